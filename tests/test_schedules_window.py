"""The node window's gather, scatter, all-to-all and uneven collectives (shm_exchange), run by
the local executor and checked exactly."""

import random

import pytest

from mlcomm.algorithms import COLLECTIVES, Layout, build_schedules
from mlcomm.ir.local import ScheduleError, check_collective
from mlcomm.ir.schedule import Await, Post

NEW = ("gather", "scatter", "alltoall", "allgatherv", "reduce_scatter_v", "gatherv",
       "scatterv", "alltoallv")
ROOTED = ("gather", "scatter", "gatherv", "scatterv")
UNEVEN = ("allgatherv", "reduce_scatter_v", "gatherv", "scatterv")


def _build(collective, p, rng, slot_bytes, nodes=None, big=False):
    """Every rank's schedule of ``collective`` with random counts (zeros included; with
    ``big``, one block of at least 12) and a random root; and check_collective's keywords
    for it."""
    algo = COLLECTIVES[collective]["shared_memory"]
    root = rng.randrange(p)
    window = {"slot_bytes": slot_bytes, "nodes": nodes}
    if collective == "alltoallv":
        M = [[rng.choice((0, 0, 1, 2, 5, 9)) for _ in range(p)] for _ in range(p)]
        M[rng.randrange(p)][rng.randrange(p)] = 9 if big else M[0][0]
        window["slot_bytes"] = max(slot_bytes, 8 * 2 * p * 9)  # one round holds every block
        return [algo.build(r, p, sum(M[r]), 8, sendcounts=tuple(M[r]),
                           recvcounts=tuple(M[j][r] for j in range(p)), **window)
                for r in range(p)], {"counts": M}
    if collective in UNEVEN:
        counts = [rng.choice((0, 0, 1, 3, 7, 20)) for _ in range(p)]
        counts[rng.randrange(p)] = 20 if big else counts[0]
        counts = tuple(counts)
        opts = {"counts": counts, **({"root": root} if collective in ROOTED else {})}
        return [algo.build(r, p, counts[r], 8, **opts, **window) for r in range(p)], \
            {"root": root, "counts": list(counts)}
    opts = {"root": root} if collective in ROOTED else {}
    count = rng.randrange(12, 20) if big else rng.choice((0, 1, rng.randrange(2, 12)))
    return [algo.build(r, p, count, 8, **opts, **window) for r in range(p)], {"root": root}


def _rounds(schedules):
    """The rounds a schedule takes through the window (two posts each)."""
    return max(sum(isinstance(t, Post) for st in s.steps for t in st.transfers)
               for s in schedules) // 2


@pytest.mark.parametrize("p", range(1, 17))
def test_window_exchanges_exact(p):
    """Every new collective through the window, exact for p = 1..16: random counts (zeros
    included), random roots, slots of a few elements (many rounds through both halves: one
    block of at least 12 through halves of at most 4) and a large one (one round); every
    rank with the same slot need."""
    rng = random.Random(51 + p)
    chunked = set()
    for collective in NEW:
        for big, slot_bytes in ((True, 8 * rng.randint(1, 8)),
                                (False, 8 * rng.randint(2 * p, 6 * p)), (False, 1 << 20)):
            schedules, opts = _build(collective, p, rng, slot_bytes, big=big)
            check_collective(schedules, collective, seed=p, **opts)
            assert len({s.slot_count for s in schedules}) == 1
            assert len({s.rotates for s in schedules}) == 1
            if _rounds(schedules) > 2:
                chunked.add(collective)
    if p > 1:  # the small slots force rounds (alltoallv takes one round by design)
        assert chunked == set(NEW) - {"alltoallv"}, chunked


@pytest.mark.parametrize("collective", NEW)
def test_window_exchanges_exact_in_any_local_order_and_rotating(collective):
    """A node whose local order is not rank order; vectors above the turn areas' size,
    whose slot area rotates on every rank alike."""
    rng = random.Random(7)
    for nodes in (((2, 0, 3, 1),), None):
        schedules, opts = _build(collective, 4, rng, 8 * 9, nodes)
        check_collective(schedules, collective, **opts)
    algo = COLLECTIVES[collective]["shared_memory"]
    count = 5000
    if collective == "alltoallv":
        built = [algo.build(r, 3, 3 * count, 8, sendcounts=(count,) * 3,
                            recvcounts=(count,) * 3) for r in range(3)]
        opts = {"counts": [[count] * 3] * 3}
    else:
        extra = {"counts": (count,) * 3} if collective in UNEVEN else {}
        built = [algo.build(r, 3, count, 8, **extra) for r in range(3)]
        opts = {"counts": [count] * 3} if extra else {}
    assert [s.rotates for s in built] == [True] * 3
    check_collective(built, collective, **opts)


def test_the_shared_memory_reduce_scatter_in_any_local_order():
    """shm_collectives' reduce-scatter reads area r of every slot for rank r, whatever the
    node's local order."""
    for count in (1, 5):
        check_collective(build_schedules("shm", 3, count, collective="reduce_scatter",
                                         nodes=((1, 2, 0),), slot_bytes=8 * 6),
                         "reduce_scatter")


def _without(schedules, drop):
    """``schedules`` with the transfers ``drop(rank, transfer)`` says removed."""
    for s in schedules:
        s.steps = [type(st)([t for t in st.transfers if not drop(s.rank, t)], st.ops)
                   for st in s.steps]
    return schedules


