"""The ``mlcomm`` process group: torch.distributed's collectives on mlcomm's algorithms.

:class:`ProcessGroupMlcomm` is a Python subclass of ``torch.distributed.ProcessGroup``, the
form torch accepts for a backend written in Python (torch's ``test_c10d_pypg.py``); torch
calls its methods from ``torch.distributed``'s functions and from DDP's C++ reducer. A
collective:

1. checks its tensors (on the CPU, contiguous, a dtype and op mlcomm reduces) and compares
   the call across the group's ranks: every rank's checksum of the call's description (or
   of its error) is gathered by one mlcomm allgather of 64 bytes a rank, on a communicator
   of its own. A call that differs on some rank (shape, dtype, op, root, collective) or
   fails on one raises the same error on every rank, where it would otherwise hang or
   crash. A blocking all-reduce of at most 56 bytes rides in that allgather and each rank
   reduces the gathered rows in rank order (the same bits on every rank): one collective;
2. runs on mlcomm: blocking in the caller's thread (``async_op=False``), or started on the
   communicator's progress thread (``async_op=True``, and every call of DDP's reducer),
   where started calls run one after another in the order they were started
   (:func:`mlcomm.api.istart`). A started call that this rank has made before (the same
   description) is compared there too, just before it runs, so it returns at once; a
   blocking call, and a call not made before (whose first run may agree on ``auto``'s
   choice across the ranks), are compared in the caller's thread, after the calls started
   before them;
3. returns a :class:`Work`: ``wait()`` waits for it and raises its error, ``get_future()``
   is a ``torch.futures.Future`` of its output tensors, completed on the progress thread
   (so its callbacks run there and must not wait for a later call of the group).

``send`` and ``recv`` are MPI's non-blocking point-to-point calls on a duplicate of the
communicator; their Work waits for the MPI request. Hooks registered with
``_register_on_completion_hook`` (torch's name) get a :class:`WorkInfo` for each collective.
"""

from __future__ import annotations

import dataclasses
import time
import zlib
from functools import partial

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

from ..api import IN_PLACE, Persistent, allgather, allreduce, bcast, istart, reduce, \
    reduce_scatter
from ..kernels import BFLOAT16, OP_TABLE, check_op, finalize, reduce_into
from ..session import Call, session_of
from ..session.compare import raise_differences
from ..buffers.tensors import as_array

__all__ = ["ProcessGroupMlcomm", "Work", "WorkInfo", "Options", "create"]

_R = dist.ReduceOp.RedOpType
_OPS = {getattr(_R, op.torch): name for name, op in OP_TABLE.items() if op.torch}
_BOOL_OPS = {"min": "band", "max": "bor"}  # the same on booleans, where mlcomm's min/max refuse
_DTYPES = frozenset({torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                     torch.uint16, torch.uint32, torch.uint64, torch.float16, torch.bfloat16,
                     torch.float32, torch.float64, torch.complex64, torch.complex128})
_KEEP = 4096  # descriptions kept of the calls run
#: bytes each rank adds to the comparison of a call: its 8-byte checksum, then the data of a
#: blocking all-reduce of at most 56 bytes, which the comparison itself then carries
_ROW = 64
_GLOO = "or run it on a gloo group beside this one: dist.new_group(backend='gloo')"
_UNSUPPORTED = {
    "gather": "all_gather gives every rank every tensor (keep the root's)",
    "scatter": "broadcast the whole tensor and take this rank's part",
    "alltoall": "all_gather every rank's tensors and take this rank's parts",
    "all_to_all_single": "all_gather every rank's tensors and take this rank's parts",
    "alltoall_base": "all_gather every rank's tensors and take this rank's parts",
    "monitored_barrier": "barrier compares every call across the ranks already",
}


@dataclasses.dataclass(frozen=True)
class _Known:
    """An all-reduce this rank has checked: its mlcomm op and description; where it rides
    in the comparison, the description's checksum, every rank's checksums as bytes, and the
    comparison's buffers as the data's dtype (this rank's part, and each rank's row)."""

    op: str
    described: str
    code: int | None = None
    expected: bytes = b""
    mine: np.ndarray | None = None
    rows: tuple = ()
    numpy: bool = True  # torch's numpy() views the tensor as this dtype (not bfloat16's)


class Options:
    """``pg_options`` of ``init_process_group("mlcomm", ...)`` and ``new_group``: the
    all-reduce's mlcomm algorithm (default ``MLCOMM_ALGORITHM`` or ``auto``) and its options
    (``segment_bytes=``...). The other collectives take ``auto``'s choice."""

    def __init__(self, algorithm: str | None = None, **options):
        self.algorithm, self.options = algorithm, options

    def __repr__(self):
        return f"Options(algorithm={self.algorithm!r}, **{self.options!r})"


