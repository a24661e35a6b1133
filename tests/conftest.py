"""Shared fixtures: launch real ``mpiexec`` jobs from a plain pytest session."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MPIEXEC = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")


def mpirun(nprocs, args, *, timeout=300, env=None, check=True, cwd=None):
    """Run ``mpiexec -n nprocs python args...``; return the CompletedProcess.

    A job that hangs is killed after ``timeout`` seconds and fails the test.
    """
    if MPIEXEC is None:
        pytest.fail("no mpiexec found: install with `pip install -e .[mpich,test]`")
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    cmd = [MPIEXEC, "-n", str(nprocs), sys.executable, *map(str, args)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env=full_env, cwd=cwd or ROOT)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{' '.join(cmd)} hung for {timeout}s\n{exc.stdout}\n{exc.stderr}")
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {proc.returncode}\n"
                    f"--- stdout ---\n{proc.stdout[-8000:]}\n--- stderr ---\n{proc.stderr[-8000:]}")
    return proc


@pytest.fixture
def run_mpi():
    """The :func:`mpirun` launcher as a fixture."""
    return mpirun


# tests/mpi/ runs inside mpiexec jobs started by test_mpi_jobs.py, not in this process
collect_ignore = [] if os.environ.get("MLCOMM_MPI_SUITE") else ["mpi"]
