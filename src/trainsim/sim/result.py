"""Simulation results: summary numbers, per-class breakdown, memory verdict and critical path."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..compile.graph import ExecutionGraph
from ..compile.program import Stream
from .engine import SimTrace

BREAKDOWN_KEYS = ("compute", "recompute", "optimizer", "tp", "cp", "ep", "dp", "pp", "offload", "bubble", "idle")
# exposed time goes to the most blocking kind first; offload = memory-stream loads/stores (compile.offload)
COMM_PRIORITY = ("tp", "cp", "ep", "pp", "offload", "dp")
_HOST_PACED = frozenset({"compute", "recompute", "optimizer"})  # fused parts whose kernels host issue / gamma stretch


@dataclass
class StageMemory:
    stage: int
    static_bytes: float
    activation_peak_bytes: float
    peak_bytes: float
    capacity_bytes: float

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.capacity_bytes


@dataclass
class SimulationResult:
    """Everything a user asks of one predicted iteration (see `to_json`)."""

    model: str
    cluster: str
    device: str
    n_gpus: int
    strategy: dict[str, Any]
    iteration_time_s: float
    global_batch: int
    tokens_per_sample: int | None
    model_flops: float
    hw_flops: float
    peak_tflops: float
    breakdown: dict[str, float]
    breakdown_per_stage: list[dict[str, float]]
    memory: list[StageMemory]
    critical_path: list[tuple[str, str, float, float]]
    critical_path_by_category: dict[str, float]
    simulation_wall_s: float = 0.0
    n_tasks: int = 0
    model_params: int = 0
    advice: list[str] = field(default_factory=list)
    placement: list[str] = field(default_factory=list)  # where each parallel axis lands on the topology
    model_assumptions: list[str] = field(default_factory=list)  # where the model approximates its source
    learned: dict[str, Any] | None = None  # the learned compute model's correction (learn.compute), if used
    critical_path_tasks: int = 0  # the critical path's length in tasks (`critical_path` is empty when folded)
    fold: str | None = None  # how the micro-batches were folded (sim.periodic), or why they were not
    fidelity: str = "event"  # event (the engine's schedule: graph and trace) | analytic (sim.analytic, neither)
    graph: ExecutionGraph | None = field(default=None, repr=False)
    trace: SimTrace | None = field(default=None, repr=False)

    @property
    def samples_per_s(self) -> float:
        return self.global_batch / self.iteration_time_s

    @property
    def tokens_per_s(self) -> float | None:
        return self.samples_per_s * self.tokens_per_sample if self.tokens_per_sample else None

    @property
    def tflops_per_gpu(self) -> float:
        """Model TFLOP/s per GPU (no recompute counted)."""
        return self.model_flops / self.iteration_time_s / self.n_gpus / 1e12

    @property
    def hw_tflops_per_gpu(self) -> float:
        """Hardware TFLOP/s per GPU (recompute counted)."""
        return self.hw_flops / self.iteration_time_s / self.n_gpus / 1e12

    @property
    def mfu(self) -> float:
        return self.tflops_per_gpu / self.peak_tflops

    @property
    def hfu(self) -> float:
        return self.hw_tflops_per_gpu / self.peak_tflops

    @property
    def oom(self) -> bool:
        return any(not s.fits for s in self.memory)

    @property
    def peak_memory_bytes(self) -> list[float]:
        return [s.peak_bytes for s in self.memory]

    def timeline(self, rank_class: int = 0) -> list[tuple[str, str, str, float, float]]:
        """(task, stream, category, start_s, end_s) of one rank class in start order."""
        g, tr = self.graph, self.trace
        assert g is not None and tr is not None
        rows = [(g.name[t], g.stream_name(g.stream[t]), g.category[t], tr.start_s[t], tr.end_s[t])
                for t in range(len(g)) if rank_class in g.participants[t]]
        return sorted(rows, key=lambda r: (r[3], r[4]))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "model": self.model, "model_params": self.model_params, "seq_len": self.tokens_per_sample,
            "cluster": self.cluster, "device": self.device, "n_gpus": self.n_gpus,
            "strategy": self.strategy,
            "iteration_time_s": self.iteration_time_s,
            "samples_per_s": self.samples_per_s,
            "samples_per_s_per_gpu": self.samples_per_s / self.n_gpus,
            "tflops_per_gpu": self.tflops_per_gpu,
            "hw_tflops_per_gpu": self.hw_tflops_per_gpu,
            "mfu": self.mfu, "hfu": self.hfu,
            "peak_memory_bytes": self.peak_memory_bytes,
            "memory_capacity_bytes": self.memory[0].capacity_bytes if self.memory else 0,
            "memory_per_stage": [{"stage": s.stage, "static_bytes": s.static_bytes,
                                  "activation_peak_bytes": s.activation_peak_bytes, "peak_bytes": s.peak_bytes,
                                  "fits": s.fits} for s in self.memory],
            "oom": self.oom,
            "breakdown": self.breakdown,
            "breakdown_per_stage": self.breakdown_per_stage,
            "critical_path_by_category": self.critical_path_by_category,
            "critical_path_length": self.critical_path_tasks,
            "advice": self.advice,
            "simulation_wall_s": self.simulation_wall_s,
            "n_tasks": self.n_tasks,
        }
        if self.model_assumptions:
            out["model_assumptions"] = self.model_assumptions
        if self.placement:
            out["placement"] = self.placement
        if self.learned is not None:
            out["compute_model"] = self.learned
        if self.tokens_per_sample:
            out["tokens_per_s"] = self.tokens_per_s
            out["tokens_per_s_per_gpu"] = (self.tokens_per_s or 0.0) / self.n_gpus
        return out


def class_breakdown(graph: ExecutionGraph, trace: SimTrace, cls: int, horizon_s: float) -> dict[str, float]:
    """Split [0, horizon) of one class into compute parts, exposed comm by kind, bubble and idle."""
    out = dict.fromkeys(BREAKDOWN_KEYS, 0.0)
    last_bwd_end = 0.0
    for t in class_tasks(graph, cls):
        s, e = trace.start_s[t], trace.end_s[t]
        if e > s and is_compute(graph, t):
            add_compute_parts(out, graph, trace, t)
            if graph.category[t] != "optimizer":
                last_bwd_end = max(last_bwd_end, e)
    for k, v in exposed_time(graph, trace, cls, 0.0, horizon_s, last_bwd_end).items():
        out[k] += v
    return out


def add_compute_parts(out: dict[str, float], graph: ExecutionGraph, trace: SimTrace, t: int) -> None:
    """Add a compute task's run time to the breakdown `out` by category (fused tasks split, `_split`)."""
    for k, v in _split(graph, t, trace.end_s[t] - trace.start_s[t]):
        out[k if k in out else "compute"] += v


