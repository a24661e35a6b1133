"""Text of the analysis commands: times, tables, volumes in n, node layouts."""

from __future__ import annotations

import csv
import io
import json
from fractions import Fraction


def _seconds(x) -> str:
    if x is None:
        return "-"
    if x < 1e-3:
        return f"{x * 1e6:.2f}us"
    if x < 1:
        return f"{x * 1e3:.3f}ms"
    return f"{x:.3f}s"


def _bytes(n) -> str:
    from ...units import format_size
    return format_size(n)


def _align(header, cells) -> list:
    """Lines of a text table: the first column left-aligned, the others right-aligned."""
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h)
              for i, h in enumerate(header)]
    return ["  ".join(v.rjust(w) if i else v.ljust(w)
                      for i, (v, w) in enumerate(zip(row, widths))).rstrip()
            for row in [header, *cells]]


def format_rows(rows, keys, fmt: str) -> str:
    """Render ``rows`` (dicts) with ``keys`` as ``table``, ``json`` or ``csv`` text."""
    if fmt == "json":
        return json.dumps([{k: r.get(k) for k in keys} for r in rows], indent=1)
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=list(keys), lineterminator="\n")
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k) for k in keys})
        return buf.getvalue().rstrip("\n")
    cells = [[_seconds(r.get(k)) if k.endswith("seconds") else
              ("-" if r.get(k) is None else str(r.get(k))) for k in keys] for r in rows]
    return "\n".join(_align(list(keys), cells))


def in_n(nbytes, n: int, p: int) -> str:
    """``nbytes`` as the lecture notes write a volume: a multiple of the message size ``n``.

    Whole multiples read ``56n`` (``n`` for one); (p-1)n/p and 2(p-1)n/p keep the notes'
    denominator p (``7n/8`` and ``14n/8`` at p = 8); other fractions are reduced
    (``n/2``, ``7n/2``); anything else is a decimal (``1.34n``).
    """
    if nbytes is None:
        return "-"
    if not n or not nbytes:
        return str(nbytes)
    f = Fraction(int(nbytes), int(n))
    coef = lambda k: "" if k == 1 else str(k)
    if f.denominator == 1:
        return f"{coef(f.numerator)}n"
    k = f * p
    if p > 1 and k in (p - 1, 2 * (p - 1)):
        return f"{coef(k.numerator)}n/{p}"
    if f.denominator <= 64:
        return f"{coef(f.numerator)}n/{f.denominator}"
    return f"{float(f):.3g}n"


def _layout(p: int, ranks_per_node) -> str:
    """The node layout in words: ``one node``, ``4 nodes of 8``, ``3 nodes of 2 (last 1)``."""
    from ..metrics import node_layout
    nodes = node_layout(p, ranks_per_node)
    if len(nodes) == 1:
        return "one node"
    k, last = len(nodes[0]), len(nodes[-1])
    return f"{len(nodes)} nodes of {k}" + (f" (last {last})" if last != k else "")
