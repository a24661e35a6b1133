"""Gathers and scatters to and from any root: linear, and the binomial tree; linear uneven
forms (gatherv, scatterv).

Blocks are packed in rank order: rank j's block starts at the exclusive prefix sum of the
counts before j (``j * count`` in the even forms). The root's own block is a local copy.

In the binomial tree ranks count from the root: rank r is ``v = (r - root) % p`` here, and
the subtree of relative rank v is the relative ranks [v, v + 2^k) for v's lowest set bit
2^k (cut at p): a subtree's blocks are contiguous in relative order. Non-root ranks hold
their subtree's blocks in scratch in that order, as MPICH's binomial gather and scatter
do. At the root the relative order is the buffer's own rotated by ``root``: each child's
subtree goes straight to or from its place there, except the one subtree that wraps past
rank p - 1, which goes through scratch, rotated into or out of place by two copies.
"""

from ..ir.schedule import INPUT, OUTPUT, SCRATCH, Region, Timeline
from ._common import check_counts, check_int, log2ceil, starts
from ._pieces import binomial_transfers
from ._registry import register

__all__ = ["gather_linear", "gather_binomial", "scatter_linear", "scatter_binomial",
           "gatherv_linear", "scatterv_linear"]


# --- options --------------------------------------------------------------------------

def _check_root(size, root):
    return check_int("root", root, 0, size - 1, "root must be a rank of the communicator")


def _check_counts(rank, size, count, root, counts):
    """``counts`` checked (:func:`._common.check_counts`, with ``counts[rank] == count``);
    None stays None off the root."""
    if counts is None and rank != root:
        return None
    return check_counts("counts", counts, size, rank, count,
                        f"the root (rank {root}) needs every rank's block length")


# --- linear ---------------------------------------------------------------------------

def _linear(rank, size, count, root, counts, gather):
    """The root receives (gather) or sends (scatter) every other rank's block of ``counts``
    in one step and copies its own; every other rank sends its input or receives its
    output, ``count`` elements."""
    tl = Timeline(rank, size)
    if rank != root:
        (tl.send if gather else tl.recv)(0, root, Region(INPUT if gather else OUTPUT, 0, count))
        return tl.schedule(count if gather else 0, 0 if gather else count)
    at = starts(counts)
    block = lambda q: Region(OUTPUT if gather else INPUT, at[q], counts[q])
    for q in range(size):
        (tl.recv if gather else tl.send)(0, q, block(q))
    if gather:
        tl.copy(0, block(root), Region(INPUT, 0, count))
    else:
        tl.copy(0, Region(OUTPUT, 0, count), block(root))
    return tl.schedule(count if gather else at[-1], at[-1] if gather else count)


def gather_linear(rank, size, count, itemsize, root=0):
    """Linear gather: the root posts the p - 1 other ranks' receives in one step, block j
    into output block j, and copies its own input into its block."""
    _check_root(size, root)
    return _linear(rank, size, count, root, (count,) * size, gather=True)


def scatter_linear(rank, size, count, itemsize, root=0):
    """Linear scatter: the root posts the p - 1 sends of input block j to rank j in one
    step, and copies its own block into its output."""
    _check_root(size, root)
    return _linear(rank, size, count, root, (count,) * size, gather=False)


def gatherv_linear(rank, size, count, itemsize, root=0, counts=None):
    """Linear gather of uneven blocks: the root posts the other ranks' receives in one step,
    rank j's ``counts[j]`` elements at the prefix sum of the counts before j, and copies its
    own; empty blocks move nothing."""
    _check_root(size, root)
    counts = _check_counts(rank, size, count, root, counts)
    return _linear(rank, size, count, root, counts, gather=True)


def scatterv_linear(rank, size, count, itemsize, root=0, counts=None):
    """Linear scatter of uneven blocks: the root posts the sends of its input's block j
    (``counts[j]`` elements at the prefix sum of the counts before j) to rank j in one step,
    and copies its own block into its output; empty blocks move nothing."""
    _check_root(size, root)
    counts = _check_counts(rank, size, count, root, counts)
    return _linear(rank, size, count, root, counts, gather=False)


# --- binomial -------------------------------------------------------------------------

def _at_root(size, count, root, lo, hi):
    """Where relative ranks [lo, hi) of the root's tree lie in the root's packed buffer:
    ``[(offset within the subtree, absolute offset, length)]``, one piece, or two where the
    subtree wraps past rank p - 1."""
    a, n = (lo + root) % size, hi - lo
    first = min(n, size - a)
    pieces = [(0, a * count, first * count)]
    if first < n:
        pieces.append((first * count, 0, (n - first) * count))
    return pieces


def _tree(rank, size, count, root, gather):
    """The timeline, this rank's relative rank, its tree transfers, and the region of its
    subtree's blocks at non-root ranks that have children (None elsewhere)."""
    _check_root(size, root)
    tl, v = Timeline(rank, size), (rank - root) % size
    transfers = binomial_transfers(size, v, down=not gather)
    held = None
    if v and any(peer > v for _, peer, _, _, _ in transfers):
        hi = next(hi for _, peer, _, hi, _ in transfers if peer < v)  # the parent's edge
        held = Region(SCRATCH, 0, (hi - v) * count)
        tl.need_scratch(held.count)
    return tl, v, transfers, held


