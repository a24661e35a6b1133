"""auto's timed trial, in steps: the probe, the finalists, the first calls, the rounds
(:mod:`.rounds`) and the decision, kept in ``session.trials``."""

from __future__ import annotations

import logging
import time

import numpy as np

from ... import config
from ...algorithms import MPI_NATIVE
from ...transport.registry import load_compiled
from . import tuning
from .agreement import _everywhere, _slowest
from .arena import _Arena
from .plans import distinct_plans
from .policy import BLOCKING, _band_key, _label_of, _way
from .rounds import _rounds, trial_pick

log = logging.getLogger("mlcomm")


def _trial(session, trial, count, dtype, op, buffers=None, began=None) -> tuple:
    """Time the candidates on every rank; return the fastest as ``(name, options)``, the same
    on every rank (every decision below is taken on times reduced to the slowest rank's, and
    on the slowest rank's clock).

    The trial, set-up included, aims at a budget: :data:`TRIAL_STEADY` calls of its fastest
    candidate plus :data:`TRIAL_FLOOR` seconds, counted from ``began`` (the call's start,
    by default now) less the session's set-up and loading the transports' compiled code.
    From :data:`TRIAL_PROBE_BYTES` on, the
    candidates are first timed on a sixteenth of the size (:func:`_probe`), which leaves the
    fastest of each way of moving data (:func:`_way`) within :data:`TRIAL_WAY_PRUNE` of the
    fastest, then the fastest of the rest up to :data:`TRIAL_FINALISTS` in all and more
    while the budget holds :data:`TRIAL_FINALIST_CALLS` full-size calls of each, the
    library's blocking call where it is within :data:`TRIAL_SETTLE` of the fastest, and the
    model's favourite, unless a form of it is among them (and none the model predicts
    :data:`TRIAL_MODEL_PRUNE` slower is probed). Each candidate left is bound at the full
    size; once the ranks are lined up, each is called once (after a probe, the fastest
    probed first and the library's calls last, unless settling; one but the first called,
    the model's favourite (unless the library's) and a settling library call only where
    the budget as it stands, less the seconds spent and a call to come, holds
    :data:`TRIAL_FIRST_CALLS` of its probe time scaled to the size), then
    once on each other area of
    the window where it rotates (as often on every rank: a node of one rank does not rotate;
    a first call on an area is slow), then
    :data:`TRIAL_WARM` times (after a probe :data:`TRIAL_WARM_LARGE` times, or once more
    where the budget holds it; neither where that first call took :data:`TRIAL_SLOW_FIRST`
    times the fastest call before it, unless it is the library's blocking call and the probe
    timed it within :data:`TRIAL_SETTLE` of the fastest), the fastest of those calls
    standing for it, the first included (setting up only adds to it); of those called
    again, the :data:`TRIAL_FINALISTS` fastest, those within :data:`TRIAL_PRUNE` of the
    fastest, such a library call and the model's favourite are then timed in rounds of
    interleaved blocks (a block lasts at least
    :data:`TRIAL_BLOCK_SECONDS`; one of fewer than :data:`TRIAL_BLOCK_CALLS` calls follows
    an untimed call), each round dropping those whose median is :data:`TRIAL_DROP` slower
    than the best, until one is left, the rounds are done or the budget, less its
    :data:`TRIAL_RESERVE` and the call to come (its binding and first call, or one call
    where the session keeps the trial's binding), would not hold another call of each
    (below TRIAL_PROBE_BYTES, after :data:`TRIAL_MIN_ROUNDS` rounds at least); the medians
    decide (:func:`trial_pick`), or
    the fastest calls where no round ran. An entry whose schedule is an earlier one's on
    every rank is not timed. What it timed is kept in ``session.trials`` by band. It runs on
    ``buffers`` (a call's input and output, or its one array in place) where given; there,
    at the full size, the session keeps the pick's binding as the call's
    (:meth:`~mlcomm.session.Session.keep_binding`). The constants are :mod:`.tuning`'s.
    """
    began = time.perf_counter() if began is None else began
    waited = time.perf_counter()
    session.wait_started()  # the session's set-up is not the trial's,
    load_compiled()  # nor the process's compiled code
    began += time.perf_counter() - waited
    n = max(1, min(count, tuning.TRIAL_BYTES // dtype.itemsize))
    arena = _Arena(session, dtype, n, buffers)
    try:
        return _measure(session, trial, count, dtype, op, arena, n, began)
    finally:
        arena.restore()  # an in-place call's array, however the trial ended


def _measure(session, trial, count, dtype, op, arena, n, began) -> tuple:
    """The trial (:func:`_trial`) on ``arena``, begun at ``began``, timing calls of ``n``
    elements at most."""
    sync = lambda: session.watch.barrier(session.comm, "auto's trial", roll=False)
    probes = [n // 16] if n * dtype.itemsize >= tuning.TRIAL_PROBE_BYTES else []
    record = {"probes": [int(m) for m in probes], "probed": [], "first": {}, "skipped": [],
              "warm": {}, "warm_calls": 0, "calls": {}, "median": {}}
    spare, settled = False, set()  # the library's blocking call where it settles
    probed = {}  # each finalist's probe time, scaled to the full size
    for m in probes:  # cheap calls on a smaller size thin out the candidates
        trial, probed, settled, spare, elapsed, budget = _probed(
            session, trial, dtype, op, arena, n, m, began, sync, record)
        if len(trial) == 1:
            return _decided(session, count, dtype, op, record, trial[0], elapsed, budget)
    trial, plans = distinct_plans(session, trial, n, dtype, op, arena.alias)
    # the library's own call, where the probe found it close to the fastest: no first call
    # rules it out
    settling = {i for i, entry in enumerate(trial) if entry in settled}
    arena.reserve([plans[entry] for entry in trial], n)
    warm = tuning.TRIAL_WARM_LARGE + spare if probes else tuning.TRIAL_WARM
    bindings, kept = {}, None
    try:
        order = _calling_order(trial, probed, settling)
        first, warmed, setup, elapsed, last = _first_calls(
            session, arena, [plans[entry] for entry in trial], n, bindings, settling, warm,
            began, order, [probed.get(entry) for entry in trial])
        # setting up only adds to a first call: where it was the faster, it stands
        basis = np.minimum(first, warmed)
        budget = tuning.TRIAL_STEADY * basis.min() + tuning.TRIAL_FLOOR
        # the call after the trial runs its pick, on this binding where the trial ran on
        # the call's own buffers (the session keeps it), else bound anew: the rounds leave
        # it that much
        ranked = np.argsort(basis, kind="stable")
        keeps = arena.calls and n == count
        coming = basis[ranked[0]] if keeps else setup[ranked[0]] + first[ranked[0]]
        alive, estimate, calls, elapsed, ran = _rounds(
            session, bindings, _contenders(ranked, basis, warmed, settling), basis, budget,
            coming, elapsed, began, sync, bool(probes))
        last = last if ran is None else ran
        pick = alive[trial_pick([trial[i][1] for i in alive], [estimate[i] for i in alive])]
        kept = bindings.pop(pick) if keeps else None
    finally:
        for binding in bindings.values():
            binding.free()
    if kept is not None and not session.keep_binding(kept, arena.scratch.nbytes):
        kept.free()
    elif kept is not None and last == pick and arena.alias is None:
        # out of place, the pick ran last on the call's own buffers: its output holds the
        # call's result, which the call then need not compute again
        session.held_result = kept
    _recorded(session, record, trial, first, warm, warmed, calls, estimate, pick,
              count * dtype.itemsize, n * dtype.itemsize)
    return _decided(session, count, dtype, op, record, trial[pick], elapsed, budget)


def _probed(session, trial, dtype, op, arena, n, m, began, sync, record) -> tuple:
    """The probe on ``m`` of the ``n`` elements: ``(finalists, probed, settled, spare,
    elapsed, budget)``, the finalists (:func:`_finalists`) in the model's order and the
    probe's time of each, the library's blocking call among them where it settles (probed
    within :data:`~.tuning.TRIAL_SETTLE` of the fastest), whether the budget holds a second
    warm call of each, and the model's favourite where probed within
    :data:`~.tuning.TRIAL_FAVOURITE_PRUNE` of the fastest, unless a form of it goes on; the
    seconds spent and the trial's budget, from the probe's fastest scaled to the size."""
    trial, plans = distinct_plans(session, trial, m, dtype, op, arena.alias)
    plans = [plans[entry] for entry in trial]
    start = time.perf_counter()
    touched = arena.reserve(plans, m)  # the seconds a byte of new memory costs, below
    faulting = (time.perf_counter() - start) / touched if touched else 0.0
    times, elapsed = _slowest(session, np.append(_probe(arena, plans, m, sync), faulting),
                              began)
    times, faulting = times[:-1], float(times[-1])
    record["probed"].append(dict(zip(map(_label_of, trial), times.tolist())))
    budget = tuning.TRIAL_STEADY * n / m * times.min() + tuning.TRIAL_FLOOR
    scratch = faulting * n / m * arena.itemsize * np.array(
        [plan.program.counts[2] for plan in plans], float)  # its full size's, in seconds
    ranked, left = _finalists(trial, times, scratch, n, m, budget, elapsed)
    # the library's own call, probed close to the fastest, goes on and settles (below)
    settle = {i for i, entry in enumerate(trial) if entry == (MPI_NATIVE, BLOCKING)
              and times[i] <= tuning.TRIAL_SETTLE * times.min()}
    ranked += sorted(settle - set(ranked))
    spare = bool(left >= n / m * times[ranked].sum())  # a second warm call of each
    if times[0] <= tuning.TRIAL_FAVOURITE_PRUNE * times.min() and \
            all(trial[i][0] != trial[0][0] for i in ranked):
        ranked.append(0)  # the model's favourite, unless a form of it goes on
    return [trial[i] for i in sorted(ranked)], {trial[i]: n / m * times[i] for i in ranked}, \
        {trial[i] for i in settle}, spare, elapsed, budget


def _finalists(trial, times, scratch, n, m, budget, elapsed) -> tuple:
    """``(ranked, left)``: the indices of the probed entries that go on to the full size, and
    the budget left for their calls there. Of those probed within
    :data:`~.tuning.TRIAL_WAY_PRUNE` of the fastest, the fastest of each way of moving data,
    then the fastest of the rest within :data:`~.tuning.TRIAL_PROBE_PRUNE` up to
    :data:`~.tuning.TRIAL_FINALISTS` in all, then more while the budget holds
    :data:`~.tuning.TRIAL_FINALIST_CALLS` full-size calls of each and the seconds its
    ``scratch`` adds to the finalists' (one scratch serves them all)."""
    order = [i for i in np.argsort(times, kind="stable")
             if times[i] <= tuning.TRIAL_WAY_PRUNE * times.min()]
    # each way of moving data changes its protocol with the size in its own way, which
    # a probe on a sixteenth does not see: the fastest of each goes on, then the
    # fastest of the rest
    ways, leaders = set(), []
    for i in order:
        way = _way(trial[i][0])
        if way not in ways:
            ways.add(way)
            leaders.append(i)
    rest = [i for i in order
            if i not in leaders and times[i] <= tuning.TRIAL_PROBE_PRUNE * times.min()]
    ranked = (leaders + rest)[:max(tuning.TRIAL_FINALISTS, len(leaders))]
    cost = tuning.TRIAL_FINALIST_CALLS * n / m * times  # each at the full size
    shared = scratch[ranked].max(initial=0.0)
    left = budget - elapsed - cost[ranked].sum() - shared
    for i in rest[len(ranked) - len(leaders):]:  # then as many more as the budget holds
        grows = max(scratch[i] - shared, 0.0)
        if cost[i] + grows > left:
            break
        ranked.append(i)
        left -= cost[i] + grows
        shared += grows
    return ranked, left


def _calling_order(trial, probed, settling) -> list:
    """The order of the full-size first calls (indices into ``trial``): after a probe, the
    fastest probed first, so that a slow first call meets a fast one, and the library's
    calls last unless settling (a library sets up a new size over its first calls, which
    the budget may then not hold); else the model's."""
    if not probed:
        return list(range(len(trial)))
    late = lambda i: trial[i][0] == MPI_NATIVE and i not in settling
    return sorted(range(len(trial)), key=lambda i: (late(i), probed[trial[i]]))


def _first_calls(session, arena, plans, n, bindings, settling, warm, began, order,
                 scaled) -> tuple:
    """``(first, warmed, setup, elapsed, last)``, the slowest rank's: each plan's first
    call on ``n`` elements, its fastest of ``warm`` calls after a pass over the window's
    areas, its binding's seconds, the trial's seconds so far, and the plan that ran last;
    the plans are called in ``order``. ``scaled``: each plan's probe time scaled to the
    size (None where no probe ran). After a probe, a plan (but the first called, the
    model's favourite unless the library's: a probe on a sixteenth can misjudge it, and
    those ``settling``) is called only where the budget as it stands
    (:data:`~.tuning.TRIAL_STEADY` of the fastest call so far plus
    :data:`~.tuning.TRIAL_FLOOR`), less the seconds so far and a call of the fastest to
    come, holds :data:`~.tuning.TRIAL_FIRST_CALLS` of its scaled probe time (else its
    first call is inf), and is not called again where its first call took
    :data:`~.tuning.TRIAL_SLOW_FIRST` times the fastest call before it (its warm calls are
    inf). Each binding goes into ``bindings`` by index (freed by the caller)."""
    # every candidate bound, then the ranks lined up once (each rank's set-up differs,
    # and a first call after its own would wait for the slowest rank's); each
    # candidate's first call, then its warm calls, the fastest of which judges
    first, basis = np.full(len(plans), np.inf), np.full(len(plans), np.inf)
    setup = np.zeros(len(plans))
    for i, plan in enumerate(plans):
        start = time.perf_counter()
        bindings[i] = arena.bind(plan, n)
        setup[i] = time.perf_counter() - start
    # the pass over the window's areas makes as many calls on every rank as where the
    # binding rotates most (a node of one rank has no window, and does not rotate);
    # agreeing on it lines the ranks up
    passes = _everywhere(session, np.array([bindings[i].rotations - 1
                                            for i in range(len(plans))], np.int64))
    probed, last = bool(plans) and scaled[0] is not None, None
    # the model's favourite is called however the probe timed it, unless the library's
    # (whose model is the best of two of mlcomm's own: it knows nothing the others' do not)
    exempt = settling | ({0} if probed and plans[0].algorithm != MPI_NATIVE else set())
    for k, i in enumerate(order):
        done, fastest = order[:k], np.inf
        if probed and k:  # every rank decides on the slowest rank's times
            both, elapsed = _slowest(session, np.concatenate([first[done], basis[done]]),
                                     began)
            first[done], basis[done] = np.split(both, 2)
            fastest = np.minimum(first[done], basis[done]).min()
            if i not in exempt and elapsed + fastest + tuning.TRIAL_FIRST_CALLS * \
                    scaled[i] > tuning.TRIAL_STEADY * fastest + tuning.TRIAL_FLOOR:
                continue  # the budget does not hold it
        first[i], last = _timed(bindings[i].run), i
        if probed:
            first[i] = _slowest(session, first[i:i + 1], began)[0][0]
            if i not in settling and first[i] >= tuning.TRIAL_SLOW_FIRST * fastest:
                continue
        for _ in range(passes[i]):  # each area once: the first is slow
            bindings[i].run()
        basis[i] = min(_timed(bindings[i].run) for _ in range(warm))
    both, elapsed = _slowest(session, np.concatenate([first, basis, setup]), began)
    first, warmed, setup = np.split(both, 3)
    return first, warmed, setup, elapsed, last


def _contenders(ranked, basis, warmed, settling) -> list:
    """The indices timed in the rounds: of those called again, the
    :data:`~.tuning.TRIAL_FINALISTS` fastest (``ranked`` by ``basis``) and those within
    :data:`~.tuning.TRIAL_PRUNE` of the fastest; the library's calls still ``settling``; and
    the model's favourite (0): single calls of ranks that share cores are noise
    (docs/tuning.rst)."""
    return sorted(i for i in {0} | settling | {
        i for k, i in enumerate(ranked) if warmed[i] < np.inf and (
            k < tuning.TRIAL_FINALISTS or basis[i] <= tuning.TRIAL_PRUNE * basis.min())}
        if basis[i] < np.inf)  # not those the budget left uncalled


def _recorded(session, record, trial, first, warm, warmed, calls, estimate, pick, nbytes,
              measured):
    """Add the full-size calls to ``record``: each entry's first call, its warm calls (of
    ``warm``), its timed calls and median; under ``MLCOMM_DEBUG=1`` rank 0 logs the pick
    for ``nbytes``, timed on ``measured`` bytes."""
    labels = [_label_of(entry) for entry in trial]
    record.update(first={label: t for label, t in zip(labels, first.tolist()) if t < np.inf},
                  skipped=[label for label, t in zip(labels, first.tolist()) if t == np.inf],
                  warm_calls=warm,
                  warm={label: t for label, t in zip(labels, warmed.tolist()) if t < np.inf},
                  calls=dict(zip(labels, calls.tolist())),
                  median={labels[i]: estimate[i] for i in range(len(trial)) if calls[i]})
    if session.rank == 0 and config.debug():
        ranked = ", ".join(f"{labels[i]}={estimate[i] * 1e6:.1f}us"
                           for i in sorted(range(len(trial)), key=lambda i: estimate[i]))
        log.warning("mlcomm: auto p=%d bytes=%d -> %s (measured on %d bytes; %s)",
                    session.size, nbytes, labels[pick], measured, ranked)


def _decided(session, count, dtype, op, record, pick, elapsed, budget) -> tuple:
    """Keep the trial's ``record`` in ``session.trials`` with its pick, the seconds it
    spent and its budget; return ``pick``."""
    session.remember_trial(_band_key(count, dtype, op), dict(
        record, spent=elapsed, budget=float(budget), pick=_label_of(pick)))
    return pick


def _probe(arena, plans, m, sync) -> np.ndarray:
    """Each plan's time on ``m`` elements of ``arena``, the fastest of
    :data:`~.tuning.TRIAL_PROBE_CALLS` (this rank's)."""
    arena.reserve(plans, m)
    bindings = []
    try:
        for plan in plans:  # every candidate bound, then the ranks lined up once
            bindings.append(arena.bind(plan, m))
        sync()
        return np.array([min(_timed(binding.run) for _ in range(tuning.TRIAL_PROBE_CALLS))
                         for binding in bindings])
    finally:
        for binding in bindings:
            binding.free()


def _timed(run) -> float:
    """The seconds one ``run()`` takes."""
    start = time.perf_counter()
    run()
    return time.perf_counter() - start
