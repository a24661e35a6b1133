"""The uneven all-gather (``allgatherv``) and reduce-scatter (``reduce_scatter_v``).

Every rank knows ``counts``, a tuple of every rank's block (``counts[rank] == count``), so
the blocks lie packed at the prefix sums of the counts and each schedule is its even form's
on those blocks: the ring pieces of :mod:`._pieces`, and the schedules of :mod:`.allgather`
and :mod:`.reduce_scatter`, which take block offsets. Empty blocks send nothing.

Costs: the even form's closed form on the largest block. ``nbytes`` is the mean block's
bytes (the total over p), scaled by ``max(counts) / mean(counts)``; without counts (or with
every count zero) ``nbytes`` itself.
"""


from ..ir.schedule import INPUT, OUTPUT, Region, Timeline
from ._common import check_counts as _check, elements, starts
from ._pieces import ring_allgather, ring_reduce_scatter
from ._registry import COLLECTIVES, register
from .allgather import bruck_schedule, doubling_schedule
from . import collectives  # noqa: F401 - the even rings' entries, whose costs these take
from .reduce_scatter import pairwise_schedule

__all__ = ["check_counts", "ring_allgatherv", "recursive_doubling_allgatherv",
           "bruck_allgatherv", "ring_reduce_scatter_v", "pairwise_reduce_scatter_v"]


def check_counts(rank, size, count, counts) -> list:
    """Check ``counts`` (:func:`._common.check_counts`, with ``counts[rank] == count``) and
    return the p + 1 block offsets, its prefix sums."""
    return starts(_check("counts", counts, size, rank, count))


def ring_allgatherv(rank, size, count, itemsize, counts=None, segment_bytes=None):
    """Ring all-gather of uneven blocks: rank r's ``counts[r]`` elements land at offset
    ``sum(counts[:r])`` of every output, passed on round the ring in p − 1 steps, each cut
    into segments of at most ``segment_bytes`` (a shorter block's trailing ones empty)."""
    at = check_counts(rank, size, count, counts)
    tl = Timeline(rank, size)
    tl.copy(0, Region(OUTPUT, at[rank], count), Region(INPUT, 0, count))
    ring_allgather(tl, 1, at, elements("segment_bytes", segment_bytes, itemsize))
    return tl.schedule(count, at[size])


def recursive_doubling_allgatherv(rank, size, count, itemsize, counts=None):
    """Recursive doubling all-gather of uneven blocks: in round k rank r swaps the blocks of
    its subtree of 2^k ranks with rank r XOR 2^k, ⌈log₂ p⌉ rounds; for p not a power of two
    the ranks whose partners exist hand what they received down to the others of their
    subtree, as in the even all-gather."""
    return doubling_schedule(rank, size, check_counts(rank, size, count, counts))


def bruck_allgatherv(rank, size, count, itemsize, counts=None):
    """Bruck's all-gather of uneven blocks: rank r collects the blocks r, r+1, ... (mod p),
    packed in that order; in step k it sends the first min(2^k, p − 2^k) of them to rank
    r − 2^k and receives as many from rank r + 2^k, ⌈log₂ p⌉ steps; a local rotation then
    puts every block in place (rank 0 collects straight into its output)."""
    return bruck_schedule(rank, size, check_counts(rank, size, count, counts))


def ring_reduce_scatter_v(rank, size, count, itemsize, counts=None, segment_bytes=None):
    """Ring reduce-scatter of uneven blocks: the input holds block j of ``counts[j]``
    elements at ``sum(counts[:j])``; rank r ends with block r reduced over every rank, the
    partial sums passed on round the ring in p − 1 steps, each cut into segments of at most
    ``segment_bytes``."""
    at = check_counts(rank, size, count, counts)
    tl = Timeline(rank, size)
    ring_reduce_scatter(tl, 0, at, elements("segment_bytes", segment_bytes, itemsize),
                        dst_offset=0)
    return tl.schedule(at[size], count)


def pairwise_reduce_scatter_v(rank, size, count, itemsize, counts=None):
    """Pairwise-exchange reduce-scatter of uneven blocks: in step k = 1 … p − 1 rank r sends
    its input block (r − k) mod p to that rank and receives its own block from rank
    (r + k) mod p, reducing it into the partial sum; the last step reduces into the
    output."""
    return pairwise_schedule(rank, size, check_counts(rank, size, count, counts))


def _largest(nbytes, counts):
    """The largest block's bytes, ``nbytes`` being the mean block's."""
    if not counts or not sum(counts):
        return nbytes
    return nbytes * max(counts) * len(counts) / sum(counts)


def _on_largest(even):
    """The cost ``even(p, nbytes, alpha, beta, gamma, **options)`` of the even form, on the
    largest block of ``counts``."""
    def cost(p, nbytes, alpha, beta, gamma, counts=None, **options):
        """The even form's closed form on the largest block of ``counts`` (``nbytes``: the
        mean block's bytes)."""
        return even(p, _largest(nbytes, counts), alpha, beta, gamma, **options)
    return cost


def _register(name, collective, build, even, options):
    """Register ``build`` with the cost of ``even``'s entry of the same name on the largest
    block."""
    register(name, collective, build, _on_largest(COLLECTIVES[even][name].cost),
             {"counts": None, **options}, aliases=COLLECTIVES[even][name].aliases)


_register("ring", "allgatherv", ring_allgatherv, "allgather", {"segment_bytes": None})
_register("recursive_doubling", "allgatherv", recursive_doubling_allgatherv, "allgather", {})
_register("bruck", "allgatherv", bruck_allgatherv, "allgather", {})
_register("ring", "reduce_scatter_v", ring_reduce_scatter_v, "reduce_scatter",
          {"segment_bytes": None})
_register("pairwise", "reduce_scatter_v", pairwise_reduce_scatter_v, "reduce_scatter", {})
