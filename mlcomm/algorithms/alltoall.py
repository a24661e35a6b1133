"""All-to-all and all-to-all-v: pairwise exchange, Bruck's algorithm, scattered batches.

Rank r's input holds one block per rank, packed in rank order; block j goes to rank j, and
block j of rank r's output is block r of rank j's input. In the all-to-all every block is
``count`` elements; in the all-to-all-v rank r's blocks are ``sendcounts`` long, rank j's
block to it ``recvcounts[j]`` (each rank knows only its own row and column). A rank's own
block is a local copy.
"""

from ..ir.schedule import INPUT, OUTPUT, SCRATCH, Region, Timeline
from ._common import check_counts, check_int, log2ceil
from ._registry import register

__all__ = ["pairwise", "bruck", "scattered", "linear", "pairwise_v", "scattered_v",
           "DEFAULT_BATCH"]

#: partners per step of ``scattered`` (MPICH's MPIR_CVAR_ALLTOALL_THROTTLE defaults to 32)
DEFAULT_BATCH = 8
_MAX_BATCH = (1 << 31) - 1


def _blocks(buffer: str, counts) -> list[Region]:
    """The packed blocks of ``counts`` in ``buffer``."""
    out, at = [], 0
    for n in counts:
        out.append(Region(buffer, at, n))
        at += n
    return out


def _check_v(rank, size, sendcounts, recvcounts):
    """This rank's validated row and column of the all-to-all-v matrix."""
    send = check_counts("sendcounts", sendcounts, size)
    recv = check_counts("recvcounts", recvcounts, size)
    if send[rank] != recv[rank]:
        raise ValueError(f"sendcounts[{rank}]={send[rank]} but recvcounts[{rank}]="
                         f"{recv[rank]}: rank {rank}'s block to itself must be as long in "
                         f"both")
    return send, recv


def _check_batch(batch) -> int:
    return check_int("batch", batch, 1, _MAX_BATCH,
                     "batch is the number of partners per step, e.g. batch=8")


# --- the exchanges, shared by the even and the uneven forms ------------------------------

def _pairwise(tl: Timeline, send: list, recv: list) -> None:
    """Own block copied in step 0; step k = 1 … p − 1 exchanges with one partner each way."""
    me, p = tl.rank, tl.size
    tl.copy(0, recv[me], send[me])
    xor = p & (p - 1) == 0
    for k in range(1, p):
        to, frm = (me ^ k, me ^ k) if xor else ((me + k) % p, (me - k) % p)
        tl.send(k, to, send[to])
        tl.recv(k, frm, recv[frm])


def _scattered(tl: Timeline, send: list, recv: list, batch: int) -> None:
    """Own block copied in step 0; partner offsets i = 1 … p − 1 in batches of ``batch``, one
    step per batch: receive from (r + i) mod p, send to (r − i) mod p."""
    me, p = tl.rank, tl.size
    tl.copy(0, recv[me], send[me])
    for i in range(1, p):
        t = 1 + (i - 1) // batch
        src, dst = (me + i) % p, (me - i) % p
        tl.recv(t, src, recv[src])
        tl.send(t, dst, send[dst])


def _even(rank, size, count):
    """A timeline and the all-to-all's input and output blocks of ``count`` each."""
    tl = Timeline(rank, size)
    return tl, _blocks(INPUT, [count] * size), _blocks(OUTPUT, [count] * size)


# --- all-to-all -------------------------------------------------------------------------

def pairwise(rank, size, count, itemsize):
    """Pairwise exchange: rank r copies its own block, then in step k = 1 … p − 1 it sends
    its block for rank r XOR k there and receives that rank's block for it (p a power of
    two), else sends to rank (r + k) mod p and receives from rank (r − k) mod p: p − 1 steps
    of one block each way."""
    tl, send, recv = _even(rank, size, count)
    _pairwise(tl, send, recv)
    return tl.schedule(size * count, size * count)


def scattered(rank, size, count, itemsize, batch=DEFAULT_BATCH):
    """Scattered exchange (MPICH's MPIR_Alltoall_intra_scattered): rank r copies its own
    block, then takes its partners at offsets i = 1 … p − 1 in batches of ``batch``
    (default 8; MPICH's MPIR_CVAR_ALLTOALL_THROTTLE defaults to 32), one step per batch;
    in a step it receives from every rank (r + i) mod p and sends to every rank (r − i)
    mod p of the batch, all at once: ⌈(p − 1)/batch⌉ steps, with the partners staggered so
    that the ranks' partners at any offset all differ."""
    batch = _check_batch(batch)
    tl, send, recv = _even(rank, size, count)
    _scattered(tl, send, recv, batch)
    return tl.schedule(size * count, size * count)


