"""Every ``MLCOMM_*`` environment variable mlcomm reads, parsed and checked in one place.

Each function reads its variable when called, so a value set before a call counts; a bad
value raises ValueError naming the variable. The kernels (``mlcomm.kernels``, which import
nothing of mlcomm) read their own four: ``MLCOMM_KERNEL``, ``MLCOMM_NUMBA_MIN_BYTES``,
``MLCOMM_NUM_THREADS`` and ``MLCOMM_LOCAL_SIZE``. :data:`VARIABLES` lists them all, with
their defaults, for ``mlcomm info``.
"""

from __future__ import annotations

import os
from typing import NamedTuple

__all__ = ["Variable", "VARIABLES", "current", "debug", "validate", "auto_mode",
           "cache_bytes", "agreed_raw", "AGREED", "positive", "executor", "stall_seconds",
           "stall_abort", "polls_before_yield", "staging_chunk_bytes", "cuda_aware",
           "single_copy", "profile_path"]


class Variable(NamedTuple):
    """One environment variable: its name, what applies when it is unset (a value as it
    would be set, or words), and what it sets."""

    name: str
    default: str
    what: str


#: name -> :class:`Variable`, for every ``MLCOMM_*`` variable mlcomm and its kernels read
VARIABLES = {v.name: v for v in (
    Variable("MLCOMM_ALGORITHM", "auto",
             "the algorithm a call without one runs (the same on every rank)"),
    Variable("MLCOMM_AUTO", "measure",
             "measure (time auto's candidates on a size's first call) or model"),
    Variable("MLCOMM_CACHE_BYTES", str(256 << 20), "the bound on the binding cache, in bytes"),
    Variable("MLCOMM_CUDA_AWARE", "auto",
             "1: the MPI library is CUDA-aware; 0: stage through host memory; auto: ask it"),
    Variable("MLCOMM_DEBUG", "0", "1: log auto's choices and new plans"),
    Variable("MLCOMM_EXECUTOR", "compiled", "compiled or python: the loop that runs programs"),
    Variable("MLCOMM_KERNEL", "auto",
             "numpy or numba: the CPU reduction kernels' backend (read by mlcomm.kernels)"),
    Variable("MLCOMM_LOCAL_SIZE", "the launcher's count",
             "ranks on this node, which share its cores (read by mlcomm.kernels)"),
    Variable("MLCOMM_NUMBA_MIN_BYTES", str(256 << 10),
             "the least bytes reduced by Numba's kernels (read by mlcomm.kernels)"),
    Variable("MLCOMM_NUM_THREADS", "cores / ranks on the node",
             "the Numba kernels' threads per rank (read by mlcomm.kernels)"),
    Variable("MLCOMM_POLLS_BEFORE_YIELD", "1024, 2 if oversubscribed",
             "polls of a wait between yields of the CPU (a power of two)"),
    Variable("MLCOMM_SLEEP_AFTER_US", "100 at 3 or more ranks a core, else 0 (never)",
             "microseconds a wait lasts before it sleeps between polls instead of yielding "
             "(ten times that on MPI messages)"),
    Variable("MLCOMM_PROFILE", "~/.cache/mlcomm/profile.json",
             "the profile file: the cost model's constants and tuned choices"),
    Variable("MLCOMM_RANKS_PER_NODE", "a machine's ranks",
             "nodes of this many consecutive ranks"),
    Variable("MLCOMM_SHM_BYTES", str(4 << 20), "each rank's slot in the node window, in bytes"),
    Variable("MLCOMM_SINGLE_COPY", "1", "0: no single-copy reads of a peer's memory"),
    Variable("MLCOMM_STAGING_CHUNK_BYTES", str(4 << 20),
             "bytes per chunk staged through host memory"),
    Variable("MLCOMM_STALL_ABORT", "0", "1: end the job after reporting a stalled wait"),
    Variable("MLCOMM_STALL_SECONDS", "60",
             "seconds a wait may last before it is reported (0: never)"),
    Variable("MLCOMM_VALIDATE", "0", "1: compare every call across ranks (read once, at import)"),
)}


def current() -> list:
    """``[(variable, its value here or None when unset), ...]`` for :data:`VARIABLES`."""
    return [(v, os.environ.get(v.name) or None) for v in VARIABLES.values()]


_TRUE = ("1", "yes", "true", "on")
_FALSE = ("0", "no", "false", "off")


def _raw(name: str) -> str:
    return os.environ.get(name, "").strip()


def debug() -> bool:
    """``MLCOMM_DEBUG=1``."""
    return os.environ.get("MLCOMM_DEBUG") == "1"


def validate() -> bool:
    """``MLCOMM_VALIDATE=1``."""
    return os.environ.get("MLCOMM_VALIDATE") == "1"


