"""Gather, scatter, all-to-all and the uneven collectives through the node window (one node).

Each rank writes the blocks it contributes into its own slot and posts them; readers await
the owners' posts and copy their blocks out of the owners' slots (a reduce-scatter reduces
them, in local-rank order). A gather's or all-gather's slot holds the rank's own block; a
scatter's, all-to-all's or reduce-scatter's holds one area per rank, the block for rank j in
area j. A rank's own block goes from its input to its output directly. Blocks longer than an
area of half a slot go in chunks through the two halves in turn (:func:`._window.rounds`),
as in :mod:`.shm_collectives`: every rank takes the longest block's rounds, so every rank
posts equally often, and last after its last read.

The uneven forms chunk so where every rank knows every count: ``allgatherv`` and
``reduce_scatter_v``, and ``gatherv`` and ``scatterv``, which here take ``counts`` on every
rank. ``alltoallv``, where a rank knows only its own row and column, takes one round through
areas of half a slot over p; a block larger than an area is refused.
"""

from __future__ import annotations

from ..ir.schedule import INPUT, OUTPUT, Region
from ._common import check_counts, check_int, elements, starts
from ._registry import register
from ._window import (DEFAULT_SLOT_BYTES, more_than_one, node_timeline, one_node,
                      reduce_as_posted, rounds, through_slots, window_cost as _cost)

__all__ = ["gather", "scatter", "alltoall", "allgatherv", "reduce_scatter_v", "gatherv",
           "scatterv", "alltoallv"]

_EVERY_RANK = "every rank takes the rounds of the longest block through the window"


# --- options -----------------------------------------------------------------------------

def _root(root, size):
    return check_int("root", root, 0, size - 1, "give the rank of the root")


# --- the exchange ------------------------------------------------------------------------

def _setup(rank, size, nodes, name):
    return node_timeline(rank, size, nodes, f"{name} through shared memory",
                         f"a flat {name} algorithm")


def _through(tl, node, slot_bytes, itemsize, parts, longest, writes, reads=(), read=None):
    """``writes`` and ``reads`` (:func:`._window.through_slots`) in the rounds of blocks up
    to ``longest`` through halves of ``parts`` areas; nothing on one rank or where every
    block is empty. ``read(sync, chunk)`` makes a round's read in place of the copies."""
    if tl.size == 1 or longest == 0:
        return
    sync, chunk, starts = rounds(tl, node, longest, slot_bytes, itemsize, parts)
    through_slots(tl, sync, chunk, starts, parts, writes, reads,
                  read and read(sync, chunk))


def _gather(rank, size, count, itemsize, nodes, slot_bytes, root, counts, name):
    node, tl = _setup(rank, size, nodes, name)
    at = starts(counts)
    if rank == root:
        tl.copy(0, Region(OUTPUT, at[root], count), Region(INPUT, 0, count))
        _through(tl, node, slot_bytes, itemsize, 1, max(counts), [],
                 [(q, 0, at[q], counts[q]) for q in node if q != root])
    else:
        _through(tl, node, slot_bytes, itemsize, 1, max(counts), [(0, 0, count)])
    return tl.schedule(count, at[-1] if rank == root else 0)


def _scatter(rank, size, count, itemsize, nodes, slot_bytes, root, counts, name):
    node, tl = _setup(rank, size, nodes, name)
    at = starts(counts)
    if rank == root:
        tl.copy(0, Region(OUTPUT, 0, count), Region(INPUT, at[root], count))
        _through(tl, node, slot_bytes, itemsize, size, max(counts),
                 [(j, at[j], counts[j]) for j in range(size) if j != root])
    else:
        _through(tl, node, slot_bytes, itemsize, size, max(counts), [], [(root, rank, 0, count)])
    return tl.schedule(at[-1] if rank == root else 0, count)


