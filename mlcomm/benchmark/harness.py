"""Collective benchmark harness: size sweep, warm-up, timed loop, check.

In the style of nccl-tests and OSU: for each message size, each placement
(in/out of place) and each algorithm of the collective (``mpi`` first, the MPI library's
own call: ``MPI_Allreduce``, ``MPI_Gather``, ..., see :mod:`.calls`), run ``warmup``
untimed calls, then ``iters`` timed calls on preallocated buffers, split into
interleaved rounds (see :func:`run_bench`). Each rank times its own loop; the per-call
times are reduced to min/avg/max over ranks.  With ``check`` one extra untimed call on
freshly initialised data is compared with the baseline and its wrong elements are counted
over all ranks.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from . import rss as _rss
from ..units import format_size
from .baseline import BASELINE, _mpi_plan, _timed_call, baseline_label
from .calls import CALLS, counts_of, expected, inputs
from .checks import _count_wrong
from .config import (BenchConfig, default_iters, left_out, options_for, resolve_algorithms,
                     size_list)
from .devices import _Cuda, _Host
from .records import EXTRA_KEYS, RECORD_KEYS, _records, band_summary
from .rounds import _calls, interleaved

__all__ = [
    "RECORD_KEYS", "EXTRA_KEYS", "BenchConfig",
    "size_list", "default_iters",
    "resolve_algorithms", "options_for", "left_out", "run_bench", "interleaved",
    "peak_rss_mib", "baseline_label", "band_summary",
]


def peak_rss_mib() -> float:
    """Return this process's peak resident set size in MiB since the last reset (see rss)."""
    return _rss.peak_bytes() / 2 ** 20


def run_bench(cfg: BenchConfig, comm=None) -> list[dict]:
    """Run the sweep of ``cfg`` on ``comm``; return the records (same on every rank).

    Per size and placement, every algorithm is first checked (with ``check``) and warmed
    up, then timed in interleaved rounds (:func:`_calls`: by default a period of the round
    order): each round times every algorithm's block of calls after one untimed call and a
    barrier, in an order that changes each round, every algorithm after every other
    equally often over the period (:func:`mlcomm.session.auto.round_order`). An
    algorithm's time per call is the median over rounds, so a burst of noise from other
    processes lands on one round of every algorithm alike, not on one algorithm's whole
    block (Google Benchmark interleaves for the same reason).
    """
    from mpi4py import MPI

    from ..kernels import check_op

    comm = MPI.COMM_WORLD if comm is None else comm
    dev = _Cuda(comm) if cfg.device == "cuda" else _Host()
    if CALLS[cfg.collective].reduces:
        check_op(cfg.dtype, cfg.op)
    plan = _mpi_plan(cfg.dtype, cfg.op, cfg.collective)
    cfg = _runnable(cfg, comm, dev)
    bar = _progress(cfg, comm)
    records = []
    for nbytes in cfg.sizes:
        records += _bench_size(cfg, comm, dev, plan, nbytes, bar)
    if bar is not None:
        bar.close()
    return records


def _runnable(cfg, comm, dev):
    """``cfg`` without the algorithms that cannot run on ``comm`` and ``dev`` (rank 0 says
    which and why)."""
    left = left_out(cfg.algorithms, comm, dev.name == "cuda", cfg.collective)
    if left and comm.Get_rank() == 0:
        print(f"# left out: {'; '.join(f'{name}: {why}' for name, why in left.items())}",
              flush=True)
    return dataclasses.replace(cfg, algorithms=[a for a in cfg.algorithms if a not in left])


def _progress(cfg, comm):
    """Rank 0's progress bar over sizes and placements (None without ``progress``)."""
    if comm.Get_rank() != 0 or not cfg.progress:
        return None
    from tqdm import tqdm
    return tqdm(total=len(cfg.sizes) * len(cfg.placements), unit="size",
                desc=f"bench {cfg.collective} P={comm.Get_size()}", leave=False, dynamic_ncols=True)


