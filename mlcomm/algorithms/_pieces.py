"""Building blocks shared by the algorithms: each adds its steps to a Timeline.

Every piece takes the slot to start at and returns the first free slot after
it, so pieces compose in sequence; tree pieces use absolute slots so that two
trees can share the same slots.
"""

from __future__ import annotations

from functools import lru_cache

from ..ir.schedule import INPUT, OUTPUT, SCRATCH, Region, Timeline

__all__ = [
    "segments", "chunks", "gather_reduce", "scatter_results",
    "ring_reduce_scatter", "ring_allgather",
    "Tree", "binary_tree", "tree_reduce", "tree_bcast", "binomial_transfers",
    "fold", "real_rank", "halving", "unfold",
]


def segments(region: Region, seg: int, nseg: int) -> list[Region]:
    """Cut ``region`` into ``nseg`` pieces of ``seg`` elements (trailing ones may be empty)."""
    if nseg == 1:
        return [region]
    out = []
    for j in range(nseg):
        lo = min(j * seg, region.count)
        hi = min(lo + seg, region.count)
        out.append(region.sub(lo, hi - lo))
    return out


# --- direct (naive, single master, parameter server) --------------------------

def gather_reduce(tl: Timeline, t: int, targets) -> int:
    """Every rank sends ``input[a:b]`` to each target; a target reduces all p in rank order.

    ``targets`` is a list of ``(target_rank, a, b)``.  The target's result goes
    to ``output[a:b]``.  Own data is staged through scratch when the target is
    not rank 0, so that an in-place call never overwrites it before use.
    """
    me, p = tl.rank, tl.size
    for target, a, b in targets:
        n = b - a
        if target != me:
            tl.send(t, target, Region(INPUT, a, n))
            continue
        slot = [Region(SCRATCH, q * n, n) for q in range(p)]
        tl.need_scratch(p * n)
        for q in range(p):
            tl.recv(t, q, slot[q])
        parts = [Region(INPUT, a, n) if q == me == 0 else slot[q] for q in range(p)]
        if me != 0:
            tl.copy(t, slot[me], Region(INPUT, a, n))
        out = Region(OUTPUT, a, n)
        if p == 1:
            tl.copy(t, out, parts[0])
        for q in range(1, p):  # the first reduce reads parts[0] itself: no copy into out
            tl.reduce(t, out, parts[q], left=parts[0] if q == 1 else None)
    return t + 1


def scatter_results(tl: Timeline, t: int, targets) -> int:
    """Each target sends its ``output[a:b]`` to every other rank."""
    me, p = tl.rank, tl.size
    for target, a, b in targets:
        region = Region(OUTPUT, a, b - a)
        if target == me:
            for q in range(p):
                tl.send(t, q, region)
        else:
            tl.recv(t, target, region)
    return t + 1


# --- ring -------------------------------------------------------------------

