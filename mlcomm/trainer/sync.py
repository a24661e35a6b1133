"""Gradient exchange modes: bsp, ssp, backup workers and an asynchronous parameter server.

Every mode works on ``ctx.comm``, a duplicate of the user's communicator, so
its point-to-point messages never meet the user's.  A mode's ``step(t)`` runs
one training step on this rank and returns a :class:`StepInfo`.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI
from mpi4py.util.dtlib import from_numpy_dtype

__all__ = ["allreduce", "wire_bytes", "StepInfo", "BSP", "SSP", "Backup", "AsyncPS", "make_mode"]

TAG_DELTA, TAG_GRAD, TAG_PARAMS, TAG_DONE, TAG_PULL, TAG_PUSH = 101, 102, 103, 104, 105, 106


def allreduce(buf: np.ndarray, comm, algorithm: str) -> np.ndarray:
    """Sum ``buf`` over ``comm`` in place with mlcomm's ``algorithm``."""
    try:
        from mlcomm import allreduce as _allreduce
    except ImportError:  # the core API is not there: fall back to MPI's own
        comm.Allreduce(MPI.IN_PLACE, buf, MPI.SUM)
        return buf
    out = _allreduce(MPI.IN_PLACE, buf, "sum", comm=comm, algorithm=algorithm)
    if out is not None and out is not buf:
        buf[...] = out
    return buf


_WIRE_CACHE: dict = {}


def wire_bytes(algorithm: str, size: int, rank: int, count: int, itemsize: int) -> int:
    """Return the bytes ``rank`` sends in one all-reduce of ``count`` elements.

    Counted from the algorithm's schedule; for ``mpi``/``auto`` (no schedule of
    ours, or an ``auto`` choice of ``mpi``) the ring's 2(p-1)/p * n is used as the model.
    """
    key = (algorithm, size, rank, count, itemsize)
    if key not in _WIRE_CACHE:
        total = None
        if size > 1:
            try:
                from mlcomm.algorithms import ALGORITHMS, resolve
                name = resolve(algorithm)
                if name == "auto":
                    from mlcomm.select import auto_choice
                    name = auto_choice("allreduce", size, count * itemsize)
                algo = ALGORITHMS[name]
                if algo.build is not None:
                    sched = algo.build(rank, size, count, itemsize)
                    total = sum(tr.region.count for st in sched.steps for tr in st.transfers
                                if type(tr).__name__ == "Send") * itemsize
            except (ImportError, KeyError, ValueError):
                pass
            if total is None:
                total = int(2 * (size - 1) * count * itemsize / size)
        _WIRE_CACHE[key] = total or 0
    return _WIRE_CACHE[key]


@dataclass
class StepInfo:
    loss: float = float("nan")
    samples: int = 0
    compute_s: float = 0.0
    comm_s: float = 0.0
    bytes_sent: int = 0
    stop: bool = False
    step: int = 0


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


def _pack_header(step, loss, flag, samples):
    return np.array([step, loss, flag, samples], np.float64).view(np.uint8)


def _unpack_header(buf):
    step, loss, flag, samples = buf[:32].view(np.float64)
    return int(step), float(loss), bool(flag), int(samples)


def _recv_bytes(comm, source, tag):
    """Receive one message of unknown size as bytes; return (payload, source)."""
    st = MPI.Status()
    comm.Probe(source, tag, st)
    buf = np.empty(st.Get_count(MPI.BYTE), np.uint8)
    comm.Recv([buf, MPI.BYTE], st.Get_source(), st.Get_tag())
    return buf, st.Get_source()


class _Mode:
    is_worker = True
    periodic_checkpoints = True  # checkpoint every N steps (otherwise only at exit)

    def __init__(self, ctx):
        self.ctx = ctx
        self.comm = ctx.comm
        self.rank, self.size = ctx.rank, ctx.size

    @property
    def logger_rank(self):
        return 0

    def resume_at(self, step):
        """Continue from ``step`` after a checkpoint was loaded."""

    def finish(self):
        """Leave identical final parameters on every rank (collective)."""

    def sync_point(self, step):
        """Reach a consistent cut where a checkpoint may be taken (collective)."""

    def gather_state(self):
        """Return {name: array} for the checkpoint on rank 0 (collective)."""
        c = self.ctx
        states = self.comm.gather(c.rank_state(), root=0)
        if self.rank:
            return None
        arrays = {"params": c.params, "velocity": c.opt.velocity}
        for r, st in enumerate(states):
            for k, v in st.items():
                arrays[f"rank{r}_{k}"] = np.asarray(v)
        return arrays

    def load_state(self, arrays):
        c = self.ctx
        c.params[...] = arrays["params"]
        c.opt.velocity[...] = arrays["velocity"]
        c.load_rank_state(arrays, self.rank)


