"""MPI executor: run a plan over an mpi4py communicator.

Transfers travel as bytes over persistent requests (``Send_init``/``Recv_init``
+ ``Startall``) bound once per plan and buffer pair; the reduction is ours
(``mlcomm.kernels``), so dtypes MPI cannot reduce work too.  mlcomm talks on
a duplicate of the user's communicator, so its messages never meet theirs.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import weakref
from functools import lru_cache

import numpy as np
from mpi4py import MPI
from mpi4py.util.dtlib import from_numpy_dtype

from . import kernels
from .device import DeviceVector
from .kernels import kernel_for
from .kernels.numpy_backend import bare_kernel3
from .plan import PlanCache

__all__ = ["IN_PLACE", "private_comm", "plan_cache", "bind_plan", "raise_error", "native_call",
           "native_dtype_ok", "finalize",
           "mpi_op", "op_name", "is_in_place", "OP_NAMES"]

IN_PLACE = MPI.IN_PLACE

_MPI_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "min": MPI.MIN, "max": MPI.MAX,
            "band": MPI.BAND, "bor": MPI.BOR, "bxor": MPI.BXOR,
            "land": MPI.LAND, "lor": MPI.LOR, "avg": MPI.SUM}
OP_NAMES = tuple(_MPI_OPS)
_TAG = 0


def op_name(op) -> str:
    """Normalise an op given by name or as an ``MPI.Op`` constant."""
    if isinstance(op, str) and op.lower() in _MPI_OPS:
        return op.lower()
    if isinstance(op, MPI.Op):
        for name, const in _MPI_OPS.items():
            if name != "avg" and op == const:
                return name
    raise ValueError(f"op={op!r} is not supported; use one of {', '.join(OP_NAMES)} "
                     f"or the matching MPI.Op constant")


def mpi_op(name: str) -> MPI.Op:
    return _MPI_OPS[name]


def is_in_place(buf) -> bool:
    return buf is MPI.IN_PLACE


class _Private:
    """What mlcomm keeps per user communicator: its duplicate, plan cache and auto choices,
    and its persistent handles (their plans are their own, outside the cache)."""

    def __init__(self, comm):
        self.comm = comm.Dup()
        self.plans = PlanCache()
        self.choices = {}
        self.handles = weakref.WeakSet()

    def free_bindings(self):
        for plan in self.plans.plans.values():
            plan.free_bindings()
        for handle in list(self.handles):
            handle.release()

    def free(self):
        self.free_bindings()
        self.plans.plans.clear()
        if not MPI.Is_finalized():
            self.comm.Free()


def _delete(comm, keyval, private):
    private.free()


_KEYVAL = MPI.Comm.Create_keyval(delete_fn=_delete)
_ALL: list = []


def private_comm(comm) -> _Private:
    """The duplicate of ``comm`` that mlcomm uses (collective on first use)."""
    private = comm.Get_attr(_KEYVAL)
    if private is None:
        private = _Private(comm)
        comm.Set_attr(_KEYVAL, private)
        _ALL.append(private)
    return private


@atexit.register
def _free_all():
    if MPI.Is_initialized() and not MPI.Is_finalized():
        for private in _ALL:
            private.free_bindings()


def plan_cache(comm) -> PlanCache:
    return private_comm(comm).plans


class _Binding:
    """A plan bound to host arrays: sliced views, persistent requests, kernels."""

    def __init__(self, comm, plan, inp, out, op, scratch=None):
        self.inp, self.out = inp, out
        self.key = _buffer_key(inp, out)
        self.live = True  # until freed
        if scratch is None:
            scratch = self._new_scratch(out, plan.schedule.scratch_count)
        typed = {"input": inp, "output": out, "scratch": scratch}
        view = lambda s: typed[s[0]][s[1]:s[2]]
        message = lambda t: self._message(typed[t[1]][t[2]:t[3]])
        self.steps, self.requests = [], []
        for sends, recvs, ops in plan.steps:
            reqs = [comm.Recv_init(message(r), r[0], _TAG) for r in recvs]
            reqs += [comm.Send_init(message(s), s[0], _TAG) for s in sends]
            calls = []
            for is_copy, dst, src, left in ops:
                d = view(dst)
                calls += self._local_ops(is_copy, d, view(src), d if left == dst else view(left),
                                         op)
            self.steps.append((reqs, calls))
            self.requests += reqs
        self.scratch = scratch
        #: a no-argument call running the plan; it returns None or an MPI error code
        self.launch = self.run
        self.program = self._compiled(plan, op)
        if self.program is not None:
            from .compiled import launcher
            self.launch = launcher(*self.program[:2])
            self.run = self._run_compiled

    @staticmethod
    def _new_scratch(out, count):
        return np.empty(count, out.dtype)

    @staticmethod
    def _message(view):
        return [view.view(np.uint8), MPI.BYTE]

    @staticmethod
    def _local_ops(is_copy, d, s, first, op):
        """``[(fn, args), ...]`` doing one Copy, or one Reduce ``d = first (op) s``."""
        if is_copy:
            return [] if _same(d, s) else [(np.copyto, (d, s))]
        if not d.size:
            return []
        if first is d or _same(d, first):
            return [(kernel_for(d, s, op), (d, s))]
        if not np.may_share_memory(d, s):  # copy the left operand in, then reduce
            return [(np.copyto, (d, first)), (kernel_for(d, s, op), (d, s))]
        return [(bare_kernel3(op), (d, first, s))]

    def _compiled(self, plan, op):
        return _compile(plan, self.inp, self.out, self.scratch, op, self.requests)

    def run(self):
        startall, waitall = MPI.Prequest.Startall, MPI.Request.Waitall
        with np.errstate(all="ignore"):
            for reqs, calls in self.steps:
                if reqs:
                    startall(reqs)
                    waitall(reqs)
                for fn, args in calls:
                    fn(*args)

    def _run_compiled(self):
        raise_error(self.launch())

    def free(self):
        if not MPI.Is_finalized():
            for req in self.requests:
                if req:
                    req.Free()
        self.requests = []
        self.program = None
        self.live = False


#: MLCOMM_EXECUTOR=python turns the compiled executor off (read once, at import)
_USE_COMPILED = os.environ.get("MLCOMM_EXECUTOR", "compiled").strip().lower() != "python"


def _compile(plan, inp, out, scratch, op, requests):
    """The compiled executor's arguments for this binding, or None to stay in Python.

    It takes plans whose reductions are small (large ones use the parallel kernels) on dtypes
    and ops it has loops for, and buffers that no op reads and writes partially overlapping.
    """
    if not _USE_COMPILED:
        return None
    from . import compiled  # imports Numba: only once a plan is bound
    from .kernels.numba_backend import kernel_dtype, num_threads
    if not (compiled.available() and compiled.supports(out.dtype, op)):
        return None
    largest = max((dst[2] - dst[1] for _, _, ops in plan.steps for _, dst, *_ in ops), default=0)
    if largest * out.dtype.itemsize >= kernels.NUMBA_MIN_BYTES and num_threads() > 1:
        return None
    where = _memory(inp, out, scratch)
    if not all(a.flags.aligned for a in (inp, out)) or _partial_overlaps(plan, where):
        return None
    kdt = kernel_dtype(out.dtype, op)
    request_bytes, status_bytes = MPI._sizeof(MPI.Request), MPI._sizeof(MPI.Status)
    handles = np.empty(max(len(requests), 1) * request_bytes, np.uint8)
    for i, req in enumerate(requests):
        handles[i * request_bytes:(i + 1) * request_bytes] = np.frombuffer(
            ctypes.string_at(MPI._addressof(req), request_bytes), np.uint8)
    statuses = np.empty(max(len(requests), 1) * status_bytes, np.uint8)
    vectors = [a.view(kdt) for a in (inp, out, scratch)]
    address = lambda a: a.__array_interface__["data"][0]
    header = [request_bytes, address(handles), address(statuses), address(vectors[0]),
              vectors[0].size, address(vectors[2]), vectors[2].size, compiled.OPCODES[op]]
    program = compiled.encode(plan.steps, _early_starts(plan, where),
                              lambda r1, r2: where(r1) == where(r2), header,
                              out.dtype.itemsize // kdt.itemsize)
    # the program holds addresses: the binding keeps these arrays alive with it
    return program, vectors[1], handles, statuses, vectors


def _memory(inp, out, scratch):
    """``region -> (first byte, last byte + 1)`` in this process's address space."""
    base = {name: a.__array_interface__["data"][0]
            for name, a in (("input", inp), ("output", out), ("scratch", scratch))}
    size = out.dtype.itemsize
    return lambda r: (base[r[0]] + r[1] * size, base[r[0]] + r[2] * size)


