"""What goes wrong between ranks ends clearly, never in a hang or a silent wrong answer.

Each case runs a small script under mpiexec with a time limit well below what a hang
would take; the compiled loop and the Python loop (``MLCOMM_EXECUTOR=python``) both.
"""

import textwrap
import time

import pytest

from conftest import mpirun

LOOPS = [pytest.param({}, id="compiled"), pytest.param({"MLCOMM_EXECUTOR": "python"}, id="python")]


def _job(tmp_path, nprocs, body, env=None, timeout=60):
    script = tmp_path / "job.py"
    script.write_text("import os, sys, time\nimport numpy as np\nfrom mpi4py import MPI\n"
                      "import mlcomm\nrank, size = MPI.COMM_WORLD.rank, MPI.COMM_WORLD.size\n"
                      + textwrap.dedent(body))
    start = time.monotonic()
    proc = mpirun(nprocs, [script], env=env, timeout=timeout, check=False)
    return proc, time.monotonic() - start


@pytest.mark.parametrize("env", LOOPS)
def test_counts_that_differ_end_the_job_with_the_call_the_peer_and_the_bytes(tmp_path, env):
    proc, secs = _job(tmp_path, 2, """
        x = np.ones(10 if rank == 0 else 11, np.float32)
        mlcomm.allreduce(x, algorithm="ring")
        print("returned", rank, flush=True)
    """, env)
    assert proc.returncode != 0 and "returned" not in proc.stdout
    assert "mlcomm: allreduce (ring," in proc.stderr
    assert "bytes from rank" in proc.stderr or "longer than the" in proc.stderr
    assert "validate=True" in proc.stderr
    assert secs < 60


@pytest.mark.parametrize("env", LOOPS)
def test_dtypes_that_differ_end_the_job(tmp_path, env):
    proc, _ = _job(tmp_path, 2, """
        x = np.ones(64, np.float32 if rank == 0 else np.float64)
        mlcomm.allreduce(x, algorithm="ring")
        print("returned", rank, flush=True)
    """, env)
    assert proc.returncode != 0 and "returned" not in proc.stdout
    assert "mlcomm: allreduce (ring," in proc.stderr and "schedule expects" in proc.stderr


@pytest.mark.parametrize("env", LOOPS)
@pytest.mark.parametrize("algorithm", ["shared_memory", "hierarchical", "auto"])
def test_counts_that_differ_on_the_windows_schedules_end_the_job(tmp_path, env, algorithm):
    """The node window's schedules send no message whose size could tell: each collective's
    first post publishes a digest of its call beside its flag, and a peer's wait that finds
    another ends the job, naming the rank (the longer rank had a wrong sum in its last
    elements). auto runs the pick of a size band it has decided (its agreement compares the
    calls on a new band only); its trial here times the window's algorithms alone (a pick of
    the library's call would meet the library's own undefined behaviour: MPICH returned
    from, or ended the job in, an MPI_Allreduce of 1005 against 1000)."""
    proc, secs = _job(tmp_path, 3, f"""
        from mlcomm.session import auto, session_of
        trial = auto.choice._trial
        auto.choice._trial = lambda session, entries, *args: trial(
            session, [e for e in entries if e[0] in ("shared_memory", "hierarchical")], *args)
        mlcomm.allreduce(np.ones(1000, np.float32), algorithm="{algorithm}")
        ran = auto.auto_ran(session_of(MPI.COMM_WORLD), "allreduce", 1000,
                            np.dtype(np.float32), "sum")
        if rank == 0:  # the pick is agreed; one rank prints it (unbuffered, prints interleave)
            print("ran", ran or "{algorithm}", flush=True)
        x = np.ones(1005 if rank == 1 else 1000, np.float32)
        got = mlcomm.allreduce(x, algorithm="{algorithm}")
        print("returned", rank, got[-5:], flush=True)
    """, dict(env, MLCOMM_PROFILE="/nonexistent"))
    assert proc.returncode != 0 and "returned" not in proc.stdout, proc.stdout
    ran = proc.stdout.split("ran ", 1)[1].split()[0]
    assert ran in ("shared_memory", "hierarchical"), proc.stdout
    assert f"mlcomm: allreduce ({ran}, 100" in proc.stderr, proc.stderr[-3000:]
    assert "runs another call on the node's window than this rank (another count, dtype, op " \
           "or algorithm)" in proc.stderr, proc.stderr[-3000:]
    assert "validate=True" in proc.stderr and secs < 60


