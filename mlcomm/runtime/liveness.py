"""A lost rank: found, named, and either the job ended or :class:`RankLost` raised.

A wait of mlcomm's (a bound program's WAIT, a watched wait) looks at its peers every
:data:`CHECK_SECONDS` while it lasts: a peer on this machine whose process is gone (no
``/proc/PID``, or a zombie) is lost; on a fault-tolerant MPI (Open MPI run with
``--with-ft ulfm``) so is every rank when mlcomm's communicator has been revoked (another
survivor found a loss first), and a transfer that fails with the library's process-failure
error. A peer on another machine is found by the library alone (its error, or its launcher
ending the job).

Without fault tolerance the job ends with a message on this rank that names the lost ranks
and the collective (:func:`lost`). With it, the survivor revokes mlcomm's communicator (so
every other survivor's wait ends too), the survivors shrink it between themselves to learn
every rank lost, and :class:`RankLost` is raised on each; ``mlcomm.shrink`` then gives the
communicator of the survivors.
"""

from __future__ import annotations

import os
import signal
import threading

from mpi4py import MPI

from ..transport.mpi.abort import abort_job
from ..transport.mpi.names import is_failure

__all__ = ["RankLost", "CHECK_SECONDS", "fault_tolerant", "gone", "lost", "lost_ranks",
           "revoke", "revoke_along", "forget", "keep_failure_notice", "visible", "is_failure"]

#: seconds between the looks of a wait at its peers (a loss is found within about this)
CHECK_SECONDS = 0.5


class RankLost(RuntimeError):
    """Ranks of a communicator were lost during a collective (fault-tolerant MPI only).

    ``ranks``: the lost ranks, in the communicator the call was made on; ``collective``:
    the call, in words. The communicator is revoked: ``mlcomm.shrink(comm)`` returns the
    survivors' communicator, on which the call can be run again."""

    def __init__(self, ranks, collective: str):
        self.ranks, self.collective = sorted(ranks), collective
        super().__init__(f"mlcomm: ranks {self.ranks} lost in {collective}; "
                         f"mlcomm.shrink(comm) gives the survivors' communicator")


def fault_tolerant() -> bool:
    """Whether the MPI library lets the survivors of a lost rank go on: Open MPI with its
    fault tolerance enabled (``mpiexec --with-ft ulfm`` sets ``OMPI_MCA_mpi_ft_enable``)."""
    return MPI.get_vendor()[0] == "Open MPI" and \
        os.environ.get("OMPI_MCA_mpi_ft_enable", "").lower() in ("1", "true", "yes", "on")


def keep_failure_notice() -> None:
    """Hydra's ``mpiexec -disable-auto-cleanup`` (MPICH, Intel MPI) tells the survivors of
    a lost process with SIGUSR1, whose default action ends a process at once, silently:
    where the signal still has that action, it is ignored, and a wait's look at its peers
    names the loss instead. (Only the main thread can set it.)"""
    if MPI.get_vendor()[0] in ("MPICH", "Intel MPI") and \
            threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def visible(pid: int) -> bool:
    """Whether this process can see process ``pid`` (the same machine and PID namespace)."""
    return os.path.exists(f"/proc/{pid}")


def gone(pids) -> list:
    """The ranks whose process is gone: ``pids`` holds each rank's pid, 0 where it is not
    known (another machine)."""
    out = []
    for rank, pid in enumerate(pids):
        if pid and pid != os.getpid():
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    state = f.read().rsplit(b")", 1)[1].split()[0]
            except (OSError, IndexError):
                out.append(rank)
                continue
            if state in (b"Z", b"X"):  # ended, not yet reaped
                out.append(rank)
    return out


def lost(comm, ranks, what: str, rank: int, pids=()) -> None:
    """Ranks ``ranks`` (may be empty where only a revocation or the library's error says
    so) were lost while this rank, ``rank`` of ``comm`` (mlcomm's communicator), was in
    ``what``: end the job naming them, or on a fault-tolerant MPI revoke ``comm``, learn
    every lost rank by shrinking it with the other survivors and raise :class:`RankLost`."""
    if not fault_tolerant():
        named = f"ranks {sorted(ranks)}" if ranks else "a rank (the MPI library says which)"
        whose = "".join(f" (rank {r}: process {pids[r]} is gone)" for r in sorted(ranks)
                        if r < len(pids) and pids[r])
        abort_job(f"mlcomm: rank {rank} lost {named} in {what}{whose}: the MPI library "
                  f"here has no fault tolerance, so the job ends (under Open MPI, "
                  f"mpiexec --with-ft ulfm lets the survivors go on; otherwise resubmit "
                  f"with mlcomm train --resume, on any number of ranks)")
    if comm is None:
        raise RankLost(ranks, what)
    raise RankLost(sorted(set(ranks) | set(revoke(comm))), what)


def revoke(comm) -> list:
    """Revoke ``comm`` (mlcomm's communicator) and return the ranks it lost, learnt once by
    shrinking it with the other survivors (:func:`survey`)."""
    key = MPI._handleof(comm)
    if key not in _LOST:
        along = _ALONG.pop(key, None)
        if along is not None and not along.Is_revoked():
            along.Revoke()  # a survivor in a plain MPI call on it is woken too
        _LOST[key] = survey(comm)
    return _LOST[key]


#: mlcomm's communicators (by handle) -> the caller's, revoked with them
_ALONG: dict = {}


def revoke_along(comm, caller) -> None:
    """Revoke ``caller`` (the communicator mlcomm's ``comm`` duplicates) when ``comm`` is,
    on a fault-tolerant MPI: a survivor waiting in a plain MPI call on it then gets the
    library's error instead of waiting for ever."""
    if fault_tolerant():
        _ALONG[MPI._handleof(comm)] = caller


def forget(comm) -> None:
    """``comm`` is freed: nothing to revoke with it."""
    _ALONG.pop(MPI._handleof(comm), None)


#: mlcomm's revoked communicators (by handle) -> the ranks they lost
_LOST: dict = {}


def lost_ranks(comm):
    """The ranks ``comm`` (mlcomm's communicator) lost, or None while it has lost none."""
    return _LOST.get(MPI._handleof(comm))


def survey(comm) -> list:
    """The ranks of ``comm`` lost (collective among the survivors, fault-tolerant MPI):
    ``comm`` revoked, shrunk, and the ranks missing from the shrunk one."""
    if not comm.Is_revoked():
        comm.Revoke()
    shrunk = comm.Shrink()
    try:
        kept = MPI.Group.Translate_ranks(shrunk.Get_group(), list(range(shrunk.Get_size())),
                                         comm.Get_group())
    finally:
        shrunk.Free()
    return sorted(set(range(comm.Get_size())) - set(kept))
