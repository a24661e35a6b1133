"""Peers from MPI: ``init_process_group``'s rendezvous, and ``new_group``'s communicators.

``init_process_group`` without ``init_method`` or ``store`` runs torch's ``env://``
rendezvous, which needs ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK`` and ``WORLD_SIZE``.
:func:`install` (run by ``import mlcomm.torch``) puts :func:`env_or_mpi` in its place:
with ``MASTER_ADDR`` set (torchrun, or a job script that sets it) torch's own handler runs
as before; without it, rank and world size are ``MPI_COMM_WORLD``'s and rank 0 opens a
``TCPStore`` on a port the system picks, whose address it broadcasts over MPI. mlcomm's
collectives never use the store, but torch hands one to every backend of the job: gloo and
NCCL groups exchange their addresses through it, so a real store lets them run beside
mlcomm's (and ``init_process_group("gloo")`` under ``mpiexec`` needs no ``MASTER_ADDR``
either). A store that lives only in MPI would need a server thread on rank 0 that polls
MPI; a TCP store's server sleeps until asked.

:func:`communicator` gives each process group its MPI communicator: ``MPI_COMM_WORLD``
for the default group, whose ranks must be MPI's; for ``new_group(ranks)``, a
sub-communicator that only its members create (``MPI_Comm_create_group``), after they
have agreed through the store, within the group's timeout, that each of them is creating
the same group. A member that does not arrive makes the others raise instead of wait.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from urllib.parse import parse_qs, urlparse

from mpi4py import MPI

__all__ = ["install", "env_or_mpi", "communicator"]

_LAUNCH = ("the mlcomm backend takes its ranks from MPI: launch the job with mpiexec or "
           "srun (mpiexec -n N python script.py), not torchrun, and leave RANK and "
           "WORLD_SIZE unset")


def install() -> None:
    """Make ``env://`` (init_process_group's default) fall back to MPI without MASTER_ADDR."""
    import importlib
    handlers = importlib.import_module("torch.distributed.rendezvous")._rendezvous_handlers
    # (torch has no call that replaces a registered handler)
    if getattr(handlers["env"], "_mlcomm", False):
        return
    torch_env = handlers["env"]

    def handler(url, timeout=timedelta(minutes=30), **kwargs):
        if os.environ.get("MASTER_ADDR"):
            return torch_env(url, timeout=timeout, **kwargs)
        return env_or_mpi(url, timeout)

    handler._mlcomm = True
    handlers["env"] = handler


def env_or_mpi(url: str, timeout: timedelta):
    """torch's rendezvous generator for ``env://`` without MASTER_ADDR: yields
    ``(store, rank, world size)`` from MPI_COMM_WORLD (collective over it)."""
    from torch.distributed import TCPStore
    world = MPI.COMM_WORLD
    asked = {k: int(v[0]) for k, v in parse_qs(urlparse(url).query).items()
             if k in ("rank", "world_size")}
    for key, env in (("rank", "RANK"), ("world_size", "WORLD_SIZE")):
        if key not in asked and os.environ.get(env):
            asked[key] = int(os.environ[env])
    mine = {"rank": world.Get_rank(), "world_size": world.Get_size()}
    wrong = {k: v for k, v in asked.items() if v != mine[k]}
    if wrong:  # raised before any message, on every rank alike
        raise RuntimeError(f"init_process_group: {wrong} differ from MPI's {mine}; {_LAUNCH}")
    store = None
    if world.Get_rank() == 0:
        store = TCPStore("127.0.0.1", 0, world.Get_size(), is_master=True, timeout=timeout,
                         wait_for_workers=False)
    host, port = world.bcast((socket.gethostname(), store.port if store else None), root=0)
    if store is None:
        address = "127.0.0.1" if host == socket.gethostname() else host
        store = TCPStore(address, port, world.Get_size(), is_master=False, timeout=timeout)
    yield store, world.Get_rank(), world.Get_size()
    raise RuntimeError("mlcomm's MPI rendezvous cannot run again: MPI_COMM_WORLD is fixed")


def communicator(options) -> MPI.Intracomm:
    """The MPI communicator of the group that torch creates with ``options`` (its
    ``_DistributedBackendOptions``); the member ranks first agree through the store."""
    world = MPI.COMM_WORLD
    ranks = list(options.global_ranks_in_group)
    rank, size = options.group_rank, options.group_size
    if not ranks:  # the default group
        if (rank, size) != (world.Get_rank(), world.Get_size()):
            raise RuntimeError(f"init_process_group('mlcomm'): torch made this rank {rank} of "
                               f"{size}, MPI_COMM_WORLD rank {world.Get_rank()} of "
                               f"{world.Get_size()}; {_LAUNCH}")
        return world
    if ranks[rank] != world.Get_rank():
        raise RuntimeError(f"new_group: torch's rank {ranks[rank]} is MPI_COMM_WORLD rank "
                           f"{world.Get_rank()}; the mlcomm backend needs torch's default group "
                           f"to number the ranks as MPI does ({_LAUNCH})")
    _agree(options.store, ranks, options.timeout)
    group = world.Get_group().Incl(ranks)
    try:
        return world.Create_group(group)
    finally:
        group.Free()


def _agree(store, ranks, timeout):
    """Every member of ``ranks`` has set its key in the group's store within ``timeout``, for
    the same ranks; else a RuntimeError, on each member that came, naming the others."""
    mine = repr(ranks).encode()
    store.set(f"mlcomm/member/{MPI.COMM_WORLD.Get_rank()}", mine)
    keys = [f"mlcomm/member/{r}" for r in ranks]
    try:
        store.wait(keys, timeout)
    except Exception:  # torch's DistStoreError: a member never came
        missing = [r for r, key in zip(ranks, keys) if not store.check([key])]
        raise RuntimeError(
            f"new_group(ranks={ranks}): ranks {missing} did not create this group within "
            f"{timeout.total_seconds():g} s; every rank must call new_group, with the same "
            f"ranks and in the same order as the others (torch asks this of every rank of the "
            f"default group)") from None
    differ = {r: v.decode() for r, v in zip(ranks, store.multi_get(keys)) if v != mine}
    if differ:
        raise RuntimeError(f"new_group(ranks={ranks}): ranks {sorted(differ)} created another "
                           f"group at this point ({differ}); every rank must call new_group "
                           f"with the same ranks, in the same order")
