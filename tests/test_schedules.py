"""Every algorithm's schedules, run by the local executor and checked exactly."""

import copy
import random

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from mlcomm.algorithms import ALGORITHMS, COLLECTIVES, build_schedules
from mlcomm.algorithms._pieces import binary_tree
from mlcomm.ir.local import ScheduleError, check_collective, run_local
from mlcomm.ir.schedule import TURN_BYTES, Recv

HAND_WRITTEN = sorted(name for name, a in ALGORITHMS.items() if a.hand_written)
FLAT = [name for name in HAND_WRITTEN if not ALGORITHMS[name].context]
PRIME = 101


def counts_for(p):
    return sorted({0, 1, max(p - 1, 0), p, p + 1, PRIME})


@pytest.mark.parametrize("name", HAND_WRITTEN)
@pytest.mark.parametrize("p", range(1, 65))
def test_allreduce_exact(name, p):
    for count in counts_for(p):
        schedules = build_schedules(name, p, count)
        check_collective(schedules)
        if count in (p + 1, PRIME):
            check_collective(schedules, in_place=True)


@pytest.mark.parametrize("name", HAND_WRITTEN)
@pytest.mark.parametrize("p", [2, 3, 5, 8, 13, 64])
def test_allreduce_large_count(name, p):
    check_collective(build_schedules(name, p, 100_003), in_place=True)


@pytest.mark.parametrize("p", [96, 128, 255, 256])
@pytest.mark.parametrize("name", HAND_WRITTEN)
def test_allreduce_many_ranks(name, p):
    if name in ("naive", "single_master", "parameter_server"):
        count = 7
    else:
        count = 3 * p + 1
    check_collective(build_schedules(name, p, count))


@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 24), count=st.integers(0, 300), seg=st.integers(1, 64),
       k=st.integers(1, 24), root=st.integers(0, 23), in_place=st.booleans())
def test_options_property(p, count, seg, k, root, in_place):
    check_collective(build_schedules("ring", p, count, segment_bytes=8 * seg), in_place=in_place)
    check_collective(build_schedules("double_binary_tree", p, count, chunk_bytes=8 * seg),
                     in_place=in_place)
    check_collective(build_schedules("parameter_server", p, count, servers=min(k, p)),
                     in_place=in_place)
    check_collective(build_schedules("single_master", p, count, root=root % p), in_place=in_place)


@pytest.mark.parametrize("collective", ["reduce_scatter", "allgather", "bcast", "reduce"])
@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 7, 8, 16, 33])
def test_other_collectives_exact(collective, p):
    for name, algo in COLLECTIVES[collective].items():
        if not algo.hand_written:
            continue
        for count in (0, 1, 5, 17):
            roots = range(p) if collective in ("bcast", "reduce") else [0]
            for root in roots:
                opts = {"root": root} if collective in ("bcast", "reduce") else {}
                schedules = build_schedules(name, p, count, collective=collective, **opts)
                check_collective(schedules, collective, root=root)
                if collective == "reduce_scatter" and count == 17:
                    check_collective(schedules, collective, in_place=True)


GATHER_SCATTER = [("allgather", "recursive_doubling"), ("allgather", "bruck"),
                  ("reduce_scatter", "recursive_halving"), ("reduce_scatter", "pairwise")]


@pytest.mark.parametrize("collective,name", GATHER_SCATTER)
def test_gather_scatter_schedules_exact_for_every_p(collective, name):
    """Recursive doubling and Bruck's all-gather, recursive halving and pairwise
    reduce-scatter are exact for every p = 1..64 (powers of two and the folds and hand-downs
    between them), on an empty block and a random one; the reduce-scatters at every third
    p in place too, where the output is the input's first block."""
    rng = np.random.default_rng(51)
    for p in range(1, 65):
        for count in (0, int(rng.integers(1, 10))):
            schedules = build_schedules(name, p, count, collective=collective)
            check_collective(schedules, collective)
            if collective == "reduce_scatter" and count and p % 3 == 0:
                check_collective(schedules, collective, in_place=True)


