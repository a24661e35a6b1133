"""Each rank's compute and communication spans, written as one Chrome trace for the job.

The file is the Trace Event Format that chrome://tracing and Perfetto open, as Horovod's
timeline is: complete events (``"ph": "X"``) with ``pid`` = rank, ``tid`` 0 for compute and
1 for communication, ``ts`` and ``dur`` in microseconds on rank 0's clock from the start,
and metadata events naming each process and thread. Each rank's clock is set against rank
0's by ping-pong messages at the start (the round trip with the shortest time wins, as in
NTP). Rank 0 gathers every rank's events and writes the file.
"""

from __future__ import annotations

import json
import os
import threading
import time

__all__ = ["TrainTimeline", "THREADS", "read"]

THREADS = {"compute": 0, "communication": 1}


class TrainTimeline:
    """Spans of one rank, in ``time.perf_counter()`` seconds, kept from ``start`` on."""

    def __init__(self, rank: int):
        self.rank = rank
        self.start = time.perf_counter()
        self._events: list = []
        self._lock = threading.Lock()  # spans come from the training and watcher threads

    def restart(self, comm, rounds: int = 8) -> None:
        """Drop every span; count time from now on rank 0's clock (collective)."""
        offset = _offset_to_rank0(comm, rounds)
        start = comm.bcast(time.perf_counter() if comm.Get_rank() == 0 else None, root=0)
        with self._lock:
            self.start = start - offset  # rank 0's start, read on this rank's clock
            self._events = []

    def add(self, name: str, start: float, end: float, thread: str = "compute", **args) -> None:
        """Record the span ``[start, end]`` (perf_counter seconds) on ``thread``."""
        if start < self.start:
            return  # before the start: set-up, not training
        event = {"name": name, "cat": thread, "ph": "X", "pid": self.rank,
                 "tid": THREADS[thread], "ts": round((start - self.start) * 1e6, 3),
                 "dur": round(max(0.0, end - start) * 1e6, 3)}
        if args:
            event["args"] = args
        with self._lock:
            self._events.append(event)

    def events(self) -> list:
        with self._lock:
            return list(self._events)

    def write(self, path: str, comm) -> None:
        """Gather every rank's spans on rank 0 and write ``path`` there (collective)."""
        everyone = comm.gather(self.events(), root=0)
        if comm.Get_rank():
            return
        trace = []
        for rank, events in enumerate(everyone):
            trace.append({"name": "process_name", "ph": "M", "pid": rank,
                          "args": {"name": f"rank {rank}"}})
            trace.append({"name": "process_sort_index", "ph": "M", "pid": rank,
                          "args": {"sort_index": rank}})
            for thread, tid in THREADS.items():
                trace.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid,
                              "args": {"name": thread}})
            trace.extend(sorted(events, key=lambda e: (e["tid"], e["ts"])))
        path = os.fspath(path)
        if os.path.dirname(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp.{os.getpid()}"
        with open(tmp, "w") as fh:
            json.dump({"traceEvents": trace, "displayTimeUnit": "ms"}, fh)
        os.replace(tmp, path)


def _offset_to_rank0(comm, rounds):
    """Rank 0's clock minus this rank's, from the ping-pong with the shortest round trip."""
    rank, best = comm.Get_rank(), (float("inf"), 0.0)
    for peer in range(1, comm.Get_size()):
        for _ in range(rounds):
            if rank == 0:
                comm.recv(source=peer, tag=77)
                comm.send(time.perf_counter(), dest=peer, tag=78)
            elif rank == peer:
                t1 = time.perf_counter()
                comm.send(None, dest=0, tag=77)
                t0 = comm.recv(source=0, tag=78)
                t2 = time.perf_counter()
                best = min(best, (t2 - t1, t0 - (t1 + t2) / 2))
    return best[1]


def read(path: str) -> dict:
    """``{rank: {thread: [(name, start_s, end_s), ...]}}`` from a timeline file."""
    with open(path) as fh:
        events = json.load(fh)["traceEvents"]
    names = {tid: thread for thread, tid in THREADS.items()}
    out: dict = {}
    for e in events:
        if e.get("ph") == "X":
            spans = out.setdefault(e["pid"], {t: [] for t in THREADS})
            spans[names[e["tid"]]].append((e["name"], e["ts"] / 1e6,
                                           (e["ts"] + e["dur"]) / 1e6))
    return out
