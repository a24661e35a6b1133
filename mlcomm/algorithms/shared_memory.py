"""Shared-memory all-reduce for the ranks of one node, through each rank's window slot.

Small vectors are written once and read by all: each rank copies its vector into its slot,
one node barrier, then every rank reduces every slot in local-rank order (so every rank
gets the same bits). Up to :data:`mlcomm.ir.schedule.TURN_BYTES` the slot is one of the
window's two turn areas, taken in turn, so a rank writes it without waiting for its peers
to finish reading the previous collective (``Schedule.turns``). Larger vectors go in chunks
of at most half a slot: each chunk is reduce-scattered (local rank j reduces part j of
every slot into its slot's result area) and all-gathered (every rank copies every part from
its owner's result area), two barriers a chunk, the next chunk's copy into the other half
of the slot overlapping this chunk's gather. Where the node allows single-copy reads of a
peer's memory (:mod:`mlcomm.transport.peer`), vectors of at least ``single_copy_bytes``
skip the window: local rank j reads part j of every peer's input (a scratch chunk at a
time), reduces it and writes each reduced chunk into every peer's output; a last barrier
keeps every rank in the call until its peers have finished with its buffers. A barrier is a
post of this rank's node flag and an await of every other rank's; a last post says this
rank has finished reading the window, which the next collective's first awaits check before
it writes its slot again.
"""

from __future__ import annotations

from ..ir.schedule import (INPUT, OUTPUT, SCRATCH, TURN_BYTES, Region, Timeline, chunk_bounds, peer,
    slot)
from ._common import elements
from ._registry import register

__all__ = ["build", "cost", "node_of", "whole_node", "Barriers", "exchange", "reduce_as_posted",
           "await_addresses", "reduce_from_peers", "write_to_peers", "read_steps",
           "SMALL_BYTES", "CHUNK_BYTES", "SINGLE_COPY_BYTES", "READ_CHUNK_BYTES", "COPY",
           "DEFAULT_SLOT_BYTES"]

#: vectors up to this many bytes take the write-once, read-by-all path
SMALL_BYTES = 16 << 10
#: each rank's window slot when the communicator does not say (``MLCOMM_SHM_BYTES``)
DEFAULT_SLOT_BYTES = 4 << 20
#: the pipeline's chunk when the call does not say: small enough that a chunk's window
#: traffic stays in cache, large enough that its synchronisations are few
CHUNK_BYTES = 512 << 10
#: vectors from this many bytes read their peers' inputs and write their outputs in place of
#: the window's copies, where the node allows it
SINGLE_COPY_BYTES = 64 << 10
#: a single-copy reduce-scatter reads a peer's part this much at a time into scratch
#: (``bench/cma_probe.py --read-chunk`` times other sizes)
READ_CHUNK_BYTES = 512 << 10
#: a copy through the window, per byte, as a fraction of beta: a message through MPI's
#: shared memory is two copies (into a shared cell and out), the window's one
COPY = 0.5


def node_of(rank: int, size: int, nodes) -> tuple:
    """The ranks of ``rank``'s node in local order (every rank when ``nodes`` is None)."""
    if nodes is None:
        return tuple(range(size))
    for node in nodes:
        if rank in node:
            return tuple(node)
    raise ValueError(f"nodes={nodes!r} does not place rank {rank}")


def whole_node(rank: int, size: int, nodes, what: str, instead: str) -> tuple:
    """:func:`node_of`, which must hold every rank: else a ValueError saying that ``what``
    needs one node, and to use ``instead``."""
    node = node_of(rank, size, nodes)
    if len(node) != size:
        raise ValueError(f"{what} needs every rank on one node; this communicator spans "
                         f"{len(nodes)} nodes: use {instead}")
    return node


