"""Sessions: everything mlcomm keeps for one communicator, in one place, freed with it.

A :class:`Session` is created (collectively) the first time mlcomm is used on a
communicator and is freed when that communicator is (an attribute delete callback), or at
the end of the job (:func:`_free_all`). It holds:

- the private duplicate mlcomm talks on, so its messages never meet the caller's;
- the algorithm ``MLCOMM_ALGORITHM`` names, read once and agreed across the ranks;
- plans (:mod:`mlcomm.runtime.plan`, immutable) by call layout, least recently used first out;
  plans that differ only in the op, or in a dtype of the same size, share one schedule and
  program;
- ``auto``'s choices, agreed across the ranks (:meth:`Session.remember_choice`);
- the algorithm options it has checked;
- bindings (:mod:`mlcomm.runtime.binding`) by plan and buffer pair, bounded in bytes with every
  other session's by ``MLCOMM_CACHE_BYTES`` (default 256 MiB), least recently used first
  out, counting their scratch and device vectors, :data:`BINDING_BYTES` each for their own
  objects, and the node windows (:func:`held`); the host bindings of one plan share one
  scratch buffer; an evicted binding's bound calls go with it, and a binding too large
  for the bound alone is not kept; ``auto``'s trial on a host all-reduce's own arrays leaves
  its pick's binding here for the call;
- bound calls (:class:`BoundCall`): calls seen before, so that a repeat skips checks and
  planning;
- persistent handles, whose bindings are their own;
- the progress thread that runs non-blocking calls (:mod:`mlcomm.runtime.progress`), started on
  first use.

Nothing here keeps a caller's host array alive: bindings hold addresses and bound calls
hold weak references. (NumPy refuses ``ndarray.resize`` on an array that is weakly referenced;
``np.resize`` gives a new array.) A device binding on a CUDA-aware MPI keeps its device
vectors, whose bytes count towards the bound.

The end of the job, on each rank, comes before ``MPI_Finalize``: at exit, or first thing in
an ``MPI_Finalize`` the script calls (a delete callback on ``MPI_COMM_SELF``). On each
communicator with a session, oldest first, the rank waits for the calls it started and
frees its bindings, then waits for every rank of the communicator to end too (a watched
barrier: a rank that does not come is named after ``MLCOMM_STALL_SECONDS``). A rank can
never end while another waits for it in silence:

- a message from a peer on mlcomm's duplicate, arriving while this rank waits at its end,
  belongs to a collective the peer started and this rank never called: the job ends at
  once, naming both;
- a script that ended with an unhandled exception ends the job unless every rank of the
  communicator has ended within :data:`FAILED_GRACE` seconds (the others may wait for it
  in a collective; where they all failed alike, each one's traceback is printed first).
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import sys
import time
import weakref
from collections import OrderedDict

from mpi4py import MPI
import numpy as np
from numpy import ndarray

from .. import config
from ..algorithms import resolve
from ..runtime.binding import Binding, buffer_key, settings_from_env
from ..runtime.plan import layout_key, make_plan, plan_key
from ..runtime.progress import Progress
from ..transport.mpi import TAG
from ..transport.mpi.abort import abort_job
from ..transport import MESSAGES, PATHS
from ..runtime.watch import Watch, free_world, world_roll

__all__ = ["Session", "get", "BoundCall", "MISS", "runner", "BOUND_CALLS", "LAST_CALL", "call_key",
           "remembers", "BindingCache", "BINDINGS", "CACHE_BYTES", "BINDING_BYTES", "cache_bytes",
           "cached_bytes", "held", "describe_held", "own_bytes", "differing_calls"]

log = logging.getLogger("mlcomm")

#: MLCOMM_CACHE_BYTES when unset
CACHE_BYTES = 256 << 20
_PLANS = 64  # plans kept per session


def cache_bytes() -> int:
    """The bound on what the binding cache holds: ``MLCOMM_CACHE_BYTES`` or 256 MiB."""
    return config.cache_bytes(CACHE_BYTES)


# --- the process-wide binding cache ------------------------------------------------------------

#: what a cached binding counts for its own objects beside its scratch: its MPI requests,
#: transports' contexts, frames and Python objects (5 to 12 KiB measured with the compiled
#: loop at P = 4; 23 to 25 KiB with the Python loop, MLCOMM_EXECUTOR=python, at P = 3)
BINDING_BYTES = 32 << 10


class _Entry:
    __slots__ = ("binding", "session", "scratch_key")


class BindingCache:
    """Every session's cached bindings, least recently used first, and the bytes of the
    scratch and device vectors they hold (each session's :attr:`Session.shared` says which
    bindings share which)."""

    __slots__ = ("entries", "own", "scratch", "vectors")

    def __init__(self):
        #: (session id, plan key, buffer key) -> _Entry
        self.entries: "OrderedDict[tuple, _Entry]" = OrderedDict()
        self.scratch = 0  # bytes of the cached bindings' scratch
        self.vectors = 0  # bytes of the device vectors they keep alive
        self.own = 0  # bytes of their own objects (:func:`own_bytes`)


#: process-wide: ``MLCOMM_CACHE_BYTES`` bounds this process's memory over all its sessions
BINDINGS = BindingCache()


def own_bytes(binding) -> int:
    """What a binding counts for its own objects: :data:`BINDING_BYTES`, and its frames for
    other areas of the window (:attr:`mlcomm.runtime.binding.Binding.areas_nbytes`)."""
    return BINDING_BYTES + binding.areas_nbytes


def _windows() -> int:
    """Bytes of the node windows of every live session (this rank's segment of each)."""
    return sum(s._window.nbytes for s in list(_ALL) if s._window is not None and not s.freed)


def cached_bytes() -> int:
    """Bytes the binding cache holds now, over every session: the cached bindings' scratch,
    device vectors and own objects (:func:`own_bytes`), and the node windows."""
    return BINDINGS.scratch + BINDINGS.vectors + BINDINGS.own + _windows()


def held() -> dict:
    """What the binding cache holds now, in bytes (``total`` is :func:`cached_bytes`, which
    ``bound`` bounds), with the count of ``bindings``."""
    parts = {"scratch": BINDINGS.scratch, "device vectors": BINDINGS.vectors,
             "bindings' own": BINDINGS.own, "windows": _windows()}
    return {"bound": cache_bytes(), "total": sum(parts.values()),
            "bindings": len(BINDINGS.entries), **parts}


def describe_held() -> str:
    """One line: the bound and what the binding cache holds now (``mlcomm info``)."""
    h = held()
    own = h["bindings' own"]
    return (f"{h['bound']} bytes bound (MLCOMM_CACHE_BYTES); holds {h['total']}: "
            f"{h['bindings']} bindings (scratch {h['scratch']}, device vectors "
            f"{h['device vectors']}, their own {own}), node windows {h['windows']}")


def _drop(key) -> None:
    """Free the cached binding under ``key`` (and its scratch if no other binding uses it),
    and forget the bound calls that run it, so that nothing keeps its memory alive."""
    entry = BINDINGS.entries.pop(key, None)
    if entry is None:
        return
    binding, session = entry.binding, entry.session
    BINDINGS.own -= own_bytes(binding)
    binding.free()
    for key_ in [k for k in session.call_keys
                 if getattr(BOUND_CALLS.get(k), "binding", None) is binding]:
        _forget_call(key_)
    shared = session.shared[entry.scratch_key]
    shared[2] -= 1
    if shared[2] == 0:
        del session.shared[entry.scratch_key]
        BINDINGS.scratch -= shared[0]
        BINDINGS.vectors -= shared[1]


def _evict_to(limit: int, keep) -> None:
    """Drop least recently used bindings until the cache fits ``limit``; never ``keep``
    nor a binding that a started non-blocking call is about to run."""
    entries = BINDINGS.entries
    # from the least recently used, starting over after each drop: a list of the keys
    # would cost a microsecond per entry (the ordered dict rehashes each key) on every call
    # once the cache is full, and it may hold thousands
    keys = iter(entries)
    while cached_bytes() > limit:
        key = next(keys, None)
        if key is None:
            return
        if key != keep and not entries[key].binding.busy:
            _drop(key)
            keys = iter(entries)


def _free_transports(transports) -> None:
    """Free an uncached binding's transports (once nothing runs it any more)."""
    for transport in transports:
        transport.free()


def differing_calls(signatures, fields) -> str | None:
    """Where the ranks' call ``signatures`` (one per rank, each a tuple of ``fields``)
    differ from rank 0's, in words: the ranks, and the first one's differing fields; None
    where they agree."""
    reference = signatures[0]
    differ = [r for r, s in enumerate(signatures) if s != reference]
    if not differ:
        return None
    diffs = [f"{f}: rank 0 has {a!r}, rank {differ[0]} has {b!r}"
             for f, a, b in zip(fields, reference, signatures[differ[0]]) if a != b]
    return (f"mlcomm: ranks {differ} called with arguments that differ from rank 0 "
            f"({'; '.join(diffs)})")


# --- bound calls -------------------------------------------------------------------------------

#: the bound calls of every session by :func:`call_key`, oldest first: process-wide, as a
#: repeat is looked up by its buffer before its communicator is known
BOUND_CALLS: dict = {}
_BOUND_CALLS_PER_PROCESS = 64


def _no_call(*args):
    return MISS


#: ``[repeat]``: the :attr:`BoundCall.repeat` of the bound call that ran last. Trying it first
#: skips the lookup in :data:`BOUND_CALLS` (0.15-0.2 us, about a quarter of an 8-byte
#: repeat); any other call makes it return :data:`MISS`
LAST_CALL: list = [_no_call]


def _forget_call(key) -> None:
    """Forget the bound call under ``key``: in :data:`BOUND_CALLS`, its session's keys and
    :data:`LAST_CALL`."""
    bound = BOUND_CALLS.pop(key, None)
    if bound is not None:
        bound.session.call_keys.discard(key)
        if LAST_CALL[0] is bound.repeat:
            LAST_CALL[0] = _no_call


def call_key(sendbuf, recvbuf, algorithm) -> int:
    """The output buffer's id (bcast has only ``sendbuf``) plus the algorithm's: calls that
    alternate algorithms on one buffer (as the benchmark does) keep a bound call each."""
    return id(sendbuf if recvbuf is None else recvbuf) + id(algorithm)


def _none():
    return None


def remembers(result, sendbuf, recvbuf) -> bool:
    """Whether a bound call can return ``result`` on a repeat without keeping anything
    alive: the caller's own buffer, or None."""
    return result is None or (result is recvbuf or result is sendbuf) and result is not None


#: what :attr:`BoundCall.repeat` returns for a call that is not its own
MISS = object()


class BoundCall:
    """A call seen before, bound to its buffers: running it skips checks and planning.

    A repeat is the same objects again (``is``, as NCCL's and Horovod's caches key on
    buffers): the collective, both buffers (held weakly), op, comm, algorithm and root; equal
    algorithm options; and what can change in place: each array's dtype and size.
    ``repeat(collective, sendbuf, recvbuf, op, comm, algorithm, root, options)`` runs such a
    call and returns what the public call returns, or :data:`MISS` for any other call.
    ``fresh``: the bound call's own output array, where the caller gave none; a repeat
    returns a copy of it.
    """

    __slots__ = ("algorithm", "binding", "options", "recv_ref", "repeat", "send_ref", "session",
                 "__weakref__")

    def __init__(self, session, args, run, binding, finish, result, options=None,
                 fresh=None):
        collective, sendbuf, recvbuf, op, comm, self.algorithm, root = args
        self.options = dict(options or {})
        self.session, self.binding = session, binding
        self.send_ref, self.recv_ref = _ref(sendbuf), _ref(recvbuf)
        # the caller's own buffer is returned through its weak reference (see remembers)
        answer = self.recv_ref if result is recvbuf and result is not None else \
            self.send_ref if result is sendbuf and result is not None else _none
        self.repeat = _repeat(self, collective, op, comm, root, sendbuf, recvbuf, run, finish,
                              answer, fresh)


def runner(session, run, binding, finish, result=None):
    """A no-argument call that runs a bound plan once more and returns ``result``: what a
    persistent handle and a bound call do on every call. A binding's loop runs straight away
    (a code other than 0 goes to its handler); without a binding (the mpi algorithm) ``run``
    runs and returns None."""
    loop = run if binding is None else binding.loop
    trouble = None if binding is None else binding.trouble

    def call():
        if session.progress is not None:
            session.progress.drain()
        code = loop()
        if code:
            trouble(code)
        if finish is not None:
            finish()
        return result
    return call


def _repeat(bound, collective, op, comm, root, sendbuf, recvbuf, run, finish, answer,
            fresh=None):
    """The bound call's ``repeat``: one closure, since it is the whole cost of a repeated
    call. It runs :func:`runner` and returns the argument that the call returns (the checks
    made it the remembered buffer), or a copy of ``fresh``, the bound call's own output.

    What can change in place is checked too: the dtype (a new size needs a resize, which
    NumPy refuses on a weakly referenced array); a tensor's storage (``set_``, ``resize_``).
    """
    send_ref, recv_ref, algorithm, options = bound.send_ref, bound.recv_ref, bound.algorithm, \
        bound.options
    binding, session = bound.binding, bound.session
    call = runner(session, run, binding, finish)
    loop = run if binding is None else binding.loop
    gives = 2 if answer is recv_ref else 1 if answer is send_ref else 0
    send, send_memory = _layout(sendbuf)
    recv, recv_memory = _layout(recvbuf)

    def repeat(collective_, sendbuf, recvbuf, op_, comm_, algorithm_, root_, options_):
        if (recv_ref() is not recvbuf or send_ref() is not sendbuf or op_ is not op
                or algorithm_ is not algorithm or comm_ is not comm
                or collective_ is not collective or root_ != root or options_ != options
                or (binding is not None and not binding.live)
                or (send is not None and sendbuf.dtype is not send)
                or (recv is not None and recvbuf.dtype is not recv)
                or (send_memory is not None
                    and (sendbuf.data_ptr(), sendbuf.numel()) != send_memory)
                or (recv_memory is not None
                    and (recvbuf.data_ptr(), recvbuf.numel()) != recv_memory)):
            return MISS
        if finish is None and session.progress is None:  # the runner's usual call, inline
            code = loop()
            if code:
                binding.trouble(code)
        else:
            call()
        if fresh is not None:
            return fresh.copy()
        return recvbuf if gives == 2 else sendbuf if gives == 1 else None
    return repeat


def _layout(buf):
    """``(dtype, memory)`` a repeat must find unchanged: an array's dtype; a tensor's dtype
    and ``(data_ptr, numel)``; nothing for other buffers."""
    if type(buf) is ndarray:
        return buf.dtype, None
    if hasattr(buf, "data_ptr") and hasattr(buf, "numel"):
        return buf.dtype, (buf.data_ptr(), buf.numel())
    return None, None


def _ref(obj):
    """A weak reference to ``obj``, or a call returning it for None and MPI.IN_PLACE."""
    if obj is None or obj is MPI.IN_PLACE:
        return lambda: obj
    return weakref.ref(obj)


# --- sessions ----------------------------------------------------------------------------------

class Session:
    """Everything mlcomm keeps for one communicator (see the module docstring)."""

    def __init__(self, comm, what="mlcomm"):
        self.comm = _duplicate(comm, what)
        self.comm.Set_errhandler(MPI.ERRORS_RETURN)
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        real = self.comm.Split_type(MPI.COMM_TYPE_SHARED)
        local, leader = real.Get_size(), real.allreduce(self.rank, op=MPI.MIN)
        cores = set().union(*real.allgather(_cpus()))  # the cores the node's ranks may use
        real.Free()
        agreed = _agreed_env(self.comm, leader)
        self.default_algorithm, self.nodes, self.slot_bytes = agreed
        #: the ranks of this rank's node, in local order, and their communicator
        self.node = next(n for n in self.nodes if self.rank in n)
        self.node_comm = self.comm.Split(self.nodes.index(self.node), self.rank)
        self._window = None
        self.settings = settings_from_env(self.rank, local / len(cores))
        #: mlcomm's own waits on this communicator (roll calls on its duplicate)
        self.watch = Watch(self.settings, self.rank, self.comm, list(range(self.size)))
        self.plans: OrderedDict = OrderedDict()
        self.layouts: OrderedDict = OrderedDict()  # layout_key -> a plan with that layout
        self._scratch = weakref.WeakValueDictionary()  # plan key -> its host bindings' scratch
        #: a plan key (a device binding's: its cache key) -> [scratch bytes, device vector
        #: bytes, cached bindings sharing them]: a plan's host bindings share one scratch
        self.shared: dict = {}
        self.plan_misses = 0
        self.choices: dict = {}  # auto's, by call layout and size band (remember_choice)
        self.checked_options: set = set()  # algorithm options an empty build accepted
        self.trials: dict = {}  # what auto's trials timed, by size band
        self.handles = weakref.WeakSet()
        self.call_keys: set = set()  # keys of this session's BOUND_CALLS
        #: a weak reference to the input of the last small all-reduce into a new array
        #: that no bound call ran (see mlcomm.api)
        self.fresh_input = _none
        self.progress = None  # the progress thread, once a non-blocking call starts one
        #: bytes this session's transports moved between ranks, per path of ``PATHS``
        self.moved = np.zeros(len(PATHS), np.int64)
        self.freed = False

    # plans
    def plan(self, collective, algorithm, count, dtype, op, options, alias=None):
        """The plan for this call layout, built and lowered on first use; or, where a plan
        for another op or dtype of the same size is kept, sharing its schedule and
        program."""
        key = plan_key(collective, algorithm, self.size, count, dtype, op, options, alias)
        plan = self.plans.get(key)
        if plan is not None:
            self.plans.move_to_end(key)
            return plan
        self.plan_misses += 1
        layout = layout_key(key)
        plan = make_plan(collective, algorithm, self.rank, self.size, count, dtype, op,
                         options, alias, like=self.layouts.get(layout))
        self.layouts[layout] = plan
        self.layouts.move_to_end(layout)
        if len(self.layouts) > _PLANS:
            self.layouts.popitem(last=False)
        if self.rank == 0 and config.debug():
            log.warning("mlcomm: new plan %s: %d steps, %d instructions, %d scratch elements",
                        plan.describe(), len(plan.schedule.steps),
                        len(plan.program.instructions), plan.schedule.scratch_count)
        self.plans[key] = plan
        if len(self.plans) > _PLANS:
            self.plans.popitem(last=False)  # its cached bindings age out of the cache
        return plan

    # bindings
    def bind(self, plan, inp, out):
        """``plan`` bound to ``inp``/``out``: the cached binding, or a new one sharing its
        plan's scratch with the plan's other host bindings. A new binding that does not fit
        the bound alone is not cached: it is freed once the call is done with it."""
        key = (id(self), plan.key, buffer_key(inp, out))
        entry = BINDINGS.entries.get(key)
        if entry is not None:
            BINDINGS.entries.move_to_end(key)
            return entry.binding
        device = not isinstance(out, ndarray)
        scratch_key = key if device else plan.key
        shared = self.shared.get(scratch_key)
        scratch = None if shared is None else self._scratch[plan.key]
        binding = Binding(self.comm, plan, inp, out, self.settings, scratch, self.moved,
                          self.window() if plan.program.node_size else None)
        vectors = inp.nbytes + out.nbytes if device else 0
        if not self._cache(key, binding, scratch_key, vectors, device):
            weakref.finalize(binding, _free_transports, binding.transports)
        return binding

    def keep_binding(self, binding, held: int) -> bool:
        """Cache ``binding``, bound by ``auto``'s trial to a host call's own buffers, as
        :meth:`bind` would have bound it for that call; ``held``: the bytes its scratch keeps
        alive (a view of the trial's). False, and nothing cached, where a binding of its
        plan is cached already (they share one scratch) or it does not fit the bound."""
        plan = binding.plan
        if plan.key in self.shared:
            return False
        binding.nbytes = held
        return self._cache((id(self), plan.key, binding.key), binding, plan.key, 0, False)

    def _cache(self, key, binding, scratch_key, vectors, device) -> bool:
        """Put a new binding in the cache under ``key``, sharing or first holding the
        scratch of ``scratch_key``; False where the first does not fit the bound alone."""
        shared = self.shared.get(scratch_key)
        bound = cache_bytes()
        if shared is None and binding.nbytes + vectors + own_bytes(binding) + _windows() > bound:
            return False
        if shared is None:
            self.shared[scratch_key] = [binding.nbytes, vectors, 1]
            BINDINGS.scratch += binding.nbytes
            BINDINGS.vectors += vectors
            if not device:
                self._scratch[binding.plan.key] = binding.scratch
        else:
            shared[2] += 1
        entry = _Entry()
        entry.binding, entry.session, entry.scratch_key = binding, self, scratch_key
        BINDINGS.entries[key] = entry
        BINDINGS.own += own_bytes(binding)
        _evict_to(bound, key)
        return True

    def own_binding(self, plan, inp, out, scratch=None):
        """A binding outside the cache (a persistent handle's, or one of auto's trial), on
        ``scratch`` where given, else its own."""
        return Binding(self.comm, plan, inp, out, self.settings, scratch, self.moved,
                       self.window() if plan.program.node_size else None)

    def context(self, names) -> dict:
        """The options this session supplies to a node-aware algorithm (``Algorithm.context``):
        asking for ``single_copy`` on a node of several ranks makes the window (collective
        over the node)."""
        values = {"nodes": lambda: self.nodes, "slot_bytes": lambda: self.slot_bytes,
                  "single_copy": lambda: len(self.node) > 1 and self.window().single_copy}
        return {name: values[name]() for name in names}

    def window(self):
        """The node's shared window (collective over the node on first use, which every
        rank of a node reaches in the same call: they run one plan)."""
        if self._window is None:
            from ..transport.window import NodeWindow
            node = Watch(self.settings, self.node.index(self.rank), self.node_comm,
                         list(range(len(self.node))), names=self.node)
            node.barrier(self.node_comm, "mlcomm's set-up of the node's shared window")
            self._window = NodeWindow(self.node_comm, self.slot_bytes)
        return self._window

    def bytes_sent(self) -> int:
        """Bytes of the messages mlcomm's own algorithms have sent on this communicator,
        counted where they are posted (the ``mpi`` algorithm's are the library's own)."""
        return int(self.moved[MESSAGES])

    def bytes_moved(self) -> dict:
        """Bytes mlcomm's own algorithms have moved between ranks on this communicator,
        per path (:data:`mlcomm.transport.PATHS`): the messages this rank sent, what it read
        from its node peers' window slots, what it read from or wrote into their buffers by
        single copy. The ``mpi`` algorithm's are the library's own and not counted."""
        return dict(zip(PATHS, self.moved.tolist()))

    def bindings(self):
        """This session's cached bindings, least recently used first."""
        return [e.binding for e in BINDINGS.entries.values() if e.session is self]

    # non-blocking calls
    def start(self, run, finish=None, result=None, keep=(), binding=None, plans=False):
        """Start ``run`` on the progress thread, after every call started before it
        (``plans``: ``run`` plans and binds its call there, as a device array's does)."""
        from mpi4py import MPI as _MPI
        if self.progress is None:
            if _MPI.Query_thread() < _MPI.THREAD_MULTIPLE:
                raise RuntimeError("non-blocking calls need MPI_THREAD_MULTIPLE (mpi4py's "
                                   "default); this job initialised MPI with a lower level "
                                   "(mpi4py.rc.thread_level or MPI_Init_thread)")
            self.progress = Progress(f"mlcomm-progress-{self.rank}")
        return self.progress.start(run, finish, result, keep, binding, plans)

    def wait_started(self):
        """Wait for every started call (a blocking call's messages must not meet theirs)."""
        if self.progress is not None:
            self.progress.drain()

    def before_planning(self):
        """Wait for the started calls while one of them plans and binds on the progress
        thread (a device array's ``iallreduce``): the session's plans, bindings and node
        collectives are set up by one thread at a time (two at once crashed a job)."""
        if self.progress is not None and self.progress.planning:
            self.progress.drain()

    # agreement
    def agree(self, value, what="mlcomm's agreement across the ranks", call=None):
        """Rank 0's ``value`` on every rank (collective; a watched wait until every rank is
        here, ``what`` naming it), once the started calls are complete: a started call may
        run the library's collectives on this communicator in the progress thread, and two
        threads' collectives on one communicator can meet in a different order on each rank
        (which hung a job). ``call``: ``(fields, signature)`` of the call this agreement is
        for; where a rank's signature differs from rank 0's, every rank raises the same
        ValueError (:func:`differing_calls`), as the ranks would otherwise go on to run
        different collectives or the same one on different counts."""
        self.wait_started()
        self.watch.barrier(self.comm, what, sleep=True)
        if call is None:
            return self.comm.bcast(value if self.rank == 0 else None, root=0)
        fields, signature = call
        value, first = self.comm.bcast((value, signature) if self.rank == 0 else None, root=0)
        if self.comm.allreduce(signature != first, op=MPI.LOR):  # the ranks' only if one differs
            differ = differing_calls(self.comm.allgather(signature), fields)
            raise ValueError(f"{differ}; auto's first call at a new size compares the calls "
                             f"(validate=True or MLCOMM_VALIDATE=1 compares every call)")
        return value

    # auto's choices
    def remember_choice(self, key, choice):
        """Keep ``auto``'s agreed ``choice`` for ``key``, a call layout or a size band."""
        self.choices[key] = choice

    def remember_trial(self, band, record):
        """Keep what ``auto``'s trial timed for a size ``band``: its first, warm and median
        times, its spending and its pick, for a reader that asks why it chose."""
        self.trials[band] = record

    # bound calls
    def remember_call(self, key, bound):
        """Keep ``bound``, a :class:`BoundCall`, under ``key`` (:func:`call_key`) for the
        calls that repeat it, replacing the process's oldest beyond its 64."""
        binding = bound.binding
        if binding is not None and \
                (id(self), binding.plan.key, binding.key) not in BINDINGS.entries:
            return  # an uncached binding (too large for the bound) is freed after its call
        _forget_call(key)
        if len(BOUND_CALLS) >= _BOUND_CALLS_PER_PROCESS:
            _forget_call(next(iter(BOUND_CALLS)))
        BOUND_CALLS[key] = bound
        self.call_keys.add(key)

    def free_bindings(self):
        """Free every binding and handle of this session (before MPI finalizes), once the
        started calls are complete; report those that failed and were never waited for."""
        if self.progress is not None:
            self.progress.stop()
            for error in self.progress.unwaited():
                print(f"mlcomm: rank {self.rank}: a started call failed and was never waited "
                      f"for: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
            self.progress = None
        for key in [k for k, e in BINDINGS.entries.items() if e.session is self]:
            _drop(key)
        for key in list(self.call_keys):
            _forget_call(key)
        for handle in list(self.handles):
            handle.release()

    def free(self):
        if self.freed:
            return
        self.free_bindings()
        self.plans.clear()
        self.layouts.clear()
        self.freed = True
        if not MPI.Is_finalized():
            if self._window is not None:
                self._window.free()
            self.node_comm.Free()
            self.comm.Free()


def _duplicate(comm, what):
    """mlcomm's duplicate of ``comm``: a plain Intracomm whatever the caller's class (so
    mlcomm's traffic never runs through a subclass's collectives: mlcomm.Comm's would run
    mlcomm again), made by ``MPI_Comm_idup`` in a watched wait (a rank late on the
    communicator's first call is reported, with the set-up's roll call on the world's
    duplicate where every rank has imported mlcomm, but on Open MPI:
    :mod:`mlcomm.runtime.watch`)."""
    plain = MPI.Intracomm(comm)
    rank = plain.Get_rank()
    made = []

    def start():
        dup, request = plain.Idup()
        made.append(dup)
        return request
    # ranks may share cores: they yield (not sleep, which slows the library's progress)
    Watch(settings_from_env(rank, 2.0), rank, lambda: world_roll(plain)).wait(
        start, f"{what}, the first call on this communicator (mlcomm's set-up)")
    return made[0]


def _cpus() -> set:
    """The cores this process may run on."""
    try:
        return os.sched_getaffinity(0)
    except AttributeError:  # pragma: no cover - not Linux
        return set(range(os.cpu_count() or 1))


def _agreed_env(comm, leader):
    """``(MLCOMM_ALGORITHM, nodes, slot bytes)``, agreed across the ranks in one allgather.

    ``leader`` is the lowest rank on this rank's machine. ``MLCOMM_RANKS_PER_NODE=k`` makes
    nodes of k consecutive ranks (which must share a machine); otherwise a node is a
    machine. ``MLCOMM_SHM_BYTES`` sizes each rank's window slot. Each variable must be the
    same on every rank; a ValueError naming the ranks that differ is raised on every rank.
    """
    from ..algorithms import DEFAULT_SLOT_BYTES
    names, mine = config.AGREED, config.agreed_raw()
    everyone = comm.allgather((mine, leader))
    for i, name in enumerate(names):
        values = [e[0][i] for e in everyone]
        differ = [r for r, v in enumerate(values) if v != values[0]]
        if differ:
            shown = ", ".join(f"rank {r}: {values[r]!r}" for r in [0] + differ[:7])
            raise ValueError(f"{name} differs across ranks ({shown}); set the same value on "
                             f"every rank, or unset it")
    algorithm, per_node, slot_bytes = everyone[0][0]
    if algorithm is not None:
        resolve(algorithm)  # an unknown name fails on every rank alike
    machines = [e[1] for e in everyone]
    size = len(machines)
    if per_node is None:
        nodes = [tuple(r for r in range(size) if machines[r] == m) for m in sorted(set(machines))]
    else:
        k = config.positive("MLCOMM_RANKS_PER_NODE", per_node)
        nodes = [tuple(range(a, min(a + k, size))) for a in range(0, size, k)]
        for node in nodes:
            if len({machines[r] for r in node}) > 1:
                raise ValueError(f"MLCOMM_RANKS_PER_NODE={k} puts ranks {list(node)} in one "
                                 f"node, but they run on different machines; use a divisor "
                                 f"of the ranks per machine")
    slot = DEFAULT_SLOT_BYTES if slot_bytes is None else config.positive("MLCOMM_SHM_BYTES",
                                                                         slot_bytes)
    return algorithm, tuple(nodes), -(-slot // 64) * 64


def _delete(comm, keyval, session):
    session.free()


_KEYVAL = MPI.Comm.Create_keyval(delete_fn=_delete)
#: every live session of this process: the end of the job ends each, and the cache counts
#: their node windows
_ALL: "weakref.WeakSet[Session]" = weakref.WeakSet()
#: numbers sessions in the order this rank creates them (every rank of a communicator
#: creates its session in the same order relative to the others' it shares)
_CREATED = itertools.count()


def get(comm, what="mlcomm") -> Session:
    """The session of ``comm``: created (collectively) on first use, in a call ``what``
    names (for a stall report)."""
    session = comm.Get_attr(_KEYVAL)
    if session is None:
        session = Session(comm, what)
        comm.Set_attr(_KEYVAL, session)
        session.created = next(_CREATED)
        _ALL.add(session)
    return session


#: seconds a rank whose script ended with an unhandled exception waits for the other ranks
#: to end before it ends the job (see the module docstring)
FAILED_GRACE = 2.0
_ended = False


@atexit.register
def _free_all():
    """The end of the job on this rank (see the module docstring); once, before
    MPI_Finalize."""
    global _ended
    if _ended or not MPI.Is_initialized() or MPI.Is_finalized():
        return
    _ended = True
    failed, since = _unhandled(), time.monotonic()
    for session in sorted(_ALL, key=lambda s: s.created):
        if not session.freed:
            _end(session, failed, since)
    free_world()


def _unhandled():
    """The exception that ended the script, if an unhandled one did (None in an
    interactive session, where the last error need not have ended it)."""
    if hasattr(sys, "ps1") or sys.flags.interactive:
        return None
    return getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)


def _end(session, failed, since):
    """This rank's end on ``session``'s communicator: its started calls complete, its
    bindings freed, then a watched barrier with every rank's end (see the module
    docstring)."""
    me = f"mlcomm: rank {session.rank}"

    def failed_long_enough():
        if failed is not None and time.monotonic() - since > FAILED_GRACE:
            abort_job(f"{me} ended with an unhandled exception ({type(failed).__name__}: "
                      f"{failed}) and the other ranks of its communicator have not all "
                      f"ended {FAILED_GRACE:g} s later: ending the job, as they may wait "
                      f"for it")

    if failed is not None and session.progress is not None:
        while not session.progress.drain(0.05):
            failed_long_enough()
    session.free_bindings()
    if session.size == 1:
        return
    status = MPI.Status()

    def check():
        if session.comm.Iprobe(MPI.ANY_SOURCE, TAG, status):  # a program's message
            peer = status.Get_source()
            abort_job(f"{me} has ended its script, but rank {peer} waits for it in a "
                      f"collective of mlcomm's on this communicator that rank {session.rank} "
                      f"never called (rank {peer}'s message of {status.Get_count(MPI.BYTE)} "
                      f"bytes is unreceived): ending the job. Every rank must make the same "
                      f"collective calls on a communicator, in the same order")
        failed_long_enough()

    session.watch.wait(session.comm.Ibarrier, "the end of the job (this rank's script has "
                       "ended; every rank of the communicator meets here before "
                       "MPI_Finalize)", check=check, sleep=True)


if MPI.Is_initialized() and not MPI.Is_finalized():  # an MPI_Finalize the script calls
    MPI.COMM_SELF.Set_attr(MPI.Comm.Create_keyval(delete_fn=lambda *_: _free_all()), True)
