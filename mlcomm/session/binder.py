"""Binding a call: its checks, ``auto``'s choice, its plan and binding, in one place.

:func:`bind` takes a :class:`~mlcomm.session.call.Call` and returns a
:class:`~mlcomm.session.bound.BoundCall`, doing on the way, in order:

1. the call's session (created collectively on a communicator's first call);
2. the local checks (:meth:`Call.check`), and with ``validate`` the comparison of the call
   across the ranks (:mod:`.compare`);
3. ``auto``'s choice, agreed across the ranks, and on a size's first call its trial, timed
   on the call's own host arrays (:mod:`.auto`);
4. the plan (:meth:`Session.plan`) and its binding, from the binding cache (:mod:`.cache`)
   or, for a persistent handle, its own; or the MPI library's own call.

A device call binds its host copies at each run: straight to a CUDA-aware MPI, else
staged through pinned host memory (:mod:`mlcomm.buffers.staging`), whose host calls are
bound here too and repeat through the memo.
"""

from __future__ import annotations

from functools import partial

import numpy as np
from mpi4py import MPI

from .. import config, kernels
from ..algorithms import AUTO, MPI_NATIVE
from ..buffers import device, gpu, staging, tensors
from ..buffers.device import DeviceVector
from ..runtime.liveness import RankLost
from ..transport.native import native_call
from . import cache, memo
from .auto import agreed_choice, plan_call
from .bound import BoundCall, fresh, remembers
from .call import SIGNATURE, Call, overlap
from .compare import compare_calls
from .lifetime import session_of
from .memo import MISS

__all__ = ["bind", "VALIDATE", "validating"]

#: MLCOMM_VALIDATE=1 checks every call across ranks (read once, at import)
VALIDATE = config.validate()


def validating(validate) -> bool:
    """Whether to compare the call across ranks: ``validate``, else ``MLCOMM_VALIDATE=1``."""
    return VALIDATE if validate is None else bool(validate)


def bind(call, own=False) -> BoundCall:
    """``call`` bound (see the module docstring); ``own``: a binding outside the cache, for
    a persistent handle."""
    session = session_of(call.comm, call.collective)
    if session.lost is not None:
        raise RankLost(session.lost, f"{call.collective} on a communicator that lost them")
    if call.on_device:
        return _device(session, call)
    return _host(session, call, own)


def _keeps(call) -> bool:
    """Whether the memo may keep the call for its repeats: no check across ranks asked, and
    host arrays, tensors, IN_PLACE or no output."""
    send, recv = call.sendbuf, call.recvbuf
    return call.validate is None and not VALIDATE and (
        type(send) is np.ndarray or send is MPI.IN_PLACE or tensors.is_tensor(send)) and (
        type(recv) is np.ndarray or recv is None or tensors.is_tensor(recv))


