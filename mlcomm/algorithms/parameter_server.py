"""Parameter-server all-reduce: the vector is sharded over K server ranks."""

from ..ir.schedule import Timeline, chunk_bounds
from ._common import check_int
from ._pieces import gather_reduce, scatter_results
from ._registry import register

__all__ = ["build", "cost", "server_targets"]


def server_targets(servers, count):
    """Shard ``count`` elements over ``servers`` (a list of ranks): ``(rank, a, b)`` each."""
    bounds = chunk_bounds(count, len(servers))
    return [(s, bounds[i], bounds[i + 1]) for i, s in enumerate(servers)]


def build(rank, size, count, itemsize, servers=None):
    """Shard the vector over K servers (ranks 0..K-1; ``servers=K``, default p).

    Workers push each shard to its server, which reduces the p shards in rank
    order; then every rank pulls every shard back.  Two rounds; the busiest
    server takes in (p-1)n/K bytes with fan-in p-1.
    """
    k = size if servers is None else check_int(
        "servers", servers, 1, size, "the number of server ranks must be between 1 and the number of ranks")
    targets = server_targets(list(range(k)), count)
    tl = Timeline(rank, size)
    t = gather_reduce(tl, 0, targets)
    scatter_results(tl, t, targets)
    return tl.schedule(count, count)


def cost(p, nbytes, alpha, beta, gamma, servers=None):
    k = p if servers is None else servers
    shard = nbytes / k
    worker_sends = nbytes if k < p else nbytes - shard  # a non-server pushes every shard
    busiest = max(worker_sends, (p - 1) * shard)
    rounds = p - 1
    return 2 * (rounds * alpha + busiest * beta) + (p - 1) * shard * gamma


register("parameter_server", "allreduce", build, cost, {"servers": None}, aliases=("ps",))
