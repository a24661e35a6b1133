"""``mlcomm explain``: every candidate's predicted time, what ``auto`` picks, and why."""

from __future__ import annotations

from ...cli.args import add_algorithms, add_dtype, add_op, add_sizes, is_root, positive_int
from .model import _command, _itemsize, _load_profile, _model_args, _model_line, _sim_args
from .text import _align, _bytes, _layout, _seconds

#: explain's limits: one rank count and size, so it can afford to simulate more
EXPLAIN_LIMIT, EXPLAIN_SECONDS = 5_000_000, 30.0


def _node_aware() -> list:
    """The all-reduces that take the node layout (their schedules use it)."""
    from ...algorithms import ALGORITHMS
    return [name for name, a in ALGORITHMS.items() if a.hand_written and a.context]


def _explain(args) -> int:
    import dataclasses

    from ...model.cost import explain
    from ..metrics import node_layout
    if not is_root():
        return 0
    profile = _load_profile(args)
    overrides = {k: getattr(args, k) for k in ("alpha", "beta", "gamma")
                 if getattr(args, k) is not None}
    if overrides:
        profile = dataclasses.replace(profile, **overrides)
    itemsize = _itemsize(args.dtype) if args.dtype else 4
    nodes = node_layout(args.ranks, args.ranks_per_node) if args.ranks_per_node else None
    for i, nbytes in enumerate(args.sizes):
        choice, times, profile = explain(args.ranks, nbytes, profile=profile, dtype=args.dtype,
                                         op=args.op, candidates=args.algorithms,
                                         itemsize=itemsize, nodes=nodes)
        gamma = profile.gamma_for(args.dtype, args.op)
        kernel = " ".join(str(x) for x in (args.dtype, args.op) if x) or "any dtype and op"
        where = "" if args.ranks_per_node is None else f", {_layout(args.ranks, args.ranks_per_node)}"
        print(("\n" if i else "") + f"all-reduce of {_bytes(nbytes)} bytes ({kernel}) "
              f"on {args.ranks} ranks{where}")
        print(f"profile: {profile.model_source}: alpha={profile.alpha:.3g}s "
              f"beta={profile.beta:.3g}s/B "
              f"({1 / profile.beta / 1e9 if profile.beta else float('inf'):.2f} GB/s) "
              f"gamma={gamma:.3g}s/B")
        if args.ranks_per_node is None:
            _explain_model(args, nbytes, choice, times, profile, itemsize)
        else:
            _explain_cluster(args, nbytes, choice, profile, gamma, itemsize)
        if profile.tuned_choice(args.ranks, nbytes) == choice:
            print(f"auto chooses {choice}: measured fastest for {args.ranks} ranks at the "
                  f"nearest tuned size (mlcomm tune), whatever the model predicts")
        elif args.ranks_per_node is None:
            print(f"auto chooses {choice}: least predicted time (alpha-beta-gamma closed form "
                  f"+ per-step and per-op overhead and copies) with MLCOMM_AUTO=model; by "
                  f"default a job times the candidates on its first call of this size band")
        else:
            print(f"auto chooses {choice}: least predicted time of its own model (the closed "
                  f"forms with the profile on this layout), not the simulator above")
    return 0


def _explain_model(args, nbytes, choice, times, profile, itemsize) -> None:
    """auto's own model (closed forms on one node), the node-aware algorithms beside it."""
    from ...model.cost import predict
    from ..metrics import not_applicable
    if args.algorithms is None:
        extra = [n for n in _node_aware() if n not in times and not not_applicable(n, args.ranks)]
        times = dict(times, **predict(args.ranks, nbytes, profile=profile, dtype=args.dtype,
                                      op=args.op, candidates=extra, itemsize=itemsize))
    fastest = min(times.values())
    cells = []
    for name, t in sorted(times.items(), key=lambda kv: kv[1]):
        ratio = t / fastest if fastest > 0 else float("nan")
        cells.append([name, _seconds(t), f"{ratio:.2f}x", "<- auto" if name == choice else ""])
    print("\n".join(_align(["algorithm", "predicted", "vs fastest", ""], cells)))


def _explain_cluster(args, nbytes, choice, profile, gamma, itemsize) -> None:
    """Every candidate on the node layout, by the two-level simulator; why ``hierarchical``
    is or is not the fastest."""
    from ..metrics import analyzable, not_applicable
    from ..simulator import Network
    from ..sweep import predict_time
    net = Network.from_profile(
        profile, gamma=gamma, ports=args.ports, ranks_per_node=args.ranks_per_node,
        inter_alpha=args.inter_alpha, inter_beta=args.inter_beta, nic_ports=args.nic_ports,
        copy_beta=args.copy_beta, sync=args.sync)
    names = args.algorithms or analyzable()
    skipped = [f"{n} ({not_applicable(n, args.ranks, args.ranks_per_node)})" for n in names
               if not_applicable(n, args.ranks, args.ranks_per_node)]
    rows = [predict_time(n, args.ranks, nbytes, network=net, itemsize=itemsize,
                         limit=args.sim_limit, seconds=args.sim_seconds,
                         ranks_per_node=args.ranks_per_node, breakdown=True)
            for n in names if not not_applicable(n, args.ranks, args.ranks_per_node)]
    rows.sort(key=lambda r: r["seconds"])
    fastest = rows[0]["seconds"]
    cells = [[r["algorithm"], _seconds(r["seconds"]),
              f"{r['seconds'] / fastest:.2f}x" if fastest > 0 else "nan", r["source"],
              "<- auto" if r["algorithm"] == choice else ""] for r in rows]
    print("\n".join(_align(["algorithm", "predicted", "vs fastest", "source", ""], cells)))
    print(_model_line(net, profile))
    if any(r["source"] == "formula" for r in rows) and net.ranks_per_node < args.ranks:
        print("# formula: the closed form, every message at the inter-node alpha and beta and no\n"
              "# NIC shared by a node's ranks (raise --sim-limit or --sim-seconds to simulate)")
    if skipped:
        print(f"not candidates on this layout: {', '.join(skipped)}")
    for line in _why("hierarchical", rows):
        print(line)


