"""``mlcomm analyze``: the lecture notes' cost table of each algorithm's schedule."""

from __future__ import annotations

from ...cli.args import is_root, options
from .model import _command, _itemsize, _model_line, _network, _sim_args, _sweep_args
from .text import _align, _bytes, _layout, _seconds, format_rows, in_n


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


def _row(name, p, nbytes, args, **kw) -> dict:
    """:func:`~mlcomm.analysis.metrics.analyze`'s row; where the schedule refuses the size
    (``alltoallv``'s window takes one round), a row of None with ``refused``: why; where
    it is too big to build (:func:`~mlcomm.analysis.sweep.predict_time`'s estimate from
    three ranks, past ``--sim-limit`` or ``--sim-seconds``), the closed form alone."""
    from ..metrics import KEYS, analyze
    from ..sweep import predict_time
    blank = {**dict.fromkeys(KEYS), "algorithm": name, "ranks": p, "bytes": nbytes}
    try:
        if p > 64:
            rough = predict_time(name, p, nbytes, network=kw["network"], itemsize=kw["itemsize"],
                                 options=kw["options"], limit=args.sim_limit,
                                 seconds=args.sim_seconds, ranks_per_node=args.ranks_per_node,
                                 collective=args.collective, estimate_only=True)
            if rough["source"] == "formula":
                return {**blank, "formula_seconds": rough["seconds"], "too_big": True}
        return analyze(name, p, nbytes, ranks_per_node=args.ranks_per_node,
                       collective=args.collective, **kw)
    except ValueError as exc:
        return {**blank, "refused": str(exc)}


def _analyze(args) -> int:
    from ...algorithms import COLLECTIVES
    from ..metrics import KEYS, analyzable, not_applicable
    if not is_root():
        return 0
    profile, net = _network(args)
    table, collective = COLLECTIVES[args.collective], args.collective
    names = args.algorithms or analyzable(collective)
    opts = options(args)
    itemsize = _itemsize(args.dtype)
    blocks = []
    for p in args.ranks:
        for nbytes in args.sizes:
            blocks.append((p, nbytes, [_row(name, p, nbytes, args, itemsize=itemsize,
                                            profile=profile, network=net, options=opts)
                                       for name in names]))
    if args.format != "table":
        print(format_rows([r for _, _, rows in blocks for r in rows], KEYS, args.format))
        return 0
    for i, (p, nbytes, rows) in enumerate(blocks):
        shown = ", ".join(f"{k}={v}" for k, v in opts.items())
        layout = (f"; {_layout(p, args.ranks_per_node)}"
                  if any(table[r["algorithm"]].context for r in rows) else "")
        what = "" if collective == "allreduce" else f"{collective}, "
        print(("\n" if i else "") + f"# {what}p = {p} ranks, n = {_bytes(nbytes)} bytes "
              f"({nbytes // itemsize} x {args.dtype}){'; ' + shown if shown else ''}{layout}")
        print(format_analysis(rows))
        why = {r["algorithm"]: not_applicable(r["algorithm"], p, args.ranks_per_node,
                                              collective) for r in rows}
        skipped = [f"{name} ({reason})" for name, reason in why.items() if reason]
        if skipped:
            print(f"# not on this layout: {', '.join(skipped)}")
        for r in rows:
            if r.get("refused"):
                print(f"# {r['algorithm']} refuses this size: {r['refused']}")
        big = [r["algorithm"] for r in rows if r.get("too_big")]
        if big:
            print(f"# closed form only (schedule over --sim-limit {args.sim_limit} entries or "
                  f"--sim-seconds {args.sim_seconds:g} s to build): {', '.join(big)}")
    print("# volumes in multiples of the message size n (raw bytes: --format json or csv)")
    print("# rounds: the critical path in steps (a message or a node sync is one);")
    print("# max/rank: the most bytes one rank sends (window reads are not on the wire)")
    print("# fan-in, in/round: the most senders to one rank, and bytes into it, in one round")
    print("# simulated: the cost simulator; formula: the closed form"
          + ("" if collective == "allreduce" else
             "; n: one rank's block (an all-to-all's to each rank)"))
    print(_model_line(net, profile))
    return 0


def register(subparsers) -> None:
    """Add ``analyze``."""
    p = _command(
        subparsers, "analyze", _analyze, schedules_only=True,
        help="rounds, volumes, fan-in and cost of each algorithm's schedule",
        description="Build every rank's schedule and derive the lecture notes' cost table "
                    "from it: rounds on the critical path, bytes sent in total and by the "
                    "busiest rank, fan-in and bytes in per round (as multiples of the "
                    "message size n), the simulated time and the closed-form time. "
                    "No MPI job needed.",
        epilog="examples:\n  mlcomm analyze -p 8 -s 1M\n"
               "  mlcomm analyze -p 4,8 -s 64K,1M -a ring,rd --format json\n"
               "  mlcomm analyze --collective alltoall -p 8,1024 -s 8,64K")
    _sweep_args(p, "P[,P2,...]", "rank counts, e.g. 8 or 4,8",
                help="table: the notes' notation (volumes in n); json, csv: raw bytes "
                     "(default %(default)s)")
    _sim_args(p)
