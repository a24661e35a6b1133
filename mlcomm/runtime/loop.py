"""The loops that run a bound program (:mod:`mlcomm.ir.program`): compiled, Python and device.

All three interpret the same instructions on the same transports and return the same
codes (:mod:`mlcomm.runtime.frame`): ``DONE``, ``STALLED`` (a WAIT outlasted the stall limit; call
again to go on waiting) or ``FAULTED`` (a transport reported a fault; ask it what).

- The **compiled loop** (:func:`compiled_loop`) runs the whole program in one Numba call
  without the GIL: the transport's C ``start``/``test`` through their addresses, copies and
  reductions as loops built from :func:`mlcomm.kernels.numba_backend.scalar`, so its results
  are bit for bit those of the kernels. It reads everything from an int64 *frame*
  (:class:`mlcomm.runtime.frame.Frame`): the program's address, the buffers, the transports, the
  stall limit. It lives in :mod:`mlcomm.runtime.hostloop`, imported (with Numba) on first use.
- The **Python loop** (:class:`PythonLoop`) decodes the program once into calls of
  :mod:`mlcomm.kernels` (NumPy, or Numba's parallel kernels for large reductions) on the
  host; with device memory (:class:`mlcomm.runtime.binding.DeviceMemory`) it is the
  **device loop**, whose kernels run on a CUDA stream that is synchronised before MPI
  touches device memory.

A WAIT polls its transport; every ``yield_mask + 1`` polls it yields the CPU (ranks may
outnumber cores) and reads the clock, so the stall check costs nothing on short waits; a
wait longer than :data:`mlcomm.runtime.frame.SPIN_NS` yields on every poll (other jobs may share
the cores), and a wait on a passive transport (one that watches memory its peers write)
longer than the settings' ``sleep_after``, or on another transport longer than
:data:`mlcomm.runtime.frame.MESSAGE_SLEEP_FACTOR` times that, sleeps
:data:`mlcomm.runtime.frame.SLEEP_US` on every poll instead: a yielding rank still takes its
turns on a core that a rank at work needs, a sleeping one does not.
A wait that returned STALLED and is run again counts from where it stopped: when it
yields and sleeps is judged on the whole wait, the stall limit on each run's part.
"""

from __future__ import annotations

import os
import time

import numpy as np

from .frame import (DONE, F_OP, FAULTED, MESSAGE_SLEEP_FACTOR, SLEEP_US, SPIN_NS, STALLED,
                    Frame)
from ..ir.program import COPY, REDUCE, REDUCE2, REDUCE3, START, WAIT
from ..transport import FAULT

__all__ = ["compiled_loop", "PythonLoop", "HostMemory", "rest"]


def rest(sleep_after: float, since: float, now: float) -> None:
    """A waiting rank's pause between polls: a yield of the CPU, or a sleep of
    :data:`mlcomm.runtime.frame.SLEEP_US` once the wait (from ``since`` to ``now``,
    seconds) has lasted ``sleep_after`` (0: never)."""
    if 0 < sleep_after < now - since:
        time.sleep(SLEEP_US * 1e-6)
    else:
        os.sched_yield()

# --- the compiled loop -----------------------------------------------------------------------

_compiled = None  # mlcomm.runtime.hostloop once imported; False when Numba is unusable


def _execute():
    global _compiled
    if _compiled is None:
        try:
            from . import hostloop
            _compiled = hostloop
        except ImportError:  # pragma: no cover - numba is a dependency
            _compiled = False
    return _compiled or None


def compiled_loop(frame: Frame, kernel_dtype: np.dtype):
    """A no-argument call running ``frame`` in the compiled loop; it returns a loop code.

    It calls the entry point compiled for these argument types directly, skipping Numba's
    per-call type dispatch. None when the compiled loop is unavailable.
    """
    hostloop = _execute()
    if hostloop is None:
        return None
    return hostloop.entry(frame, kernel_dtype, int(frame.words[F_OP]))


# --- the Python and device loops -------------------------------------------------------------

