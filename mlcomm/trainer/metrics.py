"""Per-step metrics written as CSV or JSON (chosen by the file's extension).

A row is one step of the logging rank.  Beside loss, accuracy and timings it
has the exchange columns: ``updates`` (parameter updates applied in the row),
``samples`` (samples in those updates), ``staleness_mean`` and
``staleness_max`` (over those updates; 0 for bsp and backup), ``dropped``
(gradients computed but not applied: backup's late ones, async's beyond
``--steps``), ``bytes_sent`` (every byte the logging rank moved between ranks, as its
Wire counted them) and that by path: ``bytes_messages``, ``bytes_window``,
``bytes_single_copy``.
"""

from __future__ import annotations

import csv
import json
import math
import os

from ..transport import PATHS

__all__ = ["BYTES", "COLUMNS", "write_metrics", "read_metrics"]

#: every byte moved between ranks, then by path (:data:`mlcomm.transport.PATHS`)
BYTES = ("bytes_sent", *(f"bytes_{path}" for path in PATHS))
COLUMNS = ("step", "wall_s", "loss", "test_accuracy", "samples_per_s", "compute_s",
           "comm_s", *BYTES, "lr", "mode", "updates", "samples", "staleness_mean",
           "staleness_max", "dropped")
_INTEGERS = ("step", *BYTES, "updates", "samples", "staleness_max", "dropped")


def write_metrics(path: str, rows: list[dict], meta: dict | None = None) -> None:
    """Write ``rows`` to ``path``: ``.json`` gives {"meta", "steps"}, anything else CSV."""
    path = os.fspath(path)
    if os.path.dirname(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    if path.endswith(".json"):
        clean = [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
                 for r in rows]
        with open(tmp, "w") as fh:
            json.dump({"meta": meta or {}, "steps": clean}, fh, indent=1)
    else:
        with open(tmp, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(COLUMNS), extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
    os.replace(tmp, path)


def read_metrics(path: str) -> list[dict]:
    """Read rows written by :func:`write_metrics` (numbers parsed back)."""
    path = os.fspath(path)
    if path.endswith(".json"):
        with open(path) as fh:
            return json.load(fh)["steps"]
    out = []
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            parsed = {}
            for k, v in row.items():
                try:
                    parsed[k] = int(v) if k in _INTEGERS else float(v)
                except ValueError:
                    parsed[k] = v
            out.append(parsed)
    return out
