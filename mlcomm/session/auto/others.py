"""auto's timed trial for the collectives other than all-reduce.

Where rank 0 proposes candidates for one of them (:func:`~.policy._other_candidates`: the
model's cheapest by closed form, the node window's and the library's own call), every rank
binds each to buffers of its own call's shape (its count, its root, its counts), calls each
once, calls again those whose first call is within :data:`~.tuning.OTHER_FIRST_PRUNE` of the
fastest, then times the closest in rounds of interleaved blocks (:mod:`.rounds`), all
within all-reduce's budget: :data:`~.tuning.TRIAL_STEADY` calls of the fastest plus
:data:`~.tuning.TRIAL_FLOOR` seconds. Every decision is taken on the times reduced to the
slowest rank's, so the pick is the same on every rank.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from ... import config
from ...algorithms import MPI_NATIVE
from ...runtime.binding import host_scratch
from ...transport.registry import load_compiled
from . import tuning
from .agreement import _everywhere, _slowest
from .plans import plan_call
from .policy import _band_key, _label_of
from .rounds import _rounds, trial_pick

log = logging.getLogger("mlcomm")


def other_trial(session, collective, trial, count, dtype, op, shape, began=None) -> tuple:
    """Time ``trial``'s candidates (``[(name, options), ...]``, the model's order) for this
    call of ``collective`` on every rank; return the pick as ``(name, options)``, the same on
    every rank. ``count``: the count the ranks share (the band's); ``shape``: this rank's
    call as ``(count, input size, output size, offset, placed)``: ``offset`` the input's
    start in the output where in place (the output starts the array they share: an
    in-place reduce-scatter's is its input's first block), else None; ``placed`` the root
    and counts as the plan takes them. An even form's call of more than :data:`~.tuning.TRIAL_BYTES` a rank
    is timed on that many bytes a rank. What it timed is kept in ``session.trials``."""
    began = time.perf_counter() if began is None else began
    waited = time.perf_counter()
    session.wait_started()  # the session's set-up is not the trial's,
    load_compiled()  # nor the process's compiled code
    began += time.perf_counter() - waited
    n, in_size, out_size, offset, placed = _scaled(shape, dtype)
    if offset is None:  # written, as a caller's arrays are
        inp, out = np.ones(in_size, dtype), np.ones(out_size, dtype)
    else:  # in place: one array, as the call's (zeros, written: no sum overflows)
        base = np.full(max(in_size + offset, out_size), 0, dtype)
        inp, out = base[offset:offset + in_size], base[:out_size]
    bindings = {}
    try:
        plans = [plan_call(session, collective, name, n, dtype, op, dict(options, **placed),
                           offset) for name, options in trial]
        # one scratch, written once, serves them all (they run one at a time): no first
        # call pays the page faults of its own
        scratch = host_scratch(max(plan.program.counts[2] for plan in plans), dtype,
                               touched=True)
        for i, plan in enumerate(plans):
            bindings[i] = session.own_binding(plan, inp, out,
                                              scratch[:plan.program.counts[2]])
        # the budget holds the calls: the plans and bindings (one of which the call would
        # make anyway) are kept apart, in the record
        setup, began = time.perf_counter() - began, time.perf_counter()
        record, pick = _timed_pick(session, trial, bindings, n * dtype.itemsize, began)
        record["setup"] = setup
    finally:
        for binding in bindings.values():
            binding.free()
    session.remember_trial((collective, *_band_key(count, dtype, op)), record)
    if session.rank == 0 and config.debug():
        ranked = ", ".join(f"{label}={t * 1e6:.1f}us" for label, t in
                           sorted(record["median"].items(), key=lambda kv: kv[1]))
        log.warning("mlcomm: auto %s p=%d bytes=%d -> %s (measured; %s)", collective,
                    session.size, count * dtype.itemsize, record["pick"], ranked)
    return trial[pick]


def _scaled(shape, dtype) -> tuple:
    """``shape`` as the trial times it: an even form's call (no counts) of more than
    :data:`~.tuning.TRIAL_BYTES` a rank scaled down to that many bytes, its sizes and offset
    in proportion (where they are whole multiples of its count)."""
    count, in_size, out_size, offset, placed = shape
    n = max(1, tuning.TRIAL_BYTES // dtype.itemsize)
    sizes = (in_size, out_size, offset or 0)
    if any(k in placed for k in ("counts", "sendcounts", "recvcounts")) or count <= n or \
            any(size % count for size in sizes):
        return shape
    in_size, out_size, start = (size // count * n for size in sizes)
    return n, in_size, out_size, None if offset is None else start, placed


def _timed_pick(session, trial, bindings, nbytes, began) -> tuple:
    """``(record, pick)``: each candidate's first call, then those within
    :data:`~.tuning.OTHER_FIRST_PRUNE` of the fastest called again (once on each other area
    of the window where it rotates, then :data:`~.tuning.OTHER_WARM` times, from
    :data:`~.tuning.TRIAL_PROBE_BYTES` :data:`~.tuning.OTHER_WARM_LARGE`, while the budget
    holds them; the fastest always), then those within :data:`~.tuning.TRIAL_PRUNE` of the
    fastest in the rounds (:func:`~.rounds._rounds`); the pick is the least median
    (:func:`~.rounds.trial_pick`: the model's order breaks a tie), the index into
    ``trial``."""
    sync = lambda: session.watch.barrier(session.comm, "auto's trial", roll=False)
    k, large = len(trial), nbytes >= tuning.TRIAL_PROBE_BYTES
    passes = _everywhere(session, np.array([bindings[i].rotations - 1 for i in range(k)],
                                           np.int64))  # and the ranks lined up
    first = np.array([_timed(bindings[i].run) for i in range(k)])
    first, elapsed = _slowest(session, first, began)
    budget = tuning.TRIAL_STEADY * first.min() + tuning.TRIAL_FLOOR
    warm = tuning.OTHER_WARM_LARGE if large else tuning.OTHER_WARM
    warmed, planned, best = np.full(k, np.inf), elapsed, int(np.argmin(first))
    sync()
    for i in sorted(range(k), key=lambda i: first[i]):  # the same order on every rank
        cost = (warm + passes[i]) * first[i]  # the first call is the slowest, as a rule
        slow = large and trial[i][0] != MPI_NATIVE and \
            first[i] > tuning.OTHER_FIRST_PRUNE * first[best]
        if i != best and (slow or planned + cost > budget):
            continue
        planned += cost
        for _ in range(passes[i]):  # each area once: the first is slow
            bindings[i].run()
        warmed[i] = min(_timed(bindings[i].run) for _ in range(warm))
    warmed, elapsed = _slowest(session, warmed, began)
    basis = np.minimum(first, warmed)
    called = [i for i in range(k) if warmed[i] < np.inf]
    alive = [i for i in called if basis[i] <= tuning.TRIAL_PRUNE * basis[called].min()]
    alive, estimate, calls, elapsed, _ = _rounds(session, bindings, alive, basis, budget,
                                                 first[best], elapsed, began, sync, large)
    pick = alive[trial_pick([trial[i][1] for i in alive], [estimate[i] for i in alive])]
    labels = [_label_of(entry) for entry in trial]
    record = {"first": dict(zip(labels, first.tolist())),
              "warm": {labels[i]: float(warmed[i]) for i in called}, "warm_calls": warm,
              "calls": dict(zip(labels, calls.tolist())),
              "median": {labels[i]: float(estimate[i]) for i in called},
              "spent": elapsed, "budget": float(budget), "pick": labels[pick]}
    return record, pick


def _timed(run) -> float:
    """The seconds one ``run()`` takes."""
    start = time.perf_counter()
    run()
    return time.perf_counter() - start
