"""Kineto (torch.profiler) trace reading: one rank's trace file -> a typed, columnar KinetoTrace.

`read_kineto(path)` reads `.json` / `.json.gz` (current, 2022, 2021 and ROCm schemas); see model.py for
the tables and their units (times in us relative to `KinetoTrace.origin_us`).
"""

from .model import (
    Collectives,
    CollectiveSource,
    CpuKind,
    CpuOps,
    FlowKind,
    Flows,
    GpuAnnotations,
    GpuKind,
    GpuOps,
    KinetoTrace,
    MemoryEvents,
    RuntimeCalls,
    RuntimeKind,
    StepWindow,
    SyncEvents,
    SyncKind,
)
from .reader import collective_kind, read_kineto, runtime_kind, trace_from_json

__all__ = [
    "Collectives", "CollectiveSource", "CpuKind", "CpuOps", "FlowKind", "Flows", "GpuAnnotations", "GpuKind",
    "GpuOps", "KinetoTrace", "MemoryEvents", "RuntimeCalls", "RuntimeKind", "StepWindow", "SyncEvents",
    "SyncKind", "collective_kind", "read_kineto", "runtime_kind", "trace_from_json",
]
