"""The data-parallel SGD trainer, run as real mpiexec jobs (few steps, small models)."""

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest

from conftest import mpirun

#: runs a command with a fault injected (tests/faults/inject.py)
INJECT = str(Path(__file__).parent / "faults" / "inject.py")

PRELUDE = """
import sys
import numpy as np
from mpi4py import MPI
from mlcomm.cli import abort_on_error
from mlcomm.trainer import train

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
SMALL = dict(model="mlp1", hidden=(16,), batch_size=8, steps=8, warmup=3, dtype="float64",
             progress=False, lr=0.05)

def identical(params):
    all_params = comm.allgather(params)
    return all(np.array_equal(all_params[0], p) for p in all_params)
"""


def _script(tmp_path, body, name="job.py", prelude=PRELUDE):
    """A job file: ``prelude``, then ``body`` as ``main()`` run under ``abort_on_error``."""
    path = tmp_path / name
    path.write_text(prelude + "\ndef main():\n" + textwrap.indent(textwrap.dedent(body), "    ")
                    + "\n\nabort_on_error(main)\n")
    return path


BSP_BODY = """
from mlcomm.algorithms import COLLECTIVES
ref = None
if rank == 0:  # single-process SGD on the same global batches
    ref = train(comm=MPI.COMM_SELF, **dict(SMALL, batch_size=SMALL["batch_size"] * size)).params
bsp = None
for algo in COLLECTIVES["allreduce"]:
    for bucket in (64.0, 0.0):
        got = train(algorithm=algo, bucket_mb=bucket, **SMALL).params
        assert identical(got), f"{algo}: ranks disagree"
        if rank == 0:
            err = np.max(np.abs(got - ref)) / np.max(np.abs(ref))
            assert err < 1e-12, f"{algo} bucket={bucket}: differs from single-process SGD by {err}"
            print(f"OK {algo} bucket_mb={bucket} rel.err={err:.1e}")
        bsp = got
ssp = train(sync="ssp", staleness=0, **SMALL).params
assert identical(ssp)
if rank == 0:
    err = np.max(np.abs(ssp - bsp)) / np.max(np.abs(bsp))
    assert err < 1e-12, f"ssp s=0 differs from bsp by {err}"
    print(f"OK ssp s=0 == bsp rel.err={err:.1e}")
"""


@pytest.mark.parametrize("nprocs", [3, 4])
def test_bsp_equals_single_process_sgd_and_ssp0(tmp_path, nprocs):
    from mlcomm.algorithms import COLLECTIVES
    proc = mpirun(nprocs, [_script(tmp_path, BSP_BODY)], timeout=120)
    assert proc.stdout.count("OK ") == 2 * len(COLLECTIVES["allreduce"]) + 1, proc.stdout


COMPRESS_BODY = """
kw = dict(progress=False)
topk = train(compress="topk:0.01", steps=200, algorithm="shared_memory", **kw)
qsgd = train(compress="qsgd:4", steps=10, **kw)
assert identical(topk.params) and identical(qsgd.params)
for algorithm in ("ring", "shared_memory"):  # a flat algorithm, and the node's window
    short = dict(kw, steps=10, algorithm=algorithm)
    dense = train(**short)
    fp16 = train(compress="fp16", **short).bytes_sent
    top10 = train(compress="topk:0.01", **short).bytes_sent
    if rank == 0:  # the same bytes every step: 10 steps stand for any number
        ratio = dense.bytes_sent / top10
        print(f"{algorithm}: dense {dense.bytes_moved} topk:0.01 {top10} ratio={ratio:.1f}")
        assert dense.bytes_moved["window" if algorithm == "shared_memory" else "messages"] > 0
        assert ratio >= 20, (algorithm, ratio)
        assert dense.bytes_sent / fp16 >= 1.9, (algorithm, dense.bytes_sent, fp16)
        assert dense.bytes_sent / qsgd.bytes_sent >= 3.5, (algorithm, qsgd.bytes_sent)
if rank == 0:
    print(f"topk:0.01 acc={topk.test_accuracy:.4f} bytes={topk.bytes_sent}")
    assert topk.test_accuracy >= 0.90, topk.test_accuracy
    print("OK compression")
"""


def test_topk_error_feedback_accuracy_and_bytes(tmp_path):
    """top-k 1 % moves at least 20x fewer bytes than dense BSP at P = 4, on a flat
    algorithm's messages and through the node's window alike."""
    proc = mpirun(4, [_script(tmp_path, COMPRESS_BODY)], timeout=180)
    assert "OK compression" in proc.stdout, proc.stdout


