"""Counted bytes: every byte a gradient-exchange mode moves between ranks goes through a
:class:`Wire`.

Collectives run on mlcomm's own algorithms, whose transports count the bytes each rank
moves on each path (:meth:`mlcomm.session.Session.bytes_moved`): the messages it sends, what
it reads from its node peers' window slots, and what it reads from or writes into their
buffers by single copy. The Wire takes the differences of those counters. Its own
collectives (the compressors' allgather, the broadcasts, the small loss and flag
all-reduces) use message-passing algorithms. Point-to-point messages are posted here and
count the bytes of the buffer posted. Not counted: the MPI library's own algorithm
(``--algorithm mpi``), which moves bytes mlcomm does not see.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from ..api import IN_PLACE, allgather, allreduce, allreduce_init, bcast
from ..session import session_of
from ..transport import MESSAGES, PATHS
from .metrics import BYTES

__all__ = ["Wire", "ALGORITHM"]

#: the algorithm of the Wire's own collectives: message passing, counted by the transport
ALGORITHM = {"allreduce": "recursive_doubling", "allgather": "ring", "bcast": "binary_tree"}


def _typed(buf):
    """A byte string goes as MPI_BYTE; a typed array as its own type."""
    return [buf, MPI.BYTE] if buf.dtype == np.uint8 else buf


class Wire:
    """Sends this rank's messages on ``comm`` and counts the bytes it moves between ranks.

    :meth:`totals` are the bytes per path since :meth:`reset`, ``total`` their sum;
    :meth:`take` returns those since the last take, as the metrics' columns
    (:data:`mlcomm.trainer.metrics.BYTES`).
    """

    def __init__(self, comm):
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.session = session_of(comm)  # collective: every rank builds its Wire together
        self.sessions = [self.session]
        self.reset()

    def count(self, session) -> None:
        """Count what mlcomm moves on another communicator's ``session`` too."""
        self.sessions.append(session)
        self.reset()

    def _counted(self) -> np.ndarray:
        return sum(s.moved for s in self.sessions).copy()

    def reset(self) -> None:
        self._base = self._counted()
        self._p2p = 0
        self._taken = np.zeros(len(PATHS), np.int64)

    def totals(self) -> np.ndarray:
        """Bytes moved since :meth:`reset`, per path of :data:`mlcomm.transport.PATHS`."""
        moved = self._counted() - self._base
        moved[MESSAGES] += self._p2p
        return moved

    @property
    def total(self) -> int:
        return int(self.totals().sum())

    def take(self) -> dict:
        """The bytes moved since the last call, by column: all of them, then per path."""
        totals = self.totals()
        moved, self._taken = totals - self._taken, totals
        return dict(zip(BYTES, [int(moved.sum()), *moved.tolist()]))

    # point to point: the posted buffer, exactly

    def isend(self, buf: np.ndarray, dest: int, tag: int):
        self._p2p += buf.nbytes
        return self.comm.Isend(_typed(buf), dest, tag)

    def send(self, buf: np.ndarray, dest: int, tag: int) -> None:
        self._p2p += buf.nbytes
        self.comm.Send(_typed(buf), dest, tag)

    # collectives: mlcomm's, counted by its transports

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
