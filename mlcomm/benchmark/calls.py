"""What ``mlcomm bench --collective NAME`` differs in, per collective, in one table: the
buffers each rank gets, the call timed (the ``mpi`` baseline: mpi4py's plain call on the
communicator; an algorithm: the public ``mlcomm.<collective>``), each rank's expected
result for ``--check``, and nccl-tests' bandwidths.

The swept size is each rank's block: an all-gather's contribution, a reduce-scatter's
result, an all-to-all's block to one peer, a gather's or scatter's block of one rank, the
whole vector of an all-reduce, broadcast or reduce. The uneven forms take even counts,
every rank's block that size, so that they time against their even forms.

Bandwidths follow nccl-tests: ``algbw = S / time`` with S nccl-tests' size, the bytes of
the whole collective buffer (``p`` blocks for the collectives whose buffer holds one block
per rank, one block for allreduce, bcast and reduce), and ``busbw = algbw * factor``:
``2(p-1)/p`` for allreduce; ``(p-1)/p`` for reduce_scatter, allgather, alltoall, their
uneven forms, and gather and scatter (as nccl-tests' gather and scatter perf); 1 for bcast
and reduce.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

__all__ = ["CALLS", "BenchCall", "ROOT", "busbw_factor", "nccl_bytes", "counts_of", "inputs",
           "expected"]

#: the root of the rooted collectives
ROOT = 0

_REDUCES = ("allreduce", "reduce_scatter", "reduce", "reduce_scatter_v")
_ROOTED = ("bcast", "reduce", "gather", "scatter", "gatherv", "scatterv")


@dataclass(frozen=True)
class BenchCall:
    """One collective's row of :data:`CALLS`.

    ``send`` and ``recv``: the buffers' length in blocks (-1: p blocks; 0: the call has
    no such buffer); ``whole``: the blocks of nccl-tests' size S; ``factor``: the
    bus-bandwidth factor as the table's header writes it; ``mpi``: the MPI function the
    baseline calls, ``baseline(comm, sb, rb, counts, mop)`` its call bound once;
    ``args(sb, rb, counts, op)``: the positional arguments of ``mlcomm.<name>``.
    """

    name: str
    send: int
    recv: int
    whole: int
    factor: str
    mpi: str
    baseline: Callable
    args: Callable

    @property
    def reduces(self) -> bool:
        return self.name in _REDUCES

    @property
    def rooted(self) -> bool:
        return self.name in _ROOTED

    def mlcomm(self, sb, rb, counts, op, kw):
        """The public function's call, bound once; ``kw``: comm=, algorithm=, --option's."""
        from functools import partial

        from .. import api
        return partial(getattr(api, self.name), *self.args(sb, rb, counts, op), **kw)

    def blocks(self, which: int, p: int) -> int:
        """``send``/``recv``/``whole`` in blocks: -1 stands for p."""
        return p if which < 0 else which

    def has_result(self, rank: int) -> bool:
        """Whether ``rank`` holds a result to check (the root alone for reduce and gather)."""
        return rank == ROOT or self.name not in ("reduce", "gather", "gatherv")


def busbw_factor(collective: str, p: int) -> float:
    """nccl-tests' bus-bandwidth factor of ``collective`` at ``p`` ranks."""
    factor = CALLS[collective].factor
    return {"2(p-1)/p": 2 * (p - 1) / p, "(p-1)/p": (p - 1) / p, "1": 1.0}[factor]


def nccl_bytes(collective: str, p: int, nbytes: int) -> int:
    """nccl-tests' size S of a call whose block is ``nbytes``: the whole buffer's bytes."""
    spec = CALLS[collective]
    return nbytes * spec.blocks(spec.whole, p)


# the public function's positional arguments, from the send and receive buffers, the even
# counts and the op
_REDUCING = lambda sb, rb, counts, op: (sb, rb, op)  # noqa: E731
_MOVING = lambda sb, rb, counts, op: (sb, rb)  # noqa: E731
_ROOTED_ARGS = lambda sb, rb, counts, op: (sb, rb, ROOT)  # noqa: E731
_COUNTED_ROOTED = lambda sb, rb, counts, op: (sb, rb, counts, ROOT)  # noqa: E731


# mpi4py's plain calls on the communicator, bound once
def _plain(method, reduces=False, rooted=False):
    def bind(comm, sb, rb, counts, mop):
        f = getattr(comm, method)
        if reduces and rooted:
            return lambda: f(sb, rb, mop, ROOT)
        if reduces:
            return lambda: f(sb, rb, mop)
        if rooted:
            return lambda: f(sb, rb, ROOT)
        return lambda: f(sb, rb)
    return bind


def _mpi_bcast(comm, sb, rb, counts, mop):
    f = comm.Bcast
    return lambda: f(rb, ROOT)


