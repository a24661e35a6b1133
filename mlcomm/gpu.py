"""Device arrays through the collectives: detection, CUDA-awareness, host staging, rank->GPU.

mlcomm's executor works on host NumPy arrays. A CuPy array, a Numba device array (including
the CUDA simulator's ``FakeCUDAArray``) or anything exposing ``__cuda_array_interface__`` or a
CUDA ``__dlpack_device__`` is *staged*: :func:`stage` synchronises the stream that produced
it, copies it into a host buffer (pinned when a real GPU is present, cached by shape and
dtype so repeated calls allocate nothing), and returns a ``finish`` callable that copies the
host result back onto the device::

    host_send, host_recv, finish = gpu.stage(sendbuf, recvbuf)
    result = finish(mlcomm.allreduce(host_send, host_recv, op, algorithm=...))

The whole buffer is copied, then sent; overlapping the copy of chunk k+1 with the transfer of
chunk k is not implemented.

Direct transfer of device pointers needs a CUDA-aware MPI. :func:`cuda_aware` says whether
mlcomm believes it has one (``MLCOMM_CUDA_AWARE=1|0``, or a probe of the MPI library when
unset); the executor decides what to do with it. When the probe cannot tell, device arrays
are staged and a warning is issued once, the first time one is.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
import warnings
from collections import OrderedDict

import numpy as np

__all__ = ["is_device_array", "cuda_aware", "cuda_aware_decision", "probe_cuda_support",
           "stage", "Staged", "select_device", "node_local_rank", "clear_cache"]

#: DLPack device types that live in CUDA memory (kDLCUDA, kDLCUDAManaged).
_DLPACK_CUDA = (2, 13)
_NUMBA_DEVICE_TYPES = ("FakeCUDAArray", "DeviceNDArray", "MappedNDArray", "DeviceRecord")

_lock = threading.Lock()
_probe_result = None  # (state, detail) once probed; state in {"yes", "no", "unknown"}
_warned = False


# --- what is a device array ---------------------------------------------------------------

def _top_module(obj) -> str:
    return type(obj).__module__.split(".", 1)[0]


def _is_cupy(obj) -> bool:
    return _top_module(obj) == "cupy"


def _is_numba(obj) -> bool:
    mod = type(obj).__module__
    return (mod.startswith("numba") and type(obj).__name__ in _NUMBA_DEVICE_TYPES)


def is_device_array(buf) -> bool:
    """True for CuPy arrays, Numba device arrays (simulator ones too) and anything exposing
    ``__cuda_array_interface__`` or a ``__dlpack_device__`` on a CUDA device."""
    if buf is None or isinstance(buf, (np.ndarray, bytes, bytearray, memoryview)):
        return False
    if _is_cupy(buf) and hasattr(buf, "__cuda_array_interface__"):
        return True
    if _is_numba(buf):
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

def _libmpi():
    """The MPI library mpi4py loaded, as a ctypes handle (None if it cannot be found)."""
    paths = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1] if len(line.split()) >= 6 else ""
                base = os.path.basename(path)
                if base.startswith(("libmpi.so", "libmpi_")) or base.startswith("libmpich.so"):
                    if path not in paths:
                        paths.append(path)
    except OSError:  # not Linux
        pass
    if not paths:
        for name in ("mpi", "mpich"):
            found = ctypes.util.find_library(name)
            if found:
                paths.append(found)
    for path in sorted(paths, key=lambda p: "libmpi.so" not in p):
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


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
    lib = _libmpi()
    if lib is None:
        return "unknown", f"{vendor}: libmpi not found to query"
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


_TRUE = ("1", "yes", "true", "on")
_FALSE = ("0", "no", "false", "off")


def _decision():
    """Return (aware: bool, state, text)."""
    raw = os.environ.get("MLCOMM_CUDA_AWARE")
    value = "" if raw is None else raw.strip().lower()
    if value in _TRUE:
        return True, "env", f"yes (MLCOMM_CUDA_AWARE={raw})"
    if value in _FALSE:
        return False, "env", f"no (MLCOMM_CUDA_AWARE={raw}; staging through host)"
    if value not in ("", "auto"):
        raise ValueError(f"MLCOMM_CUDA_AWARE={raw!r}: use 1 (CUDA-aware MPI), 0 (stage through "
                         f"host memory) or leave it unset to probe")
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
    """True when device pointers may go straight to MPI (``MLCOMM_CUDA_AWARE=1`` or a probe
    that says yes). The direct path needs a real CUDA-aware MPI build."""
    return _decision()[0]


def _warn_once_if_unknown():
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


# --- host buffers ----------------------------------------------------------------------------

_CACHE_ENTRIES = 16
_cache: "OrderedDict[tuple, np.ndarray]" = OrderedDict()


def clear_cache():
    """Drop the cached host staging buffers."""
    _cache.clear()


def _simulator() -> bool:
    try:
        from numba import config
        return bool(config.ENABLE_CUDASIM)
    except Exception:  # pragma: no cover - no numba
        return False


def _host_buffer(role, shape, dtype, kind):
    """A host array of ``shape``/``dtype`` for ``role`` ("send"/"recv"), reused across calls."""
    dtype = np.dtype(dtype)
    key = (role, tuple(shape), dtype.str, kind)
    buf = _cache.get(key)
    if buf is not None:
        _cache.move_to_end(key)
        return buf
    count = int(np.prod(shape, dtype=np.int64))
    if kind == "cupy":
        import cupy
        mem = cupy.cuda.alloc_pinned_memory(max(1, count * dtype.itemsize))
        buf = np.frombuffer(mem, dtype, count).reshape(shape)
    elif kind == "numba" and not _simulator():
        from numba import cuda
        buf = cuda.pinned_array(shape, dtype)
    else:
        buf = np.empty(shape, dtype)
    _cache[key] = buf
    while len(_cache) > _CACHE_ENTRIES:
        _cache.popitem(last=False)
    return buf


# --- device <-> host -------------------------------------------------------------------------

def _as_device(buf):
    """Return (kind, array) with kind "cupy" or "numba" for a device buffer."""
    if _is_cupy(buf):
        return "cupy", buf
    if _is_numba(buf):
        return "numba", buf
    if hasattr(buf, "__cuda_array_interface__"):
        try:
            import cupy
            return "cupy", cupy.asarray(buf)
        except ImportError:
            from numba import cuda  # synchronises on the interface's stream (CAI v3)
            return "numba", cuda.as_cuda_array(buf)
    if hasattr(buf, "__dlpack_device__"):
        try:
            import cupy
        except ImportError:
            raise TypeError(f"{type(buf).__name__} exposes only DLPack; install CuPy "
                            f"(mlcomm[cupy]) to stage it") from None
        return "cupy", cupy.from_dlpack(buf)
    raise TypeError(f"{type(buf).__name__} is not a CUDA device array")


def _check_contiguous(kind, arr, name):
    ok = arr.flags.c_contiguous if kind == "cupy" else arr.is_c_contiguous()
    if not ok:
        raise ValueError(f"{name} is a non-contiguous device array; pass a contiguous copy")


def _to_host(kind, arr, host, stream):
    """Copy device ``arr`` into ``host`` (same shape, raw dtype), after the producer finished."""
    if kind == "cupy":
        import cupy
        s = stream if stream is not None else cupy.cuda.get_current_stream()
        with cupy.cuda.Device(arr.device.id):
            s.synchronize()  # the producing stream (CuPy's current one unless given)
            arr.get(stream=s, out=host, blocking=True)
    else:
        s = stream if stream is not None else (getattr(arr, "stream", 0) or 0)
        if s:
            s.synchronize()
        arr.copy_to_host(host, stream=s)
        if s:
            s.synchronize()


def _to_device(kind, arr, host, stream):
    """Copy ``host`` into device ``arr`` and wait (the host buffer is reused afterwards)."""
    if kind == "cupy":
        import cupy
        s = stream if stream is not None else cupy.cuda.get_current_stream()
        with cupy.cuda.Device(arr.device.id):
            arr.set(host, stream=s)
            s.synchronize()
    else:
        s = stream if stream is not None else (getattr(arr, "stream", 0) or 0)
        arr.copy_to_device(host, stream=s)
        if s:
            s.synchronize()


def _new_device(kind, like, shape, raw_dtype):
    if kind == "cupy":
        import cupy
        with cupy.cuda.Device(like.device.id):
            return cupy.empty(shape, raw_dtype)
    from numba import cuda
    return cuda.device_array(shape, raw_dtype)


def _flat(kind, arr):
    return arr.reshape(-1) if kind == "cupy" else arr.reshape(arr.size)


def _same_start(a, b) -> bool:
    return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)
            and a.__array_interface__["data"][0] == b.__array_interface__["data"][0])


def _same_memory(a, b) -> bool:
    return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.size == b.size
            and a.__array_interface__["data"][0] == b.__array_interface__["data"][0])


class Staged:
    """Host copies of device ``sendbuf``/``recvbuf`` and the way back (see :func:`stage`)."""

    def __init__(self, sendbuf, recvbuf=None, *, dtype=None, stream=None):
        from mpi4py import MPI
        self.in_place = sendbuf is MPI.IN_PLACE
        # the user's own objects are what finish() returns, not a view made from an interface
        self._send_obj, self._recv_obj = sendbuf, recvbuf
        self.stream = stream
        self.view = None if dtype is None else np.dtype(dtype)
        self.send = self.recv = None  # (kind, device array) pairs
        if self.in_place:
            if recvbuf is None:
                raise ValueError("sendbuf=IN_PLACE needs recvbuf: the data to reduce in place")
        elif sendbuf is not None:
            if not is_device_array(sendbuf):
                raise TypeError(f"sendbuf is a {type(sendbuf).__name__} but recvbuf is on the "
                                f"device; pass device arrays for both (or host arrays for both)")
            self.send = _as_device(sendbuf)
            _check_contiguous(*self.send, "sendbuf")
        if recvbuf is not None:
            if not is_device_array(recvbuf):
                raise TypeError(f"recvbuf is a {type(recvbuf).__name__} but sendbuf is on the "
                                f"device; pass device arrays for both (or host arrays for both)")
            self.recv = _as_device(recvbuf)
            _check_contiguous(*self.recv, "recvbuf")
        if self.send is None and self.recv is None:
            raise TypeError("stage() needs a device sendbuf or recvbuf")
        _warn_once_if_unknown()
        self.host_send = MPI.IN_PLACE if self.in_place else None
        self.host_recv = None
        if self.send is not None:
            self.host_send = self._copy_in("send", *self.send)
        if self.recv is not None:
            if self.in_place:
                self.host_recv = self._copy_in("recv", *self.recv)
            else:  # its old contents never matter: an empty host buffer will do
                self.host_recv = self._typed(self._buffer("recv", *self.recv))

    def _buffer(self, role, kind, arr):
        return _host_buffer(role, arr.shape, np.dtype(arr.dtype), kind)

    def _typed(self, host):
        if self.view is None or host.dtype == self.view:
            return host
        if host.dtype.itemsize != self.view.itemsize:
            raise TypeError(f"dtype={self.view} reinterprets a {host.dtype} device buffer: "
                            f"the item sizes differ ({self.view.itemsize} vs {host.dtype.itemsize})")
        return host.view(self.view)

    def _copy_in(self, role, kind, arr):
        host = self._buffer(role, kind, arr)
        _to_host(kind, arr, host, self.stream)
        return self._typed(host)

    def finish(self, host_result):
        """Copy ``host_result`` onto the device and return the device result.

        It lands in ``recvbuf`` when one was given; in ``sendbuf`` when the result is the
        staged send buffer itself (bcast); otherwise in a new array on ``sendbuf``'s device.
        ``None`` (reduce on a non-root rank) gives ``None``.
        """
        if host_result is None:
            return None
        host = np.ascontiguousarray(host_result)
        if self.recv is not None:
            (kind, dev), result = self.recv, self._recv_obj
            if host.size < dev.size and _same_start(host, self.host_recv):
                # in-place reduce_scatter: the result is the first block of recvbuf
                dev = result = _flat(kind, dev)[:host.size]
        elif self.send is not None and _same_memory(host, self.host_send):
            (kind, dev), result = self.send, self._send_obj
        else:
            kind, like = self.send
            dev = result = _new_device(kind, like, host.shape, np.dtype(like.dtype))
        raw = np.dtype(dev.dtype)
        if host.dtype != raw:
            host = host.view(raw)
        if host.size != dev.size:
            raise ValueError(f"the result has {host.size} elements but the device buffer "
                             f"{dev.size}")
        _to_device(kind, dev, host.reshape(dev.shape), self.stream)
        return result


def stage(sendbuf, recvbuf=None, *, dtype=None, stream=None):
    """Stage device buffers through host memory.

    Returns ``(host_send, host_recv, finish)``: NumPy copies to hand to the host collective
    (``host_send`` is ``MPI.IN_PLACE`` when ``sendbuf`` is; ``host_recv`` is None when
    ``recvbuf`` is) and ``finish(host_result) -> device_result``. ``dtype`` reinterprets the
    host copies, e.g. ``ml_dtypes.bfloat16`` for raw ``uint16`` device buffers; ``stream`` is
    the CuPy/Numba stream to copy on (default: the array's own / CuPy's current stream).
    The host buffers are cached and reused: use them only until ``finish`` returns.
    """
    s = Staged(sendbuf, recvbuf, dtype=dtype, stream=stream)
    return s.host_send, s.host_recv, s.finish


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
    if _simulator():
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
