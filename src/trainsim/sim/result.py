"""Simulation results: summary numbers, per-class breakdown, memory verdict and critical path."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np

from ..compile.graph import ExecutionGraph
from ..compile.program import Stream
from .engine import SimTrace

BREAKDOWN_KEYS = ("compute", "recompute", "optimizer", "tp", "cp", "ep", "dp", "pp", "offload", "bubble", "idle")
# exposed time goes to the most blocking kind first; offload = memory-stream loads/stores (compile.offload)
COMM_PRIORITY = ("tp", "cp", "ep", "pp", "offload", "dp")
_HOST_PACED = frozenset({"compute", "recompute", "optimizer"})  # fused parts whose kernels host issue / gamma stretch
_LABELS = ("@compute", *COMM_PRIORITY)  # sweep columns; a category outside them is ignored unless compute
_FIRST_BIT = tuple(next((i for i in range(len(COMM_PRIORITY)) if bits >> i & 1), len(COMM_PRIORITY))
                   for bits in range(1 << len(COMM_PRIORITY)))  # bit mask -> its lowest bit set (or none)


COMPONENT_NAMES = {"params": "parameters", "grads": "gradients", "optimizer_states": "optimizer states",
                   "activations": "activations", "workspaces": "workspaces/buffers",
                   "static": "parameters, gradients and optimizer states"}
"""StageMemory.components()' keys as a user reads them (the OOM advice and report)."""


@dataclass
class StageMemory:
    """One pipeline stage's memory. `peak_bytes` is the allocated peak (torch.cuda.max_memory_allocated: the
    tensors alive at once); `peak_reserved_bytes` what PyTorch's caching allocator holds for them
    (max_memory_reserved: rounding, segment tails, freed blocks it cannot reuse; cost.allocator), which is what
    must fit: the verdict compares it with `capacity_bytes`. `components_bytes`: the peak by kind (params,
    grads, optimizer_states, activations, workspaces) for the OOM message."""

    stage: int
    static_bytes: float
    activation_peak_bytes: float
    peak_bytes: float
    capacity_bytes: float
    peak_reserved_bytes: float = 0.0  # 0: not estimated (taken as the allocated peak)
    components_bytes: dict[str, float] = field(default_factory=dict)

    @property
    def reserved_bytes(self) -> float:
        """The reserved peak, never below the allocated one."""
        return max(self.peak_bytes, self.peak_reserved_bytes)

    def components(self) -> dict[str, float]:
        """Bytes by component (components_bytes, else the static and activation peaks), largest first."""
        parts = self.components_bytes or {"static": self.static_bytes, "activations": self.activation_peak_bytes}
        return dict(sorted(parts.items(), key=lambda kv: -kv[1]))

    @property
    def fits(self) -> bool:
        """The OOM verdict: the caching allocator's reserved peak within the usable capacity."""
        return self.reserved_bytes <= self.capacity_bytes

    def largest_component(self) -> tuple[str, float]:
        """(name as a user reads it, bytes) of the stage's largest memory component."""
        key, size = next(iter(self.components().items()))
        return COMPONENT_NAMES.get(key, key), size

    def over_line(self) -> str:
        """How far the stage is over its capacity (reserved peak) and its largest component, in one line."""
        name, size = self.largest_component()
        return (f"stage {self.stage} needs {(self.reserved_bytes - self.capacity_bytes) / 2**30:.1f} GiB more than "
                f"fits ({self.reserved_bytes / 2**30:.1f} GiB reserved of {self.capacity_bytes / 2**30:.1f}); "
                f"largest component: {name}, {size / 2**30:.1f} GiB")


