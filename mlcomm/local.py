"""Local executor: run every rank's schedule in one process on NumPy arrays.

It matches messages as MPI does (FIFO per ordered pair of ranks), completes a
step when all its transfers are matched (rendezvous: the strictest case), and
reports deadlocks, mis-sized or out-of-bounds messages, hazards inside a step
and reads of never-written output or scratch.  :func:`check_collective`
proves a schedule exactly: each rank's contribution is tagged so that every
output element must hold every expected contribution exactly once.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from .schedule import INPUT, OUTPUT, SCRATCH, Copy, Recv, Reduce, Send

__all__ = ["ScheduleError", "run_local", "check_collective", "tagged_inputs"]


class ScheduleError(AssertionError):
    """A schedule is wrong: deadlock, mismatch, hazard, bad read or wrong result."""


class _Rank:
    def __init__(self, schedule, inp, in_place, dtype, extra_shape):
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

    def where(self, region):
        return f"rank {self.schedule.rank} step {self.step} {region}"

    def view(self, region, writing=False):
        buf = self.bufs[region.buffer]
        if region.offset < 0 or region.stop > len(buf):
            raise ScheduleError(f"{self.where(region)}: outside the {region.buffer} buffer "
                                f"of {len(buf)} elements")
        if writing and region.buffer == INPUT:
            raise ScheduleError(f"{self.where(region)}: writes the read-only input")
        return buf[region.offset:region.stop]

    def read(self, region):
        view = self.view(region)
        mask = self.written[self.alias[region.buffer]] if region.buffer != INPUT else None
        if mask is not None and not mask[region.offset:region.stop].all():
            raise ScheduleError(f"{self.where(region)}: reads elements never written")
        return view

    def mark(self, region):
        mask = self.written[self.alias[region.buffer]]
        if mask is not None:
            mask[region.offset:region.stop] = True


def _check_hazards(rank, step):
    """Receives must not overlap each other or any send of the same step."""
    phys = lambda r: (rank.alias[r.buffer], r.offset, r.stop)
    recvs = [phys(t.region) for t in step.transfers if isinstance(t, Recv) and t.region.count]
    sends = [phys(t.region) for t in step.transfers if isinstance(t, Send) and t.region.count]
    for i, (b, lo, hi) in enumerate(recvs):
        for b2, lo2, hi2 in recvs[i + 1:] + sends:
            if b == b2 and lo < hi2 and lo2 < hi:
                raise ScheduleError(f"rank {rank.schedule.rank} step {rank.step}: a receive into "
                                    f"{b}[{lo}:{hi}] overlaps another transfer of the same step")


def run_local(schedules, inputs, reduce=np.add, in_place=False):
    """Run all ranks' schedules; return each rank's output array.

    ``inputs[r]`` has ``schedules[r].input_count`` rows (extra trailing axes
    ride along).  ``reduce(dst, src, out=dst)`` is the reduction ufunc.
    """
    p = len(schedules)
    first = np.asarray(inputs[0])
    ranks = [_Rank(s, np.array(x, copy=True), in_place, first.dtype, first.shape[1:])
             for s, x in zip(schedules, inputs)]
    sends, recvs = {}, {}
    ready = deque()

    def post(r):
        rank = ranks[r]
        if rank.step >= len(rank.schedule.steps):
            return
        step = rank.schedule.steps[rank.step]
        _check_hazards(rank, step)
        rank.pending = len(step.transfers)
        if not step.transfers:
            ready.append(r)
        for t in step.transfers:
            if not 0 <= t.peer < p or t.peer == r:
                raise ScheduleError(f"rank {r} step {rank.step}: bad peer {t.peer}")
            key = (r, t.peer) if isinstance(t, Send) else (t.peer, r)
            mine, theirs = (sends, recvs) if isinstance(t, Send) else (recvs, sends)
            waiting = theirs.get(key)
            if waiting:
                other = waiting.popleft()
                match(*((r, t, other[0], other[1]) if isinstance(t, Send) else (other[0], other[1], r, t)))
            else:
                mine.setdefault(key, deque()).append((r, t))

    def match(src, send, dst, recv):
        a, b = ranks[src], ranks[dst]
        if send.region.count != recv.region.count:
            raise ScheduleError(f"message rank {src} -> {dst}: sent {send.region.count} elements "
                                f"({a.where(send.region)}) but receive posted for {recv.region.count} "
                                f"({b.where(recv.region)})")
        b.view(recv.region, writing=True)[...] = a.read(send.region)
        b.mark(recv.region)
        for rank_id in (src, dst):
            ranks[rank_id].pending -= 1
            if ranks[rank_id].pending == 0:
                ready.append(rank_id)

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
                if not np.shares_memory(dst, src) or dst.__array_interface__ != src.__array_interface__:
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
