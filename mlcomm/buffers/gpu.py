"""Which GPU path device arrays take: detection, CUDA-awareness, rank->GPU.

A CuPy array, a Numba device array (including the CUDA simulator's ``FakeCUDAArray``) or
anything exposing ``__cuda_array_interface__`` or a CUDA ``__dlpack_device__`` is a device
array. :func:`cuda_aware` decides how it travels (``MLCOMM_CUDA_AWARE=1|0``, or a probe of the
MPI library when unset):

- CUDA-aware: device pointers go straight to MPI (:func:`mlcomm.buffers.device.direct`) after the
  producing stream is synchronised; the device loop reduces with the GPU kernels on the device.
- otherwise: staged through pinned host buffers (:mod:`mlcomm.buffers.staging`), the copy of chunk
  k+1 overlapping the collective on chunk k for allreduce, reduce and bcast. When the probe
  cannot tell, device arrays are staged and a warning is issued once.

:func:`select_device` makes GPU (local rank mod visible GPUs) current.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
import warnings

import numpy as np

from .. import config
from ..transport import libmpi

__all__ = ["is_device_array", "is_cupy", "is_numba", "simulator", "cuda_aware",
           "cuda_aware_decision", "probe_cuda_support", "warn_once_if_unknown", "select_device",
           "node_local_rank"]

#: DLPack device types that live in CUDA memory (kDLCUDA, kDLCUDAManaged).
_DLPACK_CUDA = (2, 13)
_NUMBA_DEVICE_TYPES = ("FakeCUDAArray", "DeviceNDArray", "MappedNDArray", "DeviceRecord")

_lock = threading.Lock()
_probe_result = None  # (state, detail) once probed; state in {"yes", "no", "unknown"}
_warned = False


# --- what is a device array ---------------------------------------------------------------

def _top_module(obj) -> str:
    return type(obj).__module__.split(".", 1)[0]


def is_cupy(obj) -> bool:
    """True for CuPy arrays."""
    return _top_module(obj) == "cupy"


def is_numba(obj) -> bool:
    """True for Numba device arrays, the simulator's included."""
    mod = type(obj).__module__
    return (mod.startswith("numba") and type(obj).__name__ in _NUMBA_DEVICE_TYPES)


def simulator() -> bool:
    """True under Numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``)."""
    try:
        from numba import config
        return bool(config.ENABLE_CUDASIM)
    except Exception:  # pragma: no cover - no numba
        return False


def is_device_array(buf) -> bool:
    """True for CuPy arrays, Numba device arrays (simulator ones too) and anything exposing
    ``__cuda_array_interface__`` or a ``__dlpack_device__`` on a CUDA device."""
    if buf is None or isinstance(buf, (np.ndarray, bytes, bytearray, memoryview)):
        return False
    if is_cupy(buf) and hasattr(buf, "__cuda_array_interface__"):
        return True
    if is_numba(buf):
        return True
    try:
        if hasattr(buf, "__cuda_array_interface__"):
            return True
    except Exception:  # a property that raises (e.g. a CPU tensor) is not a device array
        pass
    dev = getattr(buf, "__dlpack_device__", None)
    if dev is not None:
        try:
            return int(dev()[0]) in _DLPACK_CUDA
        except Exception:
            return False
    return False


# --- CUDA-awareness --------------------------------------------------------------------------

def probe_cuda_support():
    """Ask the MPI library whether it moves CUDA device memory.

    Returns ``(state, detail)`` with state "yes", "no" or "unknown". MPICH (>= 4.1) and its
    derivatives answer through ``MPIX_GPU_query_support``/``MPIX_Query_cuda_support`` (which
    honour ``MPIR_CVAR_ENABLE_GPU``); Open MPI through ``MPIX_Query_cuda_support`` from its
    CUDA extension (absent when built without it). Other libraries cannot tell.
    """
    global _probe_result
    with _lock:
        if _probe_result is None:
            _probe_result = _probe()
        return _probe_result


