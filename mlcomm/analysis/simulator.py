"""Cost simulator: run every rank's schedule against a network model.

Matching is MPI's: the i-th ``Send`` from rank s to rank d pairs with the
i-th ``Recv`` at d from s.  A rank posts all the transfers of a step at once
when its previous step is done; a message starts when both its send and its
receive are posted and a port is free at each end; it takes
``alpha + bytes * beta``.  The step is done when all its transfers are, plus
``gamma`` per reduced byte of its ``Reduce`` ops, plus ``copy_beta`` per byte of
its ``Copy`` ops that touch a node window slot or read a node peer's buffer (the
node's data movement; other copies are free, as in the lecture notes' model).

Node synchronisation: a ``Post`` is made when its step starts (it publishes the
writes of the steps before); an ``Await(peer, k)`` completes at the later of its
own step's start and ``peer``'s k-th post plus ``sync`` (a flag handed over through
shared cache lines: default ``alpha / 4``, the figure the window algorithms' closed
forms use); ``Await(peer, 0)`` (the previous collective) completes at once.  Awaits
take no port and move no bytes.

Port models: ``ports=1`` (default) is single-port full duplex: a rank sends one
message and receives one message at a time.  ``ports=k`` allows k of each;
``ports=0`` is unlimited.  Messages that are ready at the same time take a
port in order of ring distance ``(dst - src) mod p`` then message id, which is
how MPI libraries stagger their all-to-all exchanges, so a shifted exchange
of p-1 messages takes p-1 message times.

The two-level cluster model (``ranks_per_node > 1``) places ranks on nodes in
blocks (rank r on node r // ranks_per_node).  Messages within a node cost
``alpha + bytes * beta``; messages between nodes cost
``inter_alpha + bytes * inter_beta`` and also take a port of the sending and
the receiving node's NIC (``nic_ports`` of each; 0 = unlimited).

The event loop is compiled with Numba; every algorithm at p = 1024 simulates
in seconds, and ``hierarchical`` at 4096 ranks (8 per node) too (see
``bench/simulate_speed.py``).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field, replace

import numpy as np

from ..ir.schedule import Await, Copy, Post, Recv, Reduce, Send, owner

__all__ = ["Network", "SimProgram", "SimResult", "compile_schedules", "simulate",
           "simulate_schedules", "step_costs", "critical_path", "PATH_TERMS", "UNIT_NETWORK"]

try:  # Numba compiles the event loop; without it the same code runs as Python.
    from numba import njit
except ImportError:  # pragma: no cover - numba is a dependency
    def njit(*args, **kwargs):
        return args[0] if args and callable(args[0]) else (lambda f: f)


@dataclass(frozen=True)
class Network:
    """Cost-model constants and port model of the simulated machine."""

    alpha: float = 2e-6
    beta: float = 8e-11
    gamma: float = 1e-10
    ports: int = 1
    ranks_per_node: int = 1
    inter_alpha: float | None = None
    inter_beta: float | None = None
    nic_ports: int = 1
    #: seconds per byte of a copy into or out of a node window slot (None: ``beta``)
    copy_beta: float | None = None
    #: seconds from a node post to the await that sees it (None: ``alpha / 4``)
    sync: float | None = None

    @classmethod
    def from_profile(cls, profile=None, **overrides) -> "Network":
        """Build a network from a :class:`mlcomm.model.machine.Profile` (default: the loaded
        one)."""
        if profile is None:
            from ..model.machine import load_profile
            profile = load_profile()
        net = cls(alpha=profile.alpha, beta=profile.beta, gamma=profile.gamma)
        return replace(net, **{k: v for k, v in overrides.items() if v is not None})

    @property
    def two_level(self) -> bool:
        return self.ranks_per_node > 1

    @property
    def copy_cost(self) -> float:
        """Seconds per byte copied into or out of a window slot."""
        return self.beta if self.copy_beta is None else self.copy_beta

    @property
    def sync_cost(self) -> float:
        """Seconds from a node post to the await that sees it."""
        return self.alpha / 4 if self.sync is None else self.sync

    @property
    def between_alpha(self) -> float:
        """Latency of a message between nodes."""
        return self.alpha if self.inter_alpha is None else self.inter_alpha

    @property
    def between_beta(self) -> float:
        """Seconds per byte of a message between nodes."""
        return self.beta if self.inter_beta is None else self.inter_beta


#: alpha = 1, sync = 1 and nothing else: the simulated time is the number of rounds, a
#: round being one message time or one node synchronisation.
UNIT_NETWORK = Network(alpha=1.0, beta=0.0, gamma=0.0, ports=0, copy_beta=0.0, sync=1.0)


@dataclass
class SimProgram:
    """Every rank's schedule flattened into arrays (steps, matched messages, node syncs)."""

    size: int
    itemsize: int
    rank_first: np.ndarray     # (p+1,) first global step id of each rank
    step_reduce: np.ndarray    # (S,) reduced bytes of each step
    step_copy: np.ndarray      # (S,) bytes each step copies into or out of window slots
    step_window_reads: np.ndarray  # (S,) bytes each step's ops read from other ranks' slots
    step_ptr: np.ndarray       # (S+1,) CSR into step_msgs
    step_msgs: np.ndarray      # message ids of each step's transfers
    src: np.ndarray            # (M,) per message
    dst: np.ndarray
    nbytes: np.ndarray
    send_step: np.ndarray
    recv_step: np.ndarray
    post_step: np.ndarray      # (N,) the step of each post
    await_step: np.ndarray     # (A,) the step of each await
    await_post: np.ndarray     # (A,) the post it waits for; -1: the previous collective
    step_posts: tuple          # (ptr (S+1,), post ids): CSR of each step's posts
    step_awaits: tuple         # CSR of each step's awaits
    post_awaits: tuple         # CSR of the awaits of each post

    @property
    def messages(self) -> int:
        return len(self.src)

    @property
    def syncs(self) -> int:
        """Awaits of a post of this collective (``Await(peer, 0)`` not counted)."""
        return int((self.await_post >= 0).sum())


