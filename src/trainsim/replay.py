"""Replay one rank's Kineto trace with the discrete-event engine (the orchestration layer, as api.py is for
`simulate`: trace/ builds the graph, sim/ runs it) and compare per step with the measurement.

A step window [start, end] (ProfilerStep#N or optimizer-step spacing, both CPU ranges on one thread) is
mapped to replayed times through that thread's segment boundaries: the window's start and end are
boundaries of the thread's chain (graph.py adds them), and the replayed step is the replayed time of
the end boundary minus that of the start boundary. A whole-trace window (no step annotation) is
replayed as the makespan of the whole graph.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .compile.graph import ExecutionGraph
from .sim.engine import SimTrace, run
from .trace.kineto import KinetoTrace, read_kineto
from .trace.kineto.graph import ReplayGraph, build_replay, round_us


@dataclass(frozen=True)
class StepReplay:
    """One step: measured and replayed length, ms."""

    step: int
    measured_ms: float
    replayed_ms: float

    @property
    def error_pct(self) -> float:
        """|replayed - measured| / measured, %."""
        return abs(self.replayed_ms - self.measured_ms) / self.measured_ms * 100 if self.measured_ms > 0 else 0.0


@dataclass
class ReplayResult:
    """Per-step replay of one rank's trace and where the replayed time goes."""

    path: str
    steps: list[StepReplay]
    replay_error_pct: float  # mean over steps of |replayed - measured| / measured
    makespan_ms: float  # replayed end of the whole trace
    measured_span_ms: float  # measured end of the whole trace
    busy_ms_by_category: dict[str, float]  # summed task time per category (streams overlap)
    n_tasks: int
    n_streams: int
    parse_s: float = 0.0
    build_s: float = 0.0
    replay_s: float = 0.0
    assumptions: list[str] = field(default_factory=list)
    graph: ExecutionGraph | None = field(default=None, repr=False)
    trace: SimTrace | None = field(default=None, repr=False)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready summary (no graph)."""
        return {"path": self.path, "replay_error_pct": self.replay_error_pct,
                "steps": [{"step": s.step, "measured_ms": s.measured_ms, "replayed_ms": s.replayed_ms}
                          for s in self.steps],
                "makespan_ms": self.makespan_ms, "measured_span_ms": self.measured_span_ms,
                "busy_ms_by_category": self.busy_ms_by_category, "n_tasks": self.n_tasks,
                "parse_s": self.parse_s, "build_s": self.build_s, "replay_s": self.replay_s,
                "assumptions": self.assumptions}


def _boundary_time_s(rg: ReplayGraph, sim: SimTrace, thread: int, t_us: float) -> float:
    """Replayed time of a boundary on a thread's chain (the end of the segment that ends there)."""
    b = rg.boundary_us[thread]
    j = int(np.searchsorted(b, round_us(t_us)))
    if j >= len(b) or b[j] != round_us(t_us):
        raise ValueError(f"{t_us} us is not a segment boundary of thread {thread}")
    return 0.0 if j == 0 else sim.end_s[rg.first_segment[thread] + j - 1]


def replay_trace(path_or_trace: str | Path | KinetoTrace, tol_us: float = 5.0,
                 measured_latency: bool = True) -> ReplayResult:
    """Read (if a path), build the replay graph, run the engine and compare each step with its measurement."""
    t0 = time.perf_counter()
    trace = path_or_trace if isinstance(path_or_trace, KinetoTrace) else read_kineto(path_or_trace)
    t1 = time.perf_counter()
    rg = build_replay(trace, tol_us, measured_latency)
    t2 = time.perf_counter()
    g = rg.graph
    sim = run(g, gamma=0.0, record_memory=False, bandwidth_sharing=False)
    t3 = time.perf_counter()
    makespan_s = max(sim.end_s, default=0.0)
    steps: list[StepReplay] = []
    for w in trace.steps():
        if w.source == "trace":
            replayed_s = makespan_s - w.start_us * 1e-6
        else:
            th = rg.step_thread[w.step]
            replayed_s = _boundary_time_s(rg, sim, th, w.end_us) - _boundary_time_s(rg, sim, th, w.start_us)
        steps.append(StepReplay(w.step, w.dur_us / 1e3, replayed_s * 1e3))
    errs = [s.error_pct for s in steps if s.measured_ms > 0]
    busy: dict[str, float] = defaultdict(float)
    for t in range(len(g)):
        busy[g.category[t]] += (sim.end_s[t] - sim.start_s[t]) * 1e3
    measured_end = 0.0
    for tab in (trace.cpu, trace.runtime, trace.gpu):
        if len(tab):
            measured_end = max(measured_end, float(np.max(tab.ts_us + tab.dur_us)))
    return ReplayResult(
        path=trace.path, steps=steps, replay_error_pct=float(np.mean(errs)) if errs else 0.0,
        makespan_ms=makespan_s * 1e3, measured_span_ms=measured_end / 1e3, busy_ms_by_category=dict(busy),
        n_tasks=len(g), n_streams=len(g.stream_names), parse_s=t1 - t0, build_s=t2 - t1, replay_s=t3 - t2,
        assumptions=[*trace.assumptions, *rg.assumptions], graph=g, trace=sim)


__all__ = ["ReplayResult", "StepReplay", "replay_trace"]
