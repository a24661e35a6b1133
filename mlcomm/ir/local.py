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

from .schedule import (INPUT, OUTPUT, SCRATCH, Await, Copy, Post, Recv, Reduce, Send, peer_of,
                       slot_owner)

__all__ = ["ScheduleError", "run_local", "check_collective", "tagged_inputs"]


class ScheduleError(AssertionError):
    """A schedule is wrong: deadlock, mismatch, hazard, bad read or wrong result."""


class _Slot:
    """One rank's slot of its node's window: data, and who wrote and read what when."""

    def __init__(self, owner, count, p, dtype, extra_shape):
        self.owner = owner
        self.data = np.zeros((count, *extra_shape), dtype)
        self.written = np.full(count, -1)  # the owner's step of the last write, -1: never
        # each reader's reads not yet known to the owner: (offset, stop, reader's step)
        self.reads = {q: [] for q in range(p)}


class _Rank:
    def __init__(self, schedule, inp, in_place, dtype, extra_shape, p):
        self.schedule = schedule
        self.bufs = {INPUT: inp}
        out_shape = (schedule.output_count, *extra_shape)
        self.bufs[OUTPUT] = inp if in_place else np.zeros(out_shape, dtype)
        self.bufs[SCRATCH] = np.zeros((schedule.scratch_count, *extra_shape), dtype)
        self.written = {INPUT: None,
                        OUTPUT: None if in_place else np.zeros(schedule.output_count, bool),
                        SCRATCH: np.zeros(schedule.scratch_count, bool)}
        self.alias = {INPUT: OUTPUT if in_place else INPUT, OUTPUT: OUTPUT, SCRATCH: SCRATCH}
        self.step = 0
        self.pending = 0
        self.slots = {}  # owner rank -> _Slot, for every rank of this node
        self.clock = np.full(p, -1)  # vector clock: the step of each rank seen through awaits
        self.posts = []  # the clock published by each post
        self.guarded = set()  # ranks awaited with count 0
        self.seen = set()  # ranks one of whose posts in this collective was awaited
        self.last_window_read = -1
        self.ranks = None  # every rank, for reads of a peer's buffers
        self.out_step = np.full(schedule.output_count, -1)  # the step of each output write
        self.read_by = {}  # peer -> its reads of this rank's buffers
        self.written_by = []  # peers' writes of this rank's output: (writer, lo, hi, step)
        self.own_reads = []  # this rank's reads of its output (or input in place): lo, hi, step

    def _peer(self, region, q, name, verb):
        """Rank ``q`` and its ``name`` buffer, which this rank ``verb``s at ``region``."""
        if q == self.schedule.rank or q not in self.schedule.node:
            raise ScheduleError(f"{self.where(region)}: {verb}s rank {q}'s buffers, not a "
                                f"peer of its node {self.schedule.node}")
        if self.clock[q] < 0:
            raise ScheduleError(f"{self.where(region)}: {verb}s rank {q}'s buffers before "
                                f"awaiting a post of rank {q} in this collective (which "
                                f"publishes their addresses)")
        other = self.ranks[q]
        buf = other.bufs[name]
        if region.offset < 0 or region.stop > len(buf):
            raise ScheduleError(f"{self.where(region)}: outside rank {q}'s {name} of "
                                f"{len(buf)} elements")
        return other, buf

    def _written_by_peers(self, reader, buffer, lo, hi):
        """A peer's write of this rank's output at ``[lo, hi)`` that rank ``reader`` reads
        there (through ``buffer``) without an await having shown it: an error."""
        if self.alias[buffer] != OUTPUT:
            return
        for w, a, b, step in self.written_by:
            if a < hi and lo < b and w != reader.schedule.rank and (
                    buffer == INPUT or reader.clock[w] < step):
                raise ScheduleError(
                    f"rank {reader.schedule.rank} step {reader.step}: reads rank "
                    f"{self.schedule.rank}'s {buffer}[{lo}:{hi}], which rank {w} "
                    + ("overwrote (in place)" if buffer == INPUT else
                       "wrote, before an await has made the write visible"))

    def _peer_write(self, region, q, name):
        """Rank ``q``'s output, written by this rank at ``region``."""
        if name != OUTPUT:
            raise ScheduleError(f"{self.where(region)}: writes rank {q}'s read-only {name}")
        other, buf = self._peer(region, q, name, "write")
        me, lo, hi = self.schedule.rank, region.offset, region.stop
        for x, reads in other.read_by.items():
            if x != me and any(b == OUTPUT and r > self.clock[x] and lo < b_hi and b_lo < hi
                               for b, b_lo, b_hi, r in reads):
                raise ScheduleError(f"{self.where(region)}: overwrites rank {q}'s elements "
                                    f"rank {x} may still be reading")
        if any(a < hi and lo < b and step > self.clock[q] for a, b, step in other.own_reads):
            raise ScheduleError(f"{self.where(region)}: overwrites rank {q}'s output elements "
                                f"rank {q} may still be reading")
        if (other.out_step[lo:hi] > self.clock[q]).any() or any(
                w != me and a < hi and lo < b for w, a, b, _ in other.written_by):
            raise ScheduleError(f"{self.where(region)}: writes rank {q}'s output elements "
                                f"that another rank writes too")
        return buf[lo:hi]

    def _peer_read(self, region, q, name):
        """Rank ``q``'s ``name`` buffer, read by this rank at ``region``."""
        me = self.schedule.rank
        other, buf = self._peer(region, q, name, "read")
        other._written_by_peers(self, name, region.offset, region.stop)
        if other.alias[name] == OUTPUT:
            when = other.out_step[region.offset:region.stop]
            if name == OUTPUT and (when < 0).any():
                raise ScheduleError(f"{self.where(region)}: reads rank {q}'s output elements "
                                    f"never written in this collective")
            if name == INPUT and (when >= 0).any():
                raise ScheduleError(f"{self.where(region)}: reads rank {q}'s input after rank "
                                    f"{q} overwrote it (in place)")
            if (when > self.clock[q]).any():
                raise ScheduleError(f"{self.where(region)}: reads rank {q}'s output before an "
                                    f"await has made its write visible")
        other.read_by.setdefault(me, []).append((other.alias[name], region.offset, region.stop,
                                                 self.step))
        self.last_window_read = self.step
        return buf[region.offset:region.stop]

    def where(self, region):
        return f"rank {self.schedule.rank} step {self.step} {region}"

    def _slot(self, region, writing):
        owner = slot_owner(region.buffer)
        me = self.schedule.rank
        slot = self.slots.get(owner)
        if slot is None:
            raise ScheduleError(f"{self.where(region)}: rank {owner}'s slot is not in this "
                                f"rank's node {self.schedule.node}")
        if writing and owner != me:
            raise ScheduleError(f"{self.where(region)}: writes another rank's slot")
        if region.offset < 0 or region.stop > len(slot.data):
            raise ScheduleError(f"{self.where(region)}: outside the slot of {len(slot.data)} "
                                f"elements")
        return slot

    def view(self, region, writing=False):
        found = peer_of(region.buffer)
        if found is not None:
            return self._peer_write(region, *found)
        if slot_owner(region.buffer) is not None:
            return self._slot(region, writing).data[region.offset:region.stop]
        buf = self.bufs[region.buffer]
        if region.offset < 0 or region.stop > len(buf):
            raise ScheduleError(f"{self.where(region)}: outside the {region.buffer} buffer "
                                f"of {len(buf)} elements")
        if writing and region.buffer == INPUT:
            raise ScheduleError(f"{self.where(region)}: writes the read-only input")
        return buf[region.offset:region.stop]

    def read(self, region):
        found = peer_of(region.buffer)
        if found is not None:
            return self._peer_read(region, *found)
        view = self.view(region)
        owner = slot_owner(region.buffer)
        if owner is not None:
            slot, me = self.slots[owner], self.schedule.rank
            when = slot.written[region.offset:region.stop]
            if (when < 0).any():
                raise ScheduleError(f"{self.where(region)}: reads slot elements never written "
                                    f"in this collective")
            if owner != me and (when > self.clock[owner]).any():
                raise ScheduleError(f"{self.where(region)}: reads rank {owner}'s slot before an "
                                    f"await has made its write visible")
            slot.reads[me].append((region.offset, region.stop, self.step))
            self.last_window_read = self.step
            return view
        self._written_by_peers(self, region.buffer, region.offset, region.stop)
        if self.alias[region.buffer] == OUTPUT:
            self.own_reads.append((region.offset, region.stop, self.step))
        mask = self.written[self.alias[region.buffer]] if region.buffer != INPUT else None
        if mask is not None and not mask[region.offset:region.stop].all():
            raise ScheduleError(f"{self.where(region)}: reads elements never written")
        return view

    def mark(self, region):
        found = peer_of(region.buffer)
        if found is not None:
            other = self.ranks[found[0]]
            other.written_by.append((self.schedule.rank, region.offset, region.stop, self.step))
            if other.written[OUTPUT] is not None:
                other.written[OUTPUT][region.offset:region.stop] = True
            return
        owner = slot_owner(region.buffer)
        if owner is not None:
            slot, me = self.slots[owner], self.schedule.rank
            peers = [q for q in self.schedule.node if q != me]
            if self.schedule.turns and me not in self.guarded:
                raise ScheduleError(f"{self.where(region)}: writes its turn area before its "
                                    f"first step's Await({me}, 0)")
            if not self.schedule.turns and not self.guarded >= set(peers):
                raise ScheduleError(f"{self.where(region)}: writes the slot before awaiting "
                                    f"every node rank's previous collective (Await(q, 0))")
            for q in peers:
                # a read this rank's clock has seen is ordered before every later write
                pending = [r for r in slot.reads[q] if r[2] > self.clock[q]]
                slot.reads[q] = pending
                if any(lo < region.stop and region.offset < hi for lo, hi, _ in pending):
                    raise ScheduleError(f"{self.where(region)}: overwrites slot elements rank "
                                        f"{q} may still be reading")
            slot.written[region.offset:region.stop] = self.step
            return
        if self.alias[region.buffer] == OUTPUT:
            if any(a < region.stop and region.offset < b for _, a, b, _ in self.written_by):
                raise ScheduleError(f"{self.where(region)}: writes output elements a peer "
                                    f"writes too")
            for q, reads in self.read_by.items():
                pending = [r for r in reads if r[3] > self.clock[q]]
                self.read_by[q] = pending
                if any(b == OUTPUT and lo < region.stop and region.offset < hi
                       for b, lo, hi, _ in pending):
                    raise ScheduleError(f"{self.where(region)}: overwrites output elements "
                                        f"rank {q} may still be reading")
            self.out_step[region.offset:region.stop] = self.step
        mask = self.written[self.alias[region.buffer]]
        if mask is not None:
            mask[region.offset:region.stop] = True


