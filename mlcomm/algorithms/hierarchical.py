"""Two-level all-reduce: reduce-scatter inside each node, all-reduce across nodes, all-gather
inside each node.

The vector is cut into ``Lmax`` parts, the size of the largest node; on a node of L ranks,
local rank i handles every part j with j mod L = i. Each part is reduced inside its node
(through the window, ``intra="shared_memory"``, or by point-to-point messages to its
handler, ``intra="direct"``), then all-reduced across the nodes by the ranks that handle it,
one per node, with the flat algorithm ``inter``, and finally copied to every rank of each
node. Every node's ranks and links work at once, and nodes of any sizes fit (5 ranks as
2 + 2 + 1: the single rank handles both parts). Through the window the parts go in
rounds of half a slot, each part's inter-node all-reduce once over the whole part; above
the turn areas' size a call's area of the slot rotates, as ``shared_memory``'s does. Where
the node allows single-copy reads (as for ``shared_memory``), vectors of at least
``single_copy_bytes`` skip the window: a handler reads its parts of its peers' inputs,
reduces them into its output and, once they are all-reduced across the nodes, writes them
into its peers' outputs; a last barrier keeps every rank in the call until its peers have
finished with its buffers. A vector under two ``part_bytes`` is one part.
"""

from __future__ import annotations

from functools import partial

from ..ir.schedule import (INPUT, OUTPUT, SCRATCH, Copy, Recv, Reduce, Region, Send, Timeline,
    chunk_bounds, slot)
from ._common import elements
from ._registry import COLLECTIVES, register
from ._window import (COPY, DEFAULT_SLOT_BYTES, SINGLE_COPY_BYTES, Barriers, await_addresses,
                      exchange, host_only, need_same_slot, node_of, read_steps,
                      reduce_as_posted, reduce_from_peers, write_to_peers)

__all__ = ["build", "cost", "embed", "INTRA", "PART_BYTES"]

