"""The Algorithm record and the registries that name them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

__all__ = ["Algorithm", "ALGORITHMS", "COLLECTIVES", "register"]


@dataclass(frozen=True)
class Algorithm:
    """One way to run one collective.

    ``build(rank, size, count, itemsize, **options) -> Schedule`` (None for ``auto``,
    which picks another). ``cost(p, nbytes, alpha, beta, gamma, **options)`` is the
    closed-form alpha-beta-gamma time in seconds. ``library``: the schedule hands the call
    to the MPI library's own collective (``mpi``).
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
    library: bool = False

    @property
    def hand_written(self) -> bool:
        """Whether mlcomm's own schedule moves and reduces the data (not ``mpi``, not
        ``auto``)."""
        return self.build is not None and not self.library

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


def register(name, collective, build, cost, options=None, aliases=(), doc=None, context=(),
             library=False):
    """Add an algorithm to its collective's registry and return it."""
    algo = Algorithm(name, collective, " ".join((doc or build.__doc__ or "").split()),
                     build, cost, dict(options or {}), tuple(aliases), tuple(context), library)
    COLLECTIVES[collective][name] = algo
    return algo
