"""mlcomm.allreduce_init: bound once, each call reduces what the buffers hold then."""

import numpy as np
import pytest
from mpi4py import MPI

import mlcomm
from mlcomm.benchmark.verify import reference

from mpi_helpers import COMM, DeviceLike, agree, runs_here

pytestmark = pytest.mark.mpi
P, RANK = COMM.Get_size(), COMM.Get_rank()


@pytest.mark.parametrize("name", runs_here(sorted(mlcomm.ALGORITHMS)))
def test_each_call_reduces_the_current_contents(name):
    for count in (1, P + 2, 1001):
        x, y = np.empty(count, np.int64), np.empty(count, np.int64)
        handle = mlcomm.allreduce_init(x, y, algorithm=name)
        for trial in range(3):
            x[...] = (np.arange(count) * (RANK + 1) + trial) % 97 - 40
            agree(handle() is y, f"{name} returned another array")
            agree(np.array_equal(y, reference(COMM, x, "sum")), f"{name} count={count} trial={trial}")


def test_in_place_and_max():
    z = np.empty(7)
    handle = mlcomm.allreduce_init(mlcomm.IN_PLACE, z, op=MPI.MAX, algorithm="recursive_halving_doubling")
    for trial in range(3):
        mine = np.arange(7.0) * ((RANK + trial) % P) - trial
        z[...] = mine
        handle()
        agree(np.array_equal(z, reference(COMM, mine, "max")), f"trial {trial}: {z}")


def test_avg_divides_on_every_call_and_recvbuf_none_is_owned():
    x = np.zeros((2, 3), np.float64)
    handle = mlcomm.allreduce_init(x, op="avg", algorithm="ring")
    for trial in range(3):
        x[...] = RANK + trial
        out = handle()
        agree(out.shape == (2, 3) and np.allclose(out, (P - 1) / 2 + trial), f"{out}")
    agree(handle() is out, "recvbuf=None: the handle returns its own array every call")


def test_options_and_other_calls_of_the_same_shape_in_between():
    """Calls of the same shape on other buffers (another handle, the public call) share the
    cached plan; the handle keeps its own binding through them."""
    x, y = np.empty(64, np.int32), np.empty(64, np.int32)
    handle = mlcomm.allreduce_init(x, y, algorithm="ring", segment_bytes=32)
    other = np.empty(64, np.int32)
    twin = mlcomm.allreduce_init(mlcomm.IN_PLACE, other, algorithm="ring", segment_bytes=32)
    binding = handle.binding
    for trial in range(3):
        x[...] = RANK + trial
        handle()
        agree(np.all(y == P * (P - 1) // 2 + P * trial), f"trial {trial}: {y}")
        other[...] = 1
        mlcomm.allreduce(mlcomm.IN_PLACE, other, algorithm="ring", segment_bytes=32)
        agree(np.all(other == P), f"the public call, trial {trial}: {other}")
        other[...] = 2
        twin()
        agree(np.all(other == 2 * P), f"the twin handle, trial {trial}: {other}")
    agree(handle.binding is binding and binding.live, "the handle was rebound")


def test_bad_arguments_fail_at_init_before_any_message():
    with pytest.raises(ValueError, match="recvbuf has 3 elements"):
        mlcomm.allreduce_init(np.ones(4), np.ones(3))
    with pytest.raises(TypeError, match="allreduce_init takes host arrays"):
        mlcomm.allreduce_init(DeviceLike(), DeviceLike())


def test_freeing_the_communicator_frees_the_handles_binding():
    dup = COMM.Dup()
    x = np.full(5, RANK, np.int64)
    handle = mlcomm.allreduce_init(mlcomm.IN_PLACE, x, comm=dup, algorithm="recursive_doubling")
    handle()
    agree(np.all(x == P * (P - 1) // 2), f"{x}")
    binding = handle.binding
    dup.Free()  # mlcomm's duplicate goes with it, and so do the handle's requests
    agree(not binding.live, "the handle's binding outlived its communicator")
    with pytest.raises(ValueError, match="communicator of this allreduce_init handle was freed"):
        handle()
