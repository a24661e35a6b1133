"""SGD with momentum and the linear learning-rate scaling rule with warm-up."""

from __future__ import annotations

import numpy as np

__all__ = ["SGD", "scaled_lr"]


def scaled_lr(step: int, *, lr: float, global_batch: int, base_batch: int,
              warmup: int, scaling: str = "linear") -> float:
    """Return the learning rate at ``step``.

    With ``scaling="linear"`` the target rate is ``lr * global_batch / base_batch``
    (Goyal et al.), reached by a linear ramp from ``lr`` over ``warmup`` steps.
    """
    if scaling == "none":
        target = lr
    elif scaling == "linear":
        target = lr * global_batch / base_batch
    else:
        raise ValueError(f"--lr-scaling: unknown rule {scaling!r} (choose linear or none)")
    if warmup > 0 and step < warmup:
        return lr + (target - lr) * (step + 1) / warmup
    return target


class SGD:
    """Heavy-ball momentum: ``v = mu v + g + wd w``; ``w -= lr v``."""

    def __init__(self, size, dtype, *, momentum=0.9, weight_decay=0.0):
        self.momentum = float(momentum)
        self.weight_decay = float(weight_decay)
        self.velocity = np.zeros(size, dtype=dtype)

    def direction(self, grad, params=None, velocity=None):
        """Update ``velocity`` (default: own) with ``grad`` in place and return it."""
        v = self.velocity if velocity is None else velocity
        v *= v.dtype.type(self.momentum)
        v += grad
        if self.weight_decay and params is not None:
            v += v.dtype.type(self.weight_decay) * params
        return v

    def step(self, params, grad, lr, velocity=None):
        """Apply one update to ``params`` in place."""
        v = self.direction(grad, params, velocity)
        params -= params.dtype.type(lr) * v

    def state(self):
        return {"velocity": self.velocity.copy()}

    def load(self, state):
        self.velocity[...] = state["velocity"]
