"""Numba CUDA reduction kernels for device arrays (also run under ``NUMBA_ENABLE_CUDASIM=1``).

Every op and dtype of the CPU kernels is covered, each a grid-stride loop around the op's
:attr:`~.ops.Op.element` from :data:`~.ops.OP_TABLE` (compiled as a device function), on the
view :func:`~.ops.kernel_view` gives: integer sum/prod and the bitwise and logical ops on the
unsigned view of the same width, bool on uint8, complex sum on the real view. float16
computes in float32 and rounds back (exactly NumPy's result: float32 holds every float16 sum
and product to within one rounding that cannot double-round). bfloat16 runs on the raw uint16
bits: widened to float32, reduced, rounded back to nearest-even, an arithmetic NaN made the
quiet NaN ``ml_dtypes`` makes. min and max follow :mod:`.ops` on every dtype: the NaN
operand's own bits, dst's first, and ``-0 < +0``. Kernels launch on the given stream.
"""

import math

import numpy as np
from numba import config, cuda
from numba.core.types import float16, float32, int32, int64, uint16, uint32

from .ops import BFLOAT16, OP_TABLE, kernel_view

__all__ = ["SIMULATOR", "available", "reduce_into", "finalize", "copy", "as_device",
           "to_stream"]

SIMULATOR = bool(config.ENABLE_CUDASIM)

#: threads per block and a cap on the number of blocks (the loop strides over the rest); the
#: simulator runs one Python thread per CUDA thread, so it gets few (4 x 8 still stride)
THREADS = 8 if SIMULATOR else 256
_max_blocks = 4 if SIMULATOR else None

_F16 = np.dtype(np.float16)
_UINT = {1: np.dtype(np.uint8), 2: np.dtype(np.uint16), 4: np.dtype(np.uint32),
         8: np.dtype(np.uint64)}
_REAL = {np.dtype(np.complex64): np.dtype(np.float32),
         np.dtype(np.complex128): np.dtype(np.float64)}


def available():
    """Return (ok, detail)."""
    if SIMULATOR:
        return True, "numba CUDA simulator (NUMBA_ENABLE_CUDASIM=1)"
    try:
        if not cuda.is_available():
            return False, "no CUDA driver or device"
        dev = cuda.get_current_device()
        name = dev.name.decode() if isinstance(dev.name, bytes) else dev.name
    except Exception as exc:  # pragma: no cover - needs a GPU
        return False, f"{type(exc).__name__}: {exc}"
    if _compile_error():  # pragma: no cover - needs a GPU
        return False, _cannot_compile()
    return True, f"{name} (cc {dev.compute_capability[0]}.{dev.compute_capability[1]})"


_compile_failure = None  # None: not tried yet; "": Numba compiles CUDA kernels here


def _probe(a):
    a[0] = 1


def _compile_error():
    """Return "" when Numba can compile a CUDA kernel here, else why not (tried once).

    A numba-cuda that does not support the installed NumPy fails inside its compiler (numba-cuda
    0.30.4 with numpy 2.5 raises ``AttributeError: ... 'row_stack'``); this finds out before
    the first collective does.
    """
    global _compile_failure
    if _compile_failure is None:
        try:
            cuda.jit("void(float32[::1])")(_probe)
            _compile_failure = ""
        except Exception as exc:  # pragma: no cover - needs a GPU
            _compile_failure = f"{type(exc).__name__}: {exc}"
    return _compile_failure


def _cannot_compile():
    from importlib import metadata
    try:
        version = "numba-cuda " + metadata.version("numba-cuda")
    except metadata.PackageNotFoundError:
        version = "numba " + metadata.version("numba")
    return (f"Numba cannot compile CUDA kernels here ({version}, numpy {np.__version__}): "
            f"{_compile_failure}. Pass CuPy arrays (CuPy's kernels reduce them), or install a "
            f"numba-cuda and NumPy that work together (numba-cuda 0.30.4 needs numpy<2.5)")


# --- bit casts: libdevice on a GPU, NumPy scalar views under the simulator -------------------

if SIMULATOR:
    @cuda.jit(device=True)
    def _f32_bits(f):
        return np.int64(np.float32(f).view(np.uint32))

    @cuda.jit(device=True)
    def _bits_f32(u):
        return np.uint32(u).view(np.float32)
else:  # pragma: no cover - needs a GPU
    from numba.cuda import libdevice

    @cuda.jit(device=True)
    def _f32_bits(f):
        return int64(libdevice.float_as_int(f)) & 0xFFFFFFFF

    @cuda.jit(device=True)
    def _bits_f32(u):
        return libdevice.int_as_float(int32(u))