def _meet(a, b) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def _partial_overlaps(plan, where) -> bool:
    """True when some op's source and destination overlap without being the same elements."""
    for _, _, ops in plan.steps:
        for _, dst, *sources in ops:
            d = where(dst)
            if any(_meet(d, s) and d[0] != s[0] for s in map(where, sources)):
                return True
    return False


def _early_starts(plan, where) -> list:
    """Per step: may its transfers start before the previous step's ops run?

    Yes when its receives touch nothing those ops read or write and its sends read
    nothing they write; then the ops overlap the transfers (segmented schedules).
    """
    early = [False]
    for (_, _, ops), (sends, recvs, _) in zip(plan.steps, plan.steps[1:]):
        written = [where(op[1]) for op in ops]
        touched = written + [where(r) for op in ops for r in op[2:]]
        early.append(not any(_meet(where(t[1:]), w) for t in recvs for w in touched)
                     and not any(_meet(where(t[1:]), w) for t in sends for w in written))
    return early


def _same(a, b) -> bool:
    """True when two views are the same elements."""
    return a.__array_interface__["data"][0] == b.__array_interface__["data"][0] \
        and a.size == b.size


class _DeviceBinding(_Binding):
    """A plan bound to device vectors for a CUDA-aware MPI: device views and scratch, GPU
    kernels on the vectors' stream, which is synchronised before MPI touches their memory."""

    @staticmethod
    def _new_scratch(out, count):
        return out.empty(count)

    @staticmethod
    def _message(view):
        return [view.bytes(), MPI.BYTE]

    @staticmethod
    def _local_ops(is_copy, d, s, first, op):
        if is_copy:
            return [] if d.overlaps(s) else [(DeviceVector.copy_from, (d, s))]
        if not d.size:
            return []
        kernel = kernel_for(d.raw, s.raw, op, stream=d.stream, dtype=d.dtype)
        if first is d:
            return [(kernel, (d.raw, s.raw))]
        if not d.overlaps(s):  # copy the left operand in, then reduce
            return [(DeviceVector.copy_from, (d, first)), (kernel, (d.raw, s.raw))]
        tmp = d.empty(d.size)  # s is d: reduce into a temporary, keeping first on the left
        return [(DeviceVector.copy_from, (tmp, first)), (kernel, (tmp.raw, s.raw)),
                (DeviceVector.copy_from, (d, tmp))]

    def _compiled(self, plan, op):
        return None  # the compiled loop runs on host memory only

    def run(self):
        startall, waitall = MPI.Prequest.Startall, MPI.Request.Waitall
        launched = False  # kernels or copies queued on the stream since the last wait
        for reqs, calls in self.steps:
            if reqs:
                if launched:
                    self.out.synchronize()
                    launched = False
                startall(reqs)
                waitall(reqs)
            for fn, args in calls:
                fn(*args)
                launched = True
        if launched:
            self.out.synchronize()