def _bench_size(cfg, comm, dev, plan, nbytes, bar) -> list[dict]:
    """The records of one size: per placement, every algorithm checked and warmed up, then
    timed in interleaved rounds."""
    dtype, spec = cfg.dtype, CALLS[cfg.collective]
    rank, p = comm.Get_rank(), comm.Get_size()
    count = nbytes // dtype.itemsize
    rounds, per_round, warmup = _calls(cfg, nbytes)
    send = dev.empty(spec.blocks(spec.send, p) * count, dtype)
    recv = dev.empty(spec.blocks(spec.recv, p) * count, dtype)
    host_data = inputs(cfg.collective, rank, p, count, dtype, cfg.op)
    if spec.send:
        dev.upload(send, host_data)
    staged = dev.name == "cuda" and not dev.aware
    hosts = (np.empty(count, dtype), np.empty(count, dtype)) if staged else None
    buffers = (send, recv, host_data, staged, hosts, counts_of(cfg.collective, p, count))
    ref = None
    records = []
    for in_place in cfg.placements:
        if bar is not None:
            bar.set_postfix_str(f"{format_size(nbytes)} {'in' if in_place else 'out'}")
        calls, wrongs, peaks, ref = _prepare(cfg, comm, dev, plan, buffers, in_place, warmup,
                                             ref)
        medians = interleaved(calls, rounds, per_round, comm, dev.sync)
        records += _records(cfg, comm, dev.name, nbytes, in_place, medians, wrongs, peaks,
                            rounds, per_round)
        if bar is not None:
            bar.update(1)
    return records


# tests/faults/inject.py replaces this module's _timed_call and _count_wrong: the steps that
# call them look them up here.

def _prepare(cfg, comm, dev, plan, buffers, in_place, warmup, ref):
    """Per algorithm: its call, checked once on fresh data (with ``check``), warmed up, and
    the peak memory over ranks. Return ``(calls, wrongs, peaks, ref)``."""
    from mpi4py import MPI
    send, recv, host_data, staged, hosts, counts = buffers
    mdtype, mop, exact = plan
    # the buffer that fresh data goes into: the send buffer, else the one the call reworks
    fresh = recv if in_place or not CALLS[cfg.collective].send else send
    calls, wrongs, peaks = {}, {}, {}
    for alg in cfg.algorithms:
        call = calls[alg] = _timed_call(alg, comm, dev, send, recv, in_place, cfg.op,
                                        mdtype, mop, staged, hosts, cfg.options.get(alg),
                                        cfg.collective, counts)
        _rss.reset_peak()  # this record's peak only, where the OS allows
        wrongs[alg] = None
        if cfg.check:
            wrongs[alg], ref = _check(alg, call, comm, dev, fresh, recv, host_data, exact, ref,
                                      cfg)
        if in_place:
            dev.upload(recv, host_data)
        for _ in range(warmup):
            call()
        dev.sync()
        peaks[alg] = comm.allreduce(peak_rss_mib(), op=MPI.MAX)
    return calls, wrongs, peaks, ref


def _check(alg, call, comm, dev, fresh, recv, host_data, exact, ref, cfg):
    """One untimed ``call`` on ``host_data`` uploaded to ``fresh``: ``(wrong elements over
    ranks, None for a timing proxy; the reference result)``. The reference is the
    baseline's result where MPI computes it exactly, else computed locally; a rank without
    a result (a gather's or reduce's other ranks) counts none."""
    from mpi4py import MPI
    dtype, op, spec = cfg.dtype, cfg.op, CALLS[cfg.collective]
    rank, p = comm.Get_rank(), comm.Get_size()
    dev.upload(fresh, host_data)
    call()
    dev.sync()
    here = spec.has_result(rank)
    if alg == BASELINE and exact:
        ref = dev.to_host(recv).copy() if here else None
    elif ref is None and here:
        count = host_data.size // (spec.blocks(spec.send, p) or 1)
        ref = expected(cfg.collective, rank, p, count, dtype, op)
    if alg != BASELINE or exact:
        res = np.array(dev.to_host(recv), copy=True) if here else None
        wrong = _count_wrong(res, ref, dtype, op) if here else 0
        return comm.allreduce(wrong, op=MPI.SUM), ref
    comm.allreduce(0, op=MPI.SUM)  # a timing proxy (see _mpi_plan): nothing to check
    return None, ref
