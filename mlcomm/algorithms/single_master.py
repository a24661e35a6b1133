"""Single-master all-reduce: everyone sends to one root, which sends the sum back."""

from ..ir.schedule import Timeline
from ._common import check_int
from ._pieces import gather_reduce, scatter_results
from ._registry import register

__all__ = ["build", "cost"]


def build(rank, size, count, itemsize, root=0):
    """Direct sends of whole vectors to the master ``root`` (fan-in p-1).

    The master reduces in rank order and sends the result to every rank: it
    receives (p-1)n bytes and sends (p-1)n bytes.
    """
    check_int("root", root, 0, size - 1, "root must be a rank of the communicator")
    targets = [(root, 0, count)]
    tl = Timeline(rank, size)
    t = gather_reduce(tl, 0, targets)
    scatter_results(tl, t, targets)
    return tl.schedule(count, count)


def cost(p, nbytes, alpha, beta, gamma, root=0):
    return (p - 1) * (2 * alpha + 2 * nbytes * beta + nbytes * gamma)


register("single_master", "allreduce", build, cost, {"root": 0}, aliases=("master",))
