"""Numba's ``njit`` for the event loop; without Numba the same code runs as Python."""

try:
    from numba import njit
except ImportError:  # pragma: no cover - numba is a dependency
    def njit(*args, **kwargs):
        return args[0] if args and callable(args[0]) else (lambda f: f)

__all__ = ["njit"]
