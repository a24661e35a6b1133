"""The Call: what the caller asked, checked on one rank of a communicator of any size with
no message sent (``Call.check(size, rank)``), each error naming the argument and the fix."""

import numpy as np
import pytest
from mpi4py import MPI

from mlcomm.session import Call


def checked(collective, sendbuf, recvbuf=None, size=4, rank=1, **kw):
    call = Call(collective, sendbuf, recvbuf, **kw)
    call.check(size, rank)
    return call


def test_a_checked_call_holds_the_arrays_the_plan_runs_on():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    call = checked("allreduce", x)
    assert call.inp.shape == (12,) and np.shares_memory(call.inp, x)
    assert call.out.shape == (12,) and not np.shares_memory(call.out, x)
    assert (call.count, call.opname, call.name, call.offset) == (12, "sum", "auto", None)
    assert call.signature() == ("allreduce", "auto", 12, "<f4", "sum", 0, [], None)
    assert call.result(1).shape == (3, 4)  # shaped like the input


@pytest.mark.parametrize("collective, rank, want", [
    ("allgather", 2, (3, 12, 3 * 2)),       # its block of the output, at rank 2's place
    ("reduce_scatter", 2, (12, 3, 0)),      # the whole input, its first block as output
    ("allreduce", 2, (12, 12, 0)),
])
def test_in_place_calls_read_their_input_inside_their_output(collective, rank, want):
    y = np.zeros(12, np.int64)
    call = checked(collective, MPI.IN_PLACE, y, rank=rank)
    assert (call.inp.size, call.out.size, call.offset) == want
    assert np.shares_memory(call.inp, y) and np.shares_memory(call.out, y)


def test_a_reduce_has_an_output_on_its_root_alone():
    x = np.ones(5)
    assert checked("reduce", x, root=1, rank=1).out.size == 5
    off_root = checked("reduce", x, root=1, rank=0)
    assert off_root.out.size == 0 and off_root.result(0) is None


@pytest.mark.parametrize("collective, sendbuf, recvbuf, kw, error, words", [
    ("reduce", np.ones(4), None, {"root": 4}, ValueError, "root=4 is not a rank of this 4-rank"),
    ("reduce_scatter", np.ones(5), None, {}, ValueError, "pad it to 8"),
    ("allreduce", np.ones(4), np.ones(3), {}, ValueError, "pass a recvbuf of 4 elements"),
    ("allreduce", np.ones(4), np.ones(4, np.float32), {}, TypeError, "use the same dtype"),
    ("allreduce", MPI.IN_PLACE, None, {}, ValueError, "needs recvbuf"),
    ("allgather", MPI.IN_PLACE, np.ones(6), {}, ValueError, "not a multiple of the 4 ranks"),
    ("allreduce", np.ones((4, 4))[:, 0], None, {}, ValueError, "np.ascontiguousarray(sendbuf)"),
    ("allreduce", np.ones(4), np.frombuffer(bytes(32)), {}, ValueError,
     "recvbuf is read-only; pass a writable array"),
    ("allreduce", np.ones(4), None, {"op": "nand"}, ValueError, "nand"),
    ("allreduce", np.ones(4), None, {"algorithm": "ring", "options": {"bogus": 1}},
     TypeError, "takes no option ['bogus']"),
    ("allreduce", np.ones(4), None, {"options": {"segment_bytes": 64}}, TypeError,
     "need an explicit algorithm"),
])
def test_bad_arguments_are_named_with_the_fix(collective, sendbuf, recvbuf, kw, error, words):
    with pytest.raises(error) as info:
        checked(collective, sendbuf, recvbuf, **kw)
    assert words in str(info.value), info.value


def test_overlapping_buffers_must_say_in_place():
    x = np.ones(8)
    with pytest.raises(ValueError, match="sendbuf=mlcomm.IN_PLACE"):
        checked("allreduce", x[:4], x[2:6])
    assert checked("allreduce", x, x).offset == 0  # the same elements twice: in place


def test_a_bad_communicator_is_refused_before_any_check():
    with pytest.raises(ValueError, match="COMM_NULL"):
        Call("allreduce", np.ones(2), comm=MPI.COMM_NULL)
    with pytest.raises(TypeError, match="intracommunicator"):
        Call("allreduce", np.ones(2), comm="world")
