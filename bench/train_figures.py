"""Remake the trainer figures (run as an MPI job; rank 0 writes CSVs and PNGs).

    mpiexec -n 4 python bench/train_figures.py            # train every mode, then plot
    python bench/train_figures.py --plot-only             # redraw from the committed CSVs

Figure 1 (bench/train_straggler.png): BSP, SSP (s=2), backup workers (b=1) and
an asynchronous parameter server (K=1) on digits, while one random rank per
step sleeps --straggler-ms.  Figure 2 (bench/train_compress.png): BSP with each
compressor, test accuracy against cumulative bytes sent by rank 0.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = [("bsp", {}), ("ssp s=2", dict(sync="ssp", staleness=2)),
         ("backup b=1", dict(backup_workers=1)), ("async K=1", dict(sync="async", servers=1))]
COMPRESSORS = ["none", "fp16", "qsgd:16", "qsgd:4", "topk:0.1", "topk:0.01"]


def _write(path, runs):
    cols = ["run", "step", "wall_s", "loss", "test_accuracy", "samples_per_s", "compute_s",
            "comm_s", "bytes_sent", "cum_bytes"]
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for label, rows in runs.items():
            total = 0
            for r in rows:
                total += int(r["bytes_sent"])
                w.writerow({**r, "run": label, "cum_bytes": total})


def _read(path):
    runs = defaultdict(list)
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            runs[r["run"]].append({k: (v if k == "run" else float(v)) for k, v in r.items()})
    return dict(runs)


def _train_all(args):
    from mpi4py import MPI
    from mlcomm.trainer import train

    size = MPI.COMM_WORLD.Get_size()
    straggle = f"random:{args.straggler_ms:g}"
    common = dict(steps=args.steps, progress=False, eval_every=5, algorithm=args.algorithm)
    strag = {}
    for label, opts in MODES:
        res = train(straggler=straggle, **common, **opts)
        strag[label] = res.metrics
    comp = {}
    for spec in COMPRESSORS:
        res = train(compress=spec, **common)
        comp[spec] = res.metrics
    if MPI.COMM_WORLD.Get_rank() == 0:
        meta = f"P={size}, straggler {straggle}, {args.steps} steps, algorithm {args.algorithm}"
        print(meta)
        with open(os.path.join(HERE, "train_figures.json"), "w") as fh:
            json.dump({"ranks": size, "straggler": straggle, "steps": args.steps,
                       "algorithm": args.algorithm}, fh, indent=1)
        _write(os.path.join(HERE, "train_straggler.csv"), strag)
        _write(os.path.join(HERE, "train_compress.csv"), comp)
    return MPI.COMM_WORLD.Get_rank() == 0


def _plot(title_suffix=""):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from mlcomm.trainer.metrics import plot_runs

    with open(os.path.join(HERE, "train_figures.json")) as fh:
        meta = json.load(fh)
    strag = _read(os.path.join(HERE, "train_straggler.csv"))
    ms = meta["straggler"].partition(":")[2]
    plot_runs(strag, os.path.join(HERE, "train_straggler.png"),
              title=f"digits, MLP 64-128-10, {meta['ranks']} ranks, one random rank per step "
                    f"sleeps {ms} ms (bsp: {meta['algorithm']} all-reduce)" + title_suffix)
    comp = _read(os.path.join(HERE, "train_compress.csv"))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for label, rows in comp.items():
        axes[0].plot([r["cum_bytes"] for r in rows], [r["test_accuracy"] for r in rows],
                     label=label, lw=1.2)
        axes[1].plot([r["step"] for r in rows], [r["loss"] for r in rows], label=label, lw=1)
    axes[0].set_xscale("log")
    axes[0].set_xlabel("bytes sent by rank 0 (cumulative)")
    axes[0].set_ylabel("test accuracy")
    axes[0].set_ylim(0.5, 1.0)
    axes[1].set_yscale("log")
    axes[1].set_xlabel("step")
    axes[1].set_ylabel("training loss")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8, title="--compress")
    fig.suptitle(f"BSP gradient compression on digits, {meta['ranks']} ranks "
                 f"(dense: {meta['algorithm']} all-reduce; compressed: MPI_Allgatherv)")
    fig.tight_layout()
    fig.savefig(os.path.join(HERE, "train_compress.png"), dpi=110)
    plt.close(fig)
    for name, runs in (("straggler", strag), ("compress", comp)):
        print(f"{name}:")
        for label, rows in runs.items():
            last = rows[-1]
            print(f"  {label:12s} steps={int(last['step']):4d} wall={last['wall_s']:6.2f}s "
                  f"loss={last['loss']:.4f} acc={last['test_accuracy']:.4f} "
                  f"bytes={int(last['cum_bytes'])}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--plot-only", action="store_true", help="redraw from the CSVs, no training")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--straggler-ms", type=float, default=30.0)
    p.add_argument("--algorithm", default="ring")
    args = p.parse_args(argv)
    if args.plot_only or _train_all(args):
        _plot()
    return 0


if __name__ == "__main__":
    from mlcomm.cli import abort_on_error
    sys.exit(abort_on_error(main))
