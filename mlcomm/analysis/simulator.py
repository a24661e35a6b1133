"""Cost simulator: run every rank's schedule against a network model.

Matching is MPI's: the i-th ``Send`` from rank s to rank d pairs with the
i-th ``Recv`` at d from s.  A rank posts all the transfers of a step at once
when its previous step is done; a message starts when both its send and its
receive are posted and a port is free at each end; it takes
``alpha + bytes * beta``.  The step is done when all its transfers are, plus
``gamma`` per reduced byte of its ``Reduce`` ops (``Copy`` ops are free).

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
in seconds (see ``bench/simulate_speed.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ..schedule import Recv, Reduce, Send

__all__ = ["Network", "Program", "SimResult", "compile_schedules", "simulate",
           "simulate_schedules", "UNIT_NETWORK"]

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

    @classmethod
    def from_profile(cls, profile=None, **overrides) -> "Network":
        """Build a network from a :class:`mlcomm.profile.Profile` (default: the loaded one)."""
        if profile is None:
            from ..profile import load_profile
            profile = load_profile()
        net = cls(alpha=profile.alpha, beta=profile.beta, gamma=profile.gamma)
        return replace(net, **{k: v for k, v in overrides.items() if v is not None})

    @property
    def two_level(self) -> bool:
        return self.ranks_per_node > 1


#: alpha = 1 and nothing else: the simulated time is the number of rounds.
UNIT_NETWORK = Network(alpha=1.0, beta=0.0, gamma=0.0, ports=0)


@dataclass
class Program:
    """Every rank's schedule flattened into arrays (steps and matched messages)."""

    size: int
    itemsize: int
    rank_first: np.ndarray     # (p+1,) first global step id of each rank
    step_reduce: np.ndarray    # (S,) reduced bytes of each step
    step_ptr: np.ndarray       # (S+1,) CSR into step_msgs
    step_msgs: np.ndarray      # message ids of each step's transfers
    src: np.ndarray            # (M,) per message
    dst: np.ndarray
    nbytes: np.ndarray
    send_step: np.ndarray
    recv_step: np.ndarray

    @property
    def messages(self) -> int:
        return len(self.src)


@dataclass
class SimResult:
    """Simulated times: of every rank, every message, every step."""

    seconds: float             # the collective's time: the last rank to finish
    rank_finish: np.ndarray
    msg_start: np.ndarray
    msg_end: np.ndarray
    step_done: np.ndarray


def compile_schedules(schedules, itemsize: int = 8) -> Program:
    """Flatten ``schedules`` (one per rank, in rank order) and match their messages.

    Raises ValueError on a message without a partner or with sizes that differ.
    """
    p = len(schedules)
    rank_first = np.zeros(p + 1, dtype=np.int64)
    s_src, s_dst, s_step, s_cnt = [], [], [], []
    r_src, r_dst, r_step, r_cnt = [], [], [], []
    reduce_bytes = []
    g = 0
    for r, sched in enumerate(schedules):
        if sched.rank != r or sched.size != p:
            raise ValueError(f"schedule {r} says rank {sched.rank} of {sched.size}, expected {r} of {p}")
        rank_first[r] = g
        for step in sched.steps:
            for tr in step.transfers:
                if type(tr) is Send:
                    s_src.append(r); s_dst.append(tr.peer); s_step.append(g); s_cnt.append(tr.region.count)
                elif type(tr) is Recv:
                    r_src.append(tr.peer); r_dst.append(r); r_step.append(g); r_cnt.append(tr.region.count)
                else:
                    raise TypeError(f"not a transfer: {tr!r}")
            reduce_bytes.append(sum(op.dst.count for op in step.ops if type(op) is Reduce))
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
    owner = np.concatenate([send_step, recv_step])
    ids = np.concatenate([np.arange(m), np.arange(m)]).astype(np.int64)
    order = np.argsort(owner, kind="stable")
    step_ptr = np.zeros(g + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner, minlength=g), out=step_ptr[1:])
    return Program(p, itemsize, rank_first, arr(reduce_bytes) * itemsize, step_ptr,
                   ids[order], src, dst, cnt * itemsize, send_step, recv_step)


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
def _run(p, rank_first, step_reduce, step_ptr, step_msgs, src, dst, nbytes,
         send_step, recv_step, alpha, beta, gamma, ports, rpn, inter_alpha,
         inter_beta, nic_ports):
    nsteps = len(step_reduce)
    m = len(src)
    step_rank = np.empty(nsteps, dtype=np.int64)
    for r in range(p):
        for g in range(rank_first[r], rank_first[r + 1]):
            step_rank[g] = r
    remaining = np.empty(nsteps, dtype=np.int64)
    for g in range(nsteps):
        remaining[g] = step_ptr[g + 1] - step_ptr[g]
    step_end = np.zeros(nsteps)
    step_done = np.full(nsteps, -1.0)
    posted = np.zeros(m, dtype=np.int64)
    ready = np.zeros(m)
    msg_start = np.full(m, -1.0)
    msg_end = np.full(m, -1.0)
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
            if remaining[g] == 0:
                sn = _finish_step(g, t + step_reduce[g] * gamma, step_done, step_rank,
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
                sn = _finish_step(g, step_end[g] + step_reduce[g] * gamma, step_done, step_rank,
                                  rank_first, stack_g, stack_t, sn, rank_finish)
    return rank_finish, msg_start, msg_end, step_done, done_msgs


def simulate(program: Program, network: Network = Network()) -> SimResult:
    """Simulate ``program`` on ``network``; raise RuntimeError on a deadlock."""
    n = network
    rpn = max(1, int(n.ranks_per_node))
    ia = n.alpha if n.inter_alpha is None else n.inter_alpha
    ib = n.beta if n.inter_beta is None else n.inter_beta
    pr = program
    finish, start, end, done, count = _run(
        pr.size, pr.rank_first, pr.step_reduce.astype(np.float64), pr.step_ptr, pr.step_msgs,
        pr.src, pr.dst, pr.nbytes.astype(np.float64), pr.send_step, pr.recv_step,
        float(n.alpha), float(n.beta), float(n.gamma), int(n.ports), rpn, float(ia), float(ib),
        int(n.nic_ports))
    if count != pr.messages or (done < 0).any():
        stuck = np.flatnonzero(done < 0)
        ranks = sorted(set(np.searchsorted(pr.rank_first, stuck, side="right") - 1))
        raise RuntimeError(f"deadlock: {pr.messages - count} messages never start; "
                           f"ranks stuck: {ranks[:16]}{' ...' if len(ranks) > 16 else ''}")
    return SimResult(float(finish.max()) if len(finish) else 0.0, finish, start, end, done)


def simulate_schedules(schedules, itemsize: int = 8, network: Network = Network()) -> float:
    """Return the simulated time in seconds of ``schedules`` on ``network``."""
    return simulate(compile_schedules(schedules, itemsize), network).seconds


def _rounds(result: SimResult) -> int:
    return int(math.floor(result.seconds + 0.5))
