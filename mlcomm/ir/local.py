"""Local executor: run every rank's schedule in one process on NumPy arrays.

It matches messages as MPI does (FIFO per ordered pair of ranks), completes a
step when all its transfers are matched (rendezvous: the strictest case), and
reports deadlocks, mis-sized or out-of-bounds messages, hazards inside a step
and reads of never-written output or scratch.  :func:`check_collective`
proves a schedule exactly: each rank's contribution is tagged so that every
output element must hold every expected contribution exactly once.

The node window is modelled too: every rank owns a slot that only it writes and the
ranks of its node read. Posts and awaits order those accesses; vector clocks check
every one whatever the interleaving: a read of a slot element whose write no await has
made visible, an overwrite of an element a peer may still be reading, a slot written
before the first step's awaits, a window read after the rank's last post, unequal post
counts within a node, or a slot of another node are all errors. A schedule with ``turns``
(its slots are the window's turn areas) may write its slot once it has awaited itself with
count 0, and must await a post of every other rank of its node. One that ``rotates`` must
rotate on every rank of its node, with the same slot need. Reads of a node peer's
input or output (``input@R``, ``output@R``) are checked alike: what they read must be the
peer's input untouched or its output written and made visible, after an await of one of
the peer's posts in the collective (which publishes its buffers' addresses), the peer must not overwrite
what a reader may still be reading, nor finish its collective before an await has shown
it every read of its buffers. Writes into a node peer's output (a copy to ``output@R``)
too: after such an await, never over what another rank may still be reading or what the
peer itself writes, and seen by an await before the peer reads them or finishes.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from .access import ScheduleError, _check_hazards, _Rank, _window
from .schedule import OUTPUT, Await, Copy, Post, Recv, Reduce, Send

__all__ = ["ScheduleError", "run_local", "check_collective", "tagged_inputs"]


def run_local(schedules, inputs, reduce=np.add, in_place=False):
    """Run all ranks' schedules; return each rank's output array, and how many of its output
    elements no step wrote.

    ``inputs[r]`` has ``schedules[r].input_count`` rows (extra trailing axes
    ride along).  ``reduce(dst, src, out=dst)`` is the reduction ufunc.
    """
    p = len(schedules)
    first = np.asarray(inputs[0])
    ranks = [_Rank(s, np.array(x, copy=True), in_place, first.dtype, first.shape[1:], p)
             for s, x in zip(schedules, inputs)]
    _window(ranks, p, first.dtype, first.shape[1:])
    for k in ranks:
        k.ranks = ranks
    run = _Run(ranks, reduce)
    for r in range(p):
        run.post(r)
    run.drain()
    _check_stuck(ranks)
    for k in ranks:
        _check_end(k, ranks)
    return [k.bufs[OUTPUT] for k in ranks], [getattr(k, "unwritten", 0) for k in ranks]


class _Run:
    """The ranks' steps in motion: messages waiting for their match, ranks waiting for a
    post, and the ranks whose step has completed (``ready``) to run its local ops."""

    def __init__(self, ranks, reduce):
        self.ranks, self.p, self.reduce = ranks, len(ranks), reduce
        self.sends, self.recvs = {}, {}
        self.awaiting = {}  # (peer, count) -> ranks waiting for that post
        self.ready = deque()

    def done_one(self, rank_id):
        self.ranks[rank_id].pending -= 1
        if self.ranks[rank_id].pending == 0:
            self.ready.append(rank_id)

    def see(self, rank, peer, count):
        """An await completed: what ``peer`` published with its post is visible now."""
        np.maximum(rank.clock, self.ranks[peer].posts[count - 1], out=rank.clock)
        rank.seen.add(peer)

    def post(self, r):
        """Start rank ``r``'s next step: its posts, awaits and messages."""
        rank = self.ranks[r]
        if rank.step >= len(rank.schedule.steps):
            return
        step = rank.schedule.steps[rank.step]
        _check_hazards(rank, step)
        rank.clock[r] = rank.step
        self._publish(r, rank, step)
        waits = [t for t in step.transfers if isinstance(t, Await)]
        messages = [t for t in step.transfers if isinstance(t, (Send, Recv))]
        rank.pending = len(waits) + len(messages) + 1  # + 1: this call's own completion
        for t in step.transfers:  # wake the ranks that wait for this rank's new posts
            if isinstance(t, Post):
                for waiter in self.awaiting.pop((r, t.count), []):
                    self.see(self.ranks[waiter], r, t.count)
                    self.done_one(waiter)
        for t in waits:
            self._await(r, rank, t)
        for t in messages:
            self._message(r, rank, t)
        self.done_one(r)

    def _publish(self, r, rank, step):
        """The clocks that the posts of rank ``r``'s ``step`` publish."""
        for t in step.transfers:
            if isinstance(t, Post):
                if t.count != len(rank.posts) + 1:
                    raise ScheduleError(f"rank {r} step {rank.step}: post {t.count}, expected "
                                        f"{len(rank.posts) + 1}")
                published = rank.clock.copy()
                published[r] = rank.step - 1  # the writes of the steps before this one
                rank.posts.append(published)
                rank.last_post = rank.step

    def _await(self, r, rank, t):
        """Rank ``r``'s await ``t``: done now, or waiting for the peer's post."""
        node = rank.schedule.node
        if t.peer not in node:
            raise ScheduleError(f"rank {r} step {rank.step}: awaits rank {t.peer}, not of "
                                f"its node {node}")
        if t.count == 0:
            rank.guarded.add(t.peer)
            rank.pending -= 1
        elif len(self.ranks[t.peer].posts) >= t.count:
            self.see(rank, t.peer, t.count)
            rank.pending -= 1
        else:
            self.awaiting.setdefault((t.peer, t.count), []).append(r)

    def _message(self, r, rank, t):
        """Rank ``r``'s send or receive ``t``: matched with the peer's first waiting one, or
        waiting in turn (FIFO per ordered pair of ranks)."""
        if not 0 <= t.peer < self.p or t.peer == r:
            raise ScheduleError(f"rank {r} step {rank.step}: bad peer {t.peer}")
        key = (r, t.peer) if isinstance(t, Send) else (t.peer, r)
        mine, theirs = (self.sends, self.recvs) if isinstance(t, Send) else \
            (self.recvs, self.sends)
        waiting = theirs.get(key)
        if waiting:
            other = waiting.popleft()
            self.match(*((r, t, other[0], other[1]) if isinstance(t, Send)
                         else (other[0], other[1], r, t)))
        else:
            mine.setdefault(key, deque()).append((r, t))

    def match(self, src, send, dst, recv):
        a, b = self.ranks[src], self.ranks[dst]
        if send.region.count != recv.region.count:
            raise ScheduleError(f"message rank {src} -> {dst}: sent {send.region.count} elements "
                                f"({a.where(send.region)}) but receive posted for "
                                f"{recv.region.count} ({b.where(recv.region)})")
        b.view(recv.region, writing=True)[...] = a.read(send.region)
        b.mark(recv.region)
        self.done_one(src)
        self.done_one(dst)

    def drain(self):
        """Run the local ops of each completed step, then start the rank's next step."""
        while self.ready:
            r = self.ready.popleft()
            rank = self.ranks[r]
            _run_ops(rank, rank.schedule.steps[rank.step].ops, self.reduce)
            rank.step += 1
            self.post(r)


