"""mlcomm.iallreduce and persistent handles' start/wait: many outstanding, in order, exact."""

import time

import numpy as np
import pytest
from mpi4py import MPI

import mlcomm
from mlcomm import session
from mlcomm.benchmark.verify import reference

from mpi_helpers import COMM, agree, runs_here

pytestmark = pytest.mark.mpi
P, RANK = COMM.Get_size(), COMM.Get_rank()
ALGOS = runs_here(sorted(mlcomm.ALGORITHMS))


@pytest.mark.parametrize("name", ALGOS)
def test_many_outstanding_requests_are_exact(name):
    xs = [(np.arange(100 + 7 * k, dtype=np.int64) * (RANK + 1) + k) % 1013 for k in range(8)]
    ys = [np.empty_like(x) for x in xs]
    requests = [mlcomm.iallreduce(x, y, algorithm=name) for x, y in zip(xs, ys)]
    assert all(isinstance(r, mlcomm.Request) for r in requests)
    for x, y, r in zip(xs, ys, requests):
        agree(r.wait() is y and np.array_equal(y, reference(COMM, x, "sum")), f"{name}")
        agree(r.test(), "test() after wait()")


@pytest.mark.parametrize("validate", [False, True])
def test_a_collective_of_the_callers_thread_waits_for_the_started_calls(validate):
    """A new size's agreement on auto's choice and validate=True's comparison are
    collectives on the communicator, as the library's calls that a started call may run in
    the progress thread are; two threads' collectives on one communicator can meet in a
    different order on each rank (an iallreduce under auto at a new size hung so on nodes
    of 3, 3 and 1). Each waits until the started calls are complete."""
    s = session.session_of(COMM)
    done = []

    def slow():
        time.sleep(0.2)
        done.append(True)
    request = s.start(slow)
    if validate:
        mlcomm.allreduce(np.ones(3), validate=True, algorithm="ring")
    else:
        s.agree(None, "the test's agreement")
    agree(done == [True], "a collective of the caller's thread ran beside a started call")
    request.wait()


def test_requests_complete_in_the_order_they_were_started():
    xs = [np.full(50000, float(RANK + k)) for k in range(6)]
    requests = [mlcomm.iallreduce(x, algorithm="ring") for x in xs]
    in_order, done = True, []
    while len(done) < len(requests):  # no collective in here: ranks loop different times
        # later requests first: one seen complete means every earlier one is by then
        flags = [r.test() for r in reversed(requests)][::-1]
        done = [k for k, flag in enumerate(flags) if flag]
        in_order &= done == list(range(len(done)))
    agree(in_order, "a request completed before one started earlier")
    for k, r in enumerate(requests):
        agree(np.all(r.wait() == P * k + P * (P - 1) / 2))


def test_test_is_false_until_every_rank_has_started():
    x, y = np.ones(1000), np.empty(1000)
    early = False
    if RANK == 0 and P > 1:
        r = mlcomm.iallreduce(x, y, algorithm="ring")
        time.sleep(0.2)
        early = r.test()
        COMM.Barrier()
    else:
        COMM.Barrier()
        r = mlcomm.iallreduce(x, y, algorithm="ring")
    agree(np.all(r.wait() == P) and not early, "complete before the peers started")


def test_blocking_calls_wait_for_started_ones_and_ops_and_avg_work():
    a, b = np.arange(10.0) + RANK, np.arange(10.0) * (RANK + 1)
    r1 = mlcomm.iallreduce(a, op="max", algorithm="recursive_doubling")
    r2 = mlcomm.iallreduce(mlcomm.IN_PLACE, b, op="avg", algorithm="ring")
    c = mlcomm.allreduce(np.full(10, float(RANK)), algorithm="ring")  # after r1 and r2
    agree(r1.test() and r2.test(), "a blocking call overtook started calls")
    agree(np.array_equal(r1.wait(), np.arange(10.0) + P - 1))
    agree(np.allclose(r2.wait(), np.arange(10.0) * (P + 1) / 2) and r2.wait() is b)
    agree(np.all(c == P * (P - 1) / 2))


