"""Lowering: one rank's schedule on one buffer layout becomes a :class:`Program`.

A program is the one form every loop runs (the compiled host loop, the Python loop and the
device loop, :mod:`mlcomm.runtime.loop`). It is an int64 array of fixed-width instructions plus the
table of the transfers they start, and it holds no address: a binding
(:mod:`mlcomm.runtime.binding`) supplies the buffers and the transport's handles.

Instructions are :data:`WIDTH` words; offsets and lengths are in bytes::

    START   transport first n            start transfers first .. first+n-1
    WAIT    transport first n            wait until they are complete (sizes checked)
    COPY    dbuf doff sbuf soff - - len  d = s
    REDUCE  dbuf doff sbuf soff - - len  d = d (op) s
    REDUCE2 dbuf doff abuf aoff - - len  d = a (op) d
    REDUCE3 dbuf doff sbuf soff abuf aoff len   d = a (op) s

Buffers are :data:`INPUT` (read only), :data:`OUTPUT`, :data:`SCRATCH`, and from
:data:`SLOTS` on the window slots of the node's ranks in local order. Each reduce kind has
its own loop, so no loop reads and writes one array through two names. Transport
:data:`MPI_P2P` moves messages (:class:`Transfer`); transport :data:`NODE` posts and awaits
the node's window flags (:class:`Sync`); transport :data:`PEER` copies from another rank's
input or output or into its output (:class:`Fetch`, a schedule's ``Copy`` from ``input@R``
or ``output@R``, or to ``output@R``), a START doing the copies and its WAIT completing at
once; transport :data:`NATIVE` calls the MPI library's own collectives (:class:`Call`, a
schedule's ``Collective``). The ids are plain integers here; :mod:`mlcomm.transport.registry`
binds each to the factory of its transport, and :func:`lower` may name another id for the
messages.

A transfer's START may move before the previous step's local ops when it touches nothing
they write or read (:func:`_early_starts`): the ops then overlap the transfer. The layout's
``alias`` says where the input lies within the output when they share memory (in place),
which is what decides overlaps, copies that vanish and the reduce kinds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from .schedule import (INPUT as _IN, OUTPUT as _OUT, SCRATCH as _SCR, Await, Collective, Copy,
                       Post, Recv, Reduce, Schedule, Send, peer_of, slot_owner)

__all__ = ["WIDTH", "START", "WAIT", "COPY", "REDUCE", "REDUCE2", "REDUCE3", "MAX_BYTES",
           "INPUT", "OUTPUT", "SCRATCH", "SLOTS", "BUFFER_IDS", "MPI_P2P", "NODE", "PEER",
           "NATIVE", "IN_PLACE", "Transfer", "Sync", "Fetch", "Call", "Program", "lower"]

WIDTH = 8
START, WAIT, COPY, REDUCE, REDUCE2, REDUCE3 = 1, 2, 3, 4, 5, 6
INPUT, OUTPUT, SCRATCH = 0, 1, 2
#: buffer id of local rank 0's window slot; local rank j's is SLOTS + j
SLOTS = 3
BUFFER_IDS = {_IN: INPUT, _OUT: OUTPUT, _SCR: SCRATCH}
#: transport ids: point-to-point messages on the communicator, the node's window flags,
#: single-copy reads of node peers' buffers, and the MPI library's own collectives
#: (:mod:`mlcomm.transport.registry` binds each id to its transport)
MPI_P2P, NODE, PEER, NATIVE = 0, 1, 2, 3
#: a :class:`Call`'s send buffer when it is in place
IN_PLACE = -1
#: the most bytes one transfer, single copy or call of the library's allreduce, reduce or
#: bcast moves: a larger one is lowered as several, in order (MPI's counts and
#: ``MPI_Get_count``'s are C ints; Linux copies at most 2 GiB - 4 KiB between processes at once)
MAX_BYTES = 1 << 30
#: the library's allgather and reduce-scatter cannot be split so: their count per rank is a C int
_MPI_MAX_COUNT = (1 << 31) - 1
_SPACE = 1 << 50  # bytes between buffers that do not share memory, in the overlap analysis


class Sync(NamedTuple):
    """One node synchronisation: a post of this rank's flag, or a wait for local rank
    ``peer``'s (``count`` as in :class:`mlcomm.ir.schedule.Post` and ``Await``)."""

    post: bool
    peer: int
    count: int


