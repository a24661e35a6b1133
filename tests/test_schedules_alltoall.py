"""The all-to-all and all-to-all-v schedules, run by the local executor and checked exactly."""

import inspect

import numpy as np
import pytest

from mlcomm.algorithms import COLLECTIVES, build_schedules
from mlcomm.algorithms._common import log2ceil
from mlcomm.algorithms.alltoall import DEFAULT_BATCH, bruck_blocks
from mlcomm.ir.local import check_collective
from mlcomm.ir.schedule import Recv, Send

ALLTOALL = ["pairwise", "bruck", "scattered", "linear"]
ALLTOALLV = ["pairwise", "scattered"]


def _batch(rng, p):
    """A random batch: one partner, a few, or more than there are."""
    return int(rng.choice([1, int(rng.integers(1, p + 2)), DEFAULT_BATCH, p + 5]))


def _matrix(rng, p):
    """A random p×p matrix of block counts, about a third of them zero (a whole row and a
    whole column now and then)."""
    m = rng.integers(0, 6, size=(p, p))
    m[rng.random((p, p)) < 0.35] = 0
    if p > 2 and rng.random() < 0.3:
        m[int(rng.integers(p))] = 0
        m[:, int(rng.integers(p))] = 0
    return m.tolist()


def _build_v(name, m, **options):
    """Every rank's schedule of ``name`` with its own row and column of ``m``."""
    algo, p = COLLECTIVES["alltoallv"][name], len(m)
    return [algo.build(r, p, sum(m[r]), 8, sendcounts=tuple(m[r]),
                       recvcounts=tuple(m[j][r] for j in range(p)), **options)
            for r in range(p)]


def _message_steps(schedule):
    return sum(1 for step in schedule.steps
               if any(isinstance(t, (Send, Recv)) for t in step.transfers))


def _sent(schedule):
    return sum(t.region.count for _, t in schedule.transfers() if isinstance(t, Send))


@pytest.mark.parametrize("name", ALLTOALL)
def test_alltoall_exact_for_every_p(name):
    """Every all-to-all is exact for p = 1..64 at a random block count (empty blocks every
    fifth p), ``scattered`` at a random batch."""
    rng = np.random.default_rng(51)
    for p in range(1, 65):
        count = 0 if p % 5 == 0 else int(rng.integers(1, 6))
        options = {"batch": _batch(rng, p)} if name == "scattered" else {}
        schedules = build_schedules(name, p, count, collective="alltoall", **options)
        check_collective(schedules, "alltoall")


@pytest.mark.parametrize("name", ALLTOALLV)
def test_alltoallv_exact_for_every_p(name):
    """Every all-to-all-v is exact for p = 1..64 on a random matrix of block counts with
    zeros, ``scattered`` at a random batch."""
    rng = np.random.default_rng(52)
    for p in range(1, 65):
        m = _matrix(rng, p)
        options = {"batch": _batch(rng, p)} if name == "scattered" else {}
        check_collective(_build_v(name, m, **options), "alltoallv", counts=m)


def test_alltoallv_all_empty():
    m = [[0] * 5 for _ in range(5)]
    for name in ALLTOALLV:
        schedules = _build_v(name, m)
        assert all(not s.steps for s in schedules)
        check_collective(schedules, "alltoallv", counts=m)