class BSP(_Mode):
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
        self.bucket_sums = []
        self._warm_up()

    def _warm_up(self):
        """Build the all-reduce plans (and compile kernels) before the clock starts."""
        if self.size == 1:
            return
        if self.comp.name == "none":
            from mlcomm import allreduce_init
            # one persistent in-place sum per bucket, bound to its slice of buf once
            self.bucket_sums = [allreduce_init(MPI.IN_PLACE, self.buf[lo:hi], comm=self.comm,
                                               algorithm=self.algorithm)
                                for lo, hi in self.buckets]
            for bucket_sum in self.bucket_sums:  # buf is zeros here: this only loads kernels
                bucket_sum()
        elif self.comp.name == "fp16" and self.algorithm != "mpi" and _have_mlcomm():
            allreduce(np.zeros(self.buf.size, np.float16), self.comm, self.algorithm)

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
            for (lo, hi), bucket_sum in zip(self.buckets, self.bucket_sums):
                bucket_sum()
                info.bytes_sent += wire_bytes(self.algorithm, self.size, self.rank, hi - lo,
                                              c.dtype.itemsize)
        elif self.comp.name == "fp16" and self.algorithm != "mpi" and _have_mlcomm():
            half = self.buf.astype(np.float16)
            half[-2:] = 0
            allreduce(half, self.comm, self.algorithm)
            info.bytes_sent += wire_bytes(self.algorithm, self.size, self.rank, half.size, 2)
            self.grad[...] = half[:-2]
            extras = np.array([loss, flag])
            self.comm.Allreduce(MPI.IN_PLACE, extras, MPI.SUM)
            info.bytes_sent += wire_bytes("mpi", self.size, self.rank, 2, 8)
            self.buf[-2:] = extras
        else:
            info.bytes_sent += self._allgather_exchange(loss, flag)
        info.comm_s = time.perf_counter() - t0
        info.loss = float(self.buf[-2]) / c.global_batch
        info.stop = bool(self.buf[-1] > 0)
        c.opt.step(c.params, self.grad, c.lr_at(t))
        return info

    def _allgather_exchange(self, loss, flag):
        """Exchange variable-size packed payloads with MPI_Allgatherv; sum them in rank order."""
        payload = self.comp.compress(self.grad)
        head = np.array([payload.size, loss, flag], np.float64)
        heads = np.empty((self.size, 3), np.float64)
        self.comm.Allgather(head, heads)
        counts = heads[:, 0].astype(np.int64)
        displs = np.concatenate([[0], np.cumsum(counts)[:-1]])
        allbuf = np.empty(int(counts.sum()), np.uint8)
        self.comm.Allgatherv([payload, MPI.BYTE], [allbuf, counts, displs, MPI.BYTE])
        self.grad[...] = 0
        for r in range(self.size):
            self.comp.decompress_add(allbuf[displs[r]:displs[r] + counts[r]], self.grad)
        self.buf[-2] = heads[:, 1].sum()
        self.buf[-1] = heads[:, 2].sum()
        # a ring allgather forwards every payload to p-1 ranks: on average p-1 copies of ours
        return (payload.size + head.nbytes) * (self.size - 1)


def _have_mlcomm():
    try:
        from mlcomm import allreduce  # noqa: F401
        return True
    except ImportError:
        return False


