"""Broadcasts from any root: the binomial tree, scatter then all-gather, and the pipelined chain.

Ranks count from the root: rank r is ``(r - root) % p`` here. The root's sends read its
input, which its first step copies to its output; every other rank receives into its
output, and sends from there.
"""

from ..ir.schedule import INPUT, OUTPUT, Region, Timeline, chunk_bounds
from ._common import check_int, elements, log2ceil
from ._pieces import binomial_transfers, chunks, ring_allgather
from ._registry import register

__all__ = ["binomial", "scatter_allgather", "chain", "DEFAULT_SEGMENT_BYTES"]

DEFAULT_SEGMENT_BYTES = 1 << 18


def _begin(rank, size, count, root):
    """The timeline, this rank's place counted from ``root``, and the region its sends read."""
    check_int("root", root, 0, size - 1, "root must be a rank of the communicator")
    tl = Timeline(rank, size)
    whole = Region(OUTPUT, 0, count)
    if rank != root:
        return tl, (rank - root) % size, whole
    tl.copy(0, whole, Region(INPUT, 0, count))
    return tl, 0, Region(INPUT, 0, count)


def binomial(rank, size, count, itemsize, root=0):
    """Binomial tree: ceil(log2 p) rounds, in each of which every rank that has the vector
    sends the whole of it to one that has not."""
    tl, v, source = _begin(rank, size, count, root)
    for t, peer, _, _, receives in binomial_transfers(size, v, down=True):
        (tl.recv if receives else tl.send)(t, (peer + root) % size, source)
    return tl.schedule(count if v == 0 else 0, count)


def scatter_allgather(rank, size, count, itemsize, root=0):
    """Scatter then all-gather (van de Geijn): the root's vector is cut into p near-equal
    blocks (some empty when p does not divide the count) that a binomial tree scatters,
    block u to the rank u after the root, each edge carrying its subtree's blocks; a ring
    all-gather of the blocks follows."""
    tl, v, source = _begin(rank, size, count, root)
    bounds = chunk_bounds(count, size)
    for t, peer, lo, hi, receives in binomial_transfers(size, v, down=True):
        blocks = source.sub(bounds[lo], bounds[hi] - bounds[lo])
        (tl.recv if receives else tl.send)(t, (peer + root) % size, blocks)
    ring_allgather(tl, log2ceil(size), bounds, shift=root)
    return tl.schedule(count if v == 0 else 0, count)


def chain(rank, size, count, itemsize, root=0, segment_bytes=DEFAULT_SEGMENT_BYTES):
    """Pipelined chain root -> root+1 -> ... -> root-1: the vector goes in segments of
    ``segment_bytes`` (None: one), each rank passing a segment on in the step after it
    arrived: p - 1 + segments - 1 steps."""
    tl, v, source = _begin(rank, size, count, root)
    seg = elements("segment_bytes", segment_bytes, itemsize)
    for c, piece in enumerate(chunks(source, seg)):
        if v > 0:
            tl.recv(c + v - 1, (rank - 1) % size, piece)
        if v < size - 1:
            tl.send(c + v, (rank + 1) % size, piece)
    return tl.schedule(count if v == 0 else 0, count)


def binomial_cost(p, nbytes, alpha, beta, gamma, root=0):
    return log2ceil(p) * (alpha + nbytes * beta)


def scatter_allgather_cost(p, nbytes, alpha, beta, gamma, root=0):
    return (log2ceil(p) + p - 1) * alpha + 2 * (p - 1) / p * nbytes * beta


def chain_cost(p, nbytes, alpha, beta, gamma, root=0, segment_bytes=DEFAULT_SEGMENT_BYTES):
    if p == 1:
        return 0.0
    pieces = max(1, -(-nbytes // segment_bytes)) if segment_bytes else 1
    return (p - 1 + pieces - 1) * (alpha + nbytes / pieces * beta)


register("binomial", "bcast", binomial, binomial_cost, {"root": 0})
register("scatter_allgather", "bcast", scatter_allgather, scatter_allgather_cost, {"root": 0})
register("chain", "bcast", chain, chain_cost,
         {"root": 0, "segment_bytes": DEFAULT_SEGMENT_BYTES})
