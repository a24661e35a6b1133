"""Lowering: one rank's schedule on one buffer layout becomes a :class:`Program`.

A program is the one form every loop runs (the compiled host loop, the Python loop and the
device loop, :mod:`mlcomm.loop`). It is an int64 array of fixed-width instructions plus the
table of the transfers they start, and it holds no address: a binding
(:mod:`mlcomm.binding`) supplies the buffers and the transport's handles.

Instructions are :data:`WIDTH` words; offsets and lengths are in bytes::

    START   transport first n            start transfers first .. first+n-1
    WAIT    transport first n            wait until they are complete (sizes checked)
    COPY    dbuf doff sbuf soff - - len  d = s
    REDUCE  dbuf doff sbuf soff - - len  d = d (op) s
    REDUCE2 dbuf doff abuf aoff - - len  d = a (op) d
    REDUCE3 dbuf doff sbuf soff abuf aoff len   d = a (op) s

Buffers are :data:`INPUT` (read only), :data:`OUTPUT`, :data:`SCRATCH`. Each reduce kind
has its own loop, so no loop reads and writes one array through two names.

A transfer's START may move before the previous step's local ops when it touches nothing
they write or read (:func:`_early_starts`): the ops then overlap the transfer. The layout's
``alias`` says where the input lies within the output when they share memory (in place),
which is what decides overlaps, copies that vanish and the reduce kinds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .schedule import INPUT as _IN, OUTPUT as _OUT, SCRATCH as _SCR, Copy, Recv, Reduce, Schedule

__all__ = ["WIDTH", "START", "WAIT", "COPY", "REDUCE", "REDUCE2", "REDUCE3",
           "INPUT", "OUTPUT", "SCRATCH", "BUFFER_IDS", "MPI_P2P",
           "Transfer", "Program", "lower"]

WIDTH = 8
START, WAIT, COPY, REDUCE, REDUCE2, REDUCE3 = 1, 2, 3, 4, 5, 6
INPUT, OUTPUT, SCRATCH = 0, 1, 2
BUFFER_IDS = {_IN: INPUT, _OUT: OUTPUT, _SCR: SCRATCH}
#: the transport id of point-to-point messages on the communicator
MPI_P2P = 0
_SPACE = 1 << 50  # bytes between buffers that do not share memory, in the overlap analysis


class Transfer(NamedTuple):
    """One message a program starts: received into or sent from ``buffer`` at byte ``offset``."""

    recv: bool
    peer: int
    buffer: int
    offset: int
    nbytes: int


@dataclass(frozen=True, eq=False)
class Program:
    """A lowered schedule: instructions, the transfers they start, and what a binding needs."""

    #: read-only int64 instruction words, :data:`WIDTH` per instruction
    code: np.ndarray
    #: every transfer, in the order START/WAIT ranges index them
    transfers: tuple
    itemsize: int
    #: element counts of the input, output and scratch buffers
    counts: tuple
    #: where the input starts within the output, in elements, when they share memory
    alias: int | None
    #: some local op reads memory that partly overlaps what it writes (the Python loop only)
    partial_overlap: bool
    #: the largest local reduction, in bytes
    largest_reduce: int

    @property
    def instructions(self) -> np.ndarray:
        """The code as rows of :data:`WIDTH` words."""
        return self.code.reshape(-1, WIDTH)

    def early_starts(self) -> int:
        """How many STARTs run before the previous step's local ops."""
        kinds = self.instructions[:, 0]
        return sum(1 for i in range(1, len(kinds))
                   if kinds[i] == START and kinds[i - 1] == WAIT)


def lower(schedule: Schedule, itemsize: int, alias: int | None = None) -> Program:
    """Lower ``schedule`` for elements of ``itemsize`` bytes; ``alias``: see :class:`Program`."""
    base = {_OUT: 0, _IN: alias * itemsize if alias is not None else _SPACE,
            _SCR: 2 * _SPACE}
    where = lambda r: (base[r.buffer] + r.offset * itemsize, base[r.buffer] + r.stop * itemsize)
    same = lambda r1, r2: where(r1) == where(r2)
    transfers, ranges = [], []
    for step in schedule.steps:
        first = len(transfers)
        ordered = [t for t in step.transfers if isinstance(t, Recv)] + \
                  [t for t in step.transfers if not isinstance(t, Recv)]
        transfers += [Transfer(isinstance(t, Recv), t.peer, BUFFER_IDS[t.region.buffer],
                               t.region.offset * itemsize, t.region.count * itemsize)
                      for t in ordered]
        ranges.append((first, len(transfers) - first))
    early = _early_starts(schedule, where)
    code, partial, largest = [], False, 0
    for k, step in enumerate(schedule.steps):
        first, n = ranges[k]
        if n and not early[k]:
            code.append((START, MPI_P2P, first, n, 0, 0, 0, 0))
        if n:
            code.append((WAIT, MPI_P2P, first, n, 0, 0, 0, 0))
        if k + 1 < len(ranges) and early[k + 1]:
            code.append((START, MPI_P2P, *ranges[k + 1], 0, 0, 0, 0))
        for op in step.ops:
            d = op.dst
            ref = lambda r: (BUFFER_IDS[r.buffer], r.offset * itemsize)
            nbytes = d.count * itemsize
            if isinstance(op, Copy):
                if not same(op.src, d):
                    code.append((COPY, *ref(d), *ref(op.src), 0, 0, nbytes))
                sources = [op.src]
            else:
                largest = max(largest, nbytes)
                left = op.first
                if same(left, d):
                    code.append((REDUCE, *ref(d), *ref(op.src), 0, 0, nbytes))
                elif same(op.src, d):
                    code.append((REDUCE2, *ref(d), *ref(left), 0, 0, nbytes))
                else:
                    code.append((REDUCE3, *ref(d), *ref(op.src), *ref(left), nbytes))
                sources = [op.src, left]
            dw = where(d)
            partial |= any(_meet(dw, where(s)) and dw[0] != where(s)[0] for s in sources)
    words = np.array(code, dtype=np.int64).reshape(-1)
    words.flags.writeable = False
    counts = (schedule.input_count, schedule.output_count, schedule.scratch_count)
    return Program(words, tuple(transfers), itemsize, counts, alias, partial, largest)


def _meet(a, b) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def _early_starts(schedule, where) -> list:
    """Per step: may its transfers start before the previous step's ops run?

    Yes when the previous step has ops, its receives touch nothing those ops read or
    write, and its sends read nothing they write.
    """
    steps = schedule.steps
    early = [False]
    for prev, step in zip(steps, steps[1:]):
        if not prev.ops or not step.transfers:
            early.append(False)
            continue
        written = [where(op.dst) for op in prev.ops]
        read = [where(r) for op in prev.ops
                for r in ((op.src, op.first) if isinstance(op, Reduce) else (op.src,))]
        early.append(not any(_meet(where(t.region), w) for t in step.transfers
                             if isinstance(t, Recv) for w in written + read)
                     and not any(_meet(where(t.region), w) for t in step.transfers
                                 if not isinstance(t, Recv) for w in written))
    return early
