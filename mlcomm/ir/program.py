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

:func:`lower` runs the passes of :data:`PASSES` in order over one :class:`Lowering`: it
numbers the node's ranks, lays the buffers out in one address space, tables the messages,
node synchronisations and library calls, emits the local ops, measures them, drops the
copies that vanish, picks the reduce kinds, moves a step's STARTs ahead of the previous
step's local ops where they touch different memory (the ops then overlap the transfers),
and links the steps into a :class:`Program`. The layout's ``alias`` says where the input
lies within the output when they share memory (in place), which is what decides overlaps,
copies that vanish and the reduce kinds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from .schedule import (INPUT as _IN, OUTPUT as _OUT, SCRATCH as _SCR, Await, Collective, Copy,
                       Post, Recv, Reduce, Schedule, Send, peer_of, slot_owner)

__all__ = ["WIDTH", "START", "WAIT", "COPY", "REDUCE", "REDUCE2", "REDUCE3", "MAX_BYTES",
           "INPUT", "OUTPUT", "SCRATCH", "SLOTS", "BUFFER_IDS", "MPI_P2P", "NODE", "PEER",
           "NATIVE", "INPUT_IN_OUTPUT", "Transfer", "Sync", "Fetch", "Call", "Program", "PASSES",
           "lower"]

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
#: a :class:`Call`'s send buffer when its input lies in its output (MPI's in place)
INPUT_IN_OUTPUT = -1
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
    takes it): from ``send`` (:data:`INPUT_IN_OUTPUT`, or a buffer id) at byte ``send_at``
    into ``recv`` at byte ``recv_at``; ``blocking`` as in
    :class:`mlcomm.ir.schedule.Collective`."""

    kind: str
    send: int
    send_at: int
    recv: int
    recv_at: int
    count: int
    root: int = 0
    blocking: bool = False
    #: the uneven forms' counts (:class:`mlcomm.ir.schedule.Collective`)
    counts: tuple = ()


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


#: a step's sections, in the order :func:`link` joins them: its message STARTs, the START of
#: its node posts, the WAIT of its messages and of its node awaits, its library calls, the
#: next step's message STARTs when they run early, its local ops
SECTIONS = ("start", "post", "wait", "await", "call", "early", "local")


@dataclass(eq=False)
class Lowering:
    """What the passes of :func:`lower` read and build, for one schedule."""

    schedule: Schedule
    itemsize: int
    alias: int | None
    #: the transport id of the messages
    messages: int
    #: the local index of each rank of the node
    node: dict = field(default_factory=dict)
    #: where each of this rank's buffers starts in the overlap analysis's address space
    base: dict = field(default_factory=dict)
    transfers: list = field(default_factory=list)
    syncs: list = field(default_factory=list)
    fetches: list = field(default_factory=list)
    calls: list = field(default_factory=list)
    #: per step, its instructions by section (:data:`SECTIONS`); ``local`` holds
    #: ``(instruction, op)`` pairs, op None for a START or WAIT of single copies
    blocks: list = field(default_factory=list)
    partial: bool = False
    largest: int = 0
    #: bytes the local ops read from other ranks' window slots
    window: int = 0
    program: Program | None = None

    def buffer_id(self, name: str) -> int:
        owner = slot_owner(name)
        return BUFFER_IDS[name] if owner is None else SLOTS + self.node[owner]

    def where(self, r) -> tuple:
        """Region ``r``'s bytes ``(start, stop)`` in one address space: a peer's buffers below
        zero, where they never meet this rank's."""
        found = peer_of(r.buffer)
        if found is not None:
            start = -_SPACE * (1 + 2 * found[0] + BUFFER_IDS[found[1]])
        else:
            start = self.base.get(self.buffer_id(r.buffer), self.buffer_id(r.buffer) * _SPACE)
        return start + r.offset * self.itemsize, start + r.stop * self.itemsize

    def same(self, r1, r2) -> bool:
        """Whether two regions are the same memory."""
        return self.where(r1) == self.where(r2)

    def ref(self, r) -> tuple:
        """Region ``r`` as an instruction's operand: buffer id, byte offset."""
        return self.buffer_id(r.buffer), r.offset * self.itemsize


