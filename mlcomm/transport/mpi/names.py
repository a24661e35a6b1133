"""The MPI library's names: its reduction ops as mlcomm's op names, and its error texts."""

from __future__ import annotations

from mpi4py import MPI

from ...kernels import OP_TABLE, OPS, normalize_op

__all__ = ["op_name", "describe_error"]

_MPI_OPS = {name: getattr(MPI, op.mpi) for name, op in OP_TABLE.items()}


def op_name(op) -> str:
    """Normalise an op given by name (or alias) or as an ``MPI.Op`` constant."""
    if isinstance(op, MPI.Op):
        for name, const in _MPI_OPS.items():
            if not OP_TABLE[name].divides and op == const:
                return name
    else:
        try:
            return normalize_op(op)
        except ValueError:
            pass
    raise ValueError(f"op={op!r} is not supported; use one of {', '.join(OPS)} "
                     f"or the matching MPI.Op constant")


def describe_error(code: int) -> str:
    """The MPI library's text for error ``code``."""
    try:
        return MPI.Get_error_string(code)
    except MPI.Exception:
        return f"MPI error {code}"
