"""Write benchmark records as a table, CSV or JSON."""

from __future__ import annotations

import csv
import io
import json

from ..units import format_size
from .calls import CALLS
from .records import EXTRA_KEYS, RECORD_KEYS, band_summary

__all__ = ["format_table", "format_csv", "format_json", "format_summary", "render",
           "format_kernels", "bandwidths"]

_COLUMNS = (  # header, width, record key, format
    ("size(B)", 11, "bytes", "d"),
    ("count", 10, "count", "d"),
    ("place", 5, "in_place", None),
    ("algorithm", 27, "algorithm", "s"),
    ("avg(us)", 11, "time_us_avg", ".2f"),
    ("min(us)", 11, "time_us_min", ".2f"),
    ("max(us)", 11, "time_us_max", ".2f"),
    ("algbw(GB/s)", 11, "algbw_gbps", ".3f"),
    ("busbw(GB/s)", 11, "busbw_gbps", ".3f"),
    ("ratio", 7, "ratio_to_mpi", ".2f"),
    ("#wrong", 7, "wrong", "d"),
    ("iters", 6, "iters", "d"),
    ("rss(MiB)", 9, "peak_rss_mib", ".0f"),
)


def _cell(rec, key, fmt):
    v = rec.get(key)
    if key == "in_place":
        return "in" if v else "out"
    if key == "algorithm" and rec.get("ran"):
        return f"{v}: {rec['ran']}"
    if v is None:
        return "-"
    return format(v, fmt)


def _collective(records) -> str:
    return (records[0].get("collective") if records else None) or "allreduce"


def bandwidths(collective: str) -> str:
    """How the table's algbw and busbw are computed for ``collective`` (nccl-tests')."""
    spec = CALLS[collective]
    size = "bytes" if spec.whole == 1 else "p*bytes"
    return f"algbw = {size}/avg; busbw = algbw*{spec.factor}"


def format_summary(records) -> str:
    """Return the per-size-band summary lines (``#``-prefixed)."""
    mpi = CALLS[_collective(records)].mpi
    lines = [f"# summary: time ratio to mpi (<1 is faster than {mpi}), "
             "geometric mean over the band's sizes"]
    for s in band_summary(records):
        place = "in-place" if s["in_place"] else "out-of-place"
        auto = f", auto {s['auto']:.2f}x" if s["auto"] is not None else ""
        lines.append(f"#   {s['band']:>8} {place:>12}: best {s['best']} {s['ratio']:.2f}x mpi"
                     f"{auto}  ({s['sizes']} sizes)")
    return "\n".join(lines)


def format_table(records, *, header: str | None = None, summary: bool = True) -> str:
    """Return the nccl-tests/OSU-style text table of ``records``."""
    out = []
    if records:
        r0 = records[0]
        collective = _collective(records)
        checked = any(r["wrong"] is not None for r in records)
        out.append(header or (
            f"# mlcomm bench: {collective}  ranks {r0['ranks']}  dtype {r0['dtype']}  "
            f"op {r0['op']}  "
            f"device {r0.get('device', 'cpu')}  check {'on' if checked else 'off'}"))
        if r0.get("baseline"):
            out.append(f"# baseline: mpi = {r0['baseline']}")
        given = {r["algorithm"]: r["options"] for r in records if r.get("options")}
        if given:
            out.append("# options: " + "; ".join(f"{a} {o}" for a, o in given.items()))
        each = "" if collective == "allreduce" else ", size = each rank's block"
        out.append(f"# time per call, per rank, reduced over ranks; {bandwidths(collective)}; "
                   f"ratio = avg / mpi avg{each}")
    name = max([_COLUMNS[3][1]] + [len(_cell(r, "algorithm", "s")) for r in records])
    columns = [(h, name if i == 3 else w, k, f) for i, (h, w, k, f) in enumerate(_COLUMNS)]
    out.append("#" + " ".join(f"{h:>{w}}" if i != 3 else f"{h:<{w}}"
                              for i, (h, w, _, _) in enumerate(columns))[1:])
    for rec in records:
        out.append(" ".join(f"{_cell(rec, k, f):>{w}}" if i != 3 else f"{_cell(rec, k, f):<{w}}"
                            for i, (_, w, k, f) in enumerate(columns)))
    wrong = sum(r["wrong"] or 0 for r in records)
    if any(r["wrong"] is not None for r in records):
        out.append(f"# check: {wrong} wrong elements {'OK' if wrong == 0 else 'FAILED'}")
    if summary and records:
        out.append(format_summary(records))
    return "\n".join(out) + "\n"


