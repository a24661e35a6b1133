"""Elementwise reduction kernels (NumPy, Numba CPU, Numba CUDA, CuPy) for mlcomm.

:data:`OP_TABLE` holds every fact about each reduction op (see :mod:`.ops`);
``reduce_into(dst, src, op)`` sets ``dst = dst (op) src`` in place with the backend chosen from
the array type; ``finalize`` turns a sum into an average; ``check_op`` rejects combinations that
make no sense before any message is sent.
"""

from .dispatch import (BACKENDS, NUMBA_MIN_BYTES, NUMBA_MIN_BYTES_HALF, backends, finalize,
                       kernel_for, reduce_into, select_backend)
from .ops import (BFLOAT16, DTYPES, OP_BY_CODE, OP_TABLE, OPS, Op, check_op, dtype_kind,
                  is_supported, kernel_view, normalize_op, op_code, op_info, supported_dtypes)

__all__ = ["OP_TABLE", "OP_BY_CODE", "Op", "OPS", "DTYPES", "BFLOAT16", "BACKENDS",
           "NUMBA_MIN_BYTES", "NUMBA_MIN_BYTES_HALF", "op_code", "op_info", "check_op",
           "is_supported", "normalize_op", "dtype_kind", "kernel_view", "supported_dtypes",
           "reduce_into", "kernel_for", "finalize", "select_backend", "backends"]
