"""Numba CPU reduction kernels: ``@njit(parallel=True, cache=True)``, one contiguous block a thread.

Every kernel is the same loop, built once per op by :func:`_elementwise`: ``prange`` over one
block per thread, and inside each block a plain loop over slices, which LLVM vectorises (a loop
over ``range(lo, hi)`` on the whole array is not: Numba cannot prove ``lo >= 0`` and keeps its
negative-index wrap-around). What the loop computes on one element is :func:`scalar`, chosen at
compile time by a name such as "max" or "bf16_sum" (:func:`scalar_name`) from the op's
:attr:`~.ops.Op.element` in :data:`~.ops.OP_TABLE`, so any other ``@njit`` loop that calls
:func:`scalar` computes the same bits. The kernel closures capture only strings, so Numba's
cache finds them again in the next process.

Integer sum/prod and every bitwise or logical op run on the unsigned view of the same width
(two's-complement wrap-around gives the same bits), complex sum runs on the real view
(:func:`kernel_dtype`).

float16 and bfloat16 run on their raw uint16 bits: widened to float32 exactly, reduced in float32
and rounded back to nearest even. For + and x that is NumPy's float16 and ml_dtypes' bfloat16
result bit for bit (float32 has more than 2p + 2 bits, so rounding twice cannot differ from
rounding once); a NaN result is src's NaN if it has one, else dst's, made quiet (float16 keeps
its payload, bfloat16 makes ±0x7FC0), as NumPy and ml_dtypes do. min and max follow
:mod:`.ops`: the NaN operand's own bits, dst's first, and ``-0 < +0``.

Threads: ``max(1, usable cpus // ranks on this node)``, ranks on this node read from
``MPI_LOCALNRANKS`` (MPICH/Hydra), ``OMPI_COMM_WORLD_LOCAL_SIZE`` (Open MPI),
``MV2_COMM_WORLD_LOCAL_SIZE``, ``PMI_LOCAL_SIZE`` or ``SLURM_NTASKS_PER_NODE``, so MPI ranks on
one node do not oversubscribe it. ``MLCOMM_NUM_THREADS`` overrides. Every kernel records which
thread ran each block; :func:`threads_used` reports the last call's count.
"""

import contextlib
import hashlib
import marshal
import os
import re

import numpy as np

from .ops import BFLOAT16, OP_TABLE, kernel_view

__all__ = ["available", "supports", "reduce_into", "finalize", "copy", "num_threads",
           "threads", "threads_used", "scalar", "scalar_name", "kernel_dtype",
           "contiguous_pair"]

try:
    import numba
    from llvmlite import ir
    from numba import njit, prange, types
    from numba.extending import intrinsic, overload
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
# 2-byte floats by the prefix of their kernels' names
_HALF = {np.dtype(np.float16): "f16"}
if BFLOAT16 is not None:
    _HALF[BFLOAT16] = "bf16"
_SUPPORTED = frozenset(np.dtype(t) for t in (
    np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
    np.float32, np.float64, np.complex64, np.complex128, np.bool_)) | frozenset(_HALF)


def available():
    """Return (ok, detail)."""
    if numba is None:
        return False, f"numba not importable: {_IMPORT_ERROR}"
    return True, (f"numba {numba.__version__}, {num_threads()} thread(s), "
                  f"threading layer {numba.config.THREADING_LAYER}")


def supports(dtype, op=None):
    """Return True when this backend has a kernel for ``dtype`` (and ``op`` when given).

    Complex prod is left to NumPy, whose C99 rules for infinite and signed-zero operands a
    plain Numba multiply does not follow bit for bit.
    """
    if numba is None or dtype not in _SUPPORTED:
        return False
    return not (op == "prod" and dtype.kind == "c")


# --- threads ---------------------------------------------------------------------------------

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


@contextlib.contextmanager
def threads(n):
    """Run the kernels with ``n`` threads (capped as usual) inside the ``with`` block."""
    global _threads
    saved = num_threads()
    _threads = max(1, min(int(n), numba.config.NUMBA_NUM_THREADS))
    try:
        yield _threads
    finally:
        _threads = saved


_ids = {}  # blocks -> the array the kernels write each block's thread id into
_last_ids = None


def threads_used():
    """Return how many distinct threads ran the blocks of the last kernel call (0: none yet)."""
    return 0 if _last_ids is None else len(set(_last_ids.tolist()))


