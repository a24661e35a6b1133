"""The algorithm registry: every collective's algorithms by name."""

from ._registry import ALGORITHMS, COLLECTIVES, Algorithm, register
from . import (naive, single_master, parameter_server, ring, double_binary_tree,  # noqa: F401
               recursive_halving_doubling, recursive_doubling, shared_memory, hierarchical,
               collectives, shm_collectives, native)
from .native import AUTO, MPI_NATIVE, native_schedule
from .lookup import build_schedules, resolve

__all__ = ["ALGORITHMS", "COLLECTIVES", "Algorithm", "register",
           "AUTO", "MPI_NATIVE", "build_schedules", "native_schedule", "resolve"]