def _buffer_key(inp, out):
    if isinstance(out, DeviceVector):
        return (inp.ptr, out.ptr, inp.size, out.size, inp.dtype.str, out.stream)
    return (inp.__array_interface__["data"][0], out.__array_interface__["data"][0],
            inp.size, out.size, inp.dtype.str)


def raise_error(code):
    """Raise the MPI error ``code`` that a binding's ``launch`` returned (0 or None: no error)."""
    if code:
        raise MPI.Exception(code)


#: bindings kept per plan, so that calls alternating between a few buffers of one shape
#: (gradient buckets; in and out of place) stay bound; the host ones share one scratch
BINDINGS_PER_PLAN = 4


def bind_plan(comm, plan, inp, out, op: str) -> _Binding:
    """Return ``plan`` bound to 1-D contiguous ``inp`` and ``out`` (the same array when in place):
    NumPy arrays, or device vectors (:class:`mlcomm.device.DeviceVector`) on a CUDA-aware MPI.

    The plan keeps its last :data:`BINDINGS_PER_PLAN` bindings; binding the same buffers again
    reuses one.  Calls run one at a time, so the host bindings of a plan share its scratch.
    """
    key = _buffer_key(inp, out)
    bindings = plan.bindings
    bound = bindings.get(key)
    if bound is not None and bound.live:
        bindings.move_to_end(key)
        return bound
    if isinstance(out, DeviceVector):
        bound = _DeviceBinding(comm, plan, inp, out, op)
    else:
        shared = next((b.scratch for b in bindings.values() if type(b) is _Binding and b.live),
                      None)
        bound = _Binding(comm, plan, inp, out, op, shared)
    bindings[key] = bound
    bindings.move_to_end(key)
    if len(bindings) > BINDINGS_PER_PLAN:
        bindings.popitem(last=False)[1].free()
    return bound


