"""``mlcomm bench``: sizes, reports, plots, and real mpiexec runs with --check."""

import csv
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mlcomm.benchmark.harness import (EXTRA_KEYS, RECORD_KEYS, BenchConfig, band_summary,
                                      default_iters, size_list)
from mlcomm.benchmark.report import format_csv, format_json, format_kernels, format_table
from mlcomm.units import parse_size

from conftest import ROOT, mpirun

BENCH = ["-m", "mlcomm", "bench", "--no-progress"]
#: runs a command with a fault injected (tests/faults/inject.py)
INJECT = str(Path(__file__).parent / "faults" / "inject.py")
FAST = ["--min-bytes", "8", "--max-bytes", "4K", "--factor", "8", "--iters", "3",
        "--warmup", "1"]


def _algorithms():
    from mlcomm.algorithms import ALGORITHMS
    return {n for n, a in ALGORITHMS.items() if a.collective == "allreduce"}


# ----------------------------------------------------------------- no MPI job

@pytest.mark.parametrize("text, n", [("8", 8), ("64K", 65536), ("16M", 16 << 20),
                                     ("1G", 1 << 30), ("4KiB", 4096), ("2kb", 2048), (5, 5)])
def test_parse_size(text, n):
    assert parse_size(text) == n


@pytest.mark.parametrize("bad", ["", "8X", "-1", "1.5M"])
def test_parse_size_rejects(bad):
    with pytest.raises(ValueError):
        parse_size(bad)


def test_size_list():
    assert size_list(8, 64, 2, 4) == [8, 16, 32, 64]
    assert size_list(1, 16, 2, 4) == [4, 8, 16]          # whole elements, no repeats
    assert size_list(0, 8, 4, 8) == [0, 8]
    assert size_list(8, 8 << 20, 4, 1)[-1] == 8 << 20
    with pytest.raises(ValueError):
        size_list(8, 64, 1, 4)


def test_default_iters_shrink_with_size():
    small, large = default_iters(8), default_iters(64 << 20)
    assert small[0] > large[0] >= 1 and small[1] >= 1
    assert default_iters(8, quick=True)[0] <= small[0]


def test_rounds_balance_places_and_neighbours_alike_on_every_rank():
    """Each round runs every algorithm once, in an order that depends only on the round (so
    every rank makes the same calls); over a period (n rounds for n names, 2n for n odd)
    every algorithm follows every other equally often and takes every place, so none is
    timed after the same neighbour round after round (a shuffle seeded by the round put
    the second of three after the first in 4 of 5 rounds, the third in none)."""
    from collections import Counter

    from mlcomm.session.auto import round_order, round_period
    names = ["mpi"] + sorted(_algorithms() - {"mpi"})
    orders = [round_order(names, k) for k in range(5)]
    assert all(sorted(o) == sorted(names) for o in orders)
    assert orders == [round_order(list(names), k) for k in range(5)]
    last = names[-1]
    assert len({o.index(last) for o in orders}) >= 4
    assert len({o[o.index(last) - 1] for o in orders if o.index(last)}) >= 4

    def balanced(rows, n):
        pairs = Counter(p for row in rows for p in zip(row, row[1:]))
        places = Counter((x, i) for row in rows for i, x in enumerate(row))
        return len(pairs) == n * (n - 1) and len(set(pairs.values())) == 1 and \
            len(places) == n * n and len(set(places.values())) == 1

    assert round_period(1) == 1
    for n in range(2, 13):
        period = round_period(n)
        assert period == (n if n % 2 == 0 else 2 * n)
        rows = [round_order(list(range(n)), k) for k in range(2 * period)]
        assert rows[period:] == rows[:period] and balanced(rows[:period], n), (n, rows)
        assert not any(balanced(rows[:k], n) for k in range(1, period)), n  # the fewest
    three = [round_order(["mpi", "a", "b"], k) for k in range(5)]
    after_mpi = Counter(o[o.index("mpi") + 1] for o in three if o[-1] != "mpi")
    assert max(after_mpi.values()) <= 2, three


