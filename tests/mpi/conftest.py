"""The MPI suite runs inside mpiexec jobs (tests/test_mpi_jobs.py starts them): a failure on
one rank, or a module that fails to import on one rank, ends the whole job (see
abort_on_failure).

The dtype x op matrices run whole at up to 4 ranks. At 5, 6, 7 and 8 ranks, each job runs
every eighth case (case i where ``i % 8 == P % 8``), so the four jobs together run half the
cases once more, each at a rank count of its own, in an eighth of the time: the kernels
behind a case do not change with the rank count, the schedules around them are all run.
"""

from abort_on_failure import pytest_collectreport, pytest_runtest_makereport  # noqa: F401

MATRICES = ("test_dtype_op_matrix", "test_compiled_loop_is_bitwise_the_python_loop")


def pytest_collection_modifyitems(config, items):
    from mpi4py import MPI
    p = MPI.COMM_WORLD.Get_size()
    if p < 5:
        return
    seen = dict.fromkeys(MATRICES, 0)
    keep, drop = [], []
    for item in items:
        name = getattr(item, "originalname", item.name)
        if name in seen:
            index, seen[name] = seen[name], seen[name] + 1
            if index % 8 != p % 8:
                drop.append(item)
                continue
        keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
