"""Numba's disk cache serves a second process: the transports' compiled calls and the
kernels are found there, not compiled again and stored beside the first process's."""

import os
import subprocess
import sys
from pathlib import Path

COMPILE = """
import numpy as np
from mlcomm.kernels import reduce_into
from mlcomm.transport import compile_calls, mpi, peer, window
for module in (mpi, window, peer):
    compile_calls(module._define)
a, b = np.ones(1 << 20, np.float32), np.ones(1 << 20, np.float32)
reduce_into(a, b, "sum", backend="numba")
assert a[0] == 2
"""


def _cached(cache: Path) -> set:
    return {p.relative_to(cache) for p in cache.rglob("*") if p.suffix in (".nbi", ".nbc")}


def test_a_second_process_adds_nothing_to_the_compile_cache(tmp_path):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    subprocess.run([sys.executable, "-c", COMPILE], env=env, check=True, timeout=300)
    first = _cached(tmp_path)
    assert any("transport" in str(p) or "_define" in str(p) for p in first), first
    subprocess.run([sys.executable, "-c", COMPILE], env=env, check=True, timeout=300)
    assert _cached(tmp_path) == first