def number_ranks(s: Lowering) -> None:
    """Number the node's ranks in local order (local rank j's window slot is buffer
    ``SLOTS + j``), and give every step its empty sections."""
    s.node = {rank: j for j, rank in enumerate(s.schedule.node)}
    s.blocks = [{name: [] for name in SECTIONS} for _ in s.schedule.steps]


def lay_out(s: Lowering) -> None:
    """Lay the buffers out in one address space for the overlap analysis: the output at 0,
    the input at ``alias`` elements into it when they share memory, every other buffer in a
    space of its own."""
    s.base = {INPUT: s.alias * s.itemsize if s.alias is not None else _SPACE, OUTPUT: 0}


def table_messages(s: Lowering) -> None:
    """Table each step's messages, its receives first, in pieces (:func:`_pieces`); emit a
    START per round of pieces (each message's first piece, then its second ...: one START
    each, as MPI_Startall may post its requests in any order) and one WAIT for them all."""
    for step, block in zip(s.schedule.steps, s.blocks):
        ordered = [t for t in step.transfers if isinstance(t, Recv)] + \
                  [t for t in step.transfers if isinstance(t, Send)]
        pieces = [_pieces(Transfer(isinstance(t, Recv), t.peer, *s.ref(t.region),
                                   t.region.count * s.itemsize), "nbytes", ("offset",))
                  for t in ordered]
        first = len(s.transfers)
        for j in range(max(map(len, pieces), default=0)):
            round_ = [p[j] for p in pieces if j < len(p)]
            block["start"].append((START, s.messages, len(s.transfers), len(round_), 0, 0, 0, 0))
            s.transfers += round_
        if len(s.transfers) > first:
            block["wait"].append((WAIT, s.messages, first, len(s.transfers) - first,
                                  0, 0, 0, 0))


def table_syncs(s: Lowering) -> None:
    """Table each step's node posts, then its awaits; emit a START of the posts and a WAIT
    of the awaits."""
    for step, block in zip(s.schedule.steps, s.blocks):
        posts = [Sync(True, s.node[s.schedule.rank], t.count) for t in step.transfers
                 if isinstance(t, Post)]
        waits = [Sync(False, s.node[t.peer], t.count) for t in step.transfers
                 if isinstance(t, Await)]
        if posts:
            block["post"].append((START, NODE, len(s.syncs), len(posts), 0, 0, 0, 0))
        if waits:
            block["await"].append((WAIT, NODE, len(s.syncs) + len(posts), len(waits),
                                   0, 0, 0, 0))
        s.syncs += posts + waits


def table_calls(s: Lowering) -> None:
    """Table each step's calls of the library's collectives, in pieces where the kind allows
    (:func:`_call_pieces`), the send :data:`INPUT_IN_OUTPUT` where MPI's in place
    (:func:`_in_place`); emit their START and WAIT."""
    rank, itemsize = s.schedule.rank, s.itemsize
    for step, block in zip(s.schedule.steps, s.blocks):
        natives = [piece for t in step.transfers if isinstance(t, Collective)
                   for piece in _call_pieces(Call(
                       t.kind, INPUT_IN_OUTPUT if _in_place(t, rank, s.where)
                       else s.buffer_id(t.send.buffer), t.send.offset * itemsize,
                       *s.ref(t.recv), t.count, t.root, t.blocking, t.counts), itemsize)]
        if natives:
            block["call"] += [(kind, NATIVE, len(s.calls), len(natives), 0, 0, 0, 0)
                              for kind in (START, WAIT)]
        s.calls += natives


