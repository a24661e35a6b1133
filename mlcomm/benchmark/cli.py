"""``mlcomm bench``: the collective benchmark command (all-reduce by default)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from ..cli.args import (add_algorithms, add_dtype, add_format, add_op, add_option, add_output,
    add_progress, add_quick, add_sizes, non_negative_int, options, output_format, positive_int,
    show_progress, size, write_text)
from ..kernels import OPS
from .calls import CALLS

__all__ = ["register", "run", "QUICK_SIZES", "add_sweep", "sweep_sizes"]

#: --quick sweeps these sizes: the small, medium and large messages of the performance table
#: (8 B, 64 KiB, 16 MiB) and two between.
QUICK_SIZES = (8, 1 << 10, 64 << 10, 1 << 20, 16 << 20)
_EPILOG = """\
examples:
  mpiexec -n 4 mlcomm bench --quick --plot bench.png
  mpiexec -n 2 mlcomm bench -a ring,double_binary_tree -b 8 -e 64M --check
  mpiexec -n 3 mlcomm bench -d bfloat16 -o avg --both --format json --output r.json
  mpiexec -n 2 mlcomm bench --collective gather -s 8,64K,16M --check
  mlcomm bench --kernels -b 1M -e 256M -f 4 -d float32,float16

ratio = time / mpi time in the same run (< 1 beats MPI_Allreduce, or with --collective
the library's own call: MPI_Gather, MPI_Alltoallv, ...); bandwidths as nccl-tests':
algbw = S/time, S the whole buffer (each rank's block, the size given, times p for
reduce_scatter, allgather, gather, scatter, alltoall and their v forms), busbw = algbw *
2(p-1)/p for allreduce, (p-1)/p for those, 1 for bcast and reduce.  The v forms take even
counts.  For a dtype MPI cannot reduce (float16, bfloat16) the `mpi` row times the call on
the same bytes as unsigned integers; the header says so.
Exit status 1 if --check finds a wrong element.
"""


def add_sweep(p, lo="8", hi="16M", factor=2.0) -> None:
    """The size flags of bench and tune: ``-s/--sizes`` or nccl-tests' ``-b -e -f`` sweep."""
    add_sizes(p, help="explicit message sizes, e.g. 8,64K,16M (instead of -b/-e/-f)")
    p.add_argument("-b", "--min-bytes", type=size, default=None, metavar="SIZE",
                   help=f"smallest message of the sweep, e.g. 8, 64K, 16M (default {lo})")
    p.add_argument("-e", "--max-bytes", type=size, default=None, metavar="SIZE",
                   help=f"largest message of the sweep (default {hi})")
    p.add_argument("-f", "--factor", type=float, default=None,
                   help=f"multiply the size by this between steps (default {factor:g})")


def sweep_sizes(args, itemsize: int, lo="8", hi="16M", factor=2.0) -> list:
    """The message sizes that ``args`` ask for, whole elements; ValueError on a bad range.

    ``--quick`` without ``-f`` takes :data:`QUICK_SIZES` within ``-b``/``-e``.
    """
    from ..units import parse_size
    from .harness import size_list
    if args.sizes:
        return sorted({max(itemsize, s // itemsize * itemsize) if s else 0 for s in args.sizes})
    low = args.min_bytes if args.min_bytes is not None else None
    high = args.max_bytes if args.max_bytes is not None else None
    if args.quick and args.factor is None:
        quick = [max(itemsize, s // itemsize * itemsize) for s in QUICK_SIZES]
        out = sorted({s for s in quick if (low is None or s >= low)
                      and (high is None or s <= high)})
        if not out:
            raise ValueError(f"--quick sizes {', '.join(map(str, QUICK_SIZES))} are all "
                             f"outside --min-bytes..--max-bytes")
        return out
    return size_list(parse_size(lo) if low is None else low,
                     parse_size(hi) if high is None else high,
                     args.factor or factor, itemsize)


def register(subparsers):
    """Add the ``bench`` command."""
    p = subparsers.add_parser(
        "bench", help="benchmark all-reduce (or another collective's) algorithms against "
                      "the MPI library's call",
        description="Sweep message sizes and time each algorithm of a collective (all-reduce "
                    "by default) next to the MPI library's own call (`mpi`: MPI_Allreduce, "
                    "MPI_Gather, ...), nccl-tests/OSU style. Run it under mpiexec; only "
                    "rank 0 prints.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--collective", default="allreduce", choices=list(CALLS), metavar="NAME",
                   help=f"the collective to time: {', '.join(CALLS)} (default %(default)s); "
                        f"the size is each rank's block")
    add_algorithms(p, "algorithms to run besides the `mpi` baseline (default all of the "
                      "collective's, auto included)", resolve=False)
    add_option(p)
    add_sweep(p)
    p.add_argument("-n", "--iters", type=positive_int, default=None,
                   help="timed calls per size (default: size-aware, 40 a round for small "
                        "messages down to 1 for large ones)")
    p.add_argument("-w", "--warmup", type=non_negative_int, default=None,
                   help="untimed calls before timing (default iters/4)")
    p.add_argument("-r", "--rounds", type=positive_int, default=None,
                   help="split the timed calls into this many rounds that interleave the "
                        "algorithms; each one's time is its median round (default: n rounds "
                        "for n algorithms, `mpi` included, 2n for n odd, over which each "
                        "follows every other equally often; 1 times each in one block)")
    add_dtype(p, "float32", "element type: float64, float32, float16, bfloat16, int32, ... "
                            "(default float32); with --kernels a list, e.g. float32,float16")
    add_op(p, "sum", choices=OPS, metavar="OP",
           help=f"reduction op: {', '.join(OPS)} (default %(default)s)")
    place = p.add_mutually_exclusive_group()
    place.add_argument("--in-place", dest="placement", action="store_const", const="in",
                       help="time in-place calls only (MPI_IN_PLACE)")
    place.add_argument("--out-of-place", dest="placement", action="store_const", const="out",
                       help="time out-of-place calls only (the default)")
    place.add_argument("--both", dest="placement", action="store_const", const="both",
                       help="time out-of-place and in-place calls")
    p.add_argument("-c", "--check", action="store_true",
                   help="validate every result against the baseline; count wrong elements")
    add_format(p, default=None, help="output format (default: from --output's extension, "
                                     "else table)")
    add_output(p, "write the results here (the table still goes to stdout)")
    p.add_argument("--plot", metavar="FILE.png", default=None,
                   help="draw latency and busbw vs size into this PNG")
    add_quick(p, f"a few sizes ({', '.join(_short(s) for s in QUICK_SIZES)}) and few "
                 "iterations: under a minute at P=4 on 2 cores")
    p.add_argument("--kernels", action="store_true",
                   help="measure reduction-kernel bandwidth against a plain copy "
                        "(mlcomm.kernels.bandwidth) instead of the all-reduce sweep")
    p.add_argument("--threads", default=None, metavar="N1,N2,...",
                   help="with --kernels: Numba thread counts to time side by side "
                        "(default: 1 and the kernels' own count)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="buffers on the host (NumPy) or on a GPU (CuPy)")
    add_progress(p)
    p.set_defaults(func=run, validate=lambda args: _validate(args, p))
    return p


def _short(n):
    from ..units import format_size
    return format_size(n)


def _validate(args, parser) -> None:
    """Check the values together; store the parsed dtype(s) and sizes on ``args``."""
    from ..kernels import check_op
    from ..units import parse_dtype
    from .harness import options_for, resolve_algorithms
    try:
        args.dtypes = [parse_dtype(t.strip()) for t in args.dtype.split(",") if t.strip()]
    except TypeError as exc:
        parser.error(f"argument -d/--dtype: unknown dtype in {args.dtype!r}: {exc}")
    if not args.dtypes:
        parser.error("argument -d/--dtype: no dtype given")
    if args.threads and not args.kernels:
        parser.error("--threads goes with --kernels")
    if args.kernels:
        try:
            args.threads = [int(t) for t in args.threads.split(",")] if args.threads else None
        except ValueError:
            parser.error(f"argument --threads: write whole numbers, e.g. 1,2 "
                         f"(got {args.threads!r})")
        return
    if len(args.dtypes) > 1:
        parser.error("argument -d/--dtype: one dtype (a list goes with --kernels)")
    collective = args.collective
    if collective != "allreduce" and (args.placement in ("in", "both") or
                                      args.device != "cpu"):
        parser.error(f"--collective {collective}: out-of-place calls on host buffers only "
                     f"(--in-place, --both and --device cuda go with allreduce)")
    try:
        if CALLS[collective].reduces:
            check_op(args.dtypes[0], args.op)
        args.algorithms = resolve_algorithms(args.algorithms, collective)
        args.options = options_for(args.algorithms, options(args), collective)
        args.byte_sizes = sweep_sizes(args, args.dtypes[0].itemsize)
    except (TypeError, ValueError) as exc:
        parser.error(str(exc))


def _wait_quietly(comm):
    """Wait at a barrier without spinning a core (ranks idle while rank 0 measures)."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(0.005)


def _kernel_cases(args):
    """Return the (nbytes, dtype, backend, threads) cases ``--kernels`` times, in order."""
    from ..kernels import numba_backend
    from .harness import size_list
    if args.device != "cpu":
        backends = [("cupy", None), ("cuda", None)]
    else:
        own = numba_backend.num_threads()
        backends = [("numpy", None)] + [("numba", n) for n in (args.threads or sorted({1, own}))]
    cases = []
    for dtype in args.dtypes:
        if args.sizes:
            sizes = sweep_sizes(args, dtype.itemsize)
        else:
            sizes = size_list(args.min_bytes or (64 << 10), args.max_bytes or (64 << 20),
                              args.factor or 4.0, dtype.itemsize)
            if args.quick:
                sizes = [s for s in sizes if s <= (16 << 20)][-3:] or sizes[:1]
        cases += [(nbytes, dtype, backend, n) for nbytes in sizes for backend, n in backends]
    return cases


def _run_kernels(args, comm):
    from tqdm import tqdm

    from ..kernels import bandwidth
    from .report import format_kernels
    if comm.Get_rank() != 0:  # rank 0 measures alone; the others idle
        _wait_quietly(comm)
        return 0
    try:
        cases = _kernel_cases(args)
    except ValueError as exc:
        raise SystemExit(f"mlcomm bench --kernels: error: {exc}") from None
    kw = dict(op=args.op, device=args.device)
    if args.iters is not None:
        kw["repeat"] = args.iters
    if args.warmup is not None:
        kw["warmup"] = args.warmup
    rows = []
    for nbytes, dtype, backend, threads in tqdm(cases, desc="kernels", leave=False,
                                                disable=not show_progress(args)):
        try:
            rows.append(bandwidth.measure(nbytes, dtype, backend=backend, threads=threads,
                                          **kw))
        except (ImportError, TypeError, RuntimeError) as exc:
            if args.device == "cuda" and backend == "cupy":
                raise SystemExit(f"mlcomm bench --kernels --device cuda: {exc}")
            print(f"# {backend}: skipped ({exc})", file=sys.stderr)
    _wait_quietly(comm)
    fmt = output_format(args)
    text = (json.dumps(rows, indent=1, default=str) + "\n" if fmt == "json"
            else _kernels_csv(rows) if fmt == "csv" else format_kernels(rows))
    if args.output:
        write_text(args.output, text)
        sys.stdout.write(format_kernels(rows))
    else:
        sys.stdout.write(text)
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

    from .harness import BenchConfig, run_bench
    from .report import format_table, render

    comm = MPI.COMM_WORLD
    if args.kernels:
        return _run_kernels(args, comm)
    placements = {"in": (True,), "both": (False, True)}.get(args.placement, (False,))
    cfg = BenchConfig(
        algorithms=args.algorithms, sizes=args.byte_sizes, dtype=args.dtypes[0], op=args.op,
        placements=placements, iters=args.iters, warmup=args.warmup, rounds=args.rounds,
        quick=args.quick, check=args.check, device=args.device, options=args.options,
        progress=show_progress(args), collective=args.collective)
    records = run_bench(cfg, comm)
    wrong = sum(r["wrong"] or 0 for r in records)
    if comm.Get_rank() == 0:
        fmt = output_format(args)
        if args.output:
            write_text(args.output, render(records, fmt))
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