BYTES_BODY = """
from mlcomm.algorithms import COLLECTIVES

def sends(collective, name, count, itemsize):
    schedule = COLLECTIVES[collective][name].build(rank, size, count, itemsize)
    return itemsize * sum(t.region.count for step in schedule.steps for t in step.transfers
                          if type(t).__name__ == "Send")

# mlp1 64-16-10 in float64: W0, b0, W1, b1; backprop order b1, W1, b0, W0; the loss and the
# stop flag ride in the first bucket
tensors = [64 * 16, 16, 16 * 10, 10]
cases = [("ring", 0.0, [10 + 2, 160, 16, 1024]), ("recursive_halving_doubling", 0.0,
         [10 + 2, 160, 16, 1024]), ("ring", 64.0, [sum(tensors) + 2])]
for name, bucket_mb, buckets in cases:
    res = train(algorithm=name, bucket_mb=bucket_mb, **SMALL)
    want = sum(sends("allreduce", name, n, 8) for n in buckets)
    assert res.bytes_sent == SMALL["steps"] * want, (name, bucket_mb, res.bytes_sent, want)
    assert rank or all(r["bytes_sent"] == want for r in res.metrics), (name, res.metrics)
# top-k: one allgather of each rank's payload (121 uint16 indices and float32 values) and
# its loss and flag (two float64)
res = train(compress="topk:0.1", **SMALL)
want = sends("allgather", "ring", 16 + 121 * (2 + 4), 1)
assert res.bytes_sent == SMALL["steps"] * want, (res.bytes_sent, want)
print(f"OK rank {rank} bytes")
"""


def test_counted_bytes_are_what_the_schedules_send(tmp_path):
    proc = mpirun(3, [_script(tmp_path, BYTES_BODY)], timeout=60)
    assert proc.stdout.count("OK rank") == 3, proc.stdout


ANALYZED_BODY = """
from mlcomm.analysis import analyze

# one bucket: the gradient, the loss and the stop flag, a multiple of the 4 ranks in
# elements, so that every rank moves what the busiest one does
for name, path, key in (("shared_memory", "window", "max_rank_window_bytes"),
                        ("ring", "messages", "max_rank_bytes_sent")):
    for dtype, hidden in (("float64", 16), ("float32", 128)):  # 1,228 and 9,612 elements
        res = train(algorithm=name, **dict(SMALL, dtype=dtype, hidden=(hidden,)))
        count = 64 * hidden + hidden + hidden * 10 + 10 + 2
        nbytes = count * np.dtype(dtype).itemsize
        want = analyze(name, size, nbytes, itemsize=np.dtype(dtype).itemsize)[key]
        assert want > 0 and count % size == 0, (name, want, count)
        assert res.bytes_moved == dict({"messages": 0, "window": 0, "single_copy": 0},
                                       **{path: SMALL["steps"] * want}), (name, res.bytes_moved)
        assert res.bytes_sent == SMALL["steps"] * want, (name, res.bytes_sent)
        assert rank or all(r["bytes_sent"] == r[f"bytes_{path}"] == want for r in res.metrics)
        print(f"OK rank {rank} {name} {nbytes} bytes: {want} a step")
"""


def test_counted_bytes_are_the_analysed_volume(tmp_path):
    """Through the node's window (shared_memory: written once and read by all at 9,824
    bytes, in chunks at 38,448) and in messages (ring), what the trainer counts on each
    rank is ``mlcomm analyze``'s volume of the algorithm."""
    proc = mpirun(4, [_script(tmp_path, ANALYZED_BODY)], timeout=120)
    assert proc.stdout.count("OK rank") == 16, proc.stdout


RESUME_BODY = """
ckpts = sys.argv[1:]
kw = dict(SMALL, steps=30, compress="topk:0.1")
ref = train(**kw).params
for path in ckpts:
    got = train(checkpoint=path, resume=True, **kw)
    assert got.step == 30 and not got.stopped
    if rank == 0:
        assert np.array_equal(got.params, ref), f"resume from {path}: max diff {np.max(np.abs(got.params - ref))}"
        print(f"OK resumed {path}")
"""

RUN_BODY = """
extra = dict(sync="ssp", staleness=1) if sys.argv[2:] == ["ssp"] else {}
res = train(checkpoint=sys.argv[1], checkpoint_every=5, compress="topk:0.1",
            **dict(SMALL, steps=30), **extra)
if rank == 0:
    print(f"STOPPED={res.stopped} STEP={res.step}")
"""


