"""The benchmark's records (one per algorithm, size and placement) and their summary by
size band."""

from __future__ import annotations

import math

from .baseline import BASELINE, baseline_label
from .calls import CALLS, busbw_factor, nccl_bytes

__all__ = ["RECORD_KEYS", "EXTRA_KEYS", "band_summary"]

#: The keys every JSON record carries, in column order.
RECORD_KEYS = ("algorithm", "ranks", "bytes", "count", "dtype", "op", "in_place",
               "time_us_avg", "time_us_min", "time_us_max", "algbw_gbps", "busbw_gbps",
               "ratio_to_mpi", "wrong")
#: Extra keys: timed calls, interleaved rounds, device, peak resident memory (max over ranks),
#: what the ``mpi`` baseline timed (see :func:`baseline_label`), the algorithm's
#: ``--option`` pairs (``key=value,...``; empty without), what ``auto`` ran (None for the
#: others), and the collective timed.
EXTRA_KEYS = ("iters", "rounds", "device", "peak_rss_mib", "baseline", "options", "ran",
              "collective")


def _records(cfg, comm, device, nbytes, in_place, medians, wrongs, peaks, rounds, per_round):
    """One record per algorithm of ``cfg``: its ``medians`` (seconds per call on this rank)
    over ranks, bandwidths (nccl-tests': :func:`~.calls.nccl_bytes` over the time, and that
    times :func:`~.calls.busbw_factor`), ``wrongs`` and ``peaks``, and its time against
    ``mpi``'s. ``bytes`` is each rank's block."""
    from mpi4py import MPI
    size = comm.Get_size()
    collective = cfg.collective
    dtype = cfg.dtype
    op = cfg.op if CALLS[collective].reduces else "-"
    count = nbytes // dtype.itemsize
    baseline = baseline_label(dtype, cfg.op, collective)
    whole, factor = nccl_bytes(collective, size, nbytes), busbw_factor(collective, size)
    records, times = [], {}
    for alg in cfg.algorithms:
        t = medians[alg]
        tmin = comm.allreduce(t, op=MPI.MIN)
        tmax = comm.allreduce(t, op=MPI.MAX)
        tavg = times[alg] = comm.allreduce(t, op=MPI.SUM) / size
        algbw = whole / tavg / 1e9 if tavg > 0 else 0.0
        records.append({
            "algorithm": alg, "ranks": size, "bytes": nbytes, "count": count,
            "dtype": str(dtype), "op": op, "in_place": bool(in_place),
            "time_us_avg": tavg * 1e6, "time_us_min": tmin * 1e6,
            "time_us_max": tmax * 1e6, "algbw_gbps": algbw,
            "busbw_gbps": algbw * factor,
            "ratio_to_mpi": None, "wrong": wrongs[alg],
            "iters": per_round * rounds, "rounds": rounds, "device": device,
            "peak_rss_mib": round(peaks[alg], 1), "baseline": baseline,
            "options": ",".join(f"{k}={v}" for k, v in cfg.options.get(alg, {}).items()),
            "ran": _auto_ran(comm, collective, count, dtype, cfg.op) if alg == "auto" else None,
            "collective": collective,
        })
    base = times.get(BASELINE)
    for rec in records:
        if base and base > 0:
            rec["ratio_to_mpi"] = rec["time_us_avg"] / (base * 1e6)
    return records


def _auto_ran(comm, collective, count, dtype, op):
    """What ``auto`` ran at this size (:func:`mlcomm.session.auto.auto_ran`), on host or device
    buffers; the uneven forms but allgatherv and reduce_scatter_v agree on no shared
    count (0, see :meth:`mlcomm.session.call.Call.shared_count`)."""
    from ..session.auto import auto_ran
    from ..session import session_of
    session = session_of(comm)
    if collective in ("gatherv", "scatterv", "alltoallv"):
        count = 0
    op = op if CALLS[collective].reduces else "sum"
    return (auto_ran(session, collective, count, dtype, op)
            or auto_ran(session, collective, count, dtype, op, device=True))


def band_summary(records) -> list[dict]:
    """Per size band (<=1 KiB, <=1 MiB, larger) and placement: the best mlcomm algorithm.

    The best is the algorithm (not ``mpi``, not ``auto``) with the smallest
    geometric-mean time ratio to ``mpi`` over the band's sizes; ``auto``'s
    ratio is given beside it.
    """
    bands = (("<=1 KiB", 0, 1 << 10), ("<=1 MiB", (1 << 10) + 1, 1 << 20),
             (">1 MiB", (1 << 20) + 1, math.inf))
    out = []
    placements = sorted({r["in_place"] for r in records})
    for in_place in placements:
        for label, lo, hi in bands:
            rows = [r for r in records if r["in_place"] == in_place and lo <= r["bytes"] <= hi
                    and r["ratio_to_mpi"] and r["algorithm"] != BASELINE]
            if not rows:
                continue
            by_alg = {}
            for r in rows:
                by_alg.setdefault(r["algorithm"], []).append(r["ratio_to_mpi"])
            geo = {a: math.exp(sum(map(math.log, v)) / len(v)) for a, v in by_alg.items()}
            cands = {a: g for a, g in geo.items() if a != "auto"} or geo
            best = min(cands, key=cands.get)
            nsizes = len({r["bytes"] for r in rows})
            out.append({"band": label, "in_place": in_place, "best": best,
                        "ratio": cands[best], "auto": geo.get("auto"), "sizes": nsizes})
    return out
