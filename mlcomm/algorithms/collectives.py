"""Reduce-scatter, all-gather, broadcast and reduce, built from the all-reduce pieces."""

from ..ir.schedule import INPUT, OUTPUT, SCRATCH, Region, Timeline
from ._common import check_int, elements, log2ceil
from ._pieces import binary_tree, ring_allgather, ring_reduce_scatter, tree_bcast, tree_reduce
from ._registry import register
from .double_binary_tree import DEFAULT_CHUNK_BYTES

__all__ = ["ring_reduce_scatter_block", "ring_allgather_block", "tree_bcast_root", "tree_reduce_root"]


def ring_reduce_scatter_block(rank, size, count, itemsize, segment_bytes=None):
    """Ring reduce-scatter: input holds p blocks of ``count``; rank r gets reduced block r."""
    tl = Timeline(rank, size)
    ring_reduce_scatter(tl, 0, [i * count for i in range(size + 1)],
                        elements("segment_bytes", segment_bytes, itemsize), dst_offset=0)
    return tl.schedule(size * count, count)


def ring_allgather_block(rank, size, count, itemsize, segment_bytes=None):
    """Ring all-gather: rank r's ``count`` elements land in block r of every output."""
    tl = Timeline(rank, size)
    tl.copy(0, Region(OUTPUT, rank * count, count), Region(INPUT, 0, count))
    ring_allgather(tl, 1, [i * count for i in range(size + 1)],
                   elements("segment_bytes", segment_bytes, itemsize))
    return tl.schedule(count, size * count)


def tree_bcast_root(rank, size, count, itemsize, root=0, chunk_bytes=DEFAULT_CHUNK_BYTES):
    """Pipelined binary-tree broadcast from ``root``."""
    check_int("root", root, 0, size - 1, "root must be a rank of the communicator")
    tl = Timeline(rank, size)
    whole = Region(OUTPUT, 0, count)
    if rank == root:
        tl.copy(0, whole, Region(INPUT, 0, count))
    tree_bcast(tl, 1, binary_tree(size, 0, root), whole,
               elements("chunk_bytes", chunk_bytes, itemsize))
    return tl.schedule(count if rank == root else 0, count)


def tree_reduce_root(rank, size, count, itemsize, root=0, chunk_bytes=DEFAULT_CHUNK_BYTES):
    """Pipelined binary-tree reduce to ``root``; other ranks accumulate in scratch, no output."""
    check_int("root", root, 0, size - 1, "root must be a rank of the communicator")
    tl = Timeline(rank, size)
    tree = binary_tree(size, 0, root)
    if rank != root and not tree.children[rank]:  # a leaf sends its input as it is
        acc = Region(INPUT, 0, count)
        tree_reduce(tl, 1, tree, acc, elements("chunk_bytes", chunk_bytes, itemsize), 0)
        return tl.schedule(count, 0)
    acc = Region(OUTPUT if rank == root else SCRATCH, 0, count)
    if rank != root:
        tl.need_scratch(count)
    tl.copy(0, acc, Region(INPUT, 0, count))
    tree_reduce(tl, 1, tree, acc, elements("chunk_bytes", chunk_bytes, itemsize),
                0 if rank == root else count)
    return tl.schedule(count, count if rank == root else 0)


def _ring_cost(p, nbytes, alpha, beta, gamma, segment_bytes=None):
    return (p - 1) * (alpha + nbytes * beta + nbytes * gamma)


def _tree_cost(p, nbytes, alpha, beta, gamma, root=0, chunk_bytes=DEFAULT_CHUNK_BYTES):
    """The pipeline's estimate: ⌈log₂ p⌉ + C − 1 steps of C chunks, each step a chunk to
    (or from) two children. An estimate, not the single-port simulator's time, which runs
    the actual tree (its depth and children per rank vary with p): from half to about
    twice it at p = 2 … 13."""
    chunks = max(1, -(-nbytes // chunk_bytes))
    piece = nbytes / chunks
    return (log2ceil(p) + chunks - 1) * (alpha + 2 * piece * beta + 2 * piece * gamma)


register("ring", "reduce_scatter", ring_reduce_scatter_block, _ring_cost, {"segment_bytes": None})
register("ring", "allgather", ring_allgather_block,
         lambda p, n, a, b, g, segment_bytes=None: _ring_cost(p, n, a, b, 0.0),
         {"segment_bytes": None})
register("binary_tree", "bcast", tree_bcast_root,
         lambda p, n, a, b, g, **kw: _tree_cost(p, n, a, b, 0.0, **kw),
         {"root": 0, "chunk_bytes": DEFAULT_CHUNK_BYTES}, aliases=("tree",))
register("binary_tree", "reduce", tree_reduce_root, _tree_cost,
         {"root": 0, "chunk_bytes": DEFAULT_CHUNK_BYTES}, aliases=("tree",))
