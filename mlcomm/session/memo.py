"""The repeat memo: the bound calls of every session, found by the buffer they write.

A repeat of a call is looked up once, by :func:`key`: the buffer the call writes (bcast's
only buffer; an all-reduce into a new array: its input) and the algorithm named, so that
calls alternating algorithms on one buffer (as the benchmark does) keep a bound call each.
The bound call then checks that the call is the same objects again
(:class:`mlcomm.session.bound.BoundCall`). :data:`LAST` holds the ``repeat`` of the bound
call that ran last: trying it first skips the lookup, about a quarter of an 8-byte repeat.

Process-wide, as a repeat is looked up by its buffer before its communicator is known; at
most :data:`PER_PROCESS` bound calls, oldest first out.
"""

from __future__ import annotations

__all__ = ["MISS", "LAST", "CALLS", "PER_PROCESS", "key", "find", "remember", "forget",
           "forget_binding", "forget_session", "no_call"]

#: what a bound call's ``repeat`` returns for a call that is not its own
MISS = object()
#: the bound calls of every session by :func:`key`, oldest first
CALLS: dict = {}
PER_PROCESS = 64


def no_call(*args):
    """The ``repeat`` of no call: every call misses."""
    return MISS


#: ``[repeat]``: the ``repeat`` of the bound call that ran last (see the module docstring);
#: any other call makes it return :data:`MISS`
LAST: list = [no_call]


def key(sendbuf, recvbuf, algorithm) -> tuple:
    """The memo's key of a call: the id of the buffer it writes and the algorithm it names.
    Unique among live buffers; a dead buffer's id may come back, and the bound call's
    identity checks then miss."""
    return (id(sendbuf if recvbuf is None else recvbuf), algorithm)


def find(sendbuf, recvbuf, algorithm):
    """The bound call kept for this call's buffer and algorithm, or None."""
    return CALLS.get((id(sendbuf if recvbuf is None else recvbuf), algorithm))


def remember(k, bound) -> None:
    """Keep ``bound`` under ``k``, replacing the process's oldest beyond :data:`PER_PROCESS`."""
    forget(k)
    if len(CALLS) >= PER_PROCESS:
        forget(next(iter(CALLS)))
    CALLS[k] = bound
    bound.session.call_keys.add(k)


def forget(k) -> None:
    """Forget the bound call under ``k``: here, in its session's keys and in :data:`LAST`."""
    bound = CALLS.pop(k, None)
    if bound is not None:
        bound.session.call_keys.discard(k)
        if LAST[0] is bound.repeat:
            LAST[0] = no_call


def forget_binding(binding) -> None:
    """Forget the bound calls that run ``binding`` (it is being freed)."""
    for k in [k for k, b in CALLS.items() if b.binding is binding]:
        forget(k)


def forget_session(session) -> None:
    """Forget every bound call of ``session``."""
    for k in list(session.call_keys):
        forget(k)
