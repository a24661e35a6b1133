"""The MPI shared library that mpi4py loaded, for the few C entry points mlcomm calls itself."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from functools import lru_cache

__all__ = ["library_path", "library"]


def _loaded_paths() -> list:
    """Paths of MPI libraries mapped into this process (Linux), best first."""
    paths = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split()
                path = fields[-1] if len(fields) >= 6 else ""
                base = os.path.basename(path)
                if base.startswith(("libmpi.so", "libmpi_", "libmpich.so")) and path not in paths:
                    paths.append(path)
    except OSError:  # not Linux
        pass
    return sorted(paths, key=lambda p: "libmpi.so" not in p)


@lru_cache(maxsize=None)
def library_path():
    """The path of the MPI library in use (None when it cannot be found)."""
    paths = _loaded_paths()
    if not paths:
        paths = [found for found in map(ctypes.util.find_library, ("mpi", "mpich")) if found]
    for path in paths:
        try:
            ctypes.CDLL(path)
        except OSError:
            continue
        return path
    return None


def library():
    """The MPI library as a ctypes handle (None when it cannot be found)."""
    path = library_path()
    return None if path is None else ctypes.CDLL(path)
