"""Does a non-blocking all-reduce progress while the caller computes? mlcomm against MPI.

    mpiexec -n 2 python bench/overlap.py                    # both parts
    mpiexec -n 4 python bench/overlap.py --part allreduce --sizes 64K,1M,16M
    mpiexec -n 2 python bench/overlap.py --part ddp --hidden 2048 --batch 16

Part ``allreduce``: per size, a float32 sum timed three ways for each contestant: the
all-reduce alone (start, then wait at once), the compute alone, and both (start, compute,
wait). The compute is single-threaded matrix products (64x64, float64), as many as take
about as long as rank 0's mlcomm all-reduce alone. Contestants:

- ``mlcomm iallreduce``: ``mlcomm.iallreduce`` then ``wait()``: mlcomm's progress thread
  runs the compiled loop without the GIL while the caller computes;
- ``mlcomm start()``: the same through a persistent handle (``allreduce_init``);
- ``MPI_Iallreduce``: mpi4py's ``comm.Iallreduce`` then ``Wait()``; MPI progresses only
  inside MPI calls;
- ``MPI_Iallreduce + MPI_Test``: the same with an ``MPI_Test`` after every product.

Overlap efficiency is ``(compute + all-reduce - both) / min(compute, all-reduce)``: 1 when
the shorter is hidden entirely, 0 when the two run one after the other.

Part ``ddp``: one training step (zero_grad, forward, backward, optimizer step) of an MLP
(``--hidden`` wide, three hidden layers, synthetic data, ``--batch`` samples per rank)
three ways: without communication; with PyTorch's ``DistributedDataParallel`` on the
``mlcomm`` backend (each bucket's all-reduce starts on mlcomm's progress thread as soon as
backward has produced it); and with every gradient accumulated into one flat buffer and
all-reduced (``dist.all_reduce``, op AVG) after backward.

Every call is timed in the harness's interleaved rounds; a time is the median over rounds,
averaged over ranks. Rank 0 prints the tables and writes ``bench/results/overlap_p{P}.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # single-threaded compute: the cores are the ranks'

HERE = Path(__file__).resolve().parent
CONTESTANTS = ("mlcomm iallreduce", "mlcomm start()", "MPI_Iallreduce",
               "MPI_Iallreduce + MPI_Test")


def _parser():
    from mlcomm.benchmark.cli import positive_int
    from mlcomm.units import parse_size

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--part", choices=("allreduce", "ddp", "both"), default="both")
    p.add_argument("-s", "--sizes", default="64K,1M,16M",
                   type=lambda text: [parse_size(s) for s in text.split(",") if s.strip()],
                   help="all-reduce sizes in bytes, multiples of 4 (default %(default)s)")
    p.add_argument("-r", "--rounds", type=positive_int, default=11, help="interleaved rounds")
    p.add_argument("--hidden", type=positive_int, default=2048, help="ddp: MLP width")
    p.add_argument("--batch", type=positive_int, default=16, help="ddp: samples per rank")
    p.add_argument("--bucket-mb", type=float, default=25.0, help="ddp: bucket_cap_mb")
    p.add_argument("--output", type=Path, default=None,
                   help="JSON file (default bench/results/overlap_p{P}.json)")
    return p


def _median_time(call, n, comm):
    import time

    import numpy as np
    samples = []
    for _ in range(n):
        comm.Barrier()
        t0 = time.perf_counter()
        call()
        samples.append(time.perf_counter() - t0)
    return float(np.median(samples))


class _MPIRequest:
    """An MPI request with the ``wait()``/``test()`` of mlcomm's."""

    __slots__ = ("request",)

    def __init__(self, request):
        self.request = request

    def wait(self):
        self.request.Wait()

    def test(self):
        return self.request.Test()


