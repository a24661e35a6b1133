"""Asynchronous parameter server: ranks 0..K-1 hold parameter shards, the rest are workers.

A worker pulls every shard, computes a gradient on its share of a global
batch, pushes each shard's (compressed) gradient with non-blocking sends and
pulls again; it never waits for the other workers.  A server applies every
push as it arrives: SGD with momentum mu^(1/W), so W pushes decay the velocity
like one synchronous step, and the rate times (1-mu^(1/W))/(1-mu), so W pushes
move the parameters as far as one synchronous step.

``--steps`` counts global updates: pushes applied by the servers.  Server 0
answers every pull with a code.  Once ``--steps`` updates are applied (or a
worker or server 0 got SIGTERM) the code is *stop*; every ``--checkpoint-every``
updates it is *checkpoint*.  When every worker has been told, all ranks drain
the messages in flight (a server drops a push beyond the count) and then stop
or write the checkpoint together.  A straggler therefore holds nobody: the job
ends when the servers have applied ``--steps`` updates, whoever sent them.

The staleness of an update is the server's clock (updates applied to its
shard) when it applies the push minus the clock of the parameters the worker
pulled for it.
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from .compress import get_compressor
from .sync import Mode, StepInfo, checkpoint_arrays, pack_header, recv_bytes, unpack_header

__all__ = ["AsyncPS"]

TAG_PARAMS, TAG_PULL, TAG_PUSH, TAG_REPLY, TAG_CTRL = 103, 105, 106, 107, 108
CONTINUE, CHECKPOINT, STOP = 0, 1, 2
_EMPTY = np.zeros(0, np.uint8)


class AsyncPS(Mode):
    """Asynchronous parameter server with K server ranks and P - K workers."""

    periodic_checkpoints = False  # server 0 calls them, every N global updates

    def __init__(self, ctx):
        super().__init__(ctx)
        cfg = ctx.cfg
        self.k = cfg.servers
        self.workers = self.size - self.k
        self.is_worker = self.rank >= self.k
        n = ctx.model.size
        self.bounds = np.linspace(0, n, self.k + 1).round().astype(int)
        mu = ctx.opt.momentum
        self.momentum = mu ** (1.0 / self.workers)
        # a velocity fed W times per round amplifies 1/(1-mu_push) instead of 1/(1-mu):
        # scale the rate so a round of W pushes moves as far as one synchronous step
        self.lr_factor = (1 - self.momentum) / (1 - mu) if mu > 0 else 1.0
        self.every = cfg.checkpoint_every if cfg.checkpoint else 0
        self.start = 0
        if self.is_worker:
            self.grad = np.zeros(n, ctx.dtype)
            self.comps = [get_compressor(cfg.compress, seed=cfg.seed * 100003 + self.rank * 131 + s)
                          for s in range(self.k)]
            self.replies = np.zeros((self.k, 2), np.int64)  # per server: code, clock
            self.pushes = np.zeros(self.k, np.int64)         # pushes sent to each server
            self.pulls = np.zeros(self.k, np.int64)          # pulls sent to each server
            self.sends = []                                  # (request, buffer) in flight
            self.waiting = []                                # pull replies not yet waited for
            self.row_clocks = []                             # shard clocks at each computed step
            self.local = 0                                   # this worker's next batch
            self.local_saved = None
        else:
            self.applied = 0                    # updates applied to this shard (its clock)
            self.staleness, self.samples = [], []   # per update applied in this run
            self.dropped = []                   # clock at each push dropped
            self.got_push = np.zeros(self.size, np.int64)
            self.got_pull = np.zeros(self.size, np.int64)
            self.decoders = [get_compressor(cfg.compress) for _ in range(self.size)]
            self.shard = self._shard(ctx.params, self.rank)
            self.vel = self._shard(ctx.opt.velocity, self.rank)
            self.dense = np.zeros(self.shard.size, ctx.dtype)

    @property
    def logger_rank(self):
        return self.k

    def resume_at(self, step):
        self.start = step
        if not self.is_worker:
            self.applied = step
            return step
        self.local = self.local_saved if self.local_saved is not None else step // self.workers
        return self.local

    def more(self, step):
        return True  # server 0 says when to stop

    def progress(self, step):
        return int(self.replies[0, 1])  # server 0's clock at the last pull

    def final_step(self, step):
        applied = np.array([self.applied if self.rank == 0 else 0], np.int64)
        return int(self.wire.bcast(applied, root=0)[0])

    # worker

    def _shard(self, arr, s):
        return arr[self.bounds[s]:self.bounds[s + 1]]

    def _pull(self):
        """Pull every shard; return server 0's code (the other replies may still be in flight)."""
        c = self.ctx
        reqs = []
        for s in range(self.k):
            reqs.append(self.comm.Irecv(self.replies[s], s, TAG_REPLY))
            reqs.append(self.comm.Irecv(self._shard(c.params, s), s, TAG_PARAMS))
        for s in range(self.k):
            self.wire.send(_EMPTY, s, TAG_PULL)
        self.pulls += 1
        MPI.Request.Waitall(reqs[:2])
        code = int(self.replies[0, 0])
        if code == CONTINUE:
            MPI.Request.Waitall(reqs[2:])
        else:
            self.waiting = reqs[2:]
        return code

    def step(self, t):
        c, info = self.ctx, StepInfo(step=t)
        self.local = t
        t0 = time.perf_counter()
        code = self._pull()
        while code == CHECKPOINT:
            self._drain()
            c.checkpoint(None)
            code = self._pull()
        if code == STOP:
            self._drain()
            info.stop, info.computed = True, False
            info.comm_s = time.perf_counter() - t0
            return info
        pull_s = time.perf_counter() - t0
        clocks = self.replies[:, 1].copy()
        if self.rank == self.logger_rank:
            self.row_clocks.append(clocks)
        w = self.rank - self.k
        loss, info.samples, info.compute_s = c.compute(t, c.params, self.grad, w, self.workers,
                                                       1.0 / c.global_batch)
        t0 = time.perf_counter()
        flag = c.stop_requested()
        for s in range(self.k):
            head = pack_header(clocks[s], loss, flag, info.samples)
            msg = np.concatenate([head, self.comps[s].compress(self._shard(self.grad, s))])
            self.sends.append((self.wire.isend(msg, s, TAG_PUSH), msg))
        self.pushes += 1
        self.sends = [(q, b) for q, b in self.sends if not q.Test()]
        info.comm_s = pull_s + time.perf_counter() - t0
        info.loss = loss / max(1, info.samples)
        return info

    # server

    def _pull_request(self, src, code):
        """Answer a pull from ``src``: the code (server 0's), this shard's clock and the shard."""
        self.comm.Recv([_EMPTY, MPI.BYTE], src, TAG_PULL)
        self.got_pull[src] += 1
        self.wire.send(np.array([code if self.rank == 0 else CONTINUE, self.applied], np.int64),
                       src, TAG_REPLY)
        self.wire.send(self.shard, src, TAG_PARAMS)

    def _push(self, src):
        """Receive a push from ``src``; apply it, or drop it once ``--steps`` updates are in."""
        c = self.ctx
        msg, _ = recv_bytes(self.comm, src, TAG_PUSH)
        self.got_push[src] += 1
        clock, _, flag, samples = unpack_header(msg)
        if self.applied >= c.cfg.steps:
            self.dropped.append(self.applied)
            return flag
        dense, vel = self.dense, self.vel
        dense[...] = 0
        self.decoders[src].decompress_add(msg[32:], dense)
        vel *= vel.dtype.type(self.momentum)
        vel += dense
        self.shard -= dense.dtype.type(c.lr_at(self.applied // self.workers) * self.lr_factor) * vel
        self.staleness.append(self.applied - clock)
        self.samples.append(samples)
        self.applied += 1
        return flag

    def serve(self):
        """Answer pulls and apply pushes until told to stop."""
        c = self.ctx
        phase, told, stop_wanted, st = CONTINUE, 0, False, MPI.Status()
        while True:
            self.comm.Probe(MPI.ANY_SOURCE, MPI.ANY_TAG, st)
            src, tag = st.Get_source(), st.Get_tag()
            if tag == TAG_PULL:
                if self.rank == 0 and phase == CONTINUE and (
                        stop_wanted or self.applied >= c.cfg.steps or c.stop_requested()):
                    phase = STOP
                self._pull_request(src, phase)
                told += phase != CONTINUE
                if told == self.workers:
                    for s in range(1, self.k):
                        self.wire.send(np.array([phase], np.int64), s, TAG_CTRL)
                    if self._together(phase):
                        return
                    phase, told = CONTINUE, 0
            elif tag == TAG_PUSH:
                stop_wanted |= self._push(src)
                if self.rank == 0 and phase == CONTINUE and self.every and \
                        self.applied % self.every == 0 and self.start < self.applied < c.cfg.steps:
                    phase = CHECKPOINT
            elif tag == TAG_CTRL and src == 0:
                code = np.zeros(1, np.int64)
                self.comm.Recv(code, 0, TAG_CTRL)
                if self._together(int(code[0])):
                    return
            else:
                raise RuntimeError(f"parameter server {self.rank} got unexpected tag {tag} "
                                   f"from rank {src}")

    def _together(self, code):
        """Every rank drains, then checkpoints (return False) or stops (return True)."""
        self._drain()
        if code == CHECKPOINT:
            self.ctx.checkpoint(self.applied)
            return False
        return True

    # every rank

    def _drain(self):
        """Collective: every pull and push posted so far is answered or applied."""
        mine = np.zeros(2 * self.k, np.int64)
        if self.is_worker:
            mine[:self.k], mine[self.k:] = self.pushes, self.pulls
        sent = self.wire.allgather(mine).reshape(self.size, 2 * self.k)
        if self.is_worker:
            MPI.Request.Waitall(self.waiting + [q for q, _ in self.sends])
            self.waiting, self.sends = [], []
            return
        st = MPI.Status()
        for w in range(self.k, self.size):
            pushes, pulls = sent[w, self.rank], sent[w, self.k + self.rank]
            while self.got_push[w] < pushes or self.got_pull[w] < pulls:
                self.comm.Probe(w, MPI.ANY_TAG, st)
                if st.Get_tag() == TAG_PUSH:
                    self._push(w)
                else:
                    self._pull_request(w, CONTINUE)

    def finish(self):
        """Every rank gets every server's shard of the parameters and the velocity."""
        c = self.ctx
        for arr in (c.params, c.opt.velocity):
            for s in range(self.k):
                self.wire.bcast(self._shard(arr, s), root=s)

    def annotate(self, rows):
        """Each row covers the updates applied between the logger's pull for it and its next pull.

        Its ``step`` becomes the global update count at the end of that window;
        staleness is over every shard's updates in the window, ``updates``,
        ``samples`` and ``dropped`` are server 0's.
        """
        mine = None if self.is_worker else (self.start, self.staleness, self.samples, self.dropped)
        servers = self.comm.gather(mine, root=self.logger_rank)
        if self.rank != self.logger_rank or not rows:
            return
        servers = servers[:self.k]
        ends = [start + len(stale) for start, stale, _, _ in servers]
        prev_wall = 0.0
        for i, row in enumerate(rows):
            stale, windows = [], []
            for s, (start, st, samples, dropped) in enumerate(servers):
                lo = start if i == 0 else int(self.row_clocks[i][s])
                hi = ends[s] if i == len(rows) - 1 else int(self.row_clocks[i + 1][s])
                stale += st[lo - start:hi - start]
                windows.append((lo, hi))
            lo, hi = windows[0]
            start0, _, samples0, dropped0 = servers[0]
            row["step"] = hi
            row["updates"] = hi - lo
            row["samples"] = int(sum(samples0[lo - start0:hi - start0]))
            row["dropped"] = sum(1 for d in dropped0 if d >= lo and (d < hi or i == len(rows) - 1))
            row["staleness_mean"] = float(np.mean(stale)) if stale else float("nan")
            row["staleness_max"] = int(max(stale)) if stale else 0
            row["lr"] = self.ctx.lr_at(max(0, hi - 1) // self.workers)
            dt = row["wall_s"] - prev_wall
            row["samples_per_s"] = row["samples"] / dt if dt > 0 else float("nan")
            prev_wall = row["wall_s"]

    def gather_state(self):
        """Full parameters and velocity from the shards; each worker's compressors and batch."""
        c = self.ctx
        if self.is_worker:
            mine = {f"comp{s}_{k}": v for s, comp in enumerate(self.comps)
                    for k, v in comp.state().items()}
            mine["local"] = np.array(self.local)
        else:
            mine = {"params": self._shard(c.params, self.rank).copy(),
                    "velocity": self._shard(c.opt.velocity, self.rank).copy()}
        states = self.comm.gather(mine, root=0)
        if self.rank:
            return None
        params, velocity = (np.concatenate([states[s][name] for s in range(self.k)])
                            for name in ("params", "velocity"))
        return checkpoint_arrays(params, velocity,
                                 ((r, states[r]) for r in range(self.k, self.size)))

    def load_rank_state(self, arrays):
        if not self.is_worker:
            return
        for s, comp in enumerate(self.comps):
            prefix = f"rank{self.rank}_comp{s}_"
            state = {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}
            if state:
                comp.load(state)
        if f"rank{self.rank}_local" in arrays:
            self.local_saved = int(arrays[f"rank{self.rank}_local"])
