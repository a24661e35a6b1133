"""Watched waits: mlcomm's own collectives outside a bound program, polled as the loops poll.

Setting a session up (the communicator's duplicate), agreeing on ``auto``'s choice and
timing its trial, making the node window, comparing calls under ``validate``, and
``mlcomm.Comm``'s hand-offs to the library all wait for every rank. Each waits here, on
non-blocking MPI calls polled as a bound program's WAIT is: yielding the CPU (ranks may
outnumber cores, and the MPI libraries spin in their blocking calls), or, in a wait for
ranks still at work that nothing times (an agreement, the end of the job, ``mlcomm
verify``'s), sleeping between polls once it has lasted the settings' ``sleep_after``
as a passive transport's wait does; and reporting a wait
longer than ``MLCOMM_STALL_SECONDS`` once, with the ranks that have not arrived, ending the
job under ``MLCOMM_STALL_ABORT=1``.

A collective request does not say who is missing, so a watched wait takes a roll call:
every rank that can sends its leader (the communicator's rank 0) a small message with the
wait's mark before it starts the collective, and the leader posts a receive from each. When
a wait outlasts the limit, the leader names the ranks it has not heard from; the others
say that the leader names them. A rank that cannot take part yet (a set-up's roll call
travels on the world's duplicate, which a rank can use once every rank has made progress
on it) joins when it can; on Open MPI a set-up takes no roll call (mlcomm makes no world
duplicate there), and its stall report names no one. The roll call never holds a wait up:
when the collective completes, the leader cancels what it did not receive, and a message
it takes with another wait's mark (one that came after its wait had ended) is dropped.
The roll call travels on a communicator of mlcomm's own, with a tag of its own, so it
never meets a caller's messages or a program's.
"""

from __future__ import annotations

import os
import sys
import time
import zlib

import numpy as np
from mpi4py import MPI

from .binding import Settings
from .frame import MESSAGE_SLEEP_FACTOR
from .liveness import CHECK_SECONDS, fault_tolerant, gone, is_failure, lost
from .loop import rest
from ..transport.mpi.abort import abort_job

__all__ = ["Watch", "world_roll", "mark"]

#: the roll call's tag (a program's messages use tag 0)
ROLL_TAG = 7


def mark(text: str) -> int:
    """A wait's mark: the same on every rank for the same wait."""
    return zlib.crc32(text.encode())


#: seconds an import of mlcomm polls for the world's duplicate (every rank that imports it
#: at about the same time finishes it here; a later one finishes it on a later MPI call)
IMPORT_POLL_SECONDS = 0.25


def _idup_beside_creations() -> bool:
    """Whether the MPI library may hold a non-blocking duplicate of ``MPI.COMM_WORLD`` open
    while the caller creates communicators from it: not Open MPI, whose
    ``MPI_Comm_dup`` of the world then fails (``MPI_ERR_INTERN``) or hangs on some ranks
    (Open MPI 5.0.11: 2 of 12 jobs at 7 ranks on 2 cores that imported mlcomm and then
    duplicated the world 20 times; none where that duplicate had completed first)."""
    return MPI.get_vendor()[0] != "Open MPI"


class _WorldRoll:
    """A duplicate of ``MPI.COMM_WORLD`` for the roll calls of session set-ups, started
    (``MPI_Comm_idup``) when mlcomm is imported, but not on Open MPI
    (:func:`_idup_beside_creations`); usable once every rank has imported it and made
    progress on it."""

    def __init__(self):
        self.comm = self.request = None
        if MPI.Is_initialized() and not MPI.Is_finalized() and _idup_beside_creations():
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


class _Roll:
    """One rank's part of a roll call on ``comm`` among ``ranks`` (this rank ``rank`` in
    them) for a wait marked ``tag``: the leader's receives, or a member's send."""

    def __init__(self, comm, ranks, rank, tag):
        self.comm, self.ranks, self.rank, self.tag = comm, ranks, rank, tag
        if rank == 0:
            self.marks = np.full(len(ranks) - 1, -1, np.int64)
            self.here = [False] * (len(ranks) - 1)
            self.requests = [self._receive(i) for i in range(len(ranks) - 1)]
        else:  # eager: 8 bytes complete without waiting for the leader
            self.marks = np.array([tag], np.int64)
            self.requests = [comm.Isend([self.marks, MPI.INT64_T], ranks[0], ROLL_TAG)]

    def _receive(self, i):
        return self.comm.Irecv([self.marks[i:i + 1], MPI.INT64_T], self.ranks[i + 1], ROLL_TAG)

    def absent(self) -> list:
        """The leader's view: the ranks (positions in ``ranks``) not heard from."""
        for i, request in enumerate(self.requests):
            while not self.here[i] and request.Test():
                if self.marks[i] == self.tag:
                    self.here[i] = True
                else:  # another wait's message, sent after that wait ended here: drop it
                    request = self.requests[i] = self._receive(i)
        return [i + 1 for i, here in enumerate(self.here) if not here]

    def end(self):
        """The collective is complete: cancel the receives still open; a send completes."""
        for request in self.requests:
            if request != MPI.REQUEST_NULL and not request.Test():
                if self.rank == 0:
                    request.Cancel()
                request.Wait()