def test_killed_and_resumed_equals_uninterrupted(tmp_path):
    from mlcomm.trainer.checkpoint import load
    run = _script(tmp_path, RUN_BODY, "run.py")
    crashed, termed = tmp_path / "crash.npz", tmp_path / "term.npz"
    # a hard kill at step 13 keeps the step-10 checkpoint
    proc = mpirun(3, [INJECT, "train-crash-at=13", "--", run, crashed], check=False,
                  timeout=60)
    assert proc.returncode != 0
    assert load(crashed)[1]["step"] == 10
    # SIGTERM (Slurm's preemption signal) on the last rank before step 7: all stop after it
    proc = mpirun(3, [INJECT, "train-sigterm-at=7", "--", run, termed], timeout=60)
    assert "STOPPED=True STEP=8" in proc.stdout, proc.stdout
    assert load(termed)[1]["step"] == 8
    assert not list(tmp_path.glob("*.tmp.*"))
    proc = mpirun(3, [_script(tmp_path, RESUME_BODY, "resume.py"), crashed, termed], timeout=60)
    assert proc.stdout.count("OK resumed") == 2, proc.stdout
    # SSP (s=1) stops on SIGTERM at a common clock and resumes to the end
    ssp = tmp_path / "ssp.npz"
    proc = mpirun(3, [INJECT, "train-sigterm-at=7", "--", run, ssp, "ssp"], timeout=60)
    assert "STOPPED=True" in proc.stdout, proc.stdout
    proc = mpirun(3, ["-m", "mlcomm.cli", "train", "--sync", "ssp", "--staleness", "1",
                      "--compress", "topk:0.1", "--steps", "30", "--checkpoint", ssp, "--resume",
                      "--model", "mlp1", "--hidden", "16", "--batch-size", "8", "--dtype",
                      "float64", "--no-progress"], timeout=60)
    assert "finished step 30" in proc.stdout, proc.stdout


MODES_BODY = """
out = sys.argv[1]
kw = dict(progress=False, straggler="random:3", eval_every=20)
# equal samples: 120 synchronous steps of 4 x 32 are 480 async updates of 32; 360 keeps it short
for name, opts in [("ssp", dict(sync="ssp", staleness=2, steps=120)),
                   ("backup", dict(backup_workers=1, steps=120)),
                   ("async", dict(sync="async", servers=1, steps=360))]:
    res = train(metrics=f"{out}/{name}.{'json' if name == 'async' else 'csv'}", **kw, **opts)
    assert identical(res.params), name
    computed = comm.allreduce(res.computed)
    if rank == 0:
        steps, rows = opts["steps"], res.metrics
        updates = sum(r["updates"] for r in rows)
        dropped = sum(r["dropped"] for r in rows)
        print(f"{name} acc={res.test_accuracy:.4f} step={res.step} computed={computed} "
              f"dropped={dropped} staleness max={max(r['staleness_max'] for r in rows)}")
        # async's staleness depends on scheduling on a shared machine: a looser bar
        assert res.test_accuracy >= (0.85 if name == "async" else 0.9), (name, res.test_accuracy)
        assert res.step == steps and rows[-1]["step"] == steps, (res.step, rows[-1])
        if name == "ssp":  # every rank's update of every clock, none older than s clocks
            assert updates == steps * size and computed == steps * size and dropped == 0
            assert all(0 <= r["staleness_mean"] <= r["staleness_max"] <= 2 for r in rows)
        elif name == "backup":  # every gradient computed is used (P - b a step) or dropped
            assert updates == steps and computed == steps * (size - 1) + dropped
            assert all(r["staleness_max"] == 0 for r in rows)
        else:  # every push is applied (steps of them) or dropped after the count
            assert updates == steps and computed == steps + dropped, (updates, computed, dropped)
            assert dropped <= size - 1
            assert all(r["staleness_mean"] <= r["staleness_max"] for r in rows if r["updates"])
        print("OK", name)
"""


def test_ssp_backup_async_with_straggler_and_metrics(tmp_path):
    from mlcomm.trainer.metrics import COLUMNS, read_metrics
    proc = mpirun(4, [_script(tmp_path, MODES_BODY), tmp_path], timeout=120)
    print(proc.stdout)
    assert proc.stdout.count("OK ") == 3, proc.stdout
    for name, ext in (("ssp", "csv"), ("backup", "csv"), ("async", "json")):
        rows = read_metrics(tmp_path / f"{name}.{ext}")
        assert rows, (name, proc.stdout)
        for col in COLUMNS:
            assert col in rows[0], (name, col)
        for col in ("updates", "samples", "staleness_max", "dropped"):
            assert all(isinstance(r[col], int) for r in rows), (name, col)
        assert rows[-1]["test_accuracy"] >= 0.85
    meta = json.loads((tmp_path / "async.json").read_text())["meta"]
    assert meta["updates"] == meta["step"] == 360, meta


