"""The algorithm registry: every collective's algorithms by name, and where each applies."""

from ._registry import ALGORITHMS, COLLECTIVES, Algorithm, Layout, register, weighed
from ._window import DEFAULT_SLOT_BYTES
from . import (naive, single_master, parameter_server, ring, double_binary_tree,  # noqa: F401
               recursive_halving_doubling, recursive_doubling, shared_memory, hierarchical,
               collectives, allgather, reduce_scatter, bcast, reduce, shm_collectives,
               shm_exchange, gather_scatter, uneven, alltoall, native, auto)
from .auto import AUTO
from .native import MPI_NATIVE, native_schedule
from .lookup import build_schedules, check_known, resolve

__all__ = ["ALGORITHMS", "COLLECTIVES", "Algorithm", "Layout", "register", "weighed",
           "DEFAULT_SLOT_BYTES", "AUTO", "MPI_NATIVE", "build_schedules", "check_known",
           "native_schedule", "resolve"]
