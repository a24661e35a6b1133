"""Synchronous gradient exchange (bsp, ssp, backup workers) and the base every mode shares.

Every mode works on ``ctx.comm``, a duplicate of the user's communicator, so
its point-to-point messages never meet the user's, and sends every message
through ``ctx.wire``: point-to-point messages there, collectives with mlcomm's
own algorithms, whose transport counts the bytes this rank sends.  A mode's
``step(t)`` runs one training step on this rank and returns a :class:`StepInfo`.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

__all__ = ["StepInfo", "Mode", "BSP", "SSP", "Backup", "recv_bytes", "pack_header",
           "unpack_header", "checkpoint_arrays"]

TAG_DELTA, TAG_GRAD, TAG_PARAMS = 101, 102, 103


@dataclass
class StepInfo:
    """One step on one rank.

    ``columns`` are the metrics row's exchange columns on the logging rank:
    ``updates`` (parameter updates applied), ``samples`` (samples in them),
    ``staleness_mean``/``staleness_max`` (over those updates) and ``dropped``
    (gradients computed but not applied).
    """

    step: int = 0
    loss: float = float("nan")
    samples: int = 0                   # in this rank's gradient
    compute_s: float = 0.0
    comm_s: float = 0.0
    stop: bool = False
    computed: bool = True              # False: told to stop instead of computing
    next_step: int | None = None       # the step this rank runs next (default step + 1)
    columns: dict = field(default_factory=dict)


def pack_header(step, loss, flag, samples):
    return np.array([step, loss, flag, samples], np.float64).view(np.uint8)


def unpack_header(buf):
    step, loss, flag, samples = buf[:32].view(np.float64)
    return int(step), float(loss), bool(flag), int(samples)


def recv_bytes(comm, source, tag):
    """Receive one message of unknown size as bytes; return (payload, source)."""
    st = MPI.Status()
    comm.Probe(source, tag, st)
    buf = np.empty(st.Get_count(MPI.BYTE), np.uint8)
    comm.Recv([buf, MPI.BYTE], st.Get_source(), st.Get_tag())
    return buf, st.Get_source()


def _buckets(tensors, limit_bytes, itemsize, total):
    """Group tensors (back to front, as backprop produces them) into slices of <= limit bytes."""
    if limit_bytes <= 0:
        return [(off, off + cnt) for off, cnt, _ in reversed(tensors)]
    out, hi, lo = [], total, total
    for off, cnt, _ in reversed(tensors):
        if lo < hi and (hi - off) * itemsize > limit_bytes:
            out.append((lo, hi))
            hi = lo
        lo = off
    out.append((lo, hi))
    return out


def checkpoint_arrays(params, velocity, rank_states):
    """The checkpoint's arrays: the shared ones, then each rank's own as ``rank<r>_<name>``."""
    arrays = {"params": params, "velocity": velocity}
    for r, state in rank_states:
        for k, v in state.items():
            arrays[f"rank{r}_{k}"] = np.asarray(v)
    return arrays


def _columns(updates, samples, stale_mean=0.0, stale_max=0, dropped=0):
    return {"updates": updates, "samples": samples, "staleness_mean": stale_mean,
            "staleness_max": stale_max, "dropped": dropped}


class Mode:
    """The base of every mode: one worker rank in a data-parallel job."""

    is_worker = True
    periodic_checkpoints = True  # the training loop checkpoints every N steps

    def __init__(self, ctx):
        self.ctx = ctx
        self.comm = ctx.comm
        self.wire = ctx.wire
        self.rank, self.size = ctx.rank, ctx.size

    @property
    def logger_rank(self):
        return 0

    def resume_at(self, step):
        """Continue from global ``step`` after a checkpoint was loaded; return this rank's first step."""
        return step

    def more(self, step):
        """Whether this rank runs ``step``."""
        return step < self.ctx.cfg.steps

    def progress(self, step):
        """Global steps done, for the progress bar, when this rank is about to run ``step``."""
        return step

    def finish(self):
        """Leave identical final parameters on every rank (collective)."""

    def final_step(self, step):
        """The global step reached, agreed by every rank (collective)."""
        return step

    def annotate(self, rows):
        """Complete the logging rank's rows with what only other ranks know (collective)."""

    def sync_point(self, step):
        """Reach a consistent cut where a checkpoint may be taken (collective)."""

    def gather_state(self):
        """Return {name: array} for the checkpoint on rank 0 (collective)."""
        c = self.ctx
        states = self.comm.gather(c.rank_state(), root=0)
        if self.rank:
            return None
        return checkpoint_arrays(c.params, c.opt.velocity, enumerate(states))

    def load_state(self, arrays):
        c = self.ctx
        c.params[...] = arrays["params"]
        c.opt.velocity[...] = arrays["velocity"]
        self.load_rank_state(arrays)

    def load_rank_state(self, arrays):
        """Take this rank's own state (keys ``rank<r>_...``), where the checkpoint has it."""
        self.ctx.load_rank_state(arrays, self.rank)


