"""NumPy reduction kernels: the op's ufunc (:attr:`Op.ufunc`) with ``out=``.

``np.maximum``/``np.minimum`` already propagate NaN as :mod:`.ops` says (the first
operand's NaN, else the second's, bits unchanged) but give either zero when ``-0.0`` meets
``+0.0``. For floats, max and min therefore look for zeros in the first operand, and only
where both operands are zeros set the result's bits to the AND (max) or OR (min) of theirs:
the sign order ``-0 < +0``, whatever the ufunc picked.
"""

import numpy as np

from .ops import OP_TABLE

__all__ = ["available", "reduce_into", "bare_kernel", "bare_kernel3", "finalize", "copy"]

_REAL = {np.dtype(np.complex64): np.dtype(np.float32),
         np.dtype(np.complex128): np.dtype(np.float64)}
_UINT = {2: np.dtype(np.uint16), 4: np.dtype(np.uint32), 8: np.dtype(np.uint64)}


def available():
    """Return (True, detail): NumPy is always there."""
    return True, f"numpy {np.__version__}"


def _zeros(is_max):
    """Return ``zeros(a, b)``: (where both are zeros, the result's bits there) or None.

    Call it before the ufunc overwrites either operand; integers need no fix.
    """
    def zeros(a, b):
        if a.dtype.kind in "iu":
            return None
        both = _is_zero(a)
        if not both.any():
            return None
        both &= _is_zero(b)
        if not both.any():
            return None
        uint = _UINT[a.dtype.itemsize]
        x, y = a.view(uint)[both], b.view(uint)[both]
        return both, (x & y if is_max else x | y)
    return zeros


def _is_zero(a):
    if a.dtype.itemsize == 2:  # float16/bfloat16: integer work on the bits beats their ufuncs
        return (a.view(np.uint16) & np.uint16(0x7FFF)) == 0
    return a == 0


#: op name -> its signed-zero fix (ops that pick an operand) or None
_ZEROS = {name: _zeros(name == "max") if info.picks else None
          for name, info in OP_TABLE.items()}


def _set(dst, fix):
    if fix is not None:
        where, bits = fix
        dst.view(_UINT[dst.dtype.itemsize])[where] = bits


def reduce_into(dst, src, op):
    """Set ``dst = dst (op) src`` elementwise, in place (op already normalised and checked)."""
    ufunc = OP_TABLE[op].ufunc
    if dst.dtype.kind in "iub":
        ufunc(dst, src, out=dst)
        return
    # MPI reductions never warn on overflow or NaN; neither do we.
    with np.errstate(all="ignore"):
        zeros = _ZEROS[op]
        fix = zeros(dst, src) if zeros is not None else None
        ufunc(dst, src, out=dst)
        _set(dst, fix)


def bare_kernel(op):
    """Return ``fn(dst, src)`` without the warning guard: the caller holds ``np.errstate``."""
    ufunc, zeros = OP_TABLE[op].ufunc, _ZEROS[op]
    if zeros is None:
        return lambda dst, src: ufunc(dst, src, out=dst)

    def kernel(dst, src):
        fix = zeros(dst, src)
        ufunc(dst, src, out=dst)
        _set(dst, fix)
    return kernel


def bare_kernel3(op):
    """Return ``fn(dst, left, src)`` setting ``dst = left (op) src``; any overlap is fine."""
    ufunc, zeros = OP_TABLE[op].ufunc, _ZEROS[op]
    if zeros is None:
        return lambda dst, left, src: ufunc(left, src, out=dst)

    def kernel(dst, left, src):
        fix = zeros(left, src)
        ufunc(left, src, out=dst)
        _set(dst, fix)
    return kernel


def finalize(dst, op, nranks):
    """Divide ``dst`` by ``nranks`` in place when ``op`` is avg."""
    if not OP_TABLE[op].divides:
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
