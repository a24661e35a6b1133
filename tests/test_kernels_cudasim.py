"""GPU kernels: Numba CUDA under the simulator (always), CuPy and real Numba CUDA on a GPU.

The simulator must be switched on before Numba is imported, so those checks run this file as
a script in a subprocess with ``NUMBA_ENABLE_CUDASIM=1``; the pytest process itself never turns
the simulator on. GPU-only tests skip without a GPU and fail instead when ``MLCOMM_TEST_GPU=1``.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

GPU_REQUIRED = os.environ.get("MLCOMM_TEST_GPU") == "1"


# --- the checks, shared by the simulator subprocess and the real-GPU tests ------------------

def _pairs():
    import mlcomm.kernels as K
    from mlcomm.kernels.ops import supported_dtypes
    return [(dt, op) for dt in supported_dtypes() for op in K.OPS if K.is_supported(dt, op)]


def _case(dtype, n, seed):
    """Two host arrays with edge values (signed zeros, inf, NaN, extremes) and random data."""
    import ml_dtypes
    rng = np.random.default_rng(seed)
    kind = dtype.kind
    if dtype == np.dtype(ml_dtypes.bfloat16):
        kind = "f"
    if kind == "b":
        return rng.integers(0, 2, n).astype(bool), rng.integers(0, 2, n).astype(bool)
    if kind in "iu":
        info = np.iinfo(dtype)
        a = rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
        b = rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
        a[:4] = [info.min, info.max, 0, 1]
        b[:4] = [info.max, info.max, 5, 0]
        b[4:12] = rng.integers(0, 3, 8)
        return a, b
    edge_a = [0.0, -0.0, 0.0, np.inf, -np.inf, np.nan, 1.0, 3.0, 1e30, -7.5]
    edge_b = [-0.0, 0.0, 0.0, -np.inf, 2.0, 1.0, np.nan, 3.0, 1e30, 0.125]
    ra = rng.standard_normal(n) * rng.choice([1e-3, 1.0, 1e3], n)
    rb = rng.standard_normal(n) * rng.choice([1e-3, 1.0, 1e3], n)
    ra[:10], rb[:10] = edge_a, edge_b
    with np.errstate(all="ignore"):
        if kind == "c":
            a, b = np.empty(n, dtype), np.empty(n, dtype)
            a.real, a.imag, b.real, b.imag = ra, rb[::-1], rb, ra[::-1]
            return a, b
        return ra.astype(dtype), rb.astype(dtype)


def _bits(x):
    width = x.dtype.itemsize // (2 if x.dtype.kind == "c" else 1)
    return x.view(np.dtype(f"u{width}")).reshape(-1)


def _nan_mask(x):
    import ml_dtypes
    with np.errstate(invalid="ignore"):
        if x.dtype == np.dtype(ml_dtypes.bfloat16) or x.dtype.kind == "f":
            return np.isnan(x.astype(np.float64)).reshape(-1)
        if x.dtype.kind == "c":
            real = x.view(np.float32 if x.dtype == np.dtype(np.complex64) else np.float64)
            return np.isnan(real).reshape(-1)
    return np.zeros(_bits(x).size, bool)


def _compare(got, want, exact_nans):
    """Return None when bit-identical (NaNs only NaN unless ``exact_nans``), else a message."""
    g, w = _bits(got), _bits(want)
    if not exact_nans:
        keep = ~(_nan_mask(got) & _nan_mask(want))
        g, w = g[keep], w[keep]
    bad = np.flatnonzero(g != w)
    return None if bad.size == 0 else f"{bad.size} differ, first bit patterns " \
        f"{g[bad[:3]].tolist()} vs {w[bad[:3]].tolist()}"


def _floats():
    import ml_dtypes
    return [np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32),
            np.dtype(np.float64)]


def _pick_case(dtype, seed):
    """min/max operands: every pair of special values (zeros of both signs, infinities, NaNs
    of both signs with payloads, quiet and signalling), then random values with zeros and
    NaNs sprinkled in."""
    width = dtype.itemsize
    uint = np.dtype(f"u{width}")
    nans = {2: [0x7E00, 0xFE00, 0x7C01, 0x7D55] if dtype == np.float16 else
            [0x7FC0, 0xFFC0, 0x7F81, 0xFFD5],
            4: [0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFD55555],
            8: [0x7FF8000000000000, 0xFFF8000000000000, 0x7FF0000000000001,
                0xFFFD555555555555]}[width]
    nans = np.array(nans, uint).view(dtype)
    special = np.concatenate([np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, 0.5], np.float32)
                              .astype(dtype), nans])
    rng = np.random.default_rng(seed)
    n = 120
    ra = rng.standard_normal(n).astype(np.float32).astype(dtype)
    rb = rng.standard_normal(n).astype(np.float32).astype(dtype)
    for r in (ra, rb):
        kind = rng.integers(0, 5, n)
        r[kind == 1] = 0.0
        r[kind == 2] = -0.0
        r[kind == 3] = nans[rng.integers(0, nans.size, n)][kind == 3]
    a = np.concatenate([np.repeat(special, special.size), ra])
    b = np.concatenate([np.tile(special, special.size), rb])
    return a, b


def run_pick_checks(to_device, to_host, backend):
    """min/max on every float dtype against the NumPy backend, NaN bits included, both
    operand orders. Returns failures."""
    import ml_dtypes
    import mlcomm.kernels as K
    bf16 = np.dtype(ml_dtypes.bfloat16)
    failures = []
    for i, dt in enumerate(_floats()):
        raw = np.uint16 if dt == bf16 else dt
        for op in ("max", "min"):
            a, b = _pick_case(dt, seed=i)
            for x, y in ((a, b), (b, a)):
                want = x.copy()
                K.reduce_into(want, y, op, backend="numpy")
                d = to_device(x.view(raw))
                K.reduce_into(d, to_device(y.view(raw)), op, backend=backend, dtype=dt)
                msg = _compare(to_host(d).view(dt), want, exact_nans=True)
                if msg:
                    failures.append(f"{backend} {dt} {op}: {msg}")
    return failures


def run_checks(to_device, to_host, backend, exact_nans, n=150):
    """Reduce every (dtype, op) pair on the device and compare with the NumPy backend.

    ``to_device(host) -> device array`` and ``to_host(device) -> host array`` adapt Numba or
    CuPy. bfloat16 travels as raw uint16 bits with ``dtype="bfloat16"``. Returns failures.
    """
    import ml_dtypes
    import mlcomm.kernels as K
    bf16 = np.dtype(ml_dtypes.bfloat16)
    failures = []
    for i, (dt, op) in enumerate(_pairs()):
        a, b = _case(dt, n, seed=i)
        want = a.copy()
        K.reduce_into(want, b, op, backend="numpy")
        raw = np.uint16 if dt == bf16 else dt
        d, s = to_device(a.view(raw)), to_device(b.view(raw))
        K.reduce_into(d, s, op, backend=backend, dtype=dt)
        got = to_host(d).view(dt)
        if dt.kind == "c" and op == "prod":  # not exactly rounded anywhere: a few ulps
            with np.errstate(all="ignore"):
                ref = a.astype(np.complex128) * b.astype(np.complex128)
                err = np.abs(got.astype(np.complex128) - ref)
                bound = 8 * np.finfo(dt).eps * np.abs(a) * np.abs(b) + np.finfo(dt).tiny
                fin = np.isfinite(ref) & np.isfinite(got)
            msg = None if np.all(err[fin] <= bound[fin]) else "complex prod out of tolerance"
        else:
            msg = _compare(got, want, exact_nans)
        if msg:
            failures.append(f"reduce {dt} {op}: {msg}")
        if op == "avg":
            for nranks in (3, 257):
                want2 = want.copy()
                K.finalize(want2, "avg", nranks, backend="numpy")
                d2 = to_device(want.view(raw))
                K.finalize(d2, "avg", nranks, backend=backend, dtype=dt)
                msg = _compare(to_host(d2).view(dt), want2, exact_nans)
                if msg:
                    failures.append(f"finalize {dt} avg/{nranks}: {msg}")
    return failures


def _simulator_main():
    """Run in a subprocess with NUMBA_ENABLE_CUDASIM=1; print a JSON report."""
    import warnings
    warnings.simplefilter("ignore")  # NumPy scalar overflow warnings inside simulated threads
    from numba import config, cuda
    assert config.ENABLE_CUDASIM, "NUMBA_ENABLE_CUDASIM=1 was not set"
    import mlcomm.kernels as K
    from mlcomm.kernels import cuda_backend

    report = {"backends": K.backends()["cuda"], "pairs": len(_pairs())}
    failures = run_checks(cuda.to_device, lambda d: d.copy_to_host(), "cuda", exact_nans=True)
    failures += run_pick_checks(cuda.to_device, lambda d: d.copy_to_host(), "cuda")

    # automatic selection, multi-dimensional arrays, a stream, 2-D bool, plain dtypes
    a = np.arange(24, dtype=np.int16).reshape(4, 6)
    d = cuda.to_device(a)
    if K.select_backend(d) != "cuda":
        failures.append(f"select_backend gave {K.select_backend(d)}")
    stream = cuda.stream()
    K.reduce_into(d, cuda.to_device(a * 2), "sum", stream=stream)
    stream.synchronize()
    if not np.array_equal(d.copy_to_host(), a * 3):
        failures.append("2-D int16 sum on a stream")
    flags = cuda.to_device(np.array([[True, False], [True, True]]))
    K.reduce_into(flags, cuda.to_device(np.array([[True, True], [False, True]])), "land")
    if not np.array_equal(flags.copy_to_host(), [[True, False], [False, True]]):
        failures.append("2-D bool land")
    # errors raised before any launch
    for bad, exc in ((lambda: K.reduce_into(d, d, "bxor", dtype="float32"), TypeError),
                     (lambda: K.reduce_into(d, cuda.to_device(np.zeros(3, np.int16)), "sum"),
                      ValueError),
                     (lambda: K.reduce_into(d[:, ::2], d[:, ::2], "sum"), ValueError)):
        try:
            bad()
            failures.append(f"no {exc.__name__} raised")
        except exc:
            pass
    report["threads"] = cuda_backend.THREADS
    report["failures"] = failures
    print("CUDASIM-REPORT " + json.dumps(report))


def _ptx_main():
    """Compile every Numba CUDA kernel signature the backend launches to PTX (no GPU needed).

    Needs NVVM (a CUDA toolkit via CUDA_HOME, e.g. pip's nvidia-cuda-nvcc-cu12 wheel at
    site-packages/nvidia/cuda_nvcc). Device functions ask the current device for its compute
    capability, so a stand-in device answers (8, 0).
    """
    import numba.cuda.dispatcher as dispatcher
    from numba import cuda, types
    from numba.np.numpy_support import from_dtype
    import mlcomm.kernels as K
    from mlcomm.kernels import cuda_backend as cb
    from mlcomm.kernels.ops import supported_dtypes

    class _Device:
        compute_capability = (8, 0)
    dispatcher.get_current_device = lambda: _Device()
    todo = []
    for dt in supported_dtypes():
        for op in K.OPS:
            if K.is_supported(dt, op):
                kernel, view = cb._plan(dt, op)
                arr = types.Array(from_dtype(view), 1, "C")
                todo.append((kernel, (arr, arr)))
        if K.is_supported(dt, "avg"):
            if dt == K.BFLOAT16:
                todo.append((cb._k_b_div, (types.Array(types.uint16, 1, "C"), types.float32)))
            elif dt == np.float16:
                todo.append((cb._k_h_div, (types.Array(types.float16, 1, "C"), types.float32)))
            else:
                v = from_dtype(cb._REAL.get(dt, dt))
                todo.append((cb._k_div, (types.Array(v, 1, "C"), v)))
    failures, done = [], set()
    for kernel, sig in todo:
        key = (id(kernel), str(sig))
        if key in done:
            continue
        done.add(key)
        try:
            cuda.compile_ptx(kernel.py_func, sig, cc=(8, 0), opt=False)
        except Exception as exc:
            failures.append(f"{kernel.py_func.__qualname__} {sig}: {type(exc).__name__}: "
                            f"{str(exc)[:200]}")
    print("PTX-REPORT " + json.dumps({"compiled": len(done), "failures": failures}))


# --- pytest side ---------------------------------------------------------------------------

def test_numba_cuda_kernels_under_simulator():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, __file__, "--simulator"], capture_output=True,
                          text=True, timeout=600, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("CUDASIM-REPORT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = json.loads(lines[-1].split(" ", 1)[1])
    assert report["backends"]["available"], report
    assert report["pairs"] == 103, report
    assert report["failures"] == [], report["failures"]


#: the CUDA runtime's "no GPU here": cudaErrorInsufficientDriver (no driver, or too old) and
#: cudaErrorNoDevice
NO_GPU_STATUS = (35, 100)


def no_gpu(reason):
    """Skip for ``reason``, a missing GPU or CuPy; fail instead under MLCOMM_TEST_GPU=1."""
    if GPU_REQUIRED:
        pytest.fail(f"MLCOMM_TEST_GPU=1 but {reason}")
    pytest.skip(reason)


def cupy_or_skip():
    """CuPy with a GPU, else a skip (a failure under MLCOMM_TEST_GPU=1). Any other error, a
    broken CuPy or another CUDA error, is raised: on a GPU machine it is a failure."""
    try:
        import cupy
    except ModuleNotFoundError as exc:
        if exc.name != "cupy":
            raise
        no_gpu("CuPy is not installed")
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        if getattr(exc, "status", None) not in NO_GPU_STATUS:
            raise
        no_gpu(f"no CUDA driver or device ({exc})")
    if count < 1:
        no_gpu("no CUDA device")
    return cupy


def _gpu_or_skip(what):
    """Skip (fail under MLCOMM_TEST_GPU=1) only without a GPU or CuPy. With a GPU the backend
    ``what`` must be usable: why it is not fails the test."""
    if what == "cupy":
        cupy_or_skip()
    else:
        from numba import cuda
        if not cuda.is_available():
            no_gpu("no CUDA driver or device (numba.cuda.is_available() is False)")
    import mlcomm.kernels as K
    info = K.backends()[what]
    assert info["available"], f"a GPU is here, but the {what} backend is not: {info['detail']}"


class _CudaError(Exception):
    def __init__(self, status):
        super().__init__(f"CUDA runtime error {status}")
        self.status = status


def _fake_cupy(count):
    """A stand-in ``cupy`` whose getDeviceCount returns ``count`` or raises it."""
    import types

    def device_count():
        if isinstance(count, BaseException):
            raise count
        return count
    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(
        CUDARuntimeError=_CudaError, getDeviceCount=device_count))
    return cupy


@pytest.mark.parametrize("required", [False, True], ids=["plain", "MLCOMM_TEST_GPU=1"])
def test_gpu_tests_skip_only_without_a_gpu_or_cupy(monkeypatch, required):
    """No CuPy, no driver or no device: a skip, or a failure under MLCOMM_TEST_GPU=1. Any
    other error is raised either way, never turned into a skip."""
    monkeypatch.setitem(globals(), "GPU_REQUIRED", required)
    missing = pytest.fail.Exception if required else pytest.skip.Exception
    for cupy, why in ((None, "CuPy is not installed"), (_fake_cupy(0), "no CUDA device"),
                      (_fake_cupy(_CudaError(100)), "no CUDA driver or device"),
                      (_fake_cupy(_CudaError(35)), "no CUDA driver or device")):
        monkeypatch.setitem(sys.modules, "cupy", cupy)
        with pytest.raises(missing, match=("MLCOMM_TEST_GPU=1 but " if required else "") + why):
            cupy_or_skip()
    for error in (_CudaError(2), RuntimeError("a broken CuPy")):
        monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(error))
        with pytest.raises(type(error), match=str(error)):
            cupy_or_skip()
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(1))
    assert cupy_or_skip() is sys.modules["cupy"]


def test_cupy_kernels_on_gpu():
    _gpu_or_skip("cupy")
    import cupy
    failures = run_checks(cupy.asarray, cupy.asnumpy, "cupy", exact_nans=False)
    failures += run_pick_checks(cupy.asarray, cupy.asnumpy, "cupy")
    assert failures == []
    x = cupy.arange(10, dtype=cupy.float32)
    stream = cupy.cuda.Stream(non_blocking=True)
    import mlcomm.kernels as K
    assert K.select_backend(x) == "cupy"
    K.reduce_into(x, x, "sum", stream=stream)
    stream.synchronize()
    assert cupy.asnumpy(x).tolist() == [2.0 * i for i in range(10)]


def test_numba_cuda_kernels_on_gpu():
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        pytest.skip("this process runs the simulator; the subprocess test covers it")
    _gpu_or_skip("cuda")
    from numba import cuda
    failures = run_checks(cuda.to_device, lambda d: d.copy_to_host(), "cuda", exact_nans=False)
    failures += run_pick_checks(cuda.to_device, lambda d: d.copy_to_host(), "cuda")
    assert failures == []


def test_numba_cuda_that_cannot_compile_says_what_to_do(monkeypatch):
    """A numba-cuda that fails inside its compiler (0.30.4 with numpy 2.5) is named before a
    kernel launches, with the way out, instead of a deep AttributeError."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        pytest.skip("this process runs the simulator")
    from mlcomm.kernels import cuda_backend
    monkeypatch.setattr(cuda_backend, "SIMULATOR", False)
    monkeypatch.setattr(cuda_backend, "_compile_failure",
                        "AttributeError: module 'numpy' has no attribute 'row_stack'")
    with pytest.raises(RuntimeError, match=r"cannot compile CUDA kernels.*row_stack.*CuPy"):
        cuda_backend._launch(None, 1, None)


