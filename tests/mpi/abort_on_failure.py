"""A pytest plugin for suites that run inside one mpiexec job: a test that fails on any rank,
or a module that fails to import there, ends the whole job at once, with its report,
instead of leaving the other ranks waiting in the next collective until the job's time
limit."""

import pytest


def _end_job(what, text):
    from mpi4py import MPI
    if not MPI.Is_initialized() or MPI.Is_finalized() or MPI.COMM_WORLD.Get_size() == 1:
        return
    from mlcomm.transport.mpi.abort import abort_job
    rank = MPI.COMM_WORLD.Get_rank()
    abort_job(f"\n[rank {rank}] {what}; ending the job\n{text}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        _end_job(f"FAILED {item.nodeid} ({report.when})", report.longreprtext)


def pytest_collectreport(report):
    if report.failed:
        _end_job(f"ERROR collecting {report.nodeid}", report.longreprtext)
