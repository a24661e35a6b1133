"""The mpiexec jobs of tests/test_torch.py: torch.distributed on the mlcomm backend.

    mpiexec -n P python tests/torch_job.py PART [PART ...]

Parts: ``collectives`` (every collective, every dtype, sync and async_op=True, against
NumPy), ``ddp`` (DDP and FSDP2 against one process on the global batch), ``groups``
(new_group on a subset, completion hooks), ``errors`` (the errors a user meets, raised on
every rank). An assertion that fails on one rank ends the whole job (abort_on_error). Each
part prints ``OK <part>`` on rank 0.
"""

import hashlib
import sys
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

import mlcomm.torch
from mlcomm.cli import abort_on_error
from torch_exchanges import exchanges

R = MPI.COMM_WORLD.Get_rank()
P = MPI.COMM_WORLD.Get_size()
N = 7  # elements per rank
INTS = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16,
        torch.uint32, torch.uint64]
FLOATS = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
COMPLEX = [torch.complex64, torch.complex128]
DTYPES = [torch.bool, *INTS, *FLOATS, *COMPLEX]
Op = dist.ReduceOp
OPS = {"sum": Op.SUM, "avg": Op.AVG, "prod": Op.PRODUCT, "min": Op.MIN, "max": Op.MAX,
       "band": Op.BAND, "bor": Op.BOR, "bxor": Op.BXOR}
REFERENCE = {"sum": np.sum, "prod": np.prod, "min": np.min, "max": np.max,
             "band": np.bitwise_and.reduce, "bor": np.bitwise_or.reduce,
             "bxor": np.bitwise_xor.reduce, "avg": lambda a, axis: np.sum(a, axis) / P}


def ops_of(dtype):
    if dtype is torch.bool:
        return ["min", "max", "band", "bor", "bxor"]
    if dtype in INTS:
        return ["sum", "prod", "min", "max", "band", "bor", "bxor"]
    if dtype in FLOATS:
        return ["sum", "avg", "prod", "min", "max"]
    return ["sum", "avg"]  # torch reduces complex tensors as their real views


def values(dtype, rank, n=N):
    """Rank ``rank``'s data as a float64, int64, bool or complex NumPy array."""
    i = np.arange(n) + 3 * rank
    if dtype is torch.bool:
        return (i % 3) != 0
    if dtype in INTS:
        return i % 3 + 1
    if dtype in FLOATS:
        return (i % 3) * 0.5 - 0.5
    return (i % 3) * 0.5 + 1j * (i % 2)


def tensor(a, dtype):
    if dtype is torch.bfloat16:
        return torch.from_numpy(np.asarray(a, np.float32)).to(dtype)
    return torch.from_numpy(np.asarray(a).astype(torch.empty(0, dtype=dtype).numpy().dtype))


def array(t):
    return t.float().numpy() if t.dtype is torch.bfloat16 else t.numpy()


def same(got, want, what, dtype, op=""):
    got, want = array(got), array(tensor(want, dtype))
    if op == "avg" and dtype not in (torch.float64, torch.complex128):  # divided in the dtype
        ok = np.allclose(got, want, rtol=1e-2 if dtype in (torch.float16, torch.bfloat16)
                         else 1e-6)
    else:
        ok = np.array_equal(got, want)
    assert ok, f"rank {R}: {what} {dtype} {op}: got {got}, want {want}"


def everyone(dtype, n=N):
    return np.stack([values(dtype, r, n) for r in range(P)])


def finish(work):
    """Wait for ``work``, a collective's async Work (or None, when it ran blocking)."""
    if work is not None:
        work.wait()


# --- collectives --------------------------------------------------------------------------

def all_reduces(async_op):
    """Every (dtype, op) pair; async ones all started before the first wait."""
    pending = []
    for dtype in DTYPES:
        for op in ops_of(dtype):
            t = tensor(values(dtype, R), dtype)
            work = dist.all_reduce(t, OPS[op], async_op=async_op)
            pending.append((work, t, dtype, op))
    for work, t, dtype, op in pending:
        if work is not None:
            assert work.wait() is True
        same(t, REFERENCE[op](everyone(dtype), axis=0), "all_reduce", dtype, op)


