"""The node's shared window, and the transport that synchronises on it.

:class:`NodeWindow` is one ``MPI_Win_allocate_shared`` window per node communicator: every
rank's segment holds its flag (a 64-bit counter in a cache line of its own), the addresses
of its current call's input and output (on the next cache line, for peers' single-copy
reads, :mod:`mlcomm.transport.peer`), its slot, which the rank writes and every rank of the
node reads in place, and its two turn areas (:data:`mlcomm.ir.schedule.TURN_BYTES` each),
the slot of a program with ``turns``, which alternate from one such program's run to the
next. A program that ``rotates`` runs on as many areas of its size as the slot holds (at
most :data:`ROTATIONS`, and only where it holds :data:`MIN_ROTATIONS`), the next one each
run of such a program (every rank of the node runs the same collectives, so all take the
same area); each rank allocates and maps its slot's areas when its first binding on them is
made, and maps its peers' once its first call on them has completed, so that no later call
pays their page faults. Programs read and write slots with plain copies and reductions (the
slots are buffers of the binding); :class:`NodeSync` is the transport of their node
synchronisations (:class:`mlcomm.ir.program.Sync`):

- a post stores this rank's input and output addresses, then ``base + count`` into its
  flag with release ordering; a collective's first post stores, before its flag, the
  collective's word beside the flag (:data:`LAYOUT`): its base and a digest of its call
  (collective, algorithm, count, dtype, op and options);
- a wait completes once the peer's flag, loaded with acquire ordering, reaches
  ``base + count``. ``base`` is this rank's flag when its collective began, which a wait
  with count 0 (the first step of every schedule that uses the window) records. Every rank
  of a node posts equally often in a collective, so their bases agree. Where the peer's
  word has this collective's base (the peer has not gone on to its next one) and another
  digest, the peer runs another call: the wait reports a fault, which ends the job
  (ranks that passed different counts would read past each other's data).

No MPI message is sent; a waiting loop polls and yields the CPU as for messages.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import zlib

import numpy as np
from mpi4py import MPI
from numba import carray

from ..cabi import i64_array_at, libc, load_acquire, store_release
from ...ir.schedule import TURN_BYTES
from .. import FAULT, PATHS, WINDOW, Transport, compile_calls

__all__ = ["NodeWindow", "NodeSync", "bind", "WindowError", "CONTROL_BYTES", "ADDRESSES",
           "ROTATIONS", "MIN_ROTATIONS"]

#: bytes before each slot: the flag, alone in its cache line, then the published addresses
CONTROL_BYTES = 128
#: where the input's and the output's addresses lie after the flag
ADDRESSES = 64
#: where the word of the rank's current collective lies after the flag, in its cache line:
#: the collective's base shifted left by :data:`DIGEST_BITS`, plus its call's digest
LAYOUT = 8
DIGEST_BITS = 24
#: the most areas of a slot that a rotating program takes in turn, and the fewest worth it:
#: a store into a line that another core has read must take the line back first, which
#: costs less the more the core has read since (shared_memory at 64 KiB and P = 2 on a 2-core
#: EPYC by the window: 9.8-10.1 us on one area, 9.1 on 8, 5.9 on 16, 4.5 on 32; at 1 MiB
#: four areas were slower than one; bench/floor.py times the hand-off). Each area is a frame
#: of the binding (about a KiB).
ROTATIONS = 32
MIN_ROTATIONS = 8
_BASE, _ME, _L, _IN, _OUT = 0, 1, 2, 3, 4
# the window bytes counter's address, the bytes a run reads from peers' slots, and the
# index of the program's first post, which counts them (and stores the collective's word)
_MOVED, _BYTES, _FIRST_POST = 5, 6, 7
# this call's digest, and the local rank whose word had another (-1: none)
_DIGEST, _ODD = 8, 9
_FLAGS = 10  # then L flag addresses, then two words per sync: peer, count (post: count)
_MADV_POPULATE_READ, _MADV_POPULATE_WRITE = 22, 23  # Linux 5.14


def _map_now(address: int, nbytes: int, write: bool = True) -> None:
    """Allocate and map the pages of ``nbytes`` at ``address`` (in the node window) in this
    process now, so that no call pays their faults (a rotating call at 64 KiB on fresh
    areas: 70 us, against 12): ``MADV_POPULATE_WRITE`` (``MADV_POPULATE_READ`` where not
    ``write``), which maps them without touching them, or where the kernel lacks it
    (EINVAL, before Linux 5.14), a read of each page. Where it fails otherwise (/dev/shm
    full), the calls fault the pages in."""
    page = mmap.PAGESIZE
    start = address // page * page
    length = -(-(address + nbytes - start) // page) * page
    advice = _MADV_POPULATE_WRITE if write else _MADV_POPULATE_READ
    if libc().madvise(ctypes.c_void_p(start), ctypes.c_size_t(length), advice) == 0 \
            or ctypes.get_errno() != errno.EINVAL:
        return
    pages = np.frombuffer((ctypes.c_char * nbytes).from_address(address), np.uint8)
    pages[np.r_[0, np.arange(start + page - address, nbytes, page)]].sum()  # one a page


class WindowError(RuntimeError):
    """The node window could not be allocated."""


class NodeWindow:
    """``slot_bytes`` of shared memory per rank of ``node`` (a node communicator), plus its
    flag. Collective over ``node``; every rank raises alike when any rank cannot allocate.

    ``pids`` are the node's processes in local order; ``single_copy`` says whether every
    rank can read every other's memory (see :func:`mlcomm.transport.peer.probe`), with
    ``single_copy_error`` the reason when not."""

    def __init__(self, node, slot_bytes: int):
        self.node, self.slot_bytes = node, slot_bytes
        area = -(-slot_bytes // CONTROL_BYTES) * CONTROL_BYTES  # the turn areas' alignment
        # room to align the flag and the slot, then the two turn areas
        size = 2 * CONTROL_BYTES + area + 2 * TURN_BYTES
        #: the bytes of this rank's segment
        self.nbytes = size
        win, error = None, None
        try:
            win = MPI.Win.Allocate_shared(size, 1, comm=node)
        except MPI.Exception as exc:
            error = exc
        failed = node.allgather(None if error is None else str(error))
        if any(failed):
            if win is not None:
                win.Free()
            bad = [r for r, e in enumerate(failed) if e]
            raise WindowError(
                f"mlcomm: cannot allocate the node's shared-memory window ({size} bytes per "
                f"rank, {size * node.Get_size()} in all) on node ranks {bad}: "
                f"{next(e for e in failed if e)}. Shared memory lives in /dev/shm: check "
                f"its free space (df -h /dev/shm), set MLCOMM_SHM_BYTES lower, or choose "
                f"an algorithm that does not use the window") from None
        self.win = win
        bases = [win.Shared_query(r)[0] for r in range(node.Get_size())]
        self.segments = [MPI.buffer(b).address for b in bases]
        self._keep = bases
        #: the address of each local rank's flag and of its slot, each on its own cache lines
        align = lambda a: -(-a // CONTROL_BYTES) * CONTROL_BYTES
        self.flags = [align(a) for a in self.segments]
        self.slots = [f + CONTROL_BYTES for f in self.flags]
        #: each local rank's two turn areas (``turns[t][j]``), and the one the node's next
        #: collective with turns uses (every rank of the node runs the same collectives),
        #: an int64 the compiled loop flips at :attr:`turn_address`
        self.turns = [[s + area + t * TURN_BYTES for s in self.slots] for t in (0, 1)]
        self._turn = np.zeros(1, np.int64)
        self.turn_address = self._turn.__array_interface__["data"][0]
        #: the area the node's next rotating collective takes (:meth:`rotations`)
        self.rotation = 0
        self._mapped = 0  # bytes of this rank's slot allocated in advance (map_slots)
        self._peers_mapped = 0  # and of its peers' slots mapped (map_peers)
        win.Fence()  # the zeroed flags are visible to every rank before any post
        from ..peer import probe
        self.pids, self.single_copy_error = probe(node)
        self.single_copy = self.single_copy_error is None

    def rotations(self, nbytes: int) -> tuple:
        """``(areas, area_bytes)``: for a rotating program that writes ``nbytes`` of its slot,
        each local rank's address of every area (``areas[k][j]``) and their size; the slots
        whole, one area, where :data:`MIN_ROTATIONS` of ``nbytes`` do not fit in a slot."""
        area = -(-max(nbytes, 1) // CONTROL_BYTES) * CONTROL_BYTES
        count = min(ROTATIONS, self.slot_bytes // area)
        if count < MIN_ROTATIONS:
            return [self.slots], self.slot_bytes
        return [[s + k * area for s in self.slots] for k in range(count)], area

    def map_slots(self, nbytes: int) -> None:
        """Allocate and map the first ``nbytes`` of this rank's slot now (a rotating
        binding's areas: see :func:`_map_now`), on this rank's memory: it writes them first,
        and its peers read them only after its posts. A peer's first read of an area maps
        it in the peer (16 pages a fault where the kernel maps around a fault)."""
        if nbytes > self._mapped:
            mine = self.slots[self.node.Get_rank()]
            _map_now(mine + self._mapped, nbytes - self._mapped)
            self._mapped = nbytes

    def map_peers(self, nbytes: int) -> None:
        """Map the first ``nbytes`` of every peer's slot in this process now, read-only (a
        rotating binding's areas, after its first collective has completed, by when every
        peer has allocated them with :meth:`map_slots`): otherwise each call's first read
        of an area faults it in (shared_memory at 64 KiB and P = 2 on 2 cores: the first
        pass over 32 areas took 18-21 us a call, 11 with this, then 8)."""
        if nbytes > self._peers_mapped:
            me = self.node.Get_rank()
            for j, slot in enumerate(self.slots):
                if j != me:
                    _map_now(slot + self._peers_mapped, nbytes - self._peers_mapped, False)
            self._peers_mapped = nbytes

    @property
    def turn(self) -> int:
        return int(self._turn[0])

    @turn.setter
    def turn(self, value: int):
        self._turn[0] = value

    def flag_array(self, local: int, offset: int = 0) -> np.ndarray:
        """Local rank ``local``'s flag, or the word ``offset`` bytes after it."""
        raw = (ctypes.c_char * 8).from_address(self.flags[local] + offset)
        return np.frombuffer(raw, np.int64)

    def addresses_at(self, local: int) -> int:
        """Where local rank ``local`` publishes its input's and its output's address."""
        return self.flags[local] + ADDRESSES

    def address_array(self, local: int) -> np.ndarray:
        """Local rank ``local``'s published input and output addresses."""
        import ctypes
        raw = (ctypes.c_char * 16).from_address(self.addresses_at(local))
        return np.frombuffer(raw, np.int64)

    def free(self) -> None:
        if self.win is not None and not MPI.Is_finalized():
            self.win.Free()
        self.win = None