def _run_ops(rank, ops, reduce):
    """A step's local ops on ``rank``, in order."""
    for op in ops:
        src = rank.read(op.src)
        if isinstance(op, Reduce):
            if op.first.count != op.dst.count or src.shape[0] != op.dst.count:
                raise ScheduleError(f"{rank.where(op.dst)}: reduce of mismatched regions")
            first = rank.read(op.first)
            reduce(first, src, out=rank.view(op.dst, writing=True))
        elif isinstance(op, Copy):
            if op.src.count != op.dst.count:
                raise ScheduleError(f"{rank.where(op.dst)}: copy of {op.src.count} elements")
            dst = rank.view(op.dst, writing=True)
            if not np.shares_memory(dst, src) or \
                    dst.__array_interface__ != src.__array_interface__:
                dst[...] = src
        rank.mark(op.dst)


def _check_stuck(ranks):
    """A deadlock: ranks left with steps that never completed."""
    stuck = [k for k in ranks if k.step < len(k.schedule.steps)]
    if stuck:
        lines = [f"rank {k.schedule.rank} blocked at step {k.step} of {len(k.schedule.steps)}: "
                 f"{k.schedule.steps[k.step].transfers}" for k in stuck[:8]]
        raise ScheduleError("deadlock:\n" + "\n".join(lines))


