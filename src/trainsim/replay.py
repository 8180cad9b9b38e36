"""Replay Kineto traces (one per rank) with the discrete-event engine and compare each step with its
measurement (the orchestration layer, as api.py is for `simulate`: trace/ builds the graph, sim/ runs it).

Each rank's trace becomes a replay graph (trace.kineto.graph); the graphs are merged into one
ExecutionGraph with one rank class per rank. Collectives whose members' traces are all given are coupled
(trace.kineto.match): every member's kernel waits for what each other member's kernel waited for, and runs
only its wait-free part (its aligned end minus the latest aligned start among the members), so the
collective starts when its last member is ready, as NCCL does. Each rank's clock offset (estimated from
those collectives) delays its start in the merged replay.

A step window [start, end] (ProfilerStep#N or optimizer-step spacing, both CPU ranges on one thread) is
mapped to replayed times through that thread's segment boundaries; a whole-trace window is the rank's
replayed makespan.
"""

from __future__ import annotations

import glob
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .compile.graph import ExecutionGraph, RankClass
from .errors import ConfigError
from .sim.engine import SimTrace, run
from .trace.kineto import KinetoTrace, read_kineto
from .trace.kineto.graph import ReplayGraph, build_replay, round_us
from .trace.kineto.match import CollCall, Matching, match_collectives, rank_of
from .trace.kineto.model import CollectiveSource, GpuKind

GraphEdit = Callable[["ReplayGraphs"], None]


@dataclass(frozen=True)
class StepReplay:
    """One step of one rank: measured and replayed length, ms."""

    step: int
    measured_ms: float
    replayed_ms: float
    rank: int = 0

    @property
    def error_pct(self) -> float:
        """|replayed - measured| / measured, %."""
        return abs(self.replayed_ms - self.measured_ms) / self.measured_ms * 100 if self.measured_ms > 0 else 0.0


@dataclass
class RankGraph:
    """One rank's replay graph inside the merged graph."""

    rank: int
    trace: KinetoTrace
    rg: ReplayGraph
    task0: int  # id of the rank's first task in the merged graph
    n_tasks: int
    delay_s: float = 0.0  # start of the rank's clock in the merged replay

    def gpu_task(self, row: int) -> int:
        """Merged task id of GPU op row `row`."""
        return self.task0 + self.rg.gpu_task0 + row


@dataclass
class ReplayGraphs:
    """The merged graph of all ranks plus what maps it back to the traces (what-ifs edit it in place)."""

    graph: ExecutionGraph
    ranks: list[RankGraph]
    matching: Matching
    coupled: list[list[tuple[int, int]]] = field(default_factory=list)  # per collective: (task, rank index)
    assumptions: list[str] = field(default_factory=list)


