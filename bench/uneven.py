"""Uneven work between calls: rank 0 works, the others wait in the next all-gather.

    mpiexec -n 8 python bench/uneven.py                          # 500 us and 2 ms of work
    MLCOMM_SLEEP_AFTER_US=0 mpiexec -n 8 python bench/uneven.py  # waits that only yield

Rank 0 spins for each ``--work`` (µs) before each call of a persistent 8-byte allgather
(``-a``, default ``shared_memory``: its waits are on the node window's flags; ``ring``'s
are on messages, which sleep ten times later); the other
ranks go straight to the call and wait for it. Rank 0 prints the time per call, the median
of ``--runs`` blocks of ``--calls`` calls. With ranks that share cores, the time above the
work is what the waiting ranks take of rank 0's core: a wait that yields keeps its share
of the core, a wait that sleeps (:doc:`mpis`, ``MLCOMM_SLEEP_AFTER_US``) leaves it.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def _parser():
    from mlcomm.benchmark.cli import positive_int

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", default="500,2000",
                   type=lambda text: [float(w) for w in text.split(",") if w.strip()],
                   help="rank 0's work before each call, in µs, comma-separated "
                        "(default %(default)s)")
    p.add_argument("-a", "--algorithm", default="shared_memory", help="the allgather's")
    p.add_argument("--calls", type=positive_int, default=100, help="calls a block")
    p.add_argument("--runs", type=positive_int, default=3, help="timed blocks")
    return p


def _spin(seconds):
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def main(argv=None):
    args = _parser().parse_args(argv)
    from mpi4py import MPI
    from mlcomm.api import Persistent
    from mlcomm.session import Call
    comm = MPI.COMM_WORLD.Dup()
    mine, rows = np.zeros(8, np.uint8), np.zeros(8 * comm.size, np.uint8)
    gather = Persistent(Call("allgather", mine, rows, comm=comm, algorithm=args.algorithm))
    from mlcomm.runtime.frame import MESSAGE_SLEEP_FACTOR
    sleep_after = gather.session.settings.sleep_after
    message = sleep_after * MESSAGE_SLEEP_FACTOR
    for work in args.work:
        def call():
            if comm.rank == 0:
                _spin(work * 1e-6)
            gather()
        for _ in range(max(1, args.calls // 10)):
            call()
        blocks = []
        for _ in range(args.runs):
            comm.Barrier()
            start = time.perf_counter()
            for _ in range(args.calls):
                call()
            blocks.append((time.perf_counter() - start) / args.calls)
        if comm.rank == 0:
            took = statistics.median(blocks)
            print(f"P={comm.size} {args.algorithm} work {work:g} us: {took * 1e3:.3f} ms a "
                  f"call ({took / (work * 1e-6):.2f}x the work; waits sleep after "
                  f"{sleep_after * 1e6:g} us on the window, {message * 1e6:g} us on messages, "
                  f"0: never)" if work else
                  f"P={comm.size} {args.algorithm} work 0 us: {took * 1e3:.3f} ms a call",
                  flush=True)
    gather.release()
    comm.Free()
    return 0


if __name__ == "__main__":
    import sys
    from mlcomm.cli import abort_on_error
    sys.exit(abort_on_error(main))