def _run(kernel, dst, src):
    global _last_ids
    n = num_threads()
    ids = _ids.get(n)
    if ids is None:
        ids = _ids[n] = np.full(n, -1, np.int64)
    prev = numba.get_num_threads()
    if prev != n:
        numba.set_num_threads(n)
        try:
            kernel(dst, src, ids)
        finally:
            numba.set_num_threads(prev)
    else:
        kernel(dst, src, ids)
    _last_ids = ids


# --- float16 / bfloat16 bits <-> float32 ------------------------------------------------------

def _hw_half():
    """Return True when Numba's target converts float16 in hardware: x86 with F16C.

    Without F16C, LLVM calls a helper that Numba's JIT does not link (a crash), so the bit
    arithmetic below is used instead, as on every other machine (tested against NumPy on all
    65536 values). Both give NumPy's bits: NaNs are settled before the conversion.
    """
    import platform
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    features = numba.config.CPU_FEATURES
    if features is None:
        from llvmlite import binding
        features = binding.get_host_cpu_features().flatten()
    return "+f16c" in features.split(",")


if numba is not None:
    _inline = njit(inline="always")

    @intrinsic
    def _f32(typingctx, bits):
        """Reinterpret the low 32 bits of an integer as a float32."""
        if not isinstance(bits, types.Integer):
            return None

        def codegen(context, builder, sig, args):
            value, width = args[0], sig.args[0].bitwidth
            if width > 32:
                value = builder.trunc(value, ir.IntType(32))
            elif width < 32:
                value = builder.zext(value, ir.IntType(32))
            return builder.bitcast(value, ir.FloatType())
        return types.float32(bits), codegen

    def _cast(arg_type, result_type, emit):
        """Return an intrinsic turning one ``arg_type`` value into ``result_type`` by ``emit``."""
        @intrinsic
        def cast(typingctx, x):
            if x != arg_type:
                return None
            return result_type(x), lambda context, builder, sig, args: emit(builder, args[0])
        return cast

    # a float32's uint32 bits
    _bits = _cast(types.float32, types.uint32, lambda b, v: b.bitcast(v, ir.IntType(32)))
    # float16 bits <-> float32 by the CPU's conversions (F16C's vcvtph2ps and vcvtps2ph,
    # round to nearest even)
    _hw_f16_to_f32 = _cast(types.uint16, types.float32,
                           lambda b, v: b.fpext(b.bitcast(v, ir.HalfType()), ir.FloatType()))
    _hw_f32_to_f16 = _cast(types.float32, types.uint16,
                           lambda b, v: b.bitcast(b.fptrunc(v, ir.HalfType()), ir.IntType(16)))

    @_inline
    def _soft_f16_to_f32(h):
        # Scale the exponent by 2**112 (exact, subnormals too); inf/NaN get an all-ones exponent.
        h = np.int64(h)
        x = _f32((h & 0x7FFF) << 13) * np.float32(2.0 ** 112)
        if x >= np.float32(65536.0):
            x = _f32(np.int64(_bits(x)) | 0x7F800000)
        return -x if h & 0x8000 else x

    @_inline
    def _soft_f32_to_f16(x):
        # NumPy's npy_floatbits_to_halfbits: round to nearest even, NaN keeps its top payload.
        u = np.int64(_bits(x))
        a = u & 0x7FFFFFFF
        if a > 0x7F800000:  # NaN, never turned into inf
            h = 0x7C00 + ((a & 0x7FFFFF) >> 13)
            if h == 0x7C00:
                h = 0x7C01
        elif a >= 0x47800000:  # 65536 and up: inf
            h = 0x7C00
        elif a < 0x38800000:  # below 2**-14: subnormal or zero, rounded by the float add
            h = np.int64(_bits(_f32(a) + np.float32(0.5))) - 0x3F000000
        else:
            h = (a - 0x38000000 + 0xFFF + ((a >> 13) & 1)) >> 13
        return np.uint16(h | ((u >> 16) & 0x8000))

    @_inline
    def _bf16_to_f32(h):
        return _f32(np.int64(h) << 16)

    @_inline
    def _f32_to_bf16(x):
        u = np.int64(_bits(x))
        if (u & 0x7FFFFFFF) > 0x7F800000:
            return np.uint16(((u >> 16) & 0x8000) | 0x7FC0)
        return np.uint16((u + 0x7FFF + ((u >> 16) & 1)) >> 16)

    @_inline
    def _same(x):
        return x

    @_inline
    def _quiet(x):
        return _f32(np.int64(_bits(x)) | 0x400000)

    # prefix -> (widen, narrow)
    _CODECS = {
        "": (_same, _same),
        "f16": (_hw_f16_to_f32, _hw_f32_to_f16) if _hw_half()
        else (_soft_f16_to_f32, _soft_f32_to_f16),
        "bf16": (_bf16_to_f32, _f32_to_bf16),
    }


