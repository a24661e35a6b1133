"""shared_memory and hierarchical in real jobs, on real or virtual nodes
(MLCOMM_RANKS_PER_NODE), against MPI_Allreduce: exact for integers, the same bits on every
rank and on a repeated call for floats."""

import contextlib
import zlib

import numpy as np
import pytest

import mlcomm
from mlcomm import session
from mlcomm.session import cache
from mlcomm.benchmark.verify import close, reference, sample

from mpi_helpers import COMM, agree

pytestmark = pytest.mark.mpi
P, RANK = COMM.Get_size(), COMM.Get_rank()
NODES = session.session_of(COMM).nodes
ONE_NODE = len(NODES) == 1
# hierarchical: single copies from 64 KiB where the node allows them, from 8 B, never
CASES = [("hierarchical", {}), ("hierarchical", {"intra": "direct"}),
         ("hierarchical", {"inter": "recursive_doubling", "single_copy_bytes": 8}),
         ("hierarchical", {"single_copy_bytes": 1 << 62})]
if ONE_NODE:
    CASES += [("shared_memory", {}), ("shared_memory", {"single_copy_bytes": 8})]
COUNTS = sorted({0, 1, P, P + 1, 997, 100_003, 1 << 20})


def digest(x):
    return zlib.crc32(np.ascontiguousarray(x).view(np.uint8).tobytes())


@pytest.mark.parametrize("name,options", CASES, ids=str)
def test_integers_exact(name, options):
    for count in COUNTS:
        x = (np.arange(count, dtype=np.int64) * (RANK + 1)) ** 2 % 1009 - 500
        want = reference(COMM, x, "sum")
        got = mlcomm.allreduce(x, algorithm=name, **options)
        agree(np.array_equal(got, want), f"{name} {options} count={count} nodes={NODES}")
        inplace = x.copy()
        mlcomm.allreduce(mlcomm.IN_PLACE, inplace, algorithm=name, **options)
        agree(np.array_equal(inplace, want), f"{name} {options} in place count={count}")
        ops = mlcomm.allreduce(x, op="max", algorithm=name, **options)
        agree(np.array_equal(ops, reference(COMM, x, "max")), f"{name} max count={count}")


@pytest.mark.parametrize("name,options", CASES, ids=str)
@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
def test_floats_agree_bitwise_and_repeat(name, options, dtype):
    dt = np.dtype(mlcomm.kernels.BFLOAT16) if dtype == "bfloat16" else np.dtype(dtype)
    for count in (1, P + 1, 4099, 300_001):
        x = sample(dt, "sum", count, RANK)
        got = mlcomm.allreduce(x, algorithm=name, **options)
        agree(close(got, reference(COMM, x, "sum"), P, "sum"), f"{name} {dtype} count={count}")
        agree(len(set(COMM.allgather(digest(got)))) == 1, "results differ between ranks")
        again = mlcomm.allreduce(x, algorithm=name, **options)
        agree(digest(again) == digest(got), "a repeated call gave other bits")


@pytest.mark.parametrize("name", ["shared_memory", "hierarchical"])
def test_single_copy_reads_where_the_node_allows_them(name):
    """Large vectors read the peers' buffers exactly when the window's probe allowed it (and
    the rank's node has peers); hierarchical by messages never does."""
    if name == "shared_memory" and not ONE_NODE:
        pytest.skip("shared_memory needs one node")
    from mlcomm.session.auto import plan_call
    s = session.session_of(COMM)
    f32 = np.dtype(np.float32)
    inter = {"inter": "ring"} if name == "hierarchical" else {}
    plan = plan_call(s, "allreduce", name, 1 << 20, f32, "sum", inter)
    window = s.window()
    agree(bool(plan.program.fetches) == (window.single_copy and len(s.node) > 1),
          f"single_copy={window.single_copy} ({window.single_copy_error}) but the plan has "
          f"{len(plan.program.fetches)} reads")
    agree(window.single_copy or len(s.node) == 1 or bool(window.single_copy_error),
          "no reason given")
    if name == "hierarchical":
        direct = plan_call(s, "allreduce", name, 1 << 20, f32, "sum", dict(inter, intra="direct"))
        agree(not direct.program.fetches and not direct.program.node_size, "direct read peers")


