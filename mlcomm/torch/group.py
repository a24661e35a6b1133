"""The ``mlcomm`` process group (see :mod:`mlcomm.torch.backend`): torch's collectives,
point-to-point calls and hooks, each compared across the ranks (:class:`.Comparison`) and run
on mlcomm."""

from __future__ import annotations

import time
from functools import partial

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

from ..api import IN_PLACE, allgather, allreduce, bcast, istart, reduce, reduce_scatter
from ..session import session_of
from ..buffers.tensors import as_array
from .compare import _KEEP, Comparison
from .exchange import BLOCKING, Exchange, copy_into, packed
from .work import Work, WorkInfo, _error_of, _Point, _settled, _settling

_GLOO = "or run it on a gloo group beside this one: dist.new_group(backend='gloo')"
_UNSUPPORTED = {  # torch's dist.monitored_barrier takes gloo groups alone, before this
    "monitored_barrier": "barrier compares every call across the ranks already",
}


class Options:
    """``pg_options`` of ``init_process_group("mlcomm", ...)`` and ``new_group``: the
    all-reduce's mlcomm algorithm (default ``MLCOMM_ALGORITHM`` or ``auto``) and its options
    (``segment_bytes=``...). The other collectives take ``auto``'s choice."""

    def __init__(self, algorithm: str | None = None, **options):
        self.algorithm, self.options = algorithm, options

    def __repr__(self):
        return f"Options(algorithm={self.algorithm!r}, **{self.options!r})"


def _bytes(tensor):
    return as_array(tensor, "tensor").reshape(-1).view(np.uint8)


