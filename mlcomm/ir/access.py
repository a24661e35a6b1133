"""The local executor's ranks (:mod:`mlcomm.ir.local`): each rank's buffers, its window
slots and its node peers' buffers, every access checked as it is made."""

from __future__ import annotations

import numpy as np

from .schedule import INPUT, OUTPUT, SCRATCH, Recv, Send, peer_of, slot_owner


class ScheduleError(AssertionError):
    """A schedule is wrong: deadlock, mismatch, hazard, bad read or wrong result."""


class _Slot:
    """One rank's slot of its node's window: data, and who wrote and read what when."""

    def __init__(self, owner, count, p, dtype, extra_shape):
        self.owner = owner
        self.data = np.zeros((count, *extra_shape), dtype)
        self.written = np.full(count, -1)  # the owner's step of the last write, -1: never
        # each reader's reads not yet known to the owner: (offset, stop, reader's step)
        self.reads = {q: [] for q in range(p)}


class _Rank:
    def __init__(self, schedule, inp, in_place, dtype, extra_shape, p):
        self.schedule = schedule
        self.bufs = {INPUT: inp}
        out_shape = (schedule.output_count, *extra_shape)
        self.bufs[OUTPUT] = inp if in_place else np.zeros(out_shape, dtype)
        self.bufs[SCRATCH] = np.zeros((schedule.scratch_count, *extra_shape), dtype)
        self.written = {INPUT: None,
                        OUTPUT: None if in_place else np.zeros(schedule.output_count, bool),
                        SCRATCH: np.zeros(schedule.scratch_count, bool)}
        self.alias = {INPUT: OUTPUT if in_place else INPUT, OUTPUT: OUTPUT, SCRATCH: SCRATCH}
        self.step = 0
        self.pending = 0
        self.slots = {}  # owner rank -> _Slot, for every rank of this node
        self.clock = np.full(p, -1)  # vector clock: the step of each rank seen through awaits
        self.posts = []  # the clock published by each post
        self.guarded = set()  # ranks awaited with count 0
        self.seen = set()  # ranks one of whose posts in this collective was awaited
        self.last_window_read = -1
        self.ranks = None  # every rank, for reads of a peer's buffers
        self.out_step = np.full(schedule.output_count, -1)  # the step of each output write
        self.read_by = {}  # peer -> its reads of this rank's buffers
        self.written_by = []  # peers' writes of this rank's output: (writer, lo, hi, step)
        self.own_reads = []  # this rank's reads of its output (or input in place): lo, hi, step

    def _peer(self, region, q, name, verb):
        """Rank ``q`` and its ``name`` buffer, which this rank ``verb``s at ``region``."""
        if q == self.schedule.rank or q not in self.schedule.node:
            raise ScheduleError(f"{self.where(region)}: {verb}s rank {q}'s buffers, not a "
                                f"peer of its node {self.schedule.node}")
        if self.clock[q] < 0:
            raise ScheduleError(f"{self.where(region)}: {verb}s rank {q}'s buffers before "
                                f"awaiting a post of rank {q} in this collective (which "
                                f"publishes their addresses)")
        other = self.ranks[q]
        buf = other.bufs[name]
        if region.offset < 0 or region.stop > len(buf):
            raise ScheduleError(f"{self.where(region)}: outside rank {q}'s {name} of "
                                f"{len(buf)} elements")
        return other, buf

    def _written_by_peers(self, reader, buffer, lo, hi):
        """A peer's write of this rank's output at ``[lo, hi)`` that rank ``reader`` reads
        there (through ``buffer``) without an await having shown it: an error."""
        if self.alias[buffer] != OUTPUT:
            return
        for w, a, b, step in self.written_by:
            if a < hi and lo < b and w != reader.schedule.rank and (
                    buffer == INPUT or reader.clock[w] < step):
                raise ScheduleError(
                    f"rank {reader.schedule.rank} step {reader.step}: reads rank "
                    f"{self.schedule.rank}'s {buffer}[{lo}:{hi}], which rank {w} "
                    + ("overwrote (in place)" if buffer == INPUT else
                       "wrote, before an await has made the write visible"))

    def _peer_write(self, region, q, name):
        """Rank ``q``'s output, written by this rank at ``region``."""
        if name != OUTPUT:
            raise ScheduleError(f"{self.where(region)}: writes rank {q}'s read-only {name}")
        other, buf = self._peer(region, q, name, "write")
        me, lo, hi = self.schedule.rank, region.offset, region.stop
        for x, reads in other.read_by.items():
            if x != me and any(b == OUTPUT and r > self.clock[x] and lo < b_hi and b_lo < hi
                               for b, b_lo, b_hi, r in reads):
                raise ScheduleError(f"{self.where(region)}: overwrites rank {q}'s elements "
                                    f"rank {x} may still be reading")
        if any(a < hi and lo < b and step > self.clock[q] for a, b, step in other.own_reads):
            raise ScheduleError(f"{self.where(region)}: overwrites rank {q}'s output elements "
                                f"rank {q} may still be reading")
        if (other.out_step[lo:hi] > self.clock[q]).any() or any(
                w != me and a < hi and lo < b for w, a, b, _ in other.written_by):
            raise ScheduleError(f"{self.where(region)}: writes rank {q}'s output elements "
                                f"that another rank writes too")
        return buf[lo:hi]

    def _peer_read(self, region, q, name):
        """Rank ``q``'s ``name`` buffer, read by this rank at ``region``."""
        me = self.schedule.rank
        other, buf = self._peer(region, q, name, "read")
        other._written_by_peers(self, name, region.offset, region.stop)
        if other.alias[name] == OUTPUT:
            when = other.out_step[region.offset:region.stop]
            if name == OUTPUT and (when < 0).any():
                raise ScheduleError(f"{self.where(region)}: reads rank {q}'s output elements "
                                    f"never written in this collective")
            if name == INPUT and (when >= 0).any():
                raise ScheduleError(f"{self.where(region)}: reads rank {q}'s input after rank "
                                    f"{q} overwrote it (in place)")
            if (when > self.clock[q]).any():
                raise ScheduleError(f"{self.where(region)}: reads rank {q}'s output before an "
                                    f"await has made its write visible")
        other.read_by.setdefault(me, []).append((other.alias[name], region.offset, region.stop,
                                                 self.step))
        self.last_window_read = self.step
        return buf[region.offset:region.stop]

    def where(self, region):
        return f"rank {self.schedule.rank} step {self.step} {region}"

    def _slot(self, region, writing):
        owner = slot_owner(region.buffer)
        me = self.schedule.rank
        slot = self.slots.get(owner)
        if slot is None:
            raise ScheduleError(f"{self.where(region)}: rank {owner}'s slot is not in this "
                                f"rank's node {self.schedule.node}")
        if writing and owner != me:
            raise ScheduleError(f"{self.where(region)}: writes another rank's slot")
        if region.offset < 0 or region.stop > len(slot.data):
            raise ScheduleError(f"{self.where(region)}: outside the slot of {len(slot.data)} "
                                f"elements")
        return slot

    def view(self, region, writing=False):
        found = peer_of(region.buffer)
        if found is not None:
            return self._peer_write(region, *found)
        if slot_owner(region.buffer) is not None:
            return self._slot(region, writing).data[region.offset:region.stop]
        buf = self.bufs[region.buffer]
        if region.offset < 0 or region.stop > len(buf):
            raise ScheduleError(f"{self.where(region)}: outside the {region.buffer} buffer "
                                f"of {len(buf)} elements")
        if writing and region.buffer == INPUT:
            raise ScheduleError(f"{self.where(region)}: writes the read-only input")
        return buf[region.offset:region.stop]

    def read(self, region):
        found = peer_of(region.buffer)
        if found is not None:
            return self._peer_read(region, *found)
        view = self.view(region)
        owner = slot_owner(region.buffer)
        if owner is not None:
            slot, me = self.slots[owner], self.schedule.rank
            when = slot.written[region.offset:region.stop]
            if (when < 0).any():
                raise ScheduleError(f"{self.where(region)}: reads slot elements never written "
                                    f"in this collective")
            if owner != me and (when > self.clock[owner]).any():
                raise ScheduleError(f"{self.where(region)}: reads rank {owner}'s slot before an "
                                    f"await has made its write visible")
            slot.reads[me].append((region.offset, region.stop, self.step))
            self.last_window_read = self.step
            return view
        self._written_by_peers(self, region.buffer, region.offset, region.stop)
        if self.alias[region.buffer] == OUTPUT:
            self.own_reads.append((region.offset, region.stop, self.step))
        mask = self.written[self.alias[region.buffer]] if region.buffer != INPUT else None
        if mask is not None and not mask[region.offset:region.stop].all():
            raise ScheduleError(f"{self.where(region)}: reads elements never written")
        return view

    def mark(self, region):
        found = peer_of(region.buffer)
        if found is not None:
            other = self.ranks[found[0]]
            other.written_by.append((self.schedule.rank, region.offset, region.stop, self.step))
            if other.written[OUTPUT] is not None:
                other.written[OUTPUT][region.offset:region.stop] = True
            return
        owner = slot_owner(region.buffer)
        if owner is not None:
            slot, me = self.slots[owner], self.schedule.rank
            peers = [q for q in self.schedule.node if q != me]
            if self.schedule.turns and me not in self.guarded:
                raise ScheduleError(f"{self.where(region)}: writes its turn area before its "
                                    f"first step's Await({me}, 0)")
            if not self.schedule.turns and not self.guarded >= set(peers):
                raise ScheduleError(f"{self.where(region)}: writes the slot before awaiting "
                                    f"every node rank's previous collective (Await(q, 0))")
            for q in peers:
                # a read this rank's clock has seen is ordered before every later write
                pending = [r for r in slot.reads[q] if r[2] > self.clock[q]]
                slot.reads[q] = pending
                if any(lo < region.stop and region.offset < hi for lo, hi, _ in pending):
                    raise ScheduleError(f"{self.where(region)}: overwrites slot elements rank "
                                        f"{q} may still be reading")
            slot.written[region.offset:region.stop] = self.step
            return
        if self.alias[region.buffer] == OUTPUT:
            if any(a < region.stop and region.offset < b for _, a, b, _ in self.written_by):
                raise ScheduleError(f"{self.where(region)}: writes output elements a peer "
                                    f"writes too")
            for q, reads in self.read_by.items():
                pending = [r for r in reads if r[3] > self.clock[q]]
                self.read_by[q] = pending
                if any(b == OUTPUT and lo < region.stop and region.offset < hi
                       for b, lo, hi, _ in pending):
                    raise ScheduleError(f"{self.where(region)}: overwrites output elements "
                                        f"rank {q} may still be reading")
            self.out_step[region.offset:region.stop] = self.step
        mask = self.written[self.alias[region.buffer]]
        if mask is not None:
            mask[region.offset:region.stop] = True


