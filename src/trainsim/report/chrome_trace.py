"""Chrome/Perfetto trace writer: one process per rank class, one thread per stream (ui.perfetto.dev)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..compile.program import STREAM_NAMES
from ..files import check_output, json_text, write_outputs
from ..sim.result import SimulationResult


def trace_events(result: SimulationResult) -> list[dict[str, Any]]:
    g, tr = result.graph, result.trace
    assert g is not None and tr is not None, "result carries no graph/trace"
    events: list[dict[str, Any]] = []
    for c, rc in enumerate(g.classes):
        label = f"{rc.name} (x{rc.multiplicity})" if rc.multiplicity > 1 else rc.name
        events.append({"ph": "M", "name": "process_name", "pid": c, "tid": 0, "args": {"name": label}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": c, "tid": 0, "args": {"sort_index": c}})
        for s, sname in [*enumerate(STREAM_NAMES), *sorted(g.stream_names.items())]:
            events.append({"ph": "M", "name": "thread_name", "pid": c, "tid": s, "args": {"name": sname}})
    for t in range(len(g)):
        args: dict[str, Any] = {"category": g.category[t]}
        if g.parts[t]:
            args["parts_ms"] = {k: round(v * 1e3, 4) for k, v in g.parts[t].items()}
        if g.micro_batch[t] >= 0:
            args["micro_batch"] = g.micro_batch[t]
        for c in g.participants[t]:
            events.append({"ph": "X", "name": g.name[t], "cat": g.category[t], "pid": c, "tid": g.stream[t],
                           "ts": tr.start_s[t] * 1e6, "dur": (tr.end_s[t] - tr.start_s[t]) * 1e6, "args": args})
    for c, timeline in enumerate(tr.memory_timeline):
        base = g.classes[c].static_bytes
        for time_s, dyn in timeline:
            events.append({"ph": "C", "name": "memory (GiB)", "pid": c, "tid": 0, "ts": time_s * 1e6,
                           "args": {"allocated": round((base + dyn) / 2**30, 4)}})
    return events


def chrome_trace_json(result: SimulationResult) -> str:
    """The trace as strict JSON text (what `--trace` writes)."""
    data = {"traceEvents": trace_events(result), "displayTimeUnit": "ms",
            "metadata": {"model": result.model, "cluster": result.cluster, "strategy": result.strategy}}
    return json_text(data, "--trace", indent=None)


def write_chrome_trace(result: SimulationResult, path: str | Path) -> None:
    """Write the trace to `path` through the shared output writer (a partial file never replaces a good one)."""
    write_outputs({check_output(path, "trace"): chrome_trace_json(result)})
