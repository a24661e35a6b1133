"""Counted sends: every message a gradient-exchange mode posts goes through a :class:`Wire`.

A point-to-point message counts the bytes of the buffer posted, exactly.  A
collective counts this rank's share from a model, in one place
(:meth:`Wire.collective_bytes`): an mlcomm all-reduce from its algorithm's
schedule (:func:`schedule_bytes`), MPI's own collectives from ring volumes.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ..algorithms import ALGORITHMS, resolve
from ..api import allreduce, allreduce_init
from ..select import auto_choice

__all__ = ["Wire", "schedule_bytes"]

_SCHEDULE_BYTES: dict = {}


def schedule_bytes(algorithm: str, size: int, rank: int, count: int, itemsize: int) -> int:
    """Return the bytes ``rank`` sends in one mlcomm all-reduce of ``count`` elements.

    Summed over the Send transfers of the algorithm's schedule; for ``mpi`` (no
    schedule of ours, or ``auto`` choosing it) the ring's ``2(p-1)/p * n``.
    """
    key = (algorithm, size, rank, count, itemsize)
    if key not in _SCHEDULE_BYTES:
        total = 0
        if size > 1:
            name = resolve(algorithm)
            if name == "auto":
                name = auto_choice("allreduce", size, count * itemsize, itemsize=itemsize)
            algo = ALGORITHMS[name]
            if algo.build is not None:
                sched = algo.build(rank, size, count, itemsize)
                total = sum(tr.region.count for st in sched.steps for tr in st.transfers
                            if type(tr).__name__ == "Send") * itemsize
            else:
                total = _ring_allreduce(size, count * itemsize)
        _SCHEDULE_BYTES[key] = total
    return _SCHEDULE_BYTES[key]


def _ring_allreduce(size, nbytes):
    return 2 * (size - 1) * nbytes // size


def _typed(buf):
    """A byte string goes as MPI_BYTE; a typed array as its own type."""
    return [buf, MPI.BYTE] if buf.dtype == np.uint8 else buf


class _CountedAllreduce:
    """A persistent in-place mlcomm all-reduce that counts its bytes at every call."""

    def __init__(self, wire, buf, algorithm):
        self.wire = wire
        self.handle = allreduce_init(MPI.IN_PLACE, buf, comm=wire.comm, algorithm=algorithm)
        self.nbytes = wire.collective_bytes("allreduce", buf.size, buf.dtype.itemsize, algorithm)

    def __call__(self):
        self.handle()
        self.wire.count(self.nbytes)


class Wire:
    """Posts this rank's messages on ``comm`` and counts the bytes it sends.

    ``total`` is every byte counted; :meth:`take` returns those since the last take.
    """

    def __init__(self, comm):
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.total = 0
        self._since = 0

    def count(self, nbytes: int) -> None:
        self.total += int(nbytes)
        self._since += int(nbytes)

    def take(self) -> int:
        """Return the bytes counted since the last call."""
        n, self._since = self._since, 0
        return n

    def reset(self) -> None:
        self.total = self._since = 0

    def collective_bytes(self, kind: str, count: int, itemsize: int, algorithm: str = "mpi") -> int:
        """This rank's bytes in one collective of ``count`` elements (its own share for allgather).

        The model: an mlcomm all-reduce's schedule; MPI's own collectives as rings
        (allreduce ``2(p-1)/p n``, allgather ``(p-1) n``, bcast ``(p-1)/p n``).
        """
        p, n = self.size, count * itemsize
        if p == 1:
            return 0
        if kind == "allreduce":
            return schedule_bytes(algorithm, p, self.rank, count, itemsize)
        if kind == "allgather":
            return (p - 1) * n
        if kind == "bcast":
            return (p - 1) * n // p
        raise ValueError(f"collective_bytes: unknown collective {kind!r}")

    # point to point: the posted buffer, exactly

    def isend(self, buf: np.ndarray, dest: int, tag: int):
        self.count(buf.nbytes)
        return self.comm.Isend(_typed(buf), dest, tag)

    def send(self, buf: np.ndarray, dest: int, tag: int) -> None:
        self.count(buf.nbytes)
        self.comm.Send(_typed(buf), dest, tag)

    # collectives: modelled

    def allreduce_init(self, buf: np.ndarray, algorithm: str) -> _CountedAllreduce:
        """A persistent in-place mlcomm sum of ``buf``; each call counts its schedule's bytes."""
        return _CountedAllreduce(self, buf, algorithm)

    def allreduce(self, buf: np.ndarray, algorithm: str) -> np.ndarray:
        """Sum ``buf`` in place with mlcomm's ``algorithm``."""
        out = allreduce(MPI.IN_PLACE, buf, "sum", comm=self.comm, algorithm=algorithm)
        if out is not None and out is not buf:
            buf[...] = out
        self.count(self.collective_bytes("allreduce", buf.size, buf.dtype.itemsize, algorithm))
        return buf

    def mpi_allreduce(self, buf: np.ndarray, op=MPI.SUM) -> np.ndarray:
        """Reduce ``buf`` in place with MPI's own all-reduce."""
        self.comm.Allreduce(MPI.IN_PLACE, buf, op)
        self.count(self.collective_bytes("allreduce", buf.size, buf.dtype.itemsize))
        return buf

    def mpi_iallreduce(self, sendbuf: np.ndarray, recvbuf: np.ndarray, op=MPI.SUM):
        self.count(self.collective_bytes("allreduce", sendbuf.size, sendbuf.dtype.itemsize))
        return self.comm.Iallreduce(sendbuf, recvbuf, op)

    def allgather(self, sendbuf: np.ndarray, recvbuf: np.ndarray) -> np.ndarray:
        self.comm.Allgather(sendbuf, recvbuf)
        self.count(self.collective_bytes("allgather", sendbuf.size, sendbuf.dtype.itemsize))
        return recvbuf

    def allgatherv(self, sendbuf: np.ndarray, recvspec) -> None:
        """``MPI_Allgatherv`` of ``sendbuf``; ``recvspec`` is mpi4py's [buf, counts, displs, type]."""
        self.comm.Allgatherv(_typed(sendbuf), recvspec)
        self.count(self.collective_bytes("allgather", sendbuf.size, sendbuf.dtype.itemsize))

    def bcast(self, buf: np.ndarray, root: int = 0) -> np.ndarray:
        self.comm.Bcast(buf, root=root)
        self.count(self.collective_bytes("bcast", buf.size, buf.dtype.itemsize))
        return buf
