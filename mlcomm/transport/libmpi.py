"""The MPI library that mpi4py loaded: its C entry points by address, and its file.

Symbols are looked up through the handle of mpi4py's own extension module, whose
dependencies include the MPI library it was linked or loaded against, so mlcomm's compiled
code always calls the same MPI as mpi4py, never another one that happens to be installed.
"""

from __future__ import annotations

import ctypes
from functools import lru_cache

__all__ = ["MPILibraryError", "library", "symbol", "library_path", "describe"]


class MPILibraryError(RuntimeError):
    """The MPI library's C entry points cannot be reached from this process."""


@lru_cache(maxsize=None)
def _handle():
    from mpi4py import MPI
    try:
        return ctypes.CDLL(MPI.__file__)
    except OSError as exc:
        raise MPILibraryError(f"cannot open mpi4py's extension module {MPI.__file__}: {exc}; "
                              f"set MLCOMM_EXECUTOR=python to run without the compiled "
                              f"loop") from None


def library():
    """A ctypes handle whose attributes are the MPI library's functions (None if unreachable)."""
    try:
        return _handle()
    except MPILibraryError:
        return None


@lru_cache(maxsize=None)
def symbol(name: str) -> int:
    """The address of the C function ``name`` in the MPI library mpi4py uses."""
    try:
        fn = getattr(_handle(), name)
    except AttributeError:
        raise MPILibraryError(f"{name} is not exported by the MPI library that mpi4py loaded "
                              f"({library_path() or 'unknown file'}); set MLCOMM_EXECUTOR=python "
                              f"to run without the compiled loop") from None
    return ctypes.cast(fn, ctypes.c_void_p).value


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


@lru_cache(maxsize=None)
def library_path():
    """The file of the MPI library mpi4py loaded, from ``dladdr`` on ``MPI_Init`` (None when
    the platform cannot say)."""
    try:
        address = symbol("MPI_Init")
        dladdr = ctypes.CDLL(None).dladdr
    except (MPILibraryError, AttributeError, OSError):
        return None
    info = _DlInfo()
    if not dladdr(ctypes.c_void_p(address), ctypes.byref(info)) or not info.dli_fname:
        return None
    return info.dli_fname.decode()


def describe() -> str:
    """One line for ``mlcomm info``: the library file, or why it is unknown."""
    try:
        symbol("MPI_Startall")
    except MPILibraryError as exc:
        return f"unreachable: {exc}"
    return library_path() or "linked into mpi4py (file unknown)"
