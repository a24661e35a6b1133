"""Check every algorithm against the MPI library's own ``MPI_Allreduce`` on this job.

Every case is one call on every rank, then one ``allgather`` of each rank's verdict and
digest, whatever happened locally, so the ranks always enter the same collectives: a
wrong result on one rank is a failure on all of them, never a hang.
"""

from __future__ import annotations

import os
import time
import zlib
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from .algorithms import ALGORITHMS, MPI_NATIVE, resolve
from .api import IN_PLACE, allreduce
from .benchmark.harness import corrupt
from .kernels import BFLOAT16, DTYPES, OPS, is_supported, normalize_op, supported_dtypes

__all__ = ["DTYPES", "OPS", "CORRUPT_RANK_ENV", "Row", "sample", "reference", "close",
           "verify"]

#: Test hook: the rank named here changes one element of each result before it is checked.
CORRUPT_RANK_ENV = "MLCOMM_VERIFY_CORRUPT_RANK"

_BY_NAME = {d.name: d for d in supported_dtypes()}
_NARROW_FLOATS = (np.dtype(np.float16), BFLOAT16)


@dataclass
class Row:
    """One algorithm x dtype of the matrix, the same on every rank."""

    algorithm: str
    dtype: str
    cases: int = 0
    failures: int = 0
    seconds: float = 0.0
    first_failure: str = ""
    skipped: str = ""          # why there is no case, when there is none
    note: str = ""             # ops left out of a row that has cases, and why

    @property
    def status(self) -> str:
        return "FAIL" if self.failures else "SKIP" if not self.cases else "PASS"

    @property
    def verdict(self) -> str:
        if self.failures:
            return f"FAIL ({self.first_failure})"
        if not self.cases:
            return f"SKIP ({self.skipped})"
        return f"PASS ({self.note})" if self.note else "PASS"


def sample(dtype, op, count, rank, seed=0):
    """Test data for ``op``: small integers, floats near 1 for prod, mixed signs otherwise."""
    rng = np.random.default_rng([seed, rank, count])
    if dtype.kind == "b":
        return rng.integers(0, 2, count).astype(bool)
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
    if got.dtype == BFLOAT16:
        eps = 2.0 ** -7
    else:
        eps = float(np.finfo(got.dtype).eps)
    scale = max(float(np.max(np.abs(want))) if want.size else 0.0, 1.0)
    return bool(np.all(np.abs(got.astype(want.dtype) - want) <= 4 * p * eps * scale))


def _problem(got, x, x_before, want, p, op, in_place) -> str:
    """What is wrong with this rank's result, or ''."""
    if not isinstance(got, np.ndarray):
        return f"returned {type(got).__name__}, not an ndarray"
    if got.dtype != x.dtype:
        return f"result dtype {got.dtype}, input {x.dtype}"
    if got.shape != x.shape:
        return f"result shape {got.shape}, input {x.shape}"
    if not in_place and x.tobytes() != x_before.tobytes():
        return "the input buffer changed"
    if not close(got, want, p, op):
        return "differs from MPI_Allreduce"
    return ""


def _mpi_lacks(dtype, op) -> str:
    """Why the MPI library cannot reduce ``dtype`` with ``op`` itself, or ''."""
    if dtype in _NARROW_FLOATS:
        return f"MPI has no {dtype.name} reduction"
    if dtype.kind == "b" and op in ("band", "bor", "bxor"):
        return "MPI has no bitwise op on bool"
    return ""


def _plan_row(name, dtype, ops) -> tuple:
    """``(ops to run, why some or all are left out)`` for ``name`` x ``dtype``."""
    ops = [op for op in ops if is_supported(dtype, op)]
    if not ops:
        return [], "no op given applies to " + dtype.name
    lacks = {op: _mpi_lacks(dtype, op) for op in ops} if name == MPI_NATIVE else {}
    left_out = [op for op in ops if lacks.get(op)]
    run = [op for op in ops if op not in left_out]
    if not left_out:
        return run, ""
    reasons = dict.fromkeys(lacks[op] for op in left_out)
    return run, "; ".join(reasons) if not run else \
        f"{','.join(left_out)} left out: {'; '.join(reasons)}"