class BSP(Mode):
    """Bulk synchronous: sum of all gradients by all-reduce (or allgather of compressed payloads)."""

    def __init__(self, ctx):
        super().__init__(ctx)
        n = ctx.model.size
        self.buf = np.zeros(n + 2, ctx.dtype)      # [gradient..., loss sum, stop flag]
        self.grad = self.buf[:n]
        self.buckets = _buckets(ctx.model.tensors, ctx.cfg.bucket_bytes, ctx.dtype.itemsize, n)
        self.buckets[0] = (self.buckets[0][0], n + 2)  # the extras ride in the first bucket sent
        self.algorithm = ctx.cfg.algorithm
        self.comp = ctx.compressor
        self.half_sum = self.comp.name == "fp16" and self.algorithm != "mpi"
        self.bucket_sums = []
        if self.size > 1 and self.comp.name == "none":
            # one persistent in-place sum per bucket, bound to its slice of buf once
            self.bucket_sums = [self.wire.allreduce_init(self.buf[lo:hi], self.algorithm)
                                for lo, hi in self.buckets]
        elif self.size > 1 and self.half_sum:
            self.half = np.zeros(n, np.float16)
            self.extras = np.zeros(2)                 # loss sum, stop flag
            self.bucket_sums = [self.wire.allreduce_init(self.half, self.algorithm),
                                self.wire.allreduce_init(self.extras)]
        self._warm_up()

    def _warm_up(self):
        """Build the all-reduce plans (and compile kernels) before the clock starts."""
        for bucket_sum in self.bucket_sums:  # the buffers are zeros here: this only loads kernels
            bucket_sum()

    def step(self, t):
        c, info = self.ctx, StepInfo(step=t)
        loss, info.samples, info.compute_s = c.compute(t, c.params, self.grad, self.rank, self.size,
                                                       1.0 / c.global_batch)
        t0 = time.perf_counter()
        flag = 1.0 if c.stop_requested() else 0.0
        if self.size == 1 and self.comp.name == "none":
            self.buf[-2:] = loss, flag
        elif self.comp.name == "none":
            self.buf[-2], self.buf[-1] = loss, flag
            for bucket_sum in self.bucket_sums:
                bucket_sum()
        elif self.half_sum:
            np.copyto(self.half, self.grad, casting="same_kind")
            self.extras[:] = loss, flag
            for bucket_sum in self.bucket_sums:
                bucket_sum()
            self.grad[...] = self.half
            self.buf[-2:] = self.extras
        else:
            self._allgather_exchange(loss, flag)
        info.comm_s = time.perf_counter() - t0
        info.loss = float(self.buf[-2]) / c.global_batch
        info.stop = bool(self.buf[-1] > 0)
        info.columns = _columns(1, c.global_batch)
        c.opt.step(c.params, self.grad, c.lr_at(t))
        return info

    def _allgather_exchange(self, loss, flag):
        """Allgather every rank's packed payload (with its loss and stop flag in front);
        sum them in rank order. A compressor's payload has the same size on every rank."""
        payload = self.comp.compress(self.grad)
        msg = np.empty(16 + payload.size, np.uint8)
        msg[:16] = np.array([loss, flag]).view(np.uint8)
        msg[16:] = payload
        every = self.wire.allgather(msg).reshape(self.size, msg.size)
        self.grad[...] = 0
        for r in range(self.size):
            self.comp.decompress_add(every[r, 16:], self.grad)
        heads = np.ascontiguousarray(every[:, :16]).view(np.float64)
        self.buf[-2] = heads[:, 0].sum()
        self.buf[-1] = heads[:, 1].sum()


