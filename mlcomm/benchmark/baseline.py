"""The ``mpi`` baseline (``MPI_Allreduce``: the dtype it reduces, its label) and the call
timed for each algorithm, the baseline's or mlcomm's."""

from __future__ import annotations

import numpy as np

from ..kernels import OP_TABLE

__all__ = ["BASELINE", "baseline_label"]

BASELINE = "mpi"


def _mpi_plan(dtype, op):
    """Return ``(dtype, MPI.Op, exact)`` for the ``mpi`` baseline.

    When MPI cannot compute this dtype/op itself (float16, bfloat16, avg),
    the baseline times ``MPI_Allreduce`` on the same bytes viewed as an
    unsigned type of the same width (``exact`` False): a timing reference
    whose result is not used; the check then uses a locally computed result.
    :func:`baseline_label` says so in words.
    """
    from mpi4py import MPI
    mop = getattr(MPI, OP_TABLE[op].mpi)
    native = dtype.kind in "iub" or (dtype.kind in "fc" and dtype.itemsize >= 4
                                     and op not in ("band", "bor", "bxor"))
    if native:
        return dtype, mop, op != "avg"
    return np.dtype(f"u{dtype.itemsize}"), mop, False


def baseline_label(dtype, op) -> str:
    """What the ``mpi`` baseline times for ``dtype`` and ``op``, in words."""
    dtype = np.dtype(dtype)
    mdtype, _, exact = _mpi_plan(dtype, op)
    call = f"MPI_Allreduce({mdtype}, MPI_{OP_TABLE[op].mpi})"
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
                options=None):
    """The call being timed, bound once: ``mpi`` (MPI_Allreduce) or an mlcomm algorithm
    (with ``options``)."""
    from mpi4py import MPI

    from ..api import allreduce

    if alg != BASELINE:
        send = MPI.IN_PLACE if in_place else send
        if not options:  # the call as a caller writes it (unpacking a dict costs 0.1 µs)
            return lambda: allreduce(send, recv, op, comm=comm, algorithm=alg)
        kw = dict(options, comm=comm, algorithm=alg)
        return lambda: allreduce(send, recv, op, **kw)
    Allreduce = comm.Allreduce
    if staged:  # host MPI for device data: copy through the host, as mlcomm stages
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
    rb = _view(recv, mdtype)
    if in_place:
        return lambda: Allreduce(MPI.IN_PLACE, rb, mop)
    sb = _view(send, mdtype)
    return lambda: Allreduce(sb, rb, mop)
