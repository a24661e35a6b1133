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


def runs_here(names, collective="allreduce", comm=COMM) -> list:
    """``names`` less the algorithms that cannot run on ``comm``'s node layout, as their
    registry entries say (``shared_memory`` across nodes); None and ``auto`` stay. The suite
    runs on virtual nodes too (``MLCOMM_RANKS_PER_NODE``), where ``test_node_aware.py``
    checks the error that the others raise."""
    from mlcomm import session
    from mlcomm.algorithms import COLLECTIVES, Layout
    layout = Layout(comm.Get_size(), session.session_of(comm).nodes)
    return [n for n in names
            if n in (None, "auto") or COLLECTIVES[collective][n].applies(layout)]


class DeviceLike:
    """Exposes ``__cuda_array_interface__`` only: checks must refuse it before any CUDA call."""
    __cuda_array_interface__ = {"shape": (4,), "typestr": "<f8", "data": (0, False),
                                "version": 3}


@pytest.fixture
def comm():
    return COMM