class SSP(Mode):
    """Stale synchronous parallel, peer to peer.

    Each rank keeps its own momentum, sends its update ``lr * v`` (compressed) to
    every peer and applies every update of clocks <= its own.  Before clock
    ``c`` it must hold every update of clocks <= c - 1 - s, so no rank runs more
    than ``s`` clocks ahead of the slowest; ``s = 0`` is BSP (momentum is linear).
    The staleness of a rank's update at clock ``c`` is how many clocks behind
    ``c`` the slowest peer's updates in its parameters are (at most ``s``).
    """

    def __init__(self, ctx):
        super().__init__(ctx)
        self.s = ctx.cfg.staleness
        self.grad = np.zeros(ctx.model.size, ctx.dtype)
        self.pending = {}                  # (clock, source) -> payload, not yet applied
        self.sends = []                    # (request, buffer) in flight
        self.flags = deque()               # started stop-flag all-reduces, oldest first
        self.flag_bufs = [np.zeros(1, np.int32) for _ in range(self.s + 1)]
        self.flag_max = [self.wire.allreduce_init(b, op="max") for b in self.flag_bufs]
        self.staleness = {}                # clock -> staleness of this rank's update
        self.resume_at(0)

    def resume_at(self, step):
        self.clock = step
        self.received = [None if r == self.rank else step for r in range(self.size)]
        self.applied = list(self.received)  # updates of each peer in the parameters
        return step

    def _receive(self, block_until=None):
        st = MPI.Status()
        while True:
            need = None
            if block_until is not None:
                need = next((r for r in range(self.size)
                             if r != self.rank and self.received[r] < block_until), None)
            if need is None:
                if not self.comm.Iprobe(MPI.ANY_SOURCE, TAG_DELTA, st):
                    return
                src = st.Get_source()
            else:
                src = need
            payload, src = recv_bytes(self.comm, src, TAG_DELTA)
            self.pending[(self.received[src], src)] = payload
            self.received[src] += 1

    def _apply(self, upto):
        c = self.ctx
        ready = sorted(k for k in self.pending if k[0] <= upto)
        if ready:
            acc = np.zeros_like(c.params)
            for key in ready:
                self.ctx.compressor.decompress_add(self.pending.pop(key), acc)
                self.applied[key[1]] = key[0] + 1
            c.params -= acc

    def step(self, t):
        c, info = self.ctx, StepInfo(step=t)
        peers = [a for a in self.applied if a is not None]
        self.staleness[t] = t - min(peers) if peers else 0
        loss, info.samples, info.compute_s = c.compute(t, c.params, self.grad, self.rank, self.size,
                                                       1.0 / c.global_batch)
        t0 = time.perf_counter()
        k = t % len(self.flag_bufs)  # its all-reduce was waited for s clocks ago
        self.flag_bufs[k][0] = 1 if c.stop_requested() else 0
        self.flag_max[k].start()
        self.flags.append(self.flag_max[k])
        if c.opt.weight_decay:  # each rank adds 1/P of the decay so the sum decays once
            self.grad += self.grad.dtype.type(c.opt.weight_decay / self.size) * c.params
        delta = c.opt.direction(self.grad)
        delta = delta * delta.dtype.type(c.lr_at(t))
        payload = c.compressor.compress(delta)
        own = np.zeros_like(c.params)
        c.compressor.decompress_add(payload, own)
        c.params -= own
        for r in range(self.size):
            if r != self.rank:
                self.sends.append((self.wire.isend(payload, r, TAG_DELTA), payload))
        self.sends = [(q, b) for q, b in self.sends if not q.Test()]
        # before clock t + 1: every update of clocks <= t - s must be in
        self._receive(block_until=t + 1 - self.s)
        self._apply(upto=t)
        if len(self.flags) > self.s:
            info.stop = bool(self.flags.popleft().wait()[0])
        info.comm_s = time.perf_counter() - t0
        info.loss = loss / max(1, info.samples)
        info.columns = _columns(self.size, c.global_batch)
        self.clock = t + 1
        return info

    def _drain(self):
        """Receive and apply every update of every clock so far; finish the flag requests."""
        clocks = int(self.wire.allreduce(np.array([self.clock], np.int64), op="max")[0])
        self._receive(block_until=clocks)
        self._apply(upto=clocks)
        while self.flags:
            self.flags.popleft().wait()
        MPI.Request.Waitall([q for q, _ in self.sends])
        self.sends = []

    def sync_point(self, step):
        self._drain()

    def finish(self):
        self._drain()
        self.wire.bcast(self.ctx.params, root=0)  # erase rounding differences of update order

    def annotate(self, rows):
        """Each row: mean and max staleness over the P updates of its clock."""
        every = self.comm.gather(self.staleness, root=0)
        if self.rank:
            return
        for row in rows:
            values = [st[row["step"] - 1] for st in every if row["step"] - 1 in st]
            if values:
                row["staleness_mean"] = float(np.mean(values))
                row["staleness_max"] = int(max(values))

    def gather_state(self):
        c = self.ctx
        vels = self.comm.gather(c.opt.velocity, root=0)
        arrays = super().gather_state()
        if arrays is not None:
            for r, v in enumerate(vels):
                arrays[f"rank{r}_velocity"] = v
        return arrays

    def load_rank_state(self, arrays):
        super().load_rank_state(arrays)
        key = f"rank{self.rank}_velocity"
        if key in arrays:
            self.ctx.opt.velocity[...] = arrays[key]


