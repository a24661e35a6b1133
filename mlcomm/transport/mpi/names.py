"""The MPI library's names: its reduction ops as mlcomm's op names, and its error texts."""

from __future__ import annotations

from mpi4py import MPI

from ...kernels import OP_TABLE, OPS, normalize_op

__all__ = ["op_name", "describe_error", "is_failure"]

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


def _failure_classes() -> set:
    return {getattr(MPI, name) for name in ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING",
                                            "ERR_REVOKED") if hasattr(MPI, name)}


def is_failure(code) -> bool:
    """Whether MPI error ``code`` says a process failed or the communicator was revoked (a
    fault-tolerant MPI's errors)."""
    if code is None or code == MPI.SUCCESS:
        return False
    try:
        return MPI.Get_error_class(int(code)) in _failure_classes()
    except MPI.Exception:
        return False