@dataclass
class ReplayResult:
    """Per-step replay of every rank and where the replayed time goes."""

    paths: list[str]
    ranks: list[int]
    steps: list[StepReplay]
    replay_error_pct: float  # mean over steps and ranks of |replayed - measured| / measured
    clock_offsets_us: dict[int, float]
    breakdown: dict[str, float]  # ms per step (mean over steps and ranks) by where the time went
    critical_path: dict[str, float]  # ms per step on the critical path, by category (mean over steps, ranks)
    makespan_ms: float  # replayed end of the whole replay
    measured_span_ms: float  # measured length of the longest trace
    busy_ms_by_category: dict[str, float]  # summed task time per category (streams overlap)
    n_tasks: int
    n_streams: int
    peak_memory_bytes: dict[int, dict[str, int]] = field(default_factory=dict)  # rank -> device -> bytes
    parse_s: float = 0.0
    build_s: float = 0.0
    replay_s: float = 0.0
    assumptions: list[str] = field(default_factory=list)
    trace: SimTrace | None = field(default=None, repr=False)
    graphs: ReplayGraphs | None = field(default=None, repr=False)

    @property
    def path(self) -> str:
        """The first trace's path (one-rank replays)."""
        return self.paths[0]

    @property
    def graph(self) -> ExecutionGraph | None:
        """The merged graph that was replayed."""
        return self.graphs.graph if self.graphs is not None else None

    def _slowest_mean_ms(self, replayed: bool) -> float:
        """Mean over steps of the slowest rank's time per step, ms."""
        per: dict[int, float] = defaultdict(float)
        for s in self.steps:
            per[s.step] = max(per[s.step], s.replayed_ms if replayed else s.measured_ms)
        return float(np.mean(list(per.values()))) if per else 0.0

    @property
    def step_ms(self) -> float:
        """Mean replayed step time over steps, of the slowest rank per step, ms."""
        return self._slowest_mean_ms(replayed=True)

    @property
    def measured_step_ms(self) -> float:
        """Mean measured step time over steps, of the slowest rank per step, ms."""
        return self._slowest_mean_ms(replayed=False)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready summary (no graph)."""
        return {"kind": "replay", "paths": self.paths, "ranks": self.ranks,
                "replay_error_pct": self.replay_error_pct,
                "measured_step_ms": self.measured_step_ms, "replayed_step_ms": self.step_ms,
                "steps": [{"rank": s.rank, "step": s.step, "measured_ms": s.measured_ms,
                           "replayed_ms": s.replayed_ms, "error_pct": s.error_pct} for s in self.steps],
                "clock_offsets_us": {str(r): v for r, v in self.clock_offsets_us.items()},
                "breakdown": self.breakdown, "critical_path": self.critical_path,
                "peak_memory_bytes": {str(r): v for r, v in self.peak_memory_bytes.items()},
                "makespan_ms": self.makespan_ms, "measured_span_ms": self.measured_span_ms,
                "busy_ms_by_category": self.busy_ms_by_category, "n_tasks": self.n_tasks,
                "n_streams": self.n_streams, "parse_s": self.parse_s, "build_s": self.build_s,
                "replay_s": self.replay_s, "assumptions": self.assumptions}


# ---- building ------------------------------------------------------------------------------------------

def _merge(parts: list[tuple[int, KinetoTrace, ReplayGraph]]) -> tuple[ExecutionGraph, list[RankGraph]]:
    """One graph of all ranks: rank i is rank class i; task ids shifted, streams kept per class."""
    if len(parts) == 1:
        rank, tr, rg = parts[0]
        return rg.graph, [RankGraph(rank, tr, rg, 0, len(rg.graph))]
    g = ExecutionGraph()
    out: list[RankGraph] = []
    for ci, (rank, tr, rg) in enumerate(parts):
        sub = rg.graph
        off = len(g)
        g.classes.append(RankClass(f"rank{rank}", 0, 1, range(rank, rank + 1)))
        for t in range(len(sub)):
            g.add(sub.name[t], sub.kind[t], sub.stream[t], sub.category[t], sub.duration_s[t], (ci,),
                  [d + off for d in sub.deps[t]], host_s=sub.host_s[t], host_path_s=sub.host_path_s[t],
                  host_sync=sub.host_sync[t])
        for s, nm in sub.stream_names.items():
            g.stream_names.setdefault(s, nm)
        out.append(RankGraph(rank, tr, rg, off, len(sub)))
    return g, out


def _queue_prev(g: ExecutionGraph) -> dict[int, int]:
    """Each task's predecessor in its (class, stream) queue."""
    prev: dict[int, int] = {}
    for q in g.queues.values():
        for a, b in zip(q, q[1:], strict=False):
            prev[b] = a
    return prev


