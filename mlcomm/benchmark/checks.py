"""The check of ``--check``: rank-dependent data that reduces exactly, its all-reduce
computed locally, and the count of wrong elements."""

import numpy as np

_RTOL = {2: 2e-2, 4: 1e-5, 8: 1e-12}   # float tolerance by itemsize


def _fill(out, rank: int, size: int, op: str, offset: int = 0):
    """Fill host array ``out`` with rank-dependent check data that reduces exactly."""
    n = out.size
    i = np.arange(offset, offset + n, dtype=np.int64)
    kind = out.dtype.kind
    if op in ("land", "lor"):
        v = ((i + rank) % (size + 1)) != 0
    elif op in ("band", "bor", "bxor"):
        v = (i * 2654435761 + (rank + 1) * 40503) & 0x7F
    elif op in ("min", "max"):
        v = (i * 7 + rank * 13) % 97 - (0 if kind in "ub" else 48)
    elif op == "prod":
        v = 1 - 2 * ((i + rank) % 2) if kind not in "ub" else 1 + (i + rank) % 2
    else:   # sum, avg: small integers, exact in every float type at moderate p
        v = (i * 7 + rank * 3) % 5 - (0 if kind in "ub" else 2)
    out[...] = v.astype(out.dtype) if kind != "b" else v.astype(bool)
    return out


def _reference(dtype, count, size, op):
    """Compute the all-reduce result of every rank's :func:`_fill` data locally."""
    acc = None
    for r in range(size):
        x = _fill(np.empty(count, dtype), r, size, op)
        x = x.astype(np.float64) if dtype.kind == "f" or op == "avg" else x
        if acc is None:
            acc = x.copy()
        elif op in ("sum", "avg"):
            acc += x
        elif op == "prod":
            acc *= x
        elif op == "min":
            np.minimum(acc, x, out=acc)
        elif op == "max":
            np.maximum(acc, x, out=acc)
        elif op == "band":
            acc &= x
        elif op == "bor":
            acc |= x
        elif op == "bxor":
            acc ^= x
        elif op == "land":
            acc = np.logical_and(acc, x)
        elif op == "lor":
            acc = np.logical_or(acc, x)
    if op == "avg":
        acc = acc / size
    return acc


def _count_wrong(result, ref, dtype, op) -> int:
    """Count the elements of ``result`` that differ from ``ref``."""
    if dtype.kind == "f" or op == "avg":
        r = np.asarray(result).astype(np.float64)
        e = np.asarray(ref).astype(np.float64)
        rtol = _RTOL.get(dtype.itemsize, 1e-5) if dtype.kind == "f" else 0.0
        atol = rtol if dtype.kind == "f" else 1.0      # integer avg may round
        ok = np.isclose(r, e, rtol=rtol, atol=atol, equal_nan=True)
        return int(ok.size - np.count_nonzero(ok))
    if op in ("land", "lor"):
        return int(np.count_nonzero(np.asarray(result).astype(bool) != np.asarray(ref).astype(bool)))
    return int(np.count_nonzero(np.asarray(result) != np.asarray(ref)))