def class_tasks(graph: ExecutionGraph, cls: int) -> list[int]:
    """Every task a class takes part in, stream by stream (the graph's streams, then a trace's own)."""
    extra = sorted({s for c, s in graph.queues if c == cls and s >= len(Stream)})
    return [t for stream in [*Stream, *extra] for t in graph.queues.get((cls, stream), [])]


def is_compute(graph: ExecutionGraph, t: int) -> bool:
    """A compute-stream task (or a replayed trace's compute kernel on a stream of its own)."""
    s = graph.stream[t]
    return s == Stream.COMPUTE or (s >= len(Stream) and graph.kind[t] == "compute")


_LABELS = ("@compute", *COMM_PRIORITY)  # sweep columns; a category outside them is ignored unless compute


def exposed_time(graph: ExecutionGraph, trace: SimTrace, cls: int, lo: float, hi: float,
                 last_bwd_end: float) -> dict[str, float]:
    """Over [lo, hi) of one class, the time no compute runs: exposed communication by kind (the most
    blocking first, COMM_PRIORITY) and, where nothing runs, bubble (before `last_bwd_end`) or idle after.
    A sweep over the tasks' start and end events, in numpy (one column of active counts per kind)."""
    out = dict.fromkeys(("bubble", "idle", *COMM_PRIORITY), 0.0)
    tasks = class_tasks(graph, cls)
    if not tasks:
        _idle(out, lo, hi, last_bwd_end)
        return out
    start = np.clip(np.fromiter((trace.start_s[t] for t in tasks), float, len(tasks)), lo, hi)
    end = np.clip(np.fromiter((trace.end_s[t] for t in tasks), float, len(tasks)), lo, hi)
    column = {k: i for i, k in enumerate(_LABELS)}
    label = np.fromiter((0 if is_compute(graph, t) else column.get(graph.category[t], len(_LABELS))
                         for t in tasks), np.int64, len(tasks))
    keep = end > start
    start, end, label = start[keep], end[keep], label[keep]
    if not len(start):
        _idle(out, lo, hi, last_bwd_end)
        return out
    times = np.concatenate([start, end])
    order = np.argsort(times, kind="stable")
    times = times[order]
    counts = np.zeros((len(times), len(_LABELS) + 1))
    counts[np.arange(len(times)), np.concatenate([label, label])[order]] = np.concatenate(
        [np.ones(len(start)), -np.ones(len(end))])[order]
    active = np.cumsum(counts, axis=0)[:-1] > 0.5  # what runs between event i and event i + 1
    a, b = times[:-1], times[1:]
    span = b - a
    free = ~active[:, 0] & (span > 0)
    comm = active[:, 1:len(_LABELS)]
    busy = comm.any(axis=1)
    first = np.argmax(comm, axis=1)
    for i, kind in enumerate(COMM_PRIORITY):
        out[kind] = float(span[free & busy & (first == i)].sum())
    gaps = free & ~busy
    cut = np.minimum(np.maximum(last_bwd_end, a[gaps]), b[gaps])
    out["bubble"] = float((cut - a[gaps]).sum())
    out["idle"] = float((b[gaps] - cut).sum())
    _idle(out, lo, float(times[0]), last_bwd_end)
    _idle(out, float(times[-1]), hi, last_bwd_end)
    return out


