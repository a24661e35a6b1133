"""Compiled executor: a bound plan's whole step loop in one Numba call.

The Python executor pays interpreter time for every step (``Startall``, ``Waitall``, one
kernel call per op); for small messages that is most of the collective.  Here a plan is
encoded once as an int64 *program*, and each call runs it in machine code: MPI_Startall and
MPI_Waitall through the MPI library's C entry points on the plan's persistent requests, and
the copies and reductions as loops.  Nothing is allocated per call.

Program layout: a header ``[steps, request_bytes, requests, statuses, input, input_count,
scratch, scratch_count, opcode]`` (addresses of the request handles, the status array and
the input and scratch vectors, in kernel elements), then per step
``[requests, first_request, ops, early]`` and per op ``[kind, dst_buffer, dst_start, src_buffer,
src_start, left_buffer, left_start, count]`` (buffers 0 input, 1 output, 2 scratch).  The
kind is 0 for a copy and, for a reduce ``dst = left (op) src``, 1 when left is dst, 2 when
src is dst, else 3: each has its own loop, so no loop reads and writes the same array
(LLVM vectorises only loops whose arrays it can prove apart).  ``early`` steps start their
transfers before the previous step's ops run, so those ops overlap the wire (the executor
checked that they touch different memory).  The only other argument is the output vector,
so a call costs one short Numba dispatch; the caller keeps every addressed buffer alive.

Reductions follow :mod:`mlcomm.kernels.numba_backend` element for element (integers on
their unsigned view, NumPy's NaN rules for min/max), so results are bit-identical to the
Python executor's.  float16, bfloat16 and complex prod/min/max stay on the Python executor.
"""

from __future__ import annotations

import numpy as np

from .libmpi import library_path

__all__ = ["available", "supports", "OPCODES", "encode", "execute", "launcher"]

#: op name -> the program's op code (avg reduces as sum; the caller divides afterwards)
OPCODES = {"sum": 0, "avg": 0, "prod": 1, "min": 2, "max": 3,
           "band": 4, "bor": 5, "bxor": 6, "land": 7, "lor": 8}
_BUFFERS = {"input": 0, "output": 1, "scratch": 2}
_HEADER, _STEP, _OP = 9, 4, 8

try:
    import llvmlite.binding as _llvm
    from llvmlite import ir
    from numba import carray, njit, types
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


#: dtypes with loops here, reduced on their kernel view (see numba_backend.kernel_dtype)
_DTYPES = frozenset(np.dtype(t) for t in (
    np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
    np.float32, np.float64, np.complex64, np.complex128, np.bool_))


def supports(dtype: np.dtype, op: str) -> bool:
    """True when the compiled loop reduces ``dtype`` with ``op`` (complex: sum only)."""
    return dtype in _DTYPES and op in OPCODES and (dtype.kind != "c" or op in ("sum", "avg"))


