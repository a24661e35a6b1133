"""Which algorithm runs: explicit argument, then ``MLCOMM_ALGORITHM``, then ``auto``."""

from __future__ import annotations

import os

from .algorithms import AUTO, COLLECTIVES, resolve

__all__ = ["requested", "auto_choice"]


def requested(algorithm, collective: str) -> str:
    """The canonical name asked for (maybe ``auto``); raise ValueError for unknown names."""
    if algorithm is None:
        algorithm = os.environ.get("MLCOMM_ALGORITHM") or AUTO
    if collective != "allreduce" and algorithm == AUTO:
        return AUTO
    return resolve(algorithm, collective)


def auto_choice(collective: str, p: int, nbytes: int) -> str:
    """A fixed size/ranks rule: latency-optimal when small, bandwidth-optimal when large."""
    if collective != "allreduce":
        return next(name for name, a in COLLECTIVES[collective].items() if a.build is not None)
    if p == 1 or nbytes <= 4096:
        return "recursive_doubling"
    if nbytes <= 512 * 1024:
        return "recursive_halving_doubling"
    return "ring"
