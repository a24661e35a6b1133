"""Jobs across several hosts on this machine: Hydra's ssh launcher runs each host's ranks
through ``tests/fake_ssh.sh``, so MPI sees one node per host (``Split_type`` gives each
host's ranks) with TCP between them. The node-aware suite and every collective run there:
node detection, ``hierarchical``'s phase across the nodes, a window per node, and the
collectives whose ``auto`` takes the window on one node and a flat schedule across."""

import pytest

from conftest import assert_suite_passed, mpirun

SUITE = ["tests/mpi/test_node_aware.py", "tests/mpi/test_every_collective.py"]


@pytest.mark.parametrize("hosts", ["a:2,b:2", "a:3,b:2"])
def test_the_node_aware_suite_and_every_collective_on_two_hosts(hosts):
    nprocs = sum(int(h.split(":")[1]) for h in hosts.split(","))
    proc = mpirun(nprocs, ["-m", "pytest", *SUITE, "--with-mpi", "-q", "-x", "--color=no",
                           "-ra", "-p", "no:cacheprovider", "-o", "addopts="],
                  timeout=600, env={"MLCOMM_MPI_SUITE": "1"}, hosts=hosts)
    assert_suite_passed(proc)


def test_sessions_see_one_node_per_host():
    code = ("from mpi4py import MPI; from mlcomm import session; c = MPI.COMM_WORLD; "
            "seen = c.allgather(session.session_of(c).nodes); "
            "c.rank or print('nodes', seen)")
    proc = mpirun(5, ["-c", code], hosts="a:3,b:2")
    assert f"nodes {[((0, 1, 2), (3, 4))] * 5}" in proc.stdout, proc.stdout
