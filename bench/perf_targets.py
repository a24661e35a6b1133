"""Issue 5's performance table: best mlcomm algorithm / MPI_Allreduce, median of repeated runs.

    python bench/perf_targets.py                 # P = 2, 4; 3 runs each; about 2 minutes
    python bench/perf_targets.py --runs 5 --ranks 2

Each run is one ``mlcomm bench`` job timing every algorithm and ``mpi`` side by side at
8 B, 64 KiB and 16 MiB (float32 sum).  Writes ``bench/results/perf_targets.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SIZES = {"8 B": 8, "64 KiB": 64 << 10, "16 MiB": 16 << 20}
TARGETS = {"8 B": 1.2, "64 KiB": 1.0, "16 MiB": 0.75}


def one_run(ranks: int) -> list:
    mpiexec = Path(sys.executable).with_name("mpiexec")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        subprocess.run([str(mpiexec), "-n", str(ranks), sys.executable, "-m", "mlcomm", "bench",
                        "--sizes", ",".join(str(b) for b in SIZES.values()), "--format", "json",
                        "--output", str(out), "--no-progress", "--check"],
                       check=True, capture_output=True, text=True, timeout=600)
        return json.loads(out.read_text())


def summarise(records: list) -> dict:
    """Per size: the best hand-written algorithm's ratio to mpi, and auto's gap to that best."""
    out = {}
    for label, nbytes in SIZES.items():
        rows = [r for r in records if r["bytes"] == nbytes]
        mine = [r for r in rows if r["algorithm"] not in ("mpi", "auto")]
        best = min(mine, key=lambda r: r["time_us_avg"])
        auto = next(r for r in rows if r["algorithm"] == "auto")
        out[label] = {"best": best["algorithm"], "ratio": best["ratio_to_mpi"],
                      "auto_over_best": auto["time_us_avg"] / best["time_us_avg"]}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="2,4")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    table = {}
    for p in map(int, args.ranks.split(",")):
        runs = [summarise(one_run(p)) for _ in range(args.runs)]
        table[p] = {}
        for label in SIZES:
            ratios = [r[label]["ratio"] for r in runs]
            gaps = [r[label]["auto_over_best"] for r in runs]
            table[p][label] = {"median_ratio": statistics.median(ratios), "ratios": ratios,
                               "best": [r[label]["best"] for r in runs],
                               "auto_over_best_median": statistics.median(gaps),
                               "target": TARGETS[label]}
    (HERE / "results" / "perf_targets.json").write_text(json.dumps(table, indent=1))
    print(f"{'P':>2}  {'size':7s} {'best/mpi (median)':>18s}  {'target':>6s}  met  "
          f"{'auto/best':>9s}  best algorithm per run")
    for p, rows in table.items():
        for label, row in rows.items():
            met = "yes" if row["median_ratio"] <= row["target"] else "NO"
            print(f"{p:>2}  {label:7s} {row['median_ratio']:18.2f}  {row['target']:6.2f}  {met:3s}  "
                  f"{row['auto_over_best_median']:9.2f}  {', '.join(row['best'])}")
    return 0


if __name__ == "__main__":
    from mlcomm.cli import abort_on_error
    sys.exit(abort_on_error(main))
