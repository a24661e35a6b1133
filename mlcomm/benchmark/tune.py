"""``mlcomm tune``: time every all-reduce algorithm at this job's size and keep the fastest.

The cost model predicts from a 2-rank ping-pong; a job whose ranks share cores, or a
network the model does not describe, can make it pick a slower algorithm.  ``tune``
measures instead, as MPICH's tuning JSON and Open MPI's dynamic rules do: it runs the
benchmark's interleaved rounds over a size sweep and writes, for this number of ranks,
the fastest algorithm at each size into the profile.  ``auto`` then takes the choice
at the tuned size nearest to the message (``mlcomm.model.machine.Profile.tuned_choice``).
"""

from __future__ import annotations

import argparse
import math
import statistics

from ..cli.args import add_profile, add_progress, add_quick, positive_int, show_progress
from .cli import add_sweep, sweep_sizes

__all__ = ["register", "tune", "fastest", "median_times", "NEAR_TIE", "ROUNDS", "REPEATS",
           "QUICK_ROUNDS", "QUICK_REPEATS"]

#: the smoothed choice stands while its time at the size is within 5 % of the fastest there
NEAR_TIE = 1.05
#: interleaved rounds per size and sweeps, by default and with --quick
ROUNDS, REPEATS = 9, 3
QUICK_ROUNDS, QUICK_REPEATS = 3, 1

_EPILOG = """\
examples:
  mpiexec -n 4 mlcomm tune                  # 8 B .. 16 MiB, float32 sum
  mpiexec -n 2 mlcomm tune --quick          # 5 sizes, 3 rounds, 1 sweep: seconds
  mpiexec -n 8 mlcomm tune -e 64M

Run it once per rank count you use; each run adds its own table to the profile.
"""


def fastest(records) -> list:
    """``[[bytes, algorithm], ...]``: the fastest algorithm around each size (``mpi``, the
    library's own call, included).

    An algorithm's score at a size is the geometric mean of its time over the fastest
    time at that size and its two neighbours, so a near-tie decided by noise at one
    size does not flip the choice there.  The best score wins only while it is within
    ``NEAR_TIE`` of the size's own fastest time: a real step at one size (a message that
    crosses the MPI library's eager limit) is not smoothed away.
    """
    times = {}
    for rec in records:
        if rec["algorithm"] != "auto":
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


def tune(comm, sizes, *, rounds: int = ROUNDS, repeats: int = REPEATS, path=None,
         progress: bool = False, quick: bool = False):
    """Time every all-reduce ``auto`` weighs on ``comm``; rank 0 writes and returns the table.

    The sweep runs ``repeats`` times (fresh buffers each time) and each algorithm's
    median time per size decides.  ``quick`` times fewer calls per size (as
    ``mlcomm bench --quick`` does).
    """
    from ..model.machine import load_profile, save_profile
    from ..model.cost import auto_candidates
    from ..session import session_of
    from .harness import BenchConfig, run_bench

    # the algorithms auto weighs on this node layout: a tuned choice is always one of them
    algorithms = auto_candidates(comm.Get_size(), session_of(comm).nodes)
    config = BenchConfig(algorithms=algorithms, sizes=list(sizes), rounds=rounds, check=True,
                         progress=progress, quick=quick)
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
    p = subparsers.add_parser(
        "tune", help="measure the fastest algorithm per message size for auto (mpiexec)",
        description=__doc__.splitlines()[0].split(": ", 1)[1],
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_sweep(p, hi="16M (larger messages take its choice)")
    p.add_argument("-r", "--rounds", type=positive_int, default=None,
                   help=f"interleaved timing rounds per size (default {ROUNDS}, "
                        f"{QUICK_ROUNDS} with --quick)")
    p.add_argument("--repeats", type=positive_int, default=None,
                   help=f"sweeps to take each algorithm's median time from (default {REPEATS}, "
                        f"{QUICK_REPEATS} with --quick)")
    add_quick(p, "the --quick sizes of bench, few rounds, one sweep: seconds at P=2")
    add_profile(p, "the profile to update (default $MLCOMM_PROFILE or "
                   "~/.cache/mlcomm/profile.json)")
    add_progress(p)
    p.set_defaults(func=_run, validate=lambda args: _validate(args, p))


def _validate(args, parser) -> None:
    try:
        args.byte_sizes = sweep_sizes(args, 4)
    except ValueError as exc:
        parser.error(str(exc))


def _run(args) -> int:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rounds = args.rounds or (QUICK_ROUNDS if args.quick else ROUNDS)
    repeats = args.repeats or (QUICK_REPEATS if args.quick else REPEATS)
    table = tune(comm, args.byte_sizes, rounds=rounds, repeats=repeats, path=args.profile,
                 progress=show_progress(args), quick=args.quick)
    if table is not None:
        from ..model.machine import default_path
        print(f"# mlcomm tune: P={comm.Get_size()}, float32 sum, fastest per size "
              f"({rounds} rounds, {repeats} sweeps)")
        for nbytes, name in table:
            print(f"{nbytes:>12d}  {name}")
        print(f"# wrote {args.profile or default_path()}")
    return 0
