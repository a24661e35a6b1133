"""The ``analyze``, ``simulate``, ``explain``, ``draw`` and ``calibrate`` commands."""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import sys
from fractions import Fraction

from ..cli.args import (add_algorithms, add_dtype, add_format, add_op, add_option, add_output,
    add_profile, add_progress, add_quick, add_sizes, algorithm, is_root, op_list, options,
    positive_int, rank_list, show_progress, size)

__all__ = ["register", "format_rows", "format_analysis", "in_n"]


def _seconds(x) -> str:
    if x is None:
        return "-"
    if x < 1e-3:
        return f"{x * 1e6:.2f}us"
    if x < 1:
        return f"{x * 1e3:.3f}ms"
    return f"{x:.3f}s"


def _bytes(n) -> str:
    from ..units import format_size
    return format_size(n)


def _align(header, cells) -> list:
    """Lines of a text table: the first column left-aligned, the others right-aligned."""
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h)
              for i, h in enumerate(header)]
    return ["  ".join(v.rjust(w) if i else v.ljust(w)
                      for i, (v, w) in enumerate(zip(row, widths))).rstrip()
            for row in [header, *cells]]


def format_rows(rows, keys, fmt: str) -> str:
    """Render ``rows`` (dicts) with ``keys`` as ``table``, ``json`` or ``csv`` text."""
    if fmt == "json":
        return json.dumps([{k: r.get(k) for k in keys} for r in rows], indent=1)
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=list(keys), lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k) for k in keys})
        return buf.getvalue().rstrip("\n")
    cells = [[_seconds(r.get(k)) if k.endswith("seconds") else
              ("-" if r.get(k) is None else str(r.get(k))) for k in keys] for r in rows]
    return "\n".join(_align(list(keys), cells))


def in_n(nbytes, n: int, p: int) -> str:
    """``nbytes`` as the lecture notes write a volume: a multiple of the message size ``n``.

    Whole multiples read ``56n`` (``n`` for one); (p-1)n/p and 2(p-1)n/p keep the notes'
    denominator p (``7n/8`` and ``14n/8`` at p = 8); other fractions are reduced
    (``n/2``, ``7n/2``); anything else is a decimal (``1.34n``).
    """
    if nbytes is None:
        return "-"
    if not n or not nbytes:
        return str(nbytes)
    f = Fraction(int(nbytes), int(n))
    coef = lambda k: "" if k == 1 else str(k)
    if f.denominator == 1:
        return f"{coef(f.numerator)}n"
    k = f * p
    if p > 1 and k in (p - 1, 2 * (p - 1)):
        return f"{coef(k.numerator)}n/{p}"
    if f.denominator <= 64:
        return f"{coef(f.numerator)}n/{f.denominator}"
    return f"{float(f):.3g}n"


_NOTES_COLUMNS = ("algorithm", "rounds", "total sent", "max/rank", "fan-in", "in/round",
                  "simulated", "formula")


def format_analysis(rows) -> str:
    """The notes' cost table of analysis rows of one rank count and size (volumes in n),
    then a line per algorithm that synchronises a node: its syncs and window reads."""
    dash = lambda v: "-" if v is None else str(v)
    cells, window = [], []
    for r in rows:
        p, n = r["ranks"], r["bytes"]
        sent, got = r["max_rank_bytes_sent"], r["max_rank_bytes_received"]
        per_rank = in_n(sent, n, p) if sent == got else \
            f"{in_n(sent, n, p)} out, {in_n(got, n, p)} in"
        cells.append([r["algorithm"], dash(r["rounds"]), in_n(r["total_bytes_sent"], n, p),
                      per_rank, dash(r["max_fan_in"]), in_n(r["max_round_bytes_in"], n, p),
                      _seconds(r["predicted_seconds"]), _seconds(r["formula_seconds"])])
        if r.get("max_rank_syncs"):
            window.append(f"# {r['algorithm']}: {r['max_rank_syncs']} node syncs, "
                          f"{in_n(r['max_rank_window_bytes'], n, p)} read from peers' "
                          f"window slots or buffers (busiest rank)")
    return "\n".join(_align(list(_NOTES_COLUMNS), cells) + window)


def _load_profile(args):
    from ..model.machine import load_profile
    return load_profile(args.profile)


