"""The memory target: the extra resident memory one all-reduce needs, in vectors.

    python bench/memory.py                          # P = 2 and 4, 256 MiB float32 per rank
    python bench/memory.py -p 2 -s 64M

Each case (algorithm and options) runs as its own ``mpiexec`` job, one after the other, so
no case inherits another's peak. In a job every rank

1. runs the case once on 256 KiB and the reduction kernel once on 1 MiB (imports, MPI
   connections, and Numba loading its compiled kernels: tens of MiB the first time);
2. fills its send and receive vectors, so both are resident: the baseline;
3. resets its peak RSS (Linux ``/proc/self/clear_refs``) and runs the all-reduce once;
4. reports (peak RSS - baseline) / vector size: the extra vectors the call needed, and what
   stays resident after it (the plan cache keeps its scratch for the next call).

Beside it stands the scratch the schedule declares, ``scratch_count`` / count (``-`` for
``mpi``, the MPI library's ``MPI_Allreduce``). mlcomm allocates all of it with
``np.empty``, but only the pages a schedule writes become resident, so ``peak`` can be less.
Writes ``bench/results/memory.json`` and prints the table.

    python bench/memory.py --freed                  # the cache bound, P = 2

``--freed`` measures the binding cache's bound instead: 120 all-reduces of 4 MiB and 24 of
16 MiB (ring and naive in turn) on fresh arrays at new addresses, each freed, with
``MLCOMM_CACHE_BYTES`` at its default and at 16 MiB; each rank reports how much resident
memory grew (after ``malloc_trim``, which returns what the allocator keeps of freed memory),
beside the same loop on ``MPI_Allreduce``, and what the cache holds.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from pathlib import Path

from mlcomm.cli import parse_args

HERE = Path(__file__).resolve().parent

#: (algorithm, options): the baseline, then each algorithm whole and segmented
CASES = (
    ("mpi", {}),
    ("ring", {}),
    ("ring", {"segment_bytes": 1 << 20}),
    ("recursive_halving_doubling", {}),
    ("double_binary_tree", {}),                        # 1 MiB chunks, the default
    ("double_binary_tree", {"chunk_bytes": 16 << 20}),
    ("double_binary_tree", {"chunk_bytes": 1 << 30}),  # one chunk: no pipelining
)


def _schedule_scratch(algorithm, options, ranks, count, itemsize):
    """Return the most scratch any rank's schedule declares, in vectors (None for mpi)."""
    from mlcomm.algorithms import COLLECTIVES
    algo = COLLECTIVES["allreduce"][algorithm]
    if not algo.hand_written:
        return None
    return max(algo.build(r, ranks, count, itemsize, **options).scratch_count
               for r in range(ranks)) / count