def _nvvm_available():
    try:
        from numba.cuda.cudadrv.nvvm import NVVM
        NVVM()
        return True
    except Exception:
        return False


def test_numba_cuda_kernels_compile_to_ptx():
    """Every kernel signature compiles for a real GPU (sm_80) when NVVM is installed."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" or not _nvvm_available():
        pytest.skip("NVVM not found (set CUDA_HOME to a CUDA toolkit, e.g. pip's "
                    "nvidia-cuda-nvcc-cu12 at site-packages/nvidia/cuda_nvcc)")
    proc = subprocess.run([sys.executable, __file__, "--ptx"], capture_output=True,
                          text=True, timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("PTX-REPORT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = json.loads(lines[-1].split(" ", 1)[1])
    assert report["failures"] == [] and report["compiled"] >= 60, report


# --- CuPy's kernel bodies, compiled for the host ----------------------------------------------

_C_TYPES = {"int8": "signed char", "int16": "short", "int32": "int", "int64": "long long",
            "uint8": "unsigned char", "uint16": "unsigned short", "uint32": "unsigned int",
            "uint64": "unsigned long long", "float32": "float", "float64": "double",
            "float16": "_Float16"}


def _host_cupy_library(tmp_path):
    """Compile every CuPy kernel body for real dtypes as host C++ functions; return
    {(dtype name, op): (ctypes function, view dtype)}."""
    import ctypes
    import shutil
    from mlcomm.kernels import cupy_backend as cb
    compiler = shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        pytest.skip("no C++ compiler to build CuPy's kernel bodies for the host")
    lines = ["#include <cstring>",
             "static inline float __uint_as_float(unsigned int u) "
             "{ float f; std::memcpy(&f, &u, 4); return f; }",
             "static inline unsigned int __float_as_uint(float f) "
             "{ unsigned int u; std::memcpy(&u, &f, 4); return u; }",
             cb._BF16_PREAMBLE.replace("__device__ __forceinline__", "static inline")]
    funcs = {}
    for dt, op in _pairs():
        if dt.kind == "c":  # CuPy's complex type is not host C++
            continue
        variant = cb._variant(dt)
        view = cb._view_dtype(dt, op)
        ctype = _C_TYPES[str(dt) if variant == 1 else str(view)]
        name = f"k{len(funcs)}"
        lines.append(f"extern \"C\" void {name}({ctype} *pa, const {ctype} *pb, long n) "
                     f"{{ typedef {ctype} T; for (long i = 0; i < n; i++) {{ T a = pa[i]; "
                     f"T b = pb[i]; {cb._body(op, variant)}; pa[i] = a; }} }}")
        funcs[(str(dt), op)] = (name, view)
    source = tmp_path / "bodies.cpp"
    source.write_text("\n".join(lines) + "\n")
    lib = tmp_path / "bodies.so"
    proc = subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", str(lib), str(source)],
                          capture_output=True, text=True)
    if proc.returncode and "_Float16" in proc.stderr:
        pytest.skip(f"{compiler} has no _Float16: {proc.stderr[-300:]}")
    assert proc.returncode == 0, proc.stderr[-4000:]
    dll = ctypes.CDLL(str(lib))
    return {key: (getattr(dll, name), view) for key, (name, view) in funcs.items()}


def _host_run(fn, x, y, view):
    import ctypes
    d, s = x.view(view).copy(), np.ascontiguousarray(y.view(view))
    fn(ctypes.c_void_p(d.ctypes.data), ctypes.c_void_p(s.ctypes.data), ctypes.c_long(d.size))
    return d.view(x.dtype)


def test_cupy_kernel_bodies_on_host(tmp_path):
    """CuPy's C bodies, built from OP_TABLE's c_expr, give the NumPy backend's bits.

    Compiled for the host CPU, so they are checked without a GPU: every real dtype and op
    (NaN payloads of sum/prod may differ, as on a GPU), and min/max with NaN bits exact.
    """
    import mlcomm.kernels as K
    funcs = _host_cupy_library(tmp_path)
    failures = []
    for i, (dt, op) in enumerate(_pairs()):
        if (str(dt), op) not in funcs:
            continue
        fn, view = funcs[(str(dt), op)]
        cases = [_case(dt, 150, seed=i)]
        if op in ("max", "min") and dt in _floats():
            a, b = _pick_case(dt, seed=i)
            cases += [(a, b), (b, a)]
        for a, b in cases:
            want = a.copy()
            K.reduce_into(want, b, op, backend="numpy")
            got = _host_run(fn, a, b, view)
            msg = _compare(got, want, exact_nans=op in ("max", "min"))
            if msg:
                failures.append(f"{dt} {op}: {msg}")
    assert len(funcs) == sum(1 for dt, _ in _pairs() if dt.kind != "c") == 97
    assert failures == []


if __name__ == "__main__" and "--simulator" in sys.argv:
    _simulator_main()
elif __name__ == "__main__" and "--ptx" in sys.argv:
    _ptx_main()