class Watch:
    """Watched waits on one communicator (see the module docstring).

    ``roll`` is the communicator the roll calls travel on and ``ranks`` the communicator's
    ranks in it, or a call that returns ``(roll, ranks)`` once they can be used and
    ``(None, None)`` until then; None: no roll call (a stall is reported without names).
    ``rank`` is this rank in the communicator; ``names`` what a report calls each of its
    ranks (the session's ranks of a node's communicator), by default their ranks in it.
    ``session``: the session's communicator, which a lost rank (a peer's process gone, in
    the settings' ``pids``, or the library's failure error) revokes on a fault-tolerant
    MPI (:func:`~.liveness.lost`); None before a session exists."""

    def __init__(self, settings: Settings, rank: int, roll=None, ranks=None, names=None,
                 session=None):
        self.settings, self.rank = settings, rank
        self._where = roll if callable(roll) else (lambda: (roll, ranks))
        self.names, self.session = names, session

    def wait(self, start, what: str, roll: bool = True, check=None, sleep: bool = False):
        """Run the non-blocking collective ``start()`` returns (a request, or a list of
        them) and wait for it; ``what`` names the call in a stall report. ``roll=False``
        takes no roll call (every rank is known to be here: a stall names no one).
        ``check()``, if given, is called whenever the wait yields the CPU (it may end the
        job). ``sleep=True``: a wait for ranks still at work, neither timed nor repeated
        in a loop of calls, which sleeps between polls once it has lasted the settings'
        ``sleep_after`` (a sleeping rank's polls are tens of microseconds apart)."""
        join = (lambda: self._join(mark(what))) if roll and self.settings.stall_seconds > 0 \
            else (lambda: None)
        calls = [join()]  # this rank's part of the roll call, once it has one
        requests = start()
        requests = list(requests) if isinstance(requests, (list, tuple)) else [requests]
        try:
            self._poll(requests, calls, join, what, check, self.settings.sleep_after * (
                1 if sleep else MESSAGE_SLEEP_FACTOR))
        finally:
            if calls[0] is not None:
                calls[0].end()

    def barrier(self, comm, what: str, roll: bool = True, sleep: bool = False):
        """Wait until every rank of ``comm`` (this watch's communicator) is here."""
        self.wait(comm.Ibarrier, what, roll, sleep=sleep)

    def _join(self, tag):
        """This rank's part of the roll call, or None where it cannot take one (yet)."""
        comm, ranks = self._where()
        if comm is None or len(ranks) < 2:
            return None
        return _Roll(comm, ranks, self.rank, tag)

    def _poll(self, requests, calls, join, what, check=None, sleep_after=0.0):
        settings = self.settings
        polls, spins, since, reported = settings.yield_mask + 1, 0, time.monotonic(), False
        limit, looked = settings.stall_seconds, since
        while not self._done(requests, what):
            spins += 1
            if spins % polls == 0 or spins > 64:
                now = time.monotonic()
                rest(sleep_after, since, now)  # MPI requests move only while this rank polls
                if calls[0] is None:
                    calls[0] = join()
                if check is not None:
                    check()
                if now - looked > CHECK_SECONDS:
                    looked = now
                    self._look(what)
                if not reported and limit and now - since > limit:
                    reported = self._stalled(calls[0], what)

    def _done(self, requests, what) -> bool:
        """Whether ``requests`` are complete; a process-failure error is a lost rank."""
        try:
            return MPI.Request.Testall(requests)
        except MPI.Exception as exc:
            if self.session is None or not is_failure(exc.Get_error_code()):
                raise
            lost(self.session, gone(self.settings.pids), what, self.settings.rank,
                 self.settings.pids)  # raises RankLost, or ends the job

    def _look(self, what):
        """A lost peer (:mod:`~.liveness`) ends the wait."""
        dead = gone(self.settings.pids)
        revoked = self.session is not None and fault_tolerant() and self.session.Is_revoked()
        if dead or revoked:
            lost(self.session, dead, what, self.settings.rank, self.settings.pids)

    def _stalled(self, call, what) -> bool:
        """Report the stall once (and end the job under MLCOMM_STALL_ABORT=1): the leader
        names the ranks it has not heard from; another rank leaves that to the leader, and
        ends the job itself only at twice the limit (when the leader is the one missing)."""
        seconds = self.settings.stall_seconds
        head = f"mlcomm: rank {self.settings.rank} has waited {seconds:g} s in {what}"
        name = (lambda i: i) if self.names is None else self.names.__getitem__
        if call is None:
            message = f"{head} for the other ranks (which, mlcomm cannot tell here)"
        elif self.rank == 0:
            message = f"{head} for ranks {[name(i) for i in call.absent()]}"
        else:
            message = f"{head}; rank {name(0)} names the ranks missing, unless it is one"
        if self.settings.stall_abort:
            if call is not None and self.rank != 0:
                time.sleep(seconds)  # the leader, if here, reports the names first
            abort_job(message + " (MLCOMM_STALL_ABORT=1: ending the job)")
        print(message + "; it goes on waiting (MLCOMM_STALL_SECONDS sets the limit, "
              "MLCOMM_STALL_ABORT=1 ends the job instead)", file=sys.stderr, flush=True)
        return True
