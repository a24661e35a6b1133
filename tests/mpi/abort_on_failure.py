"""A pytest plugin for suites that run inside one mpiexec job: a test that fails on any rank
ends the whole job at once, with its report, instead of leaving the other ranks waiting in
the next test's collective until the job's time limit."""

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    from mpi4py import MPI
    if not MPI.Is_initialized() or MPI.Is_finalized() or MPI.COMM_WORLD.Get_size() == 1:
        return
    from mlcomm.transport.mpi.abort import abort_job
    rank = MPI.COMM_WORLD.Get_rank()
    abort_job(f"\n[rank {rank}] FAILED {item.nodeid} ({report.when}); ending the job\n"
              f"{report.longreprtext}")
