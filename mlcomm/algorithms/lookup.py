"""Looking algorithms up by name: an alias's canonical name, and every rank's schedule."""

import gc

from ._registry import COLLECTIVES

__all__ = ["resolve", "build_schedules"]


def resolve(name: str, collective: str = "allreduce") -> str:
    """Return the canonical name for ``name`` or an alias; raise ValueError listing the
    valid names."""
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
    if not algo.hand_written:
        raise ValueError(f"{algo.name!r} has no schedule of mlcomm's own: the MPI library "
                         f"runs it, or it picks another")
    # Millions of small acyclic records: the cyclic GC would rescan them all as they pile up.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return [algo.build(r, size, count, itemsize, **options) for r in range(size)]
    finally:
        if was_enabled:
            gc.enable()
