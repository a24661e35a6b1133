"""The bound call: a checked call with its algorithm chosen and its plan bound, ready to run.

:func:`mlcomm.session.binder.bind` makes one from a :class:`~mlcomm.session.call.Call`;
:meth:`BoundCall.run` runs it and returns what the public function returns. A blocking
call that may repeat is then kept in the memo (:mod:`.memo`), and its repeats run through
:attr:`BoundCall.repeat`, which skips checks, choice and planning. A persistent handle runs
:meth:`BoundCall.runner`; a non-blocking call hands the bound call to the progress thread.
"""

from __future__ import annotations

import weakref

import numpy as np
from mpi4py import MPI
from numpy import ndarray

from . import cache, memo
from .memo import MISS

__all__ = ["BoundCall", "runner"]


def runner(session, run, binding, finish, result=None):
    """A no-argument call that runs a bound plan once more and returns ``result``: what a
    persistent handle and a repeat do on every call. A binding's loop runs straight away
    (a code other than 0 goes to its handler); without a binding (the mpi algorithm, a
    staged device call) ``run`` runs."""
    loop = run if binding is None else binding.loop
    trouble = None if binding is None else binding.trouble

    def call():
        if session.progress is not None:
            session.progress.drain()
        code = loop()
        if code:
            trouble(code)
        if finish is not None:
            finish()
        return result
    return call


class BoundCall:
    """One call, bound: ``run()`` runs it and returns its result.

    ``run``: runs the collective (a binding's ``run``, the library's call, or a staged
    device call); ``binding``: the plan's binding (None for the library's call and staged
    device calls); ``finish``: None or what completes the output after each run (avg's
    division); ``result``: what the call returns; ``returns``: ``run`` returns the result
    itself (a staged device call); ``fresh``: the bound call's own output where the caller
    gave none, whose copy each run returns; ``keeps``: the memo keeps it after its first
    run (it then holds the caller's buffers weakly, through :attr:`repeat`, and drops
    :attr:`call` and :attr:`result`); ``later``: where it ran into a new output of the
    caller's (a small all-reduce with none given), what binds the call's repeat to an output
    of its own (:data:`FRESH_BYTES`): the memo keeps it for the input's next call.
    """

    __slots__ = ("algorithm", "binding", "call", "finish", "fresh", "keeps", "later",
                 "options", "recv_ref", "repeat", "result", "returns", "run_", "send_ref",
                 "session", "__weakref__")

    def __init__(self, session, call, run, binding=None, finish=None, result=None, *,
                 returns=False, fresh=None, keeps=False, later=None):
        self.session, self.call, self.run_, self.binding = session, call, run, binding
        self.finish, self.result, self.returns = finish, result, returns
        self.fresh, self.keeps, self.later = fresh, keeps, later
        self.repeat = memo.no_call
        #: once kept: the call's algorithm, options and weak references to its buffers
        self.algorithm = self.options = self.send_ref = self.recv_ref = None

    def run(self):
        """Run the call once; return what the public function returns."""
        self.session.wait_started()
        returned = self.run_()
        if self.finish is not None:
            self.finish()
        if self.returns:
            return returned
        result = self.fresh.copy() if self.fresh is not None else self.result
        if self.keeps:
            self._remember()
        return result

    def runner(self):
        """:func:`runner` over this call: what a persistent handle calls."""
        return runner(self.session, self.run_, self.binding, self.finish, self.result)

    def _remember(self):
        """Keep this call in the memo, where its binding is cached (an uncached one is freed
        after its call)."""
        self.keeps = False
        if self.binding is not None and not cache.cached(self.session, self.binding):
            return
        c = self.call
        self.algorithm, self.options = c.algorithm, dict(c.options_given)
        self.send_ref, self.recv_ref = _ref(c.sendbuf), _ref(c.recvbuf)
        self.repeat = _repeater(self) if self.later is None else _rebinder(self)
        memo.remember(memo.key(c.sendbuf, c.recvbuf, c.algorithm), self)
        memo.LAST[0] = self.repeat  # the next call tries it first
        self.call = self.result = None  # the caller's buffers are held weakly