def _host(session, call, own=False, own_output=False) -> BoundCall:
    """A call on host buffers (or device vectors, for a CUDA-aware MPI), bound; ``own``: to
    a binding of its own; ``own_output``: a small all-reduce with no output given, to an
    output of its own, whose copy each run returns (:data:`.bound.FRESH_BYTES`)."""
    session.before_planning()
    validate = validating(call.validate)
    error = None
    try:
        call.check(session.size, session.rank, session.default_algorithm,
                   session.checked_options)
    except (TypeError, ValueError) as exc:
        if not validate:
            raise
        error = exc
    if validate:
        compare_calls(session, SIGNATURE, None if error is not None else call.signature(),
                      error)
    inp, out, name, options = call.inp, call.out, call.name, call.options
    dtype, opname, collective = out.dtype, call.opname, call.collective
    held = None  # the binding whose output holds this call's result
    # the root and the counts, as the plan takes them
    placed = dict(call.counts, **({"root": call.root} if call.root else {}))
    if name == AUTO:  # an all-reduce's trial runs on its host arrays, the others' on their shape
        host = collective == "allreduce" and type(inp) is np.ndarray and \
            type(out) is np.ndarray
        name, options = agreed_choice(session, collective, call.shared_count(session.size),
                                      dtype, opname,
                                      device=isinstance(out, DeviceVector),
                                      buffers=(inp, out) if host else None,
                                      shape=(call.count, inp.size, out.size, call.offset,
                                             placed))
        held, session.held_result = session.held_result, None
    if name == MPI_NATIVE and isinstance(out, DeviceVector):
        run, binding = partial(native_call, collective, session.comm, inp, out, opname,
                               call.root, overlap=overlap, copy=_copy, buffer=_native_buffer,
                               empty=lambda v: v.empty(v.size)), None
    else:
        if placed:
            options = dict(options, **placed)
        plan = plan_call(session, collective, name, call.count, dtype, opname, options,
                        call.offset)
        binding = session.own_binding(plan, inp, out) if own else \
            cache.binding(session, plan, inp, out)
        # the trial's last run was this call's, on this binding: its output holds the result
        run = _nothing if binding is held else binding.run
    finish = None
    if opname == "avg" and (collective != "reduce" or session.rank == call.root):
        finish = partial(_finalize, out, opname, session.size)
    result = call.result(session.rank)
    keeps, own_out, later = not own and _keeps(call), None, None
    if keeps and fresh(collective, call.sendbuf, call.recvbuf, out):
        if own_output:
            own_out = result
        else:  # a repeat on this input binds it to an output of its own
            later = partial(_own_output, session)
    keeps = keeps and (own_out is not None or later is not None or
                       remembers(result, call.sendbuf, call.recvbuf))
    return BoundCall(session, call, run, binding, finish, result, fresh=own_out, keeps=keeps,
                     later=later)


def _nothing():
    """The run of a call whose output holds its result already."""


def _own_output(session, collective, sendbuf, op, comm, algorithm, root, options):
    """The repeat of a small all-reduce into a new array, bound to an output of its own."""
    return _host(session, Call(collective, sendbuf, None, op, comm, algorithm, root, None,
                               options), own_output=True).run()


def _device(session, call) -> BoundCall:
    """A call on device arrays, bound: each run hands them to a CUDA-aware MPI, else
    stages them through pinned host memory. Either way the result lands on the device.
    ``dtype=`` reinterprets raw device buffers (bfloat16 as uint16); ``stream=`` is the
    stream that produced the data, on which the direct path also launches its kernels."""
    dtype, stream = call.options.pop("dtype", None), call.options.pop("stream", None)
    validate = validating(call.validate)
    try:
        bufs = device.UserBuffers(call.sendbuf, call.recvbuf, dtype=dtype, stream=stream)
    except (TypeError, ValueError) as exc:
        if validate:  # the other ranks wait in the comparison across ranks: fail them too
            compare_calls(session, SIGNATURE, None, exc)
        raise
    has_result = call.collective not in ("reduce", "gather", "gatherv") or \
        session.rank == call.root

    def run():
        if gpu.cuda_aware():
            send, recv, result = device.direct(bufs)
            direct = _host(session, call.on(send, recv))
            direct.run()
            return result(direct.call.out) if has_result else None
        return staging.run(call.collective, bufs, partial(_staged, session, call),
                           has_result=has_result, whole=validate)
    return BoundCall(session, call, run, returns=True)


def _staged(session, call, host_send, host_recv):
    """A staged device call's host call: staging reuses its host buffers, so its repeats
    run bound, through the memo."""
    if call.validate is None and not VALIDATE:
        bound = memo.find(host_send, host_recv, call.algorithm)
        if bound is not None:
            result = bound.repeat(call.collective, host_send, host_recv, call.op,
                                  call.comm_given, call.algorithm, call.root, call.options)
            if result is not MISS:
                return result
    return _host(session, call.on(host_send, host_recv)).run()


def _finalize(out, op, nranks):
    """Turn a sum into the average for op avg (every other op is left as is)."""
    if isinstance(out, DeviceVector):
        kernels.finalize(out.raw, op, nranks, stream=out.stream, dtype=out.dtype)
        out.synchronize()
    else:
        kernels.finalize(out, op, nranks)


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
