"""A replay of profiler traces as report plots: the measured and replayed timelines of each rank one above
the other on one time axis, each step measured against replayed (the what-if's effect when one was
applied), and where the replayed step goes."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..replay import ReplayResult
from .figures import CATEGORY_COLORS, BarPlot, Section, Segments, Table, TimelinePlot, color_of
from .simulation_section import MAX_TIMELINE_TASKS

REPLAY_COLORS = {"compute": CATEGORY_COLORS["compute"], "launch": "#F58518", "host": "#BAB0AC",
                 "runtime": "#9D755D", "memset": "#72B7B2", "memcpy": "#B279A2", "sync": "#E45756",
                 "comm": CATEGORY_COLORS["dp"], "collective": CATEGORY_COLORS["dp"]}


def _color(cat: str, i: int) -> str:
    return REPLAY_COLORS.get(cat) or color_of(cat, i)


def timeline_plot(result: ReplayResult) -> TimelinePlot:
    """Per rank: the measured GPU streams and top-level CPU ops, then the replayed streams, one time axis
    (the measured trace shifted by the rank's aligned clock, as `replay --trace` writes it)."""
    rgs, sim = result.graphs, result.trace
    assert rgs is not None and sim is not None, "the replay carries no graphs"
    g = rgs.graph
    start, end = np.asarray(sim.start_s) * 1e3, np.asarray(sim.end_s) * 1e3
    cats = np.asarray(g.category, dtype=object)
    rows: list[str] = []
    buckets: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]]] = {}

    def add(cat: str, row: int, s: np.ndarray, e: np.ndarray, labels: list[str]) -> None:
        buckets.setdefault(cat, []).append((np.full(len(s), row, dtype=np.int32), s, e, labels))

    shown, total = [], 0
    for rk in rgs.ranks:  # whole ranks, up to MAX_TIMELINE_TASKS bars (the first rank always)
        bars = len(rk.trace.gpu) + int((rk.trace.cpu.parent == -1).sum()) + rk.n_tasks
        if shown and total + bars > MAX_TIMELINE_TASKS:
            break
        shown.append(rk)
        total += bars
    for rk in shown:
        tr, shift_ms = rk.trace, rk.delay_s * 1e3
        names = tr.strings
        gpu = tr.gpu
        replayed_cat = cats[rk.task0 + rk.rg.gpu_task0: rk.task0 + rk.rg.gpu_task0 + len(gpu)]
        for dev, st in sorted({(int(d), int(s)) for d, s in zip(gpu.device.tolist(), gpu.stream.tolist(),
                                                                 strict=True)}):
            row = len(rows)
            rows.append(f"rank {rk.rank} measured · gpu {dev} stream {st}")
            sel = np.flatnonzero((gpu.device == dev) & (gpu.stream == st))
            s = gpu.ts_us[sel] / 1e3 + shift_ms
            e = s + gpu.dur_us[sel] / 1e3
            of = replayed_cat[sel] if len(replayed_cat) == len(gpu) else np.full(len(sel), "compute", dtype=object)
            for cat in sorted(set(of.tolist())):
                m = of == cat
                add(cat, row, s[m], e[m], [names[i] for i in gpu.name_id[sel[m]].tolist()])
        cpu = tr.cpu
        top = cpu.parent == -1
        for th in sorted(set(cpu.thread[top].tolist())):
            sel = np.flatnonzero(top & (cpu.thread == th))
            pid, tid = tr.threads[th] if th < len(tr.threads) else (0, th)
            row = len(rows)
            rows.append(f"rank {rk.rank} measured · cpu {pid}/{tid}")
            s = cpu.ts_us[sel] / 1e3 + shift_ms
            add("host", row, s, s + cpu.dur_us[sel] / 1e3, [names[i] for i in cpu.name_id[sel].tolist()])
        ids = np.arange(rk.task0, rk.task0 + rk.n_tasks)
        streams = np.asarray(g.stream)[ids]
        stream_names = rk.rg.graph.stream_names
        names = {s: stream_names.get(s, g.stream_name(s)) for s in set(streams.tolist())}
        for st in sorted(names, key=lambda s: (not names[s].startswith("gpu"), names[s])):  # GPU first, as measured
            row = len(rows)
            rows.append(f"rank {rk.rank} replayed · {names[st]}")
            sel = ids[(streams == st) & (end[ids] > start[ids]) & (cats[ids] != "host_idle")]
            for cat in sorted(set(cats[sel].tolist())):
                pick = sel[cats[sel] == cat]
                add(cat, row, start[pick], end[pick], [g.name[t] for t in pick.tolist()])
    groups = []
    for i, (cat, parts) in enumerate(sorted(buckets.items())):
        groups.append(Segments(cat, _color(cat, i), np.concatenate([p[0] for p in parts]),
                               np.concatenate([p[1] for p in parts]), np.concatenate([p[2] for p in parts]),
                               [lab for p in parts for lab in p[3]]))
    caption = ("For each rank, the measured trace (GPU streams and the CPU threads' top-level ops, coloured by "
               "what the replay made of each kernel) above the replay's streams, on one time axis.")
    if len(shown) < len(rgs.ranks):
        caption += f" Showing the first {len(shown)} of {len(rgs.ranks)} ranks (the page stays light)."
    return TimelinePlot("Measured and replayed, one above the other", rows, groups, caption)


