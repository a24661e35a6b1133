"""A session's lifetime: its set-up on a communicator's first call, and the end of the job.

:func:`session_of` creates a communicator's :class:`~mlcomm.session.state.Session`
(collectively) the first time mlcomm is used on it: mlcomm's duplicate, the node layout and
the variables every rank must agree on. It is freed when that communicator is (an attribute
delete callback), or at the end of the job (:func:`_free_all`).

The end of the job, on each rank, comes before ``MPI_Finalize``: at exit, or first thing in
an ``MPI_Finalize`` the script calls (a delete callback on ``MPI_COMM_SELF``). On each
communicator with a session, oldest first, the rank waits for the calls it started and
frees its bindings, then waits for every rank of the communicator to end too (a watched
barrier: a rank that does not come is named after ``MLCOMM_STALL_SECONDS``). A rank can
never end while another waits for it in silence:

- a message from a peer on mlcomm's duplicate, arriving while this rank waits at its end,
  belongs to a collective the peer started and this rank never called: the job ends at
  once, naming both;
- a script that ended with an unhandled exception ends the job unless every rank of the
  communicator has ended within :data:`FAILED_GRACE` seconds (the others may wait for it
  in a collective; where they all failed alike, each one's traceback is printed first).
"""

from __future__ import annotations

import atexit
import itertools
import os
import sys
import time

from mpi4py import MPI

from .. import config
from ..algorithms import check_known
from ..runtime.binding import settings_from_env
from ..runtime.liveness import fault_tolerant, keep_failure_notice, revoke, revoke_along, \
    visible
from ..runtime.watch import Watch, free_world, world_roll
from ..transport.mpi import TAG
from ..transport.mpi.abort import abort_job
from . import cache
from .state import Session

__all__ = ["session_of", "FAILED_GRACE"]


def _duplicate(comm, what):
    """mlcomm's duplicate of ``comm``: a plain Intracomm whatever the caller's class (so
    mlcomm's traffic never runs through a subclass's collectives: mlcomm.Comm's would run
    mlcomm again), made by ``MPI_Comm_idup`` in a watched wait (a rank late on the
    communicator's first call is reported, with the set-up's roll call on the world's
    duplicate where every rank has imported mlcomm, but on Open MPI:
    :mod:`mlcomm.runtime.watch`)."""
    plain = MPI.Intracomm(comm)
    rank = plain.Get_rank()
    made = []

    def start():
        dup, request = plain.Idup()
        made.append(dup)
        return request
    # ranks may share cores: they yield (not sleep, which slows the library's progress)
    Watch(settings_from_env(rank, 2.0), rank, lambda: world_roll(plain)).wait(
        start, f"{what}, the first call on this communicator (mlcomm's set-up)")
    return made[0]


def _cpus() -> set:
    """The cores this process may run on."""
    try:
        return os.sched_getaffinity(0)
    except AttributeError:  # pragma: no cover - not Linux
        return set(range(os.cpu_count() or 1))


