"""Two-level all-reduce: reduce-scatter inside each node, all-reduce across nodes, all-gather
inside each node.

The vector is cut into ``Lmax`` parts, the size of the largest node; on a node of L ranks,
local rank i handles every part j with j mod L = i. Each part is reduced inside its node
(through the window, ``intra="shared_memory"``, or by point-to-point messages to its
handler, ``intra="direct"``), then all-reduced across the nodes by the ranks that handle it,
one per node, with the flat algorithm ``inter``, and finally copied to every rank of each
node. Every node's ranks and links work at once, and nodes of any sizes fit (5 ranks as
2 + 2 + 1: the single rank handles both parts). With the window, a vector larger than half
a slot goes in rounds.
"""

from __future__ import annotations

from ..schedule import INPUT, OUTPUT, SCRATCH, Copy, Recv, Reduce, Region, Send, Timeline, \
    chunk_bounds, slot
from ._common import elements
from ._registry import COLLECTIVES, register
from .shared_memory import DEFAULT_SLOT_BYTES, Barriers, node_of, reduce_slots

__all__ = ["build", "cost", "embed", "INTRA"]

INTRA = ("shared_memory", "direct")


def embed(tl: Timeline, t: int, sub, peers, offset: int) -> int:
    """Append ``sub`` (a flat schedule for a group of ranks) from slot ``t``: its ranks are
    ``peers``, its input and output are this rank's output at ``offset`` (in place) and
    its scratch this rank's scratch. Returns the first free slot after it."""
    def place(region):
        if region.buffer == SCRATCH:
            return region
        return Region(OUTPUT, offset + region.offset, region.count)
    for k, step in enumerate(sub.steps):
        for tr in step.transfers:
            if isinstance(tr, Send):
                tl.send(t + k, peers[tr.peer], place(tr.region))
            elif isinstance(tr, Recv):
                tl.recv(t + k, peers[tr.peer], place(tr.region))
        for op in step.ops:
            if isinstance(op, Reduce):
                tl.reduce(t + k, place(op.dst), place(op.src), place(op.first))
            elif isinstance(op, Copy):
                tl.copy(t + k, place(op.dst), place(op.src))
    tl.need_scratch(sub.scratch_count)
    return t + len(sub.steps)


def build(rank, size, count, itemsize, nodes=None, slot_bytes=DEFAULT_SLOT_BYTES, inter="ring",
          intra="shared_memory", inter_options=()):
    """Reduce-scatter inside each node, ``inter`` across nodes per part, all-gather inside
    each node (see the module docstring). ``inter_options`` are ``inter``'s options, as
    ``(name, value)`` pairs."""
    if intra not in INTRA:
        raise ValueError(f"intra={intra!r}: choose one of {', '.join(INTRA)}")
    flat = COLLECTIVES["allreduce"].get(inter)
    if flat is None or flat.build is None or flat.context:
        valid = sorted(n for n, a in COLLECTIVES["allreduce"].items()
                       if a.build is not None and not a.context)
        raise ValueError(f"inter={inter!r}: choose a flat algorithm, one of {', '.join(valid)}")
    nodes = tuple(tuple(n) for n in nodes) if nodes is not None else (tuple(range(size)),)
    node = node_of(rank, size, nodes)
    local, L = node.index(rank), len(node)
    parts = max(len(n) for n in nodes)
    window = intra == "shared_memory" and L > 1
    tl = Timeline(rank, size)
    whole, mine = Region(OUTPUT, 0, count), Region(INPUT, 0, count)
    if count == 0:
        return tl.schedule(count, count)
    if size == 1:
        tl.copy(0, whole, mine)
        return tl.schedule(count, count)
    # every rank cuts the vector into the same rounds, whether its own node uses the window
    room = count
    if intra == "shared_memory" and parts > 1:
        room = elements("slot_bytes", slot_bytes, itemsize) // 2
        if room < parts:
            raise ValueError(f"slot_bytes={slot_bytes} is too small for parts of {parts} "
                             f"ranks: give the window more bytes (MLCOMM_SHM_BYTES)")
    room = min(room, count)
    sync = Barriers(tl, node) if window else None
    if window:
        sync.begin(0)
    t = 0
    mine_parts = [j for j in range(parts) if j % L == local]
    starts = list(range(0, count, room))
    for r, a in enumerate(starts):
        m = min(room, count - a)
        pb = chunk_bounds(m, parts)
        piece = lambda j, buf=OUTPUT, at=a: Region(buf, at + pb[j], pb[j + 1] - pb[j])
        # 1. reduce each part inside the node, into its handler's output
        if window:
            tl.need_slot(2 * room)
            if r == 0:
                tl.copy(t, Region(slot(rank), 0, m), Region(INPUT, a, m))
            t += 1
            sync.barrier(t)
            for j in mine_parts:
                reduce_slots(tl, t, node, piece(j), pb[j], pb[j + 1] - pb[j])
            t += 1
        elif L > 1:
            t = _direct_reduce(tl, t, node, parts, pb, a)
        else:
            tl.copy(t, Region(OUTPUT, a, m), Region(INPUT, a, m))
            t += 1
        # 2. all-reduce each part across the nodes, among its handlers
        if len(nodes) > 1:
            for j in mine_parts:
                column = [n[j % len(n)] for n in nodes]
                sub = flat.build(column.index(rank), len(nodes), pb[j + 1] - pb[j], itemsize,
                                 **dict(inter_options))
                t = embed(tl, t, sub, column, a + pb[j])
        # 3. every part to every rank of the node
        if window:
            result = room
            for j in mine_parts:
                tl.copy(t, Region(slot(rank), result + pb[j], pb[j + 1] - pb[j]), piece(j))
            t += 1
            sync.barrier(t)
            for j in range(parts):
                owner = node[j % L]
                if owner != rank:
                    tl.copy(t, piece(j), Region(slot(owner), result + pb[j], pb[j + 1] - pb[j]))
            if r + 1 < len(starts):
                nxt = starts[r + 1]
                tl.copy(t, Region(slot(rank), 0, min(room, count - nxt)),
                        Region(INPUT, nxt, min(room, count - nxt)))
        elif L > 1:
            t = _direct_gather(tl, t, node, parts, pb, a)
    if window:
        sync.end(t + 1)
    return tl.schedule(count, count)


