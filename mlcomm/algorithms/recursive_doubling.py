"""Recursive doubling all-reduce: latency-optimal, log2 p rounds of whole-vector exchange."""

from ..ir.schedule import OUTPUT, SCRATCH, Region, Timeline
from ._pieces import fold, real_rank, unfold
from ._registry import register

__all__ = ["build", "cost", "fold_cost"]


def build(rank, size, count, itemsize):
    """log2 p rounds; in round k each rank swaps its whole vector with rank XOR 2^k and reduces.

    Both partners reduce in the same operand order, so every rank gets the same bits.
    For p not a power of two, the first 2(p-p2) ranks fold pairwise first and
    get the result back at the end (two more rounds).
    """
    tl = Timeline(rank, size)
    new, p2, t, mine = fold(tl, 0, count)
    if new is not None:
        whole, landing = Region(OUTPUT, 0, count), Region(SCRATCH, 0, count)
        tl.need_scratch(count if p2 > 1 else 0)
        mask = 1
        while mask < p2:
            peer = real_rank(new ^ mask, size)
            tl.send(t, peer, mine)
            tl.recv(t, peer, landing)
            # both partners compute lower (+) upper: bit-identical even for ops whose
            # operands don't commute bitwise; the first round reads the input itself
            lower, upper = (landing, mine) if new & mask else (mine, landing)
            tl.reduce(t, whole, upper, left=lower)
            mine, mask, t = whole, mask << 1, t + 1
        tl.copy(t, whole, mine)  # p = 1: the result is the input
    unfold(tl, t, count)
    return tl.schedule(count, count)


def fold_cost(p, nbytes, alpha, beta, gamma):
    """The extra time of the fold and unfold rounds when p is not a power of two."""
    if p & (p - 1) == 0:
        return 0.0
    return 2 * (alpha + nbytes * beta) + nbytes * gamma


def cost(p, nbytes, alpha, beta, gamma):
    rounds = (p.bit_length() - 1)
    return rounds * (alpha + nbytes * beta + nbytes * gamma) + fold_cost(p, nbytes, alpha, beta, gamma)


register("recursive_doubling", "allreduce", build, cost, aliases=("rd",))