def _check_hazards(rank, step):
    """Receives must not overlap each other or any send of the same step."""
    phys = lambda r: (rank.alias.get(r.buffer, r.buffer), r.offset, r.stop)
    recvs = [phys(t.region) for t in step.transfers if isinstance(t, Recv) and t.region.count]
    sends = [phys(t.region) for t in step.transfers if isinstance(t, Send) and t.region.count]
    for i, (b, lo, hi) in enumerate(recvs):
        for b2, lo2, hi2 in recvs[i + 1:] + sends:
            if b == b2 and lo < hi2 and lo2 < hi:
                raise ScheduleError(f"rank {rank.schedule.rank} step {rank.step}: a receive into "
                                    f"{b}[{lo}:{hi}] overlaps another transfer of the same step")


def _window(ranks, p, dtype, extra_shape):
    """Give every rank of a node the slots of its node's ranks."""
    for k in ranks:
        node = k.schedule.node
        if not node or k.slots:
            continue
        for q in node:
            if not 0 <= q < p or tuple(ranks[q].schedule.node) != tuple(node):
                raise ScheduleError(f"rank {k.schedule.rank}'s node {node} is not rank {q}'s")
        rotating = {q for q in node if ranks[q].schedule.rotates}
        if rotating and (rotating != set(node) or len(
                {ranks[q].schedule.slot_count for q in node}) > 1):
            raise ScheduleError(f"node {node}: a rotating schedule must rotate on every rank "
                                f"of its node with the same slot need (the area each takes "
                                f"must be the same)")
        width = max(ranks[q].schedule.slot_count for q in node)
        slots = {q: _Slot(q, width, p, dtype, extra_shape) for q in node}
        for q in node:
            ranks[q].slots = slots


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
    sends, recvs = {}, {}
    awaiting = {}  # (peer, count) -> ranks waiting for that post
    ready = deque()

    def done_one(rank_id):
        ranks[rank_id].pending -= 1
        if ranks[rank_id].pending == 0:
            ready.append(rank_id)

    def see(rank, peer, count):
        """An await completed: what ``peer`` published with its post is visible now."""
        np.maximum(rank.clock, ranks[peer].posts[count - 1], out=rank.clock)
        rank.seen.add(peer)

    def post(r):
        rank = ranks[r]
        if rank.step >= len(rank.schedule.steps):
            return
        step = rank.schedule.steps[rank.step]
        _check_hazards(rank, step)
        rank.clock[r] = rank.step
        node = rank.schedule.node
        for t in step.transfers:
            if isinstance(t, Post):
                if t.count != len(rank.posts) + 1:
                    raise ScheduleError(f"rank {r} step {rank.step}: post {t.count}, expected "
                                        f"{len(rank.posts) + 1}")
                published = rank.clock.copy()
                published[r] = rank.step - 1  # the writes of the steps before this one
                rank.posts.append(published)
                rank.last_post = rank.step
        waits = [t for t in step.transfers if isinstance(t, Await)]
        messages = [t for t in step.transfers if isinstance(t, (Send, Recv))]
        rank.pending = len(waits) + len(messages) + 1  # + 1: this call's own completion
        for t in step.transfers:  # wake the ranks that wait for this rank's new posts
            if isinstance(t, Post):
                for waiter in awaiting.pop((r, t.count), []):
                    see(ranks[waiter], r, t.count)
                    done_one(waiter)
        for t in waits:
            if t.peer not in node:
                raise ScheduleError(f"rank {r} step {rank.step}: awaits rank {t.peer}, not of "
                                    f"its node {node}")
            if t.count == 0:
                rank.guarded.add(t.peer)
                rank.pending -= 1
            elif len(ranks[t.peer].posts) >= t.count:
                see(rank, t.peer, t.count)
                rank.pending -= 1
            else:
                awaiting.setdefault((t.peer, t.count), []).append(r)
        for t in messages:
            if not 0 <= t.peer < p or t.peer == r:
                raise ScheduleError(f"rank {r} step {rank.step}: bad peer {t.peer}")
            key = (r, t.peer) if isinstance(t, Send) else (t.peer, r)
            mine, theirs = (sends, recvs) if isinstance(t, Send) else (recvs, sends)
            waiting = theirs.get(key)
            if waiting:
                other = waiting.popleft()
                match(*((r, t, other[0], other[1]) if isinstance(t, Send)
                        else (other[0], other[1], r, t)))
            else:
                mine.setdefault(key, deque()).append((r, t))
        done_one(r)

    def match(src, send, dst, recv):
        a, b = ranks[src], ranks[dst]
        if send.region.count != recv.region.count:
            raise ScheduleError(f"message rank {src} -> {dst}: sent {send.region.count} elements "
                                f"({a.where(send.region)}) but receive posted for "
                                f"{recv.region.count} ({b.where(recv.region)})")
        b.view(recv.region, writing=True)[...] = a.read(send.region)
        b.mark(recv.region)
        done_one(src)
        done_one(dst)

    for r in range(p):
        post(r)
    while ready:
        r = ready.popleft()
        rank = ranks[r]
        for op in rank.schedule.steps[rank.step].ops:
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
        rank.step += 1
        post(r)
    stuck = [k for k in ranks if k.step < len(k.schedule.steps)]
    if stuck:
        lines = [f"rank {k.schedule.rank} blocked at step {k.step} of {len(k.schedule.steps)}: "
                 f"{k.schedule.steps[k.step].transfers}" for k in stuck[:8]]
        raise ScheduleError("deadlock:\n" + "\n".join(lines))
    for k in ranks:
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
    return [k.bufs[OUTPUT] for k in ranks], [getattr(k, "unwritten", 0) for k in ranks]


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


def _expected(collective, p, inputs, root):
    total = lambda rows: np.add.reduce(np.stack(rows), axis=0)
    if collective in ("allreduce", "reduce"):
        result = total(inputs)
        return [result if collective == "allreduce" or r == root else None for r in range(p)]
    if collective == "reduce_scatter":
        result = total(inputs)
        n = len(result) // p
        return [result[r * n:(r + 1) * n] for r in range(p)]
    if collective == "allgather":
        result = np.concatenate(inputs)
        return [result] * p
    if collective == "bcast":
        return [inputs[root]] * p
    raise ValueError(collective)


def check_collective(schedules, collective="allreduce", in_place=False, root=0, seed=0):
    """Run ``schedules`` on tagged inputs and raise ScheduleError unless the result is exact."""
    p = len(schedules)
    inputs = tagged_inputs(p, [s.input_count for s in schedules], seed)
    with np.errstate(over="ignore"):
        outputs, unwritten = run_local(schedules, inputs, np.add, in_place)
        expected = _expected(collective, p, inputs, root)
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