def _corrupt_rank():
    text = os.environ.get(CORRUPT_RANK_ENV, "").strip()
    return int(text) if text else None


def _check_names(algorithms, dtypes, ops):
    algorithms = [resolve(a) for a in algorithms] if algorithms else \
        [a for a in ALGORITHMS if a != MPI_NATIVE] + [MPI_NATIVE]
    dtypes = list(dtypes) if dtypes else list(DTYPES)
    bad = [d for d in dtypes if d not in _BY_NAME]
    if bad:
        raise ValueError(f"unknown dtype {', '.join(map(repr, bad))}; "
                         f"choose from {', '.join(DTYPES)}")
    ops = [normalize_op(op) for op in ops] if ops else list(OPS)
    return algorithms, dtypes, ops


def verify(comm=None, algorithms=None, dtypes=None, ops=None, counts=None, seed=0):
    """Run the matrix on ``comm``; return one :class:`Row` per algorithm x dtype.

    ``algorithms`` (default: all, ``mpi`` last), ``dtypes`` (names, default: every one in
    :data:`DTYPES`) and ``ops`` (default: every one in :data:`OPS`) are checked first: an
    unknown name is a ValueError naming the valid ones.  Each case passes only when, on
    every rank, the result has the input's dtype and shape, matches ``MPI_Allreduce``
    (exactly for integers, min/max and logic), the input is unchanged, and the result is
    bit-identical across ranks.  A row with no case (``mpi`` on float16, or no op that
    applies to the dtype) is skipped and says why; so does a row that leaves some ops out
    (``mpi`` has no bitwise op on bool).
    """
    comm = MPI.COMM_WORLD if comm is None else comm
    algorithms, dtypes, ops = _check_names(algorithms, dtypes, ops)
    p, rank = comm.Get_size(), comm.Get_rank()
    counts = counts or sorted({0, 1, max(p - 1, 1), p + 1, 1000, 65537})
    bad_rank = _corrupt_rank()
    rows = []
    for name in algorithms:
        for dname in dtypes:
            dtype = _BY_NAME[dname]
            row_ops, why = _plan_row(name, dtype, ops)
            row = Row(name, dname, skipped=why if not row_ops else "",
                      note=why if row_ops else "")
            start = time.perf_counter()
            for op in row_ops:
                for count in counts:
                    x = sample(dtype, op, count, rank, seed)
                    want = reference(comm, x, op)
                    for in_place in (False, True):
                        row.cases += 1
                        x_before = x.copy()
                        if in_place:
                            got = x.copy()
                            allreduce(IN_PLACE, got, op, comm=comm, algorithm=name)
                        else:
                            got = allreduce(x, None, op, comm=comm, algorithm=name)
                        if rank == bad_rank and isinstance(got, np.ndarray):
                            corrupt(got)
                        problem = _problem(got, x, x_before, want, p, op, in_place)
                        digest = -1 if problem else zlib.crc32(
                            np.ascontiguousarray(got).view(np.uint8).tobytes())
                        states = comm.allgather((problem, digest))  # every rank, every case
                        wrong = [(r, s) for r, (s, _) in enumerate(states) if s]
                        if not wrong and len({d for _, d in states}) > 1:
                            wrong = [(-1, "results differ across ranks")]
                        if wrong:
                            row.failures += 1
                            where = ", ".join(f"rank {r}: {s}" if r >= 0 else s
                                              for r, s in wrong[:3])
                            row.first_failure = row.first_failure or (
                                f"op={op} count={count} "
                                f"{'in-place' if in_place else 'out-of-place'}: {where}")
            row.seconds = time.perf_counter() - start
            rows.append(row)
    return rows
