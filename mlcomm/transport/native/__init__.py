"""The MPI library's own collectives, as the transport of the ``mpi`` algorithm's one step.

A program's :class:`mlcomm.ir.program.Call` runs one of the library's collectives on the
binding's buffers. Its START calls the library: the non-blocking collective
(``MPI_Iallreduce`` and friends), which its WAIT polls with ``MPI_Testall`` like a message,
yielding the CPU as every wait of mlcomm's does, so a waiting loop can report a stall; or,
for a ``blocking`` call, the blocking collective (``MPI_Allreduce`` ...), complete when it
returns, which waits as the library waits. The library does not say which ranks a
collective waits for.

Every call is started anew (no persistent collective request): an ``MPI_Allreduce_init``
is collective, and bindings are made and dropped by each rank's own cache.
"""

from __future__ import annotations

import ctypes
from functools import lru_cache
from typing import NamedTuple

import numpy as np
from mpi4py import MPI
from numba import carray, njit

from ..cabi import ccall4, ccall5, ccall6, ccall7, ccall8, ccall9, ccall10, i64_array_at
from ...ir.program import INPUT_IN_OUTPUT
from ...kernels import OP_TABLE
from .. import FAULT, Transport, compile_calls

__all__ = ["LibraryCollectives", "NativeCall", "bind", "KINDS", "native_call", "native_dtype_ok",
           "supports"]


class NativeCall(NamedTuple):
    """One call of the library's collective ``kind`` on ``count`` elements (as MPI takes
    it), from the memory at ``send`` (None: in place) into the memory at ``recv``; the
    ``blocking`` call, or the non-blocking one; an uneven form's ``counts`` (one per rank;
    an all-to-all-v's sendcounts, then its recvcounts)."""

    kind: str
    send: int | None
    recv: int
    count: int
    root: int = 0
    blocking: bool = False
    counts: tuple = ()

#: collective name -> (code, blocking function, non-blocking function)
KINDS = {"allreduce": (0, "MPI_Allreduce", "MPI_Iallreduce"),
         "reduce_scatter": (1, "MPI_Reduce_scatter_block", "MPI_Ireduce_scatter_block"),
         "allgather": (2, "MPI_Allgather", "MPI_Iallgather"),
         "bcast": (3, "MPI_Bcast", "MPI_Ibcast"),
         "reduce": (4, "MPI_Reduce", "MPI_Ireduce"),
         "gather": (5, "MPI_Gather", "MPI_Igather"),
         "scatter": (6, "MPI_Scatter", "MPI_Iscatter"),
         "alltoall": (7, "MPI_Alltoall", "MPI_Ialltoall"),
         "allgatherv": (8, "MPI_Allgatherv", "MPI_Iallgatherv"),
         "reduce_scatter_v": (9, "MPI_Reduce_scatter", "MPI_Ireduce_scatter"),
         "gatherv": (10, "MPI_Gatherv", "MPI_Igatherv"),
         "scatterv": (11, "MPI_Scatterv", "MPI_Iscatterv"),
         "alltoallv": (12, "MPI_Alltoallv", "MPI_Ialltoallv")}

# context words: a head, then _CALL words per call
_TESTALL, _REQ_BYTES, _REQS, _STATUSES, _FLAG, _FAULT_AT, _ERROR = range(7)
_HEAD = 8
# per call: kind, blocking, function, send, recv, count, datatype, op, root, comm, and the
# address of an uneven form's int32 counts and displacements (:func:`_count_words`) and
# the communicator's size
_KIND, _BLOCKING, _FN, _SEND, _RECV, _COUNT, _TYPE, _OP, _ROOT, _COMM, _COUNTS, _SIZE = \
    range(12)
_CALL = 12


