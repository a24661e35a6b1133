"""The library API: thin fronts over the bound call.

Each public function makes a :class:`~mlcomm.session.call.Call` of its arguments and runs
what :func:`~mlcomm.session.binder.bind` returns; a repeat of a call seen before runs its
bound call from the memo (:mod:`mlcomm.session.memo`) with one lookup. Every argument error
is raised in the call's checks, before any message is sent.
"""

from __future__ import annotations

from functools import partial

import numpy as np
from mpi4py import MPI

from .buffers.arrays import flat
from .runtime.liveness import RankLost
from .runtime.progress import Request
from .session import Call, bind, session_of
from .session import shrink as _shrink
from .session.call import comm_of
from .session.binder import VALIDATE, validating
from .session.memo import CALLS, LAST, MISS

__all__ = ["allreduce", "iallreduce", "istart", "allreduce_init", "init", "Persistent",
           "Request", "reduce_scatter", "allgather", "bcast", "reduce", "gather", "scatter",
           "alltoall", "allgatherv", "reduce_scatter_v", "gatherv", "scatterv", "alltoallv",
           "IN_PLACE", "RankLost", "shrink"]

IN_PLACE = MPI.IN_PLACE


def _repeat_or_bind(collective, sendbuf, recvbuf, op, comm, algorithm, root, options):
    """A call that missed the last call's repeat: its bound call from the memo, else bound
    and run anew."""
    bound = CALLS.get((id(sendbuf if recvbuf is None else recvbuf), algorithm))
    if bound is not None:
        result = bound.repeat(collective, sendbuf, recvbuf, op, comm, algorithm, root, options)
        if result is not MISS:
            LAST[0] = bound.repeat
            return result
    return bind(Call(collective, sendbuf, recvbuf, op, comm, algorithm, root, None,
                     options)).run()


def _front(collective, sendbuf, recvbuf, op, comm, algorithm, root, validate, options):
    """Run one call and return what the public function returns."""
    if validate is None and not VALIDATE:
        result = LAST[0](collective, sendbuf, recvbuf, op, comm, algorithm, root, options)
        if result is not MISS:
            return result
        return _repeat_or_bind(collective, sendbuf, recvbuf, op, comm, algorithm, root, options)
    return bind(Call(collective, sendbuf, recvbuf, op, comm, algorithm, root, validate,
                     options)).run()


def allreduce(sendbuf, recvbuf=None, op="sum", *, comm=None, algorithm=None, validate=None,
              **options):
    """Reduce ``sendbuf`` over all ranks of ``comm``; every rank gets the result.

    ``sendbuf=mlcomm.IN_PLACE`` (or ``MPI.IN_PLACE``) reduces ``recvbuf`` in
    place.  ``algorithm`` defaults to ``MLCOMM_ALGORITHM`` or ``auto``;
    ``options`` are the algorithm's (``servers=``, ``segment_bytes=`` ...).
    """
    if validate is None:  # a repeat: the call that ran last (inline: it is the hot path)
        result = LAST[0]("allreduce", sendbuf, recvbuf, op, comm, algorithm, 0, options)
        if result is not MISS:
            return result
        return _repeat_or_bind("allreduce", sendbuf, recvbuf, op, comm, algorithm, 0, options)
    return bind(Call("allreduce", sendbuf, recvbuf, op, comm, algorithm, 0, validate,
                     options)).run()


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
    call = Call("allreduce", sendbuf, recvbuf, op, comm, algorithm, 0, validate, options)
    if call.on_device:  # checked, planned and bound on the progress thread
        return session_of(call.comm).start(lambda: bind(call).run(), keep=(sendbuf, recvbuf),
                                           plans=True)
    return _start(call)


def istart(collective, sendbuf, recvbuf=None, op="sum", root=0, *, comm=None, algorithm=None,
           validate=None, before=None, after=None, **options) -> Request:
    """Start any collective of :data:`~mlcomm.COLLECTIVES` on host buffers and return at
    once, as :func:`iallreduce` does: a :class:`Request` whose ``wait()`` returns what the
    blocking call (``allreduce``, ``reduce_scatter``, ``allgather``, ``bcast`` with ``buf``
    as ``sendbuf``, ``reduce``) returns.

    The progress thread calls ``before()`` first (if it raises, the collective does not run
    and ``wait()`` raises its error) and ``after(error)`` last, once the call is complete,
    with None or the exception that ``wait()`` raises."""
    return _start(Call(collective, sendbuf, recvbuf, op, comm, algorithm, root, validate,
                       options), before, after)


