"""The ``mlcomm`` process group: torch.distributed's collectives on mlcomm's algorithms.

:class:`ProcessGroupMlcomm` is a Python subclass of ``torch.distributed.ProcessGroup``, the
form torch accepts for a backend written in Python (torch's ``test_c10d_pypg.py``); torch
calls its methods from ``torch.distributed``'s functions and from DDP's C++ reducer. A
collective:

1. checks its tensors (on the CPU, contiguous, a dtype and op mlcomm reduces) and compares
   the call across the group's ranks: every rank's checksum of the call's description (or
   of its error) is gathered by one mlcomm allgather of 64 bytes a rank, on a communicator
   of its own. A call that differs on some rank (shape, dtype, op, root, collective) or
   fails on one raises the same error on every rank, where it would otherwise hang or
   crash. A blocking all-reduce of at most 56 bytes rides in that allgather and each rank
   reduces the gathered rows in rank order (the same bits on every rank): one collective;
2. runs on mlcomm: blocking in the caller's thread (``async_op=False``), or started on the
   communicator's progress thread (``async_op=True``, and every call of DDP's reducer),
   where started calls run one after another in the order they were started
   (:func:`mlcomm.api.istart`). A started call that this rank has made before (the same
   description) is compared there too, just before it runs, so it returns at once; a
   blocking call, and a call not made before (whose first run may agree on ``auto``'s
   choice across the ranks), are compared in the caller's thread, after the calls started
   before them;
3. returns a :class:`Work`: ``wait()`` waits for it and raises its error, ``get_future()``
   is a ``torch.futures.Future`` of its output tensors, completed on the progress thread
   (so its callbacks run there and must not wait for a later call of the group).

``send`` and ``recv`` are MPI's non-blocking point-to-point calls on a duplicate of the
communicator; their Work waits for the MPI request. Hooks registered with
``_register_on_completion_hook`` (torch's name) get a :class:`WorkInfo` for each collective.

The modules: :mod:`.group` (the process group, its collectives and :class:`Options`),
:mod:`.compare` (the checks of a call and its comparison across the ranks), :mod:`.work`
(:class:`Work`, :class:`WorkInfo`); this one has torch's creator :func:`create`.
"""

from __future__ import annotations

from .group import Options, ProcessGroupMlcomm
from .work import Work, WorkInfo

__all__ = ["ProcessGroupMlcomm", "Work", "WorkInfo", "Options", "create"]


def create(backend_options, options=None):
    """torch's creator of the backend (``extended_api=True``): the process group of the
    ranks in ``backend_options`` (``_DistributedBackendOptions``)."""
    from .rendezvous import communicator
    if options is not None and not isinstance(options, Options):
        raise TypeError(f"pg_options of the mlcomm backend: pass mlcomm.torch.Options(...), "
                        f"not {type(options).__name__}")
    return ProcessGroupMlcomm(communicator(backend_options), options, backend_options.timeout)
