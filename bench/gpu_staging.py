"""Where a staged all-reduce of CuPy arrays spends its time (needs a GPU and CuPy).

    mpiexec -n 1 python bench/gpu_staging.py
    mpiexec -n 2 python bench/gpu_staging.py --sizes 8,64K,4M
    I_MPI_OFFLOAD=1 I_MPI_OFFLOAD_MODE=cuda mpiexec -n 2 python bench/gpu_staging.py --no-library

Per size, every rank times each piece on its own (median of ``--iters`` calls after a
barrier) and rank 0 prints them in microseconds: a stream synchronise, a device-to-host and a
host-to-device copy of the vector through pinned memory (each with its synchronise),
``MPI_Allreduce`` and ``mlcomm.allreduce`` on host buffers, and ``mlcomm.allreduce`` on device
buffers with ``algorithm="mpi"``, ``"ring"`` and auto. On an MPI that is not CUDA-aware the
device calls are staged, so the difference between a device call and its host call plus the
two copies is what staging adds around them; on a CUDA-aware one (Intel MPI with its GPU
support on, the third line) they take the direct path.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

import mlcomm
from mlcomm.buffers import gpu
from mlcomm.cli import parse_args
from mlcomm.cli.args import size as parse_size


def _median_us(comm, fn, iters):
    for _ in range(max(1, iters // 10)):
        fn()
    comm.Barrier()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="8,64K,4M", help="message sizes (default 8,64K,4M)")
    parser.add_argument("--iters", type=int, default=200, help="timed calls per piece")
    parser.add_argument("--no-library", action="store_true",
                        help="leave out the library's MPI_Allreduce on device buffers (Intel "
                             "MPI 2021.18's fails from 64 KiB on an H200)")
    args = parse_args(parser)
    import cupy

    comm = MPI.COMM_WORLD
    gpu.select_device()
    copy_stream = cupy.cuda.Stream(non_blocking=True)
    for nbytes in (parse_size(s) for s in args.sizes.split(",")):
        n = max(1, nbytes // 4)
        dev, dev_out = cupy.ones(n, cupy.float32), cupy.empty(n, cupy.float32)
        host = np.frombuffer(cupy.cuda.alloc_pinned_memory(4 * n), np.float32, n)
        host_out = np.empty_like(host)

        def to_host():
            dev.get(out=host, stream=copy_stream)
            copy_stream.synchronize()

        def to_device():
            dev_out.set(host, stream=copy_stream)
            copy_stream.synchronize()

        pieces = {
            "sync": cupy.cuda.get_current_stream().synchronize,
            "D2H": to_host,
            "H2D": to_device,
            "MPI host": lambda: comm.Allreduce(host, host_out),
            "ring host": lambda: mlcomm.allreduce(host, host_out, algorithm="ring"),
            "mpi dev": lambda: mlcomm.allreduce(dev, dev_out, algorithm="mpi"),
            "ring dev": lambda: mlcomm.allreduce(dev, dev_out, algorithm="ring"),
            "auto dev": lambda: mlcomm.allreduce(dev, dev_out),
        }
        if args.no_library:
            del pieces["mpi dev"]
        times = {name: _median_us(comm, fn, args.iters) for name, fn in pieces.items()}
        if comm.Get_rank() == 0:
            print(f"P={comm.Get_size()} {4 * n} B (us): "
                  + ", ".join(f"{name} {t:.1f}" for name, t in times.items()), flush=True)
    return 0


if __name__ == "__main__":
    from mlcomm.cli import abort_on_error
    sys.exit(abort_on_error(main))
