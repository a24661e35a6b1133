"""Rabenseifner's all-reduce: recursive-halving reduce-scatter, recursive-doubling all-gather."""

from ..ir.schedule import OUTPUT, Region, Timeline, chunk_bounds
from ._pieces import fold, halving, real_rank, unfold
from ._registry import register
from .recursive_doubling import fold_cost

__all__ = ["build", "cost"]


def build(rank, size, count, itemsize):
    """Bandwidth-optimal: 2 log2 p rounds, 2(p-1)/p * n bytes per rank.

    Halving: each round a rank keeps half its window, sends the other half to
    its partner and reduces what it receives.  Doubling: the windows are
    swapped back, doubling each round.  A fold handles p not a power of two.
    """
    tl = Timeline(rank, size)
    new, p2, t, contrib = fold(tl, 0, count)
    if new is not None:
        bounds = chunk_bounds(count, p2)
        span = lambda buf, lo, hi: Region(buf, bounds[lo], bounds[hi] - bounds[lo])
        tl.need_scratch(count - bounds[p2 // 2] if p2 > 1 else 0)
        # the first round reads the input itself: nothing is copied to output
        t = halving(tl, t, new, p2, bounds, contrib.buffer,
                    lambda lo, hi: span(OUTPUT, lo, hi), 0)
        if p2 == 1:  # p = 1: the result is the input
            tl.copy(t, Region(OUTPUT, 0, count), contrib)
        mask = 1
        while mask < p2:
            peer_new = new ^ mask
            mine = (new // mask) * mask
            theirs = (peer_new // mask) * mask
            peer = real_rank(peer_new, size)
            tl.send(t, peer, span(OUTPUT, mine, mine + mask))
            tl.recv(t, peer, span(OUTPUT, theirs, theirs + mask))
            mask, t = mask << 1, t + 1
    unfold(tl, t, count)
    return tl.schedule(count, count)


def cost(p, nbytes, alpha, beta, gamma):
    p2 = 1 << (p.bit_length() - 1)
    rounds = p2.bit_length() - 1
    moved = (p2 - 1) / p2 * nbytes
    return (2 * rounds * alpha + 2 * moved * beta + moved * gamma
            + fold_cost(p, nbytes, alpha, beta, gamma))


register("recursive_halving_doubling", "allreduce", build, cost, aliases=("rhd", "rabenseifner"))