def define(compile):
    """``(start, test)`` of this transport, as :func:`compile_calls` compiles them."""
    @compile
    def start(context, first, n):
        head = carray(i64_array_at(context), _FLAGS)
        ctx = carray(i64_array_at(context), _FLAGS + head[_L] + 2 * (first + n))
        mine = ctx[_FLAGS + ctx[_ME]]
        store_release(mine + ADDRESSES, ctx[_IN])
        store_release(mine + ADDRESSES + 8, ctx[_OUT])
        begins = first <= ctx[_FIRST_POST] < first + n
        if begins:
            store_release(mine + LAYOUT, (ctx[_BASE] << DIGEST_BITS) + ctx[_DIGEST])
        for i in range(first, first + n):
            store_release(mine, ctx[_BASE] + ctx[_FLAGS + ctx[_L] + 2 * i + 1])
        if begins:
            moved = carray(i64_array_at(ctx[_MOVED]), 1)
            moved[0] += ctx[_BYTES]
        return 0

    @compile
    def test(context, first, n):
        head = carray(i64_array_at(context), _FLAGS)
        ctx = carray(i64_array_at(context), _FLAGS + head[_L] + 2 * (first + n))
        syncs = _FLAGS + ctx[_L]
        for i in range(first, first + n):
            if ctx[syncs + 2 * i + 1] == 0:  # the collective begins: this rank's base
                ctx[_BASE] = load_acquire(ctx[_FLAGS + ctx[_ME]])
        for i in range(first, first + n):
            peer, count = ctx[syncs + 2 * i], ctx[syncs + 2 * i + 1]
            if load_acquire(ctx[_FLAGS + peer]) < ctx[_BASE] + count:
                return 0
        ours = (ctx[_BASE] << DIGEST_BITS) + ctx[_DIGEST]
        for i in range(first, first + n):
            peer = ctx[syncs + 2 * i]
            if ctx[syncs + 2 * i + 1] > 0:
                theirs = load_acquire(ctx[_FLAGS + peer] + LAYOUT)
                if theirs >> DIGEST_BITS == ctx[_BASE] and theirs != ours:
                    ctx[_ODD] = peer
                    return FAULT
        return 1

    return start, test


