"""The event loop: steps start when their rank's previous step is done, messages when both
ends posted them and their ports are free (:mod:`.contention`), awaits when their post is
made; a step is done when all of its messages and awaits are, plus its local ops' cost."""

import numpy as np

from .contention import free_ports, transmit
from .events import _heap_pop, _heap_push
from .jit import njit


@njit(cache=True)
def _run(p, rank_first, step_cost, step_ptr, step_msgs, src, dst, nbytes,
         send_step, recv_step, sp_ptr, sp_ids, sa_ptr, sa_ids, await_step, await_post,
         pa_ptr, pa_ids, alpha, beta, ports, rpn, inter_alpha, inter_beta, nic_ports, sync):
    # the work of each message and step stays in this loop: calls with many array arguments
    # per event made it up to 3x slower
    nsteps = len(step_cost)
    m = len(src)
    step_rank, remaining, step_end, step_done, rank_finish = _step_state(
        p, rank_first, step_ptr, sa_ptr, nsteps)
    posted, ready, msg_start, msg_end, hkey, htie, hval = _message_state(m)
    post_time = np.full(len(pa_ptr) - 1, -1.0)
    await_start = np.full(len(await_step), -1.0)
    await_done = np.full(len(await_step), -1.0)
    send_free, recv_free, nic_out, nic_in = free_ports(p, ports, rpn, nic_ports)
    net = (alpha, beta, ports, rpn, inter_alpha, inter_beta, nic_ports)
    hn = 0
    stack_g, stack_t, sn = _first_steps(p, rank_first, nsteps)
    done_msgs = 0
    while True:
        # start every step that became ready; steps with nothing to wait for finish at once
        while sn > 0:
            sn -= 1
            g = stack_g[sn]; t = stack_t[sn]
            step_end[g] = t
            for i in range(step_ptr[g], step_ptr[g + 1]):  # post its messages
                mi = step_msgs[i]
                posted[mi] += 1
                if t > ready[mi]:
                    ready[mi] = t
                if posted[mi] == 2:  # posted at both ends: queued by ready time, ring distance
                    hn = _heap_push(hkey, htie, hval, hn, ready[mi], (dst[mi] - src[mi]) % p, mi)
            if sp_ptr[g + 1] > sp_ptr[g]:
                sn = _make_posts(g, t, sn, sp_ptr, sp_ids, pa_ptr, pa_ids, post_time,
                                 await_start, await_done, await_step, sync, remaining, step_end,
                                 step_cost, step_done, step_rank, rank_first, stack_g, stack_t,
                                 rank_finish)
            if sa_ptr[g + 1] > sa_ptr[g]:
                _start_awaits(g, t, sa_ptr, sa_ids, await_post, post_time, await_start,
                              await_done, await_step, sync, remaining, step_end)
            if remaining[g] == 0:
                sn = _finish_step(g, step_end[g] + step_cost[g], step_done, step_rank,
                                  rank_first, stack_g, stack_t, sn, rank_finish)
        if hn == 0:
            break
        t0, mi, hn = _heap_pop(hkey, htie, hval, hn)
        start, end = transmit(mi, t0, src, dst, nbytes, send_free, recv_free, nic_out, nic_in,
                              net)
        msg_start[mi] = start
        msg_end[mi] = end
        done_msgs += 1
        for g in (send_step[mi], recv_step[mi]):  # each waits for one thing less
            if end > step_end[g]:
                step_end[g] = end
            remaining[g] -= 1
            if remaining[g] == 0:
                sn = _finish_step(g, step_end[g] + step_cost[g], step_done, step_rank,
                                  rank_first, stack_g, stack_t, sn, rank_finish)
    return rank_finish, msg_start, msg_end, step_done, await_done, done_msgs


