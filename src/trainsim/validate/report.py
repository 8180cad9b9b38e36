"""Printed and plotted validation reports (rich table of rows, summary, ranking quality)."""

from __future__ import annotations

import io
import math
from collections import Counter
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from ..errors import ConfigError
from .cases import skips_by_reason
from .runner import ValidationReport, stats_by_group

if TYPE_CHECKING:
    from .calibrate import CrossValidation

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
        groups = skips_by_reason(report.skipped)
        st = Table(title=f"skipped: {len(report.skipped)} rows, {len(groups)} reasons"
                   + ("" if show_all else " (--all for every case)"))
        st.add_column("rows", justify="right")
        st.add_column("reason", overflow="fold")
        st.add_column("cases", overflow="fold")
        for reason, os_ in groups:
            details = Counter((o.skipped or "").removeprefix(f"{reason}: ") for o in os_).most_common()
            shown = details if show_all else details[:3]
            text = reason if len(details) > 1 else os_[0].skipped or ""
            if len(details) > 1:
                text += "".join(f"\n  {n} x {d}" for d, n in shown) + \
                    (f"\n  +{len(details) - len(shown)} more" if len(shown) < len(details) else "")
            ids = [o.case_id for o in os_]
            cases = ", ".join(ids if show_all or len(ids) <= 3 else [*ids[:3], f"+{len(ids) - 3} more"])
            st.add_row(str(len(os_)), text, cases)
        con.print(st)
    s = report.summary()
    con.print(f"[bold]n={s['n']}[/] skipped={s['skipped']}  MAPE {_fmt(s['mape'])}%  median {_fmt(s['median_ape'])}%"
              f"  max {_fmt(s['max_ape'])}%  mean signed {_fmt(s['mean_signed_error'])}%")
    for line in memory_lines(report):
        con.print(line)
    if report.groups:
        con.print(f"ranking over {len(report.groups)} group(s) (throughput, size-weighted): "
                  f"Spearman {_fmt(s['spearman'])}  Kendall {_fmt(s['kendall'])}")
    if report.semantics:
        con.print(f"predicted in {report.semantics} semantics" + (
            "" if report.semantics == "nccl" else " (--semantics nccl: trainsim's NCCL-like model and the gap)"))
    if report.semantics == "nccl":
        print_gap_terms(report, con)


def memory_line(label: str, m: dict[str, Any]) -> str:
    """One line of peak-memory error statistics (ValidationReport.memory_summary's keys)."""
    return (f"{label} n={m['n']}  MAPE {_fmt(m['mape'])}%  median {_fmt(m['median_ape'])}%  max {_fmt(m['max_ape'])}%"
            f"  predicted OOM but ran: {m['oom_wrong']}")


def memory_lines(report: ValidationReport) -> list[str]:
    """The peak-memory summary (overall, then per mem_kind), where any compared row measured its memory."""
    m = report.memory_summary()
    if not m["n"]:
        return []
    by_kind = report.memory_by_kind()
    reserved = report.reserved_summary()
    return [memory_line("[bold]memory[/] (predicted peak of the measured rank's stage vs measured):", m),
            *(memory_line(f"  {kind}:", k) for kind, k in by_kind.items()),
            *([memory_line("  reserved peaks (incl. those stated beside allocated):", reserved)]
              if reserved["n"] else [])]


def print_gap_terms(report: ValidationReport, console: Console | None = None) -> None:
    """ASTRA-sim reference rows predicted as NCCL: how much of each row's gap each ASTRA-sim term makes."""
    con = console or Console()
    t = Table(title="ASTRA-sim's time minus trainsim's NCCL-like time, by term (switched off in this order; "
              "+ = ASTRA-sim slower)")
    for col in ("term", "rows", "us", "share %", "what"):
        t.add_column(col, justify="left" if col in ("term", "what") else "right",
                     overflow="fold", no_wrap=col == "term")
    for name, what, rows, total_us, share in report.term_table():
        t.add_row(name, str(rows), f"{total_us:,.0f}", f"{share:+.1f}", what)
    con.print(t)


GROUP_CAPTION = ("error = (predicted - measured) / measured in % of each row's own metric; MAPE, med, max: "
                 "mean, median and largest |error| (%); bias (%): mean signed error, + = trainsim predicts "
                 "faster than measured (higher throughput/TFLOP/s/MFU, shorter time: the sign of time metrics "
                 "is flipped); rho: Spearman rank correlation of predicted vs measured throughput within the "
                 "group (n >= 3)")


