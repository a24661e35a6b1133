"""Regenerate the analysis figures under bench/figures/.

    python bench/simulate_figures.py

Draws every flat algorithm's schedule at p = 4 (and p = 5 for the two recursive
algorithms, whose fold step shows there), shared_memory at p = 4 and
hierarchical on 2 nodes of 3 and on 3 nodes of 2, 2 and 1; then the simulated
figures, with the built-in default profile (MLCOMM_PROFILE is ignored so the
figures are reproducible):

- ``simulated_latency_8B``: the flat algorithms at 8 bytes, latency vs ranks up
  to 4096, one flat network;
- ``simulated_hierarchical``: flat against hierarchical up to 4096 ranks at 8 B
  and 16 MiB, 8 ranks per node, inter-node alpha = 5 us and beta = 1e-10 s/B,
  the intra-node constants the defaults (see docs/algorithms.rst).

Each figure's data is written beside it (``.txt`` table or ``.csv``).
"""

import os
import sys
from pathlib import Path

FIGURES = Path(__file__).resolve().parent / "figures"

FLAT = "naive,single_master,parameter_server,ring,double_binary_tree,recursive_doubling," \
       "recursive_halving_doubling"
#: the hierarchical figure: its command line after ``mlcomm simulate``
HIERARCHICAL = ["-p", "8,16,...,4096", "-s", "8,16M", "--ranks-per-node", "8",
                "--inter-alpha", "5e-6", "--inter-beta", "1e-10",
                "-a", "ring,double_binary_tree,recursive_doubling,recursive_halving_doubling,"
                      "hierarchical",
                "--sim-limit", "5000000", "--sim-seconds", "60", "--no-progress"]


#: the drawings of the other collectives' schedules (docs/collectives.rst)
OTHERS = [("gather", "linear"), ("gather", "binomial"), ("scatter", "binomial"),
          ("alltoall", "pairwise"), ("alltoall", "bruck"), ("alltoall", "scattered"),
          ("allgather", "recursive_doubling"), ("allgather", "bruck"),
          ("reduce_scatter", "recursive_halving"), ("reduce_scatter", "pairwise"),
          ("bcast", "binomial"), ("bcast", "scatter_allgather"), ("bcast", "chain"),
          ("reduce", "binomial"), ("reduce", "rabenseifner")]


def _to_file(path, argv):
    """Run ``mlcomm ARGV`` with its standard output in ``path``."""
    from mlcomm.cli import main as mlcomm
    with open(path, "w") as fh:
        sys.stdout, saved = fh, sys.stdout
        try:
            mlcomm(argv)
        finally:
            sys.stdout = saved


def main():
    os.environ["MLCOMM_PROFILE"] = os.devnull + ".none"   # built-in defaults
    from mlcomm.cli import main as mlcomm
    FIGURES.mkdir(exist_ok=True)
    for name in FLAT.split(","):
        for p in (4, 5) if name in ("recursive_doubling", "recursive_halving_doubling") else (4,):
            mlcomm(["draw", "-a", name, "-p", str(p),
                    "--output", str(FIGURES / f"{name}_p{p}.png")])
    mlcomm(["draw", "-a", "shared_memory", "-p", "4",
            "--output", str(FIGURES / "shared_memory_p4.png")])
    for collective, name in OTHERS:  # every other collective's families, at p = 5
        mlcomm(["draw", "--collective", collective, "-a", name, "-p", "5",
                "--output", str(FIGURES / f"{collective}_{name}_p5.png")])
    for p, k in ((6, 3), (5, 2)):
        mlcomm(["draw", "-a", "hierarchical", "-p", str(p), "--ranks-per-node", str(k),
                "--output", str(FIGURES / f"hierarchical_p{p}_k{k}.png")])
    out = FIGURES / "simulated_latency_8B.png"
    _to_file(out.with_suffix(".txt"),
             ["simulate", "-p", "2,4,...,4096", "-s", "8", "-a", FLAT, "--plot", str(out),
              "--no-progress", "--title", "default profile: alpha=2us, beta=0.08ns/B, "
              "gamma=0.1ns/B, single-port"])
    print(f"wrote {out} and its table {out.with_suffix('.txt')}")
    out = FIGURES / "simulated_hierarchical.png"
    _to_file(out.with_suffix(".csv"),
             ["simulate", *HIERARCHICAL, "--format", "csv", "--plot", str(out), "--title",
              "8 ranks per node; inter-node alpha=5us, beta=0.1ns/B, one NIC port; "
              "intra-node: default profile"])
    print(f"wrote {out} and its data {out.with_suffix('.csv')}")


if __name__ == "__main__":
    from mlcomm.cli import abort_on_error
    abort_on_error(main)
