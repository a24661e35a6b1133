"""Watched waits: mlcomm's own collectives outside a bound program, polled as the loops poll.

Setting a session up (the communicator's duplicate), agreeing on ``auto``'s choice and
timing its trial, making the node window, comparing calls under ``validate``, and
``mlcomm.Comm``'s hand-offs to the library all wait for every rank. Each waits here, on
non-blocking MPI calls polled as a bound program's WAIT is: yielding the CPU (ranks may
outnumber cores, and the MPI libraries spin in their blocking calls), and reporting a wait
longer than ``MLCOMM_STALL_SECONDS`` once, with the ranks that have not arrived, ending the
job under ``MLCOMM_STALL_ABORT=1``.

A collective request does not say who is missing, so a watched wait takes a roll call:
every rank sends its leader (the communicator's rank 0) a synchronous message with the
wait's mark before it starts the collective, and the leader receives one from each. When a
wait outlasts the limit, the leader names the ranks it has not heard from (and any that
sent another mark: they are in another of mlcomm's waits); a rank whose message the
leader has not taken names the leader. The roll call travels on a communicator of
mlcomm's own, with a tag of its own, so it never meets a caller's messages or a program's.
"""

from __future__ import annotations

import os
import sys
import time
import zlib

import numpy as np
from mpi4py import MPI

from .binding import Settings
from .transport.mpi import abort_job

__all__ = ["Watch", "world_roll", "mark"]

#: the roll call's tag (a program's messages use tag 0)
ROLL_TAG = 7


def mark(text: str) -> int:
    """A wait's mark: the same on every rank for the same wait."""
    return zlib.crc32(text.encode())


#: seconds an import of mlcomm polls for the world's duplicate (every rank that imports it
#: at about the same time finishes it here; a later one finishes it on a later MPI call)
IMPORT_POLL_SECONDS = 0.25


class _WorldRoll:
    """A duplicate of ``MPI.COMM_WORLD`` for the roll calls of session set-ups, started
    (``MPI_Comm_idup``) when mlcomm is imported; usable once every rank has imported it
    and made progress on it."""

    def __init__(self):
        self.comm = self.request = None
        if MPI.Is_initialized() and not MPI.Is_finalized():
            self.comm, self.request = MPI.COMM_WORLD.Idup()
            until = time.monotonic() + IMPORT_POLL_SECONDS
            while not self.ready() and time.monotonic() < until:
                os.sched_yield()

    def ready(self) -> bool:
        if self.request is None:
            return False
        if self.request.Test():
            self.request = MPI.REQUEST_NULL
        return self.request == MPI.REQUEST_NULL

    def free(self):
        if self.comm is not None and self.ready() and not MPI.Is_finalized():
            self.comm.Free()
        self.comm = None


_WORLD = _WorldRoll()


def world_roll(comm):
    """``(roll communicator, ranks)`` to take a set-up's roll call of ``comm`` on: the world
    duplicate and ``comm``'s ranks in it, or ``(None, None)`` when that is not possible (a
    rank of the world has not imported mlcomm yet, or ``comm`` reaches beyond the world)."""
    if not _WORLD.ready():
        return None, None
    ranks = MPI.Group.Translate_ranks(comm.Get_group(), list(range(comm.Get_size())),
                                      MPI.COMM_WORLD.Get_group())
    if any(r == MPI.UNDEFINED for r in ranks):
        return None, None
    return _WORLD.comm, list(ranks)


def free_world():
    """Free the world duplicate (before MPI finalizes)."""
    _WORLD.free()


class Watch:
    """Watched waits on one communicator (see the module docstring).

    ``roll`` is the communicator the roll calls travel on and ``ranks`` the communicator's
    ranks in it (None: no roll call; a stall is then reported without names). ``rank`` is
    this rank in the communicator; ``names`` what a report calls each of its ranks (the
    session's ranks of a node's communicator), by default their ranks in it."""

    def __init__(self, settings: Settings, rank: int, roll=None, ranks=None, names=None):
        self.settings, self.rank = settings, rank
        self.roll, self.ranks = roll, ranks
        self.names = names

    def wait(self, start, what: str, roll: bool = True):
        """Run the non-blocking collective ``start()`` returns (a request, or a list of
        them) and wait for it; ``what`` names the call in a stall report. ``roll=False``
        takes no roll call (every rank is known to be here: a stall names no one)."""
        roll = self._roll_call(mark(what)) if roll and self._rolls() else None
        requests = start()
        requests = list(requests) if isinstance(requests, (list, tuple)) else [requests]
        self._poll(requests, roll, what)
        if roll is not None:
            self._poll(roll[0], roll, what)  # every rank has arrived: done at once

    def barrier(self, comm, what: str, roll: bool = True):
        """Wait until every rank of ``comm`` (this watch's communicator) is here."""
        self.wait(comm.Ibarrier, what, roll)

    def _rolls(self) -> bool:
        return self.roll is not None and self.settings.stall_seconds > 0 and len(self.ranks) > 1

    def _roll_call(self, tag_mark):
        """Start this rank's part of a roll call: ``(requests, marks)``."""
        if self.rank == 0:
            marks = np.full(len(self.ranks) - 1, -1, np.int64)
            requests = [self.roll.Irecv([marks[i - 1:i], MPI.INT64_T], self.ranks[i], ROLL_TAG)
                        for i in range(1, len(self.ranks))]
        else:
            marks = np.array([tag_mark], np.int64)
            requests = [self.roll.Issend([marks, MPI.INT64_T], self.ranks[0], ROLL_TAG)]
        return requests, marks, tag_mark

    def _poll(self, requests, roll, what):
        settings = self.settings
        polls, spins, since, reported = settings.yield_mask + 1, 0, time.monotonic(), False
        limit = settings.stall_seconds
        while not MPI.Request.Testall(requests):
            spins += 1
            if spins % polls == 0 or spins > 64:
                os.sched_yield()
                if not reported and limit and time.monotonic() - since > limit:
                    reported = self._stalled(roll, what)

    def _stalled(self, roll, what) -> bool:
        """Report the stall (end the job under MLCOMM_STALL_ABORT=1); True once reported.
        A rank whose leader is here leaves the report to the leader, who knows who is
        missing."""
        seconds = self.settings.stall_seconds
        head = f"mlcomm: rank {self.settings.rank} has waited {seconds:g} s in {what}"
        if roll is None:
            message = f"{head} for the other ranks (which, mlcomm cannot tell here)"
        elif self.rank == 0:
            requests, marks, tag_mark = roll
            done = [r == MPI.REQUEST_NULL or r.Test() for r in requests]
            absent = [i + 1 for i, ok in enumerate(done) if not ok]
            elsewhere = [i + 1 for i, ok in enumerate(done) if ok and marks[i] != tag_mark]
            name = (lambda i: i) if self.names is None else self.names.__getitem__
            message = f"{head} for ranks {[name(i) for i in absent]}"
            if elsewhere:
                message += (f"; ranks {[name(i) for i in elsewhere]} are in another of "
                            f"mlcomm's calls")
        elif not roll[0][0].Test():
            message = f"{head} for rank {0 if self.names is None else self.names[0]}"
        else:
            return True  # the leader is here and reports
        if self.settings.stall_abort:
            abort_job(message + " (MLCOMM_STALL_ABORT=1: ending the job)")
        print(message + "; it goes on waiting (MLCOMM_STALL_SECONDS sets the limit, "
              "MLCOMM_STALL_ABORT=1 ends the job instead)", file=sys.stderr, flush=True)
        return True
