"""PNG renderer of the report's plot specs (matplotlib, Agg canvas): one image per plot, for slides and
documents where the interactive HTML page does not fit. matplotlib is imported lazily, inside the functions,
so importing this module never needs it."""

from __future__ import annotations

import importlib.util
import io
import math
import re
import textwrap
import unicodedata
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ConfigError
from .figures import PALETTE, BarPlot, HeatmapPlot, Plot, Report, Segments, TimelinePlot, XYPlot

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

ROW_HEIGHT_IN = 0.22  # timeline: figure height per row
MAX_HEIGHT_IN = 30.0  # no figure taller than this, however many rows or categories
TIMELINE_WIDTH_IN = 12.0
XY_SIZE_IN = (8.0, 4.5)
BAR_HEIGHT = 0.8  # timeline bar height, in rows
OVERLAY_HEIGHT = 0.3  # the overlay's thinner bars, in rows
ANNOTATE_MAX_CELLS = 15  # heatmaps up to 15 x 15 get their values written in the cells
SLUG_MAX = 40
CAPTION_CHARS_PER_IN = 15  # wrap width of the 8 pt caption, in characters per inch of figure width


def require_matplotlib(field: str = "--format") -> None:
    """Fail with a one-line fix when matplotlib is missing, before any work is done for a PNG."""
    if importlib.util.find_spec("matplotlib") is None:
        raise ConfigError(field, "matplotlib is not installed", "pip install 'trainsim[report]'")


def render_png(plot: Plot, dpi: int = 120) -> bytes:
    """One plot as PNG bytes; a fresh Agg figure per call, so concurrent or repeated calls never interfere."""
    require_matplotlib()
    drawers = {TimelinePlot: _draw_timeline, XYPlot: _draw_xy, BarPlot: _draw_bars, HeatmapPlot: _draw_heatmap}
    drawer = drawers.get(type(plot))
    if drawer is None:
        raise TypeError(f"render_png: not a plot spec: {type(plot).__name__}")
    fig = drawer(plot, dpi)
    try:
        return _save(fig, dpi)
    finally:
        fig.clear()


def png_files(report: Report) -> dict[str, bytes]:
    """Every plot of the report as `NN-<section>-<plot>.png`, numbered in page order (tables skipped)."""
    named = [(section.title, plot) for section in report.sections for plot in section.plots]
    width = max(2, len(str(len(named))))
    return {f"{i:0{width}d}-{slugify(sec, 'section')}-{slugify(plot.title, 'plot')}.png": render_png(plot)
            for i, (sec, plot) in enumerate(named, start=1)}


def slugify(text: str, fallback: str) -> str:
    """Lowercase ascii letters, digits and single hyphens, at most SLUG_MAX chars: safe in any file name."""
    ascii_text = unicodedata.normalize("NFKD", text.casefold()).encode("ascii", "ignore").decode("ascii")
    slug = re.sub(r"[^a-z0-9]+", "-", ascii_text).strip("-")
    return slug[:SLUG_MAX].rstrip("-") or fallback


# ---------------------------------------------------------------------------------------------- figure plumbing

def _new_figure(width_in: float, height_in: float, dpi: int) -> tuple[Figure, Axes]:
    """A figure bound to its own Agg canvas (no pyplot, no global backend switch) and its one axes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_in, min(height_in, MAX_HEIGHT_IN)), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def _save(fig: Figure, dpi: int) -> bytes:
    """PNG bytes with no software/time metadata, so the same plot always gives the same bytes."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None}, facecolor="white")
    return buf.getvalue()


def _finish(fig: Figure, ax: Axes, title: str, caption: str) -> None:
    """Title over the axes and the caption, wrapped, in small grey text under them."""
    ax.set_title(title, fontsize=11, loc="left")
    if caption.strip():
        width = max(40, int(fig.get_figwidth() * CAPTION_CHARS_PER_IN))
        fig.supxlabel(textwrap.fill(" ".join(caption.split()), width), x=0.01, ha="left", fontsize=8,
                      color="#555555")


def _no_data(ax: Axes) -> None:
    """Say so in the middle of an axes that has nothing to draw, rather than leaving it silently empty."""
    ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="#888888")


def _legend(ax: Axes, outside: bool = False, **kwargs: Any) -> None:
    """A legend only when something is labelled; `outside`: to the right of the axes (many entries)."""
    handles, labels = ax.get_legend_handles_labels()
    if not handles:
        return
    if outside:
        ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False,
                  **kwargs)
    else:
        ax.legend(handles, labels, fontsize=8, **kwargs)


