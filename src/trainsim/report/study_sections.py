"""A strategy search or a sweep as report plots: the Pareto fronts, a heat map over two chosen axes, the
top-k table and (for a search) how the space was pruned."""

from __future__ import annotations

import json
from typing import Any

from ..errors import ConfigError
from ..optimize.search import throughput
from ..optimize.space import strategy_text, value_text
from .figures import PALETTE, BarPlot, HeatmapPlot, Section, Series, Table, XYPlot

RESULT_COLUMNS = ("iteration_time_s", "tokens_per_s", "samples_per_s", "mfu", "hfu", "tflops_per_gpu",
                  "peak_memory_gib", "memory_headroom_gib", "fits", "dominant", "sim_wall_s", "key", "job", "error",
                  "grad_accumulation", "device", "n_gpus", "dp")
TOP_ROWS = 20


def _unit(rows: list[dict[str, Any]]) -> str:
    return "tokens/s" if any(r.get("tokens_per_s") for r in rows) else "samples/s"


def _per_gpu(row: dict[str, Any]) -> float:
    return throughput(row) / max(1, int(row.get("n_gpus") or 1))


def _value_text(v: Any) -> str:  # noqa: ANN401 - a JSON value
    return value_text(v, none="default")  # an unset sweep key runs at its default


def _sort_values(values: list[Any]) -> list[Any]:
    try:
        return sorted(values, key=lambda v: (v is None, v))
    except TypeError:
        return sorted(values, key=lambda v: (v is None, str(v)))


def heatmap(rows: list[dict[str, Any]], x: str, y: str, title: str, unit: str) -> HeatmapPlot:
    """The best throughput per GPU over two axes (the best over every other varied key; OOM and failed
    configurations count as absent)."""
    xs = _sort_values(list({json.dumps(r.get(x)): r.get(x) for r in rows}.values()))
    ys = _sort_values(list({json.dumps(r.get(y)): r.get(y) for r in rows}.values()))
    xi = {json.dumps(v): i for i, v in enumerate(xs)}
    yi = {json.dumps(v): i for i, v in enumerate(ys)}
    z: list[list[float | None]] = [[None] * len(xs) for _ in ys]
    for r in rows:
        if r.get("error") or not r.get("fits", True) or not throughput(r):
            continue
        i, j = yi[json.dumps(r.get(y))], xi[json.dumps(r.get(x))]
        z[i][j] = max(z[i][j] or 0.0, _per_gpu(r))
    return HeatmapPlot(title, x, y, [_value_text(v) for v in xs], [_value_text(v) for v in ys], z,
                       f"best {unit} per GPU",
                       f"Each cell is the best {unit} per GPU over every other setting; blank: nothing there fits "
                       "in memory or runs.")


def _check_axes(axes: tuple[str, str] | None, candidates: list[str], rows: list[dict[str, Any]],
                preferred: tuple[str, str] | None = None, field: str = "--axes") -> tuple[str, str] | None:
    """The two axes of the heat map: the ones asked for, else `preferred` where both vary, else the two
    varied keys with the most values."""
    if axes is not None:
        named = tuple(_column_of(a, rows) for a in axes)
        for a, col in zip(axes, named, strict=True):
            if col is None:
                raise ConfigError(field, f"'{a}' is not a column of these rows",
                                  f"choose two of: {', '.join(candidates) or 'tp, pp, dp'}")
        return named[0], named[1]  # type: ignore[return-value]
    varied = [c for c in candidates if len({json.dumps(r.get(c)) for r in rows}) > 1]
    if preferred is not None and all(c in varied for c in preferred):
        return preferred
    varied.sort(key=lambda c: -len({json.dumps(r.get(c)) for r in rows}))
    return (varied[0], varied[1]) if len(varied) >= 2 else None


def _column_of(key: str, rows: list[dict[str, Any]]) -> str | None:
    """A row column named as given or as the sweep grid's dotted key (cluster.gpu -> gpu, model.name -> model)."""
    section, _, leaf = key.rpartition(".")
    for col in (key, section if leaf == "name" else leaf):
        if col and any(col in r for r in rows):
            return col
    return None


def _front(points: list[tuple[float, float, dict[str, Any]]]) -> list[tuple[float, float, dict[str, Any]]]:
    """Points no other beats in both coordinates (higher is better in both), by x."""
    out: list[tuple[float, float, dict[str, Any]]] = []
    for p in sorted(points, key=lambda p: (-p[1], -p[0])):
        if not out or p[0] > max(q[0] for q in out):
            out.append(p)
    return sorted(out, key=lambda p: p[0])


