"""A call of the ``mlcomm`` process group checked on this rank and compared across the
group's ranks (see :mod:`mlcomm.torch.backend`): :class:`Comparison`, a base of
:class:`~mlcomm.torch.group.ProcessGroupMlcomm`, with the checksum rows of one allgather of
``_ROW`` bytes a rank, and the blocking all-reduce of at most 56 bytes that rides in it."""

from __future__ import annotations

import dataclasses
import time
import zlib

import numpy as np
import torch
import torch.distributed as dist

from ..api import Persistent, _check_splits
from ..kernels import BFLOAT16, OP_TABLE, check_op, finalize, reduce_into
from ..runtime.frame import STALLED
from ..session import Call
from ..session.compare import raise_differences
from ..buffers.tensors import as_array

_R = dist.ReduceOp.RedOpType
_OPS = {getattr(_R, op.torch): name for name, op in OP_TABLE.items() if op.torch}
_BOOL_OPS = {"min": "band", "max": "bor"}  # the same on booleans, where mlcomm's min/max refuse
_DTYPES = frozenset({torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
                     torch.uint16, torch.uint32, torch.uint64, torch.float16, torch.bfloat16,
                     torch.float32, torch.float64, torch.complex64, torch.complex128})
_KEEP = 4096  # descriptions kept of the calls run
#: bytes each rank adds to the comparison of a call: its 8-byte checksum, then the data of a
#: blocking all-reduce of at most 56 bytes, which the comparison itself then carries
_ROW = 64


@dataclasses.dataclass(frozen=True)
class _Known:
    """An all-reduce this rank has checked: its mlcomm op and description; where it rides
    in the comparison, the description's checksum, every rank's checksums as bytes, and the
    comparison's buffers as the data's dtype (this rank's part, and each rank's row)."""

    op: str
    described: str
    code: int | None = None
    expected: bytes = b""
    mine: np.ndarray | None = None
    rows: tuple = ()
    numpy: bool = True  # torch's numpy() views the tensor as this dtype (not bfloat16's)


