"""What ``auto``'s first call at a new size costs, against its steady calls.

    MLCOMM_PROFILE=/nonexistent mpiexec -n 2 python bench/first_call.py
    MLCOMM_PROFILE=/nonexistent mpiexec -n 4 python bench/first_call.py --repeats 5
    MLCOMM_PROFILE=/nonexistent mpiexec -n 4 python bench/first_call.py --in-place
    MLCOMM_PROFILE=/nonexistent mpiexec -n 4 python bench/first_call.py -s 8,512,4K,32K,256K,2M,16M

Per size (float32 sum), on a fresh duplicate of ``COMM_WORLD`` each repeat, whose session
one call of a single element has set up (so ``auto`` meets the size anew, and the process
and its compiled code are warm after the first repeat), it times the first
``mlcomm.allreduce`` and then ten more, each on the slowest rank. The target
(issue 34): the first call costs at most ten steady calls plus 20 ms. It prints one row
per size: the median first call, the median steady call (the tenth), the budget
``10 x steady + 20 ms``, the first over the budget, and what ``auto`` ran. ``--in-place``
times ``mlcomm.allreduce(mlcomm.IN_PLACE, x)`` (a gradient's all-reduce) rather than
``mlcomm.allreduce(x)``. ``--output`` writes the rows as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
from mpi4py import MPI

import mlcomm
from mlcomm.session import session_of
from mlcomm.session.auto import auto_ran
from mlcomm.units import parse_size

STEADY = 10
FLOOR = 20e-3


def slowest(comm, seconds: float) -> float:
    return comm.allreduce(seconds, op=MPI.MAX)


def one(comm, nbytes: int, in_place: bool = False) -> tuple:
    """(first, tenth, what auto ran) of one new size on ``comm``, the slowest rank's."""
    x = np.ones(nbytes // 4, np.float32)
    call = (lambda: mlcomm.allreduce(mlcomm.IN_PLACE, x, comm=comm)) if in_place else \
        (lambda: mlcomm.allreduce(x, comm=comm))
    comm.Barrier()
    t = time.perf_counter()
    call()
    first = slowest(comm, time.perf_counter() - t)
    calls = []
    for _ in range(STEADY):
        comm.Barrier()
        t = time.perf_counter()
        call()
        calls.append(slowest(comm, time.perf_counter() - t))
    ran = auto_ran(session_of(comm), "allreduce", x.size, x.dtype, "sum")
    return first, calls[-1], ran


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="fresh communicators per size")
    ap.add_argument("-s", "--sizes", default="8,64K,16M",
                    help="bytes per rank, comma-separated (K, M suffixes; default 8,64K,16M)")
    ap.add_argument("--output", help="write the rows here as JSON")
    ap.add_argument("--in-place", action="store_true",
                    help="time mlcomm.allreduce(mlcomm.IN_PLACE, x), not mlcomm.allreduce(x)")
    args = ap.parse_args(argv)
    world = MPI.COMM_WORLD
    rows = []
    for nbytes in [parse_size(s) for s in args.sizes.split(",")]:
        runs = []
        for _ in range(args.repeats):
            comm = world.Dup()
            mlcomm.allreduce(np.ones(1, np.float32), comm=comm)  # the session's set-up
            runs.append(one(comm, nbytes, args.in_place))
            comm.Free()
        first = statistics.median(r[0] for r in runs)
        steady = statistics.median(r[1] for r in runs)
        budget = STEADY * steady + FLOOR
        rows.append({"ranks": world.size, "bytes": nbytes, "first_s": first,
                     "steady_s": steady, "budget_s": budget, "over_budget": first / budget,
                     "first_of_each": [r[0] for r in runs], "ran": [r[2] for r in runs]})
    if world.rank == 0:
        print(f"{'P':>2} {'bytes':>9} {'first ms':>9} {'steady ms':>10} {'budget ms':>10} "
              f"{'first/budget':>12}  auto ran")
        for r in rows:
            print(f"{r['ranks']:>2} {r['bytes']:>9} {r['first_s'] * 1e3:>9.2f} "
                  f"{r['steady_s'] * 1e3:>10.4f} {r['budget_s'] * 1e3:>10.2f} "
                  f"{r['over_budget']:>12.2f}  {', '.join(map(str, r['ran']))}")
        if args.output:
            with open(args.output, "w") as f:
                json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    import sys
    from mlcomm.cli import abort_on_error
    sys.exit(abort_on_error(main))