@dataclasses.dataclass
class WorkInfo:
    """One completed collective, as hooks see it: torch's op name (``allreduce``...), its
    sequence number in the group, its output bytes, and ``time.perf_counter()`` seconds:
    when the call started it, when it began to run (after the calls started before it), and
    when it completed."""

    op_type: str
    seq: int
    nbytes: int
    time_queued: float
    time_started: float
    time_finished: float


class Work(dist.Work):
    """A call of the group: ``wait()`` until it is complete (raising its error);
    ``get_future()``: a future of its output tensors (a started collective's is completed
    on the progress thread; for send and recv, get_future waits for the transfer)."""

    def __init__(self, outputs, requests=(), future=None, source=None):
        super().__init__()
        self._outputs, self._requests, self._future = outputs, requests, future
        self._source = source  # recv_anysource's MPI status

    def wait(self, timeout=None) -> bool:
        for request in self._requests:  # in order: the first error is raised
            request.wait()
        return True

    def is_completed(self) -> bool:
        if self._future is not None:  # set as the call completes, just before its request
            return self._future.done()
        return all(r.test() for r in self._requests)

    def is_success(self) -> bool:
        return self.is_completed() and self.exception() is None

    def exception(self):
        try:
            self.wait()
        except Exception as exc:
            return exc
        return None

    def result(self):
        return self._outputs

    def _source_rank(self) -> int:
        if self._source is None:
            raise RuntimeError("_source_rank(): this Work is not a recv from any source")
        self.wait()
        return self._source.Get_source()

    def get_future(self) -> torch.futures.Future:
        if self._future is None:
            self._future = _settled(torch.futures.Future(), self._outputs, self.exception())
        return self._future


def _settled(future, outputs, error):
    if error is None:
        future.set_result(outputs)
    else:
        future.set_exception(error)
    return future


class _Point:
    """An MPI request with the ``wait()`` and ``test()`` of mlcomm's (its status kept from
    the call that completed it)."""

    __slots__ = ("request", "status", "done")

    def __init__(self, request, status=None):
        self.request, self.status, self.done = request, status, False

    def wait(self):
        if not self.done:
            self.request.Wait(self.status)
            self.done = True

    def test(self) -> bool:
        if not self.done:
            self.done = self.request.Test(self.status)
        return self.done


def _bytes(tensor):
    return as_array(tensor, "tensor").reshape(-1).view(np.uint8)


