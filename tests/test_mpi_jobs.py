"""Run the tests in tests/mpi/ as real mpiexec jobs at several process counts."""

import time

import pytest

from conftest import ROOT, assert_suite_passed, mpirun

SUITE = "tests/mpi"


@pytest.mark.parametrize("nprocs", [1, 2, 3, 5, 6, 7])
def test_mpi_suite(nprocs):
    """The whole suite at 1 to 3 and 5 to 7 ranks; the dtype x op matrices (the kernels',
    and the compiled loop against the Python loop) at 1 to 3: neither changes with the rank
    count, and the local executor proves every schedule exact for p = 1 to 64. Four and
    eight ranks, the powers of two past 2, run the node-aware suite below (and eight
    ``verify``, every algorithm against the library)."""
    select = ["-k", "not matrix and not bitwise_the_python_loop"] if nprocs >= 4 else []
    proc = mpirun(nprocs, ["-m", "pytest", SUITE, "--with-mpi", "-q", "-x", "--color=no",
                           "-ra", "-p", "no:cacheprovider", "-o", "addopts=", *select],
                  timeout=600, env={"MLCOMM_MPI_SUITE": "1"})
    assert_suite_passed(proc)


@pytest.mark.parametrize("nprocs", [1, 3, 8])
def test_verify_command_passes(nprocs):
    proc = mpirun(nprocs, ["-m", "mlcomm", "verify", "--dtype", "int32,float64,bfloat16",
                           "--op", "sum,max,avg,bxor"], timeout=600)
    assert "ALL PASSED" in proc.stdout and "FAIL" not in proc.stdout


#: a test module that fails on rank 1 only, what it says, and what the plugin reports
ONE_RANK_FAILS = {
    "test": ("from mpi4py import MPI\n\n"
             "def test_fails_on_rank_1():\n"
             "    assert MPI.COMM_WORLD.Get_rank() != 1, 'rank 1 disagrees'\n\n"
             "def test_then_a_collective():\n"
             "    MPI.COMM_WORLD.Barrier()\n", "rank 1 disagrees", "[rank 1] FAILED"),
    "import": ("from mpi4py import MPI\n\n"
               "if MPI.COMM_WORLD.Get_rank() == 1:\n"
               "    raise RuntimeError('rank 1 cannot import this')\n"
               "MPI.COMM_WORLD.Barrier()\n\n"
               "def test_nothing():\n"
               "    pass\n", "rank 1 cannot import this", "[rank 1] ERROR collecting"),
}


@pytest.mark.parametrize("where", sorted(ONE_RANK_FAILS))
def test_a_failure_on_one_rank_ends_the_suite_job_in_seconds(tmp_path, where):
    """The MPI suite's plugin: an assert that fails on rank 1 only, or a module whose import
    fails there (as a session's set-up may, in a collective at import), ends the job at
    once, instead of leaving ranks 0 and 2 in the next collective until the time limit."""
    source, said, reported = ONE_RANK_FAILS[where]
    test = tmp_path / "test_one_rank_fails.py"
    test.write_text(source)
    start = time.monotonic()
    proc = mpirun(3, ["-m", "pytest", test, "-p", "abort_on_failure", "-q",
                      "-p", "no:cacheprovider", "-o", "addopts="], timeout=120, check=False,
                  env={"PYTHONPATH": str(ROOT / "tests" / "mpi")})
    assert proc.returncode != 0
    assert said in proc.stdout + proc.stderr
    assert reported in proc.stderr, proc.stderr
    assert time.monotonic() - start < 60


@pytest.mark.parametrize("per_node,nprocs", [(1, 2), (2, 5), (2, 8), (3, 4), (1, 4)])
def test_node_aware_suite_on_virtual_nodes(per_node, nprocs):
    """shared_memory, hierarchical and auto's trial on nodes of 1, 2 and 3 ranks (uneven
    last nodes: a node of one rank has no window, so its bindings do not rotate)."""
    proc = mpirun(nprocs, ["-m", "pytest", f"{SUITE}/test_node_aware.py",
                           f"{SUITE}/test_auto.py", "--with-mpi", "-q",
                           "-x", "-ra", "-p", "no:cacheprovider", "-o", "addopts="], timeout=600,
                  env={"MLCOMM_MPI_SUITE": "1", "MLCOMM_RANKS_PER_NODE": str(per_node)})
    assert_suite_passed(proc)


def test_the_suite_on_uneven_virtual_nodes():
    """The whole suite but the matrices at 7 ranks on nodes of 3, 3 and 1, as on three
    nodes of a cluster: each test runs the algorithms that apply there (``runs_here``)."""
    proc = mpirun(7, ["-m", "pytest", SUITE, "--with-mpi", "-q", "-x", "--color=no", "-ra",
                      "-p", "no:cacheprovider", "-o", "addopts=",
                      "-k", "not matrix and not bitwise_the_python_loop"],
                  timeout=600, env={"MLCOMM_MPI_SUITE": "1", "MLCOMM_RANKS_PER_NODE": "3"})
    assert_suite_passed(proc)


def test_the_suite_in_the_python_loop():
    """The whole suite but the matrices at 3 ranks with ``MLCOMM_EXECUTOR=python``, the loop
    that runs where the compiled one cannot (no Numba, a dtype or op it has no loop for):
    the same results, codes, messages and memory accounting (the binding cache had
    counted less than such a binding holds, and only this run showed it)."""
    proc = mpirun(3, ["-m", "pytest", SUITE, "--with-mpi", "-q", "-x", "--color=no", "-ra",
                      "-p", "no:cacheprovider", "-o", "addopts=",
                      "-k", "not matrix and not bitwise_the_python_loop"],
                  timeout=600, env={"MLCOMM_MPI_SUITE": "1", "MLCOMM_EXECUTOR": "python"})
    assert_suite_passed(proc)