def _alltoall(tl, node, slot_bytes, itemsize, longest, sendcounts, recvcounts):
    """Block j of the input (``sendcounts``) into area j of the slot; block q of the output
    (``recvcounts``) from area r of q's slot; this rank's own block directly."""
    rank = tl.rank
    send, recv = starts(sendcounts), starts(recvcounts)
    tl.copy(0, Region(OUTPUT, recv[rank], recvcounts[rank]),
            Region(INPUT, send[rank], sendcounts[rank]))
    _through(tl, node, slot_bytes, itemsize, tl.size, longest,
             [(j, send[j], sendcounts[j]) for j in range(tl.size) if j != rank],
             [(q, rank, recv[q], recvcounts[q]) for q in node if q != rank])
    return tl.schedule(send[-1], recv[-1])


# --- the collectives ---------------------------------------------------------------------

def gather(rank, size, count, itemsize, nodes=None, slot_bytes=DEFAULT_SLOT_BYTES, root=0):
    """Every other rank writes its ``count`` elements into its slot; the root copies rank
    j's into block j of its output."""
    root = _root(root, size)
    return _gather(rank, size, count, itemsize, nodes, slot_bytes, root, (count,) * size,
                   "gather")


def scatter(rank, size, count, itemsize, nodes=None, slot_bytes=DEFAULT_SLOT_BYTES, root=0):
    """The root writes block j of its input into area j of its slot; rank j copies it out."""
    root = _root(root, size)
    return _scatter(rank, size, count, itemsize, nodes, slot_bytes, root, (count,) * size,
                    "scatter")


def _rooted_v(build, name, doc):
    """gatherv or scatterv through the window (``build``: :func:`_gather` or
    :func:`_scatter`), its root and counts checked."""
    def rooted_v(rank, size, count, itemsize, nodes=None, slot_bytes=DEFAULT_SLOT_BYTES,
                 root=0, counts=None):
        root = _root(root, size)
        counts = check_counts("counts", counts, size, rank, count, f"{name} through shared "
                         f"memory needs counts on every rank ({_EVERY_RANK})")
        return build(rank, size, count, itemsize, nodes, slot_bytes, root, counts, name)
    rooted_v.__name__ = rooted_v.__qualname__ = name
    rooted_v.__doc__ = doc
    return rooted_v


gatherv = _rooted_v(_gather, "gatherv", """As :func:`gather`, rank j's ``counts[j]`` elements
    packed in the root's output; ``counts`` on every rank.""")
scatterv = _rooted_v(_scatter, "scatterv", """As :func:`scatter`, block j of the root's packed
    input ``counts[j]`` elements long; ``counts`` on every rank.""")


def allgatherv(rank, size, count, itemsize, nodes=None, slot_bytes=DEFAULT_SLOT_BYTES,
               counts=None):
    """Rank j's ``counts[j]`` elements land at their packed place in every output, read
    from j's slot."""
    counts = check_counts("counts", counts, size, rank, count, "allgatherv needs counts")
    node, tl = _setup(rank, size, nodes, "allgatherv")
    at = starts(counts)
    tl.copy(0, Region(OUTPUT, at[rank], count), Region(INPUT, 0, count))
    _through(tl, node, slot_bytes, itemsize, 1, max(counts), [(0, 0, count)],
             [(q, 0, at[q], counts[q]) for q in node if q != rank])
    return tl.schedule(count, at[-1])


def reduce_scatter_v(rank, size, count, itemsize, nodes=None, slot_bytes=DEFAULT_SLOT_BYTES,
                     counts=None):
    """Every rank writes block j of its input (``counts[j]`` long) into area j of its slot;
    rank r reduces area r of every slot, in local order."""
    counts = check_counts("counts", counts, size, rank, count, "reduce_scatter_v needs counts")
    node, tl = _setup(rank, size, nodes, "reduce_scatter_v")
    at = starts(counts)
    if size == 1:
        tl.copy(0, Region(OUTPUT, 0, count), Region(INPUT, 0, count))

    def read(sync, chunk):
        def reduce_area(t, c, base, a, posted):
            m = min(chunk, count - a)
            if m <= 0:
                return t + 1
            return reduce_as_posted(tl, t, sync, posted, Region(OUTPUT, a, m),
                                    base + rank * chunk, m)
        return reduce_area

    _through(tl, node, slot_bytes, itemsize, size, max(counts),
             [(j, at[j], counts[j]) for j in range(size)], read=read)
    return tl.schedule(at[-1], count)