class NodeSync(Transport):
    """The node synchronisations of one program on ``window`` (see the module docstring).
    Its waits watch the peers' flags (:attr:`~mlcomm.transport.Transport.passive`).

    ``local`` is this rank's index in the node, ``ranks`` the node's ranks in the
    communicator (for stall reports). The program's first post adds ``window_bytes`` (what
    a run reads from its peers' slots) to ``moved[WINDOW]`` (a session's counters,
    :data:`mlcomm.transport.PATHS`).
    """

    passive = True

    def __init__(self, window: NodeWindow, syncs, local: int, ranks, addresses=(0, 0),
                 moved=None, window_bytes=0, digest=0):
        self.window, self.syncs, self.ranks = window, tuple(syncs), tuple(ranks)
        nlocal = len(window.flags)
        ctx = np.zeros(_FLAGS + nlocal + 2 * max(len(self.syncs), 1), np.int64)
        ctx[_ME], ctx[_L] = local, nlocal
        ctx[_DIGEST], ctx[_ODD] = digest, -1
        ctx[_IN], ctx[_OUT] = addresses
        self.moved = np.zeros(len(PATHS), np.int64) if moved is None else moved
        ctx[_MOVED] = self.moved[WINDOW:].__array_interface__["data"][0]
        ctx[_BYTES] = window_bytes
        ctx[_FIRST_POST] = next((i for i, s in enumerate(self.syncs) if s.post), -1)
        ctx[_FLAGS:_FLAGS + nlocal] = window.flags
        for i, s in enumerate(self.syncs):
            ctx[_FLAGS + nlocal + 2 * i:_FLAGS + nlocal + 2 * i + 2] = (s.peer, s.count)
        self._ctx = ctx
        self._flags = [window.flag_array(j) for j in range(nlocal)]
        self._words = [window.flag_array(j, LAYOUT) for j in range(nlocal)]
        self._published = window.address_array(local)
        self._me = local
        self.compiled = (ctx.__array_interface__["data"][0], *compile_calls(define))

    def start(self, first, n):
        mine = self._flags[self._me]
        self._published[:] = self._ctx[_IN:_OUT + 1]
        begins = first <= self._ctx[_FIRST_POST] < first + n
        if begins:
            self._words[self._me][0] = self._word()
        for s in self.syncs[first:first + n]:  # aligned 8-byte stores; x86 keeps their order
            mine[0] = self._ctx[_BASE] + s.count
        if begins:
            self.moved[WINDOW] += self._ctx[_BYTES]
        return 0

    def test(self, first, n):
        syncs = self.syncs[first:first + n]
        if any(s.count == 0 for s in syncs):
            self._ctx[_BASE] = self._flags[self._me][0]
        base = self._ctx[_BASE]
        if not all(self._flags[s.peer][0] >= base + s.count for s in syncs):
            return 0
        ours = self._word()
        for s in syncs:
            theirs = int(self._words[s.peer][0])
            if s.count > 0 and theirs >> DIGEST_BITS == base and theirs != ours:
                self._ctx[_ODD] = s.peer
                return FAULT
        return 1

    def _word(self) -> int:
        """This collective's word (:data:`LAYOUT`)."""
        return (int(self._ctx[_BASE]) << DIGEST_BITS) + int(self._ctx[_DIGEST])

    def pending_peers(self, first, n):
        base = self._ctx[_BASE]
        return sorted({self.ranks[s.peer] for s in self.syncs[first:first + n]
                       if self._flags[s.peer][0] < base + s.count})

    def fault(self) -> str:
        odd = int(self._ctx[_ODD])
        if odd < 0:
            return "a node synchronisation failed"
        return (f"rank {self.ranks[odd]} runs another call on the node's window than this "
                f"rank (another count, dtype, op or algorithm)")

    def free(self) -> None:
        self.compiled = None


def digest(plan) -> int:
    """:data:`DIGEST_BITS` bits of ``plan``'s call: its collective, algorithm, count, dtype,
    op and options (not whether it runs in place), the same in every process. An uneven
    form's count and its per-rank counts (all-to-all-v's) differ from rank to rank, and are
    left out."""
    collective, algorithm, _, count, dtype, op, options, _ = plan.key
    if collective.endswith("v"):
        count = 0
        options = tuple(kv for kv in options if kv[0] not in ("sendcounts", "recvcounts"))
    call = repr((collective, algorithm, count, dtype.str, op, options)).encode()
    return zlib.crc32(call) & ((1 << DIGEST_BITS) - 1)


def bind(site) -> NodeSync:
    """The node synchronisations of ``site``'s program on its window
    (:class:`mlcomm.transport.Site`)."""
    program, schedule = site.plan.program, site.plan.schedule
    return NodeSync(site.window, program.syncs, schedule.node.index(schedule.rank),
                    schedule.node, site.addresses[:2], site.moved, program.moved[WINDOW],
                    digest(site.plan))
