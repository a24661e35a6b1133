"""mlcomm.torch.DistributedDataParallel and ``mlcomm train --framework torch``, as mpiexec jobs."""

import json

import pytest

from conftest import mpirun
from test_trainer import _script as trainer_script

pytest.importorskip("torch")

PRELUDE = """
import hashlib
import sys
import torch
from mpi4py import MPI
from mlcomm.cli import abort_on_error
from mlcomm.torch import DistributedDataParallel as DDP

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
torch.set_num_threads(1)


def digest(module):
    h = hashlib.sha256()
    for p in module.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()


def same_on_every_rank(module):
    mine = digest(module)
    return all(d == mine for d in comm.allgather(mine))


class Probe(torch.autograd.Function):
    \"\"\"Identity; its backward notes which buckets have started by then.\"\"\"

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        SEEN.append([b.request is not None for b in WRAPPER[0].buckets])
        return grad


SEEN, WRAPPER = [], []


def model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(12, 48), torch.nn.Tanh(), torch.nn.Linear(48, 48), torch.nn.Tanh(),
        torch.nn.Linear(48, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4)).double()
"""


def _script(tmp_path, body):
    return trainer_script(tmp_path, body, prelude=PRELUDE)


MATCH_BODY = """
B, STEPS = 6, 5
g = torch.Generator().manual_seed(1)
X = torch.randn(STEPS * B * size, 12, generator=g, dtype=torch.float64)
Y = torch.randint(0, 4, (STEPS * B * size,), generator=g)
loss_fn = torch.nn.CrossEntropyLoss()
reference = model(0)                      # one process, the global batch
start = {k: v.clone() for k, v in reference.state_dict().items()}
ref_opt = torch.optim.SGD(reference.parameters(), lr=0.2, momentum=0.9, weight_decay=1e-3)
for step in range(STEPS):
    lo = step * B * size
    ref_opt.zero_grad()
    loss_fn(reference(X[lo:lo + B * size]), Y[lo:lo + B * size]).backward()
    ref_opt.step()
for overlap in (True, False):
    local = model(rank + 10)              # every rank starts elsewhere: DDP broadcasts rank 0's
    if rank == 0:
        local.load_state_dict(start)
    ddp = DDP(local, bucket_cap_mb=0.01, overlap=overlap)
    WRAPPER[:] = [ddp]
    opt = torch.optim.SGD(ddp.parameters(), lr=0.2, momentum=0.9, weight_decay=1e-3)
    assert same_on_every_rank(local), "the construction broadcast left ranks apart"
    for step in range(STEPS):
        lo = step * B * size + rank * B
        opt.zero_grad(set_to_none=step % 2 == 0)   # both ways of zeroing keep working
        SEEN.clear()
        x = X[lo:lo + B].clone().requires_grad_(True)
        loss_fn(ddp(Probe.apply(x)), Y[lo:lo + B]).backward()
        n = ddp.last_backward["buckets"]
        assert n == len(ddp.buckets) >= 4, ddp.last_backward
        if overlap:  # the input's gradient comes last: by then the late layers' bucket runs
            assert SEEN and SEEN[0][0], SEEN
            assert ddp.last_backward["started_by_hooks"] == n, ddp.last_backward
        else:
            assert SEEN and not any(SEEN[0]), SEEN
            assert ddp.last_backward["started_by_hooks"] == 0, ddp.last_backward
        opt.step()
    assert same_on_every_rank(local), "parameters differ across ranks"
    err = max(float((a - b).detach().abs().max() / b.detach().abs().max())
              for a, b in zip(local.parameters(), reference.parameters()))
    assert err < 1e-13, f"overlap={overlap}: differs from one process by {err}"
    assert list(ddp.state_dict()) == ["module." + k for k in local.state_dict()]
    if rank == 0:
        print(f"OK overlap={overlap} buckets={n} rel.err={err:.1e}")
"""




