"""Gather and scatter schedules (and their uneven forms), run by the local executor and
checked exactly."""

import random
from collections import defaultdict

import pytest

from mlcomm.algorithms import COLLECTIVES, build_schedules
from mlcomm.algorithms._common import log2ceil
from mlcomm.analysis import Network, compile_schedules, simulate
from mlcomm.ir.local import check_collective
from mlcomm.ir.schedule import Recv, Send

EVEN = [("gather", "linear"), ("gather", "binomial"),
        ("scatter", "linear"), ("scatter", "binomial")]
UNEVEN = [("gatherv", "linear"), ("scatterv", "linear")]


def _random_counts(rng, p):
    """p block lengths, some of them zero."""
    zeros = rng.random()
    return tuple(0 if rng.random() < zeros else rng.randrange(1, 9) for _ in range(p))


def _uneven_schedules(collective, name, p, root, counts, rng):
    """Every rank's schedule: the root gets ``counts``, the others it or None at random."""
    build = COLLECTIVES[collective][name].build
    return [build(r, p, counts[r], 8, root=root,
                  counts=counts if r == root or rng.random() < 0.5 else None)
            for r in range(p)]


@pytest.mark.parametrize("collective,name", EVEN)
def test_gather_and_scatter_exact_for_every_p(collective, name):
    """Every p = 1..64 from every root up to p = 12 and three random roots above, at count
    0, 1 and a random count."""
    rng = random.Random(51)
    for p in range(1, 65):
        roots = range(p) if p <= 12 else rng.sample(range(p), 3)
        for root in sorted(roots):
            for count in (0, 1, rng.randrange(2, 7)):
                schedules = build_schedules(name, p, count, collective=collective, root=root)
                check_collective(schedules, collective, root=root)


@pytest.mark.parametrize("collective,name", UNEVEN)
def test_gatherv_and_scatterv_exact_for_every_p(collective, name):
    """Every p = 1..64, four random roots and random counts with zeros among them (at every
    fifth p, once all zero)."""
    rng = random.Random(52)
    for p in range(1, 65):
        for trial in range(4):
            root = rng.randrange(p)
            counts = (0,) * p if trial == 0 and p % 5 == 0 else _random_counts(rng, p)
            schedules = _uneven_schedules(collective, name, p, root, counts, rng)
            check_collective(schedules, collective, root=root, counts=list(counts))


def _rounds(schedules):
    """The longest chain of message steps: a step's round is one more than the latest of
    its rank's previous step and the steps of the peers whose messages it takes (messages
    between a pair match in posting order); steps without messages add nothing."""
    sends, recvs = defaultdict(list), defaultdict(list)
    for s in schedules:
        for i, t in s.transfers():
            (sends if isinstance(t, Send) else recvs)[(s.rank, t.peer) if isinstance(t, Send)
                                                      else (t.peer, s.rank)].append((s.rank, i))
    partners = defaultdict(list)  # (rank, step) -> the peer steps it matches
    for key, posted in sends.items():
        for a, b in zip(posted, recvs[key]):
            partners[a].append(b)
            partners[b].append(a)
    done = {}

    def round_of(rank, step):  # the matching steps share their round
        if step < 0:
            return 0
        if (rank, step) not in done:
            prior = [round_of(rank, step - 1)] + [round_of(q, k - 1)
                                                  for q, k in partners[(rank, step)]]
            done[(rank, step)] = max(prior) + bool(schedules[rank].steps[step].transfers)
        return done[(rank, step)]
    return max((round_of(s.rank, i) for s in schedules for i in range(len(s.steps))),
               default=0)


