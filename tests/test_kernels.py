"""Reduction kernels: every op x dtype against an exact reference, NumPy vs Numba bit for bit."""

import dataclasses
import math
import os
import zlib
from fractions import Fraction

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import mlcomm.kernels as K
from mlcomm.kernels import bandwidth, numba_backend, numpy_backend

BF16 = np.dtype(ml_dtypes.bfloat16)
ALL_DTYPES = [np.dtype(n) if n != "bfloat16" else BF16 for n in K.DTYPES]
VALID = [(dt, op) for dt in ALL_DTYPES for op in K.OPS if K.is_supported(dt, op)]
NUMBA_VALID = [(dt, op) for dt, op in VALID if numba_backend.supports(dt, op)]


def _ids(pairs):
    return [f"{dt}-{op}" for dt, op in pairs]


# --- data --------------------------------------------------------------------------------

def _data(dtype, n, seed):
    """Return two arrays of ``n`` elements with edge values first, random values after."""
    rng = np.random.default_rng(seed)
    kind = K.dtype_kind(dtype)
    if kind == "b":
        return rng.integers(0, 2, n).astype(bool), rng.integers(0, 2, n).astype(bool)
    if kind in "iu":
        info = np.iinfo(dtype)
        edge = [info.min, info.max, 0, 1, info.max, info.min, 2, 3, 0]
        edge = [v for v in edge if info.min <= v <= info.max]
        if kind == "i":
            edge += [-1, info.min, -1, info.max]
        a = rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
        b = rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
        m = min(len(edge), n)
        a[:m] = np.array(edge[:m], dtype=dtype)
        b[:m] = np.array(edge[::-1][:m], dtype=dtype)
        b[m:m + 8] = rng.integers(0, 3, 8)  # small values so land/lor/prod see 0 and 1
        return a, b
    real = np.float32 if dtype in (np.dtype(np.float16), BF16) else \
        (np.float32 if dtype == np.dtype(np.complex64) else np.float64)
    big = float(np.finfo(dtype).max) if dtype != BF16 else float(ml_dtypes.finfo(BF16).max)
    tiny = float(np.finfo(dtype).smallest_subnormal) if dtype != BF16 else \
        float(ml_dtypes.finfo(BF16).smallest_subnormal)
    edge_a = [0.0, -0.0, 0.0, -0.0, np.inf, -np.inf, np.inf, np.nan, 1.0, np.nan, big, -big,
              tiny, 1.0, -tiny, 3.0]
    edge_b = [-0.0, 0.0, 0.0, -0.0, -np.inf, 1.0, np.inf, 2.0, np.nan, np.nan, big, big,
              tiny, -1.0, tiny, 3.0]
    scale = rng.choice([1e-3, 1.0, 1e3], n)
    ra = rng.standard_normal(n) * scale
    rb = rng.standard_normal(n) * scale
    m = min(16, n)
    ra[:m] = edge_a[:m]
    rb[:m] = edge_b[:m]
    if K.dtype_kind(dtype) == "c":
        ia = rng.standard_normal(n)
        ib = rng.standard_normal(n)
        ia[:m] = edge_b[:m]
        ib[:m] = edge_a[:m]
        a, b = np.empty(n, dtype), np.empty(n, dtype)
        with np.errstate(all="ignore"):
            a.real, a.imag, b.real, b.imag = (x.astype(real) for x in (ra, ia, rb, ib))
        return a, b
    with np.errstate(all="ignore"):
        return ra.astype(dtype), rb.astype(dtype)


# --- exact references --------------------------------------------------------------------

def _round64(x):
    """Round an exact Fraction to the nearest float64 (inf on overflow)."""
    try:
        return float(x)
    except OverflowError:
        return math.inf if x > 0 else -math.inf


def _exact_f64(a, b, op):
    """Correctly rounded float64 sum/product of float64 arrays (Fractions where finite)."""
    out = np.empty(a.shape, np.float64)
    with np.errstate(all="ignore"):
        fallback = np.add(a, b) if op == "sum" else np.multiply(a, b)
    for i, (x, y) in enumerate(zip(a.tolist(), b.tolist())):
        if math.isfinite(x) and math.isfinite(y):
            fx, fy = Fraction(x), Fraction(y)
            r = fx + fy if op == "sum" else fx * fy
            v = _round64(r)
            if v == 0.0:  # keep the IEEE sign of an exact zero
                v = fallback[i]
            out[i] = v
        else:
            out[i] = fallback[i]
    return out


def _ieee_pick(a, b, op):
    """IEEE 754-2019 maximum/minimum of float arrays: a NaN operand's bits (a's first), -0 < +0."""
    with np.errstate(invalid="ignore"):  # exact for every float dtype; signalling NaNs warn
        wa, wb = a.astype(np.float64), b.astype(np.float64)
        first = (wa > wb) if op == "max" else (wa < wb)
    out = np.where(np.isnan(wa) | first, a, b)  # b when equal: the same bits, but for zeros
    zeros = (wa == 0) & (wb == 0)
    neg = np.signbit(wa) & np.signbit(wb) if op == "max" else np.signbit(wa) | np.signbit(wb)
    out[zeros] = np.where(neg[zeros], -0.0, 0.0).astype(np.float32).astype(a.dtype)
    return out


