"""``mlcomm`` command line: one argparse parser, subcommands from several modules.

Each command module exposes ``register(subparsers)``; the parser it adds sets
``func=<callable(args) -> int>`` and may set ``validate=<callable(args)>``, which checks
the parsed values together and calls its parser's ``error`` on a bad combination.

Under ``mpiexec`` every rank parses its own command line and the ranks agree on the
outcome before any command runs: an argument error (or ``--help``) is printed once and
every rank exits with the same status.  Afterwards, an unhandled exception or a
``SystemExit`` with a non-zero status on any one rank prints its message and aborts the
whole job (:func:`abort_on_error`).  A closed output pipe (``mlcomm info | head -1``)
ends the command quietly with status 141, as a shell's own tools do.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import sys
import traceback

from .args import world

__all__ = ["main", "abort_on_error", "parse_args", "AgreedExit"]

COMMAND_MODULES = (
    "mlcomm.cli.commands",
    "mlcomm.benchmark.cli",
    "mlcomm.benchmark.tune",
    "mlcomm.analysis.cli",
    "mlcomm.trainer.cli",
)

#: The exit status of a command whose output pipe closed (128 + SIGPIPE).
SIGPIPE_STATUS = 141


class AgreedExit(SystemExit):
    """An exit that every rank takes together (argument errors, ``--help``): no abort."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mlcomm",
        description="Hand-written MPI all-reduce algorithms: verify, benchmark, "
                    "analyse, simulate and train.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def parse_args(parser: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """Parse ``argv`` on every rank; on an error or ``--help`` one rank prints, all exit.

    The rank that prints is rank 0 when its own command line stopped, else the lowest
    rank whose did (its message then names it: the ranks were given different command
    lines).  Every rank raises :class:`AgreedExit` with the highest status any rank got.
    After a successful parse, the command's ``validate(args)`` runs in the same way.
    """
    out, err = io.StringIO(), io.StringIO()
    args, status = None, None
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            args = parser.parse_args(argv)
            check = getattr(args, "validate", None)
            if check is not None:
                check(args)
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    mine = None if status is None else (status, out.getvalue(), err.getvalue())
    comm = world()
    states = comm.allgather(mine) if comm is not None else [mine]
    stopped = [(rank, state) for rank, state in enumerate(states) if state is not None]
    if not stopped:
        return args
    reporter, _ = stopped[0]
    if (comm.Get_rank() if comm is not None else 0) == reporter:
        _, text_out, text_err = mine
        if len(stopped) < len(states) and text_err:
            text_err = (f"mlcomm: rank {reporter} was given a different command line "
                        f"from rank(s) {[r for r, s in enumerate(states) if s is None]}:\n"
                        + text_err)
        sys.stdout.write(text_out)
        sys.stderr.write(text_err)
        sys.stdout.flush()
        sys.stderr.flush()
    raise AgreedExit(max(state[0] for _, state in stopped))


def abort_on_error(func, *args, **kwargs):
    """Run ``func``; if it fails on this rank, end the whole MPI job with its message.

    An unhandled exception prints its traceback; a ``SystemExit`` with a non-zero status
    prints its message (a bare status: which rank exited with it).  Either then calls
    ``MPI_Abort`` on ``COMM_WORLD`` when the job has more than one rank, so no other rank
    waits for this one; in a single process it exits with that status.  A clean exit
    (status 0 or None) and an :class:`AgreedExit` pass through.
    """
    try:
        return func(*args, **kwargs)
    except AgreedExit:
        raise
    except SystemExit as exc:
        if exc.code in (None, 0):
            raise
        comm = world()
        if comm is None:
            raise
        if isinstance(exc.code, int):
            code, message = exc.code, (f"mlcomm: rank {comm.Get_rank()} exited with status "
                                       f"{exc.code}; ending the MPI job")
        else:
            code, message = 1, exc.code
        print(message, file=sys.stderr)
        _flush()
        _abort(comm, code)
    except BaseException:
        traceback.print_exc()
        _flush()
        comm = world()
        if comm is not None:
            _abort(comm, 1)
        sys.exit(1)


def _abort(comm, code: int) -> None:
    from ..transport.mpi.abort import abort_job
    abort_job(code=code, comm=comm)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def _run(argv) -> int:
    args = parse_args(_parser(), argv)
    try:
        status = args.func(args) or 0
        sys.stdout.flush()
    except BrokenPipeError:
        # Python's documented recipe: point stdout at devnull so that the flush at exit
        # does not raise again, and end with the status of a process killed by SIGPIPE
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        raise SystemExit(SIGPIPE_STATUS) from None
    return status


def main(argv=None) -> int:
    """Entry point of the ``mlcomm`` console script and of ``python -m mlcomm``."""
    return abort_on_error(_run, argv)