def _floats(values: Sequence[float | None] | np.ndarray) -> np.ndarray:
    """A float array with None as NaN (matplotlib leaves NaN points out)."""
    return np.asarray(values if len(values) else [], dtype=float)


# ------------------------------------------------------------------------------------------------------ timeline

def _merged_bars(seg: Segments, tol_ms: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row, start, end) with each row's overlapping or nearly touching bars (gap <= tol_ms, under a pixel)
    joined into one: the same picture at this resolution, drawn from far fewer rectangles."""
    row = np.asarray(seg.row, dtype=np.int64)
    start, end = _floats(seg.start_ms), _floats(seg.end_ms)
    keep = ~(np.isnan(start) | np.isnan(end))
    row, start, end = row[keep], start[keep], end[keep]
    if len(row) == 0:
        return row, start, end
    order = np.lexsort((start, row))
    row, start, end = row[order], start[order], end[order]
    # running max of the ends within each row: shift each row above every earlier one so one cummax suffices
    shift = (row - row[0]) * (float(np.max(end) - np.min(start)) + 2 * tol_ms + 1.0)
    reach = np.maximum.accumulate(end + shift) - shift
    new_run = np.ones(len(row), dtype=bool)
    new_run[1:] = (row[1:] != row[:-1]) | (start[1:] > reach[:-1] + tol_ms)
    first = np.flatnonzero(new_run)
    return row[first], start[first], np.maximum.reduceat(end, first)


def _add_segments(ax: Axes, seg: Segments, height: float, tol_ms: float, zorder: int) -> None:
    """One PolyCollection per group (never one artist per bar), so tens of thousands of bars draw fast."""
    from matplotlib.collections import PolyCollection

    row, start, end = _merged_bars(seg, tol_ms)
    if len(row) == 0:
        return
    lo, hi = row - height / 2, row + height / 2
    corners = [(start, lo), (start, hi), (end, hi), (end, lo)]
    verts = np.stack([np.stack(c, axis=-1) for c in corners], axis=1)
    coll = PolyCollection(verts, facecolors=seg.color, edgecolors="none", linewidths=0, label=seg.name,
                          zorder=zorder)
    ax.add_collection(coll, autolim=False)


def _time_span(groups: Sequence[Segments]) -> tuple[float, float]:
    """The x range covering every bar, padded 1% each side (0..1 when there are none)."""
    starts = [float(np.nanmin(g.start_ms)) for g in groups if len(g)]
    ends = [float(np.nanmax(g.end_ms)) for g in groups if len(g)]
    if not starts:
        return 0.0, 1.0
    lo, hi = min(starts), max(ends)
    pad = (hi - lo) * 0.01 or 1.0
    return lo - pad, hi + pad


def _label_rows(ax: Axes, rows: Sequence[str]) -> None:
    """Row names on the y axis, row 0 at the top; thinned so labels never overlap past ~135 rows."""
    n = len(rows)
    step = max(1, math.ceil(n / ((MAX_HEIGHT_IN - 1.5) / ROW_HEIGHT_IN)))
    ticks = list(range(0, n, step))
    ax.set_yticks(ticks, [rows[i] for i in ticks], fontsize=7)
    ax.set_ylim(n - 0.5 if n else 0.5, -0.5)


def _draw_timeline(plot: TimelinePlot, dpi: int) -> Figure:
    """Rows of coloured bars, one collection per group, the overlay thin and on top, legend to the right."""
    fig, ax = _new_figure(TIMELINE_WIDTH_IN, max(2.5, 1.5 + ROW_HEIGHT_IN * len(plot.rows)), dpi)
    overlays = [plot.overlay] if plot.overlay is not None else []
    lo, hi = _time_span([*plot.groups, *overlays])
    tol_ms = 0.5 * (hi - lo) / (TIMELINE_WIDTH_IN * dpi)  # under half a pixel
    for z, seg in enumerate(plot.groups):
        _add_segments(ax, seg, BAR_HEIGHT, tol_ms, zorder=2 + z)
    for seg in overlays:
        _add_segments(ax, seg, OVERLAY_HEIGHT, tol_ms, zorder=3 + len(plot.groups))
    ax.set_xlim(lo, hi)
    _label_rows(ax, plot.rows)
    ax.set_xlabel(plot.x_label)
    ax.grid(axis="x", color="#E5E5E5", linewidth=0.6, zorder=0)
    ax.set_axisbelow(True)
    if plot.n_points == 0:
        _no_data(ax)
    _legend(ax, outside=True)
    _finish(fig, ax, plot.title, plot.caption)
    return fig


# ------------------------------------------------------------------------------------------------------------ xy

def _previous_on(x: np.ndarray, prev_x: np.ndarray, prev_y: np.ndarray) -> np.ndarray:
    """The previous series' y at this series' x (its own y where the x values agree), for a band fill."""
    if len(prev_x) == len(x) and np.array_equal(prev_x, x):
        return prev_y
    order = np.argsort(prev_x)
    return np.interp(x, prev_x[order], prev_y[order], left=np.nan, right=np.nan)


def _log_axes(ax: Axes, log_x: bool, log_y: bool) -> None:
    """Log scales with plain tick numbers (8, 16, 1e+06), not 2x10^0 style labels."""
    from matplotlib.ticker import FuncFormatter, LogFormatter

    for axis, on, set_scale in ((ax.xaxis, log_x, ax.set_xscale), (ax.yaxis, log_y, ax.set_yscale)):
        if on:
            set_scale("log")
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            # minor ticks labelled only when the axis spans under a decade or so (matplotlib's own rule)
            axis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(1, 0.4)))


def _draw_xy(plot: XYPlot, dpi: int) -> Figure:
    """Lines, markers or post-steps per series, bands filled to the previous series, reference lines."""
    fig, ax = _new_figure(*XY_SIZE_IN, dpi)
    prev: tuple[np.ndarray, np.ndarray] | None = None
    for i, s in enumerate(plot.series):
        x, y = _floats(s.x), _floats(s.y)
        color = s.color or PALETTE[i % len(PALETTE)]
        lines, markers = "lines" in s.mode, "markers" in s.mode
        ax.plot(x, y, color=color, label=s.name or None, linestyle=("--" if s.dash else "-") if lines else "none",
                marker="o" if markers else None, markersize=4, drawstyle="steps-post" if s.step else "default")
        if s.fill_to_previous and prev is not None and len(x):
            ax.fill_between(x, _previous_on(x, *prev), y, color=color, alpha=0.2, linewidth=0,
                            step="post" if s.step else None)
        prev = (x, y)
    for y0, label, color in plot.hlines:
        ax.axhline(y0, color=color, linestyle=":", linewidth=1.2, label=label or None)
    _log_axes(ax, plot.log_x, plot.log_y)
    if plot.y_from_zero and not plot.log_y and ax.get_ylim()[0] > 0:  # as the HTML page draws it
        ax.set_ylim(bottom=0)
    ax.set_xlabel(plot.x_label)
    ax.set_ylabel(plot.y_label)
    ax.grid(color="#E5E5E5", linewidth=0.6)
    if not any(len(s.x) for s in plot.series):
        _no_data(ax)
    _legend(ax)
    _finish(fig, ax, plot.title, plot.caption)
    return fig


# ---------------------------------------------------------------------------------------------------------- bars

def _bar_figure_size(plot: BarPlot) -> tuple[float, float]:
    """Wider with many categories (vertical), taller with many categories (horizontal)."""
    n = len(plot.categories)
    if plot.horizontal:
        return XY_SIZE_IN[0], max(XY_SIZE_IN[1], 1.5 + 0.3 * n)
    return min(20.0, max(XY_SIZE_IN[0], 0.35 * n)), XY_SIZE_IN[1]


def _bar_layout(plot: BarPlot) -> list[tuple[np.ndarray, np.ndarray, float]]:
    """(offset, base, thickness) per stack: stacked bars pile positives up and negatives down from 0."""
    n, k = len(plot.categories), len(plot.stacks)
    if not plot.stacked:
        width = 0.8 / max(1, k)
        return [(np.full(n, (j - (k - 1) / 2) * width), np.zeros(n), width) for j in range(k)]
    pos, neg, out = np.zeros(n), np.zeros(n), []
    for _, values, _ in plot.stacks:
        v = np.nan_to_num(_floats(values))
        out.append((np.zeros(n), np.where(v >= 0, pos, neg), 0.8))
        pos, neg = pos + np.clip(v, 0, None), neg + np.clip(v, None, 0)
    return out


def _label_categories(ax: Axes, plot: BarPlot) -> None:
    """Category names on the category axis, rotated when many or long, first category on top if horizontal."""
    idx = np.arange(len(plot.categories))
    if plot.horizontal:
        ax.set_yticks(idx, plot.categories)
        ax.invert_yaxis()
        return
    crowded = len(plot.categories) > 8 or (len(plot.categories) > 3 and max(map(len, plot.categories)) > 10)
    ax.set_xticks(idx, plot.categories, rotation=40 if crowded else 0, ha="right" if crowded else "center",
                  rotation_mode="anchor")


def _draw_bars(plot: BarPlot, dpi: int) -> Figure:
    """Stacked or grouped bars, vertical or horizontal, with value reference lines across them."""
    fig, ax = _new_figure(*_bar_figure_size(plot), dpi)
    idx = np.arange(len(plot.categories), dtype=float)
    for (name, values, color), (offset, base, thick) in zip(plot.stacks, _bar_layout(plot), strict=True):
        v = np.nan_to_num(_floats(values))
        if plot.horizontal:
            ax.barh(idx + offset, v, height=thick, left=base, color=color, label=name or None)
        else:
            ax.bar(idx + offset, v, width=thick, bottom=base, color=color, label=name or None)
    ref = ax.axvline if plot.horizontal else ax.axhline
    for value, label, color in plot.hlines:
        ref(value, color=color, linestyle="--", linewidth=1.2, label=label or None)
    _label_categories(ax, plot)
    if plot.log_value:
        _log_axes(ax, plot.horizontal, not plot.horizontal)
    (ax.set_xlabel if plot.horizontal else ax.set_ylabel)(plot.value_label)
    ax.grid(axis="x" if plot.horizontal else "y", color="#E5E5E5", linewidth=0.6)
    ax.set_axisbelow(True)
    if not plot.categories or not plot.stacks:
        _no_data(ax)
    _legend(ax, outside=True)  # bars fill the axes: a legend inside would hide some
    _finish(fig, ax, plot.title, plot.caption)
    return fig


# ------------------------------------------------------------------------------------------------------- heatmap

def _heatmap_values(plot: HeatmapPlot) -> np.ma.MaskedArray:
    """z as a (len(y), len(x)) array with None (and NaN) cells masked, so they draw blank."""
    z = np.full((len(plot.y), len(plot.x)), np.nan)
    for r, row in enumerate(plot.z[: len(plot.y)]):
        vals = _floats(row[: len(plot.x)])
        z[r, : len(vals)] = vals
    return np.ma.masked_invalid(z)


def _annotate_cells(ax: Axes, z: np.ma.MaskedArray, image: Any) -> None:
    """Each cell's value in the cell, dark or light text by the cell's brightness."""
    for (r, c), value in np.ndenumerate(z.filled(np.nan)):
        if math.isnan(value):
            continue
        red, green, blue, _ = image.cmap(image.norm(value))
        light = 0.299 * red + 0.587 * green + 0.114 * blue > 0.5
        ax.text(c, r, f"{value:.3g}", ha="center", va="center", fontsize=7, color="black" if light else "white")


def _draw_heatmap(plot: HeatmapPlot, dpi: int) -> Figure:
    """A colour grid (y[0] at the bottom, as plotly draws it), None cells blank, colour bar labelled z."""
    import matplotlib as mpl

    width = min(20.0, max(6.0, 3.0 + 0.6 * len(plot.x)))
    fig, ax = _new_figure(width, max(4.0, 2.0 + 0.45 * len(plot.y)), dpi)
    z = _heatmap_values(plot)
    if z.size == 0:
        _no_data(ax)
        _finish(fig, ax, plot.title, plot.caption)
        return fig
    cmap = mpl.colormaps["viridis"].with_extremes(bad=(1.0, 1.0, 1.0, 0.0))
    limits = (float(z.min()), float(z.max())) if z.count() else (0.0, 1.0)
    image = ax.imshow(z, cmap=cmap, aspect="auto", origin="lower", interpolation="nearest",
                      vmin=limits[0], vmax=limits[1])
    fig.colorbar(image, ax=ax, label=plot.z_label)
    crowded = len(plot.x) > 8 and max(map(len, plot.x)) > 4
    ax.set_xticks(range(len(plot.x)), plot.x, rotation=40 if crowded else 0, ha="right" if crowded else "center",
                  rotation_mode="anchor")
    ax.set_yticks(range(len(plot.y)), plot.y)
    ax.set_xlabel(plot.x_label)
    ax.set_ylabel(plot.y_label)
    if len(plot.x) <= ANNOTATE_MAX_CELLS and len(plot.y) <= ANNOTATE_MAX_CELLS:
        _annotate_cells(ax, z, image)
    _finish(fig, ax, plot.title, plot.caption)
    return fig
