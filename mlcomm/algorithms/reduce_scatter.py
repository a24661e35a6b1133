"""Reduce-scatter by recursive halving and by pairwise exchange.

The input holds p blocks of ``count``; rank r ends with block r reduced over every rank, as
in the ring. An in-place call's output is the input's first block, so each writes its output
only once it has read every block of its input. Pairwise exchange's schedule itself
(:func:`pairwise_schedule`) takes the blocks' offsets, so the uneven reduce-scatter
(:mod:`.uneven`) runs it on blocks of any sizes.
"""

from ..ir.schedule import INPUT, OUTPUT, SCRATCH, Region, Timeline
from ._pieces import fold, halving, unfold
from ._registry import register
from .collectives import _ring_cost

__all__ = ["recursive_halving", "pairwise", "pairwise_schedule"]


def recursive_halving(rank, size, count, itemsize):
    """Recursive halving: in each of log₂ p rounds a rank sends its partner the half of its
    window of blocks that the partner keeps and reduces the half it keeps with what it
    receives. For p not a power of two, as in MPICH: the first 2(p − p₂) ranks fold pairwise
    onto p₂ = 2^⌊log₂ p⌋ (the even ones send their input to their odd neighbour and sit
    out), an odd one's window covers both its blocks, and it sends its neighbour's block
    back at the end."""
    tl = Timeline(rank, size)
    n, out = size * count, Region(OUTPUT, 0, count)
    if size == 1:
        tl.copy(0, out, Region(INPUT, 0, count))
        return tl.schedule(n, count)
    new, p2, t, contrib = fold(tl, 0, n, into=Region(SCRATCH, 0, n))
    sent = None
    if new is not None:
        rem = size - p2
        # new rank i holds block i + rem, or blocks 2i and 2i + 1 (the fold's pair)
        bounds = [(i + min(i, rem)) * count for i in range(p2 + 1)]
        folded = contrib.buffer == SCRATCH
        first = p2 // 2 if new & (p2 // 2) else 0  # the first round keeps p2/2 chunks from it
        width = bounds[first + p2 // 2] - bounds[first]
        # the partial sums: where the folded vector lies, else packed from the first kept
        base, landing_at = (0, n) if folded else (bounds[first], width)
        tl.need_scratch(landing_at + width)
        acc = lambda lo, hi: Region(SCRATCH, bounds[lo] - base, bounds[hi] - bounds[lo])
        t = halving(tl, t, new, p2, bounds, contrib.buffer, acc, landing_at,
                    None if folded else out)
        if folded:  # the window holds the blocks of rank - 1 and rank
            sent, own = acc(new, new + 1).sub(0, count), acc(new, new + 1).sub(count, count)
            tl.copy(t, out, own)
    unfold(tl, t, count, sent)
    return tl.schedule(n, count)


def pairwise(rank, size, count, itemsize):
    """Pairwise exchange: in step k = 1 … p − 1 rank r sends block (r − k) mod p of its input
    to that rank and receives its own block from rank (r + k) mod p, reducing it into the
    partial sum (in scratch, landing slots alternating so that a reduction overlaps the
    next transfer); the last step reduces into the output."""
    return pairwise_schedule(rank, size, [j * count for j in range(size + 1)])


def pairwise_schedule(rank, size, at):
    """:func:`pairwise`'s schedule on the input blocks at offsets ``at`` (p + 1 of them:
    block j is ``input[at[j]:at[j + 1]]``, and this rank's output is block ``rank``)."""
    tl = Timeline(rank, size)
    count = at[rank + 1] - at[rank]
    block = lambda b: Region(INPUT, at[b], at[b + 1] - at[b])
    out, partial = Region(OUTPUT, 0, count), block(rank)
    if size == 1:
        tl.copy(0, out, partial)
        return tl.schedule(at[size], count)
    tl.need_scratch(3 * count)
    acc = Region(SCRATCH, 0, count)
    for k in range(1, size):
        landing = Region(SCRATCH, (1 + k % 2) * count, count)
        tl.send(k, (rank - k) % size, block((rank - k) % size))
        tl.recv(k, (rank + k) % size, landing)
        tl.reduce(k, out if k == size - 1 else acc, landing, left=partial)
        partial = acc
    return tl.schedule(at[size], count)


def _recursive_halving_cost(p, nbytes, alpha, beta, gamma):
    """log₂ p₂ rounds; round j moves at most 2^-j of the p₂ chunks, each one block or two
    (folded); the fold adds the whole input one way and a block back."""
    p2 = 1 << (p.bit_length() - 1)
    rem, rounds = p - p2, p2.bit_length() - 1
    blocks = sum((p2 >> j) + min(p2 >> j, rem) for j in range(1, rounds + 1))
    time = rounds * alpha + blocks * nbytes * (beta + gamma)
    if rem:
        time += 2 * alpha + p * nbytes * (beta + gamma) + nbytes * beta
    return time


register("recursive_halving", "reduce_scatter", recursive_halving, _recursive_halving_cost)
# p - 1 steps of one block, reduced: the ring's cost
register("pairwise", "reduce_scatter", pairwise,
         lambda p, n, a, b, g: _ring_cost(p, n, a, b, g))