class ProcessGroupMlcomm(dist.ProcessGroup):
    """torch.distributed's process group over the MPI communicator ``comm`` (see the module
    docstring); ``options``: an :class:`Options`."""

    def __init__(self, comm, options: Options | None = None):
        super().__init__(comm.Get_rank(), comm.Get_size())
        self.comm = comm
        self._rank, self._size = comm.Get_rank(), comm.Get_size()
        # collective: every member creates the group together (a watched wait)
        self.session = session_of(comm, "the mlcomm backend's process group")
        options = options or Options()
        self._allreduce = {"algorithm": options.algorithm, **options.options}
        self._check_comm = comm.Dup()
        self._mine, self._rows = np.zeros(_ROW, np.uint8), np.zeros((self._size, _ROW), np.uint8)
        # the checksums' words: this rank's, and every rank's as one byte string to compare
        self._mine_code, self._codes = self._mine[:8].view(np.int64), {}
        self._code_rows = self._rows[:, :8]
        self._gather = Persistent(Call("allgather", self._mine, self._rows.reshape(-1),
                                       comm=self._check_comm))
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

    def _known_allreduce(self, op, described, t):
        """The :class:`_Known` all-reduce of ``t``: with views of the comparison's buffers
        where it rides in the comparison (at most ``_ROW - 8`` bytes, in a group of more than
        one rank)."""
        nbytes = t.numel() * t.element_size()
        if self._size == 1 or nbytes > _ROW - 8:
            return _Known(op, described)
        dtype = as_array(t, "tensor").dtype
        code, expected = self._code(described, None)
        return _Known(op, described, code, expected, self._mine[8:8 + nbytes].view(dtype),
                      tuple(self._rows[:, 8:8 + nbytes].view(dtype)), dtype != BFLOAT16)

    def _small_allreduce(self, known, t):
        """A blocking all-reduce that rides in its own comparison: one allgather, then each
        rank reduces the gathered rows in rank order (the same bits on every rank)."""
        self.session.wait_started()
        # the caller checked the device and layout; numpy() is the view for most dtypes
        data = (t.numpy() if known.numpy and not t.requires_grad
                else as_array(t, "tensor")).reshape(-1)
        self._mine_code[0] = known.code
        known.mine[...] = data
        self._gather()
        if self._code_rows.tobytes() != known.expected:
            self._differ("all_reduce", known.described, None)
        _reduce_rows(known.rows, known.op, data)

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
        opts = opts or dist.AllgatherOptions()
        (outputs,), (t,) = output_tensors, input_tensors
        problem, _, described = self._describe("all_gather", input_tensors,
                                               lists=[(outputs, t)])
        flat = torch.empty((self._size, *t.shape), dtype=t.dtype) if problem is None else t

        def copy_out():
            for out, part in zip(outputs, flat):
                out.copy_(part)
        return self._go("allgather", described, problem, [("allgather", t, flat, "sum", 0)],
                        outputs, opts.asyncOp, after=copy_out)

    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        works = [self.allgather([outs], [t], opts) for outs, t in zip(output_lists, input_tensors)]
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
        flat = torch.cat([t.reshape(-1) for t in inputs]) if problem is None else out
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
        completed on this rank: the comparison across the ranks is the barrier."""
        opts = opts or dist.BarrierOptions()
        check = partial(self._compare, "barrier", "barrier", None)
        if opts.asyncOp:
            future = torch.futures.Future()
            return Work([], [self.session.start(partial(_settling, check, future))], future)
        self.session.wait_started()
        check()
        return Work([])

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

    def _local(self, what, tensors):
        """The problem with this rank's ``tensors`` for ``what``, as an exception; or None."""
        for t in tensors:
            if not isinstance(t, torch.Tensor):
                return TypeError(f"{what}: expected tensors, got {type(t).__name__}")
            if t.device.type != "cpu":
                return TypeError(
                    f"{what}: a {t.device.type} tensor; the mlcomm backend takes CPU tensors. "
                    f"Copy it with .cpu(), or run it on a group of a backend for its device "
                    f"beside this one (dist.new_group(backend='nccl') for CUDA)" + (
                        f". This group was asked for {dist.get_backend(self)!r}, but torch "
                        f"gives a backend written in Python the whole group: there is no "
                        f"other backend in it" if "," in dist.get_backend(self) else ""))
            if t.dtype not in _DTYPES:
                return TypeError(
                    f"{what}: mlcomm has no {t.dtype}; convert the tensor (e.g. "
                    f".to(torch.float32)) or, to move raw bits, view it as .view(torch.uint8)")
            if not t.is_contiguous():
                return ValueError(
                    f"{what}: a non-contiguous tensor (shape {tuple(t.shape)}, strides "
                    f"{t.stride()}); pass a contiguous one: c = t.contiguous(), then copy the "
                    f"result back with t.copy_(c) where the call writes into it")
        return None

    def _describe(self, what, tensors, reduce_op=None, root=None, lists=(), gathered=()):
        """``(problem, mlcomm op, description)`` of the call on this rank: the problem is an
        exception or None. ``lists``: (list, tensor) pairs, each list holding one tensor like
        ``tensor`` per rank; ``gathered``: (big, small) pairs, ``big`` holding one ``small``
        per rank."""
        problem = self._local(what, [*tensors, *(b for b, _ in gathered),
                                     *(t for lst, _ in lists for t in lst)])
        op = None
        if problem is None:
            problem = _shapes(what, self._size, lists, gathered)
        if problem is None and reduce_op is not None:
            problem, op = _op(what, reduce_op.op, tensors)
        if problem is None and root is not None and not 0 <= root < self._size:
            problem = ValueError(f"{what}: root {root} is not a rank of this group of "
                                 f"{self._size}")
        described = what + "".join(f" {t.dtype} {tuple(t.shape)}" for t in tensors) + \
            (f" {op}" if op else "") + (f" root {root}" if root is not None else "")
        return problem, op, described

    def _compare(self, what, described, problem):
        """Raise ``problem`` on this rank, or the difference between the ranks' calls, on
        every rank alike: one allgather of ``_ROW`` bytes a rank, each rank's checksum of
        its call (or of its problem)."""
        if self._size > 1:
            code, expected = self._code(described, problem)
            self._mine_code[0] = code
            self._gather()
            if self._code_rows.tobytes() != expected:
                self._differ(what, described, problem)
        if problem is not None:
            raise problem

    def _code(self, described, problem):
        """``(checksum, every rank's checksums as bytes)`` of the call ``described``, or of
        ``problem``, as the ranks that agree gather them."""
        known = self._codes.get(described) if problem is None else None
        if known is None:
            code = zlib.crc32((described if problem is None else str(problem)).encode())
            known = code, np.full(self._size, code, np.int64).tobytes()  # every rank's
            if problem is None and len(self._codes) < _KEEP:
                self._codes[described] = known
        return known

    def _differ(self, what, described, problem):
        """Raise how the ranks' calls differ, or which ranks met a problem (this rank's own
        problem where it met one): the comparison's checksums differed (collective)."""
        everyone = self._check_comm.allgather(
            (described, None if problem is None else f"{type(problem).__name__}: {problem}"))
        raise_differences(everyone, problem, what=what, failed=RuntimeError,
                          hint="; call the same collectives in the same order on every "
                               "rank, with tensors of the same shapes and dtypes and the "
                               "same op and root")

    def _go(self, op_type, described, problem, calls, outputs, async_op, after=None,
            **options):
        """Compare the call across the ranks and run its mlcomm ``calls`` (``(collective,
        sendbuf, recvbuf, op, root)``), then ``after()``: blocking, or started on the
        progress thread. A started call whose description this rank has run before is
        compared there too, first, so that it returns at once; any other is compared here,
        after the calls started before it (a first call may agree on ``auto``'s choice)."""
        what = described.split(" ", 1)[0]
        check = partial(self._compare, what, described, problem)
        self._seq += 1
        info = WorkInfo(op_type, self._seq, sum(t.numel() * t.element_size() for t in outputs),
                        time.perf_counter(), 0.0, 0.0) if self._hooks else None
        known = async_op and problem is None and described in self._seen
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