@njit(cache=True)
def _step_state(p, rank_first, step_ptr, sa_ptr, nsteps):
    """``(step_rank, remaining, step_end, step_done, rank_finish)`` before the first event."""
    return (_step_ranks(p, rank_first, nsteps), _waits_per_step(step_ptr, sa_ptr, nsteps),
            np.zeros(nsteps), np.full(nsteps, -1.0), np.zeros(p))


@njit(cache=True)
def _message_state(m):
    """``(posted, ready, msg_start, msg_end)`` of ``m`` messages and the empty heap's arrays."""
    return (np.zeros(m, dtype=np.int64), np.zeros(m), np.full(m, -1.0), np.full(m, -1.0),
            np.empty(m + 1), np.empty(m + 1, dtype=np.int64), np.empty(m + 1, dtype=np.int64))


@njit(cache=True)
def _step_ranks(p, rank_first, nsteps):
    """The rank of each step."""
    step_rank = np.empty(nsteps, dtype=np.int64)
    for r in range(p):
        for g in range(rank_first[r], rank_first[r + 1]):
            step_rank[g] = r
    return step_rank


@njit(cache=True)
def _waits_per_step(step_ptr, sa_ptr, nsteps):
    """What each step waits for: its messages and its awaits."""
    remaining = np.empty(nsteps, dtype=np.int64)
    for g in range(nsteps):
        remaining[g] = step_ptr[g + 1] - step_ptr[g] + sa_ptr[g + 1] - sa_ptr[g]
    return remaining


@njit(cache=True)
def _first_steps(p, rank_first, nsteps):
    """The stack of steps ready to start ``(step ids, times, depth)``: each rank's first, at 0."""
    stack_g = np.empty(nsteps + 1, dtype=np.int64)
    stack_t = np.empty(nsteps + 1)
    sn = 0
    for r in range(p):
        if rank_first[r + 1] > rank_first[r]:
            stack_g[sn] = rank_first[r]; stack_t[sn] = 0.0; sn += 1
    return stack_g, stack_t, sn


@njit(cache=True)
def _make_posts(g, t, sn, sp_ptr, sp_ids, pa_ptr, pa_ids, post_time, await_start, await_done,
                await_step, sync, remaining, step_end, step_cost, step_done, step_rank,
                rank_first, stack_g, stack_t, rank_finish):
    """Step ``g``'s posts, made at ``t``: the awaits already waiting for them complete."""
    for i in range(sp_ptr[g], sp_ptr[g + 1]):
        pid = sp_ids[i]
        post_time[pid] = t
        for j in range(pa_ptr[pid], pa_ptr[pid + 1]):
            a = pa_ids[j]
            if await_start[a] >= 0.0 and await_done[a] < 0.0:
                h = _await_done(a, max(await_start[a], t + sync), await_step,
                                await_done, remaining, step_end)
                if h >= 0 and h != g:
                    sn = _finish_step(h, step_end[h] + step_cost[h], step_done, step_rank,
                                      rank_first, stack_g, stack_t, sn, rank_finish)
    return sn


@njit(cache=True)
def _start_awaits(g, t, sa_ptr, sa_ids, await_post, post_time, await_start, await_done,
                  await_step, sync, remaining, step_end):
    """Step ``g``'s awaits, started at ``t``: those whose post is made complete now."""
    for i in range(sa_ptr[g], sa_ptr[g + 1]):
        a = sa_ids[i]
        await_start[a] = t
        pid = await_post[a]
        if pid < 0:
            _await_done(a, t, await_step, await_done, remaining, step_end)
        elif post_time[pid] >= 0.0:
            _await_done(a, max(t, post_time[pid] + sync), await_step, await_done,
                        remaining, step_end)


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
def _await_done(a, t, await_step, await_done, remaining, step_end):
    """Record await ``a`` done at ``t``; return its step when that leaves the step nothing
    to wait for, else -1."""
    await_done[a] = t
    g = await_step[a]
    if t > step_end[g]:
        step_end[g] = t
    remaining[g] -= 1
    return g if remaining[g] == 0 else -1