def alltoall(rank, size, count, itemsize, nodes=None, slot_bytes=DEFAULT_SLOT_BYTES):
    """Every rank writes block j of its input into area j of its slot; rank r copies area r
    of rank j's slot into block j of its output."""
    node, tl = _setup(rank, size, nodes, "alltoall")
    return _alltoall(tl, node, slot_bytes, itemsize, count, (count,) * size, (count,) * size)


def alltoallv(rank, size, count, itemsize, nodes=None, slot_bytes=DEFAULT_SLOT_BYTES,
              sendcounts=None, recvcounts=None):
    """As :func:`alltoall`, the blocks packed (``sendcounts``: this rank's row,
    ``recvcounts``: its column), in one round through areas of half a slot over p: no rank
    knows the others' counts, so no rank could tell how many rounds they take. ``count``
    is ignored."""
    why = "alltoallv needs this rank's sendcounts and recvcounts"
    sendcounts = check_counts("sendcounts", sendcounts, size, rank, None, why)
    recvcounts = check_counts("recvcounts", recvcounts, size, rank, sendcounts[rank], why)
    node, tl = _setup(rank, size, nodes, "alltoallv")
    area = elements("slot_bytes", slot_bytes, itemsize) // 2 // size
    for name, counts in (("sendcounts", sendcounts), ("recvcounts", recvcounts)):
        for j in range(size):
            if j != rank and (counts[j] > area or area == 0):
                raise ValueError(f"{name}[{j}]={counts[j]} on rank {rank}: alltoallv through "
                                 f"shared memory takes blocks of at most {area} elements "
                                 f"(slot_bytes={slot_bytes} over 2 * {size} ranks) in one "
                                 f"round; give the window more bytes (MLCOMM_SHM_BYTES) or "
                                 f"use a flat alltoallv algorithm")
    return _alltoall(tl, node, slot_bytes, itemsize, max(1, area), sendcounts, recvcounts)


# --- where they run, and what they cost --------------------------------------------------

def _refuse(layout, device):
    """Host buffers, every rank on one node (across nodes: the flat algorithms)."""
    return one_node(layout, device, "a flat algorithm")


_WHERE = {"context": ("nodes", "slot_bytes"), "refuse": _refuse, "weigh": more_than_one,
          "aliases": ("shm",)}


def _asked_only(layout, device):
    """``auto`` never takes it: gatherv and scatterv through the window need every rank's
    counts (a rank other than the root may have none), and alltoallv's one round refuses a
    block past its area on the ranks that have one, while the others would wait. Named
    (``algorithm='shared_memory'``), it runs."""
    return False


_ASKED = dict(_WHERE, weigh=_asked_only)


def _one(p):
    return 1


def _each(p):  # a block's write, then p - 1 reads (or p - 1 writes, then a read)
    return p


def _both_ways(p):
    return 2 * (p - 1)


_ROOTED, _ROOTED_AREAS = _cost(_each, _one), _cost(_each, _each)
register("shared_memory", "gather", gather, _ROOTED, {"root": 0}, **_WHERE)
register("shared_memory", "scatter", scatter, _ROOTED_AREAS, {"root": 0}, **_WHERE)
register("shared_memory", "alltoall", alltoall, _cost(_both_ways, _each), **_WHERE)
register("shared_memory", "allgatherv", allgatherv, _ROOTED, {"counts": None}, **_WHERE)
register("shared_memory", "reduce_scatter_v", reduce_scatter_v,
         _cost(_each, _each, lambda p: p - 1), {"counts": None}, **_WHERE)
register("shared_memory", "gatherv", gatherv, _ROOTED, {"root": 0, "counts": None}, **_ASKED)
register("shared_memory", "scatterv", scatterv, _ROOTED_AREAS, {"root": 0, "counts": None},
         **_ASKED)
register("shared_memory", "alltoallv", alltoallv,
         _cost(_both_ways, _each, one_round=True, whole_send=True),
         {"sendcounts": None, "recvcounts": None}, **_ASKED)
