"""The notes' cost-table quantities, derived from the schedules that actually run."""

from __future__ import annotations

import inspect

import numpy as np

from .simulator import UNIT_NETWORK, Network, SimProgram, compile_schedules, simulate

__all__ = ["KEYS", "schedule_metrics", "analyze", "analyzable", "count_for", "node_layout",
           "not_applicable", "call_shape", "build_options", "inter_choice", "formula_seconds"]

#: The keys of one ``mlcomm analyze`` row, in output order.
KEYS = ("algorithm", "ranks", "bytes", "rounds", "total_bytes_sent", "max_rank_bytes_sent",
        "max_rank_bytes_received", "max_fan_in", "max_round_bytes_in", "max_rank_syncs",
        "max_rank_window_bytes", "predicted_seconds", "formula_seconds")


def _entry(name: str, collective: str):
    from ..algorithms import COLLECTIVES
    return COLLECTIVES[collective][name]


def analyzable(collective: str = "allreduce") -> list[str]:
    """Names of ``collective``'s algorithms that have a schedule (not ``mpi``, not ``auto``)."""
    from ..algorithms import COLLECTIVES
    return [name for name, algo in COLLECTIVES[collective].items() if algo.hand_written]


def count_for(nbytes: int, itemsize: int) -> int:
    """Return the element count of an ``nbytes`` message; it must be whole elements."""
    if nbytes % itemsize:
        raise ValueError(f"{nbytes} bytes is not a whole number of {itemsize}-byte elements")
    return nbytes // itemsize


def node_layout(p: int, ranks_per_node: int | None = None) -> tuple:
    """Nodes of ``ranks_per_node`` consecutive ranks (the last may have fewer); one node of
    every rank when it is None, as ``mpiexec`` on one machine gives."""
    k = ranks_per_node or p
    return tuple(tuple(range(i, min(p, i + k))) for i in range(0, p, k))


def not_applicable(name: str, p: int, ranks_per_node: int | None = None,
                   collective: str = "allreduce") -> str | None:
    """Why ``name`` cannot run on this layout (host buffers), as its registry entry says
    (``shared_memory`` across nodes), else None."""
    from ..algorithms import COLLECTIVES, Layout
    algo = COLLECTIVES[collective].get(name)
    return algo.why_not(Layout(p, node_layout(p, ranks_per_node))) if algo else None


def call_shape(algo, p: int, count: int) -> tuple[int, dict]:
    """``(the count algo's schedule takes, the options that shape the call)`` for blocks of
    ``count`` elements: the uneven forms with even counts, ``counts=(count,) * p``; the
    all-to-all-v's ``sendcounts`` and ``recvcounts`` alike, its count the whole send
    (p · count, as a call passes it, and as its closed form takes it in bytes). Rooted
    collectives keep their default root, 0."""
    even = (count,) * p
    if "sendcounts" in algo.options:
        return p * count, {"sendcounts": even, "recvcounts": even}
    return count, ({"counts": even} if "counts" in algo.options else {})


def inter_choice(nodes: int, nbytes: int, network: Network, itemsize: int = 8) -> str:
    """What ``inter="auto"`` resolves to here: ``auto``'s choice for ``nbytes`` on ``nodes``
    ranks, one per node, with the inter-node alpha and beta (and ``network``'s gamma) as
    its profile."""
    from ..model.machine import Profile
    from ..model.cost import explain, flat_algorithms
    if nodes < 2:
        return flat_algorithms()[0]
    profile = Profile(alpha=network.between_alpha, beta=network.between_beta,
                      gamma=network.gamma)
    return explain(nodes, nbytes, profile=profile, itemsize=itemsize,
                   nodes=tuple((r,) for r in range(nodes)))[0]