@pytest.mark.parametrize("collective, count", [
    ("reduce_scatter", 1000), ("allgather", 1000), ("bcast", 1000), ("reduce", 1000),
    ("allreduce", 100_000), ("allreduce", 2_000_000)])
def test_counts_that_differ_on_every_window_collective_and_size_end_the_job(
        tmp_path, collective, count):
    """The digest check holds for every collective the window runs, and for an all-reduce
    on the rotating areas (400 KB) and past single_copy_bytes (8 MB) as on the turn areas
    (the test above). No rank that reads the odd rank's data, or whose data the odd rank
    reads, returns (a bcast's root and its other ranks, and a reduce's other ranks, may
    return before the job ends)."""
    blocks = "size" if collective == "reduce_scatter" else "1"
    proc, secs = _job(tmp_path, 3, f"""
        x = np.ones(({count} + (8 if rank == 1 else 0)) * {blocks}, np.float32)
        mlcomm.{collective}(x, algorithm="shared_memory")
        print("returned", rank, flush=True)
    """)
    receivers = {"bcast": [1], "reduce": [0]}.get(collective, [0, 1, 2])
    assert proc.returncode != 0, proc.stdout
    assert not [r for r in receivers if f"returned {r}" in proc.stdout], proc.stdout
    assert f"mlcomm: {collective} (shared_memory, " in proc.stderr
    assert "runs another call on the node's window than this rank" in proc.stderr, \
        proc.stderr[-3000:]
    assert secs < 60


@pytest.mark.parametrize("algorithm", ["hierarchical", "reduce_scatter"])
def test_a_count_that_differs_in_a_decided_band_ends_the_job_at_once(tmp_path, algorithm):
    """auto's modelled choices hold for their size band, as its timed ones do: on two
    nodes, hierarchical's inter-node choice and auto's reduce_scatter, after a first call
    of 1000 on every rank, a rank whose count alone is new (1005) takes the band's choice
    with no agreement and goes on to the call, whose checks end the job, naming it. Before,
    that rank waited alone in the agreement of its new count while the others, whose
    count was known, waited for it in the call: a stall reported every minute, no end."""
    call = ('mlcomm.allreduce(np.ones(n, np.float32), algorithm="hierarchical")'
            if algorithm == "hierarchical" else
            "mlcomm.reduce_scatter(np.ones(n * size, np.float32))")
    proc, secs = _job(tmp_path, 3, f"""
        n = 1000
        {call}
        n = 1005 if rank == 1 else 1000
        {call}
        print("returned", rank, flush=True)
    """, {"MLCOMM_RANKS_PER_NODE": "2", "MLCOMM_STALL_SECONDS": "20",
          "MLCOMM_PROFILE": "/nonexistent", "MLCOMM_AUTO": "model"})
    # (a timed reduce_scatter may pick the library's own call, whose answer to counts that
    # differ is its own: docs/reliability.rst)
    assert proc.returncode != 0 and "returned" not in proc.stdout, proc.stdout
    assert "has waited" not in proc.stderr, proc.stderr[-3000:]
    assert "validate=True" in proc.stderr and secs < 20, (secs, proc.stderr[-3000:])