def gather_binomial(rank, size, count, itemsize, root=0):
    """Binomial gather: ceil(log2 p) rounds; in round k every rank whose relative rank is an
    odd multiple of 2^k sends its subtree's 2^k blocks (fewer where cut at p), held in
    scratch in relative order, to the rank 2^k before it. The root lands each subtree in its
    place in the output; the subtree that wraps past rank p - 1 lands in scratch and two
    copies rotate it into place."""
    tl, v, transfers, held = _tree(rank, size, count, root, gather=True)
    mine = Region(INPUT, 0, count)
    if v == 0:
        tl.copy(0, Region(OUTPUT, root * count, count), mine)
    elif held is not None:
        tl.copy(0, held.sub(0, count), mine)
    for t, peer, lo, hi, receives in transfers:
        peer = (peer + root) % size
        if not receives:
            tl.send(t, peer, mine if held is None else held)
        elif v:
            tl.recv(t, peer, held.sub((lo - v) * count, (hi - lo) * count))
        else:
            _at_root_transfer(tl, t, peer, size, count, root, lo, hi, gather=True)
    return tl.schedule(count, size * count if v == 0 else 0)


def _at_root_transfer(tl, t, peer, size, count, root, lo, hi, gather):
    """The root's message of blocks ``lo:hi`` (counted from the root) with ``peer``: straight
    into its output (from its input, for a scatter) where they lie in one piece; else
    through scratch, which a gather unpacks after the step and a scatter packs in step 0."""
    pieces = _at_root(size, count, root, lo, hi)
    if len(pieces) == 1:
        region = Region(OUTPUT if gather else INPUT, pieces[0][1], pieces[0][2])
        (tl.recv if gather else tl.send)(t, peer, region)
        return
    staged = Region(SCRATCH, 0, (hi - lo) * count)
    tl.need_scratch(staged.count)
    if gather:
        tl.recv(t, peer, staged)
    for within, at, n in pieces:
        if gather:
            tl.copy(t, Region(OUTPUT, at, n), staged.sub(within, n))
        else:
            tl.copy(0, staged.sub(within, n), Region(INPUT, at, n))
    if not gather:
        tl.send(t, peer, staged)


def scatter_binomial(rank, size, count, itemsize, root=0):
    """Binomial scatter: ceil(log2 p) rounds; in round k every rank that holds its subtree's
    blocks sends the rank 2^(ceil(log2 p) - 1 - k) after it (counted from the root) that
    rank's subtree of blocks, in relative order; a rank with children receives its subtree
    into scratch and copies its own block out. The root sends straight from its input,
    except the subtree that wraps past rank p - 1, which two copies first rotate into
    scratch."""
    tl, v, transfers, held = _tree(rank, size, count, root, gather=False)
    mine = Region(OUTPUT, 0, count)
    if v == 0:
        tl.copy(0, mine, Region(INPUT, root * count, count))
    for t, peer, lo, hi, receives in transfers:
        peer, t = (peer + root) % size, t + 1  # step 0: the root's copies
        if receives:
            tl.recv(t, peer, mine if held is None else held)
            if held is not None:
                tl.copy(t, mine, held.sub(0, count))
        elif v:
            tl.send(t, peer, held.sub((lo - v) * count, (hi - lo) * count))
        else:
            _at_root_transfer(tl, t, peer, size, count, root, lo, hi, gather=False)
    return tl.schedule(size * count if v == 0 else 0, count)


# --- costs (Thakur, Rabenseifner & Gropp 2005; nbytes: one rank's block) -----------------

def linear_cost(p, nbytes, alpha, beta, gamma, root=0):
    """The root's p - 1 messages of one block each, one after the other."""
    return (p - 1) * (alpha + nbytes * beta)


def binomial_cost(p, nbytes, alpha, beta, gamma, root=0):
    """ceil(log2 p) rounds; the root moves the p - 1 other blocks."""
    return log2ceil(p) * alpha + (p - 1) * nbytes * beta


def linear_v_cost(p, nbytes, alpha, beta, gamma, root=0, counts=None):
    """As the linear even form, with ``nbytes`` the mean block's bytes (the counts add
    nothing to it: their mean is what ``nbytes`` gives)."""
    return linear_cost(p, nbytes, alpha, beta, gamma)


for _collective, _linear_build, _binomial_build in (
        ("gather", gather_linear, gather_binomial),
        ("scatter", scatter_linear, scatter_binomial)):
    register("linear", _collective, _linear_build, linear_cost, {"root": 0})
    register("binomial", _collective, _binomial_build, binomial_cost, {"root": 0})
register("linear", "gatherv", gatherv_linear, linear_v_cost, {"root": 0, "counts": None})
register("linear", "scatterv", scatterv_linear, linear_v_cost, {"root": 0, "counts": None})
