"""The MPI point-to-point transport: persistent requests.

:class:`PointToPoint` binds one persistent request per transfer (``Send_init``/``Recv_init``,
as bytes) once; the loops start and complete them by range. Completion is polled
(``MPI_Testall``), so a waiting loop can notice a stall, and every received message's size
is checked against the schedule (``MPI_Get_count`` on its status): a peer that called with
another count or dtype is caught instead of returning a wrong result.
"""

from __future__ import annotations

import ctypes
import numpy as np
from mpi4py import MPI
from numba import carray

from ..cabi import ccall2, ccall3, ccall4, i64_array_at
from .. import FAULT, Transport, compile_calls
from .names import describe_error, is_failure

__all__ = ["PointToPoint", "bind", "TAG"]

#: the tag of a program's messages (a watched wait's roll call has its own)
TAG = 0

# context words (int64) of a bound PointToPoint, read by the compiled start/test
_REQ_BYTES, _REQS, _STATUSES, _STATUS_BYTES, _STARTALL, _TESTALL, _GET_COUNT, _BYTE = range(8)
_FLAG, _FAULT, _FAULT_INDEX, _FAULT_VALUE, _COUNT, _SENT = 8, 9, 10, 11, 12, 13
_EXPECT = 16  # then one word per transfer: the bytes a receive expects; -(bytes + 1) a send
_SIZE_MISMATCH, _MPI_ERROR = 1, 2


def define(compile):
    """``(start, test)`` of this transport, as :func:`compile_calls` compiles them."""
    @compile
    def start(context, first, n):
        ctx = carray(i64_array_at(context), _EXPECT + first + n)
        err = ccall2(ctx[_STARTALL], n, ctx[_REQS] + first * ctx[_REQ_BYTES])
        if err != 0:
            ctx[_FAULT], ctx[_FAULT_INDEX], ctx[_FAULT_VALUE] = _MPI_ERROR, first, err
            return FAULT
        sent = carray(i64_array_at(ctx[_SENT]), 1)
        for i in range(n):
            if ctx[_EXPECT + first + i] < 0:
                sent[0] -= ctx[_EXPECT + first + i] + 1
        return 0

    @compile
    def test(context, first, n):
        ctx = carray(i64_array_at(context), _EXPECT + first + n)
        ctx[_FLAG] = 0
        err = ccall4(ctx[_TESTALL], n, ctx[_REQS] + first * ctx[_REQ_BYTES],
                     context + 8 * _FLAG, ctx[_STATUSES])
        if err != 0:
            ctx[_FAULT], ctx[_FAULT_INDEX], ctx[_FAULT_VALUE] = _MPI_ERROR, first, err
            return FAULT
        if ctx[_FLAG] & 0xFFFFFFFF == 0:
            return 0
        for i in range(n):
            want = ctx[_EXPECT + first + i]
            if want >= 0:
                ctx[_COUNT] = 0
                ccall3(ctx[_GET_COUNT], ctx[_STATUSES] + i * ctx[_STATUS_BYTES], ctx[_BYTE],
                       context + 8 * _COUNT)
                got = ctx[_COUNT] & 0xFFFFFFFF
                if got >= 0x80000000:
                    got -= 0x100000000
                if got != want:
                    ctx[_FAULT], ctx[_FAULT_INDEX], ctx[_FAULT_VALUE] = \
                        _SIZE_MISMATCH, first + i, got
                    return FAULT
        return 1

    return start, test


