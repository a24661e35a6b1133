"""The library API: validate and normalise buffers, pick the algorithm, run its plan.

Every argument error is raised here, before any message is sent.
"""

from __future__ import annotations

import weakref
from functools import lru_cache, partial

import numpy as np
from mpi4py import MPI

from . import config, kernels
from .algorithms import AUTO, COLLECTIVES, MPI_NATIVE
from .buffers import device, gpu, staging, tensors
from .buffers.device import DeviceVector
from .runtime.progress import Request
from .session import (BOUND_CALLS, LAST_CALL, MISS, BoundCall, call_key, differing_calls,
                      remembers, runner)
from .session import get as session_of
from .session.auto import agreed_choice, plan_for, requested
from .transport.mpi.names import op_name
from .transport.native import native_call, native_dtype_ok, supports

__all__ = ["allreduce", "iallreduce", "istart", "allreduce_init", "Persistent", "Request",
           "reduce_scatter", "allgather", "bcast", "reduce", "IN_PLACE"]

IN_PLACE = MPI.IN_PLACE


def is_in_place(buf) -> bool:
    return buf is MPI.IN_PLACE


def _comm(comm):
    comm = MPI.COMM_WORLD if comm is None else comm
    if isinstance(comm, MPI.Comm) and comm == MPI.COMM_NULL:
        raise ValueError("comm is MPI.COMM_NULL; pass a valid communicator")
    if not isinstance(comm, MPI.Intracomm):
        raise TypeError(f"comm must be an mpi4py intracommunicator, got {type(comm).__name__}; "
                        f"use MPI.COMM_WORLD, comm.Split(...) or an Intercomm's Merge()")
    return comm


def _array(buf, name, writable=False):
    """View ``buf`` as a 1-D NumPy array without copying; reject what MPI would mangle."""
    if isinstance(buf, DeviceVector):  # already flat, contiguous and checked
        return buf
    arr = buf if isinstance(buf, np.ndarray) else None
    if arr is None and tensors.is_tensor(buf):
        arr = tensors.as_array(buf, name)
    if arr is None:
        try:
            arr = np.frombuffer(buf, dtype=np.dtype(memoryview(buf).format))
        except TypeError:
            if writable:
                raise TypeError(f"{name} must be a writable buffer such as a NumPy array, "
                                f"got {type(buf).__name__}") from None
            arr = np.asarray(buf)
    if not arr.flags.c_contiguous:
        raise ValueError(f"{name} is not C-contiguous; pass np.ascontiguousarray({name})")
    if writable and not arr.flags.writeable:
        raise ValueError(f"{name} is read-only; pass a writable array")
    return arr if arr.ndim == 1 else arr.reshape(-1)


def _check_options(collective, algorithm, options):
    if not options:
        return {}
    if algorithm == AUTO:
        raise TypeError(f"options {sorted(options)} need an explicit algorithm, not 'auto'")
    known = COLLECTIVES[collective][algorithm].options
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise TypeError(f"algorithm {algorithm!r} takes no option {unknown}; "
                        f"its options are {sorted(known) or 'none'}")
    return options


#: the fields of a call's signature that validate=True compares across the ranks
_SIGNATURE = ("collective", "algorithm", "count", "dtype", "op", "root", "options")


def _validate_across_ranks(session, signature, error):
    """Compare call signatures over ranks; raise the same error on every rank on mismatch
    (once the started calls are complete, as :meth:`~mlcomm.session.Session.agree`)."""
    session.wait_started()
    session.watch.barrier(session.comm, "validate=True's comparison of the calls")
    everyone = session.comm.allgather((signature, None if error is None else str(error)))
    failed = {r: e for r, (_, e) in enumerate(everyone) if e is not None}
    if failed:
        if error is not None:
            raise error
        raise ValueError("mlcomm: the call failed on ranks " + ", ".join(
            f"{r} ({e})" for r, e in sorted(failed.items())))
    differ = differing_calls([s for s, _ in everyone], _SIGNATURE)
    if differ:
        raise ValueError(differ)


#: MLCOMM_VALIDATE=1 checks every call across ranks (read once, at import)
_VALIDATE = config.validate()