def define(compile):
    """``(start, test)`` of this transport, as :func:`compile_calls` compiles them."""
    @compile
    def start(context, first, n):
        head = carray(i64_array_at(context), _HEAD)
        ctx = carray(i64_array_at(context), _HEAD + _CALL * (first + n))
        for i in range(first, first + n):
            w = _HEAD + _CALL * i
            kind, fn, send, recv = ctx[w + _KIND], ctx[w + _FN], ctx[w + _SEND], ctx[w + _RECV]
            count, dtype, op, root, comm = ctx[w + _COUNT], ctx[w + _TYPE], ctx[w + _OP], \
                ctx[w + _ROOT], ctx[w + _COMM]
            req = head[_REQS] + i * head[_REQ_BYTES]
            blocking = ctx[w + _BLOCKING]
            if kind >= 5:
                err = _start_more(kind, blocking, fn, send, recv, count, dtype, op, root,
                                  comm, req, ctx[w + _COUNTS], 4 * ctx[w + _SIZE])
            elif kind == 0 or kind == 1:  # allreduce, reduce_scatter: the same signature
                err = ccall6(fn, send, recv, count, dtype, op, comm) if blocking else \
                    ccall7(fn, send, recv, count, dtype, op, comm, req)
            elif kind == 2:
                err = ccall7(fn, send, count, dtype, recv, count, dtype, comm) if blocking else \
                    ccall8(fn, send, count, dtype, recv, count, dtype, comm, req)
            elif kind == 3:
                err = ccall5(fn, recv, count, dtype, root, comm) if blocking else \
                    ccall6(fn, recv, count, dtype, root, comm, req)
            else:
                err = ccall7(fn, send, recv, count, dtype, op, root, comm) if blocking else \
                    ccall8(fn, send, recv, count, dtype, op, root, comm, req)
            if err != 0:
                ctx[_FAULT_AT], ctx[_ERROR] = i, err
                return FAULT
        return 0

    @compile
    def test(context, first, n):
        ctx = carray(i64_array_at(context), _HEAD)
        ctx[_FLAG] = 0
        err = ccall4(ctx[_TESTALL], n, ctx[_REQS] + first * ctx[_REQ_BYTES],
                     context + 8 * _FLAG, ctx[_STATUSES])
        if err != 0:
            ctx[_FAULT_AT], ctx[_ERROR] = first, err
            return FAULT
        return 1 if ctx[_FLAG] & 0xFFFFFFFF else 0

    return start, test


@njit(cache=True)
def _start_more(kind, blocking, fn, send, recv, count, dtype, op, root, comm, req, at, p4):
    """Start a collective of kind 5 and on (gather .. alltoallv, :data:`KINDS`); ``at``: the
    address of its int32 counts and displacements (:func:`_count_words`), ``p4``: the bytes
    of ``p`` of them."""
    if kind == 5 or kind == 6:  # gather, scatter
        return ccall8(fn, send, count, dtype, recv, count, dtype, root, comm) if blocking \
            else ccall9(fn, send, count, dtype, recv, count, dtype, root, comm, req)
    if kind == 7:  # alltoall
        return ccall7(fn, send, count, dtype, recv, count, dtype, comm) if blocking else \
            ccall8(fn, send, count, dtype, recv, count, dtype, comm, req)
    if kind == 8:  # allgatherv
        return ccall8(fn, send, count, dtype, recv, at, at + p4, dtype, comm) if blocking \
            else ccall9(fn, send, count, dtype, recv, at, at + p4, dtype, comm, req)
    if kind == 9:  # reduce_scatter (uneven)
        return ccall6(fn, send, recv, at, dtype, op, comm) if blocking else \
            ccall7(fn, send, recv, at, dtype, op, comm, req)
    if kind == 10:  # gatherv
        return ccall9(fn, send, count, dtype, recv, at, at + p4, dtype, root, comm) \
            if blocking else \
            ccall10(fn, send, count, dtype, recv, at, at + p4, dtype, root, comm, req)
    if kind == 11:  # scatterv
        return ccall9(fn, send, at, at + p4, dtype, recv, count, dtype, root, comm) \
            if blocking else \
            ccall10(fn, send, at, at + p4, dtype, recv, count, dtype, root, comm, req)
    # alltoallv
    return ccall9(fn, send, at, at + p4, dtype, recv, at + 2 * p4, at + 3 * p4, dtype, comm) \
        if blocking else \
        ccall10(fn, send, at, at + p4, dtype, recv, at + 2 * p4, at + 3 * p4, dtype, comm, req)


def _mpi_op(op: str):
    return getattr(MPI, OP_TABLE[op].mpi)


@lru_cache(maxsize=None)
def datatype(dtype):
    """The MPI library's predefined datatype for ``dtype``, or None: integers, float32 and
    float64, the two complex types and C bool (half floats are an extension some libraries
    lack, bfloat16 none has)."""
    dtype = np.dtype(dtype)
    if dtype.kind in "iub" or dtype.kind == "f" and dtype.itemsize in (4, 8) or \
            dtype.kind == "c" and dtype.itemsize in (8, 16):
        try:
            return MPI.Datatype.fromcode(dtype.char)
        except (ValueError, KeyError, TypeError):
            return None
    return None


def native_dtype_ok(dtype) -> bool:
    """True when the MPI library has a datatype for ``dtype``."""
    return datatype(dtype) is not None


