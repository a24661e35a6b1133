"""mlcomm as users install it: the wheel and the sdist hold every module, and each installs
into a new virtualenv outside the checkout and runs there."""

import tarfile
import zipfile

import pytest

from conftest import ROOT, make_venv, mpirun, run_checked
from test_docs import code_blocks


def modules() -> list:
    """Every module file of the package, as installed: ``mlcomm/...``; ``kernels/`` is
    installed as ``mlcomm/kernels/``."""
    found = [p.relative_to(ROOT).as_posix() for p in (ROOT / "mlcomm").rglob("*.py")]
    found += ["mlcomm/" + p.relative_to(ROOT).as_posix() for p in (ROOT / "kernels").rglob("*.py")]
    return sorted(found)


def missing(names) -> list:
    """The modules of :func:`modules` that ``names`` (an archive's listing) lacks."""
    names = set(names)
    return [m for m in modules() if m not in names]


def test_the_wheel_and_the_sdist_hold_every_module(dist):
    wheel, sdist = dist
    assert not missing(zipfile.ZipFile(wheel).namelist()), "modules missing from the wheel"
    with tarfile.open(sdist) as tar:
        root = tar.getnames()[0].split("/")[0]
        # the sdist keeps the source layout: kernels/ at the top
        listed = [n.split("/", 1)[1] for n in tar.getnames() if "/" in n]
        listed = [("mlcomm/" + n) if n.startswith("kernels/") else n for n in listed]
    assert root.startswith("mlcomm-")
    assert not missing(listed), "modules missing from the sdist"


def test_the_check_finds_a_missing_module():
    everything = modules()
    assert "mlcomm/transport/mpi/__init__.py" in everything and "mlcomm/kernels/ops.py" in everything
    assert missing([m for m in everything if "/transport/" not in m]) == \
        [m for m in everything if "/transport/" in m]


@pytest.fixture(scope="module")
def fresh(dist, tmp_path_factory):
    """A new virtualenv with the wheel and the MPI the ``mpich`` wheel brings."""
    return make_venv(tmp_path_factory.mktemp("venv") / "fresh", f"{dist[0]}[mpich]")


def _show(capsys, title, proc):
    """Put a job's output in the test log (CI's log shows the smoke job)."""
    with capsys.disabled():
        print(f"\n--- {title} ---\n{proc.stdout}{proc.stderr[-2000:]}")


def test_the_wheel_runs_outside_the_checkout(fresh, tmp_path, capsys):
    mlcomm = fresh.parent / "mlcomm"
    proc = mpirun(2, [mlcomm, "verify", "-a", "ring,shared_memory,auto", "-d", "float32",
                      "-o", "sum"], python=fresh, cwd=tmp_path, timeout=600)
    _show(capsys, "mpiexec -n 2 mlcomm verify -a ring,shared_memory,auto -d float32 -o sum "
                  "(the wheel, outside the checkout)", proc)
    assert "ALL PASSED" in proc.stdout and "FAIL" not in proc.stdout
    example = next(code for _, language, code in code_blocks(ROOT / "README.rst")
                   if language == "python")
    (tmp_path / "example.py").write_text(example)
    proc = mpirun(2, ["example.py"], python=fresh, cwd=tmp_path, timeout=300)
    _show(capsys, "mpiexec -n 2 python example.py (README's library example)", proc)


def test_the_sdist_installs_and_runs_outside_the_checkout(fresh, dist, tmp_path):
    run_checked([fresh, "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", dist[1]],
         "pip install the sdist", timeout=600)
    proc = mpirun(3, ["-c", "import numpy as np, mlcomm, mlcomm.transport.mpi, mlcomm.kernels\n"
                            "from mpi4py import MPI\n"
                            "r = MPI.COMM_WORLD.rank\n"
                            "assert mlcomm.__file__.startswith(%r) is False\n"
                            "y = mlcomm.allreduce(np.full(100, r + 1, np.int64), algorithm='ring')\n"
                            "assert (y == 6).all(), y\n"
                            "print('sdist ok', mlcomm.__file__)" % str(ROOT)],
                  python=fresh, cwd=tmp_path, timeout=300)
    assert proc.stdout.count("sdist ok") == 3 and "site-packages" in proc.stdout