class Barriers:
    """A rank's posts on its node flag in one collective, and the awaits that pair with them."""

    def __init__(self, tl: Timeline, node: tuple):
        self.tl, self.node, self.posts = tl, node, 0
        tl.node = node

    def begin(self, t: int) -> None:
        """Wait until every rank of the node has finished the previous collective."""
        for q in self.node:
            self.tl.wait(t, q, 0)

    def take_turn(self, t: int) -> None:
        """Begin on the window's turn areas instead (``Schedule.turns``): no wait for the
        previous collective's readers, only this rank's own await that takes the flag base.
        The collective must then await a post of every other rank of the node."""
        self.tl.turns = True
        self.tl.wait(t, self.tl.rank, 0)

    def post(self, t: int) -> int:
        """Publish this rank's writes so far; return the post's number."""
        self.posts += 1
        self.tl.post(t, self.posts)
        return self.posts

    def wait(self, t: int, q: int, count: int) -> None:
        """Wait for rank ``q``'s post ``count`` (nothing for this rank's own)."""
        if q != self.tl.rank:
            self.tl.wait(t, q, count)

    def barrier(self, t: int) -> None:
        """Publish this rank's writes so far and wait for every other rank's."""
        count = self.post(t)
        for q in self.node:
            self.wait(t, q, count)

    def end(self, t: int) -> None:
        """Say that this rank has finished reading the window."""
        self.post(t)


def reduce_as_posted(tl, t, sync, post, dst, at, count):
    """``dst = slot[node[0]] ⊕ slot[node[1]] ⊕ …`` in local order, each slot awaited (its
    owner's post ``post``) in the step that first reads it, so a rank reduces what has
    arrived while later ranks are still writing. Returns the first slot after it."""
    node = sync.node
    for k, q in enumerate(node):
        step = t + max(k - 1, 0)
        sync.wait(step, q, post)
        if k:
            tl.reduce(step, dst, Region(slot(q), at, count),
                      left=Region(slot(node[0]), at, count) if k == 1 else None)
    if len(node) == 1:
        tl.copy(t, dst, Region(slot(node[0]), at, count))
    return t + max(len(node) - 1, 1)


def exchange(tl, sync, half, starts, write, read, t=0, reads=None):
    """Rounds through the two halves of each slot (``half`` elements each): in round c every
    rank writes (``write(t, c, base, a)``, ``base`` the half's first element, ``a`` the
    round's ``starts[c]``), posts, reads once the writers it needs have posted
    (``read(t, c, base, a, posted)`` returns the next free step), and posts that it has
    read. A half is written again only after every rank's read post for it. ``reads``
    carries the read posts (and the halves' turns) on from an earlier exchange of the same
    collective. Returns the next free step."""
    reads = [] if reads is None else reads
    for a in starts:
        c = len(reads)
        base = (c % 2) * half
        if c >= 2:  # every rank has read this half two rounds ago
            for q in sync.node:
                sync.wait(t, q, reads[c - 2])
        write(t, c, base, a)
        t += 1
        posted = sync.post(t)
        t = read(t, c, base, a, posted)
        reads.append(sync.post(t))
    return t


