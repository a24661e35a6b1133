"""Elementwise reduction kernels (NumPy, Numba CPU, Numba CUDA, CuPy) for mlcomm.

``reduce_into(dst, src, op)`` sets ``dst = dst (op) src`` in place with the backend chosen from
the array type; ``finalize`` turns a sum into an average; ``check_op`` rejects combinations that
make no sense before any message is sent.
"""

from .dispatch import (BACKENDS, NUMBA_MIN_BYTES, NUMBA_MIN_BYTES_HALF, backends, finalize,
                       kernel_for, reduce_into, select_backend)
from .ops import (BFLOAT16, DTYPES, OPS, check_op, dtype_kind, is_supported, normalize_op,
                  supported_dtypes)

__all__ = ["OPS", "DTYPES", "BFLOAT16", "BACKENDS", "NUMBA_MIN_BYTES", "NUMBA_MIN_BYTES_HALF",
           "check_op", "is_supported", "normalize_op", "dtype_kind", "supported_dtypes",
           "reduce_into", "kernel_for", "finalize", "select_backend", "backends"]
