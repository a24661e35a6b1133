"""Shared-memory all-reduce for the ranks of one node, through each rank's window slot.

Small vectors are written once and read by all: each rank copies its vector into its slot,
one node barrier, then every rank reduces every slot in local-rank order (so every rank
gets the same bits). Up to :data:`mlcomm.ir.schedule.TURN_BYTES` the slot is one of the
window's two turn areas, taken in turn, so a rank writes it without waiting for its peers
to finish reading the previous collective (``Schedule.turns``). Larger vectors go in
chunks of at most half a slot: each chunk is reduce-scattered (local rank j reduces part j
of every slot into its slot's result area) and all-gathered (every rank copies every part
from its owner's result area), two barriers a chunk, the next chunk's copy into the other
half of the slot overlapping this chunk's gather. Above the turn areas' size, where the
slot holds that many times over, the area rotates from one call to the next
(:func:`._window.need_same_slot`, :data:`mlcomm.transport.window.ROTATIONS`). Where the
node allows single-copy reads of a peer's memory (:mod:`mlcomm.transport.peer`), vectors
of at least ``single_copy_bytes`` skip the window: local rank j reads part j of every
peer's input (a scratch chunk at a time), reduces it and writes each reduced chunk into
every peer's output; a last barrier keeps every rank in the call until its peers have
finished with its buffers. A barrier is a post of this rank's node flag and an await of
every other rank's; a last post says this rank has finished reading the window, which the
next collective's first awaits check before it writes its slot again.
"""

from __future__ import annotations

from ..ir.schedule import INPUT, OUTPUT, TURN_BYTES, Region, Timeline, chunk_bounds, slot
from ._common import elements
from ._registry import register
from ._window import (COPY, DEFAULT_SLOT_BYTES, SINGLE_COPY_BYTES, Barriers, await_addresses,
                      need_same_slot, one_node, read_steps, reduce_as_posted,
                      reduce_from_peers, whole_node)

__all__ = ["build", "cost", "by_single_copy", "SMALL_BYTES", "CHUNK_BYTES"]

#: vectors up to this many bytes take the write-once, read-by-all path
SMALL_BYTES = 16 << 10
#: the pipeline's chunk when the call does not say: small enough that a chunk's window
#: traffic stays in cache, large enough that its synchronisations are few
CHUNK_BYTES = 512 << 10


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
        need_same_slot(tl, count, itemsize)
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
    need_same_slot(tl, half * (2 if len(starts) > 1 else 1), itemsize)

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


def refuse(layout, device):
    """Host buffers, every rank on one node (across nodes: ``hierarchical``)."""
    return one_node(layout, device, "hierarchical")


def weigh(layout, device):
    """``auto`` weighs it wherever it runs on more than one rank."""
    return layout.size > 1


register("shared_memory", "allreduce", build, cost,
         {"small_bytes": SMALL_BYTES, "chunk_bytes": None,
          "single_copy_bytes": SINGLE_COPY_BYTES}, aliases=("shm",),
         context=("nodes", "slot_bytes", "single_copy"), refuse=refuse, weigh=weigh)
