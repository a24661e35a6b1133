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
from numba import carray

from ..cabi import ccall4, ccall5, ccall6, ccall7, ccall8, i64_array_at
from ...ir.program import INPUT_IN_OUTPUT
from ...kernels import OP_TABLE
from .. import FAULT, Transport, compile_calls

__all__ = ["LibraryCollectives", "NativeCall", "bind", "KINDS", "native_call", "native_dtype_ok",
           "supports"]


class NativeCall(NamedTuple):
    """One call of the library's collective ``kind`` on ``count`` elements (as MPI takes
    it), from the memory at ``send`` (None: in place) into the memory at ``recv``; the
    ``blocking`` call, or the non-blocking one."""

    kind: str
    send: int | None
    recv: int
    count: int
    root: int = 0
    blocking: bool = False

#: collective name -> (code, blocking function, non-blocking function)
KINDS = {"allreduce": (0, "MPI_Allreduce", "MPI_Iallreduce"),
         "reduce_scatter": (1, "MPI_Reduce_scatter_block", "MPI_Ireduce_scatter_block"),
         "allgather": (2, "MPI_Allgather", "MPI_Iallgather"),
         "bcast": (3, "MPI_Bcast", "MPI_Ibcast"),
         "reduce": (4, "MPI_Reduce", "MPI_Ireduce")}

# context words: a head, then _CALL words per call
_TESTALL, _REQ_BYTES, _REQS, _STATUSES, _FLAG, _FAULT_AT, _ERROR = range(7)
_HEAD = 8
# per call: kind, blocking, function, send, recv, count, datatype, op, root, comm
_KIND, _BLOCKING, _FN, _SEND, _RECV, _COUNT, _TYPE, _OP, _ROOT, _COMM = range(10)
_CALL = 10


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
            if kind == 0 or kind == 1:  # allreduce, reduce_scatter: the same signature
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
                c.recv, c.count, handles[0], handles[1], c.root, handles[2]]
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
            ins = c.count * p if c.kind == "reduce_scatter" else c.count
            # in place, a reduce-scatter's result buffer holds every rank's block first
            outs = c.count * p if c.kind == "allgather" or (
                c.kind == "reduce_scatter" and c.send is None) else c.count
            send = self._message(c.send, ins, size)
            recv = self._message(c.recv, outs, size)
            try:
                self._requests[i] = self._call(c, send, recv)
            except MPI.Exception as exc:
                self._fault = exc.Get_error_code()
                return FAULT
        return 0

    def _call(self, c, send, recv):
        """The call's request (MPI.REQUEST_NULL for a blocking call, complete)."""
        comm, op, blocking = self.comm, self.op, c.blocking
        if c.kind == "allreduce":
            call, args = (comm.Allreduce, comm.Iallreduce), (send, recv, op)
        elif c.kind == "reduce_scatter":
            call, args = (comm.Reduce_scatter_block, comm.Ireduce_scatter_block), \
                (send, recv, op)
        elif c.kind == "allgather":
            call, args = (comm.Allgather, comm.Iallgather), (send, recv)
        elif c.kind == "bcast":
            call, args = (comm.Bcast, comm.Ibcast), (recv, c.root)
        else:
            call, args = (comm.Reduce, comm.Ireduce), (send, recv, op, c.root)
        if blocking:
            call[0](*args)
            return MPI.REQUEST_NULL
        return call[1](*args)

    def test(self, first, n):
        try:
            return int(MPI.Request.Testall(self._requests[first:first + n]))
        except MPI.Exception as exc:
            self._fault = exc.Get_error_code()
            return FAULT

    def pending_peers(self, first, n):
        """None: the library does not say which ranks its collective waits for."""
        return None

    def fault(self) -> str:
        from ..mpi.names import describe_error
        code = self._fault if self._fault is not None else int(self._ctx[_ERROR])
        self._fault = None
        return f"the MPI library's collective failed: {describe_error(code)}"

    def free(self) -> None:
        self.compiled = None


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
                        at[c.recv] + c.recv_at, c.count, c.root, c.blocking)
             for c in plan.program.calls]
    return LibraryCollectives(site.comm, calls, plan.dtype, plan.op)
