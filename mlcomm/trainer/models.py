"""Softmax regression and a small MLP in NumPy with hand-written backprop.

All parameters live in one flat vector; each layer's weight and bias are
views into it, so a flat gradient vector is already one fused bucket.
"""

from __future__ import annotations

import numpy as np

__all__ = ["MLP", "build_model", "hidden_for_params"]


class MLP:
    """A ReLU MLP with layer sizes ``sizes`` ([d, c] is softmax regression)."""

    def __init__(self, sizes, dtype=np.float32):
        self.sizes = [int(s) for s in sizes]
        if len(self.sizes) < 2 or min(self.sizes) < 1:
            raise ValueError(f"bad layer sizes {self.sizes}")
        self.dtype = np.dtype(dtype)
        self.shapes = []          # (weight shape, bias shape) per layer
        self.tensors = []         # (offset, count, name) of every tensor, in memory order
        offset = 0
        for i, (a, b) in enumerate(zip(self.sizes[:-1], self.sizes[1:])):
            self.shapes.append(((a, b), (b,)))
            self.tensors.append((offset, a * b, f"W{i}"))
            offset += a * b
            self.tensors.append((offset, b, f"b{i}"))
            offset += b
        self.size = offset

    @property
    def name(self) -> str:
        return "softmax" if len(self.sizes) == 2 else f"mlp{len(self.sizes) - 2}"

    def init(self, seed: int) -> np.ndarray:
        """Return freshly initialised flat parameters (He-scaled normal weights, zero biases)."""
        rng = np.random.default_rng([seed, 7])
        flat = np.zeros(self.size, dtype=self.dtype)
        for (w_shape, _), (off, count, _) in zip(self.shapes, self.tensors[::2]):
            scale = np.sqrt(2.0 / w_shape[0]) if len(self.sizes) > 2 else 0.01
            flat[off:off + count] = rng.standard_normal(count) * scale
        return flat

    def _views(self, flat):
        out = []
        for (w_shape, b_shape), i in zip(self.shapes, range(0, len(self.tensors), 2)):
            w_off, w_cnt, _ = self.tensors[i]
            b_off, b_cnt, _ = self.tensors[i + 1]
            out.append((flat[w_off:w_off + w_cnt].reshape(w_shape),
                        flat[b_off:b_off + b_cnt]))
        return out

    def forward(self, flat, x):
        """Return the logits and the per-layer activations."""
        acts = [x]
        h = x
        layers = self._views(flat)
        for i, (w, b) in enumerate(layers):
            h = h @ w + b
            if i < len(layers) - 1:
                h = np.maximum(h, 0)
            acts.append(h)
        return h, acts

    def loss_and_grad(self, flat, x, y, grad, scale=1.0):
        """Write ``scale`` * d(sum of cross-entropies)/d(params) into ``grad``; return the loss sum."""
        logits, acts = self.forward(flat, x)
        z = logits - logits.max(axis=1, keepdims=True)
        ez = np.exp(z)
        sums = ez.sum(axis=1, keepdims=True)
        rows = np.arange(len(y))
        loss = float(np.sum(np.log(sums[:, 0]) - z[rows, y]))
        delta = ez / sums
        delta[rows, y] -= 1
        delta *= scale
        delta = delta.astype(self.dtype, copy=False)
        layers = self._views(flat)
        glayers = self._views(grad)
        for i in range(len(layers) - 1, -1, -1):
            gw, gb = glayers[i]
            np.matmul(acts[i].T, delta, out=gw)
            np.sum(delta, axis=0, out=gb)
            if i:
                delta = delta @ layers[i][0].T
                delta *= acts[i] > 0
        return loss

    def predict(self, flat, x, batch=4096):
        """Return the predicted classes of ``x``."""
        return np.concatenate([self.forward(flat, x[i:i + batch])[0].argmax(axis=1)
                               for i in range(0, max(1, len(x)), batch)]) if len(x) else np.zeros(0, int)

    def accuracy(self, flat, x, y) -> float:
        """Return the fraction of ``x`` classified as ``y``."""
        return float(np.mean(self.predict(flat, x) == y)) if len(y) else float("nan")


def hidden_for_params(n_params: int, n_in: int, n_out: int, layers: int) -> int:
    """Return the hidden width giving about ``n_params`` parameters."""
    if layers == 1:
        return max(1, round((n_params - n_out) / (n_in + 1 + n_out)))
    # two equal hidden layers: h^2 + h (n_in + 2 + n_out) + n_out = n_params
    b = n_in + 2 + n_out
    return max(1, int((-b + np.sqrt(b * b + 4 * max(0, n_params - n_out))) / 2))


def build_model(kind: str, n_in: int, n_out: int, *, hidden=(128,), dtype=np.float32) -> MLP:
    """Return ``softmax``, ``mlp1`` or ``mlp2`` (``mlp`` means one hidden layer)."""
    if kind == "softmax":
        return MLP([n_in, n_out], dtype)
    if kind in ("mlp", "mlp1"):
        return MLP([n_in, hidden[0], n_out], dtype)
    if kind == "mlp2":
        h = list(hidden) if len(hidden) >= 2 else [hidden[0], hidden[0]]
        return MLP([n_in, h[0], h[1], n_out], dtype)
    raise ValueError(f"--model: unknown model {kind!r} (choose softmax, mlp1 or mlp2)")
