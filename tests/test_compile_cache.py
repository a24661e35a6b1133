"""Numba's disk cache serves a second process: the transports' compiled calls and the
kernels are found there, not compiled again and stored beside the first process's."""

import os
import subprocess
import sys
from pathlib import Path

COMPILE = """
import numpy as np
from mlcomm.kernels import reduce_into
from mlcomm.transport.registry import load_compiled
load_compiled()
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
    assert any("transport" in str(p) or "define" in str(p) for p in first), first
    subprocess.run([sys.executable, "-c", COMPILE], env=env, check=True, timeout=300)
    assert _cached(tmp_path) == first


ENTRY = """
import numpy as np
from numba import typeof
from mlcomm.runtime import hostloop
hostloop._entry_point(typeof(np.int16(0)), 3)
stats = hostloop.run_at.stats
print("entry", sum(stats.cache_hits.values()), sum(stats.cache_misses.values()))
"""


def test_processes_that_find_an_entry_point_missing_compile_it_once(tmp_path):
    """Three processes started together on an empty cache ask for the same entry point of
    the compiled loop: one compiles it, and the two others, waiting on the compile lock,
    load what it saved."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", ENTRY], env=env, stdout=subprocess.PIPE,
                              text=True) for _ in range(3)]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    loads = sorted(tuple(int(n) for n in out.split("entry")[1].split()) for out in outs)
    assert loads == [(0, 1), (1, 0), (1, 0)], outs
