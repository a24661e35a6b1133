"""Device arrays as collective buffers: checked views, streams, events and copies.

One small adapter over CuPy arrays and Numba device arrays (the CUDA simulator's
``FakeCUDAArray`` included), so that :mod:`mlcomm.buffers.staging` and the device loop
never branch on the array library themselves. Kinds are "cupy" and "numba"; anything else with
``__cuda_array_interface__`` or a CUDA ``__dlpack_device__`` is wrapped as one of them.

:class:`DeviceVector` is what a binding holds on the CUDA-aware path: a flat device array,
the element type the collective reduces (raw ``uint16`` buffers carry ``bfloat16``) and the
stream its kernels launch on. :func:`direct` turns the user's buffers into device vectors.
"""

from __future__ import annotations

import ctypes

import numpy as np

from . import gpu

__all__ = ["UserBuffers", "DeviceVector", "direct", "new_array", "synchronize", "copy_streams",
           "to_host_async", "to_device_async"]


# --- the user's buffers ------------------------------------------------------------------------

def _wrap(buf):
    """Return (kind, array) for a device buffer, wrapping foreign ones without copying."""
    if gpu.is_cupy(buf):
        return "cupy", buf
    if gpu.is_numba(buf):
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
                            f"(mlcomm[cupy]) to pass it to mlcomm") from None
        return "cupy", cupy.from_dlpack(buf)
    raise TypeError(f"{type(buf).__name__} is not a CUDA device array")


def _flat(kind, arr, name):
    ok = arr.flags.c_contiguous if kind == "cupy" else arr.is_c_contiguous()
    if not ok:
        raise ValueError(f"{name} is a non-contiguous device array; pass a contiguous copy")
    return arr.reshape(-1) if kind == "cupy" else arr.reshape(arr.size)


def _logical_dtype(raw, dtype):
    """The element type a raw device dtype carries: ``dtype`` when given (same item size)."""
    raw = np.dtype(raw)
    if dtype is None:
        return raw
    dtype = np.dtype(dtype)
    if dtype.itemsize != raw.itemsize:
        raise TypeError(f"dtype={dtype} reinterprets a {raw} device buffer: the item sizes "
                        f"differ ({dtype.itemsize} vs {raw.itemsize}); pass a dtype of "
                        f"{raw.itemsize} bytes")
    return dtype


def _check_on_device(name, buf, other):
    if buf is not None and not gpu.is_device_array(buf):
        raise TypeError(f"{name} is a {type(buf).__name__} but {other} is on the device; "
                        f"pass device arrays for both (or host arrays for both)")


def _device_buffer(name, buf):
    """(kind, flat device array) for the user's device ``buf`` (None for None)."""
    if buf is None:
        return None
    kind, arr = _wrap(buf)
    return kind, _flat(kind, arr, name)


class UserBuffers:
    """The user's device ``sendbuf``/``recvbuf``, checked: flat arrays of one kind.

    ``send``/``recv`` are flat device arrays (None when not given, ``send`` also when in place),
    ``dtype`` the element type they carry and ``stream`` the stream that produced them.
    """

    def __init__(self, sendbuf, recvbuf, *, dtype=None, stream=None):
        from mpi4py import MPI
        self.sendbuf, self.recvbuf, self.stream = sendbuf, recvbuf, stream
        self.in_place = sendbuf is MPI.IN_PLACE
        if self.in_place and recvbuf is None:
            raise ValueError("sendbuf=IN_PLACE needs recvbuf: the data to reduce in place")
        if not self.in_place:  # both checked before either touches the CUDA driver
            _check_on_device("sendbuf", sendbuf, "recvbuf")
        _check_on_device("recvbuf", recvbuf, "sendbuf")
        send = None if self.in_place else _device_buffer("sendbuf", sendbuf)
        recv = _device_buffer("recvbuf", recvbuf)
        kinds = {kind for kind, _ in filter(None, (send, recv))}
        if not kinds:
            raise TypeError("mlcomm needs a device sendbuf or recvbuf here")
        if len(kinds) > 1:
            raise TypeError("sendbuf and recvbuf are device arrays of different libraries "
                            "(CuPy and Numba); pass two of the same kind")
        self.kind = kinds.pop()
        self.send = send[1] if send else None
        self.recv = recv[1] if recv else None
        #: what the collective reads: sendbuf, or recvbuf in place
        self.source = self.recv if self.send is None else self.send
        self.dtype = _logical_dtype(self.source.dtype, dtype)
        if self.send is not None and self.recv is not None and self.send.dtype != self.recv.dtype:
            raise TypeError(f"recvbuf dtype {self.recv.dtype} differs from sendbuf dtype "
                            f"{self.send.dtype}; use the same dtype for both")

    def wait_for_producer(self):
        """Wait until the stream that produced the data has finished."""
        synchronize(self.kind, work_stream(self.kind, self.source, self.stream))


# --- streams, events, copies ---------------------------------------------------------------

def work_stream(kind, arr, stream=None):
    """``stream`` when given, else the one the data lives on: CuPy's current stream, or the
    Numba array's own stream (0, the default stream, unless it was bound to one)."""
    if stream is not None:
        return stream
    if kind == "cupy":
        import cupy
        return cupy.cuda.get_current_stream()
    return getattr(arr, "stream", 0) or 0


def synchronize(kind, stream):
    """Block until ``stream`` (CuPy, Numba, a raw handle; 0/None: the default) is done."""
    if kind == "cupy":
        from ..kernels import cupy_backend
        cupy_backend.to_stream(stream).synchronize()
        return
    from numba import cuda
    from ..kernels import cuda_backend
    s = cuda_backend.to_stream(stream)
    if s:
        s.synchronize()
    else:
        cuda.synchronize()  # work on the default stream: wait for the device


