"""Run a program with a fault injected, for the tests: the shipped code carries no test hooks.

Usage: ``python tests/faults/inject.py FAULT=VALUE ... -- (-m MODULE | SCRIPT) ARGS...``

``bench-corrupt=ALGORITHM``
    ``mlcomm bench --check`` sees element 0 of ALGORITHM's checked result changed on the last
    rank (one wrong element in all).
``train-crash-at=N``
    the trainer's rank 0 aborts the job at step N (an asynchronous run's server 0: once it has
    applied N updates).
``train-kill-at=N:R``
    the trainer's rank R of ``MPI.COMM_WORLD`` SIGKILLs itself 10 ms into step N.
``train-sigterm-at=N``
    the trainer's last rank sends itself SIGTERM before each step from N on, until it sees
    the stop asked for.
"""

import importlib
import os
import runpy
import signal
import sys
import threading


def flip(result) -> None:
    """Change element 0 of host array ``result`` so that any check must see it."""
    if result.size == 0:
        return
    x = result.reshape(-1)[:1]
    if x.dtype.kind == "b":
        x[...] = ~x
    elif x.dtype.kind in "iu":
        x ^= 1
    else:
        x[...] = (abs(x) + 1) * 3


def bench_corrupt(algorithm: str) -> None:
    from mlcomm.benchmark import harness
    timed_call, count_wrong = harness._timed_call, harness._count_wrong
    current = []

    def _timed_call(alg, comm, *args, **kwargs):  # the check follows each algorithm's call
        current[:] = [alg, comm]
        return timed_call(alg, comm, *args, **kwargs)

    def _count_wrong(result, ref, dtype, op):
        alg, comm = current
        if alg == algorithm and comm.Get_rank() == comm.Get_size() - 1:
            flip(result)
        return count_wrong(result, ref, dtype, op)

    harness._timed_call, harness._count_wrong = _timed_call, _count_wrong


def train_faults(crash_at: int = -1, sigterm_at: int = -1, kill_at=(-1, -1)) -> None:
    from mpi4py import MPI
    train = importlib.import_module("mlcomm.trainer.train")  # the module, not the function
    make_mode = train._mode

    def _mode(ctx):
        mode = make_mode(ctx)
        step = mode.step

        def faulty_step(t):
            if t == crash_at and ctx.rank == 0:
                ctx.comm.Abort(3)
            if 0 <= sigterm_at <= t and ctx.rank == ctx.size - 1 and not ctx.stop_requested():
                os.kill(os.getpid(), signal.SIGTERM)
            if (t, MPI.COMM_WORLD.Get_rank()) == kill_at:
                threading.Timer(0.01, os.kill, (os.getpid(), signal.SIGKILL)).start()
            return step(t)

        mode.step = faulty_step
        push = getattr(mode, "_push", None)
        if push is not None:  # a parameter server: abort once it has applied crash_at updates
            def faulty_push(src):
                flag = push(src)
                if mode.rank == 0 and mode.applied == crash_at:
                    mode.comm.Abort(3)
                return flag

            mode._push = faulty_push
        return mode

    train._mode = _mode


def main(argv) -> None:
    split = argv.index("--")
    faults = dict(item.split("=", 1) for item in argv[:split])
    rest = argv[split + 1:]
    if "bench-corrupt" in faults:
        bench_corrupt(faults.pop("bench-corrupt"))
    crash, term = int(faults.pop("train-crash-at", -1)), int(faults.pop("train-sigterm-at", -1))
    kill = tuple(int(v) for v in faults.pop("train-kill-at", "-1:-1").split(":"))
    if crash >= 0 or term >= 0 or kill[0] >= 0:
        train_faults(crash, term, kill)
    if faults:
        raise SystemExit(f"inject.py: unknown faults {sorted(faults)}")
    if rest[0] == "-m":
        sys.argv = [rest[1], *rest[2:]]
        runpy.run_module(rest[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = rest
        runpy.run_path(rest[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
