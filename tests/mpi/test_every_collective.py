"""Gather, scatter, all-to-all and the uneven forms: every algorithm of each against the MPI
library's own call (mpi4py on the plain communicator), exactly; in place where they take it;
their repeats with other counts; and their argument errors, raised on every rank.

Integers carry each rank's and element's identity, so any misplaced element shows; float32
and float64 move bit for bit (their bytes are compared); ``reduce_scatter_v`` sums small
integers, exact in every dtype whatever the order.
"""

import numpy as np
import pytest
from mpi4py import MPI

import mlcomm
from mlcomm.algorithms import COLLECTIVES

from mpi_helpers import COMM, agree, runs_here

pytestmark = pytest.mark.mpi
P, RANK = COMM.Get_size(), COMM.Get_rank()
DTYPES = [np.dtype(np.int64), np.dtype(np.float32), np.dtype(np.int8)]
NEW = ("gather", "scatter", "alltoall", "allgatherv", "reduce_scatter_v", "gatherv",
       "scatterv", "alltoallv")


def names(collective):
    """Every algorithm of ``collective`` that runs on this layout, ``auto`` included."""
    return runs_here(list(COLLECTIVES[collective]), collective)


def data(dt, n, rank, salt=0):
    """Rank ``rank``'s ``n`` elements: distinct across ranks and elements (mod 128 for int8)."""
    values = (np.arange(n) * 7 + rank * 1000 + salt) % (128 if dt.itemsize == 1 else 1 << 20)
    return values.astype(dt)


def counts_for(seed):
    """One count per rank, zeros among them, the same on every rank."""
    rng = np.random.default_rng(seed)
    return tuple(int(c) for c in rng.integers(0, 4, P) * rng.integers(0, 2, P))


def same(got, want):
    return got is None and want is None or (
        got is not None and want is not None and got.dtype == want.dtype and
        got.shape == want.shape and got.tobytes() == want.tobytes())


def library(collective, send, counts=None, sendcounts=None, recvcounts=None, root=0):
    """The MPI library's own answer on the plain communicator (None off a gather's root)."""
    dt, t = send.dtype, MPI.Datatype.fromcode(send.dtype.char)
    comm = MPI.COMM_WORLD
    if collective in ("gather", "gatherv"):
        size = send.size * P if counts is None else sum(counts)
        out = np.empty(size, dt) if RANK == root else None
        if collective == "gather":
            comm.Gather([send, t], [out, t] if out is not None else None, root)
        else:
            comm.Gatherv([send, t], [out, list(counts), t] if out is not None else None, root)
        return out
    if collective in ("scatter", "scatterv"):
        block = counts[RANK] if counts is not None else send.size // P
        out = np.empty(block, dt)
        if collective == "scatter":
            comm.Scatter([send, t], [out, t], root)
        else:
            comm.Scatterv([send, list(counts), t], [out, t], root)
        return out
    if collective == "alltoall":
        out = np.empty_like(send)
        comm.Alltoall([send, t], [out, t])
        return out
    if collective == "allgatherv":
        out = np.empty(sum(counts), dt)
        comm.Allgatherv([send, t], [out, list(counts), t])
        return out
    if collective == "reduce_scatter_v":
        out = np.empty(counts[RANK], dt)
        comm.Reduce_scatter([send, t], [out, t], list(counts), MPI.SUM)
        return out
    out = np.empty(sum(recvcounts), dt)
    comm.Alltoallv([send, list(sendcounts), t], [out, list(recvcounts), t])
    return out


def call(collective, name, send, counts=None, sendcounts=None, recvcounts=None, root=0,
         recvbuf=None):
    """mlcomm's call of ``collective`` with algorithm ``name``."""
    f = getattr(mlcomm, collective)
    if collective in ("gather", "scatter"):
        return f(send, recvbuf, root, algorithm=name)
    if collective in ("gatherv", "scatterv"):  # counts at the root alone, but through the
        everywhere = name == "shared_memory" or recvbuf is None  # window, where all need them
        return f(send, recvbuf, counts if RANK == root or everywhere else None, root,
                 algorithm=name)
    if collective == "alltoall":
        return f(send, recvbuf, algorithm=name)
    if collective == "alltoallv":
        return f(send, sendcounts, recvbuf, recvcounts, algorithm=name)
    return f(send, recvbuf, counts, algorithm=name)


