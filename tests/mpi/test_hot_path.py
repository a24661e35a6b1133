"""The hot path: the compiled loop against the Python loop, and repeated calls."""

import numpy as np
import pytest
from mpi4py import MPI

import mlcomm
from mlcomm.session import memo
from mlcomm import session
from mlcomm.runtime.binding import Binding, Settings
from mlcomm.runtime.frame import compiled_supports
from mlcomm.benchmark.verify import close, reference, sample

from mpi_helpers import COMM, agree, runs_here

pytestmark = pytest.mark.mpi
P, RANK = COMM.Get_size(), COMM.Get_rank()
HAND_WRITTEN = runs_here(sorted(n for n in mlcomm.ALGORITHMS if n not in ("mpi", "auto")))
OPS = ("sum", "prod", "min", "max", "band", "bor", "bxor", "land", "lor")


def _cases():
    for dtype in mlcomm.kernels.supported_dtypes():
        for op in OPS:
            if mlcomm.kernels.is_supported(dtype, op):
                yield dtype, op


def _input(dt, op, count):
    if dt.kind == "b":
        return np.arange(count) % (RANK + 2) == 0
    return sample(dt, op, count, RANK)


@pytest.mark.parametrize("dtype,op", list(_cases()), ids=str)
def test_compiled_loop_is_bitwise_the_python_loop(dtype, op):
    """Both loops run one plan on the same buffers; the results agree bit for bit, across
    ranks too, and with MPI_Allreduce (exactly, or within rounding for float sums and
    products)."""
    dt = np.dtype(dtype)
    s = session.session_of(COMM)
    for name in HAND_WRITTEN:
        for count in (1, P + 1, 1031):
            x = _input(dt, op, count)
            x.flags.writeable = False  # the input is read-only to both loops
            out = np.empty_like(x)
            context = s.context(mlcomm.ALGORITHMS[name].context)
            plan = s.plan("allreduce", name, count, dt, op, context)
            window = s.window() if plan.program.node_size else None
            fast = Binding(s.comm, plan, x, out, s.settings, window=window)
            slow = Binding(s.comm, plan, x, out, Settings(rank=RANK, compiled=False),
                           window=window)
            agree(fast.compiled == compiled_supports(dt, op) and not slow.compiled,
                  f"{name} {dt} {op}: compiled loop used where unsupported or vice versa")
            fast.run()
            first = out.copy()
            out[...] = 0
            slow.run()
            fast.free(), slow.free()
            agree(first.tobytes() == out.tobytes(), f"{name} {dt} {op} count={count}")
            inplace = [x.copy(), x.copy()]  # in place: the other reduce kinds
            for buf, settings in zip(inplace, (s.settings, Settings(rank=RANK, compiled=False))):
                plan = s.plan("allreduce", name, count, dt, op, context, alias=0)
                bound = Binding(s.comm, plan, buf, buf, settings, window=window)
                bound.run()
                bound.free()
            agree(inplace[0].tobytes() == inplace[1].tobytes() == first.tobytes(),
                  f"{name} {dt} {op} count={count}: in place differs")
            digests = COMM.allgather(first.tobytes())
            agree(all(d == digests[0] for d in digests), f"{name} {dt} {op}: ranks differ")
            want = reference(COMM, x, op)
            agree(close(first, want, P, op), f"{name} {dt} {op}: differs from MPI_Allreduce")


def test_compiled_loop_covers_every_dtype_but_complex_products():
    for dt in mlcomm.kernels.supported_dtypes():
        assert compiled_supports(dt, "sum")
    assert compiled_supports(np.dtype(mlcomm.kernels.BFLOAT16), "max")
    assert not compiled_supports(np.dtype(np.complex128), "prod")


@pytest.mark.parametrize("name", HAND_WRITTEN + ["mpi"])
def test_repeated_calls_see_new_data(name):
    x, y = np.empty(13, np.int64), np.empty(13, np.int64)
    for trial in range(4):
        x[...] = np.arange(13) * (RANK + 1) + trial
        got = mlcomm.allreduce(x, y, algorithm=name)
        agree(got is y and np.array_equal(y, reference(COMM, x, "sum")), f"{name} trial {trial}")
        z = x.copy()
        mlcomm.allreduce(mlcomm.IN_PLACE, z, op=MPI.MAX, algorithm=name)
        agree(np.array_equal(z, reference(COMM, x, "max")), f"{name} in place trial {trial}")


def test_alternating_algorithms_on_one_buffer_stay_repeats():
    x, y = np.arange(9, dtype=np.int64) + RANK, np.empty(9, np.int64)
    seen = {}
    for trial in range(3):
        for name in ("ring", "recursive_doubling", "mpi"):
            x += trial
            mlcomm.allreduce(x, y, algorithm=name)
            agree(np.array_equal(y, reference(COMM, x, "sum")), f"{name} trial {trial}")
            bound = memo.find(x, y, name)
            agree(bound is not None and bound.recv_ref() is y and bound.algorithm == name, name)
            if trial:  # the first call's bound call ran this one: no re-planning in between
                agree(bound is seen[name], f"{name} was planned again in trial {trial}")
            seen[name] = bound


