"""The process-wide binding cache: every session's bindings, bounded in bytes.

Bindings (:mod:`mlcomm.runtime.binding`) are kept by session, plan and buffer pair, bounded
with every other session's by ``MLCOMM_CACHE_BYTES`` (default 256 MiB), least recently used
first out. The bound counts their scratch and device vectors, :data:`BINDING_BYTES` each for
their own objects, and the node windows of the live sessions. The host bindings of one plan
share one scratch buffer; an evicted binding's bound calls go with it (:mod:`.memo`), and a
binding too large for the bound alone is not kept.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict

from numpy import ndarray

from .. import config
from ..runtime.binding import Binding, buffer_key
from . import memo

__all__ = ["CACHE_BYTES", "BINDING_BYTES", "BINDINGS", "LIVE", "cache_bytes", "own_bytes",
           "cached_bytes", "held", "describe_held", "binding", "keep", "cached",
           "bindings_of", "drop_session"]

#: MLCOMM_CACHE_BYTES when unset
CACHE_BYTES = 256 << 20

#: what a cached binding counts for its own objects beside its scratch: its MPI requests,
#: transports' contexts, frames and Python objects (docs/design.rst, "Sessions")
BINDING_BYTES = 32 << 10


def cache_bytes() -> int:
    """The bound on what the binding cache holds: ``MLCOMM_CACHE_BYTES`` or 256 MiB."""
    return config.cache_bytes(CACHE_BYTES)


class _Entry:
    __slots__ = ("binding", "session", "scratch_key")


class BindingCache:
    """Every session's cached bindings, least recently used first, and the bytes of the
    scratch and device vectors they hold (each session's ``shared`` says which bindings
    share which)."""

    __slots__ = ("entries", "own", "scratch", "vectors")

    def __init__(self):
        #: (session id, plan key, buffer key) -> _Entry
        self.entries: "OrderedDict[tuple, _Entry]" = OrderedDict()
        self.scratch = 0  # bytes of the cached bindings' scratch
        self.vectors = 0  # bytes of the device vectors they keep alive
        self.own = 0  # bytes of their own objects (:func:`own_bytes`)


#: process-wide: ``MLCOMM_CACHE_BYTES`` bounds this process's memory over all its sessions
BINDINGS = BindingCache()
#: every live session of this process, whose node windows the bound counts
LIVE: "weakref.WeakSet" = weakref.WeakSet()


def own_bytes(binding) -> int:
    """What a binding counts for its own objects: :data:`BINDING_BYTES`, and its frames for
    other areas of the window (:attr:`mlcomm.runtime.binding.Binding.areas_nbytes`)."""
    return BINDING_BYTES + binding.areas_nbytes


def _windows() -> int:
    """Bytes of the node windows of every live session (this rank's segment of each)."""
    return sum(s.window_bytes() for s in list(LIVE) if not s.freed)


def cached_bytes() -> int:
    """Bytes the binding cache holds now, over every session: the cached bindings' scratch,
    device vectors and own objects (:func:`own_bytes`), and the node windows."""
    return BINDINGS.scratch + BINDINGS.vectors + BINDINGS.own + _windows()


def held() -> dict:
    """What the binding cache holds now, in bytes (``total`` is :func:`cached_bytes`, which
    ``bound`` bounds), with the count of ``bindings``."""
    parts = {"scratch": BINDINGS.scratch, "device vectors": BINDINGS.vectors,
             "bindings' own": BINDINGS.own, "windows": _windows()}
    return {"bound": cache_bytes(), "total": sum(parts.values()),
            "bindings": len(BINDINGS.entries), **parts}


def describe_held() -> str:
    """One line: the bound and what the binding cache holds now (``mlcomm info``)."""
    h = held()
    own = h["bindings' own"]
    return (f"{h['bound']} bytes bound (MLCOMM_CACHE_BYTES); holds {h['total']}: "
            f"{h['bindings']} bindings (scratch {h['scratch']}, device vectors "
            f"{h['device vectors']}, their own {own}), node windows {h['windows']}")


def _drop(key) -> None:
    """Free the cached binding under ``key`` (and its scratch if no other binding uses it),
    and forget the bound calls that run it, so that nothing keeps its memory alive."""
    entry = BINDINGS.entries.pop(key, None)
    if entry is None:
        return
    binding, session = entry.binding, entry.session
    BINDINGS.own -= own_bytes(binding)
    binding.free()
    memo.forget_binding(binding)
    shared = session.shared[entry.scratch_key]
    shared[2] -= 1
    if shared[2] == 0:
        del session.shared[entry.scratch_key]
        BINDINGS.scratch -= shared[0]
        BINDINGS.vectors -= shared[1]


def _evict_to(limit: int, keep) -> None:
    """Drop least recently used bindings until the cache fits ``limit``; never ``keep``
    nor a binding that a started non-blocking call is about to run."""
    entries = BINDINGS.entries
    # from the least recently used, starting over after each drop: a list of the keys
    # would cost a microsecond per entry (the ordered dict rehashes each key) on every call
    # once the cache is full, and it may hold thousands
    keys = iter(entries)
    while cached_bytes() > limit:
        key = next(keys, None)
        if key is None:
            return
        if key != keep and not entries[key].binding.busy:
            _drop(key)
            keys = iter(entries)


def _free_transports(transports) -> None:
    """Free an uncached binding's transports (once nothing runs it any more)."""
    for transport in transports:
        transport.free()


def binding(session, plan, inp, out):
    """``plan`` bound to ``inp``/``out`` in ``session``: the cached binding, or a new one
    sharing its plan's scratch with the plan's other host bindings. A new binding that does
    not fit the bound alone is not cached: it is freed once the call is done with it."""
    key = (id(session), plan.key, buffer_key(inp, out))
    entry = BINDINGS.entries.get(key)
    if entry is not None:
        BINDINGS.entries.move_to_end(key)
        return entry.binding
    device = not isinstance(out, ndarray)
    scratch_key = key if device else plan.key
    shared = session.shared.get(scratch_key)
    scratch = None if shared is None else session.scratch_of[plan.key]
    binding = Binding(session.comm, plan, inp, out, session.settings, scratch, session.moved,
                      session.window() if plan.program.node_size else None)
    vectors = inp.nbytes + out.nbytes if device else 0
    if not _put(session, key, binding, scratch_key, vectors, device):
        weakref.finalize(binding, _free_transports, binding.transports)
    return binding


def keep(session, binding, held_bytes: int) -> bool:
    """Cache ``binding``, bound by ``auto``'s trial to a host call's own buffers, as
    :func:`bind` would have bound it for that call; ``held_bytes``: the bytes its scratch
    keeps alive (a view of the trial's). False, and nothing cached, where a binding of its
    plan is cached already (they share one scratch) or it does not fit the bound."""
    plan = binding.plan
    if plan.key in session.shared:
        return False
    binding.nbytes = held_bytes
    return _put(session, (id(session), plan.key, binding.key), binding, plan.key, 0, False)


def cached(session, binding) -> bool:
    """Whether ``binding`` is in the cache (an uncached one is freed after its call)."""
    return (id(session), binding.plan.key, binding.key) in BINDINGS.entries


def _put(session, key, binding, scratch_key, vectors, device) -> bool:
    """Put a new binding in the cache under ``key``, sharing or first holding the scratch of
    ``scratch_key``; False where the first does not fit the bound alone."""
    shared = session.shared.get(scratch_key)
    bound = cache_bytes()
    if shared is None and binding.nbytes + vectors + own_bytes(binding) + _windows() > bound:
        return False
    if shared is None:
        session.shared[scratch_key] = [binding.nbytes, vectors, 1]
        BINDINGS.scratch += binding.nbytes
        BINDINGS.vectors += vectors
        if not device:
            session.scratch_of[binding.plan.key] = binding.scratch
    else:
        shared[2] += 1
    entry = _Entry()
    entry.binding, entry.session, entry.scratch_key = binding, session, scratch_key
    BINDINGS.entries[key] = entry
    BINDINGS.own += own_bytes(binding)
    _evict_to(bound, key)
    return True


def bindings_of(session) -> list:
    """``session``'s cached bindings, least recently used first."""
    return [e.binding for e in BINDINGS.entries.values() if e.session is session]


def drop_session(session) -> None:
    """Free every cached binding of ``session``."""
    for key in [k for k, e in BINDINGS.entries.items() if e.session is session]:
        _drop(key)