def _run(collective, sendbuf, recvbuf, op, comm, algorithm, root, validate, options):
    """Run one collective call; return what the public function returns."""
    result = _repeat(collective, sendbuf, recvbuf, op, comm, algorithm, root, validate, options)
    if result is not MISS:
        return result
    if (type(sendbuf) is not np.ndarray and gpu.is_device_array(sendbuf)) or (
            type(recvbuf) is not np.ndarray and gpu.is_device_array(recvbuf)):
        return _run_device(collective, sendbuf, recvbuf, op, comm, algorithm, root, validate,
                           options)
    return _run_host(collective, sendbuf, recvbuf, op, comm, algorithm, root, validate,
                     options)[0]


def _repeat(collective, sendbuf, recvbuf, op, comm, algorithm, root, validate, options):
    """What a repeat of a call seen before returns, run by its bound call; else MISS."""
    if validate is None and not _VALIDATE:
        result = LAST_CALL[0](collective, sendbuf, recvbuf, op, comm, algorithm, root, options)
        if result is MISS:
            bound = BOUND_CALLS.get(call_key(sendbuf, recvbuf, algorithm))
            if bound is not None:
                result = bound.repeat(collective, sendbuf, recvbuf, op, comm, algorithm, root,
                                      options)
                if result is not MISS:
                    LAST_CALL[0] = bound.repeat
        return result
    return MISS


def _result(collective, out, sendbuf, recvbuf, rank, root):
    """What the public function returns, given the output array the plan wrote."""
    if collective == "reduce" and rank != root:
        return None
    if collective in ("allreduce", "reduce", "bcast"):
        return _shaped(out, recvbuf if collective != "bcast" else sendbuf, sendbuf)
    if recvbuf is not None and tensors.is_tensor(recvbuf):  # in place: the first block of it
        return recvbuf if out.size == recvbuf.numel() else recvbuf.detach().view(-1)[:out.size]
    if recvbuf is None and tensors.is_tensor(sendbuf):
        return tensors.like(out, out)
    return out


def _run_device(collective, sendbuf, recvbuf, op, comm, algorithm, root, validate, options):
    """Device arrays: straight to a CUDA-aware MPI, else staged through pinned host memory.

    Either way the result lands on the device. ``dtype=`` reinterprets raw device buffers
    (bfloat16 as uint16); ``stream=`` is the stream that produced the data, on which the
    direct path also launches its kernels.
    """
    dtype, stream = options.pop("dtype", None), options.pop("stream", None)
    try:
        bufs = device.UserBuffers(sendbuf, recvbuf, dtype=dtype, stream=stream)
    except (TypeError, ValueError) as exc:
        if _validating(validate):  # the other ranks wait in the check across ranks: fail them too
            _validate_across_ranks(session_of(_comm(comm), collective), None, exc)
        raise
    has_result = collective != "reduce" or _comm(comm).Get_rank() == root
    if gpu.cuda_aware():
        send, recv, result = device.direct(bufs)
        out = _run_host(collective, send, recv, op, comm, algorithm, root, validate,
                        options)[1]
        return result(out) if has_result else None
    def run_host(host_send, host_recv):  # staging reuses its host buffers: repeats run bound
        args = (collective, host_send, host_recv, op, comm, algorithm, root, validate, options)
        result = _repeat(*args)
        return _run_host(*args)[0] if result is MISS else result
    return staging.run(collective, bufs, run_host, has_result=has_result,
                       whole=_validating(validate))


def _validating(validate):
    """Whether to compare the call across ranks: ``validate``, else ``MLCOMM_VALIDATE=1``."""
    return _VALIDATE if validate is None else bool(validate)


def _run_host(collective, sendbuf, recvbuf, op, comm, algorithm, root, validate, options):
    """Run the call on host buffers (or device vectors); return ``(result, output array)``.

    A call that may repeat leaves a bound call in its session, which the next identical call
    runs.
    """
    args = (collective, sendbuf, recvbuf, op, comm, algorithm, root)
    remember = validate is None and not _VALIDATE and (
        type(sendbuf) is np.ndarray or is_in_place(sendbuf) or tensors.is_tensor(sendbuf)) and (
        type(recvbuf) is np.ndarray or recvbuf is None or tensors.is_tensor(recvbuf))
    session, out, run, binding, finish = _bind_host(*args, validate, options)
    session.wait_started()
    run()
    if finish is not None:
        finish()
    result = _result(collective, out, sendbuf, recvbuf, session.rank, root)
    if remember and remembers(result, sendbuf, recvbuf):
        session.remember_call(call_key(sendbuf, recvbuf, algorithm),
                              BoundCall(session, args, run, binding, finish, result, options))
    elif remember and _fresh(collective, sendbuf, recvbuf, result):
        # a small all-reduce into a new array: on an input seen the call before, its
        # repeats run bound to an output of their own and return a copy of it (planning and
        # binding anew cost 10-20 us a call); a new input each call binds nothing more
        if session.fresh_input() is not sendbuf:
            session.fresh_input = weakref.ref(sendbuf)
        else:
            own = np.empty_like(result)
            session, _, run, binding, finish = _bind_host(collective, sendbuf, own,
                                                          *args[3:], validate, options)
            session.remember_call(call_key(sendbuf, recvbuf, algorithm),
                                  BoundCall(session, args, run, binding, finish, None,
                                            options, fresh=own))
    return result, out


