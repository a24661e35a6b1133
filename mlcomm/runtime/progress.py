"""Non-blocking collectives: one progress thread per communicator runs started calls in order.

``mlcomm.iallreduce`` checks and binds its call in the caller's thread, as the blocking call
does, then hands the bound run to its communicator's :class:`Progress` thread and returns a
:class:`Request` at once. The thread runs the calls one after another, in the order they were
started, each in the compiled loop without the GIL, so the caller's own Python and NumPy work
goes on meanwhile; requests complete in that order. A blocking call on the same
communicator first waits for the started ones (their messages must not meet its own).

The thread is started on first use and stopped with the session, after the started calls
are complete: at the end of the script (:func:`mlcomm.session.end_of_job`) or when the
communicator is freed. A call that failed and was never waited for is reported then
(:meth:`Progress.unwaited`), never dropped in silence. mpi4py initialises MPI with
``MPI_THREAD_MULTIPLE`` by default, which this needs: the caller's thread may plan and bind
while the progress thread moves messages. A collective of the caller's thread on the same
communicator (``auto``'s agreement on a new size, ``validate=True``'s comparison) first waits
for the started calls, which may run the library's collectives there. A device array's
``iallreduce`` plans and binds its call on the progress thread itself; while one is started
and not complete, a call made meanwhile waits for it before it plans (:attr:`Progress.planning`).
"""

from __future__ import annotations

import threading
from collections import deque

__all__ = ["Request", "Progress"]


class Request:
    """A started collective: :meth:`wait` for its result, :meth:`test` whether it is done.

    It keeps the call's buffers alive until it completes, as MPI's non-blocking calls need
    them to stay.
    """

    __slots__ = ("_done", "_error", "_result", "_keep", "_run", "_finish", "_binding", "_waited")

    def __init__(self, run, finish, result, keep, binding):
        self._done = threading.Event()
        self._error = None
        self._waited = False
        self._run, self._finish, self._result, self._keep = run, finish, result, keep
        self._binding = binding

    def test(self) -> bool:
        """True once the collective is complete (then :meth:`wait` returns at once)."""
        return self._done.is_set()

    def wait(self):
        """Wait until the collective is complete; return what the blocking call returns."""
        self._done.wait()
        self._waited = True
        if self._error is not None:
            raise self._error
        return self._result

    def _execute(self):
        try:
            value = self._run()
            if value is not None:  # a run that makes its result (the device path)
                self._result = value
            if self._finish is not None:
                self._finish()
        except BaseException as exc:  # handed to wait(), on the caller's thread
            self._error = exc
        finally:
            if self._binding is not None:
                self._binding.busy -= 1
            self._keep = self._run = self._finish = None
            self._done.set()


class Progress:
    """The progress thread of one communicator (see the module docstring)."""

    def __init__(self, name: str):
        self._name = name
        self._queue: deque = deque()
        self._cond = threading.Condition()
        self._thread = None
        self._last = None  # the request started last
        self._planner = None  # the request started last that plans on this thread
        self._stopping = False
        self._failed: list = []  # requests that failed, until :meth:`unwaited` looks

    @property
    def busy(self) -> bool:
        """Whether a started request is not complete yet."""
        last = self._last
        return last is not None and not last._done.is_set()

    @property
    def planning(self) -> bool:
        """Whether a started request that plans and binds on this thread (a device array's
        ``iallreduce``) is not complete yet."""
        planner = self._planner
        return planner is not None and not planner._done.is_set()

    def start(self, run, finish=None, result=None, keep=(), binding=None,
              plans=False) -> Request:
        """Start ``run()`` (then ``finish()``) after every request started before it;
        ``plans``: ``run`` plans and binds its call itself (see :attr:`planning`)."""
        request = Request(run, finish, result, keep, binding)
        if binding is not None:
            binding.busy += 1
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name,
                                                daemon=True)
                self._thread.start()
            self._queue.append(request)
            self._last = request
            if plans:
                self._planner = request
            self._cond.notify()
        return request

    def drain(self, timeout=None) -> bool:
        """Wait until every started request is complete (at most ``timeout`` seconds); True
        when they are. On the progress thread itself (a device array's ``iallreduce`` runs
        its whole call there) every request started before the running one is complete,
        and the later ones wait for it: nothing to wait for."""
        if threading.current_thread() is self._thread:
            return True
        last = self._last
        return last is None or last._done.wait(timeout)

    def unwaited(self) -> list:
        """The errors of the failed requests that nobody waited for (each given once)."""
        errors = [r._error for r in self._failed if not r._waited]
        self._failed.clear()
        return errors

    def stop(self) -> None:
        """Finish what was started, then end the thread."""
        self.drain()
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None

    def _loop(self):
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if not self._queue:
                    return
                request = self._queue.popleft()
            request._execute()
            if request._error is not None:
                if len(self._failed) >= 64:  # keep the ones nobody has waited for yet
                    self._failed = [r for r in self._failed if not r._waited][-63:]
                self._failed.append(request)
