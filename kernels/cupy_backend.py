"""CuPy reduction kernels (``cupy.ElementwiseKernel``), imported lazily.

Same coverage and results as the Numba CUDA kernels, each built from the op's
:attr:`~.ops.Op.c_expr` in :data:`~.ops.OP_TABLE` on the view :func:`~.ops.kernel_view`
gives: float16 through float32, bfloat16 on raw uint16 bits (widened to float32, rounded back
to nearest-even), complex sum on the real view, min and max as :mod:`.ops` says. Launches on
the given stream.
"""

import numpy as np

from .ops import BFLOAT16, OP_TABLE, kernel_view

__all__ = ["available", "reduce_into", "finalize", "copy", "to_stream"]

_F16 = np.dtype(np.float16)
_U16 = np.dtype(np.uint16)
_REAL = {np.dtype(np.complex64): np.dtype(np.float32),
         np.dtype(np.complex128): np.dtype(np.float64)}

_BF16_PREAMBLE = r"""
__device__ __forceinline__ float mlcomm_b2f(unsigned short b) {
    return __uint_as_float(((unsigned int)b) << 16);
}
__device__ __forceinline__ unsigned short mlcomm_f2b(float f) {
    unsigned int u = __float_as_uint(f);
    if (f != f) return (unsigned short)(((u >> 16) & 0x8000u) | 0x7FC0u);
    return (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
"""

# number format -> (widen x, narrow r) in C, for float16 (1) and bfloat16 on uint16 bits (2)
_CODECS = {1: ("(float){}", "(T){}"), 2: ("mlcomm_b2f({})", "mlcomm_f2b({})")}


def _body(op, variant):
    """Return the ElementwiseKernel body updating ``a`` from ``b`` for ``op`` (see _variant)."""
    info = OP_TABLE[op]
    if not variant:
        return "a = " + info.c_expr.format(a="a", b="b", T="T")
    widen, narrow = _CODECS[variant]
    body = (f"float x = {widen.format('a')}, y = {widen.format('b')}; "
            f"float r = {info.c_expr.format(a='x', b='y', T='float')}; ")
    store = f"a = {narrow.format('r')};"
    if info.picks:  # a NaN result is the NaN operand's own bits, a's first
        store = f"if (r != r) {{ if (x == x) a = b; }} else {store}"
    return f"{{ {body}{store} }}"


_kernels = {}


def _cupy():
    import cupy
    return cupy


def available():
    """Return (ok, detail)."""
    try:
        cupy = _cupy()
    except Exception as exc:
        return False, f"cupy not importable: {type(exc).__name__}: {exc}"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # pragma: no cover - needs a GPU
        return False, f"cupy {cupy.__version__}: no usable CUDA device ({exc})"
    if n < 1:
        return False, f"cupy {cupy.__version__}: no CUDA device"
    return True, f"cupy {cupy.__version__}, {n} device(s)"


def _variant(dtype):
    if BFLOAT16 is not None and dtype == BFLOAT16:
        return 2
    if dtype == _F16:
        return 1
    return 0


def _kernel(op, variant):
    op = OP_TABLE[op].reduces_as
    key = (op, variant)
    k = _kernels.get(key)
    if k is None:
        cupy = _cupy()
        body = _body(op, variant)
        if variant == 2:
            k = cupy.ElementwiseKernel("uint16 b", "uint16 a", body,
                                       f"mlcomm_bf16_{op}", preamble=_BF16_PREAMBLE)
        else:
            k = cupy.ElementwiseKernel("T b", "T a", body, f"mlcomm_{op}_{variant}")
        _kernels[key] = k
    return k


def _div_kernel(variant):
    key = ("div", variant)
    k = _kernels.get(key)
    if k is None:
        cupy = _cupy()
        if variant == 2:
            k = cupy.ElementwiseKernel("float32 n", "uint16 d", "d = mlcomm_f2b(mlcomm_b2f(d) / n)",
                                       "mlcomm_bf16_div", preamble=_BF16_PREAMBLE)
        elif variant == 1:
            k = cupy.ElementwiseKernel("float32 n", "T d", "d = (T)((float)d / n)",
                                       "mlcomm_half_div")
        else:
            k = cupy.ElementwiseKernel("T n", "T d", "d = d / n", "mlcomm_div")
        _kernels[key] = k
    return k


def _flat(a, view):
    """Return a flat CuPy view of ``a`` (any CUDA array) as dtype ``view``."""
    cupy = _cupy()
    arr = a if isinstance(a, cupy.ndarray) else cupy.asarray(a)
    if not arr.flags.c_contiguous:
        raise ValueError("device buffers must be C-contiguous")
    arr = arr.ravel()
    return arr if arr.dtype == view else arr.view(view)


def to_stream(stream):
    """Return a CuPy stream for a CuPy stream, a Numba stream, a raw handle or None."""
    cupy = _cupy()
    if stream is None:
        return cupy.cuda.get_current_stream()
    if isinstance(stream, cupy.cuda.Stream) or isinstance(stream, cupy.cuda.ExternalStream):
        return stream
    handle = getattr(stream, "handle", stream)  # numba Stream.handle is a ctypes c_void_p
    handle = getattr(handle, "value", handle) or 0
    return cupy.cuda.ExternalStream(int(handle))


def _view_dtype(dtype, op):
    if _variant(dtype) == 2:
        return _U16
    return kernel_view(dtype, op)


def reduce_into(dst, src, op, *, stream=None, dtype=None):
    """Set ``dst = dst (op) src`` on the device, launched on ``stream`` (op/dtype checked)."""
    dtype = np.dtype(dst.dtype if dtype is None else dtype)
    view = _view_dtype(dtype, op)
    d = _flat(dst, view)
    s = _flat(src, view)
    if d.size != s.size:
        raise ValueError(f"reduce_into: dst has {d.size} and src {s.size} elements of {view}")
    if d.size:
        with to_stream(stream):
            _kernel(op, _variant(dtype))(s, d)


def finalize(dst, op, nranks, *, stream=None, dtype=None):
    """Divide ``dst`` by ``nranks`` on the device when ``op`` is avg."""
    if not OP_TABLE[op].divides:
        return
    dtype = np.dtype(dst.dtype if dtype is None else dtype)
    variant = _variant(dtype)
    view = _U16 if variant == 2 else _REAL.get(dtype, dtype)
    d = _flat(dst, view)
    n = np.float32(nranks) if variant else view.type(nranks)
    if d.size:
        with to_stream(stream):
            _div_kernel(variant)(n, d)


def copy(dst, src, *, stream=None, dtype=None):
    """Copy ``src`` into ``dst`` (device-to-device memcpy; bandwidth baseline)."""
    dtype = np.dtype(dst.dtype if dtype is None else dtype)
    view = _U16 if _variant(dtype) == 2 else dtype
    d = _flat(dst, view)
    s = _flat(src, view)
    with to_stream(stream):
        d[...] = s