def _reference(a, b, op):
    """Return ``a op b`` computed in a wider type and rounded once to ``a.dtype``."""
    dt = a.dtype
    kind = K.dtype_kind(dt)
    if op == "avg":
        op = "sum"
    if kind in "iub":
        bits = dt.itemsize * 8
        xs, ys = a.tolist(), b.tolist()
        fn = {
            "sum": lambda x, y: x + y, "prod": lambda x, y: x * y,
            "min": min, "max": max,
            "band": lambda x, y: x & y, "bor": lambda x, y: x | y, "bxor": lambda x, y: x ^ y,
            "land": lambda x, y: int(bool(x) and bool(y)),
            "lor": lambda x, y: int(bool(x) or bool(y)),
        }[op]
        vals = [int(fn(int(x), int(y))) for x, y in zip(xs, ys)]
        if kind == "b":
            return np.array(vals, dtype=np.uint8).astype(bool)
        vals = [v % (1 << bits) for v in vals]
        if kind == "i":
            vals = [v - (1 << bits) if v >= 1 << (bits - 1) else v for v in vals]
        return np.array(vals, dtype=dt)
    if op in ("min", "max"):
        return _ieee_pick(a, b, op)
    if kind == "c":
        real = np.float32 if dt == np.dtype(np.complex64) else np.float64
        ra, rb = a.view(real).reshape(-1, 2), b.view(real).reshape(-1, 2)
        if op == "sum":
            out = np.stack([_reference(ra[:, 0], rb[:, 0], "sum"),
                            _reference(ra[:, 1], rb[:, 1], "sum")], axis=1)
            return out.reshape(-1).view(dt)
        with np.errstate(all="ignore"):  # prod: not exact in any dtype; see _close_complex
            return (a.astype(np.complex128) * b.astype(np.complex128)).astype(dt)
    if dt == np.dtype(np.float64):
        return _exact_f64(a, b, op)
    with np.errstate(all="ignore"):  # float16/bfloat16/float32: exact in float64, round once
        wa, wb = a.astype(np.float64), b.astype(np.float64)
        w = wa + wb if op == "sum" else wa * wb
        return w.astype(np.float32).astype(dt) if dt == BF16 else w.astype(dt)


def _bits(x):
    return x.view(np.dtype(f"u{x.dtype.itemsize}")) if x.dtype.kind != "c" else \
        x.view(np.dtype(f"u{x.dtype.itemsize // 2}"))


def _real_view(x):
    if x.dtype.kind == "c":
        return x.view(np.float32 if x.dtype == np.dtype(np.complex64) else np.float64)
    return x


def assert_same_bits(got, want, nan_bits=True):
    """Assert bitwise equality; NaNs only need to be NaN when ``nan_bits`` is False."""
    assert got.dtype == want.dtype and got.shape == want.shape
    g, w = _bits(got).reshape(-1), _bits(want).reshape(-1)
    if not nan_bits and K.dtype_kind(got.dtype) in "fc":
        with np.errstate(invalid="ignore"):
            both = (np.isnan(_real_view(got).astype(np.float64)) &
                    np.isnan(_real_view(want).astype(np.float64))).reshape(-1)
        g, w = g[~both], w[~both]
    bad = np.flatnonzero(g != w)
    assert bad.size == 0, (f"{bad.size} elements differ, first at {bad[:5]}: "
                           f"got {_real_view(got).reshape(-1)[bad[:5]]} "
                           f"want {_real_view(want).reshape(-1)[bad[:5]]}")


def _close_complex(got, a, b):
    """|got - a*b| within a few ulps of |a||b| (complex prod is not exactly rounded)."""
    eps = np.finfo(got.dtype).eps
    wa, wb = a.astype(np.complex128), b.astype(np.complex128)
    with np.errstate(all="ignore"):
        want = wa * wb
        err = np.abs(got.astype(np.complex128) - want)
        bound = 4 * eps * np.abs(wa) * np.abs(wb) + np.finfo(got.dtype).tiny
        finite = np.isfinite(want) & np.isfinite(got)
    assert np.all(err[finite] <= bound[finite])


# --- every op x dtype, per backend --------------------------------------------------------

@pytest.mark.parametrize("dtype,op", VALID, ids=_ids(VALID))
@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_reduce_matches_reference(dtype, op, backend):
    # backend="numba" on a pair Numba has no kernel for (float16, bfloat16, complex prod)
    # checks that reduce_into falls back to NumPy correctly.
    a, b = _data(dtype, 203, seed=zlib.crc32(f"{dtype}{op}".encode()))
    dst, b0 = a.copy(), b.copy()
    out = K.reduce_into(dst, b, op, backend=backend)
    assert out is dst
    if K.dtype_kind(dtype) == "c" and op == "prod":
        _close_complex(dst, a, b)
    else:
        # NaN payloads are whatever the hardware makes; every other bit must match.
        assert_same_bits(dst, _reference(a, b, op), nan_bits=False)
    assert_same_bits(b, b0)  # src untouched


@pytest.mark.parametrize("dtype,op", NUMBA_VALID, ids=_ids(NUMBA_VALID))
def test_numba_equals_numpy_bitwise(dtype, op):
    a, b = _data(dtype, 5003, seed=7)
    x, y = a.copy(), a.copy()
    numpy_backend.reduce_into(x, b, op)
    numba_backend.reduce_into(y, b, op)
    assert_same_bits(y, x, nan_bits=True)


