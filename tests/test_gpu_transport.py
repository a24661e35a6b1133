"""Device arrays through the collectives: staging, the direct path, CUDA-awareness, rank->GPU.

The end-to-end tests run tests/gpu_job.py in real ``mpiexec -n 3`` jobs under Numba's CUDA
simulator, once per path: staged whole, staged in chunks, and direct (``MLCOMM_CUDA_AWARE=1``:
the simulator's device arrays are host memory, so MPI really moves them, and the device loop's
device binding reduces them with the CUDA kernels). The simulator must be on before Numba is imported, so simulator-only unit checks
run in a subprocess (``_SIM_CHECKS``); this pytest process never turns it on. The CuPy test
skips without a GPU and fails instead when ``MLCOMM_TEST_GPU=1``.
"""

import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

from conftest import ROOT, mpirun
from test_kernels_cudasim import cupy_or_skip

SIM = {"NUMBA_ENABLE_CUDASIM": "1"}


@pytest.fixture
def gpu(monkeypatch):
    from mlcomm.buffers import gpu as module
    monkeypatch.delenv("MLCOMM_CUDA_AWARE", raising=False)
    module._reset()
    yield module
    module._reset()


# --- end to end ------------------------------------------------------------------------------

def _gpu_job(env, *args, timeout=240):
    """Run tests/gpu_job.py on 3 ranks under the simulator; return its summary line."""
    proc = mpirun(3, ["tests/gpu_job.py", *args], env=dict(SIM, **env), timeout=timeout)
    summary = [line for line in proc.stdout.splitlines() if line.startswith("gpu_job:")]
    assert summary, proc.stdout + proc.stderr
    assert " 0 mismatches" in summary[0], proc.stdout
    assert "numba-cudasim" in summary[0]
    return summary[0]


def test_device_arrays_every_algorithm_mpiexec_3_simulator():
    summary = _gpu_job({"MLCOMM_CUDA_AWARE": "0"})
    assert "path: staged, 4194304-byte chunks, up to 1 per call" in summary


def test_device_arrays_staged_in_chunks_mpiexec_3_simulator():
    # 256-byte chunks: 150 float32 go in 3 chunks (the last of 22 elements), 150 float64 in
    # 5 (the last of 22), 37 float64 in 2
    summary = _gpu_job({"MLCOMM_CUDA_AWARE": "0", "MLCOMM_STAGING_CHUNK_BYTES": "256"},
                       "--counts", "1,37,150")
    assert "path: staged, 256-byte chunks, up to 5 per call" in summary


def test_device_arrays_direct_cuda_aware_mpiexec_3_simulator():
    # simulated kernels are slow: smaller buffers (150 elements still stride the grid)
    summary = _gpu_job({"MLCOMM_CUDA_AWARE": "1"}, "--counts", "1,37,150", timeout=400)
    assert "path: direct" in summary


# --- the staging pipeline --------------------------------------------------------------------

def test_pipeline_starts_next_copy_in_before_running_a_chunk():
    from mlcomm.buffers import staging
    log = []

    class Event:
        def __init__(self, name):
            self.name = name
            log.append(name)

        def synchronize(self):
            log.append("wait " + self.name)

    last = staging.pipeline([(0, 4), (4, 8), (8, 10)], lambda a, b: Event(f"in {a}"),
                            lambda a, b: log.append(f"run {a}:{b}"),
                            lambda a, b: Event(f"out {a}"))
    assert log == ["in 0", "in 4", "wait in 0", "run 0:4", "out 0",
                   "in 8", "wait in 4", "run 4:8", "out 4",
                   "wait in 8", "run 8:10", "out 8"]
    assert last.name == "out 8"
    log.clear()
    assert staging.pipeline([(0, 0)], lambda a, b: Event("in"), lambda a, b: log.append("run"),
                            lambda a, b: None) is None
    assert log == ["in", "wait in", "run"]


