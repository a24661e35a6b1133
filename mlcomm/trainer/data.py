"""Data sets for the trainer: scikit-learn's digits and a synthetic problem."""

from __future__ import annotations

import functools
import importlib.util
import os
from dataclasses import dataclass

import numpy as np

__all__ = ["Dataset", "load_digits", "synthetic", "load", "batch_indices", "shard"]


@dataclass
class Dataset:
    """Train and held-out test arrays; labels are integer classes."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    n_classes: int

    @property
    def n_features(self) -> int:
        return self.x_train.shape[1]


def _split(x, y, test_fraction, seed):
    order = np.random.default_rng([seed, 17]).permutation(len(x))
    n_test = int(round(len(x) * test_fraction))
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


@functools.lru_cache(maxsize=1)
def _digits_arrays():
    """Read scikit-learn's bundled digits.csv.gz directly (importing sklearn takes seconds)."""
    spec = importlib.util.find_spec("sklearn")
    path = None
    if spec is not None and spec.submodule_search_locations:
        path = os.path.join(spec.submodule_search_locations[0], "datasets", "data", "digits.csv.gz")
    if path and os.path.exists(path):
        raw = np.loadtxt(path, delimiter=",")
        x, y = raw[:, :-1], raw[:, -1]
    else:
        from sklearn.datasets import load_digits as _load
        bunch = _load()
        x, y = bunch.data, bunch.target
    return x.astype(np.float64) / 16.0, y.astype(np.int64)


def load_digits(*, seed: int = 0, test_fraction: float = 0.25, dtype=np.float32) -> Dataset:
    """Return scikit-learn's bundled 8x8 digits (1797 images, offline), standardised."""
    x, y = _digits_arrays()
    x_tr, y_tr, x_te, y_te = _split(x, y, test_fraction, seed)
    mean, std = x_tr.mean(axis=0), x_tr.std(axis=0) + 1e-6
    x_tr, x_te = (x_tr - mean) / std, (x_te - mean) / std
    return Dataset("digits", x_tr.astype(dtype), y_tr, x_te.astype(dtype), y_te, 10)


def synthetic(*, n_features: int = 64, n_classes: int = 10, n_train: int = 8192,
              n_test: int = 2048, seed: int = 0, dtype=np.float32) -> Dataset:
    """Return a classification problem labelled by a random two-layer teacher."""
    rng = np.random.default_rng([seed, 23])
    n = n_train + n_test
    x = rng.standard_normal((n, n_features))
    hidden = max(16, min(4 * n_features, 256))
    w1 = rng.standard_normal((n_features, hidden)) / np.sqrt(n_features)
    w2 = rng.standard_normal((hidden, n_classes)) / np.sqrt(hidden)
    y = np.argmax(np.maximum(x @ w1, 0) @ w2, axis=1).astype(np.int64)
    x = x.astype(dtype)
    return Dataset("synthetic", x[:n_train], y[:n_train], x[n_train:], y[n_train:], n_classes)


def load(name: str, *, seed: int = 0, n_features: int = 64, dtype=np.float32) -> Dataset:
    """Return the data set called ``name`` ("digits" or "synthetic")."""
    if name == "digits":
        return load_digits(seed=seed, dtype=dtype)
    if name == "synthetic":
        # keep the synthetic matrix under ~64 MiB whatever the feature count
        n_train = int(max(256, min(8192, 16_000_000 // max(1, n_features))))
        return synthetic(n_features=n_features, n_train=n_train,
                         n_test=max(256, n_train // 4), seed=seed, dtype=dtype)
    raise ValueError(f"--data: unknown data set {name!r} (choose digits or synthetic)")


def batch_indices(n: int, batch: int, step: int, seed: int) -> np.ndarray:
    """Return the sample indices of global batch ``step`` (epoch-wise shuffles, stateless)."""
    start = step * batch
    out = np.empty(batch, dtype=np.int64)
    filled = 0
    while filled < batch:
        epoch, pos = divmod(start + filled, n)
        perm = np.random.default_rng([seed, 101, epoch]).permutation(n)
        take = min(batch - filled, n - pos)
        out[filled:filled + take] = perm[pos:pos + take]
        filled += take
    return out


def shard(indices: np.ndarray, index: int, parts: int) -> np.ndarray:
    """Return worker ``index``'s contiguous share of a global batch of ``parts`` workers."""
    bounds = np.linspace(0, len(indices), parts + 1).round().astype(int)
    return indices[bounds[index]:bounds[index + 1]]