def _idle(out: dict[str, float], a: float, b: float, last_bwd_end: float) -> None:
    if b <= a:
        return
    cut = min(max(last_bwd_end, a), b)
    out["bubble"] += cut - a
    out["idle"] += b - cut


def critical_path(graph: ExecutionGraph, trace: SimTrace) -> list[int]:
    """dPRO: walk back from the last task through the predecessor that released each task."""
    if not len(graph):
        return []
    t = max(range(len(graph)), key=lambda i: trace.end_s[i])
    path = []
    while t >= 0:
        path.append(t)
        t = trace.critical_pred[t]
    return path[::-1]


def time_by_category(graph: ExecutionGraph, trace: SimTrace, tasks: list[int]) -> dict[str, float]:
    """Seconds the given tasks spend per category (fused tasks split by their parts)."""
    out: dict[str, float] = defaultdict(float)
    for t in tasks:
        for k, v in _split(graph, t, trace.end_s[t] - trace.start_s[t]):
            out[k] += v
    return dict(out)


def task_parts(graph: ExecutionGraph, trace: SimTrace, t: int) -> list[tuple[str, float]]:
    """Seconds task t spent per category as it ran (what the breakdown counts; fused tasks split)."""
    return _split(graph, t, trace.end_s[t] - trace.start_s[t])


def _split(graph: ExecutionGraph, t: int, span_s: float) -> list[tuple[str, float]]:
    """A task's run time shared among its categories (fused tasks in proportion to their parts).

    A fused task that ran longer than its parts is split as its ops would be if they ran as separate
    tasks: waiting for the host to issue its kernels (up to its host_path_s) and, without a link
    share, the overlap slowdown are its compute kernels' time; a link share slows its communication."""
    parts = graph.parts[t]
    if not parts:
        return [(graph.category[t], span_s)]
    total = sum(parts.values()) or 1.0
    if span_s <= total:
        return [(k, span_s * v / total) for k, v in parts.items()]
    paced = sum(v for k, v in parts.items() if k in _HOST_PACED)
    if paced <= 0:
        return [(k, span_s * v / total) for k, v in parts.items()]
    host_wait = min(span_s, max(total, graph.host_path_s[t])) - total
    rest = span_s - total - host_wait
    comm = total - paced
    to_comm = rest if graph.flow_demand[t] and comm > 0 else 0.0
    grow_paced = (paced + host_wait + rest - to_comm) / paced
    grow_comm = (comm + to_comm) / comm if comm > 0 else 1.0
    return [(k, v * (grow_paced if k in _HOST_PACED else grow_comm)) for k, v in parts.items()]