def test_chunks_follow_the_environment(monkeypatch):
    from mlcomm.buffers import staging
    monkeypatch.delenv("MLCOMM_STAGING_CHUNK_BYTES", raising=False)
    assert staging.chunk_bytes() == staging.CHUNK_BYTES == 4 << 20
    assert staging._chunks(3 << 20, 4, whole=False) == [(0, 1 << 20), (1 << 20, 2 << 20),
                                                      (2 << 20, 3 << 20)]
    monkeypatch.setenv("MLCOMM_STAGING_CHUNK_BYTES", "256")
    assert staging._chunks(100, 4, whole=False) == [(0, 64), (64, 100)]
    assert staging._chunks(100, 4, whole=True) == [(0, 100)]
    assert staging._chunks(0, 4, whole=False) == [(0, 0)]
    assert staging._chunks(3, 512, whole=False) == [(0, 1), (1, 2), (2, 3)]
    for bad in ("0", "-5", "4M", "x"):
        monkeypatch.setenv("MLCOMM_STAGING_CHUNK_BYTES", bad)
        with pytest.raises(ValueError, match="MLCOMM_STAGING_CHUNK_BYTES"):
            staging.chunk_bytes()


# --- CUDA-awareness decision -----------------------------------------------------------------

def test_env_forces_yes(gpu, monkeypatch):
    monkeypatch.setenv("MLCOMM_CUDA_AWARE", "1")
    assert gpu.cuda_aware() is True
    assert gpu.cuda_aware_decision() == "yes (MLCOMM_CUDA_AWARE=1)"


def test_env_forces_no(gpu, monkeypatch):
    monkeypatch.setenv("MLCOMM_CUDA_AWARE", "0")
    assert gpu.cuda_aware() is False
    assert gpu.cuda_aware_decision().startswith("no (MLCOMM_CUDA_AWARE=0")


def test_env_bad_value(gpu, monkeypatch):
    monkeypatch.setenv("MLCOMM_CUDA_AWARE", "maybe")
    with pytest.raises(ValueError, match="MLCOMM_CUDA_AWARE"):
        gpu.cuda_aware()


@pytest.mark.parametrize("state,aware,prefix", [("yes", True, "yes (probe: "),
                                                ("no", False, "no (probe: "),
                                                ("unknown", False, "unknown (probe: ")])
def test_unset_uses_probe(gpu, monkeypatch, state, aware, prefix):
    monkeypatch.setattr(gpu, "_probe", lambda: (state, "a test library"))
    assert gpu.cuda_aware() is aware
    text = gpu.cuda_aware_decision()
    assert text.startswith(prefix) and "a test library" in text
    assert ("staging through host" in text) is (not aware)


def test_real_probe_answers(gpu):
    from mpi4py import MPI
    state, detail = gpu.probe_cuda_support()
    assert state in ("yes", "no", "unknown")
    first = MPI.Get_library_version().splitlines()[0]
    if first.startswith("MPICH Version"):
        # MPICH >= 4.1 always has MPIX_GPU_query_support; the pip wheel is built without CUDA
        assert state in ("yes", "no") and "MPIX_" in detail, detail


def test_mpich_enable_gpu_0_means_no(gpu, monkeypatch):
    from mpi4py import MPI
    if not MPI.Get_library_version().startswith("MPICH"):
        pytest.skip("not MPICH")
    monkeypatch.setenv("MPIR_CVAR_ENABLE_GPU", "0")
    assert gpu.probe_cuda_support()[0] == "no"
    assert "MPIR_CVAR_ENABLE_GPU=0" in gpu.cuda_aware_decision()


