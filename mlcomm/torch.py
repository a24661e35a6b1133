"""PyTorch data parallelism on mlcomm: :class:`DistributedDataParallel`.

Used as ``torch.nn.parallel.DistributedDataParallel`` is: wrap the model, train as usual.

- At construction the parameters and buffers of rank 0 are broadcast (``mlcomm.bcast``).
- The gradients are grouped into buckets of at most ``bucket_cap_mb`` MiB, in reverse
  registration order (the order backward produces them), and each parameter's ``.grad``
  is a view into its bucket's flat buffer (PyTorch's ``gradient_as_bucket_view``).
- A post-accumulate-grad hook on every parameter counts the bucket's gradients; when a
  bucket is complete its non-blocking all-reduce (op ``avg``) starts at once, on mlcomm's
  progress thread, while backward goes on computing the earlier layers. Each bucket's
  all-reduce is a persistent handle (``mlcomm.allreduce_init``, bound to the bucket once)
  whose ``start()`` returns the request. Buckets start in index order on every rank.
- At the end of backward (an autograd engine callback) every bucket is waited for, so
  ``loss.backward()`` returns with averaged gradients, identical on every rank, and the
  optimizer step needs nothing extra.

Import it as ``from mlcomm.torch import DistributedDataParallel``; importing
:mod:`mlcomm` alone does not import torch.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time

import torch
from mpi4py import MPI

from .api import IN_PLACE, allreduce_init, bcast

__all__ = ["DistributedDataParallel"]


class _Bucket:
    """One flat gradient buffer and the parameters whose ``.grad`` are views into it."""

    __slots__ = ("index", "params", "names", "buffer", "views", "pending", "handle", "request",
                 "queued", "by_hook")

    def __init__(self, index, params, names):
        self.index, self.params, self.names = index, params, names
        total = sum(p.numel() for p in params)
        self.buffer = torch.zeros(total, dtype=params[0].dtype)
        self.views, offset = [], 0
        for p in params:
            self.views.append(self.buffer[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        self.pending = len(params)
        self.handle = self.request = None
        self.queued = 0.0
        self.by_hook = False

    @property
    def nbytes(self) -> int:
        return self.buffer.numel() * self.buffer.element_size()


def _buckets(named, cap_bytes):
    """Group ``(name, param)`` pairs, last registered first, into buckets of at most
    ``cap_bytes`` (a parameter larger than that is a bucket of its own), one dtype each."""
    groups, current, size = [], [], 0
    for name, p in reversed(named):
        nbytes = p.numel() * p.element_size()
        if current and (size + nbytes > cap_bytes or p.dtype != current[0][1].dtype):
            groups.append(current)
            current, size = [], 0
        current.append((name, p))
        size += nbytes
    if current:
        groups.append(current)
    return [_Bucket(i, [p for _, p in g], [n for n, _ in g]) for i, g in enumerate(groups)]


def _tensors_in(obj):
    """Every tensor in a (nested) module output."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _tensors_in(item)
    elif isinstance(obj, dict):
        for item in obj.values():
            yield from _tensors_in(item)


def _reachable(outputs):
    """The leaf tensors whose gradients a backward from ``outputs`` accumulates."""
    seen, leaves = set(), set()
    stack = [t.grad_fn for t in outputs if t.grad_fn is not None]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        variable = getattr(fn, "variable", None)
        if variable is not None:
            leaves.add(variable)
        stack.extend(f for f, _ in fn.next_functions)
    return leaves