def _start(call, before=None, after=None) -> Request:
    """Bind ``call`` now and start it on its communicator's progress thread."""
    bound = bind(call)
    run, finish = bound.run_, bound.finish
    if before is not None or after is not None:
        run, finish = partial(_hooked, before, run, finish, after), None
    return bound.session.start(run, finish, bound.result,
                               (call.sendbuf, call.recvbuf, call.out), bound.binding)


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
    call = Call("allreduce", sendbuf, recvbuf, op, comm, algorithm, 0, validate, options)
    if call.on_device:
        raise TypeError("allreduce_init takes host arrays; pass device arrays to "
                        "mlcomm.allreduce, which stages them or hands them to a CUDA-aware MPI")
    return Persistent(call)


def init(collective, sendbuf, recvbuf=None, op="sum", root=0, *, comm=None, algorithm=None,
         validate=None, **options):
    """Bind any collective of :data:`~mlcomm.COLLECTIVES` to its buffers once, as MPI-4's
    ``MPI_Allgather_init`` and friends; return a :class:`Persistent`, as
    :func:`allreduce_init` does. The uneven forms take their counts as options
    (``counts=``; ``sendcounts=`` and ``recvcounts=``). Host arrays only."""
    call = Call(collective, sendbuf, recvbuf, op, comm, algorithm, root, validate, options)
    if call.on_device:
        raise TypeError(f"init takes host arrays; pass device arrays to mlcomm.{collective}")
    return Persistent(call)


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

    def __init__(self, call):
        bound = bind(call, own=True)
        self.session, self.binding, self.finish, self.run = bound.session, bound.binding, \
            bound.finish, bound.run_
        self.buffers = (call.sendbuf, call.recvbuf, call.out)
        result = bound.result
        self.result = lambda: result  # the handle owns its buffers
        self.call = bound.runner()
        self.request = None
        self.session.handles.add(self)

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
    return _front("reduce_scatter", sendbuf, recvbuf, op, comm, algorithm, 0, validate, options)


def allgather(sendbuf, recvbuf=None, *, comm=None, algorithm=None, validate=None, **options):
    """Gather every rank's ``sendbuf`` into block r of every rank's result."""
    return _front("allgather", sendbuf, recvbuf, "sum", comm, algorithm, 0, validate, options)


def bcast(buf, root=0, *, comm=None, algorithm=None, validate=None, **options):
    """Broadcast ``buf`` from ``root`` to every rank, in place."""
    return _front("bcast", buf, None, "sum", comm, algorithm, root, validate, options)


def reduce(sendbuf, recvbuf=None, op="sum", root=0, *, comm=None, algorithm=None, validate=None,
           **options):
    """Reduce ``sendbuf`` over all ranks to ``root``; returns the result there, None elsewhere."""
    return _front("reduce", sendbuf, recvbuf, op, comm, algorithm, root, validate, options)


def gather(sendbuf, recvbuf=None, root=0, *, comm=None, algorithm=None, validate=None,
           **options):
    """Gather every rank's ``sendbuf`` into block r of the root's result (MPI_Gather); None
    elsewhere. At the root ``sendbuf=IN_PLACE`` takes its block from ``recvbuf``."""
    return _front("gather", sendbuf, recvbuf, "sum", comm, algorithm, root, validate, options)


def scatter(sendbuf, recvbuf=None, root=0, *, comm=None, algorithm=None, validate=None,
            **options):
    """Send block r of the root's ``sendbuf`` (p equal blocks) to rank r (MPI_Scatter); the
    other ranks pass ``recvbuf`` (their ``sendbuf`` is ignored; None will do)."""
    return _front("scatter", sendbuf, recvbuf, "sum", comm, algorithm, root, validate, options)


def alltoall(sendbuf, recvbuf=None, *, comm=None, algorithm=None, validate=None, **options):
    """Send block j of ``sendbuf`` (p equal blocks) to rank j; block j of the result is rank
    j's block r (MPI_Alltoall)."""
    return _front("alltoall", sendbuf, recvbuf, "sum", comm, algorithm, 0, validate, options)


def allgatherv(sendbuf, recvbuf=None, counts=None, *, comm=None, algorithm=None,
               validate=None, **options):
    """Gather every rank's ``sendbuf``, of ``counts[r]`` elements on rank r, one after
    another into every rank's result (MPI_Allgatherv). ``counts=None``: each rank's size,
    gathered first by the library's ``MPI_Allgather`` (one more collective per call)."""
    if counts is None:
        counts = _gathered_sizes(sendbuf, recvbuf, comm)
    return _front("allgatherv", sendbuf, recvbuf, "sum", comm, algorithm, 0, validate,
                  dict(options, counts=counts))


def reduce_scatter_v(sendbuf, recvbuf=None, counts=None, op="sum", *, comm=None,
                     algorithm=None, validate=None, **options):
    """Reduce ``sendbuf`` (blocks of ``counts[r]`` elements, one after another) over all
    ranks; rank r gets reduced block r (MPI_Reduce_scatter)."""
    return _front("reduce_scatter_v", sendbuf, recvbuf, op, comm, algorithm, 0, validate,
                  dict(options, counts=counts))