def _check_end(k, ranks):
    """Rank ``k``'s collective as it ends: its node's posts, its peers' reads and writes of
    its buffers, its turns and window reads; its unwritten output elements counted."""
    node = k.schedule.node
    if node and len({len(ranks[q].posts) for q in node}) > 1:
        raise ScheduleError(f"node {node}: ranks post {[len(ranks[q].posts) for q in node]} "
                            f"times; every rank of a node must post equally often")
    for q, reads in k.read_by.items():
        if any(r[3] > k.clock[q] for r in reads):
            raise ScheduleError(f"rank {k.schedule.rank} ends its collective while rank "
                                f"{q} may still be reading its buffers")
    for w, lo, hi, step in k.written_by:
        if step > k.clock[w]:
            raise ScheduleError(f"rank {k.schedule.rank} ends its collective before an "
                                f"await has shown it rank {w}'s write of its "
                                f"output[{lo}:{hi}]")
    unseen = set(node) - k.seen - {k.schedule.rank}
    if k.schedule.turns and unseen:
        raise ScheduleError(f"rank {k.schedule.rank} takes a turn without awaiting a "
                            f"post of ranks {sorted(unseen)}: two turns on, it could "
                            f"overwrite its turn area while they read it")
    if k.last_window_read >= 0 and k.last_window_read >= getattr(k, "last_post", -1):
        raise ScheduleError(f"rank {k.schedule.rank} reads the window at step "
                            f"{k.last_window_read} after its last post: the next "
                            f"collective could overwrite what it reads")
    mask = k.written[OUTPUT]
    if mask is not None and k.schedule.output_count and not mask.all():
        k.unwritten = int((~mask).sum())


# --- exact checks -------------------------------------------------------------

_EXACT_LIMIT = 4_000_000


def tagged_inputs(p, counts, seed=0):
    """Inputs that make every contribution traceable.

    Small cases: rank r's element i is the row ``(i+1) * e_r`` of length p, so a
    correct sum has ``i+1`` in every column.  Large cases: random uint64 tags
    (wrapping sums), where any lost, doubled or misplaced contribution
    changes the result except with probability 2**-64.
    """
    if sum(counts) * p <= _EXACT_LIMIT:
        out = []
        for r, n in enumerate(counts):
            x = np.zeros((n, p), np.int64)
            x[:, r] = np.arange(1, n + 1)
            out.append(x)
        return out
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 2**63, size=n, dtype=np.uint64) for n in counts]


def _expected(collective, p, inputs, root, counts=None):
    """Every rank's exact output (None where it has none); ``counts`` as
    :func:`check_collective` takes them."""
    total = lambda rows: np.add.reduce(np.stack(rows), axis=0)
    if collective in ("allreduce", "reduce"):
        result = total(inputs)
        return [result if collective == "allreduce" or r == root else None for r in range(p)]
    if collective in ("reduce_scatter", "reduce_scatter_v"):
        result = total(inputs)
        at = _starts(counts or [len(result) // p] * p)
        return [result[at[r]:at[r + 1]] for r in range(p)]
    if collective in ("allgather", "allgatherv"):
        result = np.concatenate(inputs)
        return [result] * p
    if collective == "bcast":
        return [inputs[root]] * p
    if collective in ("gather", "gatherv"):
        return [np.concatenate(inputs) if r == root else None for r in range(p)]
    if collective in ("scatter", "scatterv"):
        at = _starts(counts or [len(inputs[root]) // p] * p)
        return [inputs[root][at[r]:at[r + 1]] for r in range(p)]
    if collective in ("alltoall", "alltoallv"):
        matrix = counts or [[len(inputs[0]) // p] * p] * p
        at = [_starts(row) for row in matrix]
        return [np.concatenate([inputs[j][at[j][r]:at[j][r + 1]] for j in range(p)])
                for r in range(p)]
    raise ValueError(collective)


def _starts(counts):
    """Where each block of ``counts`` starts, and the end."""
    return np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).tolist()


def check_collective(schedules, collective="allreduce", in_place=False, root=0, seed=0,
                     counts=None):
    """Run ``schedules`` on tagged inputs and raise ScheduleError unless the result is exact.

    ``in_place``: the output is the input (an all-reduce's or reduce's), or its first block
    (a reduce-scatter's, as MPI's in place has it). ``counts``: the uneven forms' blocks,
    rank by rank (``counts[r]`` elements for rank r; the root's input blocks of a scatter-v);
    for ``alltoallv`` the matrix whose ``counts[i][j]`` elements rank i sends rank j.
    """
    p = len(schedules)
    inputs = tagged_inputs(p, [s.input_count for s in schedules], seed)
    with np.errstate(over="ignore"):
        outputs, unwritten = run_local(schedules, inputs, np.add, in_place)
        expected = _expected(collective, p, inputs, root, counts)
    if in_place and collective == "reduce_scatter":
        outputs = [out[:s.output_count] for out, s in zip(outputs, schedules)]
    for r, (got, want) in enumerate(zip(outputs, expected)):
        if want is None:
            continue
        if unwritten[r]:
            raise ScheduleError(f"rank {r}: {unwritten[r]} output elements never written")
        if got.shape != want.shape or not np.array_equal(got, want):
            bad = np.flatnonzero((got != want).reshape(len(got), -1).any(axis=1)) \
                if got.shape == want.shape else "shape"
            raise ScheduleError(f"{collective}: rank {r} wrong at elements {bad[:10] if len(bad) else bad}")
    return outputs
