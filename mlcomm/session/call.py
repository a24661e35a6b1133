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

__all__ = ["Call", "SIGNATURE", "comm_of", "overlap", "MOVES_ONLY", "ROOTED", "COUNTED"]

#: the fields of a call's signature, which ``validate=True`` compares across the ranks
SIGNATURE = ("collective", "algorithm", "count", "dtype", "op", "root", "options", "counts")

#: the collectives that move data and reduce nothing (no op: only the datatype counts)
MOVES_ONLY = frozenset(("allgather", "bcast", "gather", "scatter", "alltoall", "allgatherv",
                        "gatherv", "scatterv", "alltoallv"))
#: the collectives with a root
ROOTED = frozenset(("bcast", "reduce", "gather", "scatter", "gatherv", "scatterv"))
#: the uneven forms with one count per rank (``counts=``); ``alltoallv`` takes
#: ``sendcounts=`` and ``recvcounts=``
COUNTED = frozenset(("allgatherv", "reduce_scatter_v", "gatherv", "scatterv"))
#: the collectives that work in place (``sendbuf=IN_PLACE``; a gather's root only)
_IN_PLACE = frozenset(("allreduce", "reduce", "reduce_scatter", "allgather", "gather",
                       "allgatherv", "gatherv"))
#: the options that are the call's counts, not an algorithm's
_COUNT_OPTIONS = ("counts", "sendcounts", "recvcounts")


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
    when they share memory (in place), else None; ``counts``, the uneven forms' counts as the
    schedule takes them (a dict of tuples, empty for the even forms).

    The uneven forms' counts come in ``options`` (``counts=``, ``sendcounts=``,
    ``recvcounts=``), so that a repeat compares them; :meth:`check` moves them out.
    """

    __slots__ = ("algorithm", "collective", "comm", "comm_given", "count", "counts", "inp",
                 "name", "offset", "op", "opname", "options", "options_given", "out",
                 "recvbuf", "root", "sendbuf", "validate")

    def __init__(self, collective, sendbuf, recvbuf=None, op="sum", comm=None, algorithm=None,
                 root=0, validate=None, options=None):
        self.collective, self.sendbuf, self.recvbuf, self.op = collective, sendbuf, recvbuf, op
        self.comm_given, self.comm = comm, comm_of(comm)
        self.algorithm, self.root, self.validate = algorithm, root, validate
        self.options_given = {} if options is None else options
        self.options = dict(self.options_given)
        self.counts = {k: self.options.pop(k) for k in _COUNT_OPTIONS if k in self.options}
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
        # an uneven form's own count differs from rank to rank; where every rank has the
        # counts (allgatherv, reduce_scatter_v), they are compared instead
        counts = self.counts.get("counts") if self.collective in ("allgatherv",
                                                                  "reduce_scatter_v") else None
        return (self.collective, self.name, 0 if self.counts else self.count,
                self.out.dtype.str, self.opname, self.root, sorted(self.options.items()),
                counts)

    def shared_count(self, size) -> int:
        """The count that every rank's call shares, on which ``auto`` agrees: the schedule's
        count; an uneven all-gather's or reduce-scatter's mean block; 0 for the other uneven
        forms, whose counts differ from rank to rank."""
        counts = self.counts.get("counts")
        if self.collective in ("allgatherv", "reduce_scatter_v"):
            return sum(counts) // size
        return 0 if self.counts else self.count

    def result(self, rank):
        """What the public function returns, given the output array the plan writes."""
        collective, out, sendbuf, recvbuf = self.collective, self.out, self.sendbuf, self.recvbuf
        if collective in ("reduce", "gather", "gatherv") and rank != self.root:
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
        self.opname = op_name(self.op) if collective not in MOVES_ONLY else "sum"
        if collective in ROOTED and not (isinstance(root, int) and 0 <= root < size):
            raise ValueError(f"root={root!r} is not a rank of this {size}-rank communicator")
        self._check_counts(size, rank)
        if collective == "bcast":
            self.out = self.inp = flat(sendbuf, "buf", writable=True)
            self.count, self.offset = self.out.size, 0
        elif sendbuf is MPI.IN_PLACE:
            self._in_place(size, rank)
        else:
            self._apart(size, rank)
        out = self.out
        moves_only = collective in MOVES_ONLY
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

    def _check_counts(self, size, rank):
        """The uneven forms' counts: tuples of ``size`` counts of at least 0 where the rank
        needs them (every rank for allgatherv, reduce_scatter_v and alltoallv; the root for
        gatherv and scatterv, where the other ranks may give them too)."""
        collective, counts = self.collective, self.counts
        names = ("sendcounts", "recvcounts") if collective == "alltoallv" else \
            ("counts",) if collective in COUNTED else ()
        stray = sorted(set(counts) - set(names))
        if stray:
            raise TypeError(f"{collective} takes no {', '.join(stray)}"
                            + (f"; it takes {' and '.join(names)}" if names else ""))
        for name in names:
            given = counts.get(name)
            if given is None:
                if collective in ("gatherv", "scatterv") and rank != self.root:
                    continue
                raise ValueError(f"{collective} needs {name}: one count per rank of the "
                                 f"{size}-rank communicator")
            try:
                given = tuple(int(c) for c in given)
            except (TypeError, ValueError):
                raise TypeError(f"{name} must be a sequence of {size} integers, got "
                                f"{type(given).__name__}") from None
            if len(given) != size or min(given, default=0) < 0:
                raise ValueError(f"{name}={list(given)!r}: give {size} counts (one per rank), "
                                 f"each at least 0")
            counts[name] = given

    def _in_place(self, size, rank):
        """``sendbuf=IN_PLACE``: the data is ``recvbuf`` (for a gather, the root's)."""
        collective = self.collective
        if self.recvbuf is None:
            raise ValueError("sendbuf=IN_PLACE needs recvbuf: the data to reduce in place")
        if collective not in _IN_PLACE:
            raise ValueError(f"{collective} does not work in place here; pass the data as "
                             f"sendbuf and a separate recvbuf")
        if collective in ("gather", "gatherv") and rank != self.root:
            raise ValueError(f"sendbuf=IN_PLACE: only the root ({self.root}) of a "
                             f"{collective} may pass it; this rank passes its data as sendbuf")
        self.offset = 0
        self.out = self.inp = out = flat(self.recvbuf, "recvbuf", writable=True)
        if collective in ("reduce_scatter", "allgather", "gather") and out.size % size:
            raise ValueError(f"in-place {collective}: recvbuf has {out.size} elements, not a "
                             f"multiple of the {size} ranks")
        if collective == "reduce_scatter":
            # the ring schedule reads every input block before it writes the first
            self.out = out[:out.size // size]
        elif collective in ("allgather", "gather", "allgatherv", "gatherv"):
            mine = self.root if collective in ROOTED else rank
            counts = self.counts.get("counts") or (out.size // size,) * size
            if sum(counts) != out.size:
                raise ValueError(f"in-place {collective}: recvbuf has {out.size} elements "
                                 f"but counts sum to {sum(counts)}")
            start = sum(counts[:mine])
            self.inp, self.offset = out[start:start + counts[mine]], start
        self.count = self.inp.size if collective != "reduce_scatter" else self.out.size

    def _apart(self, size, rank):
        """A separate ``sendbuf`` and ``recvbuf`` (or none: a new output)."""
        collective = self.collective
        if collective in ("scatter", "scatterv") and rank != self.root:
            self._scatter_leaf(size, rank)
            return
        self.inp = inp = flat(self.sendbuf, "sendbuf")
        want, self.count = self._extent(size, rank, inp.size)
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
        self.offset = _offset(collective, inp, out)

    def _scatter_leaf(self, size, rank):
        """A scatter's rank other than the root: no input; the output is ``recvbuf``, or
        ``counts[rank]`` new elements of the dtype of ``sendbuf`` (an array, ignored else)."""
        counts = self.counts.get("counts")
        if self.recvbuf is not None:
            out = flat(self.recvbuf, "recvbuf", writable=True)
        elif counts is not None and isinstance(self.sendbuf, np.ndarray):
            out = np.empty(counts[rank], self.sendbuf.dtype)
        else:
            raise ValueError(f"{self.collective}: rank {rank} is not the root ({self.root}); "
                             f"pass recvbuf, the array its block lands in")
        if counts is not None and out.size != counts[rank]:
            raise ValueError(f"recvbuf has {out.size} elements but counts[{rank}] is "
                             f"{counts[rank]}")
        self.out, self.inp, self.count, self.offset = out, _no_output(out.dtype), out.size, None

    def _extent(self, size, rank, n) -> tuple:
        """``(output elements, the schedule's count)`` for ``n`` input elements."""
        collective, root = self.collective, rank == self.root
        counts = self.counts.get("counts")
        if collective in ("reduce_scatter", "alltoall") or collective == "scatter" and root:
            if n % size:
                raise ValueError(f"{collective}: sendbuf has {n} elements, not a multiple of "
                                 f"the {size} ranks; pad it to {-(-n // size) * size}")
            block = n // size
            return (n, block) if collective == "alltoall" else (block, block)
        if collective in ("allgatherv", "gatherv") and counts is not None and \
                counts[rank] != n:
            raise ValueError(f"counts[{rank}] is {counts[rank]} but sendbuf has {n} elements; "
                             f"give this rank's own count there")
        if collective == "alltoallv":
            sends, recvs = self.counts["sendcounts"], self.counts["recvcounts"]
            if sum(sends) != n:
                raise ValueError(f"sendcounts sum to {sum(sends)} but sendbuf has {n} "
                                 f"elements")
            return sum(recvs), n
        if collective in ("reduce_scatter_v", "scatterv"):
            if sum(counts) != n:
                raise ValueError(f"counts sum to {sum(counts)} but sendbuf has {n} elements")
            return counts[rank], counts[rank]
        whole = {"allgather": n * size, "gather": n * size, "allgatherv": sum(counts or ()),
                 "gatherv": sum(counts or ())}.get(collective, n)
        if collective in ("reduce", "gather", "gatherv") and not root:
            whole = 0  # only the root has a result; a reduce accumulates in its scratch
        return whole, n

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
                                                **options, **{k: (0,) * size
                                                              for k in self.counts})
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
