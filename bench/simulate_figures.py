"""Regenerate the analysis figures under bench/figures/.

    python bench/simulate_figures.py

Draws every algorithm's schedule at p = 4 (and p = 5 for the two recursive
algorithms, whose fold step shows there), then the simulated "allreduce 8
bytes, latency vs ranks" figure up to 4096 ranks with the built-in default
profile (MLCOMM_PROFILE is ignored so the figure is reproducible).
"""

import os
import sys
from pathlib import Path

FIGURES = Path(__file__).resolve().parent / "figures"


def main():
    os.environ["MLCOMM_PROFILE"] = os.devnull + ".none"   # built-in defaults
    from mlcomm.analysis.metrics import analyzable
    from mlcomm.cli import main as mlcomm
    FIGURES.mkdir(exist_ok=True)
    for name in analyzable():
        for p in (4, 5) if name in ("recursive_doubling", "recursive_halving_doubling") else (4,):
            mlcomm(["draw", "-a", name, "-p", str(p),
                    "--output", str(FIGURES / f"{name}_p{p}.png")])
    out = FIGURES / "simulated_latency_8B.png"
    with open(FIGURES / "simulated_latency_8B.txt", "w") as fh:
        sys.stdout, saved = fh, sys.stdout
        try:
            mlcomm(["simulate", "-p", "2,4,...,4096", "-s", "8", "--plot", str(out),
                    "--no-progress", "--title", "default profile: alpha=2us, beta=0.08ns/B, "
                    "gamma=0.1ns/B, single-port"])
        finally:
            sys.stdout = saved
    print(f"wrote {out} and its table {out.with_suffix('.txt')}")


if __name__ == "__main__":
    from mlcomm.cli import abort_on_error
    abort_on_error(main)
