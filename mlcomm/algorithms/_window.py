"""The node window's pieces that ``shared_memory``, ``hierarchical`` and the window's other
collectives (:mod:`.shm_collectives`, :mod:`.shm_exchange`) share: the node's barriers, a
slot need the same on every rank of the node (whose area may rotate), the rounds through a
slot's two halves and the pieces copied through them, reductions of the slots as their
owners post them, single-copy reads of the peers' inputs and writes into their outputs, and
where a window algorithm applies.
"""

from __future__ import annotations

from ..ir.schedule import INPUT, OUTPUT, SCRATCH, TURN_BYTES, Region, Timeline, peer, slot
from ._common import elements

__all__ = ["node_of", "whole_node", "node_timeline", "Barriers", "need_same_slot", "rounds",
           "exchange", "through_slots", "reduce_as_posted", "await_addresses",
           "reduce_from_peers", "write_to_peers", "read_steps", "host_only", "one_node",
           "more_than_one", "window_cost", "DEFAULT_SLOT_BYTES", "SINGLE_COPY_BYTES", "READ_CHUNK_BYTES",
           "COPY"]

#: each rank's window slot when the communicator does not say (``MLCOMM_SHM_BYTES``)
DEFAULT_SLOT_BYTES = 4 << 20
#: vectors from this many bytes read their peers' inputs and write their outputs in place of
#: the window's copies, where the node allows it; below, the window's rotating areas are
#: faster (docs/performance.rst, the 16-core node: 1.2-2.1x at 64 KiB and P = 4, 8, 16)
SINGLE_COPY_BYTES = 128 << 10
#: a single-copy reduce-scatter reads a peer's part this much at a time into scratch
#: (``bench/cma_probe.py --read-chunk`` times other sizes)
READ_CHUNK_BYTES = 512 << 10
#: a copy through the window, per byte, as a fraction of beta: a message through MPI's
#: shared memory is two copies (into a shared cell and out), the window's one
COPY = 0.5


def node_of(rank: int, size: int, nodes) -> tuple:
    """The ranks of ``rank``'s node in local order (every rank when ``nodes`` is None)."""
    if nodes is None:
        return tuple(range(size))
    for node in nodes:
        if rank in node:
            return tuple(node)
    raise ValueError(f"nodes={nodes!r} does not place rank {rank}")


def whole_node(rank: int, size: int, nodes, what: str, instead: str) -> tuple:
    """:func:`node_of`, which must hold every rank: else a ValueError saying that ``what``
    needs one node, and to use ``instead``."""
    node = node_of(rank, size, nodes)
    if len(node) != size:
        raise ValueError(f"{what} needs every rank on one node; this communicator spans "
                         f"{len(nodes)} nodes: use {instead}")
    return node


def node_timeline(rank: int, size: int, nodes, what: str, instead: str):
    """:func:`whole_node`'s node, and a :class:`Timeline` for ``rank``."""
    return whole_node(rank, size, nodes, what, instead), Timeline(rank, size)


class Barriers:
    """A rank's posts on its node flag in one collective, and the awaits that pair with them."""

    def __init__(self, tl: Timeline, node: tuple):
        self.tl, self.node, self.posts = tl, node, 0
        tl.node = node

    def begin(self, t: int) -> None:
        """Wait until every rank of the node has finished the previous collective."""
        for q in self.node:
            self.tl.wait(t, q, 0)

    def take_turn(self, t: int) -> None:
        """Begin on the window's turn areas instead (``Schedule.turns``): no wait for the
        previous collective's readers, only this rank's own await that takes the flag base.
        The collective must then await a post of every other rank of the node."""
        self.tl.turns = True
        self.tl.wait(t, self.tl.rank, 0)

    def post(self, t: int) -> int:
        """Publish this rank's writes so far; return the post's number."""
        self.posts += 1
        self.tl.post(t, self.posts)
        return self.posts

    def wait(self, t: int, q: int, count: int) -> None:
        """Wait for rank ``q``'s post ``count`` (nothing for this rank's own)."""
        if q != self.tl.rank:
            self.tl.wait(t, q, count)

    def barrier(self, t: int) -> None:
        """Publish this rank's writes so far and wait for every other rank's."""
        count = self.post(t)
        for q in self.node:
            self.wait(t, q, count)

    def end(self, t: int) -> None:
        """Say that this rank has finished reading the window."""
        self.post(t)


