"""Device arrays through every mlcomm collective, on the path ``MLCOMM_CUDA_AWARE`` picks.

Run under mpiexec, normally with NUMBA_ENABLE_CUDASIM=1 (Numba's CUDA simulator, no GPU):

    NUMBA_ENABLE_CUDASIM=1 MLCOMM_CUDA_AWARE=0 mpiexec -n 3 python tests/gpu_job.py [--cupy]
    NUMBA_ENABLE_CUDASIM=1 MLCOMM_CUDA_AWARE=0 MLCOMM_STAGING_CHUNK_BYTES=256 mpiexec -n 3 ...
    NUMBA_ENABLE_CUDASIM=1 MLCOMM_CUDA_AWARE=1 mpiexec -n 3 python tests/gpu_job.py --counts 1,37,150

The first stages through host memory (one chunk per buffer), the second in small chunks (several
per buffer, a ragged last one), the third sends device buffers straight to MPI and reduces them
with the CUDA kernels. The simulator's device arrays live in host memory, so MPI really moves
them there (mpi4py takes them through DLPack).

Each rank builds device arrays (Numba device arrays, or CuPy arrays with ``--cupy``) of
float32, float64, int32, float16 and bfloat16 (raw uint16 + ``dtype=``), passes them straight to
``mlcomm``'s collectives, runs ``mlcomm.allreduce`` with every algorithm out of place, in place
and with recvbuf=None, and compares it with ``comm.Allreduce`` on host copies (exact for
integers, a tolerance for floats) and, bit for bit, with ``mlcomm.allreduce`` on host copies of
the same chunks (same schedule, same kernels' results). It checks that the path it expected
ran: the number of host collectives per call (one per chunk when staged), device bindings in
the plan cache only on the direct path. The other collectives go through every algorithm once
with float32 and int32. ``reduce_into`` runs once with the "cuda" backend on device arrays.
Prints one summary line on rank 0 and exits non-zero on any mismatch.
"""

import argparse
import sys
import warnings

import ml_dtypes
import numpy as np
from mpi4py import MPI

import mlcomm
from mlcomm import ALGORITHMS, COLLECTIVES, kernels, session
from mlcomm.session import binder
from mlcomm.buffers import gpu, staging
from mlcomm.runtime.binding import DeviceMemory
from mlcomm.cli import abort_on_error

BF16 = np.dtype(ml_dtypes.bfloat16)
#: dtype -> (reference dtype for comm.Allreduce, rtol, atol)
DTYPES = {
    np.dtype(np.float32): (np.float32, 1e-5, 1e-5),
    np.dtype(np.float64): (np.float64, 1e-12, 1e-12),
    np.dtype(np.int32): (np.int32, 0, 0),
    np.dtype(np.float16): (np.float32, 4e-3, 4e-3),
    BF16: (np.float32, 3e-2, 3e-2),
}
MPI_DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int32))

class HostCollectives:
    """Count the host collectives mlcomm binds (``binder._host``): one per staged chunk."""

    def __init__(self):
        self.calls = 0
        self._host = binder._host
        binder._host = self._count

    def _count(self, *args, **kwargs):
        self.calls += 1
        return self._host(*args, **kwargs)


