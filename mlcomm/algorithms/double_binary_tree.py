"""Double binary tree all-reduce (as in NCCL): two complementary trees, half the vector each."""

from ..ir.schedule import INPUT, OUTPUT, Region, Timeline
from ._common import elements, log2ceil
from ._pieces import binary_tree, tree_bcast, tree_reduce
from ._registry import register

__all__ = ["build", "cost", "DEFAULT_CHUNK_BYTES"]

DEFAULT_CHUNK_BYTES = 1 << 20


def build(rank, size, count, itemsize, chunk_bytes=DEFAULT_CHUNK_BYTES):
    """Two binary trees whose leaves are each other's interior ranks.

    Each tree reduces, then broadcasts, one half of the vector, pipelined in
    chunks of ``chunk_bytes``: about 2(log2 p + chunks) steps.
    """
    chunk = elements("chunk_bytes", chunk_bytes, itemsize)
    tl = Timeline(rank, size)
    half = count // 2
    halves = [Region(OUTPUT, 0, half), Region(OUTPUT, half, count - half)]
    width = min(chunk, count - half) if count else 0
    landing = 0  # each tree's landing slots follow the previous tree's, one per child
    for flavour, part in enumerate(halves):
        tree = binary_tree(size, flavour)
        t = tree_reduce(tl, 1, tree, part, chunk, scratch_at=landing,
                        source=Region(INPUT, part.offset, part.count))
        tree_bcast(tl, t, tree, part, chunk)
        landing += len(tree.children[rank]) * width
    return tl.schedule(count, count)


def cost(p, nbytes, alpha, beta, gamma, chunk_bytes=DEFAULT_CHUNK_BYTES):
    if p == 1:
        return 0.0
    chunks = max(1, -(-nbytes // 2 // chunk_bytes))
    piece = nbytes / 2 / chunks
    steps = log2ceil(p) + chunks - 1
    # single port: an interior rank takes in, then sends out, two children one at a time
    return steps * (4 * (alpha + piece * beta) + 2 * piece * gamma)


register("double_binary_tree", "allreduce", build, cost,
         {"chunk_bytes": DEFAULT_CHUNK_BYTES}, aliases=("dbt", "tree"))
