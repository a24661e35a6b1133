"""Atomic checkpoints: one ``.npz`` written to a temporary file, then ``os.replace``.

:func:`load` reads one back or raises :class:`CheckpointError`, whose message
is one line naming the file, what is wrong with it and what to do.
"""

from __future__ import annotations

import json
import os

import numpy as np

__all__ = ["save", "load", "CheckpointError", "REMEDY", "META_KEYS"]

REMEDY = "delete it or pass another --checkpoint"
META_KEYS = ("step", "sync", "model", "sizes", "n_params", "ranks")
ARRAY_KEYS = ("params", "velocity")


class CheckpointError(ValueError):
    """A checkpoint that cannot be read, or that does not fit this run."""


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
    """Return ``(arrays, meta)`` from a checkpoint written by :func:`save`.

    Raises CheckpointError when the file is empty, not an ``.npz`` archive,
    truncated or corrupt, or lacks the metadata or arrays every checkpoint has.
    """
    path = os.fspath(path)
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise CheckpointError(f"checkpoint {path} cannot be read ({type(exc).__name__}: "
                              f"{exc.strerror or exc}); {REMEDY}") from None
    if not magic:
        raise CheckpointError(f"checkpoint {path} is empty; {REMEDY}")
    if magic != b"PK\x03\x04":
        raise CheckpointError(f"checkpoint {path} is not an .npz archive (it starts with "
                              f"{magic!r}); {REMEDY}")
    try:
        with np.load(path, allow_pickle=False) as npz:
            if "__meta__" not in npz.files:
                raise CheckpointError(f"checkpoint {path} has no __meta__ record, so mlcomm train "
                                      f"did not write it; {REMEDY}")
            meta = json.loads(str(npz["__meta__"]))
            arrays = {k: npz[k] for k in npz.files if k != "__meta__"}
    except CheckpointError:
        raise
    except Exception as exc:  # zipfile, zlib, numpy's format reader and json all raise their own
        raise CheckpointError(f"checkpoint {path} is truncated or corrupt ({type(exc).__name__}); "
                              f"{REMEDY}") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"checkpoint {path} has a __meta__ record that is not a JSON "
                              f"object; {REMEDY}")
    missing = [k for k in META_KEYS if k not in meta] + [k for k in ARRAY_KEYS if k not in arrays]
    if missing:
        raise CheckpointError(f"checkpoint {path} lacks {', '.join(missing)}; {REMEDY}")
    for k in ARRAY_KEYS:
        if arrays[k].shape != (meta["n_params"],):
            raise CheckpointError(f"checkpoint {path} holds {k} of shape {arrays[k].shape} but "
                                  f"its metadata says {meta['n_params']} parameters, so it is "
                                  f"corrupt; {REMEDY}")
    return arrays, meta
