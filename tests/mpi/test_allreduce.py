"""Every algorithm against MPI_Allreduce on the job's communicator."""

import array
import zlib

import ml_dtypes
import numpy as np
import pytest
from mpi4py import MPI

import mlcomm
from mlcomm.benchmark import verify
from mlcomm.benchmark.verify import close, reference, sample

from mpi_helpers import COMM, agree, runs_here

pytestmark = pytest.mark.mpi
P, RANK = COMM.Get_size(), COMM.Get_rank()
ALGOS = runs_here(sorted(mlcomm.ALGORITHMS))
COUNTS = sorted({0, 1, max(P - 1, 1), P, P + 1, 997, 100_003})


def digest(x):
    return zlib.crc32(np.ascontiguousarray(x).view(np.uint8).tobytes())


@pytest.mark.parametrize("name", ALGOS)
def test_integers_exact_and_bit_identical(name):
    for count in COUNTS:
        x = (np.arange(count, dtype=np.int64) * (RANK + 1)) ** 2 % 1009 - 500
        want = np.empty_like(x)
        COMM.Allreduce(x, want, MPI.SUM)
        got = mlcomm.allreduce(x, algorithm=name)
        agree(np.array_equal(got, want), f"{name} count={count}")
        inplace = x.copy()
        mlcomm.allreduce(mlcomm.IN_PLACE, inplace, algorithm=name)
        agree(np.array_equal(inplace, want), f"{name} in place count={count}")


@pytest.mark.parametrize("name", ALGOS)
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_floats_match_mpi_and_agree_bitwise(name, dtype):
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    if name == "mpi" and dt.itemsize < 4:
        pytest.skip("MPI_Allreduce has no float16/bfloat16 reduction; mlcomm's own algorithms do")
    for count in (1, P + 1, 4099):
        x = sample(dt, "sum", count, RANK)
        got = mlcomm.allreduce(x, algorithm=name)
        agree(close(got, reference(COMM, x, "sum"), P, "sum"), f"{name} {dtype} count={count}")
        # exact: the bits of what ran (auto's choice too), by the local executor on every
        # rank's input; the library's own MPI_Allreduce has no schedule to run
        ran, options = verify._ran(mlcomm.session.session_of(COMM), name, count, dt, "sum")
        inputs = COMM.allgather(x)
        if mlcomm.ALGORITHMS[ran].hand_written:
            local = verify.scheduled(ran, options, inputs, "sum", RANK)
            agree(not isinstance(local, str) and digest(local) == digest(got),
                  f"{name} ({ran}) {dtype} count={count}: not the bits of its schedule "
                  f"({local if isinstance(local, str) else 'the local executor differs'})")
        agree(len(set(COMM.allgather(digest(got)))) == 1, "results differ between ranks")
        again = mlcomm.allreduce(x, algorithm=name)
        agree(digest(again) == digest(got), "a repeated call gave different bits")
        inplace = x.copy()
        mlcomm.allreduce(MPI.IN_PLACE, inplace, algorithm=name)
        agree(digest(inplace) == digest(got), "in place differs from out of place")


@pytest.mark.parametrize("op", ["sum", "prod", "min", "max", "avg", "band", "bor", "bxor",
                                "land", "lor"])
@pytest.mark.parametrize("dtype", ["int8", "uint16", "int32", "int64", "uint64", "float64",
                                   "complex128", "bool"])
def test_dtype_op_matrix(op, dtype):
    dt = np.dtype(dtype)
    if not mlcomm.kernels.is_supported(dt, op):
        with pytest.raises(TypeError, match=op):
            mlcomm.allreduce(np.zeros(3, dt), op=op)
        return
    x = sample(dt, op, 257, RANK) if dt.kind != "b" else (np.arange(257) % (RANK + 2) == 0)
    for name in ("ring", "recursive_halving_doubling", "double_binary_tree", "naive"):
        got = mlcomm.allreduce(x, op=op, algorithm=name)
        want = reference(COMM, x, op)
        agree(close(got, want, P, op), f"{name} {op} {dtype}")


def test_mpi_op_constants_and_options():
    x = np.arange(50, dtype=np.int32) + RANK
    want = np.empty_like(x)
    COMM.Allreduce(x, want, MPI.MAX)
    agree(np.array_equal(mlcomm.allreduce(x, op=MPI.MAX, algorithm="ring", segment_bytes=12), want))
    for k in range(1, P + 1):
        got = mlcomm.allreduce(x, op=MPI.MAX, algorithm="parameter_server", servers=k)
        agree(np.array_equal(got, want), f"servers={k}")
    for root in range(P):
        got = mlcomm.allreduce(x, op="max", algorithm="single_master", root=root)
        agree(np.array_equal(got, want), f"root={root}")
    got = mlcomm.allreduce(x, op="max", algorithm="double_binary_tree", chunk_bytes=16)
    agree(np.array_equal(got, want), "chunk_bytes")


