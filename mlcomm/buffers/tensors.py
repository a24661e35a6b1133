"""PyTorch CPU tensors as collective buffers: NumPy views over their memory, and back.

Nothing here imports torch unless a tensor is passed. A tensor is viewed, never copied, so
a collective writes into the tensor's own storage (in place, or as ``recvbuf``); a result
mlcomm allocates goes back as a tensor over the same memory. bfloat16 travels as
``ml_dtypes.bfloat16``. CUDA tensors are device arrays (``__cuda_array_interface__``) and
take the GPU path (:mod:`mlcomm.buffers.device`).
"""

from __future__ import annotations

import numpy as np

__all__ = ["is_tensor", "as_array", "like"]


def is_tensor(obj) -> bool:
    """True for ``torch.Tensor`` and its subclasses (``nn.Parameter``)."""
    return type(obj).__module__.partition(".")[0] == "torch" and hasattr(obj, "data_ptr")


def as_array(tensor, name: str) -> np.ndarray:
    """A NumPy view of a CPU tensor's memory (the tensor's gradient tracking left aside)."""
    import torch
    t = tensor.detach() if tensor.requires_grad else tensor
    if not t.is_cpu:
        raise TypeError(f"{name} is a {t.device.type} tensor; mlcomm takes CPU tensors here "
                        f"and CUDA tensors through their __cuda_array_interface__")
    if not t.is_contiguous():
        raise ValueError(f"{name} is a non-contiguous tensor; pass {name}.contiguous()")
    if t.dtype is torch.bfloat16:
        from ..kernels import BFLOAT16
        return t.view(torch.int16).numpy().view(BFLOAT16)
    return t.numpy()


def like(result: np.ndarray, tensor):
    """``result`` (an array mlcomm allocated) as a tensor shaped like ``tensor``, sharing memory."""
    import torch
    from ..kernels import BFLOAT16
    if result.dtype == BFLOAT16:
        return torch.from_numpy(result.view(np.int16)).view(torch.bfloat16).view(tensor.shape)
    return torch.from_numpy(result).view(tensor.shape)
