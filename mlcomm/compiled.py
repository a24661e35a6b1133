"""Compiled executor: a bound plan's whole step loop in one Numba call.

The Python executor pays interpreter time for every step (``Startall``, ``Waitall``, one
kernel call per op); for small messages that is most of the collective.  Here a plan is
encoded once as an int64 *program*, and each call runs it in machine code: MPI_Startall and
MPI_Waitall through the MPI library's C entry points on the plan's persistent requests, and
the copies and reductions as loops.  Nothing is allocated per call.

Program layout: ``[steps, request_bytes, status_bytes]`` then per step
``[requests, first_request, ops, early]`` and per op ``[kind, dst_buffer, dst_start, src_buffer,
src_start, left_buffer, left_start, count]`` (kind 0 copy, 1 reduce ``dst = left (op) src``;
buffers 0 input, 1 output, 2 scratch).  ``early`` steps start their transfers before
the previous step's ops run, so those ops overlap the wire (the executor checked that
they touch different memory).

Reductions follow :mod:`mlcomm.kernels.numba_backend` element for element (integers on
their unsigned view, NumPy's NaN rules for min/max), so results are bit-identical to the
Python executor's.  float16, bfloat16 and complex prod/min/max stay on the Python executor.
"""

from __future__ import annotations

import numpy as np

from .libmpi import library_path

__all__ = ["available", "supports", "OPCODES", "encode", "execute"]

#: op name -> the program's op code (avg reduces as sum; the caller divides afterwards)
OPCODES = {"sum": 0, "avg": 0, "prod": 1, "min": 2, "max": 3,
           "band": 4, "bor": 5, "bxor": 6, "land": 7, "lor": 8}
_BUFFERS = {"input": 0, "output": 1, "scratch": 2}
_HEADER, _STEP, _OP = 3, 4, 8

try:
    import llvmlite.binding as _llvm
    from llvmlite import ir
    from numba import njit, types
    from numba.core import cgutils
    from numba.extending import intrinsic, overload
except ImportError:  # pragma: no cover - numba is a hard dependency
    njit = None

_ready = None


def available() -> bool:
    """True when Numba is there and the MPI library's C entry points can be linked."""
    global _ready
    if _ready is None:
        path = library_path() if njit is not None else None
        if path is not None:
            _llvm.load_library_permanently(path)
        _ready = path is not None
    return _ready


_KINDS = frozenset("iufb")


def supports(dtype: np.dtype, op: str) -> bool:
    """True when the compiled loop reduces ``dtype`` with ``op`` (on its kernel view)."""
    from .kernels.numba_backend import kernel_dtype
    kdt = kernel_dtype(dtype, op)
    return kdt.kind in _KINDS and kdt.itemsize >= (4 if kdt.kind == "f" else 1) \
        and op in OPCODES


def encode(steps: list, early: list, request_bytes: int, status_bytes: int,
           scale: int = 1) -> np.ndarray:
    """Encode a compiled plan's steps (``Plan.steps``) as a program.

    ``scale`` kernel elements make one plan element (2 for complex on its real view).
    """
    words = [len(steps), request_bytes, status_bytes]
    first = 0
    for (sends, recvs, ops), start_early in zip(steps, early):
        n = len(sends) + len(recvs)
        words += [n, first, len(ops), int(start_early)]
        first += n
        for is_copy, (dbuf, dstart, dstop), (sbuf, sstart, _), (lbuf, lstart, _) in ops:
            words += [0 if is_copy else 1, _BUFFERS[dbuf], dstart * scale,
                      _BUFFERS[sbuf], sstart * scale, _BUFFERS[lbuf], lstart * scale,
                      (dstop - dstart) * scale]
    return np.array(words, dtype=np.int64)


