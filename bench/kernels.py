"""The kernel target: reduction GB/s over copy GB/s, median of repeated runs.

    python bench/kernels.py                 # 3 runs, 1 MiB..256 MiB, 4 dtypes; ~10 minutes
    python bench/kernels.py --runs 5 -d float32 -e 64M

Each run is one ``mlcomm bench --kernels`` process timing NumPy, Numba on 1 thread and Numba
on its own thread count side by side, alternating reduction and copy. Per row the median over
runs of each rate is kept (the ratio is the median of the per-run ratios). Writes
``bench/results/kernels.json`` and prints the table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from mlcomm.cli import parse_args

HERE = Path(__file__).resolve().parent
_KEY = ("backend", "threads", "dtype", "op", "nbytes")


def one_run(args) -> list:
    cmd = [sys.executable, "-m", "mlcomm", "bench", "--kernels", "--no-progress",
           "--format", "json", "--min-bytes", args.min_bytes, "--max-bytes", args.max_bytes,
           "--factor", "4", "--dtype", args.dtype, "--iters", str(args.iters)]
    proc = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=3600)
    return json.loads(proc.stdout)


def medians(runs: list) -> list:
    """Return one row per case: median rates and ratio over ``runs``, the ratios per run."""
    out = []
    for first in runs[0]:
        key = tuple(first[k] for k in _KEY)
        same = [r for run in runs for r in run if tuple(r[k] for k in _KEY) == key]
        row = dict(first)
        for k in ("reduce_s", "copy_s", "reduce_gbps", "copy_gbps", "ratio"):
            row[k] = statistics.median(r[k] for r in same)
        row["ratios"] = [round(r["ratio"], 3) for r in same]
        out.append(row)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("-d", "--dtype", default="float32,float16,bfloat16,int32")
    parser.add_argument("-b", "--min-bytes", default="1M")
    parser.add_argument("-e", "--max-bytes", default="256M")
    parser.add_argument("-n", "--iters", type=int, default=10,
                        help="timed repeats per row and run")
    parser.add_argument("--output", default=str(HERE / "results" / "kernels.json"))
    args = parse_args(parser)
    from tqdm import tqdm

    from mlcomm.benchmark.report import format_kernels
    runs = [one_run(args) for _ in tqdm(range(args.runs), desc="kernel runs", leave=False,
                                        disable=not sys.stderr.isatty())]
    rows = medians(runs)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=HERE).stdout.strip()
    meta = {"when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "mlcomm_commit": commit, "cpus": len(os.sched_getaffinity(0)), "runs": args.runs,
            "load_average": os.getloadavg(), "command": "python bench/kernels.py " +
            " ".join(sys.argv[1:])}
    Path(args.output).write_text(json.dumps({"metadata": meta, "rows": rows}, indent=1) + "\n")
    sys.stdout.write(format_kernels(rows))
    print(f"# median of {args.runs} runs; wrote {args.output}")
    return 0


if __name__ == "__main__":
    from mlcomm.cli import abort_on_error
    sys.exit(abort_on_error(main))
