"""Numba CPU reduction kernels: ``@njit(parallel=True, cache=True)`` loops over ``prange``.

Integer sum/prod and every bitwise or logical op run on the unsigned view of the same width
(two's-complement wrap-around gives the same bits), complex sum runs on the real view, so a
handful of compiled signatures cover every dtype. float16 and bfloat16 are not handled here
(Numba has no CPU arithmetic for them): the dispatcher sends them to NumPy.

Threads: ``max(1, usable cpus // ranks on this node)``, ranks on this node read from
``MPI_LOCALNRANKS`` (MPICH/Hydra), ``OMPI_COMM_WORLD_LOCAL_SIZE`` (Open MPI),
``MV2_COMM_WORLD_LOCAL_SIZE``, ``PMI_LOCAL_SIZE`` or ``SLURM_NTASKS_PER_NODE``, so MPI ranks on
one node do not oversubscribe it. ``MLCOMM_NUM_THREADS`` overrides.
"""

import os
import re

import numpy as np

__all__ = ["available", "supports", "reduce_into", "finalize", "copy", "num_threads"]

try:
    import numba
    from numba import njit, prange
    _IMPORT_ERROR = None
except ImportError as exc:  # pragma: no cover - numba is a hard dependency
    numba = None
    _IMPORT_ERROR = exc

_LOCAL_SIZE_VARS = ("MLCOMM_LOCAL_SIZE", "MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE",
                    "MV2_COMM_WORLD_LOCAL_SIZE", "PMI_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE")

_UINT = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32),
         8: np.dtype(np.uint64)}
_REAL = {np.dtype(np.complex64): np.dtype(np.float32),
         np.dtype(np.complex128): np.dtype(np.float64)}
_NATIVE = frozenset(np.dtype(t) for t in (
    np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
    np.float32, np.float64, np.complex64, np.complex128, np.bool_))


def available():
    """Return (ok, detail)."""
    if numba is None:
        return False, f"numba not importable: {_IMPORT_ERROR}"
    return True, (f"numba {numba.__version__}, {num_threads()} thread(s), "
                  f"threading layer {numba.config.THREADING_LAYER}")


def supports(dtype, op=None):
    """Return True when this backend has a kernel for ``dtype`` (and ``op`` when given).

    float16/bfloat16 have none, and complex prod is left to NumPy, whose C99 rules for
    infinite and signed-zero operands a plain Numba multiply does not follow bit for bit.
    """
    if numba is None or dtype not in _NATIVE:
        return False
    return not (op == "prod" and dtype.kind == "c")


def _local_size():
    for var in _LOCAL_SIZE_VARS:
        value = os.environ.get(var)
        if value:
            match = re.match(r"\s*(\d+)", value)  # SLURM_NTASKS_PER_NODE may read "4(x2)"
            if match and int(match.group(1)) > 0:
                return int(match.group(1))
    return 1


_threads = None


def num_threads():
    """Return the thread count the kernels use in this process."""
    global _threads
    if _threads is None:
        forced = os.environ.get("MLCOMM_NUM_THREADS")
        if forced:
            n = int(forced)
        else:
            try:
                cpus = len(os.sched_getaffinity(0))
            except AttributeError:  # pragma: no cover - not Linux
                cpus = os.cpu_count() or 1
            n = cpus // _local_size()
        cap = numba.config.NUMBA_NUM_THREADS if numba is not None else 1
        _threads = max(1, min(n, cap))
    return _threads


if numba is not None:
    _jit = njit(parallel=True, cache=True, nogil=True)

    @_jit
    def _sum(d, s):
        for i in prange(d.shape[0]):
            d[i] = d[i] + s[i]

    @_jit
    def _prod(d, s):
        for i in prange(d.shape[0]):
            d[i] = d[i] * s[i]

    @_jit
    def _min(d, s):
        # NumPy's np.minimum bit for bit: NaN in d wins, then NaN in s, ties give s.
        for i in prange(d.shape[0]):
            a = d[i]
            b = s[i]
            if not (a < b or a != a):
                d[i] = b

    @_jit
    def _max(d, s):
        for i in prange(d.shape[0]):
            a = d[i]
            b = s[i]
            if not (a > b or a != a):
                d[i] = b

    @_jit
    def _band(d, s):
        for i in prange(d.shape[0]):
            d[i] = d[i] & s[i]

    @_jit
    def _bor(d, s):
        for i in prange(d.shape[0]):
            d[i] = d[i] | s[i]

    @_jit
    def _bxor(d, s):
        for i in prange(d.shape[0]):
            d[i] = d[i] ^ s[i]

    @_jit
    def _land(d, s):
        for i in prange(d.shape[0]):
            d[i] = 1 if (d[i] != 0 and s[i] != 0) else 0

    @_jit
    def _lor(d, s):
        for i in prange(d.shape[0]):
            d[i] = 1 if (d[i] != 0 or s[i] != 0) else 0

    @_jit
    def _div(d, n):
        for i in prange(d.shape[0]):
            d[i] = d[i] / n

    @_jit
    def _copy(d, s):
        for i in prange(d.shape[0]):
            d[i] = s[i]

    _KERNELS = {"sum": _sum, "avg": _sum, "prod": _prod, "min": _min, "max": _max,
                "band": _band, "bor": _bor, "bxor": _bxor, "land": _land, "lor": _lor}


def kernel_dtype(dtype, op):
    """Return the dtype the kernel for (``dtype``, ``op``) really runs on."""
    kind = dtype.kind
    if kind in "iub":
        if op in ("min", "max"):
            return dtype
        return _UINT[dtype.itemsize]
    if kind == "c" and op in ("sum", "avg"):
        return _REAL[dtype]
    return dtype


def _flat(a, dtype):
    """Return a 1-D view of a contiguous array, reinterpreted as ``dtype``."""
    order = "C" if a.flags.c_contiguous else "F"
    flat = a.ravel(order=order)
    return flat if flat.dtype == dtype else flat.view(dtype)


def _run(fn, *args):
    n = num_threads()
    prev = numba.get_num_threads()
    if prev != n:
        numba.set_num_threads(n)
        try:
            fn(*args)
        finally:
            numba.set_num_threads(prev)
    else:
        fn(*args)


def contiguous_pair(dst, src):
    """Return True when both arrays are contiguous in the same order (a flat view exists)."""
    if dst.flags.c_contiguous and src.flags.c_contiguous:
        return True
    return dst.flags.f_contiguous and src.flags.f_contiguous


def reduce_into(dst, src, op):
    """Set ``dst = dst (op) src`` in place; both contiguous, same shape and supported dtype."""
    kdt = kernel_dtype(dst.dtype, op)
    _run(_KERNELS[op], _flat(dst, kdt), _flat(src, kdt))


def finalize(dst, op, nranks):
    """Divide ``dst`` by ``nranks`` in place when ``op`` is avg."""
    if op != "avg":
        return
    real = _REAL.get(dst.dtype, dst.dtype)
    flat = _flat(dst, real)
    _run(_div, flat, real.type(nranks))


def copy(dst, src):
    """Copy ``src`` into ``dst`` with the same threads (bandwidth baseline)."""
    kdt = _UINT.get(dst.dtype.itemsize, dst.dtype)
    _run(_copy, _flat(dst, kdt), _flat(src, kdt))
