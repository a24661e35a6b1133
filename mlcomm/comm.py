"""``mlcomm.Comm``: an mpi4py Intracomm whose collectives run mlcomm's algorithms.

It shares the wrapped communicator's handle, takes every buffer form mpi4py
takes, and hands anything mlcomm cannot reduce (a derived datatype, a
user-defined op, long double ...) to the MPI library's own call. Its
``algorithm`` runs in each collective that has an algorithm of that name (or
alias); a collective without one runs its ``auto``. The communicators it makes
(``Dup``, ``Split`` ...) are ``mlcomm.Comm`` objects with the same ``algorithm``.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from . import api, kernels
from .buffers import gpu
from .buffers.arrays import from_spec, from_vspec, packed
from .algorithms import AUTO, COLLECTIVES, check_known, resolve
from .session import session_of
from .transport.mpi.names import op_name

__all__ = ["Comm"]


def _plain(*specs):
    try:
        return [from_spec(s) for s in specs]
    except (TypeError, ValueError, KeyError):
        return None


def _whole(*specs):
    """:func:`_plain` for specs that give no count (a buffer, or ``[buffer, datatype]``):
    a count in a spec of an all-to-all, gather or scatter is per rank, which the library
    takes."""
    if any(isinstance(s, (list, tuple)) and not (len(s) == 2 and
                                                  isinstance(s[1], MPI.Datatype))
           for s in specs):
        return None
    return _plain(*specs)


def _per_collective(algorithm) -> dict:
    """``{collective: the algorithm= it is called with}`` for a Comm's ``algorithm``: None
    everywhere for None (``MLCOMM_ALGORITHM``, else auto); else the collective's algorithm of
    that name or alias, or ``auto`` where it has none. A name no collective has is an error."""
    if algorithm is None:
        return dict.fromkeys(COLLECTIVES)
    if not isinstance(algorithm, str):
        raise TypeError(f"algorithm must be a name (str) or None, got {type(algorithm).__name__}")
    names = {}
    for collective in COLLECTIVES:
        try:
            names[collective] = AUTO if algorithm == AUTO else resolve(algorithm, collective)
        except ValueError:
            names[collective] = AUTO
    check_known(algorithm)
    return names


class Comm(MPI.Intracomm):
    """``mlcomm.Comm(comm, algorithm=None)``: switch existing mpi4py code with one line.

    ``algorithm`` runs in each collective that has an algorithm of that name (``ring`` in
    Allreduce, Reduce_scatter_block and Allgather; ``recursive_doubling`` in Allreduce and
    Allgather; ``binary_tree`` and ``binomial`` in Bcast and Reduce; ``mpi``,
    ``shared_memory`` and ``auto`` in all); the others run their ``auto``. None:
    ``MLCOMM_ALGORITHM``, else ``auto``. ``Dup``, ``Split`` and the other constructors
    return ``mlcomm.Comm`` objects with the same ``algorithm``.
    """

    def __new__(cls, comm=None, algorithm=None):
        self = super().__new__(cls, MPI.COMM_WORLD if comm is None else comm)
        self.algorithm = algorithm
        return self

    @property
    def algorithm(self):
        """The algorithm asked for (None: ``MLCOMM_ALGORITHM``, else ``auto``)."""
        return self._algorithm

    @algorithm.setter
    def algorithm(self, name):
        self._algorithms = _per_collective(name)
        self._algorithm = name

    # communicators made from this one: mlcomm.Comm objects with the same algorithm

    def _derived(self, comm):
        if comm == MPI.COMM_NULL:  # e.g. Split with color MPI.UNDEFINED
            return comm
        if not isinstance(comm, Comm):
            comm = Comm(comm)
        comm.algorithm = self._algorithm
        return comm

    def Dup(self, info=None):
        return self._derived(super().Dup(info))

    def Dup_with_info(self, info):
        return self._derived(super().Dup_with_info(info))

    def Idup(self, info=None):
        comm, request = super().Idup(info)
        return self._derived(comm), request

    def Idup_with_info(self, info):
        comm, request = super().Idup_with_info(info)
        return self._derived(comm), request

    def Clone(self):
        return self._derived(super().Clone())

    def Split(self, color=0, key=0):
        return self._derived(super().Split(color, key))

    def Split_type(self, split_type, key=0, info=MPI.INFO_NULL):
        return self._derived(super().Split_type(split_type, key, info))

    def Create(self, group):
        return self._derived(super().Create(group))

    def Create_group(self, group, tag=0):
        return self._derived(super().Create_group(group, tag))

    # collectives

    def _library(self, nonblocking, name, *args):
        """The MPI library's own collective (what mlcomm does not reduce): its non-blocking
        form, waited for as mlcomm's own waits are (yielding the CPU; a stall reported
        with the ranks that have not arrived)."""
        watch = session_of(self, name).watch
        start = getattr(MPI.Intracomm, nonblocking)
        watch.wait(lambda: start(self, *args), f"{name} (the MPI library's, through "
                                               f"mlcomm.Comm)")

    def _reducible(self, arrays, op):
        if arrays is None or any(a is None for a in arrays):
            return None
        dtype = next(a.dtype for a in arrays if a is not MPI.IN_PLACE)
        try:
            name = op_name(op)
        except ValueError:
            return None
        return name if kernels.is_supported(dtype, name) else None

    def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM):
        if gpu.is_device_array(sendbuf) or gpu.is_device_array(recvbuf):
            api.allreduce(sendbuf, recvbuf, op_name(op), comm=self,
                          algorithm=self._algorithms["allreduce"])
            return
        arrays = _plain(sendbuf, recvbuf)
        name = self._reducible(arrays, op)
        if name is None:
            return self._library("Iallreduce", "Allreduce", sendbuf, recvbuf, op)
        api.allreduce(arrays[0], arrays[1], name, comm=self,
                      algorithm=self._algorithms["allreduce"])

    def Reduce_scatter_block(self, sendbuf, recvbuf, op=MPI.SUM):
        arrays = _plain(sendbuf, recvbuf)
        name = self._reducible(arrays, op)
        if name is None:
            return self._library("Ireduce_scatter_block", "Reduce_scatter_block", sendbuf,
                                 recvbuf, op)
        api.reduce_scatter(arrays[0], arrays[1], name, comm=self,
                           algorithm=self._algorithms["reduce_scatter"])

    def Allgather(self, sendbuf, recvbuf):
        arrays = _plain(sendbuf, recvbuf)
        if arrays is None or any(a is None for a in arrays):
            return self._library("Iallgather", "Allgather", sendbuf, recvbuf)
        api.allgather(arrays[0], arrays[1], comm=self, algorithm=self._algorithms["allgather"])

    def Bcast(self, buf, root=0):
        arrays = _plain(buf)
        if arrays is None or arrays[0] is None:
            return self._library("Ibcast", "Bcast", buf, root)
        api.bcast(arrays[0], root, comm=self, algorithm=self._algorithms["bcast"])

    def Reduce(self, sendbuf, recvbuf, op=MPI.SUM, root=0):
        if self.Get_rank() != root:
            recvbuf = None
        arrays = _plain(sendbuf, recvbuf)
        # recvbuf matters only at the root; elsewhere it was set to None above
        name = self._reducible(arrays if arrays is None or self.Get_rank() == root
                               else arrays[:1], op)
        if name is None:
            return self._library("Ireduce", "Reduce", sendbuf, recvbuf, op, root)
        api.reduce(arrays[0], arrays[1], name, root, comm=self,
                   algorithm=self._algorithms["reduce"])

    # A rooted collective's path must be the same on every rank: where the root's buffers
    # are plain, its in-place forms (None as mpi4py takes it, or IN_PLACE) run in mlcomm too.

    def Gather(self, sendbuf, recvbuf, root=0):
        root_here = self.Get_rank() == root
        if root_here and sendbuf is None:
            sendbuf = MPI.IN_PLACE
        arrays = _whole(sendbuf, recvbuf if root_here else None)
        if arrays is None or arrays[0] is None or root_here and arrays[1] is None:
            return self._library("Igather", "Gather", sendbuf, recvbuf, root)
        api.gather(arrays[0], arrays[1], root, comm=self, algorithm=self._algorithms["gather"])

    def Scatter(self, sendbuf, recvbuf, root=0):
        root_here = self.Get_rank() == root
        arrays = _whole(sendbuf if root_here else None, recvbuf)
        if arrays is not None and root_here and arrays[0] is not None and \
                (arrays[1] is None or arrays[1] is MPI.IN_PLACE):  # its block stays put
            arrays[1] = np.empty(arrays[0].size // self.Get_size(), arrays[0].dtype)
        if arrays is None or arrays[1] is None or arrays[1] is MPI.IN_PLACE or \
                root_here and arrays[0] is None:
            return self._library("Iscatter", "Scatter", sendbuf, recvbuf, root)
        api.scatter(arrays[0], arrays[1], root, comm=self,
                    algorithm=self._algorithms["scatter"])

    def Alltoall(self, sendbuf, recvbuf):
        arrays = _whole(sendbuf, recvbuf)
        if arrays is None or any(a is None or a is MPI.IN_PLACE for a in arrays):
            return self._library("Ialltoall", "Alltoall", sendbuf, recvbuf)
        api.alltoall(arrays[0], arrays[1], comm=self, algorithm=self._algorithms["alltoall"])

    def _vector(self, spec):
        """``(blocks, counts, unpack)`` of a vector spec (:func:`packed`), or None where the
        library takes it."""
        try:
            found = from_vspec(spec, self.Get_size())
        except (TypeError, ValueError, KeyError):
            return None
        if found is None or found is MPI.IN_PLACE:
            return None
        blocks, unpack = packed(*found)
        return blocks, found[1], unpack

    @staticmethod
    def _done(*vectors):
        for v in vectors:
            if v is not None and v[2] is not None:
                v[2]()

    def Gatherv(self, sendbuf, recvbuf, root=0):
        root_here = self.Get_rank() == root
        if root_here and sendbuf is None:
            sendbuf = MPI.IN_PLACE
        send = _plain(sendbuf)
        recv = self._vector(recvbuf) if root_here else None
        if send is None or send[0] is None or send[0] is MPI.IN_PLACE and not root_here or \
                root_here and recv is None:
            return self._library("Igatherv", "Gatherv", sendbuf, recvbuf, root)
        api.gatherv(send[0], recv and recv[0], recv and recv[1], root, comm=self,
                    algorithm=self._algorithms["gatherv"])
        self._done(recv)

    def Scatterv(self, sendbuf, recvbuf, root=0):
        root_here = self.Get_rank() == root
        send = self._vector(sendbuf) if root_here else None
        recv = _plain(recvbuf)
        if recv is not None and root_here and send is not None and \
                (recv[0] is None or recv[0] is MPI.IN_PLACE):  # its block stays put
            recv = [np.empty(send[1][root], send[0].dtype)]
        if recv is None or recv[0] is None or recv[0] is MPI.IN_PLACE or \
                root_here and send is None:
            return self._library("Iscatterv", "Scatterv", sendbuf, recvbuf, root)
        api.scatterv(send and send[0], recv[0], send and send[1], root, comm=self,
                     algorithm=self._algorithms["scatterv"])

    def Allgatherv(self, sendbuf, recvbuf):
        send, recv = _plain(sendbuf), self._vector(recvbuf)
        if send is None or send[0] is None or send[0] is MPI.IN_PLACE or recv is None:
            return self._library("Iallgatherv", "Allgatherv", sendbuf, recvbuf)
        api.allgatherv(send[0], recv[0], recv[1], comm=self,
                       algorithm=self._algorithms["allgatherv"])
        self._done(recv)

    def Alltoallv(self, sendbuf, recvbuf):
        send, recv = self._vector(sendbuf), self._vector(recvbuf)
        if send is None or recv is None:
            return self._library("Ialltoallv", "Alltoallv", sendbuf, recvbuf)
        api.alltoallv(send[0], send[1], recv[0], recv[1], comm=self,
                      algorithm=self._algorithms["alltoallv"])
        self._done(recv)

    def Reduce_scatter(self, sendbuf, recvbuf, recvcounts=None, op=MPI.SUM):
        arrays = _plain(sendbuf, recvbuf)
        name = self._reducible(arrays, op)
        if name is None or recvcounts is None or arrays[0] is MPI.IN_PLACE or \
                sendbuf is recvbuf:  # in place, which mpi4py takes the same buffer as
            return self._library("Ireduce_scatter", "Reduce_scatter", sendbuf, recvbuf,
                                 recvcounts, op)
        api.reduce_scatter_v(arrays[0], arrays[1], tuple(recvcounts), name, comm=self,
                             algorithm=self._algorithms["reduce_scatter_v"])
