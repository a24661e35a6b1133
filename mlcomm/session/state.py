"""The session: everything mlcomm keeps for one communicator, in one place, freed with it.

A :class:`Session` holds:

- the private duplicate mlcomm talks on, so its messages never meet the caller's, and its
  node's communicator and layout (:mod:`.lifetime` sets them up);
- the algorithm ``MLCOMM_ALGORITHM`` names, read once and agreed across the ranks;
- plans (:mod:`mlcomm.runtime.plan`, immutable) by call layout, least recently used first
  out; plans that differ only in the op, or in a dtype of the same size, share one schedule
  and program;
- ``auto``'s choices, agreed across the ranks, and what its trials timed;
- the algorithm options it has checked;
- its share of the binding cache (:mod:`.cache`) and its keys in the memo (:mod:`.memo`);
- persistent handles, whose bindings are their own;
- the progress thread that runs non-blocking calls (:mod:`mlcomm.runtime.progress`),
  started on first use.

Nothing here keeps a caller's host array alive: bindings hold addresses and bound calls
hold weak references. A device binding on a CUDA-aware MPI keeps its device vectors, whose
bytes count towards the cache's bound.
"""

from __future__ import annotations

import logging
import sys
import weakref
from collections import OrderedDict

import numpy as np
from mpi4py import MPI

from .. import config
from ..runtime.binding import Binding
from ..runtime.liveness import forget, lost_ranks
from ..runtime.plan import layout_key, make_plan, plan_key
from ..runtime.progress import Progress
from ..runtime.watch import Watch
from ..transport import MESSAGES, PATHS
from . import cache, memo
from .compare import differing_calls

__all__ = ["Session"]

log = logging.getLogger("mlcomm")

_PLANS = 64  # plans kept per session


class Session:
    """Everything mlcomm keeps for one communicator (see the module docstring).

    ``comm``: mlcomm's duplicate; ``nodes``: the ranks of each node; ``node_comm``: this
    rank's node's communicator; ``default_algorithm`` and ``slot_bytes``: agreed across the
    ranks; ``settings``: how bindings run.
    """

    def __init__(self, comm, nodes, node_comm, default_algorithm, slot_bytes, settings):
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self.default_algorithm, self.nodes, self.slot_bytes = default_algorithm, nodes, \
            slot_bytes
        #: the ranks of this rank's node, in local order, and their communicator
        self.node = next(n for n in nodes if self.rank in n)
        self.node_comm = node_comm
        self._window = None
        self.settings = settings
        #: mlcomm's own waits on this communicator (roll calls on its duplicate)
        self.watch = Watch(settings, self.rank, comm, list(range(self.size)), session=comm)
        self.plans: OrderedDict = OrderedDict()
        self.layouts: OrderedDict = OrderedDict()  # layout_key -> a plan with that layout
        #: plan key -> its host bindings' scratch (:mod:`.cache`)
        self.scratch_of = weakref.WeakValueDictionary()
        #: a plan key (a device binding's: its cache key) -> [scratch bytes, device vector
        #: bytes, cached bindings sharing them]: a plan's host bindings share one scratch
        self.shared: dict = {}
        self.plan_misses = 0
        self.choices: dict = {}  # auto's, by call layout and size band (remember_choice)
        self.checked_options: set = set()  # algorithm options an empty build accepted
        self.trials: dict = {}  # what auto's trials timed, by size band
        #: the binding auto's trial kept whose last run was the call's own (its output
        #: holds the call's result): the call does not run it again
        self.held_result = None
        self.handles = weakref.WeakSet()
        self.call_keys: set = set()  # this session's keys in the memo
        self.progress = None  # the progress thread, once a non-blocking call starts one
        #: bytes this session's transports moved between ranks, per path of ``PATHS``
        self.moved = np.zeros(len(PATHS), np.int64)
        self.freed = False
        self.created = 0  # the order this rank created its sessions in (.lifetime)

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
    def cached_binding(self, plan, inp, out):
        """``plan`` bound to ``inp``/``out`` through the binding cache (:func:`.cache.binding`)."""
        return cache.binding(self, plan, inp, out)

    def keep_binding(self, binding, held: int) -> bool:
        """Cache a binding of ``auto``'s trial for the call (:func:`.cache.keep`)."""
        return cache.keep(self, binding, held)

    def own_binding(self, plan, inp, out, scratch=None):
        """A binding outside the cache (a persistent handle's, or one of auto's trial), on
        ``scratch`` where given, else its own."""
        return Binding(self.comm, plan, inp, out, self.settings, scratch, self.moved,
                       self.window() if plan.program.node_size else None)

    def bindings(self):
        """This session's cached bindings, least recently used first."""
        return cache.bindings_of(self)

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
                         list(range(len(self.node))), names=self.node, session=self.comm)
            node.barrier(self.node_comm, "mlcomm's set-up of the node's shared window")
            self._window = NodeWindow(self.node_comm, self.slot_bytes)
        return self._window

    def window_bytes(self) -> int:
        """Bytes of this rank's segment of the node window (0 before it is made)."""
        return 0 if self._window is None else self._window.nbytes

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

    # non-blocking calls
    def start(self, run, finish=None, result=None, keep=(), binding=None, plans=False):
        """Start ``run`` on the progress thread, after every call started before it
        (``plans``: ``run`` plans and binds its call there, as a device array's does)."""
        if self.progress is None:
            if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
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
        ValueError (:func:`.compare.differing_calls`)."""
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

    # the end
    def free_bindings(self):
        """Free every binding and handle of this session (before MPI finalizes), once the
        started calls are complete; report those that failed and were never waited for."""
        if self.progress is not None:
            self.progress.stop()
            for error in self.progress.unwaited():
                print(f"mlcomm: rank {self.rank}: a started call failed and was never waited "
                      f"for: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
            self.progress = None
        cache.drop_session(self)
        memo.forget_session(self)
        for handle in list(self.handles):
            handle.release()

    @property
    def lost(self):
        """The ranks this session's communicator lost (fault-tolerant MPI), else None: it is
        revoked, and its session is then freed on this rank alone."""
        return lost_ranks(self.comm)

    def free(self):
        if self.freed:
            return
        self.free_bindings()
        self.plans.clear()
        self.layouts.clear()
        self.freed = True
        if not MPI.Is_finalized() and self.lost is None:  # a revoked one frees nothing
            if self._window is not None:
                self._window.free()
            self.node_comm.Free()
            self.comm.Free()
