"""Resident memory of this process: now, and the peak since the last reset.

``ru_maxrss`` is a high-water mark over the whole process, so a later measurement inherits
every earlier peak. On Linux the mark can be reset (``/proc/self/clear_refs``, value 5) and read
back (``VmHWM`` in ``/proc/self/status``); elsewhere the peak falls back to ``ru_maxrss``.
"""

from __future__ import annotations

import resource
import sys

__all__ = ["current_bytes", "peak_bytes", "reset_peak"]

_STATUS = "/proc/self/status"


def _status_kib(field: str) -> int | None:
    try:
        with open(_STATUS, encoding="ascii") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def current_bytes() -> int | None:
    """Return the resident set size now (``VmRSS``), or None where it cannot be read."""
    kib = _status_kib("VmRSS")
    return None if kib is None else kib * 1024


def reset_peak() -> bool:
    """Reset the peak to the current resident size; return False where that is impossible."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def peak_bytes() -> int:
    """Return the peak resident set size since the last :func:`reset_peak` (or process start)."""
    kib = _status_kib("VmHWM")
    if kib is None:  # ru_maxrss counts KiB on Linux, bytes on macOS
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024
    return kib * 1024
