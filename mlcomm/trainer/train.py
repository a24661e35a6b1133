"""``train(...)``: the data-parallel SGD training loop shared by every mode."""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from ..algorithms import resolve
from ..transport import PATHS
from . import resume
from .compress import get_compressor
from .data import batch_indices, load, shard
from .metrics import write_metrics
from .models import build_model, hidden_for_params
from .optim import SGD, scaled_lr
from .ps import AsyncPS
from .sync import BSP, SSP, Backup
from .timeline import TrainTimeline
from .wire import Wire

__all__ = ["TrainConfig", "TrainResult", "train", "validate"]

MODES = {"bsp": BSP, "ssp": SSP, "async": AsyncPS, "backup": Backup}
SYNC_MODES = tuple(MODES)
FRAMEWORKS = ("numpy", "torch")
BACKENDS = ("mlcomm", "gloo")          # torch.distributed backends of --framework torch
NUMPY_MODELS = ("softmax", "mlp", "mlp1", "mlp2")


@dataclass
class TrainConfig:
    """Every option of ``mlcomm train`` (see ``mlcomm train --help``)."""

    framework: str = "numpy"
    backend: str = "mlcomm"            # --framework torch: the torch.distributed backend
    data: str = "digits"
    model: str = "mlp1"
    hidden: tuple = (128,)
    params: int | None = None          # synthetic only: about this many parameters
    features: int = 64                 # synthetic only: input features
    steps: int = 300
    batch_size: int = 32               # per worker
    lr: float = 0.05                   # for a global batch of base_batch
    base_batch: int = 32
    lr_scaling: str = "linear"
    warmup: int = 20
    momentum: float = 0.9
    weight_decay: float = 0.0
    dtype: str = "float32"
    seed: int = 0
    sync: str = "bsp"
    algorithm: str = "auto"
    bucket_mb: float = 64.0            # fusion threshold; 0 = one all-reduce per tensor
    staleness: int = 0
    backup_workers: int = 0
    servers: int = 1
    compress: str = "none"
    straggler: str | None = None
    metrics: str | None = None
    timeline: str | None = None        # Chrome-trace JSON of every rank's spans
    eval_every: int = 10
    checkpoint: str | None = None
    checkpoint_every: int = 0
    resume: bool = False
    elastic: bool = False              # go on on the survivors of a lost rank (ULFM)
    global_batch: int | None = None    # default batch_size x workers; --elastic keeps it
    progress: bool = True

    @property
    def bucket_bytes(self) -> int:
        return int(self.bucket_mb * 2**20)


@dataclass
class TrainResult:
    """What :func:`train` returns on every rank."""

    params: np.ndarray
    step: int                          # global steps done (async: updates the servers applied)
    test_accuracy: float
    metrics: list = field(default_factory=list)   # the logging rank's rows, on every rank
    stopped: bool = False              # stopped early by SIGTERM (a checkpoint was written)
    bytes_sent: int = 0                # moved between ranks by this rank, over the whole run
    bytes_moved: dict = field(default_factory=dict)  # the same by path (mlcomm.transport.PATHS)
    wall_s: float = 0.0                # the job's: the longest of every rank's
    computed: int = 0                  # gradients this rank computed
    config: TrainConfig | None = None


def _parse_straggler(spec, size):
    """Return (mode, ranks, ms): mode "fixed" or "random"."""
    if not spec:
        return None
    spec = spec.strip()
    try:
        if spec.startswith("random"):
            _, _, ms = spec.partition(":")
            ms = float(ms) if ms else 100.0
            if ms < 0:
                raise ValueError
            return ("random", None, ms)
        ranks = {}
        for part in spec.split(","):
            r, _, ms = part.partition(":")
            r, ms = int(r), float(ms)
            if not 0 <= r < size or ms < 0:
                raise ValueError
            ranks[r] = ms
        return ("fixed", ranks, None)
    except ValueError:
        raise ValueError(f"--straggler: bad value {spec!r} (use RANK:MS[,RANK:MS...] with "
                         f"0 <= RANK < {size}, or random[:MS])") from None


