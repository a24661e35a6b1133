"""Plans: one rank's schedule for one call layout, lowered once. Immutable data.

A plan is what a call of one shape needs before it meets real memory: the schedule, and its
program (:mod:`mlcomm.ir.program`) lowered for the layout (count, dtype, op, and where the
input lies in the output when in place). Binding a plan to buffers and transports is
:mod:`mlcomm.runtime.binding`'s job; keeping plans per communicator is :mod:`mlcomm.session`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..algorithms import COLLECTIVES
from ..ir.program import Program, lower
from ..ir.schedule import Schedule

__all__ = ["Plan", "make_plan", "plan_for_schedule", "plan_key", "layout_key"]


@dataclass(frozen=True, eq=False)
class Plan:
    """One rank's lowered schedule for one (collective, algorithm, count, dtype, op, options,
    alias)."""

    key: tuple
    collective: str
    algorithm: str
    count: int
    dtype: np.dtype
    op: str
    schedule: Schedule
    program: Program

    def describe(self) -> str:
        """The call in words, for messages: ``allreduce (ring, 10 x float32)``."""
        return f"{self.collective} ({self.algorithm}, {self.count} x {self.dtype})"


def plan_key(collective, algorithm, size, count, dtype, op, options, alias) -> tuple:
    return (collective, algorithm, size, count, np.dtype(dtype), op,
            tuple(sorted(options.items())), alias)


def layout_key(key: tuple) -> tuple:
    """What a plan's schedule and program depend on, of its :func:`plan_key`: everything but
    the dtype (only its size) and the op. Plans whose layout keys are equal share them."""
    collective, algorithm, size, count, dtype, op, options, alias = key
    return collective, algorithm, size, count, dtype.itemsize, options, alias


def make_plan(collective, algorithm, rank, size, count, dtype, op, options, alias=None,
              like=None) -> Plan:
    """Build ``algorithm``'s schedule for this rank and lower it for the layout; or take
    them from ``like``, a plan of the same :func:`layout_key` (another dtype of the same
    size, or another op)."""
    dtype = np.dtype(dtype)
    if like is not None:
        return Plan(plan_key(collective, algorithm, size, count, dtype, op, options, alias),
                    collective, algorithm, count, dtype, op, like.schedule, like.program)
    schedule = COLLECTIVES[collective][algorithm].build(rank, size, count, dtype.itemsize,
                                                        **options)
    return plan_for_schedule(schedule, dtype, op, collective=collective, algorithm=algorithm,
                             count=count, options=options, alias=alias)


def plan_for_schedule(schedule: Schedule, dtype, op="sum", *, collective="allreduce",
                      algorithm="custom", count=None, options=None, alias=None) -> Plan:
    """A plan for any schedule (one rank's): how benchmarks and tools run schedules of their
    own, e.g. an algorithm with its local ops stripped, through the real loops."""
    dtype = np.dtype(dtype)
    count = schedule.output_count if count is None else count
    options = options or {}
    return Plan(plan_key(collective, algorithm, schedule.size, count, dtype, op, options, alias),
                collective, algorithm, count, dtype, op, schedule,
                lower(schedule, dtype.itemsize, alias))
