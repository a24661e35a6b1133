"""PyTorch on mlcomm: ``import mlcomm.torch`` registers the ``torch.distributed`` backend
``"mlcomm"``.

.. code-block:: text

    import mlcomm.torch
    torch.distributed.init_process_group("mlcomm")   # under mpiexec or srun

Then ``torch.distributed``'s collectives and PyTorch's own ``DistributedDataParallel`` run on
mlcomm's algorithms (:mod:`mlcomm.torch.backend`), with rank and world size from MPI and no
``MASTER_ADDR`` (:mod:`mlcomm.torch.rendezvous`). Importing :mod:`mlcomm` alone does not
import torch; nothing in mlcomm imports this package.
"""

import torch.distributed as dist

from . import rendezvous
from .backend import Options, ProcessGroupMlcomm, Work, WorkInfo, create

__all__ = ["Options", "ProcessGroupMlcomm", "Work", "WorkInfo", "BACKEND"]

#: the backend's name in ``init_process_group`` and ``new_group``
BACKEND = "mlcomm"

if BACKEND not in dist.Backend.backend_list:
    dist.Backend.register_backend(BACKEND, create, extended_api=True, devices=["cpu"])
rendezvous.install()
