"""Sizes and dtypes as a command line writes them: parsed and formatted."""

from __future__ import annotations

import re

import numpy as np

__all__ = ["parse_size", "format_size", "parse_dtype"]

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text) -> int:
    """Parse a byte count written as ``8``, ``64K``, ``16M``, ``1G`` or ``4KiB``."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*", str(text), re.IGNORECASE)
    if not m:
        raise ValueError(f"not a size: {text!r} (write e.g. 8, 64K, 16M)")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def format_size(nbytes: int) -> str:
    """Write a byte count the short way: ``8``, ``64K``, ``16M``."""
    for unit in ("T", "G", "M", "K"):
        if nbytes and nbytes % _UNITS[unit] == 0:
            return f"{nbytes // _UNITS[unit]}{unit}"
    return str(nbytes)


def parse_dtype(name) -> np.dtype:
    """Return the NumPy dtype called ``name`` (``bfloat16`` via ml_dtypes)."""
    if str(name) == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)