# --- one scalar op per name, chosen while compiling -------------------------------------------

_elements = {}  # op name -> its OP_TABLE element, compiled to inline


def _element(op):
    fn = _elements.get(op)
    if fn is None:
        fn = _elements[op] = _inline(OP_TABLE[op].element)
    return fn


def _arith(element, widen, narrow):
    def impl(name, a, b):
        x = widen(a)
        y = widen(b)
        r = element(x, y)
        if r != r:  # NaN: src's NaN wins, then dst's (as in NumPy and ml_dtypes), made quiet
            r = _quiet(y if y != y else (x if x != x else r))
        return narrow(r)
    return impl


def _pick(element, widen):
    # min/max of the widened values, whose result has the bits of x or of y (the zero of a
    # tie of zeros is one of them): the operand with those bits, a's when both have them
    def impl(name, a, b):
        x = widen(a)
        y = widen(b)
        return a if _bits(element(x, y)) == _bits(x) else b
    return impl


def _impl(name):
    """Return the Python implementation of ``scalar(name, a, b)``."""
    prefix, _, op = name.rpartition("_")
    if op == "copy" and not prefix:
        return lambda name, a, b: b
    widen, narrow = _CODECS[prefix]
    if op == "div":  # b is the float divisor; a NaN in a stays NaN without help
        return lambda name, a, b: narrow(widen(a) / b)
    info = OP_TABLE[op]
    element = _element(info.reduces_as)
    if not prefix:
        return lambda name, a, b: element(a, b)
    if "f" not in info.kinds:
        raise TypeError(f"scalar({name!r}): {op} has no float16/bfloat16 form")
    if info.picks:
        return _pick(element, widen)
    return _arith(element, widen, narrow)


def scalar(name, a, b):
    """``a (name) b`` on one element, inlined into the calling ``@njit`` function.

    ``name`` is a string literal (a constant in the caller): an op of
    :data:`~.ops.OP_TABLE` ("sum", "prod", "min", "max", "avg" as "sum", "band", "bor",
    "bxor", "land", "lor"), "div" (``a`` divided by the float ``b``) or "copy" (``b``), on
    elements of the dtype :func:`kernel_dtype` gives; prefixed "f16_" or "bf16_" (sum, prod,
    min, max, div) for float16 and bfloat16 on their raw uint16 bits. :func:`scalar_name`
    returns the name for a dtype and op. Every kernel of this module runs its elements through
    this function, so a loop that calls it gives the kernels' bits. Compiled only: calling it
    from Python raises NotImplementedError.
    """
    raise NotImplementedError("scalar() runs inside @njit functions only")


def _part(s, lo, hi):
    """``s[lo:hi]`` for an array, ``s`` for a scalar; compiled only."""
    raise NotImplementedError


def _at(s, i):
    """``s[i]`` for an array, ``s`` for a scalar; compiled only."""
    raise NotImplementedError


if numba is not None:
    @overload(scalar, inline="always")
    def _ol_scalar(name, a, b):
        if isinstance(name, types.StringLiteral):  # the non-literal retry has nothing to offer
            return _impl(name.literal_value)

    @overload(_part, inline="always")
    def _ol_part(s, lo, hi):
        if isinstance(s, types.Array):
            return lambda s, lo, hi: s[lo:hi]
        return lambda s, lo, hi: s

    @overload(_at, inline="always")
    def _ol_at(s, i):
        if isinstance(s, types.Array):
            return lambda s, i: s[i]
        return lambda s, i: s