@pytest.mark.parametrize("collective", NEW)
def test_the_local_executor_catches_broken_window_exchanges(collective):
    """One reader's await of its first owner's data dropped; every await for a half's
    readers dropped (a slot overwritten while a peer may read it); one rank's last post
    dropped."""
    def build(slot_bytes=8 * 4):
        return _build(collective, 3, random.Random(3), slot_bytes, big=True)

    schedules, opts = build()
    check_collective(schedules, collective, **opts)
    assert _rounds(schedules) == 1 if collective == "alltoallv" else _rounds(schedules) >= 3
    reader = next(s.rank for s in schedules for st in s.steps for t in st.transfers
                  if isinstance(t, Await) and t.count == 1)
    dropped = []

    def first_data_await(rank, t):
        if rank == reader and isinstance(t, Await) and t.count == 1 and not dropped:
            dropped.append(t)
            return True
        return False

    with pytest.raises(ScheduleError, match="before an await has made its write visible"):
        check_collective(_without(build()[0], first_data_await), collective, **opts)
    # alltoallv takes one round: no half is written twice; in alltoall every rank reads
    # every peer each round, so the next round's data awaits already order a half's reuse
    if collective not in ("alltoallv", "alltoall"):
        with pytest.raises(ScheduleError, match="may still be reading"):
            check_collective(_without(build()[0], lambda r, t: isinstance(t, Await) and
                                      t.count and t.count % 2 == 0), collective, **opts)
    last = max(t.count for st in schedules[0].steps for t in st.transfers
               if isinstance(t, Post))
    with pytest.raises(ScheduleError, match="post equally often"):
        check_collective(_without(build()[0], lambda r, t: isinstance(t, Post) and
                                  t.count == last and r == reader), collective, **opts)


def test_window_exchange_options_are_checked():
    gatherv = COLLECTIVES["gatherv"]["shm"] if "shm" in COLLECTIVES["gatherv"] else \
        COLLECTIVES["gatherv"]["shared_memory"]
    with pytest.raises(ValueError, match=r"counts=None: gatherv through shared memory needs "
                                         r"counts on every rank"):
        gatherv.build(1, 3, 2, 8, root=0)
    with pytest.raises(ValueError, match=r"root=3 is out of range.*0\.\.2"):
        gatherv.build(1, 3, 2, 8, root=3, counts=(1, 2, 3))
    with pytest.raises(ValueError, match=r"give a tuple"):
        gatherv.build(1, 3, 2, 8, counts=[1, 2, 3])
    with pytest.raises(ValueError, match=r"give a tuple .* of 3 element counts"):
        gatherv.build(1, 3, 2, 8, counts=(1, 2))
    with pytest.raises(ValueError, match=r"counts\[1\]=-2 is out of range"):
        gatherv.build(1, 3, 2, 8, counts=(1, -2, 3))
    with pytest.raises(ValueError, match=r"counts\[1\]=5 but count=2 on rank 1"):
        gatherv.build(1, 3, 2, 8, counts=(1, 5, 3))
    with pytest.raises(ValueError, match=r"allgatherv needs counts"):
        COLLECTIVES["allgatherv"]["shared_memory"].build(0, 2, 1, 8)
    alltoallv = COLLECTIVES["alltoallv"]["shared_memory"]
    with pytest.raises(ValueError, match=r"recvcounts\[0\]=3 but count=2"):
        alltoallv.build(0, 2, 3, 8, sendcounts=(2, 1), recvcounts=(3, 1))
    with pytest.raises(ValueError, match=r"sendcounts\[1\]=9 on rank 0: .* at most 4 "
                                         r"elements .*MLCOMM_SHM_BYTES"):
        alltoallv.build(0, 2, 9, 8, slot_bytes=8 * 16, sendcounts=(0, 9), recvcounts=(0, 1))
    with pytest.raises(ValueError, match=r"slot_bytes=0: give a positive whole number"):
        COLLECTIVES["scatter"]["shared_memory"].build(0, 2, 4, 8, slot_bytes=0)
    with pytest.raises(ValueError, match=r"needs every rank on one node.*use a flat alltoall"):
        COLLECTIVES["alltoall"]["shared_memory"].build(0, 4, 4, 8, nodes=((0, 1), (2, 3)))


def test_window_exchanges_are_registered_where_they_apply():
    defaults = {"gather": {"root": 0}, "scatter": {"root": 0}, "alltoall": {},
                "allgatherv": {"counts": None}, "reduce_scatter_v": {"counts": None},
                "gatherv": {"root": 0, "counts": None}, "scatterv": {"root": 0, "counts": None},
                "alltoallv": {"sendcounts": None, "recvcounts": None}}
    for collective in NEW:
        algo = COLLECTIVES[collective]["shared_memory"]
        assert algo.aliases == ("shm",) and algo.window and algo.hand_written
        assert algo.context == ("nodes", "slot_bytes") and algo.options == defaults[collective]
        assert algo.doc
        if collective in ("gatherv", "scatterv", "alltoallv"):  # named, never auto's
            assert algo.applies(Layout(4)) and not algo.weighed(Layout(4))
        else:
            assert algo.weighed(Layout(4)) and not algo.weighed(Layout(1))
        assert "spans 2 nodes" in algo.why_not(Layout(4, ((0, 1), (2, 3))))
        assert algo.why_not(Layout(4), device=True) == "needs host buffers"
        opts = {"counts": (1, 1, 1, 1)} if collective in UNEVEN else {}
        one = algo.cost(4, 64, 1e-6, 1e-9, 1e-10, **opts)
        many = algo.cost(4, 1 << 20, 1e-6, 1e-9, 1e-10, slot_bytes=4096, **opts)
        assert 0 < one < many
        assert algo.cost(1, 64, 1e-6, 1e-9, 1e-10) == pytest.approx(64 * 0.5e-9)
