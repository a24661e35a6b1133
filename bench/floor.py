"""The physical floor under an intra-node all-reduce: a cache-line round trip between two
cores, and one memcpy of the vector.

    python bench/floor.py                          # cores 0 and 1; 8 B, 64 KiB, 16 MiB
    python bench/floor.py --cores 0,8 -s 8,64K,1M,16M

The round trip: two processes, each pinned to one of ``--cores``, pass a counter back and
forth through two cache lines of shared memory (release stores, acquire loads: what mlcomm's
node window uses for its flags); the time per exchange is the best of ``--repeats`` runs of
``--rounds`` exchanges. The memcpy: ``numpy.copyto`` of the vector into another buffer, the
median of timed copies, on one core. Both are the least one rank's data can cost to reach
another, so an all-reduce of that size can be no faster than about the larger of the two.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import time
from multiprocessing import shared_memory

import numpy as np
from numba import njit

from mlcomm.transport.cabi import load_acquire, store_release
from mlcomm.units import format_size, parse_size

LINE = 128  # two cache lines apart: the adjacent-line prefetcher does not couple the flags


@njit(cache=True)
def _exchange(mine, theirs, first, last, lead):
    for i in range(first, last):
        if lead:
            store_release(mine, i)
            while load_acquire(theirs) != i:
                pass
        else:
            while load_acquire(theirs) != i:
                pass
            store_release(mine, i)


def _side(name, core, lead, rounds, repeats, results):
    os.sched_setaffinity(0, {core})
    shm = shared_memory.SharedMemory(name)
    try:
        base = np.frombuffer(shm.buf, np.uint8).ctypes.data
        mine, theirs = (base, base + LINE) if lead else (base + LINE, base)
        _exchange(mine, theirs, 1, 1001, lead)  # compiled and warm on both sides
        best, first = float("inf"), 1001
        for _ in range(repeats):
            t = time.perf_counter()
            _exchange(mine, theirs, first, first + rounds, lead)
            best = min(best, (time.perf_counter() - t) / rounds)
            first += rounds
        if lead:
            results.put(best)
    finally:
        shm.close()


def round_trip(cores, rounds, repeats) -> float:
    """Seconds per exchange of a counter between ``cores`` through shared memory."""
    shm = shared_memory.SharedMemory(create=True, size=2 * LINE)
    try:
        np.frombuffer(shm.buf, np.int64)[:] = 0
        results = mp.get_context("fork").Queue()
        procs = [mp.get_context("fork").Process(
            target=_side, args=(shm.name, core, lead, rounds, repeats, results))
            for core, lead in zip(cores, (True, False))]
        for proc in procs:
            proc.start()
        best = results.get(timeout=300)
        for proc in procs:
            proc.join()
        return best
    finally:
        shm.close()
        shm.unlink()


def memcpy(nbytes, core) -> float:
    """Median seconds of ``numpy.copyto`` of ``nbytes`` into another buffer, on ``core``."""
    os.sched_setaffinity(0, {core})
    src, dst = np.ones(nbytes, np.uint8), np.zeros(nbytes, np.uint8)
    calls = max(5, min(10000, (64 << 20) // max(nbytes, 1)))
    for _ in range(max(1, calls // 10)):
        np.copyto(dst, src)
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cores", default="0,1", help="the two cores (default 0,1)")
    ap.add_argument("-s", "--sizes", default="8,64K,16M", help="memcpy sizes")
    ap.add_argument("--rounds", type=int, default=100000, help="exchanges per run")
    ap.add_argument("--repeats", type=int, default=5, help="runs; the best counts")
    args = ap.parse_args(argv)
    cores = [int(c) for c in args.cores.split(",")]
    if len(cores) != 2:
        ap.error(f"--cores takes two cores, got {args.cores!r}")
    available = os.sched_getaffinity(0)
    if not set(cores) <= available:
        ap.error(f"--cores {args.cores}: this process may run on cores {sorted(available)}")
    rtt = round_trip(cores, args.rounds, args.repeats)
    print(f"cache-line round trip, cores {cores[0]} and {cores[1]}: {rtt * 1e6:.3f} us")
    for nbytes in (parse_size(s) for s in args.sizes.split(",")):
        print(f"memcpy of {format_size(nbytes)} bytes: {memcpy(nbytes, cores[0]) * 1e6:.3f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