def case(collective, dt, seed):
    """``(send, kwargs)`` for one call: this rank's input and the counts and root."""
    rng = np.random.default_rng(seed)
    root = int(rng.integers(0, P))
    counts = counts_for(seed)
    n = int(rng.integers(0, 4))
    if collective == "gather":
        return data(dt, n, RANK), {"root": root}
    if collective == "scatter":
        return data(dt, n * P, root, seed), {"root": root}
    if collective == "alltoall":
        return data(dt, n * P, RANK), {}
    if collective == "alltoallv":
        m = np.random.default_rng(seed + 1).integers(0, 3, (P, P))
        return data(dt, int(m[RANK].sum()), RANK), {
            "sendcounts": tuple(int(c) for c in m[RANK]),
            "recvcounts": tuple(int(c) for c in m[:, RANK])}
    if collective == "reduce_scatter_v":
        return (np.arange(sum(counts)) % 5 + RANK).astype(dt), {"counts": counts}
    if collective == "scatterv":
        return data(dt, sum(counts), root, seed), {"counts": counts, "root": root}
    if collective == "gatherv":
        return data(dt, counts[RANK], RANK), {"counts": counts, "root": root}
    return data(dt, counts[RANK], RANK), {"counts": counts}


@pytest.mark.parametrize("collective", NEW)
def test_every_algorithm_matches_the_library(collective):
    """Every algorithm (and auto) gives the library's answer, byte for byte, on three
    dtypes and four random cases each: counts with zeros, random roots; then repeats the
    call on the same buffers with the next case's counts."""
    bad = []
    for name in names(collective):
        for dt in DTYPES:
            for seed in range(4):
                send, kw = case(collective, dt, 100 * seed + len(collective))
                want = library(collective, send, **kw)
                if collective in ("scatter", "scatterv"):  # a leaf's recvbuf gives the size
                    kw["recvbuf"] = np.empty(want.size, dt)
                for again in range(2):  # the second call repeats through the memo
                    got = call(collective, name, send, **kw)
                    if not same(got, want):
                        bad.append((name, str(dt), seed, again))
    agree(not bad, f"{collective}: differ from the library: {bad[:5]}")


def test_repeats_with_new_counts_on_the_same_buffers():
    """A call repeated on the same arrays with other counts is a new call, not the memo's."""
    send = np.arange(6, dtype=np.int64) + 10 * RANK
    out = np.empty(6 * P, np.int64)
    for k in (2, 0, 3, 6):
        counts = tuple([k] * P)
        got = mlcomm.allgatherv(send[:k], out[:k * P], counts, algorithm="ring")
        want = np.concatenate([np.arange(k) + 10 * r for r in range(P)])
        agree(np.array_equal(got, want), f"allgatherv with counts {counts}: {got}")
    row = np.arange(2 * P, dtype=np.int64) + 100 * RANK
    recv = np.empty(2 * P, np.int64)
    for k in (1, 2, 0):
        got = mlcomm.alltoallv(row[:k * P], [k] * P, recv[:k * P], [k] * P,
                               algorithm="pairwise")
        want = np.concatenate([np.arange(k * P)[RANK * k:(RANK + 1) * k] + 100 * r
                               for r in range(P)]) if k else np.empty(0, np.int64)
        agree(np.array_equal(got, want), f"alltoallv with blocks of {k}: {got}")


@pytest.mark.parametrize("collective", ["gather", "allgatherv", "gatherv"])
def test_in_place(collective):
    """The root's (every rank's, for allgatherv) own block taken from ``recvbuf``."""
    counts = tuple((r % 3) + 1 for r in range(P)) if collective != "gather" else (2,) * P
    at = np.concatenate([[0], np.cumsum(counts)])
    want = np.concatenate([data(np.dtype(np.int64), counts[r], r) for r in range(P)])
    for name in names(collective):
        for root in {0, P - 1}:
            here = collective == "allgatherv" or RANK == root
            buf = np.full(sum(counts), -1, np.int64)
            buf[at[RANK]:at[RANK + 1]] = data(np.dtype(np.int64), counts[RANK], RANK)
            mine = buf[at[RANK]:at[RANK + 1]].copy()
            if collective == "gather":
                got = mlcomm.gather(mlcomm.IN_PLACE if here else mine, buf if here else None,
                                    root, algorithm=name)
            elif collective == "gatherv":
                got = mlcomm.gatherv(mlcomm.IN_PLACE if here else mine, buf if here else None,
                                     counts, root, algorithm=name)
            else:
                got = mlcomm.allgatherv(mlcomm.IN_PLACE, buf, counts, algorithm=name)
            ok = np.array_equal(buf, want) and got is buf if here else got is None
            agree(ok, f"{collective} {name} in place from root {root}: {buf}")