def _probe():
    try:
        from mpi4py import MPI
        version = MPI.Get_library_version().strip()
    except Exception as exc:  # pragma: no cover - broken MPI
        return "unknown", f"cannot load MPI ({type(exc).__name__}: {exc})"
    first = version.splitlines()[0].strip() if version else "unknown MPI"
    vendor = " ".join(first.split(",")[0].replace("Version:", "").split())
    if "Open MPI" in first:
        family = "Open MPI"
    elif "MPICH" in first or "Intel(R) MPI" in first or "MVAPICH" in first:
        family = "MPICH"
    else:
        family = None
    env_gpu = os.environ.get("MPIR_CVAR_ENABLE_GPU")
    if family == "MPICH" and env_gpu is not None and env_gpu.strip() in ("0", "false", "no"):
        return "no", f"{vendor}: MPIR_CVAR_ENABLE_GPU={env_gpu} disables GPU support"
    lib = libmpi.library()
    if lib is None:
        return "unknown", f"{vendor}: the MPI library is unreachable to query"
    query = getattr(lib, "MPIX_GPU_query_support", None) if family == "MPICH" else None
    if query is not None:
        flag = ctypes.c_int(0)
        query.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
        query.restype = ctypes.c_int
        if query(0, ctypes.byref(flag)) == 0:  # MPIX_GPU_SUPPORT_CUDA == 0
            return (("yes", f"{vendor}: MPIX_GPU_query_support(CUDA) reports CUDA support")
                    if flag.value else
                    ("no", f"{vendor}: MPIX_GPU_query_support(CUDA) reports no CUDA support"))
    query = getattr(lib, "MPIX_Query_cuda_support", None)
    if query is not None:
        query.argtypes = []
        query.restype = ctypes.c_int
        if query():
            return "yes", f"{vendor}: MPIX_Query_cuda_support() = 1"
        return "no", f"{vendor}: MPIX_Query_cuda_support() reports no CUDA support"
    if family == "Open MPI":
        return "unknown", f"{vendor}: built without the CUDA extension (no MPIX_Query_cuda_support)"
    return "unknown", f"{vendor}: no CUDA-support query in this MPI library"


def _decision():
    """Return (aware: bool, state, text)."""
    aware, raw = config.cuda_aware()
    if aware is True:
        return True, "env", f"yes (MLCOMM_CUDA_AWARE={raw})"
    if aware is False:
        return False, "env", f"no (MLCOMM_CUDA_AWARE={raw}; staging through host)"
    state, detail = probe_cuda_support()
    if state == "yes":
        return True, state, f"yes (probe: {detail})"
    if state == "no":
        return False, state, f"no (probe: {detail}; staging through host)"
    return False, state, (f"unknown (probe: {detail}; staging through host, set "
                          f"MLCOMM_CUDA_AWARE=1 if your MPI is CUDA-aware)")


def cuda_aware_decision() -> str:
    """One line for ``mlcomm info``: the decision and why."""
    return _decision()[2]


def cuda_aware() -> bool:
    """True when device buffers go straight to MPI (``MLCOMM_CUDA_AWARE=1`` or a probe that
    says yes); false when they are staged through host memory."""
    return _decision()[0]


def warn_once_if_unknown():
    """Warn once per process when staging only because the probe could not tell."""
    global _warned
    if _warned:
        return
    aware, state, text = _decision()
    if state == "unknown":
        _warned = True
        warnings.warn(f"mlcomm: cannot tell whether this MPI is CUDA-aware ({text}); device "
                      f"arrays are staged through host memory", RuntimeWarning, stacklevel=3)


def _reset():
    """Forget the probe and the warning (tests)."""
    global _probe_result, _warned
    with _lock:
        _probe_result = None
        _warned = False


# --- ranks and GPUs --------------------------------------------------------------------------

_LOCAL_RANK_VARS = ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID",
                    "PMI_LOCAL_RANK", "PMIX_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_RANK")


def node_local_rank():
    """This process's rank on its node, from the launcher's environment.

    Reads MPI_LOCALRANKID (MPICH Hydra), OMPI_COMM_WORLD_LOCAL_RANK (Open MPI), SLURM_LOCALID
    (srun) and friends; falls back to the world rank (right on a single node), else 0.
    """
    for var in _LOCAL_RANK_VARS:
        value = os.environ.get(var, "").strip()
        if value.isdigit():
            return int(value)
    try:
        from mpi4py import MPI
        if MPI.Is_initialized() and not MPI.Is_finalized():
            return MPI.COMM_WORLD.Get_rank()
    except Exception:  # pragma: no cover
        pass
    return 0


def _gpu_count():
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount(), "cupy"
    except Exception:
        pass
    try:
        from numba import cuda
        if cuda.is_available():
            return len(cuda.gpus), "numba"
    except Exception:
        pass
    return 0, None


def select_device(local_rank=None):
    """Make GPU ``local rank mod visible GPUs`` current for CuPy and Numba; return its index.

    The index is within ``CUDA_VISIBLE_DEVICES``. Returns None (and does nothing) under the
    CUDA simulator or when no GPU is visible.
    """
    if simulator():
        return None
    count, _ = _gpu_count()
    if count <= 0:
        return None
    lr = node_local_rank() if local_rank is None else int(local_rank)
    index = lr % count
    try:
        import cupy
        cupy.cuda.Device(index).use()
    except ImportError:
        pass
    try:
        from numba import cuda
        if cuda.is_available():
            cuda.select_device(index)
    except Exception:  # pragma: no cover - numba without a driver
        pass
    return index
