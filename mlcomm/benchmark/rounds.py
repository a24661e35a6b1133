"""The timing rounds: how many calls per size, and the interleaved rounds that time them."""

from __future__ import annotations

import time

import numpy as np

from .config import default_iters

__all__ = ["BLOCKS", "interleaved"]

#: by default a round times a block of this share of :func:`default_iters`' calls
BLOCKS = 5


def _calls(cfg, nbytes: int) -> tuple[int, int, int]:
    """``(rounds, calls per round, warmup)`` of one size: ``cfg.rounds`` rounds, else a
    period of the round order, over which every algorithm follows every other equally
    often (:func:`mlcomm.session.auto.round_period`); ``cfg.iters`` calls split over them,
    else a block of a :data:`BLOCKS`-th of :func:`default_iters`' calls a round."""
    from ..session.auto import round_period
    iters, warmup = default_iters(nbytes, cfg.quick)
    rounds = cfg.rounds or round_period(len(cfg.algorithms))
    if cfg.iters is not None:
        iters = cfg.iters
        rounds = max(1, min(rounds, iters))
    per_round = -(-iters // rounds) if cfg.iters is not None else -(-iters // BLOCKS)
    return rounds, per_round, warmup if cfg.warmup is None else cfg.warmup


def interleaved(calls: dict, rounds: int, per_round: int, comm, sync) -> dict:
    """``{name: median seconds per call}``: ``rounds`` rounds, each timing every call
    ``per_round`` times after a barrier, in the order of :func:`mlcomm.session.auto.round_order`.

    Each timed block follows one untimed call of the same kind, so it measures the steady
    state of repeated calls (a training loop's), not a first call on memory that the
    previous block's algorithm pushed out of the caches.
    """
    from ..session.auto import round_order
    samples = {name: [] for name in calls}
    for k in range(rounds):
        for name in round_order(list(calls), k):
            call = calls[name]
            call()
            sync()
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(per_round):
                call()
            sync()
            samples[name].append((time.perf_counter() - t0) / max(per_round, 1))
    return {name: float(np.median(t)) for name, t in samples.items()}