@cuda.jit(device=True)
def _b2f(b):
    """Widen raw bfloat16 bits to float32 (exact)."""
    return _bits_f32(uint32(b) << uint32(16))


@cuda.jit(device=True)
def _f2b(f):
    """Round float32 to raw bfloat16 bits, to nearest even; NaN becomes the quiet NaN."""
    u = _f32_bits(f)
    if f != f:
        return uint16(((u >> 16) & 0x8000) | 0x7FC0)
    return uint16((u + 0x7FFF + ((u >> 16) & 1)) >> 16)


# --- kernels ---------------------------------------------------------------------------------
# One grid-stride loop per op and number format, around the op's element from OP_TABLE.

def _generic(element):
    """``d = d (op) s`` on integers (views per kernel_view), float32/64 and complex."""
    @cuda.jit
    def kernel(d, s):
        for i in range(cuda.grid(1), d.size, cuda.gridsize(1)):
            d[i] = element(d[i], s[i])
    return kernel


def _float16(element, picks):
    """float16: compute in float32 and round back once; a NaN min/max keeps its own bits."""
    @cuda.jit
    def kernel(d, s):
        for i in range(cuda.grid(1), d.size, cuda.gridsize(1)):
            x = float32(d[i])
            y = float32(s[i])
            r = element(x, y)
            if picks and r != r:
                if x == x:
                    d[i] = s[i]
            else:
                d[i] = float16(r)
    return kernel


def _bfloat16(element, picks):
    """bfloat16 on raw uint16 bits, as float16 (arithmetic NaN made the quiet NaN)."""
    @cuda.jit
    def kernel(d, s):
        for i in range(cuda.grid(1), d.size, cuda.gridsize(1)):
            x = _b2f(d[i])
            y = _b2f(s[i])
            r = element(x, y)
            if picks and r != r:
                if x == x:
                    d[i] = s[i]
            else:
                d[i] = _f2b(r)
    return kernel


@cuda.jit
def _k_div(d, n):
    for i in range(cuda.grid(1), d.size, cuda.gridsize(1)):
        d[i] = d[i] / n


@cuda.jit
def _k_h_div(d, n):
    for i in range(cuda.grid(1), d.size, cuda.gridsize(1)):
        d[i] = float16(float32(d[i]) / n)


@cuda.jit
def _k_b_div(d, n):
    for i in range(cuda.grid(1), d.size, cuda.gridsize(1)):
        d[i] = _f2b(_b2f(d[i]) / n)


@cuda.jit
def _k_copy(d, s):
    for i in range(cuda.grid(1), d.size, cuda.gridsize(1)):
        d[i] = s[i]


_kernels = {}  # (op it reduces as, number format) -> kernel


def _kernel(op, fmt):
    key = (op, fmt)
    kernel = _kernels.get(key)
    if kernel is None:
        info = OP_TABLE[op]
        element = cuda.jit(device=True)(info.element)
        if fmt == "bf16":
            kernel = _bfloat16(element, info.picks)
        elif fmt == "f16":
            kernel = _float16(element, info.picks)
        else:
            kernel = _generic(element)
        _kernels[key] = kernel
    return kernel


def _plan(dtype, op):
    """Return (kernel, dtype the kernel sees) for a checked (dtype, op)."""
    op = OP_TABLE[op].reduces_as
    if BFLOAT16 is not None and dtype == BFLOAT16:
        return _kernel(op, "bf16"), _UINT[2]
    if dtype == _F16:
        return _kernel(op, "f16"), _F16
    return _kernel(op, ""), kernel_view(dtype, op)


# --- arrays and streams ----------------------------------------------------------------------

_VIEWS = 64
_views = {}  # (device address, bytes, dtype) -> flat Numba device array over that memory


class _Interface:
    """A CUDA array interface re-typed as a flat array (zero copy)."""

    def __init__(self, cai):
        self.__cuda_array_interface__ = cai


def _nbytes_and_check(cai, itemsize):
    shape = tuple(cai["shape"])
    count = math.prod(shape)
    strides = cai.get("strides")
    if strides is not None and count > 1:
        expect, acc = [], itemsize
        for extent in reversed(shape):
            expect.append(acc)
            acc *= extent
        if tuple(st for st, ext in zip(strides, shape) if ext > 1) != \
                tuple(st for st, ext in zip(reversed(expect), shape) if ext > 1):
            raise ValueError("device buffers must be C-contiguous")
    return count * itemsize