def allreduce_part(comm, sizes, rounds) -> list:
    """Alone, compute, both for every contestant at every size; rank 0's rows."""
    import numpy as np
    from mpi4py import MPI

    import mlcomm
    from mlcomm.benchmark.harness import interleaved

    rng = np.random.default_rng(comm.rank)
    a, b, c = rng.random((64, 64)), rng.random((64, 64)), np.empty((64, 64))
    product = lambda: np.matmul(a, b, out=c)
    for _ in range(50):
        product()
    t_product = _median_time(product, 51, comm)
    rows = []
    for nbytes in sizes:
        if nbytes < 4 or nbytes % 4:
            raise ValueError(f"--sizes: {nbytes} is not a positive multiple of 4 (float32)")
        n = nbytes // 4
        x = np.full(n, comm.rank + 1, np.float32)
        ys = {name: np.zeros(n, np.float32) for name in CONTESTANTS}
        handle = mlcomm.allreduce_init(x, ys["mlcomm start()"], comm=comm)

        def start(name):
            """Start ``name``'s all-reduce; return its request (``wait()``, ``test()``)."""
            y = ys[name]
            if name == "mlcomm iallreduce":
                return mlcomm.iallreduce(x, y, comm=comm)
            if name == "mlcomm start()":
                return handle.start()
            return _MPIRequest(comm.Iallreduce(x, y, MPI.SUM))

        def both(name, chunks):
            poll = name == "MPI_Iallreduce + MPI_Test"

            def run():
                request = start(name)
                for _ in range(chunks):
                    product()
                    if poll:
                        request.test()
                request.wait()
            return run

        for name in CONTESTANTS:  # the exact sum first; pages touched, plans bound
            start(name).wait()
            if not np.all(ys[name] == comm.size * (comm.size + 1) // 2):
                raise RuntimeError(f"{name} gave a wrong sum at {nbytes} bytes")
        alone = _median_time(lambda: start("mlcomm iallreduce").wait(), 11, comm)
        chunks = comm.bcast(max(1, round(alone / t_product)) if comm.rank == 0 else None)

        def compute():
            for _ in range(chunks):
                product()

        calls = {"compute": compute}
        for name in CONTESTANTS:
            calls[f"{name} alone"] = (lambda nm: lambda: start(nm).wait())(name)
            calls[f"{name} both"] = both(name, chunks)
        per_round = max(2, min(50, (8 << 20) // nbytes))
        medians = interleaved(calls, rounds, per_round, comm, lambda: None)
        us = {k: comm.allreduce(v, op=MPI.SUM) / comm.size * 1e6 for k, v in medians.items()}
        for name in CONTESTANTS:
            t_a, t_c, t_b = us[f"{name} alone"], us["compute"], us[f"{name} both"]
            rows.append({"bytes": nbytes, "contestant": name, "allreduce_us": t_a,
                         "compute_us": t_c, "both_us": t_b, "products": chunks,
                         "efficiency": (t_a + t_c - t_b) / min(t_a, t_c)})
    return rows


def ddp_part(comm, hidden, batch, bucket_mb, rounds) -> dict:
    """Step times without communication, with DDP during backward and all-reduced after."""
    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    import mlcomm.torch  # noqa: F401 - the backend
    from mlcomm.benchmark.harness import interleaved

    torch.set_num_threads(1)
    dist.init_process_group("mlcomm")
    g = torch.Generator().manual_seed(comm.rank)
    x = torch.randn(batch, 1024, generator=g)
    y = torch.randint(0, 10, (batch,), generator=g)
    loss_fn = torch.nn.CrossEntropyLoss()

    def model():
        torch.manual_seed(0)
        nn = torch.nn
        return nn.Sequential(nn.Linear(1024, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                             nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                             nn.Linear(hidden, 10))

    ddp = torch.nn.parallel.DistributedDataParallel(model(), bucket_cap_mb=bucket_mb)
    after = model()
    flat = torch.zeros(sum(p.numel() for p in after.parameters()))
    offset = 0
    for p in after.parameters():  # backward accumulates into views of one flat buffer
        p.grad = flat[offset:offset + p.numel()].view_as(p)
        offset += p.numel()
    variants = {"no communication": (model(), None),
                "DDP, all-reduce during backward": (ddp, None),
                "all-reduce after backward": (after, flat)}

    def step(net, opt, grads):
        def run():
            opt.zero_grad(set_to_none=False)
            loss_fn(net(x), y).backward()
            if grads is not None:
                dist.all_reduce(grads, dist.ReduceOp.AVG)
            opt.step()
        return run

    calls = {name: step(net, torch.optim.SGD(net.parameters(), lr=1e-6), grads)
             for name, (net, grads) in variants.items()}
    for call in calls.values():  # DDP settles its buckets after the first step
        call()
        call()
    medians = interleaved(calls, rounds, 3, comm, lambda: None)
    ms = {k: comm.allreduce(v, op=MPI.SUM) / comm.size * 1e3 for k, v in medians.items()}
    dist.destroy_process_group()
    return {"hidden": hidden, "batch": batch, "params": int(flat.numel()),
            "bucket_cap_mb": bucket_mb, "step_ms": ms}


def format_tables(rec) -> str:
    from mlcomm.units import format_size

    lines = []
    if rec.get("allreduce"):
        lines += [f"# {rec['ranks']} ranks: float32 sum alone, compute alone (64x64 float64 "
                  f"products), and both (start, compute, wait); µs, median of {rec['rounds']} "
                  f"interleaved rounds, mean over ranks",
                  f"{'size':>5s}  {'contestant':28s} {'all-reduce':>11s} {'compute':>9s} "
                  f"{'both':>9s} {'overlap':>8s}"]
        for r in rec["allreduce"]:
            lines.append(f"{format_size(r['bytes']):>5s}  {r['contestant']:28s} "
                         f"{r['allreduce_us']:11.1f} {r['compute_us']:9.1f} {r['both_us']:9.1f} "
                         f"{r['efficiency']:8.2f}")
    if rec.get("ddp"):
        d = rec["ddp"]
        base = d["step_ms"]["all-reduce after backward"]
        lines += ["", f"# {rec['ranks']} ranks: one training step of an MLP 1024-"
                      f"{d['hidden']}x3-10 ({d['params'] / 1e6:.1f} M float32 parameters, DDP "
                      f"buckets of <= {d['bucket_cap_mb']:g} MiB), {d['batch']} "
                      f"samples per rank; ms, median of {rec['rounds']} interleaved rounds",
                  f"{'':34s} {'ms':>8s} {'/ after':>8s}"]
        for name, value in d["step_ms"].items():
            lines.append(f"{name:34s} {value:8.2f} {value / base:8.2f}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from mpi4py import MPI

    from mlcomm.cli import parse_args

    args = parse_args(_parser(), argv)
    comm = MPI.COMM_WORLD
    rec = {"ranks": comm.size, "rounds": args.rounds,
           "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "mpi": MPI.Get_library_version().splitlines()[0].strip(),
           "command": "mpiexec -n %d python bench/overlap.py %s"
                      % (comm.size, " ".join(sys.argv[1:]))}
    if args.part in ("allreduce", "both"):
        rec["allreduce"] = allreduce_part(comm, args.sizes, args.rounds)
    if args.part in ("ddp", "both"):
        rec["ddp"] = ddp_part(comm, args.hidden, args.batch, args.bucket_mb, args.rounds)
    if comm.rank == 0:
        out = args.output or HERE / "results" / f"overlap_p{comm.size}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(rec, indent=1) + "\n")
        print(format_tables(rec), end="")
    return 0


if __name__ == "__main__":
    from mlcomm.cli import abort_on_error
    sys.exit(abort_on_error(main))
