#!/usr/bin/env python
"""Run ``mlcomm bench`` at several process counts, merge the results, draw the figures.

    python bench/sweep.py                       # P = 2, 3, 4, 8 -> bench/results, bench/*.png
    python bench/sweep.py -p 2,4 -s 8,64K,16M
    python bench/sweep.py --replot              # redraw the figures from bench/results

Writes, for each P, ``results/allreduce_p{P}.json`` (the harness's records) and
``allreduce_p{P}.png`` (latency and busbw vs size); then the merged
``results/sweep.json`` (metadata + records), ``results/sweep.csv`` and
``allreduce_vs_ranks.png`` (latency at 8 B and busbw at the largest size vs P).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

from mlcomm.cli import parse_args

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_SIZES = "8,64,512,4K,32K,256K,2M,16M"


def _parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("-p", "--ranks", default="2,3,4,8", help="process counts (default 2,3,4,8)")
    p.add_argument("-s", "--sizes", default=DEFAULT_SIZES,
                   help=f"message sizes (default {DEFAULT_SIZES})")
    p.add_argument("-a", "--algorithms", default="all")
    p.add_argument("-d", "--dtype", default="float32")
    p.add_argument("-o", "--op", default="sum")
    p.add_argument("--check", action="store_true", help="pass --check to every run")
    p.add_argument("--results", type=Path, default=HERE / "results", help="where the data goes")
    p.add_argument("--figures", type=Path, default=HERE, help="where the PNGs go")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per mpiexec run")
    p.add_argument("--note", default="", help="free text stored in the metadata")
    p.add_argument("--replot", action="store_true", help="only redraw from --results")
    p.add_argument("bench_args", nargs=argparse.REMAINDER,
                   help="after --: more `mlcomm bench` options")
    return p


def _mpiexec():
    return (shutil.which("mpiexec", path=str(Path(sys.executable).parent))
            or shutil.which("mpiexec"))


def _git_commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, timeout=10).stdout.strip() or None
    except OSError:
        return None


def _metadata(args, runs):
    import numpy
    import mpi4py
    try:
        mpi4py.rc.initialize = False            # the library version needs no MPI_Init
        from mpi4py import MPI
        library = MPI.Get_library_version().strip().splitlines()[0]
    except Exception:  # pragma: no cover - MPI import failure shows up in the runs anyway
        library = None
    cores = os.cpu_count()
    return {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "host": platform.node(), "machine": platform.machine(),
        "cpu": _cpu_model(), "cores": cores,
        "python": platform.python_version(), "numpy": numpy.__version__,
        "mpi4py": mpi4py.__version__, "mpi_library": library,
        "mlcomm_commit": _git_commit(),
        "ranks": sorted(runs), "seconds_per_run": runs,
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "oversubscribed_ranks": [p for p in sorted(runs) if cores and p > cores],
        "note": args.note or (f"{cores} cores: P > {cores} oversubscribes them, so those "
                              "curves measure time-sharing, not the network"),
    }


def _cpu_model():
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _run_one(args, p, mpiexec):
    out = args.results / f"allreduce_p{p}.json"
    png = args.figures / f"allreduce_p{p}.png"
    extra = [a for a in args.bench_args if a != "--"]
    cmd = [mpiexec, "-n", str(p), sys.executable, "-m", "mlcomm", "bench",
           "--algorithms", args.algorithms, "--sizes", args.sizes, "--dtype", args.dtype,
           "--op", args.op, "--format", "json", "--output", str(out), "--plot", str(png),
           *(["--check"] if args.check else []), *extra]
    print(f"$ {' '.join(cmd[:3])} python -m mlcomm {' '.join(cmd[6:])}", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, timeout=args.timeout, cwd=ROOT)
    if proc.returncode:
        raise SystemExit(f"mlcomm bench at P={p} failed with exit status {proc.returncode}")
    return round(time.perf_counter() - t0, 1)


def _merge(args, ranks):
    records = []
    for p in ranks:
        records += json.loads((args.results / f"allreduce_p{p}.json").read_text())
    return records


def _write_merged(args, records, meta):
    from mlcomm.benchmark.harness import EXTRA_KEYS, RECORD_KEYS
    (args.results / "sweep.json").write_text(
        json.dumps({"metadata": meta, "records": records}, indent=1) + "\n")
    keys = list(RECORD_KEYS) + list(EXTRA_KEYS)
    with open(args.results / "sweep.csv", "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, fieldnames=keys, extrasaction="ignore", lineterminator="\n")
        w.writeheader()
        for r in records:
            w.writerow({k: "" if r.get(k) is None else r.get(k) for k in keys})


def _draw(args, records, meta):
    from mlcomm.benchmark.plot import plot_sweep, plot_vs_ranks
    ranks = sorted({r["ranks"] for r in records})
    cores = meta.get("cores")
    for p in ranks:
        rows = [r for r in records if r["ranks"] == p]
        over = f" - oversubscribed: {p} ranks on {cores} cores" if cores and p > cores else ""
        plot_sweep(rows, args.figures / f"allreduce_p{p}.png",
                   title=f"all-reduce, {p} ranks, {rows[0]['dtype']} {rows[0]['op']}{over}")
    small = min(r["bytes"] for r in records if r["bytes"] > 0)
    large = max(r["bytes"] for r in records)
    plot_vs_ranks(records, args.figures / "allreduce_vs_ranks.png", small=small, large=large,
                  title=f"all-reduce vs ranks on {cores} cores (P > {cores} oversubscribes)")


def main(argv=None):
    args = parse_args(_parser(), argv)
    args.results.mkdir(parents=True, exist_ok=True)
    args.figures.mkdir(parents=True, exist_ok=True)
    if args.replot:
        data = json.loads((args.results / "sweep.json").read_text())
        _draw(args, data["records"], data["metadata"])
        return 0
    mpiexec = _mpiexec()
    if mpiexec is None:
        raise SystemExit("no mpiexec on PATH (pip install 'mlcomm[mpich]' or load your MPI)")
    ranks = [int(x) for x in args.ranks.split(",")]
    runs = {}
    for p in ranks:
        runs[p] = _run_one(args, p, mpiexec)
    records = _merge(args, ranks)
    meta = _metadata(args, runs)
    _write_merged(args, records, meta)
    _draw(args, records, meta)
    print(f"wrote {args.results}/sweep.json, sweep.csv and {args.figures}/allreduce_*.png")
    return 0


if __name__ == "__main__":
    from mlcomm.cli import abort_on_error
    sys.exit(abort_on_error(main))