@dataclass
class SimResult:
    """Simulated times: of every rank, every message, every step."""

    seconds: float             # the collective's time: the last rank to finish
    rank_finish: np.ndarray
    msg_start: np.ndarray
    msg_end: np.ndarray
    step_done: np.ndarray
    await_done: np.ndarray = field(default_factory=lambda: np.zeros(0))


def _csr(owner, n):
    """``(ptr, ids)``: the ids 0..len(owner)-1 grouped by ``owner`` (in 0..n-1), in order."""
    owner = np.asarray(owner, dtype=np.int64)
    ptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner, minlength=n), out=ptr[1:])
    return ptr, np.argsort(owner, kind="stable").astype(np.int64)


def compile_schedules(schedules, itemsize: int = 8) -> SimProgram:
    """Flatten ``schedules`` (one per rank, in rank order) and match their messages and posts.

    Raises ValueError on a message without a partner or with sizes that differ, and on
    an await of a post that is never made.
    """
    # Millions of small records: the cyclic GC would rescan them all as the lists grow.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _compile(schedules, itemsize)
    finally:
        if was_enabled:
            gc.enable()


def _compile(schedules, itemsize):
    p = len(schedules)
    rank_first = np.zeros(p + 1, dtype=np.int64)
    s_src, s_dst, s_step, s_cnt = [], [], [], []
    r_src, r_dst, r_step, r_cnt = [], [], [], []
    reduce_bytes, copy_bytes, peer_reads = [], [], []
    posts = {}                      # (rank, k) -> post id
    post_step, waits = [], []       # waits: (step, rank, peer, k)
    owners = {}                     # buffer name -> the rank whose slot it is, or None

    def owner_of(buffer):
        try:
            return owners[buffer]
        except KeyError:
            owners[buffer] = owner(buffer)
            return owners[buffer]

    g = 0
    for r, sched in enumerate(schedules):
        if sched.rank != r or sched.size != p:
            raise ValueError(f"schedule {r} says rank {sched.rank} of {sched.size}, expected {r} of {p}")
        rank_first[r] = g
        for step in sched.steps:
            for tr in step.transfers:
                kind = type(tr)
                if kind is Send:
                    s_src.append(r); s_dst.append(tr.peer); s_step.append(g); s_cnt.append(tr.region.count)
                elif kind is Recv:
                    r_src.append(tr.peer); r_dst.append(r); r_step.append(g); r_cnt.append(tr.region.count)
                elif kind is Post:
                    posts[r, tr.count] = len(post_step)
                    post_step.append(g)
                elif kind is Await:
                    waits.append((g, r, tr.peer, tr.count))
                else:
                    raise TypeError(f"not a transfer: {tr!r}")
            reduced = copied = read = 0
            for op in step.ops:
                n = op.dst.count
                if type(op) is Reduce:
                    reduced += n
                    q = owner_of(op.src.buffer)
                    read += n if q is not None and q != r else 0
                    if op.left is not None:
                        q = owner_of(op.left.buffer)
                        read += n if q is not None and q != r else 0
                elif type(op) is Copy:
                    q = owner_of(op.src.buffer)
                    if q is not None or owner_of(op.dst.buffer) is not None:
                        copied += n
                    read += n if q is not None and q != r else 0
            reduce_bytes.append(reduced)
            copy_bytes.append(copied)
            peer_reads.append(read)
            g += 1
    rank_first[p] = g
    arr = lambda xs: np.asarray(xs, dtype=np.int64)
    s_src, s_dst, s_step, s_cnt = map(arr, (s_src, s_dst, s_step, s_cnt))
    r_src, r_dst, r_step, r_cnt = map(arr, (r_src, r_dst, r_step, r_cnt))
    if len(s_src) != len(r_src):
        raise ValueError(f"{len(s_src)} sends but {len(r_src)} receives")
    # stable sorts keep each pair's posting order, so equal positions match
    so = np.lexsort((s_dst, s_src))
    ro = np.lexsort((r_dst, r_src))
    src, dst = s_src[so], s_dst[so]
    if not (np.array_equal(src, r_src[ro]) and np.array_equal(dst, r_dst[ro])):
        bad = np.flatnonzero((src != r_src[ro]) | (dst != r_dst[ro]))[0]
        raise ValueError(f"unmatched message near {src[bad]} -> {dst[bad]}: "
                         "sends and receives per rank pair differ")
    cnt = s_cnt[so]
    if not np.array_equal(cnt, r_cnt[ro]):
        bad = np.flatnonzero(cnt != r_cnt[ro])[0]
        raise ValueError(f"message {src[bad]} -> {dst[bad]} sends {cnt[bad]} elements "
                         f"but the receive expects {r_cnt[ro][bad]}")
    if len(src) and (src.min() < 0 or dst.max() >= p or dst.min() < 0):
        raise ValueError("a transfer names a peer outside the communicator")
    send_step, recv_step = s_step[so], r_step[ro]
    m = len(src)
    # CSR: each step lists the messages it sends or receives
    ptr, order = _csr(np.concatenate([send_step, recv_step]), g)
    ids = np.concatenate([np.arange(m), np.arange(m)]).astype(np.int64)
    await_post = []
    for step_id, r, peer, k in waits:
        if k == 0:
            await_post.append(-1)
            continue
        pid = posts.get((peer, k))
        if pid is None:
            raise ValueError(f"rank {r} awaits post {k} of rank {peer}, which rank {peer} "
                             f"never makes")
        await_post.append(pid)
    await_step, await_post, post_step = arr([w[0] for w in waits]), arr(await_post), arr(post_step)
    waiting = await_post >= 0
    pa_ptr, pa_ids = _csr(await_post[waiting], len(post_step))
    return SimProgram(p, itemsize, rank_first, arr(reduce_bytes) * itemsize,
                   arr(copy_bytes) * itemsize, arr(peer_reads) * itemsize, ptr, ids[order],
                   src, dst, cnt * itemsize, send_step, recv_step, post_step, await_step,
                   await_post, _csr(post_step, g), _csr(await_step, g),
                   (pa_ptr, np.flatnonzero(waiting)[pa_ids].astype(np.int64)))