class Transfer(NamedTuple):
    """One message a program starts: received into or sent from ``buffer`` at byte ``offset``."""

    recv: bool
    peer: int
    buffer: int
    offset: int
    nbytes: int


class Fetch(NamedTuple):
    """One single-copy read: ``nbytes`` from local rank ``peer``'s ``source`` (:data:`INPUT`
    or :data:`OUTPUT`) at byte ``offset``, into this rank's ``buffer`` at ``at``; with
    ``write``, the other way: from this rank's ``buffer`` into the peer's ``source``."""

    peer: int
    source: int
    offset: int
    buffer: int
    at: int
    nbytes: int
    write: bool = False


class Call(NamedTuple):
    """One call of the MPI library's own collective ``kind`` on ``count`` elements (as MPI
    takes it): from ``send`` (:data:`IN_PLACE`, or a buffer id) at byte ``send_at`` into
    ``recv`` at byte ``recv_at``; ``blocking`` as in :class:`mlcomm.ir.schedule.Collective`."""

    kind: str
    send: int
    send_at: int
    recv: int
    recv_at: int
    count: int
    root: int = 0
    blocking: bool = False


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
    #: every node synchronisation, in the order START/WAIT ranges on :data:`NODE` index them
    syncs: tuple = ()
    #: ranks in the node whose window slots the program reads (0: none)
    node_size: int = 0
    #: bytes of this rank's window slot the program writes
    slot_bytes: int = 0
    #: every single-copy read, in the order START/WAIT ranges on :data:`PEER` index them
    fetches: tuple = ()
    #: the slots are the window's turn areas (``mlcomm.ir.schedule.Schedule.turns``)
    turns: bool = False
    #: every call of the library's collectives, in the order START/WAIT ranges on
    #: :data:`NATIVE` index them
    calls: tuple = ()
    #: the bytes one run moves between ranks, per path of :data:`mlcomm.transport.PATHS`:
    #: the messages it sends, what it reads from peers' window slots, what it reads from or
    #: writes into peers' buffers by single copy (the library's collectives: not counted)
    moved: tuple = (0, 0, 0)
    #: the slot area may rotate (``mlcomm.ir.schedule.Schedule.rotates``)
    rotates: bool = False

    @property
    def instructions(self) -> np.ndarray:
        """The code as rows of :data:`WIDTH` words."""
        return self.code.reshape(-1, WIDTH)

    @property
    def transport_ids(self) -> frozenset:
        """The transport ids its START and WAIT instructions name."""
        rows = self.instructions
        return frozenset(rows[(rows[:, 0] == START) | (rows[:, 0] == WAIT), 1].tolist())

    def early_starts(self) -> int:
        """How many STARTs run before the previous step's local ops."""
        kinds = self.instructions[:, 0]
        return sum(1 for i in range(1, len(kinds))
                   if kinds[i] == START and kinds[i - 1] == WAIT)