def _mpi_counted(method, send_counted, recv_counted, rooted=False):
    def bind(comm, sb, rb, counts, mop):
        f = getattr(comm, method)
        s = [sb, list(counts)] if send_counted else sb
        r = [rb, list(counts)] if recv_counted else rb
        if rooted:
            return lambda: f(s, r, ROOT)
        return lambda: f(s, r)
    return bind


def _mpi_reduce_scatter(comm, sb, rb, counts, mop):
    f, counts = comm.Reduce_scatter, list(counts)
    return lambda: f(sb, rb, counts, mop)


P = -1  # p blocks
CALLS: dict[str, BenchCall] = {c.name: c for c in (
    BenchCall("allreduce", 1, 1, 1, "2(p-1)/p", "MPI_Allreduce", _plain("Allreduce", True),
              _REDUCING),
    BenchCall("reduce_scatter", P, 1, P, "(p-1)/p", "MPI_Reduce_scatter_block",
              _plain("Reduce_scatter_block", True), _REDUCING),
    BenchCall("allgather", 1, P, P, "(p-1)/p", "MPI_Allgather", _plain("Allgather"),
              _MOVING),
    BenchCall("bcast", 0, 1, 1, "1", "MPI_Bcast", _mpi_bcast,
              lambda sb, rb, counts, op: (rb, ROOT)),
    BenchCall("reduce", 1, 1, 1, "1", "MPI_Reduce", _plain("Reduce", True, True),
              lambda sb, rb, counts, op: (sb, rb, op, ROOT)),
    BenchCall("gather", 1, P, P, "(p-1)/p", "MPI_Gather", _plain("Gather", rooted=True),
              _ROOTED_ARGS),
    BenchCall("scatter", P, 1, P, "(p-1)/p", "MPI_Scatter", _plain("Scatter", rooted=True),
              _ROOTED_ARGS),
    BenchCall("alltoall", P, P, P, "(p-1)/p", "MPI_Alltoall", _plain("Alltoall"),
              _MOVING),
    BenchCall("allgatherv", 1, P, P, "(p-1)/p", "MPI_Allgatherv",
              _mpi_counted("Allgatherv", False, True),
              lambda sb, rb, counts, op: (sb, rb, counts)),
    BenchCall("reduce_scatter_v", P, 1, P, "(p-1)/p", "MPI_Reduce_scatter",
              _mpi_reduce_scatter, lambda sb, rb, counts, op: (sb, rb, counts, op)),
    BenchCall("gatherv", 1, P, P, "(p-1)/p", "MPI_Gatherv",
              _mpi_counted("Gatherv", False, True, rooted=True), _COUNTED_ROOTED),
    BenchCall("scatterv", P, 1, P, "(p-1)/p", "MPI_Scatterv",
              _mpi_counted("Scatterv", True, False, rooted=True), _COUNTED_ROOTED),
    BenchCall("alltoallv", P, P, P, "(p-1)/p", "MPI_Alltoallv",
              _mpi_counted("Alltoallv", True, True),
              lambda sb, rb, counts, op: (sb, counts, rb, counts)),
)}


def counts_of(collective: str, p: int, n: int):
    """The even counts the uneven forms take (every rank's block ``n`` elements), else None."""
    return (n,) * p if collective.endswith("v") else None


def inputs(collective: str, rank: int, p: int, n: int, dtype, op: str):
    """``rank``'s check data: what it sends (a broadcast's root its vector, the other ranks
    a different one, which the call overwrites)."""
    from .checks import _fill
    spec = CALLS[collective]
    blocks = spec.blocks(spec.send, p) or 1
    fill_op = op if spec.reduces else "sum"
    if collective == "bcast" and rank != ROOT:  # shifted: every element differs from the root's
        return _fill(np.empty(n, dtype), ROOT, p, fill_op, offset=1)
    return _fill(np.empty(blocks * n, dtype), rank, p, fill_op)


def expected(collective: str, rank: int, p: int, n: int, dtype, op: str):
    """``rank``'s result of every rank's :func:`inputs`, computed locally (None where the
    rank has none)."""
    from .checks import _reference
    spec = CALLS[collective]
    if not spec.has_result(rank):
        return None
    mine = slice(rank * n, (rank + 1) * n)
    if spec.reduces:
        whole = _reference(np.dtype(dtype), spec.blocks(spec.send, p) * n, p, op)
        return whole[mine] if collective.startswith("reduce_scatter") else whole
    each = lambda r: inputs(collective, r, p, n, dtype, op)  # noqa: E731
    if collective == "bcast":
        return each(ROOT)
    if collective in ("scatter", "scatterv"):
        return each(ROOT)[mine]
    if collective in ("alltoall", "alltoallv"):
        return np.concatenate([each(r)[mine] for r in range(p)])
    return np.concatenate([each(r) for r in range(p)])  # allgather(v), gather(v)
