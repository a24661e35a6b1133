"""Naive all-reduce: every rank sends its whole vector to every other rank."""

from ..ir.schedule import Timeline
from ._pieces import gather_reduce
from ._registry import register

__all__ = ["build", "cost"]


def build(rank, size, count, itemsize):
    """Every rank sends its whole vector to all p-1 others and reduces all p vectors in rank order.

    One round, fan-in p-1, (p-1)n bytes in and out per rank, p*n scratch.
    """
    tl = Timeline(rank, size)
    gather_reduce(tl, 0, [(q, 0, count) for q in range(size)])
    return tl.schedule(count, count)


def cost(p, nbytes, alpha, beta, gamma):
    return (p - 1) * (alpha + nbytes * beta + nbytes * gamma)


register("naive", "allreduce", build, cost, aliases=("all_to_all",))
