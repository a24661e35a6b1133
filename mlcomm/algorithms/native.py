"""The MPI library's own collectives as baseline entries (``mpi``)."""

from ..ir.schedule import INPUT, OUTPUT, Collective, Region, Schedule, Step
from ._registry import COLLECTIVES, register
from .recursive_doubling import cost as _rd_cost
from .recursive_halving_doubling import cost as _rhd_cost

__all__ = ["MPI_NATIVE", "native_cost", "native_schedule"]

MPI_NATIVE = "mpi"


def native_cost(p, nbytes, alpha, beta, gamma, **_):
    """MPICH and Open MPI pick recursive doubling or Rabenseifner by size: model the better."""
    return min(_rd_cost(p, nbytes, alpha, beta, gamma), _rhd_cost(p, nbytes, alpha, beta, gamma))


def _native_builder(collective):
    def build(rank, size, count, itemsize=8, root=0, blocking=False, counts=None,
              sendcounts=None, recvcounts=None):
        return native_schedule(collective, rank, size, count, itemsize, root, blocking,
                               counts, sendcounts, recvcounts)
    return build


for _collective in COLLECTIVES:
    register(MPI_NATIVE, _collective, _native_builder(_collective), native_cost,
             options={"blocking": False}, aliases=("native",), library=True,
             doc="The MPI library's own collective (MPI_Allreduce and friends): "
                 "non-blocking, polled as mlcomm's own calls are, or with blocking=True "
                 "the blocking call.")


def native_schedule(collective: str, rank: int, size: int, count: int, itemsize: int = 8,
                    root: int = 0, blocking: bool = False, counts=None, sendcounts=None,
                    recvcounts=None) -> Schedule:
    """``rank``'s schedule of the ``mpi`` algorithm: one step, the library's own
    ``collective`` on ``count`` elements, the count MPI takes (a reduce-scatter's block, an
    allgather's contribution, an all-to-all's block); the uneven forms' ``counts`` (the
    root's alone for gatherv and scatterv), or ``sendcounts`` and ``recvcounts``;
    ``blocking``: the blocking call, else the non-blocking one, polled."""
    if not isinstance(blocking, bool):
        raise ValueError(f"blocking={blocking!r}: give True or False")
    del itemsize  # the same schedule for every element size
    n_in, n_out = _extents(collective, rank, size, count, root, counts, sendcounts,
                           recvcounts)
    per_rank = tuple(sendcounts or ()) + tuple(recvcounts or ()) if \
        collective == "alltoallv" else tuple(counts or ())
    step = Step([Collective(collective, Region(INPUT, 0, n_in), Region(OUTPUT, 0, n_out),
                            count, root, blocking, per_rank)])
    return Schedule(rank, size, n_in, n_out, 0, [step])


def _extents(collective, rank, size, count, root, counts, sendcounts, recvcounts) -> tuple:
    """The ``(input, output)`` elements of the library's ``collective`` on this rank."""
    at_root = rank == root
    if collective == "alltoallv":
        return sum(sendcounts), sum(recvcounts)
    if collective in ("allgatherv", "reduce_scatter_v", "gatherv", "scatterv") and \
            counts is None and at_root:
        raise ValueError(f"{collective} needs counts: one count per rank")
    whole = sum(counts) if counts is not None else 0
    return {"reduce_scatter": (count * size, count),
            "allgather": (count, count * size),
            "reduce": (count, count if at_root else 0),
            "bcast": (count, count),
            "gather": (count, count * size if at_root else 0),
            "scatter": (count * size if at_root else 0, count),
            "alltoall": (count * size, count * size),
            "allgatherv": (count, whole),
            "reduce_scatter_v": (whole, count),
            "gatherv": (count, whole if at_root else 0),
            "scatterv": (whole if at_root else 0, count)}.get(collective, (count, count))
