"""A simulated iteration as report plots: the timeline per rank class and stream with the critical path,
where the time goes per stage, memory over the iteration against the GPU's capacity, and the job."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from ..compile.program import Stream
from ..sim.result import BREAKDOWN_KEYS, SimulationResult, critical_path, task_parts
from .figures import (
    CATEGORY_COLORS,
    CATEGORY_LABELS,
    BarPlot,
    Section,
    Segments,
    Series,
    Table,
    TimelinePlot,
    XYPlot,
    color_of,
)

GIB = 2**30
MAX_TIMELINE_CLASSES = 32  # rank classes drawn on the timeline; more are named in the caption
MAX_TIMELINE_TASKS = 150_000  # and no more tasks than this (about 4 MB of page and 2 s of drawing)
MIN_GAP_FRACTION = 1e-4  # compute-stream gaps shorter than this share of the iteration are not drawn


def _class_label(result: SimulationResult, c: int) -> str:
    assert result.graph is not None
    rc = result.graph.classes[c]
    return f"{rc.name} (x{rc.multiplicity})" if rc.multiplicity > 1 else rc.name


def _shown_classes(result: SimulationResult) -> list[int]:
    """Every class up to MAX_TIMELINE_CLASSES and MAX_TIMELINE_TASKS; beyond, the first ones and the last (a
    pipeline's ends matter most), so the page stays light and quick to draw."""
    g = result.graph
    assert g is not None
    n = len(g.classes)
    tasks = [0] * n
    for (c, _), q in g.queues.items():
        tasks[c] += len(q)
    shown = list(range(n)) if n <= MAX_TIMELINE_CLASSES else [*range(MAX_TIMELINE_CLASSES - 1), n - 1]
    while len(shown) > 2 and sum(tasks[c] for c in shown) > MAX_TIMELINE_TASKS:
        shown.pop(-2)
    return shown


class _Bars:
    """Bars collected per category while walking the schedule (plain lists, turned into arrays once)."""

    def __init__(self) -> None:
        self.by_cat: dict[str, tuple[list[int], list[float], list[float], list[str]]] = defaultdict(
            lambda: ([], [], [], []))

    def add(self, cat: str, row: int, start_s: float, end_s: float, label: str) -> None:
        rows, starts, ends, labels = self.by_cat[cat]
        rows.append(row)
        starts.append(start_s * 1e3)
        ends.append(end_s * 1e3)
        labels.append(label)

    def segments(self, cat: str, name: str, color: str) -> Segments:
        rows, starts, ends, labels = self.by_cat[cat]
        return Segments(name, color, np.asarray(rows, dtype=np.int32), np.asarray(starts), np.asarray(ends), labels)


def timeline_plot(result: SimulationResult) -> TimelinePlot:
    """Each shown class's streams as rows; fused tasks split into their categories in proportion; gaps on
    the compute stream drawn as waiting; the critical path drawn thin on top."""
    g, tr = result.graph, result.trace
    assert g is not None and tr is not None, "the result carries no graph/trace"
    classes = _shown_classes(result)
    rows: list[str] = []
    row_of: dict[tuple[int, int], int] = {}
    for c in classes:
        for s in sorted(s for (cc, s), q in g.queues.items() if cc == c and q):
            row_of[(c, s)] = len(rows)
            rows.append(f"{_class_label(result, c)} · {g.stream_name(s)}")
    bars = _Bars()
    min_gap_s = MIN_GAP_FRACTION * result.iteration_time_s
    for (c, s), row in row_of.items():
        busy_until = 0.0
        for t in sorted(g.queues[(c, s)], key=lambda t: tr.start_s[t]):
            start, end = tr.start_s[t], tr.end_s[t]
            if s == Stream.COMPUTE and start - busy_until > min_gap_s:
                bars.add("bubble", row, busy_until, start, "compute stream waits")
            busy_until = max(busy_until, end)
            if end <= start:
                continue
            parts = task_parts(g, tr, t)
            if len(parts) == 1:
                bars.add(parts[0][0], row, start, end, g.name[t])
                continue
            cursor = start
            for cat, secs in sorted(parts, key=lambda p: _order(p[0])):
                if secs > 0:
                    bars.add(cat, row, cursor, cursor + secs, f"{g.name[t]} ({cat} part of a fused task)")
                    cursor += secs
        if s == Stream.COMPUTE and result.iteration_time_s - busy_until > min_gap_s:
            bars.add("bubble", row, busy_until, result.iteration_time_s, "compute stream waits")
    groups = [bars.segments(cat, CATEGORY_LABELS.get(cat, cat), color_of(cat, i))
              for i, cat in enumerate(sorted(bars.by_cat, key=_order))]
    path = _Bars()
    for t in critical_path(g, tr):
        for c in g.participants[t]:
            row = row_of.get((c, g.stream[t]))
            if row is not None:
                path.add("critical", row, tr.start_s[t], tr.end_s[t], f"critical path: {g.name[t]}")
    overlay = path.segments("critical", "critical path", CATEGORY_COLORS["critical path"]) if path.by_cat else None
    caption = ("One row per rank class (ranks that run the same program, simulated once) and stream. A fused "
               "task is split into its parts in proportion (compute, then its TP/CP share); grey is the compute "
               "stream waiting (pipeline bubble, exposed communication). The thin black line is the critical "
               "path.")
    if len(classes) < len(g.classes):
        caption += (f" Showing {len(classes)} of {len(g.classes)} rank classes (the first "
                    f"{len(classes) - 1} and the last).")
    return TimelinePlot("Iteration timeline", rows, groups, caption, overlay)


def _order(cat: str) -> int:
    return BREAKDOWN_KEYS.index(cat) if cat in BREAKDOWN_KEYS else len(BREAKDOWN_KEYS)


def memory_plot(result: SimulationResult) -> XYPlot:
    """Allocated memory of each shown class over the iteration, with the GPU's capacity as the OOM line."""
    g, tr = result.graph, result.trace
    assert g is not None and tr is not None
    end_ms = result.iteration_time_s * 1e3
    series = []
    for i, c in enumerate(_shown_classes(result)):
        base = g.classes[c].static_bytes
        points = tr.memory_timeline[c] if c < len(tr.memory_timeline) else []
        xs = [0.0, *(t * 1e3 for t, _ in points), end_ms]
        ys = [base, *(base + d for _, d in points)]
        ys.append(ys[-1])
        series.append(Series(_class_label(result, c), xs, [y / GIB for y in ys], step=True, color=color_of("", i)))
    cap = result.memory[0].capacity_bytes / GIB if result.memory else 0.0
    return XYPlot("Memory over the iteration", "time (ms)", "allocated (GiB)", series,
                  "Parameters, gradients and optimizer states (static) plus activations and buffers as the "
                  "schedule holds them, per rank class. Above the red line the GPU runs out of memory.",
                  hlines=[(cap, f"GPU capacity {cap:.1f} GiB (OOM above)", "#D62728")] if cap else [])


def memory_per_stage_plot(data: dict[str, Any]) -> BarPlot | None:
    """Static and activation peak per stage against the capacity (from the JSON alone)."""
    per = data.get("memory_per_stage") or []
    if not per:
        return None
    cap = float(data.get("memory_capacity_bytes") or 0) / GIB
    cats = [f"stage {m.get('stage', i)}" for i, m in enumerate(per)]
    static = [float(m.get("static_bytes", 0)) / GIB for m in per]
    act = [float(m.get("activation_peak_bytes", 0)) / GIB for m in per]
    return BarPlot("Peak memory per stage", cats,
                   [("parameters, gradients, optimizer", static, CATEGORY_COLORS["optimizer"]),
                    ("activations and buffers at peak", act, CATEGORY_COLORS["memory"])], "GiB",
                   "The peak per pipeline stage; a bar above the red line does not fit.",
                   hlines=[(cap, f"GPU capacity {cap:.1f} GiB", "#D62728")] if cap else [])


def breakdown_plot(data: dict[str, Any], labels: list[str] | None = None) -> BarPlot | None:
    """Where each stage's iteration goes: compute parts, exposed communication by kind, bubble, idle."""
    per = data.get("breakdown_per_stage") or []
    if not per:
        return None
    keys = [k for k in BREAKDOWN_KEYS if any(float(b.get(k, 0)) > 0 for b in per)]
    cats = labels if labels and len(labels) == len(per) else [f"stage {i}" for i in range(len(per))]
    stacks = [(CATEGORY_LABELS.get(k, k), [float(b.get(k, 0)) for b in per], CATEGORY_COLORS.get(k, "#999"))
              for k in keys]
    return BarPlot("Where the time goes, per stage", cats, stacks, "seconds per iteration",
                   "Each stage's iteration split into compute, communication that compute does not hide "
                   "(by kind), pipeline bubble and idle time after its last backward.")


def critical_path_plot(data: dict[str, Any]) -> BarPlot | None:
    by_cat = data.get("critical_path_by_category") or {}
    if not by_cat:
        return None
    keys = sorted(by_cat, key=lambda k: -float(by_cat[k]))
    return BarPlot("The critical path by category", [CATEGORY_LABELS.get(k, k) for k in keys],
                   [("seconds", [float(by_cat[k]) for k in keys], CATEGORY_COLORS["compute"])], "seconds",
                   "Time on the longest dependency chain of the iteration: what to shorten to go faster.",
                   stacked=False, horizontal=True)


def _fmt_value(v: Any) -> str:  # noqa: ANN401 - any JSON value
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, list):
        return ", ".join(_fmt_value(x) for x in v)
    return str(v)


