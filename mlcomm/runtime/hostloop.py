"""The compiled host loop: a bound program's whole run in one Numba call, without the GIL.

See :mod:`mlcomm.runtime.loop` for what it does and the frame it reads. The loop is compiled once
per kernel element type and op (the op is a compile-time constant, so each compilation
holds only that op's loops) and cached on disk by Numba. Reductions call
:func:`mlcomm.kernels.numba_backend.scalar`, the kernels' own per-element op.
"""

from __future__ import annotations

import fcntl
import os
import warnings
from contextlib import contextmanager
from functools import lru_cache, partial

import numpy as np
from numba import carray, njit, typeof, types
from numba.core.errors import NumbaIRAssumptionWarning
from numba.extending import intrinsic, overload

from ..transport.cabi import call0_f64, call3, ccall0, ccall1, i64_array_at
from ..kernels.numba_backend import scalar
from .frame import (DONE, F_BUFFERS, F_CODE, F_ITEM, F_NCODE, F_NWORDS, F_OTHER, F_PC,
                    F_SLEEP, F_SLEEP_AFTER_NS, F_SLEEPERS, F_STALL_NS, F_TRANSPORT, F_TRANSPORTS,
                    F_TURN, F_WAITED_NS, F_WTIME, F_YIELD, F_YIELD_MASK, FAULTED, MESSAGE_SLEEP_FACTOR,
                    SLEEP_US, SPIN_NS, STALLED, op_names)
from ..ir.program import COPY, REDUCE, REDUCE2, REDUCE3, START, WAIT, WIDTH

__all__ = ["entry"]

_NAMES = op_names()

#: the frame and instruction layout this loop reads. Numba's disk cache is keyed by this
#: file alone, so a change to those constants elsewhere must change this line too (it is
#: checked below) or stale machine code would read the wrong words.
LAYOUT = ("F_CODE=0 F_NCODE=1 F_ITEM=3 F_PC=4 F_STALL_NS=5 F_YIELD_MASK=6 F_WTIME=7 "
          "F_YIELD=8 F_TRANSPORT=9 F_TURN=10 F_OTHER=11 F_NWORDS=12 F_SLEEP=13 "
          "F_SLEEP_AFTER_NS=14 F_SLEEPERS=15 F_WAITED_NS=16 F_TRANSPORTS=17 F_BUFFERS=41 WIDTH=8 START=1 "
          "WAIT=2 COPY=3 REDUCE=4 REDUCE2=5 REDUCE3=6 DONE=0 STALLED=1 FAULTED=2 "
          "SPIN_NS=50000 SLEEP_US=20 MESSAGE_SLEEP_FACTOR=10")


def _layout() -> str:
    names = LAYOUT.split()
    values = dict(globals())
    return " ".join(f"{n.split('=')[0]}={values[n.split('=')[0]]}" for n in names)


if _layout() != LAYOUT:  # pragma: no cover - a developer changed a constant
    raise ImportError(f"mlcomm.runtime.hostloop.LAYOUT is {LAYOUT!r} but the constants are "
                      f"{_layout()!r}: update LAYOUT (that also renews Numba's cache)")


@intrinsic
def _pointer_like(typingctx, address, like):
    """``address`` as a pointer to the type of ``like`` (a scalar)."""
    pointer = types.CPointer(like)

    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], context.get_value_type(pointer))
    return pointer(types.intp, like), codegen


def _combine(op, kind, d, a, s):
    """``d = d (op) s``, ``d = a (op) d`` or ``d = a (op) s`` by ``kind``; ``op`` is a
    compile-time loop op code (see :func:`mlcomm.runtime.loop.op_code`)."""


@overload(_combine)
def _combine_impl(op, kind, d, a, s):
    if not isinstance(op, types.IntegerLiteral):
        return None
    name = _NAMES[op.literal_value]

    def combine(op, kind, d, a, s):
        if kind == REDUCE:
            for i in range(d.size):
                d[i] = scalar(name, d[i], s[i])
        elif kind == REDUCE2:
            for i in range(d.size):
                d[i] = scalar(name, a[i], d[i])
        else:
            for i in range(d.size):
                d[i] = scalar(name, a[i], s[i])
    return combine