class HostMemory:
    """Host arrays for the Python loop: views by byte offset and the kernels on them."""

    def __init__(self, buffers, dtype, op):
        from ..kernels import kernel_for
        from ..kernels.numpy_backend import bare_kernel3
        self.buffers, self.dtype, self.op = buffers, dtype, op
        self._kernel_for, self._three = kernel_for, bare_kernel3(op)

    def view(self, buf, offset, nbytes):
        size = self.dtype.itemsize
        return self.buffers[buf][offset // size:(offset + nbytes) // size]

    def copy(self, d, s):
        return [(np.copyto, (d, s))]

    def reduce(self, kind, d, a, s):
        """Calls doing one reduce of ``kind`` (REDUCE: a is d, REDUCE2: s is d)."""
        if kind == REDUCE:
            return [(self._kernel_for(d, s, self.op), (d, s))]
        if kind == REDUCE3:  # disjoint: copy the left operand in, then reduce in place
            return [(np.copyto, (d, a)), (self._kernel_for(d, s, self.op), (d, s))]
        return [(self._three, (d, a, s))]

    def before_start(self):
        pass

    def finish(self):
        pass


class PythonLoop:
    """The program decoded into Python calls on ``memory`` (host or device) and
    ``transports``; calling it runs the program and returns a loop code."""

    def __init__(self, program, memory, transports, settings):
        self.memory, self.transports = memory, transports
        self.stall_seconds, self.yield_mask = settings.stall_seconds, settings.yield_mask
        self.sleep_after = settings.sleep_after
        self.pc, self.faulted_transport = 0, 0
        self.waited = 0.0  # seconds the stalled wait at ``pc`` had lasted
        self.steps = []
        for row in program.instructions:
            kind = int(row[0])
            if kind in (START, WAIT):
                self.steps.append((kind, (int(row[1]), int(row[2]), int(row[3]))))
                continue
            d = memory.view(int(row[1]), int(row[2]), int(row[7]))
            other = memory.view(int(row[3]), int(row[4]), int(row[7]))
            if kind == COPY:
                calls = memory.copy(d, other)
            else:  # d = a (op) s, with a = d (REDUCE) or s = d (REDUCE2)
                a, s = {REDUCE: (d, other), REDUCE2: (other, d),
                        REDUCE3: (memory.view(int(row[5]), int(row[6]), int(row[7])), other)}[kind]
                calls = memory.reduce(kind, d, a, s)
            self.steps.append((COPY, calls))

    def __call__(self) -> int:
        pc, self.pc = self.pc, 0
        memory = self.memory
        with np.errstate(all="ignore"):
            while pc < len(self.steps):
                kind, what = self.steps[pc]
                if kind == COPY:
                    for fn, args in what:
                        fn(*args)
                elif kind == START:
                    memory.before_start()
                    transport, first, n = what
                    if self.transports[transport].start(first, n) == FAULT:
                        self.faulted_transport = transport
                        return FAULTED
                elif self._wait(*what):
                    self.pc = pc
                    return self._wait_code
                pc += 1
        memory.finish()
        return DONE

    def _wait(self, transport, first, n) -> bool:
        """Poll until done; True (with ``_wait_code``) on a fault or a stall."""
        test = self.transports[transport].test
        spins, since, mask = 0, 0.0, self.yield_mask
        waited, self.waited = self.waited, 0.0  # before this run's part (a stall's)
        while True:
            r = test(first, n)
            if r == 1:
                return False
            if r == FAULT:
                self.faulted_transport, self._wait_code = transport, FAULTED
                return True
            spins += 1
            if (spins & mask) == 0:
                now = time.monotonic()
                if not since:
                    since = now
                if now - since + waited > SPIN_NS * 1e-9:
                    mask = 0  # a long wait: yield on every poll
                    if self.stall_seconds and now - since > self.stall_seconds:
                        self.waited, self._wait_code = now - since + waited, STALLED
                        return True
                rest(self.sleep_after * (1 if self.transports[transport].passive
                                         else MESSAGE_SLEEP_FACTOR), since - waited, now)
