"""``mlcomm tune``: time every all-reduce algorithm at this job's size and keep the fastest.

The cost model predicts from a 2-rank ping-pong; a job whose ranks share cores, or a
network the model does not describe, can make it pick a slower algorithm.  ``tune``
measures instead, as MPICH's tuning JSON and Open MPI's dynamic rules do: it runs the
benchmark's interleaved rounds over a size sweep and writes, for this number of ranks,
the fastest algorithm at each size into the profile.  ``auto`` then takes the choice
at the tuned size nearest to the message (``mlcomm.profile.Profile.tuned_choice``).
"""

from __future__ import annotations

import argparse
import math
import statistics

__all__ = ["register", "tune", "fastest", "median_times", "NEAR_TIE"]

#: the smoothed choice stands while its time at the size is within 5 % of the fastest there
NEAR_TIE = 1.05

_EPILOG = """\
examples:
  mpiexec -n 4 mlcomm tune                  # 8 B .. 16 MiB, float32 sum
  mpiexec -n 8 mlcomm tune --max-bytes 64M

Run it once per rank count you use; each run adds its own table to the profile.
"""


def fastest(records) -> list:
    """``[[bytes, algorithm], ...]``: the fastest hand-written algorithm around each size.

    An algorithm's score at a size is the geometric mean of its time over the fastest
    time at that size and its two neighbours, so a near-tie decided by noise at one
    size does not flip the choice there.  The best score wins only while it is within
    ``NEAR_TIE`` of the size's own fastest time: a real step at one size (a message that
    crosses the MPI library's eager limit) is not smoothed away.
    """
    times = {}
    for rec in records:
        if rec["algorithm"] not in ("mpi", "auto"):
            times.setdefault(rec["bytes"], {})[rec["algorithm"]] = rec["time_us_avg"]
    sizes = sorted(times)
    ratio = {n: {a: t / min(times[n].values()) for a, t in times[n].items()} for n in sizes}
    table = []
    for i, n in enumerate(sizes):
        near = sizes[max(i - 1, 0):i + 2]
        score = lambda a: math.prod(ratio[m].get(a, math.inf) for m in near) ** (1 / len(near))
        smoothed = min(times[n], key=lambda a: (score(a), times[n][a]))
        own = min(times[n], key=times[n].get)
        table.append([n, smoothed if ratio[n][smoothed] <= NEAR_TIE else own])
    return table


def median_times(sweeps) -> list:
    """One record per (size, algorithm) with the median ``time_us_avg`` over ``sweeps``."""
    times = {}
    for records in sweeps:
        for r in records:
            times.setdefault((r["bytes"], r["algorithm"]), []).append(r["time_us_avg"])
    return [{"bytes": n, "algorithm": a, "time_us_avg": statistics.median(t)}
            for (n, a), t in times.items()]


def tune(comm, sizes, *, rounds: int = 9, repeats: int = 3, path=None,
         progress: bool = False):
    """Time every hand-written all-reduce on ``comm``; rank 0 writes and returns the table.

    The sweep runs ``repeats`` times (fresh buffers each time) and each algorithm's
    median time per size decides.
    """
    from ..profile import load_profile, save_profile
    from .harness import BenchConfig, resolve_algorithms, run_bench

    algorithms = [a for a in resolve_algorithms("all") if a != "auto"]
    config = BenchConfig(algorithms=algorithms, sizes=list(sizes), rounds=rounds, check=True,
                         progress=progress)
    sweeps = [run_bench(config, comm) for _ in range(repeats)]
    wrong = {r["algorithm"] for records in sweeps for r in records if r["wrong"]}
    if wrong:
        raise RuntimeError(f"mlcomm tune: wrong results from {sorted(wrong)}; not tuned")
    if comm.Get_rank():
        return None
    table = fastest(median_times(sweeps))
    profile = load_profile(path)
    profile.tuned = dict(profile.tuned, **{str(comm.Get_size()): table})
    profile.source = str(save_profile(profile, path))
    return table


def register(subparsers):
    """Add the ``tune`` command."""
    from .cli import positive_int
    p = subparsers.add_parser(
        "tune", help="measure the fastest algorithm per message size for auto (mpiexec)",
        description=__doc__.splitlines()[0].split(": ", 1)[1],
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-b", "--min-bytes", default="8", metavar="SIZE",
                   help="smallest message (default 8)")
    p.add_argument("-e", "--max-bytes", default="16M", metavar="SIZE",
                   help="largest message (default 16M); larger ones take its choice")
    p.add_argument("-f", "--factor", type=float, default=2.0,
                   help="multiply the size by this between steps (default 2)")
    p.add_argument("-r", "--rounds", type=positive_int, default=9,
                   help="interleaved timing rounds per size (default 9)")
    p.add_argument("--repeats", type=positive_int, default=3,
                   help="sweeps to take each algorithm's median time from (default 3)")
    p.add_argument("--profile", default=None, metavar="FILE",
                   help="the profile to update (default $MLCOMM_PROFILE or "
                        "~/.cache/mlcomm/profile.json)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_run)


def _run(args) -> int:
    from mpi4py import MPI

    from .harness import parse_size, size_list
    comm = MPI.COMM_WORLD
    sizes = size_list(parse_size(args.min_bytes), parse_size(args.max_bytes), args.factor, 4)
    table = tune(comm, sizes, rounds=args.rounds, repeats=args.repeats, path=args.profile,
                 progress=not args.no_progress)
    if table is not None:
        from ..profile import default_path
        print(f"# mlcomm tune: P={comm.Get_size()}, float32 sum, fastest per size")
        for nbytes, name in table:
            print(f"{nbytes:>12d}  {name}")
        print(f"# wrote {args.profile or default_path()}")
    return 0