def test_a_node_without_single_copies_beside_nodes_with_them(monkeypatch):
    """Where one node refuses single copies (its kernel forbids them; here
    MLCOMM_SINGLE_COPY=0 on its ranks), hierarchical goes through the window there and by
    single copies on the others, exactly."""
    if ONE_NODE:
        pytest.skip("one node")
    if RANK in NODES[0]:
        monkeypatch.setenv("MLCOMM_SINGLE_COPY", "0")
    comm = COMM.Dup()
    try:
        s = session.session_of(comm)
        window = s.window()
        agree(not window.single_copy if RANK in NODES[0] else True, "node 0 reads its peers")
        modes = comm.allgather(window.single_copy and len(s.node) > 1)
        for count in (100_003,):
            x = (np.arange(count, dtype=np.int64) * (RANK + 1)) % 1009
            want = reference(COMM, x, "sum")
            for inter in ("ring", "recursive_doubling"):
                got = mlcomm.allreduce(x, comm=comm, algorithm="hierarchical", inter=inter)
                agree(np.array_equal(got, want), f"{inter} count={count} single copy {modes}")
            agree(np.array_equal(mlcomm.allreduce(x, comm=comm), want), f"auto {modes}")
    finally:
        comm.Free()


def test_shared_memory_on_several_nodes_names_hierarchical():
    if ONE_NODE:
        pytest.skip("one node: shared_memory applies")
    with pytest.raises(ValueError, match="use algorithm='hierarchical'"):
        mlcomm.allreduce(np.ones(4), algorithm="shared_memory")
    agree(np.all(mlcomm.allreduce(np.ones(4), algorithm="hierarchical") == P))


