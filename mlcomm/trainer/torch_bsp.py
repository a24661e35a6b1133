"""``--framework torch``: PyTorch models trained with PyTorch's DistributedDataParallel.

The model's parameters live in one flat tensor (each parameter a view into it), so the
trainer's ``params`` is a NumPy view of the live weights, as for the NumPy models. A step
is PyTorch's own loop: forward on this rank's share of the global batch, backward (during
which DDP all-reduces the gradient buckets on the ``torch.distributed`` backend, ``mlcomm``
or ``gloo``), the optimizer step; the loss sum and the stop flag travel in one small
non-blocking mlcomm all-reduce that overlaps the optimizer step.
"""

from __future__ import annotations

import os
import time

import numpy as np
import torch
import torch.distributed as dist

from .data import batch_indices, shard
from .sync import Mode, StepInfo, _columns

__all__ = ["TorchModel", "TorchBSP", "MODELS"]

MODELS = ("softmax", "mlp", "mlp1", "mlp2", "cnn")
_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _cnn(n_classes):
    """Two 3x3 convolutions (16 and 32 channels), a 2x2 max-pool, then 512-128-classes."""
    nn = torch.nn
    return nn.Sequential(
        nn.Unflatten(1, (1, 8, 8)),
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2), nn.Flatten(),
        nn.Linear(32 * 4 * 4, 128), nn.ReLU(),
        nn.Linear(128, n_classes))


def _mlp(sizes):
    nn = torch.nn
    layers = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


class TorchModel:
    """A PyTorch model whose parameters are views into one flat tensor."""

    def __init__(self, name, n_features, n_classes, *, hidden=(128,), dtype="float32", seed=0):
        if name == "cnn":
            if n_features != 64:
                raise ValueError(f"--model cnn takes 8x8 images (64 features), got {n_features}")
            make = lambda: _cnn(n_classes)
            self.name = "cnn"
        else:
            layers = {"softmax": 0, "mlp": 1, "mlp1": 1, "mlp2": 2}[name]
            widths = list(hidden[:layers]) + [hidden[-1]] * (layers - len(hidden[:layers]))
            self.sizes = [n_features, *widths, n_classes]
            make = lambda: _mlp(self.sizes)
            self.name = "softmax" if layers == 0 else f"mlp{layers}"
        torch.manual_seed(seed)
        self.module = make().to(_DTYPES[dtype])
        params = list(self.module.parameters())
        if name == "cnn":
            self.sizes = [p.numel() for p in params]
        with torch.no_grad():
            self.flat = torch.cat([p.reshape(-1) for p in params])
            offset = 0
            for p in params:
                p.data = self.flat[offset:offset + p.numel()].view_as(p)
                offset += p.numel()
        self.size = self.flat.numel()
        self._inputs = {}

    def init(self, seed):
        """The live parameters as a flat NumPy view (initialised from ``seed`` on construction)."""
        return self.flat.numpy()

    def tensor(self, array):
        """``array`` as a tensor sharing its memory (cached per array)."""
        key = id(array)
        if key not in self._inputs:
            self._inputs[key] = (array, torch.from_numpy(array))
        return self._inputs[key][1]

    def accuracy(self, params, x, y):
        """Test accuracy of the live model (``params`` is the live flat view)."""
        was = self.module.training
        self.module.eval()
        with torch.no_grad():
            pred = self.module(self.tensor(x)).argmax(dim=1).numpy()
        self.module.train(was)
        return float(np.mean(pred == y))