def as_device(a, dtype, view=None):
    """Return a flat Numba device array over ``a``'s memory, seen as ``view`` (default dtype)."""
    dtype = np.dtype(dtype)
    view = dtype if view is None else np.dtype(view)
    cai = getattr(a, "__cuda_array_interface__", None)
    if cai is None:  # a Numba (simulator) device array
        if not a.is_c_contiguous():
            raise ValueError("device buffers must be C-contiguous")
        flat = a.reshape(a.size) if len(a.shape) != 1 else a
        return flat if np.dtype(flat.dtype) == view else flat.view(view)
    itemsize = np.dtype(cai["typestr"]).itemsize
    nbytes = _nbytes_and_check(cai, itemsize)
    if nbytes % view.itemsize:
        raise ValueError(f"a buffer of {nbytes} bytes is not a whole number of {view}")
    # with no stream to wait for, a view is only (address, length, type): one made before for
    # the same three is reused, which saves Numba's array construction (about 30 us) per call
    key = (cai["data"][0], nbytes, view.str) if cai.get("stream") is None else None
    flat = _views.get(key)
    if flat is None:
        new = dict(cai, shape=(nbytes // view.itemsize,), strides=None, typestr=view.str)
        new.pop("descr", None)
        new.pop("mask", None)
        flat = cuda.as_cuda_array(_Interface(new))
        if key is not None:
            if len(_views) >= _VIEWS:
                _views.pop(next(iter(_views)))
            _views[key] = flat
    return flat


def to_stream(stream):
    """Return a Numba stream (or 0) for a Numba stream, a CuPy stream, a raw handle or None."""
    if stream is None or (isinstance(stream, int) and stream == 0):
        return 0
    if SIMULATOR:
        return stream if isinstance(stream, cuda.stream) else 0
    if type(stream).__module__.startswith("numba"):
        return stream
    ptr = getattr(stream, "ptr", stream)  # cupy.cuda.Stream has .ptr
    if ptr == 0:
        return 0
    return cuda.external_stream(int(ptr))


def _blocks(n):
    global _max_blocks
    if _max_blocks is None:  # pragma: no cover - needs a GPU
        _max_blocks = 32 * cuda.get_current_device().MULTIPROCESSOR_COUNT
    return max(1, min(_max_blocks, (n + THREADS - 1) // THREADS))


def _launch(kernel, n, stream, *args):
    if not SIMULATOR and _compile_error():
        raise RuntimeError(_cannot_compile())
    kernel[_blocks(n), THREADS, to_stream(stream)](*args)


def reduce_into(dst, src, op, *, stream=None, dtype=None):
    """Set ``dst = dst (op) src`` on the device, launched on ``stream`` (op/dtype checked)."""
    dtype = np.dtype(dst.dtype if dtype is None else dtype)
    kernel, view = _plan(dtype, op)
    d = as_device(dst, dtype, view)
    s = as_device(src, dtype, view)
    if d.size != s.size:
        raise ValueError(f"reduce_into: dst has {d.size} and src {s.size} elements of {view}")
    if d.size:
        _launch(kernel, d.size, stream, d, s)


def finalize(dst, op, nranks, *, stream=None, dtype=None):
    """Divide ``dst`` by ``nranks`` on the device when ``op`` is avg."""
    if not OP_TABLE[op].divides:
        return
    dtype = np.dtype(dst.dtype if dtype is None else dtype)
    if BFLOAT16 is not None and dtype == BFLOAT16:
        kernel, view, n = _k_b_div, _UINT[2], np.float32(nranks)
    elif dtype == _F16:
        kernel, view, n = _k_h_div, _F16, np.float32(nranks)
    else:
        view = _REAL.get(dtype, dtype)
        kernel, n = _k_div, view.type(nranks)
    d = as_device(dst, dtype, view)
    if d.size:
        _launch(kernel, d.size, stream, d, n)


def copy(dst, src, *, stream=None, dtype=None):
    """Copy ``src`` into ``dst`` with a kernel of the same shape (bandwidth baseline)."""
    dtype = np.dtype(dst.dtype if dtype is None else dtype)
    view = _UINT.get(dtype.itemsize, dtype)
    d = as_device(dst, dtype, view)
    s = as_device(src, dtype, view)
    if d.size:
        _launch(_k_copy, d.size, stream, d, s)
