"""Helpers the algorithm modules share: option checks and cost terms."""

from __future__ import annotations

from math import ceil, log2
from numbers import Integral

__all__ = ["elements", "log2ceil", "check_int"]


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
