"""What a report shows, independent of how it is drawn: plot and table specs that the HTML (plotly) and the
PNG (matplotlib) renderers both draw, so the two never disagree about the data."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# one colour per breakdown category, shared by every plot (timeline, stacked bars, legends)
CATEGORY_COLORS: dict[str, str] = {
    "compute": "#4C78A8", "recompute": "#9ECAE9", "optimizer": "#B279A2", "tp": "#F58518", "cp": "#E45756",
    "ep": "#FF9DA6", "dp": "#54A24B", "pp": "#EECA3B", "offload": "#9D755D", "bubble": "#D8D8D8",
    "idle": "#EFEFEF", "memory": "#72B7B2", "critical path": "#111111",
}
CATEGORY_LABELS: dict[str, str] = {
    "compute": "compute", "recompute": "recompute", "optimizer": "optimizer step", "tp": "TP collectives",
    "cp": "CP collectives", "ep": "EP all-to-all", "dp": "DP gradient sync", "pp": "pipeline send/recv",
    "offload": "offload transfers", "bubble": "waiting (bubble)", "idle": "idle",
}
PALETTE = ("#4C78A8", "#F58518", "#54A24B", "#E45756", "#72B7B2", "#EECA3B", "#B279A2", "#FF9DA6", "#9D755D",
           "#BAB0AC")


def color_of(category: str, index: int = 0) -> str:
    """The category's colour, or the palette's `index`-th for anything else."""
    return CATEGORY_COLORS.get(category, PALETTE[index % len(PALETTE)])


@dataclass
class Segments:
    """One category's bars on a timeline: bar i spans [start_ms[i], end_ms[i]) on row row[i]."""

    name: str
    color: str
    row: np.ndarray  # int row index per bar
    start_ms: np.ndarray
    end_ms: np.ndarray
    labels: list[str]  # hover text per bar

    def __len__(self) -> int:
        return len(self.row)


@dataclass
class TimelinePlot:
    """Rows (a rank class's stream each) with coloured bars, zoomable; `overlay` is drawn thin on top."""

    title: str
    rows: list[str]
    groups: list[Segments]
    caption: str = ""
    overlay: Segments | None = None
    x_label: str = "time (ms)"

    @property
    def n_points(self) -> int:
        return sum(len(g) for g in self.groups) + (len(self.overlay) if self.overlay is not None else 0)


@dataclass
class Series:
    """One line or set of markers. `step`: drawn as a staircase (value holds until the next x)."""

    name: str
    x: list[float]
    y: list[float]
    mode: str = "lines"  # lines | markers | lines+markers
    color: str | None = None
    dash: bool = False
    step: bool = False
    labels: list[str] | None = None  # hover text per point
    fill_to_previous: bool = False  # shade between this series and the one before it (a band)


@dataclass
class XYPlot:
    title: str
    x_label: str
    y_label: str
    series: list[Series]
    caption: str = ""
    log_x: bool = False
    log_y: bool = False
    hlines: list[tuple[float, str, str]] = field(default_factory=list)  # (y, label, colour)
    y_from_zero: bool = True  # a linear y axis starts at 0 (False: fit the data, to see small differences)


@dataclass
class BarPlot:
    """Bars per category; several `stacks` are stacked (stacked=True) or side by side."""

    title: str
    categories: list[str]
    stacks: list[tuple[str, list[float], str]]  # (name, one value per category, colour)
    value_label: str
    caption: str = ""
    stacked: bool = True
    horizontal: bool = False
    hlines: list[tuple[float, str, str]] = field(default_factory=list)
    log_value: bool = False  # the value axis in log scale (counts spanning decades)


@dataclass
class HeatmapPlot:
    title: str
    x_label: str
    y_label: str
    x: list[str]
    y: list[str]
    z: list[list[float | None]]  # z[row y][column x]; None: no configuration there
    z_label: str
    caption: str = ""


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[str]]
    caption: str = ""


Plot = TimelinePlot | XYPlot | BarPlot | HeatmapPlot


@dataclass
class Section:
    """One input's part of the page: headline numbers, plots and tables, and notes on what was assumed."""

    title: str
    kind: str  # simulation | replay | search | sweep | validation | comparison
    cards: list[tuple[str, str]] = field(default_factory=list)  # (label, value) headline numbers
    items: list[Plot | Table] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    source: str = ""

    @property
    def plots(self) -> list[Plot]:
        return [i for i in self.items if not isinstance(i, Table)]


@dataclass
class Report:
    title: str
    sections: list[Section]

    @property
    def plots(self) -> list[Plot]:
        return [p for s in self.sections for p in s.plots]