STRAGGLER_BODY = """
# rank 1 sleeps 30 ms a step, for good: the job ends at 60 updates, whoever sent them
res = train(sync="async", straggler="1:30", **dict(SMALL, steps=60))
computed = comm.allreduce(res.computed)
if rank == 0:
    rows = res.metrics
    dropped = sum(r["dropped"] for r in rows)
    assert res.step == 60 and sum(r["updates"] for r in rows) == 60, (res.step, rows[-1])
    # each worker has at most one push in flight when the count is reached
    assert computed == 60 + dropped and dropped <= size - 1, (computed, dropped)
    print(f"OK async stopped at {res.step} updates; workers computed {computed}, dropped {dropped}")
"""


def test_async_straggler_stops_on_global_count(tmp_path):
    proc = mpirun(4, [_script(tmp_path, STRAGGLER_BODY)], timeout=60)
    assert "OK async stopped at 60 updates" in proc.stdout, proc.stdout


ASYNC_CKPT_BODY = """
path, steps = sys.argv[1], int(sys.argv[2])
kw = dict(SMALL, sync="async", compress="topk:0.1", checkpoint=path, checkpoint_every=20,
          steps=steps)
res = train(resume=len(sys.argv) > 3, **kw)
if rank == 0:
    rows = res.metrics
    start = rows[0]["step"] - rows[0]["updates"] if rows else res.step
    print(f"DONE step={res.step} start={start} updates={sum(r['updates'] for r in rows)}")
"""


def test_async_checkpoint_every_n_and_resume(tmp_path):
    import shutil
    from mlcomm.trainer.checkpoint import load
    script = _script(tmp_path, ASYNC_CKPT_BODY)
    ck = tmp_path / "async.npz"
    # server 0 aborts the job at update 45: the checkpoint of the cut after update 40 stays
    proc = mpirun(3, [INJECT, "train-crash-at=45", "--", script, ck, 60], check=False,
                  timeout=60)
    assert proc.returncode != 0
    arrays, meta = load(ck)
    saved = meta["step"]
    assert 40 <= saved < 45, saved
    workers = [f"rank{r}_comp0_residual" for r in (1, 2)]
    assert all(k in arrays and np.any(arrays[k]) for k in workers), sorted(arrays)
    # resumed with nothing left to do, the run writes back exactly what it loaded
    again = tmp_path / "again.npz"
    shutil.copy(ck, again)
    proc = mpirun(3, [script, again, saved, "resume"], timeout=60)
    assert f"DONE step={saved}" in proc.stdout, proc.stdout
    arrays2, meta2 = load(again)
    assert meta2["step"] == saved and sorted(arrays2) == sorted(arrays)
    for k in arrays:
        assert np.array_equal(arrays[k], arrays2[k]), k
    # resumed to 60, it continues from the saved count
    proc = mpirun(3, [script, ck, 60, "resume"], timeout=60)
    assert f"DONE step=60 start={saved} updates={60 - saved}" in proc.stdout, proc.stdout


def _cli_train(ranks, *options, **kw):
    return mpirun(ranks, ["-m", "mlcomm.cli", "train", "--model", "mlp1", "--hidden", "16",
                          "--batch-size", "8", "--dtype", "float64", "--no-progress",
                          *map(str, options)], **kw)


def test_resume_on_another_p_says_what_changed(tmp_path):
    ck = tmp_path / "ck.npz"
    _cli_train(4, "--steps", "4", "--compress", "topk:0.1", "--checkpoint", ck, timeout=60)
    proc = _cli_train(2, "--steps", "6", "--compress", "topk:0.1", "--checkpoint", ck,
                      "--resume", timeout=60)
    lines = [ln for ln in proc.stderr.splitlines() if "resuming" in ln]
    assert lines == [f"mlcomm train: resuming {ck} (step 4, written by 4 ranks) on P=2: "
                     "global batch 32 -> 16; learning rate 0.05 -> 0.025 (--lr-scaling linear); "
                     "not carried: the 4 old ranks' topk error-feedback residuals "
                     "(they start at zero)"], proc.stderr
    assert "finished step 6" in proc.stdout, proc.stdout


