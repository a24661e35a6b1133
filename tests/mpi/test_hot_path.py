"""The hot path: the compiled executor and repeated calls on the same buffers."""

import numpy as np
import pytest
from mpi4py import MPI

import mlcomm
from mlcomm import compiled
from mlcomm.executor import _Binding, bind_plan, private_comm
from mlcomm.verify import reference, sample

from mpi_helpers import COMM, agree

pytestmark = pytest.mark.mpi
P, RANK = COMM.Get_size(), COMM.Get_rank()
HAND_WRITTEN = sorted(n for n in mlcomm.ALGORITHMS if n not in ("mpi", "auto"))
OPS = ("sum", "prod", "min", "max", "band", "bor", "bxor", "land", "lor")


def _cases():
    for dtype in ("int8", "uint16", "int32", "int64", "uint64", "float32", "float64",
                  "complex64", "bool"):
        for op in OPS:
            if mlcomm.kernels.is_supported(np.dtype(dtype), op):
                yield dtype, op


@pytest.mark.parametrize("dtype,op", list(_cases()))
def test_compiled_executor_is_bitwise_the_python_executor(dtype, op):
    dt = np.dtype(dtype)
    pcomm = private_comm(COMM)
    for name in HAND_WRITTEN:
        for count in (1, P + 1, 1031):
            x = sample(dt, op, count, RANK) if dt.kind != "b" else np.arange(count) % (RANK + 2) == 0
            x.flags.writeable = False  # the input is read-only to both executors
            out = np.empty_like(x)
            plan = pcomm.plans.get("allreduce", name, RANK, P, count, dt, op, {})
            binding = bind_plan(pcomm.comm, plan, x, out, op)
            agree((binding.program is not None) == compiled.supports(dt, op),
                  f"{name} {dtype} {op}: compiled loop used where unsupported or vice versa")
            binding.run()
            fast = out.copy()
            out[...] = 0
            _Binding.run(binding)  # the Python step loop on the same requests
            agree(fast.tobytes() == out.tobytes(), f"{name} {dtype} {op} count={count}")
            agree(np.array_equal(fast, reference(COMM, x, op)) or dt.kind in "fc",
                  f"{name} {dtype} {op}: differs from MPI_Allreduce")


def test_compiled_executor_leaves_float16_to_python():
    assert compiled.supports(np.dtype(np.float32), "sum")
    assert not compiled.supports(np.dtype(np.float16), "sum")
    assert not compiled.supports(np.dtype(mlcomm.kernels.BFLOAT16), "max")
    assert not compiled.supports(np.dtype(np.complex128), "prod")


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
    from mlcomm import api
    x, y = np.arange(9, dtype=np.int64) + RANK, np.empty(9, np.int64)
    seen = {}
    for trial in range(3):
        for name in ("ring", "recursive_doubling", "mpi"):
            x += trial
            mlcomm.allreduce(x, y, algorithm=name)
            agree(np.array_equal(y, reference(COMM, x, "sum")), f"{name} trial {trial}")
            repeat = api._REPEATS.get(api._repeat_key(x, y, name))
            agree(repeat is not None and repeat.recvbuf is y and repeat.algorithm == name, name)
            if trial:  # the first call's repeat ran this one: no re-planning in between
                agree(repeat is seen[name], f"{name} was planned again in trial {trial}")
            seen[name] = repeat


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


def test_a_buffer_reshaped_or_resized_in_place_is_planned_again():
    x = np.arange(12, dtype=np.int64) + RANK
    y = np.empty(12, np.int64)
    mlcomm.allreduce(x, y, algorithm="ring")
    x.shape = y.shape = (3, 4)
    got = mlcomm.allreduce(x, y, algorithm="ring")
    agree(got.shape == (3, 4) and np.array_equal(got, reference(COMM, x, "sum")))
    x.shape = y.shape = (12,)
    x.resize(20, refcheck=False)
    y.resize(20, refcheck=False)
    x[...] = np.arange(20) + RANK
    got = mlcomm.allreduce(x, y, algorithm="ring")
    agree(np.array_equal(got, reference(COMM, x, "sum")), "resized buffers")


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
        pcomm = private_comm(COMM)
        plan = pcomm.plans.get("allreduce", name, RANK, P, count, x.dtype, "sum", {option: 512})
        program = bind_plan(pcomm.comm, plan, x, y, "sum").program[0]
        early = [program[i + 3] for i in _step_headers(program)]
        agree(sum(early) > 0, f"{name}: no step starts early")


def _step_headers(program):
    pc = compiled._HEADER
    for _ in range(program[0]):
        yield pc
        pc += compiled._STEP + program[pc + 2] * compiled._OP


def test_buffers_of_one_shape_keep_their_bindings_and_share_scratch():
    """Calls alternating between equal-shaped buffers (gradient buckets) stay bound: each
    buffer pair keeps its binding on the shared plan, and the host bindings share one scratch."""
    from mlcomm.executor import BINDINGS_PER_PLAN, plan_cache
    n = BINDINGS_PER_PLAN + 1
    xs = [np.arange(50, dtype=np.int64) * (RANK + 1) + k for k in range(n)]
    ys = [np.empty(50, np.int64) for _ in range(n)]
    for trial in range(3):
        for k in range(n - 1):  # within the plan's capacity: bound once, never again
            mlcomm.allreduce(xs[k], ys[k], algorithm="ring")
            agree(np.array_equal(ys[k], reference(COMM, xs[k], "sum")), f"buffer {k}")
        plans = [p for p in plan_cache(COMM).plans.values()
                 if p.key[:4] == ("allreduce", "ring", P, 50)]
        agree(len(plans) == 1, "one plan for one shape")
        bindings = list(plans[0].bindings.values())
        if trial == 0:
            first = [id(b) for b in bindings]
        agree([id(b) for b in bindings] == first, f"trial {trial}: a buffer was bound again")
        agree(len({id(b.scratch) for b in bindings}) == 1, "host bindings share one scratch")
    for k in range(n):  # one buffer more than the capacity: the oldest binding goes, all correct
        mlcomm.allreduce(xs[k], ys[k], algorithm="ring")
        agree(np.array_equal(ys[k], reference(COMM, xs[k], "sum")), f"buffer {k} past capacity")
    agree(len(plans[0].bindings) == BINDINGS_PER_PLAN, "the plan keeps its capacity")