def build_options(name: str, p: int, nbytes: int, *, itemsize: int = 8,
                  options: dict | None = None, ranks_per_node: int | None = None,
                  network: Network | None = None, collective: str = "allreduce") -> dict:
    """The options ``name``'s schedules are built with, ``nbytes`` one rank's block: the
    call's shape (:func:`call_shape`), the caller's options that it takes, and the context
    a job's session supplies (the node layout of ``ranks_per_node``, the window's slot size
    unless ``options`` names ``slot_bytes``); ``inter="auto"`` resolved by
    :func:`inter_choice`."""
    from ..algorithms import AUTO, DEFAULT_SLOT_BYTES
    algo = _entry(name, collective)
    opts = call_shape(algo, p, count_for(nbytes, itemsize))[1] if algo.hand_written else {}
    opts.update({k: v for k, v in (options or {}).items()
                 if k in algo.options or (k in algo.context and k != "nodes")})
    if "nodes" in algo.context:
        opts["nodes"] = node_layout(p, ranks_per_node)
    if "slot_bytes" in algo.context:
        opts.setdefault("slot_bytes", DEFAULT_SLOT_BYTES)
    if "inter" in algo.options and opts.get("inter", algo.options["inter"]) == AUTO:
        nodes = opts["nodes"]
        part = -(-count_for(nbytes, itemsize) // max(map(len, nodes))) * itemsize
        opts["inter"] = inter_choice(len(nodes), part, network or Network(), itemsize)
    return opts


def formula_seconds(name: str, p: int, nbytes: int, network: Network, options: dict,
                    ranks_per_node: int | None = None, collective: str = "allreduce") -> float:
    """The closed form of ``name`` (``options`` from :func:`build_options`; ``nbytes``: the
    count its schedule takes, in bytes, :func:`call_shape`).

    Across more than one node a flat algorithm's closed form prices every message at the
    inter-node alpha and beta (its critical path crosses a node in every step); an
    algorithm that knows the layout is given the inter-node constants as options.
    """
    algo = _entry(name, collective)
    alpha, beta = network.alpha, network.beta
    extra = {}
    if algo.context:
        params = inspect.signature(algo.cost).parameters
        if "inter_alpha" in params:
            extra = {"inter_alpha": network.between_alpha, "inter_beta": network.between_beta}
    elif len(node_layout(p, ranks_per_node)) > 1:
        alpha, beta = network.between_alpha, network.between_beta
    return float(algo.cost(p, nbytes, alpha, beta, network.gamma, **options, **extra))


def schedule_metrics(program: SimProgram) -> dict:
    """Rounds, volumes, fan-in and node synchronisations of a compiled program.

    ``rounds`` is the critical path counted in communication steps: the simulated time
    when every message and every node synchronisation (an await of a peer's post) costs 1
    and ports are unlimited. A message's round is the time it completes there; fan-in and
    bytes-in per round group a receiver's messages by that round. Volumes count messages
    only: what moves through a node's window is ``max_rank_window_bytes``, the bytes the
    busiest rank reads from its peers' slots; ``max_rank_syncs`` is the most awaits of a
    peer's post one rank makes (each a flag handed over inside the node).
    """
    p = program.size
    unit = simulate(program, UNIT_NETWORK)
    rounds = int(round(unit.seconds))
    nbytes = program.nbytes
    sent = np.bincount(program.src, weights=nbytes, minlength=p)
    received = np.bincount(program.dst, weights=nbytes, minlength=p)
    fan_in = round_in = 0
    if program.messages:
        msg_round = np.rint(unit.msg_end).astype(np.int64)
        key = program.dst * (rounds + 2) + msg_round
        round_in = int(np.bincount(key, weights=nbytes).max())
        pairs = np.unique(key * p + program.src)
        fan_in = int(np.bincount(pairs // p).max())
    step_rank = np.searchsorted(program.rank_first, np.arange(len(program.step_reduce)),
                                side="right") - 1
    syncs = np.bincount(step_rank[program.await_step[program.await_post >= 0]], minlength=p)
    window = np.bincount(step_rank, weights=program.step_window_reads, minlength=p)
    return {
        "rounds": rounds,
        "total_bytes_sent": int(nbytes.sum()),
        "max_rank_bytes_sent": int(sent.max()) if p else 0,
        "max_rank_bytes_received": int(received.max()) if p else 0,
        "max_fan_in": fan_in,
        "max_round_bytes_in": round_in,
        "max_rank_syncs": int(syncs.max()) if p else 0,
        "max_rank_window_bytes": int(window.max()) if p else 0,
    }


def analyze(name: str, p: int, nbytes: int, *, itemsize: int = 8, profile=None,
            network: Network | None = None, options: dict | None = None,
            program: SimProgram | None = None, ranks_per_node: int | None = None,
            collective: str = "allreduce") -> dict:
    """Return one analysis row (the keys of :data:`KEYS`) for ``collective``'s algorithm
    ``name``, ``nbytes`` the bytes of one rank's block (the whole vector of an all-reduce,
    broadcast or reduce; one block to each rank of an all-to-all or all-to-all-v).

    ``ranks_per_node`` lays the ranks out on nodes (default: one node) for the algorithms
    that use the layout; an algorithm that cannot run on it gets a row of None.
    """
    from ..algorithms import build_schedules
    from ..model.machine import load_profile
    profile = profile or load_profile()
    network = network or Network.from_profile(profile)
    algo = _entry(name, collective)
    row = dict.fromkeys(KEYS)
    row.update(algorithm=name, ranks=p, bytes=nbytes)
    if not_applicable(name, p, ranks_per_node, collective):
        return row
    options = build_options(name, p, nbytes, itemsize=itemsize, options=options,
                            ranks_per_node=ranks_per_node, network=network,
                            collective=collective)
    count = call_shape(algo, p, count_for(nbytes, itemsize))[0]
    if algo.hand_written:
        if program is None:
            program = compile_schedules(build_schedules(name, p, count, itemsize, collective,
                                                        **options), itemsize)
        row.update(schedule_metrics(program))
        row["predicted_seconds"] = simulate(program, network).seconds
    row["formula_seconds"] = formula_seconds(name, p, count * itemsize, network, options,
                                             ranks_per_node, collective)
    return row
