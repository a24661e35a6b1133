"""torch.distributed on the mlcomm backend (``import mlcomm.torch``), as mpiexec jobs.

The collectives, DDP, FSDP2, groups and errors run in tests/torch_job.py, one job per
process count; ``MLCOMM_AUTO=model`` spares each of its many call layouts auto's timed
trial (tests/mpi covers the trial).
"""

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, mpirun

pytest.importorskip("torch")

JOB = ROOT / "tests" / "torch_job.py"
MODEL = {"MLCOMM_AUTO": "model"}


@pytest.mark.parametrize("nprocs,parts", [(2, ["collectives", "ddp", "exchanges"]),
                                          (3, ["collectives", "ddp", "groups", "errors",
                                               "exchanges"]),
                                          (4, ["collectives", "groups", "exchanges"])])
def test_backend_collectives_ddp_groups_errors(nprocs, parts):
    """Every collective and dtype, sync and async, against NumPy; DDP (its options) and
    FSDP2 as one process on the global batch, the same SHA-256 on every rank; new_group on a
    subset; the errors a user meets, raised on every rank; gather, scatter, all_to_all,
    uneven all_gather and the object collectives at uneven sizes, exact."""
    proc = mpirun(nprocs, [JOB, *parts], timeout=240, env=MODEL)
    for part in parts:
        assert f"OK {part}" in proc.stdout, proc.stdout
    if "ddp" in parts:
        assert proc.stdout.count("OK ddp ") == 6, proc.stdout


def test_pytorch_own_tests_of_the_exchanges():
    """torch's DistributedTest of gather, scatter, all_to_all, all_gather and the object
    collectives on the mlcomm backend at P = 2 (tests/torch_distributed_test.py): every
    test, and every body torch's decorators skip for a backend other than MPI or gloo,
    passes; the rest skip for the world size alone."""
    proc = mpirun(2, [ROOT / "tests" / "torch_distributed_test.py", "--unwrap"],
                  timeout=240, env=MODEL)
    lines = proc.stdout.strip().splitlines()
    assert lines[-1] == "mlcomm: pass 10, skip 6, skipped, body pass 14", proc.stdout
    assert all("FAIL" not in line for line in lines), proc.stdout


def _torchrun_env(rank, port):
    return dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), PYTHONUNBUFFERED="1")


def test_backend_without_mpiexec(tmp_path):
    """One process alone is a group of one; processes that torchrun (or RANK, WORLD_SIZE,
    MASTER_ADDR) made ranks of one job, but that MPI did not, fail at once with the fix."""
    script = tmp_path / "init.py"
    script.write_text("import torch, torch.distributed as dist\nimport mlcomm.torch\n"
                      "dist.init_process_group('mlcomm')\nt = torch.ones(2)\n"
                      "dist.all_reduce(t)\nprint('world', dist.get_world_size(), t.tolist())\n")
    alone = subprocess.run([sys.executable, script], capture_output=True, text=True,
                           timeout=120, cwd=ROOT)
    assert alone.returncode == 0 and "world 1 [1.0, 1.0]" in alone.stdout, alone.stderr
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, script], env=_torchrun_env(r, port), cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    for rank, proc in enumerate(procs):
        out, err = proc.communicate(timeout=120)
        assert proc.returncode != 0, out
        assert f"torch made this rank {rank} of 2, MPI_COMM_WORLD rank 0 of 1" in err, err
        assert "launch the job with mpiexec or srun" in err, err


def test_the_op_table_names_every_torch_reduce_op_but_premul_sum():
    """Every ``ReduceOp`` the backend maps is a torch member; torch has no other but
    PREMUL_SUM (older torch also has an UNUSED placeholder)."""
    import torch.distributed as dist
    from mlcomm.kernels import OP_TABLE
    named = {op.torch for op in OP_TABLE.values() if op.torch}
    members = set(dist.ReduceOp.RedOpType.__members__)
    assert named <= members and members - named - {"UNUSED"} == {"PREMUL_SUM"}


def test_importing_mlcomm_does_not_import_torch():
    code = "import sys, mlcomm, mlcomm.api; assert 'torch' not in sys.modules, 'torch'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, cwd=ROOT)