def steps_plot(data: dict[str, Any]) -> BarPlot | None:
    steps = [s for s in data.get("steps") or [] if isinstance(s, dict)]
    if not steps:
        return None
    cats = [f"rank {s.get('rank', 0)} step {s.get('step')}" for s in steps]
    return BarPlot("Each step: measured and replayed", cats,
                   [("measured", [float(s["measured_ms"]) for s in steps], "#BAB0AC"),
                    ("replayed", [float(s["replayed_ms"]) for s in steps], CATEGORY_COLORS["compute"])],
                   "ms", "Each profiled step as measured and as replayed (with a what-if, the step under the "
                   "what-if against the original measurement).", stacked=False)


def breakdown_plot(data: dict[str, Any]) -> BarPlot | None:
    by_cat = {k: float(v) for k, v in (data.get("breakdown") or {}).items() if float(v) > 0}
    if not by_cat:
        return None
    keys = sorted(by_cat, key=lambda k: -by_cat[k])
    return BarPlot("Where the replayed step goes", keys, [("ms per step", [by_cat[k] for k in keys],
                                                          CATEGORY_COLORS["compute"])], "ms per step",
                   "Mean over steps and ranks.", stacked=False, horizontal=True)


def replay_section(data: dict[str, Any], result: ReplayResult | None, source: str = "",
                   notes: list[str] | None = None) -> Section:
    what_if = data.get("what_if") or {}
    title = "Replay" + (f" with what-if: {', '.join(f'{k} {v}' for k, v in what_if.items())}" if what_if else "")
    sec = Section(title, "replay", source=source, notes=list(notes or []))
    sec.cards = [("replay error", f"{float(data.get('replay_error_pct') or 0):.2f}%"),
                 ("measured step", f"{float(data.get('measured_step_ms') or 0):.2f} ms"),
                 ("replayed step", f"{float(data.get('replayed_step_ms') or 0):.2f} ms"),
                 ("ranks", str(len(data.get("ranks") or []))), ("tasks", f"{int(data.get('n_tasks') or 0):,}")]
    meas, rep = float(data.get("measured_step_ms") or 0), float(data.get("replayed_step_ms") or 0)
    if what_if and meas > 0:
        sec.cards.append(("what-if speed-up", f"{meas / rep:.2f}x" if rep > 0 else "-"))
    if result is not None and result.graphs is not None and result.trace is not None:
        sec.items.append(timeline_plot(result))
    for plot in (steps_plot(data), breakdown_plot(data)):
        if plot is not None:
            sec.items.append(plot)
    rows = [["trace", str(p)] for p in data.get("paths") or []]
    rows += [["what-if", f"{k}: {v}"] for k, v in what_if.items()]
    rows += [["assumption", str(a)] for a in data.get("assumptions") or []]
    if rows:
        sec.items.append(Table("Inputs and assumptions", ["kind", "what"], rows))
    return sec
