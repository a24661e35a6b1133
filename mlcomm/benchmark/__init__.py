"""The all-reduce benchmark behind ``mlcomm bench`` (nccl-tests/OSU style)."""

from ..units import parse_size
from .harness import (BenchConfig, RECORD_KEYS, EXTRA_KEYS, band_summary, default_iters,
                      resolve_algorithms, run_bench, size_list)
from .report import format_csv, format_json, format_table, render

__all__ = ["BenchConfig", "RECORD_KEYS", "EXTRA_KEYS", "band_summary", "default_iters",
           "parse_size", "resolve_algorithms", "run_bench", "size_list",
           "format_csv", "format_json", "format_table", "render"]
