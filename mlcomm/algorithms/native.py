"""The MPI library's own collectives as baseline entries, ``auto``, and name lookup."""

import gc

from ._registry import COLLECTIVES, register
from .recursive_doubling import cost as _rd_cost
from .recursive_halving_doubling import cost as _rhd_cost

__all__ = ["MPI_NATIVE", "AUTO", "resolve", "build_schedules"]

MPI_NATIVE, AUTO = "mpi", "auto"


def _native_cost(p, nbytes, alpha, beta, gamma, **_):
    """MPICH and Open MPI pick recursive doubling or Rabenseifner by size: model the better."""
    return min(_rd_cost(p, nbytes, alpha, beta, gamma), _rhd_cost(p, nbytes, alpha, beta, gamma))


for _collective in COLLECTIVES:
    register(MPI_NATIVE, _collective, None, _native_cost, aliases=("native",),
             doc="The MPI library's own collective (MPI_Allreduce and friends), as the baseline.")
register(AUTO, "allreduce", None, _native_cost,
         doc="Pick the algorithm with the least predicted time for this size and rank count.")


def resolve(name: str, collective: str = "allreduce") -> str:
    """Return the canonical name for ``name`` or an alias; raise ValueError listing the valid names."""
    table = COLLECTIVES[collective]
    if name in table:
        return name
    for algo in table.values():
        if name in algo.aliases:
            return algo.name
    valid = ", ".join(sorted(table))
    raise ValueError(f"algorithm={name!r} is not a known {collective} algorithm; "
                     f"choose one of: {valid}")


def build_schedules(name, size, count, itemsize=8, collective="allreduce", **options):
    """Every rank's schedule of ``name`` for ``size`` ranks and ``count`` elements."""
    algo = COLLECTIVES[collective][resolve(name, collective)]
    if algo.build is None:
        raise ValueError(f"{algo.name!r} has no schedule: it is run by the MPI library or by selection")
    # Millions of small acyclic records: the cyclic GC would rescan them all as they pile up.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return [algo.build(r, size, count, itemsize, **options) for r in range(size)]
    finally:
        if was_enabled:
            gc.enable()
