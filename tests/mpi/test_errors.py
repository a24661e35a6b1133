"""Argument errors are raised locally, before any message, with the fix in the text."""

import numpy as np
import pytest
from mpi4py import MPI

import mlcomm

from mpi_helpers import COMM, DeviceLike, agree, runs_here

pytestmark = pytest.mark.mpi
P, RANK = COMM.Get_size(), COMM.Get_rank()


def test_wrong_recvbuf_size():
    with pytest.raises(ValueError, match="recvbuf has 3 elements"):
        mlcomm.allreduce(np.ones(4), np.ones(3))


def test_dtype_mismatch():
    with pytest.raises(TypeError, match="same dtype"):
        mlcomm.allreduce(np.ones(4), np.ones(4, np.float32))


def test_non_contiguous():
    with pytest.raises(ValueError, match="ascontiguousarray"):
        mlcomm.allreduce(np.ones(8)[::2])


@pytest.mark.parametrize("host_first", [True, False])
def test_host_and_device_buffers_mixed(host_first):
    host, dev = np.ones(4), DeviceLike()
    args, host_name = ((host, dev), "sendbuf") if host_first else ((dev, host), "recvbuf")
    with pytest.raises(TypeError, match=f"{host_name} is a ndarray but .* is on the device; "
                                        "pass device arrays for both"):
        mlcomm.allreduce(*args)


def test_unknown_algorithm_lists_valid_names():
    with pytest.raises(ValueError, match="ring"):
        mlcomm.allreduce(np.ones(4), algorithm="butterfly")


def test_servers_out_of_range():
    with pytest.raises(ValueError, match="servers"):
        mlcomm.allreduce(np.ones(4), algorithm="parameter_server", servers=P + 1)


def test_unknown_option():
    with pytest.raises(TypeError, match="segment_bytes"):
        mlcomm.allreduce(np.ones(4), algorithm="naive", segment_bytes=8)


def test_op_that_makes_no_sense():
    with pytest.raises(TypeError, match="bxor"):
        mlcomm.allreduce(np.ones(4), op="bxor")
    with pytest.raises(TypeError, match="max"):
        mlcomm.allreduce(np.ones(4, np.complex64), op="max")


def test_mpi_algorithm_with_a_dtype_mpi_lacks():
    bf16 = np.ones(4, mlcomm.kernels.BFLOAT16)
    with pytest.raises(TypeError, match="no bfloat16 datatype.*'ring'"):
        mlcomm.allreduce(bf16, algorithm="mpi")
    agree(mlcomm.allreduce(bf16, algorithm="ring")[0] == P)


def test_mpi_algorithm_moves_the_bools_it_cannot_reduce():
    """The library's allgather and bcast move C bools; its reductions of them take only the
    logical ops, not the bitwise ones."""
    flags = np.array([True, False, RANK % 2 == 0])
    want = np.concatenate([[True, False, r % 2 == 0] for r in range(P)])
    agree(np.array_equal(mlcomm.allgather(flags, algorithm="mpi"), want), "allgather")
    got = mlcomm.bcast(flags.copy(), root=P - 1, algorithm="mpi")
    agree(np.array_equal(got, [True, False, (P - 1) % 2 == 0]), "bcast")
    with pytest.raises(TypeError, match="no bxor on bool.*'ring'"):
        mlcomm.allreduce(flags, op="bxor", algorithm="mpi")


def test_non_intra_communicator():
    with pytest.raises(TypeError, match="intracommunicator"):
        mlcomm.allreduce(np.ones(4), comm=object())
    with pytest.raises(ValueError, match="COMM_NULL"):
        mlcomm.allreduce(np.ones(4), comm=MPI.COMM_NULL)


def test_every_rank_still_works_after_errors():
    got = mlcomm.allreduce(np.ones(5), algorithm="ring")
    agree(np.all(got == P))


def test_validate_names_the_differing_ranks():
    if P < 2:
        pytest.skip("needs two ranks")
    count = 4 if COMM.Get_rank() != P - 1 else 5
    with pytest.raises(ValueError, match=f"ranks \\[{P - 1}\\]"):
        mlcomm.allreduce(np.ones(count), algorithm="ring", validate=True)


def test_validate_shares_a_local_error():
    if P < 2:
        pytest.skip("needs two ranks")
    bad = np.ones(8)[::2] if COMM.Get_rank() == 0 else np.ones(4)
    with pytest.raises(ValueError, match="not C-contiguous") as raised:
        mlcomm.allreduce(bad, validate=True)
    # rank 0 raises its own error; every other rank an error that names rank 0 and why
    msg = str(raised.value)
    agree(msg.startswith("sendbuf is not C-contiguous") if RANK == 0 else
          msg.startswith("mlcomm: the call failed on ranks 0 (sendbuf is not C-contiguous"), msg)
    agree(np.all(mlcomm.allreduce(np.ones(4), validate=True) == P), "the next call failed")


@pytest.mark.parametrize("name,option,value", [
    ("ring", "segment_bytes", 0), ("ring", "segment_bytes", -4), ("ring", "segment_bytes", 1.5),
    ("ring", "segment_bytes", "8"), ("ring", "segment_bytes", True),
    ("double_binary_tree", "chunk_bytes", 0), ("double_binary_tree", "chunk_bytes", -1)])
def test_size_options_must_be_positive_whole_bytes(name, option, value):
    with pytest.raises(ValueError, match=f"{option}={value!r}: give a positive whole number"):
        mlcomm.allreduce(np.ones(16), algorithm=name, **{option: value})
    agree(np.all(mlcomm.allreduce(np.ones(16), algorithm=name, **{option: 8}) == P))


def test_overlapping_send_and_recv_buffers_are_refused():
    x = np.ones(10)
    with pytest.raises(ValueError, match="sendbuf and recvbuf overlap"):
        mlcomm.allreduce(x[:8], x[2:])
    same = np.ones(10)  # the same array twice is in place
    agree(np.all(mlcomm.allreduce(same, same, algorithm="ring") == P))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_max_and_min_follow_one_nan_and_signed_zero_rule_in_every_algorithm(dtype):
    """NaN propagates and -0 < +0, so every algorithm gives the same bits on every rank,
    whatever order it reduces in."""
    dt = np.dtype(mlcomm.kernels.BFLOAT16) if dtype == "bfloat16" else np.dtype(dtype)
    x = np.array([0.0 if RANK % 2 else -0.0, -0.0 if RANK % 2 else 0.0, 1.0,
                  np.nan if RANK == P - 1 else 2.0, -0.0, 0.0], dt)
    for op in ("max", "min"):
        seen = set()
        for name in runs_here(sorted(n for n in mlcomm.ALGORITHMS if n not in ("mpi", "auto"))):
            got = mlcomm.allreduce(x, op=op, algorithm=name)
            seen.add(got.tobytes())
            agree(len(set(COMM.allgather(got.tobytes()))) == 1, f"{name} {op}: ranks differ")
            agree(np.isnan(got[3]), f"{name} {op}: NaN lost")
            if P > 1:
                zero = 0.0 if op == "max" else -0.0
                agree(np.signbit(got[0]) == np.signbit(dt.type(zero)), f"{name} {op}: {got}")
        agree(len(seen) == 1, f"{op}: algorithms differ")