def worker(args) -> int:
    """Measure one case inside an mpiexec job; rank 0 prints one JSON object."""
    import numpy as np
    from mpi4py import MPI

    import mlcomm
    from mlcomm import kernels
    from mlcomm.benchmark import rss

    comm = MPI.COMM_WORLD
    options = json.loads(args.options)
    dtype = np.dtype(np.float32)
    count = args.bytes // dtype.itemsize
    small = np.ones(1 << 16, dtype)
    mlcomm.allreduce(small, np.empty_like(small), comm=comm, algorithm=args.algorithm, **options)
    kernels.reduce_into(np.ones(1 << 18, dtype), np.ones(1 << 18, dtype), "sum")

    send = np.full(count, comm.rank + 1, dtype)
    recv = np.empty(count, dtype)
    recv.fill(0)
    comm.Barrier()
    before = rss.current_bytes()
    if before is None or not rss.reset_peak():
        raise SystemExit("bench/memory.py needs Linux's /proc/self/status and clear_refs")
    mlcomm.allreduce(send, recv, comm=comm, algorithm=args.algorithm, **options)
    peak, after = rss.peak_bytes(), rss.current_bytes()
    p = comm.size
    ok = bool(np.all(recv == p * (p + 1) // 2))  # small integers: exact in float32
    mine = {"before_mib": before / 2 ** 20, "peak_mib": peak / 2 ** 20,
            "extra_vectors": (peak - before) / args.bytes,
            "retained_vectors": (after - before) / args.bytes, "correct": ok}
    ranks = comm.gather(mine, root=0)
    if comm.rank == 0:
        print(json.dumps({
            "algorithm": args.algorithm, "options": options, "ranks": p, "bytes": args.bytes,
            "dtype": str(dtype),
            "schedule_scratch_vectors": _schedule_scratch(args.algorithm, options, p, count,
                                                          dtype.itemsize),
            "extra_vectors": max(r["extra_vectors"] for r in ranks),
            "retained_vectors": max(r["retained_vectors"] for r in ranks),
            "peak_rss_mib": max(r["peak_mib"] for r in ranks),
            "correct": all(r["correct"] for r in ranks), "per_rank": ranks}))
    return 0


def freed_worker(args) -> int:
    """The cache bound inside an mpiexec job (see the module docstring); rank 0 prints one
    JSON object."""
    import ctypes
    import gc
    import os

    import numpy as np
    from mpi4py import MPI

    import mlcomm
    from mlcomm import session

    comm = MPI.COMM_WORLD
    libc = ctypes.CDLL(None)

    def rss():
        gc.collect()
        libc.malloc_trim(0)
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def calls(reduce):
        for n, count in ((1 << 20, 120), (4 << 20, 24)):  # float32: 4 MiB, then 16 MiB
            for k in range(count):
                pad = np.empty(n + 16 * k, np.float32)  # a fresh array at a new address
                x = pad[16 * k:16 * k + n]
                x.fill(1.0)
                reduce(x, k)
                del pad, x

    def library(x, k):
        comm.Allreduce(x, np.empty_like(x))

    def ours(x, k):
        y = mlcomm.allreduce(x, np.empty_like(x) if k % 3 else None,
                             algorithm="naive" if k % 2 else "ring")
        assert y[0] == comm.size
        most[0] = max(most[0], session.cached_bytes())

    most = [0]  # the most the cache held after a call
    calls(library)
    for algorithm in ("naive", "ring"):
        mlcomm.allreduce(np.ones(1 << 14, np.float32), algorithm=algorithm)
    base = rss()
    calls(library)
    library_grown = rss() - base
    base = rss()
    calls(ours)
    grown = rss() - base
    ranks = comm.gather((grown, library_grown), root=0)
    if comm.rank == 0:
        print(json.dumps({"ranks": comm.size, "bound": session.cache_bytes(), "most": most[0],
                          "grown_mib": [g / 2 ** 20 for g, _ in ranks],
                          "library_grown_mib": [g / 2 ** 20 for _, g in ranks],
                          "held": session.held() if hasattr(session, "held") else None}))
    return 0


def freed_jobs(ranks) -> str:
    """``--freed``: one job per bound (the default, 16 MiB); the table."""
    import os
    lines = [f"# resident memory growth per rank (MiB) after 144 all-reduces on fresh arrays, "
             f"P = {ranks}"]
    for bound in (None, 16 << 20):
        env = dict(os.environ)
        env.pop("MLCOMM_CACHE_BYTES", None)
        if bound is not None:
            env["MLCOMM_CACHE_BYTES"] = str(bound)
        cmd = [str(Path(sys.executable).with_name("mpiexec")), "-n", str(ranks),
               sys.executable, str(Path(__file__).resolve()), "--worker", "--freed"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n"
                               f"{proc.stderr[-4000:]}")
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        grown = ", ".join(f"{g:.1f}" for g in r["grown_mib"])
        library = ", ".join(f"{g:.1f}" for g in r["library_grown_mib"])
        lines.append(f"MLCOMM_CACHE_BYTES={r['bound']}: grown {grown}; MPI_Allreduce's loop "
                     f"{library}; the cache held at most {r['most']}, at the end {r['held']}")
    return "\n".join(lines) + "\n"


def one_job(ranks, algorithm, options, nbytes) -> dict:
    """Run one case as its own mpiexec job; return rank 0's record."""
    mpiexec = Path(sys.executable).with_name("mpiexec")
    cmd = [str(mpiexec), "-n", str(ranks), sys.executable, str(Path(__file__).resolve()),
           "--worker", "--algorithm", algorithm, "--options", json.dumps(options),
           "--size", str(nbytes)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _label(rec) -> str:
    opts = ", ".join(f"{k}={v >> 20}M" for k, v in rec["options"].items())
    return rec["algorithm"] + (f" ({opts})" if opts else "")


def format_table(records) -> str:
    lines = ["# extra memory per rank in vectors (of the vector size) beyond send + recv, max "
             "over ranks: declared by the schedule, resident at the call's peak, resident after",
             f"{'P':>2}  {'algorithm (options)':42s} {'declared':>8s} {'peak':>8s} "
             f"{'after':>8s} {'RSS MiB':>8s}  correct"]
    for r in records:
        sched = "-" if r["schedule_scratch_vectors"] is None else \
            f"{r['schedule_scratch_vectors']:.3f}"
        lines.append(f"{r['ranks']:>2}  {_label(r):42s} {sched:>8s} {r['extra_vectors']:8.3f} "
                     f"{r['retained_vectors']:8.3f} {r['peak_rss_mib']:8.0f}  {r['correct']}")
    return "\n".join(lines) + "\n"


def _metadata(nbytes) -> dict:
    from mpi4py import MPI
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=HERE).stdout.strip()
    return {"when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "bytes_per_rank": nbytes, "dtype": "float32", "op": "sum", "mlcomm_commit": commit,
            "mpi": MPI.Get_library_version().splitlines()[0].strip(),
            "command": "python bench/memory.py " + " ".join(sys.argv[1:])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-p", "--ranks", default="2,4", help="process counts, one job each")
    parser.add_argument("-s", "--size", default="256M", help="vector size per rank")
    parser.add_argument("--output", default=str(HERE / "results" / "memory.json"))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--algorithm", help=argparse.SUPPRESS)
    parser.add_argument("--options", default="{}", help=argparse.SUPPRESS)
    parser.add_argument("--freed", action="store_true",
                        help="measure the cache bound instead (P = 2 unless -p says)")
    args = parse_args(parser)
    from mlcomm.units import parse_size
    args.bytes = parse_size(args.size)
    if args.worker:
        return freed_worker(args) if args.freed else worker(args)
    if args.freed:
        sys.stdout.write(freed_jobs(2 if args.ranks == "2,4" else int(args.ranks)))
        return 0
    from tqdm import tqdm
    jobs = [(int(p), alg, opts) for p in args.ranks.split(",") for alg, opts in CASES]
    records = [one_job(p, alg, opts, args.bytes)
               for p, alg, opts in tqdm(jobs, desc="memory jobs", leave=False,
                                        disable=not sys.stderr.isatty())]
    Path(args.output).write_text(json.dumps({"metadata": _metadata(args.bytes),
                                             "records": records}, indent=1) + "\n")
    sys.stdout.write(format_table(records))
    print(f"# wrote {args.output}")
    return 0 if all(r["correct"] for r in records) else 1


if __name__ == "__main__":
    from mlcomm.cli import abort_on_error
    sys.exit(abort_on_error(main))
