"""The buffer normaliser: what a caller passes, as the flat array a collective runs on.

:func:`flat` takes what the public functions take (a NumPy array, a CPU tensor, anything
with the buffer protocol, a device vector) and rejects what MPI would mangle, naming the
argument; :func:`from_spec` takes mpi4py's buffer specifications (``[buf, MPI.FLOAT]``,
``[buf, count, MPI.FLOAT]``, ``[buf, (count, displ), MPI.FLOAT]``) and gives None for what
is not plain (a derived datatype, a non-contiguous buffer), which ``mlcomm.Comm`` hands to
the library.
"""

from __future__ import annotations

import numpy as np

from . import tensors
from .device import DeviceVector

__all__ = ["flat", "from_spec"]


def _buffer(obj) -> np.ndarray:
    """A NumPy view of a buffer-protocol object, typed by its format (bytes as uint8)."""
    view = memoryview(obj)
    return np.frombuffer(obj, dtype=np.dtype(view.format)) if view.format != "B" \
        else np.frombuffer(obj, np.uint8)


def flat(buf, name: str, writable: bool = False):
    """View ``buf`` as a 1-D array without copying; reject what MPI would mangle, with an
    error naming ``name`` and the fix."""
    if isinstance(buf, DeviceVector):  # already flat, contiguous and checked
        return buf
    arr = buf if isinstance(buf, np.ndarray) else None
    if arr is None and tensors.is_tensor(buf):
        arr = tensors.as_array(buf, name)
    if arr is None:
        try:
            arr = _buffer(buf)
        except TypeError:
            if writable:
                raise TypeError(f"{name} must be a writable buffer such as a NumPy array, "
                                f"got {type(buf).__name__}") from None
            arr = np.asarray(buf)
    if not arr.flags.c_contiguous:
        raise ValueError(f"{name} is not C-contiguous; pass np.ascontiguousarray({name})")
    if writable and not arr.flags.writeable:
        raise ValueError(f"{name} is read-only; pass a writable array")
    return arr if arr.ndim == 1 else arr.reshape(-1)


def from_spec(spec):
    """A 1-D NumPy view of an mpi4py buffer spec (None and ``MPI.IN_PLACE`` as given), or
    None where the spec is not plain."""
    from mpi4py import MPI
    from mpi4py.util import dtlib
    if spec is None or spec is MPI.IN_PLACE:
        return spec
    obj, count, displ, datatype = spec, None, 0, None
    if isinstance(spec, (list, tuple)):
        obj, *rest = spec
        if rest and isinstance(rest[-1], MPI.Datatype):
            datatype = rest.pop()
        if rest:
            count = rest[0]
            if isinstance(count, (list, tuple)):
                count, displ = count
    if isinstance(obj, np.ndarray):
        if not obj.flags.c_contiguous:
            return None
        arr = obj.reshape(-1)
    else:
        if not memoryview(obj).c_contiguous:
            return None
        arr = _buffer(obj)
    if datatype is not None:
        if not datatype.is_predefined:
            return None
        dtype = dtlib.to_numpy_dtype(datatype)
        if dtype != arr.dtype:
            if arr.nbytes % dtype.itemsize:
                return None
            arr = arr.view(np.uint8).view(dtype)
    if count is not None:
        arr = arr[displ:displ + count]
    return arr


def from_vspec(spec, blocks: int):
    """``(array, counts, displs)`` of an mpi4py vector buffer spec (``[buf, counts, displs,
    datatype]`` and its shorter forms, as mpi4py reads them) over ``blocks`` ranks:
    ``array`` the whole buffer, 1-D; ``counts`` and ``displs`` tuples, in elements. None and
    ``MPI.IN_PLACE`` come back as given; None for a spec that is not plain (the MPI library
    takes those)."""
    from mpi4py import MPI
    if spec is None or spec is MPI.IN_PLACE:
        return spec
    obj, counts, displs, datatype = spec, None, None, None
    if isinstance(spec, (list, tuple)):
        if not 2 <= len(spec) <= 4:
            return None
        obj, *rest = spec
        if isinstance(rest[-1], MPI.Datatype):
            datatype = rest.pop()
        if len(rest) == 2:
            counts, displs = rest
        elif rest:
            counts = rest[0]
            if isinstance(counts, tuple):
                counts, displs = counts
    arr = from_spec(obj if datatype is None else [obj, datatype])
    if arr is None:
        return None
    if counts is None:
        counts = [arr.size // blocks + (arr.size % blocks > i) for i in range(blocks)]
    elif isinstance(counts, (int, np.integer)):
        counts = [int(counts)] * blocks
    counts = tuple(int(c) for c in counts)
    if displs is None:
        displs = np.concatenate([[0], np.cumsum(counts[:-1], dtype=np.int64)]).tolist() \
            if counts else []
    elif isinstance(displs, (int, np.integer)):
        displs = [int(displs) * i for i in range(blocks)]
    displs = tuple(int(d) for d in displs)
    if len(counts) != blocks or len(displs) != blocks or \
            any(d < 0 or d + c > arr.size for c, d in zip(counts, displs)):
        return None
    return arr, counts, displs


def packed(arr, counts, displs):
    """``(blocks, unpack)``: the blocks of ``arr`` at ``displs`` one after another (a view
    where they are so already, else a copy), and None or what copies a packed result back
    into place."""
    at = 0
    if all(d == (at := at + c) - c for c, d in zip(counts, displs)):
        return arr[:sum(counts)], None
    blocks = np.concatenate([arr[d:d + c] for c, d in zip(counts, displs)]) if counts \
        else arr[:0].copy()

    def unpack():
        k = 0
        for c, d in zip(counts, displs):
            arr[d:d + c] = blocks[k:k + c]
            k += c
    return blocks, unpack