#: an all-reduce into a new array of at most this many bytes repeats bound to an output of
#: its own, copied out each call (above it, the copy costs more than planning again)
FRESH_BYTES = 64 << 10


def _fresh(collective, sendbuf, recvbuf, result) -> bool:
    """Whether a call's repeats may run bound to an output of their own (:data:`FRESH_BYTES`)."""
    return collective == "allreduce" and recvbuf is None and type(sendbuf) is np.ndarray \
        and type(result) is np.ndarray and result.nbytes <= FRESH_BYTES


def _bind_host(collective, sendbuf, recvbuf, op, comm, algorithm, root, validate, options,
               own=False):
    """Check the call and bind its plan to host buffers, without running it.

    Returns ``(session, out, run, binding, finish)``: the output array, ``run()`` (runs the
    collective), the plan's binding (None for ``mpi``) and ``finish``, None or what
    completes ``out`` after each run (avg's division). ``own`` gives a binding outside the
    session's cache (a persistent handle's).
    """
    comm = _comm(comm)
    session = session_of(comm, collective)
    session.before_planning()
    p, rank = session.size, session.rank
    validate = _validating(validate)
    signature, error, plan_args = None, None, None
    try:
        plan_args = _prepare(collective, sendbuf, recvbuf, op, session, algorithm, root, options)
        inp, out, count, opname, name, options, alias = plan_args
        signature = (collective, name, count, out.dtype.str, opname, root, sorted(options.items()))
    except (TypeError, ValueError) as exc:
        if not validate:
            raise
        error = exc
    if validate:
        _validate_across_ranks(session, signature, error)
    inp, out, count, opname, name, options, alias = plan_args
    if name == AUTO:  # an all-reduce's trial runs on its host arrays
        host = collective == "allreduce" and type(inp) is np.ndarray and \
            type(out) is np.ndarray
        name, options = agreed_choice(session, collective, count, out.dtype, opname,
                                      device=isinstance(out, DeviceVector),
                                      buffers=(inp, out) if host else None)
    if name == MPI_NATIVE and isinstance(out, DeviceVector):
        run, binding = partial(native_call, collective, session.comm, inp, out, opname, root,
                               overlap=_overlap, copy=_copy, buffer=_native_buffer,
                               empty=lambda v: v.empty(v.size)), None
    else:
        if root:
            options = dict(options, root=root)
        plan = plan_for(session, collective, name, count, out.dtype, opname, options, alias)
        binding = session.own_binding(plan, inp, out) if own else \
            session.bind(plan, inp, out)
        run = binding.run
    finish = None
    if opname == "avg" and (collective != "reduce" or rank == root):
        finish = partial(_finalize, out, opname, p)
    return session, out, run, binding, finish


def _finalize(out, op, nranks):
    """Turn a sum into the average for op avg (every other op is left as is)."""
    if isinstance(out, DeviceVector):
        kernels.finalize(out.raw, op, nranks, stream=out.stream, dtype=out.dtype)
        out.synchronize()
    else:
        kernels.finalize(out, op, nranks)


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


