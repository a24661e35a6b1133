"""The physical floor under an intra-node all-reduce: a cache-line round trip between two
cores, one memcpy of the vector (alone, and on both cores at once), and a hand-off of it
between the two cores.

    python bench/floor.py                          # cores 0 and 1; 8 B, 64 KiB, 16 MiB
    python bench/floor.py --cores 0,8 -s 8,64K,1M,16M

The round trip: two processes, each pinned to one of ``--cores``, pass a counter back and
forth through two cache lines of shared memory (release stores, acquire loads: what mlcomm's
node window uses for its flags); the time per exchange is the best of ``--repeats`` runs of
``--rounds`` exchanges. The memcpy: ``numpy.copyto`` of the vector into another buffer, the
median of timed copies, on one core. Both are the least one rank's data can cost to reach
another, so an all-reduce of that size can be no faster than about the larger of the two.
On both cores at once, two processes copy in step (a flag exchange before each copy), as
the ranks of an all-reduce move their data together: where the cores share the memory's
bandwidth, each copy of a large vector takes longer than one alone, and that is the floor
of a rank that reads and writes a memcpy's worth of bytes, as two ranks do (mlcomm's
single copies read a half from the peer and reduce it with its own into its output and the
peer's).

The hand-off is the window's write-once, read-by-all all-reduce of two ranks with nothing
else: each process copies its vector into its own area of shared memory, raises its flag,
waits for the other's, adds the other's area to its vector into an output, and raises its
flag again; the time per exchange is the best of ``--repeats`` runs. It runs with one area
per process, as the node window's turn areas are reused every other call, and with areas
that rotate over ``--area`` bytes a process, as its slots' areas rotate above the turn
areas: a store to a line the other core has read must take it back first, and on a 2-core
EPYC that made the copy in 2.5-4x slower than the copy into lines the other core had not
read for many calls (docs/performance.rst).
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


def _flags(shm, lead) -> tuple:
    """``(bytes, mine, theirs)``: the shared memory ``shm`` as bytes, and the addresses of
    this side's flag line and the other's, at its start."""
    raw = np.frombuffer(shm.buf, np.uint8)
    flags = raw[:2 * LINE].ctypes.data
    return (raw, flags, flags + LINE) if lead else (raw, flags + LINE, flags)


def _side(name, core, lead, rounds, repeats, results):
    os.sched_setaffinity(0, {core})
    shm = shared_memory.SharedMemory(name)
    raw, mine, theirs = _flags(shm, lead)
    try:
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
        del raw
        shm.close()


def _on_two_cores(cores, size, side, *args) -> float:
    """What ``side(name, core, lead, *args, results)`` puts on ``results`` on the lead core,
    run by two processes on ``cores`` over ``size`` bytes of shared memory named ``name``
    (its first two flag lines zeroed)."""
    shm = shared_memory.SharedMemory(create=True, size=size)
    try:
        np.frombuffer(shm.buf, np.int64, count=2 * LINE // 8)[:] = 0
        results = mp.get_context("fork").Queue()
        procs = [mp.get_context("fork").Process(
            target=side, args=(shm.name, core, lead, *args, results))
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


def round_trip(cores, rounds, repeats) -> float:
    """Seconds per exchange of a counter between ``cores`` through shared memory."""
    return _on_two_cores(cores, 2 * LINE, _side, rounds, repeats)


@njit(cache=True)
def _hand_off(mine, theirs, src, areas, other, out, first, last):
    for i in range(first, last):
        area = areas[i % areas.shape[0]]
        for j in range(src.size):
            area[j] = src[j]
        store_release(mine, 2 * i)
        while load_acquire(theirs) < 2 * i:
            pass
        read = other[i % other.shape[0]]
        for j in range(src.size):
            out[j] = src[j] + read[j]
        store_release(mine, 2 * i + 1)
        while load_acquire(theirs) < 2 * i + 1:
            pass


def _hand_off_side(name, core, lead, nbytes, areas, rounds, repeats, results):
    os.sched_setaffinity(0, {core})
    shm = shared_memory.SharedMemory(name)
    try:
        raw, mine, theirs = _flags(shm, lead)
        slots = raw[2 * LINE:].view(np.float32).reshape(2, areas, nbytes // 4)
        own, other = (slots[0], slots[1]) if lead else (slots[1], slots[0])
        src, out = np.ones(nbytes // 4, np.float32), np.empty(nbytes // 4, np.float32)
        _hand_off(mine, theirs, src, own, other, out, 1, 1 + 2 * areas)  # warm on both sides
        best, first = float("inf"), 1 + 2 * areas
        for _ in range(repeats):
            t = time.perf_counter()
            _hand_off(mine, theirs, src, own, other, out, first, first + rounds)
            best = min(best, (time.perf_counter() - t) / rounds)
            first += rounds
        if lead:
            results.put(best if np.all(out == 2) else float("nan"))
    finally:
        del raw, slots, own, other
        shm.close()


def hand_off(cores, nbytes, areas, rounds, repeats) -> float:
    """Seconds per hand-off of ``nbytes`` each way between ``cores`` (see the module
    docstring), through ``areas`` areas a process taken in turn; at most ``rounds`` a run,
    and 256 MiB of vector."""
    nbytes = max(4, nbytes - nbytes % 4)
    rounds = max(20, min(rounds, (256 << 20) // nbytes))
    return _on_two_cores(cores, 2 * LINE + 2 * areas * nbytes, _hand_off_side, nbytes, areas,
                         rounds, repeats)


@njit(cache=True)
def _meet(mine, theirs, i):
    store_release(mine, i)
    while load_acquire(theirs) < i:
        pass


def _copy_side(name, core, lead, nbytes, calls, results):
    os.sched_setaffinity(0, {core})
    shm = shared_memory.SharedMemory(name)
    raw, mine, theirs = _flags(shm, lead)
    try:
        src, dst = np.ones(nbytes, np.uint8), np.zeros(nbytes, np.uint8)
        times = []
        for i in range(1, calls + calls // 10 + 1):  # the first tenth warms up
            _meet(mine, theirs, i)
            t = time.perf_counter()
            np.copyto(dst, src)
            times.append(time.perf_counter() - t)
        if lead:
            results.put(statistics.median(times[calls // 10:]))
    finally:
        del raw
        shm.close()


def memcpy_together(nbytes, cores) -> float:
    """Median seconds of ``numpy.copyto`` of ``nbytes`` on the lead core of ``cores`` while
    the other copies as much, the two in step."""
    calls = max(5, min(10000, (64 << 20) // max(nbytes, 1)))
    return _on_two_cores(cores, 2 * LINE, _copy_side, nbytes, calls)


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
    ap.add_argument("--rounds", type=int, default=100000,
                    help="exchanges per run (hand-offs: at most 256 MiB of vector a run)")
    ap.add_argument("--repeats", type=int, default=5, help="runs; the best counts")
    ap.add_argument("--area", default="4M",
                    help="the bytes a process's rotating hand-off areas span (default 4M)")
    args = ap.parse_args(argv)
    cores = [int(c) for c in args.cores.split(",")]
    if len(cores) != 2:
        ap.error(f"--cores takes two cores, got {args.cores!r}")
    available = os.sched_getaffinity(0)
    if not set(cores) <= available:
        ap.error(f"--cores {args.cores}: this process may run on cores {sorted(available)}")
    rtt = round_trip(cores, args.rounds, args.repeats)
    print(f"cache-line round trip, cores {cores[0]} and {cores[1]}: {rtt * 1e6:.3f} us")
    area = parse_size(args.area)
    for nbytes in (parse_size(s) for s in args.sizes.split(",")):
        size = format_size(nbytes)
        print(f"memcpy of {size} bytes: {memcpy(nbytes, cores[0]) * 1e6:.3f} us")
        print(f"memcpy of {size} bytes on both cores at once: "
              f"{memcpy_together(nbytes, cores) * 1e6:.3f} us")
        one = hand_off(cores, nbytes, 1, args.rounds, args.repeats)
        line = f"hand-off of {size} bytes: one area {one * 1e6:.3f} us"
        if area // nbytes >= 2:
            rotating = hand_off(cores, nbytes, area // nbytes, args.rounds, args.repeats)
            line += f"; areas over {format_size(area)}: {rotating * 1e6:.3f} us"
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
