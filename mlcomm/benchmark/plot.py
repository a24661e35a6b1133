"""Draw benchmark records: latency and busbw vs size, and vs ranks (matplotlib Agg)."""

from __future__ import annotations

import math

from ..units import format_size

__all__ = ["plot_sweep", "plot_vs_ranks", "model_times", "sweep_title"]

_BASELINE = "mpi"
#: how a title names a collective (the others by their own name)
_NAMES = {"allreduce": "all-reduce"}


def _factor(collective):
    """The bus-bandwidth factor of ``collective`` as the axis writes it."""
    from .calls import CALLS
    return CALLS[collective].factor.replace("-", "−")


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _style(alg, colors):
    if alg == _BASELINE:
        return dict(color="black", linewidth=2.2, marker="s", markersize=4, zorder=5)
    return dict(color=colors[alg], linewidth=1.3, marker="o", markersize=3)


def _colors(algs):
    plt = _plt()
    cmap = plt.get_cmap("tab10")
    others = [a for a in algs if a != _BASELINE]
    return {a: cmap(i % 10) for i, a in enumerate(others)}


def _pick_placement(records):
    """Out-of-place rows if any, else in-place ones."""
    outs = [r for r in records if not r["in_place"]]
    return (outs, "out-of-place") if outs else (records, "in-place")


def model_times(algorithms, ranks, sizes, dtype="float32", op="sum"):
    """Return ``{alg: [predicted seconds per size]}`` from a calibrated profile, or None.

    Only a calibrated profile (``mlcomm calibrate``) draws a model; built-in defaults
    or an unreadable profile draw none.
    """
    from ..algorithms import ALGORITHMS
    from ..model.machine import load_profile
    try:
        prof = load_profile()
    except (OSError, ValueError):
        return None
    if not prof.calibrated:
        return None
    alpha, beta, gamma = prof.alpha, prof.beta, prof.gamma_for(dtype, op)
    out = {}
    for alg in algorithms:
        if alg in (_BASELINE, "auto") or alg not in ALGORITHMS:
            continue
        cost = ALGORITHMS[alg].cost
        out[alg] = [cost(ranks, n, float(alpha), float(beta), float(gamma)) for n in sizes]
    return out or None


def sweep_title(rows, placement) -> str:
    """The sweep figure's title: the collective, ranks, dtype, op, placement, device."""
    r0 = rows[0] if rows else {}
    collective = r0.get("collective") or "allreduce"
    op = f" {r0.get('op', '')}" if r0.get("op") != "-" else ""  # a collective that moves only
    return (f"{_NAMES.get(collective, collective)}, {r0.get('ranks', 0)} ranks, "
            f"{r0.get('dtype', '')}{op}, {placement}, device {r0.get('device', 'cpu')}")


def plot_sweep(records, path, *, title=None, model=True):
    """Write a PNG: latency vs size (log-log) and busbw vs size side by side."""
    plt = _plt()
    rows, placement = _pick_placement(records)
    rows = [r for r in rows if r["bytes"] > 0]
    algs = list(dict.fromkeys(r["algorithm"] for r in rows))
    colors = _colors(algs)
    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(13, 5.2))
    ranks = rows[0]["ranks"] if rows else 0
    collective = (rows[0].get("collective") if rows else None) or "allreduce"
    predicted = None
    if model and rows and collective == "allreduce":  # the cost model's sizes are all-reduce's
        sizes = sorted({r["bytes"] for r in rows})
        predicted = model_times(algs, ranks, sizes, rows[0]["dtype"], rows[0]["op"])
    for alg in algs:
        rr = sorted((r for r in rows if r["algorithm"] == alg), key=lambda r: r["bytes"])
        x = [r["bytes"] for r in rr]
        st = _style(alg, colors)
        ax_t.plot(x, [r["time_us_avg"] for r in rr], label=alg, **st)
        ax_b.plot(x, [r["busbw_gbps"] for r in rr], label=alg, **st)
        if predicted and alg in predicted:
            sizes = sorted({r["bytes"] for r in rows})
            ax_t.plot(sizes, [t * 1e6 for t in predicted[alg]], linestyle="--",
                      color=st["color"], linewidth=1, alpha=0.8)
    from matplotlib.ticker import FuncFormatter
    for ax in (ax_t, ax_b):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: format_size(int(round(x)))))
        ax.set_xlabel("message size (bytes)")
        ax.grid(True, which="both", alpha=0.3)
    ax_t.set_yscale("log")
    ax_t.set_ylabel(f"time per {_NAMES.get(collective, collective)} (µs, avg over ranks)")
    ax_t.set_title("latency")
    ax_b.set_ylabel(f"bus bandwidth (GB/s) = algbw·{_factor(collective)}")
    ax_b.set_title("bus bandwidth")
    ax_t.legend(fontsize=8, loc="upper left")
    if predicted:
        ax_t.plot([], [], "k--", linewidth=1, label="model (calibrated profile)")
        ax_t.legend(fontsize=8, loc="upper left")
    fig.suptitle(title or sweep_title(rows, placement))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_vs_ranks(records, path, *, small=8, large=None, title=None):
    """Write a PNG: latency vs ranks at ``small`` bytes and busbw vs ranks at ``large`` bytes."""
    plt = _plt()
    rows, placement = _pick_placement(records)
    if large is None:
        large = max(r["bytes"] for r in rows)
    algs = list(dict.fromkeys(r["algorithm"] for r in rows))
    colors = _colors(algs)
    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(13, 5.2))
    for alg in algs:
        st = _style(alg, colors)
        for ax, nbytes, key in ((ax_t, small, "time_us_avg"), (ax_b, large, "busbw_gbps")):
            rr = sorted((r for r in rows if r["algorithm"] == alg and r["bytes"] == nbytes),
                        key=lambda r: r["ranks"])
            if rr:
                ax.plot([r["ranks"] for r in rr], [r[key] for r in rr], label=alg, **st)
    ranks = sorted({r["ranks"] for r in rows})
    for ax in (ax_t, ax_b):
        ax.set_xlabel("ranks (P)")
        ax.set_xticks(ranks)
        ax.grid(True, alpha=0.3)
    ax_t.set_yscale("log")
    ax_t.set_ylabel("time per all-reduce (µs)")
    ax_t.set_title(f"latency at {small} B")
    ax_b.set_ylabel("bus bandwidth (GB/s)")
    ax_b.set_title(f"busbw at {_fmt(large)}")
    ax_t.legend(fontsize=8)
    fig.suptitle(title or f"all-reduce vs ranks ({placement})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _fmt(n):
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k and n % (1 << k) == 0:
            return f"{n >> k} {unit}"
    return f"{n} B" if not math.isnan(n) else "?"

