"""Looking algorithms up by name: an alias's canonical name, and every rank's schedule."""

import gc

from ._registry import COLLECTIVES

__all__ = ["resolve", "build_schedules", "check_known"]


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


def check_known(name: str) -> None:
    """Raise ValueError where no collective has an algorithm ``name`` (or alias), listing
    the names there are (``auto`` is every collective's)."""
    tables = COLLECTIVES.values()
    if name == "auto" or any(name in t or any(name in a.aliases for a in t.values())
                             for t in tables):
        return
    known = sorted({n for t in tables for n in t})
    raise ValueError(f"algorithm={name!r} is not an algorithm of any collective; choose one "
                     f"of: {', '.join(known)}")


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