def _repeater(bound):
    """The bound call's ``repeat``: one closure, since it is the whole cost of a repeated
    call. ``repeat(collective, sendbuf, recvbuf, op, comm, algorithm, root, options)`` runs
    the call and returns what the public call returns, where it is the same objects again
    (``is``, as NCCL's and Horovod's caches key on buffers: the collective, both buffers,
    held weakly, op, comm, algorithm and root; equal options); else :data:`MISS`.

    What can change in place is checked too: the dtype (a new size needs a resize, which
    NumPy refuses on a weakly referenced array); a tensor's storage (``set_``, ``resize_``).
    """
    call = bound.call
    collective, op, comm, root = call.collective, call.op, call.comm_given, call.root
    sendbuf, recvbuf = call.sendbuf, call.recvbuf
    algorithm, options, fresh = bound.algorithm, bound.options, bound.fresh
    binding, session, finish = bound.binding, bound.session, bound.finish
    send_ref, recv_ref = bound.send_ref, bound.recv_ref
    result = bound.result
    gives = 2 if result is recvbuf and result is not None else \
        1 if result is sendbuf and result is not None else 0
    run = runner(session, bound.run_, binding, finish)
    loop = bound.run_ if binding is None else binding.loop
    send, send_memory = _layout(sendbuf)
    recv, recv_memory = _layout(recvbuf)
    del call, sendbuf, recvbuf, result  # held weakly

    def repeat(collective_, sendbuf, recvbuf, op_, comm_, algorithm_, root_, options_):
        if (recv_ref() is not recvbuf or send_ref() is not sendbuf or op_ is not op
                or algorithm_ is not algorithm or comm_ is not comm
                or collective_ is not collective or root_ != root or options_ != options
                or (binding is not None and not binding.live)
                or (send is not None and sendbuf.dtype is not send)
                or (recv is not None and recvbuf.dtype is not recv)
                or (send_memory is not None
                    and (sendbuf.data_ptr(), sendbuf.numel()) != send_memory)
                or (recv_memory is not None
                    and (recvbuf.data_ptr(), recvbuf.numel()) != recv_memory)):
            return MISS
        if finish is None and session.progress is None:  # the runner's usual call, inline
            code = loop()
            if code:
                binding.trouble(code)
        else:
            run()
        if fresh is not None:
            return fresh.copy()
        return recvbuf if gives == 2 else sendbuf if gives == 1 else None
    return repeat


def _rebinder(bound):
    """The ``repeat`` of a small all-reduce that ran into a new array: the same call on the
    same input again binds it to an output of its own (``bound.later``), whose bound call
    takes this one's place in the memo; this one then misses every call."""
    call, later = bound.call, bound.later
    collective, op, comm, algorithm, root = call.collective, call.op, call.comm_given, \
        call.algorithm, call.root
    options, send_ref, dtype = bound.options, bound.send_ref, call.sendbuf.dtype
    done = []

    def repeat(collective_, sendbuf, recvbuf, op_, comm_, algorithm_, root_, options_):
        if (done or send_ref() is not sendbuf or recvbuf is not None or op_ is not op
                or algorithm_ is not algorithm or comm_ is not comm or root_ != root
                or collective_ is not collective or options_ != options
                or sendbuf.dtype is not dtype):
            return MISS
        done.append(True)
        return later(collective, sendbuf, op, comm, algorithm, root, options_)
    return repeat


def _layout(buf):
    """``(dtype, memory)`` a repeat must find unchanged: an array's dtype; a tensor's dtype
    and ``(data_ptr, numel)``; nothing for other buffers."""
    if type(buf) is ndarray:
        return buf.dtype, None
    if hasattr(buf, "data_ptr") and hasattr(buf, "numel"):
        return buf.dtype, (buf.data_ptr(), buf.numel())
    return None, None


def _ref(obj):
    """A weak reference to ``obj``, or a call returning it for None and MPI.IN_PLACE."""
    if obj is None or obj is MPI.IN_PLACE:
        return lambda: obj
    return weakref.ref(obj)


def remembers(result, sendbuf, recvbuf) -> bool:
    """Whether a bound call can return ``result`` on a repeat without keeping anything
    alive: the caller's own buffer, or None."""
    return result is None or (result is recvbuf or result is sendbuf) and result is not None


#: an all-reduce into a new array of at most this many bytes runs bound to an output of its
#: own, whose copy each call returns, so that its repeats run bound
FRESH_BYTES = 64 << 10


def fresh(collective, sendbuf, recvbuf, out) -> bool:
    """Whether a call runs bound to an output of its own (:data:`FRESH_BYTES`)."""
    return collective == "allreduce" and recvbuf is None and type(sendbuf) is np.ndarray \
        and type(out) is np.ndarray and out.nbytes <= FRESH_BYTES
