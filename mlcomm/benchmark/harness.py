"""All-reduce benchmark harness: size sweep, warm-up, timed loop, check.

In the style of nccl-tests and OSU: for each message size, each placement
(in/out of place) and each algorithm (``mpi`` first, the MPI library's own
``MPI_Allreduce``), run ``warmup`` untimed calls, then ``iters`` timed calls on
preallocated buffers, split into interleaved rounds (see :func:`run_bench`).
Each rank times its own loop; the per-call times are reduced to min/avg/max
over ranks.  With ``check`` one extra untimed call on freshly initialised data
is compared with the baseline and its wrong elements are counted over all ranks.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field

import numpy as np

from . import rss as _rss
from ..kernels import OP_TABLE
from ..units import format_size

__all__ = [
    "RECORD_KEYS", "EXTRA_KEYS", "BenchConfig",
    "size_list", "default_iters",
    "resolve_algorithms", "options_for", "left_out", "run_bench", "interleaved",
    "peak_rss_mib", "baseline_label",
]

#: The keys every JSON record carries, in column order.
RECORD_KEYS = ("algorithm", "ranks", "bytes", "count", "dtype", "op", "in_place",
               "time_us_avg", "time_us_min", "time_us_max", "algbw_gbps", "busbw_gbps",
               "ratio_to_mpi", "wrong")
#: Extra keys: timed calls, interleaved rounds, device, peak resident memory (max over ranks),
#: what the ``mpi`` baseline timed (see :func:`baseline_label`), the algorithm's
#: ``--option`` pairs (``key=value,...``; empty without), and what ``auto`` ran (None for the
#: others).
EXTRA_KEYS = ("iters", "rounds", "device", "peak_rss_mib", "baseline", "options", "ran")

BASELINE = "mpi"
_RTOL = {2: 2e-2, 4: 1e-5, 8: 1e-12}   # float tolerance by itemsize
def size_list(min_bytes: int, max_bytes: int, factor: float, itemsize: int) -> list[int]:
    """Return the swept message sizes in bytes, whole elements, no repeats."""
    if min_bytes < 0 or max_bytes < min_bytes:
        raise ValueError(f"bad size range {min_bytes}..{max_bytes}")
    if factor <= 1:
        raise ValueError("--factor must be > 1")
    sizes, n = [], min_bytes
    if n == 0:
        sizes.append(0)
        n = itemsize
    while n <= max_bytes:
        b = max(itemsize, n // itemsize * itemsize)
        if b <= max_bytes and (not sizes or b > sizes[-1]):
            sizes.append(b)
        n = max(n + 1, int(n * factor))
    return sizes


def default_iters(nbytes: int, quick: bool = False) -> tuple[int, int]:
    """Return ``(iters, warmup)`` for one size: many for small messages, few for large."""
    cap, budget, floor = (40, 8 << 20, 3) if quick else (200, 64 << 20, 5)
    iters = max(floor, min(cap, budget // max(nbytes, 1)))
    return iters, max(1 if quick else 2, iters // 4)


#: by default a round times a block of this share of :func:`default_iters`' calls
BLOCKS = 5


def _calls(cfg, nbytes: int) -> tuple[int, int, int]:
    """``(rounds, calls per round, warmup)`` of one size: ``cfg.rounds`` rounds, else a
    period of the round order, over which every algorithm follows every other equally
    often (:func:`mlcomm.session.auto.round_period`); ``cfg.iters`` calls split over them,
    else a block of a :data:`BLOCKS`-th of :func:`default_iters`' calls a round."""
    from ..session.auto import round_period
    iters, warmup = default_iters(nbytes, cfg.quick)
    rounds = cfg.rounds or round_period(len(cfg.algorithms))
    if cfg.iters is not None:
        iters = cfg.iters
        rounds = max(1, min(rounds, iters))
    per_round = -(-iters // rounds) if cfg.iters is not None else -(-iters // BLOCKS)
    return rounds, per_round, warmup if cfg.warmup is None else cfg.warmup


def peak_rss_mib() -> float:
    """Return this process's peak resident set size in MiB since the last reset (see rss)."""
    return _rss.peak_bytes() / 2 ** 20


def resolve_algorithms(spec) -> list[str]:
    """Return the algorithm names to run: ``mpi`` first, then ``spec``.

    ``spec`` is ``all`` (or None), ``"A,B"`` or a list of names; aliases are resolved and
    an unknown name is a ValueError naming the known ones.
    """
    from ..algorithms import COLLECTIVES, resolve
    if spec in (None, "", "all"):
        names = [n for n in COLLECTIVES["allreduce"] if n != BASELINE]
    else:
        items = spec.split(",") if isinstance(spec, str) else spec
        names = [resolve(s.strip()) for s in items if s.strip()]
    return [BASELINE] + [n for n in dict.fromkeys(names) if n != BASELINE]


def options_for(algorithms, options: dict) -> dict:
    """``{algorithm: its share of options}`` (``--option``): each algorithm gets the keys it
    takes; a key that none of ``algorithms`` takes is a ValueError naming who takes what."""
    from ..algorithms import COLLECTIVES
    known = {name: COLLECTIVES["allreduce"][name].options for name in algorithms
             if name in COLLECTIVES["allreduce"]}
    for key in options:
        if not any(key in opts for opts in known.values()):
            takes = "; ".join(f"{n}: {', '.join(sorted(o))}" for n, o in known.items() if o)
            raise ValueError(f"--option {key}: no algorithm of this run takes it "
                             f"({takes or 'none takes options'})")
    return {name: {k: v for k, v in options.items() if k in opts}
            for name, opts in known.items() if any(k in opts for k in options)}


@dataclass
class BenchConfig:
    """What one ``mlcomm bench`` run sweeps."""

    algorithms: list[str]
    sizes: list[int]
    dtype: np.dtype = field(default_factory=lambda: np.dtype("float32"))
    op: str = "sum"
    placements: tuple[bool, ...] = (False,)          # in_place values to run
    iters: int | None = None                         # None: per round, default_iters / BLOCKS
    warmup: int | None = None
    rounds: int | None = None                        # None: a period of the round order
    quick: bool = False
    check: bool = False
    device: str = "cpu"
    progress: bool = True
    options: dict = field(default_factory=dict)      # algorithm -> its options (options_for)


# --------------------------------------------------------------------------- data

def _fill(out, rank: int, size: int, op: str, offset: int = 0):
    """Fill host array ``out`` with rank-dependent check data that reduces exactly."""
    n = out.size
    i = np.arange(offset, offset + n, dtype=np.int64)
    kind = out.dtype.kind
    if op in ("land", "lor"):
        v = ((i + rank) % (size + 1)) != 0
    elif op in ("band", "bor", "bxor"):
        v = (i * 2654435761 + (rank + 1) * 40503) & 0x7F
    elif op in ("min", "max"):
        v = (i * 7 + rank * 13) % 97 - (0 if kind in "ub" else 48)
    elif op == "prod":
        v = 1 - 2 * ((i + rank) % 2) if kind not in "ub" else 1 + (i + rank) % 2
    else:   # sum, avg: small integers, exact in every float type at moderate p
        v = (i * 7 + rank * 3) % 5 - (0 if kind in "ub" else 2)
    out[...] = v.astype(out.dtype) if kind != "b" else v.astype(bool)
    return out


def _reference(dtype, count, size, op):
    """Compute the all-reduce result of every rank's :func:`_fill` data locally."""
    acc = None
    for r in range(size):
        x = _fill(np.empty(count, dtype), r, size, op)
        x = x.astype(np.float64) if dtype.kind == "f" or op == "avg" else x
        if acc is None:
            acc = x.copy()
        elif op in ("sum", "avg"):
            acc += x
        elif op == "prod":
            acc *= x
        elif op == "min":
            np.minimum(acc, x, out=acc)
        elif op == "max":
            np.maximum(acc, x, out=acc)
        elif op == "band":
            acc &= x
        elif op == "bor":
            acc |= x
        elif op == "bxor":
            acc ^= x
        elif op == "land":
            acc = np.logical_and(acc, x)
        elif op == "lor":
            acc = np.logical_or(acc, x)
    if op == "avg":
        acc = acc / size
    return acc


def _count_wrong(result, ref, dtype, op) -> int:
    """Count the elements of ``result`` that differ from ``ref``."""
    if dtype.kind == "f" or op == "avg":
        r = np.asarray(result).astype(np.float64)
        e = np.asarray(ref).astype(np.float64)
        rtol = _RTOL.get(dtype.itemsize, 1e-5) if dtype.kind == "f" else 0.0
        atol = rtol if dtype.kind == "f" else 1.0      # integer avg may round
        ok = np.isclose(r, e, rtol=rtol, atol=atol, equal_nan=True)
        return int(ok.size - np.count_nonzero(ok))
    if op in ("land", "lor"):
        return int(np.count_nonzero(np.asarray(result).astype(bool) != np.asarray(ref).astype(bool)))
    return int(np.count_nonzero(np.asarray(result) != np.asarray(ref)))


# --------------------------------------------------------------------------- device

class _Host:
    """Host (NumPy) buffers."""

    name = "cpu"

    def empty(self, n, dtype):
        return np.empty(n, dtype)

    def to_host(self, a):
        return a

    def upload(self, dst, host):
        dst[...] = host

    def sync(self):
        pass


class _Cuda:
    """CuPy device buffers; rank r uses GPU (local rank mod visible GPUs)."""

    name = "cuda"

    def __init__(self, comm):
        try:
            import cupy
            ngpu = cupy.cuda.runtime.getDeviceCount()
        except Exception as exc:  # ImportError, CUDARuntimeError, ...
            raise SystemExit(f"mlcomm bench --device cuda needs CuPy and a CUDA GPU "
                             f"(pip install 'mlcomm[cupy]'): {exc}") from None
        if ngpu < 1:
            raise SystemExit("mlcomm bench --device cuda: no CUDA device is visible")
        from mpi4py import MPI
        local = comm.Split_type(MPI.COMM_TYPE_SHARED)
        cupy.cuda.Device(local.Get_rank() % ngpu).use()
        local.Free()
        self.cp = cupy
        from ..buffers.gpu import cuda_aware
        self.aware = cuda_aware()  # the baseline stages exactly when mlcomm does

    def empty(self, n, dtype):
        return self.cp.empty(n, dtype)

    def to_host(self, a):
        return self.cp.asnumpy(a)

    def upload(self, dst, host):
        dst.set(np.ascontiguousarray(host))

    def sync(self):
        self.cp.cuda.get_current_stream().synchronize()


# --------------------------------------------------------------------------- baseline

def _mpi_plan(dtype, op):
    """Return ``(dtype, MPI.Op, exact)`` for the ``mpi`` baseline.

    When MPI cannot compute this dtype/op itself (float16, bfloat16, avg),
    the baseline times ``MPI_Allreduce`` on the same bytes viewed as an
    unsigned type of the same width (``exact`` False): a timing reference
    whose result is not used; the check then uses a locally computed result.
    :func:`baseline_label` says so in words.
    """
    from mpi4py import MPI
    mop = getattr(MPI, OP_TABLE[op].mpi)
    native = dtype.kind in "iub" or (dtype.kind in "fc" and dtype.itemsize >= 4
                                     and op not in ("band", "bor", "bxor"))
    if native:
        return dtype, mop, op != "avg"
    return np.dtype(f"u{dtype.itemsize}"), mop, False


def baseline_label(dtype, op) -> str:
    """What the ``mpi`` baseline times for ``dtype`` and ``op``, in words."""
    dtype = np.dtype(dtype)
    mdtype, _, exact = _mpi_plan(dtype, op)
    call = f"MPI_Allreduce({mdtype}, MPI_{OP_TABLE[op].mpi})"
    if exact:
        return call
    if mdtype == dtype:
        return f"{call}: a sum without the division (MPI has no average)"
    if op in ("band", "bor", "bxor"):
        return f"{call} on the {dtype} bytes (MPI has no bitwise op on {dtype})"
    return (f"{call} on the {dtype} bytes: an integer {OP_TABLE[op].mpi.lower()} of their bit "
            f"patterns timed as a stand-in, not a {dtype} {op} (MPI cannot reduce {dtype})")


def _view(a, dtype):
    """View a host or device array's bytes as ``dtype`` (same itemsize or total bytes)."""
    return a.view(dtype) if a.dtype != dtype and a.nbytes % dtype.itemsize == 0 else a


# --------------------------------------------------------------------------- runner

def _timed_call(alg, comm, dev, send, recv, in_place, op, mdtype, mop, staged, hosts,
                options=None):
    """The call being timed, bound once: ``mpi`` (MPI_Allreduce) or an mlcomm algorithm
    (with ``options``)."""
    from mpi4py import MPI

    from ..api import allreduce

    if alg != BASELINE:
        send = MPI.IN_PLACE if in_place else send
        if not options:  # the call as a caller writes it (unpacking a dict costs 0.1 µs)
            return lambda: allreduce(send, recv, op, comm=comm, algorithm=alg)
        kw = dict(options, comm=comm, algorithm=alg)
        return lambda: allreduce(send, recv, op, **kw)
    Allreduce = comm.Allreduce
    if staged:  # host MPI for device data: copy through the host, as mlcomm stages
        hs, hr = hosts

        def call():
            hs[...] = dev.to_host(recv if in_place else send)
            if in_place:
                Allreduce(MPI.IN_PLACE, _view(hs, mdtype), mop)
                recv.set(hs)
            else:
                Allreduce(_view(hs, mdtype), _view(hr, mdtype), mop)
                recv.set(hr)
        return call
    rb = _view(recv, mdtype)
    if in_place:
        return lambda: Allreduce(MPI.IN_PLACE, rb, mop)
    sb = _view(send, mdtype)
    return lambda: Allreduce(sb, rb, mop)


def interleaved(calls: dict, rounds: int, per_round: int, comm, sync) -> dict:
    """``{name: median seconds per call}``: ``rounds`` rounds, each timing every call
    ``per_round`` times after a barrier, in the order of :func:`mlcomm.session.auto.round_order`.

    Each timed block follows one untimed call of the same kind, so it measures the steady
    state of repeated calls (a training loop's), not a first call on memory that the
    previous block's algorithm pushed out of the caches.
    """
    from ..session.auto import round_order
    samples = {name: [] for name in calls}
    for k in range(rounds):
        for name in round_order(list(calls), k):
            call = calls[name]
            call()
            sync()
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(per_round):
                call()
            sync()
            samples[name].append((time.perf_counter() - t0) / max(per_round, 1))
    return {name: float(np.median(t)) for name, t in samples.items()}


def _auto_ran(comm, count, dtype, op):
    """What ``auto`` ran at this size (:func:`mlcomm.session.auto.auto_ran`), on host or device
    buffers."""
    from ..session.auto import auto_ran
    from ..session import session_of
    session = session_of(comm)
    return (auto_ran(session, "allreduce", count, dtype, op)
            or auto_ran(session, "allreduce", count, dtype, op, device=True))


def left_out(algorithms, comm, device: bool) -> dict:
    """``{name: why}`` for those of ``algorithms`` that cannot run on ``comm``'s node layout
    and buffers, as their registry entries say (collective)."""
    from ..algorithms import ALGORITHMS, Layout
    from ..session import session_of
    layout = Layout(comm.Get_size(), session_of(comm).nodes)
    why = {name: ALGORITHMS[name].why_not(layout, device)
           for name in algorithms if name in ALGORITHMS}
    return {name: reason for name, reason in why.items() if reason}


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
    rank, size = comm.Get_rank(), comm.Get_size()
    dev = _Cuda(comm) if cfg.device == "cuda" else _Host()
    dtype, op = cfg.dtype, cfg.op
    check_op(dtype, op)
    mdtype, mop, exact = _mpi_plan(dtype, op)
    baseline = baseline_label(dtype, op)
    staged = dev.name == "cuda" and not dev.aware
    left = left_out(cfg.algorithms, comm, dev.name == "cuda")
    if left and rank == 0:
        print(f"# left out: {'; '.join(f'{name}: {why}' for name, why in left.items())}",
              flush=True)
    cfg = dataclasses.replace(cfg, algorithms=[a for a in cfg.algorithms if a not in left])

    bar = None
    total = len(cfg.sizes) * len(cfg.placements)
    if rank == 0 and cfg.progress:
        from tqdm import tqdm
        bar = tqdm(total=total, unit="size", desc=f"bench P={size}", leave=False,
                   dynamic_ncols=True)

    records = []
    for nbytes in cfg.sizes:
        count = nbytes // dtype.itemsize
        rounds, per_round, warmup = _calls(cfg, nbytes)
        send = dev.empty(count, dtype)
        recv = dev.empty(count, dtype)
        host_data = _fill(np.empty(count, dtype), rank, size, op)
        dev.upload(send, host_data)
        hosts = (np.empty(count, dtype), np.empty(count, dtype)) if staged else None
        ref = None
        for in_place in cfg.placements:
            if bar is not None:
                bar.set_postfix_str(f"{format_size(nbytes)} {'in' if in_place else 'out'}")
            calls, wrongs, peaks = {}, {}, {}
            # -- per algorithm: check one untimed call on fresh data, warm up, peak memory
            for alg in cfg.algorithms:
                call = calls[alg] = _timed_call(alg, comm, dev, send, recv, in_place, op,
                                                mdtype, mop, staged, hosts,
                                                cfg.options.get(alg))
                _rss.reset_peak()  # this record's peak only, where the OS allows
                wrongs[alg] = None
                if cfg.check:
                    dev.upload(recv if in_place else send, host_data)
                    call()
                    dev.sync()
                    if alg == BASELINE and exact:
                        ref = dev.to_host(recv).copy()
                    elif ref is None:
                        ref = _reference(dtype, count, size, op)
                    if alg != BASELINE or exact:
                        res = np.array(dev.to_host(recv), copy=True)
                        wrongs[alg] = comm.allreduce(_count_wrong(res, ref, dtype, op),
                                                     op=MPI.SUM)
                    else:  # a timing proxy (see _mpi_plan): nothing to check
                        comm.allreduce(0, op=MPI.SUM)
                if in_place:
                    dev.upload(recv, host_data)
                for _ in range(warmup):
                    call()
                dev.sync()
                peaks[alg] = comm.allreduce(peak_rss_mib(), op=MPI.MAX)
            medians = interleaved(calls, rounds, per_round, comm, dev.sync)
            times = {}
            for alg in cfg.algorithms:
                t = medians[alg]
                tmin = comm.allreduce(t, op=MPI.MIN)
                tmax = comm.allreduce(t, op=MPI.MAX)
                tavg = times[alg] = comm.allreduce(t, op=MPI.SUM) / size
                algbw = nbytes / tavg / 1e9 if tavg > 0 else 0.0
                records.append({
                    "algorithm": alg, "ranks": size, "bytes": nbytes, "count": count,
                    "dtype": str(dtype), "op": op, "in_place": bool(in_place),
                    "time_us_avg": tavg * 1e6, "time_us_min": tmin * 1e6,
                    "time_us_max": tmax * 1e6, "algbw_gbps": algbw,
                    "busbw_gbps": algbw * 2 * (size - 1) / size,
                    "ratio_to_mpi": None, "wrong": wrongs[alg],
                    "iters": per_round * rounds, "rounds": rounds, "device": dev.name,
                    "peak_rss_mib": round(peaks[alg], 1), "baseline": baseline,
                    "options": ",".join(f"{k}={v}" for k, v in
                                        cfg.options.get(alg, {}).items()),
                    "ran": _auto_ran(comm, count, dtype, op) if alg == "auto" else None,
                })
            base = times.get(BASELINE)
            for rec in records[-len(times):]:
                if base and base > 0:
                    rec["ratio_to_mpi"] = rec["time_us_avg"] / (base * 1e6)
            if bar is not None:
                bar.update(1)
        del send, recv
    if bar is not None:
        bar.close()
    return records


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