def test_every_claimed_pair_is_tested():
    """The matrix above covers exactly the pairs check_op accepts, on every dtype."""
    assert {str(d) for d, _ in VALID} == set(K.DTYPES)
    per_op = {op: sum(1 for _, o in VALID if o == op) for op in K.OPS}
    assert per_op == {"sum": 14, "prod": 14, "avg": 6, "min": 12, "max": 12, "band": 9,
                      "bor": 9, "bxor": 9, "land": 9, "lor": 9}


# --- layouts, dispatch, API errors ---------------------------------------------------------

@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_multidim_and_fortran_order(backend):
    a = np.arange(60, dtype=np.int32).reshape(3, 4, 5)
    b = np.ones_like(a)
    x = a.copy()
    K.reduce_into(x, b, "sum", backend=backend)
    np.testing.assert_array_equal(x, a + 1)
    f = np.asfortranarray(a)
    K.reduce_into(f, np.asfortranarray(b) * 3, "prod", backend=backend)
    np.testing.assert_array_equal(f, a * 3)


@pytest.mark.parametrize("backend", ["numpy", "numba", None])
def test_strided_views(backend):
    base = np.arange(40, dtype=np.float64)
    dst = base[::2]
    src = np.arange(100, 120, dtype=np.float64)[::-1]
    K.reduce_into(dst, src, "max", backend=backend)
    np.testing.assert_array_equal(base[::2], np.maximum(np.arange(0, 40, 2), src))
    np.testing.assert_array_equal(base[1::2], np.arange(1, 40, 2))  # untouched


def test_zero_size_and_bfloat16_bits_reinterpretation():
    K.reduce_into(np.empty(0, np.float32), np.empty(0, np.float32), "sum")
    a = np.array([1.5, -2.0, 3.0], BF16)
    b = np.array([0.25, 2.0, 1e30], BF16)
    x = a.view(np.uint16).copy()
    K.reduce_into(x, b.view(np.uint16), "sum", dtype="bfloat16")
    assert_same_bits(x.view(BF16), a + b)


def test_argument_errors():
    with pytest.raises(ValueError, match="differ in shape or dtype"):
        K.reduce_into(np.zeros(3), np.zeros(4), "sum")
    with pytest.raises(ValueError, match="differ in shape or dtype"):
        K.reduce_into(np.zeros(3), np.zeros(3, np.float32), "sum")
    ro = np.zeros(3)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        K.reduce_into(ro, np.zeros(3), "sum")
    with pytest.raises(ValueError, match="unknown reduction op"):
        K.reduce_into(np.zeros(3), np.zeros(3), "median")
    with pytest.raises(TypeError, match="max needs"):
        K.reduce_into(np.zeros(3, complex), np.zeros(3, complex), "max")
    with pytest.raises(TypeError, match="NumPy arrays or CUDA device arrays"):
        K.reduce_into([1, 2], [3, 4], "sum")
    with pytest.raises(ValueError, match="unknown kernel backend"):
        K.reduce_into(np.zeros(3), np.zeros(3), "sum", backend="fortran")