def _prepare(collective, sendbuf, recvbuf, op, session, algorithm, root, options):
    """Check every argument locally and return the arrays the plan runs on.

    Returns ``(inp, out, count, op, algorithm, options, alias)``; ``alias`` is where the
    input starts within the output, in elements, when they share memory (in place).
    """
    p, rank = session.size, session.rank
    name = requested(algorithm, collective, session.default_algorithm)
    opname = op_name(op) if collective not in ("allgather", "bcast") else "sum"
    if collective in ("bcast", "reduce") and not (isinstance(root, int) and 0 <= root < p):
        raise ValueError(f"root={root!r} is not a rank of this {p}-rank communicator")
    in_place = is_in_place(sendbuf)
    alias = 0
    if collective == "bcast":
        out = _array(sendbuf, "buf", writable=True)
        inp, count = out, out.size
    elif in_place:
        if recvbuf is None:
            raise ValueError("sendbuf=IN_PLACE needs recvbuf: the data to reduce in place")
        out = _array(recvbuf, "recvbuf", writable=True)
        inp = out
        if collective == "reduce_scatter":
            if out.size % p:
                raise ValueError(f"in-place reduce_scatter: recvbuf has {out.size} elements, "
                                 f"not a multiple of the {p} ranks")
            # the ring schedule reads every input block before it writes the first
            inp, out = out, out[:out.size // p]
        elif collective == "allgather":
            if out.size % p:
                raise ValueError(f"in-place allgather: recvbuf has {out.size} elements, "
                                 f"not a multiple of the {p} ranks")
            n = out.size // p
            inp, alias = out[rank * n:(rank + 1) * n], rank * n
        count = inp.size if collective != "reduce_scatter" else out.size
    else:
        inp = _array(sendbuf, "sendbuf")
        want = {"allreduce": inp.size, "reduce": inp.size, "allgather": inp.size * p,
                "reduce_scatter": inp.size // p}[collective]
        if collective == "reduce_scatter" and inp.size % p:
            raise ValueError(f"reduce_scatter: sendbuf has {inp.size} elements, not a multiple of "
                             f"the {p} ranks; pad it to {-(-inp.size // p) * p}")
        if collective == "reduce" and rank != root:
            want = 0  # only the root has a result; the schedule accumulates in its scratch
        if want == 0:
            out = _no_output(inp.dtype) if isinstance(inp, np.ndarray) else inp.empty(0)
        elif recvbuf is None:
            out = np.empty(want, inp.dtype) if isinstance(inp, np.ndarray) else inp.empty(want)
        else:
            out = _array(recvbuf, "recvbuf", writable=True)
        if out.size != want:
            raise ValueError(f"recvbuf has {out.size} elements but this {collective} needs {want} "
                             f"(sendbuf has {inp.size} on {p} ranks); pass a recvbuf of {want} "
                             f"elements or recvbuf=None")
        if out.dtype != inp.dtype:
            raise TypeError(f"recvbuf dtype {out.dtype} differs from sendbuf dtype {inp.dtype}; "
                            f"use the same dtype for both")
        count = want if collective == "reduce_scatter" else inp.size
        alias = _alias(collective, inp, out)
    if collective not in ("allgather", "bcast"):
        kernels.check_op(out.dtype, opname)
    if name == MPI_NATIVE and not supports(out.dtype, opname):
        lacks = f"no {out.dtype} datatype" if not native_dtype_ok(out.dtype) else \
            f"no {opname} on {out.dtype}"
        raise TypeError(f"algorithm='mpi' calls the MPI library, which has {lacks}; use one "
                        f"of mlcomm's algorithms (e.g. 'ring') or 'auto'")
    if options:
        _check_options(collective, name, options)
        key = (collective, name, p, out.dtype.itemsize, tuple(sorted(options.items())))
        if key not in session.checked_options:  # an empty build checks the values once
            COLLECTIVES[collective][name].build(rank, p, 0, out.dtype.itemsize, **options)
            session.checked_options.add(key)
    return inp, out, count, opname, name, options, alias


def _alias(collective, inp, out):
    """None for disjoint buffers; 0 for the same elements passed twice to an all-reduce or
    reduce (which is in place); a ValueError for any other overlap, as MPI forbids it."""
    if not inp.size or not out.size or not _overlap(inp, out):
        return None
    start = (lambda v: v.ptr) if isinstance(out, DeviceVector) else \
        (lambda a: a.__array_interface__["data"][0])
    if collective in ("allreduce", "reduce") and start(inp) == start(out) and \
            inp.size == out.size:
        return 0
    raise ValueError("sendbuf and recvbuf overlap; to work in place pass "
                     "sendbuf=mlcomm.IN_PLACE and the data as recvbuf")


@lru_cache(maxsize=None)
def _no_output(dtype):
    """One empty array per dtype, so that plans stay bound across calls."""
    return np.empty(0, dtype)


def _shaped(result, given, like):
    """The user's own output array (or tensor) when they gave one, else ``result`` shaped
    like ``like`` (a tensor when ``like`` is one)."""
    if type(given) is np.ndarray or given is not None and tensors.is_tensor(given):
        return given  # the result was written into its memory
    if tensors.is_tensor(like):
        return tensors.like(result, like)
    return result.reshape(np.shape(like)) if isinstance(like, np.ndarray) else result


def allreduce(sendbuf, recvbuf=None, op="sum", *, comm=None, algorithm=None, validate=None,
              **options):
    """Reduce ``sendbuf`` over all ranks of ``comm``; every rank gets the result.

    ``sendbuf=mlcomm.IN_PLACE`` (or ``MPI.IN_PLACE``) reduces ``recvbuf`` in
    place.  ``algorithm`` defaults to ``MLCOMM_ALGORITHM`` or ``auto``;
    ``options`` are the algorithm's (``servers=``, ``segment_bytes=`` ...).
    """
    if validate is None:  # a repeat: the call that ran last, else its bound call (see _run)
        result = LAST_CALL[0]("allreduce", sendbuf, recvbuf, op, comm, algorithm, 0, options)
        if result is not MISS:
            return result
        bound = BOUND_CALLS.get(id(sendbuf if recvbuf is None else recvbuf) + id(algorithm))
        if bound is not None:
            result = bound.repeat("allreduce", sendbuf, recvbuf, op, comm, algorithm, 0, options)
            if result is not MISS:
                LAST_CALL[0] = bound.repeat
                return result
    return _run("allreduce", sendbuf, recvbuf, op, comm, algorithm, 0, validate, options)


def iallreduce(sendbuf, recvbuf=None, op="sum", *, comm=None, algorithm=None, validate=None,
               **options) -> Request:
    """Start an all-reduce and return at once: a :class:`Request` whose ``wait()`` returns
    what :func:`allreduce` returns, and whose ``test()`` says whether it is done.

    The call is checked and planned now; it runs on the communicator's progress thread in
    the compiled loop without the GIL, after every call started on the communicator before
    it, so many may be outstanding and they complete in order. The buffers must not be
    touched until the request completes (the request keeps them alive). A blocking call on
    the same communicator waits for the started ones first.
    """
    if (type(sendbuf) is not np.ndarray and gpu.is_device_array(sendbuf)) or (
            type(recvbuf) is not np.ndarray and gpu.is_device_array(recvbuf)):
        session = session_of(_comm(comm))
        run = partial(_run_device, "allreduce", sendbuf, recvbuf, op, comm, algorithm, 0,
                      validate, dict(options))
        return session.start(run, keep=(sendbuf, recvbuf), plans=True)  # run() returns it
    return istart("allreduce", sendbuf, recvbuf, op, comm=comm, algorithm=algorithm,
                  validate=validate, **options)


def istart(collective, sendbuf, recvbuf=None, op="sum", root=0, *, comm=None, algorithm=None,
           validate=None, before=None, after=None, **options) -> Request:
    """Start any collective of :data:`~mlcomm.COLLECTIVES` on host buffers and return at
    once, as :func:`iallreduce` does: a :class:`Request` whose ``wait()`` returns what the
    blocking call (``allreduce``, ``reduce_scatter``, ``allgather``, ``bcast`` with ``buf``
    as ``sendbuf``, ``reduce``) returns.

    The progress thread calls ``before()`` first (if it raises, the collective does not run
    and ``wait()`` raises its error) and ``after(error)`` last, once the call is complete,
    with None or the exception that ``wait()`` raises."""
    args = (collective, sendbuf, recvbuf, op, comm, algorithm, root)
    session, out, run, binding, finish = _bind_host(*args, validate, options)
    result = _result(collective, out, sendbuf, recvbuf, session.rank, root)
    if before is not None or after is not None:
        run, finish = partial(_hooked, before, run, finish, after), None
    return session.start(run, finish, result, (sendbuf, recvbuf, out), binding)


def _hooked(before, run, finish, after):
    """``before()``, the collective's ``run()`` and ``finish()``, then ``after(error)``."""
    try:
        if before is not None:
            before()
        run()
        if finish is not None:
            finish()
    except BaseException as exc:
        if after is not None:
            after(exc)
        raise
    if after is not None:
        after(None)


def allreduce_init(sendbuf, recvbuf=None, op="sum", *, comm=None, algorithm=None, validate=None,
                   **options):
    """Bind an all-reduce to its buffers once, as MPI-4's ``MPI_Allreduce_init``; return a
    :class:`Persistent` whose every call runs it on what the buffers hold then.

    Collective: every rank of ``comm`` calls it with matching arguments, which are checked
    here (across ranks too with ``validate``), not on each call.  Host arrays only.
    """
    if gpu.is_device_array(sendbuf) or gpu.is_device_array(recvbuf):
        raise TypeError("allreduce_init takes host arrays; pass device arrays to "
                        "mlcomm.allreduce, which stages them or hands them to a CUDA-aware MPI")
    return Persistent("allreduce", sendbuf, recvbuf, op, comm, algorithm, 0, validate, options)


class Persistent:
    """A collective bound to its buffers: calling it runs the collective and returns the result.

    A call skips everything ``mlcomm.allreduce`` does before its plan runs: argument checks,
    the repeat lookup and its identity checks.  On an oversubscribed node that time is paid
    several times over, as the partner ranks wait for it.  The buffers must stay the arrays
    given (not resized, not re-typed) for as long as the handle is used; the handle keeps
    them alive.  Its binding is its own (no other call rebinds it) and goes when the
    communicator is freed.
    """

    __slots__ = ("binding", "buffers", "call", "finish", "request", "result", "run", "session",
                 "__weakref__")

    def __init__(self, collective, sendbuf, recvbuf, op, comm, algorithm, root, validate,
                 options):
        args = (collective, sendbuf, recvbuf, op, comm, algorithm, root)
        session, out, run, binding, finish = _bind_host(*args, validate, options, own=True)
        result = _result(collective, out, sendbuf, recvbuf, session.rank, root)
        self.session, self.binding, self.finish, self.run = session, binding, finish, run
        self.buffers = (sendbuf, recvbuf, out)
        self.result = lambda: result  # the handle owns its buffers
        self.call = runner(session, run, binding, finish, result)
        self.request = None
        session.handles.add(self)

    def __call__(self):
        """Run the collective again; return what the public call returns."""
        return self.call()

    def start(self) -> Request:
        """Start the collective on the communicator's progress thread (as
        ``MPI_Start``); :meth:`wait` for it. Returns its :class:`Request`."""
        self.request = self.session.start(self.run, self.finish, self.result(), (),
                                          self.binding)
        return self.request

    def wait(self):
        """Wait for the call :meth:`start` started; return the result."""
        if self.request is None:
            raise ValueError("wait() before start(): call handle.start() first")
        request, self.request = self.request, None
        return request.wait()

    def test(self) -> bool:
        """Whether the call :meth:`start` started is complete."""
        return self.request is None or self.request.test()

    def release(self):
        """Free the binding; a later call raises (the communicator is being freed)."""
        if self.binding is not None:
            self.binding.free()
        self.binding = None
        self.call = self.run = _released


def _released():
    raise ValueError("the communicator of this allreduce_init handle was freed; "
                     "call mlcomm.allreduce_init again on a live communicator")


def reduce_scatter(sendbuf, recvbuf=None, op="sum", *, comm=None, algorithm=None, validate=None,
                   **options):
    """Reduce p equal blocks over all ranks; rank r gets reduced block r (MPI_Reduce_scatter_block)."""
    return _run("reduce_scatter", sendbuf, recvbuf, op, comm, algorithm, 0, validate, options)


def allgather(sendbuf, recvbuf=None, *, comm=None, algorithm=None, validate=None, **options):
    """Gather every rank's ``sendbuf`` into block r of every rank's result."""
    return _run("allgather", sendbuf, recvbuf, "sum", comm, algorithm, 0, validate, options)


def bcast(buf, root=0, *, comm=None, algorithm=None, validate=None, **options):
    """Broadcast ``buf`` from ``root`` to every rank, in place."""
    return _run("bcast", buf, None, "sum", comm, algorithm, root, validate, options)


def reduce(sendbuf, recvbuf=None, op="sum", root=0, *, comm=None, algorithm=None, validate=None,
           **options):
    """Reduce ``sendbuf`` over all ranks to ``root``; returns the result there, None elsewhere."""
    return _run("reduce", sendbuf, recvbuf, op, comm, algorithm, root, validate, options)
