"""Machine profile: the alpha-beta-gamma constants the cost model runs on.

``mlcomm calibrate`` measures them and writes a JSON profile to
:func:`default_path` (``$MLCOMM_PROFILE``, else
``$XDG_CACHE_HOME/mlcomm/profile.json``, else ``~/.cache/mlcomm/profile.json``).
Without a profile the built-in defaults below apply.  The JSON holds::

    {"version": 1, "alpha": s, "beta": s/byte, "gamma": s/byte,
     "gammas": {"<backend>": {"<dtype>": {"<op>": s/byte}}},
     "created": "...", "host": "...", "mpi": "...", "ranks": P,
     "pingpong": [[bytes, seconds], ...]}

``gamma`` is the time to reduce one byte of the destination (``dst = dst op
src``); ``gammas`` refines it per kernel backend, dtype and op.

``mlcomm tune`` adds measured choices, which ``auto`` takes over the model's
where they exist (as MPICH's tuning JSON and Open MPI's dynamic rules do)::

    "tuned": {"<P>": [[bytes, "algorithm"], ...]}
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from .. import config

__all__ = [
    "DEFAULT_ALPHA", "DEFAULT_BETA", "DEFAULT_GAMMA", "DEFAULT_STEP_OVERHEAD",
    "DEFAULT_OP_OVERHEAD",
    "Profile", "default_path", "load_profile", "save_profile",
]

#: Built-in defaults: 2 us latency, 12.5 GB/s links (100 Gb/s), 10 GB/s reduction.
DEFAULT_ALPHA = 2e-6
DEFAULT_BETA = 1 / 12.5e9
DEFAULT_GAMMA = 1 / 10e9

#: What the loop adds per schedule step (Startall/Waitall) and per local op,
#: measured on the 2-core development machine (see README, Performance).
DEFAULT_STEP_OVERHEAD = 2e-6
DEFAULT_OP_OVERHEAD = 0.7e-6

_VERSION = 1


@dataclass
class Profile:
    """Cost-model constants: latency ``alpha`` (s), ``beta`` (s/byte), ``gamma`` (s/byte)."""

    alpha: float = DEFAULT_ALPHA
    beta: float = DEFAULT_BETA
    gamma: float = DEFAULT_GAMMA
    gammas: dict = field(default_factory=dict)
    step_overhead: float = DEFAULT_STEP_OVERHEAD
    op_overhead: float = DEFAULT_OP_OVERHEAD
    tuned: dict = field(default_factory=dict)
    source: str = "built-in defaults"
    meta: dict = field(default_factory=dict)

    @property
    def calibrated(self) -> bool:
        """Whether alpha and beta were measured (``mlcomm calibrate``) or written by hand: a
        profile that ``mlcomm tune`` alone wrote holds the built-in defaults."""
        return (self.alpha, self.beta) != (DEFAULT_ALPHA, DEFAULT_BETA)

    @property
    def model_source(self) -> str:
        """Where alpha, beta and gamma come from: the profile's path or built-in defaults."""
        return self.source if self.calibrated else "built-in defaults"

    def tuned_choice(self, p: int, nbytes: int):
        """The measured fastest algorithm for ``p`` ranks at the tuned size nearest ``nbytes``
        (on a log scale), or None when ``p`` was not tuned."""
        table = self.tuned.get(str(p))
        if not table:
            return None
        size = lambda n: math.log2(max(n, 1))
        return min(table, key=lambda row: abs(size(row[0]) - size(nbytes)))[1]

    def gamma_for(self, dtype=None, op=None, backend=None) -> float:
        """Return gamma for one kernel; fall back to the fastest matching one, then ``gamma``."""
        if dtype is None and op is None and backend is None:
            return self.gamma
        dtype = None if dtype is None else _dtype_name(dtype)
        op = None if op is None else str(getattr(op, "name", op)).lower()
        tables = ([self.gammas[backend]] if backend in self.gammas
                  else list(self.gammas.values()))
        found = []
        for table in tables:
            for dt, ops in table.items():
                if dtype is not None and dt != dtype:
                    continue
                found.extend(v for o, v in ops.items() if op is None or o == op)
        return min(found) if found else self.gamma

    def to_json(self) -> dict:
        data = {"version": _VERSION, "alpha": self.alpha, "beta": self.beta,
                "gamma": self.gamma, "gammas": self.gammas,
                "step_overhead": self.step_overhead, "op_overhead": self.op_overhead,
                "tuned": self.tuned}
        data.update(self.meta)
        return data


def _dtype_name(dtype) -> str:
    try:
        import numpy as np
        return np.dtype(dtype).name
    except TypeError:
        return str(dtype)


def default_path() -> Path:
    """Return where the profile is read and written (``$MLCOMM_PROFILE`` first)."""
    env = config.profile_path()
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "mlcomm" / "profile.json"


_cache: dict = {}


def load_profile(path=None) -> Profile:
    """Read the profile at ``path`` (default :func:`default_path`); defaults when there is none.

    The result is cached per path and file modification time, so calling
    this on every plan is cheap.
    """
    path = Path(path) if path is not None else default_path()
    try:
        stamp = path.stat().st_mtime_ns
    except OSError:
        return Profile()
    key = (str(path), stamp)
    if key not in _cache:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        meta = {k: v for k, v in data.items()
                if k not in ("alpha", "beta", "gamma", "gammas", "version", "step_overhead",
                             "op_overhead", "tuned")}
        _cache.clear()
        _cache[key] = Profile(alpha=float(data.get("alpha", DEFAULT_ALPHA)),
                              beta=float(data.get("beta", DEFAULT_BETA)),
                              gamma=float(data.get("gamma", DEFAULT_GAMMA)),
                              gammas=data.get("gammas", {}) or {},
                              step_overhead=float(data.get("step_overhead",
                                                           DEFAULT_STEP_OVERHEAD)),
                              op_overhead=float(data.get("op_overhead", DEFAULT_OP_OVERHEAD)),
                              tuned=data.get("tuned", {}) or {}, source=str(path), meta=meta)
    return _cache[key]


def save_profile(profile: Profile, path=None) -> Path:
    """Write ``profile`` as JSON to ``path`` (default :func:`default_path`); return the path."""
    path = Path(path) if path is not None else default_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(profile.to_json(), fh, indent=1, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, path)
    return path

