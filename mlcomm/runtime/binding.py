"""Bindings: a plan bound to buffers, a transport and a loop, ready to run.

A :class:`Binding` holds what one plan needs to run on one pair of buffers: the scratch,
the transport's handles for the program's transfers, and the loop that interprets the
program (compiled when it can, else Python; the device loop for device vectors). It keeps
the buffers' addresses, never the caller's arrays: whoever keeps a binding (a session, a
persistent handle) makes sure the memory is alive when it runs.

Running it turns a loop's code into what the user sees: a stall is reported once on the
waiting rank (and ends the job under ``MLCOMM_STALL_ABORT=1``); a transfer fault (a message
of the wrong size, an MPI error) ends the job with a message that names the call, the peer
and the bytes, as MPI's own collectives do.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
import time
from dataclasses import dataclass

import numpy as np

from .. import config, kernels
from ..buffers.device import DeviceVector
from .frame import (DONE, F_PC, FAULTED, MAX_TRANSPORTS, STALLED, Frame, compiled_supports,
                    op_code)
from .liveness import CHECK_SECONDS, fault_tolerant, gone, lost
from .loop import HostMemory, PythonLoop, compiled_loop
from ..ir.program import INPUT, OUTPUT, SCRATCH, SLOTS
from ..ir.schedule import TURN_BYTES
from ..transport import Site, Transport, registry
from ..transport.mpi.abort import abort_job

__all__ = ["Settings", "Binding", "settings_from_env"]


@dataclass(frozen=True)
class Settings:
    """How bindings run: the stall inspector, CPU yielding and the loop."""

    rank: int = 0
    #: seconds a WAIT may last before it is reported (0: never)
    stall_seconds: float = 60.0
    #: end the job after reporting a stall
    stall_abort: bool = False
    #: polls between yields of the CPU and clock reads, minus one (a power of two minus one)
    yield_mask: int = 1023
    #: seconds a wait lasts before it sleeps between polls instead of yielding (0: never)
    sleep_after: float = 0.0
    #: use the compiled loop where it applies
    compiled: bool = True
    #: each rank's process id where this rank can see it (its machine's), else 0: a wait
    #: looks at them (:mod:`mlcomm.runtime.liveness`)
    pids: tuple = ()


#: a wait sleeps after SLEEP_AFTER_US where the node's ranks are at least SLEEP_RANKS_PER_CORE
#: times its cores: a yield keeps a rank's share of the core wherever the ranks are in
#: different scheduling groups (each MPICH rank is a session of its own; another job is
#: another), which costs a rank at work most of its core when three or more share it; at
#: two to a core tight loops of calls run faster yielding (docs/mpis.rst)
SLEEP_AFTER_US = 100
SLEEP_RANKS_PER_CORE = 3
#: what a binding holds for each run on another area of the window: the compiled loop's
#: frame and run, or a Python loop (32 areas held 33 KiB more than one area in the first,
#: 205 KiB in the second: 6.6 KiB an area)
AREA_FRAME_BYTES = 1 << 10
AREA_LOOP_BYTES = 7 << 10


def _polls(oversubscribed: bool) -> int:
    """``MLCOMM_POLLS_BEFORE_YIELD`` (a power of two), else 2 when ranks outnumber cores
    (a waiting rank gives its core away almost at once) and 1024 when they do not."""
    return config.polls_before_yield(2 if oversubscribed else 1024)


def settings_from_env(rank: int, per_core: float, pids: tuple = ()) -> Settings:
    """Settings from ``MLCOMM_STALL_SECONDS``, ``MLCOMM_STALL_ABORT``,
    ``MLCOMM_POLLS_BEFORE_YIELD``, ``MLCOMM_SLEEP_AFTER_US`` and ``MLCOMM_EXECUTOR``, for a
    node with ``per_core`` ranks per core: ranks that outnumber the cores yield the CPU
    sooner, and sleep in a wait that lasts where they are many to a core."""
    executor = config.executor()
    sleep_after = SLEEP_AFTER_US if per_core >= SLEEP_RANKS_PER_CORE else 0
    return Settings(rank=rank,
                    stall_seconds=config.stall_seconds(60.0),
                    stall_abort=config.stall_abort(),
                    yield_mask=_polls(per_core > 1) - 1,
                    sleep_after=config.sleep_after_us(sleep_after) / 1e6,
                    compiled=executor == "compiled", pids=tuple(pids))


def _address(a) -> int:
    return a.__array_interface__["data"][0]


#: host scratch of at least this many bytes is mapped from the system, not the C heap
MAPPED_SCRATCH_BYTES = 128 << 10


def host_scratch(count: int, dtype, touched: bool = False) -> np.ndarray:
    """A binding's host scratch of ``count`` elements, its pages written where ``touched``.
    From :data:`MAPPED_SCRATCH_BYTES` up it is an anonymous mapping of its own, whose memory
    goes back to the system when the binding does: in the C heap, the scratch the binding
    cache keeps would sit among the caller's freed arrays, which the allocator then cannot
    give back (docs/design.rst, "Sessions"). A touched mapping is populated by the kernel
    (``MAP_POPULATE``), which faults its pages in about a third faster than writing them."""
    dtype = np.dtype(dtype)
    nbytes = count * dtype.itemsize
    if nbytes < MAPPED_SCRATCH_BYTES:
        return np.zeros(count, dtype) if touched else np.empty(count, dtype)
    populate = getattr(mmap, "MAP_POPULATE", 0) if touched else 0
    mapped = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | populate)
    if hasattr(mmap, "MADV_HUGEPAGE"):  # as NumPy asks for its large arrays
        mapped.madvise(mmap.MADV_HUGEPAGE)
    scratch = np.frombuffer(mapped, dtype, count)
    if touched and not populate:
        scratch[...] = 0
    return scratch


def _array_at(address: int, nbytes: int, dtype) -> np.ndarray:
    """A NumPy array over memory it does not own (and keeps nothing alive)."""
    if not nbytes:
        return np.empty(0, dtype)
    return np.frombuffer((ctypes.c_char * nbytes).from_address(address), dtype)


class Binding:
    """``plan`` bound to 1-D contiguous ``inp`` and ``out`` (one array when in place): NumPy
    arrays, or device vectors (:class:`mlcomm.buffers.device.DeviceVector`) on a CUDA-aware MPI.

    ``scratch`` may be shared with other host bindings of the same plan (calls on one
    communicator run one at a time); else the binding allocates its own. ``moved`` holds the
    int64 counters, one per path of :data:`mlcomm.transport.PATHS`, that the transports add
    the bytes they move between ranks to (:attr:`mlcomm.ir.program.Program.moved` a run).
    """

    def __init__(self, comm, plan, inp, out, settings: Settings, scratch=None, moved=None,
                 window=None):
        self.plan, self.settings, self.comm = plan, settings, comm
        program = plan.program
        device = isinstance(out, DeviceVector)
        if program.node_size:
            if device:
                raise TypeError(f"{plan.algorithm} runs on host buffers (the node's shared "
                                f"window); pass host arrays, or a flat algorithm such as "
                                f"'ring' for device arrays")
            room = 0 if window is None else TURN_BYTES if program.turns else window.slot_bytes
            if window is None or program.slot_bytes > room:
                raise ValueError(f"{plan.describe()} needs {program.slot_bytes} bytes of the "
                                 f"node window per rank; the window has {room}")
            if program.turns and any(t.buffer >= SLOTS for t in program.transfers
                                     + program.fetches):
                raise ValueError(f"{plan.describe()}: a program with turns may touch its "
                                 f"slots only by copies and reductions")
        if scratch is None:
            scratch = out.empty(program.counts[2]) if device else \
                host_scratch(program.counts[2], out.dtype)
        self.scratch = scratch
        self.key = buffer_key(inp, out)
        self.nbytes = scratch.nbytes
        if device:
            buffers = {INPUT: inp, OUTPUT: out, SCRATCH: scratch}
            message = lambda t: buffers[t.buffer].bytes()[t.offset:t.offset + t.nbytes]
            slots, addresses = [], [0, 0]
        else:
            # a program with turns runs on the turn areas, the other set every other run; a
            # rotating one on the next of the slots' areas each run
            area_bytes = TURN_BYTES
            if program.turns:
                turns = window.turns
            elif program.node_size:
                turns, area_bytes = window.rotations(program.slot_bytes) if program.rotates \
                    else ([window.slots], window.slot_bytes)
                if len(turns) > 1:  # no call on a fresh area pays its page faults
                    window.map_slots(len(turns) * area_bytes)
            else:
                turns, area_bytes = [[]], 0
            slot_sets = [areas[:program.node_size] for areas in turns]
            slots = slot_sets[0]
            addresses = [_address(inp), _address(out), _address(scratch), *slots]
            message = lambda t: (ctypes.c_char * t.nbytes).from_address(
                addresses[t.buffer] + t.offset)
        # the transports by id (mlcomm.transport.registry), each id the program names
        site = Site(comm, plan, addresses, message, moved, window, device)
        used = program.transport_ids
        self.transports = [registry.bind(i, site) if i in used else _Unused()
                           for i in range(max(used, default=-1) + 1)]
        if device:
            self.frames = [None]
            runs = [PythonLoop(program, DeviceMemory(buffers, plan.dtype, plan.op),
                               self.transports, settings)]
        else:
            self.frames, runs = [], []
            for areas in slot_sets:
                if self.frames and self.frames[0] is not None:  # the first, on other areas
                    from ..kernels.numba_backend import kernel_dtype
                    frame = self.frames[0].moved(SLOTS, areas, area_bytes)
                    run = compiled_loop(frame, kernel_dtype(plan.dtype, plan.op))
                else:
                    frame, run = self._compiled(inp, out, scratch, areas, area_bytes)
                if run is None:
                    views = [_array_at(_address(a), a.nbytes, a.dtype) for a in (inp, out, scratch)]
                    views += [_array_at(a, area_bytes, plan.dtype) for a in areas]
                    run = PythonLoop(program, HostMemory(views, plan.dtype, plan.op),
                                     self.transports, settings)
                self.frames.append(frame)
                runs.append(run)
        # the window's turn or rotation picks the run
        self._window = window if len(runs) > 1 else None
        compiled = all(frame is not None for frame in self.frames)
        if program.turns and compiled:  # the compiled loop picks the turn's frame
            self.frames[0].take_turns(self.frames[1], window.turn_address)
        self.loop = runs[0] if len(runs) == 1 or program.turns and compiled else \
            _in_turn(runs, window) if program.turns else \
            _in_rotation(runs, window, len(runs) * area_bytes)
        self._runs = runs
        #: bytes of its frames for other areas of the window (the binding cache counts them)
        self.areas_nbytes = (len(runs) - 1) * (AREA_FRAME_BYTES if compiled else
                                               AREA_LOOP_BYTES)
        self.live = True
        self.busy = 0  # started non-blocking calls that will run this binding
        self._set_stall(self.tick)

    def _compiled(self, inp, out, scratch, slots, slot_bytes):
        """``(frame, run)`` of the compiled loop for host arrays on window ``slots`` of
        ``slot_bytes`` each, or ``(None, None)`` where it does not apply: Numba or the MPI
        symbols missing, a transport without compiled calls or an id past the frame's
        (:data:`mlcomm.runtime.frame.MAX_TRANSPORTS`), a dtype/op it has no loop for, partly
        overlapping op operands, misaligned arrays, or reductions large enough for the
        parallel kernels."""
        from ..kernels.numba_backend import kernel_dtype, num_threads
        plan, settings = self.plan, self.settings
        if not settings.compiled or len(self.transports) > MAX_TRANSPORTS or any(
                t.compiled is None for t in self.transports):
            return None, None
        if not compiled_supports(plan.dtype, plan.op) or plan.program.partial_overlap:
            return None, None
        if not all(a.flags.aligned for a in (inp, out)):
            return None, None
        if plan.program.largest_reduce >= kernels.NUMBA_MIN_BYTES and num_threads() > 1:
            return None, None
        kdt = kernel_dtype(plan.dtype, plan.op)
        frame = Frame(plan.program, op_code(plan.dtype, plan.op), kdt.itemsize, settings,
                      3 + len(slots))
        for index, a in enumerate((inp, out, scratch)):
            frame.set_buffer(index, _address(a), a.nbytes)
        for j, address in enumerate(slots):
            frame.set_buffer(SLOTS + j, address, slot_bytes)
        for index, transport in enumerate(self.transports):
            frame.set_transport(index, transport)
        run = compiled_loop(frame, kdt)
        return (None, None) if run is None else (frame, run)

    def _turn(self) -> int:
        """Which of the binding's runs is in progress or next (a program with turns has one
        per set of turn areas, a rotating one one per area of the slots)."""
        window = self._window
        if window is None:
            return 0
        return window.turn if self.plan.program.turns else window.rotation % len(self._runs)

    @property
    def rotations(self) -> int:
        """How many areas of the window its calls take in turn (1: it does not rotate)."""
        return 1 if self.plan.program.turns else len(self._runs)

    @property
    def frame(self):
        """The compiled loop's frame of the run in progress or next, None for the Python
        loop."""
        return self.frames[self._turn()]

    @property
    def compiled(self) -> bool:
        """Whether the compiled loop runs this binding."""
        return self.frame is not None

    def run(self) -> None:
        """Run the plan once; a fault ends the job (see the module docstring)."""
        code = self.loop()
        if code != DONE:
            self.trouble(code)

    @property
    def tick(self) -> float:
        """The seconds a wait of the loop lasts before it returns STALLED: the liveness
        check's period, or the stall limit where that is shorter."""
        stall = self.settings.stall_seconds
        return min(stall, CHECK_SECONDS) if stall else CHECK_SECONDS

    def trouble(self, code):
        """Handle a loop code other than DONE: a wait that lasts looks at its peers
        (:meth:`check_peers`) every :attr:`tick` and is reported once past the stall
        limit; a fault that is a lost rank is one (:func:`~.liveness.lost`); another ends
        the job."""
        what, stall = self.plan.describe(), self.settings.stall_seconds
        began, reported = time.monotonic() - self.tick, False
        while code == STALLED:
            self.check_peers()
            if stall and not reported and time.monotonic() - began >= stall:
                self.report_stall(stall)
                reported = True
            code = self.loop()
        if code == FAULTED:
            faulted = self.frame.faulted_transport if self.frame is not None else \
                self._run().faulted_transport
            transport = self.transports[faulted]
            if fault_tolerant() and (transport.failed() or self.comm.Is_revoked()):
                self.live = False  # its requests are dead; the session is revoked
                lost(self.comm, gone(self.settings.pids), what, self.settings.rank)
            self.check_peers()  # a peer's death can surface as a transfer's error
            abort_job(f"mlcomm: {what} on rank {self.settings.rank}: "
                      f"{transport.fault()}. "
                      f"If the ranks called it with different counts, dtypes or algorithms, "
                      f"validate=True (or MLCOMM_VALIDATE=1) compares the calls across ranks")

    def check_peers(self):
        """End the job, or raise :class:`~.liveness.RankLost`, where a peer's process is
        gone or (fault-tolerant MPI) mlcomm's communicator was revoked."""
        dead = gone(self.settings.pids)
        if dead or fault_tolerant() and self.comm.Is_revoked():
            self.live = False
            lost(self.comm, dead, self.plan.describe(), self.settings.rank, self.settings.pids)

    def report_stall(self, seconds):
        """Say once that the run has waited ``seconds`` (naming the ranks its wait is for,
        where the transport knows them), or end the job under ``MLCOMM_STALL_ABORT=1``."""
        transport, first, n = self._waiting()
        peers = self.transports[transport].pending_peers(first, n)
        whom = f"for ranks {peers}" if peers is not None else \
            "for the other ranks (the MPI library does not say which)"
        message = (f"mlcomm: rank {self.settings.rank} has waited {seconds:g} s in "
                   f"{self.plan.describe()} {whom}")
        if self.settings.stall_abort:
            abort_job(message + " (MLCOMM_STALL_ABORT=1: ending the job)")
        print(message + "; it goes on waiting (MLCOMM_STALL_SECONDS sets the limit, "
              "MLCOMM_STALL_ABORT=1 ends the job instead)", file=sys.stderr, flush=True)

    def set_stall(self, seconds):
        """The seconds a wait of the loop lasts before it returns STALLED (0: none)."""
        self._set_stall(seconds)

    def _run(self):
        """The loop of the run in progress or next."""
        return self._runs[self._turn()]

    def _waiting(self):
        """``(transport, first, n)`` of the WAIT the loop stopped at."""
        if self.frame is not None:
            pc = int(self.frame.words[F_PC])
            row = self.plan.program.instructions[pc]
        else:
            loop = self._run()
            row = (0, *loop.steps[loop.pc][1])
        return int(row[1]), int(row[2]), int(row[3])

    def _set_stall(self, seconds):
        for frame, run in zip(self.frames, self._runs):
            if frame is not None:
                frame.stall_ns = int(seconds * 1e9)
            else:
                run.stall_seconds = seconds

    def free(self) -> None:
        if self.live:
            for transport in self.transports:
                transport.free()
            self.live = False


