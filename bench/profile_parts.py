"""Where the time of one all-reduce goes: each algorithm whole, its bound plan alone, its
transfers alone and its reductions alone, timed beside ``MPI_Allreduce`` in the same job.

    mpiexec -n 4 python bench/profile_parts.py                 # 16 MiB float32 sum
    mpiexec -n 2 python bench/profile_parts.py --size 8 --algorithms recursive_doubling
    mpiexec -n 2 python bench/profile_parts.py --size 4M --rounds 21

For each hand-written algorithm its compiled plan runs five ways, all through the same
loops on the same buffers:

- whole: ``mlcomm.allreduce`` (out of place), the public call;
- persistent: the handle ``mlcomm.allreduce_init`` returns, called;
- plan: the same plan bound once and run without the API layer above it (argument checks,
  the repeat lookup);
- transfers: the plan with its local ops removed (every message, no arithmetic);
- reductions: the plan with its messages removed (every reduction and copy, no MPI).

Beside them stand ``MPI_Allreduce`` and two yardsticks: ``copy``, one ``np.copyto`` of the
vector on every rank at once (what memory gives), and ``sendrecv``, one ``MPI_Sendrecv`` of the
whole vector with a partner (what the MPI transport gives). Every call is timed in the
interleaved rounds ``mlcomm bench`` uses; a time is the median over rounds, averaged over
ranks. Rank 0 prints the table and writes ``bench/results/profile_parts_p{P}_{SIZE}.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEFAULT_ALGORITHMS = ("recursive_halving_doubling", "ring", "parameter_server",
                      "double_binary_tree")


def _parser():
    from mlcomm.benchmark.cli import positive_int
    from mlcomm.units import parse_size

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-s", "--size", type=parse_size, default=16 << 20,
                   help="vector size per rank in bytes, e.g. 8, 64K, 16M (default 16M)")
    p.add_argument("-a", "--algorithms", default=",".join(DEFAULT_ALGORITHMS),
                   help="comma-separated hand-written algorithms")
    p.add_argument("-r", "--rounds", type=positive_int, default=15, help="interleaved rounds")
    p.add_argument("--per-round", type=positive_int, default=None,
                   help="calls per round (default: 4, more for small messages)")
    p.add_argument("--output", type=Path, default=None,
                   help="JSON file (default bench/results/profile_parts_p{P}_{SIZE}.json)")
    return p


def _stripped(schedule, keep_transfers):
    """The schedule with only its transfers, or only its local ops."""
    steps = [dataclasses.replace(s, ops=[]) if keep_transfers else
             dataclasses.replace(s, transfers=[]) for s in schedule.steps]
    return dataclasses.replace(schedule, steps=steps)


def _bound(comm, schedule, send, recv):
    """A no-argument call running ``schedule`` through the real loops on these buffers."""
    from mlcomm import session
    from mlcomm.runtime.plan import plan_for_schedule

    plan = plan_for_schedule(schedule, send.dtype, "sum")
    return session.session_of(comm).own_binding(plan, send, recv).run


def calls_for(comm, algorithms, send, recv):
    """``{label: no-argument call}``: MPI_Allreduce, the yardsticks, and each algorithm's parts."""
    import numpy as np
    from mpi4py import MPI

    from mlcomm import session
    from mlcomm.algorithms import ALGORITHMS
    from mlcomm.api import allreduce, allreduce_init

    rank, size = comm.rank, comm.size
    partner = rank ^ 1 if (rank ^ 1) < size else rank
    other = np.empty_like(recv)
    calls = {
        "mpi": lambda: comm.Allreduce(send, recv, MPI.SUM),
        "copy": lambda: np.copyto(recv, send),
        "sendrecv": lambda: comm.Sendrecv(send, partner, 7, other, partner, 7),
    }
    for name in algorithms:
        if name not in ALGORITHMS or not ALGORITHMS[name].hand_written:
            raise ValueError(f"--algorithms: {name!r} is not a hand-written all-reduce (choose "
                             f"from {sorted(a for a in ALGORITHMS if ALGORITHMS[a].hand_written)})")
        context = session.session_of(comm).context(ALGORITHMS[name].context)  # as the call has it
        schedule = ALGORITHMS[name].build(rank, size, send.size, send.itemsize, **context)
        calls[name] = (lambda n: lambda: allreduce(send, recv, comm=comm, algorithm=n))(name)
        calls[f"{name}:persistent"] = allreduce_init(send, recv, comm=comm, algorithm=name)
        calls[f"{name}:plan"] = _bound(comm, schedule, send, recv)
        calls[f"{name}:transfers"] = _bound(comm, _stripped(schedule, True), send, recv)
        calls[f"{name}:reductions"] = _bound(comm, _stripped(schedule, False), send, recv)
    return calls