def test_in_place_forms_of_every_collective_match_mpi():
    for name in ("mpi", "ring"):
        blocks = np.arange(P * 3, dtype=np.int64) * (RANK + 1)
        mlcomm.reduce_scatter(mlcomm.IN_PLACE, blocks, algorithm=name)
        agree(np.array_equal(blocks[:3], np.arange(RANK * 3, RANK * 3 + 3) * P * (P + 1) // 2),
              f"in-place reduce_scatter {name}")
        gathered = np.zeros(P * 2, np.int64)
        gathered[RANK * 2:RANK * 2 + 2] = RANK
        mlcomm.allgather(mlcomm.IN_PLACE, gathered, algorithm=name)
        agree(np.array_equal(gathered, np.repeat(np.arange(P), 2)), f"in-place allgather {name}")


def test_other_collectives():
    n = 7
    x = np.arange(P * n, dtype=np.int64) * (RANK + 1)
    total = np.empty_like(x)
    COMM.Allreduce(x, total)
    got = mlcomm.reduce_scatter(x)
    agree(np.array_equal(got, total[RANK * n:(RANK + 1) * n]), "reduce_scatter")
    mine = np.full(n, RANK, np.int32)
    agree(np.array_equal(mlcomm.allgather(mine), np.repeat(np.arange(P, dtype=np.int32), n)),
          "allgather")
    for root in range(P):
        buf = np.arange(n, dtype=np.float64) + 100 * RANK
        mlcomm.bcast(buf, root)
        agree(np.array_equal(buf, np.arange(n) + 100 * root), f"bcast root={root}")
        red = mlcomm.reduce(x, op="sum", root=root)
        agree((RANK != root and red is None) or np.array_equal(red, total), f"reduce root={root}")


#: each hand-written broadcast and reduce that needs no node layout, with the options that
#: cut a vector of ``SEGMENTED`` elements into several pieces
SEGMENTED = 4099
PIECES = {"chain": {"segment_bytes": 8 * 512}, "binary_tree": {"chunk_bytes": 8 * 512}}
FLAT = {c: [n for n, a in mlcomm.COLLECTIVES[c].items() if a.flat] for c in ("bcast", "reduce")}


@pytest.mark.parametrize("name", FLAT["bcast"])
def test_bcast_from_every_root_bit_for_bit(name):
    """Random float64s from every root, at counts below p, that p does not divide, and in
    several pipeline pieces: every rank ends with the root's bits."""
    for count in sorted({max(P - 1, 1), 7 * P + 1, SEGMENTED}):
        for root in range(P):
            want = np.random.default_rng(count + root).standard_normal(count)
            buf = want.copy() if RANK == root else np.zeros(count)
            got = mlcomm.bcast(buf, root=root, algorithm=name, **PIECES.get(name, {}))
            agree(got is buf and buf.tobytes() == want.tobytes(),
                  f"{name} count={count} root={root}")


@pytest.mark.parametrize("name", FLAT["reduce"])
def test_reduce_to_every_root_exact_and_the_same_bits_each_run(name):
    """Integers exact to every root, out of place and in place; random float64s reduce to
    the same bits in every run."""
    for count in sorted({max(P - 1, 1), 7 * P + 1, SEGMENTED}):
        x = (np.arange(count, dtype=np.int64) * (RANK + 1)) ** 2 % 1009 - 500
        want = np.empty_like(x)
        COMM.Allreduce(x, want, MPI.SUM)
        floats = np.random.default_rng(RANK).standard_normal(count)
        for root in range(P):
            options = dict(root=root, algorithm=name, **PIECES.get(name, {}))
            got = mlcomm.reduce(x, **options)
            buf = x.copy()
            mine = mlcomm.reduce(mlcomm.IN_PLACE, buf, **options)
            runs = [mlcomm.reduce(floats, **options) for _ in range(2)]
            agree(got is None and mine is None if RANK != root else
                  np.array_equal(got, want) and mine is buf and np.array_equal(buf, want)
                  and runs[0].tobytes() == runs[1].tobytes(), f"{name} count={count} root={root}")


def test_comm_drop_in_accepts_mpi4py_buffer_forms():
    comm = mlcomm.Comm(COMM, algorithm="ring")
    assert comm.Get_rank() == RANK and comm.Get_size() == P
    a = array.array("d", [RANK + 0.5] * 5)
    out = array.array("d", [0.0] * 5)
    comm.Allreduce(a, out, MPI.SUM)
    agree(list(out) == [sum(r + 0.5 for r in range(P))] * 5, "array.array")
    x = np.arange(10, dtype=np.int32) + RANK
    y = np.zeros(10, np.int32)
    comm.Allreduce([x, MPI.INT], [y, MPI.INT], MPI.SUM)
    agree(np.array_equal(y, np.arange(10) * P + P * (P - 1) // 2), "[buf, MPI.INT]")
    y[:] = 0
    comm.Allreduce((x, 4, MPI.INT), (y, 4, MPI.INT), MPI.MAX)
    agree(np.array_equal(y[:4], np.arange(4) + P - 1) and not y[4:].any(), "(buf, count, type)")
    z = x.copy()
    comm.Allreduce(MPI.IN_PLACE, z, MPI.SUM)
    agree(np.array_equal(z, np.arange(10) * P + P * (P - 1) // 2), "IN_PLACE")
    # types mlcomm has no kernel for fall back to MPI's own call
    ld = np.full(3, RANK, np.longdouble)
    out_ld = np.zeros(3, np.longdouble)
    comm.Allreduce(ld, out_ld, MPI.SUM)
    agree(np.all(out_ld == P * (P - 1) / 2), "long double")
    flags = np.array([RANK % 2 == 0] * 3)
    res = np.zeros(3, bool)
    comm.Allreduce(flags, res, MPI.LAND)
    agree(np.all(res == (P == 1)), "bool land")
    c = np.full(4, 1 + 1j * RANK, np.complex128)
    rc = np.zeros(4, np.complex128)
    comm.Allreduce(c, rc, MPI.SUM)
    agree(np.allclose(rc, P + 1j * P * (P - 1) / 2), "complex")
    blocks = np.arange(P * 3, dtype=np.float64)
    part = np.zeros(3)
    comm.Reduce_scatter_block(blocks, part, MPI.SUM)
    agree(np.array_equal(part, P * blocks[RANK * 3:RANK * 3 + 3]), "Reduce_scatter_block")
    gathered = np.zeros(P * 2, np.int64)
    comm.Allgather(np.full(2, RANK, np.int64), gathered)
    agree(np.array_equal(gathered, np.repeat(np.arange(P), 2)), "Allgather")
    b = np.arange(6.0) if RANK == 0 else np.zeros(6)
    comm.Bcast(b, root=0)
    agree(np.array_equal(b, np.arange(6.0)), "Bcast")
    r = np.zeros(3) if RANK == P - 1 else None
    comm.Reduce(np.ones(3), r, MPI.SUM, root=P - 1)
    agree(RANK != P - 1 or np.array_equal(r, np.full(3, P)), "Reduce")
    # everything else is the plain communicator
    agree(comm.allreduce(RANK) == P * (P - 1) // 2, "lowercase allreduce")


def test_library_messages_never_meet_user_messages():
    if P < 2:
        pytest.skip("needs two ranks")
    peer = (RANK + 1) % P
    req = COMM.isend(("user", RANK), dest=peer, tag=0)
    got = mlcomm.allreduce(np.ones(1000), algorithm="ring")
    msg = COMM.recv(source=(RANK - 1) % P, tag=0)
    req.wait()
    agree(msg == ("user", (RANK - 1) % P) and np.all(got == P), "user message intercepted")


def test_plans_are_cached():
    from mlcomm import session
    x = np.ones(123)
    mlcomm.allreduce(x, algorithm="ring")
    s = session.session_of(COMM)
    misses = s.plan_misses
    for _ in range(5):
        mlcomm.allreduce(x, algorithm="ring")
    agree(s.plan_misses == misses, "a repeated call planned again")


def test_plans_of_one_layout_share_their_program_and_stay_exact():
    """Calls that differ only in the op, or in a dtype of the same size, get plans of their
    own that share one schedule and program (lowered once); each result is exact."""
    from mlcomm import session
    comm = COMM.Dup()
    try:
        s = session.session_of(comm)
        x = np.arange(77) % 5 + RANK
        calls = [(np.int32, "sum"), (np.int32, "max"), (np.float32, "min"), (np.uint32, "bxor"),
                 (np.int64, "sum")]
        for dtype, op in calls:
            got = mlcomm.allreduce(x.astype(dtype), op=op, comm=comm, algorithm="ring")
            want = np.empty_like(x.astype(dtype))
            COMM.Allreduce(x.astype(dtype), want, getattr(MPI, op.upper()))
            agree(np.array_equal(got, want), f"ring {np.dtype(dtype)} {op}")
        plans = list(s.plans.values())
        agree(len(plans) == len(calls), f"{len(plans)} plans for {len(calls)} layouts")
        four = {id(p.program) for p in plans if p.dtype.itemsize == 4}
        agree(len(four) == 1 and id(plans[-1].program) not in four,
              "plans of one layout lowered apart, or of another element size shared")
    finally:
        comm.Free()


def test_repeated_reduce_and_reduce_scatter_stay_bound():
    """No per-call output allocation or copy: the plan's binding survives repeated calls."""
    from mlcomm import session
    x = np.arange(4 * P, dtype=np.int64) + RANK
    result = np.empty_like(x) if RANK == 0 else None  # recvbuf=None would be a new array each call
    mlcomm.reduce(x, result, root=0, algorithm="binary_tree")
    buf = x.copy()
    mlcomm.reduce_scatter(mlcomm.IN_PLACE, buf, algorithm="ring")
    agree(np.array_equal(buf[:4], (np.arange(4 * P)[RANK * 4:RANK * 4 + 4] * P
                                   + P * (P - 1) // 2)), "in-place reduce_scatter")
    bound = {id(b) for b in session.session_of(COMM).bindings()}
    for _ in range(3):
        red = mlcomm.reduce(x, result, root=0, algorithm="binary_tree")
        agree(RANK != 0 or np.array_equal(red, np.arange(4 * P) * P + P * (P - 1) // 2), "reduce")
        buf[:] = x
        mlcomm.reduce_scatter(mlcomm.IN_PLACE, buf, algorithm="ring")
    again = {id(b) for b in session.session_of(COMM).bindings()}
    agree(bound <= again and len(again) == len(bound), "a repeated call rebound its plan")


@pytest.mark.parametrize("name", ALGOS)
def test_transfers_past_the_largest_move_in_pieces(name, monkeypatch):
    """A message, single copy or library call longer than ``program.MAX_BYTES`` is lowered as
    several in order (MPI's counts are C ints; Linux copies at most 2 GiB at once). With the
    bound at 40 bytes, every algorithm's pieces still give the exact answer, for every
    collective."""
    from mlcomm.ir import program
    monkeypatch.setattr(program, "MAX_BYTES", 40)
    comm = COMM.Dup()  # a fresh session: no plan lowered before the bound changed
    try:
        count = 1237
        x = (np.arange(count, dtype=np.int64) * (RANK + 3)) % 1013 - 500
        want = np.empty_like(x)
        COMM.Allreduce(x, want, MPI.SUM)
        got = mlcomm.allreduce(x, comm=comm, algorithm=name)
        agree(np.array_equal(got, want), f"{name} in pieces")
        plan = next(iter(mlcomm.session.session_of(comm).plans.values()))
        pieces = max((t.nbytes for t in (*plan.program.transfers, *plan.program.fetches)),
                     default=0)
        agree(pieces <= 40, f"{name}: a transfer of {pieces} bytes")
        for collective in ("reduce_scatter", "allgather", "bcast", "reduce"):
            if name not in mlcomm.COLLECTIVES[collective]:
                continue
            block = np.arange(count * P, dtype=np.int64).reshape(P, count) * (RANK + 1)
            if collective == "reduce_scatter":
                out = mlcomm.reduce_scatter(block.ravel(), comm=comm, algorithm=name)
                ok = np.array_equal(out, block[RANK] * P * (P + 1) // 2 // (RANK + 1))
            elif collective == "allgather":
                out = mlcomm.allgather(x, comm=comm, algorithm=name)
                ok = np.array_equal(out, np.concatenate(COMM.allgather(x)))
            elif collective == "bcast":
                out = mlcomm.bcast(x.copy(), root=P - 1, comm=comm, algorithm=name)
                ok = np.array_equal(out, COMM.bcast(x, root=P - 1))
            else:
                out = mlcomm.reduce(x, root=0, comm=comm, algorithm=name)
                ok = RANK != 0 or np.array_equal(out, want)
            agree(ok, f"{name} {collective} in pieces")
    finally:
        mlcomm.session.session_of(comm).free()
        comm.Free()


def test_a_library_allgather_past_a_c_int_says_what_to_use(monkeypatch):
    """The library's allgather and reduce-scatter take a C int count per rank and cannot be
    cut into pieces: past it, algorithm='mpi' is an error naming mlcomm's algorithms, raised
    on every rank before any message (the bound lowered to 10 elements here)."""
    from mlcomm.ir import program
    monkeypatch.setattr(program, "_MPI_MAX_COUNT", 10)
    comm = COMM.Dup()
    try:
        with pytest.raises(ValueError, match=r"takes at most 10 elements per rank .*"
                                             r"algorithm='ring'"):
            mlcomm.allgather(np.ones(11, np.int32), comm=comm, algorithm="mpi")
        out = mlcomm.allgather(np.full(11, RANK, np.int32), comm=comm, algorithm="ring")
        agree(np.array_equal(out, np.repeat(np.arange(P, dtype=np.int32), 11)), "ring")
    finally:
        mlcomm.session.session_of(comm).free()
        comm.Free()
