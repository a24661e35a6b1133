"""The public entry points called as README.rst, docs/guide.rst and docs/api.rst show users
calling them, with exact answers.

- ``mlcomm.Comm`` with the default algorithm on COMM_WORLD, on a ``Dup()`` and on a
  ``Split()``; the communicators it makes keep its ``algorithm``; each collective runs the
  algorithm it is given where it has one of that name, else its ``auto``; every dtype and
  ``MPI.Op`` through mpi4py's buffer forms; user-defined ops, derived datatypes and long
  double go to the MPI library.
- ``mlcomm.allreduce``, ``iallreduce`` and ``allreduce_init`` meeting sizes that their
  communicator has not seen, so ``auto``'s trial runs inside the call.
- ``reduce_scatter``, ``allgather``, ``bcast`` and ``reduce`` on every dtype and op they
  claim, in place and out of place, with each of their algorithms.

Each rank's input is small integers (powers of two for prod) that differ by rank and
element, so every sum, product, min, max and average is exact in every dtype, whatever the
order of reduction; each rank makes every rank's input and reduces them itself.
"""

import functools

import numpy as np
import pytest
from mpi4py import MPI
from mpi4py.util import dtlib

import mlcomm
from mlcomm import api, session
from mlcomm.kernels import BFLOAT16, OPS, is_supported, supported_dtypes

from mpi_helpers import COMM, agree, runs_here

pytestmark = pytest.mark.mpi
P, RANK = COMM.Get_size(), COMM.Get_rank()
DTYPES = supported_dtypes()
PAIRS = [(dt, op) for dt in DTYPES for op in OPS if is_supported(dt, op)]
#: the ops that mpi4py code passes as MPI.Op constants (avg has none)
MPI_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX, "band": MPI.BAND,
           "bor": MPI.BOR, "bxor": MPI.BXOR, "land": MPI.LAND, "lor": MPI.LOR}
UFUNCS = {"sum": np.add, "avg": np.add, "prod": np.multiply, "min": np.minimum,
          "max": np.maximum, "band": np.bitwise_and, "bor": np.bitwise_or,
          "bxor": np.bitwise_xor, "land": np.logical_and, "lor": np.logical_or}
COLLECTIVES = ("allreduce", "reduce_scatter", "allgather", "bcast", "reduce")


def _mpi_type(dt):
    try:
        t = MPI.Datatype.fromcode(dt.char)
    except (KeyError, ValueError):
        return None
    return t if t != MPI.DATATYPE_NULL and dtlib.to_numpy_dtype(t) == dt else None


#: the MPI library's predefined datatype of each dtype that has one
MPI_TYPES = {dt: t for dt in DTYPES if (t := _mpi_type(dt)) is not None}


def _wide(dt):
    """The exact NumPy type that the reference reduces ``dt``'s values in."""
    if dt == BFLOAT16 or dt.kind == "f":
        return np.dtype(np.float64)
    return np.dtype(np.complex128) if dt.kind == "c" else dt


def inputs(dt, op, p, n):
    """Every rank's input of ``n`` elements on a ``p``-rank communicator (rank r's is [r])."""
    i = np.arange(n)
    out = []
    for r in range(p):
        if dt.kind == "b":
            out.append((i * 7 + r * 3) % 5 != 0)
            continue
        if op == "prod":  # |product| <= 2**p, exact; 0.5 only in floats
            table = [1, 2, -1, 1, -2] if dt.kind in "iu" else [1, 2, -1, 0.5, -2]
            v = np.array(table)[(i + r) % 5]
            im = np.where((i + r) % 3 == 0, 1, 0)
            v = v * (1j ** im) if dt.kind == "c" else v
        elif op == "avg":  # 2((i + r) % p) - (p - 1) sums to 0 over the ranks: mean = i % 5
            v = i % 5 + 2 * ((i + r) % p) - (p - 1)
            v = v + 1j * (i % 3 + 2 * ((i + r + 1) % p) - (p - 1)) if dt.kind == "c" else v
        elif op in ("band", "bor", "bxor"):
            v = (i * 37 + r * 11) % 101
        elif op in ("land", "lor"):
            v = (i + r) % 3
        else:  # sum, min, max: small, of both signs (unsigned types wrap, as in C)
            v = i % 11 - 5 + r * (i % 3 - 1)
            v = v + 1j * (i % 4 - r) if dt.kind == "c" else v
        out.append(np.asarray(v).astype(_wide(dt)).astype(dt))
    return out