def _network(args):
    from .simulator import Network
    profile = _load_profile(args)
    return profile, Network.from_profile(
        profile, alpha=args.alpha, beta=args.beta, gamma=args.gamma,
        ports=getattr(args, "ports", None), ranks_per_node=getattr(args, "ranks_per_node", None),
        inter_alpha=getattr(args, "inter_alpha", None), inter_beta=getattr(args, "inter_beta", None),
        nic_ports=getattr(args, "nic_ports", None), copy_beta=getattr(args, "copy_beta", None),
        sync=getattr(args, "sync", None))


def _model_line(net, profile) -> str:
    """The ``# model:`` lines: the constants the simulator ran on."""
    nodes = (f"# nodes: {net.ranks_per_node} ranks/node, inter alpha={net.between_alpha:.3g}s "
             f"beta={net.between_beta:.3g}s/B, nic_ports={net.nic_ports}\n"
             if net.two_level else "")
    return (f"# model: alpha={net.alpha:.3g}s beta={net.beta:.3g}s/B gamma={net.gamma:.3g}s/B, "
            f"ports={net.ports or 'unlimited'} ({profile.model_source})\n{nodes}"
            f"# window: node sync={net.sync_cost:.3g}s, copy={net.copy_cost:.3g}s/B")


def _itemsize(dtype) -> int:
    from ..units import parse_dtype
    return parse_dtype(dtype).itemsize


def _check_model(args, parser) -> None:
    """Shared checks of analyze, simulate, explain and draw (names, dtype, profile)."""
    if getattr(args, "profile", None) and not os.path.exists(args.profile):
        parser.error(f"argument --profile: no file {args.profile!r}")
    if getattr(args, "dtype", None):
        try:
            itemsize = _itemsize(args.dtype)
        except TypeError as exc:
            parser.error(f"argument -d/--dtype: {exc}")
        sizes = getattr(args, "sizes", None) or ([args.size] if getattr(args, "size", None)
                                                 else [])
        uneven = [s for s in sizes if s % itemsize]
        if uneven:
            parser.error(f"argument -s/--sizes: {uneven[0]} bytes is not a whole number of "
                         f"{args.dtype} elements ({itemsize} bytes each)")
    names = getattr(args, "algorithms", None) or (
        [args.algorithm] if getattr(args, "algorithm", None) else None)
    if getattr(args, "algorithm", None):
        from .metrics import not_applicable
        why = not_applicable(args.algorithm, args.ranks, args.ranks_per_node)
        if why:
            parser.error(f"argument -a/--algorithm: {args.algorithm} on {args.ranks} ranks, "
                         f"{args.ranks_per_node} per node, {why}")
    if names and getattr(args, "schedules_only", False):
        from .metrics import analyzable
        bad = [a for a in names if a not in analyzable()]
        if bad:
            parser.error(f"argument -a: {', '.join(bad)} has no schedule; choose from "
                         f"{', '.join(analyzable())}")


# --- analyze -------------------------------------------------------------------

def _analyze(args) -> int:
    from ..algorithms import ALGORITHMS
    from .metrics import KEYS, analyzable, analyze, not_applicable
    if not is_root():
        return 0
    profile, net = _network(args)
    names = args.algorithms or analyzable()
    opts = options(args)
    itemsize = _itemsize(args.dtype)
    blocks = []
    for p in args.ranks:
        for nbytes in args.sizes:
            blocks.append((p, nbytes, [analyze(name, p, nbytes, itemsize=itemsize,
                                               profile=profile, network=net, options=opts,
                                               ranks_per_node=args.ranks_per_node)
                                       for name in names]))
    if args.format != "table":
        print(format_rows([r for _, _, rows in blocks for r in rows], KEYS, args.format))
        return 0
    for i, (p, nbytes, rows) in enumerate(blocks):
        shown = ", ".join(f"{k}={v}" for k, v in opts.items())
        layout = (f"; {_layout(p, args.ranks_per_node)}"
                  if any(ALGORITHMS[r["algorithm"]].context for r in rows) else "")
        print(("\n" if i else "") + f"# p = {p} ranks, n = {_bytes(nbytes)} bytes "
              f"({nbytes // itemsize} x {args.dtype}){'; ' + shown if shown else ''}{layout}")
        print(format_analysis(rows))
        skipped = [f"{r['algorithm']} ({not_applicable(r['algorithm'], p, args.ranks_per_node)})"
                   for r in rows if not_applicable(r["algorithm"], p, args.ranks_per_node)]
        if skipped:
            print(f"# not on this layout: {', '.join(skipped)}")
    print("# volumes in multiples of the message size n (raw bytes: --format json or csv)")
    print("# rounds: the critical path in steps (a message or a node sync is one);")
    print("# max/rank: the most bytes one rank sends (window reads are not on the wire)")
    print("# fan-in, in/round: the most senders to one rank, and bytes into it, in one round")
    print("# simulated: the cost simulator; formula: the closed form")
    print(_model_line(net, profile))
    return 0