def _couple(rgs: ReplayGraphs) -> None:
    """Coupled collectives: every member's work waits for all members' readiness and runs wait-free."""
    g = rgs.graph
    idx = {r.rank: i for i, r in enumerate(rgs.ranks)}
    prev = _queue_prev(g)
    off = rgs.matching.offsets_us

    def task(c: CollCall) -> int:
        rk = rgs.ranks[idx[c.rank]]
        return rk.task0 + rk.rg.coll_task[c.row]

    base_deps = {task(c): list(g.deps[task(c)]) for calls in rgs.matching.matched for c in calls}
    for calls in rgs.matching.matched:
        members = []
        for c in calls:
            t = task(c)
            end = c.end_us - off[c.rank]
            members.append((t, idx[c.rank], end - g.duration_s[t] * 1e6, end))  # the task's measured start
        latest = max(m[2] for m in members)
        shortest = min(g.duration_s[m[0]] for m in members)
        for t, _, _, end in members:
            ready = {d for m in members if m[0] != t for d in (*base_deps[m[0]], prev.get(m[0], -1)) if d >= 0}
            g.deps[t].extend(d for d in ready if d not in g.deps[t])
            g.duration_s[t] = min(max((end - latest) * 1e-6, shortest), g.duration_s[t])
        rgs.coupled.append([(m[0], m[1]) for m in members])


def _delay_starts(rgs: ReplayGraphs) -> None:
    """Shift each rank's start by its aligned clock origin (a 'clock' task its first tasks wait for)."""
    if len(rgs.ranks) < 2:
        return
    off = rgs.matching.offsets_us
    origins = [r.trace.origin_us - off.get(r.rank, 0.0) for r in rgs.ranks]
    zero = min(origins)
    g = rgs.graph
    stream = max(g.stream, default=0) + 1
    g.stream_names[stream] = "clock offset"
    for ci, (rk, o) in enumerate(zip(rgs.ranks, origins, strict=True)):
        d = (o - zero) * 1e-6
        rk.delay_s = d
        if d <= 0:
            continue
        t0 = g.add("clock start", "host", stream, "clock", d, (ci,), [])
        for t in range(rk.task0, rk.task0 + rk.n_tasks):
            if not g.deps[t]:
                g.deps[t].append(t0)


def build_graphs(traces: Sequence[KinetoTrace], tol_us: float = 5.0, measured_latency: bool = True) -> ReplayGraphs:
    """Per-rank replay graphs merged, collectives coupled, clocks aligned."""
    ranks = rank_of(list(traces))
    parts = [(r, t, build_replay(t, tol_us, measured_latency)) for r, t in zip(ranks, traces, strict=True)]
    g, rank_graphs = _merge(parts)
    matching = match_collectives(list(traces), ranks, [set(rg.coll_task) for _, _, rg in parts]) \
        if len(traces) > 1 else Matching(offsets_us={ranks[0]: 0.0})
    rgs = ReplayGraphs(g, rank_graphs, matching)
    _couple(rgs)
    _delay_starts(rgs)
    seen: set[str] = set()
    for t, (_, _, rg) in zip(traces, parts, strict=True):
        for a in [*t.assumptions, *rg.assumptions]:
            if a not in seen:
                seen.add(a)
                rgs.assumptions.append(a if len(traces) == 1 else f"{Path(t.path).name}: {a}")
    rgs.assumptions += matching.assumptions
    return rgs


# ---- results --------------------------------------------------------------------------------------------

def _boundary_task(rk: RankGraph, thread: int, t_us: float) -> int:
    """Merged id of the segment that ends at a boundary of a thread's chain (-1 for the chain's start)."""
    rg = rk.rg
    b = rg.boundary_us[thread]
    j = int(np.searchsorted(b, round_us(t_us)))
    if j >= len(b) or b[j] != round_us(t_us):
        raise ValueError(f"{t_us} us is not a segment boundary of thread {thread}")
    return -1 if j == 0 else rk.task0 + rg.first_segment[thread] + j - 1


def _boundary_time_s(rk: RankGraph, sim: SimTrace, thread: int, t_us: float) -> float:
    """Replayed time of a boundary on a thread's chain (the end of the segment that ends there)."""
    t = _boundary_task(rk, thread, t_us)
    return rk.delay_s if t < 0 else sim.end_s[t]