def lower_ops(s: Lowering) -> None:
    """Emit each step's local ops: a COPY for a copy, a REDUCE3 (``dst = first (op) src``)
    for a reduction; a copy from or into a peer's buffer becomes single-copy reads or writes
    (:class:`Fetch`, in pieces), each run of them one START and WAIT on :data:`PEER`."""
    for step, block in zip(s.schedule.steps, s.blocks):
        reads = []  # the single copies not yet emitted
        for op in step.ops:
            d, nbytes = op.dst, op.dst.count * s.itemsize
            found, target = peer_of(op.src.buffer), peer_of(d.buffer)
            if found is not None or target is not None:
                if not isinstance(op, Copy) or found is not None and target is not None:
                    raise ValueError(f"{op}: only a copy may read or write another rank's "
                                     f"buffer, from or to one of this rank's own")
                if found is not None:
                    fetch = Fetch(s.node[found[0]], BUFFER_IDS[found[1]],
                                  op.src.offset * s.itemsize, *s.ref(d), nbytes)
                else:
                    fetch = Fetch(s.node[target[0]], BUFFER_IDS[target[1]],
                                  d.offset * s.itemsize, *s.ref(op.src), nbytes, True)
                reads += _pieces(fetch, "nbytes", ("offset", "at"))
                continue
            _emit_fetches(s, block, reads)
            if isinstance(op, Copy):
                row = (COPY, *s.ref(d), *s.ref(op.src), 0, 0, nbytes)
            else:
                row = (REDUCE3, *s.ref(d), *s.ref(op.src), *s.ref(op.first), nbytes)
            block["local"].append((row, op))
        _emit_fetches(s, block, reads)


def _emit_fetches(s: Lowering, block: dict, reads: list) -> None:
    """Table ``reads`` and emit their START and WAIT on :data:`PEER`; empty ``reads``."""
    if reads:
        block["local"] += [((kind, PEER, len(s.fetches), len(reads), 0, 0, 0, 0), None)
                           for kind in (START, WAIT)]
        s.fetches += reads
        reads.clear()


def measure(s: Lowering) -> None:
    """Measure the local ops: the largest reduction, the bytes read from other ranks'
    window slots, and whether an op reads memory that partly overlaps what it writes."""
    for block in s.blocks:
        for _, op in block["local"]:
            if op is None:
                continue
            sources = (op.src,) if isinstance(op, Copy) else (op.src, op.first)
            if not isinstance(op, Copy):
                s.largest = max(s.largest, op.dst.count * s.itemsize)
            s.window += sum(r.count * s.itemsize for r in sources
                            if slot_owner(r.buffer) not in (None, s.schedule.rank))
            dw = s.where(op.dst)
            s.partial |= any(_meet(dw, s.where(r)) and dw[0] != s.where(r)[0]
                             for r in sources)


def drop_null_copies(s: Lowering) -> None:
    """Drop each COPY whose source is its destination's memory (in place, a part of the
    input seen at its own place in the output)."""
    for block in s.blocks:
        block["local"] = [(row, op) for row, op in block["local"]
                          if row[0] != COPY or not s.same(op.src, op.dst)]


def pick_reduce_kinds(s: Lowering) -> None:
    """Narrow each REDUCE3 ``d = a (op) s`` whose first operand is its destination to REDUCE
    ``d = d (op) s``, and one whose source is its destination to REDUCE2 ``d = a (op) d``."""
    for block in s.blocks:
        for i, (row, op) in enumerate(block["local"]):
            if row[0] != REDUCE3:
                continue
            if s.same(op.first, op.dst):
                block["local"][i] = ((REDUCE, *row[1:5], 0, 0, row[7]), op)
            elif s.same(op.src, op.dst):
                block["local"][i] = ((REDUCE2, *row[1:3], *row[5:7], 0, 0, row[7]), op)