def finalize(out, op, nranks):
    """Turn a sum into the average for op avg (every other op is left as is)."""
    if isinstance(out, DeviceVector):
        kernels.finalize(out.raw, op, nranks, stream=out.stream, dtype=out.dtype)
        out.synchronize()
    else:
        kernels.finalize(out, op, nranks)


@lru_cache(maxsize=None)
def native_dtype_ok(dtype) -> bool:
    """True when the MPI library has a datatype for ``dtype`` (bfloat16 has none)."""
    try:
        from_numpy_dtype(dtype)
    except (ValueError, KeyError, TypeError):
        return False
    return True


def native_call(collective, comm, inp, out, op, root=0):
    """Run the MPI library's own collective on NumPy buffers (or device vectors, through a
    CUDA-aware MPI).

    Overlapping ``inp`` and ``out`` mean in place, in MPI's sense for each collective.
    """
    in_place = _overlap(inp, out)
    if collective == "bcast" and comm.Get_rank() == root and not in_place:
        _copy(out, inp)
    inp, out = _native_buffer(inp), _native_buffer(out)
    send = MPI.IN_PLACE if in_place else inp
    if collective == "allreduce":
        comm.Allreduce(send, out, mpi_op(op))
    elif collective == "reduce_scatter":  # in place: the p blocks are in inp, the result in its first
        comm.Reduce_scatter_block(send, inp if in_place else out, mpi_op(op))
    elif collective == "allgather":
        comm.Allgather(send, out)
    elif collective == "bcast":
        comm.Bcast(out, root)
    elif collective == "reduce":
        if in_place and comm.Get_rank() != root:
            send = inp
        comm.Reduce(send, out, mpi_op(op), root)
    else:
        raise ValueError(collective)


def _overlap(a, b):
    return a.overlaps(b) if isinstance(a, DeviceVector) else np.may_share_memory(a, b)


def _copy(dst, src):
    if isinstance(dst, DeviceVector):
        dst.copy_from(src)
        dst.synchronize()
    else:
        dst[...] = src


def _native_buffer(buf):
    """A NumPy array as it is; a device vector as [device array, its dtype's type code]."""
    if isinstance(buf, DeviceVector):
        return [buf.raw, buf.dtype.char]
    return buf