def lower(schedule: Schedule, itemsize: int, alias: int | None = None,
          messages: int = MPI_P2P) -> Program:
    """Lower ``schedule`` for elements of ``itemsize`` bytes; ``alias``: see :class:`Program`;
    ``messages``: the id of the transport that carries its messages (:class:`Transfer`)."""
    node = {rank: j for j, rank in enumerate(schedule.node)}

    def buffer_id(name):
        owner = slot_owner(name)
        return BUFFER_IDS[name] if owner is None else SLOTS + node[owner]

    # where each buffer starts in one address space, for the overlap analysis (a peer's
    # buffers below zero: they never meet this rank's)
    base = {INPUT: alias * itemsize if alias is not None else _SPACE, OUTPUT: 0}

    def where(r):
        found = peer_of(r.buffer)
        if found is not None:
            start = -_SPACE * (1 + 2 * found[0] + BUFFER_IDS[found[1]])
        else:
            start = base.get(buffer_id(r.buffer), buffer_id(r.buffer) * _SPACE)
        return start + r.offset * itemsize, start + r.stop * itemsize

    same = lambda r1, r2: where(r1) == where(r2)
    ref = lambda r: (buffer_id(r.buffer), r.offset * itemsize)
    transfers, syncs, fetches, calls, ranges, starts = [], [], [], [], [], []
    for step in schedule.steps:
        step_messages = [t for t in step.transfers if isinstance(t, Recv)] + \
                        [t for t in step.transfers if isinstance(t, Send)]
        posts = [Sync(True, node[schedule.rank], t.count) for t in step.transfers
                 if isinstance(t, Post)]
        waits = [Sync(False, node[t.peer], t.count) for t in step.transfers
                 if isinstance(t, Await)]
        natives = [piece for t in step.transfers if isinstance(t, Collective)
                   for piece in _call_pieces(Call(
                       t.kind, IN_PLACE if _in_place(t, schedule.rank, where)
                       else buffer_id(t.send.buffer), t.send.offset * itemsize,
                       buffer_id(t.recv.buffer), t.recv.offset * itemsize, t.count, t.root,
                       t.blocking), itemsize)]
        pieces = [_pieces(Transfer(isinstance(t, Recv), t.peer, buffer_id(t.region.buffer),
                                   t.region.offset * itemsize, t.region.count * itemsize),
                          "nbytes", ("offset",)) for t in step_messages]
        # the first piece of every message, then the second ...: one START each, so that
        # the pieces of a message are posted in order (MPI_Startall may post its requests
        # in any order)
        depth = max(map(len, pieces), default=0)
        step_messages = [p[j] for j in range(depth) for p in pieces if j < len(p)]
        counts = [sum(j < len(p) for p in pieces) for j in range(depth)]
        starts.append([(len(transfers) + sum(counts[:j]), counts[j]) for j in range(depth)])
        ranges.append(((len(transfers), len(step_messages)), (len(syncs), len(posts)),
                       (len(syncs) + len(posts), len(waits)), (len(calls), len(natives))))
        calls += natives
        transfers += step_messages
        syncs += posts + waits
    early = _early_starts(schedule, where)
    code, partial, largest, window = [], False, 0, 0
    for k, step in enumerate(schedule.steps):
        (first, n), posted, awaited, native = ranges[k]
        if n and not early[k]:
            code += [(START, messages, *group, 0, 0, 0, 0) for group in starts[k]]
        if posted[1]:
            code.append((START, NODE, *posted, 0, 0, 0, 0))
        if n:
            code.append((WAIT, messages, first, n, 0, 0, 0, 0))
        if awaited[1]:
            code.append((WAIT, NODE, *awaited, 0, 0, 0, 0))
        if native[1]:
            code.append((START, NATIVE, *native, 0, 0, 0, 0))
            code.append((WAIT, NATIVE, *native, 0, 0, 0, 0))
        if k + 1 < len(ranges) and early[k + 1]:
            code += [(START, messages, *group, 0, 0, 0, 0) for group in starts[k + 1]]
        reads = []  # this step's fetches not yet started

        def start_reads():
            if reads:
                code.append((START, PEER, len(fetches), len(reads), 0, 0, 0, 0))
                code.append((WAIT, PEER, len(fetches), len(reads), 0, 0, 0, 0))
                fetches.extend(reads)
                reads.clear()

        for op in step.ops:
            d = op.dst
            nbytes = d.count * itemsize
            found = peer_of(op.src.buffer)
            target = peer_of(d.buffer)
            if found is not None or target is not None:
                if not isinstance(op, Copy) or found is not None and target is not None:
                    raise ValueError(f"{op}: only a copy may read or write another rank's "
                                     f"buffer, from or to one of this rank's own")
                if found is not None:
                    reads += _pieces(Fetch(node[found[0]], BUFFER_IDS[found[1]],
                                           op.src.offset * itemsize, *ref(d), nbytes),
                                     "nbytes", ("offset", "at"))
                else:
                    reads += _pieces(Fetch(node[target[0]], BUFFER_IDS[target[1]],
                                           d.offset * itemsize, *ref(op.src), nbytes, True),
                                     "nbytes", ("offset", "at"))
                continue
            start_reads()
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
            window += sum(r.count * itemsize for r in sources
                          if slot_owner(r.buffer) not in (None, schedule.rank))
            dw = where(d)
            partial |= any(_meet(dw, where(s)) and dw[0] != where(s)[0] for s in sources)
        start_reads()
    words = np.array(code, dtype=np.int64).reshape(-1)
    words.flags.writeable = False
    counts = (schedule.input_count, schedule.output_count, schedule.scratch_count)
    moved = (sum(t.nbytes for t in transfers if not t.recv), window,
             sum(f.nbytes for f in fetches))
    return Program(words, tuple(transfers), itemsize, counts, alias, partial, largest,
                   tuple(syncs), len(schedule.node), schedule.slot_count * itemsize,
                   tuple(fetches), schedule.turns, tuple(calls), moved, schedule.rotates)