def _terms(path, least: float) -> str:
    """A critical path's terms of at least ``least`` seconds, largest first:
    ``inter-node latency 45.00us (9)`` (the count of messages or syncs)."""
    counts = path["counts"]
    said = {"inter-node latency": "inter-node messages", "intra-node latency":
            "intra-node messages", "node syncs": "node syncs"}
    parts = []
    for term, t in sorted(((k, v) for k, v in path.items() if k != "counts"),
                          key=lambda kv: -kv[1]):
        if t >= least:
            n = counts.get(said.get(term), 0)
            parts.append(f"{term} {_seconds(t)}" + (f" ({n})" if n else ""))
    return " + ".join(parts) or "nothing"


def _why(name, rows) -> list:
    """Lines that say why ``name`` is or is not the fastest of ``rows``: its critical path
    against the fastest other candidate's, term by term, the largest difference first."""
    mine = next((r for r in rows if r["algorithm"] == name), None)
    others = [r for r in rows if r["algorithm"] != name]
    if mine is None or not others:
        return []
    other = others[0]
    fastest = mine["seconds"] <= other["seconds"]
    verdict = (f"{name} is the fastest ({_seconds(mine['seconds'])}; next {other['algorithm']} "
               f"{_seconds(other['seconds'])})" if fastest else
               f"{name} is not the fastest ({_seconds(mine['seconds'])} against "
               f"{other['algorithm']}'s {_seconds(other['seconds'])})")
    if "critical_path" not in mine or "critical_path" not in other:
        formula = [r["algorithm"] for r in (mine, other) if "critical_path" not in r]
        return [f"why: {verdict}; {' and '.join(formula)} from the closed form (the schedule "
                f"is over --sim-limit or --sim-seconds), so no term-by-term comparison"]
    a, b = mine["critical_path"], other["critical_path"]
    least = 1e-3 * max(mine["seconds"], other["seconds"])  # terms under 0.1% go unsaid
    diff = {k: a[k] - b[k] for k in a if k != "counts"}
    less = sorted((k for k in diff if diff[k] <= -least), key=lambda k: diff[k])
    more = sorted((k for k in diff if diff[k] >= least), key=lambda k: -diff[k])
    words = lambda keys: ", ".join(f"{k} {_seconds(abs(diff[k]))}" for k in keys) or "nothing"
    dominant = max(diff, key=lambda k: abs(diff[k]))
    return [f"why: {verdict}. Critical paths:",
            f"  {name}: {_terms(a, least)}",
            f"  {other['algorithm']}: {_terms(b, least)}",
            f"  {name} saves {words(less)}; it adds {words(more)}. The dominant term: "
            f"{dominant} ({'saved' if diff[dominant] < 0 else 'added'} "
            f"{_seconds(abs(diff[dominant]))})."]


def register(subparsers) -> None:
    """Add ``explain``."""
    p = _command(
        subparsers, "explain", _explain,
        help="every candidate's predicted time and what `auto` picks",
        description="Evaluate each all-reduce algorithm's predicted time, each against the "
                    "fastest prediction, and show what algorithm='auto' chooses: the fastest "
                    "prediction of its model, or the measured choice where `mlcomm tune` "
                    "decided. Without --ranks-per-node the predictions are auto's model (the "
                    "closed forms with the profile, calibrated or the built-in defaults, all "
                    "ranks on one node). With it, every candidate runs through the two-level "
                    "simulator on that layout (see `mlcomm simulate`), and the critical "
                    "paths say why hierarchical is or is not the fastest.",
        epilog="examples:\n  mlcomm explain -p 64 -s 8,16M -d float32 -o sum\n"
               "  mlcomm explain -p 4096 -s 8 --ranks-per-node 8 --inter-alpha 5e-6 "
               "--inter-beta 1e-10")
    p.add_argument("-p", "--ranks", type=positive_int, required=True)
    add_sizes(p, required=True)
    add_dtype(p, None, "pick gamma and the element size for this dtype (default: the "
                       "profile's gamma, 4-byte elements)")
    add_op(p, None, "pick gamma for this op")
    add_algorithms(p, "candidates, comma-separated (default: every algorithm with a schedule "
                      "that runs on the layout)")
    _model_args(p, cluster=True)
    _sim_args(p, EXPLAIN_LIMIT, EXPLAIN_SECONDS)
