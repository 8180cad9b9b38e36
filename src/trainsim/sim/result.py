"""Simulation results: summary numbers, per-class breakdown, memory verdict and critical path."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

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
            "critical_path_length": len(self.critical_path),
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
    events: list[tuple[float, int, int, str]] = []  # (time, order, +1/-1, label)
    last_bwd_end = 0.0
    extra = sorted({s for c, s in graph.queues if c == cls and s >= len(Stream)})
    for stream in [*Stream, *extra]:
        for t in graph.queues.get((cls, stream), []):
            s, e = trace.start_s[t], trace.end_s[t]
            if e <= s:
                continue
            if stream == Stream.COMPUTE or (stream >= len(Stream) and graph.kind[t] == "compute"):
                for k, v in _split(graph, t, e - s):
                    out[k if k in out else "compute"] += v
                events.append((s, 1, 1, "@compute"))
                events.append((e, 0, -1, "@compute"))
                if graph.category[t] != "optimizer":
                    last_bwd_end = max(last_bwd_end, e)
            else:
                cat = graph.category[t]
                events.append((s, 1, 1, cat))
                events.append((e, 0, -1, cat))
    events.sort()
    active: dict[str, int] = defaultdict(int)
    prev = 0.0
    for time, _, delta, label in events:
        if time > prev:
            span = time - prev
            if active["@compute"] <= 0:
                kind = next((k for k in COMM_PRIORITY if active[k] > 0), None)
                if kind is not None:
                    out[kind] += span
                else:
                    _idle(out, prev, time, last_bwd_end)
            prev = time
        active[label] += delta
    if horizon_s > prev:
        _idle(out, prev, horizon_s, last_bwd_end)
    return out


def _idle(out: dict[str, float], a: float, b: float, last_bwd_end: float) -> None:
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
    paced = sum(v for k, v in parts.items() if k in _HOST_PACED)
    if span_s <= total or paced <= 0:
        return [(k, span_s * v / total) for k, v in parts.items()]
    host_wait = min(span_s, max(total, graph.host_path_s[t])) - total
    rest = span_s - total - host_wait
    comm = total - paced
    to_comm = rest if graph.flow_demand[t] and comm > 0 else 0.0
    grow_paced = (paced + host_wait + rest - to_comm) / paced
    grow_comm = (comm + to_comm) / comm if comm > 0 else 1.0
    return [(k, v * (grow_paced if k in _HOST_PACED else grow_comm)) for k, v in parts.items()]
