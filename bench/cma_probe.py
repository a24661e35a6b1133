"""Is a single-copy read of a peer's memory (Linux CMA, ``process_vm_readv``) worth it here?

    mpiexec -n 2 python bench/cma_probe.py                 # 16 MiB, float32
    mpiexec -n 4 python bench/cma_probe.py --size 4M
    mpiexec -n 2 python bench/cma_probe.py --read-chunk 256K   # shm-single-copy's chunk

Per size, every rank moves the part of its peers' vectors that a reduce-scatter reads
(``(p-1)/p`` of a vector, from its ``p-1`` peers) three ways, in interleaved rounds beside
``MPI_Allreduce`` of the whole vector:

- ``window``: what ``shared_memory`` does, in its 512 KiB chunks: copy a chunk into this
  rank's slot of the node window, synchronise, copy this rank's part of the chunk out of
  each peer's slot;
- ``cma``: ``process_vm_readv`` of each peer's part straight out of the peer's private
  array (one copy, no window), after a barrier;
- ``sendrecv``: ``MPI_Sendrecv`` of each part with each peer (MPICH's own path).

Beside them, two whole all-reduces of the vector: ``shm-window`` (``shared_memory``
through the window's copies) and ``shm-single-copy`` (``shared_memory`` reading its peers'
inputs and writing their outputs), by setting its ``single_copy_bytes`` above and below
the size.

It prints each one's median time over ``MPI_Allreduce``'s. A kernel that forbids CMA (Yama
``ptrace_scope`` 2 or 3, or no ``CAP_SYS_PTRACE`` in a container) makes ``cma`` fail with
the errno, and the script says so.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

import mlcomm.algorithms._window as node_window
from mlcomm.cli import parse_args
from mlcomm.cli.args import size as parse_size
from mlcomm.transport.peer import move


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-s", "--size", type=parse_size, default=16 << 20)
    parser.add_argument("-r", "--rounds", type=int, default=15)
    parser.add_argument("--read-chunk", type=parse_size, default=node_window.READ_CHUNK_BYTES,
                        help="shm-single-copy's chunk (default the library's, "
                             f"{node_window.READ_CHUNK_BYTES >> 10} KiB)")
    args = parse_args(parser)
    if args.read_chunk < 4:
        parser.error(f"--read-chunk {args.read_chunk}: give at least one element, e.g. 512K")
    node_window.READ_CHUNK_BYTES = args.read_chunk  # before the first plan of this process
    comm = MPI.COMM_WORLD
    rank, p = comm.Get_rank(), comm.Get_size()
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    if node.Get_size() != p:
        raise SystemExit("cma_probe: every rank must be on one node")
    count = args.size // 4
    chunk = min(count, (512 << 10) // 4)
    bounds = [count * j // p for j in range(p + 1)]
    mine = np.full(count, rank + 1, np.float32)
    out = np.empty_like(mine)
    land = np.empty_like(mine)
    win = MPI.Win.Allocate_shared(args.size, 4, comm=node)
    slots = [np.ndarray(count, np.float32, buffer=win.Shared_query(q)[0]) for q in range(p)]
    peers = comm.allgather((os.getpid(), mine.ctypes.data))

    def window():  # in chunks, as shared_memory goes, so a chunk's traffic stays in cache
        for c in range(0, count, chunk):
            m = min(chunk, count - c)
            slots[rank][:m] = mine[c:c + m]
            comm.Barrier()
            lo, hi = m * rank // p, m * (rank + 1) // p
            for q in range(p):
                if q != rank:
                    land[c + lo:c + hi] = slots[q][lo:hi]
            comm.Barrier()

    def cma():
        comm.Barrier()
        lo, hi = bounds[rank], bounds[rank + 1]
        for q in range(p):
            if q != rank:
                move(peers[q][0], peers[q][1] + 4 * lo, land[lo:].ctypes.data, 4 * (hi - lo))
        comm.Barrier()

    def sendrecv():
        for k in range(1, p):
            to, frm = (rank + k) % p, (rank - k) % p
            comm.Sendrecv(mine[bounds[to]:bounds[to + 1]], to,
                          recvbuf=land[bounds[rank]:bounds[rank + 1]], source=frm)

    def mpi():
        comm.Allreduce(mine, out, MPI.SUM)

    tests = {"mpi": mpi, "window": window, "sendrecv": sendrecv}
    try:
        cma()
        tests["cma"] = cma
        forbidden = None
    except OSError as exc:
        forbidden = str(exc)
    forbidden = comm.allreduce([forbidden] if forbidden else [])
    if forbidden:
        tests.pop("cma", None)
        if rank == 0:
            print(f"cma: not allowed here ({forbidden[0]}); timing the others", flush=True)
        comm.Barrier()
    import mlcomm
    for name, at in (("shm-window", 1 << 62), ("shm-single-copy", 1)):
        tests[name] = lambda at=at: mlcomm.allreduce(mine, out, algorithm="shared_memory",
                                                     single_copy_bytes=at)
        tests[name]()  # plan, bind and probe outside the timed rounds
    times = {name: [] for name in tests}
    names = list(tests)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            tests[name]()
            comm.Barrier()
            t0 = time.perf_counter()
            tests[name]()
            times[name].append(comm.allreduce(time.perf_counter() - t0, MPI.MAX))
    win.Free()
    if rank == 0:
        base = statistics.median(times["mpi"])
        print(f"# P={p}, {args.size} B vectors (MPI_Allreduce {base * 1e3:.2f} ms); each moves (p-1)/p of a vector; "
              f"median of {args.rounds} rounds over MPI_Allreduce of the vector")
        for name in names:
            print(f"{name:10s} {statistics.median(times[name]) / base:6.2f}")
    return 0


if __name__ == "__main__":
    from mlcomm.cli import abort_on_error
    sys.exit(abort_on_error(main))
