"""torch.distributed on the mlcomm backend against gloo: one script, only the backend name
changes.

    mpiexec -n 2 python bench/torch_gloo.py --backend mlcomm     # one job, one backend
    python bench/torch_gloo.py --compare -n 2 --runs 3           # alternated jobs, the table

A job (``--backend mlcomm`` or ``gloo``) imports ``mlcomm.torch`` (so that gloo too finds
its peers from MPI, without ``MASTER_ADDR``), calls ``init_process_group(BACKEND)`` and
times, in the harness's interleaved rounds (each round times every contestant after a
barrier, in a shuffled order), with one torch thread per rank:

- ``dist.all_reduce`` of a float32 CPU tensor of each ``--sizes`` (sum, in place), and of a
  bfloat16 tensor of as many elements (half the bytes), each checked for the exact sum
  first;
- a DDP training step of the trainer's CNN (``mlcomm train --framework torch --model cnn``:
  72 k float32 parameters in one bucket; zero_grad, forward, backward, SGD step on 32
  random 8x8 images per rank) with PyTorch's ``DistributedDataParallel``, configured as the
  trainer configures it (``gradient_as_bucket_view=True, static_graph=True``), and the same
  step of the model alone, without DDP: the floor that no backend goes below.

A time is the median over rounds, averaged over ranks. Rank 0 writes the record (``--output``,
default ``bench/results/torch_backend_{BACKEND}_p{P}.json``) and prints it.

``--compare`` (run without mpiexec) starts ``--runs`` jobs of each backend at ``-n`` ranks,
alternating mlcomm, gloo, mlcomm, ..., and prints each row's mlcomm/gloo ratio per run pair,
with their median and range; it writes ``bench/results/torch_gloo_p{P}.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
BACKENDS = ("mlcomm", "gloo")
#: the issue's targets: mlcomm's time / gloo's at most this
TARGETS = {"all_reduce float32 8": 0.05, "all_reduce float32 16M": 0.4, "DDP step (CNN)": 0.7}


def _parser():
    from mlcomm.benchmark.cli import positive_int
    from mlcomm.units import parse_size

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=BACKENDS, help="one job: the backend to time")
    p.add_argument("--compare", action="store_true",
                   help="start alternated jobs of both backends and print the ratios")
    p.add_argument("-n", "--ranks", type=positive_int, default=2, help="--compare: job size")
    p.add_argument("--runs", type=positive_int, default=3, help="--compare: jobs per backend")
    p.add_argument("-s", "--sizes", default="8,16M",
                   type=lambda text: [parse_size(s) for s in text.split(",") if s.strip()],
                   help="float32 all_reduce sizes in bytes, multiples of 4 (default %(default)s)")
    p.add_argument("-r", "--rounds", type=positive_int, default=15, help="interleaved rounds")
    p.add_argument("--output", type=Path, default=None, help="the JSON record")
    return p


def _per_round(nbytes: int) -> int:
    return max(4, min(400, (32 << 20) // max(nbytes, 1)))


def measure(args) -> dict | None:
    """Time the backend's all_reduce and DDP step; rank 0's record (None elsewhere)."""
    import torch
    import torch.distributed as dist
    from mpi4py import MPI

    import mlcomm.torch  # noqa: F401 - the backend, and gloo's peers from MPI
    from mlcomm.benchmark.harness import interleaved
    from mlcomm.units import format_size
    from mlcomm.trainer.torch_bsp import TorchModel

    comm = MPI.COMM_WORLD
    torch.set_num_threads(1)
    dist.init_process_group(args.backend)
    p, rank = dist.get_world_size(), dist.get_rank()
    calls, tensors = {}, []
    for nbytes in args.sizes:
        if nbytes < 4 or nbytes % 4:
            raise ValueError(f"--sizes: {nbytes} is not a positive multiple of 4 (float32)")
        for dtype in (torch.float32, torch.bfloat16):
            t = torch.full((nbytes // 4,), float(rank + 1), dtype=dtype)
            dist.all_reduce(t)  # the exact sum first, then zeros: no overflow over many calls
            if not torch.all(t == p * (p + 1) / 2):
                raise RuntimeError(f"{args.backend}: wrong {dtype} sum at {nbytes} bytes")
            t.zero_()
            name = f"all_reduce {str(dtype).split('.')[1]} {format_size(nbytes)}"
            calls[name] = (lambda x: lambda: dist.all_reduce(x))(t)
            tensors.append((name, nbytes))
    model = TorchModel("cnn", 64, 10, dtype="float32", seed=0).module
    ddp = torch.nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True,
                                                    static_graph=True)  # as the trainer
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)
    loss_fn = torch.nn.CrossEntropyLoss()

    alone = TorchModel("cnn", 64, 10, dtype="float32", seed=0).module
    alone_opt = torch.optim.SGD(alone.parameters(), lr=0.01, momentum=0.9)

    def step(net, opt):
        def run():
            opt.zero_grad(set_to_none=False)
            loss_fn(net(x), y).backward()
            opt.step()
        for _ in range(3):  # DDP rebuilds its buckets after the first step
            run()
        return run
    calls["DDP step (CNN)"] = step(ddp, opt)
    calls["step without DDP (CNN)"] = step(alone, alone_opt)  # the floor: no communication
    per_round = {name: _per_round(nbytes) for name, nbytes in tensors}
    per_round.update(dict.fromkeys(["DDP step (CNN)", "step without DDP (CNN)"], 10))
    medians = {}
    for group in sorted(set(per_round.values())):  # calls of one count per round together
        names = [n for n in calls if per_round[n] == group]
        medians.update(interleaved({n: calls[n] for n in names}, args.rounds, group, comm,
                                   lambda: None))
    us = {k: comm.allreduce(medians[k], op=MPI.SUM) / p * 1e6 for k in calls}
    dist.destroy_process_group()
    if rank:
        return None
    return {"backend": args.backend, "ranks": p, "rounds": args.rounds, "time_us": us,
            "params": sum(q.numel() for q in model.parameters()),
            "torch": torch.__version__, "mpi": MPI.Get_library_version().splitlines()[0].strip(),
            "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": "mpiexec -n %d python bench/torch_gloo.py %s"
                       % (p, " ".join(sys.argv[1:]))}


def compare(args) -> dict:
    """Start the alternated jobs; return the record of every run and the ratios."""
    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or "mpiexec"
    runs = {b: [] for b in BACKENDS}
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.runs):
            for backend in BACKENDS:
                out = Path(tmp) / f"{backend}{k}.json"
                cmd = [mpiexec, "-n", str(args.ranks), sys.executable, __file__, "--backend",
                       backend, "--rounds", str(args.rounds), "--sizes",
                       ",".join(map(str, args.sizes)), "--output", str(out)]
                subprocess.run(cmd, check=True, env=dict(os.environ, OMP_NUM_THREADS="1"),
                               stdout=subprocess.DEVNULL)
                runs[backend].append(json.loads(out.read_text()))
    rows = []
    for name in runs["mlcomm"][0]["time_us"]:
        ml = [r["time_us"][name] for r in runs["mlcomm"]]
        gl = [r["time_us"][name] for r in runs["gloo"]]
        ratios = sorted(a / b for a, b in zip(ml, gl))
        rows.append({"name": name, "mlcomm_us": ml, "gloo_us": gl, "ratios": ratios,
                     "ratio_median": ratios[len(ratios) // 2], "target": TARGETS.get(name)})
    return {"ranks": args.ranks, "runs": args.runs, "rounds": args.rounds, "rows": rows,
            "when": runs["mlcomm"][0]["when"], "torch": runs["mlcomm"][0]["torch"],
            "mpi": runs["mlcomm"][0]["mpi"],
            "command": f"python bench/torch_gloo.py --compare -n {args.ranks} --runs "
                       f"{args.runs} --rounds {args.rounds}"}


def format_table(rec) -> str:
    lines = [f"# P = {rec['ranks']}: µs per call (median of {rec['rounds']} interleaved rounds, "
             f"mean over ranks), {rec['runs']} jobs per backend, alternated",
             f"{'':24s} {'mlcomm':>18s} {'gloo':>20s} {'mlcomm/gloo':>20s} {'target':>7s}"]
    for r in rec["rows"]:
        span = lambda v: f"{min(v):.1f}-{max(v):.1f}"
        ratio = f"{r['ratio_median']:.3f} ({min(r['ratios']):.3f}-{max(r['ratios']):.3f})"
        target = f"<= {r['target']}" if r["target"] else ""
        lines.append(f"{r['name']:24s} {span(r['mlcomm_us']):>18s} {span(r['gloo_us']):>20s} "
                     f"{ratio:>20s} {target:>7s}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.compare:
        rec = compare(args)
        out = args.output or HERE / "results" / f"torch_gloo_p{args.ranks}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(rec, indent=1) + "\n")
        print(format_table(rec), end="")
        return 0
    if args.backend is None:
        raise SystemExit("give --backend mlcomm|gloo (under mpiexec) or --compare")
    rec = measure(args)
    if rec is not None:
        out = args.output or HERE / "results" / f"torch_backend_{args.backend}_p{rec['ranks']}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(rec, indent=1) + "\n")
        print(json.dumps(rec["time_us"], indent=1))
    return 0


if __name__ == "__main__":
    from mlcomm.cli import abort_on_error
    sys.exit(abort_on_error(main))