def _layout(p: int, ranks_per_node) -> str:
    """The node layout in words: ``one node``, ``4 nodes of 8``, ``3 nodes of 2 (last 1)``."""
    from .metrics import node_layout
    nodes = node_layout(p, ranks_per_node)
    if len(nodes) == 1:
        return "one node"
    k, last = len(nodes[0]), len(nodes[-1])
    return f"{len(nodes)} nodes of {k}" + (f" (last {last})" if last != k else "")


# --- simulate ------------------------------------------------------------------

def _simulate(args) -> int:
    from tqdm import tqdm

    from .metrics import analyzable
    from .sweep import SWEEP_KEYS, sweep
    if not is_root():
        return 0
    profile, net = _network(args)
    names = args.algorithms or analyzable()
    total = len(names) * len(args.ranks) * len(args.sizes)
    with tqdm(total=total, desc="simulate", disable=not show_progress(args) or total < 8,
              file=sys.stderr, leave=False) as bar:
        rows = sweep(names, args.ranks, args.sizes, network=net, itemsize=_itemsize(args.dtype),
                     options=options(args), limit=args.sim_limit,
                     seconds=args.sim_seconds, progress=bar, ranks_per_node=args.ranks_per_node)
    print(format_rows(rows, SWEEP_KEYS, args.format))
    formula = sorted({(r["algorithm"], r["ranks"]) for r in rows if r["source"] == "formula"})
    if args.format == "table":
        print(_model_line(net, profile))
        if formula:
            first = {}
            for name, p in formula:
                first.setdefault(name, p)
            print(f"# closed forms take over (schedule over --sim-limit {args.sim_limit} entries "
                  f"or over --sim-seconds {args.sim_seconds:g} s to build) for: "
                  + ", ".join(f"{n} at p>={p}" for n, p in first.items()))
    if args.plot:
        from .plots import plot_sweep
        plot_sweep(rows, args.plot, title=args.title)
        print(f"# plot written to {args.plot}", file=sys.stderr)
    return 0


# --- explain -------------------------------------------------------------------

def _node_aware() -> list:
    """The all-reduces that take the node layout (their schedules use it)."""
    from ..algorithms import ALGORITHMS
    return [name for name, a in ALGORITHMS.items() if a.hand_written and a.context]


def _explain(args) -> int:
    import dataclasses

    from ..model.cost import explain
    from .metrics import node_layout
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
    from ..model.cost import predict
    from .metrics import not_applicable
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
    from .metrics import analyzable, not_applicable
    from .simulator import Network
    from .sweep import predict_time
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


# --- draw ----------------------------------------------------------------------

def _draw(args) -> int:
    from ..algorithms import build_schedules
    from .draw import draw_schedule
    from .metrics import build_options, count_for
    if not is_root():
        return 0
    name = args.algorithm
    itemsize = _itemsize(args.dtype)
    count = count_for(args.size, itemsize) if args.size is not None else args.ranks
    opts = build_options(name, args.ranks, count * itemsize, itemsize=itemsize,
                         options=options(args), ranks_per_node=args.ranks_per_node)
    scheds = build_schedules(name, args.ranks, count, itemsize, **opts)
    out = args.output or f"{name}_p{args.ranks}.png"
    title = f"{name} all-reduce, p={args.ranks}, {count} elements"
    if any(s.node for s in scheds) or args.ranks_per_node:
        title += f", {_layout(args.ranks, args.ranks_per_node)}"
    if opts.get("inter") and len({s.node for s in scheds}) > 1:
        title += f", inter={opts['inter']}"
    draw_schedule(scheds, out, title=title)
    print(f"wrote {out}")
    return 0


# --- calibrate -----------------------------------------------------------------