def test_a_first_hierarchical_call_that_differs_across_nodes_names_the_part(tmp_path):
    """On several nodes hierarchical's first call agrees on its inter-node algorithm for a
    part of the vector; a count that differs there raises on every rank, naming that part."""
    proc, _ = _job(tmp_path, 3, f"""
        try:
            mlcomm.allreduce(np.ones(1005 if rank == 1 else 1000, np.float32),
                             algorithm="hierarchical")
        except ValueError as exc:
            with open(os.path.join({str(tmp_path)!r}, f"raised{{rank}}"), "w") as f:
                f.write(str(exc))
    """, {"MLCOMM_RANKS_PER_NODE": "2", "MLCOMM_PROFILE": "/nonexistent"})
    said = ("mlcomm: ranks [1] called with arguments that differ from rank 0 (count of "
            "hierarchical's part across the nodes: rank 0 has 500, rank 1 has 503)")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for r in range(3):
        raised = tmp_path / f"raised{r}"
        assert raised.exists() and said in raised.read_text(), (r, proc.stderr[-3000:])


def test_mlcomm_algorithm_that_differs_is_an_error_on_every_rank(tmp_path):
    proc, _ = _job(tmp_path, 3, """
        os.environ["MLCOMM_ALGORITHM"] = "naive" if rank == 0 else "single_master"
        try:
            mlcomm.allreduce(np.ones(4))
        except ValueError as exc:
            print(f"rank {rank}: {exc}", flush=True)
            sys.exit(0)
        print("returned", rank, flush=True)
    """)
    assert proc.returncode == 0 and "returned" not in proc.stdout, proc.stderr
    for r in range(3):
        assert f"rank {r}: MLCOMM_ALGORITHM differs across ranks" in proc.stdout
    assert "rank 1: 'single_master'" in proc.stdout


def test_mlcomm_algorithm_is_rank_0s_when_every_rank_agrees(tmp_path):
    proc, _ = _job(tmp_path, 2, """
        from mlcomm import session
        os.environ["MLCOMM_ALGORITHM"] = "naive"
        got = mlcomm.allreduce(np.arange(5.0))
        assert session.session_of(MPI.COMM_WORLD).default_algorithm == "naive"
        assert np.array_equal(got, np.arange(5.0) * size)
        print("ok", rank, flush=True)
    """)
    assert proc.returncode == 0 and proc.stdout.count("ok") == 2, proc.stderr


def test_an_explicit_algorithm_that_differs_is_caught_by_validate(tmp_path):
    proc, _ = _job(tmp_path, 2, """
        try:
            mlcomm.allreduce(np.ones(4), algorithm="naive" if rank else "ring", validate=True)
        except ValueError as exc:
            print(f"rank {rank}: {exc}", flush=True)
    """)
    assert proc.returncode == 0
    for r in range(2):
        assert f"rank {r}: mlcomm: ranks [1] called with arguments that differ" in proc.stdout
    assert "algorithm: rank 0 has 'ring', rank 1 has 'naive'" in proc.stdout


LATE = """
    x = np.full(100, rank + 1.0)
    {setup}
    got = {call}  # the communicator's session and the plan exist: the late call waits in it
    if rank == size - 1:
        time.sleep({sleep})
    got = {call}
    assert np.all(got == size * (size + 1) / 2), got
    x[...] = rank + 2.0  # and the call after the stall
    got = {call}
    assert np.all(got == size * (size + 3) / 2), got
    print("done", rank, flush=True)
"""