@njit(cache=True)
def _before(key, tie, val, i, j, or_equal):
    """Heap order: entry i comes before entry j by (key, tie, val)."""
    if key[i] != key[j]:
        return key[i] < key[j]
    if tie[i] != tie[j]:
        return tie[i] < tie[j]
    return val[i] <= val[j] if or_equal else val[i] < val[j]


@njit(cache=True)
def _finish_step(g, fin, step_done, step_rank, rank_first, stack_g, stack_t, sn, rank_finish):
    """Record step ``g`` done at ``fin``; queue the rank's next step or finish the rank."""
    step_done[g] = fin
    r = step_rank[g]
    if g + 1 < rank_first[r + 1]:
        stack_g[sn] = g + 1
        stack_t[sn] = fin
        sn += 1
    else:
        rank_finish[r] = fin
    return sn


@njit(cache=True)
def _swap(key, tie, val, i, j):
    key[i], key[j] = key[j], key[i]
    tie[i], tie[j] = tie[j], tie[i]
    val[i], val[j] = val[j], val[i]


@njit(cache=True)
def _heap_push(key, tie, val, n, k, t, v):
    i = n
    key[i] = k; tie[i] = t; val[i] = v
    while i > 0:
        j = (i - 1) >> 1
        if _before(key, tie, val, j, i, True):
            break
        _swap(key, tie, val, i, j)
        i = j
    return n + 1