def need_same_slot(tl: Timeline, count: int, itemsize: int) -> None:
    """Need ``count`` elements of the slot, as every rank of the node does in this
    collective. Above the turn areas' size (:data:`~mlcomm.ir.schedule.TURN_BYTES`) the
    call's area may then rotate (``Schedule.rotates``): the next of as many areas of that
    size as the slot holds, each call, the same on every rank of the node. A core's store
    into a line that another core has just read must take the line back first; one read
    many calls ago costs less (64 KiB at P = 2: 4.5 us against 10). At 4 KiB and below it
    costs more (the hand-off of bench/floor.py)."""
    tl.need_slot(count)
    tl.rotates = count * itemsize > TURN_BYTES


def rounds(tl, node, longest, slot_bytes, itemsize, parts=1):
    """The node's barriers begun, and the rounds that carry blocks of up to ``longest``
    elements through both slot halves, each half cut into ``parts`` areas: the chunk (at most
    an area) and the chunks' starts. The slot need (one half where one round does) is the
    same on every rank of the node."""
    sync = Barriers(tl, node)
    sync.begin(0)
    half = elements("slot_bytes", slot_bytes, itemsize) // 2
    chunk = max(1, min(half // parts, longest))
    starts = list(range(0, longest, chunk)) or [0]
    need_same_slot(tl, parts * chunk * (2 if len(starts) > 1 else 1), itemsize)
    return sync, chunk, starts


def reduce_as_posted(tl, t, sync, post, dst, at, count):
    """``dst = slot[node[0]] ⊕ slot[node[1]] ⊕ …`` in local order, each slot awaited (its
    owner's post ``post``) in the step that first reads it, so a rank reduces what has
    arrived while later ranks are still writing. Returns the first slot after it."""
    node = sync.node
    for k, q in enumerate(node):
        step = t + max(k - 1, 0)
        sync.wait(step, q, post)
        if k:
            tl.reduce(step, dst, Region(slot(q), at, count),
                      left=Region(slot(node[0]), at, count) if k == 1 else None)
    if len(node) == 1:
        tl.copy(t, dst, Region(slot(node[0]), at, count))
    return t + max(len(node) - 1, 1)


def exchange(tl, sync, half, starts, write, read, t=0, reads=None):
    """Rounds through the two halves of each slot (``half`` elements each): in round c every
    rank writes (``write(t, c, base, a)``, ``base`` the half's first element, ``a`` the
    round's ``starts[c]``), posts, reads once the writers it needs have posted
    (``read(t, c, base, a, posted)`` returns the next free step), and posts that it has
    read. A half is written again only after every rank's read post for it. ``reads``
    carries the read posts (and the halves' turns) on from an earlier exchange of the same
    collective. Returns the next free step."""
    reads = [] if reads is None else reads
    for a in starts:
        c = len(reads)
        base = (c % 2) * half
        if c >= 2:  # every rank has read this half two rounds ago
            for q in sync.node:
                sync.wait(t, q, reads[c - 2])
        write(t, c, base, a)
        t += 1
        posted = sync.post(t)
        t = read(t, c, base, a, posted)
        reads.append(sync.post(t))
    return t


def through_slots(tl, sync, chunk, starts, parts, writes, reads=(), read=None):
    """:func:`exchange` over halves of ``parts`` areas of ``chunk`` elements. In the round
    from element ``a`` this rank copies piece ``a:a+chunk`` of each of its ``writes``
    ``(area, input offset, length)`` into that area of its slot, and of each of its
    ``reads`` ``(owner, area, output offset, length)`` out of the owner's slot once the
    owner has posted it, a step a piece (a block shorter than ``a`` has none). ``read``,
    as :func:`exchange` takes it, replaces the reads (a reduction). Returns the next free
    step."""
    mine = slot(tl.rank)

    def write(t, c, base, a):
        for area, at, n in writes:
            m = min(chunk, n - a)
            if m > 0:
                tl.copy(t, Region(mine, base + area * chunk, m), Region(INPUT, at + a, m))

    def copy_out(t, c, base, a, posted):
        first = t
        for q, area, at, n in reads:
            m = min(chunk, n - a)
            if m > 0:
                sync.wait(t, q, posted)
                tl.copy(t, Region(OUTPUT, at + a, m), Region(slot(q), base + area * chunk, m))
                t += 1
        return max(t, first + 1)

    return exchange(tl, sync, parts * chunk, starts, write, read or copy_out)


def _read_chunks(lo, hi, itemsize):
    """``[(first element, count), ...]``: a part read :data:`READ_CHUNK_BYTES` at a time."""
    chunk = max(1, min(hi - lo, READ_CHUNK_BYTES // itemsize))
    return [(a, min(chunk, hi - a)) for a in range(lo, hi, chunk)]


def reduce_from_peers(tl, t, node, rank, lo, hi, itemsize, spread):
    """Reduce elements ``lo:hi`` of every node rank's input, in local order, into this rank's
    output, reading each peer's :data:`READ_CHUNK_BYTES` at a time into scratch; with
    ``spread``, each reduced chunk also into every peer's output, while this rank's cache
    holds it. In place, a peer's ``lo:hi`` is overwritten only by this rank, its only reader,
    after reading it. The peers' addresses must have been awaited. Returns the next free step."""
    chunks = _read_chunks(lo, hi, itemsize)
    width = max([n for _, n in chunks], default=0)
    for a, n in chunks:
        # partial results in the first scratch chunk, the last straight into the output
        # (in place, this rank's input is read before the output is written)
        total, fetched = Region(SCRATCH, 0, n), Region(SCRATCH, width, n)
        first = None
        for k, q in enumerate(node):
            operand = Region(INPUT, a, n) if q == rank else (total if k == 0 else fetched)
            if q != rank:
                tl.copy(t, operand, Region(peer(INPUT, q), a, n))
            if k:
                dst = Region(OUTPUT, a, n) if k == len(node) - 1 else total
                tl.reduce(t, dst, operand, left=first if k == 1 else total)
            first = operand
        if spread:
            write_to_peers(tl, t, node, rank, a, n)
        t += 1
    tl.need_scratch(2 * width)
    return t


def write_to_peers(tl, t, node, rank, a, n):
    """Copy this rank's output ``a:a+n`` into every other node rank's output."""
    for q in node:
        if q != rank:
            tl.copy(t, Region(peer(OUTPUT, q), a, n), Region(OUTPUT, a, n))


def read_steps(bounds, itemsize) -> int:
    """The most read chunks any one part of ``bounds`` takes (aligns the last barrier)."""
    return max(len(_read_chunks(bounds[j], bounds[j + 1], itemsize))
               for j in range(len(bounds) - 1))


def await_addresses(sync) -> int:
    """Publish this rank's buffers' addresses (post 1) and await every peer's; returns the
    first step that may read or write a peer's buffers."""
    data = sync.post(1)
    for q in sync.node:
        sync.wait(2, q, data)
    return 2


def host_only(layout, device) -> str | None:
    """Why a window algorithm cannot run: the window holds host memory, not a GPU's."""
    return "needs host buffers" if device else None


def one_node(layout, device, instead: str) -> str | None:
    """Why an algorithm of one node's window cannot run on ``layout``: :func:`host_only`,
    or ranks on more than one node (use ``instead``)."""
    nodes = layout.node_count
    return host_only(layout, device) or (f"spans {nodes} nodes (use {instead})" if nodes > 1
                                         else None)


def more_than_one(layout, device) -> bool:
    """``auto`` weighs a window collective wherever it runs on more than one rank."""
    return layout.size > 1


def window_cost(copies, parts, reductions=lambda p: 0, one_round=False, whole_send=False):
    """The closed form of a window collective whose busiest rank copies ``copies(p)`` blocks
    into or out of the window and reduces ``reductions(p)`` blocks, through halves of
    ``parts(p)`` areas of a slot (one round where ``one_round``); ``whole_send``: its
    ``nbytes`` is the rank's whole send, p blocks (the all-to-all-v's, as its flat
    algorithms take it), else one block."""
    def cost(p, nbytes, alpha, beta, gamma, nodes=None, slot_bytes=DEFAULT_SLOT_BYTES, **_):
        """A round's barrier costs about alpha/4 twice (flags in shared cache lines, no
        message: the owners' post that the readers await, and the readers' post that an
        owner awaits before it writes the half again, the previous call's in a call's first
        round, which the simulator's single call does not wait for), a copy through the
        window ``COPY * beta`` per byte (the simulator's ``copy_beta``, default beta), a
        reduction gamma per byte; ``nbytes``: a block's bytes (the uneven forms: their mean
        block), or the whole send's (``whole_send``)."""
        block = nbytes / p if whole_send else nbytes
        if p == 1:
            return block * COPY * beta
        area = max(1, slot_bytes // 2 // parts(p))
        chunks = 1 if one_round else max(1, -(-block // area))
        return 2 * chunks * alpha / 4 + copies(p) * block * COPY * beta + \
            reductions(p) * block * gamma
    return cost