_copy_streams: dict = {}


def _device_id(kind, arr):
    if kind == "cupy":
        return arr.device.id
    from numba import cuda
    return 0 if gpu.simulator() else cuda.get_current_device().id


def copy_streams(kind, arr):
    """Two streams of ``arr``'s device for staging copies: (to host, to device), created once."""
    key = (kind, _device_id(kind, arr))
    pair = _copy_streams.get(key)
    if pair is None:
        if kind == "cupy":
            import cupy
            with cupy.cuda.Device(key[1]):
                pair = (cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True))
        else:
            from numba import cuda
            pair = (cuda.stream(), cuda.stream())
        _copy_streams[key] = pair
    return pair


def _record(kind, stream):
    """An event recorded on ``stream`` now; its ``synchronize()`` waits for what came before."""
    if kind == "cupy":
        return stream.record()
    from numba import cuda
    event = cuda.event() if gpu.simulator() else cuda.event(timing=False)
    event.record(stream)
    return event


def _copy_async(kind, dev, host, stream, to_host):
    """Start a copy between flat device ``dev`` and pinned ``host`` on ``stream``."""
    if not dev.size:
        return
    if kind == "cupy":
        mem = dev.data
        copy = mem.copy_to_host_async if to_host else mem.copy_from_host_async
        with dev.device:
            copy(host.ctypes.data_as(ctypes.c_void_p), host.nbytes, stream)
    elif to_host:
        dev.copy_to_host(host, stream=stream)
    else:
        dev.copy_to_device(host, stream=stream)


def to_host_async(kind, dev, host, stream):
    """Start copying flat device ``dev`` into pinned ``host`` on ``stream``; return an event."""
    _copy_async(kind, dev, host, stream, to_host=True)
    return _record(kind, stream)


def to_device_async(kind, dev, host, stream):
    """Start copying pinned ``host`` into flat device ``dev`` on ``stream``; return an event."""
    _copy_async(kind, dev, host, stream, to_host=False)
    return _record(kind, stream)


def new_array(kind, like, count, raw_dtype):
    """A new flat device array of ``count`` elements on ``like``'s device."""
    if kind == "cupy":
        import cupy
        with like.device:
            return cupy.empty(count, raw_dtype)
    from numba import cuda
    return cuda.device_array(count, raw_dtype)


def _address(kind, arr):
    if kind == "cupy":
        return arr.data.ptr
    if gpu.simulator():  # the simulator's arrays are NumPy arrays in host memory
        return arr.__array_interface__["data"][0]
    return arr.__cuda_array_interface__["data"][0]


# --- the CUDA-aware path -------------------------------------------------------------------

class DeviceVector:
    """A flat device array seen as ``dtype``, and the stream mlcomm works on for it.

    Slicing gives a vector over the same memory. A binding sends ``bytes()`` through a
    CUDA-aware MPI, reduces ``raw`` with the GPU kernels and copies with :meth:`copy_from`.
    """

    __slots__ = ("raw", "kind", "dtype", "stream", "ptr")

    def __init__(self, raw, kind, dtype, stream):
        self.raw, self.kind, self.dtype, self.stream = raw, kind, dtype, stream
        self.ptr = _address(kind, raw)

    @property
    def size(self):
        return self.raw.size

    @property
    def nbytes(self):
        return self.raw.size * self.dtype.itemsize

    def __getitem__(self, item):
        return DeviceVector(self.raw[item], self.kind, self.dtype, self.stream)

    def bytes(self):
        """The raw bytes, as a device array MPI takes (``__cuda_array_interface__``/DLPack)."""
        return self.raw.view(np.uint8)

    def empty(self, count):
        """A new vector of ``count`` elements like this one (no allocation for 0)."""
        if count == 0:
            return self[0:0]
        return DeviceVector(new_array(self.kind, self.raw, count, self.raw.dtype), self.kind,
                            self.dtype, self.stream)

    def overlaps(self, other):
        return self.ptr < other.ptr + other.nbytes and other.ptr < self.ptr + self.nbytes

    def copy_from(self, src):
        """Copy ``src`` into this vector on the stream (device to device)."""
        if self.kind == "cupy":
            from ..kernels import cupy_backend
            with cupy_backend.to_stream(self.stream):
                self.raw[...] = src.raw
        else:
            from ..kernels import cuda_backend
            self.raw.copy_to_device(src.raw, stream=cuda_backend.to_stream(self.stream))

    def synchronize(self):
        synchronize(self.kind, self.stream)


def direct(bufs: UserBuffers):
    """Device vectors for a CUDA-aware MPI, once the producing stream has finished.

    Returns ``(send, recv, result)``: ``send`` is ``MPI.IN_PLACE`` when ``sendbuf`` is, ``recv``
    None when ``recvbuf`` is, and ``result(out)`` gives the user's own ``recvbuf``/``sendbuf``
    object when ``out`` is one of them, else the device array under ``out``.
    """
    from mpi4py import MPI
    work = work_stream(bufs.kind, bufs.source, bufs.stream)
    vector = lambda arr: None if arr is None else DeviceVector(arr, bufs.kind, bufs.dtype, work)
    send, recv = vector(bufs.send), vector(bufs.recv)
    bufs.wait_for_producer()

    def result(out):
        if out is recv:
            return bufs.recvbuf
        return bufs.sendbuf if out is send else out.raw
    return (MPI.IN_PLACE if bufs.in_place else send), recv, result
