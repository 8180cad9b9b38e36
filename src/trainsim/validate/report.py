"""Printed and plotted validation reports (rich table of rows, summary, ranking quality)."""

from __future__ import annotations

import io
import math

from rich.console import Console
from rich.table import Table

from ..errors import ConfigError
from .runner import ValidationReport

MAX_ROWS_PRINTED = 60


def _fmt(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.4g}"


def print_validation(report: ValidationReport, console: Console | None = None, show_all: bool = False) -> None:
    con = console or Console()
    rows = report.compared
    shown = rows if show_all or len(rows) <= MAX_ROWS_PRINTED else \
        sorted(rows, key=lambda o: -abs(o.error_pct or 0.0))[:MAX_ROWS_PRINTED // 2]
    title = f"{report.kind}: {len(rows)} rows compared" + ("" if shown is rows else
                                                           f" (the {len(shown)} largest errors; --all for every row)")
    t = Table(title=title)
    for col in ("row", "case", "metric", "predicted", "measured", "error %"):
        t.add_column(col, justify="right" if col not in ("case", "metric") else "left",
                     overflow="fold" if col == "case" else "ellipsis")  # a narrow console wraps names, never cuts
    for o in shown:
        err = o.error_pct or 0.0
        style = "red" if abs(err) > 20 else "yellow" if abs(err) > 10 else ""
        t.add_row(str(o.row), o.case_id, o.metric, _fmt(o.predicted), _fmt(o.measured), f"{err:+.1f}", style=style)
    con.print(t)
    if report.skipped:
        st = Table(title=f"skipped: {len(report.skipped)} rows")
        st.add_column("row", justify="right")
        st.add_column("case")
        st.add_column("reason")
        for o in report.skipped:
            st.add_row(str(o.row), o.case_id, o.skipped or "")
        con.print(st)
    s = report.summary()
    con.print(f"[bold]n={s['n']}[/] skipped={s['skipped']}  MAPE {_fmt(s['mape'])}%  median {_fmt(s['median_ape'])}%"
              f"  max {_fmt(s['max_ape'])}%  mean signed {_fmt(s['mean_signed_error'])}%")
    if report.groups:
        con.print(f"ranking over {len(report.groups)} group(s) (throughput, size-weighted): "
                  f"Spearman {_fmt(s['spearman'])}  Kendall {_fmt(s['kendall'])}")


def require_matplotlib() -> None:
    """Fail at once (before any row is simulated) when the plot extra is missing."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise ConfigError("--plot", "matplotlib is not installed", "pip install 'trainsim[plot]'")


def plot_validation(report: ValidationReport) -> bytes:
    """Predicted vs measured scatter (log-log) with the y = x line and +-10% band, as PNG bytes."""
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report.compared
    if not rows:
        raise ConfigError("--plot", "no compared rows to plot", "check the skipped rows")
    fig, ax = plt.subplots(figsize=(5.5, 5.0))
    by_metric: dict[str, list] = {}
    for o in rows:
        by_metric.setdefault(o.metric, []).append(o)
    for metric, os_ in by_metric.items():
        ax.scatter([o.measured for o in os_], [o.predicted for o in os_], s=12, label=metric, alpha=0.7)
    lo = min(min(o.measured or 1, o.predicted or 1) for o in rows) * 0.8
    hi = max(max(o.measured or 1, o.predicted or 1) for o in rows) * 1.25
    xs = [lo, hi]
    ax.plot(xs, xs, "k-", lw=1)
    ax.plot(xs, [x * 1.1 for x in xs], "k:", lw=0.8)
    ax.plot(xs, [x * 0.9 for x in xs], "k:", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured")
    ax.set_ylabel("predicted (trainsim)")
    s = report.summary()
    ax.set_title(f"{report.kind}: n={s['n']}, MAPE {s['mape']:.1f}%")
    ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format="png", dpi=120)
    finally:
        plt.close(fig)
    return buf.getvalue()
