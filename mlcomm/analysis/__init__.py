"""Analyse, simulate and draw the all-reduce schedules; calibrate the cost model."""

from .metrics import KEYS, analyzable, analyze, schedule_metrics
from .simulator import (Network, SimProgram, SimResult, compile_schedules, simulate,
                        simulate_schedules)
from .sweep import SIM_LIMIT, predict_time, sweep

__all__ = ["KEYS", "analyze", "analyzable", "schedule_metrics",
           "Network", "SimProgram", "SimResult", "compile_schedules", "simulate",
           "simulate_schedules", "SIM_LIMIT", "predict_time", "sweep"]
