"""The cost-model flags and checks the analysis commands share, and their parsers' maker."""

from __future__ import annotations

import argparse
import os

from ...cli.args import (add_algorithms, add_dtype, add_format, add_option, add_profile,
                         add_sizes, positive_int, rank_list)


def _load_profile(args):
    from ...model.machine import load_profile
    return load_profile(args.profile)


def _network(args):
    from ..simulator import Network
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
    from ...units import parse_dtype
    return parse_dtype(dtype).itemsize


def _resolve_names(args, parser) -> None:
    """``-a``'s names (aliases allowed) as ``--collective``'s canonical names, in place."""
    from ...algorithms import resolve
    collective = getattr(args, "collective", "allreduce")
    try:
        if getattr(args, "algorithms", None):
            args.algorithms = list(dict.fromkeys(resolve(a, collective) for a in args.algorithms))
        if getattr(args, "algorithm", None):
            args.algorithm = resolve(args.algorithm.strip(), collective)
    except ValueError as exc:
        flag = "-a/--algorithms" if getattr(args, "algorithms", None) else "-a/--algorithm"
        parser.error(f"argument {flag}: {exc}")


def _check_model(args, parser) -> None:
    """Shared checks of analyze, simulate, explain and draw (names, dtype, profile)."""
    _resolve_names(args, parser)
    collective = getattr(args, "collective", "allreduce")
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
        from ..metrics import not_applicable
        why = not_applicable(args.algorithm, args.ranks, args.ranks_per_node, collective)
        if why:
            parser.error(f"argument -a/--algorithm: {args.algorithm} on {args.ranks} ranks, "
                         f"{args.ranks_per_node} per node, {why}")
    if names and getattr(args, "schedules_only", False):
        from ..metrics import analyzable
        bad = [a for a in names if a not in analyzable(collective)]
        if bad:
            parser.error(f"argument -a: {', '.join(bad)} has no schedule; choose from "
                         f"{', '.join(analyzable(collective))}")


def _collective(p) -> None:
    """``--collective NAME``: whose algorithms the command builds."""
    from ...algorithms import COLLECTIVES
    p.add_argument("--collective", choices=list(COLLECTIVES), default="allreduce",
                   metavar="NAME",
                   help="the collective whose algorithms to study: "
                        f"{', '.join(COLLECTIVES)} (default %(default)s); -s is one rank's "
                        "block (an all-reduce's, broadcast's or reduce's whole vector, an "
                        "all-to-all's block to each rank); rooted ones at root 0, the "
                        "uneven ones with even counts")


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


def _sim_args(p, limit=None, seconds=None) -> None:
    from ..sweep import SIM_LIMIT, SIM_SECONDS
    limit, seconds = limit or SIM_LIMIT, seconds or SIM_SECONDS
    p.add_argument("--sim-limit", type=int, default=limit,
                   help="simulate while p x (steps + transfers of one rank) is at most this "
                        f"(default {limit}); above it the closed form is used")
    p.add_argument("--sim-seconds", type=float, default=seconds,
                   help="simulate while building all schedules is estimated to take at most "
                        f"this many seconds (default {seconds:g})")


def _schedule_args(p) -> None:
    """The flags of the commands that build schedules: -a, -d, --option."""
    add_algorithms(p, "algorithms, comma-separated (default: every one with a schedule)",
                   resolve=False)
    add_dtype(p, "float64", "element type; sets the element size (default %(default)s)")
    add_option(p)


def _sweep_args(p, metavar, ranks, **format_help) -> None:
    """The flags of analyze and simulate: rank counts, sizes, schedules, format, cost model."""
    p.add_argument("-p", "--ranks", type=rank_list, required=True, metavar=metavar, help=ranks)
    add_sizes(p, required=True)
    _collective(p)
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