def test_comm_methods_match_mpi4py():
    """mlcomm.Comm's Gather ... Reduce_scatter give what mpi4py's own give, with mpi4py's
    buffer specifications, displacements with gaps included."""
    comm = mlcomm.Comm(MPI.COMM_WORLD)
    plain = MPI.COMM_WORLD
    counts = [r % 3 + 1 for r in range(P)]
    displs = [4 * r for r in range(P)]  # gaps between the blocks
    send = data(np.dtype(np.int32), counts[RANK], RANK)
    results = []
    for c in (comm, plain):
        out = {}
        g = np.full(4 * P, -1, np.int32)
        c.Gatherv(send, [g, counts, displs, MPI.INT] if RANK == 0 else None, 0)
        out["gatherv"] = g
        a = np.full(4 * P, -1, np.int32)
        c.Allgatherv(send, [a, (counts, displs), MPI.INT])
        out["allgatherv"] = a
        s = np.full(counts[RANK], -1, np.int32)
        c.Scatterv([np.arange(4 * P, dtype=np.int32), counts, displs, MPI.INT], s, P - 1)
        out["scatterv"] = s
        t = np.full(2 * P, -1, np.int32)
        c.Alltoall(np.arange(2 * P, dtype=np.int32) + 10 * RANK, t)
        out["alltoall"] = t
        v = np.full(4 * P, -1, np.int32)
        c.Alltoallv([np.arange(4 * P, dtype=np.int32) + 50 * RANK, counts, displs, MPI.INT],
                    [v, [counts[RANK]] * P, displs, MPI.INT])
        out["alltoallv"] = v
        r = np.full(counts[RANK], -1, np.int32)
        c.Reduce_scatter(np.arange(sum(counts), dtype=np.int32) + RANK, r, counts, MPI.SUM)
        out["reduce_scatter"] = r
        gg = np.full(3 * P, -1, np.int32) if RANK == 1 % P else None
        c.Gather(np.arange(3, dtype=np.int32) + RANK, gg, 1 % P)
        out["gather"] = gg
        sc = np.full(3, -1, np.int32)
        c.Scatter(np.arange(3 * P, dtype=np.int32), sc, 0)
        out["scatter"] = sc
        results.append(out)
    bad = [k for k in results[0] if not (results[0][k] is None and results[1][k] is None or
                                         np.array_equal(results[0][k], results[1][k]))]
    agree(not bad, f"mlcomm.Comm differs from mpi4py in {bad}")


def test_argument_errors_are_raised_on_every_rank():
    """Counts that do not match the buffer, a root out of range and counts of the wrong
    length are errors naming the argument, on every rank, before any message."""
    x = np.arange(3, dtype=np.int64)
    cases = [
        (lambda: mlcomm.allgatherv(x, counts=(3,) * (P + 1)), "counts"),
        (lambda: mlcomm.allgatherv(x, counts=(2,) * P), "counts"),
        (lambda: mlcomm.reduce_scatter_v(x, counts=(4,) * P), "counts sum"),
        (lambda: mlcomm.gather(x, root=P), "root"),
        (lambda: mlcomm.scatter(np.arange(P * 2), root=-1), "root"),
        *([(lambda: mlcomm.alltoall(np.arange(P * 2 + 1)), "multiple")] if P > 1 else []),
        (lambda: mlcomm.alltoallv(np.arange(P + 1), (1,) * P, recvcounts=(1,) * P),
         "sendcounts"),
        (lambda: mlcomm.alltoallv(x, (-1,) * P, recvcounts=(1,) * P), "sendcounts"),
        (lambda: mlcomm.gatherv(x, counts=None, root=0) if RANK == 0 else
         (_ for _ in ()).throw(ValueError("counts (not the root)")), "counts"),
        (lambda: mlcomm.scatter(None, None, 0) if RANK else
         (_ for _ in ()).throw(ValueError("recvbuf (the root)")), "recvbuf"),
        (lambda: mlcomm.alltoall(mlcomm.IN_PLACE, np.arange(P)), "in place"),
    ]
    missed = []
    for run, word in cases:
        try:
            run()
            missed.append(word)
        except (TypeError, ValueError) as exc:
            if word not in str(exc):
                missed.append(f"{word}: {exc}")
    agree(not missed, f"not raised, or not naming the argument: {missed}")


