"""The Algorithm record and the registries that name them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

__all__ = ["Algorithm", "ALGORITHMS", "COLLECTIVES", "register"]


@dataclass(frozen=True)
class Algorithm:
    """One way to run one collective.

    ``build(rank, size, count, itemsize, **options) -> Schedule`` is None for
    the MPI library's own call.  ``cost(p, nbytes, alpha, beta, gamma,
    **options)`` is the closed-form alpha-beta-gamma time in seconds.
    """

    name: str
    collective: str
    doc: str
    build: Callable | None
    cost: Callable
    options: dict = field(default_factory=dict)
    aliases: tuple = ()
    #: options the communicator's session supplies (its node layout, its window's slot
    #: size), not the caller
    context: tuple = ()

    @property
    def window(self) -> bool:
        """Whether it runs through the node's shared window (host buffers only)."""
        return "slot_bytes" in self.context

    @property
    def __doc__(self):  # noqa: D105 - help(ALGORITHMS[name]) shows the algorithm's own doc
        return self.doc


COLLECTIVES: dict[str, dict[str, Algorithm]] = {
    "allreduce": {}, "reduce_scatter": {}, "allgather": {}, "bcast": {}, "reduce": {},
}
ALGORITHMS = COLLECTIVES["allreduce"]


def register(name, collective, build, cost, options=None, aliases=(), doc=None, context=()):
    """Add an algorithm to its collective's registry and return it."""
    algo = Algorithm(name, collective, " ".join((doc or build.__doc__ or "").split()),
                     build, cost, dict(options or {}), tuple(aliases), tuple(context))
    COLLECTIVES[collective][name] = algo
    return algo
