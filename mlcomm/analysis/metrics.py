"""The notes' cost-table quantities, derived from the schedules that actually run."""

from __future__ import annotations

import numpy as np

from .simulator import UNIT_NETWORK, Network, Program, compile_schedules, simulate

__all__ = ["KEYS", "schedule_metrics", "analyze", "analyzable", "count_for"]

#: The keys of one ``mlcomm analyze`` row, in output order.
KEYS = ("algorithm", "ranks", "bytes", "rounds", "total_bytes_sent", "max_rank_bytes_sent",
        "max_rank_bytes_received", "max_fan_in", "max_round_bytes_in",
        "predicted_seconds", "formula_seconds")


def analyzable() -> list[str]:
    """Names of the all-reduce algorithms that have a schedule (not ``mpi``, not ``auto``)."""
    from ..algorithms import ALGORITHMS
    return [name for name, algo in ALGORITHMS.items() if algo.build is not None]


def count_for(nbytes: int, itemsize: int) -> int:
    """Return the element count of an ``nbytes`` message; it must be whole elements."""
    if nbytes % itemsize:
        raise ValueError(f"{nbytes} bytes is not a whole number of {itemsize}-byte elements")
    return nbytes // itemsize


def schedule_metrics(program: Program) -> dict:
    """Rounds, volumes and fan-in of a compiled program.

    ``rounds`` is the critical path counted in communication steps: the
    simulated time when every message costs 1 and ports are unlimited.  A
    message's round is the time it completes there; fan-in and bytes-in per
    round group a receiver's messages by that round.
    """
    p = program.size
    unit = simulate(program, UNIT_NETWORK)
    rounds = int(round(unit.seconds))
    nbytes = program.nbytes
    sent = np.bincount(program.src, weights=nbytes, minlength=p)
    received = np.bincount(program.dst, weights=nbytes, minlength=p)
    fan_in = round_in = 0
    if program.messages:
        msg_round = np.rint(unit.msg_end).astype(np.int64)
        key = program.dst * (rounds + 2) + msg_round
        round_in = int(np.bincount(key, weights=nbytes).max())
        pairs = np.unique(key * p + program.src)
        fan_in = int(np.bincount(pairs // p).max())
    return {
        "rounds": rounds,
        "total_bytes_sent": int(nbytes.sum()),
        "max_rank_bytes_sent": int(sent.max()) if p else 0,
        "max_rank_bytes_received": int(received.max()) if p else 0,
        "max_fan_in": fan_in,
        "max_round_bytes_in": round_in,
    }


def analyze(name: str, p: int, nbytes: int, *, itemsize: int = 8, profile=None,
            network: Network | None = None, options: dict | None = None,
            program: Program | None = None) -> dict:
    """Return one analysis row (the keys of :data:`KEYS`) for algorithm ``name``."""
    from ..algorithms import ALGORITHMS, build_schedules
    from ..profile import load_profile
    profile = profile or load_profile()
    network = network or Network.from_profile(profile)
    algo = ALGORITHMS[name]
    options = {k: v for k, v in (options or {}).items() if k in algo.options}
    row = dict.fromkeys(KEYS)
    row.update(algorithm=name, ranks=p, bytes=nbytes)
    if algo.build is not None:
        if program is None:
            count = count_for(nbytes, itemsize)
            program = compile_schedules(build_schedules(name, p, count, itemsize, **options), itemsize)
        row.update(schedule_metrics(program))
        row["predicted_seconds"] = simulate(program, network).seconds
    row["formula_seconds"] = float(algo.cost(p, nbytes, network.alpha, network.beta,
                                             network.gamma, **options))
    return row