class PointToPoint(Transport):
    """Persistent requests for a program's transfers on ``comm`` (see the module docstring).

    ``message(transfer)`` gives the buffer each request uses, as mpi4py takes it (an
    ``MPI.buffer`` over host memory, or a device array on a CUDA-aware MPI). Every byte
    sent is added to ``sent[0]`` (a session's counters, :data:`mlcomm.transport.PATHS`,
    whose first is ``messages``).
    """

    def __init__(self, comm, transfers, message, sent=None):
        self.comm, self.transfers = comm, tuple(transfers)
        self.requests = [(comm.Recv_init if t.recv else comm.Send_init)(
            [message(t), MPI.BYTE], t.peer, TAG) for t in self.transfers]
        widest = max(len(self.transfers), 1)  # statuses for the widest range
        self.statuses = [MPI.Status() for _ in range(widest)]
        self._ranges = {}
        self._fault = None
        self._ctx = None
        self.sent = np.zeros(1, np.int64) if sent is None else sent
        self.compiled = self._context(widest)

    def _context(self, widest):
        """The int64 context the compiled start/test read (None when they are unavailable)."""
        from ..libmpi import MPILibraryError, symbol
        try:
            fns = [symbol(f"MPI_{n}") for n in ("Startall", "Testall", "Get_count")]
        except MPILibraryError:
            return None
        req_bytes, status_bytes = MPI._sizeof(MPI.Request), MPI._sizeof(MPI.Status)
        self._handles = np.zeros(max(len(self.requests), 1) * req_bytes, np.uint8)
        for i, req in enumerate(self.requests):
            self._handles[i * req_bytes:(i + 1) * req_bytes] = np.frombuffer(
                ctypes.string_at(MPI._addressof(req), req_bytes), np.uint8)
        self._status_words = np.zeros(widest * status_bytes, np.uint8)
        ctx = np.zeros(_EXPECT + len(self.transfers), np.int64)
        ctx[:8] = [req_bytes, _address(self._handles), _address(self._status_words),
                   status_bytes, *fns, MPI._handleof(MPI.BYTE)]
        ctx[_SENT] = _address(self.sent)
        ctx[_EXPECT:] = [t.nbytes if t.recv else -t.nbytes - 1 for t in self.transfers]
        self._ctx = ctx
        return (_address(ctx), *compile_calls(define))

    def _slice(self, first, n):
        reqs = self._ranges.get((first, n))  # a WAIT may span several STARTs' ranges
        if reqs is None:
            reqs = self._ranges[first, n] = self.requests[first:first + n]
        return reqs

    def start(self, first, n):
        try:
            MPI.Prequest.Startall(self._slice(first, n))
        except MPI.Exception as exc:
            self._fault = (_MPI_ERROR, first, exc.Get_error_code())
            return FAULT
        self.sent[0] += sum(t.nbytes for t in self.transfers[first:first + n] if not t.recv)
        return 0

    def test(self, first, n):
        statuses = self.statuses[:n]
        try:
            if not MPI.Request.Testall(self._slice(first, n), statuses):
                return 0
        except MPI.Exception as exc:
            self._fault = (_MPI_ERROR, first, exc.Get_error_code())
            return FAULT
        for i, status in enumerate(statuses):
            t = self.transfers[first + i]
            if t.recv and status.Get_count(MPI.BYTE) != t.nbytes:
                self._fault = (_SIZE_MISMATCH, first + i, status.Get_count(MPI.BYTE))
                return FAULT
        return 1

    def pending_peers(self, first, n):
        return sorted({t.peer for t, req in zip(self.transfers[first:first + n],
                                                self._slice(first, n))
                       if not req.Get_status()})

    def failed(self) -> bool:
        raw = self._fault is None
        kind, index, value = (tuple(int(v) for v in self._ctx[[_FAULT, _FAULT_INDEX,
                                                               _FAULT_VALUE]])
                              if raw else self._fault)
        if kind != _MPI_ERROR:
            return False
        return is_failure(value) or value == MPI.ERR_IN_STATUS and any(
            is_failure(err) for _, err in self._errors(index, raw))

    def fault(self) -> str:
        raw = self._fault is None  # the compiled calls left it in the context
        kind, index, value = (tuple(int(v) for v in self._ctx[[_FAULT, _FAULT_INDEX,
                                                               _FAULT_VALUE]])
                              if raw else self._fault)
        self._fault = None
        if kind == _SIZE_MISMATCH:
            t = self.transfers[index]
            return (f"received {value} bytes from rank {t.peer} where the schedule expects "
                    f"{t.nbytes}")
        if value != MPI.ERR_IN_STATUS:
            return f"MPI error: {describe_error(value)}"
        found = []
        for i, err in self._errors(index, raw):
            t = self.transfers[index + i]
            found.append(f"a message from rank {t.peer} is longer than the {t.nbytes} "
                         f"bytes the schedule expects"
                         if MPI.Get_error_class(err) == MPI.ERR_TRUNCATE
                         else f"transfer with rank {t.peer}: {describe_error(err)}")
        return "; ".join(found) or f"MPI error: {describe_error(value)}"

    def _errors(self, index, raw):
        """``(i, error)`` of each transfer from ``index`` whose status holds an error (the
        compiled calls left the statuses in their words where ``raw``)."""
        for i, status in enumerate(self.statuses[:len(self.transfers) - index]):
            if raw:
                size = MPI._sizeof(MPI.Status)
                ctypes.memmove(MPI._addressof(status), _address(self._status_words) + i * size,
                               size)
            err = status.Get_error()
            if err not in (MPI.SUCCESS, MPI.ERR_PENDING):
                yield i, err

    def free(self):
        if not MPI.Is_finalized():
            for req in self.requests:
                if req:
                    req.Free()
        self.requests, self._ranges, self.compiled = [], {}, None


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def bind(site) -> PointToPoint:
    """The persistent requests of ``site``'s program's transfers (:class:`mlcomm.transport.Site`)."""
    return PointToPoint(site.comm, site.plan.program.transfers, site.message, site.moved)