def test_select_backend_and_env(monkeypatch):
    monkeypatch.delenv("MLCOMM_KERNEL", raising=False)
    small = np.zeros(16, np.float32)
    large = np.zeros(K.NUMBA_MIN_BYTES // 4, np.float32)
    assert K.select_backend(small) == "numpy"
    assert K.select_backend(large) == "numba"
    for half in (np.float16, BF16):  # NumPy is slow on 2-byte floats: Numba pays much sooner
        assert K.select_backend(np.zeros(K.NUMBA_MIN_BYTES_HALF // 2, half)) == "numba"
        assert K.select_backend(np.zeros(K.NUMBA_MIN_BYTES_HALF // 2 - 1, half)) == "numpy"
    assert K.NUMBA_MIN_BYTES_HALF < K.NUMBA_MIN_BYTES
    assert K.select_backend(large, op="prod") == "numba"
    assert K.select_backend(large.astype(np.complex64), op="prod") == "numpy"
    monkeypatch.setenv("MLCOMM_KERNEL", "numpy")
    assert K.select_backend(large) == "numpy"
    monkeypatch.setenv("MLCOMM_KERNEL", "numba")
    assert K.select_backend(small) == "numba"
    assert K.select_backend(np.zeros(16, np.float16)) == "numba"
    assert K.select_backend(small[::2], small[::2]) == "numpy"  # not contiguous
    x = small + 1
    K.reduce_into(x, small + 2, "sum")
    np.testing.assert_array_equal(x, 3)
    monkeypatch.setenv("MLCOMM_KERNEL", "cobol")
    with pytest.raises(ValueError, match="MLCOMM_KERNEL"):
        K.select_backend(small)


def test_backends_report():
    info = K.backends()
    assert list(info) == list(K.BACKENDS)
    assert info["numpy"]["available"] and info["numba"]["available"]
    for entry in info.values():
        assert set(entry) == {"available", "detail"} and isinstance(entry["detail"], str)


@pytest.mark.parametrize("env,cpus,expect", [
    ({}, 8, 8), ({"MPI_LOCALNRANKS": "3"}, 8, 2), ({"OMPI_COMM_WORLD_LOCAL_SIZE": "16"}, 8, 1),
    ({"SLURM_NTASKS_PER_NODE": "4(x2)"}, 8, 2), ({"MLCOMM_NUM_THREADS": "1"}, 8, 1),
])
def test_thread_count(monkeypatch, env, cpus, expect):
    for var in numba_backend._LOCAL_SIZE_VARS + ("MLCOMM_NUM_THREADS",):
        monkeypatch.delenv(var, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(numba_backend.os, "sched_getaffinity", lambda pid: set(range(cpus)))
    monkeypatch.setattr(numba_backend.numba.config, "NUMBA_NUM_THREADS", 64)
    monkeypatch.setattr(numba_backend, "_threads", None)
    assert numba_backend.num_threads() == expect
    monkeypatch.setattr(numba_backend, "_threads", None)


# --- Numba: blocks, threads, float16/bfloat16 on their bits ---------------------------------

HALVES = [np.dtype(np.float16), BF16]
# zeros, subnormals, 1, the largest finite, inf, and NaNs of both signs, quiet and signalling,
# in float16 (first row) and bfloat16 (second row) encodings
_SPECIAL = np.array([0x0000, 0x8000, 0x0001, 0x83FF, 0x3C00, 0xBC00, 0x7BFF, 0xFBFF, 0x7C00,
                     0xFC00, 0x7C05, 0x7E02, 0xFE03, 0xFC07,
                     0x0080, 0x007F, 0x3F80, 0x7F7F, 0xFF7F, 0x7F80, 0xFF80, 0x7F85, 0x7FC2,
                     0xFFC3, 0xFF87], np.uint16)


@pytest.mark.parametrize("op", ["sum", "prod", "min", "max"])
@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_numba_half_every_value_equals_numpy(dtype, op):
    """All 65536 bit patterns against each edge value, both ways round, NaN payloads included."""
    every = np.arange(1 << 16, dtype=np.uint16)
    a = np.concatenate([np.tile(every, _SPECIAL.size), np.repeat(_SPECIAL, every.size)])
    b = np.concatenate([np.repeat(_SPECIAL, every.size), np.tile(every, _SPECIAL.size)])
    x, y = a.view(dtype).copy(), a.view(dtype).copy()
    numpy_backend.reduce_into(x, b.view(dtype), op)
    numba_backend.reduce_into(y, b.view(dtype), op)
    assert_same_bits(y, x)


def test_float16_bit_arithmetic_equals_numpy():
    """The float16 path for machines without F16C converts exactly as NumPy does."""
    numba = pytest.importorskip("numba")

    @numba.njit
    def widen(h, out):
        for i in range(h.shape[0]):
            out[i] = numba_backend._soft_f16_to_f32(h[i])

    @numba.njit
    def narrow(x, out):
        for i in range(x.shape[0]):
            out[i] = numba_backend._soft_f32_to_f16(x[i])

    every = np.arange(1 << 16, dtype=np.uint16)
    got = np.empty(every.size, np.float32)
    widen(every, got)
    want = every.view(np.float16).astype(np.float32)
    nan = np.isnan(want)
    assert_same_bits(got[~nan], want[~nan])
    h = every[nan].astype(np.uint32)  # NaN: sign and payload kept, as npy_halfbits_to_floatbits
    assert_same_bits(got[nan].view(np.uint32), (h & 0x8000) << 16 | 0x7F800000 | (h & 0x3FF) << 13)

    # every float16 value, its float32 neighbours, the midpoints between float16 values, and
    # random bit patterns (subnormal, overflowing and NaN floats among them)
    base = want.view(np.uint32)[~nan].astype(np.int64)
    bits = np.concatenate([base + d for d in (-1, 0, 1, 0xFFF, 0x1000, 0x1001)] +
                          [np.random.default_rng(5).integers(0, 1 << 32, 1 << 20)])
    x = (bits & 0xFFFFFFFF).astype(np.uint32).view(np.float32)
    out = np.empty(x.size, np.uint16)
    narrow(x, out)
    with np.errstate(all="ignore"):
        want16 = x.astype(np.float16)
    quiet_or_number = ~np.isnan(x) | ((x.view(np.uint32) & 0x400000) != 0)
    assert_same_bits(out[quiet_or_number], want16.view(np.uint16)[quiet_or_number])
    assert np.isnan(out.view(np.float16)[~quiet_or_number]).all()


@pytest.mark.parametrize("op", ["sum", "prod", "min", "max", "div"])
def test_float16_ops_without_f16c_equal_numpy(monkeypatch, op):
    """The kernels' float16 ops built on the bit arithmetic match NumPy, NaN bits included."""
    numba = pytest.importorskip("numba")
    nb = numba_backend
    monkeypatch.setitem(nb._CODECS, "f16", (nb._soft_f16_to_f32, nb._soft_f32_to_f16))
    fn = numba.njit(nb._impl(f"f16_{op}"))

    @numba.njit
    def loop(d, s):
        for i in range(d.shape[0]):
            d[i] = fn(0, d[i], s[i])

    every = np.arange(1 << 16, dtype=np.uint16)
    f16 = np.dtype(np.float16)
    if op == "div":  # finalize: divide by the rank count in float32, round once
        for n in (3, 7):
            got = every.copy()
            loop(got, np.full(every.size, n, np.float32))
            want = every.view(f16).copy()
            numpy_backend.finalize(want, "avg", n)
            assert_same_bits(got.view(f16), want, nan_bits=False)
        return
    a = np.concatenate([np.tile(every, _SPECIAL.size), np.repeat(_SPECIAL, every.size)])
    b = np.concatenate([np.repeat(_SPECIAL, every.size), np.tile(every, _SPECIAL.size)])
    got, want = a.copy(), a.view(f16).copy()
    loop(got, b)
    numpy_backend.reduce_into(want, b.view(f16), op)
    assert_same_bits(got.view(f16), want)


@pytest.mark.parametrize("dtype", [np.dtype(np.float32), np.dtype(np.int8),
                                   np.dtype(np.complex64)] + HALVES, ids=str)
@pytest.mark.parametrize("n", [1, 2, 3, 5, 63, 1000, 4097])
def test_numba_blocks_cover_ragged_sizes_once(n, dtype):
    """Blocks split any length, at any offset, touching each element once: NumPy's bits."""
    a, b = (v[:n] for v in _data(dtype, max(n, 32), seed=n))
    for offset in (0, 1):
        y = np.empty(n + offset, dtype)[offset:]
        y[...] = a
        x = a.copy()
        with numba_backend.threads(2):
            numba_backend.reduce_into(y, b, "sum")
        numpy_backend.reduce_into(x, b, "sum")
        assert_same_bits(y, x)


def test_numba_uses_every_core(monkeypatch):
    numba = pytest.importorskip("numba")
    cores = min(len(os.sched_getaffinity(0)), numba.config.NUMBA_NUM_THREADS)
    if cores < 2:
        pytest.skip("needs 2 cores")
    for var in numba_backend._LOCAL_SIZE_VARS + ("MLCOMM_NUM_THREADS",):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(numba_backend, "_threads", None)
    x = np.zeros(K.NUMBA_MIN_BYTES // 4, np.float32)
    assert K.select_backend(x) == "numba"
    K.reduce_into(x, np.ones_like(x), "sum")
    if numba.threading_layer() == "tbb":
        pytest.skip("TBB may let one thread run both blocks")
    assert numba_backend.num_threads() == cores
    assert numba_backend.threads_used() == cores
    with numba_backend.threads(1):
        K.reduce_into(x, np.ones_like(x), "sum")
        assert numba_backend.threads_used() == 1
    assert numba_backend.num_threads() == cores
    np.testing.assert_array_equal(x, 2)
    assert f"{cores} thread(s)" in K.backends()["numba"]["detail"]


# --- the op table --------------------------------------------------------------------------

def test_op_table_records():
    codes = {"sum": 0, "prod": 1, "min": 2, "max": 3, "band": 4, "bor": 5, "bxor": 6, "land": 7,
             "lor": 8, "avg": 9}
    assert tuple(K.OP_TABLE) == K.OPS
    assert {name: op.code for name, op in K.OP_TABLE.items()} == codes
    assert [op.code for op in K.OP_BY_CODE] == list(range(10))
    assert all(K.OP_BY_CODE[op.code] is op for op in K.OP_TABLE.values())
    assert {name: op.mpi for name, op in K.OP_TABLE.items()} == {
        "sum": "SUM", "prod": "PROD", "min": "MIN", "max": "MAX", "avg": "SUM", "band": "BAND",
        "bor": "BOR", "bxor": "BXOR", "land": "LAND", "lor": "LOR"}
    assert {name: op.torch for name, op in K.OP_TABLE.items()} == {
        "sum": "SUM", "prod": "PRODUCT", "min": "MIN", "max": "MAX", "avg": "AVG", "band": "BAND",
        "bor": "BOR", "bxor": "BXOR", "land": "", "lor": ""}
    for op in K.OP_TABLE.values():
        assert op.reduces_as == ("sum" if op.name == "avg" else op.name)
        assert op.reduce_code == K.OP_TABLE[op.reduces_as].code
        assert op.divides == (op.name == "avg")
        assert op.picks == (op.name in ("min", "max"))
        for dt in ALL_DTYPES:  # the accepted kinds are exactly what check_op lets through
            assert K.is_supported(dt, op.name) == (K.dtype_kind(dt) in op.kinds)
            if K.dtype_kind(dt) not in op.kinds and op.hint(K.dtype_kind(dt)):
                with pytest.raises(TypeError) as err:
                    K.check_op(dt, op.name)
                assert op.hint(K.dtype_kind(dt)) in str(err.value)
    assert K.op_code("MPI_MAX") == 3 and K.op_code("mean") == 9 and K.op_code("bitwise_or") == 5
    assert K.op_info("logical_and") is K.OP_TABLE["land"]
    assert K.OP_TABLE["prod"].ufunc is np.multiply and K.OP_TABLE["avg"].ufunc is np.add
    with pytest.raises(dataclasses.FrozenInstanceError):
        K.OP_TABLE["sum"].code = 5
    with pytest.raises(TypeError):
        K.OP_TABLE["median"] = K.OP_TABLE["sum"]
    with pytest.raises(ValueError, match="unknown reduction op"):
        K.op_code("median")


def test_kernel_views_and_scalar_names():
    u8, u16 = np.dtype(np.uint8), np.dtype(np.uint16)
    assert K.kernel_view(np.int8, "sum") == u8 and K.kernel_view(np.int8, "max") == np.int8
    assert K.kernel_view(np.bool_, "lor") == u8
    assert K.kernel_view(np.complex64, "avg") == np.float32
    assert K.kernel_view(np.complex128, "prod") == np.complex128
    assert K.kernel_view(BF16, "max") == BF16
    assert numba_backend.kernel_dtype(BF16, "max") == u16
    assert numba_backend.kernel_dtype(np.float16, "sum") == u16
    assert numba_backend.kernel_dtype(np.int64, "bxor") == np.uint64
    assert numba_backend.scalar_name(np.float16, "avg") == "f16_sum"
    assert numba_backend.scalar_name(BF16, "max") == "bf16_max"
    assert numba_backend.scalar_name(np.float32, "avg") == "sum"
    assert numba_backend.scalar_name(BF16, "div") == "bf16_div"
    with pytest.raises(NotImplementedError):
        numba_backend.scalar("sum", 1, 2)


_ELEMENT_PAIRS = [(dt, op) for dt, op in VALID if dt not in (np.dtype(np.float16), BF16)]


@pytest.mark.parametrize("dtype,op", _ELEMENT_PAIRS, ids=_ids(_ELEMENT_PAIRS))
def test_table_element_is_the_numpy_op(dtype, op):
    """``Op.element`` run by Python on the kernel view gives the NumPy backend's bits."""
    a, b = _data(dtype, 64, seed=zlib.crc32(f"{dtype}{op}element".encode()))
    want = a.copy()
    numpy_backend.reduce_into(want, b, op)
    view = K.kernel_view(dtype, op)
    x, y = a.view(view), b.view(view)
    element = K.OP_TABLE[op].element
    with np.errstate(all="ignore"):
        got = np.array([element(p, q) for p, q in zip(x, y)]).astype(view, casting="unsafe")
    if dtype.kind == "c" and op == "prod":
        _close_complex(got.view(dtype), a, b)
    else:
        assert_same_bits(got.view(dtype), want)


def _loop(name):
    """A user's own @njit loop calling ``scalar`` with the literal ``name``."""
    numba = pytest.importorskip("numba")

    @numba.njit
    def loop(d, s):
        for i in range(d.shape[0]):
            d[i] = numba_backend.scalar(name, d[i], s[i])
    return loop


_LOOPS = {}


@pytest.mark.parametrize("dtype,op", NUMBA_VALID, ids=_ids(NUMBA_VALID))
def test_scalar_in_another_njit_loop_equals_the_kernels(dtype, op):
    """scalar(scalar_name(dt, op), ...) on kernel_dtype(dt, op) gives reduce_into's bits."""
    name = numba_backend.scalar_name(dtype, op)
    loop = _LOOPS.get(name) or _LOOPS.setdefault(name, _loop(name))
    a, b = _data(dtype, 301, seed=11)
    want = a.copy()
    numba_backend.reduce_into(want, b, op)
    kdt = numba_backend.kernel_dtype(dtype, op)
    got = a.copy()
    loop(got.view(kdt), b.view(kdt))
    assert_same_bits(got, want)


def test_scalar_with_a_literal_in_the_source():
    numba = pytest.importorskip("numba")

    @numba.njit
    def bf16_max(d, s):
        for i in range(d.shape[0]):
            d[i] = numba_backend.scalar("bf16_max", d[i], s[i])

    a = np.array([0.0, -0.0, np.nan, 1.0], BF16)
    b = np.array([-0.0, 0.0, 2.0, np.nan], BF16)
    got = a.view(np.uint16).copy()
    bf16_max(got, b.view(np.uint16))
    assert got.tolist() == [0x0000, 0x0000, a.view(np.uint16)[2], b.view(np.uint16)[3]]


# --- check_op ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,op,words", [
    (np.complex64, "max", ["max", "complex64", "abs()"]),
    (np.complex128, "min", ["min", "complex128", "not ordered"]),
    (np.float32, "bxor", ["bxor", "float32", "view"]),
    (BF16, "band", ["band", "bfloat16", "unsigned integer"]),
    (np.float64, "land", ["land", "float64", "!= 0"]),
    (np.int32, "avg", ["avg", "int32", "floating or complex", "sum"]),
    (np.uint8, "avg", ["avg", "uint8", "sum"]),
    (np.bool_, "sum", ["sum", "bool", "lor"]),
    (np.bool_, "prod", ["prod", "bool", "land"]),
    (np.bool_, "max", ["max", "bool", "lor"]),
    (np.bool_, "avg", ["avg", "bool"]),
    (np.longdouble, "sum", ["sum", "fall back to MPI"]),
    (np.dtype(">i4"), "sum", ["sum", "byte order"]),
    (np.dtype([("a", "i4")]), "sum", ["sum", "no mlcomm kernel"]),
])
def test_check_op_errors(dtype, op, words):
    with pytest.raises(TypeError) as err:
        K.check_op(dtype, op)
    for word in words:
        assert word in str(err.value)
    assert not K.is_supported(dtype, op)


def test_check_op_accepts_and_names():
    for dt, op in VALID:
        assert K.check_op(dt, op) is None
    assert K.check_op("float32", "SUM") is None and K.check_op(np.int8, "MPI_BXOR") is None
    assert K.normalize_op("logical_or") == "lor" and K.normalize_op("mean") == "avg"
    with pytest.raises(ValueError, match="choose one of sum, prod"):
        K.check_op(np.float32, "median")
    assert not K.is_supported(np.float32, "median")
    assert not K.is_supported(object, "sum")
    assert K.OPS == ("sum", "prod", "min", "max", "avg", "band", "bor", "bxor", "land", "lor")


# --- finalize ------------------------------------------------------------------------------

AVG_DTYPES = [d for d, op in VALID if op == "avg"]


@pytest.mark.parametrize("dtype", AVG_DTYPES, ids=[str(d) for d in AVG_DTYPES])
@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("nranks", [1, 3, 7, 257])
def test_finalize_avg(dtype, backend, nranks):
    a, _ = _data(dtype, 101, seed=3)
    x = a.copy()
    K.finalize(x, "avg", nranks, backend=backend)
    if K.dtype_kind(dtype) == "c":
        real = np.float32 if dtype == np.dtype(np.complex64) else np.float64
        got, src = x.view(real), a.view(real)
    else:
        got, src = x, a
    if got.dtype == np.dtype(np.float64):
        want = np.array([math.copysign(_round64(Fraction(v) / nranks), v)
                         if math.isfinite(v) else v / nranks for v in src.tolist()])
    else:  # exact in float64, then one rounding
        want = (src.astype(np.float64) / nranks).astype(np.float32).astype(got.dtype) \
            if got.dtype == BF16 else (src.astype(np.float64) / nranks).astype(got.dtype)
    assert_same_bits(got, want, nan_bits=False)


def test_finalize_other_ops_untouched():
    x = np.arange(5, dtype=np.int32)
    for op in ("sum", "max", "bxor"):
        K.finalize(x, op, 4)
    np.testing.assert_array_equal(x, np.arange(5))
    with pytest.raises(TypeError, match="avg"):
        K.finalize(np.arange(5), "avg", 4)


# --- property test -------------------------------------------------------------------------

PROP_DTYPES = [np.dtype(t) for t in (np.int8, np.uint16, np.int64, np.uint64, np.float32,
                                     np.float64, np.complex64, np.bool_)]


@st.composite
def _case(draw):
    dtype = draw(st.sampled_from(PROP_DTYPES))
    op = draw(st.sampled_from([op for op in K.OPS if K.is_supported(dtype, op)]))
    n = draw(st.integers(0, 64))
    elements = None
    if dtype.kind == "f":
        elements = st.floats(width=dtype.itemsize * 8, allow_nan=True, allow_infinity=True)
    a = draw(hnp.arrays(dtype, n, elements=elements))
    b = draw(hnp.arrays(dtype, n, elements=elements))
    return dtype, op, a, b


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_case())
def test_property_backends_agree_with_reference(case):
    dtype, op, a, b = case
    x, y = a.copy(), a.copy()
    K.reduce_into(x, b, op, backend="numpy")
    K.reduce_into(y, b, op, backend="numba")
    assert_same_bits(y, x)
    if dtype.kind == "c" and op == "prod":
        return
    assert_same_bits(x, _reference(a, b, op), nan_bits=False)


# --- min/max: NaN propagates, -0 < +0, on every backend --------------------------------------

FLOATS = [np.dtype(np.float16), BF16, np.dtype(np.float32), np.dtype(np.float64)]
_UINTS = {2: np.uint16, 4: np.uint32, 8: np.uint64}
# NaNs of both signs, quiet and signalling, with payloads, as raw bits per width
_NANS = {2: {np.dtype(np.float16): [0x7E00, 0xFE00, 0x7C01, 0xFE05, 0x7D55],
             BF16: [0x7FC0, 0xFFC0, 0x7F81, 0xFFC5, 0x7FD5]},
         4: [0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFC00005, 0x7FD55555],
         8: [0x7FF8000000000000, 0xFFF8000000000000, 0x7FF0000000000001,
             0xFFF8000000000005, 0x7FF5555555555555]}


def _nans(dtype):
    table = _NANS[dtype.itemsize]
    bits = table[dtype] if isinstance(table, dict) else table
    return np.array(bits, _UINTS[dtype.itemsize]).view(dtype)


def _run(backend, dst, src, op):
    """Reduce with ``backend``: "numpy", "numba" or "scalar" (a user's njit loop)."""
    if backend == "scalar":
        name = numba_backend.scalar_name(dst.dtype, op)
        loop = _LOOPS.get(name) or _LOOPS.setdefault(name, _loop(name))
        kdt = numba_backend.kernel_dtype(dst.dtype, op)
        loop(dst.view(kdt), src.view(kdt))
    else:
        K.reduce_into(dst, src, op, backend=backend)
    return dst


PICK_BACKENDS = ["numpy", "numba", "scalar"]


@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("backend", PICK_BACKENDS)
def test_signed_zeros_are_ordered(backend, dtype, op):
    zeros = np.array([0.0, -0.0], dtype)
    a = np.repeat(zeros, 2)  # +0 +0 -0 -0
    b = np.tile(zeros, 2)    # +0 -0 +0 -0
    got = _run(backend, a.copy(), b, op)
    swapped = _run(backend, b.copy(), a, op)
    want = [0.0, 0.0, 0.0, -0.0] if op == "max" else [0.0, -0.0, -0.0, -0.0]
    assert_same_bits(got, np.array(want, dtype))
    assert_same_bits(swapped, got)


@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("backend", PICK_BACKENDS)
def test_nan_propagates_from_either_side(backend, dtype, op):
    nans = _nans(dtype)
    others = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf], dtype)
    nan_first = np.repeat(nans, others.size)
    other = np.tile(others, nans.size)
    assert_same_bits(_run(backend, nan_first.copy(), other, op), nan_first)  # its bits
    assert_same_bits(_run(backend, other.copy(), nan_first, op), nan_first)
    a = np.repeat(nans, nans.size)  # two NaNs: the first operand's
    b = np.tile(nans, nans.size)
    assert_same_bits(_run(backend, a.copy(), b, op), a)


def _sprinkled(draw, dtype, n):
    """``n`` random values of ``dtype`` with zeros of both signs and NaNs sprinkled in."""
    values = draw(hnp.arrays(np.float64, n, elements=st.floats(-1e4, 1e4, width=32)))
    kinds = draw(hnp.arrays(np.int8, n, elements=st.integers(0, 5)))
    nans = _nans(dtype)
    with np.errstate(all="ignore"):
        out = values.astype(np.float32).astype(dtype)
    out[kinds == 1] = 0.0
    out[kinds == 2] = -0.0
    picks = draw(hnp.arrays(np.int8, n, elements=st.integers(0, nans.size - 1)))
    out[kinds == 3] = nans[picks[kinds == 3]]
    return out


@st.composite
def _pick_case(draw):
    dtype = draw(st.sampled_from(FLOATS))
    op = draw(st.sampled_from(["max", "min"]))
    n = draw(st.integers(1, 80))
    return dtype, op, _sprinkled(draw, dtype, n), _sprinkled(draw, dtype, n)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_pick_case())
def test_property_min_max_every_backend_same_bits(case):
    dtype, op, a, b = case
    want = _ieee_pick(a, b, op)
    for backend in PICK_BACKENDS:
        assert_same_bits(_run(backend, a.copy(), b, op), want)
    # commutative, but for which of two NaNs
    swapped = _run("numpy", b.copy(), a, op)
    with np.errstate(invalid="ignore"):
        both_nan = np.isnan(a.astype(np.float64)) & np.isnan(b.astype(np.float64))
    assert_same_bits(swapped[~both_nan], want[~both_nan])


@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("backend", PICK_BACKENDS)
def test_min_max_do_not_depend_on_the_reduction_order(backend, dtype, op):
    """Any order of combining ranks' vectors, as algorithms differ in, gives the same bits."""
    rng = np.random.default_rng(3)
    n, ranks = 64, 7
    vectors = rng.choice(np.array([0.0, -0.0, 1.0, -1.0, 0.5, np.nan], np.float32),
                         (ranks, n)).astype(dtype)

    def chain(order):
        acc = vectors[order[0]].copy()
        for r in order[1:]:
            _run(backend, acc, vectors[r], op)
        return acc

    def tree(rows):
        rows = [v.copy() for v in rows]
        while len(rows) > 1:
            for i in range(0, len(rows) - 1, 2):
                _run(backend, rows[i], rows[i + 1], op)
            rows = rows[::2]
        return rows[0]

    want = chain(list(range(ranks)))
    assert_same_bits(chain(list(range(ranks))[::-1]), want)
    assert_same_bits(chain(list(rng.permutation(ranks))), want)
    assert_same_bits(tree(list(vectors[rng.permutation(ranks)])), want)


@pytest.mark.parametrize("op", ["max", "min"])
def test_bare_kernels_order_zeros_whatever_aliases(op):
    """The loops' kernels: dst = dst op src, and dst = left op src with dst one of them."""
    a = np.array([0.0, -0.0, 0.0, -0.0, np.nan, 2.0], np.float32)
    b = np.array([-0.0, 0.0, 0.0, -0.0, 1.0, np.nan], np.float32)
    want = _ieee_pick(a, b, op)
    with np.errstate(all="ignore"):
        x = a.copy()
        numpy_backend.bare_kernel(op)(x, b)
        assert_same_bits(x, want)
        kernel3 = numpy_backend.bare_kernel3(op)
        out = np.empty_like(a)
        kernel3(out, a, b)
        assert_same_bits(out, want)
        x = a.copy()
        kernel3(x, x, b)
        assert_same_bits(x, want)
        y = b.copy()
        kernel3(y, a, y)
        assert_same_bits(y, want)


# --- bandwidth -----------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_bandwidth_measure(backend):
    r = bandwidth.measure(1 << 16, "float32", "sum", backend=backend, repeat=2)
    assert r["backend"] == backend and r["nbytes"] == 1 << 16 and r["count"] == 1 << 14
    assert r["threads"] == (1 if backend == "numpy" else numba_backend.num_threads())
    assert r["reduce_gbps"] > 0 and r["copy_gbps"] > 0
    assert r["ratio"] == pytest.approx(r["reduce_gbps"] / max(r["copy_gbps"], r["memcpy_gbps"]))
    assert r["memcpy_gbps"] == pytest.approx(2 * r["nbytes"] / r["memcpy_s"] / 1e9)
    assert r["reduce_gbps"] == pytest.approx(3 * r["nbytes"] / r["reduce_s"] / 1e9)
    with pytest.raises(TypeError):
        bandwidth.measure(1024, "complex64", "max")


def test_bandwidth_threads_and_halves():
    r = bandwidth.measure(1 << 16, "bfloat16", "sum", backend="numba", repeat=1, threads=1)
    assert (r["backend"], r["threads"], r["dtype"], r["count"]) == ("numba", 1, "bfloat16", 1 << 15)
    r = bandwidth.measure(1 << 16, "complex64", "prod", backend="numba", repeat=1)
    assert r["backend"] == "numpy" and r["threads"] == 1  # no Numba kernel: NumPy timed
