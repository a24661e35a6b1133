"""Check every algorithm against the MPI library's own ``MPI_Allreduce`` on this job."""

from __future__ import annotations

import time
import zlib

import ml_dtypes
import numpy as np
from mpi4py import MPI

from . import api, kernels
from .algorithms import ALGORITHMS, MPI_NATIVE

__all__ = ["DTYPES", "OPS", "reference", "close", "verify"]

DTYPES = ("int8", "int32", "int64", "uint16", "float16", "bfloat16", "float32", "float64",
          "complex128")
_NARROW_FLOATS = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))
OPS = ("sum", "prod", "min", "max", "avg", "band", "bor", "bxor", "land", "lor")


def _dtype(name):
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def sample(dtype, op, count, rank, seed=0):
    """Test data for ``op``: small integers, floats near 1 for prod, mixed signs otherwise."""
    rng = np.random.default_rng([seed, rank, count])
    if dtype.kind in "iu":
        hi = 3 if op == "prod" else 50
        lo = 0 if dtype.kind == "u" or op in ("band", "bor", "bxor") else -hi
        return rng.integers(lo, hi, count).astype(dtype)
    if op == "prod":
        x = rng.uniform(0.9, 1.1, count)
    else:
        x = rng.standard_normal(count)
    if dtype.kind == "c":
        x = x + 1j * (rng.uniform(0.9, 1.1, count) if op == "prod" else rng.standard_normal(count))
    return x.astype(dtype)


def reference(comm, x, op):
    """``MPI_Allreduce`` of ``x``; types MPI cannot reduce go through float64/complex128."""
    wide = x.astype(np.float64) if x.dtype in _NARROW_FLOATS else x
    out = np.empty_like(wide)
    mpi_op = {"avg": MPI.SUM}.get(op) or getattr(MPI, op.upper())
    if x.dtype == np.bool_:  # MPI defines only the logical ops on C bool
        mpi_op = {"band": MPI.LAND, "bor": MPI.LOR, "bxor": MPI.LXOR,
                  "min": MPI.LAND, "max": MPI.LOR}.get(op, mpi_op)
    comm.Allreduce(wide, out, mpi_op)
    if op == "avg":
        out = out / comm.Get_size()
    return out


def close(got, want, p, op):
    """Exact for integers, min/max and logic; a rounding-error bound for sums and products."""
    if got.dtype.kind in "iub" or op in ("min", "max"):
        return np.array_equal(got.astype(want.dtype), want)
    eps = float(np.finfo(np.float32 if got.dtype == _dtype("bfloat16") else got.dtype).eps)
    if got.dtype == _dtype("bfloat16"):
        eps = 2.0 ** -7
    scale = max(float(np.max(np.abs(want))) if want.size else 0.0, 1.0)
    return bool(np.all(np.abs(got.astype(want.dtype) - want) <= 4 * p * eps * scale))


def _identical_everywhere(comm, result):
    digest = zlib.crc32(np.ascontiguousarray(result).view(np.uint8).tobytes())
    return len(set(comm.allgather(digest))) == 1


def verify(comm=None, algorithms=None, dtypes=DTYPES, ops=OPS, counts=None, seed=0):
    """Run the matrix; return rows ``(algorithm, dtype, cases, failures, seconds, first_failure)``."""
    comm = MPI.COMM_WORLD if comm is None else comm
    p, rank = comm.Get_size(), comm.Get_rank()
    counts = counts or sorted({0, 1, max(p - 1, 1), p + 1, 1000, 65537})
    algorithms = algorithms or [a for a in ALGORITHMS if a != MPI_NATIVE] + [MPI_NATIVE]
    rows = []
    for name in algorithms:
        for dname in dtypes:
            dtype = _dtype(dname)
            cases = fails = 0
            first = ""
            start = time.perf_counter()
            for op in ops:
                if not kernels.is_supported(dtype, op):
                    continue
                if name == MPI_NATIVE and dtype in _NARROW_FLOATS:
                    continue
                for count in counts:
                    x = sample(dtype, op, count, rank, seed)
                    want = reference(comm, x, op)
                    for in_place in (False, True):
                        cases += 1
                        if in_place:
                            got = x.copy()
                            api.allreduce(api.IN_PLACE, got, op, comm=comm, algorithm=name)
                        else:
                            got = api.allreduce(x, None, op, comm=comm, algorithm=name)
                        ok = close(got, want, p, op) and _identical_everywhere(comm, got)
                        ok = comm.allreduce(ok, op=MPI.LAND)
                        if not ok:
                            fails += 1
                            first = first or f"op={op} count={count} in_place={in_place}"
            rows.append((name, dname, cases, fails, time.perf_counter() - start, first))
    return rows