def _memory_front(rows: list[dict[str, Any]], unit: str, label: Any) -> XYPlot:  # noqa: ANN401
    feas = [r for r in rows if not r.get("error") and r.get("fits", True) and throughput(r)
            and r.get("memory_headroom_gib") is not None]
    pts = [(float(r["memory_headroom_gib"]), _per_gpu(r), r) for r in feas]
    front = _front(pts)
    series = [Series("configurations", [p[0] for p in pts], [p[1] for p in pts], mode="markers", color="#BAB0AC",
                     labels=[label(p[2]) for p in pts]),
              Series("Pareto front", [p[0] for p in front], [p[1] for p in front], mode="lines+markers",
                     color="#E45756", labels=[label(p[2]) for p in front])]
    return XYPlot(f"{unit} per GPU against memory headroom", "memory headroom (GiB free at peak)",
                  f"{unit} per GPU", series,
                  "Every configuration that fits; on the red line no other is both faster and leaves more memory "
                  "free (room for a longer sequence or a larger micro-batch).", y_from_zero=False)


def _sweep_label(varied: list[str]) -> Any:  # noqa: ANN401 - a row -> str function
    return lambda r: ", ".join(f"{k} {_value_text(r.get(k))}" for k in varied)


def sweep_section(data: dict[str, Any], axes: tuple[str, str] | None = None, source: str = "") -> Section:
    rows: list[dict[str, Any]] = [r for r in data.get("rows") or [] if isinstance(r, dict)]
    varied = [c for c in data.get("varied") or _varied_from_jobs(rows) if isinstance(c, str)]
    unit = _unit(rows)
    ok = [r for r in rows if not r.get("error")]
    fits = [r for r in ok if r.get("fits", True)]
    best = max(fits, key=throughput, default=None)
    sec = Section(f"Sweep {data.get('study', '')}".strip(), "sweep", source=source)
    sec.cards = [("configurations", str(len(rows))), ("fit in memory", str(len(fits))),
                 ("OOM", str(len(ok) - len(fits))), ("failed", str(len(rows) - len(ok)))]
    if best is not None:
        sec.cards.append((f"best {unit}", f"{throughput(best):,.0f}"))
        sec.cards.append(("best", _sweep_label(varied)(best) or "-"))
    candidates = varied + [c for c in ("tp", "pp", "dp", "cp", "ep", "micro_batch") if c not in varied]
    pair = _check_axes(axes, candidates, rows)
    if pair is not None:
        sec.items.append(heatmap(rows, pair[0], pair[1], f"Best {unit} per GPU: {pair[1]} against {pair[0]}", unit))
    elif varied:
        key = varied[0]
        values = _sort_values(list({json.dumps(r.get(key)): r.get(key) for r in rows}.values()))
        best_of = [max((_per_gpu(r) for r in fits if r.get(key) == v), default=0.0) for v in values]
        sec.items.append(BarPlot(f"Best {unit} per GPU by {key}", [_value_text(v) for v in values],
                                 [(f"{unit} per GPU", best_of, PALETTE[0])], f"{unit} per GPU", stacked=False))
    if fits:
        sec.items.append(_memory_front(rows, unit, _sweep_label(varied)))
    cols = [*varied, "iteration s", f"{unit}", "MFU %", "peak GiB", "verdict"]
    ranked = sorted(rows, key=lambda r: (bool(r.get("error")), not r.get("fits", True), -throughput(r)))
    table_rows = [[*(_value_text(r.get(k)) for k in varied),
                   f"{r['iteration_time_s']:.4g}" if r.get("iteration_time_s") else "-",
                   f"{throughput(r):,.0f}" if throughput(r) else "-",
                   f"{100 * r['mfu']:.1f}" if r.get("mfu") is not None else "-",
                   f"{r['peak_memory_gib']:.1f}" if r.get("peak_memory_gib") is not None else "-",
                   str(r["error"])[:80] if r.get("error") else ("fits" if r.get("fits", True) else "OOM")]
                  for r in ranked[:TOP_ROWS]]
    sec.items.append(Table(f"Top {min(TOP_ROWS, len(rows))} of {len(rows)}", cols, table_rows,
                           "Fastest first; OOM and failed configurations last."))
    return sec


