"""The plan of any algorithm for a call on a session, and a trial's distinct plans."""

from __future__ import annotations

import numpy as np

from ...algorithms import AUTO, COLLECTIVES
from .agreement import _everywhere, agreed


def plan_call(session, collective, name, count, dtype, op, options, alias=None):
    """The plan of ``name`` (any of mlcomm's algorithms) for this call on ``session``, with
    the node layout it needs and hierarchical's ``inter`` chosen when not given."""
    context = COLLECTIVES[collective][name].context
    if options.get("intra") == "direct":  # hierarchical by messages: no window, no peer reads
        context = tuple(c for c in context if c != "single_copy")
    if context:
        options = dict(options, **session.context(context))
    if options.get("inter") == AUTO or (name == "hierarchical" and "inter" not in options):
        part = -(-count // max(map(len, session.nodes)))
        inter, _ = agreed(session, collective, part, dtype, op, device=False, flat=True,
                          measure=None)  # a flat choice is never timed
        options = dict(options, inter=inter)
    return session.plan(collective, name, count, dtype, op, options, alias)


def distinct_plans(session, trial, count, dtype, op, alias=None):
    """``(trial, plans)``: the trial's entries less those whose schedule is an earlier
    entry's on every rank (a window variant where the node refuses single-copy reads), and
    each entry's plan for ``count`` elements (in place where ``alias`` is 0), keyed by
    ``(name, options)``."""
    plans = {(name, options): plan_call(session, "allreduce", name, count, dtype, op,
                                        dict(options), alias)
             for name, options in trial}
    schedules = [plans[name, options].schedule for name, options in trial]
    # the shapes first: comparing two schedules' steps costs milliseconds at 16 MiB
    shapes = [(s.input_count, s.output_count, s.scratch_count, len(s.steps), s.node,
               s.slot_count, s.turns, s.rotates) for s in schedules]
    same = _everywhere(session, np.array(
        [[j < i and shapes[i] == shapes[j] and schedules[i] == schedules[j]
          for j in range(len(trial))] for i in range(len(trial))], np.int32), largest=False)
    return [t for t, row in zip(trial, same) if not row.any()], plans
