"""Counted sends: every message a gradient-exchange mode sends goes through a :class:`Wire`.

Collectives run on mlcomm's own algorithms, whose MPI transport counts each message's
bytes where it is posted (:meth:`mlcomm.session.Session.bytes_sent`); the Wire takes the
differences of that counter. The Wire's own collectives (the compressors' allgather, the
broadcasts, the small loss and flag all-reduces) use message-passing algorithms, so that
their bytes are always counted. Point-to-point messages are posted here and count the
bytes of the buffer posted. Not counted: MPI's own algorithm (``--algorithm mpi``), whose
messages mlcomm does not see, and what the node-window algorithms (``shared_memory``,
``hierarchical``) copy through shared memory, which is no message.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ..api import IN_PLACE, allgather, allreduce, allreduce_init, bcast
from ..session import get as session_of

__all__ = ["Wire", "ALGORITHM"]

#: the algorithm of the Wire's own collectives: message passing, counted by the transport
ALGORITHM = {"allreduce": "recursive_doubling", "allgather": "ring", "bcast": "binary_tree"}


def _typed(buf):
    """A byte string goes as MPI_BYTE; a typed array as its own type."""
    return [buf, MPI.BYTE] if buf.dtype == np.uint8 else buf


class Wire:
    """Sends this rank's messages on ``comm`` and counts the bytes it sends.

    ``total`` is every byte counted since :meth:`reset`; :meth:`take` returns those since
    the last take.
    """

    def __init__(self, comm):
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.session = session_of(comm)  # collective: every rank builds its Wire together
        self.sessions = [self.session]
        self.reset()

    def count(self, session) -> None:
        """Count what mlcomm sends on another communicator's ``session`` too."""
        self.sessions.append(session)
        self.reset()

    def reset(self) -> None:
        self._base = sum(s.bytes_sent() for s in self.sessions)
        self._p2p = 0
        self._taken = 0

    @property
    def total(self) -> int:
        return self._p2p + sum(s.bytes_sent() for s in self.sessions) - self._base

    def take(self) -> int:
        """Return the bytes counted since the last call."""
        total = self.total
        n, self._taken = total - self._taken, total
        return n

    # point to point: the posted buffer, exactly

    def isend(self, buf: np.ndarray, dest: int, tag: int):
        self._p2p += buf.nbytes
        return self.comm.Isend(_typed(buf), dest, tag)

    def send(self, buf: np.ndarray, dest: int, tag: int) -> None:
        self._p2p += buf.nbytes
        self.comm.Send(_typed(buf), dest, tag)

    # collectives: mlcomm's, counted by its transport

    def allreduce_init(self, buf: np.ndarray, algorithm: str | None = None, op="sum"):
        """A persistent in-place mlcomm reduction of ``buf`` with ``algorithm`` (default
        :data:`ALGORITHM`'s): each call, or ``start()`` and ``wait()``, reduces what it
        holds then."""
        return allreduce_init(IN_PLACE, buf, op, comm=self.comm,
                              algorithm=algorithm or ALGORITHM["allreduce"])

    def allreduce(self, buf: np.ndarray, algorithm: str | None = None, op="sum") -> np.ndarray:
        """Reduce ``buf`` in place with mlcomm's ``algorithm`` (default :data:`ALGORITHM`'s)."""
        return allreduce(IN_PLACE, buf, op, comm=self.comm,
                         algorithm=algorithm or ALGORITHM["allreduce"])

    def allgather(self, buf: np.ndarray) -> np.ndarray:
        """Every rank's ``buf`` (the same size on every rank), rank by rank, in one array."""
        return allgather(buf, comm=self.comm, algorithm=ALGORITHM["allgather"])

    def bcast(self, buf: np.ndarray, root: int = 0) -> np.ndarray:
        """``root``'s ``buf`` into every rank's ``buf``, in place."""
        return bcast(buf, root, comm=self.comm, algorithm=ALGORITHM["bcast"])
