"""The compiled loop's frame: the int64 words it runs on, its return codes and op codes.

One frame per binding holds everything the loop reads: the program's address and length,
the loop op code and kernel element size, the buffers' addresses and sizes, each
transport's context and C ``start``/``test`` addresses, the stall limit, how often a wait
yields the CPU, when it sleeps instead and on which transports' waits, and the addresses
of ``MPI_Wtime``, ``sched_yield`` and ``usleep``. The loop writes
back where it stopped (a stall), how long that wait had lasted (the run that goes on
counts from there: when to sleep is judged on the whole wait) and which transport faulted. A program with turns is bound
once per set of turn areas: the first frame then holds the address of the turn (an int64
that says which frame runs, flipped by each completed run) and of the second frame.
Nothing here imports Numba.
"""

from __future__ import annotations

import numpy as np

from ..ir.program import WIDTH

__all__ = ["DONE", "STALLED", "FAULTED", "SPIN_NS", "SLEEP_US", "MESSAGE_SLEEP_FACTOR",
           "MAX_TRANSPORTS", "Frame",
           "compiled_supports", "op_names", "op_code"]

DONE, STALLED, FAULTED = 0, 1, 2
#: nanoseconds a WAIT spins between yields; after that it yields the CPU on every poll (a
#: peer that waits for this core's time comes in at once, whoever else shares the cores)
SPIN_NS = 50_000
#: microseconds a WAIT sleeps on each poll once it has lasted its ``sleep_after`` (a sleeping
#: rank leaves its core to the ranks that share it, which a yielding one does not)
SLEEP_US = 20
#: a wait on MPI messages (a transport that is not passive, or a watched wait) sleeps only
#: once it has lasted this many times its ``sleep_after``: a request moves only while its
#: rank polls it, so each sleep can hold a message up; a wait that long is a peer off its
#: core for a time slice, whose end a poll every sleep still meets
MESSAGE_SLEEP_FACTOR = 10

# frame words
F_CODE, F_NCODE, F_OP, F_ITEM, F_PC, F_STALL_NS, F_YIELD_MASK, F_WTIME, F_YIELD, F_TRANSPORT, \
    F_TURN, F_OTHER, F_NWORDS, F_SLEEP, F_SLEEP_AFTER_NS, F_SLEEPERS, F_WAITED_NS = range(17)
F_TRANSPORTS = 17  # (context, start, test) per transport id
#: the transport ids a frame has room for (a binding with more runs the Python loop)
MAX_TRANSPORTS = 8
F_BUFFERS = F_TRANSPORTS + 3 * MAX_TRANSPORTS  # then (address, bytes) per buffer id
#: codec offsets of the loop's op code: float16 and bfloat16 reduce on their uint16 bits
_CODECS = {"f16": 16, "bf16": 32}


class Frame:
    """The int64 words the compiled loop runs on: one per binding (see the module docstring)."""

    def __init__(self, program, op_code, itemsize, settings, buffers=3):
        """``settings``: how waits wait (a :class:`mlcomm.runtime.binding.Settings`)."""
        from ..transport.cabi import libc_address
        from ..transport.libmpi import symbol
        self.words = np.zeros(F_BUFFERS + 2 * buffers, np.int64)
        self.program = program  # the code's memory lives as long as the frame
        w = self.words
        w[F_CODE] = program.code.__array_interface__["data"][0]
        w[F_NCODE] = len(program.code) // WIDTH
        w[F_OP], w[F_ITEM] = op_code, itemsize
        w[F_STALL_NS] = int(settings.stall_seconds * 1e9)
        w[F_YIELD_MASK] = settings.yield_mask
        w[F_WTIME], w[F_YIELD] = symbol("MPI_Wtime"), libc_address("sched_yield")
        w[F_SLEEP], w[F_SLEEP_AFTER_NS] = libc_address("usleep"), int(settings.sleep_after * 1e9)
        w[F_NWORDS] = len(w)
        #: where the words are: what the compiled loop is called with
        self.address = w.__array_interface__["data"][0]
        self.second = None  # the frame of the second turn, which this one keeps alive

    def take_turns(self, second, turn_address):
        """Run ``second`` instead of this frame while the int64 at ``turn_address`` is 1; a
        completed run of either flips it."""
        self.second = second
        self.words[F_TURN], self.words[F_OTHER] = turn_address, second.address

    def moved(self, index, addresses, nbytes):
        """A copy of this frame whose buffers ``index``, ``index + 1`` ... are at
        ``addresses``, ``nbytes`` each: the same program on other areas of the window."""
        other = object.__new__(Frame)
        other.words, other.program, other.second = self.words.copy(), self.program, None
        other.address = other.words.__array_interface__["data"][0]
        for j, address in enumerate(addresses):
            other.set_buffer(index + j, address, nbytes)
        return other

    def set_buffer(self, index, address, nbytes):
        self.words[F_BUFFERS + 2 * index:F_BUFFERS + 2 * index + 2] = (address, nbytes)

    def set_transport(self, index, transport):
        self.words[F_TRANSPORTS + 3 * index:F_TRANSPORTS + 3 * index + 3] = transport.compiled
        if transport.passive:  # its waits may sleep
            self.words[F_SLEEPERS] |= 1 << index

    @property
    def stall_ns(self) -> int:
        return int(self.words[F_STALL_NS])

    @stall_ns.setter
    def stall_ns(self, value):
        self.words[F_STALL_NS] = value

    @property
    def faulted_transport(self) -> int:
        return int(self.words[F_TRANSPORT])


#: dtypes the compiled loop reduces, on their kernel view (numba_backend.kernel_dtype)
_DTYPES = frozenset(np.dtype(t) for t in (
    np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
    np.float16, np.float32, np.float64, np.complex64, np.complex128, np.bool_))


def compiled_supports(dtype: np.dtype, op: str) -> bool:
    """True when the compiled loop reduces ``dtype`` with ``op`` (complex: sum only)."""
    from ..kernels import BFLOAT16
    from ..kernels import OP_TABLE
    return ((dtype in _DTYPES or dtype == BFLOAT16) and op in OP_TABLE
            and (dtype.kind != "c" or OP_TABLE[op].reduces_as == "sum"))


def op_names() -> dict:
    """Loop op code -> the kernels' scalar op name (see :func:`op_code`)."""
    from ..kernels import OP_TABLE
    names = {}
    for op in OP_TABLE.values():
        if op.divides:
            continue  # reduces as another op
        names[op.code] = op.name
        if op.name in ("sum", "prod", "min", "max"):  # the arithmetic half floats have
            for prefix, base in _CODECS.items():
                names[base + op.code] = f"{prefix}_{op.name}"
    return names


def op_code(dtype: np.dtype, op: str) -> int:
    """The compiled loop's op code: the op's, plus the float16/bfloat16 codec's offset."""
    from ..kernels.numba_backend import scalar_name
    from ..kernels import OP_TABLE
    prefix = scalar_name(dtype, op).rpartition("_")[0]
    return OP_TABLE[op].reduce_code + _CODECS.get(prefix, 0)


