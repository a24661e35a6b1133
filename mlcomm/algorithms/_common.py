"""Helpers the algorithm modules share: option checks and cost terms."""

from __future__ import annotations

from math import ceil, log2

__all__ = ["elements", "log2ceil", "check_int"]


def elements(nbytes, itemsize: int) -> int | None:
    """Turn a byte-size option into whole elements (at least one); None stays None."""
    if nbytes is None:
        return None
    return max(1, int(nbytes) // itemsize)


def log2ceil(p: int) -> int:
    return ceil(log2(p)) if p > 1 else 0


def check_int(name: str, value, lo: int, hi: int, hint: str) -> int:
    """Return ``value`` as an int in [lo, hi] or raise ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ValueError(f"{name}={value!r} is out of range: {hint} (allowed {lo}..{hi})")
    return value