@pytest.mark.parametrize("count", [1000, 10_000])  # 80 KB: single copies where allowed
def test_persistent_and_nonblocking_through_the_window(count):
    name = "shared_memory" if ONE_NODE else "hierarchical"
    x = np.empty(count, np.int64)
    handle = mlcomm.allreduce_init(mlcomm.IN_PLACE, x, algorithm=name)
    for trial in range(3):
        x[...] = np.arange(count) + RANK + trial
        handle()
        agree(np.array_equal(x, np.arange(count) * P + P * (P - 1) // 2 + P * trial))
    xs = [np.full(count, float(RANK + k)) for k in range(4)]
    requests = [mlcomm.iallreduce(v, algorithm=name) for v in xs]
    for k, r in enumerate(requests):
        agree(np.all(r.wait() == P * k + P * (P - 1) / 2))


def test_the_layout_is_the_same_on_every_rank():
    everyone = COMM.allgather(NODES)
    agree(all(n == NODES for n in everyone) and sorted(r for n in NODES for r in n)
          == list(range(P)), f"{NODES}")


@pytest.mark.parametrize("count", [0, 1, 5, 4099, 1 << 20])
def test_the_other_collectives_through_the_window(count):
    if not ONE_NODE:
        pytest.skip("the window's other collectives need one node")
    kw = {"algorithm": "shared_memory"}
    blocks = (np.arange(P * count, dtype=np.int64) * (RANK + 1)) % 101
    part = mlcomm.reduce_scatter(blocks, **kw)
    agree(np.array_equal(part, reference(COMM, blocks, "sum")[RANK * count:(RANK + 1) * count]),
          "reduce_scatter")
    mine = np.full(count, RANK, np.int64)
    agree(np.array_equal(mlcomm.allgather(mine, **kw), np.repeat(np.arange(P), count)),
          "allgather")
    for root in sorted({0, P - 1}):
        buf = np.arange(count, dtype=np.float64) if RANK == root else np.zeros(count)
        mlcomm.bcast(buf, root, **kw)
        agree(np.array_equal(buf, np.arange(count, dtype=np.float64)), f"bcast root {root}")
        got = mlcomm.reduce(mine, root=root, **kw)
        agree(RANK != root or np.array_equal(got, np.full(count, P * (P - 1) // 2)),
              f"reduce root {root}")


def test_small_calls_back_to_back_take_turns():
    """Small shared_memory all-reduces write a turn area without waiting for the previous
    call's readers; back to back, of varying sizes, with ranks delayed at random and the
    window's other calls (chunks, bcast, a persistent handle, non-blocking calls) between
    them, every result is exact."""
    if not ONE_NODE:
        pytest.skip("shared_memory needs one node")
    import random
    import time
    rng = random.Random(RANK)
    kw = {"algorithm": "shared_memory"}
    held = np.zeros(7, np.int64)
    handle = mlcomm.allreduce_init(mlcomm.IN_PLACE, held, **kw)
    wrong = []
    for it in range(300):
        count = 1 + (it * 37) % 2000  # up to 16000 B: a turn area
        x = np.arange(count, dtype=np.int64) * (RANK + 1) + it
        want = np.arange(count, dtype=np.int64) * (P * (P + 1) // 2) + P * it
        if rng.random() < 0.3:
            time.sleep(rng.random() * 1e-4)
        if not np.array_equal(mlcomm.allreduce(x, **kw), want):
            wrong.append(("allreduce", it, count))
        if it % 7 == 3:
            big = np.full(5000, RANK + it, np.int64)  # 40 KB: the slot, in chunks
            if not np.all(mlcomm.allreduce(big, **kw) == P * (P - 1) // 2 + P * it):
                wrong.append(("chunks", it))
            buf = np.full(100, it if RANK == it % P else -1, np.int64)
            mlcomm.bcast(buf, it % P, **kw)
            if not np.all(buf == it):
                wrong.append(("bcast", it))
        if it % 11 == 5:
            held[...] = RANK + it
            handle()
            if not np.all(held == P * (P - 1) // 2 + P * it):
                wrong.append(("persistent", it))
            requests = [mlcomm.iallreduce(np.full(k + 1, RANK * k + it, np.int64), **kw)
                        for k in range(3)]
            if not all(np.all(r.wait() == k * P * (P - 1) // 2 + P * it)
                       for k, r in enumerate(requests)):
                wrong.append(("nonblocking", it))
    agree(not wrong, f"wrong results: {wrong[:5]}")


@pytest.mark.parametrize("name", ["shared_memory", "hierarchical"])
def test_chunked_calls_take_the_slots_areas_in_turn(name):
    """Calls through the window above the turn areas' size run on the next of the
    slot's areas each call, every rank on the same one: back to back at sizes with other
    numbers of areas, ranks delayed at random, turn calls, a persistent handle and
    non-blocking calls between them, every result is exact. The window's rotation counts
    exactly the rotating calls; a binding holds one frame per area, as many as the slot
    holds up to ROTATIONS, or one where it holds fewer than MIN_ROTATIONS."""
    if not ONE_NODE or P == 1:
        pytest.skip("needs one node of two ranks or more (one rank copies, without a window)")
    import random
    import time
    from mlcomm.transport.window import MIN_ROTATIONS, ROTATIONS
    rng = random.Random(RANK)
    kw = {"algorithm": name, "single_copy_bytes": 1 << 62}
    window = session.session_of(COMM).window()
    start, rotating, wrong = window.rotation, 0, []
    held = np.zeros(9000, np.int64)
    handle = mlcomm.allreduce_init(mlcomm.IN_PLACE, held, **kw)
    for it in range(2 * ROTATIONS + 5):
        for count in (3000, 11000, 200_000):  # 24 KB, 88 KB: areas; 1.6 MB: the slot whole
            x = np.arange(count, dtype=np.int64) * (RANK + 1) + it
            want = np.arange(count, dtype=np.int64) * (P * (P + 1) // 2) + P * it
            if rng.random() < 0.3:
                time.sleep(rng.random() * 1e-4)
            if not np.array_equal(mlcomm.allreduce(x, **kw), want):
                wrong.append((count, it))
            rotating += count < 200_000
        if not np.all(mlcomm.allreduce(np.full(5, RANK + it), **kw) == P * (P - 1) // 2 + P * it):
            wrong.append(("turn", it))
        if it % 5 == 2:
            held[...] = RANK + it
            handle()
            request = mlcomm.iallreduce(np.full(3000, RANK * it, np.int64), **kw)
            if not np.all(held == P * (P - 1) // 2 + P * it) or \
                    not np.all(request.wait() == it * P * (P - 1) // 2):
                wrong.append(("persistent or non-blocking", it))
            rotating += 2
    agree(not wrong, f"wrong results: {wrong[:5]}")
    agree(window.rotation - start == rotating, f"{window.rotation - start} != {rotating}")
    import tracemalloc
    for count in (3000, 200_000):
        x = np.zeros(count, np.int64)
        mlcomm.allreduce_init(x, x.copy(), **kw)  # its plan made
        tracemalloc.start()
        try:  # what the binding cache counts for a binding covers what one holds
            handles = [mlcomm.allreduce_init(x, x.copy(), **kw) for _ in range(4)]
            held = (tracemalloc.get_traced_memory()[0] - 4 * x.nbytes) / 4
        finally:
            tracemalloc.stop()
        binding = handles[0].binding
        area = -(-binding.plan.program.slot_bytes // 128) * 128
        fit = min(ROTATIONS, window.slot_bytes // area)
        agree(len(binding.frames) == (fit if fit >= MIN_ROTATIONS else 1),
              f"{count}: {len(binding.frames)} frames, {fit} areas fit")
        agree(held <= cache.own_bytes(binding) + binding.nbytes,
              f"{count}: a binding holds {held:.0f} B, the cache counts "
              f"{cache.own_bytes(binding) + binding.nbytes}")


@contextlib.contextmanager
def _rotating_handle():
    """``(comm, handle, output)``: a persistent shared_memory all-reduce of 64 KiB through
    the window, whose areas rotate, on a new communicator; skips off one node of two ranks
    or more (one rank copies, without a window)."""
    if not ONE_NODE or P == 1:
        pytest.skip("needs one node of two ranks or more (one rank copies, without a window)")
    comm = COMM.Dup()
    try:
        x, y = np.ones(16384, np.float32), np.empty(16384, np.float32)
        handle = mlcomm.allreduce_init(x, y, comm=comm, algorithm="shared_memory",
                                       single_copy_bytes=1 << 62)
        yield comm, handle, y
    finally:
        comm.Free()


def test_a_rotating_binding_allocates_its_areas_of_this_ranks_slot():
    """A rotating binding allocates and maps its areas of this rank's slot when it is made
    (on this rank's memory: it writes them first): on a new communicator's window every
    page of them is resident before the first call (a 64 KiB call that faulted its 16
    pages, and the peer's, took 70 us against 12); the calls are exact."""
    import ctypes
    import mmap
    with _rotating_handle() as (comm, handle, y):
        window = session.session_of(comm).window()
        areas = handle.binding.rotations
        mine = window.slots[window.node.Get_rank()]
        page = mmap.PAGESIZE
        start = mine // page * page
        end = -(-(mine + areas * (64 << 10)) // page) * page
        resident = np.zeros((end - start) // page, np.uint8)
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(end - start),
                            resident.ctypes.data_as(ctypes.c_void_p)) == 0
        agree(areas >= 8 and np.all(resident & 1),
              f"{areas} areas; {int(np.sum(resident & 1))} of {len(resident)} pages resident")
        for _ in range(areas + 1):
            handle()
        agree(np.all(y == P), f"y[:3] = {y[:3]}")


def test_a_rotating_bindings_first_call_maps_its_peers_areas():
    """Once a rotating binding's first call has completed (its peers have allocated their
    areas by then), this rank maps the peers' areas too: its next pass over every area
    takes no page fault (without it, 47-89 a rank at P = 2 and 3), and the calls are
    exact."""
    import resource
    with _rotating_handle() as (_, handle, y):
        handle()
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(handle.binding.rotations):
            handle()
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        agree(faults < handle.binding.rotations // 4,
              f"{faults} page faults over {handle.binding.rotations} areas")
        agree(np.all(y == P), f"y[:3] = {y[:3]}")


@pytest.mark.parametrize("collective", ["bcast", "allgather", "reduce_scatter", "reduce"])
def test_the_windows_other_collectives_take_the_slots_areas_in_turn(collective):
    """bcast, allgather, reduce_scatter and reduce through the window above the turn areas'
    size take the slot's areas in turn, as all-reduce does: back to back at two sizes, the
    root moving, ranks delayed at random, every result exact; the window's rotation counts
    every call."""
    if not ONE_NODE or P == 1:
        pytest.skip("needs one node of two ranks or more (one rank copies, without a window)")
    import random
    import time
    from mlcomm.transport.window import ROTATIONS
    rng = random.Random(RANK)
    window = session.session_of(COMM).window()
    start, wrong = window.rotation, []
    calls = 2 * ROTATIONS + 3
    for it in range(calls):
        root = it % P
        count = (3000, 7000)[it % 2]  # int64: 24 KB and 56 KB a rank
        base = np.arange(count, dtype=np.int64)
        x = base * (RANK + 1) + it
        if rng.random() < 0.3:
            time.sleep(rng.random() * 1e-4)
        if collective == "bcast":
            mlcomm.bcast(x, root, algorithm="shared_memory")
            ok = np.array_equal(x, base * (root + 1) + it)
        elif collective == "allgather":
            got = mlcomm.allgather(x, algorithm="shared_memory")
            ok = np.array_equal(got, np.concatenate([base * (r + 1) + it for r in range(P)]))
        elif collective == "reduce_scatter":
            blocks = np.concatenate([x + b for b in range(P)])
            got = mlcomm.reduce_scatter(blocks, algorithm="shared_memory")
            ok = np.array_equal(got, base * (P * (P + 1) // 2) + P * (it + RANK))
        else:
            got = mlcomm.reduce(x, None, "sum", root, algorithm="shared_memory")
            ok = (got is None) if RANK != root else \
                np.array_equal(got, base * (P * (P + 1) // 2) + P * it)
        if not ok:
            wrong.append(it)
    agree(not wrong, f"{collective}: wrong results at calls {wrong[:5]}")
    agree(window.rotation - start == calls,
          f"{window.rotation - start} rotations in {calls} calls")