class Comparison:
    """The checks and the comparison of :class:`~mlcomm.torch.group.ProcessGroupMlcomm`'s
    calls; the group sets ``_size`` and ``session``, then calls :meth:`_start_comparison`."""

    def _start_comparison(self, comm):
        """The comparison's communicator (a duplicate of ``comm``: collective) and buffers."""
        self._check_comm = comm.Dup()
        self._mine, self._rows = np.zeros(_ROW, np.uint8), np.zeros((self._size, _ROW), np.uint8)
        # the checksums' words: this rank's, and every rank's as one byte string to compare
        self._mine_code, self._codes = self._mine[:8].view(np.int64), {}
        self._code_rows = self._rows[:, :8]
        self._broken = None  # why the group no longer runs calls (a timed-out comparison)
        self._gather = self._timed(Persistent(Call("allgather", self._mine,
                                                   self._rows.reshape(-1),
                                                   comm=self._check_comm)))

    def _timed(self, handle):
        """``handle`` (the comparison's allgather) as a call that raises RuntimeError ("Timed
        out", gloo's words) where the group's ranks have not all come within the group's
        timeout: every call of the group is compared, so every collective honours it. The
        group then runs no more calls (each raises why), as gloo's. A wait past
        ``MLCOMM_STALL_SECONDS`` is reported once before that, as every wait of mlcomm's."""
        binding, session, timeout = handle.binding, handle.session, self._timeout
        stall = binding.settings.stall_seconds
        tick = min(timeout, stall) if stall else timeout
        binding.set_stall(tick)
        loop = binding.loop

        def gather():
            if self._broken is not None:
                raise RuntimeError(self._broken)
            if session.progress is not None:
                session.progress.drain()
            start, reported = time.monotonic(), False
            code = loop()
            while code == STALLED:
                binding.check_peers()
                waited = time.monotonic() - start
                if waited >= timeout:
                    self._broken = (f"Timed out after {timeout:g} s in the mlcomm group's "
                                    f"comparison of a call: some of its ranks did not call "
                                    f"it (the group's timeout); this group runs no more "
                                    f"calls: create a new one")
                    raise RuntimeError(self._broken)
                if stall and waited >= stall and not reported:
                    binding.report_stall(stall)
                    reported = True
                code = loop()
            if code:
                binding.trouble(code)
        return gather

    def _known_allreduce(self, op, described, t):
        """The :class:`_Known` all-reduce of ``t``: with views of the comparison's buffers
        where it rides in the comparison (at most ``_ROW - 8`` bytes, in a group of more than
        one rank)."""
        nbytes = t.numel() * t.element_size()
        if self._size == 1 or nbytes > _ROW - 8:
            return _Known(op, described)
        dtype = as_array(t, "tensor").dtype
        code, expected = self._code(described, None)
        return _Known(op, described, code, expected, self._mine[8:8 + nbytes].view(dtype),
                      tuple(self._rows[:, 8:8 + nbytes].view(dtype)), dtype != BFLOAT16)

    def _small_allreduce(self, known, t):
        """A blocking all-reduce that rides in its own comparison: one allgather, then each
        rank reduces the gathered rows in rank order (the same bits on every rank)."""
        self.session.wait_started()
        # the caller checked the device and layout; numpy() is the view for most dtypes
        data = (t.numpy() if known.numpy and not t.requires_grad
                else as_array(t, "tensor")).reshape(-1)
        self._mine_code[0] = known.code
        known.mine[...] = data
        self._gather()
        if self._code_rows.tobytes() != known.expected:
            self._differ("all_reduce", known.described, None)
        _reduce_rows(known.rows, known.op, data)

    def _local(self, what, tensors):
        """The problem with this rank's ``tensors`` for ``what``, as an exception; or None."""
        for t in tensors:
            if not isinstance(t, torch.Tensor):
                return TypeError(f"{what}: expected tensors, got {type(t).__name__}")
            if t.device.type != "cpu":
                return TypeError(
                    f"{what}: a {t.device.type} tensor; the mlcomm backend takes CPU tensors. "
                    f"Copy it with .cpu(), or run it on a group of a backend for its device "
                    f"beside this one (dist.new_group(backend='nccl') for CUDA)" + (
                        f". This group was asked for {dist.get_backend(self)!r}, but torch "
                        f"gives a backend written in Python the whole group: there is no "
                        f"other backend in it" if "," in dist.get_backend(self) else ""))
            if t.dtype not in _DTYPES:
                return TypeError(
                    f"{what}: mlcomm has no {t.dtype}; convert the tensor (e.g. "
                    f".to(torch.float32)) or, to move raw bits, view it as .view(torch.uint8)")
            if not t.is_contiguous():
                return ValueError(
                    f"{what}: a non-contiguous tensor (shape {tuple(t.shape)}, strides "
                    f"{t.stride()}); pass a contiguous one: c = t.contiguous(), then copy the "
                    f"result back with t.copy_(c) where the call writes into it")
        return None

    def _describe(self, what, tensors, reduce_op=None, root=None, lists=(), gathered=()):
        """``(problem, mlcomm op, description)`` of the call on this rank: the problem is an
        exception or None. ``lists``: (list, tensor) pairs, each list holding one tensor like
        ``tensor`` per rank; ``gathered``: (big, small) pairs, ``big`` holding one ``small``
        per rank."""
        problem = self._local(what, [*tensors, *(b for b, _ in gathered),
                                     *(t for lst, _ in lists for t in lst)])
        op = None
        if problem is None:
            problem = _shapes(what, self._size, lists, gathered)
        if problem is None and reduce_op is not None:
            problem, op = _op(what, reduce_op.op, tensors)
        if problem is None and root is not None and not 0 <= root < self._size:
            problem = ValueError(f"{what}: root {root} is not a rank of this group of "
                                 f"{self._size}")
        described = what + "".join(f" {t.dtype} {tuple(t.shape)}" for t in tensors) + \
            (f" {op}" if op else "") + (f" root {root}" if root is not None else "")
        return problem, op, described

    def _compare(self, what, described, problem):
        """Raise ``problem`` on this rank, or the difference between the ranks' calls, on
        every rank alike: one allgather of ``_ROW`` bytes a rank, each rank's checksum of
        its call (or of its problem)."""
        if self._size > 1:
            code, expected = self._code(described, problem)
            self._mine_code[0] = code
            self._gather()
            if self._code_rows.tobytes() != expected:
                self._differ(what, described, problem)
        if problem is not None:
            raise problem

    def _compare_splits(self, what, described, problem, sends, recvs):
        """:meth:`_compare`, then whether every rank's ``recvs`` (elements from each rank)
        are what its peers' ``sends`` give it (mlcomm's check of alltoallv's counts, on the
        comparison's communicator): ValueError on every rank where one differs."""
        self._compare(what, described, problem)
        try:
            _check_splits(sends, recvs, self._check_comm)
        except ValueError as exc:
            raise ValueError(f"{what}: the output sizes (output_split_sizes, or the output "
                             f"tensors) differ from what the peers send, in elements: "
                             f"{str(exc).split(': ', 1)[1]}") from None

    def _code(self, described, problem):
        """``(checksum, every rank's checksums as bytes)`` of the call ``described``, or of
        ``problem``, as the ranks that agree gather them."""
        known = self._codes.get(described) if problem is None else None
        if known is None:
            code = zlib.crc32((described if problem is None else str(problem)).encode())
            known = code, np.full(self._size, code, np.int64).tobytes()  # every rank's
            if problem is None and len(self._codes) < _KEEP:
                self._codes[described] = known
        return known

    def _differ(self, what, described, problem):
        """Raise how the ranks' calls differ, or which ranks met a problem (this rank's own
        problem where it met one): the comparison's checksums differed (collective)."""
        everyone = self._check_comm.allgather(
            (described, None if problem is None else f"{type(problem).__name__}: {problem}"))
        raise_differences(everyone, problem, what=what, failed=RuntimeError,
                          hint="; call the same collectives in the same order on every "
                               "rank, with tensors of the same shapes and dtypes and the "
                               "same op and root")


