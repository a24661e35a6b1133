"""mlcomm's all-reduce on PyTorch tensors against ``torch.distributed`` with gloo, in one job.

    mpiexec -n 2 python bench/torch_gloo.py
    mpiexec -n 4 python bench/torch_gloo.py --sizes 8,64K,1M,16M --rounds 15

Every rank joins a gloo process group (``env://``: MASTER_ADDR=127.0.0.1 and a free port
that rank 0 picks, RANK and WORLD_SIZE from MPI) beside mlcomm's communicator. Per size,
one float32 CPU tensor per contestant is summed in place over and over:

- ``mlcomm``: ``mlcomm.allreduce(mlcomm.IN_PLACE, tensor)`` (``auto``'s choice, or
  ``--algorithm``);
- ``handle``: the same all-reduce through a persistent handle
  (``mlcomm.allreduce_init``, as :class:`mlcomm.torch.DistributedDataParallel` uses);
- ``gloo``: ``torch.distributed.all_reduce(tensor)``;
- ``mpi``: ``MPI_Allreduce`` (mpi4py) on the tensor's memory, for reference.

Each is checked for the exact sum first. The calls are timed in interleaved rounds (the
harness's ``interleaved``: each round times every contestant after a barrier, in an order
rotated by one per round); a time is the median over rounds, averaged over ranks. Rank 0
prints the table and writes ``bench/results/torch_gloo_p{P}.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
TARGETS = {8: 0.1, 16 << 20: 0.5}   # mlcomm / gloo at most this


def _parser():
    from mlcomm.benchmark.cli import positive_int
    from mlcomm.benchmark.harness import parse_size

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-s", "--sizes", default="8,64K,1M,16M",
                   type=lambda text: [parse_size(s) for s in text.split(",") if s.strip()],
                   help="comma-separated sizes in bytes, multiples of 4 (default %(default)s)")
    p.add_argument("-a", "--algorithm", default=None, help="mlcomm algorithm (default auto)")
    p.add_argument("-r", "--rounds", type=positive_int, default=15, help="interleaved rounds")
    p.add_argument("--output", type=Path, default=None,
                   help="JSON file (default bench/results/torch_gloo_p{P}.json)")
    return p


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_gloo(comm):
    """Join a gloo process group of the ranks of ``comm`` (env:// on 127.0.0.1)."""
    import torch.distributed as dist

    port = comm.bcast(_free_port() if comm.rank == 0 else None, root=0)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      RANK=str(comm.rank), WORLD_SIZE=str(comm.size))
    dist.init_process_group("gloo", init_method="env://")
    return dist


def _per_round(nbytes: int) -> int:
    return max(4, min(400, (32 << 20) // max(nbytes, 1)))


def measure(comm, args) -> dict | None:
    """Time every contestant at every size; return rank 0's record (None elsewhere)."""
    import numpy as np
    import torch
    from mpi4py import MPI

    import mlcomm
    from mlcomm.benchmark.harness import interleaved

    dist = init_gloo(comm)
    p = comm.size
    rows = []
    for nbytes in args.sizes:
        if nbytes < 4 or nbytes % 4:
            raise ValueError(f"--sizes: {nbytes} is not a positive multiple of 4 (float32)")
        n = nbytes // 4
        t_ml, t_h, t_gloo, t_mpi = (torch.full((n,), float(comm.rank + 1)) for _ in range(4))
        view = t_mpi.numpy()
        calls = {
            "mlcomm": lambda: mlcomm.allreduce(mlcomm.IN_PLACE, t_ml, algorithm=args.algorithm),
            "handle": mlcomm.allreduce_init(mlcomm.IN_PLACE, t_h, algorithm=args.algorithm),
            "gloo": lambda: dist.all_reduce(t_gloo),
            "mpi": lambda: comm.Allreduce(MPI.IN_PLACE, view, MPI.SUM),
        }
        for name, call in calls.items():  # the exact sum first
            call()
        for name, t in (("mlcomm", t_ml), ("handle", t_h), ("gloo", t_gloo), ("mpi", t_mpi)):
            if not torch.all(t == p * (p + 1) / 2):
                raise RuntimeError(f"{name} gave a wrong sum at {nbytes} bytes")
            t.zero_()  # zeros stay zeros: no overflow over many calls
        medians = interleaved(calls, args.rounds, _per_round(nbytes), comm, lambda: None)
        us = {k: comm.allreduce(v, op=MPI.SUM) / p * 1e6 for k, v in medians.items()}
        rows.append({"bytes": nbytes, "time_us": us, "mlcomm_over_gloo": us["mlcomm"] / us["gloo"],
                     "handle_over_gloo": us["handle"] / us["gloo"], "target": TARGETS.get(nbytes)})
    dist.destroy_process_group()
    if comm.rank:
        return None
    return {"ranks": p, "dtype": "float32", "op": "sum", "rounds": args.rounds,
            "algorithm": args.algorithm or "auto", "torch": torch.__version__,
            "mpi": MPI.Get_library_version().splitlines()[0].strip(),
            "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": "mpiexec -n %d python bench/torch_gloo.py %s" % (p, " ".join(sys.argv[1:])),
            "rows": rows}


def format_table(rec) -> str:
    from mlcomm.benchmark.harness import format_size

    lines = [f"# {rec['ranks']} ranks, float32 sum of a CPU tensor in place; µs per call "
             f"(median of {rec['rounds']} interleaved rounds, mean over ranks)",
             f"{'size':>6s} {'mlcomm':>9s} {'handle':>9s} {'gloo':>9s} {'MPI':>9s} "
             f"{'mlcomm/gloo':>12s} {'handle/gloo':>12s} {'target':>7s}"]
    for r in rec["rows"]:
        t = r["time_us"]
        target = f"<= {r['target']}" if r["target"] else ""
        lines.append(f"{format_size(r['bytes']):>6s} {t['mlcomm']:9.1f} {t['handle']:9.1f} "
                     f"{t['gloo']:9.1f} {t['mpi']:9.1f} {r['mlcomm_over_gloo']:12.3f} "
                     f"{r['handle_over_gloo']:12.3f} {target:>7s}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from mpi4py import MPI

    from mlcomm.cli import parse_args

    comm = MPI.COMM_WORLD
    args = parse_args(_parser(), argv)
    rec = measure(comm, args)
    if comm.rank == 0:
        args.output = args.output or HERE / "results" / f"torch_gloo_p{comm.size}.json"
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(rec, indent=1) + "\n")
        print(format_table(rec), end="")
    return 0


if __name__ == "__main__":
    from mlcomm.cli import abort_on_error
    sys.exit(abort_on_error(main))