UNUSED_BODY = """
class Heads(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = torch.nn.Linear(4, 3)
        self.left = torch.nn.Linear(3, 2)
        self.right = torch.nn.Linear(3, 2)
        self.never = torch.nn.Linear(3, 2)

    def forward(self, x, right):
        h = self.trunk(x)
        return self.right(h) if right else self.left(h)

x = torch.full((2, 4), float(rank + 1))
net = Heads()
ddp = DDP(net, bucket_cap_mb=0, find_unused_parameters=True)
ddp(x, right=rank == 0).sum().backward()
# right: used on rank 0 only, so its average has zeros from the others; never: no rank used it
assert torch.allclose(net.right.bias.grad, torch.full((2,), 2.0 / size)), net.right.bias.grad
assert torch.allclose(net.left.bias.grad, torch.full((2,), 2.0 * (size - 1) / size))
assert net.never.weight.grad is None and net.never.bias.grad is None
# no_sync: local sums, then the next backward all-reduces them
mine = torch.autograd.grad(net(x, True).sum(), net.trunk.bias)[0]  # this rank's, not averaged
ddp.zero_grad(set_to_none=False)
with ddp.no_sync():
    ddp(x, right=True).sum().backward()
assert torch.equal(net.trunk.bias.grad, mine), (net.trunk.bias.grad, mine)
ddp(x, right=True).sum().backward()
want = 2 * sum(comm.allgather(mine)) / size
assert torch.allclose(net.trunk.bias.grad, want, rtol=1e-6), (net.trunk.bias.grad, want)
# without find_unused_parameters: a clear error on every rank, no rank left waiting
strict = DDP(Heads(), bucket_cap_mb=0)
try:
    strict(x, right=False).sum().backward()
except RuntimeError as exc:
    assert "right.weight, right.bias, never.weight, never.bias got no gradient" in str(exc), exc
    assert "find_unused_parameters=True" in str(exc)
else:
    raise AssertionError("an unused parameter was accepted")
for bad, word in (({"bucket_cap_mb": -1}, "bucket_cap_mb"), ({"algorithm": "nope"}, "nope")):
    try:
        DDP(Heads(), **bad)
    except ValueError as exc:
        assert word in str(exc), exc
    else:
        raise AssertionError(bad)
print(f"OK unused rank {rank}")
"""


@pytest.mark.parametrize("nprocs", [2, 3])
def test_ddp_matches_one_process_unused_parameters_no_sync(tmp_path, nprocs):
    """Same parameters as one process on the global batch, the same bits on every rank,
    buckets started during backward; unused parameters, no_sync and bad arguments."""
    proc = mpirun(nprocs, [_script(tmp_path, MATCH_BODY + UNUSED_BODY)], timeout=120)
    assert proc.stdout.count("OK overlap=") == 2, proc.stdout
    assert proc.stdout.count("OK unused rank") == nprocs, proc.stdout


def test_train_torch_cnn_accuracy_timeline_and_bytes(tmp_path):
    """``mlcomm train --framework torch --model cnn``: accuracy, a Chrome trace, counted bytes."""
    from mlcomm.trainer.metrics import read_metrics
    timeline, metrics = tmp_path / "timeline.json", tmp_path / "metrics.csv"
    proc = mpirun(2, ["-m", "mlcomm.cli", "train", "--framework", "torch", "--model", "cnn",
                      "--steps", "120", "--bucket-mb", "0.05", "--algorithm", "ring",
                      "--timeline", timeline, "--metrics", metrics, "--no-progress"],
                  timeout=120)
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


def test_bench_scripts_check_their_sums_and_write_their_records(tmp_path):
    """bench/torch_gloo.py and bench/overlap.py run (few rounds) and write their JSON."""
    from conftest import ROOT
    gloo, overlap = tmp_path / "gloo.json", tmp_path / "overlap.json"
    proc = mpirun(2, [ROOT / "bench" / "torch_gloo.py", "--sizes", "8,64K", "--rounds", "1",
                      "--output", gloo], timeout=120)
    rows = json.loads(gloo.read_text())["rows"]
    assert [r["bytes"] for r in rows] == [8, 65536], proc.stdout
    assert set(rows[0]["time_us"]) == {"mlcomm", "handle", "gloo", "mpi"}
    assert "mlcomm/gloo" in proc.stdout
    proc = mpirun(2, [ROOT / "bench" / "overlap.py", "--sizes", "64K", "--rounds", "1",
                      "--hidden", "64", "--batch", "4", "--output", overlap], timeout=120)
    rec = json.loads(overlap.read_text())
    assert {r["contestant"] for r in rec["allreduce"]} == {
        "mlcomm iallreduce", "mlcomm start()", "MPI_Iallreduce", "MPI_Iallreduce + MPI_Test"}
    assert set(rec["ddp"]["step_ms"]) == {"no communication", "DDP, all-reduce during backward",
                                          "DDP, all-reduce after backward"}
    assert "overlap" in proc.stdout
