"""jobs/: every script's dry run prints the one command it would run; the hostfile recipe runs."""

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

JOBS = ROOT / "jobs"


def dry_run(script, *args, **env):
    """Run ``bash jobs/SCRIPT ARGS`` with DRY_RUN=1; return the printed command as argv."""
    full = {k: v for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "PBS_", "MLCOMM_"))}
    full.update(DRY_RUN="1", **env)
    proc = subprocess.run(["bash", str(JOBS / script), *args], capture_output=True, text=True,
                          env=full, timeout=30, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout                  # one command, nothing run
    return shlex.split(lines[0])


def test_every_script_is_covered_and_parses():
    scripts = sorted(p.name for p in JOBS.iterdir() if p.suffix in (".sbatch", ".pbs", ".sh"))
    assert scripts == ["impi_hydra.sh", "mpiexec_hostfile.sh", "openmpi_mpirun.sh",
                       "pbs_bench.pbs", "slurm_bench.sbatch", "slurm_gpu.sbatch",
                       "slurm_hierarchical.sbatch", "slurm_train.sbatch", "slurm_tune.sbatch"]
    for name in scripts:
        subprocess.run(["bash", "-n", str(JOBS / name)], check=True)
        text = (JOBS / name).read_text()
        assert "DRY_RUN=1" in text                      # the usage line documents the dry run


def test_slurm_bench_nodes_by_tasks():
    cmd = dry_run("slurm_bench.sbatch", "--quick", "--algorithms", "ring,mpi",
                  NODES="3", TASKS_PER_NODE="2", MLCOMM_OUT="out/x")
    assert cmd[:4] == ["srun", "--mpi=pmix", "--nodes=3", "--ntasks-per-node=2"]
    assert cmd[4:6] == ["mlcomm", "bench"]
    assert cmd[-3:] == ["--quick", "--algorithms", "ring,mpi"]
    assert "out/x.json" in cmd and "out/x.png" in cmd


def test_slurm_bench_takes_the_allocation_from_slurm():
    cmd = dry_run("slurm_bench.sbatch", SLURM_JOB_NUM_NODES="16", SLURM_NTASKS_PER_NODE="32",
                  SLURM_JOB_ID="77", NODES="1")
    assert "--nodes=16" in cmd and "--ntasks-per-node=32" in cmd
    assert "mlcomm-bench-77.json" in cmd


def test_slurm_tune():
    cmd = dry_run("slurm_tune.sbatch", "--max-bytes", "64M", NODES="4", TASKS_PER_NODE="8")
    assert cmd == ["srun", "--mpi=pmix", "--nodes=4", "--ntasks-per-node=8",
                   "mlcomm", "tune", "--no-progress", "--max-bytes", "64M"]


def test_slurm_hierarchical_sets_ranks_per_node():
    head = (JOBS / "slurm_hierarchical.sbatch").read_text().split("set -euo")[0]
    assert "#SBATCH --ntasks-per-node=8" in head and "MLCOMM_RANKS_PER_NODE" in head
    tail = ["mlcomm", "bench", "--check", "-a", "hierarchical,ring,recursive_doubling",
            "--sizes", "8,64K,16M", "--output", "mlcomm-hierarchical-9.json",
            "--plot", "mlcomm-hierarchical-9.png", "--iters", "5"]
    # across nodes: no shared_memory, which needs every rank on one node
    cmd = dry_run("slurm_hierarchical.sbatch", "--iters", "5", SLURM_JOB_NUM_NODES="4",
                  SLURM_NTASKS_PER_NODE="8", SLURM_JOB_ID="9")
    assert cmd == ["srun", "--mpi=pmix", "--nodes=4", "--ntasks-per-node=8", *tail]
    # one node: shared_memory too
    cmd = dry_run("slurm_hierarchical.sbatch", "--iters", "5", NODES="1", TASKS_PER_NODE="8",
                  SLURM_JOB_ID="9")
    assert cmd[4:] == [*tail[:4], "hierarchical,shared_memory,ring,recursive_doubling",
                       *tail[5:]]
    # virtual nodes of 4 on one machine: passed to every rank, no shared_memory
    cmd = dry_run("slurm_hierarchical.sbatch", "--iters", "5", NODES="1", TASKS_PER_NODE="8",
                  MLCOMM_RANKS_PER_NODE="4", SLURM_JOB_ID="9")
    assert cmd == ["srun", "--mpi=pmix", "--nodes=1", "--ntasks-per-node=8",
                   "--export=ALL,MLCOMM_RANKS_PER_NODE=4", *tail]
    # the options it passes are the bench's own, and its algorithms are known
    from mlcomm.cli import _parser
    args = _parser().parse_args(cmd[6:])
    assert args.algorithms == ["hierarchical", "ring", "recursive_doubling"]


def test_pbs_bench():
    cmd = dry_run("pbs_bench.pbs", "--max-bytes", "64M", NODES="4", TASKS_PER_NODE="8",
                  PBS_NODEFILE="/var/spool/nodes", BENCH_ARGS="--quick")
    assert cmd[:5] == ["mpiexec", "--hostfile", "/var/spool/nodes", "-n", "32"]
    assert cmd[5:7] == ["mlcomm", "bench"]
    assert cmd[-3:] == ["--quick", "--max-bytes", "64M"]


def test_mpiexec_hostfile_recipe_dry():
    cmd = dry_run("mpiexec_hostfile.sh", "--check", HOSTFILE="my hosts", NP="6")
    assert cmd[:7] == ["mpiexec", "--hostfile", "my hosts", "-n", "6", "mlcomm", "bench"]
    assert cmd[-1] == "--check"


def test_openmpi_mpirun_binds_each_rank_to_a_core():
    cmd = dry_run("openmpi_mpirun.sh", "--quick", NP="16", HOSTFILE="hosts.txt")
    assert cmd[:9] == ["mpirun", "--hostfile", "hosts.txt", "-n", "16", "--map-by", "core",
                       "--bind-to", "core"]
    assert cmd[9:11] == ["mlcomm", "bench"] and cmd[-1] == "--quick"
    cmd = dry_run("openmpi_mpirun.sh", NP="8", OVERSUBSCRIBE="1")
    assert cmd[:10] == ["mpirun", "-n", "8", "--map-by", "core:OVERSUBSCRIBE", "--bind-to",
                        "none", "--mca", "mpi_yield_when_idle", "1"]


def test_impi_hydra_pins_each_rank_to_a_core():
    cmd = dry_run("impi_hydra.sh", "--quick", NP="32", PPN="16", HOSTFILE="hosts.txt")
    assert cmd[:13] == ["mpiexec.hydra", "-f", "hosts.txt", "-n", "32", "-ppn", "16",
                        "-genv", "I_MPI_PIN", "1", "-genv", "I_MPI_PIN_DOMAIN", "core"]
    assert cmd[13:15] == ["mlcomm", "bench"] and cmd[-1] == "--quick"
    cmd = dry_run("impi_hydra.sh", NP="8", OVERSUBSCRIBE="1")
    assert cmd[:11] == ["mpiexec.hydra", "-n", "8", "-ppn", "8", "-genv", "I_MPI_PIN", "0",
                        "-genv", "I_MPI_THREAD_YIELD", "3"]


def test_gpu_job_one_gpu_per_rank():
    cmd = dry_run("slurm_gpu.sbatch", "--quick", NODES="2", TASKS_PER_NODE="4")
    assert cmd[0] == "srun" and "--mpi=pmix" in cmd and "--gpus-per-task=1" in cmd
    assert "--nodes=2" in cmd and "--ntasks-per-node=4" in cmd
    i = cmd.index("mlcomm")
    assert cmd[i:i + 4] == ["mlcomm", "bench", "--device", "cuda"] and cmd[-1] == "--quick"
    assert "--gpus-per-task=1" in (JOBS / "slurm_gpu.sbatch").read_text().split("set -euo")[0]


def test_train_job():
    cmd = dry_run("slurm_train.sbatch", "--steps", "3", NODES="2", TASKS_PER_NODE="4")
    assert cmd == ["srun", "--mpi=pmix", "--nodes=2", "--ntasks-per-node=4",
                   "mlcomm", "train", "--checkpoint", "mlcomm_train_ckpt.npz",
                   "--checkpoint-every", "50", "--resume", "--metrics", "mlcomm_train.csv",
                   "--steps", "3"]
    # the options it passes are the trainer's own
    from mlcomm.cli import _parser
    _parser().parse_args(cmd[4 + 1:])


def test_hostfile_recipe_really_runs(tmp_path):
    """The plain mpiexec recipe, for real, on this host (MPICH Hydra hostfile syntax)."""
    hosts = tmp_path / "hosts.txt"
    hosts.write_text("localhost:2\n")
    bindir = str(Path(sys.executable).parent)
    env = dict(os.environ, HOSTFILE=str(hosts), NP="2", MLCOMM_OUT=str(tmp_path / "hf"),
               PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
    env.pop("DRY_RUN", None)
    try:
        proc = subprocess.run(["bash", str(JOBS / "mpiexec_hostfile.sh"), "--algorithms", "ring",
                               "--min-bytes", "8", "--max-bytes", "64", "--iters", "2",
                               "--no-progress"],
                              capture_output=True, text=True, env=env, timeout=180, cwd=tmp_path)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"hostfile recipe hung\n{exc.stdout}\n{exc.stderr}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert " ring " in proc.stdout and " mpi " in proc.stdout
    assert (tmp_path / "hf.json").stat().st_size > 0 and (tmp_path / "hf.png").stat().st_size > 0