@njit(cache=True)
def _heap_pop(key, tie, val, n):
    k, v = key[0], val[0]
    n -= 1
    key[0] = key[n]; tie[0] = tie[n]; val[0] = val[n]
    i = 0
    while True:
        a = 2 * i + 1
        if a >= n:
            break
        b = a + 1
        c = a
        if b < n and _before(key, tie, val, b, a, False):
            c = b
        if _before(key, tie, val, i, c, True):
            break
        _swap(key, tie, val, i, c)
        i = c
    return k, v, n


@njit(cache=True)
def _take_port(ports, row, ready):
    """Return (start, column) of the earliest-free port of ``row`` for a message ready at ``ready``."""
    best = 0
    for c in range(1, ports.shape[1]):
        if ports[row, c] < ports[row, best]:
            best = c
    return max(ready, ports[row, best]), best


@njit(cache=True)
def _await_done(a, t, await_step, await_done, remaining, step_end):
    """Record await ``a`` done at ``t``; return its step when that leaves the step nothing
    to wait for, else -1."""
    await_done[a] = t
    g = await_step[a]
    if t > step_end[g]:
        step_end[g] = t
    remaining[g] -= 1
    return g if remaining[g] == 0 else -1


@njit(cache=True)
def _run(p, rank_first, step_cost, step_ptr, step_msgs, src, dst, nbytes,
         send_step, recv_step, sp_ptr, sp_ids, sa_ptr, sa_ids, await_step, await_post,
         pa_ptr, pa_ids, alpha, beta, ports, rpn, inter_alpha, inter_beta, nic_ports, sync):
    nsteps = len(step_cost)
    m = len(src)
    step_rank = np.empty(nsteps, dtype=np.int64)
    for r in range(p):
        for g in range(rank_first[r], rank_first[r + 1]):
            step_rank[g] = r
    remaining = np.empty(nsteps, dtype=np.int64)
    for g in range(nsteps):
        remaining[g] = step_ptr[g + 1] - step_ptr[g] + sa_ptr[g + 1] - sa_ptr[g]
    step_end = np.zeros(nsteps)
    step_done = np.full(nsteps, -1.0)
    posted = np.zeros(m, dtype=np.int64)
    ready = np.zeros(m)
    msg_start = np.full(m, -1.0)
    msg_end = np.full(m, -1.0)
    post_time = np.full(len(pa_ptr) - 1, -1.0)
    await_start = np.full(len(await_step), -1.0)
    await_done = np.full(len(await_step), -1.0)
    rank_finish = np.zeros(p)
    kp = max(ports, 1)
    send_free = np.zeros((p, kp))
    recv_free = np.zeros((p, kp))
    nodes = (p + rpn - 1) // rpn
    kn = max(nic_ports, 1)
    nic_out = np.zeros((nodes, kn))
    nic_in = np.zeros((nodes, kn))
    hkey = np.empty(m + 1)
    htie = np.empty(m + 1, dtype=np.int64)
    hval = np.empty(m + 1, dtype=np.int64)
    hn = 0
    stack_g = np.empty(nsteps + 1, dtype=np.int64)
    stack_t = np.empty(nsteps + 1)
    sn = 0
    for r in range(p):
        if rank_first[r + 1] > rank_first[r]:
            stack_g[sn] = rank_first[r]; stack_t[sn] = 0.0; sn += 1
    done_msgs = 0
    while True:
        # post every step that became ready; steps without transfers finish at once
        while sn > 0:
            sn -= 1
            g = stack_g[sn]; t = stack_t[sn]
            step_end[g] = t
            for i in range(step_ptr[g], step_ptr[g + 1]):
                mi = step_msgs[i]
                posted[mi] += 1
                if t > ready[mi]:
                    ready[mi] = t
                if posted[mi] == 2:
                    hn = _heap_push(hkey, htie, hval, hn, ready[mi],
                                    (dst[mi] - src[mi]) % p, mi)
            # this step's posts: the awaits already waiting for them complete
            for i in range(sp_ptr[g], sp_ptr[g + 1]):
                pid = sp_ids[i]
                post_time[pid] = t
                for j in range(pa_ptr[pid], pa_ptr[pid + 1]):
                    a = pa_ids[j]
                    if await_start[a] >= 0.0 and await_done[a] < 0.0:
                        h = _await_done(a, max(await_start[a], t + sync), await_step,
                                        await_done, remaining, step_end)
                        if h >= 0 and h != g:
                            sn = _finish_step(h, step_end[h] + step_cost[h], step_done,
                                              step_rank, rank_first, stack_g, stack_t, sn,
                                              rank_finish)
            # this step's awaits: those whose post is made complete now
            for i in range(sa_ptr[g], sa_ptr[g + 1]):
                a = sa_ids[i]
                await_start[a] = t
                pid = await_post[a]
                if pid < 0:
                    _await_done(a, t, await_step, await_done, remaining, step_end)
                elif post_time[pid] >= 0.0:
                    _await_done(a, max(t, post_time[pid] + sync), await_step, await_done,
                                remaining, step_end)
            if remaining[g] == 0:
                sn = _finish_step(g, step_end[g] + step_cost[g], step_done, step_rank,
                                  rank_first, stack_g, stack_t, sn, rank_finish)
        if hn == 0:
            break
        t0, mi, hn = _heap_pop(hkey, htie, hval, hn)
        s, d = src[mi], dst[mi]
        inter = rpn > 1 and s // rpn != d // rpn
        start = t0
        cs = 0
        cr = 0
        if ports > 0:
            start, cs = _take_port(send_free, s, start)
            start, cr = _take_port(recv_free, d, start)
            start = max(start, send_free[s, cs])
        cno = 0
        cni = 0
        if inter and nic_ports > 0:
            start, cno = _take_port(nic_out, s // rpn, start)
            start, cni = _take_port(nic_in, d // rpn, start)
            start = max(start, nic_out[s // rpn, cno])
            if ports > 0:
                start = max(start, send_free[s, cs], recv_free[d, cr])
        if inter:
            end = start + inter_alpha + nbytes[mi] * inter_beta
        else:
            end = start + alpha + nbytes[mi] * beta
        if ports > 0:
            send_free[s, cs] = end
            recv_free[d, cr] = end
        if inter and nic_ports > 0:
            nic_out[s // rpn, cno] = end
            nic_in[d // rpn, cni] = end
        msg_start[mi] = start
        msg_end[mi] = end
        done_msgs += 1
        for g in (send_step[mi], recv_step[mi]):
            if end > step_end[g]:
                step_end[g] = end
            remaining[g] -= 1
            if remaining[g] == 0:
                sn = _finish_step(g, step_end[g] + step_cost[g], step_done, step_rank,
                                  rank_first, stack_g, stack_t, sn, rank_finish)
    return rank_finish, msg_start, msg_end, step_done, await_done, done_msgs


def step_costs(program: SimProgram, network: Network) -> np.ndarray:
    """Seconds of each step's local ops: reductions (gamma) and window copies (copy cost)."""
    return (program.step_reduce.astype(np.float64) * network.gamma
            + program.step_copy.astype(np.float64) * network.copy_cost)


def simulate(program: SimProgram, network: Network = Network()) -> SimResult:
    """Simulate ``program`` on ``network``; raise RuntimeError on a deadlock."""
    n = network
    rpn = max(1, int(n.ranks_per_node))
    pr = program
    finish, start, end, done, awaited, count = _run(
        pr.size, pr.rank_first, step_costs(pr, n), pr.step_ptr, pr.step_msgs,
        pr.src, pr.dst, pr.nbytes.astype(np.float64), pr.send_step, pr.recv_step,
        *pr.step_posts, *pr.step_awaits, pr.await_step, pr.await_post, *pr.post_awaits,
        float(n.alpha), float(n.beta), int(n.ports), rpn, float(n.between_alpha),
        float(n.between_beta), int(n.nic_ports), float(n.sync_cost))
    if count != pr.messages or (done < 0).any():
        stuck = np.flatnonzero(done < 0)
        ranks = sorted(set(np.searchsorted(pr.rank_first, stuck, side="right") - 1))
        raise RuntimeError(f"deadlock: {pr.messages - count} messages never start, "
                           f"{int((awaited < 0).sum())} awaits never complete; "
                           f"ranks stuck: {ranks[:16]}{' ...' if len(ranks) > 16 else ''}")
    return SimResult(float(finish.max()) if len(finish) else 0.0, finish, start, end, done,
                     awaited)


def simulate_schedules(schedules, itemsize: int = 8, network: Network = Network()) -> float:
    """Return the simulated time in seconds of ``schedules`` on ``network``."""
    return simulate(compile_schedules(schedules, itemsize), network).seconds


#: The terms of :func:`critical_path`, in display order.
PATH_TERMS = ("inter-node latency", "inter-node bandwidth", "intra-node latency",
              "intra-node bandwidth", "waiting for a port or NIC", "node syncs",
              "reductions", "window copies")


def critical_path(program: SimProgram, result: SimResult, network: Network) -> dict:
    """Split the simulated time into the terms of :data:`PATH_TERMS` along the critical path.

    The path runs back from the last rank to finish: each step ends with its local ops
    after the last of its start, its messages and its awaits; a message's time is its
    alpha and bytes x beta (inter- or intra-node), after any wait for a port or NIC since
    both ends posted it; an await that waited is one sync after its peer's post. Returns
    ``{term: seconds}`` (summing to the simulated time) and, under ``"counts"``, how many
    inter-node messages, intra-node messages and syncs the path holds.
    """
    pr, n = program, network
    rpn = max(1, int(n.ranks_per_node))
    terms = dict.fromkeys(PATH_TERMS, 0.0)
    counts = {"inter-node messages": 0, "intra-node messages": 0, "node syncs": 0}
    if not len(pr.step_reduce):
        return {**terms, "counts": counts}
    nsteps = len(pr.step_reduce)
    step_rank = np.searchsorted(pr.rank_first, np.arange(nsteps), side="right") - 1
    first = pr.rank_first[step_rank] == np.arange(nsteps)
    start = np.where(first, 0.0, np.roll(result.step_done, 1))
    reduce_s = pr.step_reduce * n.gamma
    copy_s = pr.step_copy * n.copy_cost
    ends = pr.rank_first[1:] - 1
    live = pr.rank_first[1:] > pr.rank_first[:-1]
    g = int(ends[live][np.argmax(result.rank_finish[live])])
    sp_ptr, _ = pr.step_posts
    sa_ptr, sa_ids = pr.step_awaits
    tol = 1e-12 * max(1.0, result.seconds)
    while g >= 0:
        terms["reductions"] += float(reduce_s[g])
        terms["window copies"] += float(copy_s[g])
        cause, when = None, start[g] + tol
        for mi in pr.step_msgs[pr.step_ptr[g]:pr.step_ptr[g + 1]]:
            if result.msg_end[mi] > when:
                cause, when = ("message", mi), result.msg_end[mi]
        for a in sa_ids[sa_ptr[g]:sa_ptr[g + 1]]:
            if result.await_done[a] > when:
                cause, when = ("await", a), result.await_done[a]
        if cause is None:  # nothing waited: the step began when the one before ended
            g = -1 if first[g] else g - 1
            continue
        kind, i = cause
        if kind == "message":
            s, d = pr.src[i], pr.dst[i]
            inter = rpn > 1 and s // rpn != d // rpn
            alpha = n.between_alpha if inter else n.alpha
            place = "inter-node" if inter else "intra-node"
            terms[f"{place} latency"] += alpha
            terms[f"{place} bandwidth"] += float(result.msg_end[i] - result.msg_start[i]) - alpha
            counts[f"{place} messages"] += 1
            later = max((pr.send_step[i], pr.recv_step[i]), key=lambda h: start[h])
            terms["waiting for a port or NIC"] += float(result.msg_start[i] - start[later])
            g = -1 if first[later] else later - 1
        else:
            post = pr.post_step[pr.await_post[i]]
            terms["node syncs"] += float(result.await_done[i] - start[post])
            counts["node syncs"] += 1
            g = -1 if first[post] else post - 1
    return {**terms, "counts": counts}
