"""Numba intrinsics that call C functions by address, and read memory by address.

The compiled loop calls its transports, and the MPI transport calls the MPI library, through
function addresses held in int64 arrays (frames and contexts), so compiled code names no
external symbol and links against nothing: the addresses come from :mod:`mlcomm.transport.libmpi`,
from libc and from Numba ``cfunc``s. Integer arguments pass as 64-bit words: on the
x86-64 and AArch64 C ABIs a callee taking ``int`` reads the low half of the register.
"""

from __future__ import annotations

import ctypes
from functools import lru_cache

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

__all__ = ["call0", "call3", "call6", "ccall0", "ccall2", "ccall3", "ccall4", "ccall5", "ccall6",
           "ccall7", "ccall8", "ccall9", "ccall10", "call0_f64", "load_acquire", "store_release", "i64_array_at",
           "libc_address"]

_I32, _I64, _F64 = ir.IntType(32), ir.IntType(64), ir.DoubleType()


def _codegen(result, nargs):
    """Lower ``fn(a1 .. an)``: ``fn`` is the first argument, an address. A C ``int`` result
    (``_I32``) is sign-extended to 64 bits."""
    def codegen(context, builder, sig, args):
        fnty = ir.FunctionType(result, [_I64] * nargs)
        value = builder.call(builder.inttoptr(args[0], fnty.as_pointer()), list(args[1:]))
        return builder.sext(value, _I64) if result is _I32 else value
    return codegen


_W = types.int64


@intrinsic
def call0(typingctx, fn):
    """``fn()`` returning a 64-bit integer (or a pointer)."""
    return _W(_W), _codegen(_I64, 0)


@intrinsic
def call6(typingctx, fn, a, b, c, d, e, f):
    """``fn(a, b, c, d, e, f)`` returning a 64-bit integer."""
    return _W(_W, _W, _W, _W, _W, _W, _W), _codegen(_I64, 6)


@intrinsic
def call3(typingctx, fn, a, b, c):
    """``fn(a, b, c)`` returning a 64-bit integer."""
    return _W(_W, _W, _W, _W), _codegen(_I64, 3)


@intrinsic
def ccall0(typingctx, fn):
    """``fn()`` returning a C ``int``."""
    return _W(_W), _codegen(_I32, 0)


@intrinsic
def ccall1(typingctx, fn, a):
    """``fn(a)`` returning a C ``int``."""
    return _W(_W, _W), _codegen(_I32, 1)


@intrinsic
def ccall2(typingctx, fn, a, b):
    """``fn(a, b)`` returning a C ``int``."""
    return _W(_W, _W, _W), _codegen(_I32, 2)


@intrinsic
def ccall3(typingctx, fn, a, b, c):
    """``fn(a, b, c)`` returning a C ``int``."""
    return _W(_W, _W, _W, _W), _codegen(_I32, 3)


@intrinsic
def ccall4(typingctx, fn, a, b, c, d):
    """``fn(a, b, c, d)`` returning a C ``int``."""
    return _W(_W, _W, _W, _W, _W), _codegen(_I32, 4)


@intrinsic
def ccall5(typingctx, fn, a, b, c, d, e):
    """``fn(a, b, c, d, e)`` returning a C ``int``."""
    return _W(*[_W] * 6), _codegen(_I32, 5)


@intrinsic
def ccall6(typingctx, fn, a, b, c, d, e, f):
    """``fn(a, b, c, d, e, f)`` returning a C ``int``."""
    return _W(*[_W] * 7), _codegen(_I32, 6)


@intrinsic
def ccall7(typingctx, fn, a, b, c, d, e, f, g):
    """``fn(a, b, c, d, e, f, g)`` returning a C ``int``."""
    return _W(*[_W] * 8), _codegen(_I32, 7)


@intrinsic
def ccall8(typingctx, fn, a, b, c, d, e, f, g, h):
    """``fn(a, b, c, d, e, f, g, h)`` returning a C ``int`` (arguments past the sixth go on
    the stack as 64-bit words, as the C ABIs pass an ``int`` there too)."""
    return _W(*[_W] * 9), _codegen(_I32, 8)


@intrinsic
def ccall9(typingctx, fn, a, b, c, d, e, f, g, h, i):
    """``fn(a, ..., i)`` returning a C ``int`` (nine arguments, as :func:`ccall8`)."""
    return _W(*[_W] * 10), _codegen(_I32, 9)


@intrinsic
def ccall10(typingctx, fn, a, b, c, d, e, f, g, h, i, j):
    """``fn(a, ..., j)`` returning a C ``int`` (ten arguments, as :func:`ccall8`)."""
    return _W(*[_W] * 11), _codegen(_I32, 10)


@intrinsic
def call0_f64(typingctx, fn):
    """``fn()`` returning a double."""
    return types.float64(_W), _codegen(_F64, 0)


@intrinsic
def load_acquire(typingctx, address):
    """The int64 at ``address``, loaded with acquire ordering (what another process
    released before it is visible after it)."""
    def codegen(context, builder, sig, args):
        ptr = builder.inttoptr(args[0], _I64.as_pointer())
        return builder.load_atomic(ptr, "acquire", 8)
    return _W(_W), codegen


@intrinsic
def store_release(typingctx, address, value):
    """Store the int64 ``value`` at ``address`` with release ordering (every write before
    it is visible to whoever loads it with acquire)."""
    def codegen(context, builder, sig, args):
        ptr = builder.inttoptr(args[0], _I64.as_pointer())
        builder.store_atomic(args[1], ptr, "release", 8)
        return context.get_dummy_value()
    return types.none(_W, _W), codegen


@intrinsic
def i64_array_at(typingctx, address):
    """A pointer to int64 at ``address``, for ``numba.carray``."""
    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], ir.IntType(64).as_pointer())
    return types.CPointer(types.int64)(types.int64), codegen


@lru_cache(maxsize=None)
def libc():
    """The C library, its calls setting ``ctypes.get_errno()`` (loaded once)."""
    return ctypes.CDLL(None, use_errno=True)


@lru_cache(maxsize=None)
def libc_address(name: str) -> int:
    """The address of libc's function ``name`` (looked up once: a lookup opens the process's
    symbol table, 70 us)."""
    return ctypes.cast(getattr(libc(), name), ctypes.c_void_p).value
