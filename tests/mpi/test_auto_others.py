"""auto for the collectives other than all-reduce, in real jobs: a size band's first call
times the candidates (auto/others.py) and picks the same on every rank, the results are
exact, a later call of the band times nothing; MLCOMM_AUTO=model and an uneven form whose
counts differ by rank take the closed-form choice."""

import numpy as np
import pytest
from mpi4py import MPI

import mlcomm
from mlcomm import session
from mlcomm.session import auto

from mpi_helpers import COMM, agree

pytestmark = pytest.mark.mpi
P, RANK = COMM.Get_size(), COMM.Get_rank()
ROOT = P - 1


@pytest.fixture
def fresh(monkeypatch):
    """A new communicator (a session with no choices yet), no profile."""
    monkeypatch.setenv("MLCOMM_PROFILE", "/nonexistent")
    comm = COMM.Dup()
    yield comm, session.session_of(comm)
    comm.Free()


def _call(collective, n, comm):
    """``(result, want)``: ``collective`` on ``n`` int32 elements a rank (root ROOT), and its
    exact answer (None where this rank has no result)."""
    x = np.arange(n, dtype=np.int32) + RANK
    blocks = lambda f: np.concatenate([f(r) for r in range(P)])
    if collective == "allgather":
        return mlcomm.allgather(x, comm=comm), blocks(lambda r: np.arange(n) + r)
    if collective == "bcast":
        mlcomm.bcast(x, root=ROOT, comm=comm)
        return x, np.arange(n) + ROOT
    if collective == "reduce":
        got = mlcomm.reduce(x, root=ROOT, comm=comm)
        return got, (P * np.arange(n) + P * (P - 1) // 2) if RANK == ROOT else None
    if collective == "gather":
        got = mlcomm.gather(x, root=ROOT, comm=comm)
        return got, blocks(lambda r: np.arange(n) + r) if RANK == ROOT else None
    if collective == "scatter":
        send = np.arange(n * P, dtype=np.int32) + ROOT
        got = mlcomm.scatter(send, np.empty(n, np.int32), root=ROOT, comm=comm)
        return got, send[RANK * n:(RANK + 1) * n]
    if collective == "reduce_scatter":
        send = np.arange(n * P, dtype=np.int32) + RANK
        total = P * np.arange(n * P) + P * (P - 1) // 2
        return mlcomm.reduce_scatter(send, comm=comm), total[RANK * n:(RANK + 1) * n]
    if collective == "alltoall":
        send = np.arange(n * P, dtype=np.int32) + 1000 * RANK
        return mlcomm.alltoall(send, comm=comm), \
            blocks(lambda r: np.arange(RANK * n, (RANK + 1) * n) + 1000 * r)
    if collective == "allgatherv":
        counts = [n + r for r in range(P)]
        got = mlcomm.allgatherv(np.arange(n + RANK, dtype=np.int32) + RANK, counts=counts,
                                comm=comm)
        return got, blocks(lambda r: np.arange(n + r) + r)
    raise AssertionError(collective)


EVEN = ("reduce_scatter", "allgather", "bcast", "reduce", "gather", "scatter", "alltoall")


def _bands(s, collective, kind="band"):
    return {k: v for k, v in s.choices.items() if k[:2] == (kind, collective)}


@pytest.mark.parametrize("collective", EVEN + ("allgatherv",))
@pytest.mark.parametrize("n", [5, 20_000])
def test_timed_once_per_band_same_everywhere_exact(fresh, monkeypatch, collective, n):
    monkeypatch.delenv("MLCOMM_AUTO", raising=False)
    comm, s = fresh
    timed = []
    monkeypatch.setattr(auto.choice, "other_trial",
                        lambda *a, _t=auto.choice.other_trial: timed.append(a[1]) or _t(*a))
    got, want = _call(collective, n, comm)
    agree(want is None and got is None or np.array_equal(got, want),
          f"auto's {collective} is inexact")
    bands = _bands(s, collective)
    if P == 1:
        agree(not bands and not timed, f"a single rank has nothing to time: {bands}")
        return
    agree(len(bands) == 1 and timed == [collective], f"{bands}, trials {timed}")
    everyone = COMM.allgather(sorted(bands.items()))
    agree(all(e == everyone[0] for e in everyone), f"ranks chose differently: {everyone}")
    (record,) = [v for k, v in s.trials.items() if k[0] == collective]
    agree(record["pick"] == next(iter(bands.values()))[0], str(record))
    # another count of the band times nothing, and is exact on the band's pick
    # the band is the count the ranks share: allgatherv's mean block
    band = lambda k: (4 * (k + (P - 1) // 2 if collective == "allgatherv" else k)).bit_length()
    m = next(k for k in [*range(n + 1, 2 * n + 2), *range(n - 1, 0, -1)] if band(k) == band(n))
    got, want = _call(collective, m, comm)
    agree(want is None and got is None or np.array_equal(got, want), "inexact in the band")
    agree(timed == [collective], f"the band was timed again: {timed}")


@pytest.mark.parametrize("collective", EVEN)
def test_in_place_and_the_library_call_exact(fresh, monkeypatch, collective):
    """The trial of an in-place call lays out its buffers as the call's; where the library's
    call is the pick, its result is exact too."""
    monkeypatch.delenv("MLCOMM_AUTO", raising=False)
    comm, s = fresh
    n = 500
    if collective == "allgather":
        buf = np.zeros(n * P, np.int32)
        buf[RANK * n:(RANK + 1) * n] = np.arange(n) + RANK
        mlcomm.allgather(MPI.IN_PLACE, buf, comm=comm)
        agree(np.array_equal(buf, np.concatenate([np.arange(n) + r for r in range(P)])))
    elif collective == "reduce_scatter":
        buf = np.arange(n * P, dtype=np.int32) + RANK
        got = mlcomm.reduce_scatter(MPI.IN_PLACE, buf, comm=comm)
        agree(np.array_equal(got, (P * np.arange(n * P) + P * (P - 1) // 2)[RANK * n:
                                                                             (RANK + 1) * n]))
    else:
        monkeypatch.setattr(auto.policy.tuning, "OTHER_MODEL_TOP", 0)  # the library's alone
        got, want = _call(collective, n, comm)
        agree(want is None and got is None or np.array_equal(got, want), "inexact")
        picked = {v[0] for v in _bands(s, collective).values()}
        agree(P == 1 or picked <= {"mpi", "shared_memory"}, str(picked))


@pytest.mark.parametrize("collective", EVEN)
def test_model_takes_the_closed_form_choice(fresh, monkeypatch, collective):
    monkeypatch.setenv("MLCOMM_AUTO", "model")
    comm, s = fresh
    n = 1000
    got, want = _call(collective, n, comm)
    agree(want is None and got is None or np.array_equal(got, want), "inexact")
    agree(not _bands(s, collective), f"MLCOMM_AUTO=model timed: {_bands(s, collective)}")
    picked = [v[0] for k, v in s.choices.items() if k[:3] == (collective, P, n)]
    model = auto.auto_choice(collective, P, n * 4, nodes=s.nodes)
    agree(picked == [model], f"{picked} is not the model's {model}")


def test_uneven_counts_that_differ_by_rank_take_the_model(fresh, monkeypatch):
    """gatherv's counts are the root's alone: its band (count 0) is not timed."""
    monkeypatch.delenv("MLCOMM_AUTO", raising=False)
    comm, s = fresh
    counts = [3 + r for r in range(P)]
    x = np.arange(3 + RANK, dtype=np.int32) + RANK
    got = mlcomm.gatherv(x, counts=counts, root=ROOT, comm=comm)
    if RANK == ROOT:
        want = np.concatenate([np.arange(3 + r) + r for r in range(P)])
        agree(np.array_equal(got, want), "inexact")
    else:
        agree(got is None)
    agree(not _bands(s, "gatherv") and _bands(s, "gatherv", "modelled") if P > 1 else True,
          str(s.choices))
