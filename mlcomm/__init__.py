"""mlcomm: hand-written MPI all-reduce algorithms as verified schedules."""

from .algorithms import ALGORITHMS, COLLECTIVES
from .api import (IN_PLACE, Persistent, Request, allgather, allreduce, allreduce_init, bcast,
                  iallreduce, reduce, reduce_scatter)
from .comm import Comm

__all__ = ["ALGORITHMS", "COLLECTIVES", "IN_PLACE", "Comm", "Persistent", "Request",
           "allreduce", "iallreduce", "allreduce_init", "reduce_scatter", "allgather", "bcast",
           "reduce", "train"]

def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version("mlcomm")
    except PackageNotFoundError:  # a source tree that was never installed
        return "unknown"


__version__ = _version()


def __getattr__(name):
    # The trainer pulls in scikit-learn; load it only when asked for.
    if name == "train":
        from .trainer import train
        return train
    raise AttributeError(f"module 'mlcomm' has no attribute {name!r}")
