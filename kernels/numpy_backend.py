"""NumPy reduction kernels: one ufunc call with ``out=`` per reduction."""

import numpy as np

__all__ = ["available", "reduce_into", "bare_kernel", "bare_kernel3", "finalize", "copy"]

_UFUNCS = {
    "sum": np.add, "avg": np.add, "prod": np.multiply,
    "min": np.minimum, "max": np.maximum,
    "band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor,
    "land": np.logical_and, "lor": np.logical_or,
}

_REAL = {np.dtype(np.complex64): np.dtype(np.float32),
         np.dtype(np.complex128): np.dtype(np.float64)}


def available():
    """Return (True, detail): NumPy is always there."""
    return True, f"numpy {np.__version__}"


def reduce_into(dst, src, op):
    """Set ``dst = dst (op) src`` elementwise, in place (op already normalised and checked)."""
    ufunc = _UFUNCS[op]
    if dst.dtype.kind in "iub":
        ufunc(dst, src, out=dst)
    else:
        # MPI reductions never warn on overflow or NaN; neither do we.
        with np.errstate(all="ignore"):
            ufunc(dst, src, out=dst)


def bare_kernel(op):
    """Return ``fn(dst, src)`` without the warning guard: the caller holds ``np.errstate``."""
    ufunc = _UFUNCS[op]
    return lambda dst, src: ufunc(dst, src, out=dst)


def bare_kernel3(op):
    """Return ``fn(dst, left, src)`` setting ``dst = left (op) src``; any overlap is fine."""
    ufunc = _UFUNCS[op]
    return lambda dst, left, src: ufunc(left, src, out=dst)


def finalize(dst, op, nranks):
    """Divide ``dst`` by ``nranks`` in place when ``op`` is avg."""
    if op != "avg":
        return
    real = _REAL.get(dst.dtype)
    if real is not None:  # divide both components exactly like a real division
        dst = dst.view(real)
    with np.errstate(all="ignore"):
        if dst.dtype.itemsize == 2:  # float16/bfloat16: nranks may not be exact there
            np.copyto(dst, np.true_divide(dst, np.float32(nranks), dtype=np.float32),
                      casting="unsafe")
        else:
            np.true_divide(dst, dst.dtype.type(nranks), out=dst)


def copy(dst, src):
    """Copy ``src`` into ``dst`` (the baseline the bandwidth benchmark compares with)."""
    np.copyto(dst, src)
