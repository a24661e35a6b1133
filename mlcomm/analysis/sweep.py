"""Predicted time of a collective over rank counts and sizes: simulated, or closed form at
scale."""

from __future__ import annotations

import time

from .metrics import (analyzable, build_options, call_shape, count_for, formula_seconds,
                      not_applicable)
from .simulator import Network, compile_schedules, critical_path, simulate

__all__ = ["SIM_LIMIT", "SIM_SECONDS", "estimate_work", "predict_time", "sweep", "SWEEP_KEYS"]

#: Simulate when p x (one rank's steps + transfers) is at most this and building
#: every rank's schedule is estimated to take at most SIM_SECONDS; above either
#: the closed form ``COLLECTIVES[collective][name].cost`` takes over.
SIM_LIMIT = 1_100_000
SIM_SECONDS = 5.0

SWEEP_KEYS = ("algorithm", "ranks", "bytes", "seconds", "source", "formula_seconds")


def estimate_work(name: str, p: int, count: int, itemsize: int, options: dict,
                  collective: str = "allreduce") -> tuple[int, float]:
    """Estimate ``(schedule entries, build seconds)`` of all ranks from ranks 0, p/2 and p-1
    (``count``: the count the schedule takes)."""
    from ..algorithms import COLLECTIVES
    algo = COLLECTIVES[collective][name]
    if p <= 64:
        return 0, 0.0
    s0 = algo.build(0, p, count, itemsize, **options)  # also fills the builders' caches
    t0 = time.perf_counter()
    sm = algo.build(p // 2, p, count, itemsize, **options)
    sl = algo.build(p - 1, p, count, itemsize, **options)
    seconds = (time.perf_counter() - t0) / 2 * p
    per = max(len(s.steps) + sum(len(st.transfers) for st in s.steps) for s in (s0, sm, sl))
    return p * per, seconds


def predict_time(name: str, p: int, nbytes: int, *, network: Network = Network(),
                 itemsize: int = 8, options: dict | None = None,
                 limit: int = SIM_LIMIT, seconds: float = SIM_SECONDS,
                 ranks_per_node: int | None = None, breakdown: bool = False,
                 collective: str = "allreduce", estimate_only: bool = False) -> dict:
    """One sweep row of ``collective``'s algorithm ``name``, ``nbytes`` one rank's block (as
    :func:`~mlcomm.analysis.metrics.analyze` takes it): the simulated time, or the closed
    form when the schedule is too big.

    ``ranks_per_node`` is the node layout of the algorithms that use one (default: one
    node); ``source`` says ``simulated``, ``formula`` (see
    :func:`~mlcomm.analysis.metrics.formula_seconds`) or, with no time, why the algorithm
    cannot run on the layout; ``estimate_only``: ``simulated`` without simulating where the
    estimate allows it (its time the closed form's). ``breakdown`` adds a simulated row's
    :func:`~mlcomm.analysis.simulator.critical_path` under ``"critical_path"``.
    """
    from ..algorithms import COLLECTIVES, build_schedules
    algo = COLLECTIVES[collective][name]
    why = not_applicable(name, p, ranks_per_node, collective)
    if why:
        return {"algorithm": name, "ranks": p, "bytes": nbytes, "seconds": None,
                "source": why, "formula_seconds": None}
    opts = build_options(name, p, nbytes, itemsize=itemsize, options=options,
                         ranks_per_node=ranks_per_node, network=network, collective=collective)
    count = call_shape(algo, p, count_for(nbytes, itemsize))[0]
    formula = formula_seconds(name, p, count * itemsize, network, opts, ranks_per_node,
                              collective)
    row = {"algorithm": name, "ranks": p, "bytes": nbytes, "seconds": formula,
           "source": "formula", "formula_seconds": formula}
    if not algo.hand_written:
        return row
    entries, build_seconds = estimate_work(name, p, count, itemsize, opts, collective)
    if entries <= limit and build_seconds <= seconds and estimate_only:
        row["source"] = "simulated"
    elif entries <= limit and build_seconds <= seconds:
        prog = compile_schedules(build_schedules(name, p, count, itemsize, collective, **opts),
                                 itemsize)
        result = simulate(prog, network)
        row["seconds"] = result.seconds
        row["source"] = "simulated"
        if breakdown:
            row["critical_path"] = critical_path(prog, result, network)
    return row


def sweep(names, ranks, sizes, *, network: Network = Network(), itemsize: int = 8,
          options: dict | None = None, limit: int = SIM_LIMIT, seconds: float = SIM_SECONDS,
          progress=None, ranks_per_node: int | None = None,
          collective: str = "allreduce") -> list[dict]:
    """Predict every (algorithm, ranks, bytes) combination of ``collective``; return the
    rows."""
    names = list(names or analyzable(collective))
    rows = []
    for name in names:
        for p in ranks:
            for nbytes in sizes:
                rows.append(predict_time(name, p, nbytes, network=network, itemsize=itemsize,
                                         options=options, limit=limit, seconds=seconds,
                                         ranks_per_node=ranks_per_node,
                                         collective=collective))
                if progress is not None:
                    progress.update(1)
    return rows