def test_the_last_call_repeats_without_a_lookup_and_is_forgotten_with_its_communicator():
    """A repeat of the call that ran last runs its bound call straight from
    ``memo.LAST``; another call misses it and is looked up; freeing the communicator
    forgets it, so it keeps nothing of the communicator alive."""
    sub = COMM.Dup()
    x, y = np.arange(5, dtype=np.int64) + RANK, np.empty(5, np.int64)
    z = np.empty(5, np.int64)
    for trial in range(3):
        mlcomm.allreduce(x, y, algorithm="ring", comm=sub)
        mlcomm.allreduce(x, z, op="max", algorithm="ring", comm=sub)
    bound = memo.find(x, z, "ring")
    agree(memo.LAST[0] is bound.repeat, "the last call is not the one kept")
    calls = []
    real = bound.repeat

    def counted(*args):
        calls.append(args[0])
        return real(*args)
    memo.LAST[0] = counted  # a repeat of the max now runs through it, once per call
    x += 1
    got = mlcomm.allreduce(x, z, op="max", algorithm="ring", comm=sub)
    agree(got is z and np.array_equal(z, reference(COMM, x, "max")) and calls == ["allreduce"],
          f"the last call ran {len(calls)} times")
    got = mlcomm.allreduce(x, y, algorithm="ring", comm=sub)  # misses it: looked up
    agree(got is y and np.array_equal(y, reference(COMM, x, "sum")) and len(calls) == 2,
          "another call was not looked up")
    agree(memo.LAST[0] is memo.find(x, y, "ring").repeat)
    sub.Free()
    agree(memo.LAST[0] is memo.no_call, "a freed communicator's call is kept")


def test_a_call_with_options_repeats_until_its_options_change():
    x, y = np.arange(4099, dtype=np.int64) + RANK, np.empty(4099, np.int64)
    bound = []
    for segment in (512, 512, 1024, 1024):
        x += 1
        mlcomm.allreduce(x, y, algorithm="ring", segment_bytes=segment)
        agree(np.array_equal(y, reference(COMM, x, "sum")), f"segment_bytes={segment}")
        bound.append(memo.find(x, y, "ring"))
        agree(bound[-1] is not None and bound[-1].options == {"segment_bytes": segment})
    agree(bound[0] is bound[1] and bound[2] is bound[3] and bound[1] is not bound[2],
          "equal options repeat through one bound call; new options plan again")


def test_repeated_avg_divides_every_time():
    x = np.full(5, float(RANK + 1))
    y = np.empty(5)
    for _ in range(3):
        mlcomm.allreduce(x, y, op="avg", algorithm="ring")
        agree(np.allclose(y, (P + 1) / 2), f"avg gave {y}")


def test_recvbuf_none_returns_a_new_array_every_call():
    x = np.arange(6, dtype=np.int32)
    first = mlcomm.allreduce(x)
    second = mlcomm.allreduce(x)
    agree(first is not second and not np.shares_memory(first, second))
    agree(np.array_equal(first, x * P) and np.array_equal(second, x * P))


