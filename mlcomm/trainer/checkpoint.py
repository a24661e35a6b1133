"""Atomic checkpoints: one ``.npz`` written to a temporary file, then ``os.replace``."""

from __future__ import annotations

import json
import os

import numpy as np

__all__ = ["save", "load"]


def save(path: str, arrays: dict, meta: dict) -> None:
    """Write ``arrays`` plus JSON ``meta`` to ``path`` atomically (tmp file, fsync, os.replace)."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as fh:
        np.savez(fh, __meta__=np.array(json.dumps(meta)), **arrays)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def load(path: str) -> tuple[dict, dict]:
    """Return ``(arrays, meta)`` from a checkpoint written by :func:`save`."""
    with np.load(os.fspath(path), allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files if k != "__meta__"}
        meta = json.loads(str(npz["__meta__"]))
    return arrays, meta
