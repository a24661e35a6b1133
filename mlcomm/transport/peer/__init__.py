"""Single-copy reads and writes of a node peer's own buffers: Linux cross-memory attach.

``process_vm_readv`` copies from another process's memory into this one's in the kernel,
one copy with no shared buffer between (Open MPI's ``smsc/cma`` does the same), and
``process_vm_writev`` the other way. A program that reads a peer's input or output or
writes its output (:class:`mlcomm.ir.program.Fetch`) finds the peer's address in the node
window, where the peer's post published it, and the peer's process id from :func:`probe`.

The kernel allows it between processes of one user unless Yama's ``ptrace_scope`` is 2 or
3 or a container withholds ``CAP_SYS_PTRACE``; under ``ptrace_scope`` 1 each process names
any process of its user as a permitted reader (``PR_SET_PTRACER``), as Open MPI does.
:func:`probe` tries one read per rank when the window is made and says, on every rank
alike, whether single-copy reads are used on this node. ``MLCOMM_SINGLE_COPY=0`` turns
them off.
"""

from __future__ import annotations

import ctypes
import os
from functools import lru_cache

import numpy as np
from numba import carray

from ... import config
from ..cabi import call0, call6, i64_array_at, libc, load_acquire
from .. import FAULT, PATHS, SINGLE_COPY, Transport, compile_calls

__all__ = ["probe", "PeerCopies", "bind"]

_PR_SET_PTRACER, _PR_SET_PTRACER_ANY = 0x59616D61, ctypes.c_ulong(-1)
_ERRNO_AT, _FAILED, _GOT, _ERRNO, _IOV = 0, 1, 2, 3, 4  # _IOV: two iovecs, four words
_MOVED = _IOV + 4  # the address of the single-copy bytes counter
_HEAD, _WORDS = _MOVED + 1, 6  # per fetch: pid, address word, offset, local address, nbytes, function


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_CALLS = ("process_vm_readv", "process_vm_writev")


@lru_cache(maxsize=None)
def _function(write: bool):
    fn = getattr(libc(), _CALLS[write])
    fn.restype = ctypes.c_ssize_t
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong,
                   ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.c_ulong]
    return fn


def move(pid: int, remote: int, local: int, nbytes: int, write: bool = False) -> None:
    """Copy ``nbytes`` at ``remote`` in process ``pid`` to ``local`` (with ``write``, from
    ``local`` to ``remote``); OSError on failure."""
    mine, theirs = _IoVec(local, nbytes), _IoVec(remote, nbytes)
    got = _function(write)(pid, ctypes.byref(mine), 1, ctypes.byref(theirs), 1, 0)
    if got != nbytes:
        err = ctypes.get_errno()
        raise OSError(err, f"{_CALLS[write]} moved {got} of {nbytes} bytes: "
                           f"{os.strerror(err) if got < 0 else 'short copy'}")


def _allow_readers() -> None:
    """Under Yama ``ptrace_scope`` 1, let the node's other processes read this one."""
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            scope = f.read().strip()
    except OSError:
        return
    if scope == "1":
        libc().prctl(_PR_SET_PTRACER, _PR_SET_PTRACER_ANY, 0, 0, 0)


def probe(node) -> tuple:
    """``(pids, error)`` over the node communicator ``node`` (collective): each rank reads a
    word of its next local rank's memory; ``error`` is None when every read worked, else
    why single-copy reads are off on this node."""
    off = not config.single_copy()
    if not off:
        _allow_readers()
    mine = np.array([os.getpid()], np.int64)
    everyone = node.allgather((os.getpid(), mine.ctypes.data))
    size, me = node.Get_size(), node.Get_rank()
    error = "MLCOMM_SINGLE_COPY=0" if off else None
    if error is None and size > 1:
        q = (me + 1) % size
        word = ctypes.c_int64()
        try:
            move(everyone[q][0], everyone[q][1], ctypes.addressof(word), 8)
            if word.value != everyone[q][0]:
                raise OSError(0, "read the wrong bytes")
        except (OSError, AttributeError) as exc:
            error = f"local rank {me} cannot read local rank {q}'s memory ({exc})"
    errors = node.allgather(error)  # every read is done before ``mine`` goes
    return [pid for pid, _ in everyone], next((e for e in errors if e), None)


