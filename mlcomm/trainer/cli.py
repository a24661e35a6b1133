"""``mlcomm train``: data-parallel SGD as an MPI job."""

from __future__ import annotations

import argparse
import sys

from ..cli.args import add_progress, show_progress

__all__ = ["register", "add_arguments", "config_from_args"]


def _hidden(text):
    try:
        sizes = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected WIDTH[,WIDTH], got {text!r}") from None
    if not 1 <= len(sizes) <= 2 or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected one or two positive widths, got {text!r}")
    return sizes


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add every trainer option to ``p``."""
    from .train import TrainConfig
    d = TrainConfig()
    g = p.add_argument_group("data and model")
    g.add_argument("--framework", default=d.framework, choices=("numpy", "torch"),
                   help="numpy: hand-written backprop, every --sync mode; torch: PyTorch's "
                        "DistributedDataParallel (bsp) (default %(default)s)")
    g.add_argument("--backend", default=d.backend, choices=("mlcomm", "gloo"),
                   help="--framework torch: the torch.distributed backend (default "
                        "%(default)s; gloo to compare)")
    g.add_argument("--data", default=d.data, help="digits (scikit-learn, offline) or synthetic")
    g.add_argument("--model", default=d.model,
                   help="softmax, mlp (= mlp1), mlp1 or mlp2; cnn with --framework torch "
                        "(default %(default)s)")
    g.add_argument("--hidden", type=_hidden, default=d.hidden, metavar="W[,W]",
                   help="hidden layer widths (default 128)")
    g.add_argument("--params", type=lambda s: int(float(s)), default=None, metavar="N",
                   help="synthetic data: size the model to about N parameters (up to ~1e7)")
    g.add_argument("--features", type=int, default=d.features, help="synthetic input features")
    g.add_argument("-d", "--dtype", default=d.dtype, help="float32 or float64")
    g.add_argument("--seed", type=int, default=d.seed)
    g = p.add_argument_group("optimiser")
    g.add_argument("--steps", type=int, default=d.steps,
                   help="global steps; async: updates the servers apply (default %(default)s)")
    g.add_argument("--batch-size", type=int, default=d.batch_size, help="per worker")
    g.add_argument("--lr", type=float, default=d.lr, help="learning rate for --base-batch")
    g.add_argument("--base-batch", type=int, default=d.base_batch,
                   help="global batch that --lr is tuned for (linear scaling rule)")
    g.add_argument("--lr-scaling", default=d.lr_scaling, choices=("linear", "none"))
    g.add_argument("--lr-warmup", dest="warmup", type=int, default=d.warmup, metavar="STEPS",
                   help="learning-rate warm-up steps (default %(default)s)")
    g.add_argument("--momentum", type=float, default=d.momentum)
    g.add_argument("--weight-decay", type=float, default=d.weight_decay)
    g = p.add_argument_group("gradient exchange")
    g.add_argument("--sync", default=d.sync, help="bsp, ssp, async or backup (default bsp)")
    g.add_argument("--algorithm", default=d.algorithm,
                   help="mlcomm all-reduce algorithm for bsp (torch: the mlcomm backend's)")
    g.add_argument("--bucket-mb", type=float, default=d.bucket_mb,
                   help="gradient fusion threshold in MiB (0: one all-reduce per tensor); "
                        "torch: DDP's bucket_cap_mb")
    g.add_argument("--staleness", type=int, default=d.staleness, help="ssp bound s (0 = BSP)")
    g.add_argument("--backup-workers", type=int, default=d.backup_workers, metavar="B",
                   help="use the first P-B gradients of each step")
    g.add_argument("--servers", type=int, default=d.servers, metavar="K",
                   help="async: parameter-server ranks (the rest are workers)")
    g.add_argument("--compress", default=d.compress,
                   help="none, fp16, topk:RATIO (error feedback) or qsgd:LEVELS")
    g.add_argument("--straggler", default=None, metavar="RANK:MS|random[:MS]",
                   help="slow RANK by MS ms every step, or one random rank per step")
    g = p.add_argument_group("output and checkpoints")
    g.add_argument("--metrics", default=None, metavar="FILE", help="per-step metrics (.csv or .json)")
    g.add_argument("--timeline", default=None, metavar="FILE.json",
                   help="every rank's compute and communication spans as a Chrome trace "
                        "(chrome://tracing, Perfetto), written by rank 0")
    g.add_argument("--eval-every", type=int, default=d.eval_every, metavar="N")
    g.add_argument("--checkpoint", default=None, metavar="PATH", help="checkpoint file (.npz)")
    g.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every, metavar="N",
                   help="also checkpoint every N steps (async: N updates); "
                        "always at exit and on SIGTERM")
    g.add_argument("--elastic", action="store_true",
                   help="after a lost rank, go on on the survivors from the last checkpoint "
                        "(an MPI with fault tolerance: Open MPI's mpiexec --with-ft ulfm; "
                        "checkpoints every step unless --checkpoint-every says otherwise)")
    g.add_argument("--resume", action="store_true",
                   help="continue from --checkpoint if it exists (on another P it says what "
                        "changes)")
    add_progress(g)


def config_from_args(args):
    """Build a TrainConfig from parsed arguments."""
    import dataclasses
    from .train import TrainConfig
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    values = {k: v for k, v in vars(args).items() if k in names}
    values["progress"] = show_progress(args)
    return TrainConfig(**values)


def _checker(parser):
    """The parser's ``validate``: every option against the job's size, as ``train`` checks them."""
    def check(args):
        from mpi4py import MPI
        from .train import validate
        try:
            validate(config_from_args(args), MPI.COMM_WORLD.Get_size())
        except ValueError as exc:
            parser.error(str(exc))
    return check


def _run(args) -> int:
    from mpi4py import MPI
    from .checkpoint import CheckpointError
    from .train import train
    try:
        result = train(config_from_args(args))
    except CheckpointError as exc:  # raised alike on every rank: print once, all exit
        if MPI.COMM_WORLD.Get_rank() == 0:
            print(f"mlcomm train: error: {exc}", file=sys.stderr)
        return 2
    if MPI.COMM_WORLD.Get_rank() == 0:
        state = "stopped by SIGTERM at" if result.stopped else "finished"
        print(f"{state} step {result.step}: test accuracy {result.test_accuracy:.4f}, "
              f"job wall {result.wall_s:.2f} s, rank 0 moved {result.bytes_sent} bytes ("
              + ", ".join(f"{path.replace('_', ' ')} {n}"
                          for path, n in result.bytes_moved.items()) + ")"
              + (f", checkpoint {result.config.checkpoint}" if result.config.checkpoint else ""))
    return 0


def register(subparsers) -> None:
    """Add the ``train`` command."""
    p = subparsers.add_parser(
        "train", help="data-parallel SGD on digits or a synthetic problem",
        description="Data-parallel SGD (BSP all-reduce, SSP, backup workers or an asynchronous "
                    "parameter server) with optional gradient compression. "
                    "Run as: mpiexec -n P mlcomm train [options]")
    add_arguments(p)
    p.set_defaults(func=_run, validate=_checker(p))
