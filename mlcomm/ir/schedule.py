"""Schedule IR: a collective as pure data, one list of steps per rank.

A step posts all its transfers together, waits for all of them, then runs
its local ops in order.  Regions name a buffer (``input`` is read only,
``output``, ``scratch``, or ``slot:R``, rank R's slot of its node's shared window,
which every rank of that node reads but only R writes), an element offset and an
element count.  Messages between one pair of ranks match in the order they are posted.
A ``Copy`` may also read ``input@R`` or ``output@R``, rank R's own buffers, when R is of
the same node: a single-copy read of another process's memory (Linux cross-memory
attach), ordered by node synchronisation like a slot read.

A ``Collective`` step hands the whole call to the MPI library's own collective (the
``mpi`` algorithm): the library decides its messages and its reduction order.

Node synchronisation orders a node's reads of a slot after its owner's writes:
``Post(k)`` (this rank's k-th post in the collective) publishes every write of the
steps before it; ``Await(peer, k)`` completes once ``peer`` has made k posts in this
collective. ``Await(peer, 0)`` waits until ``peer`` has finished the previous
collective on the window; a schedule's first step awaits every rank of the node so
(itself included), and its last post comes after its last read of the window.

A schedule with ``turns`` finds its slots in the window's turn areas instead: each rank
has two of :data:`TURN_BYTES`, and the node's collectives with ``turns`` take them in turn
(the first, the second, the first, ...). Its first step awaits only itself with count 0;
it must await a post of every other rank of its node. So when it writes a turn area, the
last collective that used that area is two turns back, and every rank finished reading it
before the post that the turn between awaited: the write needs no wait.

A schedule that ``rotates`` (its slot need the same on every rank of its node) may run on
any of several equal areas of the slots, the same area on every rank of the node, which the
node's rotating collectives take in turn: a store to a line that another core has read must
take the line back first, and lines read many collectives ago cost less to take
(docs/performance.rst). Its synchronisation is a plain schedule's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

__all__ = [
    "INPUT", "OUTPUT", "SCRATCH", "BUFFERS", "slot", "slot_owner", "peer", "peer_of", "owner",
    "Region", "Send", "Recv", "Post", "Await", "Collective", "Reduce", "Copy", "Step", "Schedule",
    "Timeline", "chunk_bounds", "TURN_BYTES",
]

INPUT, OUTPUT, SCRATCH = "input", "output", "scratch"
#: bytes of each of a rank's two turn areas of the node window (see ``Schedule.turns``)
TURN_BYTES = 16 << 10
BUFFERS = (INPUT, OUTPUT, SCRATCH)
_SLOT = "slot:"


def slot(rank: int) -> str:
    """The buffer name of ``rank``'s slot of its node's window."""
    return f"{_SLOT}{rank}"


def slot_owner(buffer: str):
    """The rank whose slot ``buffer`` is, or None for a rank's own buffers."""
    return int(buffer[len(_SLOT):]) if buffer.startswith(_SLOT) else None


def peer(buffer: str, rank: int) -> str:
    """The name of ``rank``'s own ``buffer`` (input or output), read from another rank."""
    return f"{buffer}@{rank}"


def peer_of(name: str):
    """``(rank, buffer)`` when ``name`` names another rank's input or output, else None."""
    buffer, at, rank = name.partition("@")
    return (int(rank), buffer) if at else None


def owner(name: str):
    """The rank whose memory ``name`` is when other ranks may read it (a window slot, or a
    rank's buffers read by its peers), else None."""
    found = peer_of(name)
    return found[0] if found is not None else slot_owner(name)


# Immutable records are NamedTuples: a schedule at p = 1024 holds millions of them, and a
# NamedTuple builds in half the time of a frozen dataclass.

class Region(NamedTuple):
    """A contiguous run of ``count`` elements at ``offset`` in ``buffer``."""

    buffer: str
    offset: int
    count: int

    @property
    def stop(self) -> int:
        return self.offset + self.count

    def overlaps(self, other: "Region") -> bool:
        return (self.buffer == other.buffer and self.count and other.count
                and self.offset < other.stop and other.offset < self.stop)

    def sub(self, offset: int, count: int) -> "Region":
        """Return the region ``count`` elements long at ``offset`` within this one."""
        return Region(self.buffer, self.offset + offset, count)


class Send(NamedTuple):
    peer: int
    region: Region


class Recv(NamedTuple):
    peer: int
    region: Region


class Post(NamedTuple):
    """Publish this rank's writes so far to its node: its ``count``-th post (from 1)."""

    count: int