def others(dtype, async_op):
    """broadcast, reduce, all_gather (both forms, in place), reduce_scatter (both forms),
    coalesced, send/recv and barrier in ``dtype``."""
    op = "bor" if dtype is torch.bool else "sum"
    data, root = everyone(dtype), P - 1
    b = tensor(values(dtype, R), dtype)
    red = tensor(values(dtype, R), dtype)
    lst = [tensor(np.zeros(N), dtype) for _ in range(P)]
    big = tensor(np.zeros(N * P), dtype)
    inplace = tensor(np.zeros(N * P), dtype)
    inplace[R * N:(R + 1) * N] = tensor(values(dtype, R), dtype)
    rs = tensor(np.zeros(2), dtype)
    rs_list = tensor(np.zeros(2), dtype)
    mine = values(dtype, R, 2 * P)
    works = [
        dist.broadcast(b, root, async_op=async_op),
        dist.reduce(red, 1 % P, OPS[op], async_op=async_op),
        dist.all_gather(lst, tensor(values(dtype, R), dtype), async_op=async_op),
        dist.all_gather_into_tensor(big, tensor(values(dtype, R), dtype), async_op=async_op),
        dist.all_gather_into_tensor(inplace, inplace[R * N:(R + 1) * N], async_op=async_op),
        dist.reduce_scatter_tensor(rs, tensor(mine, dtype), OPS[op], async_op=async_op),
        dist.reduce_scatter(rs_list, list(tensor(mine, dtype).chunk(P)), OPS[op],
                            async_op=async_op),
    ]
    for w in works:
        finish(w)
    same(b, data[root], "broadcast", dtype)
    if R == 1 % P:
        same(red, REFERENCE[op](data, axis=0), "reduce", dtype, op)
    for r, part in enumerate(lst):
        same(part, data[r], "all_gather", dtype)
    same(big, data.reshape(-1), "all_gather_into_tensor", dtype)
    same(inplace, data.reshape(-1), "all_gather_into_tensor in place", dtype)
    full = REFERENCE[op](everyone(dtype, 2 * P), axis=0)
    same(rs, full[2 * R:2 * R + 2], "reduce_scatter_tensor", dtype, op)
    same(rs_list, full[2 * R:2 * R + 2], "reduce_scatter", dtype, op)


def coalesced_and_point_to_point(async_op):
    a, b = torch.full((3,), float(R + 1)), torch.full((5,), float(2 * R))
    with dist._coalescing_manager(async_ops=async_op) as cm:
        dist.all_reduce(a)
        dist.all_reduce(b)
    if async_op:
        cm.wait()
    assert torch.all(a == P * (P + 1) / 2) and torch.all(b == P * (P - 1)), (a, b)
    big, part = torch.zeros(2 * P), torch.zeros(2)
    with dist._coalescing_manager(async_ops=async_op) as cm:
        dist.all_gather_into_tensor(big, torch.full((2,), float(R)))
    with dist._coalescing_manager(async_ops=async_op) as cm2:
        dist.reduce_scatter_tensor(part, torch.arange(2.0 * P))
    if async_op:
        cm.wait()
        cm2.wait()
    assert torch.equal(big, torch.arange(P, dtype=torch.float32).repeat_interleave(2)), big
    assert torch.equal(part, torch.arange(2.0 * P)[2 * R:2 * R + 2] * P), part
    # a sparse tensor's sum (as gloo's): rank r holds ones at 0..r of a (P, 2) tensor
    sparse = torch.sparse_coo_tensor(torch.arange(R + 1).reshape(1, -1),
                                     torch.ones(R + 1, 2), (P, 2))
    work = dist.all_reduce(sparse, async_op=async_op)
    if async_op:
        assert work.wait() is True
    want = torch.tensor([[P - i] * 2 for i in range(P)], dtype=torch.float32)
    assert sparse.is_sparse and torch.equal(sparse.to_dense(), want), sparse
    # torch's layout: output_tensor_lists[rank][input]
    inputs = [torch.full((2,), float(R)), torch.full((3,), 10.0 + R)]
    outputs = [[torch.empty_like(t) for t in inputs] for _ in range(P)]
    gathered = dist.all_gather_coalesced(outputs, inputs, async_op=async_op)
    if async_op:
        gathered.wait()
    for r, (first, second) in enumerate(outputs):
        assert torch.all(first == r) and torch.all(second == 10 + r), outputs
    if P > 1:  # a ring: each rank sends to the next, receives from the previous
        got = torch.empty(4, dtype=torch.bfloat16)
        send = dist.isend(torch.full((4,), float(R), dtype=torch.bfloat16), (R + 1) % P)
        recv = dist.irecv(got, (R - 1) % P)
        send.wait()
        recv.wait()
        assert torch.all(got == (R - 1) % P), got
        if R == 1:
            dist.send(torch.full((2,), 7), 0)
        if R == 0:
            x = torch.empty(2, dtype=torch.int64)
            assert dist.recv(x) == 1 and torch.all(x == 7), x  # from any source
    finish(dist.barrier(async_op=async_op))