@njit(inline="always")
def _view(frame, like, buf, offset, nbytes):
    item = frame[F_ITEM]
    whole = carray(_pointer_like(frame[F_BUFFERS + 2 * buf], like),
                   frame[F_BUFFERS + 2 * buf + 1] // item)
    return whole[offset // item:(offset + nbytes) // item]


@njit(nogil=True, cache=True)
def execute(frame, like, op):
    """Run the frame's program from ``frame[F_PC]``; return DONE, STALLED or FAULTED."""
    code = carray(i64_array_at(frame[F_CODE]), frame[F_NCODE] * WIDTH)
    pc = frame[F_PC]
    frame[F_PC] = 0
    while pc < frame[F_NCODE]:
        i = pc * WIDTH
        kind = code[i]
        if kind == START:
            t = F_TRANSPORTS + 3 * code[i + 1]
            if call3(frame[t + 1], frame[t], code[i + 2], code[i + 3]) != 0:
                frame[F_TRANSPORT] = code[i + 1]
                return FAULTED
        elif kind == WAIT:
            t = F_TRANSPORTS + 3 * code[i + 1]
            spins = 0
            since = 0.0
            waited = frame[F_WAITED_NS]  # before this run's part of the wait (a stall's)
            frame[F_WAITED_NS] = 0
            mask = frame[F_YIELD_MASK]
            sleep_after = frame[F_SLEEP_AFTER_NS] if (frame[F_SLEEPERS] >> code[i + 1]) & 1 \
                else frame[F_SLEEP_AFTER_NS] * MESSAGE_SLEEP_FACTOR
            while True:
                r = call3(frame[t + 2], frame[t], code[i + 2], code[i + 3])
                if r == 1:
                    break
                if r != 0:
                    frame[F_TRANSPORT] = code[i + 1]
                    return FAULTED
                spins += 1
                if (spins & mask) == 0:
                    now = call0_f64(frame[F_WTIME])
                    if since == 0.0:
                        since = now
                    total = (now - since) * 1e9 + waited
                    if total > SPIN_NS:
                        mask = 0  # a long wait: yield on every poll
                        if frame[F_STALL_NS] > 0 and (now - since) * 1e9 > frame[F_STALL_NS]:
                            frame[F_PC] = pc
                            frame[F_WAITED_NS] = int(total)
                            return STALLED
                    if 0 < sleep_after < total:
                        ccall1(frame[F_SLEEP], SLEEP_US)
                    else:
                        ccall0(frame[F_YIELD])
        else:
            d = _view(frame, like, code[i + 1], code[i + 2], code[i + 7])
            s = _view(frame, like, code[i + 3], code[i + 4], code[i + 7])
            if kind == COPY:
                for j in range(d.size):
                    d[j] = s[j]
            elif kind == REDUCE3:
                _combine(op, kind, d, _view(frame, like, code[i + 5], code[i + 6], code[i + 7]),
                         s)
            else:
                _combine(op, kind, d, s, s)
        pc += 1
    return DONE


@njit(nogil=True, cache=True)
def run_at(address, like, op):
    """Run the frame at ``address`` (or the other turn's, see :mod:`mlcomm.runtime.frame`); flip
    the turn when the run completes."""
    turn_at = carray(i64_array_at(address), F_BUFFERS)[F_TURN]
    if turn_at != 0 and carray(i64_array_at(turn_at), 1)[0] != 0:
        address = carray(i64_array_at(address), F_BUFFERS)[F_OTHER]
    frame = carray(i64_array_at(address), carray(i64_array_at(address), F_BUFFERS)[F_NWORDS])
    code = execute(frame, like, op)
    if code == DONE and turn_at != 0:
        turn = carray(i64_array_at(turn_at), 1)
        turn[0] ^= 1
    return code


@contextmanager
def _one_compiler():
    """An exclusive lock on a file beside Numba's disk cache of this module, held while an
    entry point is compiled or loaded: the ranks of a node that find one missing from the
    cache compile it one at a time, and each after the first loads what the first saved.
    Without it every rank compiled every entry point at once (``mpiexec -n 8 mlcomm verify``
    on 2 cores after an upgrade: 294 s in compiles, against 6 s in the same calls warm).
    Where the lock file cannot be made, each rank compiles on its own."""
    try:
        fd = os.open(os.path.join(run_at._cache._cache_path, "mlcomm-compile.lock"),
                     os.O_RDWR | os.O_CREAT, 0o666)
    except (AttributeError, OSError):
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


@lru_cache(maxsize=None)
def _entry_point(like_type, op):
    with warnings.catch_warnings(), _one_compiler():
        # Numba's pedantic IR check flags the inlined scalar ops' branches; they are correct
        # (every loop is checked bit for bit against the kernels by the test suite)
        warnings.simplefilter("ignore", NumbaIRAssumptionWarning)
        return run_at.compile((types.int64, like_type, types.literal(op)))


def entry(frame, kernel_dtype: np.dtype, op: int):
    """A no-argument call running ``frame`` (a :class:`mlcomm.runtime.frame.Frame`, which the call
    keeps alive); it calls the entry point compiled for this element type and op directly,
    skipping Numba's per-call type dispatch. Its arguments are two scalars, the cheapest a
    compiled function unboxes."""
    like = kernel_dtype.type(0)
    call = partial(_entry_point(typeof(like), op), frame.address, like, op)
    call.frame = frame
    return call