def _threads(comm):
    """Torch threads per rank: the cores shared out among this node's ranks."""
    if "OMP_NUM_THREADS" in os.environ:
        return
    from mpi4py import MPI
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    local = node.Get_size()
    node.Free()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    torch.set_num_threads(max(1, (cores or 1) // local))


class TorchBSP(Mode):
    """Synchronous data parallelism with PyTorch's DDP: gradients average in backward.

    The job's default process group is initialised on ``--backend`` unless it already is
    (then on that backend); on mlcomm's, ``--algorithm`` is the gradient all-reduce's, its
    bytes are counted and its calls are the timeline's communication spans.
    """

    records_timeline = True

    def __init__(self, ctx):
        super().__init__(ctx)
        cfg, model = ctx.cfg, ctx.model
        _threads(ctx.comm)
        self.created = _init_process_group(cfg)
        if dist.get_world_size() != self.size:
            raise ValueError(f"--framework torch trains on torch.distributed's default group "
                             f"({dist.get_world_size()} ranks), not on this communicator of "
                             f"{self.size}: call train() on MPI.COMM_WORLD")
        group = dist.group.WORLD
        # the gradients are views into DDP's buckets (no copy in and out) and the graph is
        # the same every step
        self.ddp = torch.nn.parallel.DistributedDataParallel(
            model.module, bucket_cap_mb=cfg.bucket_mb, gradient_as_bucket_view=True,
            static_graph=True)
        self.opt = torch.optim.SGD(model.module.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                                   weight_decay=cfg.weight_decay)
        self.x = model.tensor(ctx.data.x_train)
        self.y = model.tensor(ctx.data.y_train)
        self.extras = np.zeros(2)   # this rank's loss sum and stop flag, summed over ranks
        self.extras_sum = self.wire.allreduce_init(self.extras)
        self.loss_fn = torch.nn.CrossEntropyLoss()
        self.buckets = []           # this step's all-reduces: (start, end, queued, bytes)
        self.mlcomm = dist.get_backend(group) == "mlcomm"
        if self.mlcomm:
            group._register_on_completion_hook(self._on_work)
            self.wire.count(group.session)
        self._warm_up()

    def _warm_up(self):
        """Two steps' forward and backward before the clock starts: DDP settles its buckets
        (rebuilt after the first) and mlcomm plans their all-reduces (and the extras')."""
        idx = torch.arange(min(len(self.y), self.ctx.cfg.batch_size))
        for _ in range(2):
            self.loss_fn(self.ddp(self.x[idx]), self.y[idx]).backward()
        self.opt.zero_grad(set_to_none=False)
        self.extras_sum()

    def _on_work(self, info):
        """The backend's hook (progress thread): one all-reduce of this step completed."""
        self.buckets.append((info.time_started, info.time_finished, info.time_queued,
                             info.nbytes))

    def step(self, t):
        c, info = self.ctx, StepInfo(step=t)
        t0 = time.perf_counter()
        idx = torch.from_numpy(shard(batch_indices(len(c.data.y_train), c.global_batch, t,
                                                   c.cfg.seed), self.rank, self.size))
        c.straggle(t)
        self.opt.zero_grad(set_to_none=False)
        self.buckets = []
        out = self.ddp(self.x[idx])
        tf = time.perf_counter()
        loss = self.loss_fn(out, self.y[idx])
        loss.backward()                              # averages the gradients
        t1 = time.perf_counter()
        # backward's end waited for the all-reduces from the last one's start on
        wait = max(0.0, t1 - max(q for _, _, q, _ in self.buckets)) if self.buckets else 0.0
        self.extras[:] = float(loss.detach()) * len(idx), 1.0 if c.stop_requested() else 0.0
        self.extras_sum.start()                      # overlaps the optimizer step
        for group in self.opt.param_groups:
            group["lr"] = c.lr_at(t)
        self.opt.step()
        t2 = time.perf_counter()
        extras = self.extras_sum.wait()
        t3 = time.perf_counter()
        if c.timeline is not None:
            c.timeline.add("forward", t0, tf, "compute")
            c.timeline.add("backward", tf, t1 - wait, "compute")
            if wait > 0:
                c.timeline.add("wait for all-reduces", t1 - wait, t1, "compute")
            for i, (start, end, _, nbytes) in enumerate(self.buckets):
                c.timeline.add(f"all-reduce bucket {i}", start, end, "communication",
                               bytes=nbytes)
            c.timeline.add("optimizer step", t1, t2, "compute")
            c.timeline.add("all-reduce loss", t1, t3, "communication")
            if t3 > t2:
                c.timeline.add("wait for loss", t2, t3, "compute")
        info.samples = len(idx)
        info.compute_s = (t1 - t0 - wait) + (t2 - t1)
        info.comm_s = wait + (t3 - t2)
        info.loss = float(extras[0]) / c.global_batch
        info.stop = bool(extras[1] > 0)
        info.columns = _columns(1, c.global_batch)
        return info

    def finish(self):
        if self.created:
            dist.destroy_process_group()


def _init_process_group(cfg) -> bool:
    """Initialise torch.distributed on ``cfg.backend`` unless it is; whether this did."""
    from ..torch import Options  # the mlcomm backend, and gloo's peers from MPI
    if dist.is_initialized():
        return False
    options = Options(algorithm=cfg.algorithm) if cfg.backend == "mlcomm" else None
    dist.init_process_group(cfg.backend, pg_options=options)
    return True