def _direct_reduce(tl, t, node, parts, pb, a):
    """Each rank sends part j to its handler, which reduces them in local-rank order."""
    me, L = tl.rank, len(node)
    width = max(pb[j + 1] - pb[j] for j in range(parts))
    handled = [j for j in range(parts) if node[j % L] == me]
    tl.need_scratch(len(handled) * L * width)
    for j in range(parts):
        owner, n = node[j % L], pb[j + 1] - pb[j]
        own = Region(INPUT, a + pb[j], n)
        if owner != me:
            tl.send(t, owner, own)
            continue
        # this rank's own part is read in place only when it comes first; otherwise it is
        # staged in scratch, since the first reduction writes over it when in place
        at = handled.index(j) * L * width
        landing = [own if q == me == node[0] else Region(SCRATCH, at + i * width, n)
                   for i, q in enumerate(node)]
        for i, q in enumerate(node):
            if q != me:
                tl.recv(t, q, landing[i])
            elif q != node[0]:
                tl.copy(t, landing[i], own)
        out = Region(OUTPUT, a + pb[j], n)
        for i in range(1, L):
            tl.reduce(t, out, landing[i], left=landing[0] if i == 1 else None)
    return t + 1


def _direct_gather(tl, t, node, parts, pb, a):
    """Each handler sends its finished parts to the other ranks of its node."""
    me, L = tl.rank, len(node)
    for j in range(parts):
        owner, region = node[j % L], Region(OUTPUT, a + pb[j], pb[j + 1] - pb[j])
        if owner == me:
            for q in node:
                if q != me:
                    tl.send(t, q, region)
        else:
            tl.recv(t, owner, region)
    return t + 1


def cost(p, nbytes, alpha, beta, gamma, nodes=None, slot_bytes=DEFAULT_SLOT_BYTES, inter="ring",
         intra="shared_memory", inter_options=(), inter_alpha=None, inter_beta=None):
    """Inside the node the window's costs (a barrier alpha/4, copies beta per byte);
    across the nodes ``inter``'s closed form on one part, with ``inter_alpha`` and
    ``inter_beta`` when given."""
    nodes = nodes or (tuple(range(p)),)
    n_nodes, L = len(nodes), max(len(n) for n in nodes)
    part = nbytes / L
    local = 4 * (alpha / 4) + 3 * nbytes * beta + (L - 1) * part * gamma
    if n_nodes == 1:
        return local
    flat = COLLECTIVES["allreduce"][inter]
    return local + flat.cost(n_nodes, part, inter_alpha or alpha, inter_beta or beta, gamma,
                             **dict(inter_options))


register("hierarchical", "allreduce", build, cost,
         {"inter": "auto", "intra": "shared_memory", "inter_options": ()},
         aliases=("two_level", "hier"), context=("nodes", "slot_bytes"))
