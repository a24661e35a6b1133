"""Simulate a compiled program on a network: :func:`simulate`, its :class:`SimResult`."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .loop import _run
from .network import Network
from .program import SimProgram, compile_schedules

__all__ = ["SimResult", "simulate", "simulate_schedules", "step_costs"]


@dataclass
class SimResult:
    """Simulated times: of every rank, every message, every step."""

    seconds: float             # the collective's time: the last rank to finish
    rank_finish: np.ndarray
    msg_start: np.ndarray
    msg_end: np.ndarray
    step_done: np.ndarray
    await_done: np.ndarray = field(default_factory=lambda: np.zeros(0))


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
