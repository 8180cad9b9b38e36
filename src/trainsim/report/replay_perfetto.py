"""Perfetto/Chrome trace of a replay beside the original: per rank, one process with the measured events
(CPU ops, runtime calls, GPU ops; aligned clocks) and one with the replayed tasks, on one time axis."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..files import json_text
from ..replay import RankGraph, ReplayResult


def _measured(events: list[dict[str, Any]], pid: int, rk: RankGraph, shift_us: float) -> None:
    tr = rk.trace
    names = tr.strings
    tids: dict[str, int] = {}

    def tid(label: str) -> int:
        if label not in tids:
            tids[label] = len(tids)
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tids[label], "args": {"name": label}})
        return tids[label]

    for table, kind in ((tr.cpu, "cpu"), (tr.runtime, "runtime")):
        th = table.thread.tolist()
        for i, (ts, dur, nid) in enumerate(zip(table.ts_us.tolist(), table.dur_us.tolist(), table.name_id.tolist(),
                                               strict=True)):
            pid_, tid_ = tr.threads[th[i]] if th[i] < len(tr.threads) else (0, th[i])
            events.append({"ph": "X", "name": names[nid], "cat": kind, "pid": pid, "tid": tid(f"cpu {pid_}/{tid_}"),
                           "ts": ts + shift_us, "dur": dur})
    g = tr.gpu
    for ts, dur, nid, dev, st in zip(g.ts_us.tolist(), g.dur_us.tolist(), g.name_id.tolist(), g.device.tolist(),
                                     g.stream.tolist(), strict=True):
        events.append({"ph": "X", "name": names[nid], "cat": "gpu", "pid": pid, "tid": tid(f"gpu {dev} stream {st}"),
                       "ts": ts + shift_us, "dur": dur})


def replay_trace_events(result: ReplayResult) -> list[dict[str, Any]]:
    """Chrome trace events: for rank i, pid 2i is the measured trace, pid 2i+1 the replay."""
    rgs, sim = result.graphs, result.trace
    assert rgs is not None and sim is not None, "result carries no graphs"
    g = rgs.graph
    events: list[dict[str, Any]] = []
    start, end = np.asarray(sim.start_s), np.asarray(sim.end_s)
    for i, rk in enumerate(rgs.ranks):
        for pid, label in ((2 * i, f"rank {rk.rank} measured"), (2 * i + 1, f"rank {rk.rank} replayed")):
            events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": label}})
            events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        _measured(events, 2 * i, rk, rk.delay_s * 1e6)
        names = rk.rg.graph.stream_names
        seen: set[int] = set()
        for t in range(rk.task0, rk.task0 + rk.n_tasks):
            s = g.stream[t]
            if s not in seen:
                seen.add(s)
                events.append({"ph": "M", "name": "thread_name", "pid": 2 * i + 1, "tid": s,
                               "args": {"name": names.get(s, g.stream_name(s))}})
            if end[t] <= start[t] or g.category[t] == "host_idle":  # gaps are the empty space between ops
                continue
            events.append({"ph": "X", "name": g.name[t], "cat": g.category[t], "pid": 2 * i + 1, "tid": s,
                           "ts": float(start[t]) * 1e6, "dur": float(end[t] - start[t]) * 1e6})
    return events


def replay_trace_json(result: ReplayResult) -> str:
    """The side-by-side trace as strict JSON text (what `replay --trace` writes)."""
    data = {"traceEvents": replay_trace_events(result), "displayTimeUnit": "ms",
            "metadata": {"replay_error_pct": result.replay_error_pct, "traces": result.paths}}
    return json_text(data, "--trace", indent=None)


__all__ = ["replay_trace_events", "replay_trace_json"]