def expected(dt, op, xs):
    """The reduction of the ranks' inputs ``xs`` (exact by construction)."""
    if dt.kind in "iub":  # integers and bool: in the dtype itself, wrapping as C does
        return functools.reduce(lambda a, b: UFUNCS[op](a, b).astype(dt), xs)
    wide = _wide(dt)
    acc = functools.reduce(UFUNCS[op], [x.astype(wide) for x in xs])
    return (acc / len(xs) if op == "avg" else acc).astype(dt)


def same(got, want):
    """Equal in dtype, shape and every bit; complex numbers equal in value (a zero part of a
    complex product takes its sign from the order of reduction)."""
    if got is None or got.dtype != want.dtype or got.shape != want.shape:
        return False
    return np.array_equal(got, want) if got.dtype.kind == "c" else got.tobytes() == want.tobytes()


def mpi_lacks(dt, op):
    """What algorithm="mpi" may refuse, by the MPI library: float16 and bfloat16 (MPICH has
    float16 as an extension), and bitwise ops on C bool (which MPI does not define)."""
    return dt in (np.dtype(np.float16), BFLOAT16) or (dt.kind == "b" and op[0] == "b")


def make_comm(kind):
    """COMM_WORLD, a Dup() of it, or a Split() of it, even and odd ranks from 3 ranks on
    (all at 2), in reverse rank order: a communicator the user already has."""
    if kind == "world":
        return MPI.COMM_WORLD
    if kind == "dup":
        return COMM.Dup()
    return COMM.Split(RANK % 2 if P >= 3 else 0, P - RANK)


def free(comm):
    if comm != MPI.COMM_WORLD:
        comm.Free()


def bands(comm):
    return {k for k in session.session_of(comm).choices if k[0] == "band"}


class Failures(list):
    """Checks gathered over many calls and agreed once, at the end: one collective instead
    of one per call (every rank makes the same calls, so none waits on another)."""

    def check(self, ok, what):
        if not ok:
            self.append(what)

    def agree(self):
        agree(not self, f"{len(self)} failed: " + "; ".join(map(str, self[:6])))


