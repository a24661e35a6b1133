"""Device arrays through the collectives (mlcomm.gpu): staging, CUDA-awareness, rank->GPU.

The end-to-end test runs tests/gpu_job.py in a real ``mpiexec -n 3`` job under Numba's CUDA
simulator. The simulator must be on before Numba is imported, so simulator-only unit checks
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

GPU_REQUIRED = os.environ.get("MLCOMM_TEST_GPU") == "1"
SIM = {"NUMBA_ENABLE_CUDASIM": "1"}


@pytest.fixture
def gpu(monkeypatch):
    from mlcomm import gpu as module
    monkeypatch.delenv("MLCOMM_CUDA_AWARE", raising=False)
    module._reset()
    yield module
    module._reset()


# --- end to end ------------------------------------------------------------------------------

def test_device_arrays_every_algorithm_mpiexec_3_simulator():
    proc = mpirun(3, ["tests/gpu_job.py"], env=SIM, timeout=240)
    summary = [line for line in proc.stdout.splitlines() if line.startswith("gpu_job:")]
    assert summary, proc.stdout + proc.stderr
    assert " 0 mismatches" in summary[0], proc.stdout
    assert "numba-cudasim" in summary[0]


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
        gpu._warn_once_if_unknown()
        gpu._warn_once_if_unknown()
    assert [w.category for w in caught] == [RuntimeWarning]
    assert "cannot tell" in str(caught[0].message)
    gpu._reset()
    monkeypatch.setattr(gpu, "_probe", lambda: ("no", "a test library"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gpu._warn_once_if_unknown()
    assert caught == []


# --- detection and rank -> GPU -----------------------------------------------------------------

class _CAI:
    __cuda_array_interface__ = {"shape": (1,), "typestr": "<f4", "data": (0, False),
                                "version": 3}


class _DLPack:
    def __init__(self, device_type):
        self.device_type = device_type

    def __dlpack_device__(self):
        return (self.device_type, 0)


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
    monkeypatch.setattr(gpu, "_simulator", lambda: False)
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
from mlcomm import gpu

assert gpu._simulator()
a = cuda.to_device(np.arange(6, dtype=np.float32))
assert gpu.is_device_array(a) and not gpu.is_device_array(a.copy_to_host())
assert gpu.select_device() is None  # a no-op under the simulator

gpu._probe = lambda: ("unknown", "simulated")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(3):
        hs, hr, finish = gpu.stage(a, None)
n = sum(issubclass(w.category, RuntimeWarning) for w in caught)
assert n == 1, [str(w.message) for w in caught]

# single-rank round trip: out of place, in place, new array, bfloat16 reinterpretation
res = finish(mlcomm.allreduce(hs, hr, "sum"))
assert type(res).__name__ == "FakeCUDAArray" and res.copy_to_host().tolist() == list(range(6))
hs, hr, finish = gpu.stage(MPI.IN_PLACE, a)
assert hs is MPI.IN_PLACE and hr.tolist() == list(range(6))
hr *= 2
assert finish(hr) is a and a.copy_to_host().tolist() == [0, 2, 4, 6, 8, 10]
bits = np.array([1.5, -2.0, 3.25], ml_dtypes.bfloat16).view(np.uint16)
d = cuda.to_device(bits)
hs, hr, finish = gpu.stage(d, None, dtype=ml_dtypes.bfloat16)
assert hs.dtype == ml_dtypes.bfloat16 and hs.astype(float).tolist() == [1.5, -2.0, 3.25]
out = finish(mlcomm.allreduce(hs, None, "sum", algorithm="ring"))
assert out.copy_to_host().view(ml_dtypes.bfloat16).astype(float).tolist() == [1.5, -2.0, 3.25]

# errors: mixing host and device, IN_PLACE without recvbuf, size mismatch in dtype=
for args, kw, exc in [((np.zeros(6, np.float32), a), {}, TypeError),
                      ((a, np.zeros(6, np.float32)), {}, TypeError),
                      ((MPI.IN_PLACE, None), {}, ValueError),
                      ((a, None), {"dtype": np.float64}, TypeError)]:
    try:
        gpu.stage(*args, **kw)
    except exc:
        pass
    else:
        raise AssertionError(f"stage{args} {kw} did not raise {exc.__name__}")
print("SIM-CHECKS-OK")
"""


def test_stage_under_simulator_subprocess():
    env = dict(os.environ, **SIM)
    env.pop("MLCOMM_CUDA_AWARE", None)
    proc = subprocess.run([sys.executable, "-c", _SIM_CHECKS], capture_output=True, text=True,
                          timeout=120, env=env, cwd=ROOT)
    assert proc.returncode == 0 and "SIM-CHECKS-OK" in proc.stdout, proc.stdout + proc.stderr


# --- CuPy on a real GPU ------------------------------------------------------------------------

def _cupy_gpu_or_skip():
    try:
        import cupy
        count = cupy.cuda.runtime.getDeviceCount()
        if count < 1:
            raise RuntimeError("no CUDA device")
    except Exception as exc:  # ImportError, CUDARuntimeError, ...
        msg = f"CuPy with a GPU unavailable ({type(exc).__name__}: {exc})"
        if GPU_REQUIRED:
            pytest.fail(f"MLCOMM_TEST_GPU=1 but {msg}")
        pytest.skip(msg)


def test_cupy_arrays_every_algorithm_mpiexec_2():
    _cupy_gpu_or_skip()
    env = {"NUMBA_ENABLE_CUDASIM": "0"}
    proc = mpirun(2, ["tests/gpu_job.py", "--cupy"], env=env, timeout=300)
    summary = [line for line in proc.stdout.splitlines() if line.startswith("gpu_job:")]
    assert summary and " 0 mismatches" in summary[0], proc.stdout + proc.stderr
