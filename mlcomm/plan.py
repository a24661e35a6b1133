"""Plans: a schedule compiled for one buffer layout, cached by its key.

Compiling turns regions into ``(buffer, start, stop)`` element slices once, so
a repeated call does no planning and no index arithmetic.  Binding those
slices to real arrays (and MPI requests) is the executor's job.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from dataclasses import dataclass, field

from .algorithms import COLLECTIVES
from .schedule import Copy, Schedule, Send

__all__ = ["Plan", "PlanCache", "compile_plan"]

log = logging.getLogger("mlcomm")


@dataclass
class Plan:
    """One rank's compiled schedule for one (algorithm, count, dtype, op, options)."""

    key: tuple
    schedule: Schedule
    #: per step: (sends, recvs, ops); sends/recvs are (peer, buffer, start, stop),
    #: ops are (is_copy, dst, src, left) with each region as (buffer, start, stop);
    #: a reduce computes dst = left (op) src, and left is dst unless the schedule says otherwise
    steps: list
    #: the executor's bindings to the buffers used last, oldest first (buffer key -> binding)
    bindings: OrderedDict = field(default_factory=OrderedDict)

    def free_bindings(self) -> None:
        for binding in self.bindings.values():
            binding.free()
        self.bindings.clear()


def _slice(region):
    return (region.buffer, region.offset, region.stop)


def compile_plan(key, schedule: Schedule) -> Plan:
    steps = []
    for step in schedule.steps:
        sends = [(t.peer, *_slice(t.region)) for t in step.transfers if isinstance(t, Send)]
        recvs = [(t.peer, *_slice(t.region)) for t in step.transfers if not isinstance(t, Send)]
        ops = [(True, _slice(op.dst), _slice(op.src), _slice(op.dst)) if isinstance(op, Copy)
               else (False, _slice(op.dst), _slice(op.src), _slice(op.first)) for op in step.ops]
        steps.append((sends, recvs, ops))
    return Plan(key, schedule, steps)


class PlanCache:
    """An LRU of plans; one lives on each communicator mlcomm uses."""

    def __init__(self, capacity: int = 64):
        self.capacity = capacity
        self.plans: OrderedDict = OrderedDict()
        self.misses = 0

    def get(self, collective, algorithm, rank, size, count, dtype, op, options) -> Plan:
        key = (collective, algorithm, size, count, dtype.str, op, tuple(sorted(options.items())))
        plan = self.plans.get(key)
        if plan is not None:
            self.plans.move_to_end(key)
            return plan
        self.misses += 1
        algo = COLLECTIVES[collective][algorithm]
        plan = compile_plan(key, algo.build(rank, size, count, dtype.itemsize, **options))
        if os.environ.get("MLCOMM_DEBUG") == "1" and rank == 0:
            log.warning("mlcomm: new plan %s -> %d steps, %d scratch elements",
                        key, len(plan.steps), plan.schedule.scratch_count)
        self.plans[key] = plan
        if len(self.plans) > self.capacity:
            _, old = self.plans.popitem(last=False)
            old.free_bindings()
        return plan