def validate(cfg: TrainConfig, size: int) -> TrainConfig:
    """Check every option against ``size`` ranks; raise ValueError naming the option.

    Runs before any communication, identically on every rank.
    """
    cfg = dataclasses.replace(cfg)
    if cfg.sync not in SYNC_MODES:
        raise ValueError(f"--sync: unknown mode {cfg.sync!r} (choose {', '.join(SYNC_MODES)})")
    if cfg.staleness < 0:
        raise ValueError(f"--staleness must be >= 0, got {cfg.staleness}")
    if cfg.staleness and cfg.sync != "ssp":
        raise ValueError(f"--staleness applies to --sync ssp, not --sync {cfg.sync}")
    if cfg.backup_workers < 0 or cfg.backup_workers >= size:
        raise ValueError(f"--backup-workers must be in [0, P-1] = [0, {size - 1}] "
                         f"for P = {size} ranks, got {cfg.backup_workers}")
    if cfg.backup_workers:
        if cfg.sync not in ("bsp", "backup"):
            raise ValueError(f"--backup-workers applies to --sync bsp, not --sync {cfg.sync}")
        cfg.sync = "backup"
    if cfg.sync == "async" and not 1 <= cfg.servers < size:
        raise ValueError(f"--servers K must satisfy 1 <= K < P = {size} (the other ranks are "
                         f"workers), got K = {cfg.servers}")
    get_compressor(cfg.compress)
    try:
        cfg.algorithm = resolve(cfg.algorithm)
    except ValueError as exc:
        raise ValueError(f"--algorithm: {exc}") from None
    _parse_straggler(cfg.straggler, size)
    for name in ("steps", "batch_size", "base_batch", "eval_every"):
        if getattr(cfg, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(cfg, name)}")
    for name in ("warmup", "checkpoint_every"):
        if getattr(cfg, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(cfg, name)}")
    if cfg.lr <= 0:
        raise ValueError(f"--lr must be > 0, got {cfg.lr}")
    if not 0 <= cfg.momentum < 1:
        raise ValueError(f"--momentum must be in [0, 1), got {cfg.momentum}")
    if cfg.bucket_mb < 0:
        raise ValueError(f"--bucket-mb must be >= 0, got {cfg.bucket_mb}")
    if cfg.dtype not in ("float32", "float64"):
        raise ValueError(f"--dtype: choose float32 or float64, not {cfg.dtype!r}")
    if cfg.resume and not cfg.checkpoint:
        raise ValueError("--resume needs --checkpoint PATH")
    if cfg.elastic and not cfg.checkpoint:
        raise ValueError("--elastic needs --checkpoint PATH (the survivors go on from it)")
    if cfg.elastic and (cfg.sync != "bsp" or cfg.framework != "numpy"):
        raise ValueError("--elastic runs --sync bsp --framework numpy; drop --elastic, or "
                         "use those")
    if cfg.data not in ("digits", "synthetic"):
        raise ValueError(f"--data: unknown data set {cfg.data!r} (choose digits or synthetic)")
    if cfg.params is not None and cfg.data != "synthetic":
        raise ValueError("--params applies to --data synthetic")
    if cfg.params is not None and not 10 < cfg.params <= 2 * 10**8:
        raise ValueError(f"--params must be in (10, 2e8], got {cfg.params}")
    if cfg.framework not in FRAMEWORKS:
        raise ValueError(f"--framework: choose numpy or torch, not {cfg.framework!r}")
    if cfg.framework == "torch":
        _validate_torch(cfg)
    elif cfg.backend != "mlcomm":
        raise ValueError("--backend applies to --framework torch")
    elif cfg.model not in NUMPY_MODELS:
        more = " (cnn needs --framework torch)" if cfg.model == "cnn" else ""
        raise ValueError(f"--model: unknown model {cfg.model!r} (choose softmax, mlp1 or "
                         f"mlp2){more}")
    return cfg


def _validate_torch(cfg):
    import importlib.util
    if importlib.util.find_spec("torch") is None:
        raise ValueError("--framework torch needs PyTorch: pip install 'mlcomm[torch]'")
    from .torch_bsp import MODELS
    if cfg.model not in MODELS:
        raise ValueError(f"--model: unknown model {cfg.model!r} for --framework torch "
                         f"(choose {', '.join(MODELS)})")
    if cfg.model == "cnn" and cfg.data != "digits":
        raise ValueError("--model cnn takes the 8x8 digits images: use --data digits")
    if cfg.sync != "bsp" or cfg.compress != "none":
        raise ValueError("--framework torch trains with DistributedDataParallel: "
                         "--sync bsp and --compress none only")
    if cfg.checkpoint:
        raise ValueError("--checkpoint applies to --framework numpy")
    if cfg.backend not in BACKENDS:
        raise ValueError(f"--backend: choose mlcomm or gloo, not {cfg.backend!r}")