def test_train_torch_cnn_accuracy_timeline_and_bytes(tmp_path):
    """``mlcomm train --framework torch --model cnn``: stock DDP on the mlcomm backend;
    accuracy, a Chrome trace whose communication spans come from the backend, counted bytes."""
    from mlcomm.trainer.metrics import read_metrics
    timeline, metrics = tmp_path / "timeline.json", tmp_path / "metrics.csv"
    proc = mpirun(2, ["-m", "mlcomm.cli", "train", "--framework", "torch", "--model", "cnn",
                      "--steps", "120", "--bucket-mb", "0.05", "--algorithm", "ring",
                      "--timeline", timeline, "--metrics", metrics, "--no-progress"],
                  timeout=120, env={"MLCOMM_AUTO": "model"})
    # (under the measured auto, the trial of DDP's first broadcasts moves bytes of its own
    # in the first step; the model's choice moves none)
    line = proc.stdout.strip().splitlines()[-1]
    assert line.startswith("finished step 120: test accuracy"), proc.stdout
    accuracy = float(line.split("test accuracy ")[1].split(",")[0])
    assert accuracy >= 0.9, line
    rows = read_metrics(metrics)
    assert len(rows) == 120 and rows[-1]["mode"] == "torch ddp"
    # at p = 2 each rank sends every bucket once (the ring: one half each way twice), and
    # the two float64 loss and stop values (recursive doubling), every step
    n_params = 16 * 9 + 16 + 32 * 16 * 9 + 32 + 512 * 128 + 128 + 128 * 10 + 10
    assert all(r["bytes_sent"] == 4 * n_params + 16 for r in rows), rows[0]["bytes_sent"]

    trace = json.loads(timeline.read_text())
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    names = {(e["pid"], e["tid"], e["name"].split(" bucket")[0]) for e in events}
    for rank in (0, 1):
        assert {(rank, 0, "forward"), (rank, 0, "backward"), (rank, 1, "all-reduce")} <= names
    assert {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"} == \
        {"compute", "communication"}
    assert all(isinstance(e["ts"], (int, float)) and e["dur"] >= 0 for e in events)
    buckets = {e["name"] for e in events if e["name"].startswith("all-reduce bucket")}
    assert len(buckets) > 1, buckets
    backward = [(e["pid"], e["ts"], e["ts"] + e["dur"]) for e in events
                if e["name"] == "backward"]
    overlapping = [e for e in events if e["name"].startswith("all-reduce bucket") and any(
        pid == e["pid"] and e["ts"] < end and e["ts"] + e["dur"] > start
        for pid, start, end in backward)]
    assert overlapping, "no bucket all-reduce overlaps a backward span"


def test_bench_scripts_run_both_backends_and_write_their_records(tmp_path):
    """bench/torch_gloo.py --compare (a job of each backend, few rounds) and bench/overlap.py
    write their JSON."""
    out = tmp_path / "compare.json"
    proc = subprocess.run([sys.executable, ROOT / "bench" / "torch_gloo.py", "--compare", "-n",
                           "2", "--runs", "1", "--rounds", "1", "--sizes", "8,64K",
                           "--output", out], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rec = json.loads(out.read_text())
    assert [r["name"] for r in rec["rows"]] == [
        "all_reduce float32 8", "all_reduce bfloat16 8", "all_reduce float32 64K",
        "all_reduce bfloat16 64K", "DDP step (CNN)", "step without DDP (CNN)"], rec
    assert all(len(r["ratios"]) == 1 and r["ratio_median"] > 0 for r in rec["rows"])
    assert "mlcomm/gloo" in proc.stdout
    overlap = tmp_path / "overlap.json"
    proc = mpirun(2, [ROOT / "bench" / "overlap.py", "--sizes", "64K", "--rounds", "1",
                      "--hidden", "64", "--batch", "4", "--output", overlap], timeout=120)
    rec = json.loads(overlap.read_text())
    assert {r["contestant"] for r in rec["allreduce"]} == {
        "mlcomm iallreduce", "mlcomm start()", "MPI_Iallreduce", "MPI_Iallreduce + MPI_Test"}
    assert set(rec["ddp"]["step_ms"]) == {"no communication", "DDP, all-reduce during backward",
                                          "all-reduce after backward"}
    assert "overlap" in proc.stdout