def _op(what, kind, tensors):
    """``(problem, mlcomm op)`` for torch's reduce op ``kind`` (a ``RedOpType``) on
    ``tensors``."""
    name = _OPS.get(kind)
    if name is None:
        return NotImplementedError(
            f"{what}: the mlcomm backend has no {kind}; for PREMUL_SUM multiply the tensor "
            f"by the factor and use ReduceOp.SUM"), None
    if tensors and tensors[0].dtype == torch.bool:
        name = _BOOL_OPS.get(name, name)
    for t in tensors:
        try:
            check_op(as_array(t, "tensor").dtype, name)
        except (TypeError, ValueError) as exc:
            return type(exc)(f"{what} with ReduceOp.{kind.name} on {t.dtype}: {exc}"), None
    return None, name


def _reduce_rows(rows, op, out):
    """``out[:] =`` the arrays ``rows`` (one per rank) reduced in rank order with mlcomm's
    ``op``: the same bits on every rank."""
    if op in ("min", "max") and out.dtype.kind == "f":  # IEEE min/max: mlcomm's kernels
        acc = rows[0].copy()
        for row in rows[1:]:
            reduce_into(acc, np.ascontiguousarray(row), op)
        out[...] = acc
        return
    ufunc = OP_TABLE[op].ufunc
    ufunc(rows[0], rows[1], out=out)
    for row in rows[2:]:
        ufunc(out, row, out=out)
    if op == "avg":
        finalize(out, op, len(rows))


def _shapes(what, size, lists, gathered):
    """The problem, or None: whether the per-rank lists and gathered tensors fit."""
    for lst, t in lists:
        if len(lst) != size or any(x.numel() != t.numel() or x.dtype != t.dtype for x in lst):
            return ValueError(f"{what}: the list must hold {size} tensors (one per rank) of "
                              f"{t.numel()} x {t.dtype}, as the single tensor")
    for big, small in gathered:
        if big.numel() != size * small.numel() or big.dtype != small.dtype:
            return ValueError(f"{what}: the large tensor must hold {size} x {small.numel()} "
                              f"elements of {small.dtype} (one block per rank), got "
                              f"{big.numel()} x {big.dtype}")
    return None


def _error_of(request):
    try:
        request.wait()
    except Exception as exc:
        return exc
    return None


def _settling(call, future):
    """``call()``, then its outcome into ``future``."""
    try:
        call()
    except Exception as exc:
        future.set_exception(exc)
        raise
    future.set_result([])


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
}


def create(backend_options, options=None):
    """torch's creator of the backend (``extended_api=True``): the process group of the
    ranks in ``backend_options`` (``_DistributedBackendOptions``)."""
    from .rendezvous import communicator
    if options is not None and not isinstance(options, Options):
        raise TypeError(f"pg_options of the mlcomm backend: pass mlcomm.torch.Options(...), "
                        f"not {type(options).__name__}")
    return ProcessGroupMlcomm(communicator(backend_options), options)