def define(compile):
    """``(start, test)`` of this transport, as :func:`compile_calls` compiles them."""
    @compile
    def start(context, first, n):
        ctx = carray(i64_array_at(context), _HEAD + _WORDS * (first + n))
        moved = carray(i64_array_at(ctx[_MOVED]), 1)
        iov = context + 8 * _IOV
        for i in range(first, first + n):
            f = _HEAD + _WORDS * i
            ctx[_IOV], ctx[_IOV + 1] = ctx[f + 3], ctx[f + 4]
            ctx[_IOV + 2], ctx[_IOV + 3] = load_acquire(ctx[f + 1]) + ctx[f + 2], ctx[f + 4]
            got = call6(ctx[f + 5], ctx[f], iov, 1, iov + 16, 1, 0)
            if got != ctx[f + 4]:
                ctx[_FAILED], ctx[_GOT] = i, got
                ctx[_ERRNO] = load_acquire(call0(ctx[_ERRNO_AT])) & 0xFFFFFFFF
                return -1
            moved[0] += got
        return 0

    @compile
    def test(context, first, n):
        return 1

    return start, test


class PeerCopies(Transport):
    """The single-copy reads and writes of one program (:class:`mlcomm.ir.program.Fetch`) on
    ``window``: each copies between a local peer's input or output, whose address the peer
    published, and ``addresses[fetch.buffer] + fetch.at``. ``ranks``: the node's ranks
    (messages). Every byte copied is added to ``moved[SINGLE_COPY]`` (a session's counters,
    :data:`mlcomm.transport.PATHS`)."""

    def __init__(self, window, fetches, addresses, ranks, moved=None):
        from ..cabi import libc_address
        self.fetches, self.ranks = tuple(fetches), tuple(ranks)
        ctx = np.zeros(_HEAD + _WORDS * max(len(self.fetches), 1), np.int64)
        ctx[_ERRNO_AT] = libc_address("__errno_location")
        self.moved = np.zeros(len(PATHS), np.int64) if moved is None else moved
        ctx[_MOVED] = self.moved[SINGLE_COPY:].__array_interface__["data"][0]
        calls = [libc_address(name) for name in _CALLS]
        for i, f in enumerate(self.fetches):
            ctx[_HEAD + _WORDS * i:_HEAD + _WORDS * (i + 1)] = (
                window.pids[f.peer], window.addresses_at(f.peer) + 8 * f.source,
                f.offset, addresses[f.buffer] + f.at, f.nbytes, calls[f.write])
        self._ctx = ctx
        self._published = [window.address_array(j) for j in range(len(window.flags))]
        self.compiled = (ctx.__array_interface__["data"][0], *compile_calls(define))

    def start(self, first, n):
        for i in range(first, first + n):
            f, words = self.fetches[i], self._ctx[_HEAD + _WORDS * i:_HEAD + _WORDS * (i + 1)]
            try:
                move(int(words[0]), int(self._published[f.peer][f.source]) + f.offset,
                     int(words[3]), f.nbytes, f.write)
            except OSError as exc:
                self._ctx[_FAILED], self._ctx[_GOT], self._ctx[_ERRNO] = i, -1, exc.errno or 0
                return FAULT
            self.moved[SINGLE_COPY] += f.nbytes
        return 0

    def test(self, first, n):
        return 1

    def pending_peers(self, first, n):
        return []

    def fault(self) -> str:
        i, got, err = (int(v) for v in self._ctx[[_FAILED, _GOT, _ERRNO]])
        f = self.fetches[i]
        why = os.strerror(err) if got < 0 else f"{got} bytes"
        return (f"a single-copy {'write' if f.write else 'read'} of {f.nbytes} bytes "
                f"{'to' if f.write else 'from'} rank {self.ranks[f.peer]}'s "
                f"{'output' if f.source else 'input'} failed ({why}); set "
                f"MLCOMM_SINGLE_COPY=0 to use the window's copies instead")


def bind(site) -> PeerCopies:
    """The single copies of ``site``'s program (:class:`mlcomm.transport.Site`), where the
    node allows them."""
    window, plan = site.window, site.plan
    if not window.single_copy:
        raise ValueError(f"{plan.describe()} reads its node peers' memory, which this "
                         f"node does not allow: {window.single_copy_error}")
    return PeerCopies(window, plan.program.fetches, site.addresses, plan.schedule.node,
                      site.moved)