@pytest.mark.parametrize("env", LOOPS)
@pytest.mark.parametrize("handle", [False, True], ids=["call", "persistent"])
@pytest.mark.parametrize("name", ["ring", "shared_memory"])  # shared_memory: a turn stalls
def test_a_stall_is_reported_once_with_the_missing_ranks(tmp_path, env, handle, name):
    setup = f"h = mlcomm.allreduce_init(x, algorithm='{name}')" if handle else ""
    call = "h()" if handle else f"mlcomm.allreduce(x, algorithm='{name}')"
    body = LATE.format(setup=setup, sleep=3, call=call)
    proc, _ = _job(tmp_path, 3, body, dict(env, MLCOMM_STALL_SECONDS="1"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("done") == 3
    for r in (0, 1):
        line = f"mlcomm: rank {r} has waited 1 s in allreduce ({name}, 100 x float64) for ranks"
        assert proc.stderr.count(line) == 1, proc.stderr
    assert "for ranks [2]" in proc.stderr


FIRST = """
    comm = mlcomm.Comm(MPI.COMM_WORLD)
    x, out = np.full(8, rank + 1.0), np.empty(8)
    {before}
    if rank == size - 1:
        time.sleep({sleep})
    {call}
    print("done", rank, flush=True)
"""

#: a first call in each place mlcomm waits for every rank outside a bound program
FIRSTS = {
    "set-up": ("", "mlcomm.allreduce(x)",
               "allreduce, the first call on this communicator (mlcomm's set-up)"),
    "set-up-comm": ("", "comm.Allreduce(x, out)",
                    "allreduce, the first call on this communicator (mlcomm's set-up)"),
    "new-size": ("mlcomm.allreduce(np.ones(3))", "mlcomm.allreduce(x)",
                 "allreduce (8 x float64): auto's choice for a new size"),
    "window": ("mlcomm.allreduce(np.ones(3), algorithm='ring')",
               "mlcomm.allreduce(x, algorithm='shared_memory')",
               "mlcomm's set-up of the node's shared window"),
    "torch": ("import torch, torch.distributed as dist, mlcomm.torch",
              "dist.init_process_group('mlcomm'); dist.all_reduce(torch.ones(3))",
              "the mlcomm backend's process group, the first call on this communicator "
              "(mlcomm's set-up)"),
    "library": ("comm.Allreduce(np.ones(3, np.longdouble), np.empty(3, np.longdouble))",
                "comm.Allreduce(np.ones(3, np.longdouble), np.empty(3, np.longdouble))",
                "Allreduce (the MPI library's, through mlcomm.Comm)"),
}


@pytest.mark.parametrize("place", sorted(FIRSTS))
@pytest.mark.parametrize("nprocs", [2, 3])
def test_a_rank_late_on_a_first_call_is_named(tmp_path, place, nprocs):
    """mlcomm's own waits (the communicator's set-up, auto's agreement on a new size, the
    node window's creation, the library's collective through Comm, the torch backend's
    process group) report a late rank by name within the stall limit, then go on: the call
    completes."""
    before, call, what = FIRSTS[place]
    proc, _ = _job(tmp_path, nprocs, FIRST.format(before=before, sleep=4, call=call),
                   {"MLCOMM_STALL_SECONDS": "1"}, timeout=60)
    assert proc.returncode == 0 and proc.stdout.count("done") == nprocs, proc.stderr
    line = f"mlcomm: rank 0 has waited 1 s in {what}"
    assert proc.stderr.count(line) == 1, proc.stderr
    assert f"for ranks [{nprocs - 1}]" in proc.stderr.split(line, 1)[1].split("\n")[0]


@pytest.mark.parametrize("nprocs", [2, 3])
def test_a_rank_missing_from_a_first_call_ends_the_job_under_stall_abort(tmp_path, nprocs):
    before, call, what = FIRSTS["set-up"]
    proc, secs = _job(tmp_path, nprocs, FIRST.format(before=before, sleep=60, call=call),
                      {"MLCOMM_STALL_SECONDS": "1", "MLCOMM_STALL_ABORT": "1"}, timeout=90)
    assert proc.returncode != 0 and "done" not in proc.stdout
    assert (f"mlcomm: rank 0 has waited 1 s in {what} for ranks [{nprocs - 1}] "
            f"(MLCOMM_STALL_ABORT=1: ending the job)") in proc.stderr, proc.stderr
    assert secs < 40


@pytest.mark.parametrize("env", LOOPS)
def test_a_stall_in_the_library_collective_is_reported(tmp_path, env):
    """algorithm="mpi" (MPI_Iallreduce, polled): the stall is reported; the library does not
    say which ranks are missing, and the report says so."""
    body = LATE.format(setup="", sleep=3, call="mlcomm.allreduce(x, algorithm='mpi')")
    proc, _ = _job(tmp_path, 3, body, dict(env, MLCOMM_STALL_SECONDS="1"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("done") == 3
    for r in (0, 1):
        line = (f"mlcomm: rank {r} has waited 1 s in allreduce (mpi, 100 x float64) for the "
                f"other ranks (the MPI library does not say which)")
        assert proc.stderr.count(line) == 1, proc.stderr


@pytest.mark.parametrize("env", LOOPS)
def test_a_stall_ends_the_job_under_stall_abort(tmp_path, env):
    proc, secs = _job(tmp_path, 2, LATE.format(setup="", sleep=60,
                                               call="mlcomm.allreduce(x, algorithm='ring')"),
                      dict(env, MLCOMM_STALL_SECONDS="1", MLCOMM_STALL_ABORT="1"), timeout=90)
    assert proc.returncode != 0
    assert "mlcomm: rank 0 has waited 1 s in allreduce (ring, 100 x float64) for ranks [1]" \
        in proc.stderr and "MLCOMM_STALL_ABORT=1: ending the job" in proc.stderr
    assert secs < 40


def test_freed_arrays_leave_at_most_the_cache_bound(tmp_path):
    """120 all-reduces of 4 MiB and 24 of 16 MiB (ring and naive, whose 16 MiB scratch is
    twice the bound) on fresh arrays at new addresses, output given or not, each freed by
    the caller: the cache never holds more than MLCOMM_CACHE_BYTES, counting its scratch,
    its bindings and the node window, and resident memory grows by no more than that (and
    what the same loop on MPI_Allreduce leaves). Evicted bindings' bound calls kept their
    scratch alive: 210 to 330 MiB with a 16 MiB bound."""
    proc, _ = _job(tmp_path, 2, """
        import ctypes, gc
        from mlcomm import session
        libc = ctypes.CDLL(None)
        def rss():
            gc.collect()
            libc.malloc_trim(0)  # what the allocator keeps of freed memory is not mlcomm's
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        def calls(reduce):
            for n, count in ((1 << 20, 120), (4 << 20, 24)):  # float32: 4 MiB, then 16 MiB
                for k in range(count):
                    pad = np.empty(n + 16 * k, np.float32)  # a fresh array, at a new address
                    x = pad[16 * k:16 * k + n]
                    x.fill(1.0)
                    reduce(x, k)
                    del pad, x
        def library(x, k):
            y = np.empty_like(x)
            MPI.COMM_WORLD.Allreduce(x, y)
            assert y[0] == size
        bound = session.cache_bytes()
        def ours(x, k):
            y = mlcomm.allreduce(x, np.empty_like(x) if k % 3 else None,
                                 algorithm="naive" if k % 2 else "ring")
            assert y[0] == size
            assert session.cached_bytes() <= bound, session.held()
        calls(library)  # the library's own buffers for large messages
        for algorithm in ("naive", "ring", "shared_memory"):  # imports, loops, the window
            mlcomm.allreduce(np.ones(1 << 14, np.float32), algorithm=algorithm)
        window = session.session_of(MPI.COMM_WORLD)._window.nbytes
        assert session.held()["windows"] == window > 4 << 20, session.held()
        base = rss()
        calls(library)
        noise = rss() - base
        base = rss()
        calls(ours)
        grown = rss() - base
        held = session.held()
        assert held["total"] == session.cached_bytes() <= bound, held
        assert f"holds {held['total']}: {held['bindings']} bindings" in session.describe_held()
        print("grown", rank, grown >> 20, "MiB; the library's loop", noise >> 20, "MiB;",
              session.describe_held(), flush=True)
        assert grown <= bound + max(noise, 0) + (4 << 20), (grown, noise)
    """, {"MLCOMM_CACHE_BYTES": str(16 << 20)}, timeout=240)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert proc.stdout.count("grown") == 2, proc.stdout


def test_what_the_process_keeps_is_the_cache_bound_without_a_trim(tmp_path):
    """60 all-reduces of 4 MiB, each a new size (a plan and a binding each), on arrays the
    caller frees: resident memory, read with no malloc_trim, grows by the cache's bound and
    no more. With the bindings' scratch in the C heap among the caller's freed arrays, the
    allocator kept 54 MiB for a 32 MiB bound."""
    proc, _ = _job(tmp_path, 2, """
        import gc
        from mlcomm import session
        def rss():
            gc.collect()
            with open("/proc/self/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        mlcomm.allreduce(np.ones(1 << 14, np.float32), algorithm="ring")
        base = rss()
        for k in range(60):
            x = np.ones((1 << 20) + k, np.float32)
            y = mlcomm.allreduce(x, algorithm="ring")
            assert y[0] == size
            del x, y
        kept, bound = rss() - base, session.cache_bytes()
        print("kept", rank, kept >> 20, "MiB; bound", bound >> 20, "MiB", flush=True)
        assert kept <= bound + (4 << 20), (kept, session.held())
    """, {"MLCOMM_CACHE_BYTES": str(32 << 20)}, timeout=240)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert proc.stdout.count("kept") == 2, proc.stdout


def test_info_shows_what_the_cache_holds():
    proc = mpirun(1, ["-m", "mlcomm", "info"], env={"MLCOMM_CACHE_BYTES": str(16 << 20)})
    assert "cache       16777216 bytes bound (MLCOMM_CACHE_BYTES); holds 0: 0 bindings " \
           "(scratch 0, device vectors 0, their own 0), node windows 0" in proc.stdout, \
        proc.stdout


def test_a_window_that_cannot_be_allocated_says_what_to_do(tmp_path):
    proc, _ = _job(tmp_path, 2, """
        try:
            mlcomm.allreduce(np.ones(4), algorithm="shared_memory")
        except Exception as exc:
            print(f"rank {rank}: {type(exc).__name__}: {exc}", flush=True)
    """, {"MLCOMM_SHM_BYTES": str(1 << 50)})
    assert proc.returncode == 0, proc.stderr
    for r in (0, 1):
        assert f"rank {r}: WindowError: mlcomm: cannot allocate the node's shared-memory " \
               f"window" in proc.stdout, proc.stdout
    assert "/dev/shm" in proc.stdout and "MLCOMM_SHM_BYTES" in proc.stdout


@pytest.mark.parametrize("name", ["shared_memory", "hierarchical"])
@pytest.mark.parametrize("count", [1000, 100_000])  # through the window; by single copies
def test_a_rank_killed_in_a_window_collective_ends_the_job(tmp_path, name, count):
    """The others spin on window flags, sending no MPI message, or read a dead peer's
    memory: the launcher ends them (where it does not, mlcomm does: tests/test_lost_rank.py).
    The first call completes everywhere; what ends the job is rank 1's SIGKILL."""
    proc, secs = _job(tmp_path, 3, f"""
        import signal
        x = np.ones({count})
        y = mlcomm.allreduce(x, algorithm="{name}")
        done = MPI.COMM_WORLD.gather(bool((y == size).all()))
        if rank == 0:
            print("first call exact on", sum(done), "ranks", flush=True)
        MPI.COMM_WORLD.Barrier()
        if rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        mlcomm.allreduce(x, algorithm="{name}")
        print("returned", rank, flush=True)
    """, {"MLCOMM_RANKS_PER_NODE": "3" if name == "shared_memory" else "2"}, timeout=60)
    out = proc.stdout + proc.stderr
    assert "first call exact on 3 ranks" in proc.stdout, out
    assert proc.returncode != 0 and "returned" not in proc.stdout, out
    # MPICH and Intel MPI: "EXIT STRING: Killed (signal 9)"; Open MPI: "exited on signal 9"
    assert "signal 9" in out, out
    assert "Traceback" not in out, out
    assert secs < 30


@pytest.mark.parametrize("name, raw", [("MLCOMM_POLLS_BEFORE_YIELD", "3"),
                                       ("MLCOMM_POLLS_BEFORE_YIELD", "many"),
                                       ("MLCOMM_STALL_SECONDS", "-1"),
                                       ("MLCOMM_SLEEP_AFTER_US", "soon"),
                                       ("MLCOMM_SLEEP_AFTER_US", "-5"),
                                       ("MLCOMM_EXECUTOR", "gpu")])
def test_bad_loop_settings_name_the_variable(monkeypatch, name, raw):
    from mlcomm.runtime.binding import settings_from_env
    monkeypatch.setenv(name, raw)
    with pytest.raises(ValueError, match=name):
        settings_from_env(0, 1.0)


def test_waits_yield_sooner_and_sleep_by_ranks_per_core(monkeypatch):
    """Ranks that outnumber the cores yield every 2 polls; at 3 or more to a core a wait
    that lasts 100 us sleeps between polls; MLCOMM_POLLS_BEFORE_YIELD and
    MLCOMM_SLEEP_AFTER_US override."""
    from mlcomm.runtime.binding import settings_from_env
    waits = lambda per_core: (settings_from_env(0, per_core).yield_mask,
                              settings_from_env(0, per_core).sleep_after)
    assert waits(1.0) == (1023, 0) and waits(0.25) == (1023, 0)
    assert waits(2.0) == (1, 0) and waits(4.0) == (1, 100e-6)
    monkeypatch.setenv("MLCOMM_POLLS_BEFORE_YIELD", "64")
    monkeypatch.setenv("MLCOMM_SLEEP_AFTER_US", "50")
    assert waits(2.0) == (63, 50e-6) and waits(1.0) == (63, 50e-6)
    monkeypatch.setenv("MLCOMM_SLEEP_AFTER_US", "0")
    assert waits(4.0) == (63, 0)


_LATE_PEER = """
import sys, time
import numpy as np
from mpi4py import MPI
import mlcomm
comm = MPI.COMM_WORLD
x = np.ones(4, np.float32)
mlcomm.allreduce(mlcomm.IN_PLACE, x, algorithm=sys.argv[1])  # set up and bound
comm.Barrier()
if comm.rank == 1:
    time.sleep(1.0)
cpu, wall = time.process_time(), time.perf_counter()
mlcomm.allreduce(mlcomm.IN_PLACE, x, algorithm=sys.argv[1])  # rank 0 waits 1 s for rank 1
if comm.rank == 0:
    print("CPU share", (time.process_time() - cpu) / (time.perf_counter() - wall))
"""


@pytest.mark.parametrize("executor", ["compiled", "python"])
def test_a_long_wait_sleeps_and_leaves_the_core(tmp_path, executor):
    """Rank 0 waits a second for rank 1 in an all-reduce. On the node window's flags, with
    MLCOMM_SLEEP_AFTER_US, it sleeps between polls and takes a small share of the CPU (each
    wake costs a system call and a timer: 0.22-0.34 of a core measured on this 2-core VM);
    yielding, it takes it all (the ranks that share its core get only their turns). A wait
    on MPI requests (ring's messages) sleeps too, but only after ten times as long (the
    library moves them only while it polls): with 100 ms set, the window's wait sleeps
    after 0.1 s, ring's yields for the whole second."""
    script = tmp_path / "late.py"
    script.write_text(_LATE_PEER)
    share = {}
    for algorithm, after in (("shared_memory", "100"), ("shared_memory", "0"),
                             ("ring", "100"), ("ring", "0"), ("shared_memory", "100000"),
                             ("ring", "100000")):
        proc = mpirun(2, [script, algorithm], timeout=120,
                      env={"MLCOMM_SLEEP_AFTER_US": after, "MLCOMM_EXECUTOR": executor})
        share[algorithm, after] = float(proc.stdout.split("CPU share")[1].split()[0])
    assert max(share["shared_memory", "100"], share["ring", "100"]) < 0.5 < 0.7 < min(
        share["shared_memory", "0"], share["ring", "0"]), share
    assert share["shared_memory", "100000"] < 0.5 < 0.7 < share["ring", "100000"], share


# --- the end of the job -----------------------------------------------------------------------

def test_a_collective_one_rank_never_calls_ends_the_job_at_its_end(tmp_path):
    """Rank 1 calls one all-reduce more than rank 0: rank 0's end of the job finds rank 1's
    message, names both ranks and ends the job, instead of leaving rank 1 waiting."""
    proc, secs = _job(tmp_path, 2, """
        for _ in range(2 if rank == 1 else 1):
            mlcomm.allreduce(np.ones(16, np.float32), algorithm="ring")
        print("script ended", rank, flush=True)
    """, env={"MLCOMM_STALL_SECONDS": "30"})
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "mlcomm: rank 0 has ended its script, but rank 1 waits for it" in proc.stderr
    assert "script ended 0" in proc.stdout and secs < 30


def test_an_unhandled_exception_on_one_rank_ends_a_job_the_others_wait_in(tmp_path):
    """Rank 0's script fails; rank 1 waits for it in an all-reduce: rank 0's end ends the
    job within the grace period, long before the stall limit."""
    proc, secs = _job(tmp_path, 2, """
        mlcomm.allreduce(np.ones(16, np.float32), algorithm="ring")
        if rank == 0:
            raise KeyError("a bug in rank 0's script")
        mlcomm.allreduce(np.ones(16, np.float32), algorithm="ring")
    """, env={"MLCOMM_STALL_SECONDS": "60"})
    assert proc.returncode != 0
    assert "KeyError" in proc.stderr and "a bug in rank 0's script" in proc.stderr
    # rank 1's message of the second all-reduce, or the grace period, ends it
    assert ("ended with an unhandled exception" in proc.stderr
            or "rank 1 waits for it" in proc.stderr), proc.stderr
    assert secs < 40


def test_a_script_that_fails_alike_on_every_rank_prints_each_traceback(tmp_path):
    proc, _ = _job(tmp_path, 2, """
        mlcomm.allreduce(np.ones(16, np.float32), algorithm="ring")
        raise KeyError(f"rank {rank}'s own")
    """)
    assert proc.returncode != 0
    assert "rank 0's own" in proc.stderr and "rank 1's own" in proc.stderr


def test_a_started_call_that_failed_unwaited_is_reported_at_the_end(tmp_path):
    """A call started on the progress thread that fails is reported at the end of the job
    when nobody waited for it; one that was waited for raised there and is not."""
    proc, _ = _job(tmp_path, 2, """
        session = mlcomm.session.session_of(MPI.COMM_WORLD)
        waited = session.start(lambda: {}["waited"])
        session.start(lambda: {}["never waited"])
        try:
            waited.wait()
        except KeyError as exc:
            print("raised", exc, flush=True)
        print("script ended", rank, flush=True)
    """, timeout=60)
    assert proc.returncode == 0 and "raised 'waited'" in proc.stdout, proc.stdout + proc.stderr
    for rank in (0, 1):
        assert (f"mlcomm: rank {rank}: a started call failed and was never waited for: "
                f"KeyError: 'never waited'") in proc.stderr
    assert "'waited'" not in proc.stderr


def test_a_clean_end_with_watched_waits_behind_it_ends_cleanly(tmp_path):
    """Watched waits (auto's agreement, a set-up's roll call) leave no message that the end of
    the job would take for a peer's unmatched one."""
    proc, _ = _job(tmp_path, 3, """
        for n in (1, 100, 5000, 1):
            y = mlcomm.allreduce(np.full(n, rank, np.int64))
            assert (y == 3).all(), y
        sub = MPI.COMM_WORLD.Split(rank % 2, rank)
        mlcomm.allreduce(np.ones(4), comm=sub)
        print("done", rank, flush=True)
    """, env={"MLCOMM_STALL_SECONDS": "5"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("done") == 3 and "waits for it" not in proc.stderr
