"""The ``mpi`` baseline (``MPI_Allreduce`` or the collective's own call: the dtype it takes,
its label) and the call timed for each algorithm, the baseline's or mlcomm's."""

from __future__ import annotations

import numpy as np

from ..kernels import OP_TABLE
from .calls import CALLS

__all__ = ["BASELINE", "baseline_label"]

BASELINE = "mpi"


def _mpi_plan(dtype, op, collective="allreduce"):
    """Return ``(dtype, MPI.Op, exact)`` for the ``mpi`` baseline.

    When MPI cannot compute this dtype/op itself (float16, bfloat16, avg),
    the baseline times ``MPI_Allreduce`` on the same bytes viewed as an
    unsigned type of the same width (``exact`` False): a timing reference
    whose result is not used; the check then uses a locally computed result.
    :func:`baseline_label` says so in words. A collective that only moves data
    moves the bytes of a dtype MPI has no type for as that unsigned type, exactly.
    """
    from mpi4py import MPI
    mop = getattr(MPI, OP_TABLE[op].mpi)
    moves = not CALLS[collective].reduces
    native = dtype.kind in "iub" or (dtype.kind in "fc" and dtype.itemsize >= 4
                                     and (moves or op not in ("band", "bor", "bxor")))
    if native:
        return dtype, mop, moves or op != "avg"
    return np.dtype(f"u{dtype.itemsize}"), mop, moves


def baseline_label(dtype, op, collective="allreduce") -> str:
    """What the ``mpi`` baseline times for ``dtype`` and ``op``, in words."""
    dtype = np.dtype(dtype)
    mdtype, _, exact = _mpi_plan(dtype, op, collective)
    spec = CALLS[collective]
    if not spec.reduces:
        call = f"{spec.mpi}({mdtype})"
        return call if mdtype == dtype else f"{call} moving the {dtype} bytes"
    call = f"{spec.mpi}({mdtype}, MPI_{OP_TABLE[op].mpi})"
    if exact:
        return call
    if mdtype == dtype:
        return f"{call}: a sum without the division (MPI has no average)"
    if op in ("band", "bor", "bxor"):
        return f"{call} on the {dtype} bytes (MPI has no bitwise op on {dtype})"
    return (f"{call} on the {dtype} bytes: an integer {OP_TABLE[op].mpi.lower()} of their bit "
            f"patterns timed as a stand-in, not a {dtype} {op} (MPI cannot reduce {dtype})")


def _view(a, dtype):
    """View a host or device array's bytes as ``dtype`` (same itemsize or total bytes)."""
    return a.view(dtype) if a.dtype != dtype and a.nbytes % dtype.itemsize == 0 else a


def _timed_call(alg, comm, dev, send, recv, in_place, op, mdtype, mop, staged, hosts,
                options=None, collective="allreduce", counts=None):
    """The call being timed, bound once: ``mpi`` (the MPI library's plain call on ``comm``,
    :data:`~.calls.CALLS`) or an mlcomm algorithm (with ``options``) through the public
    function."""
    from mpi4py import MPI

    spec = CALLS[collective]
    if alg != BASELINE:
        send = MPI.IN_PLACE if in_place else send
        # the call as a caller writes it (unpacking a dict costs 0.1 µs)
        kw = dict(options, comm=comm, algorithm=alg) if options else \
            {"comm": comm, "algorithm": alg}
        if collective == "allreduce" and not options:
            from ..api import allreduce
            return lambda: allreduce(send, recv, op, comm=comm, algorithm=alg)
        return spec.mlcomm(send, recv, counts, op, kw)
    if staged:  # host MPI for device data: copy through the host, as mlcomm stages
        return _staged(comm, dev, send, recv, in_place, mdtype, mop, hosts)
    rb = _view(recv, mdtype)
    if in_place:
        Allreduce = comm.Allreduce
        return lambda: Allreduce(MPI.IN_PLACE, rb, mop)
    return spec.baseline(comm, _view(send, mdtype), rb, counts, mop)


def _staged(comm, dev, send, recv, in_place, mdtype, mop, hosts):
    """``MPI_Allreduce`` on device data through host copies (a host MPI)."""
    from mpi4py import MPI
    Allreduce = comm.Allreduce
    hs, hr = hosts

    def call():
        hs[...] = dev.to_host(recv if in_place else send)
        if in_place:
            Allreduce(MPI.IN_PLACE, _view(hs, mdtype), mop)
            recv.set(hs)
        else:
            Allreduce(_view(hs, mdtype), _view(hr, mdtype), mop)
            recv.set(hr)
    return call