def hoist_starts(s: Lowering) -> None:
    """Move a step's message STARTs ahead of the previous step's local ops (into its
    ``early`` section) when the step has no node post or await, its receives touch nothing
    those ops write or read, and its sends read nothing they write: the ops then overlap
    the transfers."""
    steps = s.schedule.steps
    for k in range(1, len(steps)):
        prev, step = steps[k - 1], steps[k]
        if not prev.ops or not step.transfers or any(
                isinstance(t, (Post, Await)) for t in step.transfers):
            continue  # a node post publishes the ops before it: never early
        written = [s.where(op.dst) for op in prev.ops]
        read = [s.where(r) for op in prev.ops
                for r in ((op.src, op.first) if isinstance(op, Reduce) else (op.src,))]
        if not any(_meet(s.where(t.region), w) for t in step.transfers
                   if isinstance(t, Recv) for w in written + read) and \
                not any(_meet(s.where(t.region), w) for t in step.transfers
                        if isinstance(t, Send) for w in written):
            s.blocks[k - 1]["early"], s.blocks[k]["start"] = s.blocks[k]["start"], []


def link(s: Lowering) -> None:
    """Join the steps' sections into the instruction words, and everything into the
    :class:`Program`."""
    code = [row for block in s.blocks
            for row in (*(r for name in SECTIONS[:-1] for r in block[name]),
                        *(r for r, _ in block["local"]))]
    words = np.array(code, dtype=np.int64).reshape(-1)
    words.flags.writeable = False
    schedule = s.schedule
    counts = (schedule.input_count, schedule.output_count, schedule.scratch_count)
    moved = (sum(t.nbytes for t in s.transfers if not t.recv), s.window,
             sum(f.nbytes for f in s.fetches))
    s.program = Program(words, tuple(s.transfers), s.itemsize, counts, s.alias, s.partial,
                        s.largest, tuple(s.syncs), len(schedule.node),
                        schedule.slot_count * s.itemsize, tuple(s.fetches), schedule.turns,
                        tuple(s.calls), moved, schedule.rotates)


#: the passes :func:`lower` runs, in order
PASSES = (number_ranks, lay_out, table_messages, table_syncs, table_calls, lower_ops, measure,
          drop_null_copies, pick_reduce_kinds, hoist_starts, link)


def lower(schedule: Schedule, itemsize: int, alias: int | None = None,
          messages: int = MPI_P2P) -> Program:
    """Lower ``schedule`` for elements of ``itemsize`` bytes: run :data:`PASSES` in order;
    ``alias``: see :class:`Program`; ``messages``: the id of the transport that carries its
    messages (:class:`Transfer`)."""
    state = Lowering(schedule, itemsize, alias, messages)
    for lowering_pass in PASSES:
        lowering_pass(state)
    return state.program


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
    element by element; the others cannot be split so, and a count per rank (or an uneven
    form's total, which its displacements reach) past a C int is an error."""
    if call.kind in ("allreduce", "reduce", "bcast"):
        return _pieces(call, "count", ("send_at", "recv_at"), itemsize)
    if max(call.count, sum(call.counts)) > _MPI_MAX_COUNT:
        raise ValueError(f"algorithm='mpi': the MPI library's {call.kind} takes at most "
                         f"{_MPI_MAX_COUNT} elements per rank (a C int), and this call has "
                         f"{max(call.count, sum(call.counts))}; use one of mlcomm's "
                         f"algorithms (e.g. algorithm='ring'), which move it in pieces of at most "
                         f"{MAX_BYTES} bytes")
    return [call]


def _in_place(call, rank, where) -> bool:
    """Whether a :class:`mlcomm.ir.schedule.Collective` is in place in MPI's sense: its input
    lies in its output (an allgather's block in its result), except off a reduce's root,
    where the input is always the data, and where a rank sends or receives nothing (off a
    gather's or scatter's root)."""
    if call.kind == "reduce" and rank != call.root or not (call.send.count and
                                                           call.recv.count):
        return False
    send, recv = where(call.send), where(call.recv)
    return send[0] == recv[0] or _meet(send, recv)


def _meet(a, b) -> bool:
    return a[0] < b[1] and b[0] < a[1]