class Backup(Mode):
    """Synchronous SGD with backup workers (Chen et al. 2016), aggregated on rank 0.

    Every rank computes a gradient; rank 0 averages the first P - b that arrive
    for the current step (its own counts when it is done), drops late ones,
    updates, and sends the new parameters to every worker.  A late worker skips
    to the newest parameters it has been sent.
    """

    def __init__(self, ctx):
        super().__init__(ctx)
        self.need = self.size - ctx.cfg.backup_workers
        self.grad = np.zeros(ctx.model.size, ctx.dtype)
        self.sends = []
        self.sent = 0          # gradients sent (workers)
        self.got = {}          # gradients received per worker (rank 0)
        self.dropped = 0       # late gradients rank 0 dropped
        self.drained = 0       # of which received while finishing

    def step(self, t):
        c, info = self.ctx, StepInfo(step=t)
        loss, info.samples, info.compute_s = c.compute(t, c.params, self.grad, self.rank, self.size,
                                                       1.0 / max(1, c.shard_size(self.rank)))
        t0 = time.perf_counter()
        payload = c.compressor.compress(self.grad)
        if self.rank:
            msg = np.concatenate([pack_header(t, loss, c.stop_requested(), info.samples), payload])
            self.sends.append((self.wire.isend(msg, 0, TAG_GRAD), msg))
            self.sent += 1
            # newest parameters wins; a late worker skips the steps it missed
            msg, _ = recv_bytes(self.comm, 0, TAG_PARAMS)
            st = MPI.Status()
            while self.comm.Iprobe(0, TAG_PARAMS, st):
                msg, _ = recv_bytes(self.comm, 0, TAG_PARAMS)
            nxt, gloss, stop, _ = unpack_header(msg)
            c.params[...] = msg[32:].view(c.dtype)
            info.loss, info.stop = gloss, stop
            self.sends = [(q, b) for q, b in self.sends if not q.Test()]
            info.next_step = nxt
        else:
            used = {0: (payload, loss, info.samples)}
            stop = c.stop_requested()
            dropped = self.dropped
            while len(used) < self.need:
                msg, src = recv_bytes(self.comm, MPI.ANY_SOURCE, TAG_GRAD)
                self.got[src] = self.got.get(src, 0) + 1
                step, wloss, wflag, wsamples = unpack_header(msg)
                stop = stop or wflag
                if step == t and src not in used:
                    used[src] = (msg[32:], wloss, wsamples)
                else:
                    self.dropped += 1
            self.grad[...] = 0
            for r in sorted(used):
                c.compressor.decompress_add(used[r][0], self.grad)
            self.grad /= self.grad.dtype.type(len(used))
            total = sum(u[2] for u in used.values())
            info.loss = sum(u[1] for u in used.values()) / max(1, total)
            c.opt.step(c.params, self.grad, c.lr_at(t))
            info.stop = stop or t + 1 >= c.cfg.steps
            info.columns = _columns(1, total, dropped=self.dropped - dropped)
            head = pack_header(t + 1, info.loss, info.stop, total)
            msg = np.concatenate([head, c.params.view(np.uint8)])
            for r in range(1, self.size):
                self.sends.append((self.wire.isend(msg, r, TAG_PARAMS), msg))
            self.sends = [(q, b) for q, b in self.sends if not q.Test()]
            info.next_step = t + 1
        info.comm_s = time.perf_counter() - t0
        return info

    def finish(self):
        """Workers report how many gradients they sent; rank 0 drains (and drops) the late ones."""
        counts = self.wire.allgather(np.array([self.sent], np.int64))
        if self.rank == 0:
            for src in range(1, self.size):
                while self.got.get(src, 0) < counts[src]:
                    recv_bytes(self.comm, src, TAG_GRAD)
                    self.got[src] = self.got.get(src, 0) + 1
                    self.drained += 1
            self.dropped += self.drained
        MPI.Request.Waitall([q for q, _ in self.sends])
        self.sends = []
        # workers that stopped early (stop header) still hold the last params sent
        self.wire.bcast(self.ctx.params, root=0)

    def final_step(self, step):
        return int(self.wire.bcast(np.array([step], np.int64), root=0)[0])

    def annotate(self, rows):
        """The gradients drained at the end were dropped in the last step."""
        if self.rank == 0 and rows:
            rows[-1]["dropped"] += self.drained

    def gather_state(self):
        self.ctx.opt.velocity = self.comm.bcast(self.ctx.opt.velocity if self.rank == 0 else None)
        return super().gather_state()