# --- mlcomm.Comm ------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["world", "dup", "split"])
def test_comm_with_the_default_algorithm(kind):
    """README's and the guide's ``mlcomm.Comm(comm)``: the five collectives with mpi4py's
    signatures, in place and out of place, a root other than 0. A Dup() or Split() is new
    to mlcomm, so auto times its candidates inside the first Allreduce."""
    base = make_comm(kind)
    comm = mlcomm.Comm(base)
    p, rank, last = comm.Get_size(), comm.Get_rank(), comm.Get_size() - 1
    bad = Failures()
    bad.check(isinstance(comm, MPI.Intracomm) and comm.algorithm is None, repr(comm.algorithm))
    bad.check(MPI.Comm.Compare(comm, base) == MPI.IDENT, "Comm does not share the handle")
    f32, i64 = np.dtype(np.float32), np.dtype(np.int64)
    before = bands(comm)

    xs = inputs(f32, "sum", p, 37)
    out = np.full(37, np.nan, f32)
    comm.Allreduce(xs[rank], out, op=MPI.SUM)
    bad.check(same(out, expected(f32, "sum", xs)), f"Allreduce {out[:4]}")
    if kind != "world":  # world's session may have met this size in an earlier test
        bad.check(len(bands(comm) - before) == (p > 1), "auto timed no candidates")
    buf = xs[rank].copy()
    comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
    bad.check(same(buf, out), "Allreduce in place")

    xs = inputs(i64, "max", p, 3 * p)
    want = expected(i64, "max", xs)
    part = np.zeros(3, i64)
    comm.Reduce_scatter_block(xs[rank], part, op=MPI.MAX)
    bad.check(same(part, want[3 * rank:3 * rank + 3]), f"Reduce_scatter_block {part}")
    buf = xs[rank].copy()
    comm.Reduce_scatter_block(MPI.IN_PLACE, buf, op=MPI.MAX)
    bad.check(same(buf[:3], part), f"Reduce_scatter_block in place {buf[:3]}")

    xs = inputs(i64, "sum", p, 5)
    every = np.zeros(5 * p, i64)
    comm.Allgather(xs[rank], every)
    bad.check(same(every, np.concatenate(xs)), f"Allgather {every}")
    every = np.zeros(5 * p, i64)
    every[5 * rank:5 * rank + 5] = xs[rank]
    comm.Allgather(MPI.IN_PLACE, every)
    bad.check(same(every, np.concatenate(xs)), f"Allgather in place {every}")

    buf = xs[rank].astype(f32)
    comm.Bcast(buf, root=last)
    bad.check(same(buf, xs[last].astype(f32)), f"Bcast {buf}")

    xs = inputs(i64, "sum", p, 9)
    want = expected(i64, "sum", xs)
    top = np.zeros(9, i64) if rank == last else None
    comm.Reduce(xs[rank], top, op=MPI.SUM, root=last)
    bad.check(same(top, want) if rank == last else top is None, f"Reduce {top}")
    buf = xs[rank].copy()
    comm.Reduce(MPI.IN_PLACE if rank == last else buf, buf if rank == last else None,
                op=MPI.SUM, root=last)
    bad.check(same(buf, want) if rank == last else same(buf, xs[rank]), "Reduce in place")
    bad.agree()
    free(base)


