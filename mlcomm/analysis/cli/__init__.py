"""The ``analyze``, ``simulate``, ``explain``, ``draw`` and ``calibrate`` commands, a module
each; ``text`` renders their tables, ``model`` holds the cost-model flags and checks."""

from __future__ import annotations

from . import analyze, calibrate, draw, explain, simulate
from .analyze import format_analysis
from .text import format_rows, in_n

__all__ = ["register", "format_rows", "format_analysis", "in_n"]


def register(subparsers) -> None:
    """Add the analysis commands."""
    for command in (analyze, simulate, explain, draw, calibrate):
        command.register(subparsers)