def _calibrate(args) -> int:
    from mpi4py import MPI

    from .calibrate import GAMMA_DTYPES, GAMMA_OPS, calibrate
    comm = MPI.COMM_WORLD
    prof = calibrate(comm, sizes=args.sizes, quick=args.quick, gamma_bytes=args.gamma_bytes,
                     dtypes=args.dtype.split(",") if args.dtype else GAMMA_DTYPES,
                     ops=args.op or GAMMA_OPS, path=args.profile, write=not args.dry_run)
    if prof is None:
        return 0
    print(f"ping-pong rank 0 <-> 1 ({comm.Get_size()} ranks, {prof.meta['mpi']})")
    print(f"{'bytes':>10s} {'one-way':>12s} {'fit':>12s}")
    for n, t in prof.meta["pingpong"]:
        print(f"{n:10d} {_seconds(t):>12s} {_seconds(prof.alpha + n * prof.beta):>12s}")
    bw = 1 / prof.beta / 1e9 if prof.beta else float("inf")
    print(f"alpha = {prof.alpha:.3g} s   beta = {prof.beta:.3g} s/B ({bw:.2f} GB/s)")
    print(f"loop overhead: {prof.step_overhead * 1e6:.2f} us per step, "
          f"{prof.op_overhead * 1e6:.2f} us per local op")
    print(f"gamma = {prof.gamma:.3g} s/B (default: float64 sum)")
    for backend, table in prof.gammas.items():
        for dtype, ops in table.items():
            cells = "  ".join(f"{op}={v:.3g}" for op, v in ops.items())
            print(f"  gamma[{backend}][{dtype}]: {cells}")
    print("profile not written (--dry-run)" if args.dry_run else f"profile written to {prof.source}")
    return 0


# --- parsers -------------------------------------------------------------------

def _ranks_per_node(p, extra="") -> None:
    p.add_argument("--ranks-per-node", type=positive_int, default=None, metavar="K",
                   help="K consecutive ranks per node, the last node maybe fewer: the layout "
                        "of shared_memory and hierarchical" + extra + " (default: one node)")


def _model_args(p, cluster: bool) -> None:
    g = p.add_argument_group("cost model (defaults: the profile, see `mlcomm calibrate`)")
    add_profile(g)
    g.add_argument("--alpha", type=float, default=None, help="latency per message, seconds")
    g.add_argument("--beta", type=float, default=None, help="seconds per byte on a link")
    g.add_argument("--gamma", type=float, default=None, help="seconds per reduced byte")
    g.add_argument("--copy-beta", type=float, default=None,
                   help="seconds per byte copied into or out of a node window slot "
                        "(default: --beta)")
    g.add_argument("--sync", type=float, default=None,
                   help="seconds from a node post to the await that sees it "
                        "(default: --alpha / 4)")
    if cluster:
        g.add_argument("--ports", type=int, default=None,
                       help="messages a rank sends (and receives) at once: 1 = single-port "
                            "full duplex (default), k, or 0 = unlimited")
        _ranks_per_node(g, ", and the two-level model's placement: messages between nodes "
                           "cost --inter-alpha and --inter-beta")
        g.add_argument("--inter-alpha", type=float, default=None,
                       help="latency between nodes (default: --alpha)")
        g.add_argument("--inter-beta", type=float, default=None,
                       help="seconds per byte between nodes (default: --beta)")
        g.add_argument("--nic-ports", type=int, default=None,
                       help="inter-node messages a node's NIC carries at once each way "
                            "(default 1; 0 = unlimited)")


#: explain's limits: one rank count and size, so it can afford to simulate more
EXPLAIN_LIMIT, EXPLAIN_SECONDS = 5_000_000, 30.0


def _sim_args(p, limit=None, seconds=None) -> None:
    from .sweep import SIM_LIMIT, SIM_SECONDS
    limit, seconds = limit or SIM_LIMIT, seconds or SIM_SECONDS
    p.add_argument("--sim-limit", type=int, default=limit,
                   help="simulate while p x (steps + transfers of one rank) is at most this "
                        f"(default {limit}); above it the closed form is used")
    p.add_argument("--sim-seconds", type=float, default=seconds,
                   help="simulate while building all schedules is estimated to take at most "
                        f"this many seconds (default {seconds:g})")


def _schedule_args(p) -> None:
    """The flags of the commands that build schedules: -a, -d, --option."""
    add_algorithms(p, "algorithms, comma-separated (default: every one with a schedule)")
    add_dtype(p, "float64", "element type; sets the element size (default %(default)s)")
    add_option(p)


def _sweep_args(p, metavar, ranks, **format_help) -> None:
    """The flags of analyze and simulate: rank counts, sizes, schedules, format, cost model."""
    p.add_argument("-p", "--ranks", type=rank_list, required=True, metavar=metavar, help=ranks)
    add_sizes(p, required=True)
    _schedule_args(p)
    add_format(p, **format_help)
    _model_args(p, cluster=True)