class _Context:
    """Everything a mode needs: communicator, model, data, optimiser, compressor, timers."""

    def __init__(self, cfg: TrainConfig, comm):
        self.cfg, self.comm = cfg, comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.dtype = np.dtype(cfg.dtype)
        features, hidden = cfg.features, tuple(cfg.hidden)
        n_classes = 10
        if cfg.params is not None:
            layers = {"softmax": 0, "mlp": 1, "mlp1": 1, "mlp2": 2}[cfg.model]
            if layers == 0:
                features = max(1, cfg.params // n_classes - 1)
            else:
                h = hidden_for_params(cfg.params, features, n_classes, layers)
                hidden = (h, h)
        self.data = load(cfg.data, seed=cfg.seed, n_features=features, dtype=self.dtype)
        if cfg.framework == "torch":
            from .torch_bsp import TorchModel
            self.model = TorchModel(cfg.model, self.data.n_features, self.data.n_classes,
                                    hidden=hidden, dtype=cfg.dtype, seed=cfg.seed)
        else:
            self.model = build_model(cfg.model, self.data.n_features, self.data.n_classes,
                                     hidden=hidden, dtype=self.dtype)
        self.params = self.model.init(cfg.seed)
        self.opt = SGD(self.model.size, self.dtype, momentum=cfg.momentum,
                       weight_decay=cfg.weight_decay)
        self.compressor = get_compressor(cfg.compress, seed=cfg.seed * 100003 + self.rank)
        self.workers = self.size - cfg.servers if cfg.sync == "async" else self.size
        self.global_batch = cfg.global_batch or cfg.batch_size * self.workers
        self.straggler = _parse_straggler(cfg.straggler, self.size)
        self.wire = Wire(comm)
        self.timeline = TrainTimeline(self.rank) if cfg.timeline else None
        self.computed_span = None    # (start, end) of the last gradient computation
        self.checkpoint = None       # checkpoint(step): a collective checkpoint, set by train
        self._stop = threading.Event()

    def lr_at(self, step: int, global_batch: int | None = None) -> float:
        c = self.cfg
        return scaled_lr(step, lr=c.lr, global_batch=global_batch or self.global_batch,
                         base_batch=c.base_batch, warmup=c.warmup, scaling=c.lr_scaling)

    def shard_size(self, index: int) -> int:
        b = self.global_batch
        return int(round(b * (index + 1) / self.workers) - round(b * index / self.workers))

    def straggle(self, step: int) -> None:
        s = self.straggler
        if s is None:
            return
        if s[0] == "fixed":
            ms = s[1].get(self.rank, 0.0)
        else:
            chosen = int(np.random.default_rng([self.cfg.seed, 77, step]).integers(self.size))
            ms = s[2] if chosen == self.rank else 0.0
        if ms:
            time.sleep(ms / 1000.0)

    def compute(self, step, params, grad, index, parts, scale):
        """Gradient of this worker's share of global batch ``step``; return (loss sum, n, seconds)."""
        t0 = time.perf_counter()
        idx = shard(batch_indices(len(self.data.y_train), self.global_batch, step, self.cfg.seed),
                    index, parts)
        loss = self.model.loss_and_grad(params, self.data.x_train[idx], self.data.y_train[idx],
                                        grad, scale)
        self.straggle(step)
        t1 = time.perf_counter()
        self.computed_span = (t0, t1)
        if self.timeline is not None:
            self.timeline.add("gradient", t0, t1, "compute", step=step)
        return loss, len(idx), t1 - t0

    def stop_requested(self) -> bool:
        return self._stop.is_set()

    def rank_state(self) -> dict:
        return {f"comp_{k}": v for k, v in self.compressor.state().items()}

    def load_rank_state(self, arrays, rank) -> None:
        prefix = f"rank{rank}_comp_"
        state = {k[len(prefix):]: arrays[k] for k in arrays if k.startswith(prefix)}
        if state:
            self.compressor.load(state)

    def test_accuracy(self) -> float:
        return self.model.accuracy(self.params, self.data.x_test, self.data.y_test)


def train(config: TrainConfig | None = None, *, comm=None, **options) -> TrainResult:
    """Train on ``comm`` (default COMM_WORLD); every rank calls it and gets a TrainResult.

    Options are the fields of :class:`TrainConfig`.  Bad options raise ValueError
    on every rank before any communication; so does a ``--resume`` checkpoint
    that cannot be read or does not fit (CheckpointError, a ValueError).
    """
    cfg = dataclasses.replace(config or TrainConfig(), **options)
    base = MPI.COMM_WORLD if comm is None else comm
    cfg = validate(cfg, base.Get_size())
    comm = base.Dup()
    if cfg.elastic:
        return _elastic(cfg, comm)
    try:
        return _train(cfg, comm)
    finally:
        comm.Free()


def _elastic(cfg, comm):
    """:func:`_train` on ``comm``, checkpointing every ``--checkpoint-every`` steps (every
    step by default); after a lost rank (:class:`mlcomm.RankLost`, an MPI with fault
    tolerance) the survivors shrink ``comm`` and go on from the last checkpoint with the
    same global batch, re-sharded. Each loss is logged on the survivors' rank 0 and kept
    in the metrics' ``losses``: the lost ranks, the step the survivors went on from, the
    seconds from the exception to their first step."""
    from ..api import RankLost, shrink
    from ..transport.mpi.names import is_failure
    cfg = dataclasses.replace(cfg, checkpoint_every=cfg.checkpoint_every or 1)
    losses = []
    while True:
        try:
            result = _train(cfg, comm, losses)
            comm.Free()
            return result
        except (RankLost, MPI.Exception) as exc:
            if isinstance(exc, MPI.Exception) and not is_failure(exc.Get_error_code()):
                raise  # not a lost rank (a plain MPI call's on the revoked communicator is)
            began, old = time.monotonic(), comm
            comm = shrink(comm)
            kept = MPI.Group.Translate_ranks(comm.Get_group(), list(range(comm.Get_size())),
                                             old.Get_group())
            lost = sorted(set(range(old.Get_size())) - set(kept))
            losses.append({"ranks": lost, "collective": getattr(exc, "collective", str(exc)),
                           "began": began})
            cfg = dataclasses.replace(cfg, resume=True, global_batch=cfg.global_batch or
                                      cfg.batch_size * old.Get_size())


def _totals(rows):
    """The run's exchange totals from the rows."""
    updates = sum(r["updates"] for r in rows)
    stale = [(r["staleness_mean"], r["updates"]) for r in rows if r["updates"]
             and not math.isnan(r["staleness_mean"])]
    return {"updates": updates, "dropped": sum(r["dropped"] for r in rows),
            "staleness_mean": (sum(m * n for m, n in stale) / sum(n for _, n in stale))
            if stale else float("nan"),
            "staleness_max": max((r["staleness_max"] for r in rows), default=0)}


def _mode(ctx):
    if ctx.cfg.framework == "torch":
        from .torch_bsp import TorchBSP
        return TorchBSP(ctx)
    return MODES[ctx.cfg.sync](ctx)


def _exchange_spans(ctx, mode, start, end):
    """A NumPy mode's step: the time outside its gradient computation is exchange."""
    if ctx.timeline is None or getattr(mode, "records_timeline", False):
        return
    c0, c1 = ctx.computed_span if ctx.computed_span else (end, end)
    for a, b in ((start, min(c0, end)), (max(c1, start), end)):
        if b > a:
            ctx.timeline.add("exchange", a, b, "communication")
    ctx.computed_span = None


def _train(cfg, comm, losses=None):
    ctx = _Context(cfg, comm)
    mode = _mode(ctx)
    start = resume.load(ctx, mode) if cfg.resume else 0
    if losses and "from_step" not in losses[-1]:
        _recovered(losses[-1], start, ctx.rank, ctx.size)
    t = mode.resume_at(start)
    ctx.checkpoint = lambda step: resume.save(ctx, mode, step)

    previous = None
    if threading.current_thread() is threading.main_thread():
        def _on_term(signum, frame):
            if ctx._stop.is_set():  # a second SIGTERM: the job may be stuck, so die now
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)
            ctx._stop.set()
        previous = signal.signal(signal.SIGTERM, _on_term)
    logger = ctx.rank == mode.logger_rank
    rows, bar, acc, computed = [], None, float("nan"), 0
    if logger and cfg.progress:
        from tqdm import tqdm
        bar = tqdm(total=cfg.steps, initial=min(start, cfg.steps), desc=f"train {cfg.sync}",
                   unit="step", dynamic_ncols=True)
    comm.Barrier()
    ctx.wire.reset()
    if ctx.timeline is not None:
        ctx.timeline.restart(comm)
    t_start = time.perf_counter()
    try:
        if not mode.is_worker:
            mode.serve()
        else:
            while mode.more(t):
                t0 = time.perf_counter()
                info = mode.step(t)
                _exchange_spans(ctx, mode, t0, time.perf_counter())
                sent = ctx.wire.take()
                if not info.computed:
                    break
                computed += 1
                done = t
                t = info.next_step if info.next_step is not None else t + 1
                if logger:
                    dt = time.perf_counter() - t0
                    if t % cfg.eval_every == 0 or t >= cfg.steps or info.stop:
                        acc = ctx.test_accuracy()
                    rows.append({"step": done + 1, "wall_s": round(time.perf_counter() - t_start, 6),
                                 "loss": info.loss, "test_accuracy": acc,
                                 "samples_per_s": info.columns.get("samples", info.samples) / dt
                                 if dt > 0 else float("nan"),
                                 "compute_s": info.compute_s, "comm_s": info.comm_s,
                                 **sent, "lr": ctx.lr_at(done),
                                 "mode": _mode_label(cfg), **info.columns})
                    if bar is not None:
                        bar.update(min(cfg.steps, mode.progress(t)) - bar.n)
                        bar.set_postfix(loss=f"{info.loss:.3g}", acc=f"{acc:.3f}")
                if cfg.checkpoint and cfg.checkpoint_every and t % cfg.checkpoint_every == 0 \
                        and t < cfg.steps and not info.stop and mode.periodic_checkpoints:
                    if isinstance(mode, Backup):
                        resume.save(ctx, mode, t, collective=False)
                    else:
                        mode.sync_point(t)
                        resume.save(ctx, mode, t)
                if info.stop:
                    break
        mode.finish()
        step = mode.final_step(t)
        mode.annotate(rows)
        stopped = step < cfg.steps
        if cfg.checkpoint:
            resume.save(ctx, mode, step)
    finally:
        if bar is not None:
            bar.close()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    wall = comm.allreduce(time.perf_counter() - t_start, MPI.MAX)
    if ctx.timeline is not None:
        ctx.timeline.write(cfg.timeline, comm)
    if logger:
        acc = ctx.test_accuracy()
        if rows:
            rows[-1]["test_accuracy"] = acc
        if cfg.metrics:
            write_metrics(cfg.metrics, rows, {**resume.describe(ctx, step),
                                              "config": _jsonable(cfg), "stopped": stopped,
                                              "wall_s": wall, "start": start, **_totals(rows),
                                              "losses": losses or []})
    acc, rows = comm.bcast((acc, rows), root=mode.logger_rank)
    return TrainResult(params=ctx.params, step=step, test_accuracy=acc, metrics=rows,
                       stopped=stopped, bytes_sent=ctx.wire.total,
                       bytes_moved=dict(zip(PATHS, ctx.wire.totals().tolist())), wall_s=wall,
                       computed=computed, config=cfg)


def _recovered(loss, start, rank, size):
    """Note in ``loss`` (and on rank 0's stderr) the step the survivors go on from and the
    seconds the recovery took."""
    loss.update(from_step=int(start), ranks_left=size,
                recovery_s=round(time.monotonic() - loss.pop("began"), 3))
    if rank == 0:
        print(f"mlcomm train: lost ranks {loss['ranks']} in {loss['collective']}; "
              f"{size} ranks go on from step {start} (the last checkpoint), recovered in "
              f"{loss['recovery_s']:.2f} s", file=sys.stderr, flush=True)


def _mode_label(cfg):
    if cfg.framework == "torch":
        return "torch ddp"
    if cfg.sync == "ssp":
        return f"ssp s={cfg.staleness}"
    if cfg.sync == "backup":
        return f"backup b={cfg.backup_workers}"
    if cfg.sync == "async":
        return f"async K={cfg.servers}"
    return "bsp" if cfg.compress == "none" else f"bsp {cfg.compress}"


def _jsonable(cfg):
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(cfg).items()}
