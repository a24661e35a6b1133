"""The ``analyze``, ``simulate``, ``explain``, ``draw`` and ``calibrate`` commands."""

from __future__ import annotations

import argparse
import csv
import io
import json
import re
import sys

__all__ = ["register", "parse_size", "parse_list", "format_rows"]

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text) -> int:
    """Parse ``8``, ``64K``, ``16M``, ``1G``, ``4KiB`` (binary units) into bytes."""
    m = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(?:i?B)?\s*", str(text), re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (write e.g. 8, 64K, 16M)")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def parse_list(text, item=int) -> list:
    """Parse ``a,b,c`` or ``2,4,8,...,4096[,more]`` (geometric, or arithmetic when b-a is the step)."""
    parts = [t.strip() for t in str(text).split(",") if t.strip()]
    if "..." not in parts:
        return [item(t) for t in parts]
    i = parts.index("...")
    if i < 2 or i == len(parts) - 1:
        raise ValueError(f"{text!r}: write a,b,...,z with two values before '...'")
    head = [item(t) for t in parts[:i]]
    a, b, last = head[-2], head[-1], item(parts[i + 1])
    out = head[:]
    if a > 0 and b % a == 0 and b // a > 1:
        while out[-1] * (b // a) <= last:
            out.append(out[-1] * (b // a))
    elif b > a:
        while out[-1] + (b - a) <= last:
            out.append(out[-1] + (b - a))
    else:
        raise ValueError(f"{text!r}: the values before '...' must grow")
    if out[-1] != last:
        out.append(last)
    return out + parse_list(",".join(parts[i + 2:]), item) if parts[i + 2:] else out


def _seconds(x) -> str:
    if x is None:
        return "-"
    if x < 1e-3:
        return f"{x * 1e6:.2f}us"
    if x < 1:
        return f"{x * 1e3:.3f}ms"
    return f"{x:.3f}s"


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
    widths = [max(len(k), *(len(c[i]) for c in cells)) if cells else len(k)
              for i, k in enumerate(keys)]
    lines = ["  ".join(k.rjust(w) if i else k.ljust(w) for i, (k, w) in enumerate(zip(keys, widths)))]
    for c in cells:
        lines.append("  ".join(v.rjust(w) if i else v.ljust(w)
                               for i, (v, w) in enumerate(zip(c, widths))))
    return "\n".join(lines)


def _algorithms(text) -> list[str] | None:
    if not text or text == "all":
        return None
    from ..algorithms import resolve
    return [resolve(t.strip()) for t in text.split(",") if t.strip()]


def _options(pairs) -> dict:
    out = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--option {pair!r}: write KEY=VALUE, e.g. servers=2")
        try:
            out[key] = int(value)
        except ValueError:
            out[key] = None if value.lower() == "none" else value
    return out


def _itemsize(dtype) -> int:
    import numpy as np
    if dtype == "bfloat16":
        return 2
    return np.dtype(dtype).itemsize


def _network(args):
    from ..profile import load_profile
    from .simulator import Network
    profile = load_profile()
    return profile, Network.from_profile(
        profile, alpha=args.alpha, beta=args.beta, gamma=args.gamma,
        ports=getattr(args, "ports", None), ranks_per_node=getattr(args, "ranks_per_node", None),
        inter_alpha=getattr(args, "inter_alpha", None), inter_beta=getattr(args, "inter_beta", None),
        nic_ports=getattr(args, "nic_ports", None))


def _is_root() -> bool:
    """Print on rank 0 only when launched under mpiexec (mpi4py may not even be initialised)."""
    import os
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if os.environ.get(var) not in (None, "", "0"):
            return False
    return True


# --- analyze -------------------------------------------------------------------

def _analyze(args) -> int:
    from .metrics import KEYS, analyzable, analyze
    if not _is_root():
        return 0
    profile, net = _network(args)
    names = _algorithms(args.algorithms) or analyzable()
    opts = _options(args.option)
    rows = [analyze(name, args.ranks, args.bytes, itemsize=_itemsize(args.dtype), profile=profile,
                    network=net, options=opts) for name in names]
    print(format_rows(rows, KEYS, args.format))
    if args.format == "table":
        print(f"# alpha={net.alpha:.3g}s beta={net.beta:.3g}s/B gamma={net.gamma:.3g}s/B "
              f"({profile.model_source}); rounds = critical path in communication steps")
    return 0


# --- simulate ------------------------------------------------------------------

def _simulate(args) -> int:
    from tqdm import tqdm

    from .metrics import analyzable
    from .sweep import SWEEP_KEYS, sweep
    if not _is_root():
        return 0
    profile, net = _network(args)
    names = _algorithms(args.algorithms) or analyzable()
    try:
        ranks = parse_list(args.ranks, int)
        sizes = parse_list(args.bytes, parse_size)
    except (ValueError, argparse.ArgumentTypeError) as exc:
        raise SystemExit(f"mlcomm simulate: {exc}")
    total = len(names) * len(ranks) * len(sizes)
    with tqdm(total=total, desc="simulate", disable=args.no_progress or total < 8,
              file=sys.stderr, leave=False) as bar:
        rows = sweep(names, ranks, sizes, network=net, itemsize=_itemsize(args.dtype),
                     options=_options(args.option), limit=args.sim_limit,
                     seconds=args.sim_seconds, progress=bar)
    print(format_rows(rows, SWEEP_KEYS, args.format))
    formula = sorted({(r["algorithm"], r["ranks"]) for r in rows if r["source"] == "formula"})
    if args.format == "table":
        model = (f"{net.ranks_per_node} ranks/node, inter alpha={net.inter_alpha or net.alpha:.3g} "
                 f"beta={net.inter_beta or net.beta:.3g}, nic_ports={net.nic_ports}; "
                 if net.two_level else "")
        print(f"# model: alpha={net.alpha:.3g}s beta={net.beta:.3g}s/B gamma={net.gamma:.3g}s/B, "
              f"ports={net.ports or 'unlimited'}; {model}profile: {profile.model_source}")
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

def _explain(args) -> int:
    from ..select import explain
    if not _is_root():
        return 0
    candidates = _algorithms(args.algorithms)
    choice, times, profile = explain(args.ranks, args.bytes, dtype=args.dtype, op=args.op,
                                     candidates=candidates)
    gamma = profile.gamma_for(args.dtype, args.op)
    kernel = ", ".join(str(x) for x in (args.dtype, args.op) if x) or "any dtype and op"
    print(f"all-reduce of {args.bytes} bytes ({kernel}) on {args.ranks} ranks")
    print(f"profile: {profile.model_source}: alpha={profile.alpha:.3g}s beta={profile.beta:.3g}s/B "
          f"({1 / profile.beta / 1e9 if profile.beta else float('inf'):.2f} GB/s) "
          f"gamma={gamma:.3g}s/B")
    best = times[choice]
    print(f"{'algorithm':28s} {'predicted':>12s} {'vs best':>8s}")
    for name, t in sorted(times.items(), key=lambda kv: kv[1]):
        mark = "  <- auto" if name == choice else ""
        ratio = t / best if best > 0 else float("nan")
        print(f"{name:28s} {_seconds(t):>12s} {ratio:7.2f}x{mark}")
    if profile.tuned_choice(args.ranks, args.bytes) == choice:
        print(f"auto chooses {choice}: measured fastest for {args.ranks} ranks at the nearest "
              f"tuned size (mlcomm tune), whatever the model predicts")
    else:
        print(f"auto chooses {choice}: least predicted time (alpha-beta-gamma closed form + "
              f"per-step and per-op overhead and copies)")
    return 0


# --- draw ----------------------------------------------------------------------

def _draw(args) -> int:
    from ..algorithms import build_schedules, resolve
    from .draw import draw_schedule
    from .metrics import count_for
    if not _is_root():
        return 0
    name = resolve(args.algorithm)
    itemsize = _itemsize(args.dtype)
    count = count_for(args.bytes, itemsize) if args.bytes is not None else args.ranks
    scheds = build_schedules(name, args.ranks, count, itemsize, **_options(args.option))
    out = args.out or f"{name}_p{args.ranks}.png"
    title = f"{name} all-reduce, p={args.ranks}, {count} elements"
    draw_schedule(scheds, out, title=title)
    print(f"wrote {out}")
    return 0


# --- calibrate -----------------------------------------------------------------

def _calibrate(args) -> int:
    from mpi4py import MPI

    from .calibrate import GAMMA_DTYPES, GAMMA_OPS, calibrate
    comm = MPI.COMM_WORLD
    prof = calibrate(comm, sizes=parse_list(args.sizes, parse_size) if args.sizes else None,
                     quick=args.quick, gamma_bytes=args.gamma_bytes,
                     dtypes=args.dtypes.split(",") if args.dtypes else GAMMA_DTYPES,
                     ops=args.ops.split(",") if args.ops else GAMMA_OPS,
                     path=args.output, write=not args.dry_run)
    if prof is None:
        return 0
    print(f"ping-pong rank 0 <-> 1 ({comm.Get_size()} ranks, {prof.meta['mpi']})")
    print(f"{'bytes':>10s} {'one-way':>12s} {'fit':>12s}")
    for n, t in prof.meta["pingpong"]:
        print(f"{n:10d} {_seconds(t):>12s} {_seconds(prof.alpha + n * prof.beta):>12s}")
    bw = 1 / prof.beta / 1e9 if prof.beta else float("inf")
    print(f"alpha = {prof.alpha:.3g} s   beta = {prof.beta:.3g} s/B ({bw:.2f} GB/s)")
    print(f"executor overhead: {prof.step_overhead * 1e6:.2f} us per step, "
          f"{prof.op_overhead * 1e6:.2f} us per local op")
    print(f"gamma = {prof.gamma:.3g} s/B (default: float64 sum)")
    for backend, table in prof.gammas.items():
        for dtype, ops in table.items():
            cells = "  ".join(f"{op}={v:.3g}" for op, v in ops.items())
            print(f"  gamma[{backend}][{dtype}]: {cells}")
    print("profile not written (--dry-run)" if args.dry_run else f"profile written to {prof.source}")
    return 0


# --- parsers -------------------------------------------------------------------

def _model_args(p, cluster: bool) -> None:
    g = p.add_argument_group("cost model (defaults: the profile, see `mlcomm calibrate`)")
    g.add_argument("--alpha", type=float, default=None, help="latency per message, seconds")
    g.add_argument("--beta", type=float, default=None, help="seconds per byte on a link")
    g.add_argument("--gamma", type=float, default=None, help="seconds per reduced byte")
    if cluster:
        g.add_argument("--ports", type=int, default=None,
                       help="messages a rank sends (and receives) at once: 1 = single-port "
                            "full duplex (default), k, or 0 = unlimited")
        g.add_argument("--ranks-per-node", type=int, default=None,
                       help="two-level model: ranks per node, placed in blocks (default 1 = flat)")
        g.add_argument("--inter-alpha", type=float, default=None,
                       help="latency between nodes (default: --alpha)")
        g.add_argument("--inter-beta", type=float, default=None,
                       help="seconds per byte between nodes (default: --beta)")
        g.add_argument("--nic-ports", type=int, default=None,
                       help="inter-node messages a node's NIC carries at once each way "
                            "(default 1; 0 = unlimited)")


def _common(p) -> None:
    p.add_argument("-a", "--algorithms", default=None, metavar="A,B,...",
                   help="algorithms (default: every one with a schedule)")
    p.add_argument("--dtype", default="float64", help="element type (sets the element size)")
    p.add_argument("-o", "--option", action="append", metavar="KEY=VALUE",
                   help="algorithm option, e.g. servers=2 or chunk_bytes=65536 (repeatable)")
    p.add_argument("--format", choices=["table", "json", "csv"], default="table")


def register(subparsers) -> None:
    """Add the analysis commands."""
    from .sweep import SIM_LIMIT, SIM_SECONDS
    fmt = argparse.RawDescriptionHelpFormatter
    p = subparsers.add_parser(
        "analyze", help="rounds, volumes, fan-in and cost of each algorithm's schedule",
        description="Build every rank's schedule and derive the lecture notes' cost-table "
                    "numbers from it: rounds on the critical path, bytes sent (total and per "
                    "rank), bytes received per rank, fan-in and bytes in per round, the simulated "
                    "time and the closed-form time. No MPI job needed.",
        epilog="example:\n  mlcomm analyze --ranks 8 --bytes 1M --format json", formatter_class=fmt)
    p.add_argument("-p", "--ranks", type=int, required=True)
    p.add_argument("-n", "--bytes", type=parse_size, required=True, help="message size, e.g. 1M")
    _common(p)
    _model_args(p, cluster=False)
    p.set_defaults(func=_analyze)

    p = subparsers.add_parser(
        "simulate", help="predicted time vs ranks and bytes (cost simulator)",
        description="Run the schedules through the cost simulator (MPI matching, alpha + "
                    "bytes*beta per message, gamma per reduced byte, port and two-level "
                    "models). Schedules bigger than --sim-limit use the closed form instead; "
                    "the `source` column says which.",
        epilog="examples:\n  mlcomm simulate --ranks 2,4,8,...,4096 --bytes 8 --plot latency.png\n"
               "  mlcomm simulate --ranks 16,64 --bytes 8,64K,16M --ranks-per-node 8 "
               "--inter-alpha 5e-6 --inter-beta 1e-10", formatter_class=fmt)
    p.add_argument("-p", "--ranks", required=True, help="rank counts: 2,4,8 or 2,4,...,4096")
    p.add_argument("-n", "--bytes", required=True, help="sizes: 8,64K,16M or 8,64,...,16M")
    _common(p)
    _model_args(p, cluster=True)
    p.add_argument("--sim-limit", type=int, default=SIM_LIMIT,
                   help="simulate while p x (steps + transfers of one rank) is at most this "
                        f"(default {SIM_LIMIT}); above it the closed form is used")
    p.add_argument("--sim-seconds", type=float, default=SIM_SECONDS,
                   help="simulate while building all schedules is estimated to take at most "
                        f"this many seconds (default {SIM_SECONDS:g})")
    p.add_argument("--plot", metavar="FILE.png", default=None,
                   help="draw time vs ranks (one panel per size) and time vs bytes")
    p.add_argument("--title", default=None, help="plot title")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=_simulate)

    p = subparsers.add_parser(
        "explain", help="every candidate's predicted time and what `auto` picks",
        description="Evaluate each all-reduce algorithm's closed-form cost with the calibrated "
                    "profile (or the built-in defaults) and show what algorithm='auto' chooses.")
    p.add_argument("-p", "--ranks", type=int, required=True)
    p.add_argument("-n", "--bytes", type=parse_size, required=True)
    p.add_argument("--dtype", default=None, help="pick gamma for this dtype (default: profile's)")
    p.add_argument("--op", default=None, help="pick gamma for this op")
    p.add_argument("-a", "--algorithms", default=None, metavar="A,B,...",
                   help="candidates (default: every algorithm with a schedule)")
    p.set_defaults(func=_explain)

    p = subparsers.add_parser(
        "draw", help="draw a schedule round by round (PNG)",
        description="Draw the schedule as the slides do: ranks as rows, rounds as columns, "
                    "chunks as coloured boxes (whose contributions they sum), arrows for the "
                    "messages of each round.",
        epilog="example:\n  mlcomm draw --algorithm ring --ranks 4 --out ring.png", formatter_class=fmt)
    p.add_argument("--algorithm", required=True)
    p.add_argument("-p", "--ranks", type=int, required=True)
    p.add_argument("-n", "--bytes", type=parse_size, default=None,
                   help="vector size (default: one element per rank)")
    p.add_argument("--dtype", default="float64")
    p.add_argument("-o", "--option", action="append", metavar="KEY=VALUE")
    p.add_argument("--out", default=None, help="output file (default ALGORITHM_pP.png)")
    p.set_defaults(func=_draw)

    p = subparsers.add_parser(
        "calibrate", help="measure alpha, beta, gamma and write the profile (mpiexec -n 2+)",
        description="Ping-pong between ranks 0 and 1 over sizes, least-squares fit of alpha and "
                    "beta; time the reduction kernels for gamma per backend, dtype and op. "
                    "Rank 0 writes the profile to $MLCOMM_PROFILE or ~/.cache/mlcomm/profile.json.",
        epilog="example:\n  mpiexec -n 2 mlcomm calibrate", formatter_class=fmt)
    p.add_argument("--quick", action="store_true", help="fewer sizes and iterations (seconds)")
    p.add_argument("--sizes", default=None, help="ping-pong sizes, e.g. 8,64,...,16M")
    p.add_argument("--gamma-bytes", type=parse_size, default=None,
                   help="array size for the kernel timings (default 4M, 1M with --quick)")
    p.add_argument("--dtypes", default=None, help="dtypes for gamma (default: a common set)")
    p.add_argument("--ops", default=None, help="ops for gamma (default sum,prod,min,max)")
    p.add_argument("--output", default=None, help="profile path (default: $MLCOMM_PROFILE or "
                                                  "~/.cache/mlcomm/profile.json)")
    p.add_argument("--dry-run", action="store_true", help="measure and print, write nothing")
    p.set_defaults(func=_calibrate)
