"""``mlcomm`` command line: one argparse parser, subcommands from several modules.

Each command module exposes ``register(subparsers)``; the parser it adds sets
``func=<callable(args) -> int>``.  An unhandled exception on any rank prints
its traceback and aborts the whole MPI job, as ``python -m mpi4py`` does.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback

__all__ = ["main", "abort_on_error"]

COMMAND_MODULES = (
    "mlcomm.commands",
    "mlcomm.benchmark.cli",
    "mlcomm.benchmark.tune",
    "mlcomm.analysis.cli",
    "mlcomm.trainer.cli",
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mlcomm",
        description="Hand-written MPI all-reduce algorithms: verify, benchmark, "
                    "analyse, simulate and train.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # that command family is not built yet
                continue
            raise
        module.register(sub)
    return parser


def abort_on_error(func, *args, **kwargs):
    """Run ``func``; on an unhandled exception print it and abort every rank."""
    try:
        return func(*args, **kwargs)
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        from mpi4py import MPI
        if MPI.Is_initialized() and not MPI.Is_finalized() and MPI.COMM_WORLD.Get_size() > 1:
            MPI.COMM_WORLD.Abort(1)
        sys.exit(1)


def main(argv=None) -> int:
    """Entry point of the ``mlcomm`` console script."""
    args = _parser().parse_args(argv)
    return abort_on_error(args.func, args) or 0


if __name__ == "__main__":
    sys.exit(main())
