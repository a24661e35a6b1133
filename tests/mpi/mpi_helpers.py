"""Helpers for tests that run inside an mpiexec job (every rank runs pytest).

Assertions go through :func:`agree`, so a failure on one rank fails the test on
every rank instead of leaving the others waiting in the next collective.
"""

import pytest
from mpi4py import MPI

COMM = MPI.COMM_WORLD


def agree(ok, message=""):
    """Fail on every rank if ``ok`` is false on any rank."""
    bad = COMM.allgather(bool(ok))
    ranks = [r for r, good in enumerate(bad) if not good]
    assert not ranks, f"failed on ranks {ranks}: {message}"


class DeviceLike:
    """Exposes ``__cuda_array_interface__`` only: checks must refuse it before any CUDA call."""
    __cuda_array_interface__ = {"shape": (4,), "typestr": "<f8", "data": (0, False),
                                "version": 3}


@pytest.fixture
def comm():
    return COMM
