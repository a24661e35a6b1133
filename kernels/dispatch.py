"""Pick a reduction backend from the array type and run ``reduce_into``/``finalize`` on it.

NumPy arrays go to "numba" when they are large (at least :data:`NUMBA_MIN_BYTES`, or
:data:`NUMBA_MIN_BYTES_HALF` for float16/bfloat16), contiguous and of a dtype Numba can do, else
to "numpy". ``MLCOMM_KERNEL=numpy|numba`` forces the CPU backend (non-contiguous arrays and
complex prod still use NumPy). Arrays exposing
``__cuda_array_interface__`` go to "cupy" when they are CuPy arrays, else to "cuda" (Numba CUDA).
"""

import os

import numpy as np

from . import numpy_backend
from .ops import OP_TABLE, check_op, dtype_kind, normalize_op

__all__ = ["BACKENDS", "NUMBA_MIN_BYTES", "NUMBA_MIN_BYTES_HALF", "reduce_into", "kernel_for",
           "finalize", "select_backend", "backends"]

#: Every backend name, CPU first.
BACKENDS = ("numpy", "numba", "cuda", "cupy")

#: NumPy arrays at least this large use the Numba backend when it is allowed. Below it the
#: parallel launch costs more than it saves (measured on a 2-core machine: numba overtakes
#: numpy ufuncs for float32 sum between 64 KiB and 256 KiB; see kernels/bandwidth.py).
NUMBA_MIN_BYTES = int(os.environ.get("MLCOMM_NUMBA_MIN_BYTES", 256 * 1024))

#: float16/bfloat16 arrays use Numba from this size: NumPy widens and rounds them one element
#: at a time, so Numba's fixed ~8 us launch pays from a few KiB (measured here: 1 KiB of
#: float16 sums in 10 us with NumPy, 9 us with Numba; 64 KiB in 395 us and 13 us).
NUMBA_MIN_BYTES_HALF = 4 * 1024

_numba = None  # the numba_backend module once imported, False when unusable


def _numba_backend():
    global _numba
    if _numba is None:
        try:
            from . import numba_backend
            _numba = numba_backend if numba_backend.available()[0] else False
        except Exception:  # pragma: no cover - broken numba install
            _numba = False
    return _numba


def _forced_cpu():
    value = os.environ.get("MLCOMM_KERNEL", "").strip().lower()
    if value in ("", "auto"):
        return None
    if value not in ("numpy", "numba"):
        raise ValueError(f"MLCOMM_KERNEL={value!r}: choose numpy or numba")
    return value


def _is_cupy(a):
    return type(a).__module__.split(".", 1)[0] == "cupy"


def _is_device(a):
    if hasattr(a, "__cuda_array_interface__"):
        return True
    # Numba's CUDA simulator arrays have no __cuda_array_interface__.
    return type(a).__name__ in ("FakeCUDAArray", "DeviceNDArray", "MappedNDArray")


def select_backend(dst, src=None, op=None):
    """Return the backend name ``reduce_into`` would use for these arrays (and op)."""
    if isinstance(dst, np.ndarray):
        forced = _forced_cpu()
        if forced == "numpy":
            return "numpy"
        nb = _numba_backend()
        if not nb or not nb.supports(dst.dtype, op):
            return "numpy"
        if src is not None and not nb.contiguous_pair(dst, src):
            return "numpy"
        half = dst.itemsize == 2 and dtype_kind(dst.dtype) == "f"
        if forced == "numba" or dst.nbytes >= (NUMBA_MIN_BYTES_HALF if half else NUMBA_MIN_BYTES):
            return "numba"
        return "numpy"
    if _is_device(dst):
        return "cupy" if _is_cupy(dst) else "cuda"
    raise TypeError(f"reduce_into needs NumPy arrays or CUDA device arrays, "
                    f"got {type(dst).__name__}")


def _module(name):
    if name == "numpy":
        return numpy_backend
    if name == "numba":
        nb = _numba_backend()
        if not nb:
            raise RuntimeError("the numba backend is not available")
        return nb
    if name == "cuda":
        from . import cuda_backend
        return cuda_backend
    if name == "cupy":
        from . import cupy_backend
        return cupy_backend
    raise ValueError(f"unknown kernel backend {name!r}; choose one of {', '.join(BACKENDS)}")