def format_csv(records) -> str:
    """Return ``records`` as CSV with a header row (RECORD_KEYS, then EXTRA_KEYS)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(RECORD_KEYS) + list(EXTRA_KEYS),
                       extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for rec in records:
        w.writerow({k: ("" if rec.get(k) is None else rec.get(k)) for k in w.fieldnames})
    return buf.getvalue()


def format_json(records) -> str:
    """Return ``records`` as a JSON list of objects."""
    keys = list(RECORD_KEYS) + list(EXTRA_KEYS)
    return json.dumps([{k: rec.get(k) for k in keys} for rec in records], indent=1) + "\n"


def render(records, fmt: str) -> str:
    """Return ``records`` in format ``fmt`` (table, csv or json)."""
    return {"table": format_table, "csv": format_csv, "json": format_json}[fmt](records)


_KERNEL_COLUMNS = (  # header, record key, format
    ("backend", "backend", "s"), ("threads", "threads", "d"), ("dtype", "dtype", "s"),
    ("op", "op", "s"), ("size", "nbytes", None), ("reduce(us)", "reduce_s", "us"),
    ("copy(us)", "copy_s", "us"), ("reduce(GB/s)", "reduce_gbps", ".2f"),
    ("copy(GB/s)", "copy_gbps", ".2f"), ("memcpy(GB/s)", "memcpy_gbps", ".2f"),
    ("ratio", "ratio", ".2f"), ("met", "ratio", "met"),
)


def _kernel_cell(row, key, fmt, target):
    v = row.get(key)
    if v is None:
        return "-"
    if fmt is None:
        return format_size(v)
    if fmt == "us":
        return f"{v * 1e6:.1f}"
    if fmt == "met":
        return "yes" if v >= target else "NO"
    return format(v, fmt)


def _thread_speedups(rows):
    """Return lines comparing each Numba thread count with 1 thread at the largest size."""
    lines = []
    for dtype in dict.fromkeys(r["dtype"] for r in rows):
        numba = [r for r in rows if r["dtype"] == dtype and r["backend"] == "numba"]
        if not numba:
            continue
        top = max(r["nbytes"] for r in numba)
        at = {r["threads"]: r for r in numba if r["nbytes"] == top}
        if 1 not in at:
            continue
        for n, r in sorted(at.items()):
            if n != 1:
                lines.append(f"#   {dtype} {format_size(top)}: numba x{n} threads reduces "
                             f"{r['reduce_gbps'] / at[1]['reduce_gbps']:.2f}x, copies "
                             f"{r['copy_gbps'] / at[1]['copy_gbps']:.2f}x the 1-thread rate")
    return lines


def format_kernels(rows, target: float = 0.8) -> str:
    """Return kernel-bandwidth rows (from ``kernels.bandwidth.measure``) as a text table.

    ``threads`` is how many threads really ran the reduction; ``met`` says whether the ratio
    (over the faster copy) reaches ``target`` (0.8: a reduction within 20 % of a copy).
    """
    if not rows:
        return "# no kernel measurements\n"
    cells = [[_kernel_cell(r, k, f, target) for _, k, f in _KERNEL_COLUMNS] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, (h, _, _) in enumerate(_KERNEL_COLUMNS)]
    lines = ["# kernel bandwidth: reduce counts 3 x size bytes (2 reads, 1 write), copies 2 x size;"
             " copy: the backend's, same threads; memcpy: np.copyto",
             f"# ratio = reduce GB/s / max(copy, memcpy GB/s); target {target}",
             "# " + "  ".join(h.rjust(w) for (h, _, _), w in zip(_KERNEL_COLUMNS, widths))]
    lines += ["  " + "  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    speedups = _thread_speedups(rows)
    if speedups:
        lines += ["# threads, side by side:"] + speedups
    return "\n".join(lines) + "\n"