def chunks(n, itemsize, chunk_bytes):
    """The element ranges mlcomm stages one at a time (the whole buffer when not chunked)."""
    step = n if chunk_bytes is None else max(1, chunk_bytes // itemsize)
    return [(a, min(a + step, n)) for a in range(0, n, step)] or [(0, 0)]


def bits(a):
    return a.view(f"u{a.dtype.itemsize}")


class Device:
    """Make device arrays with Numba (simulator or real) or CuPy."""

    def __init__(self, use_cupy):
        self.cupy = use_cupy
        if use_cupy:
            import cupy
            self.xp = cupy
        else:
            from numba import cuda
            self.cuda = cuda

    def put(self, host):
        """A device copy of ``host``; bfloat16 travels as raw uint16."""
        raw = host.view(np.uint16) if host.dtype == BF16 else host
        return self.xp.asarray(raw) if self.cupy else self.cuda.to_device(raw)

    def get(self, dev, dtype):
        host = self.xp.asnumpy(dev) if self.cupy else dev.copy_to_host()
        return host.view(dtype) if dtype == BF16 else host

    def empty(self, n, dtype):
        raw = np.uint16 if dtype == BF16 else dtype
        return self.xp.empty(n, raw) if self.cupy else self.cuda.device_array(n, raw)


def host_data(rng, dtype, n, rank):
    if dtype.kind == "i":
        return rng.integers(-1000, 1000, n).astype(dtype)
    return (rng.standard_normal(n) + rank).astype(dtype)


def reference(comm, host, dtype, op):
    ref_dtype, _, _ = DTYPES[dtype]
    send = host.astype(ref_dtype)
    out = np.empty_like(send)
    mpi = {"sum": MPI.SUM, "avg": MPI.SUM, "max": MPI.MAX}[op]
    comm.Allreduce(send, out, mpi)
    if op == "avg":
        out = out / comm.Get_size()
    return out


def close(got, want, dtype):
    _, rtol, atol = DTYPES[dtype]
    g = got.astype(np.float64) if dtype.kind == "f" or dtype == BF16 else got
    if rtol == 0:
        return np.array_equal(g, want)
    return np.allclose(g, want.astype(np.float64), rtol=rtol, atol=atol * max(1, np.abs(want).max(initial=0)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cupy", action="store_true", help="CuPy arrays on a real GPU")
    ap.add_argument("--counts", default="1,37,1000", help="allreduce element counts")
    args = ap.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    direct = gpu.cuda_aware()
    chunk_bytes = None if direct else staging.chunk_bytes()
    if gpu.simulator():  # simulated kernels compute in NumPy scalars, which warn on wrap-around
        warnings.filterwarnings("ignore", "overflow encountered", RuntimeWarning)
    host_calls = HostCollectives()
    comm = MPI.COMM_WORLD
    rank, p = comm.Get_rank(), comm.Get_size()
    if args.cupy:
        gpu.select_device()
    dev = Device(args.cupy)
    rng = np.random.default_rng(1234 + rank)
    failures, cases = [], 0

    def check(label, got, want, dtype, same=None):
        """``got`` close to MPI's ``want`` and, when given, bit-identical to mlcomm's ``same``."""
        nonlocal cases
        cases += 1
        if not close(got, want, dtype):
            bad = np.flatnonzero(~np.isclose(got.astype(np.float64), want.astype(np.float64),
                                             rtol=DTYPES[dtype][1] or 1e-300, atol=DTYPES[dtype][2]))
            failures.append(f"rank {rank} {label}: first bad index {bad[:3]}, "
                            f"got {got.ravel()[bad[:3]]} want {want.ravel()[bad[:3]]}")
        elif same is not None and not np.array_equal(bits(got), bits(same)):
            bad = np.flatnonzero(bits(got) != bits(same))
            failures.append(f"rank {rank} {label}: differs from mlcomm on the host at {bad[:3]}")

    def expect_host_calls(label, before, want):
        if host_calls.calls - before != want:
            failures.append(f"rank {rank} {label}: {host_calls.calls - before} host collectives, "
                            f"expected {want}")

    algorithms = list(mlcomm.ALGORITHMS)
    most_chunks = 0
    for dtype in DTYPES:
        dt = BF16 if dtype == BF16 else None
        for name in algorithms:
            if name == "mpi" and dtype not in MPI_DTYPES or direct and ALGORITHMS[name].window:
                continue  # the node window takes host buffers: staged device arrays only
            for n in counts:
                ops = ("sum", "max") if dtype.kind == "i" else ("sum", "max", "avg")
                parts = chunks(n, dtype.itemsize, chunk_bytes)
                most_chunks = max(most_chunks, len(parts))
                for op in ops:
                    host = host_data(rng, dtype, n, rank)
                    want = reference(comm, host, dtype, op)
                    same = np.concatenate([mlcomm.allreduce(host[a:b], op=op, algorithm=name)
                                           for a, b in parts])
                    label = f"{name} {dtype} n={n} {op}"
                    # out of place into a device recvbuf
                    d_send, d_recv = dev.put(host), dev.empty(n, dtype)
                    before = host_calls.calls
                    res = mlcomm.allreduce(d_send, d_recv, op, algorithm=name, dtype=dt)
                    expect_host_calls(label, before, len(parts))
                    if name == "auto" and direct:  # auto decides a device call apart
                        ran = session.session_of(comm).choices[("allreduce", p, n, dtype.str, op, True,
                                                         False)]
                        same = mlcomm.allreduce(host, op=op, algorithm=ran[0], **dict(ran[1]))
                    if res is not d_recv:
                        failures.append(f"rank {rank} {label}: result is not recvbuf")
                    check(label + " out-of-place", dev.get(d_recv, dtype), want, dtype, same)
                    if not np.array_equal(dev.get(d_send, dtype).view(np.uint8), host.view(np.uint8)):
                        failures.append(f"rank {rank} {label}: sendbuf changed")
                    # in place
                    d_buf = dev.put(host)
                    res = mlcomm.allreduce(MPI.IN_PLACE, d_buf, op, algorithm=name, dtype=dt)
                    if res is not d_buf:
                        failures.append(f"rank {rank} {label}: in-place result is not recvbuf")
                    check(label + " in-place", dev.get(d_buf, dtype), want, dtype, same)
                    if op == "sum":  # recvbuf=None: a new device array
                        res = mlcomm.allreduce(dev.put(host), None, op, algorithm=name, dtype=dt)
                        check(label + " recvbuf=None", dev.get(res, dtype), want, dtype, same)

    # the path that ran: device bindings only when direct, staging buffers only when staged
    device_bindings = sum(1 for b in session.session_of(comm).bindings()
                          if isinstance(b.loop.memory if not b.compiled else None, DeviceMemory))
    cases += 1
    if direct and (device_bindings == 0 or staging._cache):
        failures.append(f"rank {rank}: direct path expected, but {device_bindings} device "
                        f"bindings and {len(staging._cache)} staging buffers")
    if not direct and (device_bindings or not staging._cache):
        failures.append(f"rank {rank}: staged path expected, but {device_bindings} device "
                        f"bindings and {len(staging._cache)} staging buffers")

    # the pinned/host staging buffers are reused for the same shape and dtype
    a = dev.put(np.zeros(64, np.float32))
    h1 = staging.stage(a, None)[0]
    h2 = staging.stage(a, None)[0]
    cases += 1
    if h1 is not h2:
        failures.append(f"rank {rank}: host staging buffer not reused")

    # the other collectives, every algorithm, float32 and int32; bcast and reduce (staged in
    # chunks like allreduce) on 100 elements, the others on 5 per rank
    names = {c: [name for name, a in COLLECTIVES[c].items() if not (direct and a.window)]
             for c in ("reduce_scatter", "allgather", "bcast", "reduce")}
    for dtype in (np.dtype(np.float32), np.dtype(np.int32)):
        n, m = 5, 100
        for name in names["reduce_scatter"]:
            host = host_data(rng, dtype, n * p, rank)
            full = reference(comm, host, dtype, "sum")
            want = full[rank * n:(rank + 1) * n]
            d_recv = dev.empty(n, dtype)
            mlcomm.reduce_scatter(dev.put(host), d_recv, "sum", algorithm=name)
            check(f"reduce_scatter {name} {dtype}", dev.get(d_recv, dtype), want, dtype)
            d_buf = dev.put(host)  # in place: the result is recvbuf's first block
            res = mlcomm.reduce_scatter(MPI.IN_PLACE, d_buf, "sum", algorithm=name)
            check(f"reduce_scatter {name} {dtype} in-place", dev.get(res, dtype), want, dtype)
            check(f"reduce_scatter {name} {dtype} in-place block 0",
                  dev.get(d_buf, dtype)[:n], want, dtype)
        for name in names["allgather"]:
            host = host_data(rng, dtype, n, rank)
            want = np.empty(n * p, dtype)
            comm.Allgather(host, want)
            d_recv = dev.empty(n * p, dtype)
            mlcomm.allgather(dev.put(host), d_recv, algorithm=name)
            check(f"allgather {name} {dtype}", dev.get(d_recv, dtype), want, dtype)
        for name in names["bcast"]:
            for root in {0, p - 1}:
                host = host_data(rng, dtype, m, rank)
                want = host.copy()
                comm.Bcast(want, root)
                d_buf = dev.put(host)
                before = host_calls.calls
                res = mlcomm.bcast(d_buf, root, algorithm=name)
                expect_host_calls(f"bcast {name}", before,
                                  len(chunks(m, dtype.itemsize, chunk_bytes)))
                if res is not d_buf:
                    failures.append(f"rank {rank} bcast {name}: result is not the buffer")
                check(f"bcast {name} {dtype} root={root}", dev.get(d_buf, dtype), want, dtype)
        for name in names["reduce"]:
            for root in {0, p - 1}:
                host = host_data(rng, dtype, m, rank)
                want = reference(comm, host, dtype, "sum")
                d_recv = dev.empty(m, dtype)
                before = host_calls.calls
                res = mlcomm.reduce(dev.put(host), d_recv, "sum", root, algorithm=name)
                expect_host_calls(f"reduce {name}", before,
                                  len(chunks(m, dtype.itemsize, chunk_bytes)))
                if rank == root:
                    check(f"reduce {name} {dtype} root={root}", dev.get(d_recv, dtype), want,
                          dtype)
                elif res is not None:
                    failures.append(f"rank {rank} reduce {name}: non-root got a result")

    # iallreduce on device arrays: the whole call (its staging, auto's agreement on a new
    # size) runs on the progress thread, after the calls started before it; host calls at
    # new sizes, made meanwhile, plan and bind once it is done (one thread at a time)
    f32 = np.dtype(np.float32)
    for k, name in enumerate(("ring", "auto", "shared_memory")):
        if direct and ALGORITHMS[name].window:
            continue
        hosts = [host_data(rng, f32, n + k, rank) for n in (5, 300, 2000)]
        requests = [mlcomm.iallreduce(dev.put(h), algorithm=name) for h in hosts[:2]]
        requests.append(mlcomm.iallreduce(hosts[2], algorithm=name))
        got = [dev.get(r.wait(), f32) for r in requests[:2]] + [requests[2].wait()]
        blocking = mlcomm.allreduce(hosts[2] * 2, algorithm=name)
        for h, g in zip(hosts, got):
            check(f"iallreduce {name} {h.size}", g, reference(comm, h, f32, "sum"), f32)
        check(f"allreduce after iallreduce {name}", blocking,
              reference(comm, hosts[2] * 2, f32, "sum"), f32)
    fresh = comm.Dup()  # its session and window set up while both threads want them
    for k in range(0 if direct else 20):  # new sizes for both threads at once, each time
        d, h = dev.put(np.full(1000 + 17 * k, rank + k, f32)), np.full(3000 + 51 * k, rank + k)
        requests = [mlcomm.iallreduce(d, algorithm="shared_memory", comm=fresh),
                    mlcomm.iallreduce(h, algorithm="shared_memory", comm=fresh)]
        want = p * k + p * (p - 1) // 2
        cases += 1
        if not (np.all(dev.get(requests[0].wait(), f32) == want)
                and np.all(requests[1].wait() == want)):
            failures.append(f"rank {rank} device and host iallreduce {k}: wrong sums")
    fresh.Free()

    # validate=True: a bad device buffer on the last rank fails every rank instead of hanging
    good = dev.put(np.zeros(8, np.float32))
    bad = dev.put(np.zeros(16, np.float32))[::2] if rank == p - 1 else good
    cases += 1
    try:
        mlcomm.allreduce(bad, None, "sum", algorithm="ring", validate=True)
        failures.append(f"rank {rank}: validate=True with a non-contiguous buffer did not raise")
    except ValueError as exc:
        if rank == p - 1 and "non-contiguous" not in str(exc) or \
                rank != p - 1 and f"ranks {p - 1}" not in str(exc):
            failures.append(f"rank {rank}: validate=True raised {exc}")

    # the Numba CUDA (or CuPy) kernel on device arrays: sum of two ranks' data, and bfloat16
    backend = "cupy" if args.cupy else "cuda"
    for dtype in (np.dtype(np.float32), BF16):
        x, y = host_data(rng, dtype, 33, rank), host_data(rng, dtype, 33, rank + 1)
        dx, dy = dev.put(x), dev.put(y)
        kernels.reduce_into(dx, dy, "sum", backend=backend, dtype=BF16 if dtype == BF16 else None)
        check(f"reduce_into {backend} {dtype}", dev.get(dx, dtype),
              (x.astype(np.float64) + y.astype(np.float64)), dtype)

    everyone = comm.gather(failures, root=0)
    total = comm.reduce(cases, root=0)
    if rank == 0:
        bad = [f for fs in everyone for f in fs]
        for line in bad[:20]:
            print("MISMATCH", line)
        kind = "cupy" if args.cupy else ("numba-cudasim" if gpu.simulator() else "numba-cuda")
        path = ("direct" if direct else
                f"staged, {chunk_bytes}-byte chunks, up to {most_chunks} per call")
        print(f"gpu_job: {p} ranks, {kind} device arrays, {len(algorithms)} allreduce algorithms "
              f"x {len(DTYPES)} dtypes, {total} checks, {len(bad)} mismatches; path: {path}; "
              f"CUDA-aware: {gpu.cuda_aware_decision()}")
        sys.stdout.flush()
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    code = abort_on_error(main)
    code = MPI.COMM_WORLD.bcast(code, root=0)
    sys.exit(code)
