"""Which algorithm runs: explicit argument, then ``MLCOMM_ALGORITHM``, then ``auto``.

``auto`` predicts every candidate with the cost model and takes the fastest.
"""

from __future__ import annotations

import logging
import os

from .algorithms import ALGORITHMS, AUTO, COLLECTIVES, resolve
from .profile import load_profile

log = logging.getLogger("mlcomm")

__all__ = ["requested", "auto_choice", "explain", "predict"]


def requested(algorithm, collective: str) -> str:
    """The canonical name asked for (maybe ``auto``); raise ValueError for unknown names."""
    if algorithm is None:
        algorithm = os.environ.get("MLCOMM_ALGORITHM") or AUTO
    if collective != "allreduce" and algorithm == AUTO:
        return AUTO
    return resolve(algorithm, collective)


_PREFER = ("recursive_doubling", "recursive_halving_doubling", "ring", "double_binary_tree",
           "parameter_server", "single_master", "naive")


def predict(p: int, nbytes: int, *, profile=None, dtype=None, op=None,
            candidates=None) -> dict:
    """Predicted seconds of every candidate all-reduce (closed forms, the profile's constants)."""
    if profile is None:
        profile = load_profile()
    gamma = profile.gamma_for(dtype, op)
    names = candidates or [name for name, a in ALGORITHMS.items() if a.build is not None]
    out = {}
    for name in names:
        algo = ALGORITHMS[resolve(name)]
        out[algo.name] = float(algo.cost(p, nbytes, profile.alpha, profile.beta, gamma,
                                         **algo.options))
    return out


def explain(p: int, nbytes: int, *, profile=None, dtype=None, op=None, candidates=None):
    """Return ``(choice, {name: predicted seconds}, profile)`` for an all-reduce of ``nbytes`` on ``p`` ranks."""
    if profile is None:
        profile = load_profile()
    times = predict(p, nbytes, profile=profile, dtype=dtype, op=op, candidates=candidates)
    # exact ties (p = 2, where several schedules coincide) go to the earlier name in _PREFER
    rank = {name: i for i, name in enumerate(_PREFER)}
    best = min(times.values())
    near = lambda t: round(t / best, 9) if best > 0 else t  # float noise is a tie
    choice = min(times, key=lambda name: (near(times[name]), rank.get(name, len(rank))))
    return choice, times, profile


def auto_choice(collective: str, p: int, nbytes: int, *, dtype=None, op=None) -> str:
    """The candidate with the least predicted time, as NCCL's tuner picks.

    Each all-reduce algorithm's closed-form cost is evaluated with the
    calibrated profile (``mlcomm calibrate``; built-in defaults without
    one).  ``MLCOMM_DEBUG=1`` logs every candidate's prediction.
    """
    if collective != "allreduce":
        return next(name for name, a in COLLECTIVES[collective].items() if a.build is not None)
    choice, times, profile = explain(p, nbytes, dtype=dtype, op=op)
    if os.environ.get("MLCOMM_DEBUG") == "1":
        ranked = ", ".join(f"{n}={t * 1e6:.1f}us" for n, t in sorted(times.items(), key=lambda kv: kv[1]))
        log.warning("mlcomm: auto p=%d bytes=%d -> %s (profile: %s; %s)",
                    p, nbytes, choice, profile.source, ranked)
    return choice
