"""Transports: what moves a program's transfers between ranks.

A program (:mod:`mlcomm.ir.program`) names transfers by index; a binding hands them, with the
buffers they read and write, to a transport, which the loops (:mod:`mlcomm.runtime.loop`) then drive
through two calls on index ranges:

- ``start(first, n)``: start transfers ``first .. first+n-1``; 0, or a fault code.
- ``test(first, n)``: 1 when all of them are complete (and were what the schedule expects),
  0 while some are pending, :data:`FAULT` when something went wrong; :meth:`Transport.fault`
  then says what.

The compiled loop makes the same two calls through C function addresses
(:attr:`Transport.compiled`: a context address and the addresses of ``start`` and ``test``,
each taking ``(context, first, n)`` as 64-bit words), so a new transport plugs in without
touching the loops or the algorithms. :mod:`mlcomm.transport.mpi` moves bytes with MPI
persistent point-to-point requests.

Each transport counts the bytes it moves between ranks into a session's int64 counters,
one per path of :data:`PATHS`; a byte is counted once, by the rank that moves it:

- ``messages``: the bytes of every message this rank sends (:mod:`~mlcomm.transport.mpi`);
- ``window``: the bytes this rank reads from its node peers' window slots
  (:mod:`~mlcomm.transport.window`, counted at a run's first post);
- ``single_copy``: the bytes this rank reads from or writes into its node peers' own
  buffers (:mod:`~mlcomm.transport.peer`).

The MPI library's own collectives (:mod:`~mlcomm.transport.native`) move bytes that the
library decides and does not report; they are not counted.

Each transport is a package here with a ``bind(site)`` that builds its :class:`Transport`
for one binding (:class:`Site`: the plan, the buffers, the communicator, the node window);
:mod:`mlcomm.transport.registry` maps each transport id a program names to that factory.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable

__all__ = ["Transport", "Site", "FAULT", "compile_calls", "PATHS", "MESSAGES", "WINDOW",
           "SINGLE_COPY"]

#: what ``test`` and ``start`` return when a transfer went wrong
FAULT = -1
#: the paths bytes move between ranks on, in the order of a session's counters
PATHS = ("messages", "window", "single_copy")
MESSAGES, WINDOW, SINGLE_COPY = range(3)


@lru_cache(maxsize=None)
def compile_calls(define):
    """The addresses of a transport's C ``start`` and ``test``: ``define(compile)`` returns
    the two, each a Python function of ``(context, first, n)`` decorated with ``compile``
    (a Numba ``cfunc`` returning int64, cached on disk). Compiled once per process for
    each ``define``; the functions must reference only module globals, never a closure
    cell, or Numba's disk cache keys every process anew (it hashes the cells' pickles)."""
    from numba import cfunc, types
    compile = cfunc(types.int64(types.int64, types.int64, types.int64), cache=True,
                    nopython=True)
    start, test = define(compile)
    return start.address, test.address


class Transport:
    """The interface every transport implements (see the module docstring)."""

    #: ``(context, start, test)`` addresses for the compiled loop, or None (Python loop only)
    compiled = None
    #: its waits need nothing of this rank (they watch memory its peers write), so a long
    #: one sleeps after ``sleep_after``; a wait on MPI requests, which move only while their
    #: rank polls them, after ten times that (:data:`mlcomm.runtime.frame.MESSAGE_SLEEP_FACTOR`)
    passive = False

    def start(self, first: int, n: int) -> int:
        raise NotImplementedError

    def test(self, first: int, n: int) -> int:
        raise NotImplementedError

    def pending_peers(self, first: int, n: int) -> list:
        """The peer ranks of the transfers in the range that are not complete yet."""
        raise NotImplementedError

    def fault(self) -> str:
        """What went wrong in the last call that returned :data:`FAULT`."""
        raise NotImplementedError

    def failed(self) -> bool:
        """Whether that fault is the MPI library's process-failure or revocation error
        (a fault-tolerant MPI's; :mod:`mlcomm.runtime.liveness`)."""
        return False

    def free(self) -> None:
        """Release the transport's handles; it is not used again."""


@dataclass(frozen=True)
class Site:
    """What a transport's ``bind(site)`` builds its :class:`Transport` on: one plan bound to
    one pair of buffers."""

    #: the communicator
    comm: Any
    #: the plan (:class:`mlcomm.runtime.plan.Plan`): its program, schedule, dtype and op
    plan: Any
    #: the host addresses of the program's buffers by id (input, output, scratch, then the
    #: window slots); ``[0, 0]`` on device buffers
    addresses: list
    #: ``message(transfer)``: a transfer's bytes as mpi4py takes them
    message: Callable
    #: the session's int64 counters, one per path of :data:`PATHS`
    moved: Any = None
    #: the node window (:class:`mlcomm.transport.window.NodeWindow`), or None
    window: Any = None
    #: the buffers are device vectors
    device: bool = False