class _Unused(Transport):
    """A transport id this program does not name (the binding's transports are indexed
    by id)."""

    compiled = (0, 0, 0)

    def free(self) -> None:
        pass


def _in_rotation(runs, window, nbytes):
    """One call running the run of the window's next area (``window.rotation``); a run
    that completes moves it on (see :func:`_in_turn`). The first that completes maps the
    first ``nbytes`` of the peers' slots (:meth:`NodeWindow.map_peers`)."""
    mapped = []

    def run():
        code = runs[window.rotation % len(runs)]()
        if code == DONE:
            window.rotation += 1
            if not mapped:
                window.map_peers(nbytes)
                mapped.append(True)
        return code
    return run


def _in_turn(runs, window):
    """One call running ``runs[window.turn]`` (a program with turns, bound to each set of
    turn areas); a run that completes passes the turn on (a stalled run goes on where it
    stopped when called again; a fault ends the job)."""
    def run():
        code = runs[window.turn]()
        if code == DONE:
            window.turn ^= 1
        return code
    return run


def buffer_key(inp, out) -> tuple:
    """What identifies a buffer pair to a plan: addresses, sizes (and the device stream)."""
    if isinstance(out, DeviceVector):
        return (inp.ptr, out.ptr, inp.size, out.size, out.stream)
    return (_address(inp), _address(out), inp.size, out.size)


