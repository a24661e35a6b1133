"""Plots of predicted all-reduce time: against ranks and against bytes."""

from __future__ import annotations

from ..units import format_size

__all__ = ["plot_sweep"]

_STYLE = {
    "naive": ("tab:gray", ":"), "single_master": ("tab:brown", ":"),
    "parameter_server": ("tab:pink", "--"), "ring": ("tab:red", "-"),
    "double_binary_tree": ("tab:green", "-"), "recursive_doubling": ("tab:blue", "-"),
    "recursive_halving_doubling": ("tab:purple", "--"),
    "shared_memory": ("tab:olive", "-"), "hierarchical": ("black", "-"),
}


def plot_sweep(rows, path, title: str | None = None) -> None:
    """Draw sweep rows: one panel per size (time vs ranks), then, for three sizes or more,
    time vs bytes.

    Simulated points are filled markers, closed-form points hollow ones; rows without a
    time (an algorithm that cannot run on the layout) are left out.
    """
    rows = [r for r in rows if r["seconds"] is not None]
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["algorithm"] for r in rows))
    ranks = sorted({r["ranks"] for r in rows})
    sizes = sorted({r["bytes"] for r in rows})
    panels = []
    if len(ranks) > 1:
        panels += [("ranks", n) for n in sizes]
    if len(sizes) > 2 or (len(sizes) > 1 and len(ranks) == 1):
        picks = sorted({ranks[0], ranks[len(ranks) // 2], ranks[-1]})
        panels += [("bytes", p) for p in picks]
    if not panels:
        panels = [("ranks", sizes[0])]
    cols = min(3, len(panels))
    nrows = -(-len(panels) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5.2 * cols, 4.0 * nrows), squeeze=False)
    for ax, (axis, fixed) in zip(axes.flat, panels):
        for name in names:
            key = "bytes" if axis == "ranks" else "ranks"
            pts = sorted((r[axis], r["seconds"], r["source"]) for r in rows
                         if r["algorithm"] == name and r[key] == fixed)
            if not pts:
                continue
            colour, ls = _STYLE.get(name, (None, "-"))
            xs = [x for x, _, _ in pts]
            ys = [y * 1e6 for _, y, _ in pts]
            wide = ls == "-"  # solid lines underneath, so coinciding dashed ones stay visible
            line, = ax.plot(xs, ys, ls, color=colour, label=name, lw=2.6 if wide else 1.6,
                            alpha=0.75 if wide else 1.0, zorder=2 if wide else 3)
            sim = [(x, y) for (x, _, s), y in zip(pts, ys) if s == "simulated"]
            form = [(x, y) for (x, _, s), y in zip(pts, ys) if s != "simulated"]
            if sim:
                ax.plot(*zip(*sim), "o", color=line.get_color(), ms=3.5)
            if form:
                ax.plot(*zip(*form), "o", mfc="none", color=line.get_color(), ms=4)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.grid(True, which="major", alpha=0.3)
        ax.set_ylabel("predicted time (us)")
        if axis == "ranks":
            ax.set_xlabel("ranks")
            ax.set_title(f"allreduce {format_size(fixed)} bytes: latency vs ranks", fontsize=10)
        else:
            ax.set_xlabel("bytes")
            ax.set_title(f"allreduce on {fixed} ranks: time vs bytes", fontsize=10)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7, loc="upper left")
    note = "filled: simulated schedule, hollow: closed form"
    fig.suptitle((title + "\n" if title else "") + note, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