if njit is not None:
    def _mpi_call(name, nargs):
        """An intrinsic calling ``int name(int count, void *p1[, void *p2])`` in the MPI library."""
        i8p = ir.IntType(8).as_pointer()
        fnty = ir.FunctionType(ir.IntType(32), [ir.IntType(32)] + [i8p] * nargs)

        def codegen(context, builder, sig, args):
            fn = cgutils.get_or_insert_function(builder.module, fnty, name)
            argv = [builder.trunc(args[0], ir.IntType(32))]
            argv += [builder.inttoptr(a, i8p) for a in args[1:]]
            return builder.sext(builder.call(fn, argv), ir.IntType(64))
        return codegen

    @intrinsic
    def _startall(typingctx, count, requests):
        return types.int64(types.intp, types.intp), _mpi_call("MPI_Startall", 1)

    @intrinsic
    def _waitall(typingctx, count, requests, statuses):
        return types.int64(types.intp, types.intp, types.intp), _mpi_call("MPI_Waitall", 2)

    def _combine(opcode, d, ds, a, as_, b, bs, n):
        """``d[ds:ds+n] = a[as_:as_+n] (op) b[bs:bs+n]``; typed per element kind below."""

    @overload(_combine)
    def _combine_impl(opcode, d, ds, a, as_, b, bs, n):
        if isinstance(d.dtype, types.Float):
            def float_combine(opcode, d, ds, a, as_, b, bs, n):
                if opcode == 0:
                    for i in range(n):
                        d[ds + i] = a[as_ + i] + b[bs + i]
                elif opcode == 1:
                    for i in range(n):
                        d[ds + i] = a[as_ + i] * b[bs + i]
                elif opcode == 2:  # np.minimum bit for bit: NaN in a wins, then b; ties give b
                    for i in range(n):
                        x, y = a[as_ + i], b[bs + i]
                        d[ds + i] = x if (x < y or x != x) else y
                else:
                    for i in range(n):
                        x, y = a[as_ + i], b[bs + i]
                        d[ds + i] = x if (x > y or x != x) else y
            return float_combine

        def int_combine(opcode, d, ds, a, as_, b, bs, n):
            if opcode == 0:
                for i in range(n):
                    d[ds + i] = a[as_ + i] + b[bs + i]
            elif opcode == 1:
                for i in range(n):
                    d[ds + i] = a[as_ + i] * b[bs + i]
            elif opcode == 2:
                for i in range(n):
                    d[ds + i] = min(a[as_ + i], b[bs + i])
            elif opcode == 3:
                for i in range(n):
                    d[ds + i] = max(a[as_ + i], b[bs + i])
            elif opcode == 4:
                for i in range(n):
                    d[ds + i] = a[as_ + i] & b[bs + i]
            elif opcode == 5:
                for i in range(n):
                    d[ds + i] = a[as_ + i] | b[bs + i]
            elif opcode == 6:
                for i in range(n):
                    d[ds + i] = a[as_ + i] ^ b[bs + i]
            elif opcode == 7:
                for i in range(n):
                    d[ds + i] = 1 if (a[as_ + i] != 0 and b[bs + i] != 0) else 0
            else:
                for i in range(n):
                    d[ds + i] = 1 if (a[as_ + i] != 0 or b[bs + i] != 0) else 0
        return int_combine

    @njit
    def _pick(buf, inp, out, scratch):
        return inp if buf == 0 else (out if buf == 1 else scratch)

    @njit(cache=True, nogil=True)
    def execute(program, requests, statuses, inp, out, scratch, opcode):
        """Run ``program``; return 0 or the first MPI error code."""
        request_bytes, base = program[1], requests.ctypes.data
        pc, started = _HEADER, False
        for step in range(program[0]):
            nreq, first, nops = program[pc], program[pc + 1], program[pc + 2]
            pc += _STEP
            if nreq:
                err = 0 if started else _startall(nreq, base + first * request_bytes)
                if err == 0:
                    err = _waitall(nreq, base + first * request_bytes, statuses.ctypes.data)
                if err != 0:
                    return err
            nxt = pc + nops * _OP  # the next step's header
            started = step + 1 < program[0] and program[nxt + 3] == 1 and program[nxt] > 0
            if started:
                err = _startall(program[nxt], base + program[nxt + 1] * request_bytes)
                if err != 0:
                    return err
            for _ in range(nops):
                d = out if program[pc + 1] == 1 else scratch
                ds, n = program[pc + 2], program[pc + 7]
                s = _pick(program[pc + 3], inp, out, scratch)
                ss = program[pc + 4]
                if program[pc] == 0:
                    for i in range(n):
                        d[ds + i] = s[ss + i]
                else:
                    left = _pick(program[pc + 5], inp, out, scratch)
                    _combine(opcode, d, ds, left, program[pc + 6], s, ss, n)
                pc += _OP
        return 0
