"""MPI executor: run a plan over an mpi4py communicator.

Transfers travel as bytes over persistent requests (``Send_init``/``Recv_init``
+ ``Startall``) bound once per plan and buffer pair; the reduction is ours
(``mlcomm.kernels``), so dtypes MPI cannot reduce work too.  mlcomm talks on
a duplicate of the user's communicator, so its messages never meet theirs.
"""

from __future__ import annotations

import atexit

import numpy as np
from mpi4py import MPI

from . import kernels
from .device import DeviceVector
from .kernels import kernel_for
from .plan import PlanCache

__all__ = ["IN_PLACE", "private_comm", "plan_cache", "run_plan", "native_call", "finalize",
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
    """What mlcomm keeps per user communicator: its duplicate, plan cache and auto choices."""

    def __init__(self, comm):
        self.comm = comm.Dup()
        self.plans = PlanCache()
        self.choices = {}

    def free(self):
        for plan in self.plans.plans.values():
            if plan.bound is not None:
                plan.bound.free()
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
            for plan in private.plans.plans.values():
                if plan.bound is not None:
                    plan.bound.free()


def plan_cache(comm) -> PlanCache:
    return private_comm(comm).plans


class _Binding:
    """A plan bound to host arrays: sliced views, persistent requests, kernels."""

    def __init__(self, comm, plan, inp, out, op):
        self.inp, self.out = inp, out
        self.key = _buffer_key(inp, out)
        scratch = self._new_scratch(out, plan.schedule.scratch_count)
        typed = {"input": inp, "output": out, "scratch": scratch}
        view = lambda s: typed[s[0]][s[1]:s[2]]
        message = lambda t: self._message(typed[t[1]][t[2]:t[3]])
        self.steps, self.requests = [], []
        for sends, recvs, ops in plan.steps:
            reqs = [comm.Recv_init(message(r), r[0], _TAG) for r in recvs]
            reqs += [comm.Send_init(message(s), s[0], _TAG) for s in sends]
            calls = [self._local_op(is_copy, view(dst), view(src), op)
                     for is_copy, dst, src in ops]
            self.steps.append((reqs, [call for call in calls if call is not None]))
            self.requests += reqs
        self.scratch = scratch

    @staticmethod
    def _new_scratch(out, count):
        return np.empty(count, out.dtype)

    @staticmethod
    def _message(view):
        return [view.view(np.uint8), MPI.BYTE]

    @staticmethod
    def _local_op(is_copy, d, s, op):
        """``(fn, d, s)`` doing one Copy or Reduce, or None when there is nothing to do."""
        if is_copy:
            return None if np.shares_memory(d, s) else (np.copyto, d, s)
        return (kernel_for(d, s, op), d, s) if d.size else None

    def run(self):
        startall, waitall = MPI.Prequest.Startall, MPI.Request.Waitall
        with np.errstate(all="ignore"):
            for reqs, calls in self.steps:
                if reqs:
                    startall(reqs)
                    waitall(reqs)
                for fn, d, s in calls:
                    fn(d, s)

    def free(self):
        if not MPI.Is_finalized():
            for req in self.requests:
                if req:
                    req.Free()
        self.requests = []


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
    def _local_op(is_copy, d, s, op):
        if is_copy:
            return None if d.overlaps(s) else (DeviceVector.copy_from, d, s)
        if not d.size:
            return None
        return kernel_for(d.raw, s.raw, op, stream=d.stream, dtype=d.dtype), d.raw, s.raw

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
            for fn, d, s in calls:
                fn(d, s)
                launched = True
        if launched:
            self.out.synchronize()


def _buffer_key(inp, out):
    if isinstance(out, DeviceVector):
        return (inp.ptr, out.ptr, inp.size, out.size, inp.dtype.str, out.stream)
    return (inp.__array_interface__["data"][0], out.__array_interface__["data"][0],
            inp.size, out.size, inp.dtype.str)


def run_plan(comm, plan, inp, out, op: str) -> None:
    """Run ``plan`` on 1-D contiguous ``inp`` and ``out`` (the same array when in place):
    NumPy arrays, or device vectors (:class:`mlcomm.device.DeviceVector`) on a CUDA-aware MPI."""
    bound = plan.bound
    # the same array objects hold the same memory (the binding's reference pins it)
    if bound is None or not (bound.inp is inp and bound.out is out) \
            and bound.key != _buffer_key(inp, out):
        if bound is not None:
            bound.free()
        binding = _DeviceBinding if isinstance(out, DeviceVector) else _Binding
        plan.bound = bound = binding(comm, plan, inp, out, op)
    bound.run()


def finalize(out, op, nranks):
    """Turn a sum into the average for op avg (every other op is left as is)."""
    if isinstance(out, DeviceVector):
        kernels.finalize(out.raw, op, nranks, stream=out.stream, dtype=out.dtype)
        out.synchronize()
    else:
        kernels.finalize(out, op, nranks)


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
