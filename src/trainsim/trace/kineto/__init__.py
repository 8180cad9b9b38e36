"""Kineto (torch.profiler) trace reading: one rank's trace file -> a typed, columnar KinetoTrace.

`read_kineto(path)` reads `.json` / `.json.gz` (current, 2022, 2021 and ROCm schemas); see model.py for
the tables and their units (times in us relative to `KinetoTrace.origin_us`).
"""

from .model import KinetoTrace, StepWindow
from .reader import read_kineto, trace_from_json

__all__ = ["KinetoTrace", "StepWindow", "read_kineto", "trace_from_json"]
