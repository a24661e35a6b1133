"""``mlcomm draw``: a schedule round by round, as a PNG."""

from __future__ import annotations

from ...cli.args import add_dtype, add_option, add_output, is_root, options, positive_int, size
from .model import _collective, _command, _itemsize, _ranks_per_node
from .text import _layout


def _draw(args) -> int:
    from ...algorithms import COLLECTIVES, build_schedules
    from ..draw import draw_schedule
    from ..metrics import build_options, call_shape, count_for
    if not is_root():
        return 0
    name, collective = args.algorithm, args.collective
    itemsize = _itemsize(args.dtype)
    # one element per rank: of an all-reduce's, broadcast's or reduce's vector, else a block
    whole = collective in ("allreduce", "bcast", "reduce")
    count = count_for(args.size, itemsize) if args.size is not None else \
        (args.ranks if whole else 1)
    opts = build_options(name, args.ranks, count * itemsize, itemsize=itemsize,
                         options=options(args), ranks_per_node=args.ranks_per_node,
                         collective=collective)
    built = call_shape(COLLECTIVES[collective][name], args.ranks, count)[0]
    scheds = build_schedules(name, args.ranks, built, itemsize, collective, **opts)
    out = args.output or (f"{name}_p{args.ranks}.png" if collective == "allreduce" else
                          f"{collective}_{name}_p{args.ranks}.png")
    what = "all-reduce" if collective == "allreduce" else collective
    title = f"{name} {what}, p={args.ranks}, {count} element{'s' * (count != 1)}" + \
        ("" if whole else " per block")
    if any(s.node for s in scheds) or args.ranks_per_node:
        title += f", {_layout(args.ranks, args.ranks_per_node)}"
    if opts.get("inter") and len({s.node for s in scheds}) > 1:
        title += f", inter={opts['inter']}"
    draw_schedule(scheds, out, title=title)
    print(f"wrote {out}")
    return 0


def register(subparsers) -> None:
    """Add ``draw``."""
    p = _command(
        subparsers, "draw", _draw, schedules_only=True,
        help="draw a schedule round by round (PNG)",
        description="Draw the schedule as the slides do: ranks as rows, rounds as columns, "
                    "chunks as coloured boxes (whose contributions they sum), arrows for the "
                    "messages of each round.",
        epilog="examples:\n  mlcomm draw -a ring -p 4 --output ring.png\n"
               "  mlcomm draw --collective alltoall -a bruck -p 5")
    p.add_argument("-a", "--algorithm", required=True, metavar="NAME",
                   help="the algorithm to draw (of --collective)")
    _collective(p)
    p.add_argument("-p", "--ranks", type=positive_int, required=True)
    p.add_argument("-s", "--size", type=size, default=None, metavar="SIZE",
                   help="message size in bytes, one rank's block as in analyze (default: "
                        "one element per rank of an all-reduce's, broadcast's or reduce's "
                        "vector, else one element a block)")
    add_dtype(p, "float64", "element type; sets the element size (default %(default)s)")
    add_option(p)
    _ranks_per_node(p)
    add_output(p, "the PNG to write (default ALGORITHM_pP.png; another collective's "
                  "COLLECTIVE_ALGORITHM_pP.png)")
