"""``mlcomm bench``: the all-reduce benchmark command."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

__all__ = ["register", "run", "QUICK_SIZES"]

#: --quick sweeps these sizes (the issue-5 targets 8 B, 64 KiB, 16 MiB among them).
QUICK_SIZES = (8, 1 << 10, 64 << 10, 1 << 20, 16 << 20)
_EPILOG = """\
examples:
  mpiexec -n 4 mlcomm bench --quick --plot bench.png
  mpiexec -n 2 mlcomm bench --algorithms ring,double_binary_tree --min-bytes 8 --max-bytes 64M --check
  mpiexec -n 3 mlcomm bench --dtype bfloat16 --op avg --both --format json --output r.json
  mlcomm bench --kernels --min-bytes 1M --max-bytes 256M --factor 4 --dtype float32,float16

ratio = time / mpi time in the same run (< 1 beats MPI_Allreduce);
busbw = algbw * 2(p-1)/p.  Exit status 1 if --check finds a wrong element.
"""


def register(subparsers):
    """Add the ``bench`` command."""
    p = subparsers.add_parser(
        "bench", help="benchmark all-reduce algorithms against MPI_Allreduce",
        description="Sweep message sizes and time each all-reduce algorithm next to the "
                    "MPI library's own MPI_Allreduce (`mpi`), nccl-tests/OSU style. "
                    "Run it under mpiexec; only rank 0 prints.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-a", "--algorithms", default="all", metavar="all|A,B,...",
                   help="algorithms to run besides the `mpi` baseline (default all)")
    p.add_argument("-b", "--min-bytes", default=None, metavar="SIZE",
                   help="smallest message, e.g. 8, 64K, 16M (default 8)")
    p.add_argument("-e", "--max-bytes", default=None, metavar="SIZE",
                   help="largest message (default 16M)")
    p.add_argument("-f", "--factor", type=float, default=None,
                   help="multiply the size by this between steps (default 2)")
    p.add_argument("--sizes", default=None, metavar="S1,S2,...",
                   help="explicit message sizes, e.g. 8,64K,16M (overrides -b/-e/-f)")
    p.add_argument("-n", "--iters", type=int, default=None,
                   help="timed calls per size (default: size-aware, 200 for small messages "
                        "down to 5 for large ones)")
    p.add_argument("-w", "--warmup", type=int, default=None,
                   help="untimed calls before timing (default iters/4)")
    p.add_argument("-r", "--rounds", type=positive_int, default=5,
                   help="split the timed calls into this many rounds that interleave the "
                        "algorithms; each one's time is its median round (default 5; 1 times "
                        "each algorithm in one block)")
    p.add_argument("-d", "--dtype", default="float32",
                   help="element type: float64, float32, float16, bfloat16, int32, ... "
                        "(default float32); with --kernels a list, e.g. float32,float16")
    p.add_argument("-o", "--op", default="sum",
                   choices=["sum", "prod", "min", "max", "avg", "band", "bor", "bxor",
                            "land", "lor"], help="reduction (default sum)")
    place = p.add_mutually_exclusive_group()
    place.add_argument("--in-place", dest="placement", action="store_const", const="in",
                       help="time in-place calls only (MPI_IN_PLACE)")
    place.add_argument("--out-of-place", dest="placement", action="store_const", const="out",
                       help="time out-of-place calls only (the default)")
    place.add_argument("--both", dest="placement", action="store_const", const="both",
                       help="time out-of-place and in-place calls")
    p.add_argument("-c", "--check", action="store_true",
                   help="validate every result against the baseline; count wrong elements")
    p.add_argument("--format", choices=["table", "csv", "json"], default=None,
                   help="output format (default: from --output's extension, else table)")
    p.add_argument("--output", metavar="FILE", default=None,
                   help="write the results here (the table still goes to stdout)")
    p.add_argument("--plot", metavar="FILE.png", default=None,
                   help="draw latency and busbw vs size into this PNG")
    p.add_argument("--quick", action="store_true",
                   help=f"a few sizes ({', '.join(_short(s) for s in QUICK_SIZES)}) "
                        "and few iterations: under a minute at P=4 on 2 cores")
    p.add_argument("--kernels", action="store_true",
                   help="measure reduction-kernel bandwidth against a plain copy "
                        "(mlcomm.kernels.bandwidth) instead of the all-reduce sweep")
    p.add_argument("--threads", default=None, metavar="N1,N2,...",
                   help="with --kernels: Numba thread counts to time side by side "
                        "(default: 1 and the kernels' own count)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="buffers on the host (NumPy) or on a GPU (CuPy)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)
    return p


def positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def _short(n):
    from .harness import format_size
    return format_size(n)


def _sizes(args, itemsize):
    from .harness import parse_size, size_list
    if args.sizes:
        sizes = [parse_size(t) for t in args.sizes.split(",") if t.strip()]
        return sorted({max(itemsize, s // itemsize * itemsize) if s else 0 for s in sizes})
    lo = parse_size(args.min_bytes) if args.min_bytes is not None else None
    hi = parse_size(args.max_bytes) if args.max_bytes is not None else None
    if args.quick and args.factor is None:
        sizes = [max(itemsize, s // itemsize * itemsize) for s in QUICK_SIZES]
        return sorted({s for s in sizes if (lo is None or s >= lo) and (hi is None or s <= hi)})
    return size_list(8 if lo is None else lo, (16 << 20) if hi is None else hi,
                     args.factor or 2.0, itemsize)


def _format(args):
    if args.format:
        return args.format
    ext = os.path.splitext(args.output or "")[1].lower()
    return {".csv": "csv", ".json": "json"}.get(ext, "table")


def _write(text, path):
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


def _wait_quietly(comm):
    """Wait at a barrier without spinning a core (ranks idle while rank 0 measures)."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(0.005)


