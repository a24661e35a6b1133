"""The call: what the caller asked, checked on the local rank alone.

A :class:`Call` holds a collective call as the caller made it (the collective, buffers, op,
communicator, algorithm, root, ``validate`` and the algorithm's options).
:meth:`Call.check` checks every argument against the communicator's size and this rank,
with no message sent, and sets the arrays the plan runs on; every argument error is raised
there, naming the argument and the fix. :func:`mlcomm.session.binder.bind` then binds it.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from mpi4py import MPI

from .. import kernels
from ..algorithms import AUTO, COLLECTIVES, MPI_NATIVE
from ..buffers import gpu, tensors
from ..buffers.arrays import flat
from ..buffers.device import DeviceVector
from ..transport.mpi.names import op_name
from ..transport.native import native_dtype_ok, supports
from .auto import requested

__all__ = ["Call", "SIGNATURE", "comm_of", "overlap"]

#: the fields of a call's signature, which ``validate=True`` compares across the ranks
SIGNATURE = ("collective", "algorithm", "count", "dtype", "op", "root", "options")


def comm_of(comm):
    """``comm`` as the intracommunicator a call runs on (None: ``MPI.COMM_WORLD``)."""
    comm = MPI.COMM_WORLD if comm is None else comm
    if isinstance(comm, MPI.Comm) and comm == MPI.COMM_NULL:
        raise ValueError("comm is MPI.COMM_NULL; pass a valid communicator")
    if not isinstance(comm, MPI.Intracomm):
        raise TypeError(f"comm must be an mpi4py intracommunicator, got {type(comm).__name__}; "
                        f"use MPI.COMM_WORLD, comm.Split(...) or an Intercomm's Merge()")
    return comm


def overlap(a, b) -> bool:
    """Whether two arrays (or device vectors) share memory."""
    return a.overlaps(b) if isinstance(a, DeviceVector) else np.may_share_memory(a, b)


class Call:
    """One collective call as asked (see the module docstring).

    As given: ``collective``, ``sendbuf``, ``recvbuf``, ``op``, ``comm_given``,
    ``algorithm``, ``root``, ``validate``, ``options_given``; ``comm`` is the communicator
    itself. Set by :meth:`check`: ``inp`` and ``out``, the flat arrays the plan reads and
    writes; ``count``; ``opname``; ``name``, the algorithm asked (``auto`` until the binder
    chooses); ``options``; ``offset``, where the input starts within the output, in elements,
    when they share memory (in place), else None.
    """

    __slots__ = ("algorithm", "collective", "comm", "comm_given", "count", "inp", "name",
                 "offset", "op", "opname", "options", "options_given", "out", "recvbuf",
                 "root", "sendbuf", "validate")

    def __init__(self, collective, sendbuf, recvbuf=None, op="sum", comm=None, algorithm=None,
                 root=0, validate=None, options=None):
        self.collective, self.sendbuf, self.recvbuf, self.op = collective, sendbuf, recvbuf, op
        self.comm_given, self.comm = comm, comm_of(comm)
        self.algorithm, self.root, self.validate = algorithm, root, validate
        self.options_given = {} if options is None else options
        self.options = dict(self.options_given)
        self.inp = self.out = self.count = self.opname = self.name = self.offset = None

    def on(self, sendbuf, recvbuf) -> "Call":
        """The same call on other buffers (a device call's host or device copies)."""
        return Call(self.collective, sendbuf, recvbuf, self.op, self.comm_given,
                    self.algorithm, self.root, self.validate, self.options)

    @property
    def on_device(self) -> bool:
        """Whether a buffer is a device array (CuPy, Numba, CUDA array interface, DLPack)."""
        send, recv = self.sendbuf, self.recvbuf
        return (type(send) is not np.ndarray and gpu.is_device_array(send)) or (
            type(recv) is not np.ndarray and gpu.is_device_array(recv))

    def signature(self) -> tuple:
        """The fields of :data:`SIGNATURE`, once checked."""
        return (self.collective, self.name, self.count, self.out.dtype.str, self.opname,
                self.root, sorted(self.options.items()))

    def result(self, rank):
        """What the public function returns, given the output array the plan writes."""
        collective, out, sendbuf, recvbuf = self.collective, self.out, self.sendbuf, self.recvbuf
        if collective == "reduce" and rank != self.root:
            return None
        if collective in ("allreduce", "reduce", "bcast"):
            return _shaped(out, recvbuf if collective != "bcast" else sendbuf, sendbuf)
        if recvbuf is not None and tensors.is_tensor(recvbuf):  # in place: its first block
            return recvbuf if out.size == recvbuf.numel() else \
                recvbuf.detach().view(-1)[:out.size]
        if recvbuf is None and tensors.is_tensor(sendbuf):
            return tensors.like(out, out)
        return out

    def check(self, size, rank, default_algorithm=None, checked_options=None) -> None:
        """Check every argument on this rank of a ``size``-rank communicator and set the
        arrays the plan runs on (see the class docstring). ``checked_options``: a set of the
        option values an empty build has accepted, added to here."""
        collective, sendbuf, root = self.collective, self.sendbuf, self.root
        self.name = name = requested(self.algorithm, collective, default_algorithm)
        self.opname = op_name(self.op) if collective not in ("allgather", "bcast") else "sum"
        if collective in ("bcast", "reduce") and not (isinstance(root, int) and
                                                      0 <= root < size):
            raise ValueError(f"root={root!r} is not a rank of this {size}-rank communicator")
        if collective == "bcast":
            self.out = self.inp = flat(sendbuf, "buf", writable=True)
            self.count, self.offset = self.out.size, 0
        elif sendbuf is MPI.IN_PLACE:
            self._in_place(size, rank)
        else:
            self._apart(size, rank)
        out = self.out
        moves_only = collective in ("allgather", "bcast")  # no op: only the datatype counts
        if not moves_only:
            kernels.check_op(out.dtype, self.opname)
        if name == MPI_NATIVE and not (native_dtype_ok(out.dtype) if moves_only
                                       else supports(out.dtype, self.opname)):
            lacks = f"no {out.dtype} datatype" if not native_dtype_ok(out.dtype) else \
                f"no {self.opname} on {out.dtype}"
            raise TypeError(f"algorithm='mpi' calls the MPI library, which has {lacks}; use "
                            f"one of mlcomm's algorithms (e.g. 'ring') or 'auto'")
        if self.options:
            self._check_options(size, rank, checked_options)

    def _in_place(self, size, rank):
        """``sendbuf=IN_PLACE``: the data is ``recvbuf``."""
        collective = self.collective
        if self.recvbuf is None:
            raise ValueError("sendbuf=IN_PLACE needs recvbuf: the data to reduce in place")
        self.offset = 0
        self.out = self.inp = out = flat(self.recvbuf, "recvbuf", writable=True)
        if collective in ("reduce_scatter", "allgather") and out.size % size:
            raise ValueError(f"in-place {collective}: recvbuf has {out.size} elements, not a "
                             f"multiple of the {size} ranks")
        if collective == "reduce_scatter":
            # the ring schedule reads every input block before it writes the first
            self.out = out[:out.size // size]
        elif collective == "allgather":
            n = out.size // size
            self.inp, self.offset = out[rank * n:(rank + 1) * n], rank * n
        self.count = self.inp.size if collective != "reduce_scatter" else self.out.size

    def _apart(self, size, rank):
        """A separate ``sendbuf`` and ``recvbuf`` (or none: a new output)."""
        collective = self.collective
        self.inp = inp = flat(self.sendbuf, "sendbuf")
        want = {"allreduce": inp.size, "reduce": inp.size, "allgather": inp.size * size,
                "reduce_scatter": inp.size // size}[collective]
        if collective == "reduce_scatter" and inp.size % size:
            raise ValueError(f"reduce_scatter: sendbuf has {inp.size} elements, not a multiple "
                             f"of the {size} ranks; pad it to {-(-inp.size // size) * size}")
        if collective == "reduce" and rank != self.root:
            want = 0  # only the root has a result; the schedule accumulates in its scratch
        if want == 0:
            out = _no_output(inp.dtype) if isinstance(inp, np.ndarray) else inp.empty(0)
        elif self.recvbuf is None:
            out = np.empty(want, inp.dtype) if isinstance(inp, np.ndarray) else inp.empty(want)
        else:
            out = flat(self.recvbuf, "recvbuf", writable=True)
        if out.size != want:
            raise ValueError(f"recvbuf has {out.size} elements but this {collective} needs "
                             f"{want} (sendbuf has {inp.size} on {size} ranks); pass a recvbuf "
                             f"of {want} elements or recvbuf=None")
        if out.dtype != inp.dtype:
            raise TypeError(f"recvbuf dtype {out.dtype} differs from sendbuf dtype "
                            f"{inp.dtype}; use the same dtype for both")
        self.out = out
        self.count = want if collective == "reduce_scatter" else inp.size
        self.offset = _offset(collective, inp, out)

    def _check_options(self, size, rank, checked):
        """The algorithm's own options: names it takes, values its empty build accepts."""
        collective, name, options = self.collective, self.name, self.options
        if name == AUTO:
            raise TypeError(f"options {sorted(options)} need an explicit algorithm, not 'auto'")
        known = COLLECTIVES[collective][name].options
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise TypeError(f"algorithm {name!r} takes no option {unknown}; "
                            f"its options are {sorted(known) or 'none'}")
        key = (collective, name, size, self.out.dtype.itemsize, tuple(sorted(options.items())))
        if checked is None or key not in checked:  # an empty build checks the values once
            COLLECTIVES[collective][name].build(rank, size, 0, self.out.dtype.itemsize,
                                                **options)
            if checked is not None:
                checked.add(key)


def _offset(collective, inp, out):
    """None for disjoint buffers; 0 for the same elements passed twice to an all-reduce or
    reduce (which is in place); a ValueError for any other overlap, as MPI forbids it."""
    if not inp.size or not out.size or not overlap(inp, out):
        return None
    start = (lambda v: v.ptr) if isinstance(out, DeviceVector) else \
        (lambda a: a.__array_interface__["data"][0])
    if collective in ("allreduce", "reduce") and start(inp) == start(out) and \
            inp.size == out.size:
        return 0
    raise ValueError("sendbuf and recvbuf overlap; to work in place pass "
                     "sendbuf=mlcomm.IN_PLACE and the data as recvbuf")


@lru_cache(maxsize=None)
def _no_output(dtype):
    """One empty array per dtype, so that plans stay bound across calls."""
    return np.empty(0, dtype)


def _shaped(result, given, like):
    """The user's own output array (or tensor) when they gave one, else ``result`` shaped
    like ``like`` (a tensor when ``like`` is one)."""
    if type(given) is np.ndarray or given is not None and tensors.is_tensor(given):
        return given  # the result was written into its memory
    if tensors.is_tensor(like):
        return tensors.like(result, like)
    return result.reshape(np.shape(like)) if isinstance(like, np.ndarray) else result