BCAST_REDUCE = [("bcast", "binomial"), ("bcast", "scatter_allgather"), ("bcast", "chain"),
                ("reduce", "binomial"), ("reduce", "rabenseifner")]


def test_bcast_and_reduce_exact_for_every_p():
    """The binomial, scatter_allgather and chain broadcasts and the binomial and rabenseifner
    reduces, exact for every p = 1..64 from random roots, at count 0, a count up to p
    (empty blocks) and one above it (uneven blocks); the chain in one to five segments,
    the reduces in place too."""
    rng = random.Random(51)
    for p in range(1, 65):
        for collective, name in BCAST_REDUCE:
            for count in (0, rng.randrange(1, p + 1), rng.randrange(p + 1, 2 * p + 2)):
                root = rng.randrange(p)
                pieces = rng.randrange(1, 6)
                options = {"segment_bytes": 8 * max(1, -(-count // pieces))} \
                    if name == "chain" else {}
                schedules = build_schedules(name, p, count, collective=collective, root=root,
                                            **options)
                check_collective(schedules, collective, root=root)
                if collective == "reduce":
                    check_collective(schedules, collective, root=root, in_place=True)


def _matmul_mod(a, b, out):
    """2x2 matrix products mod a prime, row by row: associative, not commutative."""
    out[...] = np.einsum("nij,njk->nik", a, b) % 65521


@pytest.mark.parametrize("p", [2, 3, 5, 8, 13])
def test_binomial_reduce_reduces_in_rank_order_from_the_root(p):
    """The binomial reduce's order is fixed: the root's result is x[root] (op) x[root+1]
    (op) ... (op) x[root-1], shown with an op whose operands do not commute."""
    rng = np.random.default_rng(p)
    for root in sorted({0, p // 2, p - 1}):
        x = rng.integers(0, 65521, size=(p, 3, 2, 2))
        got, _ = run_local(build_schedules("binomial", p, 3, collective="reduce", root=root),
                           list(x), reduce=_matmul_mod)
        want = x[root].copy()
        for k in range(1, p):
            _matmul_mod(want, x[(root + k) % p], out=want)
        assert np.array_equal(got[root], want), (p, root)


def test_bcast_and_reduce_options_are_checked():
    with pytest.raises(ValueError, match=r"root=4 is out of range.*0\.\.3"):
        build_schedules("scatter_allgather", 4, 10, collective="bcast", root=4)
    with pytest.raises(ValueError, match=r"root=-1 is out of range"):
        build_schedules("rabenseifner", 4, 10, collective="reduce", root=-1)
    with pytest.raises(ValueError, match=r"segment_bytes=0: give a positive whole number"):
        build_schedules("chain", 4, 10, collective="bcast", segment_bytes=0)


def test_checker_catches_a_lost_reduction():
    schedules = build_schedules("ring", 4, 8)
    broken = copy.deepcopy(schedules)
    step = next(s for s in broken[2].steps if s.ops)
    step.ops.pop()
    with pytest.raises(ScheduleError):
        check_collective(broken)


def test_checker_catches_a_deadlock():
    schedules = build_schedules("recursive_doubling", 4, 8)
    broken = copy.deepcopy(schedules)
    # rank 0 receives where it should send: both partners wait forever
    first = broken[0].steps[1]
    first.transfers = [Recv(t.peer, t.region) for t in first.transfers]
    with pytest.raises(ScheduleError, match="deadlock|overlaps"):
        check_collective(broken)


def test_checker_catches_a_missized_message():
    broken = build_schedules("ring", 3, 9)
    step = broken[1].steps[0]
    t = step.transfers[0]
    step.transfers[0] = type(t)(t.peer, t.region.sub(0, t.region.count - 1))
    with pytest.raises(ScheduleError, match="elements"):
        check_collective(broken)


@pytest.mark.parametrize("p", [2, 4, 6, 8, 16, 64])
def test_double_binary_tree_interior_ranks_are_disjoint_for_even_p(p):
    t0, t1 = binary_tree(p, 0), binary_tree(p, 1)
    assert not (t0.interior() & t1.interior())
    assert all(len(c) <= 2 for c in t0.children + t1.children)


@pytest.mark.parametrize("p,count", [(8, 1 << 20), (5, 1000), (16, 4096)])
def test_cost_tables_from_schedules(p, count):
    """Rounds and per-rank volume of the bandwidth-optimal algorithms match the notes."""
    def sent(schedules):
        return [sum(t.region.count for _, t in s.transfers() if not isinstance(t, Recv))
                for s in schedules]
    ring = build_schedules("ring", p, count)
    assert max(len(s.steps) for s in ring) == 2 * (p - 1)
    assert max(sent(ring)) <= 2 * (p - 1) * -(-count // p)
    if p & (p - 1) == 0:
        rhd = build_schedules("recursive_halving_doubling", p, count)
        assert max(sent(rhd)) == 2 * (p - 1) * count // p
        rd = build_schedules("recursive_doubling", p, count)
        assert max(sent(rd)) == count * (p.bit_length() - 1)


# --- the node window: shared_memory and hierarchical ------------------------------------------

def _random_nodes(p, rng):
    """Consecutive ranks cut into nodes of random sizes."""
    cuts = sorted(rng.sample(range(1, p), rng.randint(0, min(p - 1, 12)))) if p > 1 else []
    bounds = [0, *cuts, p]
    return tuple(tuple(range(bounds[i], bounds[i + 1])) for i in range(len(bounds) - 1))


@pytest.mark.parametrize("p", range(1, 65))
def test_shared_memory_and_hierarchical_exact_with_random_nodes(p):
    """Every p from 1 to 64; random node sizes; a window small enough to force several
    chunks and rounds, and one that is not; both intra-node modes; several flat algorithms
    across nodes; in place and out of place."""
    import random
    rng = random.Random(p)
    for count in sorted({0, 1, p + 1, PRIME}):
        slot_bytes = rng.choice((8 * 4 * (p + 1), 1 << 20))
        check_collective(build_schedules("shared_memory", p, count, slot_bytes=slot_bytes,
                                         small_bytes=8 * rng.choice((1, 64))),
                         in_place=bool(count % 2))
        inter = rng.choice(["ring", "recursive_doubling", "naive", "recursive_halving_doubling",
                            "double_binary_tree"])
        check_collective(build_schedules("hierarchical", p, count, nodes=_random_nodes(p, rng),
                                         slot_bytes=slot_bytes, inter=inter,
                                         intra=rng.choice(("shared_memory", "direct")),
                                         part_bytes=rng.choice((8, 4096))),
                         in_place=bool(count % 3))


def _schedules_without(name, p, count, drop):
    """Every rank's schedule with the transfers ``drop(step_index, transfer)`` says removed."""
    schedules = build_schedules(name, p, count)
    for s in schedules:
        s.steps = [type(st)([t for t in st.transfers if not drop(i, t)], st.ops)
                   for i, st in enumerate(s.steps)]
    return schedules


def test_the_local_executor_finds_window_races():
    from mlcomm.ir.schedule import Await, Post
    # no wait for the peers' posts: a slot is read before its owner's write is visible
    with pytest.raises(ScheduleError, match="before an await has made its write visible"):
        check_collective(_schedules_without("shared_memory", 3, 10,
                                            lambda i, t: isinstance(t, Await) and t.count == 1))
    # no wait for the previous collective: a slot is written before the guard (a vector
    # larger than a turn area, written once and read by all)
    big = TURN_BYTES // 8 + 1
    schedules = build_schedules("shared_memory", 3, big, small_bytes=2 * TURN_BYTES)
    assert not schedules[0].turns
    check_collective(schedules)
    with pytest.raises(ScheduleError, match="before awaiting every node rank's previous"):
        for s in schedules:
            s.steps = [type(st)([t for t in st.transfers
                                 if not (isinstance(t, Await) and t.count == 0)], st.ops)
                       for st in s.steps]
        check_collective(schedules)
    # a turn area is written only after the rank's own Await(self, 0), which takes its base
    assert build_schedules("shared_memory", 3, 10)[0].turns
    with pytest.raises(ScheduleError, match="before its first step's Await"):
        check_collective(_schedules_without("shared_memory", 3, 10,
                                            lambda i, t: isinstance(t, Await) and t.count == 0))
    # no last post: the window is read after this rank's last post
    with pytest.raises(ScheduleError, match="after its last post"):
        check_collective(_schedules_without("shared_memory", 3, 10,
                                            lambda i, t: isinstance(t, Post) and t.count == 2))
    # a slot overwritten while a peer may still read it: the chunked path without its
    # second barrier's awaits
    with pytest.raises(ScheduleError, match="may still be reading|visible"):
        schedules = [ALGORITHMS["shared_memory"].build(r, 2, 64, 8, slot_bytes=8 * 24,
                                                       small_bytes=8)
                     for r in range(2)]
        for s in schedules:
            s.steps = [type(st)([t for t in st.transfers
                                 if not (isinstance(t, Await) and t.count % 2 == 0 and t.count)],
                                st.ops) for st in s.steps]
        check_collective(schedules)


def test_a_turn_must_await_every_peer():
    """A collective with turns writes its turn area without waiting for the previous one's
    readers; it is safe only if each rank awaits a post of every peer in each turn."""
    from mlcomm.ir.local import run_local
    from mlcomm.ir.schedule import Await, Copy, Post, Region, Schedule, Step, slot

    def schedule(rank, reads):
        steps = [Step([Await(rank, 0)], [Copy(Region(slot(rank), 0, 1), Region("input", 0, 1))]),
                 Step([Post(1)] + [Await(q, 1) for q in reads],
                      [Copy(Region("output", 0, 1), Region(slot(q), 0, 1)) for q in reads]),
                 Step([Post(2)])]
        return Schedule(rank, 2, 1, 1, 0, steps, (0, 1), 1, True)

    x = [np.ones(1), np.ones(1)]
    run_local([schedule(0, [0, 1]), schedule(1, [0, 1])], x)
    with pytest.raises(ScheduleError, match=r"without awaiting a post of ranks \[1\]"):
        run_local([schedule(0, [0]), schedule(1, [0, 1])], x)


def test_a_rotating_schedule_rotates_on_every_rank_of_its_node_alike():
    """shared_memory's chunked schedules, the window's other collectives and hierarchical's
    through the window may rotate their slot area (every rank of the node with the same need, so all take the same area);
    the executor refuses a node where one
    rank rotates and another does not, or where their needs differ."""
    import dataclasses
    from types import SimpleNamespace
    from mlcomm.ir.local import run_local
    from mlcomm.transport.window import MIN_ROTATIONS, ROTATIONS, NodeWindow
    schedules = build_schedules("shared_memory", 3, 5000)
    assert all(s.rotates for s in schedules) and len({s.slot_count for s in schedules}) == 1
    assert not any(s.rotates for s in build_schedules("shared_memory", 3, 50))  # turns
    # the window's other collectives too, above the turn areas' size only
    for collective in ("bcast", "allgather", "reduce_scatter", "reduce"):
        for count, rotates in ((5000, True), (50, False)):
            built = build_schedules("shared_memory", 3, count, collective=collective)
            assert [s.rotates for s in built] == [rotates] * 3, (collective, count)
    # hierarchical's window path too, above the turn areas' size, on nodes of any sizes
    # (its parts, so its need, are the same on every rank), and proved exact so
    nodes = ((0, 1), (2, 3, 4))
    for count, rotates in ((5000, True), (50, False)):
        tiered = build_schedules("hierarchical", 5, count, nodes=nodes)
        assert [s.rotates for s in tiered] == [rotates] * 5, count
        assert len({s.slot_count for s in tiered}) == 1
        inputs = [np.arange(count, dtype=np.float64) * (r + 1) for r in range(5)]
        for out in run_local(tiered, inputs)[0]:
            assert np.array_equal(out, np.arange(count) * 15.0)
    x = [np.ones(5000) for _ in range(3)]
    for bad in (dataclasses.replace(schedules[1], rotates=False),
                dataclasses.replace(schedules[1], slot_count=schedules[1].slot_count + 1)):
        with pytest.raises(ScheduleError, match="must rotate on every rank of its node"):
            run_local([schedules[0], bad, schedules[2]], x)
    # the areas: as many of the need (in whole cache lines) as a slot holds, up to ROTATIONS;
    # the slot whole where fewer than MIN_ROTATIONS fit
    window = SimpleNamespace(slot_bytes=4 << 20, slots=[1 << 30, 2 << 30])
    areas, nbytes = NodeWindow.rotations(window, 96 << 10)
    assert nbytes == 96 << 10 and len(areas) == ROTATIONS
    assert areas[1] == [(1 << 30) + nbytes, (2 << 30) + nbytes]
    assert areas[-1][0] + nbytes <= (1 << 30) + (4 << 20)
    areas, nbytes = NodeWindow.rotations(window, (200 << 10) + 1)
    assert nbytes == (200 << 10) + 128 and len(areas) == (4 << 20) // nbytes >= MIN_ROTATIONS
    assert NodeWindow.rotations(window, (4 << 20) // MIN_ROTATIONS + 1) == \
        ([window.slots], 4 << 20)


def test_shared_memory_refuses_more_than_one_node():
    with pytest.raises(ValueError, match="use algorithm='hierarchical'"):
        ALGORITHMS["shared_memory"].build(0, 4, 10, 8, nodes=((0, 1), (2, 3)))


@pytest.mark.parametrize("p", range(1, 17))
def test_shared_memory_single_copy_exact(p, monkeypatch):
    """Reads of peers' buffers: exact in and out of place, in one read chunk or many."""
    import mlcomm.algorithms._window as window
    for read_bytes in (8, 8 * 5, 1 << 20):
        monkeypatch.setattr(window, "READ_CHUNK_BYTES", read_bytes)
        for count in sorted({0, 1, p - 1, p + 1, 97}):
            for in_place in (False, True):
                check_collective(build_schedules("shared_memory", p, count, single_copy=True,
                                                 single_copy_bytes=8), in_place=in_place)


@pytest.mark.parametrize("p", range(1, 25))
def test_hierarchical_single_copy_exact(p, monkeypatch):
    """hierarchical's intra-node phases by reads of the peers' inputs and writes into their
    outputs: random node sizes, one read chunk or many, in place and out of place."""
    import random
    import mlcomm.algorithms._window as window
    rng = random.Random(p)
    for read_bytes in (8 * 3, 1 << 20):
        monkeypatch.setattr(window, "READ_CHUNK_BYTES", read_bytes)
        for count in sorted({0, 1, p + 1, 97}):
            nodes = _random_nodes(p, rng)
            check_collective(build_schedules(
                "hierarchical", p, count, nodes=nodes, single_copy=True, single_copy_bytes=8,
                inter=rng.choice(["ring", "recursive_doubling", "naive"]),
                part_bytes=rng.choice((8, 4096))), in_place=bool(count % 2))


def test_the_local_executor_finds_single_copy_races():
    """Reads of the peers' inputs and writes into their outputs are ordered by the post
    that publishes the addresses (1) and by the last barrier (2)."""
    from mlcomm.ir.schedule import Await

    def without(count):
        schedules = build_schedules("shared_memory", 3, 30, single_copy=True,
                                    single_copy_bytes=8)
        for s in schedules:
            s.steps = [type(st)([t for t in st.transfers
                                 if not (isinstance(t, Await) and t.count == count)], st.ops)
                       for st in s.steps]
        return schedules

    check_collective(without(-1))
    # a peer's buffers read before its first post has published their addresses
    with pytest.raises(ScheduleError, match="before awaiting a post"):
        check_collective(without(1))
    # no last barrier: a rank ends while its peers may still read its buffers
    with pytest.raises(ScheduleError, match="may still be reading its buffers"):
        check_collective(without(2))


def test_the_local_executor_finds_a_peer_write_the_last_barrier_does_not_cover(monkeypatch):
    """Parts reduced in chunks, each written into every peer's output: writes made after the
    last barrier's post are not seen by the peers before they return."""
    import mlcomm.algorithms._window as window
    from mlcomm.ir.schedule import peer_of
    monkeypatch.setattr(window, "READ_CHUNK_BYTES", 16)  # parts of 10 doubles in 5 chunks
    schedules = build_schedules("shared_memory", 3, 30, single_copy=True, single_copy_bytes=8)
    check_collective(schedules)
    for s in schedules:  # the last chunk's writes move into the barrier's step
        last = max(i for i, st in enumerate(s.steps)
                   if any(peer_of(op.dst.buffer) for op in st.ops))
        writes = [op for op in s.steps[last].ops if peer_of(op.dst.buffer)]
        s.steps[last] = type(s.steps[last])(
            s.steps[last].transfers, [op for op in s.steps[last].ops if op not in writes])
        s.steps[-1] = type(s.steps[-1])(s.steps[-1].transfers, [*s.steps[-1].ops, *writes])
    with pytest.raises(ScheduleError, match="before an await has shown it rank"):
        check_collective(schedules)


def _peer_write_schedules(case, in_place=False):
    """Two ranks of one node publish their addresses (post 1), await each other's and end
    with a barrier (post 2); rank 0 writes the first half of rank 1's output, rank 1 the
    rest; ``case`` adds one mistake."""
    from mlcomm.ir.local import run_local
    from mlcomm.ir.schedule import INPUT, OUTPUT, SCRATCH, Region, Timeline, peer
    schedules = []
    for r in range(2):
        tl = Timeline(r, 2)
        tl.node = (0, 1)
        tl.wait(0, 1 - r, 0)
        tl.post(1, 1)
        tl.wait(2, 1 - r, 1)
        tl.copy(2, Region(OUTPUT, 2, 2), Region(INPUT, 2, 2))
        if r == 0:
            tl.copy(2, Region(OUTPUT, 0, 2), Region(INPUT, 0, 2))
            tl.copy(5 if case == "after the barrier" else 3,
                    Region(peer(INPUT if case == "input" else OUTPUT, 1), 0, 2),
                    Region(OUTPUT, 0, 2))
        elif case == "both write":
            tl.copy(3, Region(OUTPUT, 1, 1), Region(SCRATCH, 0, 1))
            tl.copy(2, Region(SCRATCH, 0, 1), Region(INPUT, 1, 1))
        elif case == "read unseen":
            tl.copy(3, Region(SCRATCH, 0, 2), Region(OUTPUT, 0, 2))
        elif case == "in place":
            tl.copy(5, Region(SCRATCH, 0, 2), Region(INPUT, 0, 2))
        tl.post(4, 2)
        tl.wait(4, 1 - r, 2)
        tl.need_scratch(2)
        schedules.append(tl.schedule(4, 4))
    return run_local(schedules, [np.arange(4.0) + 10 * r for r in range(2)], in_place=in_place)


@pytest.mark.parametrize("case, match", [
    ("input", "writes rank 1's read-only input"),
    ("both write", "writes too"),
    ("read unseen", "which rank 0 wrote, before an await has made the write visible"),
    ("in place", "which rank 0 overwrote \\(in place\\)"),
    ("after the barrier", "before an await has shown it rank 0's write"),
])
def test_the_local_executor_checks_writes_into_a_peers_output(case, match):
    outputs, unwritten = _peer_write_schedules("none")
    assert outputs[1].tolist() == [0.0, 1.0, 12.0, 13.0] and unwritten == [0, 0]
    with pytest.raises(ScheduleError, match=match):
        _peer_write_schedules(case, in_place=case == "in place")