def kernel_for(dst, src, op, *, stream=None, dtype=None):
    """Return ``fn(dst, src)`` reducing with the backend chosen now, for these views.

    Cached plans bind it once, so a repeated collective skips the per-call dispatch.  The
    caller runs it under ``np.errstate(all="ignore")`` (MPI reductions never warn). For device
    arrays, ``stream`` is the stream the kernel launches on and ``dtype`` the element type of
    raw buffers (as in :func:`reduce_into`).
    """
    op = normalize_op(op)
    name = select_backend(dst, src, op)
    on_device = name in ("cuda", "cupy")
    dt = _device_dtype(dst, dtype) if on_device else dst.dtype
    check_op(dt, op)
    if name == "numpy":
        return numpy_backend.bare_kernel(op)
    reduce = _module(name).reduce_into
    if on_device:
        return lambda d, s: reduce(d, s, op, stream=stream, dtype=dt)
    return lambda d, s: reduce(d, s, op)


def _device_dtype(a, dtype):
    if dtype is not None:
        return np.dtype(dtype)
    return np.dtype(a.dtype)


def reduce_into(dst, src, op, *, backend=None, stream=None, dtype=None):
    """Set ``dst = dst (op) src`` elementwise, in place; return ``dst``.

    ``dst`` and ``src`` have the same shape and dtype. The op means what
    :data:`~.ops.OP_TABLE` says, on every backend; avg reduces as sum (see :func:`finalize`).
    ``backend`` is one of :data:`BACKENDS` (default: chosen from the array type), ``stream``
    the CUDA stream for device backends (a Numba stream, a CuPy stream or a raw
    ``cudaStream_t`` int; default: the default stream). ``dtype`` reinterprets both buffers as
    that dtype first, e.g. raw ``uint16`` device buffers holding bfloat16.
    """
    op = normalize_op(op)
    if isinstance(dst, np.ndarray) and isinstance(src, np.ndarray):
        if dtype is not None:
            dtype = np.dtype(dtype)
            if dst.dtype != dtype:
                dst = dst.view(dtype)
            if src.dtype != dtype:
                src = src.view(dtype)
        if dst.shape != src.shape or dst.dtype != src.dtype:
            raise ValueError(f"reduce_into: dst {dst.dtype}{list(dst.shape)} and src "
                             f"{src.dtype}{list(src.shape)} differ in shape or dtype")
        check_op(dst.dtype, op)
        if dst.size == 0:
            return dst
        if not dst.flags.writeable:
            raise ValueError("reduce_into: dst is read-only")
        name = backend or select_backend(dst, src, op)
        if name == "numba":
            nb = _module("numba")
            if nb.supports(dst.dtype, op) and nb.contiguous_pair(dst, src):
                nb.reduce_into(dst, src, op)
                return dst
            name = "numpy"
        if name != "numpy":
            _module(name)  # an unknown name raises here
            raise ValueError(f"backend {name!r} cannot reduce NumPy arrays")
        numpy_backend.reduce_into(dst, src, op)
        return dst
    name = backend or select_backend(dst, src)
    if name in ("numpy", "numba"):
        raise TypeError(f"backend {name!r} needs NumPy arrays, got {type(dst).__name__}")
    mod = _module(name)
    dt = _device_dtype(dst, dtype)
    check_op(dt, op)
    mod.reduce_into(dst, src, op, stream=stream, dtype=dt)
    return dst


def finalize(dst, op, nranks, *, backend=None, stream=None, dtype=None):
    """Finish a reduction over ``nranks`` ranks in place: avg divides by ``nranks``.

    Every other op is left as is. Returns ``dst``.
    """
    op = normalize_op(op)
    if not OP_TABLE[op].divides:
        return dst
    if isinstance(dst, np.ndarray):
        if dtype is not None and dst.dtype != np.dtype(dtype):
            dst = dst.view(dtype)
        check_op(dst.dtype, op)
        if dst.size == 0:
            return dst
        name = backend or select_backend(dst, dst, op)
        nb = _module("numba") if name == "numba" else None
        if nb is not None and nb.supports(dst.dtype) and nb.contiguous_pair(dst, dst):
            nb.finalize(dst, op, nranks)
        else:
            numpy_backend.finalize(dst, op, nranks)
        return dst
    name = backend or select_backend(dst)
    mod = _module(name)
    dt = _device_dtype(dst, dtype)
    check_op(dt, op)
    mod.finalize(dst, op, nranks, stream=stream, dtype=dt)
    return dst


def backends():
    """Return {backend name: {"available": bool, "detail": str}} for ``mlcomm info``."""
    out = {}
    for name in BACKENDS:
        try:
            ok, detail = _module(name).available()
        except Exception as exc:  # an unusable backend is reported, never raised
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        out[name] = {"available": bool(ok), "detail": str(detail)}
    return out
