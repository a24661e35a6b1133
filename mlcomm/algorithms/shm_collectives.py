"""Reduce-scatter, all-gather, broadcast and reduce through the node window (one node).

Each writes what it contributes into its own slot and posts it; readers await the owners'
posts and copy or reduce from the slots in place, in local-rank order (the same bits on
every rank). A vector larger than half a slot goes in chunks through the two halves in
turn; before a rank writes a half again it awaits the posts that say every reader has
finished with it. Every rank posts equally often, and last after its last read. Above the
turn areas' size a call's area of the slot rotates, as ``shared_memory``'s does.
"""

from __future__ import annotations

from ..ir.schedule import INPUT, OUTPUT, Region, Timeline, slot
from ._common import elements
from ._registry import register
from ._window import (COPY, DEFAULT_SLOT_BYTES, Barriers, exchange, need_same_slot, one_node,
                      reduce_as_posted, whole_node)

__all__ = ["reduce_scatter", "allgather", "bcast", "reduce"]


def _setup(rank, size, nodes, name):
    node = whole_node(rank, size, nodes, f"{name} through shared memory",
                      "'ring' or 'binary_tree'")
    tl = Timeline(rank, size)
    return node, tl


def _chunks(total, slot_bytes, itemsize):
    """Chunk length (elements, at most half a slot) and the chunk starts over ``total``."""
    half = elements("slot_bytes", slot_bytes, itemsize) // 2
    chunk = max(1, min(half, total))
    return chunk, list(range(0, total, chunk)) or [0]


def _window(tl, node, count, slot_bytes, itemsize):
    """The node's barriers begun, and the chunks of ``count`` through both slot halves."""
    sync = Barriers(tl, node)
    sync.begin(0)
    chunk, starts = _chunks(count, slot_bytes, itemsize)
    need_same_slot(tl, 2 * chunk if len(starts) > 1 else chunk, itemsize)
    return sync, chunk, starts


def reduce_scatter(rank, size, count, itemsize, nodes=None, slot_bytes=DEFAULT_SLOT_BYTES):
    """Input holds p blocks of ``count``; rank r reduces block r of every slot, in place."""
    node, tl = _setup(rank, size, nodes, "reduce_scatter")
    if size == 1 or count == 0:
        tl.copy(0, Region(OUTPUT, 0, count), Region(INPUT, 0, count))
        return tl.schedule(size * count, count)
    sync = Barriers(tl, node)
    sync.begin(0)
    per = max(1, elements("slot_bytes", slot_bytes, itemsize) // 2 // size)
    chunk, starts = min(per, count), list(range(0, count, min(per, count)))
    need_same_slot(tl, 2 * size * chunk if len(starts) > 1 else size * chunk, itemsize)
    me = node.index(rank)

    def write(t, c, base, a):
        m = min(chunk, count - a)
        for b in range(size):  # block b's chunk, at b * chunk in this half
            tl.copy(t, Region(slot(rank), base + b * chunk, m), Region(INPUT, b * count + a, m))

    def read(t, c, base, a, posted):
        m = min(chunk, count - a)
        return reduce_as_posted(tl, t, sync, posted, Region(OUTPUT, a, m), base + me * chunk, m)

    exchange(tl, sync, chunk * size, starts, write, read)
    return tl.schedule(size * count, count)


def allgather(rank, size, count, itemsize, nodes=None, slot_bytes=DEFAULT_SLOT_BYTES):
    """Rank r's ``count`` elements land in block r of every output, read from r's slot."""
    node, tl = _setup(rank, size, nodes, "allgather")
    tl.copy(0, Region(OUTPUT, rank * count, count), Region(INPUT, 0, count))
    if size == 1 or count == 0:
        return tl.schedule(count, size * count)
    sync, chunk, starts = _window(tl, node, count, slot_bytes, itemsize)

    def write(t, c, base, a):
        m = min(chunk, count - a)
        tl.copy(t, Region(slot(rank), base, m), Region(INPUT, a, m))

    def read(t, c, base, a, posted):
        m = min(chunk, count - a)
        for q in node:
            if q != rank:
                sync.wait(t, q, posted)
                tl.copy(t, Region(OUTPUT, q * count + a, m), Region(slot(q), base, m))
                t += 1
        return t

    exchange(tl, sync, chunk, starts, write, read)
    return tl.schedule(count, size * count)


def bcast(rank, size, count, itemsize, nodes=None, slot_bytes=DEFAULT_SLOT_BYTES, root=0):
    """The root writes each chunk into its slot; every other rank copies it out."""
    node, tl = _setup(rank, size, nodes, "bcast")
    whole = Region(OUTPUT, 0, count)
    if rank == root:
        tl.copy(0, whole, Region(INPUT, 0, count))
    if size == 1 or count == 0:
        return tl.schedule(count if rank == root else 0, count)
    sync, chunk, starts = _window(tl, node, count, slot_bytes, itemsize)

    def write(t, c, base, a):
        if rank == root:
            m = min(chunk, count - a)
            tl.copy(t, Region(slot(rank), base, m), Region(INPUT, a, m))

    def read(t, c, base, a, posted):
        if rank != root:
            m = min(chunk, count - a)
            sync.wait(t, root, posted)
            tl.copy(t, Region(OUTPUT, a, m), Region(slot(root), base, m))
        return t + 1

    exchange(tl, sync, chunk, starts, write, read)
    return tl.schedule(count if rank == root else 0, count)


def reduce(rank, size, count, itemsize, nodes=None, slot_bytes=DEFAULT_SLOT_BYTES, root=0):
    """Every rank writes each chunk into its slot; the root reduces them in local order."""
    node, tl = _setup(rank, size, nodes, "reduce")
    if size == 1 or count == 0:
        if rank == root:
            tl.copy(0, Region(OUTPUT, 0, count), Region(INPUT, 0, count))
        return tl.schedule(count, count if rank == root else 0)
    sync, chunk, starts = _window(tl, node, count, slot_bytes, itemsize)

    def write(t, c, base, a):
        m = min(chunk, count - a)
        tl.copy(t, Region(slot(rank), base, m), Region(INPUT, a, m))

    def read(t, c, base, a, posted):
        if rank != root:
            return t + 1
        m = min(chunk, count - a)
        return reduce_as_posted(tl, t, sync, posted, Region(OUTPUT, a, m), base, m)

    exchange(tl, sync, chunk, starts, write, read)
    return tl.schedule(count, count if rank == root else 0)


def _cost(p, nbytes, alpha, beta, gamma, **_):
    return 2 * alpha / 4 + 2 * nbytes * COPY * beta + (p - 1) / p * nbytes * gamma


def _refuse(layout, device):
    """Host buffers, every rank on one node (across nodes: the flat algorithms)."""
    return one_node(layout, device, "ring or binary_tree")


def _weigh(layout, device):
    """``auto`` takes the window wherever it runs on more than one rank."""
    return layout.size > 1


_WHERE = {"context": ("nodes", "slot_bytes"), "refuse": _refuse, "weigh": _weigh}
register("shared_memory", "reduce_scatter", reduce_scatter, _cost, aliases=("shm",), **_WHERE)
register("shared_memory", "allgather", allgather, _cost, aliases=("shm",), **_WHERE)
register("shared_memory", "bcast", bcast, _cost, {"root": 0}, aliases=("shm",), **_WHERE)
register("shared_memory", "reduce", reduce, _cost, {"root": 0}, aliases=("shm",), **_WHERE)
