"""Predicted all-reduce time over rank counts and sizes: simulated, or closed form at scale."""

from __future__ import annotations

import time

from .metrics import analyzable, build_options, count_for, formula_seconds, not_applicable
from .simulator import Network, compile_schedules, critical_path, simulate

__all__ = ["SIM_LIMIT", "SIM_SECONDS", "estimate_work", "predict_time", "sweep", "SWEEP_KEYS"]

#: Simulate when p x (one rank's steps + transfers) is at most this and building
#: every rank's schedule is estimated to take at most SIM_SECONDS; above either
#: the closed form ``ALGORITHMS[name].cost`` takes over.
SIM_LIMIT = 1_100_000
SIM_SECONDS = 5.0

SWEEP_KEYS = ("algorithm", "ranks", "bytes", "seconds", "source", "formula_seconds")


def estimate_work(name: str, p: int, count: int, itemsize: int, options: dict) -> tuple[int, float]:
    """Estimate ``(schedule entries, build seconds)`` of all ranks from ranks 0, p/2 and p-1."""
    from ..algorithms import ALGORITHMS
    algo = ALGORITHMS[name]
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
                 ranks_per_node: int | None = None, breakdown: bool = False) -> dict:
    """One sweep row: the simulated time, or the closed form when the schedule is too big.

    ``ranks_per_node`` is the node layout of the algorithms that use one (default: one
    node); ``source`` says ``simulated``, ``formula`` (see
    :func:`~mlcomm.analysis.metrics.formula_seconds`) or, with no time, why the algorithm
    cannot run on the layout. ``breakdown`` adds a simulated row's
    :func:`~mlcomm.analysis.simulator.critical_path` under ``"critical_path"``.
    """
    from ..algorithms import ALGORITHMS, build_schedules
    algo = ALGORITHMS[name]
    why = not_applicable(name, p, ranks_per_node)
    if why:
        return {"algorithm": name, "ranks": p, "bytes": nbytes, "seconds": None,
                "source": why, "formula_seconds": None}
    opts = build_options(name, p, nbytes, itemsize=itemsize, options=options,
                         ranks_per_node=ranks_per_node, network=network)
    formula = formula_seconds(name, p, nbytes, network, opts, ranks_per_node)
    row = {"algorithm": name, "ranks": p, "bytes": nbytes, "seconds": formula,
           "source": "formula", "formula_seconds": formula}
    if not algo.hand_written:
        return row
    count = count_for(nbytes, itemsize)
    entries, build_seconds = estimate_work(name, p, count, itemsize, opts)
    if entries <= limit and build_seconds <= seconds:
        prog = compile_schedules(build_schedules(name, p, count, itemsize, **opts), itemsize)
        result = simulate(prog, network)
        row["seconds"] = result.seconds
        row["source"] = "simulated"
        if breakdown:
            row["critical_path"] = critical_path(prog, result, network)
    return row


def sweep(names, ranks, sizes, *, network: Network = Network(), itemsize: int = 8,
          options: dict | None = None, limit: int = SIM_LIMIT, seconds: float = SIM_SECONDS,
          progress=None, ranks_per_node: int | None = None) -> list[dict]:
    """Predict every (algorithm, ranks, bytes) combination; return the rows."""
    names = list(names or analyzable())
    rows = []
    for name in names:
        for p in ranks:
            for nbytes in sizes:
                rows.append(predict_time(name, p, nbytes, network=network, itemsize=itemsize,
                                         options=options, limit=limit, seconds=seconds,
                                         ranks_per_node=ranks_per_node))
                if progress is not None:
                    progress.update(1)
    return rows
