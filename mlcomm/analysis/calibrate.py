"""Measure alpha, beta and gamma on this machine and this MPI; write the profile.

alpha and beta come from a ping-pong between ranks 0 and 1 over a range of
sizes: the one-way time ``t(n) = alpha + n * beta`` is fitted by least
squares on relative error (each size weighs the same, so the small sizes
fix alpha and the large ones beta).  gamma comes from timing
``mlcomm.kernels.reduce_into`` per backend, dtype and op on rank 0.  This is
a transport-level tool: it calls mpi4py directly.
"""

from __future__ import annotations

import datetime
import platform
import time

import numpy as np

__all__ = ["PINGPONG_SIZES", "QUICK_SIZES", "GAMMA_DTYPES", "GAMMA_OPS",
           "pingpong", "fit_alpha_beta", "measure_gamma", "calibrate"]

PINGPONG_SIZES = tuple(8 << (3 * i) for i in range(8))        # 8 B .. 16 MiB
QUICK_SIZES = (8, 512, 4096, 32768, 262144)
GAMMA_DTYPES = ("float64", "float32", "float16", "bfloat16", "int32", "int64")
GAMMA_OPS = ("sum", "prod", "min", "max")


def _iters(nbytes: int, quick: bool) -> int:
    budget = (1 << 22) if quick else (1 << 26)  # bytes moved per size
    cap = 50 if quick else 500
    return int(max(5, min(cap, budget // max(nbytes, 1))))


def pingpong(comm, sizes=PINGPONG_SIZES, *, quick: bool = False) -> list[tuple[int, float]]:
    """Return ``[(bytes, one-way seconds)]`` measured between ranks 0 and 1 (rank 0's list).

    Each size is timed in a few batches; the fastest batch counts (the
    least disturbed by other processes).  Other ranks wait at a barrier.
    """
    rank = comm.Get_rank()
    out = []
    for n in sizes:
        buf = np.zeros(max(n, 1), np.uint8)
        iters = _iters(n, quick)
        best = float("inf")
        comm.Barrier()
        for batch in range(3 if quick else 5):
            if rank == 0:
                comm.Send([buf, n, _byte()], dest=1, tag=7)   # warm-up round trip
                comm.Recv([buf, n, _byte()], source=1, tag=7)
                t0 = time.perf_counter()
                for _ in range(iters):
                    comm.Send([buf, n, _byte()], dest=1, tag=7)
                    comm.Recv([buf, n, _byte()], source=1, tag=7)
                best = min(best, (time.perf_counter() - t0) / (2 * iters))
            elif rank == 1:
                for _ in range(iters + 1):
                    comm.Recv([buf, n, _byte()], source=0, tag=7)
                    comm.Send([buf, n, _byte()], dest=0, tag=7)
        out.append((n, best))
    comm.Barrier()
    return out


def _byte():
    from mpi4py import MPI
    return MPI.BYTE


def fit_alpha_beta(samples) -> tuple[float, float]:
    """Least-squares ``t = alpha + n * beta`` on relative error; both clamped at >= 0."""
    n = np.array([s[0] for s in samples], float)
    t = np.array([s[1] for s in samples], float)
    a = np.stack([np.ones_like(n), n], axis=1) / t[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    if beta <= 0:  # flat curve: latency only
        beta = 0.0
    if alpha < 0:  # refit beta through the origin
        alpha = 0.0
        beta = float((n * t).sum() / (n * n).sum())
    return float(alpha), float(beta)


def measure_gamma(nbytes: int = 1 << 22, *, dtypes=GAMMA_DTYPES, ops=GAMMA_OPS,
                  backends=None, repeat: int = 5) -> dict:
    """Return ``{backend: {dtype: {op: seconds per byte of dst}}}`` from ``reduce_into`` timings."""
    from ..kernels import BFLOAT16, backends as kernel_backends, is_supported, reduce_into
    if backends is None:
        backends = [name for name, state in kernel_backends().items()
                    if state["available"] and name in ("numpy", "numba")]
    out: dict = {}
    for backend in backends:
        for dname in dtypes:
            dtype = BFLOAT16 if dname == "bfloat16" else np.dtype(dname)
            if dtype is None:
                continue
            count = max(1, nbytes // dtype.itemsize)
            rng = np.random.default_rng(0)
            base = (rng.integers(1, 3, count) if dtype.kind in "iu" else
                    1 + rng.random(count) * 1e-3).astype(dtype)
            src = base.copy()
            for op in ops:
                if not is_supported(dtype, op):
                    continue
                dst = base.copy()
                try:
                    reduce_into(dst, src, op, backend=backend)  # compile / warm up
                except (TypeError, RuntimeError, ValueError):
                    continue
                best = float("inf")
                for _ in range(repeat):
                    dst[...] = base
                    t0 = time.perf_counter()
                    reduce_into(dst, src, op, backend=backend)
                    best = min(best, time.perf_counter() - t0)
                out.setdefault(backend, {}).setdefault(dname, {})[op] = best / (count * dtype.itemsize)
    return out


def measure_overheads(comm, alpha: float, *, calls: int = 2000) -> tuple[float, float]:
    """Time what mlcomm's loop adds per schedule step and per local op (seconds).

    A 2-element-per-rank ring plan, bound once, runs ``calls`` times on ``comm``; what is
    left after ``alpha`` per step and the measured per-op time is the per-step overhead.
    The compiled loop runs its ops in machine code, so their overhead counts as nil.
    """
    import time

    from ..session import session_of
    from ..kernels import kernel_for
    a, b = np.ones(1), np.ones(1)
    fn = kernel_for(a, b, "sum")
    start = time.perf_counter()
    for _ in range(calls):
        fn(a, b)
        np.copyto(a, b)
    op_cost = (time.perf_counter() - start) / (2 * calls)
    s = session_of(comm)
    p = comm.Get_size()
    x, y = np.ones(2 * p), np.empty(2 * p)
    plan = s.plan("allreduce", "ring", 2 * p, x.dtype, "sum", {})
    steps = len(plan.schedule.steps)
    ops = sum(len(step.ops) for step in plan.schedule.steps)
    bound = s.own_binding(plan, x, y)
    if bound.compiled:
        op_cost = 0.0
    for _ in range(50):
        bound.run()
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(calls):
        bound.run()
    per_call = comm.allreduce(time.perf_counter() - start, op=_max()) / calls
    bound.free()
    step_cost = max(0.0, (per_call - ops * op_cost) / steps - alpha)
    return step_cost, op_cost


def _max():
    from mpi4py import MPI
    return MPI.MAX


def calibrate(comm, *, sizes=None, quick: bool = False, gamma_bytes: int | None = None,
              dtypes=GAMMA_DTYPES, ops=GAMMA_OPS, path=None, write: bool = True):
    """Measure on ``comm`` (at least 2 ranks); rank 0 returns and writes the Profile, others None."""
    from mpi4py import MPI

    from ..model.machine import Profile, default_path, load_profile, save_profile
    if comm.Get_size() < 2:
        raise RuntimeError("calibrate needs at least 2 ranks for the ping-pong: "
                           "run `mpiexec -n 2 mlcomm calibrate`")
    sizes = tuple(sizes or (QUICK_SIZES if quick else PINGPONG_SIZES))
    samples = pingpong(comm, sizes, quick=quick)
    alpha, beta = comm.bcast(fit_alpha_beta(samples) if comm.Get_rank() == 0 else None, root=0)
    step_overhead, op_overhead = measure_overheads(comm, alpha, calls=500 if quick else 2000)
    gammas = {}
    if comm.Get_rank() == 0:
        gammas = measure_gamma(gamma_bytes or (1 << 20 if quick else 1 << 22),
                               dtypes=dtypes, ops=ops, repeat=3 if quick else 7)
    comm.Barrier()
    if comm.Get_rank():
        return None
    # the default gamma: float64 sum on the faster CPU backend
    found = [t["float64"]["sum"] for t in gammas.values() if "sum" in t.get("float64", {})]
    default = min(found) if found else None
    if default is None:
        flat = [v for t in gammas.values() for ops_ in t.values() for v in ops_.values()]
        default = float(np.median(flat)) if flat else Profile().gamma
    prof = Profile(alpha=alpha, beta=beta, gamma=float(default), gammas=gammas,
                   step_overhead=step_overhead, op_overhead=op_overhead,
                   tuned=load_profile(path).tuned,  # measured choices stay (mlcomm tune)
                   source=str(path or default_path()),
                   meta={"created": datetime.datetime.now().isoformat(timespec="seconds"),
                         "host": platform.node(),
                         "mpi": MPI.Get_library_version().splitlines()[0].strip(),
                         "ranks": comm.Get_size(),
                         "pingpong": [[int(n), float(t)] for n, t in samples]})
    if write:
        prof.source = str(save_profile(prof, path))
    return prof