def test_a_request_progresses_while_its_rank_computes_without_calling_mlcomm():
    """Rank 0 starts an all-reduce and only then lets the peers start theirs; it then computes
    (NumPy, no mlcomm call) until every peer reports its request complete. The ring's later
    steps need rank 0's reductions, so the peers finish only if rank 0's request progresses
    on its own, during the compute."""
    if P < 2:
        pytest.skip("needs two ranks")
    tag, want = 771, P * (P + 1) // 2
    x = np.full(1 << 18, RANK + 1, np.float32)
    mlcomm.allreduce(x, algorithm="ring")  # the session and the plan exist before timing
    if RANK == 0:
        r = mlcomm.iallreduce(x, algorithm="ring")
        for peer in range(1, P):
            COMM.send("go", dest=peer, tag=tag)
        reported, chunks, status = set(), 0, MPI.Status()
        deadline = time.monotonic() + 60
        while len(reported) < P - 1 and time.monotonic() < deadline:
            np.sum(np.sqrt(np.arange(20000.0)))  # this rank's own work
            chunks += 1
            while COMM.Iprobe(MPI.ANY_SOURCE, tag, status):
                reported.add(COMM.recv(source=status.Get_source(), tag=tag))
        if len(reported) < P - 1:  # the peers wait in their request: end the job from here
            pytest.fail(f"after {chunks} chunks of compute, only ranks {sorted(reported)} "
                        f"of 1..{P - 1} completed")
        got = r.wait()
    else:
        COMM.recv(source=0, tag=tag)
        got = mlcomm.iallreduce(x, algorithm="ring").wait()
        COMM.send(RANK, dest=0, tag=tag)
    agree(np.all(got == want), f"sum {got[:4]}, want {want}")


def test_persistent_start_wait_and_test():
    x, y = np.empty(33, np.int32), np.empty(33, np.int32)
    handle = mlcomm.allreduce_init(x, y, algorithm="recursive_halving_doubling")
    with pytest.raises(ValueError, match="start"):
        handle.wait()
    for trial in range(4):
        x[...] = np.arange(33) + RANK + trial
        handle.start()
        got = handle.wait()
        agree(got is y and np.array_equal(y, reference(COMM, x, "sum")), f"trial {trial}")
        agree(handle.test())


def test_requests_on_two_communicators():
    dup = COMM.Dup()
    r1 = mlcomm.iallreduce(np.full(7, 1.0), algorithm="ring")
    r2 = mlcomm.iallreduce(np.full(7, 2.0), comm=dup, algorithm="ring")
    agree(np.all(r2.wait() == 2 * P) and np.all(r1.wait() == P))
    dup.Free()


def test_a_bad_call_raises_before_starting():
    with pytest.raises(ValueError, match="recvbuf has 3 elements"):
        mlcomm.iallreduce(np.ones(4), np.ones(3))
    agree(np.all(mlcomm.iallreduce(np.ones(4)).wait() == P))


@pytest.mark.parametrize("name", ["ring", "naive", "recursive_doubling"])
def test_the_transport_counts_the_bytes_it_sends(name):
    """Counted where messages are posted, and equal to what the schedule sends."""
    from mlcomm import session
    from mlcomm.algorithms import ALGORITHMS
    from mlcomm.ir.schedule import Send
    s = session.session_of(COMM)
    x = np.ones(1001)
    before = s.bytes_sent()
    for _ in range(3):
        mlcomm.allreduce(x, algorithm=name)
    mlcomm.iallreduce(x, algorithm=name).wait()
    schedule = ALGORITHMS[name].build(RANK, P, x.size, x.itemsize)
    want = sum(t.region.count for _, t in schedule.transfers() if isinstance(t, Send)) * 8
    agree(s.bytes_sent() - before == 4 * want, f"{s.bytes_sent() - before} != 4 x {want}")