INTRA = ("shared_memory", "direct")
#: the smallest part: a vector under two of them is one part, crossing nodes once per node
PART_BYTES = 4096


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
          intra="shared_memory", inter_options=(), part_bytes=PART_BYTES, single_copy=False,
          single_copy_bytes=SINGLE_COPY_BYTES):
    """Reduce-scatter inside each node, ``inter`` across nodes per part, all-gather inside
    each node (see the module docstring). ``inter_options`` are ``inter``'s options, as
    ``(name, value)`` pairs; a part holds at least ``part_bytes`` (so a tiny vector is one
    part, handled by one rank per node). ``single_copy`` (the node allows reads of a peer's
    memory) and ``single_copy_bytes`` as for ``shared_memory``: from that size on, with
    ``intra="shared_memory"``, a handler reads its parts of its node peers' inputs and
    writes the finished parts into their outputs instead of going through the window."""
    flat = _flat(inter, intra)
    nodes = tuple(tuple(n) for n in nodes) if nodes is not None else (tuple(range(size)),)
    node = node_of(rank, size, nodes)
    local, L = node.index(rank), len(node)
    largest = max(len(n) for n in nodes)
    parts = max(1, min(largest, count * itemsize // elements("part_bytes", part_bytes, 1)))
    pb = chunk_bounds(count, parts)
    mine = [j for j in range(parts) if j % L == local]
    shared = intra == "shared_memory" and L > 1
    copies = shared and single_copy and \
        count * itemsize >= elements("single_copy_bytes", single_copy_bytes, 1)
    tl = Timeline(rank, size)
    if count == 0:
        return tl.schedule(count, count)
    if size == 1:
        tl.copy(0, Region(OUTPUT, 0, count), Region(INPUT, 0, count))
        return tl.schedule(count, count)
    across = partial(_across_nodes, tl, nodes, mine, pb, itemsize, flat, inter_options)
    if copies:
        _by_reads(tl, node, len(nodes), mine, pb, itemsize, across)
    elif shared:
        window = _Window(tl, node, parts, pb, mine, slot_bytes, itemsize)
        window.gather(across(window.reduce(0)))
    else:
        _by_messages(tl, node, parts, pb, count, across)
    return tl.schedule(count, count)


def _flat(inter, intra):
    """The flat all-reduce algorithm ``inter``; a ValueError for an ``intra`` not in
    :data:`INTRA` or an ``inter`` that is not a flat all-reduce."""
    if intra not in INTRA:
        raise ValueError(f"intra={intra!r}: choose one of {', '.join(INTRA)}")
    flat = COLLECTIVES["allreduce"].get(inter)
    if flat is None or not flat.flat:
        valid = sorted(n for n, a in COLLECTIVES["allreduce"].items() if a.flat)
        raise ValueError(f"inter={inter!r}: choose a flat algorithm, one of {', '.join(valid)}")
    return flat


def _across_nodes(tl, nodes, mine, pb, itemsize, flat, inter_options, t):
    """2. All-reduce each part of ``mine`` across the nodes, among its handlers (one per
    node), from step ``t``; the next free step."""
    if len(nodes) > 1:
        built = {}
        for j in mine:
            column = [n[j % len(n)] for n in nodes]
            key = (column.index(tl.rank), pb[j + 1] - pb[j])
            if key not in built:
                built[key] = flat.build(key[0], len(nodes), key[1], itemsize,
                                        **dict(inter_options))
            t = embed(tl, t, built[key], column, pb[j])
    return t


def _by_reads(tl, node, n_nodes, mine, pb, itemsize, across):
    """The three phases by single copies: a handler reduces its parts of its node peers'
    inputs, ``across`` the nodes, then writes them into its peers' outputs."""
    rank = tl.rank
    sync = Barriers(tl, node)
    sync.begin(0)
    t = start = await_addresses(sync)
    # 1. reduce each part inside the node (on one node, each reduced chunk goes straight on
    # to the peers' outputs)
    for j in mine:
        t = reduce_from_peers(tl, t, node, rank, pb[j], pb[j + 1], itemsize, n_nodes == 1)
    t = across(t)
    # 3. every part to every rank of the node
    if n_nodes > 1:
        for j in mine:
            write_to_peers(tl, t, node, rank, pb[j], pb[j + 1] - pb[j])
            t += 1
    # every output whole, and no peer touches this rank's buffers after it; on one node
    # in shared_memory's step, which makes the two schedules one (timed once by auto)
    sync.barrier(t if n_nodes > 1 else max(t, start + read_steps(pb, itemsize)))


class _Window:
    """Phases 1 and 3 through the node window, in rounds of half a slot: each round moves
    ``q`` elements of every part."""

    def __init__(self, tl, node, parts, pb, mine, slot_bytes, itemsize):
        self.tl, self.node, self.parts, self.pb, self.mine = tl, node, parts, pb, mine
        self.sync = Barriers(tl, node)
        self.sync.begin(0)
        half = elements("slot_bytes", slot_bytes, itemsize) // 2
        if half < parts:
            raise ValueError(f"slot_bytes={slot_bytes} is too small for {parts} parts: give "
                             f"the window more bytes (MLCOMM_SHM_BYTES)")
        longest = max(pb[j + 1] - pb[j] for j in range(parts))
        self.q = q = min(half // parts, longest)  # elements of each part a round moves
        self.rounds = list(range(0, longest, q))
        # the gather goes on through the halves in turn; parts and q are every rank's
        need_same_slot(tl, 2 * parts * q, itemsize)
        self.reads = []

    def length(self, j, at):
        return max(0, min(self.q, self.pb[j + 1] - self.pb[j] - at))

    def part(self, j, at):
        """Round ``at``'s piece of part ``j`` in the output."""
        return Region(OUTPUT, self.pb[j] + at, self.length(j, at))

    def reduce(self, t):
        """1. Reduce each part inside the node, into its handler's output."""
        return exchange(self.tl, self.sync, self.parts * self.q, self.rounds, self.gather_in,
                        self.reduce_mine, t, self.reads)

    def gather(self, t):
        """3. Every part to every rank of the node."""
        return exchange(self.tl, self.sync, self.parts * self.q, self.rounds, self.publish,
                        self.copy_out, t, self.reads)

    def gather_in(self, t, c, base, at):
        for j in range(self.parts):
            self.tl.copy(t, Region(slot(self.tl.rank), base + j * self.q, self.length(j, at)),
                         Region(INPUT, self.pb[j] + at, self.length(j, at)))

    def reduce_mine(self, t, c, base, at, posted):
        step = t
        for j in self.mine:
            step = max(step, reduce_as_posted(self.tl, t, self.sync, posted, self.part(j, at),
                                              base + j * self.q, self.length(j, at)))
        return step

    def publish(self, t, c, base, at):
        for j in self.mine:
            self.tl.copy(t, Region(slot(self.tl.rank), base + j * self.q, self.length(j, at)),
                         self.part(j, at))

    def copy_out(self, t, c, base, at, posted):
        for j in range(self.parts):
            owner = self.node[j % len(self.node)]
            if owner != self.tl.rank:
                self.sync.wait(t, owner, posted)
                self.tl.copy(t, self.part(j, at),
                             Region(slot(owner), base + j * self.q, self.length(j, at)))
                t += 1
        return t + 1


def _by_messages(tl, node, parts, pb, count, across):
    """The three phases by point-to-point messages (``intra="direct"``, or one rank a
    node): parts to their handlers, ``across`` the nodes, and back."""
    t = 0
    if len(node) > 1:
        t = _direct_reduce(tl, t, node, parts, pb, 0)
    else:
        tl.copy(t, Region(OUTPUT, 0, count), Region(INPUT, 0, count))
        t += 1
    t = across(t)
    if len(node) > 1:
        _direct_gather(tl, t, node, parts, pb, 0)


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
         intra="shared_memory", inter_options=(), inter_alpha=None, inter_beta=None,
         part_bytes=PART_BYTES, single_copy=False, single_copy_bytes=SINGLE_COPY_BYTES):
    """Inside the node the window's costs (a barrier alpha/4, copies ``COPY * beta`` per
    byte: three per byte through the window, the peers' share twice with single copies);
    across the nodes ``inter``'s closed form on one part, with ``inter_alpha`` and
    ``inter_beta`` when given."""
    nodes = nodes or (tuple(range(p)),)
    n_nodes = len(nodes)
    L = max(1, min(max(len(n) for n in nodes), nbytes // part_bytes))
    part = nbytes / L
    if single_copy and intra == "shared_memory" and nbytes >= single_copy_bytes:
        local = 2 * (alpha / 4) + 2 * (L - 1) * part * COPY * beta
    else:
        local = 4 * (alpha / 4) + 3 * nbytes * COPY * beta
    local += (L - 1) * part * gamma
    if n_nodes == 1:
        return local
    flat = COLLECTIVES["allreduce"][inter]
    return local + flat.cost(n_nodes, part, inter_alpha or alpha, inter_beta or beta, gamma,
                             **dict(inter_options))


def weigh(layout, device):
    """``auto`` weighs it across nodes where some node has more than one rank: on one node
    ``shared_memory`` is the window's schedule, and with one rank a node there is no node
    phase (``inter`` alone)."""
    return layout.node_count > 1 and layout.largest > 1


register("hierarchical", "allreduce", build, cost,
         {"inter": "auto", "intra": "shared_memory", "inter_options": (),
          "part_bytes": PART_BYTES, "single_copy_bytes": SINGLE_COPY_BYTES},
         aliases=("two_level", "hier"), context=("nodes", "slot_bytes", "single_copy"),
         refuse=host_only, weigh=weigh)
