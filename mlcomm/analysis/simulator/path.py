"""The critical path of a simulated collective, split into latency, bandwidth, waits and
local work."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from .engine import SimResult
    from .network import Network
    from .program import SimProgram

__all__ = ["PATH_TERMS", "critical_path"]

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