def _window_path(g: ExecutionGraph, sim: SimTrace, last: int, a: float, b: float, labels: dict[int, str],
                 into: dict[str, float]) -> None:
    """Walk the critical path back from task `last` through [a, b]: ms by label (category where unlabelled)."""
    t = last
    while t >= 0 and sim.end_s[t] > a:
        span = min(sim.end_s[t], b) - max(sim.start_s[t], a)
        if span > 0:
            into[labels.get(t) or g.category[t]] += span * 1e3
        t = sim.critical_pred[t]


def _rank_end_s(rk: RankGraph, sim: SimTrace) -> float:
    ends = sim.end_s[rk.task0:rk.task0 + rk.n_tasks]
    return max(ends, default=0.0)


def _labels(rk: RankGraph, g: ExecutionGraph, classify: Callable[[KinetoTrace], list[str]] | None) -> list[str]:
    """A breakdown label per task of the rank ('' for tasks that do not count)."""
    tr, rg = rk.trace, rk.rg
    labels = [""] * rk.n_tasks
    main = rg.thread_stream.get(rg.main_thread)
    gpu0 = rg.gpu_task0
    kinds = {tr.collectives.row[j]: tr.collectives.kind[j] or "other" for j in range(len(tr.collectives))
             if tr.collectives.source[j] == CollectiveSource.GPU_KERNEL}
    classes = classify(tr) if classify is not None else None
    gk = tr.gpu.kind.tolist()
    for i in range(len(tr.gpu)):
        if i in kinds:
            labels[gpu0 + i] = f"comm.{kinds[i]}"
        elif gk[i] == GpuKind.MEMCPY:
            labels[gpu0 + i] = "memcpy"
        elif gk[i] == GpuKind.MEMSET:
            labels[gpu0 + i] = "memset"
        else:
            labels[gpu0 + i] = f"compute.{classes[i]}" if classes is not None else "compute"
    if main is not None:
        cpu_only = not len(tr.gpu)
        for t in range(gpu0):
            if g.stream[rk.task0 + t] != main:
                continue
            cat = g.category[rk.task0 + t]
            if cat in ("host", "launch", "runtime"):
                labels[t] = "cpu.host" if cpu_only else "cpu_bound"
    return labels


_PRIORITY = ("compute", "comm", "memcpy", "memset", "cpu")


def _sweep(rk: RankGraph, sim: SimTrace, labels: list[str]) -> tuple[np.ndarray, list[str]]:
    """Labelled segments of the rank's replayed timeline: boundaries and the label of each piece."""
    ev: list[tuple[float, int, str]] = []
    for t, lab in enumerate(labels):
        if not lab:
            continue
        s, e = sim.start_s[rk.task0 + t], sim.end_s[rk.task0 + t]
        if e > s:
            ev.append((s, 1, lab))
            ev.append((e, -1, lab))
    ev.sort(key=lambda x: (x[0], x[1]))
    active: dict[str, int] = defaultdict(int)
    bounds: list[float] = []
    out: list[str] = []
    for time_s, delta, lab in ev:
        if bounds and time_s > bounds[-1]:
            best = ""
            for p in _PRIORITY:
                hit = next((k for k, v in active.items() if v > 0 and k.startswith(p)), "")
                if hit:
                    best = hit
                    break
            out.append(best or "idle")
        if not bounds or time_s > bounds[-1]:
            bounds.append(time_s)
        active[lab] += delta
    return np.asarray(bounds), out


def _window_breakdown(bounds: np.ndarray, labels: list[str], a: float, b: float, into: dict[str, float]) -> None:
    if b <= a:
        return
    if len(bounds) < 2:
        into["idle"] += (b - a) * 1e3
        return
    covered = 0.0
    i0 = max(int(np.searchsorted(bounds, a, side="right")) - 1, 0)
    for i in range(i0, len(labels)):
        s, e = max(bounds[i], a), min(bounds[i + 1], b)
        if bounds[i] >= b:
            break
        if e > s:
            into[labels[i]] += (e - s) * 1e3
            covered += e - s
    into["idle"] += max(b - a - covered, 0.0) * 1e3


