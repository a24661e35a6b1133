"""The exchanges of the ``mlcomm`` process group (see :mod:`mlcomm.torch.backend`): torch's
``gather``, ``scatter``, ``all_to_all``, ``all_to_all_single`` and the uneven ``all_gather``
(output tensors of different sizes), as :class:`Exchange`, a base of
:class:`~mlcomm.torch.group.ProcessGroupMlcomm`, on mlcomm's ``gather``, ``scatter``,
``alltoall``, ``alltoallv`` and ``allgatherv``. torch's object collectives
(``gather_object``, ``scatter_object_list``, ``all_gather_object``) run on these."""

from __future__ import annotations

import math
from functools import partial

import torch
import torch.distributed as dist

from ..api import alltoall, alltoallv, allgatherv, gather, scatter


class Exchange:
    """The exchanges; the group has ``_rank``, ``_size``, ``_describe``, ``_local`` and
    ``_go``. Each is compared across the ranks and runs blocking or started as every
    collective of the group does; where each rank's sizes are its own (``all_to_all``,
    ``all_to_all_single`` with split sizes) the comparison is followed by a check that
    every rank receives what its peers send (:meth:`~.Comparison._compare_splits`)."""

    def gather(self, output_tensors, input_tensors, opts=None):
        """``output_tensors``: ``[gather_list]`` on the root, ``[]`` elsewhere (torch's)."""
        opts = opts or dist.GatherOptions()
        (t,), root = input_tensors, opts.rootRank
        here = self._rank == root
        outputs = output_tensors[0] if here and output_tensors else []
        problem, _, described = self._describe("gather", input_tensors, root=root,
                                               lists=[(outputs, t)] if here else ())
        flat = torch.empty((self._size, *t.shape), dtype=t.dtype) \
            if problem is None and here else None
        return self._go("gather", described, problem, [("gather", t, flat, "sum", root)],
                        outputs, opts.asyncOp,
                        after=partial(copy_into, outputs, flat) if here else None)

    def scatter(self, output_tensors, input_tensors, opts=None):
        """``input_tensors``: ``[scatter_list]`` on the root, ``[]`` elsewhere (torch's)."""
        opts = opts or dist.ScatterOptions()
        (t,), root = output_tensors, opts.rootRank
        here = self._rank == root
        inputs = input_tensors[0] if here and input_tensors else []
        problem, _, described = self._describe("scatter", output_tensors, root=root,
                                               lists=[(inputs, t)] if here else ())
        flat = packed(inputs) if problem is None and here else None
        return self._go("scatter", described, problem, [("scatter", flat, t, "sum", root)],
                        [t], opts.asyncOp)

    def alltoall(self, output_tensors, input_tensors, opts=None):
        """Rank r's ``input_tensors[j]`` into rank j's ``output_tensors[r]``: tensors of any
        sizes, packed one after another (``alltoallv``)."""
        opts = opts or dist.AllToAllOptions()
        what = "all_to_all"
        problem = self._local(what, [*input_tensors, *output_tensors]) or \
            _per_rank(what, self._size, input_tensors, output_tensors)
        dtype = (input_tensors or output_tensors or [torch.empty(0)])[0].dtype
        sends = [t.numel() for t in input_tensors]
        recvs = [t.numel() for t in output_tensors]
        flat_in = packed(input_tensors) if problem is None else None
        flat_out = torch.empty(sum(recvs), dtype=dtype) if problem is None else None
        return self._go("alltoall", f"{what} {dtype} of {self._size}", problem,
                        [("alltoallv", flat_in, flat_out, "sum", 0)], output_tensors,
                        opts.asyncOp, after=partial(copy_into, output_tensors,
                                                    _split(flat_out, recvs)),
                        splits=(sends, recvs), sendcounts=sends, recvcounts=recvs)

    def all_to_all_single(self, output, input, output_split_sizes=(), input_split_sizes=(),
                          opts=None):
        """Rows (dim 0) of ``input``: ``input_split_sizes[j]`` of them to rank j, or equal
        parts; rank j's rows to this rank into ``output``, after one another."""
        opts = opts or dist.AllToAllOptions()
        what = "all_to_all_single"
        if not output_split_sizes and not input_split_sizes:  # equal blocks: alltoall
            problem, _, described = self._describe(what, [input, output])
            problem = problem or _equal(what, self._size, input, output)
            return self._go("alltoall_base", described, problem,
                            [("alltoall", input, output, "sum", 0)], [output], opts.asyncOp)
        problem = self._local(what, [input, output])
        sends, problem = _split_counts(what, "input", input, input_split_sizes, self._size,
                                       problem)
        recvs, problem = _split_counts(what, "output", output, output_split_sizes,
                                       self._size, problem)
        return self._go("alltoall_base", f"{what} {input.dtype} {output.dtype} split",
                        problem, [("alltoallv", input, output, "sum", 0)], [output],
                        opts.asyncOp, splits=(sends, recvs), sendcounts=sends,
                        recvcounts=recvs)

    alltoall_base = all_to_all_single  # torch's older name

    def _allgather_v(self, outputs, t, opts):
        """all_gather into output tensors of different sizes: rank r's tensor into
        ``outputs[r]`` (``allgatherv``, its counts the outputs' sizes, the same list on every
        rank)."""
        what = "all_gather"
        problem, _, described = self._describe(what, outputs)
        problem = problem or self._local(what, [t]) or _uneven(what, self._size,
                                                               self._rank, outputs, t)
        counts = [o.numel() for o in outputs]
        flat = torch.empty(sum(counts), dtype=t.dtype) if problem is None else None
        return self._go("allgather", described, problem, [("allgatherv", t, flat, "sum", 0)],
                        outputs, opts.asyncOp, after=partial(copy_into, outputs,
                                                             _split(flat, counts)),
                        counts=counts)