SHORT_METRIC = {"tflops_per_gpu": "TFLOPS", "samples_per_s": "samples/s", "tokens_per_s_per_gpu": "tokens/s",
                "mfu_pct": "MFU", "iter_time_s": "time", "time_us": "time"}


def _pct(x: float | None, signed: bool = False) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:+.1f}" if signed else f"{x:.1f}"


def print_groups(report: ValidationReport, console: Console | None = None) -> None:
    """One table of error statistics per --by group, with an 'all rows' line (GROUP_CAPTION says what)."""
    con = console or Console()
    everything = stats_by_group(report.outcomes, lambda o: "all rows").get("all rows")
    metrics = {", ".join(g["metrics"]) for g in report.by_group.values()}
    title = f"{report.kind}: errors by {', '.join(report.by)} ({len(report.by_group)} groups" + \
        (f", {metrics.pop() or 'no'} rows)" if len(metrics) == 1 else ")")
    t = Table(title=title, caption=GROUP_CAPTION, caption_justify="left")
    t.add_column(" | ".join(report.by), overflow="fold")
    show_skipped = any(g["skipped"] for g in report.by_group.values())
    show_metric = len(metrics) > 1
    for col in ("n", *(("skipped",) if show_skipped else ()), "MAPE", "med", "bias", "max", "rho",
                *(("metric",) if show_metric else ())):
        t.add_column(col, justify="left" if col == "metric" else "right", overflow="fold",
                     max_width=10 if col == "metric" else None)  # the group names get the room
    if everything and len(everything["metrics"]) > 2:
        everything["metrics"] = [f"{len(everything['metrics'])} metrics"]
    items = list(report.by_group.items()) + ([("all rows", everything)] if everything else [])
    for i, (key, g) in enumerate(items):
        style = "red" if g["mape"] > 20 else "yellow" if g["mape"] > 10 else ""
        t.add_row(key, str(g["n"]), *((str(g["skipped"]),) if show_skipped else ()),
                  _pct(g["mape"]), _pct(g["median_ape"]), _pct(g["bias"], signed=True), _pct(g["max_ape"]),
                  "-" if math.isnan(g["spearman"]) else f"{g['spearman']:.3f}",
                  *((",".join(SHORT_METRIC.get(m, m) for m in g["metrics"]),) if show_metric else ()),
                  style="bold" if i == len(report.by_group) else style, end_section=i == len(report.by_group) - 1)
    con.print(t)


CV_CAPTION = ("MAPE (%) of each group's rows predicted with: the starting calibration (start), the fit on every "
              "row (in-sample) and the fit on every row outside the group (held out); bias (%): held-out mean "
              "signed error, + = predicted faster than measured; train: rows the held-out fit saw")


def print_cross_validation(cv: CrossValidation, console: Console | None = None) -> None:
    """Per held-out group: rows, training rows, start / in-sample / held-out MAPE and held-out bias, a line
    over all rows; then each fitted constant (start, the all-rows fit, its range over the held-out fits)."""
    con = console or Console()
    t = Table(title=f"leave-one-group-out cross-validation ({cv.family}, {len(cv.groups)} groups)",
              caption=CV_CAPTION, caption_justify="left")
    t.add_column(f"held out: {' | '.join(cv.by)}" if cv.by else "held-out group", overflow="fold")
    for col in ("n", "train", "start", "in-sample", "held out", "bias"):
        t.add_column(col, justify="right", overflow="fold")
    keys = [*cv.groups, None]
    for i, g in enumerate(keys):
        st = cv.stats(g)
        n = int(st["held_out"]["n"])
        h = st["held_out"]["mape"]
        style = "bold" if g is None else "red" if h > 20 else "yellow" if h > 10 else ""
        t.add_row("all rows" if g is None else g, str(n), "-" if g is None else str(cv.train_rows[g]),
                  _pct(st["start"]["mape"]), _pct(st["in_sample"]["mape"]), _pct(h),
                  _pct(st["held_out"]["bias"], signed=True), style=style, end_section=i == len(cv.groups) - 1)
    con.print(t)
    every_row = cv.fitted(cv.all_fit)
    ft = Table(title=f"fitted constants ({cv.family})")
    for col in ("constant", "start", "every row", "held-out fits: min", "max"):
        ft.add_column(col, justify="left" if col == "constant" else "right", overflow="fold")
    for n in cv.names:
        folds = [cv.fitted(cv.folds[g])[n] for g in cv.groups]
        ft.add_row(n, f"{cv.start[n]:.4g}", f"{every_row[n]:.4g}", f"{min(folds):.4g}", f"{max(folds):.4g}")
    con.print(ft)


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
