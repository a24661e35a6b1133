"""Reduce-scatter, all-gather, broadcast and reduce through the node window (one node).

Each writes what it contributes into its own slot and posts it; readers await the owners'
posts and copy or reduce from the slots in place, in local-rank order (the same bits on
every rank). A vector larger than half a slot goes in chunks through the two halves in
turn; before a rank writes a half again it awaits the posts that say every reader has
finished with it. Every rank posts equally often, and last after its last read. Above the
turn areas' size a call's area of the slot rotates, as ``shared_memory``'s does.
"""

from __future__ import annotations

from ..ir.schedule import INPUT, OUTPUT, Region
from ._registry import register
from ._window import (COPY, DEFAULT_SLOT_BYTES, more_than_one, node_timeline, one_node,
                      reduce_as_posted, rounds, through_slots)

__all__ = ["reduce_scatter", "allgather", "bcast", "reduce"]


def _setup(rank, size, nodes, name):
    return node_timeline(rank, size, nodes, f"{name} through shared memory",
                         "'ring' or 'binary_tree'")


def reduce_scatter(rank, size, count, itemsize, nodes=None, slot_bytes=DEFAULT_SLOT_BYTES):
    """Input holds p blocks of ``count``; rank r reduces block r of every slot, in place."""
    node, tl = _setup(rank, size, nodes, "reduce_scatter")
    if size == 1 or count == 0:
        tl.copy(0, Region(OUTPUT, 0, count), Region(INPUT, 0, count))
        return tl.schedule(size * count, count)
    sync, chunk, starts = rounds(tl, node, count, slot_bytes, itemsize, size)

    def read(t, c, base, a, posted):
        m = min(chunk, count - a)
        return reduce_as_posted(tl, t, sync, posted, Region(OUTPUT, a, m), base + rank * chunk,
                                m)

    # block b's chunk at b * chunk in each half
    through_slots(tl, sync, chunk, starts, size, [(b, b * count, count) for b in range(size)],
                  read=read)
    return tl.schedule(size * count, count)


def allgather(rank, size, count, itemsize, nodes=None, slot_bytes=DEFAULT_SLOT_BYTES):
    """Rank r's ``count`` elements land in block r of every output, read from r's slot."""
    node, tl = _setup(rank, size, nodes, "allgather")
    tl.copy(0, Region(OUTPUT, rank * count, count), Region(INPUT, 0, count))
    if size == 1 or count == 0:
        return tl.schedule(count, size * count)
    sync, chunk, starts = rounds(tl, node, count, slot_bytes, itemsize)
    through_slots(tl, sync, chunk, starts, 1, [(0, 0, count)],
                  [(q, 0, q * count, count) for q in node if q != rank])
    return tl.schedule(count, size * count)


def bcast(rank, size, count, itemsize, nodes=None, slot_bytes=DEFAULT_SLOT_BYTES, root=0):
    """The root writes each chunk into its slot; every other rank copies it out."""
    node, tl = _setup(rank, size, nodes, "bcast")
    if rank == root:
        tl.copy(0, Region(OUTPUT, 0, count), Region(INPUT, 0, count))
    if size == 1 or count == 0:
        return tl.schedule(count if rank == root else 0, count)
    sync, chunk, starts = rounds(tl, node, count, slot_bytes, itemsize)
    if rank == root:
        through_slots(tl, sync, chunk, starts, 1, [(0, 0, count)])
    else:
        through_slots(tl, sync, chunk, starts, 1, [], [(root, 0, 0, count)])
    return tl.schedule(count if rank == root else 0, count)


def reduce(rank, size, count, itemsize, nodes=None, slot_bytes=DEFAULT_SLOT_BYTES, root=0):
    """Every rank writes each chunk into its slot; the root reduces them in local order."""
    node, tl = _setup(rank, size, nodes, "reduce")
    if size == 1 or count == 0:
        if rank == root:
            tl.copy(0, Region(OUTPUT, 0, count), Region(INPUT, 0, count))
        return tl.schedule(count, count if rank == root else 0)
    sync, chunk, starts = rounds(tl, node, count, slot_bytes, itemsize)

    def read(t, c, base, a, posted):
        if rank != root:
            return t + 1
        m = min(chunk, count - a)
        return reduce_as_posted(tl, t, sync, posted, Region(OUTPUT, a, m), base, m)

    through_slots(tl, sync, chunk, starts, 1, [(0, 0, count)], read=read)
    return tl.schedule(count, count if rank == root else 0)


def _cost(p, nbytes, alpha, beta, gamma, **_):
    return 2 * alpha / 4 + 2 * nbytes * COPY * beta + (p - 1) / p * nbytes * gamma


def _refuse(layout, device):
    """Host buffers, every rank on one node (across nodes: the flat algorithms)."""
    return one_node(layout, device, "ring or binary_tree")


_WHERE = {"context": ("nodes", "slot_bytes"), "refuse": _refuse, "weigh": more_than_one}
register("shared_memory", "reduce_scatter", reduce_scatter, _cost, aliases=("shm",), **_WHERE)
register("shared_memory", "allgather", allgather, _cost, aliases=("shm",), **_WHERE)
register("shared_memory", "bcast", bcast, _cost, {"root": 0}, aliases=("shm",), **_WHERE)
register("shared_memory", "reduce", reduce, _cost, {"root": 0}, aliases=("shm",), **_WHERE)
