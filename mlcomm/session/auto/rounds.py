"""The trial's rounds: interleaved timed blocks of the candidates left, and the decision.

:func:`round_order` orders each round (the benchmark's blocks take the same order),
:func:`_rounds` runs them within the budget, and :func:`trial_pick` picks on their medians.
"""

from __future__ import annotations

import time

import numpy as np

from . import tuning
from .agreement import _slowest
from .policy import WINDOW_ONLY


def round_order(names, k) -> list:
    """Round ``k``'s order of interleaved timing, the same on every rank: row ``k`` of a
    Williams design, in which over a period every name follows every other equally often
    and takes every place (n rounds for n names, n even; 2n for n odd, each row then its
    reverse). A block pays for what the block before it left, and a shuffle seeded by the
    round need not balance who follows whom (docs/tuning.rst)."""
    n = len(names)
    first = [0] + [(i + 1) // 2 if i % 2 else n - i // 2 for i in range(1, n)]
    if n % 2 == 0:
        return [names[(f + k) % n] for f in first]
    row = [names[(f + k // 2) % n] for f in first]
    return row[::-1] if k % 2 else row


def round_period(n) -> int:
    """The rounds after which :func:`round_order` of ``n`` names repeats: the fewest over
    which every name follows every other equally often (n for n even, 2n for n odd, one
    for one name)."""
    return n if n % 2 == 0 or n == 1 else 2 * n


def _rounds(session, bindings, alive, basis, budget, coming, elapsed, began, sync,
            probed) -> tuple:
    """``(alive, estimate, calls, elapsed, last)`` after the rounds of the candidates ``alive``
    (indices into ``bindings``), whose calls first took ``basis``: each round times a block
    of each (:func:`_round`) and drops those whose median is :data:`~.tuning.TRIAL_DROP`
    slower than the best, until one is left, :data:`~.tuning.TRIAL_ROUNDS` are done or the
    ``budget`` less its :data:`~.tuning.TRIAL_RESERVE`, the call to come (``coming``) and
    the ``elapsed`` seconds would not hold another call of each (where no probe ran, after
    :data:`~.tuning.TRIAL_MIN_ROUNDS` at least). ``estimate`` is each one's median (its
    ``basis`` where no round ran), ``calls`` the timed calls each made, ``last`` the
    candidate that ran last (None where no round ran)."""
    samples = {i: [] for i in alive}
    estimate = basis.copy()
    calls = np.zeros(len(basis), np.int64)
    last = None  # the candidate that ran last
    for r in range(tuning.TRIAL_ROUNDS):
        # a call of each, and the untimed call before a short block
        one_each = sum(estimate[i] * (1 + (estimate[i] * tuning.TRIAL_BLOCK_CALLS
                                           > tuning.TRIAL_BLOCK_SECONDS)) for i in alive)
        left = (1 - tuning.TRIAL_RESERVE) * budget - coming - elapsed
        if len(alive) == 1 or left < one_each and (probed or r >= tuning.TRIAL_MIN_ROUNDS):
            break
        times, counts, last = _round(bindings, alive, estimate, r, left, sync)
        times, elapsed = _slowest(session, times, began)
        for i in alive:
            samples[i].append(times[i])
            estimate[i] = float(np.median(samples[i]))
            calls[i] += counts[i]
        best = min(estimate[i] for i in alive)
        alive = [i for i in alive if estimate[i] <= tuning.TRIAL_DROP * best]
    return alive, estimate, calls, elapsed, last


def _round(bindings, alive, estimate, r, left, sync) -> tuple:
    """``(times, counts, last)`` of round ``r``: a block of calls of each candidate
    ``alive``, in :func:`round_order` (interleaved: drift hits them all), each after the
    ranks line up, its share of the ``left`` seconds (at least
    :data:`~.tuning.TRIAL_BLOCK_SECONDS`), and after an untimed call where it holds fewer
    than :data:`~.tuning.TRIAL_BLOCK_CALLS`; this rank's seconds a call, and the candidate
    that ran last."""
    block = max(tuning.TRIAL_BLOCK_SECONDS, left / (tuning.TRIAL_ROUNDS - r) / len(alive))
    block = max(tuning.TRIAL_BLOCK_SECONDS, min(block, left / len(alive)))
    times = np.zeros(len(estimate))
    counts = {i: max(1, int(block // estimate[i])) for i in alive}
    order = round_order(alive, r)
    for i in order:
        sync()
        if counts[i] < tuning.TRIAL_BLOCK_CALLS:
            bindings[i].run()
        start = time.perf_counter()
        for _ in range(counts[i]):
            bindings[i].run()
        times[i] = (time.perf_counter() - start) / counts[i]
    return times, counts, order[-1]


def trial_pick(options, typical) -> int:
    """The index of the trial's choice among entries with these ``options`` and median
    times: the fastest, a window variant's time counted :data:`~.tuning.VARIANT_MARGIN`
    times over; the first (the model's favourite) of those within
    :data:`~.tuning.TRIAL_TIE` of it."""
    judged = np.asarray(typical) * [tuning.VARIANT_MARGIN if o == WINDOW_ONLY else 1.0
                                    for o in options]
    return int(np.argmax(judged <= judged.min() * tuning.TRIAL_TIE))