def collectives():
    all_reduces(async_op=True)   # calls seen for the first time: compared in this thread
    all_reduces(async_op=False)
    all_reduces(async_op=True)   # seen before: compared on the progress thread
    for dtype in DTYPES:
        for async_op in (False, True):
            others(dtype, async_op)
    for async_op in (False, True):
        coalesced_and_point_to_point(async_op)
    work = dist.all_reduce(torch.ones(3), async_op=True)
    future = work.get_future()
    assert torch.all(future.wait()[0] == P) and work.is_completed() and work.is_success()


# --- DDP and FSDP2 ------------------------------------------------------------------------

def digest(module):
    h = hashlib.sha256()
    for p in module.parameters():
        p = p.full_tensor() if hasattr(p, "full_tensor") else p
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


def model(seed, unused=False):
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(12, 48), torch.nn.Tanh(), torch.nn.Linear(48, 48),
                              torch.nn.Tanh(), torch.nn.Linear(48, 4)).double()
    if unused:
        net.add_module("unused", torch.nn.Linear(4, 4).double())
        net.forward = lambda x: torch.nn.Sequential.forward(net[:5], x)
    return net


B, STEPS = 6, 4
gen = torch.Generator().manual_seed(1)
X = torch.randn(STEPS * B * P, 12, generator=gen, dtype=torch.float64)
Y = torch.randint(0, 4, (STEPS * B * P,), generator=gen)
LOSS = torch.nn.CrossEntropyLoss()


def one_process(unused=False):
    net = model(0, unused)
    opt = torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.9, weight_decay=1e-3)
    for step in range(STEPS):
        lo = step * B * P
        opt.zero_grad()
        LOSS(net(X[lo:lo + B * P]), Y[lo:lo + B * P]).backward()
        opt.step()
    return net


