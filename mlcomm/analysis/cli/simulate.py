"""``mlcomm simulate``: predicted time over rank counts and sizes."""

from __future__ import annotations

import sys

from ...cli.args import add_progress, is_root, options, show_progress
from .model import _command, _itemsize, _model_line, _network, _sim_args, _sweep_args
from .text import format_rows


def _simulate(args) -> int:
    from tqdm import tqdm

    from ..metrics import analyzable
    from ..sweep import SWEEP_KEYS, sweep
    if not is_root():
        return 0
    profile, net = _network(args)
    names = args.algorithms or analyzable(args.collective)
    total = len(names) * len(args.ranks) * len(args.sizes)
    with tqdm(total=total, desc="simulate", disable=not show_progress(args) or total < 8,
              file=sys.stderr, leave=False) as bar:
        rows = sweep(names, args.ranks, args.sizes, network=net, itemsize=_itemsize(args.dtype),
                     options=options(args), limit=args.sim_limit,
                     seconds=args.sim_seconds, progress=bar, ranks_per_node=args.ranks_per_node,
                     collective=args.collective)
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
        from ..plots import plot_sweep
        plot_sweep(rows, args.plot, title=args.title)
        print(f"# plot written to {args.plot}", file=sys.stderr)
    return 0


def register(subparsers) -> None:
    """Add ``simulate``."""
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
