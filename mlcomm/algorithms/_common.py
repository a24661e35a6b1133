"""Helpers the algorithm modules share: option checks and cost terms."""

from __future__ import annotations

from itertools import accumulate
from math import ceil, log2
from numbers import Integral

__all__ = ["elements", "log2ceil", "check_int", "check_counts", "starts"]


def elements(name: str, nbytes, itemsize: int) -> int | None:
    """Turn the byte-size option ``name`` into whole elements (at least one); None stays None.

    Anything but a positive integer raises a ValueError that names the option.
    """
    if nbytes is None:
        return None
    if isinstance(nbytes, bool) or not isinstance(nbytes, Integral) or nbytes < 1:
        raise ValueError(f"{name}={nbytes!r}: give a positive whole number of bytes, "
                         f"e.g. {name}=65536, or leave it out")
    return max(1, int(nbytes) // itemsize)


def log2ceil(p: int) -> int:
    return ceil(log2(p)) if p > 1 else 0


def check_int(name: str, value, lo: int, hi: int, hint: str) -> int:
    """Return ``value`` as an int in [lo, hi] or raise ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{name}={value!r} is out of range: {hint} (allowed {lo}..{hi})")
    return value


def check_counts(name: str, counts, size: int, rank=None, count=None, missing="") -> tuple:
    """``counts`` as a tuple of ``size`` whole numbers >= 0 (a tuple: it is part of the
    plan's key), with ``counts[rank] == count`` where both are given; else a ValueError
    naming ``name``. ``missing``: why None is refused."""
    if counts is None:
        raise ValueError(f"{name}=None: {missing or 'it is required'}; give a tuple of "
                         f"{size} element counts, one per rank")
    if not isinstance(counts, tuple) or len(counts) != size:
        raise ValueError(f"{name}={counts!r}: give a tuple (it is part of the plan's key) of "
                         f"{size} element counts, one per rank, in rank order")
    for j, n in enumerate(counts):
        check_int(f"{name}[{j}]", n, 0, 1 << 62, "give a whole number of elements >= 0")
    if rank is not None and count is not None and counts[rank] != count:
        raise ValueError(f"{name}[{rank}]={counts[rank]} but count={count} on rank {rank}: "
                         f"this rank's entry of {name} must be its own block")
    return counts


def starts(counts) -> list:
    """Where each block of ``counts`` starts when packed, and the end."""
    return [0, *accumulate(counts)]
