"""A transport added from outside the package: a toy that carries a program's messages
between ranks of one process through NumPy copies, registered here without touching any
other file, runs a real all-reduce (ring, three ranks in this process) to the exact result."""

from collections import deque
from dataclasses import replace

import numpy as np
import pytest

from mlcomm.algorithms import COLLECTIVES
from mlcomm.ir.program import MPI_P2P, lower
from mlcomm.runtime.binding import Binding, Settings
from mlcomm.runtime.frame import DONE, MAX_TRANSPORTS
from mlcomm.runtime.plan import plan_for_schedule
from mlcomm.transport import Transport, registry

LOOPBACK = 6  # a free id


class Loopback(Transport):
    """Messages between ranks of one process: a send copies its bytes into the mailbox of
    its pair of ranks (``boxes``, shared by the ranks), a receive takes the oldest out."""

    def __init__(self, boxes, rank, transfers, message):
        self.boxes, self.rank, self.transfers = boxes, rank, transfers
        self.views = [np.frombuffer(message(t), np.uint8) for t in transfers]
        self.pending = []  # receives started and not yet complete, in order

    def start(self, first, n):
        for i in range(first, first + n):
            t = self.transfers[i]
            if t.recv:
                self.pending.append(i)
            else:
                self.boxes.setdefault((self.rank, t.peer), deque()).append(self.views[i].copy())
        return 0

    def test(self, first, n):
        while self.pending:
            i = self.pending[0]
            box = self.boxes.get((self.transfers[i].peer, self.rank))
            if not box:
                return 0
            self.views[i][:] = box.popleft()
            self.pending.pop(0)
        return 1

    def pending_peers(self, first, n):
        return sorted({self.transfers[i].peer for i in self.pending})

    def fault(self):
        return "no fault"


def bind(site):
    """The toy's factory: ``site.comm`` is the ranks' shared mailboxes."""
    return Loopback(site.comm, site.plan.schedule.rank, site.plan.program.transfers,
                    site.message)


@pytest.fixture
def loopback():
    registry.register(LOOPBACK, "loopback", bind)
    yield LOOPBACK
    registry.unregister(LOOPBACK)


def run_in_process(algorithm, size, data, transport):
    """Every rank's binding of ``algorithm`` in this process, its messages on
    ``transport``; each loop runs until it waits, then the next rank's, until all are done."""
    boxes, bindings, outs = {}, [], []
    settings = Settings(stall_seconds=1e-9, yield_mask=0, compiled=False)
    for rank in range(size):
        schedule = COLLECTIVES["allreduce"][algorithm].build(rank, size, data[rank].size,
                                                             data.itemsize)
        plan = plan_for_schedule(schedule, data.dtype, algorithm=algorithm)
        plan = replace(plan, program=lower(schedule, data.itemsize, messages=transport))
        outs.append(np.empty_like(data[rank]))
        bindings.append(Binding(boxes, plan, data[rank], outs[-1], settings))
    done = set()
    while len(done) < size:
        for rank, binding in enumerate(bindings):
            if rank not in done and binding.loop() == DONE:
                done.add(rank)
    assert not any(boxes.values()), "messages left unreceived"
    return bindings, outs


@pytest.mark.parametrize("algorithm,size", [("ring", 3), ("recursive_doubling", 4),
                                            ("ring", 1)])
def test_a_registered_toy_transport_runs_an_allreduce(loopback, algorithm, size):
    data = np.arange(size * 1000, dtype=np.float64).reshape(size, 1000) % 97 + 1
    bindings, outs = run_in_process(algorithm, size, data, loopback)
    for binding, out in zip(bindings, outs):
        if size > 1:  # one rank sends nothing
            assert binding.plan.program.transport_ids == {loopback}
            assert isinstance(binding.transports[loopback], Loopback)
        assert np.array_equal(out, data.sum(axis=0))  # small integers: exact in any order


def test_an_unregistered_id_is_an_error_that_names_it():
    data = np.ones((2, 8))
    with pytest.raises(ValueError, match="transport id 6, which no transport registers"):
        run_in_process("ring", 2, data, LOOPBACK)


def test_the_registry_refuses_a_taken_id_and_binds_the_four_builtins():
    assert [e.name for _, e in sorted(registry.TRANSPORTS.items())] == \
        ["mpi", "window", "peer", "native"]
    with pytest.raises(ValueError, match="'mpi' already"):
        registry.register(MPI_P2P, "again", bind)
    assert LOOPBACK < MAX_TRANSPORTS