class ProcessGroupMlcomm(Exchange, dist.ProcessGroup, Comparison):
    """torch.distributed's process group over the MPI communicator ``comm`` (see the module
    docstring); ``options``: an :class:`Options`; ``timeout``: the group's (a ``timedelta``),
    within which a barrier whose ranks do not all come raises."""

    def __init__(self, comm, options: Options | None = None, timeout=None):
        super().__init__(comm.Get_rank(), comm.Get_size())
        self.comm = comm
        self._timeout = (timeout or dist.default_pg_timeout).total_seconds()
        self._arrival = None  # the barrier's wait that timed out, which the next one resumes
        self._rank, self._size = comm.Get_rank(), comm.Get_size()
        # collective: every member creates the group together (a watched wait)
        self.session = session_of(comm, "the mlcomm backend's process group")
        options = options or Options()
        self._allreduce = {"algorithm": options.algorithm, **options.options}
        self._start_comparison(comm)
        self._p2p = comm.Dup()
        self._hooks = []
        self._seq = 0
        self._last_finished = 0.0
        self._known = {}  # (op, dtype, shape) -> _Known: the all-reduces seen
        self._seen = set()  # descriptions of the calls this rank has run
        self._name = self._desc = ""

    # torch's identity of the backend

    def getBackendName(self) -> str:
        return "mlcomm"

    def name(self) -> str:
        return "mlcomm"

    # torch keeps a group's name and description on its C++ backends, which a Python group
    # has none of: these keep them here
    def getGroupName(self) -> str:
        return self._name

    def setGroupName(self, name: str) -> None:
        self._name = name

    def getGroupDesc(self) -> str:
        return self._desc

    def setGroupDesc(self, desc: str) -> None:
        self._desc = desc

    # collectives

    def allreduce(self, tensors, opts=None):
        opts = opts or dist.AllreduceOptions()
        t, reduce_op = tensors[0], opts.reduceOp
        if t.layout == torch.sparse_coo:
            return self._sparse_allreduce(tensors, reduce_op)
        key = (hash(reduce_op), t.dtype, t.shape)  # a ReduceOp hashes fast, its enum slowly
        known, blocking = self._known.get(key), not opts.asyncOp and not self._hooks
        if known is None or len(tensors) != 1 or not t.is_cpu or not t.is_contiguous():
            problem, op, described = self._describe("all_reduce", tensors, reduce_op)
            known = None
            if problem is None and len(self._known) < _KEEP:
                known = self._known[key] = self._known_allreduce(op, described, t)
        else:
            op, described, problem = known.op, known.described, None  # compared only
        if blocking and known is not None and known.code is not None:
            self._small_allreduce(known, t)
            return Work(tensors)
        if blocking and problem is None:  # here
            self.session.wait_started()
            self._compare("all_reduce", described, None)
            allreduce(IN_PLACE, t, op, comm=self.comm, **self._allreduce)
            return Work(tensors)
        return self._go("allreduce", described, problem, [("allreduce", IN_PLACE, t, op, 0)],
                        tensors, opts.asyncOp, **self._allreduce)

    def _sparse_allreduce(self, tensors, reduce_op):
        """A sparse COO tensor's sum, as gloo's: every rank's coalesced indices and values,
        gathered in rank order, summed alike on every rank (the same bits), and copied into
        the tensor. Compared across the ranks first, as every call is."""
        t = tensors[0]
        problem = None
        if len(tensors) != 1:
            problem = ValueError(f"all_reduce of sparse tensors: pass one tensor, not "
                                 f"{len(tensors)}")
        elif reduce_op.op != dist.ReduceOp.SUM:
            problem = ValueError(f"all_reduce of a sparse tensor: only ReduceOp.SUM, not "
                                 f"{reduce_op.op} (as gloo); densify it with .to_dense() for "
                                 f"other ops")
        elif t.device.type != "cpu":
            problem = TypeError(f"all_reduce: a {t.device.type} sparse tensor; the mlcomm "
                                f"backend takes CPU tensors (.cpu())")
        described = f"all_reduce sparse {t.dtype} {tuple(t.shape)} sparse_dim {t.sparse_dim()}"
        self.session.wait_started()
        self._compare("all_reduce", described, problem)
        mine = t.coalesce()
        parts = self._check_comm.allgather((mine.indices(), mine.values()))
        t.copy_(torch.sparse_coo_tensor(torch.cat([i for i, _ in parts], 1),
                                        torch.cat([v for _, v in parts]), t.shape).coalesce())
        return Work(tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts or dist.AllreduceCoalescedOptions()
        problem, op, described = self._describe("all_reduce_coalesced", tensors, opts.reduceOp)
        return self._go("allreduce_coalesced", described, problem,
                        [("allreduce", IN_PLACE, t, op, 0) for t in tensors], tensors,
                        opts.asyncOp, **self._allreduce)

    def broadcast(self, tensors, opts=None):
        opts = opts or dist.BroadcastOptions()
        problem, _, described = self._describe("broadcast", tensors, root=opts.rootRank)
        return self._go("broadcast", described, problem,
                        [("bcast", t, None, "sum", opts.rootRank) for t in tensors[:1]],
                        tensors, opts.asyncOp)

    def reduce(self, tensors, opts=None):
        opts = opts or dist.ReduceOptions()
        root = opts.rootRank
        problem, op, described = self._describe("reduce", tensors, opts.reduceOp, root=root)
        return self._go("reduce", described, problem,  # in place on the root
                        [("reduce", t, t if self._rank == root else None, op, root)
                         for t in tensors[:1]], tensors, opts.asyncOp)

    def allgather(self, output_tensors, input_tensors, opts=None):
        """``outputs[r]`` receives rank r's tensor; outputs of different sizes (each rank's
        of its input's size) gather unevenly (:meth:`~.Exchange._allgather_v`)."""
        opts = opts or dist.AllgatherOptions()
        (outputs,), (t,) = output_tensors, input_tensors
        if len({o.numel() for o in outputs}) > 1:
            return self._allgather_v(outputs, t, opts)
        problem, _, described = self._describe("all_gather", input_tensors,
                                               lists=[(outputs, t)])
        flat = torch.empty((self._size, *t.shape), dtype=t.dtype) if problem is None else t
        return self._go("allgather", described, problem, [("allgather", t, flat, "sum", 0)],
                        outputs, opts.asyncOp, after=partial(copy_into, outputs, flat))

    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        """``output_lists[r][i]`` receives rank r's ``input_tensors[i]`` (torch's order)."""
        if len(output_lists) != self._size or any(
                len(outs) != len(input_tensors) for outs in output_lists):
            raise ValueError(
                f"all_gather_coalesced: output_tensor_lists must hold one list per rank "
                f"({self._size}), each of one tensor per input ({len(input_tensors)}); got "
                f"{[len(outs) for outs in output_lists]}")
        works = [self.allgather([[outs[i] for outs in output_lists]], [t], opts)
                 for i, t in enumerate(input_tensors)]
        return Work([t for outs in output_lists for t in outs],
                    [r for w in works for r in w._requests], works[-1]._future if works else None)

    def all_gather_single(self, output, input, opts=None):
        opts = opts or dist.AllgatherOptions()
        problem, _, described = self._describe("all_gather_into_tensor", [input],
                                               gathered=[(output, input)])
        return self._go("_allgather_base", described, problem,
                        [self._gather_call(output, input)], [output], opts.asyncOp)

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        opts = opts or dist.AllgatherOptions()
        problem, _, described = self._describe("all_gather_into_tensor_coalesced", inputs,
                                               gathered=list(zip(outputs, inputs)))
        return self._go("allgather_coalesced", described, problem,
                        [self._gather_call(o, i) for o, i in zip(outputs, inputs)],
                        outputs, opts.asyncOp)

    def _gather_call(self, output, input):
        """The mlcomm allgather of ``input`` into ``output``: in place where ``input`` is
        this rank's block of ``output`` (as FSDP2 gathers)."""
        block = input.numel() * input.element_size()
        if input.data_ptr() == output.data_ptr() + self._rank * block and input.numel() and \
                input.untyped_storage().data_ptr() == output.untyped_storage().data_ptr():
            return "allgather", IN_PLACE, output, "sum", 0
        return "allgather", input, output, "sum", 0

    def reduce_scatter(self, output_tensors, input_lists, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        (out,), (inputs,) = output_tensors, input_lists
        problem, op, described = self._describe("reduce_scatter", output_tensors, opts.reduceOp,
                                                lists=[(inputs, out)])
        flat = packed(inputs) if problem is None else out
        return self._go("reduce_scatter", described, problem,
                        [("reduce_scatter", flat, out, op, 0)], [out], opts.asyncOp)

    def reduce_scatter_single(self, output, input, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        problem, op, described = self._describe("reduce_scatter_tensor", [output],
                                                opts.reduceOp, gathered=[(input, output)])
        return self._go("_reduce_scatter_base", described, problem,
                        [("reduce_scatter", input, output, op, 0)], [output], opts.asyncOp)

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        problem, op, described = self._describe("reduce_scatter_tensor_coalesced", outputs,
                                                opts.reduceOp,
                                                gathered=list(zip(inputs, outputs)))
        return self._go("reduce_scatter_coalesced", described, problem,
                        [("reduce_scatter", i, o, op, 0) for o, i in zip(outputs, inputs)],
                        outputs, opts.asyncOp)

    # the names torch used before 2.10 for the same calls
    _allgather_base = all_gather_single
    _reduce_scatter_base = reduce_scatter_single
    allgather_into_tensor_coalesced = all_gather_single_coalesced
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def barrier(self, opts=None):
        """Complete once every rank has entered it and every call started before it has
        completed on this rank: the comparison across the ranks is the barrier. A blocking
        one raises RuntimeError where the ranks have not all entered it within ``timeout=``
        (else the group's timeout), as gloo's does."""
        opts = opts or dist.BarrierOptions()
        check = partial(self._compare, "barrier", "barrier", None)
        if opts.asyncOp:
            future = torch.futures.Future()
            return Work([], [self.session.start(partial(_settling, check, future))], future)
        self.session.wait_started()
        seconds = opts.timeout.total_seconds()
        self._arrive("barrier", seconds if seconds >= 0 else self._timeout)
        check()
        return Work([])

    def _arrive(self, what, seconds):
        """Wait until every rank has entered ``what`` (a barrier on the comparison's
        communicator), or raise RuntimeError after ``seconds``: the next barrier on this
        rank then waits for the same ranks (every rank's next collective must be that
        barrier)."""
        request, self._arrival = self._arrival or self._check_comm.Ibarrier(), None
        start = time.monotonic()
        while not request.Test():
            waited = time.monotonic() - start
            if waited > seconds:
                self._arrival = request
                raise RuntimeError(
                    f"{what}: Timed out after {seconds:g} s, waiting for the ranks of the "
                    f"group that have not entered it (the group's timeout, or timeout=); "
                    f"call barrier() again on this rank to wait for them once more")
            time.sleep(0 if waited < 1e-3 else 1e-4)

    # point to point

    def send(self, tensors, dst, tag):
        _raise(self._local("send", tensors))
        (t,) = tensors
        return Work([t], [_Point(self._p2p.Isend(_bytes(t), dst, tag))])

    def recv(self, tensors, src, tag):
        _raise(self._local("recv", tensors))
        (t,) = tensors
        return Work([t], [_Point(self._p2p.Irecv(_bytes(t), src, tag))])

    def recv_anysource(self, tensors, tag):
        _raise(self._local("recv", tensors))
        (t,) = tensors
        status = MPI.Status()
        point = _Point(self._p2p.Irecv(_bytes(t), MPI.ANY_SOURCE, tag), status)
        return Work([t], [point], source=status)

    # hooks and life

    def _register_on_completion_hook(self, hook) -> None:
        """Call ``hook(WorkInfo)`` after each collective completes: on the progress thread for
        a started call, in the caller's thread for a blocking one."""
        self._hooks.append(hook)

    def _wait_for_pending_works(self) -> None:
        self.session.wait_started()

    def shutdown(self) -> None:
        """Finish the started calls; free this group's communicators (not COMM_WORLD)."""
        if MPI.Is_finalized() or self._check_comm == MPI.COMM_NULL:
            return
        self.session.wait_started()
        for comm in (self._check_comm, self._p2p) + (
                (self.comm,) if self.comm != MPI.COMM_WORLD else ()):
            comm.Free()

    abort = shutdown

    # the machinery

    def _go(self, op_type, described, problem, calls, outputs, async_op, after=None,
            splits=None, **options):
        """Compare the call across the ranks and run its mlcomm ``calls`` (``(collective,
        sendbuf, recvbuf, op, root)``), then ``after()``: blocking, or started on the
        progress thread. A started call whose description this rank has run before is
        compared there too, first, so that it returns at once; any other is compared here,
        after the calls started before it (a first call may agree on ``auto``'s choice).
        ``splits``: ``(sendcounts, recvcounts)`` of an exchange whose sizes are each rank's
        own, checked across the ranks after the comparison."""
        what = described.split(" ", 1)[0]
        check = partial(self._compare, what, described, problem) if splits is None else \
            partial(self._compare_splits, what, described, problem, *splits)
        self._seq += 1
        info = WorkInfo(op_type, self._seq, sum(t.numel() * t.element_size() for t in outputs),
                        time.perf_counter(), 0.0, 0.0) if self._hooks else None
        # an exchange whose block to itself differs in size would fail as it starts, on
        # this rank alone: compared here, where its check raises on every rank
        known = async_op and problem is None and described in self._seen and (
            splits is None or splits[0][self._rank] == splits[1][self._rank])
        if not known:
            self.session.wait_started()
            check()
            if len(self._seen) > _KEEP:
                self._seen.clear()
            self._seen.add(described)
        if not async_op:
            for call in calls:
                _BLOCKING[call[0]](*call[1:], comm=self.comm, **options)
            if after is not None:
                after()
            if info is not None:
                self._finished(info, time.perf_counter())
            return Work(outputs)
        future, requests = torch.futures.Future(), []
        for k, call in enumerate(calls):
            done = partial(self._done, future, outputs, after, info, tuple(requests)) \
                if k == len(calls) - 1 else None
            requests.append(istart(*call, comm=self.comm, before=check if known and not k
                                   else None, after=done, **options))
        return Work(outputs, requests, future)

    def _done(self, future, outputs, after, info, earlier, error):
        """The end of a started call, on the progress thread (its last collective's
        ``after``): ``after()``, the hooks, the future."""
        for request in earlier:  # complete: they ran first
            error = error or _error_of(request)
        if error is None and after is not None:
            try:
                after()
            except Exception as exc:
                error = exc
        if info is not None:
            self._finished(info, time.perf_counter(), started=True)
        _settled(future, outputs, error)
        if error is not None:
            raise error

    def _finished(self, info, end, started=False):
        """Hand ``info`` to the hooks, the call having completed at ``end``; a ``started``
        one began to run once the call started before it had completed."""
        info.time_started = max(info.time_queued, self._last_finished) if started else \
            info.time_queued
        info.time_finished = end
        if started:
            self._last_finished = end
        for hook in self._hooks:
            hook(info)


def _raise(problem):
    if problem is not None:
        raise problem


def _refusal(name, alternative):
    def refuse(self, *args, **kwargs):
        raise NotImplementedError(f"the mlcomm backend has no {name}; {alternative}")
    refuse.__name__ = name
    return refuse


# what the backend does not do: a NotImplementedError that names the alternative
for _name, _alternative in _UNSUPPORTED.items():
    setattr(ProcessGroupMlcomm, _name, _refusal(_name, f"{_alternative}, {_GLOO}"))
ProcessGroupMlcomm.split_group = _refusal("split_group", "use new_group(ranks)")
ProcessGroupMlcomm.merge_remote_group = _refusal("merge_remote_group", "use new_group(ranks)")


_BLOCKING = {
    "allreduce": lambda s, r, op, root, **kw: allreduce(s, r, op, **kw),
    "reduce_scatter": lambda s, r, op, root, **kw: reduce_scatter(s, r, op, **kw),
    "allgather": lambda s, r, op, root, **kw: allgather(s, r, **kw),
    "bcast": lambda s, r, op, root, **kw: bcast(s, root, **kw),
    "reduce": lambda s, r, op, root, **kw: reduce(s, r, op, root, **kw),
    **BLOCKING,
}
