"""All-gather by recursive doubling and by Bruck's algorithm.

Rank r's ``count`` elements land in block r of every rank's output, as in the ring. The
schedules themselves (:func:`doubling_schedule`, :func:`bruck_schedule`) take the blocks'
offsets, so the uneven all-gather (:mod:`.uneven`) runs them on blocks of any sizes.
"""

from ..ir.schedule import INPUT, OUTPUT, SCRATCH, Region, Timeline
from ._common import log2ceil
from ._registry import register

__all__ = ["recursive_doubling", "bruck", "doubling_schedule", "bruck_schedule"]


def recursive_doubling(rank, size, count, itemsize):
    """Recursive doubling: in round k rank r swaps the blocks of its subtree (the 2^k ranks
    that share r's bits above bit k) with rank r XOR 2^k, ⌈log₂ p⌉ rounds with the block
    doubling each round. For p not a power of two, as in MPICH: where a subtree's partner
    subtree is cut short by p, the ranks whose partners exist hand what they received down
    to the others of their subtree, in halving steps."""
    return doubling_schedule(rank, size, [j * count for j in range(size + 1)])


def doubling_schedule(rank, size, at):
    """:func:`recursive_doubling`'s schedule on the blocks at offsets ``at`` (p + 1 of them:
    block j is ``output[at[j]:at[j + 1]]``, this rank's input is block ``rank``)."""
    tl = Timeline(rank, size)
    blocks = lambda lo, hi: Region(OUTPUT, at[lo], at[min(hi, size)] - at[lo])
    count = at[rank + 1] - at[rank]
    tl.copy(0, blocks(rank, rank + 1), Region(INPUT, 0, count))
    t, mask = 1, 1
    while mask < size:
        peer, mine = rank ^ mask, rank & -mask
        theirs = peer & -mask
        if peer < size:
            tl.send(t, peer, blocks(mine, mine + mask))
            tl.recv(t, peer, blocks(theirs, theirs + mask))
        t += 1
        if mine < theirs < size < theirs + mask:
            t = _hand_down(tl, t, mask, size - theirs, blocks(theirs, size))
        mask <<= 1
    return tl.schedule(count, at[size])


def _hand_down(tl, t, mask, done, region):
    """The ranks of this rank's subtree of ``mask`` ranks whose partners exist (the first
    ``done``) hand ``region`` to the others: in the step of bit j, within each part of
    2^(j+1) ranks, those that hold it send it to their partner across bit j that does not."""
    rank, j = tl.rank, mask >> 1
    while j:
        partner, have = rank ^ j, (rank & -(2 * j)) + done
        if rank < have <= partner:
            tl.send(t, partner, region)
        elif partner < have <= rank:
            tl.recv(t, partner, region)
        j, t = j >> 1, t + 1
    return t


def bruck(rank, size, count, itemsize):
    """Bruck's all-gather, for any p: rank r collects the blocks r, r+1, ... (mod p) in that
    order; in step k it sends the first min(2^k, p − 2^k) of them to rank r − 2^k and
    receives as many from rank r + 2^k behind them, ⌈log₂ p⌉ steps; a local rotation then
    puts every block in place. Rank 0's order is the output's own: it collects straight
    into the output, the others in scratch."""
    return bruck_schedule(rank, size, [j * count for j in range(size + 1)])


def bruck_schedule(rank, size, at):
    """:func:`bruck`'s schedule on the blocks at offsets ``at`` (as in
    :func:`doubling_schedule`); the blocks this rank holds lie packed in its order."""
    tl = Timeline(rank, size)
    count = at[rank + 1] - at[rank]
    into = OUTPUT if rank == 0 else SCRATCH
    order = [0]  # held block i is block (rank + i) mod p, at order[i]
    for i in range(size):
        j = (rank + i) % size
        order.append(order[-1] + at[j + 1] - at[j])
    held = lambda lo, hi: Region(into, order[lo], order[hi] - order[lo])
    tl.copy(0, Region(OUTPUT, at[rank], count), Region(INPUT, 0, count))
    if rank:
        tl.need_scratch(at[size])
        tl.copy(0, held(0, 1), Region(INPUT, 0, count))
    t, dist = 1, 1
    while dist < size:
        m = min(dist, size - dist)
        tl.send(t, (rank - dist) % size, held(0, m))
        tl.recv(t, (rank + dist) % size, held(dist, dist + m))
        t, dist = t + 1, 2 * dist
    if rank:
        tl.copy(t, Region(OUTPUT, at[rank + 1], at[size] - at[rank + 1]), held(1, size - rank))
        tl.copy(t, Region(OUTPUT, 0, at[rank]), held(size - rank, size))
    return tl.schedule(count, at[size])


def _recursive_doubling_cost(p, nbytes, alpha, beta, gamma):
    """⌈log₂ p⌉ rounds of 2^k blocks; for p not a power of two, at each bit k of p with
    d = p mod 2^k > 0, the hand-down: k − ⌊log₂ d⌋ steps of d blocks."""
    rounds = log2ceil(p)
    time = rounds * alpha + ((1 << rounds) - 1) * nbytes * beta
    for k in range(rounds):
        done = p % (1 << k)
        if p >> k & 1 and done:
            time += (k - done.bit_length() + 1) * (alpha + done * nbytes * beta)
    return time


def _bruck_cost(p, nbytes, alpha, beta, gamma):
    return log2ceil(p) * alpha + (p - 1) * nbytes * beta


register("recursive_doubling", "allgather", recursive_doubling, _recursive_doubling_cost,
         aliases=("rd",))
register("bruck", "allgather", bruck, _bruck_cost)