def gatherv(sendbuf, recvbuf=None, counts=None, root=0, *, comm=None, algorithm=None,
            validate=None, **options):
    """Gather every rank's ``sendbuf`` (``counts[r]`` elements on rank r) one after another
    into the root's result (MPI_Gatherv); ``counts`` is needed at the root only."""
    return _front("gatherv", sendbuf, recvbuf, "sum", comm, algorithm, root, validate,
                  dict(options, counts=counts))


def scatterv(sendbuf, recvbuf=None, counts=None, root=0, *, comm=None, algorithm=None,
             validate=None, **options):
    """Send block r of the root's ``sendbuf`` (blocks of ``counts[r]`` elements, one after
    another) to rank r (MPI_Scatterv); a rank other than the root passes ``recvbuf`` or
    ``counts``."""
    return _front("scatterv", sendbuf, recvbuf, "sum", comm, algorithm, root, validate,
                  dict(options, counts=counts))


def alltoallv(sendbuf, sendcounts, recvbuf=None, recvcounts=None, *, comm=None,
              algorithm=None, validate=None, **options):
    """Send block j of ``sendbuf`` (``sendcounts[j]`` elements; blocks one after another) to
    rank j; block j of the result is what rank j sent this rank (MPI_Alltoallv).
    ``recvcounts=None``: exchanged first by the library's ``MPI_Alltoall`` (one more
    collective per call)."""
    if recvcounts is None:
        recvcounts = _exchanged_counts(sendcounts, comm)
    elif validating(validate):
        _check_splits(sendcounts, recvcounts, comm)
    return _front("alltoallv", sendbuf, recvbuf, "sum", comm, algorithm, 0, validate,
                  dict(options, sendcounts=sendcounts, recvcounts=recvcounts))


def _gathered_sizes(sendbuf, recvbuf, comm) -> tuple:
    """Every rank's element count of ``sendbuf`` (in place: its own block, which it cannot
    know; an error), gathered on the session's communicator in a watched wait."""
    if sendbuf is MPI.IN_PLACE:
        raise ValueError("allgatherv in place needs counts: the ranks' blocks of recvbuf")
    session = session_of(comm_of(comm), "allgatherv")
    session.wait_started()  # the calls started on the communicator go first
    mine = np.array([flat(sendbuf, "sendbuf").size], np.int64)
    every = np.empty(session.size, np.int64)
    session.watch.wait(lambda: session.comm.Iallgather(mine, every),
                       "allgatherv's exchange of the ranks' counts")
    return tuple(every.tolist())


def _check_splits(sendcounts, recvcounts, comm) -> None:
    """Raise ValueError on every rank where a rank's ``recvcounts`` differ from what its
    peers send it (``validate``)."""
    comm = comm_of(comm)
    sent = _exchanged_counts(sendcounts, comm)
    try:
        mine = tuple(int(c) for c in recvcounts)
    except (TypeError, ValueError):
        mine = None
    wrong = comm.allgather(None if mine == sent else (mine, sent))
    bad = {r: w for r, w in enumerate(wrong) if w is not None}
    if bad:
        said = "; ".join(f"rank {r} has recvcounts {list(m) if m else m}, its peers send "
                         f"{list(s)}" for r, (m, s) in bad.items())
        raise ValueError(f"alltoallv: recvcounts differ from the peers' sendcounts: {said}")


def _exchanged_counts(sendcounts, comm) -> tuple:
    """The counts every rank sends this one, from each rank's ``sendcounts`` (a watched
    wait on the session's communicator)."""
    comm = comm_of(comm)
    try:
        sends = np.array(sendcounts, np.int64).reshape(-1)
    except (TypeError, ValueError):
        raise TypeError("sendcounts must be a sequence of integers, one per rank") from None
    if sends.size != comm.Get_size():
        raise ValueError(f"sendcounts has {sends.size} counts; give {comm.Get_size()}, one "
                         f"per rank")
    recvs = np.empty_like(sends)
    session = session_of(comm, "alltoallv")
    session.wait_started()  # the calls started on the communicator go first
    session.watch.wait(lambda: session.comm.Ialltoall(sends, recvs),
                       "alltoallv's exchange of the ranks' counts")
    return tuple(recvs.tolist())


def shrink(comm=None):
    """The survivors' communicator after ``comm`` (default ``MPI.COMM_WORLD``) lost ranks
    (:class:`RankLost`), on an MPI with fault tolerance (Open MPI run with ``mpiexec
    --with-ft ulfm``): collective among the survivors; ``comm`` is revoked, and a call
    that raised can be run again on the new one. Elsewhere it raises RuntimeError (a lost
    rank ends the job there)."""
    return _shrink(comm_of(comm))
