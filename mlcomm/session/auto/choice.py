"""auto's choice for a call on a session: agreed across the ranks, timed where they agreed to
time."""

from __future__ import annotations

import time

from .agreement import agreed
from .others import other_trial
from .trial import _trial


def agreed_choice(session, collective, count, dtype, op, *, device=False,
                  flat=False, buffers=None, shape=None) -> tuple:
    """``auto``'s algorithm and its options for this call on ``session``, the same on every
    rank.

    Collective on a size band's first call (a later count in the band takes the band's
    choice). There the ranks' calls are compared: a count, dtype, op or kind of buffer
    that differs from rank 0's raises ValueError on every rank
    (:meth:`~mlcomm.session.Session.agree`). Rank 0 proposes the tuned or modelled choice
    (:func:`~.policy.auto_choice`), or for an all-reduce with neither a tuned choice nor
    ``MLCOMM_AUTO=model`` (for another collective, without ``MLCOMM_AUTO=model``) the
    candidates to time; every rank then runs the same trial
    (:func:`~.trial._trial`). The choice, modelled or timed, holds for the whole
    power-of-two size band. ``flat``: among the flat algorithms, for one rank per node
    (hierarchical's ``inter``). The options are empty but for a variant the trial timed
    (:data:`~.policy.VARIANTS`). ``buffers``: the call's own ``(input, output)`` (one array
    where it is in place), which a trial runs on instead of arrays of its own (an output is
    written, an input only read; an in-place call's array is restored after the trial).
    The trial's budget counts from here: the agreement is part of a first call. The other
    collectives' trial (:func:`~.others.other_trial`) runs on buffers of its own, of this
    rank's call's ``shape`` (``(count, input size, output size, offset, placed)``).
    """
    began = time.perf_counter()
    if collective != "allreduce":
        measure = lambda trial: other_trial(session, collective, trial, count, dtype, op,
                                            shape, began)
    else:
        measure = lambda trial: _trial(session, trial, count, dtype, op, buffers, began)
    return agreed(session, collective, count, dtype, op, device=device, flat=flat,
                  measure=measure)