def _peak_memory(tr: KinetoTrace) -> dict[str, int]:
    """Peak allocated bytes per device from the trace's `[memory]` events (allocator totals)."""
    m = tr.memory
    out: dict[str, int] = {}
    if not len(m):
        return out
    for dt, dev in sorted({(int(a), int(b)) for a, b in zip(m.device_type.tolist(), m.device_id.tolist(),
                                                            strict=True)}):
        sel = (m.device_type == dt) & (m.device_id == dev)
        tot = m.total_allocated_bytes[sel]
        peak = int(tot.max()) if np.all(tot >= 0) else int(max(np.cumsum(m.bytes[sel]).max(), 0))
        out["cpu" if dt == 0 else f"gpu{dev}"] = peak
    return out


TRACE_SUFFIXES = (".json", ".json.gz")
_FIX = "pass torch.profiler traces (.json or .json.gz), a folder of them, or a glob"


def expand_traces(args: Sequence[str | Path]) -> list[Path]:
    """Files, folders (their *.json / *.json.gz, sorted) and globs -> trace paths, each once."""
    if not args:
        raise ConfigError("TRACE", "no trace given", _FIX)
    out: list[Path] = []
    for a in map(str, args):
        if not a.strip():
            raise ConfigError("TRACE", "an empty path", _FIX)
        p = Path(a)
        if any(ch in a for ch in "*?[") and not p.exists():
            hits = sorted(Path(h) for h in glob.glob(a, recursive=True) if Path(h).is_file())
            if not hits:
                raise ConfigError("TRACE", f"'{a}' matches no file", _FIX)
            out += hits
        elif p.is_dir():
            hits = sorted(f for f in p.iterdir() if f.is_file() and f.name.endswith(TRACE_SUFFIXES))
            if not hits:
                raise ConfigError("TRACE", f"folder {a} holds no .json or .json.gz file", _FIX)
            out += hits
        elif not p.exists():
            raise ConfigError("TRACE", f"{a} does not exist", _FIX)
        elif not p.is_file():
            raise ConfigError("TRACE", f"{a} is not a file", _FIX)
        else:
            out.append(p)
    seen: set[Path] = set()
    uniq = []
    for p in out:
        if p.resolve() not in seen:
            seen.add(p.resolve())
            uniq.append(p)
    return uniq


def read_traces(paths: Sequence[str | Path | KinetoTrace],
                progress: Callable[[int, int], None] | None = None) -> list[KinetoTrace]:
    """Read every trace, in order (already-read ones pass through; folders and globs expand to their traces)."""
    items: list[Path | KinetoTrace] = []
    for p in paths:
        items += [p] if isinstance(p, KinetoTrace) else expand_traces([p])
    out = []
    for i, p in enumerate(items):
        out.append(p if isinstance(p, KinetoTrace) else read_kineto(p))
        if progress is not None:
            progress(i + 1, len(items))
    return out


def replay(paths: Sequence[str | Path | KinetoTrace] | str | Path | KinetoTrace, *, tol_us: float = 5.0,
           measured_latency: bool = True, edits: Sequence[GraphEdit] = (),
           classify: Callable[[KinetoTrace], list[str]] | None = None,
           progress: Callable[[int, int], None] | None = None) -> ReplayResult:
    """Replay one trace per rank: read, build and merge the graphs, apply what-if `edits`, run the engine,
    and compare each step with its measurement. `classify` names each GPU op's class for the breakdown."""
    if isinstance(paths, (str, Path, KinetoTrace)):
        paths = [paths]
    if not paths:
        raise ConfigError("TRACE", "no trace given", "pass one torch.profiler trace per rank")
    t0 = time.perf_counter()
    traces = read_traces(paths)
    t1 = time.perf_counter()
    rgs = build_graphs(traces, tol_us, measured_latency)
    for edit in edits:
        edit(rgs)
    t2 = time.perf_counter()
    g = rgs.graph
    sim = run(g, gamma=0.0, record_memory=False, bandwidth_sharing=any(d is not None for d in g.flow_demand),
              progress=progress)
    t3 = time.perf_counter()
    return _result(rgs, sim, t1 - t0, t2 - t1, t3 - t2, classify)