def ring_reduce_scatter(tl: Timeline, t: int, bounds, seg: int | None = None,
                        dst_offset: int = None) -> int:
    """Reduce-scatter of ``input`` around the ring; rank r ends with block r.

    ``bounds`` are the p+1 block offsets into ``input``.  Block r's result is
    written to ``output`` at ``dst_offset``.  With ``seg`` each ring step is
    cut into segments of at most ``seg`` elements.

    Without ``dst_offset`` (an all-reduce) partial sums build up in their own
    blocks of ``output``, which the all-gather overwrites later, and only
    the incoming segments land in scratch, in two alternating slots: scratch
    is two segments, and a segment's reduction may overlap the next
    transfer.  With ``dst_offset`` the partial sums travel through two
    block-sized scratch slots and the last step reduces into ``output``.
    """
    me, p = tl.rank, tl.size
    right, left = (me + 1) % p, (me - 1) % p
    block = [Region(INPUT, bounds[i], bounds[i + 1] - bounds[i]) for i in range(p)]
    width = max(b.count for b in block)
    in_output = dst_offset is None
    dst = Region(OUTPUT, block[me].offset if in_output else dst_offset, block[me].count)
    if p == 1:
        tl.copy(t, dst, block[0])
        return t + 1
    seg = seg or max(width, 1)
    nseg = max(1, -(-width // seg))
    if in_output:
        partial = [Region(OUTPUT, b.offset, b.count) for b in block]
        span = min(seg, width)
        tl.need_scratch(2 * span if nseg > 1 else width)
    else:
        slots = [Region(SCRATCH, 0, width), Region(SCRATCH, width, width)]
        tl.need_scratch(2 * width)
    n = 0  # segments so far: the landing slot alternates per segment
    for k in range(p - 1):
        send_i, recv_i = (me - k - 1) % p, (me - k - 2) % p
        if in_output:
            outgoing = block[send_i] if k == 0 else partial[send_i]
            result = partial[recv_i]
        else:
            outgoing = block[send_i] if k == 0 else slots[(k - 1) % 2].sub(0, block[send_i].count)
            result = dst if k == p - 2 else slots[k % 2].sub(0, block[recv_i].count)
        for so, own, res in zip(segments(outgoing, seg, nseg), segments(block[recv_i], seg, nseg),
                                segments(result, seg, nseg)):
            ri = Region(SCRATCH, (n % 2) * span if nseg > 1 else 0, own.count) if in_output else \
                slots[k % 2].sub(res.offset - result.offset, own.count)
            tl.send(t, right, so)
            tl.recv(t, left, ri)
            tl.reduce(t, res, own, left=ri)
            t, n = t + 1, n + 1
    return t


def ring_allgather(tl: Timeline, t: int, bounds, seg: int | None = None,
                   shift: int = 0) -> int:
    """All-gather of ``output`` blocks around the ring; rank r starts with block
    ``(r - shift) % p``."""
    me, p = tl.rank, tl.size
    right, left = (me + 1) % p, (me - 1) % p
    block = [Region(OUTPUT, bounds[j], bounds[j + 1] - bounds[j])
             for j in ((i - shift) % p for i in range(p))]
    width = max(b.count for b in block)
    seg = seg or max(width, 1)
    nseg = max(1, -(-width // seg))
    for k in range(p - 1):
        for so, ri in zip(segments(block[(me - k) % p], seg, nseg),
                          segments(block[(me - k - 1) % p], seg, nseg)):
            tl.send(t, right, so)
            tl.recv(t, left, ri)
            t += 1
    return t


# --- trees ------------------------------------------------------------------

class Tree:
    """A rooted tree over ranks: parent, children, subtree height and depth."""

    def __init__(self, parent: list):
        p = len(parent)
        self.parent = parent
        self.children = [[] for _ in range(p)]
        for r, up in enumerate(parent):
            if up is not None:
                self.children[up].append(r)
        self.root = parent.index(None)
        self.depth = [0] * p
        order = [self.root]
        for r in order:
            for c in self.children[r]:
                self.depth[c] = self.depth[r] + 1
                order.append(c)
        self.height = [0] * p
        for r in reversed(order):
            if self.children[r]:
                self.height[r] = 1 + max(self.height[c] for c in self.children[r])

    def interior(self) -> set:
        return {r for r in range(len(self.parent)) if self.children[r]}


@lru_cache(maxsize=64)
def _inorder_parents(p: int) -> tuple:
    """Parents of the in-order binary tree on 0..p-1 with root 0 (odd ranks are leaves)."""
    parent = [None] * p
    for r in range(1, p):
        low = r & -r
        up = (r - low) | (low << 1)
        parent[r] = up if up < p else r - low
    return tuple(parent)


@lru_cache(maxsize=64)
def binary_tree(p: int, flavour: int = 0, root: int = 0) -> Tree:
    """Binary tree on p ranks.

    ``flavour=0`` is the in-order tree rooted at ``root`` (ranks relabelled
    by ``(r - root) % p``).  ``flavour=1`` is its complement for the double
    binary tree: mirrored (``p-1-r``) for even p, shifted by one for odd p, so
    that the leaves of one tree are the interior ranks of the other.
    """
    base = _inorder_parents(p)
    if flavour == 0:
        to_tree = lambda r: (r - root) % p
        from_tree = lambda v: (v + root) % p
    elif p % 2 == 0:
        to_tree = from_tree = lambda r: p - 1 - r
    else:
        to_tree = lambda r: (r - 1) % p
        from_tree = lambda v: (v + 1) % p
    parent = [None] * p
    for r in range(p):
        up = base[to_tree(r)]
        parent[r] = None if up is None else from_tree(up)
    return Tree(parent)


def chunks(region: Region, chunk: int | None) -> list[Region]:
    """Cut ``region`` into near-equal pieces of at most ``chunk`` elements (None: one piece)."""
    n = max(1, -(-region.count // chunk)) if chunk else 1
    return segments(region, -(-region.count // n) if region.count else 0, n)


def tree_reduce(tl: Timeline, t0: int, tree: Tree, acc: Region, chunk: int,
                scratch_at: int, source: Region | None = None) -> int:
    """Pipelined reduce of ``acc`` up ``tree``; the root's ``acc`` ends with the result.

    Chunk c leaves a rank of height h at slot ``t0 + c + h``, so every pair of
    ranks posts its matching transfers in the same slot.  Each child's
    partial lands in its own scratch slot at ``scratch_at``.  With ``source``
    (this rank's contribution, when ``acc`` does not hold it yet) the first
    reduction reads it where it lies, and a leaf sends it as it is.  Returns
    the slot at which the root may start broadcasting chunk 0.
    """
    me = tl.rank
    pieces = chunks(acc, chunk)
    own = pieces if source is None else chunks(source, chunk)
    width = max(c.count for c in pieces)
    kids = tree.children[me]
    tl.need_scratch(scratch_at + len(kids) * width)
    first = min(kids, key=tree.height.__getitem__, default=None)  # the first to arrive
    for c, (piece, mine) in enumerate(zip(pieces, own)):
        for i, kid in enumerate(kids):
            t = t0 + c + tree.height[kid]
            landing = Region(SCRATCH, scratch_at + i * width, piece.count)
            tl.recv(t, kid, landing)
            tl.reduce(t, piece, landing, left=mine if kid == first else None)
        if tree.parent[me] is not None:
            tl.send(t0 + c + tree.height[me], tree.parent[me], piece if kids else mine)
        elif not kids:  # a lone root: the result is its own contribution
            tl.copy(t0 + c, piece, mine)
    return t0 + tree.height[tree.root]


def tree_bcast(tl: Timeline, t0: int, tree: Tree, buf: Region, chunk: int) -> int:
    """Pipelined broadcast of the root's ``buf`` down ``tree``; returns the first free slot."""
    me = tl.rank
    pieces = chunks(buf, chunk)
    d = tree.depth[me]
    for c, piece in enumerate(pieces):
        if tree.parent[me] is not None:
            tl.recv(t0 + c + d - 1, tree.parent[me], piece)
        for kid in tree.children[me]:
            tl.send(t0 + c + d, kid, piece)
    return t0 + len(pieces) + max(tree.depth)


def binomial_transfers(p: int, v: int, down: bool):
    """Relative rank ``v``'s transfers in the binomial tree on relative ranks 0..p-1 rooted
    at 0, in round order: ``(round, peer, lo, hi, receives)``.

    The parent of v is v less its lowest set bit m; its children are v + 2^k for every
    2^k below m (every 2^k below p at the root). An edge carries the child's subtree, the
    relative ranks [lo, hi). The edge of 2^k is round k going up (``down=False``: a reduce
    or a gather, leaves first) and round ceil(log2 p) - 1 - k going down (a broadcast or a
    scatter, root first): ceil(log2 p) rounds.
    """
    top = (p - 1).bit_length()
    when = (lambda m: top - m.bit_length()) if down else (lambda m: m.bit_length() - 1)
    up = v & -v
    out = [] if v == 0 else [(when(up), v - up, v, min(v + up, p), down)]
    m = 1
    while m < (up or 1 << top) and v + m < p:
        out.append((when(m), v + m, v + m, min(v + 2 * m, p), not down))
        m <<= 1
    return sorted(out)


# --- fold for non-power-of-two p (recursive doubling / halving) ---------------

def fold(tl: Timeline, t: int, n: int, into: Region | None = None, shift: int = 0
         ) -> tuple[int | None, int, int, Region | None]:
    """Fold p ranks onto the largest power of two p2 <= p.

    Ranks count from ``shift``: rank r is ``(r - shift) % p`` here. The first
    ``2*(p-p2)`` pair up: even ones send their vector to the odd neighbour and sit out;
    the odd one lands it in scratch and reduces it with its own into ``into`` (default
    ``output``). Returns ``(new_rank or None, p2, next slot, contribution)``: the region
    holding this rank's (possibly folded) vector, ``into`` after a fold, else ``input``
    itself (nothing is copied).
    """
    p = tl.size
    me = (tl.rank - shift) % p
    p2 = 1 << (p.bit_length() - 1)
    extra = p - p2
    whole, own = into or Region(OUTPUT, 0, n), Region(INPUT, 0, n)
    if me < 2 * extra and me % 2 == 0:
        tl.send(t, (tl.rank + 1) % p, own)
        return None, p2, t + 1, None
    if me < 2 * extra:
        tl.need_scratch(n)
        tl.recv(t, (tl.rank - 1) % p, Region(SCRATCH, 0, n))
        tl.reduce(t, whole, Region(SCRATCH, 0, n), left=own)
        return me // 2, p2, t + 1, whole
    return me - extra, p2, t + 1, own


def real_rank(new_rank: int, p: int, shift: int = 0) -> int:
    """Map a rank of the folded power-of-two group back to its communicator rank (ranks
    counted from ``shift``, as in :func:`fold`)."""
    extra = p - (1 << (p.bit_length() - 1))
    return ((2 * new_rank + 1 if new_rank < extra else new_rank + extra) + shift) % p


def halving(tl: Timeline, t: int, new: int, p2: int, bounds, contrib: str, acc,
            landing_at: int, result: Region | None = None, shift: int = 0) -> int:
    """Recursive halving over the folded group of ``p2`` ranks, this rank ``new`` in it.

    ``bounds`` are the p2+1 offsets of the group's chunks. Each round a rank sends its
    partner the half of its window that the partner keeps, and reduces what it receives
    into the half it keeps: new rank i ends with chunk i reduced. The first round reads
    this rank's contribution from buffer ``contrib`` at the chunks' offsets;
    ``acc(lo, hi)`` is the region of the partial sums of chunks lo..hi-1 (a window's halves
    lie within it); incoming halves land in scratch at ``landing_at``; the last round
    writes ``result`` (default ``acc`` of the last chunk); ranks count from ``shift``, as
    in :func:`fold`. Returns the next free slot.
    """
    span = lambda lo, hi: Region(contrib, bounds[lo], bounds[hi] - bounds[lo])
    lo, hi, mask = 0, p2, p2 >> 1
    while mask:
        peer = real_rank(new ^ mask, tl.size, shift)
        mid = (lo + hi) // 2
        keep, give = ((mid, hi), (lo, mid)) if new & mask else ((lo, mid), (mid, hi))
        kept = result if mask == 1 and result is not None else acc(*keep)
        landing = Region(SCRATCH, landing_at, kept.count)
        tl.send(t, peer, span(*give))
        tl.recv(t, peer, landing)
        tl.reduce(t, kept, landing, left=span(*keep))
        lo, hi = keep
        span, mask, t = acc, mask >> 1, t + 1
    return t


def unfold(tl: Timeline, t: int, n: int, sent: Region | None = None) -> int:
    """Send the result back to the ranks that sat out the fold: ``sent`` (default the
    whole ``output``) lands in their ``output``."""
    me, p = tl.rank, tl.size
    extra = p - (1 << (p.bit_length() - 1))
    whole = Region(OUTPUT, 0, n)
    if me < 2 * extra:
        if me % 2 == 0:
            tl.recv(t, me + 1, whole)
        else:
            tl.send(t, me - 1, sent or whole)
    return t + 1