def encode(steps: list, early: list, same, header: list, scale: int = 1) -> np.ndarray:
    """Encode a compiled plan's steps (``Plan.steps``) as a program.

    ``early[k]``: step k may start during step k-1's ops; ``same(r1, r2)``: two regions are
    the same memory; ``header``: the header after its step count; ``scale`` kernel elements
    make one plan element (2 for complex).
    """
    words = [len(steps), *header]
    first = 0
    for (sends, recvs, ops), start_early in zip(steps, early):
        n = len(sends) + len(recvs)
        words += [n, first, len(ops), int(start_early)]
        first += n
        for is_copy, dst, src, left in ops:
            (dbuf, dstart, dstop), (sbuf, sstart, _), (lbuf, lstart, _) = dst, src, left
            kind = 0 if is_copy else 1 if same(left, dst) else 2 if same(src, dst) else 3
            words += [kind, _BUFFERS[dbuf], dstart * scale,
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

    def _loops(scalar):
        """One op's reduction loops for kinds 1 (d = d op s), 2 (d = a op d), 3 (d = a op s).

        Views are indexed from 0, so LLVM drops Numba's negative-index checks and vectorises.
        """
        @njit
        def combine(kind, d, a, s):
            if kind == 1:
                for i in range(d.size):
                    d[i] = scalar(d[i], s[i])
            elif kind == 2:
                for i in range(d.size):
                    d[i] = scalar(a[i], d[i])
            else:
                for i in range(d.size):
                    d[i] = scalar(a[i], s[i])
        return combine

    # np.minimum/np.maximum bit for bit: a NaN first operand wins, then the second; ties
    # give the second (for integers these are plain min and max)
    _sum = _loops(njit(lambda x, y: x + y))
    _prod = _loops(njit(lambda x, y: x * y))
    _min = _loops(njit(lambda x, y: x if (x < y or x != x) else y))
    _max = _loops(njit(lambda x, y: x if (x > y or x != x) else y))
    _band = _loops(njit(lambda x, y: x & y))
    _bor = _loops(njit(lambda x, y: x | y))
    _bxor = _loops(njit(lambda x, y: x ^ y))
    _land = _loops(njit(lambda x, y: 1 if (x != 0 and y != 0) else 0))
    _lor = _loops(njit(lambda x, y: 1 if (x != 0 or y != 0) else 0))

    @njit
    def _arithmetic(opcode, kind, d, a, s):
        """Ops 0-3 (sum, prod, min, max), which every dtype here has."""
        if opcode == 0:
            _sum(kind, d, a, s)
        elif opcode == 1:
            _prod(kind, d, a, s)
        elif opcode == 2:
            _min(kind, d, a, s)
        else:
            _max(kind, d, a, s)

    def _combine(opcode, kind, d, a, s):
        """Reduce with op ``opcode`` (see OPCODES); the bitwise ops exist for integers only."""

    @overload(_combine)
    def _combine_impl(opcode, kind, d, a, s):
        if isinstance(d.dtype, types.Float):
            return lambda opcode, kind, d, a, s: _arithmetic(opcode, kind, d, a, s)

        def int_combine(opcode, kind, d, a, s):
            if opcode < 4:
                _arithmetic(opcode, kind, d, a, s)
            elif opcode == 4:
                _band(kind, d, a, s)
            elif opcode == 5:
                _bor(kind, d, a, s)
            elif opcode == 6:
                _bxor(kind, d, a, s)
            elif opcode == 7:
                _land(kind, d, a, s)
            else:
                _lor(kind, d, a, s)
        return int_combine

    @intrinsic
    def _pointer_like(typingctx, address, array):
        """``address`` as a pointer to ``array``'s element type."""
        pointer = types.CPointer(array.dtype)

        def codegen(context, builder, sig, args):
            return builder.inttoptr(args[0], context.get_value_type(pointer))
        return pointer(types.intp, array), codegen

    @njit
    def _pick(buf, inp, out, scratch):
        return inp if buf == 0 else (out if buf == 1 else scratch)

    @njit(cache=True, nogil=True)
    def execute(program, out):
        """Run ``program`` with output vector ``out``; return 0 or the first MPI error code."""
        request_bytes, base, statuses = program[1], program[2], program[3]
        inp = carray(_pointer_like(program[4], out), program[5])
        scratch = carray(_pointer_like(program[6], out), program[7])
        opcode = program[8]
        pc, started = _HEADER, False
        for step in range(program[0]):
            nreq, first, nops = program[pc], program[pc + 1], program[pc + 2]
            pc += _STEP
            if nreq:
                err = 0 if started else _startall(nreq, base + first * request_bytes)
                if err == 0:
                    err = _waitall(nreq, base + first * request_bytes, statuses)
                if err != 0:
                    return err
            nxt = pc + nops * _OP  # the next step's header
            started = step + 1 < program[0] and program[nxt + 3] == 1 and program[nxt] > 0
            if started:
                err = _startall(program[nxt], base + program[nxt + 1] * request_bytes)
                if err != 0:
                    return err
            for _ in range(nops):
                ds, ss, ls, n = program[pc + 2], program[pc + 4], program[pc + 6], program[pc + 7]
                d = (out if program[pc + 1] == 1 else scratch)[ds:ds + n]
                s = _pick(program[pc + 3], inp, out, scratch)[ss:ss + n]
                kind = program[pc]
                if kind == 0:
                    for i in range(n):
                        d[i] = s[i]
                else:
                    a = _pick(program[pc + 5], inp, out, scratch)[ls:ls + n]
                    _combine(opcode, kind, d, a, s)
                pc += _OP
        return 0


def launcher(program: np.ndarray, out: np.ndarray):
    """A no-argument callable running ``program`` on ``out``; it returns 0 or an MPI error code.

    It calls the compiled entry point for these two arrays' types directly, so a call skips
    Numba's per-call type dispatch (a third of the cost of an 8-byte all-reduce's Python side).
    """
    from functools import partial
    from numba import typeof
    return partial(execute.compile((typeof(program), typeof(out))), program, out)

