"""Device buffers through an MPI that is not CUDA-aware: staged in pinned host buffers.

allreduce, reduce and bcast work element by element, so they run as a pipeline over chunks of
:func:`chunk_bytes` (4 MiB unless ``MLCOMM_STAGING_CHUNK_BYTES`` says otherwise; it must be the
same on every rank). The device-to-host copy of chunk k+1 runs on one copy stream while the
host collective works on chunk k, and chunk k's result goes back to the device on a second
stream as soon as it is ready. A buffer of at most one chunk is copied in one piece.

reduce_scatter and allgather stage the whole buffer at once (:class:`Staged`): their result
blocks do not line up element by element with their input.

Host buffers are pinned when a real GPU is present and cached per role, size and dtype, so
repeated calls allocate nothing. Under Numba's CUDA simulator copies are synchronous, but the
chunking runs exactly as on a GPU.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from .. import config
from . import gpu
from .device import UserBuffers, copy_streams, new_array, to_device_async, to_host_async

__all__ = ["CHUNK_BYTES", "ELEMENTWISE", "chunk_bytes", "run", "pipeline", "stage", "Staged"]

#: Staging chunk size when ``MLCOMM_STAGING_CHUNK_BYTES`` is unset.
CHUNK_BYTES = 4 << 20
#: Collectives whose result element i depends only on input element i: these are chunked.
ELEMENTWISE = ("allreduce", "reduce", "bcast")


def chunk_bytes() -> int:
    """Bytes per staging chunk: ``MLCOMM_STAGING_CHUNK_BYTES``, else :data:`CHUNK_BYTES`."""
    return config.staging_chunk_bytes(CHUNK_BYTES)


# --- host buffers ------------------------------------------------------------------------------

_CACHE_ENTRIES = 16
_cache: "OrderedDict[tuple, np.ndarray]" = OrderedDict()


def _host_buffer(role, count, dtype, kind):
    """A flat host array for ``role`` ("send"/"recv"), pinned on a GPU, reused across calls."""
    dtype = np.dtype(dtype)
    key = (role, count, dtype.str, kind)
    buf = _cache.get(key)
    if buf is not None:
        _cache.move_to_end(key)
        return buf
    if kind == "cupy":
        import cupy
        mem = cupy.cuda.alloc_pinned_memory(max(1, count * dtype.itemsize))
        buf = np.frombuffer(mem, dtype, count)
    elif kind == "numba" and not gpu.simulator():
        from numba import cuda
        buf = cuda.pinned_array(count, dtype)
    else:
        buf = np.empty(count, dtype)
    _cache[key] = buf
    while len(_cache) > _CACHE_ENTRIES:
        _cache.popitem(last=False)
    return buf


def _typed(host, dtype):
    return host if host is None or host.dtype == dtype else host.view(dtype)


# --- elementwise collectives: chunk by chunk ---------------------------------------------------

def pipeline(chunks, copy_in, run_chunk, copy_out):
    """Run ``run_chunk(a, b)`` on each chunk ``(a, b)`` in turn, between its copies in and out.

    ``copy_in``/``copy_out`` start an asynchronous copy and return an event (``copy_out`` may
    return None). Chunk k+1's copy in starts before chunk k runs, so the two overlap; chunk k's
    copy out is queued as soon as it has run. Returns the last copy out's event: the copies out
    run in order on one stream, so waiting for it waits for all of them.
    """
    pending, last = copy_in(*chunks[0]), None
    for k, chunk in enumerate(chunks):
        following = copy_in(*chunks[k + 1]) if k + 1 < len(chunks) else None
        pending.synchronize()
        run_chunk(*chunk)
        last = copy_out(*chunk)
        pending = following
    return last


def _chunks(count, itemsize, whole):
    step = count if whole else max(1, chunk_bytes() // itemsize)
    return [(a, min(a + step, count)) for a in range(0, count, step)] or [(0, 0)]


def _elementwise(collective, bufs, run_host, has_result, whole):
    """Run an elementwise collective on device buffers through the staging pipeline."""
    from mpi4py import MPI
    kind, src, bcast = bufs.kind, bufs.source, collective == "bcast"
    count, raw = src.size, np.dtype(src.dtype)
    host_in = _host_buffer("recv" if bufs.in_place else "send", count, raw, kind)
    if not has_result:  # reduce on a non-root rank
        host_out = dst = result = None
    elif bcast or bufs.in_place:  # the result overwrites the data it came from
        host_out, dst = host_in, src
        result = bufs.sendbuf if bcast else bufs.recvbuf
    else:
        host_out = _host_buffer("recv", count, raw, kind)
        dst = bufs.recv if bufs.recv is not None else new_array(kind, src, count, raw)
        result = bufs.recvbuf if bufs.recv is not None else dst
    typed_in, typed_out = _typed(host_in, bufs.dtype), _typed(host_out, bufs.dtype)
    to_host, to_device = copy_streams(kind, src)

    def part(host, a, b):  # the host buffer itself for the whole: a repeat then runs bound
        return host if a == 0 and b == count else host[a:b]

    def run_chunk(a, b):
        if bufs.in_place:
            run_host(MPI.IN_PLACE, part(typed_in, a, b))
        else:
            run_host(part(typed_in, a, b),
                     None if bcast or typed_out is None else part(typed_out, a, b))

    def copy_out(a, b):
        return None if dst is None else to_device_async(kind, dst[a:b], host_out[a:b], to_device)

    bufs.wait_for_producer()
    last = pipeline(_chunks(count, raw.itemsize, whole),
                    lambda a, b: to_host_async(kind, src[a:b], host_in[a:b], to_host),
                    run_chunk, copy_out)
    if last is not None:
        last.synchronize()  # the host buffers are reused by the next call
    return result


# --- every collective: the whole buffer at once ------------------------------------------------

def _same_start(a, b) -> bool:
    return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)
            and a.__array_interface__["data"][0] == b.__array_interface__["data"][0])


def _same_memory(a, b) -> bool:
    return _same_start(a, b) and a.size == b.size


class Staged:
    """Host copies of device ``sendbuf``/``recvbuf`` and the way back (see :func:`stage`)."""

    def __init__(self, bufs: UserBuffers):
        from mpi4py import MPI
        self.bufs = bufs
        self.to_host, self.to_device = copy_streams(bufs.kind, bufs.source)
        gpu.warn_once_if_unknown()
        bufs.wait_for_producer()
        self.host_send = MPI.IN_PLACE if bufs.in_place else None
        self.host_recv = None
        if bufs.send is not None:
            self.host_send = self._copy_in("send", bufs.send)
        if bufs.recv is not None:
            if bufs.in_place:
                self.host_recv = self._copy_in("recv", bufs.recv)
            else:  # its old contents never matter: an empty host buffer will do
                host = _host_buffer("recv", bufs.recv.size, bufs.recv.dtype, bufs.kind)
                self.host_recv = _typed(host, bufs.dtype)

    def _copy_in(self, role, dev):
        host = _host_buffer(role, dev.size, dev.dtype, self.bufs.kind)
        to_host_async(self.bufs.kind, dev, host, self.to_host).synchronize()
        return _typed(host, self.bufs.dtype)

    def finish(self, host_result):
        """Copy ``host_result`` onto the device and return the device result.

        It lands in ``recvbuf`` when one was given; in ``sendbuf`` when the result is the
        staged send buffer itself (bcast); otherwise in a new array on ``sendbuf``'s device.
        ``None`` (reduce on a non-root rank) gives ``None``.
        """
        if host_result is None:
            return None
        bufs, host = self.bufs, np.ascontiguousarray(host_result).reshape(-1)
        if bufs.recv is not None:
            dev, result = bufs.recv, bufs.recvbuf
            if host.size < dev.size and _same_start(host, self.host_recv):
                # in-place reduce_scatter: the result is the first block of recvbuf
                dev = result = dev[:host.size]
        elif bufs.send is not None and _same_memory(host, self.host_send):
            dev, result = bufs.send, bufs.sendbuf
        else:
            dev = result = new_array(bufs.kind, bufs.send, host.size, bufs.send.dtype)
        if host.size != dev.size:
            raise ValueError(f"the result has {host.size} elements but the device buffer "
                             f"{dev.size}")
        host = _typed(host, np.dtype(dev.dtype))
        to_device_async(bufs.kind, dev, host, self.to_device).synchronize()
        return result


def stage(sendbuf, recvbuf=None, *, dtype=None, stream=None):
    """Stage device buffers through host memory, whole.

    Returns ``(host_send, host_recv, finish)``: NumPy copies to hand to the host collective
    (``host_send`` is ``MPI.IN_PLACE`` when ``sendbuf`` is; ``host_recv`` is None when
    ``recvbuf`` is) and ``finish(host_result) -> device_result``. ``dtype`` reinterprets the
    host copies, e.g. ``ml_dtypes.bfloat16`` for raw ``uint16`` device buffers; ``stream`` is
    the CuPy/Numba stream that produced the data (default: CuPy's current stream / the Numba
    array's own). The host buffers are cached and reused: use them only until ``finish``
    returns.
    """
    s = Staged(UserBuffers(sendbuf, recvbuf, dtype=dtype, stream=stream))
    return s.host_send, s.host_recv, s.finish


def run(collective, bufs: UserBuffers, run_host, *, has_result=True, whole=False):
    """Run ``run_host(host_send, host_recv)`` on staged copies of ``bufs``; return the device
    result.

    Elementwise collectives go through the chunk pipeline (in one chunk when ``whole``, as
    ``validate=True`` needs so that its check covers the whole call); the others through
    :class:`Staged`. ``has_result`` is False on a reduce's non-root ranks (the result is None).
    """
    if collective in ELEMENTWISE:
        gpu.warn_once_if_unknown()
        return _elementwise(collective, bufs, run_host, has_result, whole)
    staged = Staged(bufs)
    result = run_host(staged.host_send, staged.host_recv)
    return staged.finish(result if has_result else None)