def test_the_default_rounds_are_a_period_of_the_order_in_blocks_of_a_fifth():
    """By default every algorithm follows every other equally often: with 11 names and 5
    rounds, auto running shared_memory's schedule timed 3-16 % behind shared_memory itself
    at 64 KiB and P = 2 in two jobs of three, over a period (22 rounds) within 3 %. A
    block keeps its default length (a fifth of default_iters), and -n and -r still set the
    calls and rounds."""
    from mlcomm.benchmark.harness import _calls
    from mlcomm.session.auto import round_period
    config = lambda **kw: BenchConfig(algorithms=["mpi", "ring", "auto"], sizes=[8], **kw)
    for nbytes in (8, 64 << 10, 1 << 20, 16 << 20):
        iters, warmup = default_iters(nbytes)
        assert _calls(config(), nbytes) == (round_period(3), -(-iters // 5), warmup) == (
            6, {8: 40, 64 << 10: 40, 1 << 20: 13, 16 << 20: 1}[nbytes], warmup)
        assert _calls(config(rounds=5), nbytes)[:2] == (5, -(-iters // 5))
    assert _calls(config(quick=True), 8)[:2] == (6, 8)
    assert _calls(config(iters=7, warmup=0), 8) == (6, 2, 0)
    assert _calls(config(iters=2, rounds=4), 8)[:2] == (2, 1)
    assert _calls(BenchConfig(algorithms=["mpi", "ring"], sizes=[8]), 8)[0] == 2


def test_each_timed_block_follows_an_untimed_call_of_its_own():
    """Steady state: no timed block starts cold after another algorithm's block."""
    from mlcomm.benchmark.harness import interleaved
    from mlcomm.session.auto import round_order
    events = []

    class Comm:
        def Barrier(self):
            events.append("|")

    calls = {n: (lambda n: lambda: events.append(n))(n) for n in ("mpi", "ring")}
    medians = interleaved(calls, rounds=2, per_round=3, comm=Comm(), sync=lambda: None)
    assert set(medians) == {"mpi", "ring"}
    blocks = "".join(e[0] if e != "|" else e for e in events)
    assert blocks == "".join(f"{n[0]}|{n[0] * 3}" for k in range(2)
                             for n in round_order(["mpi", "ring"], k))


def test_tune_keeps_a_choice_that_one_noisy_size_would_flip():
    from mlcomm.benchmark.tune import fastest
    times = {8: {"rd": 5.0, "ring": 9.0}, 16: {"rd": 5.2, "ring": 5.1},   # a near tie
             32: {"rd": 5.3, "ring": 9.5}, 64: {"rd": 5.4, "ring": 9.6},
             1 << 20: {"rd": 900.0, "ring": 500.0}, 2 << 20: {"rd": 1800.0, "ring": 1000.0}}
    recs = [{"algorithm": a, "bytes": n, "time_us_avg": t}
            for n, row in times.items() for a, t in row.items()]
    assert fastest(recs) == [[8, "rd"], [16, "rd"], [32, "rd"], [64, "rd"],
                             [1 << 20, "ring"], [2 << 20, "ring"]]
    # the MPI library's own collective is a candidate like any other: it wins where it is
    # clearly the fastest, at 8 B here
    recs.append({"algorithm": "mpi", "bytes": 8, "time_us_avg": 1.0})
    assert fastest(recs)[0] == [8, "mpi"] and fastest(recs)[1:] == [
        [16, "rd"], [32, "rd"], [64, "rd"], [1 << 20, "ring"], [2 << 20, "ring"]]


def test_tune_keeps_a_real_step_at_one_size():
    """rd wins both neighbours by far, but is 20 % slower at 8 KiB itself: the step stands."""
    from mlcomm.benchmark.tune import fastest
    times = {4096: {"rd": 5.0, "rhd": 8.0}, 8192: {"rd": 12.0, "rhd": 10.0},
             16384: {"rd": 11.0, "rhd": 16.0}}
    recs = [{"algorithm": a, "bytes": n, "time_us_avg": t}
            for n, row in times.items() for a, t in row.items()]
    assert fastest(recs) == [[4096, "rd"], [8192, "rhd"], [16384, "rd"]]


def _fake(alg, nbytes, t, ranks=4, in_place=False):
    algbw = nbytes / (t * 1e-6) / 1e9
    return {"algorithm": alg, "ranks": ranks, "bytes": nbytes, "count": nbytes // 4,
            "dtype": "float32", "op": "sum", "in_place": in_place, "time_us_avg": t,
            "time_us_min": t * 0.9, "time_us_max": t * 1.1, "algbw_gbps": algbw,
            "busbw_gbps": algbw * 2 * (ranks - 1) / ranks, "ratio_to_mpi": None, "wrong": 0,
            "iters": 10, "rounds": 5, "device": "cpu", "peak_rss_mib": 50.0}


def _fake_sweep():
    recs = []
    for n, tm in ((8, 10.0), (1024, 20.0), (65536, 100.0), (4 << 20, 5000.0)):
        for alg, f in (("mpi", 1.0), ("ring", 1.5 if n < 2048 else 0.7), ("naive", 3.0),
                       ("auto", 1.2)):
            r = _fake(alg, n, tm * f)
            r["ratio_to_mpi"] = f
            recs.append(r)
    return recs


def test_band_summary_picks_best_non_auto():
    s = {b["band"]: b for b in band_summary(_fake_sweep())}
    assert set(s) == {"<=1 KiB", "<=1 MiB", ">1 MiB"}
    assert s["<=1 KiB"]["best"] == "ring" and s["<=1 KiB"]["ratio"] == pytest.approx(1.5)
    assert s["<=1 MiB"]["best"] == "ring" and s["<=1 MiB"]["ratio"] == pytest.approx(0.7)
    assert s[">1 MiB"]["auto"] == pytest.approx(1.2)


def test_report_formats():
    recs = _fake_sweep()
    rows = list(csv.DictReader(io.StringIO(format_csv(recs))))
    assert len(rows) == len(recs)
    assert list(rows[0]) == list(RECORD_KEYS) + list(EXTRA_KEYS)
    data = json.loads(format_json(recs))
    assert [set(d) for d in data] == [set(RECORD_KEYS) | set(EXTRA_KEYS)] * len(recs)
    table = format_table(recs)
    assert "busbw(GB/s)" in table and "#wrong" in table
    assert "# baseline" not in table                      # records without one: no line
    labelled = format_table([dict(r, baseline="MPI_Allreduce(float32, MPI_SUM)") for r in recs])
    assert labelled.splitlines()[1] == "# baseline: mpi = MPI_Allreduce(float32, MPI_SUM)"
    assert "<=1 KiB" in table and "best ring" in table


def test_plots_written(tmp_path):
    from mlcomm.benchmark.plot import plot_sweep, plot_vs_ranks
    recs = _fake_sweep()
    a = plot_sweep(recs, tmp_path / "sweep.png")
    more = recs + [dict(r, ranks=2) for r in recs]
    b = plot_vs_ranks(more, tmp_path / "ranks.png", small=8, large=4 << 20)
    for p in (a, b):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000


def test_model_lines_only_with_a_calibrated_profile(tmp_path, monkeypatch):
    from mlcomm.benchmark.plot import model_times, plot_sweep
    monkeypatch.setenv("MLCOMM_PROFILE", str(tmp_path / "missing.json"))
    assert model_times(["mpi", "ring"], 4, [8, 1024]) is None     # built-in defaults: no model
    from mlcomm.model.machine import Profile, save_profile  # as mlcomm tune alone writes it
    tuned_only = save_profile(Profile(tuned={"4": [[8, "naive"]]}), tmp_path / "tuned.json")
    monkeypatch.setenv("MLCOMM_PROFILE", str(tuned_only))
    assert model_times(["mpi", "ring"], 4, [8, 1024]) is None
    prof = tmp_path / "profile.json"
    prof.write_text(json.dumps({"version": 1, "alpha": 2e-5, "beta": 5e-10, "gamma": 1e-10}))
    monkeypatch.setenv("MLCOMM_PROFILE", str(prof))
    m = model_times(["mpi", "ring", "naive", "auto"], 4, [8, 1024])
    assert set(m) == {"ring", "naive"} and all(len(v) == 2 and v[0] > 0 for v in m.values())
    path = plot_sweep(_fake_sweep(), tmp_path / "model.png")
    assert path.stat().st_size > 10_000


# ----------------------------------------------------------------- mpiexec jobs

def test_bench_json_and_plot_n2(tmp_path):
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    proc = mpirun(2, BENCH + FAST + ["--check", "--output", out, "--plot", png], timeout=240)
    data = json.loads(out.read_text())
    algs = _algorithms()
    assert {d["algorithm"] for d in data} == algs
    sizes = sorted({d["bytes"] for d in data})
    assert sizes == [8, 64, 512, 4096]
    assert len(data) == len(sizes) * len(algs)
    for d in data:
        assert set(RECORD_KEYS) <= set(d)
        assert d["ranks"] == 2 and d["dtype"] == "float32" and d["op"] == "sum"
        assert d["in_place"] is False and d["count"] == d["bytes"] // 4
        assert d["wrong"] == 0, d
        assert 0 < d["time_us_min"] <= d["time_us_avg"] <= d["time_us_max"]
        assert d["busbw_gbps"] == pytest.approx(d["algbw_gbps"] * 2 * 1 / 2)
        assert d["peak_rss_mib"] > 0
        if d["algorithm"] == "mpi":
            assert d["ratio_to_mpi"] == pytest.approx(1.0)
    assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 10_000
    # rank 0 printed the table once, with every algorithm
    assert proc.stdout.count("# mlcomm bench") == 1
    for alg in algs:
        assert f" {alg} " in proc.stdout
    assert "# check: 0 wrong elements OK" in proc.stdout
    assert "# summary" in proc.stdout and "<=1 KiB" in proc.stdout


def test_bench_csv_both_placements_n3():
    proc = mpirun(3, BENCH + FAST + ["--algorithms", "ring,recursive_doubling", "--both",
                                     "--dtype", "int32", "--op", "max", "--check",
                                     "--rounds", "2", "--format", "csv"], timeout=240)
    rows = list(csv.DictReader(io.StringIO(proc.stdout)))
    assert list(rows[0]) == list(RECORD_KEYS) + list(EXTRA_KEYS)
    assert len(rows) == 4 * 2 * 3                      # sizes x placements x algorithms
    assert {r["algorithm"] for r in rows} == {"mpi", "ring", "recursive_doubling"}
    assert {r["in_place"] for r in rows} == {"True", "False"}
    assert {r["ranks"] for r in rows} == {"3"}
    assert {r["dtype"] for r in rows} == {"int32"} and {r["wrong"] for r in rows} == {"0"}
    assert {(r["rounds"], r["iters"]) for r in rows} == {("2", "4")}  # 3 calls: 2 per round


@pytest.mark.parametrize("nprocs, dtype, op, corrupted", [
    (3, "float32", "sum", "ring"),            # tolerance path, MPI baseline
    (2, "int64", "bxor", "ring"),             # exact path
    (3, "bfloat16", "avg", "recursive_halving_doubling"),  # local reference (MPI cannot)
])
def test_check_catches_corrupted_result(nprocs, dtype, op, corrupted):
    algs = "ring,recursive_halving_doubling"
    proc = mpirun(nprocs, [INJECT, f"bench-corrupt={corrupted}", "--", *BENCH, *FAST,
                           "--algorithms", algs, "--dtype", dtype, "--op", op,
                           "--check", "--format", "json"], timeout=240, check=False)
    assert proc.returncode != 0, proc.stdout + proc.stderr    # a failed check fails the run
    data = json.loads(proc.stdout)
    baseline = {d["baseline"] for d in data}
    assert baseline == {{"float32": "MPI_Allreduce(float32, MPI_SUM)",
                         "int64": "MPI_Allreduce(int64, MPI_BXOR)",
                         "bfloat16": "MPI_Allreduce(uint16, MPI_SUM) on the bfloat16 bytes: an "
                                     "integer sum of their bit patterns timed as a stand-in, not "
                                     "a bfloat16 avg (MPI cannot reduce bfloat16)"}[dtype]}
    for d in data:
        if d["algorithm"] == corrupted:
            assert d["wrong"] == 1, d                 # one element on one rank
        elif d["algorithm"] == "mpi" and op == "avg":
            assert d["wrong"] is None                 # MPI cannot average bfloat16: timing only
        else:
            assert d["wrong"] == 0, d


def test_bench_rejects_unknown_algorithm():
    proc = mpirun(2, BENCH + ["--algorithms", "nonesuch", "--quick"], timeout=120, check=False)
    assert proc.returncode != 0 and "nonesuch" in proc.stderr
    assert proc.stderr.count("nonesuch") == 1 and proc.stderr.count("usage:") == 1


@pytest.mark.parametrize("argv, words", [
    (["-d", "float32,float16"], "one dtype (a list goes with --kernels)"),
    (["-d", "int32", "-o", "avg"], "avg needs a floating or complex dtype, got int32"),
    (["-b", "64K", "-e", "8"], "bad size range"),
    (["-s", "8,1Q"], "not a size: '1Q'"),
    (["-n", "0"], "must be 1 or more"),
    (["--threads", "2"], "--threads goes with --kernels"),
    (["-a", "ring", "--option", "servers=2"],
     "--option servers: no algorithm of this run takes it (mpi: blocking; ring: "
         "segment_bytes)"),
])
def test_bench_argument_errors_name_the_flag(argv, words):
    from mlcomm.cli import AgreedExit, main
    import contextlib
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(AgreedExit) as exc:
        main(["bench", *argv])
    assert exc.value.code == 2 and words in err.getvalue(), err.getvalue()


def test_bench_options_go_to_the_algorithms_that_take_them_n2(tmp_path):
    out = tmp_path / "r.json"
    proc = mpirun(2, BENCH + ["-a", "shared_memory,ring", "-s", "64K", "-n", "2", "-w", "1",
                              "-r", "1", "--check", "--option", "single_copy_bytes=1G",
                              "--output", out], timeout=120)
    given = {d["algorithm"]: d["options"] for d in json.loads(out.read_text())}
    assert given == {"mpi": "", "shared_memory": "single_copy_bytes=1073741824", "ring": ""}
    assert "# options: shared_memory single_copy_bytes=1073741824" in proc.stdout
    assert "# check: 0 wrong elements OK" in proc.stdout


def test_bench_says_what_auto_ran_n2(tmp_path, monkeypatch):
    """auto's record and table row name the algorithm it ran at each size (with
    MLCOMM_AUTO=model, the cost model's choice)."""
    from mlcomm.session.auto import auto_choice
    env = {"MLCOMM_AUTO": "model", "MLCOMM_PROFILE": str(tmp_path / "none.json")}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    out = tmp_path / "r.json"
    proc = mpirun(2, BENCH + ["-a", "ring,auto", "-s", "8,64K", "-n", "2", "-w", "1", "-r",
                              "1", "--output", out], timeout=120, env=env)
    ran = {(d["algorithm"], d["bytes"]): d["ran"] for d in json.loads(out.read_text())}
    for nbytes in (8, 64 << 10):
        assert ran["ring", nbytes] is None and ran["mpi", nbytes] is None
        want = auto_choice("allreduce", 2, nbytes, nodes=((0, 1),))
        assert ran["auto", nbytes] == want, (ran, want)
        assert f"out auto: {want} " in proc.stdout


#: the collectives the jobs below time, with nccl-tests' bus-bandwidth factor at p ranks and
#: the blocks of nccl-tests' size S (the whole buffer) per rank's block
_EVERY = {"gather": (lambda p: (p - 1) / p, "p"), "alltoall": (lambda p: (p - 1) / p, "p"),
          "allgatherv": (lambda p: (p - 1) / p, "p"), "bcast": (lambda p: 1.0, 1)}


def test_every_collective_has_a_call_builder():
    import mlcomm
    from mlcomm.benchmark.calls import CALLS, busbw_factor
    assert list(CALLS) == list(mlcomm.COLLECTIVES)
    assert busbw_factor("allreduce", 4) == 1.5 and busbw_factor("reduce", 4) == 1.0
    assert {c for c in CALLS if busbw_factor(c, 4) == 0.75} == set(CALLS) - {
        "allreduce", "bcast", "reduce"}


@pytest.mark.parametrize("nprocs", [2, 3])
def test_bench_other_collectives_check_clean(nprocs, tmp_path):
    """--collective: every algorithm of the collective that applies here, auto and the
    library's plain call, checked against it at two sizes; nccl-tests' bandwidths."""
    from mlcomm.algorithms import COLLECTIVES, Layout
    layout = Layout(nprocs)  # one node: the tests run on one machine
    for collective, (factor, blocks) in _EVERY.items():
        out = tmp_path / f"{collective}.json"
        proc = mpirun(nprocs, BENCH + ["--collective", collective, "-s", "8,4K", "-n", "2",
                                       "-w", "1", "-r", "1", "--check", "--output", out],
                      timeout=240)
        data = json.loads(out.read_text())
        want = {n for n, a in COLLECTIVES[collective].items() if a.applies(layout)} | {"auto"}
        assert {d["algorithm"] for d in data} == want, (collective, data)
        assert len(data) == 2 * len(want) and {d["bytes"] for d in data} == {8, 4096}
        for d in data:
            assert d["collective"] == collective and d["ranks"] == nprocs, d
            assert d["wrong"] == 0, d
            assert d["busbw_gbps"] == pytest.approx(d["algbw_gbps"] * factor(nprocs)), d
            whole = d["bytes"] * (nprocs if blocks == "p" else 1)
            assert d["algbw_gbps"] == pytest.approx(whole / d["time_us_avg"] / 1e3), d
        mpi = {"gather": "MPI_Gather", "alltoall": "MPI_Alltoall",
               "allgatherv": "MPI_Allgatherv", "bcast": "MPI_Bcast"}[collective]
        lines = proc.stdout.splitlines()
        assert lines[0].startswith(f"# mlcomm bench: {collective}  ranks {nprocs}"), lines[0]
        assert lines[1] == f"# baseline: mpi = {mpi}(float32)"
        bw = "algbw = p*bytes/avg; busbw = algbw*(p-1)/p" if blocks == "p" else \
            "algbw = bytes/avg; busbw = algbw*1"
        assert bw in lines[2], lines[2]
        for alg in want - {"auto"}:
            assert re.search(rf"^ +(8|4096) +\d+ +out {alg} ", proc.stdout, re.M), alg
        assert re.search(r"^ +8 +\d+ +out auto: \w+", proc.stdout, re.M), proc.stdout
        assert "# check: 0 wrong elements OK" in proc.stdout
        assert f"faster than {mpi})" in proc.stdout


def test_bench_collective_refuses_what_it_does_not_time():
    from mlcomm.cli import AgreedExit, main
    import contextlib
    for argv, words in ((["--collective", "gather", "--both"], "out-of-place calls on host"),
                        (["--collective", "gather", "-a", "ring"],
                         "'ring' is not a known gather algorithm"),
                        (["--collective", "gathr"], "invalid choice: 'gathr'")):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), pytest.raises(AgreedExit) as exc:
            main(["bench", *argv])
        assert exc.value.code == 2 and words in err.getvalue(), err.getvalue()


def test_plot_names_the_collective(tmp_path):
    from mlcomm.benchmark.plot import plot_sweep, sweep_title
    recs = [dict(r, collective="alltoall", op="-") for r in _fake_sweep()]
    path = plot_sweep(recs, tmp_path / "alltoall.png")
    assert path.read_bytes()[:4] == b"\x89PNG" and path.stat().st_size > 10_000
    assert sweep_title(recs, "out-of-place") == "alltoall, 4 ranks, float32, out-of-place, " \
        "device cpu"
    assert sweep_title(_fake_sweep(), "in-place").startswith("all-reduce, 4 ranks, float32 sum")


def test_bench_baseline_is_said_in_the_table_n2():
    proc = mpirun(2, BENCH + ["-a", "ring", "-s", "64,1K", "-n", "2", "-w", "1", "-r", "1",
                              "-d", "bfloat16"], timeout=120)
    header = proc.stdout.splitlines()[1]
    assert header.startswith("# baseline: mpi = MPI_Allreduce(uint16, MPI_SUM) on the "
                             "bfloat16 bytes") and "not a bfloat16 sum" in header
    assert proc.stderr == ""                        # no progress bar into a pipe


def test_tune_quick_n2(tmp_path):
    """--quick: the 5 quick sizes, 3 rounds, one sweep, every result checked; seconds."""
    from mlcomm.benchmark.cli import QUICK_SIZES
    path = tmp_path / "profile.json"
    out = mpirun(2, ["-m", "mlcomm", "tune", "--quick", "--profile", path], timeout=120).stdout
    tuned = json.loads(path.read_text())["tuned"]["2"]
    assert [n for n, _ in tuned] == list(QUICK_SIZES)
    assert {name for _, name in tuned} <= _algorithms() - {"mpi", "auto"}
    assert "(3 rounds, 1 sweeps)" in out and f"# wrote {path}" in out


def test_bench_cuda_without_gpu_fails_clearly():
    try:
        import cupy  # noqa: F401
        pytest.skip("CuPy is installed: the no-GPU error path is not reachable")
    except ImportError:
        pass
    proc = mpirun(2, BENCH + ["--device", "cuda", "--quick"], timeout=120, check=False)
    assert proc.returncode != 0 and "--device cuda needs CuPy" in proc.stdout + proc.stderr


# ----------------------------------------------------------------- --kernels

def _kernel_row(backend, threads, dtype, nbytes, reduce_gbps, copy_gbps, memcpy_gbps=1.0):
    return {"backend": backend, "device": "cpu", "threads": threads, "dtype": dtype, "op": "sum",
            "nbytes": nbytes, "count": nbytes // 4, "repeat": 3,
            "reduce_s": 3 * nbytes / reduce_gbps / 1e9, "copy_s": 2 * nbytes / copy_gbps / 1e9,
            "memcpy_s": 2 * nbytes / memcpy_gbps / 1e9, "reduce_gbps": reduce_gbps,
            "copy_gbps": copy_gbps, "memcpy_gbps": memcpy_gbps,
            "ratio": reduce_gbps / max(copy_gbps, memcpy_gbps)}


def test_format_kernels_columns_target_and_thread_speedup():
    rows = [_kernel_row("numpy", 1, "float32", 1 << 20, 9.0, 10.0),
            _kernel_row("numba", 1, "float32", 1 << 20, 5.0, 10.0),
            _kernel_row("numba", 2, "float32", 1 << 20, 8.0, 16.0),
            _kernel_row("numba", 1, "float32", 256 << 20, 4.0, 5.0),
            _kernel_row("numba", 2, "float32", 256 << 20, 7.0, 6.0, 8.0)]
    lines = format_kernels(rows).splitlines()
    assert lines[2].split() == ["#", "backend", "threads", "dtype", "op", "size", "reduce(us)",
                                "copy(us)", "reduce(GB/s)", "copy(GB/s)", "memcpy(GB/s)",
                                "ratio", "met"]
    body = [line.split() for line in lines[3:8]]
    assert [r[0:2] + r[4:5] for r in body] == [["numpy", "1", "1M"], ["numba", "1", "1M"],
                                               ["numba", "2", "1M"], ["numba", "1", "256M"],
                                               ["numba", "2", "256M"]]
    assert [r[-2:] for r in body] == [["0.90", "yes"], ["0.50", "NO"], ["0.50", "NO"],
                                      ["0.80", "yes"], ["0.88", "yes"]]
    assert lines[-1] == ("#   float32 256M: numba x2 threads reduces 1.75x, copies 1.20x "
                         "the 1-thread rate")
    assert "side by side" not in format_kernels(rows[:1])  # no 1-thread row to compare with


def test_bench_kernels_dtypes_and_threads_side_by_side():
    import numba
    proc = mpirun(1, BENCH + ["--kernels", "--dtype", "float32,bfloat16", "--sizes", "64K,256K",
                              "--threads", "1,2", "--iters", "1", "--warmup", "1",
                              "--format", "json"], timeout=240)
    rows = json.loads(proc.stdout)
    two = min(2, numba.config.NUMBA_NUM_THREADS)  # the threads that really ran
    keys = [(r["dtype"], r["nbytes"], r["backend"], r["threads"]) for r in rows]
    assert keys == [(dt, n, b, t) for dt in ("float32", "bfloat16") for n in (1 << 16, 1 << 18)
                    for b, t in (("numpy", 1), ("numba", 1), ("numba", two))]
    for r in rows:
        assert r["ratio"] == pytest.approx(r["reduce_gbps"] / max(r["copy_gbps"],
                                                                   r["memcpy_gbps"]))
        assert r["reduce_gbps"] == pytest.approx(3 * r["nbytes"] / r["reduce_s"] / 1e9)


def test_bench_kernels_rejects_unknown_dtype():
    proc = mpirun(1, BENCH + ["--kernels", "--dtype", "float32,float7", "--sizes", "64K"],
                  timeout=120, check=False)
    assert proc.returncode != 0 and "float7" in proc.stderr


# ----------------------------------------------------------------- memory

def test_rss_peak_resets():
    import mmap
    import numpy as np
    from mlcomm.benchmark import rss
    if not rss.reset_peak():
        pytest.skip("resetting the peak needs Linux's /proc/self/clear_refs")
    before = rss.current_bytes()
    fresh = mmap.mmap(-1, 64 << 20)  # new pages: a heap the process freed may stay resident
    np.frombuffer(fresh, np.uint8)[:] = 1  # written, so resident
    high = rss.peak_bytes()
    assert high - before >= 60 << 20
    fresh.close()
    assert rss.peak_bytes() > high - (4 << 20)  # freed memory still counts until the reset
    assert rss.reset_peak()
    assert rss.peak_bytes() < high - (32 << 20)


def test_memory_job_tells_scratch_apart():
    """ring at P = 2 declares and writes one block (half a vector); the 1 MiB-chunk tree almost none."""
    out = {}
    for alg in ("ring", "double_binary_tree"):
        proc = mpirun(2, [ROOT / "bench" / "memory.py", "--worker", "--algorithm", alg,
                          "--size", "32M"], timeout=240)
        out[alg] = json.loads(proc.stdout.strip().splitlines()[-1])
    ring, tree = out["ring"], out["double_binary_tree"]
    assert ring["correct"] and tree["correct"] and ring["ranks"] == 2
    assert ring["schedule_scratch_vectors"] == 0.5 and tree["schedule_scratch_vectors"] < 0.2
    assert ring["extra_vectors"] - tree["extra_vectors"] > 0.4
    assert ring["retained_vectors"] > 0.4  # the plan cache keeps the scratch


def test_profile_parts_splits_each_plan_into_transfers_and_reductions(tmp_path):
    """P = 3: every part is timed beside MPI_Allreduce, after the whole call checked exact sums."""
    out = tmp_path / "profile.json"
    mpirun(3, [ROOT / "bench" / "profile_parts.py", "--size", "256K", "--rounds", "1",
               "--per-round", "1", "--algorithms", "ring,recursive_halving_doubling",
               "--output", out], timeout=240)
    rec = json.loads(out.read_text())
    assert rec["ranks"] == 3 and rec["algorithms"] == ["ring", "recursive_halving_doubling"]
    labels = {"mpi", "copy", "sendrecv"} | {f"{a}{part}" for a in rec["algorithms"]
                                            for part in ("", ":persistent", ":plan", ":transfers",
                                                         ":reductions")}
    assert set(rec["time_us"]) == labels and all(t > 0 for t in rec["time_us"].values())


def test_profile_parts_parts_keep_only_messages_or_only_ops():
    import importlib.util
    from mlcomm.algorithms import ALGORITHMS
    spec = importlib.util.spec_from_file_location("profile_parts", ROOT / "bench" / "profile_parts.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    whole = ALGORITHMS["ring"].build(1, 5, 1000, 4)
    transfers, reductions = mod._stripped(whole, True), mod._stripped(whole, False)
    count = lambda s, attr: sum(len(getattr(step, attr)) for step in s.steps)
    assert count(transfers, "transfers") == count(whole, "transfers") > 0
    assert count(reductions, "ops") == count(whole, "ops") > 0
    assert count(transfers, "ops") == 0 and count(reductions, "transfers") == 0


def test_profile_parts_names_a_bad_algorithm():
    proc = mpirun(2, [ROOT / "bench" / "profile_parts.py", "--size", "64K",
                      "--algorithms", "mpi"], timeout=120, check=False)
    assert proc.returncode != 0 and "--algorithms: 'mpi' is not a hand-written" in proc.stderr


def test_floor_times_a_round_trip_and_copies():
    cores = sorted(os.sched_getaffinity(0))
    pair = f"{cores[0]},{cores[-1]}"  # one core twice on a one-core machine: still a round trip
    proc = subprocess.run([sys.executable, ROOT / "bench" / "floor.py", "--cores", pair,
                           "-s", "8,64K", "--rounds", "2000", "--repeats", "2", "--area", "4M"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    times = re.findall(r"^(cache-line round trip, cores \d+ and \d+|memcpy of (?:8|64K) bytes):"
                       r" (\d+\.\d+) us$", proc.stdout, re.M)
    assert [t[0] for t in times] == [f"cache-line round trip, cores {pair.replace(',', ' and ')}",
                                     "memcpy of 8 bytes", "memcpy of 64K bytes"], proc.stdout
    assert all(float(t[1]) > 0 for t in times), proc.stdout
    together = re.findall(r"^memcpy of (8|64K) bytes on both cores at once: (\d+\.\d+) us$",
                          proc.stdout, re.M)
    assert [t[0] for t in together] == ["8", "64K"] and all(float(t[1]) > 0 for t in together)
    # the hand-off, by one area and by areas that rotate over --area (both sizes fit in 4M)
    hand_offs = re.findall(r"^hand-off of (8|64K) bytes: one area (\d+\.\d+) us"
                           r"(?:; areas over 4M: (\d+\.\d+) us)?$", proc.stdout, re.M)
    assert [h[0] for h in hand_offs] == ["8", "64K"] and all(
        float(h[1]) > 0 and float(h[2]) > 0 for h in hand_offs), proc.stdout


def test_floor_names_a_core_it_cannot_use():
    proc = subprocess.run([sys.executable, ROOT / "bench" / "floor.py", "--cores", "0,4096"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--cores 0,4096: this process may run on cores" in proc.stderr


def test_uneven_times_calls_after_rank_0s_work():
    """bench/uneven.py: each call takes at least rank 0's work; with waits that sleep, as
    set, it says so."""
    proc = mpirun(2, [ROOT / "bench" / "uneven.py", "--work", "300", "--calls", "20",
                      "--runs", "2"], timeout=120, env={"MLCOMM_SLEEP_AFTER_US": "100"})
    line = re.search(r"^P=2 shared_memory work 300 us: (\d+\.\d+) ms a call \((\d+\.\d+)x "
                     r"the work; waits sleep after 100 us on the window, 1000 us on "
                     r"messages, 0: never\)$", proc.stdout, re.M)
    assert line and float(line[1]) >= 0.3 and float(line[2]) >= 1.0, proc.stdout


def test_mpis_gives_the_table_with_the_floor_beside_it(tmp_path):
    """bench/mpis.py on one environment (this one): the peer table, the round trip before
    each job and the memcpy of each size before and after, and each run's own worst auto
    over fastest MPI_Allreduce, in its output and its record."""
    out = tmp_path / "mpis.json"
    proc = subprocess.run([sys.executable, ROOT / "bench" / "mpis.py", "--envs",
                           f"here={sys.prefix}", "--runs", "2", "-p", "2", "-s", "8,4K",
                           "-a", "ring", "-n", "20", "--output", out],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert re.search(r"^2  8 B +\d+\.\d+ +\d+\.\d+ \(ring\) / \d+\.\d+", proc.stdout, re.M), \
        proc.stdout  # auto is always timed
    assert re.search(r"^cache-line round trip before each job \(µs\): here P=2: "
                     r"\d+\.\d+, \d+\.\d+$", proc.stdout, re.M), proc.stdout
    assert re.search(r"^memcpy of 4K: \d+\.\d+, \d+\.\d+ µs \(before, after\); on two cores "
                     r"at once \d+\.\d+, \d+\.\d+$", proc.stdout, re.M), proc.stdout
    # each run's own ratio, beside the round trip before it
    runs = re.search(r"^  P=2 4096 B: (\d+\.\d+) \((\d+\.\d+)\), (\d+\.\d+) \((\d+\.\d+)\)$",
                     proc.stdout, re.M)
    assert runs, proc.stdout
    record = json.loads(out.read_text())
    trips = record["round_trips_us"]["here"]["2"]
    assert [round(t, 2) for t in trips] == [float(runs[2]), float(runs[4])], (trips, runs[0])
    assert [r for r, _ in record["per_run"]["2"]["4096"]] == pytest.approx(
        [float(runs[1]), float(runs[3])], abs=0.006), record["per_run"]
    jobs = record["jobs"]["here"]["2"]
    assert len(jobs) == 2 and all({"8 mpi", "8 ring", "8 auto", "4096 auto"} <= set(job)
                                  for job in jobs), jobs
    assert len(record["round_trips_us"]["here"]["2"]) == 2 and \
        set(record["memcpy_us"][1]) == set(record["memcpy_together_us"][1]) == {"8", "4096"}, \
        record


def test_mpis_times_another_collective(tmp_path):
    """bench/mpis.py --collective: the library's own call of that collective beside mlcomm's,
    and the worst auto over the better of mlcomm's best and that MPI's own call."""
    out = tmp_path / "mpis.json"
    proc = subprocess.run([sys.executable, ROOT / "bench" / "mpis.py", "--envs",
                           f"here={sys.prefix}", "--runs", "1", "-p", "3", "-s", "8",
                           "-a", "linear", "-n", "20", "--collective", "gather",
                           "--output", out], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert re.search(r"^P +size +here MPI gather +here best / auto .* worst auto / own best$",
                     proc.stdout, re.M), proc.stdout
    row = re.search(r"^3  8 B +(\d+\.\d+) +(\d+\.\d+) \(linear\) / (\d+\.\d+) .* "
                    r"(\d+\.\d+)$", proc.stdout, re.M)
    assert row, proc.stdout
    mpi, best, auto, worst = map(float, row.groups())
    assert worst == pytest.approx(auto / min(mpi, best), abs=0.01), row[0]
    record = json.loads(out.read_text())
    assert record["collective"] == "gather" and \
        {"8 mpi", "8 linear", "8 auto"} <= set(record["jobs"]["here"]["3"][0]), record["jobs"]


@pytest.mark.parametrize("in_place", [False, True])
def test_first_call_times_auto_on_new_sizes(tmp_path, in_place):
    """bench/first_call.py: per size, the first call of ``auto`` at a new size against its
    budget (ten steady calls plus 20 ms), and what ``auto`` ran, in its table and record."""
    from mlcomm.algorithms import MPI_NATIVE
    out = tmp_path / "first.json"
    # the default sizes out of place; in place, two sizes named with -s
    proc = mpirun(2, [ROOT / "bench" / "first_call.py", "--repeats", "1", "--output", out,
                      *(["--in-place", "-s", "8,4K"] if in_place else [])], timeout=300,
                  env={"MLCOMM_PROFILE": str(tmp_path / "none")})
    rows = json.loads(out.read_text())
    assert [r["bytes"] for r in rows] == ([8, 4096] if in_place else [8, 64 << 10, 16 << 20]), rows
    for r in rows:
        assert r["ranks"] == 2 and r["first_s"] > r["steady_s"] > 0, r
        assert r["budget_s"] == pytest.approx(10 * r["steady_s"] + 20e-3), r
        assert r["over_budget"] == pytest.approx(r["first_s"] / r["budget_s"]), r
        assert len(r["ran"]) == 1 and r["ran"][0].split()[0] in _algorithms() | {MPI_NATIVE}, r
        assert re.search(rf"^ 2 +{r['bytes']} .* {re.escape(r['ran'][0])}$", proc.stdout,
                         re.M), proc.stdout
