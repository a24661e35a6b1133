"""The agreement across ranks: one choice per size band, and the trial's times reduced alike.

:func:`agreed` finds a call's choice, or has rank 0 propose one and every rank agree on it;
:func:`_everywhere` and :func:`_slowest` reduce the trial's measurements so that every rank
takes every decision on the same numbers.
"""

from __future__ import annotations

import time

import numpy as np

from .policy import _band_key, _label, _propose

#: what every rank's call must share where auto agrees on a new size band
_CALL = ("collective", "count", "dtype", "op", "buffers")
#: and where it agrees on hierarchical's inter-node algorithm, whose count is a part's
_FLAT_CALL = ("collective", "count of hierarchical's part across the nodes", "dtype", "op",
              "buffers")


def agreed(session, collective, count, dtype, op, *, device, flat, measure) -> tuple:
    """``(name, options)`` for this call on ``session``, the same on every rank
    (:func:`~mlcomm.session.auto.agreed_choice`): the call layout's, else its size band's,
    else agreed from rank 0's proposal, where ``measure(trial)`` times the candidates the
    ranks agreed to time (a flat choice is the model's, never timed)."""
    p = len(session.nodes) if flat else session.size
    key = (collective, p, count, dtype.str, op, device, flat)
    choice = session.choices.get(key)
    if choice is not None:
        return choice[0], dict(choice[1])
    band = (collective, p, *_band_key(count, dtype, op), device, flat)
    choice = session.choices.get(("band", *band)) or session.choices.get(("modelled", *band))
    if choice is None:
        proposal = None
        if session.rank == 0 or flat and p == 1:
            try:
                proposal = _propose(collective, p, count, dtype, op, session.nodes, device, flat)
            except ValueError as exc:  # e.g. a bad MLCOMM_AUTO: every rank raises it
                proposal = exc
        # one node's inter-node phase has one rank, where every flat algorithm is the same
        # copy: no rank need hear another's choice; elsewhere the agreement compares the
        # ranks' calls (a rank whose count, dtype or op differs would time another layout)
        reply = proposal if flat and p == 1 else session.agree(
            proposal, f"{collective} ({count} x {dtype}): auto's choice for a new size "
                      f"(mlcomm's agreement)",
            (_FLAT_CALL if flat else _CALL,
             (collective, count, str(dtype), op, "device" if device else "host")))
        if isinstance(reply, Exception):
            raise reply
        choice, trial = reply
        choice = (choice, ()) if choice is not None else measure(trial)
        # a band's later counts need no agreement, modelled or timed: a rank whose count
        # alone is new goes on to the call, whose checks name the difference, and does not
        # wait alone in an agreement
        session.remember_choice(("band" if trial else "modelled", *band), choice)
    session.remember_choice(key, choice)
    return choice[0], dict(choice[1])


def auto_ran(session, collective, count, dtype, op, *, device=False):
    """What ``auto`` runs for this call layout on ``session`` (the algorithm, and a variant's
    options in words), once a call has decided it; None before."""
    choice = session.choices.get((collective, session.size, count, dtype.str, op, device,
                                  False))
    return None if choice is None else _label(*choice)


def _everywhere(session, values, largest=True):
    """``values`` (an array, reduced in place) the largest (else the smallest) over the
    ranks, the same on every rank: a collective wait, watched as the trial's."""
    from mpi4py import MPI
    op = MPI.MAX if largest else MPI.MIN
    session.watch.wait(lambda: session.comm.Iallreduce(MPI.IN_PLACE, values, op=op),
                       "auto's trial", roll=False)
    return values


def _slowest(session, times, began) -> tuple:
    """``(times, elapsed)``: ``times`` reduced to the slowest rank's, and the seconds since
    ``began`` on the slowest rank, the same on every rank."""
    both = _everywhere(session, np.append(times, time.perf_counter() - began))
    return both[:-1], float(both[-1])
