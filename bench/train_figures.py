"""Remake the trainer figures (run as an MPI job; rank 0 writes CSVs, JSON and PNGs).

    mpiexec -n 4 python bench/train_figures.py                 # straggler and compression
    mpiexec -n 4 python bench/train_figures.py --only straggler
    mpiexec -n 2 python bench/train_figures.py --only timeline
    python bench/train_figures.py --plot-only                  # redraw from the committed files

Figure 1 (bench/train_straggler.png, .csv): BSP, SSP (s=2), backup workers
(b=1) and an asynchronous parameter server (K=1) on digits, each with and
without a persistent straggler (by default the last rank sleeps 30 ms every
step).  Every run applies the same number of samples (``--steps`` synchronous
steps of the global batch: backup runs P/(P-b) times the steps, async P times
the updates of one worker's batch).  A run's end is the job's wall time, the
longest of every rank's, from the start barrier to the last rank leaving.

Figure 2 (bench/train_compress.png, .csv): BSP with each compressor, on ``ring`` and on
``shared_memory``, test accuracy against the cumulative bytes rank 0 moved between ranks,
as mlcomm's transports counted them on every path (messages, the node's window, single
copies; a column each).

Figure 3 (bench/train_timeline.png, .json): ``mlcomm train --framework torch --model cnn
--timeline``: a few steps of every rank's compute and communication spans, drawn from the
Chrome trace. The gradients travel in buckets of at most ``--timeline-bucket-mb`` MiB.
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
STRAGGLER_COLS = ["run", "mode", "straggler", "step", "wall_s", "loss", "test_accuracy",
                  "updates", "samples", "cum_samples", "staleness_mean", "staleness_max",
                  "dropped", "bytes_sent", "cum_bytes", "job_wall_s"]
TIMELINE_STEPS = 40      # steps trained for the timeline; the figure shows the last few
TIMELINE_SHOWN = 3
#: the gradient all-reduces of figure 2: a flat algorithm's messages, the node's window
COMPRESS_ALGORITHMS = ("ring", "shared_memory")
COMPRESS_COLS = ["algorithm", "run", "step", "wall_s", "loss", "test_accuracy", "samples_per_s",
                 "compute_s", "comm_s", "bytes_sent", "bytes_messages", "bytes_window",
                 "bytes_single_copy", "cum_bytes"]


def _mode_steps(label, opts, steps, size):
    """Steps (async: updates) that apply ``steps`` synchronous global batches of samples."""
    if opts.get("sync") == "async":
        return steps * size                        # one worker's batch an update
    if opts.get("backup_workers"):
        b = opts["backup_workers"]
        return -(-steps * size // (size - b))      # P - b batches a step
    return steps


SMOOTH = 20


def _moving_mean(values, n):
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v - (values[i - n] if i >= n else 0.0)
        out.append(total / min(i + 1, n))
    return out


def _mean_staleness(rows):
    """Mean staleness over every update applied in the run."""
    weighted = [(r["staleness_mean"], r["updates"]) for r in rows
                if r["updates"] and r["staleness_mean"] == r["staleness_mean"]]
    return sum(m * n for m, n in weighted) / max(1, sum(n for _, n in weighted))


def _write(path, runs, cols):
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        for label, rows in runs.items():
            cum_bytes = cum_samples = 0
            for r in rows:
                cum_bytes += int(r["bytes_sent"])
                cum_samples += int(r.get("samples", 0))
                w.writerow({"run": label, **r, "cum_bytes": cum_bytes,
                            "cum_samples": cum_samples})


def _read(path, key=lambda r: r["run"]):
    runs = defaultdict(list)
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            runs[key(r)].append({k: (v if k in ("run", "mode", "straggler", "algorithm")
                                     else float(v)) for k, v in r.items()})
    return dict(runs)


def _train_all(args):
    from mpi4py import MPI
    from mlcomm.trainer import train

    size, rank = MPI.COMM_WORLD.Get_size(), MPI.COMM_WORLD.Get_rank()
    straggler = args.straggler or f"{size - 1}:30"
    common = dict(progress=False, eval_every=5, algorithm=args.algorithm)
    meta = {}
    if rank == 0:  # keep the record of the figures not remade
        try:
            with open(os.path.join(HERE, "train_figures.json")) as fh:
                meta = json.load(fh)
        except (OSError, ValueError):
            pass
    if {"straggler", "compress"} & set(args.only):
        meta.update(ranks=size, steps=args.steps, algorithm=args.algorithm)
    if "straggler" in args.only:
        meta.update(straggler=straggler, runs={})
        strag = {}
        for label, opts in MODES:
            steps = _mode_steps(label, opts, args.steps, size)
            for spec, tag in ((None, "none"), (straggler, straggler)):
                res = train(steps=steps, straggler=spec, **common, **opts)
                name = f"{label}, straggler {tag}"
                strag[name] = [{**r, "mode": label, "straggler": tag, "job_wall_s": res.wall_s}
                               for r in res.metrics]
                rows = res.metrics
                meta["runs"][name] = {
                    "mode": label, "straggler": tag, "steps": steps, "job_wall_s": res.wall_s,
                    "samples": sum(r["samples"] for r in rows),
                    "test_accuracy": res.test_accuracy,
                    "dropped": sum(r["dropped"] for r in rows),
                    "staleness_mean": _mean_staleness(rows),
                    "staleness_max": max((r["staleness_max"] for r in rows), default=0)}
                if rank == 0:
                    print(f"{name:32s} steps={steps:5d} job wall={res.wall_s:6.2f} s "
                          f"acc={res.test_accuracy:.4f}", flush=True)
        if rank == 0:
            _write(os.path.join(HERE, "train_straggler.csv"), strag, STRAGGLER_COLS)
    if "compress" in args.only:
        comp = {}
        meta["compress"] = {"ranks": size, "steps": args.steps,
                            "algorithms": list(COMPRESS_ALGORITHMS)}
        for algorithm in COMPRESS_ALGORITHMS:
            for spec in COMPRESSORS:
                rows = train(compress=spec, steps=args.steps,
                             **dict(common, algorithm=algorithm)).metrics
                comp[f"{algorithm} {spec}"] = [{**r, "run": spec, "algorithm": algorithm}
                                               for r in rows]
        if rank == 0:
            _write(os.path.join(HERE, "train_compress.csv"), comp, COMPRESS_COLS)
    if "timeline" in args.only:
        res = train(framework="torch", model="cnn", steps=TIMELINE_STEPS, progress=False,
                    bucket_mb=args.timeline_bucket_mb, algorithm=args.algorithm,
                    timeline=os.path.join(HERE, "train_timeline.json"))
        meta["timeline"] = {"ranks": size, "steps": TIMELINE_STEPS, "algorithm": args.algorithm,
                            "bucket_mb": args.timeline_bucket_mb,
                            "test_accuracy": res.test_accuracy}
    if rank == 0:
        with open(os.path.join(HERE, "train_figures.json"), "w") as fh:
            json.dump(meta, fh, indent=1)
    return rank == 0


def _save(fig, name):
    import matplotlib.pyplot as plt
    fig.tight_layout()
    fig.savefig(os.path.join(HERE, name), dpi=110)
    plt.close(fig)


def _plot_straggler(meta):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = _read(os.path.join(HERE, "train_straggler.csv"))
    colors = dict(zip([label for label, _ in MODES], plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    for name, rows in runs.items():
        mode, slow = rows[0]["mode"], rows[0]["straggler"] != "none"
        style = dict(color=colors[mode], ls="-" if slow else "--", lw=1.2 if slow else 1)
        label = f"{mode}{' + straggler' if slow else ''}"
        wall = [r["wall_s"] for r in rows]
        loss = _moving_mean([r["loss"] for r in rows], SMOOTH)
        end = rows[0]["job_wall_s"]
        axes[0].plot(wall + [end], loss + [loss[-1]], label=label, **style)
        axes[0].plot([end], [loss[-1]], marker="o" if slow else "s", color=colors[mode], ms=5)
        axes[1].plot([r["cum_samples"] for r in rows], [r["test_accuracy"] for r in rows],
                     label=label, **style)
    axes[0].set_xlabel("wall time (s); marker: the job's end (its longest rank)")
    axes[0].set_ylabel(f"training loss (mean of the last {SMOOTH} rows)")
    axes[0].set_yscale("log")
    axes[1].set_xlabel("samples in applied updates (cumulative)")
    axes[1].set_ylabel("test accuracy")
    axes[1].set_ylim(0.8, 1.0)
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    summary = meta["runs"]
    x = range(len(MODES))
    for i, (tag, off) in enumerate((("none", -0.2), (meta["straggler"], 0.2))):
        walls = [next((v["job_wall_s"] for v in summary.values()
                       if v["mode"] == label and v["straggler"] == tag), 0) for label, _ in MODES]
        bars = axes[2].bar([j + off for j in x], walls, 0.4,
                           label="no straggler" if tag == "none" else f"straggler {tag} (rank:ms)",
                           color=[colors[label] for label, _ in MODES], alpha=0.5 if i == 0 else 1,
                           edgecolor="black", lw=0.5)
        axes[2].bar_label(bars, fmt="%.1f s", fontsize=8)
    axes[2].set_xticks(list(x), [label for label, _ in MODES])
    axes[2].set_ylabel("job wall time (s)")
    axes[2].legend(fontsize=8)
    axes[2].grid(alpha=0.3, axis="y")
    fig.suptitle(f"digits, MLP 64-128-10, P = {meta['ranks']}, every run applies "
                 f"{meta['steps']} x the global batch of samples; straggler {meta['straggler']} "
                 f"(rank:ms every step), dashed: without (bsp: {meta['algorithm']} all-reduce)")
    _save(fig, "train_straggler.png")
    print("straggler:")
    for name, v in summary.items():
        print(f"  {name:32s} steps={v['steps']:5d} job wall={v['job_wall_s']:6.2f}s "
              f"samples={v['samples']} acc={v['test_accuracy']:.4f} dropped={v['dropped']} "
              f"staleness mean={v.get('staleness_mean', float('nan')):.2f} "
              f"max={v['staleness_max']}")


def _plot_compress(meta):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    comp = _read(os.path.join(HERE, "train_compress.csv"),
                 key=lambda r: (r["algorithm"], r["run"]))
    info = meta["compress"]
    colors = dict(zip(COMPRESSORS, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    styles = dict(zip(info["algorithms"], ("-", "--", ":")))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for (algorithm, label), rows in comp.items():
        style = dict(color=colors[label], ls=styles[algorithm])
        axes[0].plot([r["cum_bytes"] for r in rows], [r["test_accuracy"] for r in rows],
                     lw=1.2, **style)
        axes[1].plot([r["step"] for r in rows], [r["loss"] for r in rows], lw=1, **style)
    axes[0].set_xscale("log")
    axes[0].set_xlabel("bytes rank 0 moved between ranks (cumulative: messages, window, "
                       "single copies)", fontsize=9)
    axes[0].set_ylabel("test accuracy")
    axes[0].set_ylim(0.5, 1.0)
    axes[1].set_yscale("log")
    axes[1].set_xlabel("step")
    axes[1].set_ylabel("training loss")
    for ax in axes:
        ax.grid(alpha=0.3)
    from matplotlib.lines import Line2D
    axes[0].legend(handles=[Line2D([], [], color=colors[c], label=c) for c in COMPRESSORS]
                   + [Line2D([], [], color="black", ls=styles[a], label=a)
                      for a in info["algorithms"]],
                   fontsize=8, title="--compress, --algorithm", loc="lower right")
    fig.suptitle(f"BSP gradient compression on digits, {info['ranks']} ranks (dense, fp16: "
                 f"{' or '.join(info['algorithms'])} all-reduce; top-k, QSGD: ring allgather)")
    _save(fig, "train_compress.png")
    print("compress:")
    for (algorithm, label), rows in comp.items():
        last = rows[-1]
        paths = {k[6:]: int(sum(r[k] for r in rows)) for k in COMPRESS_COLS
                 if k.startswith("bytes_") and k != "bytes_sent"}
        dense = comp[algorithm, "none"][-1]["cum_bytes"]
        print(f"  {algorithm:13s} {label:10s} steps={int(last['step']):4d} "
              f"wall={last['wall_s']:6.2f}s loss={last['loss']:.4f} "
              f"acc={last['test_accuracy']:.4f} bytes={int(last['cum_bytes'])} {paths} "
              f"({dense / last['cum_bytes']:.1f}x fewer than dense)")


def _plot_timeline(meta):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from mlcomm.trainer.timeline import read

    spans = read(os.path.join(HERE, "train_timeline.json"))
    forwards = sorted(s for name, s, _ in spans[0]["compute"] if name == "forward")
    lo, hi = forwards[-TIMELINE_SHOWN - 1], forwards[-1]  # the last steps but one, whole
    colors = {"forward": "#4c72b0", "backward": "#dd8452", "optimizer step": "#55a868",
              "wait for all-reduces": "#bbbbbb", "wait for loss": "#dddddd",
              "all-reduce loss": "#8172b3"}
    buckets = sorted({name for r in spans.values() for name, _, _ in r["communication"]
                      if name.startswith("all-reduce bucket")})
    palette = ["#c44e52", "#937860", "#da8bc3", "#8c8c8c", "#ccb974", "#64b5cd"]
    colors.update({name: palette[i % len(palette)] for i, name in enumerate(buckets)})
    ranks = sorted(spans)
    fig, ax = plt.subplots(figsize=(13, 1.4 + 0.9 * len(ranks)))
    ticks, labels = [], []
    for i, rank in enumerate(ranks):
        for j, thread in enumerate(("compute", "communication")):
            y = -(2 * i + j) - 0.3 * i
            bars = [(s, e, name) for name, s, e in spans[rank][thread] if e > lo and s < hi]
            ax.broken_barh([((s - lo) * 1e3, (e - s) * 1e3) for s, e, _ in bars], (y - 0.4, 0.8),
                           facecolors=[colors.get(name, "#999999") for _, _, name in bars],
                           edgecolor="black", linewidth=0.3)
            ticks.append(y)
            labels.append(f"rank {rank} {thread}")
    ax.set_yticks(ticks, labels)
    ax.set_xlim(0, (hi - lo) * 1e3)
    ax.set_xlabel("time (ms)")
    ax.grid(alpha=0.3, axis="x")
    used = [name for name in colors if any(name == n for r in spans.values()
                                           for t in r.values() for n, _, _ in t)]
    ax.legend(handles=[Patch(facecolor=colors[n], edgecolor="black", lw=0.3, label=n)
                       for n in used], fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    t = meta["timeline"]
    ax.set_title(f"mlcomm train --framework torch --model cnn, P = {t['ranks']}: "
                 f"{TIMELINE_SHOWN} steps; gradient buckets of <= {t['bucket_mb']:g} MiB "
                 f"({t['algorithm']} all-reduce) start during backward", fontsize=10)
    _save(fig, "train_timeline.png")


def _plot(only):
    with open(os.path.join(HERE, "train_figures.json")) as fh:
        meta = json.load(fh)
    if "straggler" in only:
        _plot_straggler(meta)
    if "compress" in only:
        _plot_compress(meta)
    if "timeline" in only:
        _plot_timeline(meta)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--plot-only", action="store_true", help="redraw from the CSVs, no training")
    p.add_argument("--only", choices=("straggler", "compress", "timeline"), action="append",
                   help="train and draw only this figure (repeatable; default straggler and "
                        "compress)")
    p.add_argument("--steps", type=int, default=300,
                   help="synchronous steps; the other modes apply as many samples")
    p.add_argument("--straggler", default=None, metavar="SPEC",
                   help="mlcomm train --straggler for figure 1 (default: the last rank, 30 ms)")
    p.add_argument("--algorithm", default="ring")
    p.add_argument("--timeline-bucket-mb", type=float, default=0.05, metavar="MB",
                   help="the timeline's DDP bucket cap (default %(default)s)")
    from mlcomm.cli import parse_args

    args = parse_args(p, argv)
    args.only = args.only or (["straggler", "compress", "timeline"] if args.plot_only
                              else ["straggler", "compress"])
    if args.plot_only or _train_all(args):
        _plot(args.only)
    return 0


if __name__ == "__main__":
    from mlcomm.cli import abort_on_error
    sys.exit(abort_on_error(main))
