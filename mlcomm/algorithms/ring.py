"""Ring all-reduce: reduce-scatter then all-gather around a ring."""

from ..ir.schedule import Timeline, chunk_bounds
from ._common import elements
from ._pieces import ring_allgather, ring_reduce_scatter
from ._registry import register

__all__ = ["build", "cost"]


def build(rank, size, count, itemsize, segment_bytes=None):
    """Reduce-scatter then all-gather around the ring: 2(p-1) steps of n/p bytes, fan-in 1.

    ``segment_bytes`` cuts each step's block into segments, which bounds the
    scratch to two segments.
    """
    seg = elements("segment_bytes", segment_bytes, itemsize)
    bounds = chunk_bounds(count, size)
    tl = Timeline(rank, size)
    t = ring_reduce_scatter(tl, 0, bounds, seg)
    ring_allgather(tl, t, bounds, seg)
    return tl.schedule(count, count)


def cost(p, nbytes, alpha, beta, gamma, segment_bytes=None):
    share = nbytes / p
    return 2 * (p - 1) * (alpha + share * beta) + (p - 1) * share * gamma


register("ring", "allreduce", build, cost, {"segment_bytes": None})