@pytest.mark.parametrize("algorithm", [None, "ring", "tree"])
def test_comms_made_from_a_comm_are_comms_with_its_algorithm(algorithm):
    """Dup, Split and the other constructors give mlcomm.Comm objects with the algorithm of
    the Comm they were made from; Split with MPI.UNDEFINED gives MPI.COMM_NULL."""
    comm = mlcomm.Comm(COMM, algorithm=algorithm)
    group = comm.Get_group()
    pending, request = comm.Idup()
    request.Wait()
    made = {"Dup": comm.Dup(), "Dup(info)": comm.Dup(MPI.INFO_NULL),
            "Dup_with_info": comm.Dup_with_info(MPI.INFO_NULL), "Idup": pending,
            "Clone": comm.Clone(), "Split": comm.Split(0, P - RANK),
            "Split_type": comm.Split_type(MPI.COMM_TYPE_SHARED),
            "Create": comm.Create(group), "Create_group": comm.Create_group(group)}
    group.Free()
    for how, new in made.items():
        agree(type(new) is mlcomm.Comm and new.algorithm == algorithm,
              f"{how}: a {type(new).__name__} with algorithm {getattr(new, 'algorithm', '-')!r}")
        agree(MPI.Comm.Compare(new, comm) in (MPI.CONGRUENT, MPI.SIMILAR), f"{how}: not a copy")
    agree(made["Split"].Get_rank() == P - 1 - RANK, "Split's key was not honoured")
    if algorithm == "ring":  # each works as a communicator of its own (the ring: no trial)
        for how in ("Dup", "Split"):
            new = made[how]
            x = np.arange(6, dtype=np.int32) + new.Get_rank()
            out = np.empty_like(x)
            new.Allreduce(x, out, op=MPI.SUM)
            agree(same(out, np.arange(6, dtype=np.int32) * P + P * (P - 1) // 2),
                  f"{how}: {out}")
    none = comm.Split(MPI.UNDEFINED if RANK == 0 else 1, 0)
    agree(none == MPI.COMM_NULL if RANK == 0 else type(none) is mlcomm.Comm, repr(none))
    for new in [*made.values(), none]:
        if new != MPI.COMM_NULL:
            new.Free()


def test_comm_algorithm_names_are_checked_and_can_change():
    with pytest.raises(ValueError, match="'rnig' is not an algorithm of any collective.*ring"):
        mlcomm.Comm(COMM, algorithm="rnig")
    comm = mlcomm.Comm(COMM, algorithm="ring")
    comm.algorithm = "binary_tree"
    dup = comm.Dup()
    agree(comm.algorithm == dup.algorithm == "binary_tree", f"{dup.algorithm!r}")
    dup.Free()
    with pytest.raises(ValueError, match="'bogus' is not an algorithm"):
        comm.algorithm = "bogus"
    agree(comm.algorithm == "binary_tree", "a refused name replaced the algorithm")


def _call_comm(comm, collective, dt, op, count, in_place):
    """Run ``collective`` through mlcomm.Comm as mpi4py code does; return ``(got, want)``,
    each None where this rank has no result."""
    p, rank = comm.Get_size(), comm.Get_rank()
    root = p - 1
    mop = MPI_OPS[op]
    if collective == "allreduce":
        xs = inputs(dt, op, p, count)
        want = expected(dt, op, xs)
        if in_place:
            got = xs[rank].copy()
            comm.Allreduce(MPI.IN_PLACE, got, mop)
        else:
            got = np.zeros_like(want)
            mpi_type = MPI_TYPES.get(dt)  # mpi4py's [buffer, datatype] where MPI has one
            comm.Allreduce(xs[rank] if mpi_type is None else [xs[rank], mpi_type], got, mop)
        return got, want
    if collective == "reduce_scatter":
        xs = inputs(dt, op, p, count * p)
        want = expected(dt, op, xs)[rank * count:(rank + 1) * count]
        if in_place:
            buf = xs[rank].copy()
            comm.Reduce_scatter_block(MPI.IN_PLACE, buf, mop)
            return buf[:count], want
        got = np.zeros_like(want)
        comm.Reduce_scatter_block(xs[rank], got, mop)
        return got, want
    if collective == "allgather":
        xs = inputs(dt, "sum", p, count)
        got = np.zeros(count * p, dt)
        if in_place:
            got[rank * count:(rank + 1) * count] = xs[rank]
            comm.Allgather(MPI.IN_PLACE, got)
        else:
            comm.Allgather(xs[rank], got)
        return got, np.concatenate(xs)
    if collective == "bcast":
        xs = inputs(dt, "sum", p, count)
        got = xs[rank].copy()
        comm.Bcast(got, root=root)
        return got, xs[root]
    xs = inputs(dt, op, p, count)
    want = expected(dt, op, xs) if rank == root else None
    if in_place:
        got = xs[rank].copy()
        comm.Reduce(MPI.IN_PLACE if rank == root else got, got if rank == root else None, mop,
                    root=root)
        return (got, want) if rank == root else (None, None)
    got = np.zeros_like(xs[rank]) if rank == root else None
    comm.Reduce(xs[rank], got, mop, root=root)
    return got, want


def covering(ops_of):
    """``(dtype, op, in_place)`` cases in which every dtype meets at least two of its ops and
    every op of a dtype family (ints, floats, complex, bool) meets several of its dtypes, in
    place and out of place by turns."""
    families = {}
    for dt in DTYPES:
        families.setdefault(tuple(ops_of(dt)), []).append(dt)
    cases = []
    for ops, dts in families.items():
        per = max(2, -(-len(ops) // len(dts)))
        for j, dt in enumerate(dts):
            cases += [(dt, ops[(j * per + t) % len(ops)], t % 2 == 1) for t in range(per)]
    return cases


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_comm_every_dtype_and_mpi_op_in_and_out_of_place(collective):
    """Every dtype mlcomm reduces and every MPI.Op constant, as mpi4py code passes them
    (arrays, [array, MPI datatype]), through ``mlcomm.Comm(comm, algorithm="ring")`` (Bcast
    and Reduce have no ring: their auto runs). Comm maps the datatype and op and calls the
    module functions, whose every dtype x op the tests below run."""
    comm = mlcomm.Comm(COMM, algorithm="ring")
    if collective in ("allgather", "bcast"):
        cases = [(dt, "sum", k % 2 == 1 and collective != "bcast") for k, dt in enumerate(DTYPES)]
    else:
        cases = covering(lambda dt: [op for op in MPI_OPS if is_supported(dt, op)])
    bad = Failures()
    for k, (dt, op, in_place) in enumerate(cases):
        got, want = _call_comm(comm, collective, dt, op, 5 + k % 4, in_place)
        bad.check(got is None and want is None or same(got, want),
                  f"{collective} {dt} {op} in_place={in_place}: {got} != {want}")
    bad.agree()


def _plans(comm):
    return set(session.session_of(comm).plans)


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_comm_collectives_run_the_algorithm_they_are_given(collective, monkeypatch):
    """``mlcomm.Comm(comm, algorithm=name)``: each collective runs ``name`` where it has an
    algorithm of that name; where it has none, its auto (the cost model's choice here: the
    tests above and below time auto's trials)."""
    monkeypatch.setenv("MLCOMM_AUTO", "model")
    fresh = COMM.Dup()
    lacking = {"allreduce": "binary_tree", "reduce_scatter": "naive", "allgather": "naive",
               "bcast": "ring", "reduce": "ring"}[collective]
    names = runs_here([n for n in mlcomm.COLLECTIVES[collective] if n != "auto"], collective)
    dt = np.dtype(np.int32)
    for k, name in enumerate([*names, lacking]):
        comm = mlcomm.Comm(fresh, algorithm=name)
        before, choices = _plans(comm), dict(session.session_of(comm).choices)
        count = 64 + 8 * k  # a count of its own: its plan is new
        got, want = _call_comm(comm, collective, dt, "sum", count, False)
        agree(got is None and want is None or same(got, want), f"{name}: {got} != {want}")
        ran = {key[1] for key in _plans(comm) - before if key[0] == collective}
        if name == lacking:  # auto chose for this call, and its choice ran
            picked = {v[0] for key, v in session.session_of(comm).choices.items() if key not in choices
                      and key[:3] == (collective, P, count) and not key[-1]}
            agree(len(picked) == 1 and ran == picked - {"mpi"},
                  f"{name}: auto picked {picked}, ran {ran}")
        elif name == "mpi":  # the library's call, with or without a plan around it
            agree(ran <= {"mpi"}, f"algorithm='mpi' ran {ran}")
        else:
            agree(ran == {name}, f"algorithm={name!r} ran {ran}")
    fresh.Free()


def test_comm_hands_what_mlcomm_cannot_reduce_to_the_mpi_library(monkeypatch):
    """The guide's promise: a user-defined MPI.Op, a derived datatype and long double go to
    the MPI library's own call (mlcomm's functions are not called), with its answer."""
    def refuse(*args, **kwargs):
        raise AssertionError("mlcomm was called")
    for name in ("allreduce", "reduce_scatter", "allgather", "bcast", "reduce"):
        monkeypatch.setattr(api, name, refuse)
    comm = mlcomm.Comm(COMM)
    last = P - 1

    def absmax(a, b, datatype):  # |a| vs |b|, sign kept: not an op mlcomm knows
        x = np.frombuffer(a, np.int32)
        y = np.frombuffer(b, np.int32)
        y[...] = np.where(np.abs(x) > np.abs(y), x, y)
    op = MPI.Op.Create(absmax, commute=True)
    x = np.array([RANK, -RANK - 1, 3 * (RANK % 2) - 1, 0], np.int32)
    out = np.zeros(4, np.int32)
    comm.Allreduce(x, out, op=op)
    agree(same(out, np.array([P - 1, -P, 2 if P > 1 else -1, 0], np.int32)), f"user op {out}")
    top = np.zeros(4, np.int32)
    comm.Reduce(x, top if RANK == last else None, op=op, root=last)
    agree(RANK != last or same(top, out), f"Reduce with a user op {top}")
    op.Free()

    def add(a, b, datatype):  # MPI's predefined ops take no derived datatype: a user op
        y = np.frombuffer(b, np.int32)
        y += np.frombuffer(a, np.int32)
    pair, op = MPI.INT.Create_contiguous(2).Commit(), MPI.Op.Create(add, commute=True)
    x = np.arange(6, dtype=np.int32) + RANK
    out = np.zeros(6, np.int32)
    comm.Allreduce([x, 3, pair], [out, 3, pair], op=op)
    agree(same(out, np.arange(6, dtype=np.int32) * P + P * (P - 1) // 2), f"pairs {out}")
    op.Free()
    every = np.zeros(6 * P, np.int32)
    comm.Allgather([x, 3, pair], [every, 3, pair])
    agree(same(every, np.concatenate([np.arange(6, dtype=np.int32) + r for r in range(P)])),
          f"Allgather of pairs {every}")
    pair.Free()
    strided = MPI.DOUBLE.Create_vector(3, 1, 2).Commit()  # elements 0, 2, 4
    buf = np.arange(6.0) + 10 * RANK
    comm.Bcast([buf, 1, strided], root=last)
    want = np.arange(6.0) + 10 * RANK
    want[::2] = np.arange(6.0)[::2] + 10 * last
    agree(same(buf, want), f"Bcast of a strided datatype {buf}")
    strided.Free()

    x = np.full(3, RANK + 0.5, np.longdouble)              # no mlcomm kernel
    out = np.zeros(3, np.longdouble)
    comm.Allreduce(x, out, op=MPI.SUM)
    # (compared by value: an 80-bit long double's padding bytes are undefined)
    agree(np.array_equal(out, np.full(3, P * P / 2, np.longdouble)), f"long double {out}")


# --- the module functions -------------------------------------------------------------------

def test_allreduce_iallreduce_and_allreduce_init_meet_new_sizes_under_auto():
    """Each entry point's first call at a size band new to the communicator (a Split()):
    auto's trial runs inside it, inside iallreduce and allreduce_init too, before they
    return."""
    comm = make_comm("split")
    p, rank = comm.Get_size(), comm.Get_rank()
    f32, i64 = np.dtype(np.float32), np.dtype(np.int64)
    bad = Failures()
    started = bands(comm)

    xs = inputs(f32, "avg", p, 300)
    got = mlcomm.allreduce(xs[rank], op="avg", comm=comm)
    bad.check(same(got, expected(f32, "avg", xs)), f"allreduce avg {got[:4]}")
    out = np.zeros(300, f32)
    bad.check(mlcomm.allreduce(xs[rank], out, op="avg", comm=comm) is out and same(out, got),
              "allreduce into recvbuf")
    after_allreduce = bands(comm)

    xs = inputs(i64, "bxor", p, 900)
    buf = xs[rank].copy()
    request = mlcomm.iallreduce(mlcomm.IN_PLACE, buf, op=MPI.BXOR, comm=comm)
    after_iallreduce = bands(comm)
    bad.check(request.wait() is buf and same(buf, expected(i64, "bxor", xs)),
              f"iallreduce {buf[:4]}")
    got = mlcomm.iallreduce(xs[rank], op="bxor", comm=comm).wait()
    bad.check(same(got, buf), "iallreduce out of place")

    grad = np.zeros(5000, f32)
    step = mlcomm.allreduce_init(mlcomm.IN_PLACE, grad, op="max", comm=comm)
    after_init = bands(comm)
    for i in range(3):
        xs = inputs(f32, "max", p, grad.size)
        grad[:] = xs[rank] + i
        bad.check(step() is grad and same(grad, expected(f32, "max", xs) + np.float32(i)),
                  f"allreduce_init step {i}: {grad[:4]}")
    out = np.zeros_like(grad)
    step = mlcomm.allreduce_init(grad, out, op="min", comm=comm)
    xs = inputs(f32, "min", p, grad.size)
    grad[:] = xs[rank]
    bad.check(step() is out and same(out, expected(f32, "min", xs)), "allreduce_init out of place")
    timed = [len(after_allreduce - started), len(after_iallreduce - after_allreduce),
             len(after_init - after_iallreduce)]
    bad.check(timed == [int(p > 1)] * 3, f"new bands timed: {timed}")
    bad.agree()
    free(comm)


#: each collective's algorithms, by the name a user passes (None: auto)
ALGORITHMS = {c: runs_here([None, *(n for n in mlcomm.COLLECTIVES[c] if n != "auto")], c)
              for c in ("reduce_scatter", "allgather", "bcast", "reduce")}


def _call(collective, dt, op, count, in_place, algorithm):
    """Run the module function as the guide shows; return ``(got, want)`` (None where this
    rank has no result)."""
    root = P - 1
    if collective == "reduce_scatter":
        xs = inputs(dt, op, P, count * P)
        want = expected(dt, op, xs)[RANK * count:(RANK + 1) * count]
        if in_place:
            buf = xs[RANK].copy()
            got = mlcomm.reduce_scatter(mlcomm.IN_PLACE, buf, op=op, algorithm=algorithm)
            return (got if np.shares_memory(got, buf) else None), want
        return mlcomm.reduce_scatter(xs[RANK], op=op, algorithm=algorithm), want
    if collective == "allgather":
        xs = inputs(dt, "sum", P, count)
        if in_place:
            got = np.zeros(count * P, dt)
            got[RANK * count:(RANK + 1) * count] = xs[RANK]
            mlcomm.allgather(mlcomm.IN_PLACE, got, algorithm=algorithm)
        else:
            got = mlcomm.allgather(xs[RANK], algorithm=algorithm)
        return got, np.concatenate(xs)
    if collective == "bcast":
        xs = inputs(dt, "sum", P, count)
        buf = xs[RANK].copy()
        got = mlcomm.bcast(buf, root=root, algorithm=algorithm)
        return (got if got is buf else None), xs[root]
    xs = inputs(dt, op, P, count)
    want = expected(dt, op, xs) if RANK == root else None
    if in_place:
        buf = xs[RANK].copy()
        got = mlcomm.reduce(mlcomm.IN_PLACE, buf, op=op, root=root, algorithm=algorithm)
        return (got if got is None or got is buf else "not buf"), want
    out = np.zeros_like(xs[RANK]) if RANK == root else None
    got = mlcomm.reduce(xs[RANK], out, op=op, root=root, algorithm=algorithm)
    return (got if got is out else "not out"), want


def _library_wraps() -> bool:
    """Whether the MPI library's integer sums wrap around as C's do. Open MPI 5.0.11's
    saturate at the type's bounds (a library bug, which ``mlcomm verify`` names)."""
    got = np.empty(256, np.uint8)  # enough elements for its vector loops, which saturate
    COMM.Allreduce(np.full(256, 200, np.uint8), got, MPI.SUM)
    return P == 1 or bool(np.all(got == 200 * P % 256))


#: whether algorithm="mpi", which hands the call to the library, is held to C's wrap-around
LIBRARY_WRAPS = _library_wraps()


def _library_may_saturate(dt, op) -> bool:
    """Whether the library's answer for ``dt`` and ``op`` may differ from C's here."""
    return not LIBRARY_WRAPS and dt.kind in "iu" and op in ("sum", "prod")


@pytest.mark.parametrize("collective", ["reduce_scatter", "allgather", "bcast", "reduce"])
def test_collectives_every_dtype_op_and_algorithm_in_and_out_of_place(collective):
    """Every dtype x op the collective claims (avg included) with its default algorithm, in
    place and out of place by turns; each named algorithm (every one of the collective's
    that runs here) on a third of the cases of a reduction, case k where k plus its dtype's
    place is its own place modulo 3, so on every dtype and every op, and on every case of
    a broadcast or all-gather; not mpi on integer sums and products where the library
    saturates them (``LIBRARY_WRAPS``). Where algorithm="mpi" refuses what the MPI library
    lacks, the message names the fix."""
    reducing = collective in ("reduce_scatter", "reduce")
    cases = PAIRS if reducing else [(dt, "sum") for dt in DTYPES]
    names = ALGORITHMS[collective][1:]
    runs = [(dt, op, None, k % 2 == 1, k) for k, (dt, op) in enumerate(cases)]
    runs += [(dt, op, name, k // 3 % 2 == 0, k) for j, name in enumerate(names)
             for k, (dt, op) in enumerate(cases)
             if (not reducing or (k + DTYPES.index(dt)) % 3 == j % 3)
             and not (name == "mpi" and _library_may_saturate(dt, op))]
    bad = Failures()
    for dt, op, algorithm, in_place, k in runs:
        in_place = in_place and collective != "bcast"
        what = f"{collective} {dt} {op} algorithm={algorithm} in_place={in_place}"
        try:
            got, want = _call(collective, dt, op, 3 + k % 5, in_place, algorithm)
        except TypeError as exc:
            if not (algorithm == "mpi" and mpi_lacks(dt, op)):
                raise
            bad.check("algorithm='mpi' calls the MPI library" in str(exc), f"{what}: {exc}")
            continue
        bad.check(got is None and want is None or
                  isinstance(got, np.ndarray) and same(got, want), f"{what}: {got} {want}")
    bad.agree()


def test_mlcomm_algorithm_names_the_default_of_the_collectives_that_have_it(monkeypatch):
    """MLCOMM_ALGORITHM=ring: the all-reduce, reduce-scatter and all-gather of a call that
    names no algorithm run the ring; bcast and reduce, which have none, their auto (as
    mlcomm.Comm(comm, algorithm="ring") does)."""
    monkeypatch.setenv("MLCOMM_ALGORITHM", "ring")
    comm = COMM.Dup()  # a new session reads it
    s = session.session_of(comm)
    x = np.arange(4 * P, dtype=np.int32) + RANK
    want = np.arange(4 * P, dtype=np.int32) * P + P * (P - 1) // 2
    agree(same(mlcomm.allreduce(x, comm=comm), want), "allreduce")
    agree(same(mlcomm.reduce_scatter(x, comm=comm), want[4 * RANK:4 * RANK + 4]), "rs")
    agree(same(mlcomm.allgather(x[:2], comm=comm),
               np.concatenate([x[:2] - RANK + r for r in range(P)])), "allgather")
    ran = {key[:2] for key in s.plans}
    agree({("allreduce", "ring"), ("reduce_scatter", "ring"), ("allgather", "ring")} <= ran
          or P == 1, f"ran {ran}")
    buf = x.copy()
    mlcomm.bcast(buf, root=0, comm=comm)
    agree(same(buf, x - RANK), "bcast")
    top = mlcomm.reduce(x, comm=comm)
    agree(same(top, want) if RANK == 0 else top is None, "reduce")
    for name in ("naive", "recursive_doubling"):  # names the reduce-scatter has not
        comm.Free()
        monkeypatch.setenv("MLCOMM_ALGORITHM", name)
        comm = COMM.Dup()
        agree(same(mlcomm.reduce_scatter(x, comm=comm), want[4 * RANK:4 * RANK + 4]), name)
    comm.Free()