@pytest.mark.parametrize("p", [2, 3, 5, 6, 7, 8, 12, 16, 31, 33])
def test_message_steps_and_partners(p):
    """Bruck: ⌈log₂ p⌉ message steps, step k to rank r + 2^k and from r − 2^k, its sends
    the positions with bit k set. Pairwise: p − 1 steps of one block each way, to the XOR
    partner when p is a power of two. Scattered: ⌈(p − 1)/batch⌉ steps; linear one."""
    count = 3
    for s in build_schedules("bruck", p, count, collective="alltoall"):
        steps = [st for st in s.steps if st.transfers]
        assert len(steps) == _message_steps(s) == log2ceil(p)
        for k, step in enumerate(steps):
            send, = [t for t in step.transfers if isinstance(t, Send)]
            recv, = [t for t in step.transfers if isinstance(t, Recv)]
            assert send.peer == (s.rank + (1 << k)) % p and recv.peer == (s.rank - (1 << k)) % p
            assert send.region.count == count * sum(1 for i in range(p) if i >> k & 1)
        assert _sent(s) == bruck_blocks(p) * count
    for s in build_schedules("pairwise", p, count, collective="alltoall"):
        assert _message_steps(s) == p - 1
        partners = set()
        for step in s.steps[1:]:
            send, recv = step.transfers
            assert send.region.count == recv.region.count == count
            if p & (p - 1) == 0:
                assert send.peer == recv.peer
            partners.add(send.peer)
        assert partners == set(range(p)) - {s.rank}
    for batch in (1, 2, 3, 8, p - 1, p + 1):
        for s in build_schedules("scattered", p, count, collective="alltoall", batch=batch):
            assert _message_steps(s) == -(-(p - 1) // batch)
            assert max(len(st.transfers) for st in s.steps) == 2 * min(batch, p - 1)
    assert all(_message_steps(s) == 1 and len(s.steps[-1].transfers) == 2 * (p - 1)
               for s in build_schedules("linear", p, count, collective="alltoall"))


@pytest.mark.parametrize("p", [1, 2, 3, 4, 7, 8, 13, 16, 64])
def test_costs_match_schedules(p):
    """The closed forms' latency terms count the message steps; Bruck's and pairwise's
    bandwidth terms the blocks a rank sends; the v-forms on even blocks cost what the
    all-to-all does (``nbytes`` their whole send, its mean block nbytes/p)."""
    for name in ALLTOALL:
        algo = COLLECTIVES["alltoall"][name]
        schedules = build_schedules(name, p, 1, collective="alltoall")
        steps = max(_message_steps(s) for s in schedules)
        assert algo.cost(p, 1, 1.0, 0.0, 0.0, **algo.options) == steps
        assert algo.cost(p, 1, 0.0, 1.0, 0.0, **algo.options) == max(map(_sent, schedules))
    for name in ALLTOALLV:
        v, even = COLLECTIVES["alltoallv"][name], COLLECTIVES["alltoall"][name]
        options = {"batch": 3} if name == "scattered" else {}
        assert v.cost(p, 40.0 * p, 2e-6, 1e-9, 0.0, **{**v.options, **options}) == \
            pytest.approx(even.cost(p, 40.0, 2e-6, 1e-9, 0.0, **options))
    assert COLLECTIVES["alltoall"]["bruck"].cost(16, 8, 1.0, 1.0, 0.0) == 4 + 8 * 8 * 4


def test_registry_options_list_every_build_option():
    for collective in ("alltoall", "alltoallv"):
        for name, algo in COLLECTIVES[collective].items():
            if not algo.hand_written:
                continue
            params = list(inspect.signature(algo.build).parameters)[4:]
            # the context options are the session's to give (the window's node and slots)
            assert sorted(params) == sorted([*algo.options, *algo.context]), (collective, name)
            assert algo.doc


def _v(rank=0, size=3, sendcounts=(1, 2, 3), recvcounts=(1, 0, 4), name="pairwise",
       **options):
    return COLLECTIVES["alltoallv"][name].build(rank, size, 6, 8, sendcounts=sendcounts,
                                                recvcounts=recvcounts, **options)


@pytest.mark.parametrize("kwargs,arg", [
    ({"sendcounts": None}, "sendcounts"),
    ({"recvcounts": None}, "recvcounts"),
    ({"sendcounts": (1, 2)}, "sendcounts"),
    ({"recvcounts": (1, 0, 4, 0)}, "recvcounts"),
    ({"sendcounts": (1, -2, 3)}, "sendcounts"),
    ({"recvcounts": (1, 0, 2.5)}, "recvcounts"),
    ({"sendcounts": (1, True, 3)}, "sendcounts"),
    ({"sendcounts": 6}, "sendcounts"),
    ({"sendcounts": (2, 2, 3)}, r"sendcounts\[0\]=2 but recvcounts\[0\]=1"),
    ({"name": "scattered", "batch": 0}, "batch"),
    ({"name": "scattered", "batch": -1}, "batch"),
    ({"name": "scattered", "batch": 2.0}, "batch"),
])
def test_bad_alltoallv_options_name_the_argument(kwargs, arg):
    with pytest.raises(ValueError, match=arg):
        _v(**kwargs)


@pytest.mark.parametrize("batch", [0, -3, None, "8", True])
def test_bad_batch_names_the_argument(batch):
    with pytest.raises(ValueError, match="batch"):
        build_schedules("scattered", 4, 2, collective="alltoall", batch=batch)


@pytest.mark.parametrize("p", [2, 3, 5, 8, 12])
def test_simulator_agrees_with_pairwise_and_bruck(p):
    """Pairwise's and Bruck's closed forms are their simulated times (single port, copies
    free); the batched exchanges simulate as pairwise there, their closed forms overlapping
    a batch's latencies below it."""
    from mlcomm.analysis import Network, compile_schedules, simulate
    net, count = Network(alpha=3e-6, beta=1e-9, gamma=2e-10), 16
    table = COLLECTIVES["alltoall"]
    seconds = {name: simulate(compile_schedules(
        build_schedules(name, p, count, 8, "alltoall"), 8), net).seconds for name in ALLTOALL}
    cost = {name: table[name].cost(p, 8 * count, net.alpha, net.beta, net.gamma,
                                   **table[name].options) for name in ALLTOALL}
    for name in ("pairwise", "bruck"):
        assert seconds[name] == pytest.approx(cost[name], rel=1e-9), name
    for name in ("scattered", "linear"):
        assert seconds[name] == pytest.approx(cost["pairwise"], rel=1e-9)
        assert cost[name] <= cost["pairwise"]