class SSP(_Mode):
    """Stale synchronous parallel, peer to peer.

    Each rank keeps its own momentum, sends its update ``lr * v`` (compressed) to
    every peer and applies every update of clocks <= its own.  Before clock
    ``c`` it must hold every update of clocks <= c - 1 - s, so no rank runs more
    than ``s`` clocks ahead of the slowest; ``s = 0`` is BSP (momentum is linear).
    """

    def __init__(self, ctx):
        super().__init__(ctx)
        self.s = ctx.cfg.staleness
        self.grad = np.zeros(ctx.model.size, ctx.dtype)
        self.received = [0] * self.size    # updates received from each peer (= next clock)
        self.received[self.rank] = None
        self.pending = {}                  # (clock, source) -> payload, not yet applied
        self.sends = []                    # (request, buffer) in flight
        self.flags = deque()               # (request, buffer) of stop-flag Iallreduces
        self.clock = 0

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
            payload, src = _recv_bytes(self.comm, src, TAG_DELTA)
            self.pending[(self.received[src], src)] = payload
            self.received[src] += 1

    def _apply(self, upto):
        c = self.ctx
        ready = sorted(k for k in self.pending if k[0] <= upto)
        if ready:
            acc = np.zeros_like(c.params)
            for key in ready:
                self.ctx.compressor.decompress_add(self.pending.pop(key), acc)
            c.params -= acc

    def step(self, t):
        c, info = self.ctx, StepInfo(step=t)
        loss, info.samples, info.compute_s = c.compute(t, c.params, self.grad, self.rank, self.size,
                                                       1.0 / c.global_batch)
        t0 = time.perf_counter()
        flag = np.array([1 if c.stop_requested() else 0], np.int32)
        out = np.zeros(1, np.int32)
        self.flags.append((self.comm.Iallreduce(flag, out, MPI.MAX), out, flag))
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
                self.sends.append((self.comm.Isend([payload, MPI.BYTE], r, TAG_DELTA), payload))
                info.bytes_sent += payload.size
        self.sends = [(q, b) for q, b in self.sends if not q.Test()]
        # before clock t + 1: every update of clocks <= t - s must be in
        self._receive(block_until=t + 1 - self.s)
        self._apply(upto=t)
        if len(self.flags) > self.s:
            req, out, _ = self.flags.popleft()
            req.Wait()
            info.stop = bool(out[0])
        info.comm_s = time.perf_counter() - t0
        info.loss = loss / max(1, info.samples)
        self.clock = t + 1
        return info

    def _drain(self):
        """Receive and apply every update of every clock so far; finish the flag requests."""
        clocks = self.comm.allreduce(self.clock, MPI.MAX)
        self._receive(block_until=clocks)
        self._apply(upto=clocks)
        while self.flags:
            req, _, _ = self.flags.popleft()
            req.Wait()
        MPI.Request.Waitall([q for q, _ in self.sends])
        self.sends = []

    def resume_at(self, step):
        self.clock = step
        self.received = [None if r == self.rank else step for r in range(self.size)]

    def sync_point(self, step):
        self._drain()

    def finish(self):
        self._drain()
        self.comm.Bcast(self.ctx.params, root=0)  # erase rounding differences of update order

    def gather_state(self):
        c = self.ctx
        vels = self.comm.gather(c.opt.velocity, root=0)
        arrays = super().gather_state()
        if arrays is not None:
            for r, v in enumerate(vels):
                arrays[f"rank{r}_velocity"] = v
        return arrays

    def load_state(self, arrays):
        super().load_state(arrays)
        key = f"rank{self.rank}_velocity"
        if key in arrays:
            self.ctx.opt.velocity[...] = arrays[key]