def test_uneven_splits_that_differ_from_the_peers_are_an_error():
    """With ``validate=True``, an all-to-all-v whose recvcounts differ from what the peers
    send raises on every rank, naming the ranks and the counts."""
    sends = (1,) * P
    recvs = (1,) * P if RANK else (2,) + (1,) * (P - 1)
    with pytest.raises(ValueError, match="recvcounts"):
        mlcomm.alltoallv(np.arange(P, dtype=np.int64), sends, np.empty(sum(recvs), np.int64),
                         recvs, validate=True)


def test_validate_passes_uneven_calls_and_names_a_dtype_that_differs():
    """``validate=True`` takes the uneven forms' per-rank counts as they are, and raises on
    every rank where one rank's dtype differs."""
    m = [[(i + j) % 3 for j in range(P)] for i in range(P)]
    sends = np.arange(sum(m[RANK]), dtype=np.int64)
    got = mlcomm.alltoallv(sends, m[RANK], None, [m[j][RANK] for j in range(P)],
                           validate=True)
    agree(got.size == sum(m[j][RANK] for j in range(P)), "alltoallv with validate=True")
    counts = [q + 1 for q in range(P)]
    got = mlcomm.gatherv(np.arange(RANK + 1), None, counts, 0, validate=True)
    agree(RANK != 0 or got.size == sum(counts), "gatherv with validate=True")
    if P > 1:
        x = np.arange(4, dtype=np.float32 if RANK == P - 1 else np.float64)
        with pytest.raises(ValueError, match="dtype"):
            mlcomm.gather(x, root=0, validate=True)


def test_mlcomm_algorithm_may_name_an_algorithm_the_all_reduce_lacks(monkeypatch):
    """``MLCOMM_ALGORITHM=bruck``: the all-to-all runs Bruck's, the all-reduce its auto."""
    monkeypatch.setenv("MLCOMM_ALGORITHM", "bruck")
    comm = COMM.Dup()
    try:
        got = mlcomm.alltoall(np.arange(P) + 10 * RANK, comm=comm)
        total = mlcomm.allreduce(np.ones(3), comm=comm)
        from mlcomm import session
        ran = {key[:2] for key in session.session_of(comm).plans}
        agree(got.tolist() == [10 * q + RANK for q in range(P)] and (total == P).all(),
              "alltoall and allreduce under MLCOMM_ALGORITHM=bruck")
        agree(("alltoall", "bruck") in ran or P == 1, f"ran {ran}")
    finally:
        comm.Free()


@pytest.mark.parametrize("collective", NEW)
def test_non_blocking_and_persistent_forms(collective):
    """``mlcomm.istart`` and ``mlcomm.init`` of every new collective give the blocking
    call's answer: started twice and waited in order, and a persistent handle called three
    times (and started once) on what its buffers hold then."""
    send, kw = case(collective, np.dtype(np.int64), 7)
    want = library(collective, send, **kw)
    root = kw.pop("root", 0)
    recv = np.empty(want.size, np.int64) if want is not None else None
    options = {k: v for k, v in kw.items() if v is not None}
    first = mlcomm.istart(collective, send, recv, root=root, **options)
    second = mlcomm.istart(collective, send, None if want is None else np.empty_like(recv),
                           root=root, **options) if collective not in ("scatter",
                                                                        "scatterv") else None
    got = [first.wait(), second.wait() if second is not None else want]
    agree(all(same(g, want) for g in got), f"istart {collective}: {got} vs {want}")
    handle = mlcomm.init(collective, send, recv, root=root, **options)
    results = [handle() for _ in range(3)]
    handle.start()
    results.append(handle.wait())
    agree(all(same(g, want) for g in results), f"init {collective}: {results} vs {want}")
