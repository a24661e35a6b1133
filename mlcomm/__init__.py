"""mlcomm: hand-written MPI collectives as verified schedules."""

from .transport import startup as _startup

_startup.prepare()  # before the first import of mpi4py.MPI, which initializes MPI

from .algorithms import ALGORITHMS, COLLECTIVES  # noqa: E402
from .api import (IN_PLACE, Persistent, RankLost, Request, allgather, allgatherv,  # noqa: E402
                  allreduce, allreduce_init, alltoall, alltoallv, bcast, gather, gatherv,
                  iallreduce, init, istart, reduce, reduce_scatter, reduce_scatter_v, scatter,
                  scatterv, shrink)
from .comm import Comm  # noqa: E402

_startup.restore()

__all__ = ["ALGORITHMS", "COLLECTIVES", "IN_PLACE", "Comm", "Persistent", "Request",
           "allreduce", "iallreduce", "allreduce_init", "istart", "init", "reduce_scatter",
           "allgather", "bcast", "reduce", "gather", "scatter", "alltoall", "allgatherv",
           "reduce_scatter_v", "gatherv", "scatterv", "alltoallv", "RankLost", "shrink",
           "train"]

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
    if name == "elastic":
        import importlib
        return importlib.import_module(".elastic", __name__)
    raise AttributeError(f"module 'mlcomm' has no attribute {name!r}")