def test_warn_once_only_when_unknown(gpu, monkeypatch):
    monkeypatch.setattr(gpu, "_probe", lambda: ("unknown", "a test library"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gpu.warn_once_if_unknown()
        gpu.warn_once_if_unknown()
    assert [w.category for w in caught] == [RuntimeWarning]
    assert "cannot tell" in str(caught[0].message)
    gpu._reset()
    monkeypatch.setattr(gpu, "_probe", lambda: ("no", "a test library"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gpu.warn_once_if_unknown()
    assert caught == []


@pytest.mark.parametrize("aware,line", [("1", "CUDA-aware  yes (MLCOMM_CUDA_AWARE=1)"),
                                        ("0", "CUDA-aware  no (MLCOMM_CUDA_AWARE=0; staging")])
def test_info_reports_the_decision_and_chunk_size(aware, line):
    env = dict(os.environ, MLCOMM_CUDA_AWARE=aware, MLCOMM_STAGING_CHUNK_BYTES="1024")
    proc = subprocess.run([sys.executable, "-m", "mlcomm", "info"], capture_output=True,
                          text=True, timeout=120, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert line in proc.stdout
    assert "staging     1024-byte chunks when not CUDA-aware" in proc.stdout


# --- detection and rank -> GPU -----------------------------------------------------------------

class _CAI:
    __cuda_array_interface__ = {"shape": (1,), "typestr": "<f4", "data": (0, False),
                                "version": 3}


class _DLPack:
    def __init__(self, device_type):
        self.device_type = device_type

    def __dlpack_device__(self):
        return (self.device_type, 0)


def test_an_in_place_reduce_scatter_reaches_the_library_from_a_copy():
    # Intel MPI 2021.18 with I_MPI_OFFLOAD=1 leaves wrong blocks on ranks >= 1 when an
    # in-place reduce-scatter of device buffers reaches it as MPI_IN_PLACE (H200, 2026-11-27)
    from mpi4py import MPI
    from mlcomm.transport.native import native_call
    calls = []

    class Comm:
        Get_size, Get_rank = (lambda self: 2), (lambda self: 1)

        def Reduce_scatter_block(self, send, recv, op):
            calls.append((send, recv))
            recv[...] = send[:3] + send[3:]  # what the sum over one rank's two blocks gives

    def copy(dst, src):
        dst[...] = src

    buf = np.arange(6.0)
    native_call("reduce_scatter", Comm(), buf, buf, "sum", overlap=np.may_share_memory,
                copy=copy, buffer=lambda x: x, empty=np.empty_like)
    (send, recv), = calls
    assert send is not MPI.IN_PLACE and not np.may_share_memory(send, buf)
    assert recv.base is buf and recv.size == 3 and buf.tolist() == [3.0, 5.0, 7.0, 3.0, 4.0, 5.0]


def test_is_device_array_host_objects(gpu):
    from mpi4py import MPI
    for obj in (np.zeros(3), b"abc", bytearray(3), None, MPI.IN_PLACE, [1, 2], _DLPack(1)):
        assert not gpu.is_device_array(obj), obj
    assert gpu.is_device_array(_CAI())
    assert gpu.is_device_array(_DLPack(2))      # kDLCUDA
    assert gpu.is_device_array(_DLPack(13))     # kDLCUDAManaged


@pytest.mark.parametrize("var", ["MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"])
def test_node_local_rank_from_launcher(gpu, monkeypatch, var):
    for other in gpu._LOCAL_RANK_VARS:
        monkeypatch.delenv(other, raising=False)
    monkeypatch.setenv(var, "5")
    assert gpu.node_local_rank() == 5


def test_select_device_mod_visible(gpu, monkeypatch):
    monkeypatch.setattr(gpu, "simulator", lambda: False)
    monkeypatch.setattr(gpu, "_gpu_count", lambda: (0, None))
    assert gpu.select_device(3) is None  # no GPU: nothing to do
    chosen = []
    monkeypatch.setattr(gpu, "_gpu_count", lambda: (4, "numba"))
    import numba.cuda
    monkeypatch.setattr(numba.cuda, "is_available", lambda: True)
    monkeypatch.setattr(numba.cuda, "select_device", chosen.append)
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError
    assert gpu.select_device(6) == 2
    assert chosen == [2]


# --- under the simulator, in one subprocess --------------------------------------------------

_SIM_CHECKS = r"""
import warnings
import ml_dtypes
import numpy as np
from numba import cuda
from mpi4py import MPI
import mlcomm
from mlcomm.buffers import device, gpu, staging

assert gpu.simulator()
a = cuda.to_device(np.arange(6, dtype=np.float32))
assert gpu.is_device_array(a) and not gpu.is_device_array(a.copy_to_host())
assert gpu.select_device() is None  # a no-op under the simulator

gpu._probe = lambda: ("unknown", "simulated")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(3):
        hs, hr, finish = staging.stage(a, None)
n = sum(issubclass(w.category, RuntimeWarning) for w in caught)
assert n == 1, [str(w.message) for w in caught]

# single-rank round trip: out of place, in place, new array, bfloat16 reinterpretation
res = finish(mlcomm.allreduce(hs, hr, "sum"))
assert type(res).__name__ == "FakeCUDAArray" and res.copy_to_host().tolist() == list(range(6))
hs, hr, finish = staging.stage(MPI.IN_PLACE, a)
assert hs is MPI.IN_PLACE and hr.tolist() == list(range(6))
hr *= 2
assert finish(hr) is a and a.copy_to_host().tolist() == [0, 2, 4, 6, 8, 10]
bits = np.array([1.5, -2.0, 3.25], ml_dtypes.bfloat16).view(np.uint16)
d = cuda.to_device(bits)
hs, hr, finish = staging.stage(d, None, dtype=ml_dtypes.bfloat16)
assert hs.dtype == ml_dtypes.bfloat16 and hs.astype(float).tolist() == [1.5, -2.0, 3.25]
out = finish(mlcomm.allreduce(hs, None, "sum", algorithm="ring"))
assert out.copy_to_host().view(ml_dtypes.bfloat16).astype(float).tolist() == [1.5, -2.0, 3.25]

# staging reuses its host buffers, so a repeated call plans and binds only the first time
from mlcomm.session import binder
binds, bind = [], binder._host
binder._host = lambda *args, **kw: binds.append(args[1].collective) or bind(*args, **kw)
x = cuda.to_device(np.arange(5, dtype=np.float32))
for _ in range(3):
    assert mlcomm.allreduce(x, algorithm="ring").copy_to_host().tolist() == list(range(5))
for _ in range(3):
    assert mlcomm.allreduce(mlcomm.IN_PLACE, x, algorithm="ring") is x
assert binds == ["allreduce", "allreduce"], binds
binder._host = bind

# errors (UserBuffers checks for both paths): mixing host and device, IN_PLACE without recvbuf, an item size
# that dtype= cannot reinterpret, different dtypes, a non-contiguous buffer
strided = cuda.to_device(np.zeros(12, np.float32))[::2]
for args, kw, exc, words in [
        ((np.zeros(6, np.float32), a), {}, TypeError, "sendbuf is a ndarray"),
        ((a, np.zeros(6, np.float32)), {}, TypeError, "recvbuf is a ndarray"),
        ((MPI.IN_PLACE, None), {}, ValueError, "needs recvbuf"),
        ((a, None), {"dtype": np.float64}, TypeError, "item sizes differ"),
        ((a, cuda.device_array(6, np.int32)), {}, TypeError, "differs from sendbuf dtype"),
        ((strided, None), {}, ValueError, "non-contiguous")]:
    for path in (staging.stage, device.UserBuffers):
        try:
            path(*args, **kw)
        except exc as e:
            assert words in str(e), (path.__name__, str(e))
        else:
            raise AssertionError(f"{path.__name__}{args} {kw} did not raise {exc.__name__}")

# device vectors (the direct path's buffers): views over the same memory, as bytes for MPI
raw = cuda.to_device(bits)
v = device.direct(device.UserBuffers(raw, None, dtype=ml_dtypes.bfloat16))[0]
assert v.dtype == ml_dtypes.bfloat16 and v.raw.dtype == np.uint16 and v.size == 3
part = v[1:3]
assert part.ptr == v.ptr + 2 and part.nbytes == 4 and part.bytes().size == 4
assert part.overlaps(v) and not v[0:1].overlaps(part) and not v[0:0].overlaps(v)
assert v.empty(0).size == 0 and v.empty(0).ptr == v.ptr  # nothing allocated
w = v.empty(3)
assert w.dtype == v.dtype and not w.overlaps(v)
w.copy_from(v)
w.synchronize()
assert w.raw.copy_to_host().tolist() == bits.tolist()
send, recv, result = device.direct(device.UserBuffers(MPI.IN_PLACE, raw))
assert send is MPI.IN_PLACE and result(recv) is raw and result(recv[0:1]) is not raw
print("SIM-CHECKS-OK")
"""


def test_stage_under_simulator_subprocess():
    env = dict(os.environ, **SIM)
    env.pop("MLCOMM_CUDA_AWARE", None)
    proc = subprocess.run([sys.executable, "-c", _SIM_CHECKS], capture_output=True, text=True,
                          timeout=120, env=env, cwd=ROOT)
    assert proc.returncode == 0 and "SIM-CHECKS-OK" in proc.stdout, proc.stdout + proc.stderr


# --- CuPy on a real GPU ------------------------------------------------------------------------

def test_cupy_arrays_every_algorithm_mpiexec_2():
    cupy_or_skip()
    env = {"NUMBA_ENABLE_CUDASIM": "0"}
    proc = mpirun(2, ["tests/gpu_job.py", "--cupy"], env=env, timeout=300)
    summary = [line for line in proc.stdout.splitlines() if line.startswith("gpu_job:")]
    assert summary and " 0 mismatches" in summary[0], proc.stdout + proc.stderr
