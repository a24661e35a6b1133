"""Ending the whole MPI job from any rank."""

from __future__ import annotations

from mpi4py import MPI

__all__ = ["abort_job"]


def abort_job(message: str | None = None, code: int = 1, comm=None) -> None:
    """Print ``message`` and end the whole MPI job, as MPI's fatal error handler does.

    The output gets a moment to reach the launcher first (an aborted job's last lines can
    be lost otherwise). ``MPI_Abort`` may return before the process manager ends this
    process (MPICH's does), so this process then exits at once: nothing after it runs.
    """
    import os
    import sys
    import time
    if message:
        print(message, file=sys.stderr, flush=True)
    time.sleep(0.2)
    try:
        (comm or MPI.COMM_WORLD).Abort(code)
    finally:
        os._exit(code)