def profile(comm, args) -> dict | None:
    """Time every call; return rank 0's record (None elsewhere)."""
    import numpy as np
    from mpi4py import MPI

    from mlcomm.benchmark.harness import interleaved

    algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    if args.size < 4 or args.size % 4:
        raise ValueError(f"--size {args.size}: give a positive multiple of 4 (float32)")
    count = args.size // 4
    per_round = args.per_round or min(max(4, (64 << 20) // args.size), 2000)
    send = np.full(count, comm.rank + 1, np.float32)
    recv = np.zeros(count, np.float32)
    calls = calls_for(comm, algorithms, send, recv)
    for name in algorithms:  # correctness first: the whole call against exact integers
        calls[name]()
        p = comm.size
        if not np.all(recv == p * (p + 1) // 2):
            raise RuntimeError(f"{name} gave a wrong sum at {args.size} bytes")
    for call in calls.values():  # warm-up: plans bound, pages touched, kernels loaded
        call()
    medians = interleaved(calls, args.rounds, per_round, comm, lambda: None)
    times = {k: comm.allreduce(v, op=MPI.SUM) / comm.size * 1e6 for k, v in medians.items()}
    if comm.rank != 0:
        return None
    return {"ranks": comm.size, "bytes": args.size, "dtype": "float32", "op": "sum",
            "rounds": args.rounds, "per_round": per_round,
            "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "mpi": MPI.Get_library_version().splitlines()[0].strip(),
            "command": "mpiexec -n %d python bench/profile_parts.py %s"
                       % (comm.size, " ".join(sys.argv[1:])),
            "algorithms": algorithms, "time_us": times}


def format_table(rec) -> str:
    from mlcomm.units import format_size

    t = rec["time_us"]
    rows = [(name, t[name]) for name in ("mpi", "copy", "sendrecv")]
    for name in rec["algorithms"]:
        rows += [(name, t[name]), ("  allreduce_init handle", t[f"{name}:persistent"]),
                 ("  bound plan (no API layer)", t[f"{name}:plan"]),
                 ("  transfers only", t[f"{name}:transfers"]),
                 ("  reductions only", t[f"{name}:reductions"]),
                 ("  transfers + reductions", t[f"{name}:transfers"] + t[f"{name}:reductions"])]
    size = format_size(rec["bytes"])
    size = size[:-1] + " " + size[-1] + "iB" if size[-1] in "KMGT" else size + " B"
    lines = [f"# {rec['ranks']} ranks, {size} float32 sum; µs per call "
             f"(median of {rec['rounds']} rounds of {rec['per_round']}, mean over ranks) and "
             f"ratio to MPI_Allreduce", f"{'':36s} {'µs':>10s} {'/ mpi':>7s}"]
    lines += [f"{label:36s} {value:10.2f} {value / t['mpi']:7.2f}" for label, value in rows]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from mpi4py import MPI

    from mlcomm.units import format_size

    from mlcomm.cli import parse_args

    args = parse_args(_parser(), argv)
    comm = MPI.COMM_WORLD
    rec = profile(comm, args)
    if rec is not None:
        out = args.output or HERE / "results" / \
            f"profile_parts_p{comm.size}_{format_size(args.size)}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(rec, indent=1) + "\n")
        print(format_table(rec), end="")
    return 0


if __name__ == "__main__":
    from mlcomm.cli import abort_on_error
    sys.exit(abort_on_error(main))