def _kernel_cases(args):
    """Return the (nbytes, dtype, backend, threads) cases ``--kernels`` times, in order."""
    from mlcomm.kernels import numba_backend
    from .harness import parse_dtype, parse_size, size_list
    dtypes = [parse_dtype(t.strip()) for t in args.dtype.split(",") if t.strip()]
    if args.device != "cpu":
        backends = [("cupy", None), ("cuda", None)]
    else:
        own = numba_backend.num_threads()
        counts = ([int(t) for t in args.threads.split(",")] if args.threads
                  else sorted({1, own}))
        backends = [("numpy", None)] + [("numba", n) for n in counts]
    cases = []
    for dtype in dtypes:
        if args.sizes:
            sizes = _sizes(args, dtype.itemsize)
        else:
            sizes = size_list(parse_size(args.min_bytes or "64K"),
                              parse_size(args.max_bytes or "64M"), args.factor or 4.0,
                              dtype.itemsize)
            if args.quick:
                sizes = [s for s in sizes if s <= (16 << 20)][-3:] or sizes[:1]
        cases += [(nbytes, dtype, backend, n) for nbytes in sizes for backend, n in backends]
    return cases


def _run_kernels(args, comm):
    from .report import format_kernels
    if comm.Get_rank() != 0:  # rank 0 measures alone; the others idle
        _wait_quietly(comm)
        return 0
    from mlcomm.kernels import bandwidth
    try:
        cases = _kernel_cases(args)
    except (TypeError, ValueError) as exc:
        raise SystemExit(f"mlcomm bench --kernels: error: {exc}") from None
    kw = dict(op=args.op, device=args.device)
    if args.iters is not None:
        kw["repeat"] = args.iters
    if args.warmup is not None:
        kw["warmup"] = args.warmup
    rows = []
    from tqdm import tqdm
    for nbytes, dtype, backend, threads in tqdm(cases, desc="kernels", leave=False,
                                                disable=args.no_progress):
        try:
            rows.append(bandwidth.measure(nbytes, dtype, backend=backend, threads=threads,
                                          **kw))
        except (ImportError, TypeError, RuntimeError) as exc:
            if args.device == "cuda" and backend == "cupy":
                raise SystemExit(f"mlcomm bench --kernels --device cuda: {exc}")
            print(f"# {backend}: skipped ({exc})", file=sys.stderr)
    _wait_quietly(comm)
    fmt = _format(args)
    text = (json.dumps(rows, indent=1, default=str) + "\n" if fmt == "json"
            else _kernels_csv(rows) if fmt == "csv" else format_kernels(rows))
    if args.output:
        _write(text, args.output)
        sys.stdout.write(format_kernels(rows))
    else:
        sys.stdout.write(text)
    sys.stdout.flush()
    return 0


def _kernels_csv(rows):
    import csv
    import io
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]) if rows else [], lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def run(args) -> int:
    """Run ``mlcomm bench``; return the exit status (1 if --check found wrong elements)."""
    from mpi4py import MPI
    from .harness import BenchConfig, parse_dtype, resolve_algorithms, run_bench
    from .report import format_table, render

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    if args.kernels:
        return _run_kernels(args, comm)
    try:
        dtype = parse_dtype(args.dtype)
    except TypeError as exc:
        raise SystemExit(f"mlcomm bench: error: unknown --dtype {args.dtype!r}: {exc}") from None
    placements = {"in": (True,), "both": (False, True)}.get(args.placement, (False,))
    try:
        algorithms, sizes = resolve_algorithms(args.algorithms), _sizes(args, dtype.itemsize)
    except ValueError as exc:
        raise SystemExit(f"mlcomm bench: error: {exc}" if rank == 0 else 2) from None
    cfg = BenchConfig(
        algorithms=algorithms, sizes=sizes,
        dtype=dtype, op=args.op, placements=placements, iters=args.iters,
        warmup=args.warmup, rounds=args.rounds, quick=args.quick, check=args.check,
        device=args.device,
        progress=not args.no_progress, corrupt=os.environ.get("MLCOMM_BENCH_CORRUPT") or None)
    records = run_bench(cfg, comm)
    wrong = sum(r["wrong"] or 0 for r in records)
    if rank == 0:
        fmt = _format(args)
        if args.output:
            _write(render(records, fmt), args.output)
            sys.stdout.write(format_table(records))
        else:
            sys.stdout.write(render(records, fmt))
        if args.plot:
            from .plot import plot_sweep
            plot_sweep(records, args.plot)
            to = sys.stdout if fmt == "table" or args.output else sys.stderr
            print(f"# wrote {args.plot}", file=to)
        if args.output:
            print(f"# wrote {args.output}")
        sys.stdout.flush()
    comm.Barrier()
    return 1 if wrong else 0