def _agreed_env(comm, leader):
    """``(MLCOMM_ALGORITHM, nodes, slot bytes)``, agreed across the ranks in one allgather.

    ``leader`` is the lowest rank on this rank's machine. ``MLCOMM_RANKS_PER_NODE=k`` makes
    nodes of k consecutive ranks (which must share a machine); otherwise a node is a
    machine. ``MLCOMM_SHM_BYTES`` sizes each rank's window slot. Each variable must be the
    same on every rank; a ValueError naming the ranks that differ is raised on every rank.
    """
    from ..algorithms import DEFAULT_SLOT_BYTES
    names, mine = config.AGREED, config.agreed_raw()
    everyone = comm.allgather((mine, leader))
    for i, name in enumerate(names):
        values = [e[0][i] for e in everyone]
        differ = [r for r, v in enumerate(values) if v != values[0]]
        if differ:
            shown = ", ".join(f"rank {r}: {values[r]!r}" for r in [0] + differ[:7])
            raise ValueError(f"{name} differs across ranks ({shown}); set the same value on "
                             f"every rank, or unset it")
    algorithm, per_node, slot_bytes = everyone[0][0]
    if algorithm is not None:
        check_known(algorithm)  # an unknown name fails on every rank alike
    machines = [e[1] for e in everyone]
    size = len(machines)
    if per_node is None:
        nodes = [tuple(r for r in range(size) if machines[r] == m) for m in sorted(set(machines))]
    else:
        k = config.positive("MLCOMM_RANKS_PER_NODE", per_node)
        nodes = [tuple(range(a, min(a + k, size))) for a in range(0, size, k)]
        for node in nodes:
            if len({machines[r] for r in node}) > 1:
                raise ValueError(f"MLCOMM_RANKS_PER_NODE={k} puts ranks {list(node)} in one "
                                 f"node, but they run on different machines; use a divisor "
                                 f"of the ranks per machine")
    slot = DEFAULT_SLOT_BYTES if slot_bytes is None else config.positive("MLCOMM_SHM_BYTES",
                                                                         slot_bytes)
    return algorithm, tuple(nodes), -(-slot // 64) * 64


def _open(comm, what) -> Session:
    """A new session on ``comm`` (collective): mlcomm's duplicate, the node layout, the
    agreed variables and how its bindings run on this node's cores."""
    dup = _duplicate(comm, what)
    dup.Set_errhandler(MPI.ERRORS_RETURN)
    keep_failure_notice()
    revoke_along(dup, comm)
    rank = dup.Get_rank()
    real = dup.Split_type(MPI.COMM_TYPE_SHARED)
    machine = real.allgather((rank, os.getpid(), _cpus()))
    real.Free()
    local, leader = len(machine), min(r for r, _, _ in machine)
    cores = set().union(*(c for _, _, c in machine))  # the cores the node's ranks may use
    # the pids a wait looks at (mlcomm.runtime.liveness): this machine's that it can see
    pids = [0] * dup.Get_size()
    for r, pid, _ in machine:
        pids[r] = pid if visible(pid) else 0
    default_algorithm, nodes, slot_bytes = _agreed_env(dup, leader)
    node = next(n for n in nodes if rank in n)
    node_comm = dup.Split(nodes.index(node), rank)
    return Session(dup, nodes, node_comm, default_algorithm, slot_bytes,
                   settings_from_env(rank, local / len(cores), pids))


def _delete(comm, keyval, session):
    session.free()


_KEYVAL = MPI.Comm.Create_keyval(delete_fn=_delete)
#: numbers sessions in the order this rank creates them (every rank of a communicator
#: creates its session in the same order relative to the others' it shares)
_CREATED = itertools.count()


def session_of(comm, what="mlcomm") -> Session:
    """The session of ``comm``: created (collectively) on first use, in a call ``what``
    names (for a stall report)."""
    session = comm.Get_attr(_KEYVAL)
    if session is None:
        session = _open(comm, what)
        comm.Set_attr(_KEYVAL, session)
        session.created = next(_CREATED)
        cache.LIVE.add(session)
    return session


def shrink(comm):
    """The survivors' communicator after ``comm`` lost ranks (collective among them, on a
    fault-tolerant MPI): ``comm`` revoked and shrunk (``MPI_Comm_shrink``), its session
    freed on this rank alone; the new communicator's session is set up on its first call
    (node layout, window, ``auto``'s choices). ``comm``'s class is kept (an
    :class:`mlcomm.Comm` stays one)."""
    if not fault_tolerant():
        raise RuntimeError("mlcomm.shrink needs an MPI with fault tolerance (Open MPI run "
                           "with mpiexec --with-ft ulfm); here a lost rank ends the job: "
                           "resubmit it, as mlcomm train --resume does, on the survivors")
    session = comm.Get_attr(_KEYVAL)
    if session is not None:
        revoke(session.comm)  # the survivors' other calls on it end at once
        session.free()
    if not comm.Is_revoked():
        comm.Revoke()
    return type(comm)(comm.Shrink()) if type(comm) is not MPI.Intracomm else comm.Shrink()


#: seconds a rank whose script ended with an unhandled exception waits for the other ranks
#: to end before it ends the job (see the module docstring)
FAILED_GRACE = 2.0
_ended = False


@atexit.register
def _free_all():
    """The end of the job on this rank (see the module docstring); once, before
    MPI_Finalize."""
    global _ended
    if _ended or not MPI.Is_initialized() or MPI.Is_finalized():
        return
    _ended = True
    failed, since = _unhandled(), time.monotonic()
    for session in sorted(cache.LIVE, key=lambda s: s.created):
        if session.lost is not None:  # revoked: nothing to wait for on it
            session.free()
        elif not session.freed:
            _end(session, failed, since)
    free_world()


def _unhandled():
    """The exception that ended the script, if an unhandled one did (None in an
    interactive session, where the last error need not have ended it)."""
    if hasattr(sys, "ps1") or sys.flags.interactive:
        return None
    return getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)


def _end(session, failed, since):
    """This rank's end on ``session``'s communicator: its started calls complete, its
    bindings freed, then a watched barrier with every rank's end (see the module
    docstring)."""
    me = f"mlcomm: rank {session.rank}"

    def failed_long_enough():
        if failed is not None and time.monotonic() - since > FAILED_GRACE:
            abort_job(f"{me} ended with an unhandled exception ({type(failed).__name__}: "
                      f"{failed}) and the other ranks of its communicator have not all "
                      f"ended {FAILED_GRACE:g} s later: ending the job, as they may wait "
                      f"for it")

    if failed is not None and session.progress is not None:
        while not session.progress.drain(0.05):
            failed_long_enough()
    session.free_bindings()
    if session.size == 1:
        return
    status = MPI.Status()

    def check():
        if session.comm.Iprobe(MPI.ANY_SOURCE, TAG, status):  # a program's message
            peer = status.Get_source()
            abort_job(f"{me} has ended its script, but rank {peer} waits for it in a "
                      f"collective of mlcomm's on this communicator that rank {session.rank} "
                      f"never called (rank {peer}'s message of {status.Get_count(MPI.BYTE)} "
                      f"bytes is unreceived): ending the job. Every rank must make the same "
                      f"collective calls on a communicator, in the same order")
        failed_long_enough()

    session.watch.wait(session.comm.Ibarrier, "the end of the job (this rank's script has "
                       "ended; every rank of the communicator meets here before "
                       "MPI_Finalize)", check=check, sleep=True)


if MPI.Is_initialized() and not MPI.Is_finalized():  # an MPI_Finalize the script calls
    MPI.COMM_SELF.Set_attr(MPI.Comm.Create_keyval(delete_fn=lambda *_: _free_all()), True)
