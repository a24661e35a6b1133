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
from ._window import (DEFAULT_SLOT_BYTES, more_than_one, node_timeline, one_node,
                      reduce_as_posted, rounds, through_slots, window_cost)

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


# The busiest rank's copies and reductions, in blocks of ``nbytes`` (the count the schedule
# takes: a reduce-scatter's or all-gather's block, a broadcast's or reduce's vector).
_ONE, _EACH, _BUT_ONE = (lambda p: 1), (lambda p: p), (lambda p: p - 1)
#: reduce-scatter: p blocks into its slot's areas, p - 1 peers' block r reduced
_REDUCE_SCATTER = window_cost(_EACH, _EACH, _BUT_ONE)
#: all-gather: its block into its slot, p - 1 peers' blocks out
_ALLGATHER = window_cost(_EACH, _ONE)
#: broadcast: the root's write and a reader's copy out
_BCAST = window_cost(lambda p: 2, _ONE)
#: reduce: every rank's write; the root reduces p - 1 peers' slots
_REDUCE = window_cost(_ONE, _ONE, _BUT_ONE)


def _refuse(layout, device):
    """Host buffers, every rank on one node (across nodes: the flat algorithms)."""
    return one_node(layout, device, "ring or binary_tree")


_WHERE = {"context": ("nodes", "slot_bytes"), "refuse": _refuse, "weigh": more_than_one}
register("shared_memory", "reduce_scatter", reduce_scatter, _REDUCE_SCATTER, aliases=("shm",),
         **_WHERE)
register("shared_memory", "allgather", allgather, _ALLGATHER, aliases=("shm",), **_WHERE)
register("shared_memory", "bcast", bcast, _BCAST, {"root": 0}, aliases=("shm",), **_WHERE)
register("shared_memory", "reduce", reduce, _REDUCE, {"root": 0}, aliases=("shm",), **_WHERE)