def native_call(collective, comm, inp, out, op, root=0, *, overlap, copy, buffer, empty):
    """Run the MPI library's own collective on ``inp`` and ``out`` from Python (device
    buffers on a CUDA-aware MPI).

    Overlapping buffers (``overlap(inp, out)``) mean in place, in MPI's sense for each
    collective; ``copy(dst, src)`` copies, ``buffer(x)`` gives what mpi4py takes and
    ``empty(x)`` a new buffer like ``x``. An in-place reduce-scatter reduces from a copy of
    its blocks into the first: with ``MPI_IN_PLACE`` on device buffers, Intel MPI 2021.18
    (``I_MPI_OFFLOAD=1``) leaves wrong results on every rank but 0 (docs/gpu.rst).
    """
    in_place = overlap(inp, out)
    if collective == "bcast" and comm.Get_rank() == root and not in_place:
        copy(out, inp)
    if collective == "reduce_scatter" and in_place:
        blocks = empty(inp)
        copy(blocks, inp)
        inp, out, in_place = blocks, inp[0:inp.size // comm.Get_size()], False
    inp, out = buffer(inp), buffer(out)
    send = MPI.IN_PLACE if in_place else inp
    if collective == "allreduce":
        comm.Allreduce(send, out, _mpi_op(op))
    elif collective == "reduce_scatter":
        comm.Reduce_scatter_block(send, out, _mpi_op(op))
    elif collective == "allgather":
        comm.Allgather(send, out)
    elif collective == "bcast":
        comm.Bcast(out, root)
    elif collective == "reduce":
        if in_place and comm.Get_rank() != root:
            send = inp
        comm.Reduce(send, out, _mpi_op(op), root)
    else:
        raise ValueError(collective)


def supports(dtype, op: str) -> bool:
    """Whether the library's collectives reduce ``dtype`` with ``op`` (as mlcomm's ops
    mean it): a datatype it has, and on C bool only the logical ops."""
    dtype = np.dtype(dtype)
    return native_dtype_ok(dtype) and (dtype.kind != "b" or op in ("land", "lor"))


class LibraryCollectives(Transport):
    """A program's :class:`NativeCall` s on ``comm``, of ``dtype`` reduced with ``op`` (see
    the module docstring)."""

    def __init__(self, comm, calls, dtype, op):
        from ..libmpi import MPILibraryError, symbol
        self.comm, self.calls = comm, tuple(calls)
        self.datatype = datatype(dtype)
        self.op = _mpi_op(op)
        self._requests = [MPI.REQUEST_NULL] * len(self.calls)
        self._fault = None
        self._ctx = None
        self._counts = [_count_words(c, comm.Get_size()) for c in self.calls]
        try:
            fns = [symbol(KINDS[c.kind][1 if c.blocking else 2]) for c in self.calls]
            testall = symbol("MPI_Testall")
        except MPILibraryError:
            return
        req_bytes, status_bytes = MPI._sizeof(MPI.Request), MPI._sizeof(MPI.Status)
        # MPI_REQUEST_NULL in every slot: a blocking call's stays so, which Testall passes
        null = np.frombuffer(ctypes.string_at(MPI._addressof(MPI.REQUEST_NULL), req_bytes),
                             np.uint8)
        self._handles = np.tile(null, max(len(self.calls), 1))
        self._statuses = np.zeros(max(len(self.calls), 1) * status_bytes, np.uint8)
        ctx = np.zeros(_HEAD + _CALL * len(self.calls), np.int64)
        ctx[:_FLAG] = [testall, req_bytes, _address(self._handles), _address(self._statuses)]
        handles = [_word(MPI._handleof(h)) for h in (self.datatype, self.op, comm)]
        for i, (c, fn) in enumerate(zip(self.calls, fns)):
            ctx[_HEAD + _CALL * i:_HEAD + _CALL * (i + 1)] = [
                KINDS[c.kind][0], int(c.blocking), fn,
                _word(int(MPI.IN_PLACE)) if c.send is None else c.send,
                c.recv, c.count, handles[0], handles[1], c.root, handles[2],
                _address(self._counts[i]) if self._counts[i].size else 0, comm.Get_size()]
        self._ctx = ctx
        self.compiled = (_address(ctx), *compile_calls(define))

    def _message(self, address, count, size):
        """An mpi4py buffer spec over ``count`` elements at ``address`` (None: in place)."""
        if address is None:
            return MPI.IN_PLACE
        return [MPI.buffer.fromaddress(address, count * size) if count else None,
                self.datatype]

    def start(self, first, n):
        size = self.datatype.Get_size()
        p = self.comm.Get_size()
        for i in range(first, first + n):
            c = self.calls[i]
            ins, outs = _lengths(c, p)
            send = self._message(c.send, ins, size)
            recv = self._message(c.recv, outs, size)
            try:
                self._requests[i] = self._call(c, send, recv, self._counts[i])
            except MPI.Exception as exc:
                self._fault = exc.Get_error_code()
                return FAULT
        return 0

    def _call(self, c, send, recv, words):
        """The call's request (MPI.REQUEST_NULL for a blocking call, complete); ``words``:
        its counts and displacements (:func:`_count_words`)."""
        comm, op, blocking, kind, root = self.comm, self.op, c.blocking, c.kind, c.root
        p = comm.Get_size()
        v = lambda spec, k: [spec[0], (words[k * p:(k + 1) * p], words[(k + 1) * p:(k + 2) * p]),
                             self.datatype] if spec is not MPI.IN_PLACE else spec
        name, args = {
            "allreduce": ("Allreduce", lambda: (send, recv, op)),
            "reduce_scatter": ("Reduce_scatter_block", lambda: (send, recv, op)),
            "allgather": ("Allgather", lambda: (send, recv)),
            "bcast": ("Bcast", lambda: (recv, root)),
            "reduce": ("Reduce", lambda: (send, recv, op, root)),
            "gather": ("Gather", lambda: (send, recv, root)),
            "scatter": ("Scatter", lambda: (send, recv, root)),
            "alltoall": ("Alltoall", lambda: (send, recv)),
            "allgatherv": ("Allgatherv", lambda: (send, v(recv, 0))),
            "reduce_scatter_v": ("Reduce_scatter", lambda: (send, recv, words[:p], op)),
            "gatherv": ("Gatherv", lambda: (send, v(recv, 0), root)),
            "scatterv": ("Scatterv", lambda: (v(send, 0), recv, root)),
            "alltoallv": ("Alltoallv", lambda: (v(send, 0), v(recv, 2)))}[kind]
        if blocking:
            getattr(comm, name)(*args())
            return MPI.REQUEST_NULL
        return getattr(comm, "I" + name[0].lower() + name[1:])(*args())

    def test(self, first, n):
        try:
            return int(MPI.Request.Testall(self._requests[first:first + n]))
        except MPI.Exception as exc:
            self._fault = exc.Get_error_code()
            return FAULT

    def pending_peers(self, first, n):
        """None: the library does not say which ranks its collective waits for."""
        return None

    def failed(self) -> bool:
        from ..mpi.names import is_failure
        return is_failure(self._fault if self._fault is not None else int(self._ctx[_ERROR]))

    def fault(self) -> str:
        from ..mpi.names import describe_error
        code = self._fault if self._fault is not None else int(self._ctx[_ERROR])
        self._fault = None
        return f"the MPI library's collective failed: {describe_error(code)}"

    def free(self) -> None:
        self.compiled = None


def _lengths(c, p) -> tuple:
    """The elements a :class:`NativeCall` reads from ``send`` and writes at ``recv`` (every
    rank's block where it is in place)."""
    kind, n, counts = c.kind, c.count, c.counts
    if kind == "alltoallv":
        return sum(counts[:p]), sum(counts[p:])
    whole, in_place = sum(counts), c.send is None
    return {"reduce_scatter": (n * p, n * p if in_place else n), "allgather": (n, n * p),
            "gather": (n, n * p), "scatter": (n * p, n), "alltoall": (n * p, n * p),
            "allgatherv": (n, whole), "reduce_scatter_v": (whole, whole if in_place else n),
            "gatherv": (n, whole), "scatterv": (whole, n)}.get(kind, (n, n))


def _count_words(c, p) -> np.ndarray:
    """A :class:`NativeCall`'s counts as MPI takes them, int32: the counts and their
    displacements (the exclusive prefix sums); an all-to-all-v's sendcounts, sdispls,
    recvcounts and rdispls; a reduce-scatter's counts alone; none for the even forms (and a
    gatherv's or scatterv's rank other than the root: p zeros, twice)."""
    if c.kind not in ("allgatherv", "reduce_scatter_v", "gatherv", "scatterv", "alltoallv"):
        return np.zeros(0, np.int32)
    counts = np.asarray(c.counts or (0,) * p, np.int64).reshape(-1, p)
    if c.kind == "reduce_scatter_v":
        return counts[0].astype(np.int32)
    displs = np.cumsum(counts, axis=1) - counts
    return np.stack([counts, displs], axis=1).reshape(-1).astype(np.int32)


def _word(value: int) -> int:
    """A handle or address as an int64 word: MPICH's handles are C ``int`` s that mpi4py
    gives as unsigned, its ``MPI_IN_PLACE`` is ``(void *) -1``."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >> 63 else value


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def bind(site) -> LibraryCollectives:
    """The library's collectives of ``site``'s program, on host buffers
    (:class:`mlcomm.transport.Site`)."""
    plan, at = site.plan, site.addresses
    if site.device:
        raise TypeError(f"{plan.describe()} runs on host buffers here; device buffers "
                        f"go to the MPI library through mlcomm.allreduce")
    calls = [NativeCall(c.kind, None if c.send == INPUT_IN_OUTPUT else at[c.send] + c.send_at,
                        at[c.recv] + c.recv_at, c.count, c.root, c.blocking, c.counts)
             for c in plan.program.calls]
    return LibraryCollectives(site.comm, calls, plan.dtype, plan.op)