def linear(rank, size, count, itemsize):
    """Linear exchange: rank r copies its own block, then posts all p − 1 receives and p − 1
    sends in one step (partners staggered as in ``scattered``)."""
    tl, send, recv = _even(rank, size, count)
    _scattered(tl, send, recv, max(1, size - 1))
    return tl.schedule(size * count, size * count)


def _bruck_positions(p: int) -> list[list[int]]:
    """Per step k, the block positions whose index has bit k set (position 0 never moves)."""
    return [[i for i in range(1, p) if i >> k & 1] for k in range(log2ceil(p))]


def _runs(positions: list[int]):
    """``(first position, index in the list, length)`` of each run of consecutive ones."""
    out = []
    for j, i in enumerate(positions):
        if out and out[-1][0] + out[-1][2] == i:
            out[-1][2] += 1
        else:
            out.append([i, j, 1])
    return out


def bruck(rank, size, count, itemsize):
    """Bruck's all-to-all, for any p (as MPICH's MPIR_Alltoall_intra_brucks): rank r copies
    its own block to its output and rotates its other blocks up by r into scratch (position
    i holds its block for rank (r + i) mod p, two copies); in step k = 0 … ⌈log₂ p⌉ − 1 it
    sends every position whose index has bit k set to rank (r + 2^k) mod p and receives the
    same positions from rank (r − 2^k) mod p. Positions that are not one contiguous run are
    packed by copies into a send buffer first; received positions land in a receive buffer
    and are unpacked into their places. Position i then holds rank (r − i) mod p's block for
    r: the inverse rotation copies it block by block into the output, the last step's
    straight from the receive buffer."""
    tl, p, n = Timeline(rank, size), size, count
    pos = lambda i, k=1: Region(SCRATCH, (i - 1) * n, k * n)  # positions 1 ... p - 1
    out = lambda j: Region(OUTPUT, j * n, n)
    tl.copy(0, out(rank), Region(INPUT, rank * n, n))
    steps = _bruck_positions(p)
    if not steps:
        return tl.schedule(p * n, p * n)
    width = max(len(sel) for sel in steps)
    packs = max((len(sel) for sel in steps if len(_runs(sel)) > 1), default=0)
    landed = lambda j, k=1: Region(SCRATCH, (p - 1 + j) * n, k * n)
    packed = lambda j, k=1: Region(SCRATCH, (p - 1 + width + j) * n, k * n)
    tl.need_scratch((p - 1 + width + packs) * n)
    tl.copy(0, pos(1, p - 1 - rank), Region(INPUT, (rank + 1) * n, (p - 1 - rank) * n))
    tl.copy(0, pos(p - rank, rank), Region(INPUT, 0, rank * n))
    where = {}  # the final step's positions: in the receive buffer
    for k, sel in enumerate(steps):
        runs, t = _runs(sel), k + 1
        if len(runs) == 1:
            outgoing = pos(sel[0], len(sel))
        else:
            for first, j, length in runs:
                tl.copy(k, packed(j, length), pos(first, length))
            outgoing = packed(0, len(sel))
        tl.send(t, (rank + (1 << k)) % p, outgoing)
        tl.recv(t, (rank - (1 << k)) % p, landed(0, len(sel)))
        if t < len(steps):
            for first, j, length in runs:
                tl.copy(t, pos(first, length), landed(j, length))
        else:
            where = {i: landed(j) for j, i in enumerate(sel)}
    for i in range(1, p):
        tl.copy(len(steps), out((rank - i) % p), where.get(i, pos(i)))
    return tl.schedule(p * n, p * n)


# --- all-to-all-v -----------------------------------------------------------------------

def pairwise_v(rank, size, count, itemsize, sendcounts=None, recvcounts=None):
    """Pairwise exchange of uneven blocks: as the all-to-all's ``pairwise``, block j of the
    input ``sendcounts[j]`` long and rank j's block ``recvcounts[j]``; empty blocks are not
    sent. ``count`` is ignored."""
    send, recv = _check_v(rank, size, sendcounts, recvcounts)
    tl = Timeline(rank, size)
    _pairwise(tl, _blocks(INPUT, send), _blocks(OUTPUT, recv))
    return tl.schedule(sum(send), sum(recv))