class Await(NamedTuple):
    """Wait until ``peer``, a rank of this node, has made ``count`` posts in this collective
    (0: until it has finished the previous collective on the window)."""

    peer: int
    count: int


class Collective(NamedTuple):
    """The MPI library's own collective ``kind`` (a name of
    :data:`mlcomm.algorithms.COLLECTIVES`) on the whole communicator, from ``send`` into
    ``recv``; in place where the two start at the same element. ``count`` is the count MPI
    takes (a reduce-scatter's block, an allgather's contribution); ``root`` for bcast and
    reduce."""

    kind: str
    send: Region
    recv: Region
    count: int
    root: int = 0
    #: the blocking call, else the non-blocking one, polled
    blocking: bool = False
    #: the uneven forms' counts, one per rank (an all-to-all-v's sendcounts, then its
    #: recvcounts); empty for the even forms
    counts: tuple = ()


class Reduce(NamedTuple):
    """``dst = left (op) src``, with ``left`` the first operand (default: ``dst`` itself).

    A ``left`` other than ``dst`` saves the copy into ``dst`` that a two-operand
    reduction would need first.
    """

    dst: Region
    src: Region
    left: Region | None = None

    @property
    def first(self) -> Region:
        """The left operand's region."""
        return self.dst if self.left is None else self.left


class Copy(NamedTuple):
    dst: Region
    src: Region


@dataclass(slots=True)
class Step:
    transfers: list = field(default_factory=list)
    ops: list = field(default_factory=list)


@dataclass(slots=True)
class Schedule:
    """One rank's part of a collective."""

    rank: int
    size: int
    input_count: int
    output_count: int
    scratch_count: int
    steps: list
    #: the ranks of this rank's node in local order, when the schedule uses the window
    node: tuple = ()
    #: elements of this rank's window slot the schedule uses
    slot_count: int = 0
    #: the slots are the window's turn areas, taken in turn (see the module docstring)
    turns: bool = False
    #: the slot area may rotate from one collective to the next (see the module docstring)
    rotates: bool = False

    def transfers(self):
        """Yield ``(step_index, transfer)`` for every transfer."""
        for i, step in enumerate(self.steps):
            for t in step.transfers:
                yield i, t


class Timeline:
    """Build a schedule by time step; empty steps and empty regions vanish.

    Pieces of an algorithm that run concurrently (the two trees of the
    double binary tree) add their work to the same steps.  Sequential
    pieces take steps one after the other (``self.now``). ``slot``: the
    window slot, in elements, that the schedule needs (:meth:`need_slot`).
    """

    def __init__(self, rank: int, size: int):
        self.rank, self.size = rank, size
        self.at: dict[int, Step] = {}
        self.scratch = 0
        self.node: tuple = ()
        self.slot = 0
        self.turns = False
        self.rotates = False
        self.now = 0

    def _step(self, t: int) -> Step:
        step = self.at.get(t)
        if step is None:
            step = self.at[t] = Step()
        return step

    def send(self, t: int, peer: int, region: Region) -> None:
        if region.count and peer != self.rank:
            self._step(t).transfers.append(Send(peer, region))

    def recv(self, t: int, peer: int, region: Region) -> None:
        if region.count and peer != self.rank:
            self._step(t).transfers.append(Recv(peer, region))

    def post(self, t: int, count: int) -> None:
        self._step(t).transfers.append(Post(count))

    def wait(self, t: int, peer: int, count: int) -> None:
        self._step(t).transfers.append(Await(peer, count))

    def need_slot(self, count: int) -> None:
        self.slot = max(self.slot, count)

    def reduce(self, t: int, dst: Region, src: Region, left: Region | None = None) -> None:
        """``dst = left (op) src`` (``left`` defaults to ``dst``)."""
        if dst.count:
            self._step(t).ops.append(Reduce(dst, src, None if left == dst else left))

    def copy(self, t: int, dst: Region, src: Region) -> None:
        if dst.count and dst != src:
            self._step(t).ops.append(Copy(dst, src))

    def need_scratch(self, count: int) -> None:
        self.scratch = max(self.scratch, count)

    def schedule(self, input_count: int, output_count: int) -> Schedule:
        steps = [self.at[t] for t in sorted(self.at) if self.at[t].transfers or self.at[t].ops]
        return Schedule(self.rank, self.size, input_count, output_count,
                        self.scratch, steps, self.node, self.slot, self.turns, self.rotates)


def chunk_bounds(count: int, parts: int) -> list[int]:
    """Split ``count`` elements into ``parts`` near-equal chunks; return ``parts+1`` offsets."""
    return [i * count // parts for i in range(parts + 1)]