@pytest.mark.parametrize("name", runs_here(["ring", "shared_memory", "mpi", None]))
def test_a_small_allreduce_into_a_new_array_repeats_bound(name):
    """A small all-reduce with no output array, called again on the same input, finds its
    bound call in the memo, which binds it to an output of its own; from then on no
    planning or binding, a new array each call with this call's data, the earlier results
    untouched, and the bits of the call with an output array. A new input each call binds
    no output of its own."""
    s = session.session_of(COMM)
    for _ in range(3):
        fleeting = np.ones(3, np.float32)
        mlcomm.allreduce(fleeting, algorithm=name)
        kept = memo.find(fleeting, None, name)
        agree(kept is None or kept.fresh is None,
              f"{name}: bound an output of its own for an input seen once")
    x = (np.arange(2 * 3, dtype=np.float32) * (RANK + 1) / 7).reshape(2, 3)
    mlcomm.allreduce(x, algorithm=name)
    first = memo.find(x, None, name)
    agree(first is not None and first.fresh is None, f"{name}: the first call is not kept")
    mlcomm.allreduce(x, algorithm=name)
    bound = memo.find(x, None, name)
    agree(bound is not first and bound.fresh is not None,
          f"{name}: the second call did not bind an output of its own")
    misses, results = s.plan_misses, []
    for trial in range(3):
        x += trial
        results.append(mlcomm.allreduce(x, algorithm=name))
        out = np.empty_like(x)
        mlcomm.allreduce(x, out, algorithm=name)
        agree(results[-1].shape == x.shape and results[-1].tobytes() == out.tobytes(),
              f"{name} trial {trial}: {results[-1]} against {out}")
        agree(memo.find(x, None, name) is bound,
              f"{name} trial {trial}: planned again")
    agree(s.plan_misses == misses, f"{name}: {s.plan_misses - misses} plans built on repeats")
    agree(len({id(r) for r in results}) == 3 and not any(
        np.shares_memory(a, b) for a in results for b in results if a is not b))
    agree(not np.array_equal(results[0], results[2]), "an earlier result changed with a repeat")
    big = np.ones(mlcomm.session.bound.FRESH_BYTES // 4 + 1, np.float32)
    for _ in range(2):  # above FRESH_BYTES: nothing kept for it
        mlcomm.allreduce(big, algorithm=name)
    kept = memo.find(big, None, name)
    agree(kept is None or kept.send_ref() is not big, "kept a large one")


def test_a_buffer_reshaped_or_replaced_is_planned_again():
    x = np.arange(12, dtype=np.int64) + RANK
    y = np.empty(12, np.int64)
    mlcomm.allreduce(x, y, algorithm="ring")
    x.shape = y.shape = (3, 4)
    got = mlcomm.allreduce(x, y, algorithm="ring")
    agree(got is y and got.shape == (3, 4) and np.array_equal(got, reference(COMM, x, "sum")))
    x, y = np.resize(x, 20), np.resize(y, 20)  # new arrays, maybe at the old ones' ids
    x[...] = np.arange(20) + RANK
    got = mlcomm.allreduce(x, y, algorithm="ring")
    agree(got is y and np.array_equal(got, reference(COMM, x, "sum")), "resized buffers")


def test_no_caller_array_is_kept_alive():
    """Bound calls hold weak references and bindings addresses: a freed array is gone, and a new
    array that reuses its id (and maybe its memory) is never mistaken for it."""
    import gc
    import weakref
    refs = []
    for trial in range(20):
        x = np.full(1000 + trial % 3, RANK + trial, np.float64)
        y = np.empty_like(x)
        got = mlcomm.allreduce(x, y, algorithm="ring")
        agree(got is y and np.all(y == P * trial + P * (P - 1) / 2), f"trial {trial}")
        refs += [weakref.ref(x), weakref.ref(y)]
        del x, y, got
    gc.collect()
    agree(all(r() is None for r in refs), "mlcomm kept a caller's array alive")


def test_repeated_bcast_and_reduce():
    buf = np.empty(7, np.float64)
    out = np.empty(7, np.float64)
    for trial in range(3):
        buf[...] = trial if RANK == 1 % P else -1
        mlcomm.bcast(buf, root=1 % P)
        agree(np.all(buf == trial), f"bcast trial {trial}")
        got = mlcomm.reduce(np.full(7, float(RANK + trial)), out, root=0)
        if RANK == 0:
            agree(got is out and np.all(out == P * trial + P * (P - 1) / 2))
        else:
            agree(got is None)


def test_a_freed_communicator_is_not_reused():
    for trial in range(3):
        sub = COMM.Dup()
        x = np.full(4, trial + RANK, np.int32)
        y = np.empty(4, np.int32)
        mlcomm.allreduce(x, y, comm=sub)
        again = mlcomm.allreduce(x, y, comm=sub)
        agree(np.array_equal(again, reference(COMM, x, "sum")), f"trial {trial}")
        sub.Free()


@pytest.mark.parametrize("name,option", [("ring", "segment_bytes"),
                                         ("double_binary_tree", "chunk_bytes")])
def test_segmented_steps_overlap_and_stay_exact(name, option):
    count = 6007
    x = (np.arange(count, dtype=np.int64) * (RANK + 3)) % 1013
    want = reference(COMM, x, "sum")
    y = np.empty_like(x)
    mlcomm.allreduce(x, y, algorithm=name, **{option: 512})
    agree(np.array_equal(y, want), f"{name} out of place")
    z = x.copy()
    mlcomm.allreduce(mlcomm.IN_PLACE, z, algorithm=name, **{option: 512})
    agree(np.array_equal(z, want), f"{name} in place")
    if P > 1 and name == "ring":  # transfers start while the previous segment is reduced
        plan = session.session_of(COMM).plan("allreduce", name, count, x.dtype, "sum",
                                      {option: 512})
        agree(plan.program.early_starts() > 0, f"{name}: no step starts early")


def test_buffers_of_one_shape_keep_their_bindings_and_share_scratch():
    """Calls alternating between equal-shaped buffers (gradient buckets) stay bound: each
    buffer pair keeps its binding, and the bindings of one plan share one scratch."""
    s = session.session_of(COMM)
    n = 6
    xs = [np.arange(50, dtype=np.int64) * (RANK + 1) + k for k in range(n)]
    ys = [np.empty(50, np.int64) for _ in range(n)]
    plan = s.plan("allreduce", "ring", 50, xs[0].dtype, "sum", {})
    for trial in range(3):
        for k in range(n):
            mlcomm.allreduce(xs[k], ys[k], algorithm="ring")
            agree(np.array_equal(ys[k], reference(COMM, xs[k], "sum")), f"buffer {k}")
        bound = [b for b in s.bindings() if b.plan is plan]
        if trial == 0:
            first = [id(b) for b in bound]
        agree(len(bound) == n and [id(b) for b in bound] == first,
              f"trial {trial}: a buffer was bound again")
        agree(len({id(b.scratch) for b in bound}) == 1, "the bindings share one scratch")
