"""The MPI suite runs inside mpiexec jobs (tests/test_mpi_jobs.py starts them): a failure on
one rank ends the whole job (see abort_on_failure)."""

from abort_on_failure import pytest_runtest_makereport  # noqa: F401 - the hook
