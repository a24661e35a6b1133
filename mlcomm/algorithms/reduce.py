"""Reduces to any root: the binomial tree, and Rabenseifner's reduce-scatter then gather.

The root reduces into its output; the other ranks, which have none, accumulate in scratch.
Every rank reduces in an order that its schedule fixes, so a result's bits are the same
from one run to the next.
"""

from ..ir.schedule import INPUT, OUTPUT, SCRATCH, Region, Timeline, chunk_bounds
from ._common import check_int, log2ceil
from ._pieces import binomial_transfers, fold, halving, real_rank
from ._registry import register

__all__ = ["binomial", "rabenseifner"]


def _begin(rank, size, count, root):
    """The timeline, this rank's input, where it accumulates (the root's output, else
    scratch from 0) and the first free element of scratch after that."""
    check_int("root", root, 0, size - 1, "root must be a rank of the communicator")
    at_root = rank == root
    return Timeline(rank, size), Region(INPUT, 0, count), \
        Region(OUTPUT if at_root else SCRATCH, 0, count), 0 if at_root else count


def binomial(rank, size, count, itemsize, root=0):
    """Binomial tree: ceil(log2 p) rounds; in round k every rank whose place counted from
    the root, (r - root) % p, is an odd multiple of 2^k sends its partial result to the
    rank 2^k places before it, which reduces it into its own: ranks in order from the root."""
    tl, mine, acc, free = _begin(rank, size, count, root)
    v, first = (rank - root) % size, True
    landing = Region(SCRATCH, free, count)
    for t, peer, _, _, receives in binomial_transfers(size, v, down=False):
        if receives:
            tl.need_scratch(landing.stop)
            tl.recv(t, (peer + root) % size, landing)
            tl.reduce(t, acc, landing, left=mine if first else None)
            first = False
        else:
            tl.send(t, (peer + root) % size, mine if first else acc)
    if size == 1:
        tl.copy(0, acc, mine)
    return tl.schedule(count, count if v == 0 else 0)


def rabenseifner(rank, size, count, itemsize, root=0):
    """Reduce-scatter by recursive halving, then a binomial gather of the reduced blocks to
    the root: 2 log2 p rounds, (p-1)/p * n bytes each way per phase on the busiest rank.

    Ranks count from the one after the root (the root is the last), and for p not a power
    of two the first 2(p - p2) of them fold pairwise onto p2 = 2^floor(log2 p) ranks
    first, as the all-reduce's fold does: the root is never one that sits out. After the
    halving the rank numbered q of the p2 holds block q, and the root is the last of them.
    """
    tl, mine, acc, free = _begin(rank, size, count, root)
    shift = (root + 1) % size
    new, p2, t, contrib = fold(tl, 0, count, acc, shift)
    if new is None:
        return tl.schedule(count, 0)
    bounds = chunk_bounds(count, p2)
    tl.need_scratch(free + (count - bounds[p2 // 2] if p2 > 1 else 0))
    blocks = lambda lo, hi: acc.sub(bounds[lo], bounds[hi] - bounds[lo])
    t = halving(tl, t, new, p2, bounds, contrib.buffer, blocks, free, shift=shift)
    if size == 1:
        tl.copy(t, acc, mine)
    last = p2 - 1  # the root's number: the gather tree counts u = last - q from it
    for k, u, lo, hi, receives in binomial_transfers(p2, new ^ last, down=False):
        (tl.recv if receives else tl.send)(t + k, real_rank(u ^ last, size, shift),
                                           blocks(p2 - hi, p2 - lo))
    return tl.schedule(count, count if rank == root else 0)


def binomial_cost(p, nbytes, alpha, beta, gamma, root=0):
    return log2ceil(p) * (alpha + nbytes * beta + nbytes * gamma)


def rabenseifner_cost(p, nbytes, alpha, beta, gamma, root=0):
    """2 log2 p2 rounds moving (p2-1)/p2 of the vector each way, plus the fold's round
    (its whole vector, reduced) when p is not the power of two p2."""
    p2 = 1 << (p.bit_length() - 1)
    moved = (p2 - 1) / p2 * nbytes
    fold = 0.0 if p == p2 else alpha + nbytes * beta + nbytes * gamma
    return 2 * log2ceil(p2) * alpha + 2 * moved * beta + moved * gamma + fold


register("binomial", "reduce", binomial, binomial_cost, {"root": 0})
register("rabenseifner", "reduce", rabenseifner, rabenseifner_cost, {"root": 0})