#: A digest of the elements' code in ops.py. Numba's cache keys a kernel on this file and on
#: the kernel's closure variables, not on ops.py: every kernel holds this digest, so a change
#: to an element there compiles the kernels afresh.
_ELEMENTS = hashlib.sha256(b"".join(marshal.dumps(op.element.__code__)
                                    for op in OP_TABLE.values())).hexdigest()


def _elementwise(name):
    """Return the kernel ``k(d, s, ids)``: ``d[i] = d[i] (name) s[i]`` in ``len(ids)`` blocks.

    ``s`` may be a scalar (finalize's divisor). Block b writes its thread id into ``ids[b]``.
    """
    elements = _ELEMENTS

    @njit(parallel=True, cache=True, nogil=True)
    def kernel(d, s, ids):
        elements  # noqa: B018 - part of the cache key only (see _ELEMENTS)
        blocks = ids.shape[0]
        step = -(-d.shape[0] // blocks)
        for b in prange(blocks):
            ids[b] = numba.get_thread_id()
            dd = d[b * step:(b + 1) * step]
            ss = _part(s, b * step, (b + 1) * step)
            for i in range(dd.shape[0]):
                dd[i] = scalar(name, dd[i], _at(ss, i))
    return kernel


_kernels = {}


def _kernel(name):
    kernel = _kernels.get(name)
    if kernel is None:
        kernel = _kernels[name] = _elementwise(name)
    return kernel


# --- the backend ------------------------------------------------------------------------------

def kernel_dtype(dtype, op):
    """Return the dtype the kernel for (``dtype``, ``op``) runs on: that of :func:`scalar`'s
    operands.

    float16 and bfloat16 run on uint16 (their raw bits); every other dtype on
    :func:`~.ops.kernel_view` (integers on their unsigned view for ops whose bits do not
    depend on signedness, complex sum on the real view).
    """
    dtype = np.dtype(dtype)
    if dtype in _HALF:
        return _UINT[2]
    return kernel_view(dtype, op)


def scalar_name(dtype, op):
    """Return the literal that :func:`scalar` takes for ``op`` on ``dtype``.

    ``op`` is a canonical op name (avg gives "sum": it reduces as sum) or "div"; float16 and
    bfloat16 get the "f16_"/"bf16_" prefix, e.g. ``scalar_name(np.float16, "max")`` is
    "f16_max".
    """
    if op != "div":
        op = OP_TABLE[op].reduces_as
    prefix = _HALF.get(np.dtype(dtype))
    return f"{prefix}_{op}" if prefix else op


def _flat(a, dtype):
    """Return a 1-D view of a contiguous array, reinterpreted as ``dtype``."""
    order = "C" if a.flags.c_contiguous else "F"
    flat = a.ravel(order=order)
    return flat if flat.dtype == dtype else flat.view(dtype)


def contiguous_pair(dst, src):
    """Return True when both arrays are contiguous in the same order (a flat view exists)."""
    if dst.flags.c_contiguous and src.flags.c_contiguous:
        return True
    return dst.flags.f_contiguous and src.flags.f_contiguous


_bound = {}  # (dtype, op) -> (kernel, dtype it runs on)


def reduce_into(dst, src, op):
    """Set ``dst = dst (op) src`` in place; both contiguous, same shape and supported dtype."""
    key = (dst.dtype, op)
    bound = _bound.get(key)
    if bound is None:
        bound = _bound[key] = (_kernel(scalar_name(dst.dtype, op)), kernel_dtype(dst.dtype, op))
    kernel, kdt = bound
    _run(kernel, _flat(dst, kdt), _flat(src, kdt))


def finalize(dst, op, nranks):
    """Divide ``dst`` by ``nranks`` in place when ``op`` is avg."""
    if not OP_TABLE[op].divides:
        return
    if dst.dtype in _HALF:  # divide in float32 and round once, as NumPy's finalize does
        _run(_kernel(scalar_name(dst.dtype, "div")), _flat(dst, _UINT[2]), np.float32(nranks))
        return
    real = _REAL.get(dst.dtype, dst.dtype)
    _run(_kernel("div"), _flat(dst, real), real.type(nranks))


def copy(dst, src):
    """Copy ``src`` into ``dst`` with the same threads (bandwidth baseline)."""
    kdt = _UINT.get(dst.dtype.itemsize, dst.dtype)
    _run(_kernel("copy"), _flat(dst, kdt), _flat(src, kdt))
