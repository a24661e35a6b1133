"""PyTorch CPU tensors in every collective: zero-copy, in place and out of place."""

import numpy as np
import pytest

import mlcomm
from mlcomm.session import memo

from mpi_helpers import COMM, agree

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.mpi
P, RANK = COMM.Get_size(), COMM.Get_rank()


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16", "int64"])
@pytest.mark.parametrize("name", ["ring", "recursive_doubling", "auto"])
def test_allreduce_out_of_place_in_place_and_new(dtype, name):
    dt = getattr(torch, dtype)
    x = (torch.arange(12, dtype=torch.float64).reshape(3, 4) % 5 + RANK).to(dt)
    want = (torch.arange(12, dtype=torch.float64).reshape(3, 4) % 5 * P + P * (P - 1) / 2)
    y = torch.empty_like(x)
    got = mlcomm.allreduce(x, y, algorithm=name)
    agree(got is y and torch.equal(y.to(torch.float64), want), f"{dtype} {name} recvbuf")
    z = x.clone()
    got = mlcomm.allreduce(mlcomm.IN_PLACE, z, algorithm=name)
    agree(got is z and torch.equal(z.to(torch.float64), want), f"{dtype} {name} in place")
    got = mlcomm.allreduce(x, algorithm=name)
    agree(isinstance(got, torch.Tensor) and got.shape == x.shape and got.dtype == x.dtype
          and torch.equal(got.to(torch.float64), want), f"{dtype} {name} recvbuf=None")


def test_zero_copy_into_the_tensors_storage_and_parameters():
    p = torch.nn.Parameter(torch.full((5,), float(RANK + 1)))
    before = p.data_ptr()
    mlcomm.allreduce(mlcomm.IN_PLACE, p)  # a parameter, which requires grad
    agree(p.data_ptr() == before and torch.all(p == P * (P + 1) / 2), f"{p}")
    (p * (RANK + 1)).sum().backward()  # its gradient: RANK + 1 everywhere
    grad = p.grad
    before = grad.data_ptr()
    mlcomm.allreduce(mlcomm.IN_PLACE, p.grad)
    agree(p.grad is grad and grad.data_ptr() == before and torch.all(grad == P * (P + 1) / 2),
          f"{grad}")


def test_nonblocking_and_persistent_on_tensors():
    xs = [torch.full((1000,), float(RANK + k)) for k in range(4)]
    reqs = [mlcomm.iallreduce(mlcomm.IN_PLACE, x, op="avg") for x in xs]
    for k, r in enumerate(reqs):
        agree(r.wait() is xs[k] and torch.allclose(xs[k], torch.full((1000,), k + (P - 1) / 2)))
    buf = torch.zeros(7)
    handle = mlcomm.allreduce_init(mlcomm.IN_PLACE, buf)
    for trial in range(3):
        buf.fill_(RANK + trial)
        handle()
        agree(torch.all(buf == P * trial + P * (P - 1) / 2), f"trial {trial}")


def test_other_collectives_on_tensors():
    x = torch.arange(2 * P, dtype=torch.float32) + RANK
    part = mlcomm.reduce_scatter(x)
    agree(isinstance(part, torch.Tensor) and torch.equal(
        part, torch.arange(2 * P, dtype=torch.float32)[2 * RANK:2 * RANK + 2] * P
        + P * (P - 1) / 2))
    gathered = mlcomm.allgather(torch.full((2,), float(RANK)))
    agree(torch.equal(gathered, torch.arange(P, dtype=torch.float32).repeat_interleave(2)))
    b = torch.arange(4.0) if RANK == 0 else torch.zeros(4)
    agree(mlcomm.bcast(b) is b and torch.equal(b, torch.arange(4.0)))
    r = mlcomm.reduce(torch.ones(3), root=0)
    agree(r is None if RANK else torch.equal(r, torch.full((3,), float(P))))


def test_a_non_contiguous_tensor_is_refused():
    with pytest.raises(ValueError, match="non-contiguous tensor; pass sendbuf.contiguous"):
        mlcomm.allreduce(torch.ones(4, 4).t())


def test_repeated_tensor_calls_take_their_bound_call_and_see_storage_changes():
    from mlcomm import session
    x, y = torch.full((6,), float(RANK)), torch.empty(6)
    mlcomm.allreduce(x, y, algorithm="ring")
    bound = memo.find(x, y, "ring")
    agree(bound is not None, "a repeated tensor call has no bound call")
    for trial in range(3):
        x.fill_(RANK + trial)
        agree(torch.all(mlcomm.allreduce(x, y, algorithm="ring") == P * trial + P * (P - 1) / 2))
    y.set_(torch.empty(6).untyped_storage())  # new storage: the bound call must not run
    x.fill_(1.0)
    got = mlcomm.allreduce(x, y, algorithm="ring")
    agree(got is y and torch.all(y == P), f"{y}")
    x.resize_(4)
    y.resize_(4)
    agree(torch.all(mlcomm.allreduce(x, y, algorithm="ring") == P), "resized tensors")
