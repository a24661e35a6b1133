"""Argument errors are raised locally, before any message, with the fix in the text."""

import numpy as np
import pytest
from mpi4py import MPI

import mlcomm

from mpi_helpers import COMM, DeviceLike, agree

pytestmark = pytest.mark.mpi
P = COMM.Get_size()


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
    with pytest.raises(ValueError):
        mlcomm.allreduce(bad, validate=True)
    agree(True)
