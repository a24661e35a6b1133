"""Run the tests in tests/mpi/ as real mpiexec jobs at several process counts."""

import pytest

from conftest import mpirun

SUITE = "tests/mpi"


@pytest.mark.parametrize("nprocs", [1, 2, 3, 4, 5, 7, 8])
def test_mpi_suite(nprocs):
    proc = mpirun(nprocs, ["-m", "pytest", SUITE, "--with-mpi", "-q", "-x",
                           "-p", "no:cacheprovider", "-o", "addopts="], timeout=600,
                  env={"MLCOMM_MPI_SUITE": "1"})
    assert " passed" in proc.stdout


@pytest.mark.parametrize("nprocs", [1, 3, 8])
def test_verify_command_passes(nprocs):
    proc = mpirun(nprocs, ["-m", "mlcomm", "verify", "--dtype", "int32,float64,bfloat16",
                           "--op", "sum,max,avg,bxor"], timeout=600)
    assert "ALL PASSED" in proc.stdout and "FAIL" not in proc.stdout