CORRUPT_BODY = """
import json
cases = json.loads(sys.argv[1])
for path, opts, expect in cases:
    try:
        train(checkpoint=path, resume=True, **dict(SMALL, **opts))
    except ValueError as exc:
        msg = str(exc)
        assert "\\n" not in msg and msg.startswith(f"checkpoint {path} ") and expect in msg, msg
        assert msg.endswith("or pass another --checkpoint"), msg
        print(f"OK rank {rank}: {msg}")
    else:
        raise AssertionError(f"{path} {opts} was accepted")
"""


def test_corrupt_or_mismatched_checkpoint_is_one_line(tmp_path):
    from mlcomm.trainer.checkpoint import load, save
    good = tmp_path / "good.npz"
    _cli_train(2, "--steps", "2", "--checkpoint", good, timeout=60)
    raw = good.read_bytes()
    arrays, meta = load(good)
    cases = []

    def case(name, data, expect, **opts):
        path = tmp_path / name
        if data is not None:
            path.write_bytes(data)
        cases.append((str(path if data is not None else good), opts, expect))

    case("truncated.npz", raw[:len(raw) // 2], "is truncated or corrupt (BadZipFile)")
    case("flipped.npz", raw[:300] + bytes(b ^ 0xFF for b in raw[300:400]) + raw[400:],
         "is truncated or corrupt")
    case("garbage.npz", b"\x13\x37" * 500, "is not an .npz archive")
    case("empty.npz", b"", "is empty")
    np.savez(tmp_path / "nometa.npz", params=arrays["params"])
    cases.append((str(tmp_path / "nometa.npz"), {}, "has no __meta__ record"))
    save(tmp_path / "nokeys.npz", {"params": arrays["params"]},
         {k: v for k, v in meta.items() if k != "sizes"})
    cases.append((str(tmp_path / "nokeys.npz"), {}, "lacks sizes, velocity"))
    save(tmp_path / "shape.npz", {"params": arrays["params"][:-3], "velocity": arrays["velocity"]},
         meta)
    cases.append((str(tmp_path / "shape.npz"), {}, "holds params of shape"))
    case("model", None, "holds a mlp1 model with layers [64, 16, 10]", hidden=(32,))
    case("sync", None, "was written by a P=2 bsp run; this run is P=2 ssp: resume with --sync bsp and no",
         sync="ssp")
    proc = mpirun(2, [_script(tmp_path, CORRUPT_BODY), json.dumps(cases)], timeout=60)
    assert proc.stdout.count("OK rank") == 2 * len(cases), proc.stdout
    # the command line: one line, a non-zero exit on every rank, no traceback
    for path, opts in ((tmp_path / "truncated.npz", []), (good, ["--sync", "ssp"])):
        proc = _cli_train(2, "--checkpoint", path, "--resume", *opts, check=False, timeout=60)
        assert proc.returncode != 0, proc.stdout
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"mlcomm train: error: checkpoint {path} "), \
            proc.stderr
        assert "Traceback" not in proc.stderr


BAD_BODY = """
cases = [(dict(sync="ssp", staleness=-1), "--staleness"),
         (dict(backup_workers=size), "--backup-workers"),
         (dict(sync="async", servers=size), "--servers"),
         (dict(sync="async", servers=0), "--servers"),
         (dict(compress="zip:3"), "--compress"),
         (dict(compress="topk:0"), "--compress"),
         (dict(algorithm="nope"), "--algorithm"),
         (dict(framework="jax"), "--framework"),
         (dict(model="cnn"), "cnn needs --framework torch"),
         (dict(framework="torch", sync="ssp"), "--sync bsp"),
         (dict(framework="torch", model="cnn", data="synthetic"), "--data digits")]
for opts, word in cases:
    try:
        train(**opts)
    except ValueError as exc:
        assert word in str(exc), (opts, str(exc))
        if rank == 0:
            print("OK", word, "->", exc)
    else:
        raise AssertionError(f"{opts} was accepted")
"""


def test_bad_options_raise_before_communicating(tmp_path):
    proc = mpirun(3, [_script(tmp_path, BAD_BODY)], timeout=60)
    assert proc.stdout.count("OK ") == 11, proc.stdout
    # the command line reports them as errors (exit 2), without a traceback
    proc = mpirun(2, ["-m", "mlcomm.cli", "train", "--backup-workers", "2"], check=False, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "mlcomm train: error: --backup-workers" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
