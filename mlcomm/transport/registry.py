"""The transports by id: the factory that binds each transport id a program names.

A program (:mod:`mlcomm.ir.program`) names its transports by integer id in its START and
WAIT instructions; a binding (:mod:`mlcomm.runtime.binding`) asks this registry for each id
its program names and calls the entry's ``bind(site)`` (:class:`mlcomm.transport.Site`),
which returns the :class:`mlcomm.transport.Transport` the loops drive. One line here per
transport; :func:`register` adds one from anywhere else (a test, a plugin).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from ..ir.program import MPI_P2P, NATIVE, NODE, PEER
from . import Site, Transport, compile_calls, mpi, native, peer, window

__all__ = ["Entry", "TRANSPORTS", "register", "unregister", "bind", "load_compiled"]


class Entry(NamedTuple):
    """A registered transport: its name and its factory."""

    name: str
    #: ``bind(site)`` -> the :class:`mlcomm.transport.Transport` of one binding
    bind: Callable
    #: what :func:`~mlcomm.transport.compile_calls` compiles its C calls from, if it has any
    define: Callable | None = None


#: transport id -> :class:`Entry`
TRANSPORTS: dict = {}


def register(transport_id: int, name: str, factory: Callable, define=None) -> None:
    """Bind ``transport_id`` to ``factory`` (``factory(site)`` -> a transport), whose C
    calls, if any, :func:`~mlcomm.transport.compile_calls` compiles from ``define``."""
    if transport_id in TRANSPORTS:
        raise ValueError(f"transport id {transport_id} is {TRANSPORTS[transport_id].name!r} "
                         f"already")
    TRANSPORTS[transport_id] = Entry(name, factory, define)


def unregister(transport_id: int) -> None:
    """Forget ``transport_id`` (what :func:`register` added)."""
    del TRANSPORTS[transport_id]


def bind(transport_id: int, site: Site) -> Transport:
    """The transport of ``transport_id`` for ``site``."""
    entry = TRANSPORTS.get(transport_id)
    if entry is None:
        raise ValueError(f"{site.plan.describe()} names transport id {transport_id}, which "
                         f"no transport registers (mlcomm.transport.registry)")
    return entry.bind(site)


def load_compiled() -> None:
    """Compile (or load from Numba's disk cache) every transport's C calls, once per
    process: a first binding otherwise pays it, about a second in a new process."""
    for entry in list(TRANSPORTS.values()):
        if entry.define is not None:
            compile_calls(entry.define)


register(MPI_P2P, "mpi", mpi.bind, mpi.define)
register(NODE, "window", window.bind, window.define)
register(PEER, "peer", peer.bind, peer.define)
register(NATIVE, "native", native.bind, native.define)