def distributed(wrap, accumulate=False, unused=False):
    """Train ``wrap(model)`` on this rank's share of each global batch; every rank starts
    elsewhere (DDP broadcasts rank 0's parameters, FSDP2 shards rank 0's)."""
    net = model(0 if R == 0 else R + 10, unused)
    if wrap is fsdp:
        net = model(0, unused)  # fully_shard shards; it does not broadcast
    wrapped = wrap(net)
    opt = torch.optim.SGD(wrapped.parameters(), lr=0.2, momentum=0.9, weight_decay=1e-3)
    for step in range(STEPS):
        lo = step * B * P + R * B
        opt.zero_grad(set_to_none=step % 2 == 0)
        x, y = X[lo:lo + B], Y[lo:lo + B]
        if accumulate:  # two half batches, the first without synchronising
            with wrapped.no_sync():
                (LOSS(wrapped(x[:B // 2]), y[:B // 2]) / 2).backward()
            (LOSS(wrapped(x[B // 2:]), y[B // 2:]) / 2).backward()
        else:
            LOSS(wrapped(x), y).backward()
        opt.step()
    return net


def fsdp(net):
    from torch.distributed.fsdp import fully_shard
    for layer in net:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    return fully_shard(net)


def ddp():
    DDP = torch.nn.parallel.DistributedDataParallel
    reference, with_unused = one_process(), one_process(unused=True)
    hooked = []
    dist.group.WORLD._register_on_completion_hook(hooked.append)
    cases = {
        "default": (lambda m: DDP(m, bucket_cap_mb=0.005), {}),
        "gradient_as_bucket_view": (lambda m: DDP(m, bucket_cap_mb=0.005,
                                                  gradient_as_bucket_view=True), {}),
        "static_graph": (lambda m: DDP(m, bucket_cap_mb=0.005, static_graph=True), {}),
        "find_unused_parameters": (lambda m: DDP(m, bucket_cap_mb=0.005,
                                                 find_unused_parameters=True),
                                   {"unused": True}),
        "no_sync": (lambda m: DDP(m, bucket_cap_mb=0.005), {"accumulate": True}),
        "fully_shard (FSDP2)": (fsdp, {}),
    }
    for name, (wrap, kw) in cases.items():
        net = distributed(wrap, **kw)
        mine = digest(net)
        assert all(d == mine for d in MPI.COMM_WORLD.allgather(mine)), f"{name}: ranks differ"
        ref = with_unused if kw.get("unused") else reference
        err = max(float((a.full_tensor() if hasattr(a, "full_tensor") else a).detach().sub(b).abs().max()
                        / b.abs().max()) for a, b in zip(net.parameters(), ref.parameters()))
        assert err < 1e-13, f"{name}: differs from one process by {err}"
        if R == 0:
            print(f"OK ddp {name}: rel.err {err:.1e}, the same SHA-256 on {P} ranks")
    # the buckets' all-reduces start during backward: before the input's gradient, the last
    seen = []

    class Probe(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            seen.append(time.perf_counter())
            return grad

    net = DDP(model(0), bucket_cap_mb=0.005)
    for _ in range(2):  # the first builds DDP's buckets
        hooked.clear()
        seen.clear()
        x = X[:B].clone().requires_grad_(True)
        LOSS(net(Probe.apply(x)), Y[:B]).backward()
    started = [i.time_queued for i in hooked if i.op_type == "allreduce"]
    assert len(started) >= 2 and min(started) < seen[-1], (started, seen)
    dist.group.WORLD._hooks.clear()


# --- groups -------------------------------------------------------------------------------

def groups():
    ranks = list(range(1, P))                     # every rank but 0
    g = dist.new_group(ranks, timeout=timedelta(seconds=60))
    pair = dist.new_group([0, P - 1])
    infos = []
    if R in ranks:
        g._register_on_completion_hook(infos.append)
        t = torch.full((5,), float(R))
        dist.all_reduce(t, group=g)
        assert torch.all(t == sum(ranks)), t
        dist.all_reduce(t, group=g, async_op=True).wait()
        assert torch.all(t == sum(ranks) * len(ranks)), t
        b = torch.full((2,), float(R))
        dist.broadcast(b, group_src=len(ranks) - 1, group=g)  # the group's last rank
        assert torch.all(b == P - 1), b
        assert dist.get_rank(g) == R - 1 and dist.get_world_size(g) == len(ranks)
        assert [i.op_type for i in infos] == ["allreduce", "allreduce", "broadcast"], infos
        assert all(i.time_queued <= i.time_started <= i.time_finished for i in infos)
        assert infos[0].nbytes == 20
    else:
        assert dist.get_rank(g) == -1
    if R in (0, P - 1):
        t = torch.full((3,), 1.0 + R)
        dist.all_reduce(t, group=pair)
        assert torch.all(t == 2 + P - 1), t
    gloo = dist.new_group(backend="gloo")  # beside mlcomm's: through the store from MPI
    t = torch.full((2,), float(R))
    dist.all_reduce(t, group=gloo)
    assert torch.all(t == P * (P - 1) / 2), t
    dist.barrier()


# --- errors -------------------------------------------------------------------------------

def raises(call, kind, *words):
    try:
        call()
    except kind as exc:
        assert all(w in str(exc) for w in words), f"rank {R}: {exc!r} lacks {words}"
        return str(exc)
    raise AssertionError(f"rank {R}: no {kind.__name__} from {call}")


def errors():
    raises(lambda: dist.all_reduce(torch.empty(3, device="meta")), TypeError,
           "a meta tensor", "CPU tensors")
    raises(lambda: dist.all_reduce(torch.ones(4, 4).t()), ValueError, "non-contiguous",
           ".contiguous()")
    raises(lambda: dist.all_reduce(torch.ones(2, dtype=torch.float8_e4m3fn)), TypeError,
           "float8_e4m3fn")
    raises(lambda: dist.all_reduce(torch.ones(2, dtype=torch.bool)), TypeError, "SUM", "bool")
    raises(lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32), Op.AVG), TypeError,
           "AVG", "int32")
    raises(lambda: dist.all_reduce(torch.ones(2), dist._make_nccl_premul_sum(2.0)),
           NotImplementedError, "PREMUL_SUM", "ReduceOp.SUM")
    raises(lambda: dist.all_reduce(torch.ones(3).to_sparse(), Op.MAX), ValueError,
           "sparse", "ReduceOp.SUM", ".to_dense()")
    # a problem on one rank only: that rank raises it, the others name it
    for n in (4, 2):  # 64 bytes; 16 bytes, which ride in the comparison once seen
        dist.all_reduce(torch.ones(n, n))
        bad = torch.ones(n, n).t() if R == 0 else torch.ones(n, n)
        raises(lambda: dist.all_reduce(bad), ValueError if R == 0 else RuntimeError,
               "non-contiguous")
    # different shapes: on every rank, every path (compared here, and on the progress
    # thread; blocking, riding in the comparison)
    for async_op in (True, False, True, False):
        for r in range(P):
            dist.all_reduce(torch.ones(3 + r), async_op=True).wait()  # every shape seen
        shaped = torch.ones(3 + R)
        raises(lambda: finish(dist.all_reduce(shaped, async_op=async_op)), ValueError,
               "differ", "rank 0: all_reduce torch.float32 (3,)",
               f"rank {P - 1}: all_reduce torch.float32 ({3 + P - 1},)")
    t = torch.ones(3)
    dist.all_reduce(t)  # the group works on after the errors
    assert torch.all(t == P), t
    # a barrier that rank 0 alone enters raises there after the group's timeout (gloo's
    # words: " Timed out "); its next barrier waits for the same ranks, which then come
    late = dist.new_group(list(range(P)), timeout=timedelta(seconds=1))
    if R == 0:
        start = time.monotonic()
        raises(lambda: dist.barrier(late), RuntimeError, " Timed out ", "barrier() again")
        assert 1.0 <= time.monotonic() - start < 10, time.monotonic() - start
    dist.barrier()
    dist.barrier(late)
    t = torch.full((2,), float(R))
    dist.all_reduce(t, group=late)  # the group works on
    assert torch.all(t == P * (P - 1) / 2), t
    dist.destroy_process_group(late)
    # a collective that rank 0 alone calls raises there after the group's timeout, and the
    # group then runs no more calls (gloo's)
    alone = dist.new_group(list(range(P)), timeout=timedelta(seconds=1))
    dist.all_reduce(torch.ones(2), group=alone)
    if R == 0 and P > 1:
        start = time.monotonic()
        raises(lambda: dist.all_reduce(torch.ones(2), group=alone), RuntimeError,
               "Timed out after 1 s", "create a new one")
        assert 1.0 <= time.monotonic() - start < 10, time.monotonic() - start
        raises(lambda: dist.broadcast(torch.ones(2), 0, group=alone), RuntimeError,
               "Timed out")
    dist.barrier()
    # a group that rank 1 does not create: its other members raise within the timeout
    if R != 1:
        try:
            dist.new_group([0, 1], timeout=timedelta(seconds=3))
        except RuntimeError as exc:
            assert R == 0 and "ranks [1] did not create this group" in str(exc), exc
        else:
            assert R != 0, "a group without rank 1 was created"
    dist.barrier()
    # "cpu:mlcomm,cuda:nccl": torch makes the whole group mlcomm's, which says so
    dist.destroy_process_group()
    dist.init_process_group("cpu:mlcomm,cuda:nccl")
    t = torch.ones(2)
    dist.all_reduce(t)
    assert torch.all(t == P), t
    raises(lambda: dist.all_reduce(torch.empty(3, device="meta")), TypeError,
           "'cpu:mlcomm,cuda:nccl'", "the whole group", "new_group(backend='nccl')")


PARTS = {"collectives": collectives, "ddp": ddp, "groups": groups, "errors": errors,
         "exchanges": exchanges}


def main():
    torch.set_num_threads(1)
    dist.init_process_group("mlcomm")
    assert (dist.get_rank(), dist.get_world_size(), dist.get_backend()) == (R, P, "mlcomm")
    for part in sys.argv[1:]:
        PARTS[part]()
        MPI.COMM_WORLD.Barrier()
        if R == 0:
            print(f"OK {part}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    abort_on_error(main)