class Backup(_Mode):
    """Synchronous SGD with backup workers (Chen et al. 2016), aggregated on rank 0.

    Every rank computes a gradient; rank 0 averages the first P - b that arrive
    for the current step (its own counts when it is done), drops late ones,
    updates, and sends the new parameters to every worker.  A late worker skips
    to the newest parameters it has been sent.
    """

    periodic_checkpoints = True

    def __init__(self, ctx):
        super().__init__(ctx)
        self.need = self.size - ctx.cfg.backup_workers
        self.grad = np.zeros(ctx.model.size, ctx.dtype)
        self.sends = []
        self.sent = 0          # gradients sent (workers)
        self.got = {}          # gradients received per worker (rank 0)
        self.dropped = 0
        self.next_step = None

    def step(self, t):
        c, info = self.ctx, StepInfo(step=t)
        loss, info.samples, info.compute_s = c.compute(t, c.params, self.grad, self.rank, self.size,
                                                       1.0 / max(1, c.shard_size(self.rank)))
        t0 = time.perf_counter()
        payload = c.compressor.compress(self.grad)
        if self.rank:
            msg = np.concatenate([_pack_header(t, loss, c.stop_requested(), info.samples), payload])
            self.sends.append((self.comm.Isend([msg, MPI.BYTE], 0, TAG_GRAD), msg))
            self.sent += 1
            info.bytes_sent = msg.size
            # newest parameters wins; a late worker skips the steps it missed
            msg, _ = _recv_bytes(self.comm, 0, TAG_PARAMS)
            st = MPI.Status()
            while self.comm.Iprobe(0, TAG_PARAMS, st):
                msg, _ = _recv_bytes(self.comm, 0, TAG_PARAMS)
            nxt, gloss, stop, _ = _unpack_header(msg)
            c.params[...] = msg[32:].view(c.dtype)
            info.loss, info.stop = gloss, stop
            self.sends = [(q, b) for q, b in self.sends if not q.Test()]
            self.next_step = nxt
        else:
            used = {0: (payload, loss, info.samples)}
            stop = c.stop_requested()
            while len(used) < self.need:
                msg, src = _recv_bytes(self.comm, MPI.ANY_SOURCE, TAG_GRAD)
                self.got[src] = self.got.get(src, 0) + 1
                step, wloss, wflag, wsamples = _unpack_header(msg)
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
            head = _pack_header(t + 1, info.loss, info.stop, total)
            msg = np.concatenate([head, c.params.view(np.uint8)])
            for r in range(1, self.size):
                self.sends.append((self.comm.Isend([msg, MPI.BYTE], r, TAG_PARAMS), msg))
                info.bytes_sent += msg.size
            self.sends = [(q, b) for q, b in self.sends if not q.Test()]
            self.next_step = t + 1
        info.comm_s = time.perf_counter() - t0
        return info

    def finish(self):
        """Workers report how many gradients they sent; rank 0 drains the late ones."""
        counts = self.comm.gather(self.sent, root=0)
        if self.rank == 0:
            for src in range(1, self.size):
                while self.got.get(src, 0) < counts[src]:
                    _recv_bytes(self.comm, src, TAG_GRAD)
                    self.got[src] = self.got.get(src, 0) + 1
                    self.dropped += 1
        MPI.Request.Waitall([q for q, _ in self.sends])
        self.sends = []
        # workers that stopped early (stop header) still hold the last params sent
        self.comm.Bcast(self.ctx.params, root=0)

    def gather_state(self):
        self.ctx.opt.velocity = self.comm.bcast(self.ctx.opt.velocity if self.rank == 0 else None)
        return super().gather_state()