def _flatten(d: dict[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for k, v in d.items():
        key = f"{prefix}{k}"
        if v is None:
            continue
        if isinstance(v, dict):
            out += _flatten(v, key + ".")
        else:
            out.append((key, _fmt_value(v)))
    return out


def job_table(data: dict[str, Any]) -> Table:
    """The job as it ran (resolved keys, defaults included) and the strategy trainsim derived."""
    rows = [[k, v] for k, v in _flatten(data.get("job") or {})]
    rows += [[f"resolved.{k}", v] for k, v in _flatten(data.get("strategy") or {})]
    return Table("The job", ["key", "value"], rows,
                 "Every key of the job as simulated (a job YAML with these keys reproduces it); `resolved.` "
                 "are the degrees and batch trainsim derived.")


def assumptions_table(data: dict[str, Any]) -> Table | None:
    rows = [["model", a] for a in data.get("model_assumptions") or []]
    rows += [["placement", a] for a in data.get("placement") or []]
    rows += [["advice", a] for a in data.get("advice") or []]
    learned = data.get("compute_model")
    if isinstance(learned, dict):
        rows += [["compute model", f"{k}: {_fmt_value(v)}"] for k, v in learned.items() if not isinstance(v, dict)]
    return Table("Assumptions and advice", ["kind", "what"], rows) if rows else None


def _gib(x: float) -> str:
    return f"{x / GIB:.1f} GiB"


def cards(data: dict[str, Any]) -> list[tuple[str, str]]:
    """The headline numbers of one simulation."""
    out = [("iteration", f"{float(data['iteration_time_s']):.4g} s")]
    if data.get("tokens_per_s"):
        out.append(("tokens/s", f"{float(data['tokens_per_s']):,.0f}"))
        out.append(("tokens/s per GPU", f"{float(data.get('tokens_per_s_per_gpu', 0)):,.0f}"))
    else:
        out.append(("samples/s", f"{float(data.get('samples_per_s', 0)):,.1f}"))
    out.append(("MFU", f"{100 * float(data.get('mfu', 0)):.1f}%"))
    peaks = data.get("peak_memory_bytes") or [0.0]
    cap = float(data.get("memory_capacity_bytes") or 0)
    out.append(("peak memory", f"{_gib(max(peaks))} of {_gib(cap)}"))
    out.append(("verdict", "OOM" if data.get("oom") else "fits"))
    out.append(("GPUs", f"{data.get('n_gpus')} {data.get('device', '')}".strip()))
    return out


def simulation_section(data: dict[str, Any], result: SimulationResult | None, source: str = "",
                       notes: list[str] | None = None) -> Section:
    """The section of one simulation: `data` is its JSON (simulate --json); `result`, when there, adds the
    timeline and memory over time (they need the simulated schedule)."""
    strategy = data.get("strategy") or {}
    degrees = " x ".join(f"{k.upper()}{strategy[k]}" for k in ("tp", "pp", "dp", "cp", "ep")
                         if int(strategy.get(k) or 1) > 1) or "one GPU"
    title = f"{data.get('model', 'job')} on {data.get('n_gpus')} x {data.get('device', 'GPU')}: {degrees}"
    sec = Section(title, "simulation", cards(data), source=source, notes=list(notes or []))
    labels = None
    if result is not None and result.graph is not None and result.trace is not None:
        sec.items.append(timeline_plot(result))
        labels = [_class_label(result, c) for c in range(len(result.graph.classes))]
    for plot in (breakdown_plot(data, labels), critical_path_plot(data)):
        if plot is not None:
            sec.items.append(plot)
    if result is not None and result.graph is not None and result.trace is not None:
        sec.items.append(memory_plot(result))
    mem = memory_per_stage_plot(data)
    if mem is not None:
        sec.items.append(mem)
    fidelity = ((data.get("job") or {}).get("simulation") or {}).get("fidelity")
    if (result is not None and result.fidelity == "analytic") or (result is None and fidelity == "analytic"):
        sec.notes.append("No timeline: the analytic tier (simulation.fidelity analytic) composes the costs in "
                         "closed form without playing the schedule; simulate with --fidelity event for the "
                         "timeline, memory over time and critical path.")
    elif result is None and not data.get("job"):
        sec.notes.append("No timeline: this JSON has no `job` to simulate again (written by an older trainsim); "
                         "pass the job YAML instead.")
    sec.items.append(job_table(data))
    extra = assumptions_table(data)
    if extra is not None:
        sec.items.append(extra)
    return sec
