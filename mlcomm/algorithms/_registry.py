"""The Algorithm record and the registries that name them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

__all__ = ["Algorithm", "Layout", "ALGORITHMS", "COLLECTIVES", "register", "weighed"]


@dataclass(frozen=True)
class Layout:
    """Where a collective runs: ``size`` ranks on ``nodes`` (tuples of ranks; None: one node
    of every rank)."""

    size: int
    nodes: tuple | None = None

    @property
    def node_count(self) -> int:
        return 1 if self.nodes is None else len(self.nodes)

    @property
    def largest(self) -> int:
        """The most ranks on one node."""
        return self.size if self.nodes is None else max(map(len, self.nodes))


@dataclass(frozen=True)
class Algorithm:
    """One way to run one collective.

    ``build(rank, size, count, itemsize, **options) -> Schedule`` (None for ``auto``,
    which picks another). ``cost(p, nbytes, alpha, beta, gamma, **options)`` is the
    closed-form alpha-beta-gamma time in seconds. ``library``: the schedule hands the call
    to the MPI library's own collective (``mpi``).

    Where it applies is the entry's to say, from the algorithm's own file: ``refuse(layout,
    device)`` names why it cannot run on a :class:`Layout` (``device``: the buffers are on a
    GPU), None where it can (default: anywhere); ``weigh(layout, device)`` says whether
    ``auto`` weighs it where it can run (default: wherever it can). A schedule may run where
    ``auto`` does not weigh it: ``hierarchical`` on one node, where ``shared_memory`` is the
    window's schedule.
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
    refuse: Callable | None = None
    weigh: Callable | None = None

    @property
    def hand_written(self) -> bool:
        """Whether mlcomm's own schedule moves and reduces the data (not ``mpi``, not
        ``auto``)."""
        return self.build is not None and not self.library

    @property
    def flat(self) -> bool:
        """Whether it is hand-written and needs no node layout (``hierarchical``'s
        ``inter`` is one)."""
        return self.hand_written and not self.context

    @property
    def window(self) -> bool:
        """Whether it runs through the node's shared window (host buffers only)."""
        return "slot_bytes" in self.context

    def why_not(self, layout: Layout, device: bool = False) -> str | None:
        """Why it cannot run on ``layout`` (``device``: GPU buffers), else None."""
        return self.refuse(layout, device) if self.refuse else None

    def applies(self, layout: Layout, device: bool = False) -> bool:
        """Whether it can run on ``layout``."""
        return self.why_not(layout, device) is None

    def weighed(self, layout: Layout, device: bool = False) -> bool:
        """Whether ``auto`` weighs it on ``layout``: a hand-written schedule (``auto`` adds
        the library's own call itself, where the library supports the call) that applies
        there and that its ``weigh`` takes."""
        return self.hand_written and self.applies(layout, device) and \
            (self.weigh is None or bool(self.weigh(layout, device)))

    @property
    def __doc__(self):  # noqa: D105 - help(ALGORITHMS[name]) shows the algorithm's own doc
        return self.doc


COLLECTIVES: dict[str, dict[str, Algorithm]] = {
    "allreduce": {}, "reduce_scatter": {}, "allgather": {}, "bcast": {}, "reduce": {},
    "gather": {}, "scatter": {}, "alltoall": {},
    "allgatherv": {}, "reduce_scatter_v": {}, "gatherv": {}, "scatterv": {}, "alltoallv": {},
}
ALGORITHMS = COLLECTIVES["allreduce"]


def register(name, collective, build, cost, options=None, aliases=(), doc=None, context=(),
             library=False, refuse=None, weigh=None):
    """Add an algorithm to its collective's registry and return it."""
    algo = Algorithm(name, collective, " ".join((doc or build.__doc__ or "").split()),
                     build, cost, dict(options or {}), tuple(aliases), tuple(context), library,
                     refuse, weigh)
    COLLECTIVES[collective][name] = algo
    return algo


def weighed(layout: Layout, device: bool = False, collective: str = "allreduce") -> list:
    """The names of ``collective``'s algorithms that ``auto`` weighs on ``layout``, in
    registry order."""
    return [name for name, algo in COLLECTIVES[collective].items()
            if algo.weighed(layout, device)]