class DistributedDataParallel(torch.nn.Module):
    """Data-parallel training of ``module`` over the ranks of ``comm`` (default COMM_WORLD).

    Every rank builds the same model, wraps it and feeds it its own batch; after
    ``loss.backward()`` every parameter's ``.grad`` holds the average over the ranks, the
    same bits on every rank. Training on P ranks with batches of B matches training in one
    process on the global batch of P·B, to rounding.

    ``bucket_cap_mb``: gradients are all-reduced in buckets of at most this many MiB (0: one
    bucket per parameter). ``algorithm`` and ``options``: the mlcomm all-reduce algorithm
    (default ``MLCOMM_ALGORITHM`` or ``auto``) and its options.

    ``find_unused_parameters``: every parameter must get a gradient in every backward
    unless this is True. Then each forward finds the parameters its output does not reach;
    they add zeros to their bucket, and a parameter that no rank used keeps the gradient
    it had (``None`` after ``zero_grad()``), as in one process. Without it, a parameter with
    no gradient raises a RuntimeError at the end of backward (after its bucket has been
    all-reduced with zeros, so that no other rank waits).

    ``overlap=False`` starts every bucket at the end of backward instead of as soon as it
    is complete (the all-reduce after backward, for comparison). ``broadcast_buffers``
    broadcasts rank 0's buffers (BatchNorm's statistics) at every forward, as PyTorch's
    DDP does. ``timeline``: an object with ``add(name, start, end, thread, **args)``
    (:class:`mlcomm.trainer.timeline.Timeline`) that receives the forward, backward and
    wait spans (thread ``"compute"``) and each bucket's all-reduce (``"communication"``),
    in ``time.perf_counter()`` seconds.

    A parameter's ``.grad`` becomes a view into its bucket at its first gradient (one copy)
    and stays one while ``optimizer.zero_grad(set_to_none=False)`` zeroes it; after
    ``zero_grad()`` (to None) each backward copies the new gradient into the bucket.
    Within ``with ddp.no_sync():`` backward accumulates local gradients and all-reduces
    nothing. :attr:`last_backward` describes the last backward: ``buckets``,
    ``started_by_hooks`` (buckets started during backward) and ``wait_s`` (the time
    backward's end spent waiting for all-reduces).
    """

    def __init__(self, module: torch.nn.Module, bucket_cap_mb: float = 25, algorithm=None,
                 comm=None, *, find_unused_parameters: bool = False, overlap: bool = True,
                 broadcast_buffers: bool = True, timeline=None, **options):
        super().__init__()
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
        if not bucket_cap_mb >= 0:
            raise ValueError(f"bucket_cap_mb must be >= 0, got {bucket_cap_mb!r}")
        self.module = module
        self.comm = MPI.COMM_WORLD if comm is None else comm
        self.find_unused_parameters = find_unused_parameters
        self.overlap, self.broadcast_buffers = overlap, broadcast_buffers
        self.timeline = timeline
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        for name, t in [*module.named_parameters(), *module.named_buffers()]:
            if t.device.type != "cpu":
                raise TypeError(f"{name} is on {t.device}; mlcomm.torch.DistributedDataParallel "
                                f"takes models on the CPU")
        self._check_same_model(named)
        self._broadcast([t for _, t in module.state_dict(keep_vars=True).items()
                         if isinstance(t, torch.Tensor)])
        self.buckets = _buckets(named, bucket_cap_mb * 2**20)
        self._where = {}
        for bucket in self.buckets:
            bucket.handle = allreduce_init(IN_PLACE, bucket.buffer, "avg", comm=self.comm,
                                           algorithm=algorithm, **options)
            for p, view in zip(bucket.params, bucket.views):
                if p.grad is not None:  # else it becomes the view at its first gradient
                    view.copy_(p.grad)
                    p.grad = view
                self._where[p] = (bucket, view)
                p.register_post_accumulate_grad_hook(self._ready)
        self._names = {p: n for n, p in named}
        self._flags = torch.zeros(len(self._where), dtype=torch.int32)  # used, per parameter
        self._used = allreduce_init(IN_PLACE, self._flags, comm=self.comm) \
            if find_unused_parameters else None
        self._sync = True
        self._next = 0             # the next bucket to start
        self._active = False       # within a backward that all-reduces
        self._backward_t0 = None
        self._unused = set()       # parameters this forward's output does not reach
        self._ready_set = set()
        self._kept = {}            # unused parameter -> its gradient before this backward
        self._watch = None
        self.last_backward = {"buckets": len(self.buckets), "started_by_hooks": 0, "wait_s": 0.0}

    # construction

    def _check_same_model(self, named):
        shapes = [(n, tuple(p.shape), str(p.dtype)) for n, p in named]
        everyone = self.comm.allgather(shapes)
        for rank, theirs in enumerate(everyone):
            if theirs != shapes:
                raise ValueError(f"DistributedDataParallel: rank {rank}'s model has parameters "
                                 f"that differ from rank {self.comm.Get_rank()}'s; build the "
                                 f"same model on every rank")

    def _broadcast(self, tensors):
        """Rank 0's values of ``tensors`` on every rank: one broadcast per dtype."""
        by_dtype = {}
        for t in tensors:
            by_dtype.setdefault(t.dtype, []).append(t)
        with torch.no_grad():
            for group in by_dtype.values():
                flat = torch.cat([t.detach().reshape(-1) for t in group])
                bcast(flat, root=0, comm=self.comm)
                offset = 0
                for t in group:
                    t.copy_(flat[offset:offset + t.numel()].view_as(t))
                    offset += t.numel()

    # forward

    def forward(self, *args, **kwargs):
        t0 = time.perf_counter()
        if self.broadcast_buffers:
            buffers = [b for b in self.module.buffers()]
            if buffers:
                self._broadcast(buffers)
        out = self.module(*args, **kwargs)
        if torch.is_grad_enabled() and self._sync:
            self._prepare(list(_tensors_in(out)))
        if self.timeline is not None:
            self.timeline.add("forward", t0, time.perf_counter(), "compute")
        return out

    def _prepare(self, outputs):
        """Reset the buckets for the backward of this forward's ``outputs``."""
        self._reset()
        if self.find_unused_parameters:
            reached = _reachable(outputs)
            self._unused = {p for p in self._where if p not in reached}
        for t in outputs:  # the first gradient of backward: its start
            if t.requires_grad:
                t.register_hook(self._backward_started)

    def _reset(self):
        for bucket in self.buckets:
            bucket.pending = len(bucket.params)
            bucket.request, bucket.by_hook = None, False
        self._next = 0
        self._ready_set = set()
        self._unused = set()
        self._kept = {}
        self._active = False

    # backward

    def _backward_started(self, grad=None):
        if not self._active and self._sync:
            self._active = True
            self._backward_t0 = time.perf_counter()
            torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
            for p in self._unused:  # known now: they add zeros
                self._mark(p, zero=True)

    def _ready(self, param):
        """Post-accumulate-grad hook: ``param.grad`` is final for this backward."""
        if not self._sync:
            return
        self._backward_started()
        bucket, view = self._where[param]
        grad = param.grad
        if grad is None or grad.data_ptr() != view.data_ptr():
            if grad is not None:
                view.copy_(grad)
            else:
                view.zero_()
            param.grad = view
        self._mark(param)

    def _mark(self, param, zero=False):
        if param in self._ready_set:
            return
        bucket, view = self._where[param]
        if zero:
            self._kept[param] = None if param.grad is None else view.clone()
            view.zero_()
            param.grad = view
        self._ready_set.add(param)
        bucket.pending -= 1
        if bucket.pending == 0 and self.overlap:
            self._start_ready(by_hook=True)

    def _start_ready(self, by_hook):
        """Start every complete bucket from the next one on, in index order."""
        while self._next < len(self.buckets) and self.buckets[self._next].pending == 0:
            bucket = self.buckets[self._next]
            bucket.queued = time.perf_counter()
            bucket.by_hook = by_hook
            bucket.request = bucket.handle.start()
            if self.timeline is not None:
                self._watcher().put((bucket.index, bucket.request, bucket.queued, bucket.nbytes,
                                     len(bucket.params)))
            self._next += 1

    def _end_of_backward(self):
        """Autograd's final callback: start what is left, wait for every bucket."""
        t_end = time.perf_counter()
        missing = [p for p in self._where if p not in self._ready_set]
        for p in missing:
            self._mark(p, zero=True)
        self._start_ready(by_hook=False)
        used = None
        if self._used is not None:  # how many ranks used each parameter
            self._flags.copy_(torch.tensor([p not in self._kept for p in self._where]))
            used = self._used.start()
        t0 = time.perf_counter()
        error = None
        for bucket in self.buckets:
            try:
                bucket.request.wait()
            except BaseException as exc:  # every request is waited for; the first error raised
                error = error or exc
        if used is not None:
            used.wait()
            for p, n in zip(self._where, self._flags.tolist()):
                if n == 0 and p in self._kept:  # no rank used it: as in one process
                    kept = self._kept[p]
                    if kept is None:
                        p.grad = None
                    else:
                        self._where[p][1].copy_(kept)
        t1 = time.perf_counter()
        self.last_backward = {"buckets": len(self.buckets),
                              "started_by_hooks": sum(b.by_hook for b in self.buckets),
                              "wait_s": t1 - t0}
        self._reset()  # a second backward of the same graph all-reduces again
        if self.timeline is not None:
            self.timeline.add("backward", self._backward_t0, t_end, "compute")
            self.timeline.add("wait for all-reduces", t0, t1, "compute")
        if error is not None:
            raise error
        if missing and not self.find_unused_parameters:
            order = {p: i for i, p in enumerate(self._names)}
            missing.sort(key=order.__getitem__)
            names = ", ".join(self._names[p] for p in missing[:5])
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            raise RuntimeError(f"DistributedDataParallel: parameters {names}{more} got no "
                               f"gradient in this backward (their buckets were all-reduced "
                               f"with zeros); pass find_unused_parameters=True to the wrapper "
                               f"if the model leaves parameters unused")

    # the timeline's communication spans

    def _watcher(self):
        """A thread that notes when each started bucket completes (requests complete in order)."""
        if self._watch is None:
            self._watch = queue.SimpleQueue()
            threading.Thread(target=self._watch_loop, args=(self._watch, self.timeline),
                             daemon=True, name="mlcomm-ddp-timeline").start()
        return self._watch

    @staticmethod
    def _watch_loop(pending, timeline):
        last_end = 0.0
        while True:
            index, request, start, nbytes, nparams = pending.get()
            try:
                request.wait()
            except BaseException:  # the training thread's wait raises it
                pass
            end = time.perf_counter()
            start = max(start, last_end)  # it ran after the bucket before it
            last_end = end
            timeline.add(f"all-reduce bucket {index}", start, end, "communication",
                         bytes=nbytes, params=nparams)

    # gradient accumulation

    @contextlib.contextmanager
    def no_sync(self):
        """Within this context, backward accumulates local gradients and all-reduces nothing;
        the first backward after it all-reduces the sum."""
        before, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = before