def _result(rgs: ReplayGraphs, sim: SimTrace, parse_s: float, build_s: float, replay_s: float,
            classify: Callable[[KinetoTrace], list[str]] | None) -> ReplayResult:
    g = rgs.graph
    steps: list[StepReplay] = []
    breakdown: dict[str, float] = defaultdict(float)
    cpath: dict[str, float] = defaultdict(float)
    n_windows = 0
    for rk in rgs.ranks:
        labels = _labels(rk, g, classify)
        bounds, seg_labels = _sweep(rk, sim, labels)
        gpu_labels = {rk.task0 + t: lab for t, lab in enumerate(labels) if t >= rk.rg.gpu_task0 and lab}
        for w in rk.trace.steps():
            if w.source == "trace":
                a, b = rk.delay_s + w.start_us * 1e-6, _rank_end_s(rk, sim)
                last = max(range(rk.task0, rk.task0 + rk.n_tasks), key=lambda t: sim.end_s[t], default=-1)
            else:
                th = rk.rg.step_thread[w.step]
                a, b = _boundary_time_s(rk, sim, th, w.start_us), _boundary_time_s(rk, sim, th, w.end_us)
                last = _boundary_task(rk, th, w.end_us)
            steps.append(StepReplay(w.step, w.dur_us / 1e3, (b - a) * 1e3, rk.rank))
            _window_breakdown(bounds, seg_labels, a, b, breakdown)
            _window_path(g, sim, last, a, b, gpu_labels, cpath)
            n_windows += 1
    errs = [s.error_pct for s in steps if s.measured_ms > 0]
    busy: dict[str, float] = defaultdict(float)
    for t in range(len(g)):
        busy[g.category[t]] += (sim.end_s[t] - sim.start_s[t]) * 1e3
    measured_end = 0.0
    for rk in rgs.ranks:
        for tab in (rk.trace.cpu, rk.trace.runtime, rk.trace.gpu):
            if len(tab):
                measured_end = max(measured_end, float(np.max(tab.ts_us + tab.dur_us)))
    cp = {k: v / max(n_windows, 1) for k, v in sorted(cpath.items(), key=lambda kv: -kv[1])}
    return ReplayResult(
        paths=[rk.trace.path for rk in rgs.ranks], ranks=[rk.rank for rk in rgs.ranks], steps=steps,
        replay_error_pct=float(np.mean(errs)) if errs else 0.0,
        clock_offsets_us={rk.rank: rgs.matching.offsets_us.get(rk.rank, 0.0) for rk in rgs.ranks},
        breakdown={k: v / max(n_windows, 1) for k, v in sorted(breakdown.items(), key=lambda kv: -kv[1])},
        critical_path=cp, makespan_ms=max(sim.end_s, default=0.0) * 1e3, measured_span_ms=measured_end / 1e3,
        busy_ms_by_category=dict(busy), n_tasks=len(g), n_streams=len({(c, s) for c, s in g.queues}),
        peak_memory_bytes={rk.rank: p for rk in rgs.ranks if (p := _peak_memory(rk.trace))},
        parse_s=parse_s, build_s=build_s, replay_s=replay_s, assumptions=list(rgs.assumptions),
        trace=sim, graphs=rgs)


def replay_trace(path_or_trace: str | Path | KinetoTrace, tol_us: float = 5.0,
                 measured_latency: bool = True) -> ReplayResult:
    """Replay one rank's trace on its own (its collectives keep their measured times)."""
    return replay([path_or_trace], tol_us=tol_us, measured_latency=measured_latency)


__all__ = ["ReplayGraphs", "ReplayResult", "StepReplay", "build_graphs", "read_traces", "replay", "replay_trace"]