class AsyncPS(_Mode):
    """Asynchronous parameter server: ranks 0..K-1 hold parameter shards, the rest are workers.

    A worker pulls every shard, computes a gradient on its share of the global
    batch and pushes each shard's (compressed) gradient with non-blocking sends,
    then pulls again; it never waits for the other workers.  A server applies
    every push as it arrives: SGD with momentum mu^(1/W), so W pushes decay the
    velocity like one synchronous step, and the rate times (1-mu^(1/W))/(1-mu),
    so W pushes move the parameters as far as one synchronous step.
    """

    periodic_checkpoints = False

    def __init__(self, ctx):
        super().__init__(ctx)
        self.k = ctx.cfg.servers
        self.workers = self.size - self.k
        self.is_worker = self.rank >= self.k
        n = ctx.model.size
        self.bounds = np.linspace(0, n, self.k + 1).round().astype(int)
        self.grad = np.zeros(n, ctx.dtype)
        self.sends = []
        from .compress import get_compressor
        self.comps = [get_compressor(ctx.cfg.compress, seed=ctx.cfg.seed * 100003 + self.rank * 131 + s)
                      for s in range(self.k)]
        mu = ctx.opt.momentum
        self.momentum = mu ** (1.0 / self.workers)
        # a velocity fed W times per round amplifies 1/(1-mu_push) instead of 1/(1-mu):
        # scale the rate so a round of W pushes moves as far as one synchronous step
        self.lr_factor = (1 - self.momentum) / (1 - mu) if mu > 0 else 1.0

    @property
    def logger_rank(self):
        return self.k

    def step(self, t):
        c, info = self.ctx, StepInfo(step=t)
        t0 = time.perf_counter()
        reqs = [self.comm.Irecv(c.params[self.bounds[s]:self.bounds[s + 1]], s, TAG_PARAMS)
                for s in range(self.k)]
        for s in range(self.k):
            self.comm.Send([np.zeros(0, np.uint8), MPI.BYTE], s, TAG_PULL)
        MPI.Request.Waitall(reqs)
        pull_s = time.perf_counter() - t0
        w = self.rank - self.k
        loss, info.samples, info.compute_s = c.compute(t, c.params, self.grad, w, self.workers,
                                                       1.0 / c.global_batch)
        t0 = time.perf_counter()
        head = _pack_header(t, loss, 0, info.samples)
        for s in range(self.k):
            lo, hi = self.bounds[s], self.bounds[s + 1]
            msg = np.concatenate([head, self.comps[s].compress(self.grad[lo:hi])])
            self.sends.append((self.comm.Isend([msg, MPI.BYTE], s, TAG_PUSH), msg))
            info.bytes_sent += msg.size
        self.sends = [(q, b) for q, b in self.sends if not q.Test()]
        info.comm_s = pull_s + time.perf_counter() - t0
        info.loss = loss / max(1, info.samples)
        info.stop = c.stop_requested()
        return info

    def serve(self):
        """Answer pulls and apply pushes until every worker is done; return pushes applied."""
        c = self.ctx
        lo, hi = self.bounds[self.rank], self.bounds[self.rank + 1]
        shard, vel = c.params[lo:hi], c.opt.velocity[lo:hi]
        dense = np.zeros(hi - lo, c.dtype)
        from .compress import get_compressor
        decoders = [get_compressor(c.cfg.compress) for _ in range(self.size)]
        done, applied, st = 0, 0, MPI.Status()
        self.bytes_sent = 0
        while done < self.workers:
            self.comm.Probe(MPI.ANY_SOURCE, MPI.ANY_TAG, st)
            src, tag = st.Get_source(), st.Get_tag()
            if tag == TAG_PULL:
                self.comm.Recv([np.zeros(0, np.uint8), MPI.BYTE], src, TAG_PULL)
                self.comm.Send(shard, src, TAG_PARAMS)
                self.bytes_sent += shard.nbytes
            elif tag == TAG_PUSH:
                msg, _ = _recv_bytes(self.comm, src, TAG_PUSH)
                step = _unpack_header(msg)[0]
                dense[...] = 0
                decoders[src].decompress_add(msg[32:], dense)
                vel *= vel.dtype.type(self.momentum)
                vel += dense
                shard -= shard.dtype.type(c.lr_at(step) * self.lr_factor) * vel
                applied += 1
            elif tag == TAG_DONE:
                self.comm.Recv([np.zeros(0, np.uint8), MPI.BYTE], src, TAG_DONE)
                done += 1
            else:
                raise RuntimeError(f"parameter server got unexpected tag {tag} from {src}")
        return applied

    def finish(self):
        c = self.ctx
        if self.is_worker:
            MPI.Request.Waitall([q for q, _ in self.sends])
            self.sends = []
            for s in range(self.k):
                self.comm.Send([np.zeros(0, np.uint8), MPI.BYTE], s, TAG_DONE)
        counts = np.diff(self.bounds)
        full = [counts, self.bounds[:-1]]
        for arr in (c.params, c.opt.velocity):
            mine = arr[self.bounds[self.rank]:self.bounds[self.rank + 1]].copy() \
                if self.rank < self.k else np.zeros(0, c.dtype)
            cnt = np.concatenate([counts, np.zeros(self.workers, int)])
            dsp = np.concatenate([full[1], np.full(self.workers, 0)])
            self.comm.Allgatherv(mine, [arr, cnt, dsp, from_numpy_dtype(arr.dtype)])


def make_mode(ctx):
    """Return the mode object for ``ctx.cfg.sync``."""
    return {"bsp": BSP, "ssp": SSP, "backup": Backup, "async": AsyncPS}[ctx.cfg.sync](ctx)
