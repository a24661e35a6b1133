"""What one ``mlcomm bench`` run sweeps: sizes, calls per size, algorithms and their options."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .baseline import BASELINE

__all__ = ["BenchConfig", "size_list", "default_iters", "resolve_algorithms", "options_for",
           "left_out"]


def size_list(min_bytes: int, max_bytes: int, factor: float, itemsize: int) -> list[int]:
    """Return the swept message sizes in bytes, whole elements, no repeats."""
    if min_bytes < 0 or max_bytes < min_bytes:
        raise ValueError(f"bad size range {min_bytes}..{max_bytes}")
    if factor <= 1:
        raise ValueError("--factor must be > 1")
    sizes, n = [], min_bytes
    if n == 0:
        sizes.append(0)
        n = itemsize
    while n <= max_bytes:
        b = max(itemsize, n // itemsize * itemsize)
        if b <= max_bytes and (not sizes or b > sizes[-1]):
            sizes.append(b)
        n = max(n + 1, int(n * factor))
    return sizes


def default_iters(nbytes: int, quick: bool = False) -> tuple[int, int]:
    """Return ``(iters, warmup)`` for one size: many for small messages, few for large."""
    cap, budget, floor = (40, 8 << 20, 3) if quick else (200, 64 << 20, 5)
    iters = max(floor, min(cap, budget // max(nbytes, 1)))
    return iters, max(1 if quick else 2, iters // 4)


def resolve_algorithms(spec, collective: str = "allreduce") -> list[str]:
    """Return the algorithm names of ``collective`` to run: ``mpi`` first, then ``spec``.

    ``spec`` is ``all`` (or None: every algorithm of the collective's registry, ``auto``
    last), ``"A,B"`` or a list of names; aliases are resolved and an unknown name is a
    ValueError naming the known ones.
    """
    from ..algorithms import AUTO, COLLECTIVES, resolve
    table = COLLECTIVES[collective]
    if spec in (None, "", "all"):
        names = [n for n in table if n not in (BASELINE, AUTO)] + [AUTO]
    else:
        items = spec.split(",") if isinstance(spec, str) else spec
        names = [s.strip() if s.strip() == AUTO else resolve(s.strip(), collective)
                 for s in items if s.strip()]
    return [BASELINE] + [n for n in dict.fromkeys(names) if n != BASELINE]


def options_for(algorithms, options: dict, collective: str = "allreduce") -> dict:
    """``{algorithm: its share of options}`` (``--option``): each algorithm gets the keys it
    takes; a key that none of ``algorithms`` takes is a ValueError naming who takes what."""
    from ..algorithms import COLLECTIVES
    table = COLLECTIVES[collective]
    known = {name: table[name].options for name in algorithms if name in table}
    for key in options:
        if not any(key in opts for opts in known.values()):
            takes = "; ".join(f"{n}: {', '.join(sorted(o))}" for n, o in known.items() if o)
            raise ValueError(f"--option {key}: no algorithm of this run takes it "
                             f"({takes or 'none takes options'})")
    return {name: {k: v for k, v in options.items() if k in opts}
            for name, opts in known.items() if any(k in opts for k in options)}


@dataclass
class BenchConfig:
    """What one ``mlcomm bench`` run sweeps."""

    algorithms: list[str]
    sizes: list[int]
    dtype: np.dtype = field(default_factory=lambda: np.dtype("float32"))
    op: str = "sum"
    placements: tuple[bool, ...] = (False,)          # in_place values to run
    iters: int | None = None                         # None: per round, default_iters / BLOCKS
    warmup: int | None = None
    rounds: int | None = None                        # None: a period of the round order
    quick: bool = False
    check: bool = False
    device: str = "cpu"
    progress: bool = True
    options: dict = field(default_factory=dict)      # algorithm -> its options (options_for)
    collective: str = "allreduce"                    # a key of mlcomm.COLLECTIVES (calls.CALLS)


def left_out(algorithms, comm, device: bool, collective: str = "allreduce") -> dict:
    """``{name: why}`` for those of ``algorithms`` that cannot run on ``comm``'s node layout
    and buffers, as their entries in ``collective``'s registry say."""
    from ..algorithms import COLLECTIVES, Layout
    from ..session import session_of
    table = COLLECTIVES[collective]
    layout = Layout(comm.Get_size(), session_of(comm).nodes)
    why = {name: table[name].why_not(layout, device) for name in algorithms if name in table}
    return {name: reason for name, reason in why.items() if reason}