def _read_chunks(lo, hi, itemsize):
    """``[(first element, count), ...]``: a part read :data:`READ_CHUNK_BYTES` at a time."""
    chunk = max(1, min(hi - lo, READ_CHUNK_BYTES // itemsize))
    return [(a, min(chunk, hi - a)) for a in range(lo, hi, chunk)]


def reduce_from_peers(tl, t, node, rank, lo, hi, itemsize, spread):
    """Reduce elements ``lo:hi`` of every node rank's input, in local order, into this rank's
    output, reading each peer's :data:`READ_CHUNK_BYTES` at a time into scratch; with
    ``spread``, each reduced chunk also into every peer's output, while this rank's cache
    holds it. In place, a peer's ``lo:hi`` is overwritten only by this rank, its only reader,
    after reading it. The peers' addresses must have been awaited. Returns the next free step."""
    chunks = _read_chunks(lo, hi, itemsize)
    width = max([n for _, n in chunks], default=0)
    for a, n in chunks:
        # partial results in the first scratch chunk, the last straight into the output
        # (in place, this rank's input is read before the output is written)
        total, fetched = Region(SCRATCH, 0, n), Region(SCRATCH, width, n)
        first = None
        for k, q in enumerate(node):
            operand = Region(INPUT, a, n) if q == rank else (total if k == 0 else fetched)
            if q != rank:
                tl.copy(t, operand, Region(peer(INPUT, q), a, n))
            if k:
                dst = Region(OUTPUT, a, n) if k == len(node) - 1 else total
                tl.reduce(t, dst, operand, left=first if k == 1 else total)
            first = operand
        if spread:
            write_to_peers(tl, t, node, rank, a, n)
        t += 1
    tl.need_scratch(2 * width)
    return t


def write_to_peers(tl, t, node, rank, a, n):
    """Copy this rank's output ``a:a+n`` into every other node rank's output."""
    for q in node:
        if q != rank:
            tl.copy(t, Region(peer(OUTPUT, q), a, n), Region(OUTPUT, a, n))


def read_steps(bounds, itemsize) -> int:
    """The most read chunks any one part of ``bounds`` takes (aligns the last barrier)."""
    return max(len(_read_chunks(bounds[j], bounds[j + 1], itemsize))
               for j in range(len(bounds) - 1))


def await_addresses(sync) -> int:
    """Publish this rank's buffers' addresses (post 1) and await every peer's; returns the
    first step that may read or write a peer's buffers."""
    data = sync.post(1)
    for q in sync.node:
        sync.wait(2, q, data)
    return 2


def by_single_copy(tl, sync, node, rank, count, itemsize):
    """Reduce-scatter by reading this rank's part of every peer's input and all-gather by
    writing each reduced chunk into every peer's output (:func:`reduce_from_peers`); then a
    barrier, after which every output is whole and no peer touches this rank's buffers."""
    parts = chunk_bounds(count, len(node))
    local = node.index(rank)
    t = await_addresses(sync)
    reduce_from_peers(tl, t, node, rank, parts[local], parts[local + 1], itemsize, True)
    sync.barrier(t + read_steps(parts, itemsize))


def build(rank, size, count, itemsize, nodes=None, slot_bytes=DEFAULT_SLOT_BYTES,
          small_bytes=SMALL_BYTES, chunk_bytes=None, single_copy=False,
          single_copy_bytes=SINGLE_COPY_BYTES):
    """All-reduce through the node window, each slot read as soon as its owner has posted
    it; every rank of ``nodes`` (default: all ranks) must be on one node.

    ``small_bytes``: the largest vector written once and read by all; ``chunk_bytes``: the
    pipeline's chunk (default :data:`CHUNK_BYTES`, at most half a slot less the result
    area); ``single_copy``: whether the node allows reads of a peer's memory (the session
    says), used from ``single_copy_bytes`` on.
    """
    node = whole_node(rank, size, nodes, "algorithm='shared_memory'", "algorithm='hierarchical'")
    tl = Timeline(rank, size)
    whole, mine = Region(OUTPUT, 0, count), Region(INPUT, 0, count)
    if size == 1 or count == 0:
        tl.copy(0, whole, mine)
        return tl.schedule(count, count)
    local = node.index(rank)
    slot_elems = elements("slot_bytes", slot_bytes, itemsize)
    sync = Barriers(tl, node)
    nbytes = count * itemsize
    if single_copy and nbytes >= elements("single_copy_bytes", single_copy_bytes, 1):
        sync.begin(0)
        by_single_copy(tl, sync, node, rank, count, itemsize)
        return tl.schedule(count, count)
    small = nbytes <= elements("small_bytes", small_bytes, 1) and count <= slot_elems
    if small and nbytes <= TURN_BYTES:
        sync.take_turn(0)
    else:
        sync.begin(0)
    if small:
        tl.need_slot(count)
        tl.copy(0, Region(slot(rank), 0, count), mine)
        posted = sync.post(1)
        t = reduce_as_posted(tl, 1, sync, posted, whole, 0, count)
        sync.end(t)
        return tl.schedule(count, count)
    # a slot half holds a chunk and its result part: chunk + ceil(chunk / L) <= slot / 2
    L = len(node)
    fits = (slot_elems // 2) * L // (L + 1)
    chunk = min(fits, elements("chunk_bytes", chunk_bytes or CHUNK_BYTES, itemsize), count)
    if chunk < L and count >= L:
        raise ValueError(f"slot_bytes={slot_bytes} leaves chunks of {chunk} elements for "
                         f"{L} ranks: give the window more bytes (MLCOMM_SHM_BYTES)")
    half = chunk + -(-chunk // L)  # the slot elements one chunk uses
    starts = list(range(0, count, chunk))
    tl.need_slot(half * (2 if len(starts) > 1 else 1))

    def copy_in(t, c):
        """The chunk's parts that other ranks reduce, into this rank's slot half; its own
        part only when it must be staged (see reduce_part)."""
        a, base = starts[c], (c % 2) * half
        parts = chunk_bounds(min(chunk, count - a), L)
        for j in range(L):
            if j != local or local >= 2:
                lo, hi = parts[j], parts[j + 1]
                tl.copy(t, Region(slot(rank), base + lo, hi - lo), Region(INPUT, a + lo, hi - lo))

    copy_in(0, 0)
    t = 1
    for c, a in enumerate(starts):
        m = min(chunk, count - a)
        base = (c % 2) * half
        parts = chunk_bounds(m, L)
        lo, hi = parts[local], parts[local + 1]
        n = hi - lo
        # reduce-scatter: this rank's part, every rank's contribution in local order, its
        # own read where it lies (staged in its slot from local rank 2 on: in place, the
        # output it writes first is its input)
        data = sync.post(t)
        out = Region(OUTPUT, a + lo, n)
        operand = lambda q: Region(INPUT, a + lo, n) if q == rank and local < 2 else \
            Region(slot(q), base + lo, n)
        for k, q in enumerate(node):
            step = t + max(k - 1, 0)
            sync.wait(step, q, data)
            if k:
                tl.reduce(step, out, operand(q), left=operand(node[0]) if k == 1 else None)
        t += L - 1
        tl.copy(t, Region(slot(rank), base + chunk, n), out)  # for the other ranks
        t += 1
        # all-gather: each other part from its owner's result area, once posted
        done = sync.post(t)
        if c + 1 < len(starts):  # the next chunk goes into the other half meanwhile
            copy_in(t, c + 1)
        for j, q in enumerate(node):
            if q != rank:
                lo, hi = parts[j], parts[j + 1]
                sync.wait(t, q, done)
                tl.copy(t, Region(OUTPUT, a + lo, hi - lo),
                        Region(slot(q), base + chunk, hi - lo))
                t += 1
    sync.end(t)
    return tl.schedule(count, count)


def cost(p, nbytes, alpha, beta, gamma, nodes=None, slot_bytes=DEFAULT_SLOT_BYTES,
         small_bytes=SMALL_BYTES, chunk_bytes=None, single_copy=False,
         single_copy_bytes=SINGLE_COPY_BYTES):
    """A barrier costs about alpha/4 (flags in shared cache lines, no message), a copy
    (through the window or from a peer) ``COPY * beta`` per byte, a reduction gamma per
    byte."""
    copy = COPY * beta
    if p == 1:
        return nbytes * copy
    sync = alpha / 4
    if single_copy and nbytes >= single_copy_bytes:
        return 2 * sync + (p - 1) / p * nbytes * (2 * copy + gamma)
    if nbytes <= small_bytes:  # a turn has no wait for the previous collective
        return (1 if nbytes <= TURN_BYTES else 2) * sync + nbytes * copy + \
            (p - 1) * nbytes * gamma
    chunk = max(1, min(slot_bytes // 2 * p // (p + 1), chunk_bytes or CHUNK_BYTES))
    chunks = -(-nbytes // chunk)
    return 2 * chunks * sync + 2 * nbytes * copy + (p - 1) / p * nbytes * gamma


register("shared_memory", "allreduce", build, cost,
         {"small_bytes": SMALL_BYTES, "chunk_bytes": None,
          "single_copy_bytes": SINGLE_COPY_BYTES}, aliases=("shm",),
         context=("nodes", "slot_bytes", "single_copy"))