@pytest.mark.parametrize("collective", ["gather", "scatter"])
@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 7, 8, 12, 16, 31, 33])
def test_binomial_takes_log_p_rounds_of_one_message_each(collective, p):
    """The binomial tree's dependent rounds are ceil(log2 p), no rank posts more than one
    message in a step, and the root posts ceil(log2 p) messages moving the p - 1 other
    blocks: a linear root (p - 1 messages in one step) or a chain (p - 1 rounds) fails."""
    count = 3
    for root in sorted({0, p // 2, p - 1}):
        schedules = build_schedules("binomial", p, count, collective=collective, root=root)
        assert _rounds(schedules) == log2ceil(p), (p, root)
        for s in schedules:
            assert all(len(step.transfers) <= 1 for step in s.steps), (p, root, s.rank)
        at_root = [t for _, t in schedules[root].transfers()]
        assert len(at_root) == log2ceil(p)
        assert all(isinstance(t, Recv if collective == "gather" else Send) for t in at_root)
        assert sum(t.region.count for t in at_root) == (p - 1) * count
        linear = build_schedules("linear", p, count, collective=collective, root=root)
        assert _rounds(linear) == (p > 1)


def _build(collective, p, count, **options):
    return COLLECTIVES[collective]["linear"].build(0, p, count, 8, **options)


@pytest.mark.parametrize("collective,name", EVEN + UNEVEN)
def test_bad_root_raises_naming_root(collective, name):
    build = COLLECTIVES[collective][name].build
    extra = {"counts": (2,) * 4} if collective.endswith("v") else {}
    for root in (4, -1, True, 1.0):
        with pytest.raises(ValueError, match=r"root="):
            build(0, 4, 2, 8, root=root, **extra)


@pytest.mark.parametrize("collective", ["gatherv", "scatterv"])
def test_bad_counts_raise_naming_counts(collective):
    with pytest.raises(ValueError, match=r"counts=None: the root \(rank 0\)"):
        _build(collective, 4, 2, root=0)
    with pytest.raises(ValueError, match=r"counts=\(2, 2, 2\): give a tuple .* of 4 element counts"):
        _build(collective, 4, 2, counts=(2, 2, 2))
    with pytest.raises(ValueError, match=r"counts=\[2, 2, 2, 2\]: give a tuple"):
        _build(collective, 4, 2, counts=[2, 2, 2, 2])
    with pytest.raises(ValueError, match=r"counts\[1\]=-1 is out of range"):
        _build(collective, 4, 2, counts=(2, -1, 2, 2))
    with pytest.raises(ValueError, match=r"counts\[1\]=1.5 is out of range"):
        _build(collective, 4, 2, counts=(2, 1.5, 2, 2))
    with pytest.raises(ValueError, match=r"counts\[0\]=3 but count=2"):
        _build(collective, 4, 2, counts=(3, 2, 2, 2))
    with pytest.raises(ValueError, match=r"counts\[1\]=5 but count=2"):
        COLLECTIVES[collective]["linear"].build(1, 4, 2, 8, root=0, counts=(2, 5, 2, 2))
    # off the root counts may be left out
    COLLECTIVES[collective]["linear"].build(1, 4, 2, 8, root=0, counts=None)


def test_costs_and_options():
    """The registry lists every option with its default; the closed forms as Thakur,
    Rabenseifner and Gropp give them."""
    for collective in ("gather", "scatter"):
        for name in ("linear", "binomial"):
            assert COLLECTIVES[collective][name].options == {"root": 0}
    for collective in ("gatherv", "scatterv"):
        assert COLLECTIVES[collective]["linear"].options == {"root": 0, "counts": None}
    a, b = 1e-6, 1e-9
    assert COLLECTIVES["gather"]["linear"].cost(8, 100, a, b, 0.0) == \
        pytest.approx(7 * (a + 100 * b))
    assert COLLECTIVES["scatter"]["binomial"].cost(8, 100, a, b, 0.0) == \
        pytest.approx(3 * a + 7 * 100 * b)
    assert COLLECTIVES["gather"]["binomial"].cost(1, 100, a, b, 0.0) == 0.0
    assert COLLECTIVES["gatherv"]["linear"].cost(5, 100, a, b, 0.0, counts=(1,) * 5) == \
        pytest.approx(4 * (a + 100 * b))


@pytest.mark.parametrize("p", [1, 2, 3, 5, 8, 13, 16, 33])
def test_simulator_agrees_with_the_closed_forms(p):
    """Each schedule's simulated time (one port per rank) is its closed form, from any root;
    the uneven forms' on even counts, where the mean block is every block."""
    net, count = Network(alpha=3e-6, beta=1e-9, gamma=2e-10), 4 * p
    rng = random.Random(p)
    for collective, name in EVEN + UNEVEN:
        for root in sorted({0, p // 2, p - 1}):
            if collective.endswith("v"):
                schedules = _uneven_schedules(collective, name, p, root, (count,) * p, rng)
            else:
                schedules = build_schedules(name, p, count, 8, collective, root=root)
            want = COLLECTIVES[collective][name].cost(p, 8 * count, net.alpha, net.beta,
                                                      net.gamma, root=root)
            assert simulate(compile_schedules(schedules, 8), net).seconds == \
                pytest.approx(want, rel=1e-9, abs=1e-15), (collective, name, p, root)
