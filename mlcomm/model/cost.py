"""The cost model: each all-reduce's predicted time on a layout, and the model's choice.

A candidate's time is its closed form (the profile's alpha, beta and gamma) plus what the
loop adds per message step and per local op, and the local copies, counted on sampled
ranks' schedules. ``auto`` (:mod:`mlcomm.session.auto`) orders its trials by it, and takes
its choice where it measures nothing; ``mlcomm explain`` prints it.
"""

from __future__ import annotations

from functools import lru_cache

from ..algorithms import ALGORITHMS, MPI_NATIVE, Layout, resolve, weighed
from ..ir.schedule import INPUT, Copy, Recv, Send, owner
from .machine import DEFAULT_GAMMA, DEFAULT_OP_OVERHEAD, DEFAULT_STEP_OVERHEAD, load_profile

__all__ = ["predict", "explain", "flat_algorithms", "auto_candidates"]

_PREFER = ("recursive_doubling", "recursive_halving_doubling", "ring", "double_binary_tree",
           "parameter_server", "single_master", "naive")


@lru_cache(maxsize=512)
def _local_work(name: str, p: int, count: int, itemsize: int, nodes=None) -> tuple:
    """Message steps, local ops and copied bytes the closed forms omit, on the busiest
    sampled rank (node synchronisations and window copies are in the closed forms).

    Ranks 0, 1, p/2 and p-1 stand in for all: building every rank's schedule is O(p^2).
    """
    algo = ALGORITHMS[name]
    context = {"nodes": nodes} if "nodes" in algo.context else {}
    worst = (0, 0, 0.0)
    for rank in sorted({0, min(1, p - 1), p // 2, p - 1}):
        schedule = algo.build(rank, p, count, itemsize, **context)
        ops = [op for step in schedule.steps for op in step.ops
               if not any(owner(r.buffer) is not None for r in (op.dst, op.src))]
        # a copy from input is free in place but not out of place: count it half
        copied = sum(op.dst.count * (0.5 if op.src.buffer == INPUT else 1.0)
                     for op in ops if isinstance(op, Copy))
        steps = sum(1 for step in schedule.steps
                    if any(isinstance(t, (Send, Recv)) for t in step.transfers))
        work = (steps, len(ops), copied * itemsize)
        worst = max(worst, work, key=lambda w: (w[0] * DEFAULT_STEP_OVERHEAD
                                                 + w[1] * DEFAULT_OP_OVERHEAD + w[2] * DEFAULT_GAMMA))
    return worst


def flat_algorithms() -> list:
    """The hand-written all-reduces that need no node layout."""
    return [name for name, a in ALGORITHMS.items() if a.flat]


def auto_candidates(p: int, nodes=None, device: bool = False) -> list:
    """The all-reduces ``auto`` weighs for ``p`` ranks on ``nodes`` (None: one node): those
    whose registry entry weighs itself there (:meth:`~mlcomm.algorithms.Algorithm.weighed`),
    the flat ones everywhere and the node window's where it applies."""
    return weighed(Layout(p, nodes), device)


def predict(p: int, nbytes: int, *, profile=None, dtype=None, op=None,
            candidates=None, itemsize: int = 4, nodes=None) -> dict:
    """Predicted seconds of every candidate all-reduce on ``p`` ranks (``nodes``: the layout).

    The closed form (the profile's alpha, beta, gamma) plus what the loop adds per message
    step and per local op, and the local copies, counted on sampled ranks' schedules.
    """
    if profile is None:
        profile = load_profile()
    gamma = profile.gamma_for(dtype, op)
    names = candidates or flat_algorithms()
    out = {}
    for name in names:
        algo = ALGORITHMS[resolve(name)]
        options = dict(algo.options)
        if "nodes" in algo.context:
            options["nodes"] = nodes
        steps, ops, copied = _local_work(algo.name, p, nbytes // itemsize, itemsize,
                                         nodes if algo.context else None)
        out[algo.name] = float(algo.cost(p, nbytes, profile.alpha, profile.beta, gamma,
                                         **options)
                               + steps * profile.step_overhead + ops * profile.op_overhead
                               + copied * gamma)
    return out


def explain(p: int, nbytes: int, *, profile=None, dtype=None, op=None, candidates=None,
            itemsize: int = 4, nodes=None, device: bool = False):
    """Return ``(choice, {name: predicted seconds}, profile)`` for an all-reduce of ``nbytes``
    on ``p`` ranks laid out on ``nodes`` (None: one node).

    A tuned choice (``mlcomm tune``) for ``p`` wins over the predictions.
    """
    if profile is None:
        profile = load_profile()
    names = candidates or auto_candidates(p, nodes, device)
    tuned = profile.tuned_choice(p, nbytes)
    if tuned == MPI_NATIVE and not candidates:  # measured: the library was the fastest
        names = [*names, MPI_NATIVE]
    times = predict(p, nbytes, profile=profile, dtype=dtype, op=op, candidates=names,
                    itemsize=itemsize, nodes=nodes)
    if tuned in times:
        return tuned, times, profile
    # exact ties (p = 2, where several schedules coincide) go to the earlier name in _PREFER
    rank = {name: i for i, name in enumerate(_PREFER)}
    best = min(times.values())
    near = lambda t: round(t / best, 9) if best > 0 else t  # float noise is a tie
    choice = min(times, key=lambda name: (near(times[name]), rank.get(name, len(rank))))
    return choice, times, profile
