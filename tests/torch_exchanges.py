"""The ``exchanges`` part of tests/torch_job.py: gather, scatter, all_to_all,
all_to_all_single (equal parts, split sizes, zero-size splits), all_gather into outputs of
different sizes and the object collectives on them, in several dtypes, blocking and with
``async_op=True``, against exact answers; then their errors, raised on every rank."""

import torch
import torch.distributed as dist
from mpi4py import MPI

R = MPI.COMM_WORLD.Get_rank()
P = MPI.COMM_WORLD.Get_size()
DTYPES = [torch.bool, torch.int8, torch.int64, torch.bfloat16, torch.float32,
          torch.complex64]


def data(sender, receiver, n, dtype, rows=1):
    """What rank ``sender`` sends rank ``receiver``: ``n`` rows of ``rows`` elements that
    name both (exact in every dtype)."""
    v = (torch.arange(n * rows, dtype=torch.float64) + 7 * sender + 3 * receiver) % 100
    v = (v % 2 == 1) if dtype is torch.bool else v.to(dtype)
    if dtype.is_complex:
        v = v + 1j * sender
    return v.reshape(n, rows) if rows > 1 else v


def size(sender, receiver):
    """The uneven sizes, zero among them: what ``sender`` sends ``receiver``."""
    return (sender + 2 * receiver) % 3


def finish(works):
    for work in works:
        if work is not None:
            assert work.wait() is True


def check(got, want, what, dtype):
    assert got.dtype == dtype and torch.equal(got, want), \
        f"rank {R}: {what} {dtype}: got {got}, want {want}"


def rooted(dtype, async_op):
    """gather and scatter from every root."""
    gathered = {root: [torch.empty(3, dtype=dtype) for _ in range(P)] for root in range(P)}
    scattered = {root: torch.empty(2, 2, dtype=dtype) for root in range(P)}
    works = []
    for root in range(P):
        works.append(dist.gather(data(R, root, 3, dtype), gathered[root] if R == root else None,
                                 dst=root, async_op=async_op))
        works.append(dist.scatter(
            scattered[root], [data(root, r, 2, dtype, 2) for r in range(P)] if R == root
            else None, src=root, async_op=async_op))
    finish(works)
    for r, got in enumerate(gathered[R]):
        check(got, data(r, R, 3, dtype), "gather", dtype)
    for root in range(P):
        check(scattered[root], data(root, R, 2, dtype, 2), "scatter", dtype)


def all_to_alls(dtype, async_op):
    """all_to_all at uneven sizes; all_to_all_single with split sizes (rows of 2), with the
    output's only, and in equal parts; all_gather into outputs of different sizes."""
    ins = [data(R, j, size(R, j), dtype) for j in range(P)]
    outs = [torch.full((size(j, R),), 1, dtype=dtype) for j in range(P)]
    split_out = torch.empty(sum(size(j, R) for j in range(P)), 2, dtype=dtype)
    split_in = torch.cat([data(R, j, size(R, j), dtype, 2) for j in range(P)])
    half_out = torch.empty(2 * P, 3, dtype=dtype)
    half_in = torch.cat([data(R, j, 2, dtype, 3) for j in range(P)])
    equal_out = torch.empty(4 * P, dtype=dtype)
    equal_in = torch.cat([data(R, j, 4, dtype) for j in range(P)])
    uneven = [torch.empty(size(r, 0), dtype=dtype) for r in range(P)]
    finish([
        dist.all_to_all(outs, ins, async_op=async_op),
        dist.all_to_all_single(split_out, split_in, [size(j, R) for j in range(P)],
                               [size(R, j) for j in range(P)], async_op=async_op),
        dist.all_to_all_single(half_out, half_in, output_split_sizes=[2] * P,
                               async_op=async_op),
        dist.all_to_all_single(equal_out, equal_in, async_op=async_op),
        dist.all_gather(uneven, data(R, 0, size(R, 0), dtype), async_op=async_op),
    ])
    for j, got in enumerate(outs):
        check(got, data(j, R, size(j, R), dtype), "all_to_all", dtype)
    check(split_out, torch.cat([data(j, R, size(j, R), dtype, 2) for j in range(P)]),
          "all_to_all_single split", dtype)
    check(half_out, torch.cat([data(j, R, 2, dtype, 3) for j in range(P)]),
          "all_to_all_single output splits", dtype)
    check(equal_out, torch.cat([data(j, R, 4, dtype) for j in range(P)]),
          "all_to_all_single", dtype)
    for r, got in enumerate(uneven):
        check(got, data(r, 0, size(r, 0), dtype), "all_gather uneven", dtype)


def objects():
    """The object collectives: pickles of different sizes on every rank."""
    mine = {"rank": R, "payload": list(range(5 * R))}
    everyone = [None] * P
    dist.all_gather_object(everyone, mine)
    assert everyone == [{"rank": r, "payload": list(range(5 * r))} for r in range(P)], everyone
    for root in range(P):
        got = [None] * P if R == root else None
        dist.gather_object(("from", R, "x" * R), got, dst=root)
        assert got is None or got == [("from", r, "x" * r) for r in range(P)], got
        out = [None]
        dist.scatter_object_list(out, [{"to": r, "n": [root] * r} for r in range(P)]
                                 if R == root else None, src=root)
        assert out == [{"to": R, "n": [root] * R}], out


def raises(call, kind, *words):
    try:
        call()
    except kind as exc:
        assert all(w in str(exc) for w in words), f"rank {R}: {exc!r} lacks {words}"
        return
    raise AssertionError(f"rank {R}: no {kind.__name__} from {call}")


def errors():
    """Split sizes that differ from what the peers send, blocking and started (a call seen
    before: checked on the progress thread), raise ValueError on every rank; a problem on
    one rank raises there and a RuntimeError naming it on the others."""
    if P > 1:
        for async_op in (False, True):
            out = torch.empty(P + (R == 0))
            wrong = [1] * P if R else [2] + [1] * (P - 1)  # rank 0 expects 2 from itself
            raises(lambda: finish([dist.all_to_all_single(
                out, torch.ones(P), wrong, [1] * P, async_op=async_op)]), ValueError,
                "differ from what the peers send", "rank 0 has recvcounts [2")
            raises(lambda: finish([dist.all_to_all(
                [torch.empty(1 + (R == 0 and j == P - 1)) for j in range(P)],
                [torch.ones(1) for _ in range(P)], async_op=async_op)]), ValueError,
                "differ from what the peers send")
        raises(lambda: dist.all_to_all_single(torch.empty(P + 1), torch.ones(P + 1)),
               ValueError, "a multiple of the")
    lists = [torch.empty(3) for _ in range(P + (R == 0))]
    raises(lambda: dist.gather(torch.ones(3), lists if R == 0 else None, dst=0),
           ValueError if R == 0 else RuntimeError, "one per rank")
    raises(lambda: dist.all_to_all_single(torch.empty(P), torch.ones(P), [1] * P, [2] * P),
           ValueError, "input_split_sizes must be")
    raises(lambda: dist.monitored_barrier(), ValueError, "GLOO")  # torch's own front
    outs = [torch.empty(1) for _ in range(P)]
    dist.all_to_all(outs, [torch.full((1,), float(R)) for _ in range(P)])  # works on
    assert [o.item() for o in outs] == list(range(P)), outs


def exchanges():
    for dtype in DTYPES:
        for async_op in (False, True):
            rooted(dtype, async_op)
            all_to_alls(dtype, async_op)
    all_to_alls(torch.float32, True)  # seen before: compared on the progress thread
    objects()
    errors()
