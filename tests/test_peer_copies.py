"""Single-copy reads and writes of another process's memory (mlcomm.transport.peer), and the
node window's mapping of shared pages in advance, in one process."""

import ctypes
import os

import numpy as np
import pytest
from mpi4py import MPI

from mlcomm.ir.program import OUTPUT, Fetch
from mlcomm.transport import FAULT
from mlcomm.transport.peer import PeerCopies, probe
from mlcomm.transport import window
from mlcomm.transport.window import ADDRESSES


def _start(reads, compiled):
    """``reads.start(0, 1)`` in Python, or through the compiled loop's C function."""
    if not compiled:
        return reads.start(0, 1)
    context, start, _ = reads.compiled
    return ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                            ctypes.c_int64)(start)(context, 0, 1)


class _Window:
    """What PeerCopies needs of a node window: pids, flag addresses, published addresses."""

    def __init__(self, pids):
        self.pids = pids
        self.words = np.zeros((len(pids), ADDRESSES // 8 + 2), np.int64)
        self.flags = [self.words.ctypes.data + j * self.words.strides[0]
                      for j in range(len(pids))]

    def addresses_at(self, j):
        return self.flags[j] + ADDRESSES

    def address_array(self, j):
        return self.words[j, ADDRESSES // 8:]


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("write, fetch, want", [
    (False, Fetch(0, OUTPUT, 3 * 8, 0, 8, 3 * 8), [0, 3, 4, 5, 0, 0]),
    (True, Fetch(0, OUTPUT, 2 * 8, 0, 5 * 8, 3 * 8, True), [0, 0, 5, 6, 7, 0])])
def test_a_copy_moves_between_the_published_address_and_a_local_one(compiled, write, fetch,
                                                                     want):
    """A read copies from the peer's published output into this rank's buffer; a write
    the other way."""
    source, target = np.arange(10, dtype=np.float64), np.zeros(6)
    published, local = (target, source) if write else (source, target)
    window = _Window([os.getpid()])
    window.address_array(0)[OUTPUT] = published.ctypes.data  # "local rank 0's output"
    copies = PeerCopies(window, [fetch], [local.ctypes.data], [7])
    assert _start(copies, compiled) == 0 and copies.test(0, 1) == 1
    assert target.tolist() == want


@pytest.mark.parametrize("compiled", [False, True])
def test_a_failed_write_faults_and_names_the_peer(compiled):
    window = _Window([os.getpid()])
    window.address_array(0)[OUTPUT] = 8  # unmapped
    source = np.zeros(4)
    writes = PeerCopies(window, [Fetch(0, OUTPUT, 0, 0, 0, 32, True)], [source.ctypes.data], [7])
    assert _start(writes, compiled) == FAULT
    message = writes.fault()
    assert "write of 32 bytes to rank 7's output" in message and "Bad address" in message


@pytest.mark.parametrize("compiled", [False, True])
def test_a_failed_read_faults_and_says_how_to_turn_reads_off(compiled):
    window = _Window([os.getpid()])
    window.address_array(0)[OUTPUT] = 8  # unmapped
    target = np.zeros(4)
    reads = PeerCopies(window, [Fetch(0, OUTPUT, 0, 0, 0, 32)], [target.ctypes.data], [7])
    assert _start(reads, compiled) == FAULT
    message = reads.fault()
    assert "32 bytes from rank 7's output" in message and "Bad address" in message
    assert "MLCOMM_SINGLE_COPY=0" in message


def test_the_probe_reads_a_peer_or_says_why_not(monkeypatch):
    pids, error = probe(MPI.COMM_SELF)
    assert pids == [os.getpid()] and error is None
    monkeypatch.setenv("MLCOMM_SINGLE_COPY", "0")
    assert probe(MPI.COMM_SELF)[1] == "MLCOMM_SINGLE_COPY=0"


@pytest.mark.parametrize("write", [True, False], ids=["write", "read"])
@pytest.mark.parametrize("advice", [True, False], ids=["madvise", "touch"])
def test_shared_pages_are_mapped_in_advance(monkeypatch, advice, write):
    """The window maps a range of shared pages (from an unaligned address) before any call
    stores into it (``write``; before any call reads it, else): by MADV_POPULATE_WRITE
    (MADV_POPULATE_READ), or by reading a byte of each page where the kernel refuses it.
    Storing into (reading) the range afterwards takes no page fault."""
    import mmap
    import resource
    if not advice:  # EINVAL, as before 5.14
        monkeypatch.setattr(window, "_MADV_POPULATE_WRITE", -1)
        monkeypatch.setattr(window, "_MADV_POPULATE_READ", -1)
    pages = 64
    shared = mmap.mmap(-1, pages * mmap.PAGESIZE, flags=mmap.MAP_SHARED)
    x = np.frombuffer(shared, np.uint8)
    start = ctypes.addressof(ctypes.c_char.from_buffer(shared))
    window._map_now(start + 100, len(x) - 100, write)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    if write:
        x[100:] = 7  # the first page from byte 100 on: the range starts there
    else:
        x[100::mmap.PAGESIZE // 2].sum()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    assert faults < pages // 4, f"{faults} faults on {pages} mapped pages"
    del x
    shared.close()