def packed(tensors):
    """The tensors' elements one after another, in a new flat tensor."""
    return torch.cat([t.reshape(-1) for t in tensors])


def copy_into(outputs, parts):
    """Copy each of ``parts`` into the tensor of ``outputs`` at its place (same sizes)."""
    for out, part in zip(outputs, parts):
        out.copy_(part.reshape(out.shape))


def _split(flat, counts):
    return None if flat is None else torch.split(flat, counts)


def _per_rank(what, size, inputs, outputs):
    """The problem, or None: a list of one tensor per rank each, of one dtype."""
    if len(inputs) != size or len(outputs) != size:
        return ValueError(f"{what}: pass one input and one output tensor per rank ({size}), "
                          f"got {len(inputs)} and {len(outputs)}")
    if len({t.dtype for t in (*inputs, *outputs)}) > 1:
        return ValueError(f"{what}: the tensors must be of one dtype, got "
                          f"{sorted({str(t.dtype) for t in (*inputs, *outputs)})}")
    return None


def _equal(what, size, input, output):
    """The problem, or None: ``all_to_all_single`` without split sizes."""
    if input.dtype != output.dtype or input.numel() != output.numel() or \
            input.numel() % size:
        return ValueError(f"{what} without split sizes: input and output must hold the same "
                          f"number of elements of one dtype, a multiple of the {size} ranks; "
                          f"got {input.numel()} x {input.dtype} and {output.numel()} x "
                          f"{output.dtype}")
    return None


def _split_counts(what, name, t, splits, size, problem):
    """``(elements per rank, problem)`` of ``t`` cut along dim 0 by ``splits`` (empty:
    equal parts): a split of k rows is k * prod(shape[1:]) elements."""
    if problem is not None:
        return [0] * size, problem
    rows, row = (t.shape[0], math.prod(t.shape[1:])) if t.dim() else (1, 1)
    splits = list(splits) if splits else [rows // size] * size if rows % size == 0 else None
    if splits is None:
        return [0] * size, ValueError(
            f"{what}: {name} has {rows} rows (dim 0), which the {size} ranks do not divide; "
            f"give {name}_split_sizes")
    if len(splits) != size or any(s < 0 for s in splits) or sum(splits) != rows:
        return [0] * size, ValueError(
            f"{what}: {name}_split_sizes must be {size} counts of at least 0 (one per rank) "
            f"that sum to {name}'s {rows} rows (dim 0); got {splits}")
    return [s * row for s in splits], None


def _uneven(what, size, rank, outputs, t):
    """The problem, or None: one output per rank, of the input's dtype, this rank's of the
    input's size."""
    if len(outputs) != size or any(o.dtype != t.dtype for o in outputs):
        return ValueError(f"{what}: the list must hold {size} tensors (one per rank) of "
                          f"{t.dtype}")
    if outputs[rank].numel() != t.numel():
        return ValueError(f"{what}: output {rank} (this rank's) holds {outputs[rank].numel()} "
                          f"elements, the input {t.numel()}; each rank's output must be of "
                          f"that rank's input's size")
    return None


#: the blocking mlcomm calls of the exchanges, as group.py's ``_BLOCKING`` takes them
BLOCKING = {
    "gather": lambda s, r, op, root, **kw: gather(s, r, root, **kw),
    "scatter": lambda s, r, op, root, **kw: scatter(s, r, root, **kw),
    "alltoall": lambda s, r, op, root, **kw: alltoall(s, r, **kw),
    "alltoallv": lambda s, r, op, root, sendcounts, recvcounts, **kw: alltoallv(
        s, sendcounts, r, recvcounts, **kw),
    "allgatherv": lambda s, r, op, root, counts, **kw: allgatherv(s, r, counts, **kw),
}