def _pieces(item, size, offsets, unit=1) -> list:
    """``item`` (a :class:`Transfer`, :class:`Fetch` or :class:`Call`) as pieces of at most
    :data:`MAX_BYTES` bytes, in order: its field ``size`` (in units of ``unit`` bytes) split,
    its byte fields ``offsets`` advanced. A piece of each rank's transfer meets the peer's
    same piece: both sides split one region of the schedule alike."""
    whole, most = getattr(item, size), max(MAX_BYTES // unit, 1)
    if whole <= most:
        return [item]
    return [item._replace(**{size: min(most, whole - k)},
                          **{f: getattr(item, f) + k * unit for f in offsets})
            for k in range(0, whole, most)]


def _call_pieces(call, itemsize) -> list:
    """A :class:`Call` as pieces (:func:`_pieces`): an allreduce, reduce or bcast works
    element by element; an allgather or reduce-scatter cannot be split so, and a count per
    rank past a C int is an error."""
    if call.kind in ("allreduce", "reduce", "bcast"):
        return _pieces(call, "count", ("send_at", "recv_at"), itemsize)
    if call.count > _MPI_MAX_COUNT:
        raise ValueError(f"algorithm='mpi': the MPI library's {call.kind} takes at most "
                         f"{_MPI_MAX_COUNT} elements per rank (a C int), and this call has "
                         f"{call.count}; use one of mlcomm's algorithms (e.g. "
                         f"algorithm='ring'), which move it in pieces of at most "
                         f"{MAX_BYTES} bytes")
    return [call]


def _in_place(call, rank, where) -> bool:
    """Whether a :class:`mlcomm.ir.schedule.Collective` is in place in MPI's sense: its input
    lies in its output (an allgather's block in its result), except off a reduce's root,
    where the input is always the data."""
    if call.kind == "reduce" and rank != call.root:
        return False
    send, recv = where(call.send), where(call.recv)
    return send[0] == recv[0] or _meet(send, recv)


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
        if not prev.ops or not step.transfers or any(
                isinstance(t, (Post, Await)) for t in step.transfers):
            early.append(False)  # a node post publishes the ops before it: never early
            continue
        written = [where(op.dst) for op in prev.ops]
        read = [where(r) for op in prev.ops
                for r in ((op.src, op.first) if isinstance(op, Reduce) else (op.src,))]
        early.append(not any(_meet(where(t.region), w) for t in step.transfers
                             if isinstance(t, Recv) for w in written + read)
                     and not any(_meet(where(t.region), w) for t in step.transfers
                                 if isinstance(t, Send) for w in written))
    return early
