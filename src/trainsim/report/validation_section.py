"""A validation (`validate --json`) as report plots: predicted against measured with the +-10% band per
metric, the error by group and the worst rows."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from .figures import CATEGORY_COLORS, BarPlot, Section, Series, Table, XYPlot

BAND = 0.10  # the band drawn around y = x
WORST_ROWS = 15
MAX_GROUPS = 40

METRIC_NAMES = {"tflops_per_gpu": "TFLOP/s per GPU", "iter_time_s": "iteration time (s)",
                "samples_per_s": "samples/s", "tokens_per_s_per_gpu": "tokens/s per GPU", "mfu_pct": "MFU (%)",
                "time_us": "time (us)", "busbw_gbps": "bus bandwidth (GB/s)", "iteration_time_ms": "iteration (ms)"}


def _rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for r in data.get("rows") or [] if isinstance(r, dict) and isinstance(r.get("predicted"), int | float)
            and isinstance(r.get("measured"), int | float) and r["measured"] > 0 and r["predicted"] > 0]


def scatter(metric: str, rows: list[dict[str, Any]]) -> XYPlot:
    """Predicted against measured for one metric, log-log, with y = x and the +-10% band."""
    meas = [float(r["measured"]) for r in rows]
    pred = [float(r["predicted"]) for r in rows]
    lo, hi = min(meas + pred) / 1.15, max(meas + pred) * 1.15
    line = [lo, hi]
    inside = sum(abs(p / m - 1) <= BAND for p, m in zip(pred, meas, strict=True))
    labels = [f"{r.get('case_id', r.get('row'))}: error {float(r.get('error_pct') or 0):+.1f}%" for r in rows]
    name = METRIC_NAMES.get(metric, metric)
    return XYPlot(f"Predicted against measured: {name} ({len(rows)} rows)", f"measured {name}", f"predicted {name}",
                  [Series("-10%", line, [v * (1 - BAND) for v in line], color="#54A24B", dash=True),
                   Series("+10%", line, [v * (1 + BAND) for v in line], color="#54A24B", dash=True,
                          fill_to_previous=True),
                   Series("predicted = measured", line, line, color="#888888"),
                   Series("rows", meas, pred, mode="markers", color=CATEGORY_COLORS["compute"], labels=labels)],
                  f"{inside} of {len(rows)} rows ({100 * inside / len(rows):.0f}%) within the green +-10% band. "
                  "Points above the line are predicted higher than measured.", log_x=True, log_y=True)


def _group_stats(data: dict[str, Any], rows: list[dict[str, Any]]) -> tuple[str, dict[str, tuple[float, float, int]]]:
    """(what groups are, {group: (MAPE %, mean signed error %, n)}): --by groups when the JSON has them, else
    the ranking groups (one model in one source), else the metric."""
    given = data.get("groups")
    if isinstance(given, dict) and given:
        out = {k: (float(g.get("mape") or 0), float(g.get("bias") or 0), int(g.get("n") or 0))
               for k, g in given.items() if isinstance(g, dict) and g.get("mape") is not None}
        return " | ".join(data.get("group_by") or ["group"]), out
    key = "group" if any(r.get("group") for r in rows) else "metric"
    errs: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        errs[str(r.get(key) or "-")].append(float(r.get("error_pct") or 0))
    return ("source and model" if key == "group" else "metric"), {
        k: (float(np.mean(np.abs(v))), float(np.mean(v)), len(v)) for k, v in errs.items()}


def group_plot(data: dict[str, Any], rows: list[dict[str, Any]]) -> BarPlot | None:
    what, stats = _group_stats(data, rows)
    if len(stats) < 2:
        return None
    keys = sorted(stats, key=lambda k: -stats[k][0])[:MAX_GROUPS]
    cap = "Mean absolute error of each group's rows (n rows in brackets), worst first"
    if len(stats) > MAX_GROUPS:
        cap += f"; the {MAX_GROUPS} worst of {len(stats)} groups"
    return BarPlot(f"Error by {what}", [f"{k} ({stats[k][2]})" for k in keys],
                   [("MAPE %", [stats[k][0] for k in keys], CATEGORY_COLORS["tp"]),
                    ("mean signed error %", [stats[k][1] for k in keys], CATEGORY_COLORS["compute"])],
                   "error (%)", cap + ".", stacked=False, horizontal=True,
                   hlines=[(10.0, "10%", "#54A24B")])


def _assumption_text(r: dict[str, Any]) -> str:
    tags = r.get("assumptions")
    if not isinstance(tags, dict):
        return ""
    return "; ".join(f"{k}: {v}" for k, v in tags.items() if k not in ("tier", "subset"))[:160]


def validation_section(data: dict[str, Any], source: str = "") -> Section:
    rows = _rows(data)
    summary = data.get("summary") or {}
    kind = str(data.get("kind") or "validation")
    sec = Section(f"Validation: {kind.replace('_', ' ')}", "validation", source=source)
    errs = np.abs([float(r.get("error_pct") or 0) for r in rows]) if rows else np.zeros(0)
    sec.cards = [("rows compared", str(summary.get("n", len(rows)))), ("skipped", str(summary.get("skipped", 0)))]
    if rows:
        sec.cards += [("MAPE", f"{float(np.mean(errs)):.2f}%"), ("median error", f"{float(np.median(errs)):.2f}%"),
                      ("max error", f"{float(np.max(errs)):.1f}%"),
                      ("within +-10%", f"{100 * float(np.mean(errs <= 100 * BAND)):.0f}%")]
    if summary.get("spearman") is not None:
        sec.cards.append(("rank correlation", f"{float(summary['spearman']):.3f}"))
    by_metric: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_metric[str(r.get("metric") or "value")].append(r)
    for metric, mrows in sorted(by_metric.items(), key=lambda kv: -len(kv[1])):
        sec.items.append(scatter(metric, mrows))
    groups = group_plot(data, rows)
    if groups is not None:
        sec.items.append(groups)
    worst = sorted(rows, key=lambda r: -abs(float(r.get("error_pct") or 0)))[:WORST_ROWS]
    sec.items.append(Table(f"The {len(worst)} worst rows", ["row", "case", "metric", "measured", "predicted", "error",
                                                          "assumed"],
                           [[str(r.get("row")), str(r.get("case_id")), str(r.get("metric")), f"{r['measured']:.4g}",
                             f"{r['predicted']:.4g}", f"{float(r.get('error_pct') or 0):+.1f}%", _assumption_text(r)]
                            for r in worst]))
    skipped = data.get("skipped_by_reason") or {}
    if skipped:
        sec.items.append(Table("Rows not compared", ["reason", "rows"],
                               [[str(k), str(v)] for k, v in sorted(skipped.items(), key=lambda kv: -kv[1])]))
    if not rows:
        sec.notes.append("No row was compared: nothing to plot.")
    return sec
