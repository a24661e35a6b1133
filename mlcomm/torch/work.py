"""The objects a call of the ``mlcomm`` process group returns: :class:`Work`, the
:class:`WorkInfo` its completion hooks get, and the MPI request of a send or recv."""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist


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
