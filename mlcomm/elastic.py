"""Elastic training in Horovod's shape: a state the loop commits, restored on the
survivors after a lost rank, the loop going on on their communicator.

::

    state = mlcomm.elastic.State(comm, params=params, step=0)

    @mlcomm.elastic.run
    def train(state):
        while state.step < steps:
            ...  # collectives on state.comm
            state.step += 1
            state.commit()

    train(state)

On an MPI with fault tolerance (Open MPI run with ``mpiexec --with-ft ulfm``), a
collective that loses a rank raises :class:`mlcomm.RankLost` on every survivor;
:func:`run` then shrinks ``state.comm`` to the survivors (:func:`mlcomm.shrink`), restores
the last commit, makes every survivor's copy rank 0's (:meth:`State.sync`), calls the
state's reset callbacks (to re-shard data, say) and calls the function again. Without
fault tolerance a lost rank ends the job (docs/failures.rst) and ``run`` only syncs.
"""

from __future__ import annotations

import copy
import time

import numpy as np

from .api import RankLost, bcast, shrink
from .session.call import comm_of

__all__ = ["State", "run"]


def _copy(value):
    """A copy that later changes to ``value`` do not reach: arrays and tensors copied,
    anything else deep-copied."""
    if isinstance(value, np.ndarray):
        return value.copy()
    if hasattr(value, "detach") and hasattr(value, "clone"):  # a torch tensor
        return value.detach().clone()
    return copy.deepcopy(value)


class State:
    """Named values of a training loop (``State(comm, params=w, step=0)``: ``state.params``,
    ``state.step``), kept on ``comm`` (default ``MPI.COMM_WORLD``; ``state.comm`` is the
    survivors' after a loss). :meth:`commit` keeps a copy of every value, :meth:`restore`
    puts it back, :meth:`sync` makes every rank's values rank 0's. ``resets``: what the
    losses were, ``(lost ranks, seconds from the exception to the loop's new start)``."""

    def __init__(self, comm=None, **values):
        object.__setattr__(self, "_names", tuple(values))
        object.__setattr__(self, "comm", comm_of(comm))
        object.__setattr__(self, "resets", [])
        object.__setattr__(self, "_callbacks", [])
        for name, value in values.items():
            object.__setattr__(self, name, value)
        self.commit()

    def __setattr__(self, name, value):
        if name not in self._names and name != "comm":
            raise AttributeError(f"State has no value {name!r}; name it when the state is "
                                 f"made: State(comm, {name}=...)")
        object.__setattr__(self, name, value)

    def commit(self) -> None:
        """Keep a copy of every value: a loss goes back to here."""
        object.__setattr__(self, "_committed", {n: _copy(getattr(self, n)) for n in self._names})

    def restore(self) -> None:
        """Every value as it was at the last :meth:`commit`."""
        for name, value in self._committed.items():
            object.__setattr__(self, name, _copy(value))

    def sync(self) -> None:
        """Every rank's values made rank 0's (collective on ``comm``): NumPy arrays and
        tensors by mlcomm's broadcast, in place; other values by pickle."""
        others = {}
        for name in self._names:
            value = getattr(self, name)
            array = value.detach().numpy() if hasattr(value, "detach") else value
            if isinstance(array, np.ndarray) and array.flags.c_contiguous and array.size:
                bcast(array.reshape(-1), comm=self.comm)
            else:
                others[name] = value
        for name, value in self.comm.bcast(others, root=0).items():
            object.__setattr__(self, name, value)

    def on_reset(self, callback) -> None:
        """Call ``callback(state)`` after each loss, once the state is restored and synced
        on the survivors (re-shard the data there)."""
        self._callbacks.append(callback)

    def _reset(self, lost: RankLost, since: float) -> None:
        object.__setattr__(self, "comm", shrink(self.comm))
        self.restore()
        self.sync()
        for callback in self._callbacks:
            callback(self)
        self.resets.append((lost.ranks, time.monotonic() - since))


def run(fn):
    """``fn(state, ...)`` run until it returns, going on after each lost rank on the
    survivors (see the module docstring); the state is synced before the first run."""
    def elastic(state: State, *args, **kwargs):
        state.sync()
        while True:
            try:
                return fn(state, *args, **kwargs)
            except RankLost as lost:
                state._reset(lost, time.monotonic())
    elastic.__name__, elastic.__doc__ = fn.__name__, fn.__doc__
    return elastic