def _varied_from_jobs(rows: list[dict[str, Any]]) -> list[str]:
    """The columns whose values differ between rows (an older sweep JSON names no varied keys)."""
    keys = [k for k in (rows[0] if rows else {}) if k not in RESULT_COLUMNS]
    return [k for k in keys if len({json.dumps(r.get(k)) for r in rows}) > 1]


def _entry_row(e: dict[str, Any]) -> dict[str, Any]:
    """A search JSON entry flattened: strategy keys beside the results."""
    return {**(e.get("strategy") or {}), **{k: v for k, v in e.items() if k != "strategy"}}


def _label(r: dict[str, Any]) -> str:
    try:
        return f"{r.get('n_gpus')} GPUs: {strategy_text(r)}"
    except (KeyError, TypeError):
        return str(r.get("n_gpus"))


def search_section(data: dict[str, Any], axes: tuple[str, str] | None = None, source: str = "") -> Section:
    simulated = [_entry_row(e) for e in data.get("simulated") or [] if isinstance(e, dict)]
    top = [_entry_row(e) for e in data.get("top") or [] if isinstance(e, dict)]
    rows = simulated or top
    unit = _unit(rows or top)
    best = _entry_row(data["best"]) if isinstance(data.get("best"), dict) else None
    sec = Section("Strategy search", "search", source=source)
    sec.cards = [("configurations", f"{int(data.get('space') or 0):,}"), ("simulated", f"{data.get('evaluated')}"),
                 ("proven best", "yes" if data.get("proven_optimal") else "no (time limit)")]
    if best is not None:
        sec.cards += [(f"best {unit}", f"{throughput(best):,.0f}"), ("best MFU", f"{100 * float(best['mfu']):.1f}%"),
                      ("best", _label(best))]
    if data.get("wall_s") is not None:
        sec.cards.append(("search took", f"{float(data['wall_s']):.1f} s"))
    per_nodes = [n for n in data.get("per_nodes") or [] if isinstance(n, dict) and isinstance(n.get("best"), dict)]
    if len(per_nodes) > 1:
        bests = [_entry_row(n["best"]) for n in per_nodes]
        front = [_entry_row(e) for e in data.get("pareto_gpus") or []]
        sec.items.append(XYPlot(f"{unit} against GPUs", "GPUs", unit, [
            Series("best per cluster size", [float(r["n_gpus"]) for r in bests], [throughput(r) for r in bests],
                   mode="markers", color="#BAB0AC", labels=[_label(r) for r in bests]),
            Series("Pareto front", [float(r["n_gpus"]) for r in front], [throughput(r) for r in front],
                   mode="lines+markers", color="#E45756", labels=[_label(r) for r in front])],
            "The best strategy of each cluster size; on the red line each size beats every smaller one.",
            log_x=True))
    if rows:
        sec.items.append(_memory_front(rows, unit, _label))
        if simulated:
            pair = _check_axes(axes, ["tp", "pp", "dp", "cp", "ep", "vpp", "micro_batch", "zero", "recompute",
                                      "n_gpus"], simulated, preferred=("tp", "pp"))
            if pair is not None:
                sec.items.append(heatmap(simulated, pair[0], pair[1],
                                         f"Best {unit} per GPU: {pair[1]} against {pair[0]} (simulated configurations)",
                                         unit))
    pruned = {k: int(v) for k, v in (data.get("pruned") or {}).items()}
    if pruned:
        names = [*pruned, "simulated"]
        sec.items.append(BarPlot("How the space was settled", names,
                                 [("configurations", [*pruned.values(), int(data.get("evaluated") or 0)],
                                   PALETTE[0])], "configurations", stacked=False, horizontal=True, log_value=True,
                                 caption="Configurations pruned by each rule, and those the event simulation ran. "
                                         "The bound rules (memory_bound, throughput_bound) never drop the best."))
    cols = ["#", "GPUs", "strategy", "iteration s", unit, "MFU %", "free GiB", "dominant"]
    sec.items.append(Table(f"Top {len(top)}", cols, [
        [str(i), str(r.get("n_gpus")), strategy_text(r) if "tp" in r else "-", f"{float(r['iteration_time_s']):.4g}",
         f"{throughput(r):,.0f}", f"{100 * float(r['mfu']):.1f}", f"{float(r['memory_headroom_gib']):.1f}",
         str(r.get("dominant"))] for i, r in enumerate(top, 1)]))
    return sec