def _check_hazards(rank, step):
    """Receives must not overlap each other or any send of the same step."""
    phys = lambda r: (rank.alias.get(r.buffer, r.buffer), r.offset, r.stop)
    recvs = [phys(t.region) for t in step.transfers if isinstance(t, Recv) and t.region.count]
    sends = [phys(t.region) for t in step.transfers if isinstance(t, Send) and t.region.count]
    for i, (b, lo, hi) in enumerate(recvs):
        for b2, lo2, hi2 in recvs[i + 1:] + sends:
            if b == b2 and lo < hi2 and lo2 < hi:
                raise ScheduleError(f"rank {rank.schedule.rank} step {rank.step}: a receive into "
                                    f"{b}[{lo}:{hi}] overlaps another transfer of the same step")


def _window(ranks, p, dtype, extra_shape):
    """Give every rank of a node the slots of its node's ranks."""
    for k in ranks:
        node = k.schedule.node
        if not node or k.slots:
            continue
        for q in node:
            if not 0 <= q < p or tuple(ranks[q].schedule.node) != tuple(node):
                raise ScheduleError(f"rank {k.schedule.rank}'s node {node} is not rank {q}'s")
        rotating = {q for q in node if ranks[q].schedule.rotates}
        if rotating and (rotating != set(node) or len(
                {ranks[q].schedule.slot_count for q in node}) > 1):
            raise ScheduleError(f"node {node}: a rotating schedule must rotate on every rank "
                                f"of its node with the same slot need (the area each takes "
                                f"must be the same)")
        width = max(ranks[q].schedule.slot_count for q in node)
        slots = {q: _Slot(q, width, p, dtype, extra_shape) for q in node}
        for q in node:
            ranks[q].slots = slots
