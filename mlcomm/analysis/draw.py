"""Draw a schedule round by round, as the slides do.

Ranks are rows, rounds are columns.  Each cell shows what one rank holds of
the vector after that round: one box per element, coloured by whose
contributions it sums (a rank's own colour, a blend for a partial sum, black
when every rank is in it).  A collective that only moves data (no ``Reduce``
in any schedule: gathers, scatters, broadcasts, all-to-alls) shows each rank's
output instead, element by element, coloured by the rank whose data it holds.  Arrows are the messages that complete in that
round; dashed arrows are reads of a peer's node window slot; a grey frame
around a node's rows is a node synchronisation (an await of a peer's post)
completing in that round.  Rounds are those of the unit-cost model: a message
or a node synchronisation takes one.  The drawing comes from running the
schedule symbolically: every buffer element carries the vector index it
stands for and a count of each rank's contributions, so partial sums in
scratch and in window slots are shown at their place in the vector too, and a
double-counted contribution shows in red.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..ir.schedule import INPUT, OUTPUT, SCRATCH, Copy, Recv, Reduce, Send, owner, peer, slot
from .simulator import UNIT_NETWORK, compile_schedules, simulate

__all__ = ["Trace", "trace", "draw_schedule"]

_LETTERS = "abcdefghijklmnopqrstuvwxyz"


class _State:
    """One rank's buffers: per element, the vector index and the contribution counts.

    The window slots of every rank live in ``window`` (shared by all states): a rank
    writes its own slot and reads its node's.
    """

    def __init__(self, sched, rank, p, window):
        n_in, n_out, n_scr = sched.input_count, sched.output_count, sched.scratch_count
        self.rank, self.window = rank, window
        self.idx = {INPUT: np.arange(n_in), OUTPUT: np.full(n_out, -1),
                    SCRATCH: np.full(n_scr, -1)}
        self.cnt = {INPUT: np.zeros((n_in, p), np.int64), OUTPUT: np.zeros((n_out, p), np.int64),
                    SCRATCH: np.zeros((n_scr, p), np.int64)}
        self.cnt[INPUT][:, rank] = 1
        self.own = slot(rank)
        window[self.own] = (np.full(sched.slot_count, -1),
                            np.zeros((sched.slot_count, p), np.int64))
        for name in (INPUT, OUTPUT):  # what its node peers may read of its own buffers
            window[peer(name, rank)] = (self.idx[name], self.cnt[name])
        self.peer_reads = []  # (owner, idx, cnt) of reads of peers' slots since last taken

    def _arrays(self, buffer):
        if buffer in self.idx:
            return self.idx[buffer], self.cnt[buffer]
        return self.window[buffer]

    def read(self, region):
        sl = slice(region.offset, region.stop)
        idx, cnt = self._arrays(region.buffer)
        idx, cnt = idx[sl].copy(), cnt[sl].copy()
        q = owner(region.buffer)
        if q is not None and q != self.rank:
            self.peer_reads.append((q, idx, cnt))
        return idx, cnt

    def write(self, region, idx, cnt):
        sl = slice(region.offset, region.stop)
        mine_idx, mine_cnt = self._arrays(region.buffer)
        mine_idx[sl] = idx
        mine_cnt[sl] = cnt

    def apply(self, op):
        idx, cnt = self.read(op.src)
        if type(op) is Copy:
            self.write(op.dst, idx, cnt)
        elif type(op) is Reduce:
            didx, dcnt = self.read(op.first)
            self.write(op.dst, np.where(didx >= 0, didx, idx), dcnt + cnt)

    def output_view(self, count):
        """The contribution counts of each element of this rank's output (zeros past its
        end)."""
        cnt = np.zeros((count, self.cnt[INPUT].shape[1]), np.int64)
        held = self.cnt[OUTPUT][:count]
        cnt[:len(held)] = held
        return cnt

    def view(self, count):
        """Per vector index, the fullest partial sum this rank holds anywhere (output first,
        its window slot included)."""
        cnt = np.zeros((count, self.cnt[INPUT].shape[1]), np.int64)
        best = np.full(count, -1)
        for buf in (OUTPUT, SCRATCH, self.own, INPUT):
            idx_all, cnt_all = self._arrays(buf)
            for at, i in enumerate(idx_all):
                if 0 <= i < count:
                    c = cnt_all[at]
                    k = int((c > 0).sum())
                    if k > best[i]:
                        best[i], cnt[i] = k, c
        return cnt


class Trace(NamedTuple):
    """What :func:`trace` finds, round by round (index 0 is the start)."""

    #: ``views[t][r]``: rank r's (count, p) contribution counts after round t (of the
    #: vector's elements, or of its output's where no schedule reduces)
    views: list
    #: ``messages[t]``: ``(src, dst, indices, counts)`` of the messages completing in round t
    #: (where no schedule reduces, the indices are the output's that a message lands in)
    messages: list
    #: ``reads[t]``: ``(owner, reader, indices, counts)`` of the reads of a peer's slot in round t
    reads: list
    #: ``syncs[t]``: the nodes (tuples of ranks) in which an await of a post completes in round t
    syncs: list


def trace(schedules) -> Trace:
    """Run ``schedules`` symbolically, in the rounds of the unit-cost model."""
    p = len(schedules)
    moves = not any(type(op) is Reduce for s in schedules for st in s.steps for op in st.ops)
    count = (max(s.output_count for s in schedules) if moves else schedules[0].input_count) \
        if p else 0
    prog = compile_schedules(schedules, 1)
    unit = simulate(prog, UNIT_NETWORK)
    rounds = int(round(unit.seconds))
    # the same per-pair posting order as compile_schedules, with the regions kept
    sends, recvs, steps = [], [], []
    for r, sched in enumerate(schedules):
        for step in sched.steps:
            for tr in step.transfers:
                if type(tr) is Send:
                    sends.append((r, tr.peer, tr.region))
                elif type(tr) is Recv:
                    recvs.append((tr.peer, r, tr.region))
            steps.append((r, step))
    skey = sorted(range(len(sends)), key=lambda i: (sends[i][0], sends[i][1], i))
    rkey = sorted(range(len(recvs)), key=lambda i: (recvs[i][0], recvs[i][1], i))
    pairs = [(sends[a], recvs[b]) for a, b in zip(skey, rkey)]
    window = {}
    states = [_State(s, r, p, window) for r, s in enumerate(schedules)]
    msg_round = np.rint(unit.msg_end).astype(int)
    step_round = np.rint(unit.step_done).astype(int)
    step_rank = np.searchsorted(prog.rank_first, prog.await_step, side="right") - 1
    sync_round = np.rint(unit.await_done).astype(int)
    syncs = [set() for _ in range(rounds + 1)]
    for a in np.flatnonzero(prog.await_post >= 0):
        syncs[sync_round[a]].add(tuple(schedules[step_rank[a]].node))

    def run_ops(t):
        read = []
        for g in np.flatnonzero(step_round == t):
            r, step = steps[g]
            for op in step.ops:
                states[r].apply(op)
            read += [(q, r, idx, cnt) for q, idx, cnt in states[r].peer_reads]
            states[r].peer_reads.clear()
        return read

    look = (lambda st: st.output_view(count)) if moves else (lambda st: st.view(count))
    reads = [run_ops(0)]  # local ops before any message or sync (copies)
    views = [[look(st) for st in states]]
    messages = [[]]
    for t in range(1, rounds + 1):
        arrived = []
        for m in np.flatnonzero(msg_round == t):
            (s, d, sreg), (_, _, rreg) = pairs[m]
            idx, cnt = states[s].read(sreg)
            states[s].peer_reads.clear()
            arrived.append((s, d, rreg, idx, cnt))
        for s, d, rreg, idx, cnt in arrived:
            states[d].write(rreg, idx, cnt)
        messages.append([(s, d, np.arange(rreg.offset, rreg.stop)
                          if moves and rreg.buffer == OUTPUT else idx, cnt)
                         for s, d, rreg, idx, cnt in arrived])
        reads.append(run_ops(t))
        views.append([look(st) for st in states])
    return Trace(views, messages, reads, [sorted(n) for n in syncs])


def _colours(p):
    import matplotlib
    cmap = matplotlib.colormaps["tab10" if p <= 10 else "tab20"]
    return np.array([cmap(q % cmap.N)[:3] for q in range(p)])


def _box_colour(c, base):
    """Colour and text of one element box from its contribution counts."""
    who = np.flatnonzero(c > 0)
    p = len(c)
    if len(who) == 0:
        return (0.93, 0.93, 0.93), ""
    if (c > 1).any():
        return (1.0, 0.0, 0.0), "2x"
    if len(who) == p:
        return (0.1, 0.1, 0.1), "Σ"
    colour = base[who].mean(axis=0) * 0.75 + 0.25
    text = "".join(_LETTERS[q] for q in who) if p <= 8 else f"{len(who)}/{p}"
    return tuple(colour), text


def draw_schedule(schedules, path, title: str | None = None) -> None:
    """Draw ``schedules`` (every rank's, small p) round by round into the image file ``path``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle

    views, messages, reads, syncs = trace(schedules)
    p = len(schedules)
    count = len(views[0][0]) if p else 0
    rounds = len(views) - 1
    base = _colours(p)
    box, gap_x, row_h = 1.0, 2.2, 1.7
    cell_w = count * box + gap_x
    fig_w = min(60, 1.2 + (rounds + 1) * (count * 0.32 + 0.8))
    fig_h = 1.3 + p * 0.62
    fig, ax = plt.subplots(figsize=(fig_w, fig_h))

    def x0(t):
        return t * cell_w

    def y0(r):
        return (p - 1 - r) * row_h

    def arrows(t, moves, **style):
        """An arrow for each ``(source, destination, indices, counts)`` of round ``t``."""
        for s, d, idx, cnt in moves:
            known = idx[idx >= 0]
            centre = (known.mean() + 0.5) * box if len(known) else count * box / 2
            colour, _ = _box_colour(cnt[0] if len(cnt) else np.zeros(p, np.int64), base)
            ax.annotate("", xy=(x0(t) + centre, y0(d) + box / 2),
                        xytext=(x0(t - 1) + centre, y0(s) + box / 2),
                        arrowprops=dict(arrowstyle="-|>", color=colour, shrinkA=4, shrinkB=4,
                                        **style))

    for t, view in enumerate(views):
        for r in range(p):
            for i in range(count):
                colour, text = _box_colour(view[r][i], base)
                ax.add_patch(Rectangle((x0(t) + i * box, y0(r)), box, box, facecolor=colour,
                                       edgecolor="white", linewidth=0.8))
                if text and count <= 24:
                    dark = sum(colour) < 1.4
                    ax.text(x0(t) + (i + 0.5) * box, y0(r) + 0.5 * box, text, ha="center",
                            va="center", fontsize=7 if len(text) < 4 else 5,
                            color="white" if dark else "black")
        ax.text(x0(t) + count * box / 2, y0(0) + box + 0.35, "start" if t == 0 else f"round {t}",
                ha="center", va="bottom", fontsize=8)
    for r in range(p):
        ax.text(-0.4, y0(r) + box / 2, f"rank {r}", ha="right", va="center", fontsize=8)
    nodes = sorted({tuple(s.node) for s in schedules if s.node})
    for node in nodes[1:]:  # a line between nodes
        y = y0(node[0]) + box + (row_h - box) / 2
        ax.plot([-2.6, x0(rounds) + count * box], [y, y], color="0.6", lw=0.8, ls="-")
    for t in range(1, rounds + 1):
        for node in syncs[t]:
            top, bottom = y0(min(node)) + box + 0.25, y0(max(node)) - 0.25
            ax.add_patch(Rectangle((x0(t) - 0.35, bottom), count * box + 0.7, top - bottom,
                                   fill=False, edgecolor="0.45", linewidth=1.0, ls="--"))
        arrows(t, messages[t], alpha=0.8, lw=1.2, connectionstyle="arc3,rad=0.08")
        arrows(t, reads[t], alpha=0.6, lw=0.9, ls="--", connectionstyle="arc3,rad=-0.08")
    handles = [Patch(facecolor=tuple(base[q]), label=f"{_LETTERS[q] if p <= 26 else q}: rank {q}")
               for q in range(min(p, 10))]
    handles += [Patch(facecolor=(0.1, 0.1, 0.1), label="Σ all ranks"),
                Patch(facecolor=(0.93, 0.93, 0.93), edgecolor="grey", label="not yet held")]
    if nodes:
        from matplotlib.lines import Line2D
        handles += [Line2D([], [], color="0.3", ls="--", lw=0.9, label="read of a peer's slot"),
                    Patch(fill=False, edgecolor="0.45", ls="--", label="node sync")]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.01),
              ncol=min(len(handles), 7, max(3, int(fig_w / 1.4))), fontsize=7,
              frameon=False)
    ax.set_xlim(-2.8, x0(rounds) + count * box + 0.6)
    ax.set_ylim(-0.4, y0(0) + box + 1.0)
    ax.set_aspect("equal")
    ax.axis("off")
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