class DeviceMemory:
    """Device vectors for the device loop: GPU kernels on the vectors' stream, which is
    synchronised before MPI touches their memory and when the program ends."""

    def __init__(self, buffers, dtype, op):
        self.buffers, self.dtype, self.op = buffers, dtype, op
        self.launched = False  # kernels or copies queued since the last synchronise

    def view(self, buf, offset, nbytes):
        size = self.dtype.itemsize
        return self.buffers[buf][offset // size:(offset + nbytes) // size]

    def _note(self, fn):
        def call(*args):
            fn(*args)
            self.launched = True
        return call

    def copy(self, d, s):
        return [(self._note(DeviceVector.copy_from), (d, s))]

    def reduce(self, kind, d, a, s):
        from ..ir.program import REDUCE, REDUCE3
        kernel = self._note(kernels.kernel_for(d.raw, s.raw, self.op, stream=d.stream,
                                               dtype=d.dtype))
        copy = self._note(DeviceVector.copy_from)
        if kind == REDUCE:
            return [(kernel, (d.raw, s.raw))]
        if kind == REDUCE3:  # disjoint: copy the left operand in, then reduce in place
            return [(copy, (d, a)), (kernel, (d.raw, s.raw))]
        tmp = d.empty(d.size)  # s is d: reduce into a temporary, keeping a on the left
        return [(copy, (tmp, a)), (kernel, (tmp.raw, s.raw)), (copy, (d, tmp))]

    def before_start(self):
        if self.launched:
            self.buffers[OUTPUT].synchronize()
            self.launched = False

    def finish(self):
        self.before_start()