def _op(what, kind, tensors):
    """``(problem, mlcomm op)`` for torch's reduce op ``kind`` (a ``RedOpType``) on
    ``tensors``."""
    name = _OPS.get(kind)
    if name is None:
        return NotImplementedError(
            f"{what}: the mlcomm backend has no {kind}; for PREMUL_SUM multiply the tensor "
            f"by the factor and use ReduceOp.SUM"), None
    if tensors and tensors[0].dtype == torch.bool:
        name = _BOOL_OPS.get(name, name)
    for t in tensors:
        try:
            check_op(as_array(t, "tensor").dtype, name)
        except (TypeError, ValueError) as exc:
            return type(exc)(f"{what} with ReduceOp.{kind.name} on {t.dtype}: {exc}"), None
    return None, name


def _reduce_rows(rows, op, out):
    """``out[:] =`` the arrays ``rows`` (one per rank) reduced in rank order with mlcomm's
    ``op``: the same bits on every rank."""
    if op in ("min", "max") and out.dtype.kind == "f":  # IEEE min/max: mlcomm's kernels
        acc = rows[0].copy()
        for row in rows[1:]:
            reduce_into(acc, np.ascontiguousarray(row), op)
        out[...] = acc
        return
    ufunc = OP_TABLE[op].ufunc
    ufunc(rows[0], rows[1], out=out)
    for row in rows[2:]:
        ufunc(out, row, out=out)
    if op == "avg":
        finalize(out, op, len(rows))


def _shapes(what, size, lists, gathered):
    """The problem, or None: whether the per-rank lists and gathered tensors fit."""
    for lst, t in lists:
        if len(lst) != size or any(x.numel() != t.numel() or x.dtype != t.dtype for x in lst):
            return ValueError(f"{what}: the list must hold {size} tensors (one per rank) of "
                              f"{t.numel()} x {t.dtype}, as the single tensor")
    for big, small in gathered:
        if big.numel() != size * small.numel() or big.dtype != small.dtype:
            return ValueError(f"{what}: the large tensor must hold {size} x {small.numel()} "
                              f"elements of {small.dtype} (one block per rank), got "
                              f"{big.numel()} x {big.dtype}")
    return None