def _command(subparsers, name, func, *, help, description, epilog, check=True, **defaults):
    """A command's parser: ``func`` runs it, with ``check`` once the cost model's flags are
    checked; ``defaults`` go into its namespace."""
    p = subparsers.add_parser(name, help=help, description=description, epilog=epilog,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(func=func, **defaults)
    if check:
        p.set_defaults(validate=lambda args: _check_model(args, p))
    return p


def register(subparsers) -> None:
    """Add the analysis commands."""
    p = _command(
        subparsers, "analyze", _analyze, schedules_only=True,
        help="rounds, volumes, fan-in and cost of each algorithm's schedule",
        description="Build every rank's schedule and derive the lecture notes' cost table "
                    "from it: rounds on the critical path, bytes sent in total and by the "
                    "busiest rank, fan-in and bytes in per round (as multiples of the "
                    "message size n), the simulated time and the closed-form time. "
                    "No MPI job needed.",
        epilog="examples:\n  mlcomm analyze -p 8 -s 1M\n"
               "  mlcomm analyze -p 4,8 -s 64K,1M -a ring,rd --format json")
    _sweep_args(p, "P[,P2,...]", "rank counts, e.g. 8 or 4,8",
                help="table: the notes' notation (volumes in n); json, csv: raw bytes "
                     "(default %(default)s)")

    p = _command(
        subparsers, "simulate", _simulate, schedules_only=True,
        help="predicted time vs ranks and bytes (cost simulator)",
        description="Run the schedules through the cost simulator (MPI matching, alpha + "
                    "bytes*beta per message, gamma per reduced byte, port and two-level "
                    "models). Schedules bigger than --sim-limit use the closed form instead; "
                    "the `source` column says which.",
        epilog="examples:\n  mlcomm simulate -p 2,4,8,...,4096 -s 8 --plot latency.png\n"
               "  mlcomm simulate -p 16,64 -s 8,64K,16M --ranks-per-node 8 "
               "--inter-alpha 5e-6 --inter-beta 1e-10")
    _sweep_args(p, "P1,P2,...", "rank counts: 2,4,8 or 2,4,...,4096")
    _sim_args(p)
    p.add_argument("--plot", metavar="FILE.png", default=None,
                   help="draw time vs ranks (one panel per size) and time vs bytes")
    p.add_argument("--title", default=None, help="plot title")
    add_progress(p)

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

    p = _command(
        subparsers, "draw", _draw, schedules_only=True,
        help="draw a schedule round by round (PNG)",
        description="Draw the schedule as the slides do: ranks as rows, rounds as columns, "
                    "chunks as coloured boxes (whose contributions they sum), arrows for the "
                    "messages of each round.",
        epilog="example:\n  mlcomm draw -a ring -p 4 --output ring.png")
    p.add_argument("-a", "--algorithm", type=algorithm, required=True, metavar="NAME",
                   help="the algorithm to draw")
    p.add_argument("-p", "--ranks", type=positive_int, required=True)
    p.add_argument("-s", "--size", type=size, default=None, metavar="SIZE",
                   help="message size in bytes (default: one element per rank)")
    add_dtype(p, "float64", "element type; sets the element size (default %(default)s)")
    add_option(p)
    _ranks_per_node(p)
    add_output(p, "the PNG to write (default ALGORITHM_pP.png)")

    p = _command(
        subparsers, "calibrate", _calibrate, check=False,
        help="measure alpha, beta, gamma and write the profile (mpiexec -n 2+)",
        description="Ping-pong between ranks 0 and 1 over sizes, least-squares fit of alpha and "
                    "beta; time the reduction kernels for gamma per backend, dtype and op. "
                    "Rank 0 writes the profile to --profile, $MLCOMM_PROFILE or "
                    "~/.cache/mlcomm/profile.json.",
        epilog="example:\n  mpiexec -n 2 mlcomm calibrate --quick")
    add_quick(p, "fewer sizes and iterations (seconds)")
    add_sizes(p, help="ping-pong sizes, e.g. 8,64,...,16M")
    p.add_argument("--gamma-bytes", type=size, default=None,
                   help="array size for the kernel timings (default 4M, 1M with --quick)")
    add_dtype(p, None, "dtypes for gamma, comma-separated (default: a common set)",
              metavar="D1,D2,...")
    add_op(p, None, "ops for gamma, comma-separated (default sum,prod,min,max)", type=op_list,
           metavar="OP1,OP2,...")
    add_profile(p, "the profile to write (default $MLCOMM_PROFILE or "
                   "~/.cache/mlcomm/profile.json)")
    p.add_argument("--dry-run", action="store_true", help="measure and print, write nothing")
