"""Per-step metrics written as CSV or JSON (chosen by the file's extension)."""

from __future__ import annotations

import csv
import json
import math
import os

__all__ = ["COLUMNS", "write_metrics", "read_metrics"]

COLUMNS = ("step", "wall_s", "loss", "test_accuracy", "samples_per_s", "compute_s",
           "comm_s", "bytes_sent", "lr", "mode")


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
                    parsed[k] = int(v) if k in ("step", "bytes_sent") else float(v)
                except ValueError:
                    parsed[k] = v
            out.append(parsed)
    return out
