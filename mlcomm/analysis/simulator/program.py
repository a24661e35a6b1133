"""Every rank's schedule flattened into arrays, its messages and node syncs matched
(:class:`SimProgram`, :func:`compile_schedules`)."""

from __future__ import annotations

import gc
from dataclasses import dataclass

import numpy as np

from ...ir.schedule import Await, Copy, Post, Recv, Reduce, Send, owner

__all__ = ["SimProgram", "compile_schedules"]


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
    flat = _flatten(schedules)
    g = flat["steps"]
    src, dst, cnt, send_step, recv_step = _match_messages(flat["sends"], flat["recvs"], p)
    m = len(src)
    # CSR: each step lists the messages it sends or receives
    ptr, order = _csr(np.concatenate([send_step, recv_step]), g)
    ids = np.concatenate([np.arange(m), np.arange(m)]).astype(np.int64)
    waits = flat["waits"]
    await_step = _ints([w[0] for w in waits])
    await_post = _ints(_match_awaits(waits, flat["posts"]))
    post_step = _ints(flat["post_step"])
    waiting = await_post >= 0
    pa_ptr, pa_ids = _csr(await_post[waiting], len(post_step))
    return SimProgram(p, itemsize, flat["rank_first"], _ints(flat["reduce"]) * itemsize,
                   _ints(flat["copy"]) * itemsize, _ints(flat["reads"]) * itemsize, ptr,
                   ids[order], src, dst, cnt * itemsize, send_step, recv_step, post_step,
                   await_step, await_post, _csr(post_step, g), _csr(await_step, g),
                   (pa_ptr, np.flatnonzero(waiting)[pa_ids].astype(np.int64)))


def _ints(xs):
    return np.asarray(xs, dtype=np.int64)


def _flatten(schedules) -> dict:
    """Every rank's steps in rank order (global step ids): their sends and receives as
    ``(src, dst, step, count)`` lists, their posts and awaits, and their ops' bytes."""
    p = len(schedules)
    rank_first = np.zeros(p + 1, dtype=np.int64)
    s_src, s_dst, s_step, s_cnt = sends = [], [], [], []
    r_src, r_dst, r_step, r_cnt = recvs = [], [], [], []
    reduce_bytes, copy_bytes, peer_reads = [], [], []
    posts = {}                      # (rank, k) -> post id
    post_step, waits = [], []       # waits: (step, rank, peer, k)
    owner_of = _owners()
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
            g += 1
        _op_bytes(sched.steps, r, owner_of, reduce_bytes, copy_bytes, peer_reads)
    rank_first[p] = g
    return {"rank_first": rank_first, "steps": g, "sends": sends, "recvs": recvs,
            "reduce": reduce_bytes, "copy": copy_bytes, "reads": peer_reads, "posts": posts,
            "post_step": post_step, "waits": waits}


def _owners():
    """``owner_of(buffer)``: :func:`~mlcomm.ir.schedule.owner`, once per buffer name."""
    owners = {}                     # buffer name -> the rank whose slot it is, or None

    def owner_of(buffer):
        try:
            return owners[buffer]
        except KeyError:
            owners[buffer] = owner(buffer)
            return owners[buffer]
    return owner_of


def _op_bytes(steps, r, owner_of, reduce_bytes, copy_bytes, peer_reads):
    """Append, per step of rank ``r``, the elements its ops reduce, copy into or out of
    window slots, and read from other ranks' slots."""
    for step in steps:
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


def _match_messages(sends, recvs, p):
    """``(src, dst, count, send_step, recv_step)`` per message: the i-th send of each rank
    pair with its i-th receive; ValueError on a message without a partner or sizes that differ."""
    s_src, s_dst, s_step, s_cnt = map(_ints, sends)
    r_src, r_dst, r_step, r_cnt = map(_ints, recvs)
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
    return src, dst, cnt, s_step[so], r_step[ro]


def _match_awaits(waits, posts) -> list:
    """The post id each await waits for (-1: the previous collective); ValueError on an
    await of a post that is never made."""
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
    return await_post