def auto_mode() -> str:
    """``MLCOMM_AUTO``: ``measure`` (the default) or ``model``."""
    raw = _raw("MLCOMM_AUTO").lower() or "measure"
    if raw not in ("measure", "model"):
        raise ValueError(f"MLCOMM_AUTO={raw!r}: use 'measure' (time the candidates on a "
                         f"size's first call, the default) or 'model' (the cost model alone)")
    return raw


def cache_bytes(default: int) -> int:
    """``MLCOMM_CACHE_BYTES``, else ``default``."""
    raw = _raw("MLCOMM_CACHE_BYTES")
    if not raw:
        return default
    if not raw.isdigit():
        raise ValueError(f"MLCOMM_CACHE_BYTES={raw!r}: give a number of bytes, e.g. "
                         f"{default} (the default, {default >> 20} MiB)")
    return int(raw)


#: the variables that must be the same on every rank, agreed when a session starts
AGREED = ("MLCOMM_ALGORITHM", "MLCOMM_RANKS_PER_NODE", "MLCOMM_SHM_BYTES")


def agreed_raw() -> tuple:
    """This rank's values of :data:`AGREED`, None where unset (parsed once agreed)."""
    return tuple(_raw(n) or None for n in AGREED)


def positive(name: str, raw: str) -> int:
    """``raw``, the value of ``name``, as a positive whole number."""
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"{name}={raw!r}: give a positive whole number")
    return int(raw)


def executor() -> str:
    """``MLCOMM_EXECUTOR``: ``compiled`` (the default) or ``python``."""
    value = os.environ.get("MLCOMM_EXECUTOR", "compiled").strip().lower() or "compiled"
    if value not in ("compiled", "python"):
        raise ValueError(f"MLCOMM_EXECUTOR={value!r}: choose compiled or python")
    return value


def _non_negative(name: str, default: float, fix: str) -> float:
    """The number >= 0 in the variable ``name``, else ``default``; ``fix`` says what to give."""
    raw = _raw(name)
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise ValueError(f"{name}={raw!r}: {fix}")
    return value


def stall_seconds(default: float = 60.0) -> float:
    """``MLCOMM_STALL_SECONDS``, else ``default``."""
    return _non_negative("MLCOMM_STALL_SECONDS", default,
                         "give a number of seconds (0 turns it off)")


def stall_abort() -> bool:
    """``MLCOMM_STALL_ABORT=1``."""
    return _raw("MLCOMM_STALL_ABORT") == "1"


def sleep_after_us(default: float) -> float:
    """``MLCOMM_SLEEP_AFTER_US`` (microseconds, 0: never), else ``default``."""
    return _non_negative("MLCOMM_SLEEP_AFTER_US", default,
                         "give microseconds >= 0, e.g. 100 (0: waits never sleep)")


def polls_before_yield(default: int) -> int:
    """``MLCOMM_POLLS_BEFORE_YIELD`` (a power of two), else ``default``."""
    raw = _raw("MLCOMM_POLLS_BEFORE_YIELD")
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < 1 or int(raw) & (int(raw) - 1):
        raise ValueError(f"MLCOMM_POLLS_BEFORE_YIELD={raw!r}: give a power of two, e.g. 16")
    return int(raw)


def staging_chunk_bytes(default: int) -> int:
    """``MLCOMM_STAGING_CHUNK_BYTES``, else ``default``."""
    raw = _raw("MLCOMM_STAGING_CHUNK_BYTES")
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise ValueError(f"MLCOMM_STAGING_CHUNK_BYTES={raw!r}: give a positive number of bytes, "
                         f"e.g. {default} (the default, {default >> 20} MiB), the same on "
                         f"every rank")
    return int(raw)


def cuda_aware():
    """``MLCOMM_CUDA_AWARE``: ``(True or False, its text)`` when set, ``(None, None)`` when
    unset or ``auto`` (probe the library)."""
    raw = os.environ.get("MLCOMM_CUDA_AWARE")
    value = "" if raw is None else raw.strip().lower()
    if value in _TRUE:
        return True, raw
    if value in _FALSE:
        return False, raw
    if value not in ("", "auto"):
        raise ValueError(f"MLCOMM_CUDA_AWARE={raw!r}: use 1 (CUDA-aware MPI), 0 (stage through "
                         f"host memory) or leave it unset to probe")
    return None, None


def single_copy() -> bool:
    """False under ``MLCOMM_SINGLE_COPY=0``."""
    return _raw("MLCOMM_SINGLE_COPY") != "0"


def profile_path() -> str | None:
    """``MLCOMM_PROFILE``, else None."""
    return os.environ.get("MLCOMM_PROFILE") or None