def fullest_stage(memory: list[StageMemory]) -> StageMemory:
    """The stage furthest over (or least under) its capacity, by its reserved peak."""
    return max(memory, key=lambda m: m.reserved_bytes - m.capacity_bytes)


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
    active_params: int = 0  # what one token runs through (model_params less the routed experts it skips)
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
            "model": self.model, "model_params": self.model_params, "active_params": self.active_params,
            "seq_len": self.tokens_per_sample,
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
            "peak_reserved_bytes": [s.reserved_bytes for s in self.memory],
            "memory_verdict_uses": "peak_reserved (the caching allocator's segments must fit)",
            "memory_per_stage": [{"stage": s.stage, "static_bytes": s.static_bytes,
                                  "activation_peak_bytes": s.activation_peak_bytes, "peak_bytes": s.peak_bytes,
                                  "peak_allocated_bytes": s.peak_bytes, "peak_reserved_bytes": s.reserved_bytes,
                                  "components_bytes": s.components_bytes,
                                  "largest": next(iter(s.components())),
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


@dataclass(frozen=True)
class TaskColumns:
    """The graph's and the trace's columns that the breakdown, the critical path's categories and the fold
    read, as numpy arrays: built once per result, then all classes are summed at once (no per-class or
    per-task Python loops). The rows: each task's run time split among its categories (`_split`), one row per
    part (one for a task without parts), task by task: task t's rows are row_start[t] .. row_start[t + 1]."""

    start: np.ndarray
    end: np.ndarray
    stream: np.ndarray
    compute: np.ndarray  # is_compute, per task
    label: np.ndarray  # sweep column per task: 0 compute, 1 + COMM_PRIORITY's index, len(_LABELS) anything else
    optimizer: np.ndarray  # category "optimizer"
    member_task: np.ndarray  # one row per (task, class taking part in it), task by task
    member_class: np.ndarray
    n_classes: int
    one_class_each: bool  # every task has exactly one class (member_task is 0..n-1)
    names: list[str]  # the categories the rows name
    row_start: np.ndarray
    row_task: np.ndarray
    row_key: np.ndarray  # index into names
    row_seconds: np.ndarray


def task_columns(graph: ExecutionGraph, trace: SimTrace) -> TaskColumns:
    """The columns of a simulated graph (see TaskColumns)."""
    n = len(graph)
    start, end = np.asarray(trace.start_s, dtype=float), np.asarray(trace.end_s, dtype=float)
    stream = np.fromiter(graph.stream, np.int64, n)
    compute = stream == Stream.COMPUTE
    for t in np.flatnonzero(stream >= len(Stream)).tolist():  # a replayed trace's kernels on streams of their own
        compute[t] = graph.kind[t] == "compute"
    parts = graph.parts
    fused = np.flatnonzero(np.fromiter(map(bool, parts), bool, n))
    dicts = [parts[t] for t in fused.tolist()]
    part_names = list(chain.from_iterable(dicts))
    names = sorted(set(graph.category).union(part_names))
    index = {k: i for i, k in enumerate(names)}
    category = np.fromiter(map(index.__getitem__, graph.category), np.int64, n)
    column = {k: i for i, k in enumerate(_LABELS)}
    label = np.array([column.get(k, len(_LABELS)) for k in names], dtype=np.int64)[category]
    label[compute] = 0
    sizes = np.fromiter(map(len, dicts), np.int64, len(dicts))
    counts = np.ones(n, dtype=np.int64)
    counts[fused] = sizes
    row_start = np.concatenate([[0], np.cumsum(counts)])
    row_task = np.repeat(np.arange(n), counts)
    row_key, row_seconds = category[row_task], (end - start)[row_task]  # a task without parts: all its category
    if len(fused):
        owner = np.repeat(np.arange(len(fused)), sizes)
        rows = row_start[fused][owner] + np.arange(len(owner)) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        row_key[rows] = np.fromiter(map(index.__getitem__, part_names), np.int64, len(part_names))
        values = np.fromiter(chain.from_iterable(map(dict.values, dicts)), float, len(part_names))
        paced = np.array([k in _HOST_PACED for k in names])[row_key[rows]]
        row_seconds[rows] = _fused_seconds(graph, fused, owner, values, paced, (end - start)[fused])
    members = np.fromiter(map(len, graph.participants), np.int64, n)
    member_class = np.fromiter(chain.from_iterable(graph.participants), np.int64, int(members.sum()))
    member_task = np.repeat(np.arange(n), members)
    return TaskColumns(start, end, stream, compute, label, category == index.get("optimizer", -1), member_task,
                       member_class, len(graph.classes), bool(np.all(members == 1)), names, row_start, row_task,
                       row_key, row_seconds)


def _fused_seconds(graph: ExecutionGraph, fused: np.ndarray, owner: np.ndarray, values: np.ndarray,
                   paced_row: np.ndarray, span: np.ndarray) -> np.ndarray:
    """`_split` of the fused tasks `fused` (ran `span` seconds) over their parts (rows of `owner`, an index into
    `fused`, with `values` seconds): the same arithmetic in numpy columns."""
    total = np.bincount(owner, values, len(fused))
    total[total == 0] = 1.0
    paced = np.bincount(owner, np.where(paced_row, values, 0.0), len(fused))
    out = span[owner] * values / total[owner]  # in proportion to its parts
    stretched = (span > total) & (paced > 0)
    if stretched.any():  # ran longer than its parts: host wait and overlap slowdown to compute, link share to comm
        host_path = np.asarray(graph.host_path_s, dtype=float)[fused]
        flow = np.fromiter(map(bool, graph.flow_demand), bool, len(graph))[fused]
        host_wait = np.minimum(span, np.maximum(total, host_path)) - total
        rest = span - total - host_wait
        comm = total - paced
        to_comm = np.where(flow & (comm > 0), rest, 0.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            grow_paced = (paced + host_wait + rest - to_comm) / paced
            grow_comm = np.where(comm > 0, (comm + to_comm) / comm, 1.0)
        rows = stretched[owner]
        grow = np.where(paced_row[rows], grow_paced[owner[rows]], grow_comm[owner[rows]])
        out[rows] = values[rows] * grow
    return out


def class_breakdowns(graph: ExecutionGraph, trace: SimTrace, horizon_s: float,
                     cols: TaskColumns | None = None) -> list[dict[str, float]]:
    """Every class's [0, horizon) split into compute parts, exposed comm by kind, bubble and idle (a gap
    before the class's last non-optimizer compute task ends is bubble, after it idle)."""
    cols = cols or task_columns(graph, trace)
    seconds = breakdown_seconds(cols, Sweep(cols, 0.0, horizon_s))
    return [dict(zip(BREAKDOWN_KEYS, row, strict=True)) for row in seconds.tolist()]


def breakdown_seconds(cols: TaskColumns, sweep: Sweep) -> np.ndarray:
    """[class, BREAKDOWN_KEYS]: `class_breakdowns` over the sweep's window."""
    ran = cols.compute & (cols.end > cols.start)
    last_bwd_end = np.zeros(cols.n_classes)
    busy = (ran & ~cols.optimizer)[cols.member_task]
    np.maximum.at(last_bwd_end, cols.member_class[busy], cols.end[cols.member_task[busy]])
    return compute_seconds(cols, ran) + sweep.seconds(sweep.lo, sweep.hi, last_bwd_end)


def compute_seconds(cols: TaskColumns, which: np.ndarray) -> np.ndarray:
    """[class, BREAKDOWN_KEYS]: the run time of the compute tasks among `which` (a mask), by category (a part
    outside the keys counts as compute), added to every class taking part."""
    which = which & cols.compute
    n_keys = len(BREAKDOWN_KEYS)
    key_of = np.array([BREAKDOWN_KEYS.index(k) if k in BREAKDOWN_KEYS else 0 for k in cols.names], dtype=np.int64)
    rows = which[cols.row_task]
    if cols.one_class_each:
        flat = cols.member_class[cols.row_task[rows]] * n_keys + key_of[cols.row_key[rows]]
        return np.bincount(flat, cols.row_seconds[rows], cols.n_classes * n_keys).reshape(-1, n_keys)
    local = np.cumsum(which) - 1  # the selected tasks, numbered
    per_task = np.bincount(local[cols.row_task[rows]] * n_keys + key_of[cols.row_key[rows]], cols.row_seconds[rows],
                           int(which.sum()) * n_keys).reshape(-1, n_keys)
    mine = which[cols.member_task]
    flat = (cols.member_class[mine] * n_keys)[:, None] + np.arange(n_keys)
    return np.bincount(flat.ravel(), per_task[local[cols.member_task[mine]]].ravel(),
                       cols.n_classes * n_keys).reshape(-1, n_keys)


class Sweep:
    """What fills each class's time in [lo, hi): spans [a, b) between consecutive start and end events of one
    class, with `kind` the COMM_PRIORITY index of the most blocking communication exposed there (no compute
    runs), len(COMM_PRIORITY) for nothing running, -1 for compute. One sweep over all classes' events sorted
    by class then time: a running count per sweep column says what runs between two events."""

    def __init__(self, cols: TaskColumns, lo: float, hi: float) -> None:
        self.lo, self.hi, self.n_classes = lo, hi, cols.n_classes
        task, cls = cols.member_task, cols.member_class
        start, end = np.clip(cols.start[task], lo, hi), np.clip(cols.end[task], lo, hi)
        keep = end > start
        task, cls, start, end = task[keep], cls[keep], start[keep], end[keep]
        times = np.concatenate([start, end])
        ev_cls = np.concatenate([cls, cls])
        order = np.argsort(times, kind="stable")  # by time (a start before an end at one time), then by class
        small = ev_cls.astype(np.int16) if self.n_classes < 2**15 else ev_cls  # numpy sorts int16 by radix
        order = order[np.argsort(small[order], kind="stable")]
        times, ev_cls = times[order], ev_cls[order]
        label = np.concatenate([cols.label[task], cols.label[task]])[order]
        step = np.concatenate([np.ones(len(start), np.int32), np.full(len(start), -1, np.int32)])[order]
        counts = np.zeros((len(times), len(_LABELS) + 1), np.int32)
        counts[np.arange(len(times)), label] = step
        active = np.cumsum(counts, axis=0)[:-1] > 0  # what runs between event i and i + 1 (of one class)
        # the most blocking communication running: the lowest bit set of the running kinds' bit mask
        kind = np.asarray(_FIRST_BIT)[active[:, 1:len(_LABELS)] @ (1 << np.arange(len(COMM_PRIORITY)))]
        kind[active[:, 0]] = -1
        inner = ev_cls[:-1] == ev_cls[1:]
        # before a class's first event and after its last nothing runs (all of [lo, hi) for a class without tasks)
        head, tail = np.full(self.n_classes, hi), np.full(self.n_classes, hi)
        if len(times):
            firsts = np.flatnonzero(np.r_[True, ev_cls[1:] != ev_cls[:-1]])
            lasts = np.r_[firsts[1:] - 1, len(times) - 1]
            head[ev_cls[firsts]], tail[ev_cls[firsts]] = times[firsts], times[lasts]
        everyone = np.arange(self.n_classes)
        self.a = np.concatenate([times[:-1][inner], np.full(self.n_classes, lo), tail])
        self.b = np.concatenate([times[1:][inner], head, np.full(self.n_classes, hi)])
        self.cls = np.concatenate([ev_cls[:-1][inner], everyone, everyone])
        self.kind = np.concatenate([kind[inner], np.full(2 * self.n_classes, len(COMM_PRIORITY))])

    def seconds(self, lo: float, hi: float, last_bwd_end: np.ndarray | float) -> np.ndarray:
        """[class, BREAKDOWN_KEYS] over [lo, hi) (within the sweep's window): exposed communication by kind and,
        where nothing runs, bubble before the class's `last_bwd_end` and idle after."""
        out = np.zeros((self.n_classes, len(BREAKDOWN_KEYS)))
        a, b = np.maximum(self.a, lo), np.minimum(self.b, hi)
        keep = (b > a) & (self.kind >= 0)
        a, b, cls, kind = a[keep], b[keep], self.cls[keep], self.kind[keep]
        comm = kind < len(COMM_PRIORITY)
        n_comm = len(COMM_PRIORITY)
        out[:, [BREAKDOWN_KEYS.index(k) for k in COMM_PRIORITY]] = np.bincount(
            cls[comm] * n_comm + kind[comm], b[comm] - a[comm], self.n_classes * n_comm).reshape(-1, n_comm)
        a, b, cls = a[~comm], b[~comm], cls[~comm]
        lbe = np.broadcast_to(np.asarray(last_bwd_end, dtype=float), (self.n_classes,))
        cut = np.minimum(np.maximum(lbe[cls], a), b)
        out[:, BREAKDOWN_KEYS.index("bubble")] = np.bincount(cls, cut - a, self.n_classes)
        out[:, BREAKDOWN_KEYS.index("idle")] = np.bincount(cls, b - cut, self.n_classes)
        return out


def is_compute(graph: ExecutionGraph, t: int) -> bool:
    """A compute-stream task (or a replayed trace's compute kernel on a stream of its own)."""
    s = graph.stream[t]
    return s == Stream.COMPUTE or (s >= len(Stream) and graph.kind[t] == "compute")


def critical_path(graph: ExecutionGraph, trace: SimTrace, cols: TaskColumns | None = None) -> list[int]:
    """dPRO: walk back from the last task through the predecessor that released each task."""
    if not len(graph):
        return []
    t = int(np.argmax(cols.end if cols is not None else np.asarray(trace.end_s, dtype=float)))  # the first last
    pred = trace.critical_pred
    path = []
    while t >= 0:
        path.append(t)
        t = pred[t]
    return path[::-1]


def time_by_category(graph: ExecutionGraph, trace: SimTrace, tasks: list[int] | np.ndarray,
                     cols: TaskColumns | None = None) -> dict[str, float]:
    """Seconds the given tasks spend per category (fused tasks split by their parts), in order of appearance."""
    cols = cols or task_columns(graph, trace)
    tasks = np.asarray(tasks, dtype=np.int64)
    first, size = cols.row_start[tasks], np.diff(cols.row_start)[tasks]
    rows = np.repeat(first - np.cumsum(size) + size, size) + np.arange(int(size.sum()))
    keys = cols.row_key[rows]
    sums = np.bincount(keys, cols.row_seconds[rows], len(cols.names))
    seen, at = np.unique(keys, return_index=True)
    values = sums.tolist()
    return {cols.names[k]: values[k] for k in seen[np.argsort(at)].tolist()}


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