def scattered_v(rank, size, count, itemsize, sendcounts=None, recvcounts=None,
                batch=DEFAULT_BATCH):
    """Scattered exchange of uneven blocks (MPICH's MPIR_Alltoallv_intra_scattered): as the
    all-to-all's ``scattered``, block j of the input ``sendcounts[j]`` long and rank j's
    block ``recvcounts[j]``; empty blocks are not sent. ``count`` is ignored."""
    send, recv = _check_v(rank, size, sendcounts, recvcounts)
    batch = _check_batch(batch)
    tl = Timeline(rank, size)
    _scattered(tl, _blocks(INPUT, send), _blocks(OUTPUT, recv), batch)
    return tl.schedule(sum(send), sum(recv))


# --- costs ------------------------------------------------------------------------------

def bruck_blocks(p: int) -> int:
    """Blocks a rank sends over Bruck's steps: the positions 1 … p − 1 counted once per set
    bit, (p/2)·log₂ p for p a power of two."""
    return sum(len(sel) for sel in _bruck_positions(p))


def _bruck_cost(p, nbytes, alpha, beta, gamma):
    """⌈log₂ p⌉ steps, each of the blocks whose position has that bit set (about p/2):
    ⌈log₂ p⌉α + (nbytes·p/2)·⌈log₂ p⌉β for p a power of two, as Thakur, Rabenseifner and
    Gropp give it. The local copies are left out, as there: the two rotations copy
    2(p − 1) blocks and each step but the last packs and unpacks about p/2 blocks."""
    return log2ceil(p) * alpha + bruck_blocks(p) * nbytes * beta


def _pairwise_cost(p, nbytes, alpha, beta, gamma):
    """(p − 1)(α + nbytes·β): p − 1 steps of one block each way."""
    return (p - 1) * (alpha + nbytes * beta)


def _scattered_cost(p, nbytes, alpha, beta, gamma, batch=DEFAULT_BATCH):
    """⌈(p − 1)/batch⌉α + (p − 1)·nbytes·β: the messages of a batch are in flight together,
    so it pays one latency per batch, while the rank's link still carries all p − 1 blocks
    one after another. This models overlapped latencies; in the single-port model (the
    simulator's default, where each message takes its port for α + nbytes·β) a batch gains
    nothing and the exchange costs pairwise's (p − 1)(α + nbytes·β)."""
    return -(-(p - 1) // batch) * alpha + (p - 1) * nbytes * beta


def _linear_cost(p, nbytes, alpha, beta, gamma):
    """One step: α + (p − 1)·nbytes·β (``scattered`` with a single batch): all p − 1
    latencies overlapped, which the single-port simulator does not model (there the step's
    messages take the port one after another, pairwise's (p − 1)(α + nbytes·β))."""
    return _scattered_cost(p, nbytes, alpha, beta, gamma, batch=max(1, p - 1))


def _pairwise_v_cost(p, nbytes, alpha, beta, gamma, sendcounts=None, recvcounts=None):
    """``pairwise``'s cost with the mean block: ``nbytes`` is the rank's whole send
    (sum(sendcounts) elements, the count the build takes), nbytes/p its mean block."""
    return _pairwise_cost(p, nbytes / p, alpha, beta, gamma)


def _scattered_v_cost(p, nbytes, alpha, beta, gamma, sendcounts=None, recvcounts=None,
                      batch=DEFAULT_BATCH):
    """``scattered``'s cost with the mean block: ``nbytes`` is the rank's whole send
    (sum(sendcounts) elements, the count the build takes), nbytes/p its mean block; a
    batch's latencies overlapped, as there."""
    return _scattered_cost(p, nbytes / p, alpha, beta, gamma, batch)


_V = {"sendcounts": None, "recvcounts": None}
register("pairwise", "alltoall", pairwise, _pairwise_cost)
register("bruck", "alltoall", bruck, _bruck_cost)
register("scattered", "alltoall", scattered, _scattered_cost, {"batch": DEFAULT_BATCH})
register("linear", "alltoall", linear, _linear_cost)
register("pairwise", "alltoallv", pairwise_v, _pairwise_v_cost, dict(_V))
register("scattered", "alltoallv", scattered_v, _scattered_v_cost,
         {**_V, "batch": DEFAULT_BATCH})
