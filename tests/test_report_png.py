"""The PNG renderer: every plot kind draws a real, non-blank image, deterministically, fast for big timelines,
and a report's files are named safely in page order."""

from __future__ import annotations

import importlib.util
import io
import re
import time

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from matplotlib.image import imread  # noqa: E402

from trainsim.errors import ConfigError  # noqa: E402
from trainsim.report import png  # noqa: E402
from trainsim.report.figures import (  # noqa: E402
    BarPlot,
    HeatmapPlot,
    Plot,
    Report,
    Section,
    Segments,
    Series,
    Table,
    TimelinePlot,
    XYPlot,
    color_of,
)
from trainsim.report.png import png_files, render_png, require_matplotlib  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _segments(name: str, n: int, n_rows: int, seed: int = 0) -> Segments:
    """`n` random bars of one category spread over `n_rows` rows and one second."""
    rng = np.random.default_rng(seed)
    start = rng.uniform(0.0, 1000.0, n)
    return Segments(name, color_of(name), rng.integers(0, n_rows, n), start, start + rng.uniform(0.05, 3.0, n),
                    [f"{name} {i}" for i in range(n)])


def _timeline(n_rows: int, n_bars: int = 200) -> TimelinePlot:
    """A timeline with two categories and a critical-path overlay."""
    return TimelinePlot(
        title=f"step timeline, {n_rows} rows",
        rows=[f"stage {i}" for i in range(n_rows)],
        groups=[_segments("compute", n_bars, n_rows, 1), _segments("tp", n_bars // 2, n_rows, 2)],
        caption="Each row is one rank class's stream; the thin dark bars are the critical path.",
        overlay=_segments("critical path", 20, n_rows, 3),
    )


def _xy() -> XYPlot:
    """Lines, dashed lines, a band, markers, a step series, log x and a reference line."""
    x = [1.0, 2.0, 4.0, 8.0, 16.0]
    return XYPlot(
        title="throughput vs GPUs", x_label="GPUs", y_label="tokens/s", log_x=True,
        series=[Series("low", x, [1, 2, 3, 5, 8], color="#888888", dash=True),
                Series("high", x, [2, 3, 5, 8, 13], color="#888888", fill_to_previous=True),
                Series("predicted", x, [1.5, 2.5, 4, 6.5, 10], mode="lines+markers"),
                Series("memory", [1.0, 3.0, 9.0], [4, 2, 6], step=True)],
        hlines=[(9.0, "target", "#E45756")], caption="the band spans low to high",
    )


def _bars(stacked: bool = True, horizontal: bool = False, n: int = 4) -> BarPlot:
    """Breakdown bars over `n` configurations with a reference line."""
    cats = [f"tp{2 ** i}-pp{n - i}" for i in range(n)]
    stacks = [(k, [1.0 + i * 0.5 + j for i in range(n)], color_of(k)) for j, k in enumerate(["compute", "tp", "dp"])]
    return BarPlot("step breakdown", cats, stacks, "ms", stacked=stacked, horizontal=horizontal,
                   hlines=[(5.0, "budget", "#111111")], caption="exposed time per category")


def _heatmap() -> HeatmapPlot:
    """A TP x PP grid with holes where no configuration exists."""
    z = [[None if (i + j) % 4 == 0 else float(i * 10 + j) for j in range(5)] for i in range(3)]
    return HeatmapPlot("step time", "TP", "PP", ["1", "2", "4", "8", "16"], ["1", "2", "4"], z, "ms",
                       caption="blank: does not fit in memory")


def _pixels(data: bytes) -> np.ndarray:
    """Decoded RGBA pixels of PNG bytes (fails if the bytes are not a PNG)."""
    assert data.startswith(PNG_SIGNATURE)
    return imread(io.BytesIO(data), format="png")


def _assert_drawn(data: bytes) -> np.ndarray:
    """The image decodes and has something on it (not one flat colour, not all white)."""
    img = _pixels(data)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    rgb = img[..., :3]
    assert float(rgb.var()) > 0.0
    assert float(rgb.min()) < 0.9  # some ink, not a white page
    return img


ALL_PLOTS = {
    "timeline": lambda: _timeline(6),
    "xy": _xy,
    "bars-stacked": _bars,
    "bars-grouped-horizontal": lambda: _bars(stacked=False, horizontal=True),
    "bars-many-categories": lambda: _bars(n=14),
    "heatmap": _heatmap,
}


@pytest.mark.parametrize("kind", sorted(ALL_PLOTS))
def test_each_plot_kind_renders_a_non_blank_png_deterministically(kind: str) -> None:
    plot = ALL_PLOTS[kind]()
    first = render_png(plot)
    _assert_drawn(first)
    assert render_png(plot) == first  # no timestamps or other run-to-run noise in the file


def test_dpi_scales_the_image() -> None:
    plot = _xy()
    small, large = _pixels(render_png(plot, dpi=60)), _pixels(render_png(plot, dpi=120))
    assert large.shape[0] == 2 * small.shape[0] and large.shape[1] == 2 * small.shape[1]


def test_timeline_image_grows_with_its_rows() -> None:
    heights = [_pixels(render_png(_timeline(n))).shape[0] for n in (3, 20, 60)]
    assert heights[0] < heights[1] < heights[2]


def test_timeline_height_is_capped() -> None:
    dpi = 40
    img = _pixels(render_png(_timeline(1000, n_bars=2000), dpi=dpi))
    assert img.shape[0] <= png.MAX_HEIGHT_IN * dpi + 1


def test_timeline_with_tens_of_thousands_of_bars_renders_fast() -> None:
    plot = _timeline(32, n_bars=40_000)
    render_png(_timeline(2))  # imports and font cache out of the timing
    t0 = time.perf_counter()
    _assert_drawn(render_png(plot))
    assert time.perf_counter() - t0 < 5.0  # ~0.5 s here; one artist per bar would take tens of seconds


def test_timeline_bars_and_overlay_show_their_colours() -> None:
    seg = Segments("compute", "#FF0000", np.array([0, 1]), np.array([0.0, 0.0]), np.array([100.0, 100.0]),
                   ["a", "b"])
    over = Segments("critical path", "#0000FF", np.array([0]), np.array([10.0]), np.array([90.0]), ["c"])
    rgb = _pixels(render_png(TimelinePlot("t", ["r0", "r1"], [seg], overlay=over)))[..., :3]
    red = (rgb[..., 0] > 0.9) & (rgb[..., 1] < 0.1) & (rgb[..., 2] < 0.1)
    blue = (rgb[..., 2] > 0.9) & (rgb[..., 0] < 0.1) & (rgb[..., 1] < 0.1)
    assert red.sum() > 5000 and blue.sum() > 5000  # far more than the legend swatches
    rows, _ = np.nonzero(blue)
    red_rows, _ = np.nonzero(red)
    assert rows.mean() < np.median(red_rows)  # the overlay is on row 0, which is drawn at the top


def test_merged_bars_join_overlapping_and_touching_bars_per_row() -> None:
    seg = Segments("c", "#000000", np.array([0, 0, 0, 1, 0, 0]), np.array([0.0, 1.0, 5.0, 0.5, 2.0, 20.0]),
                   np.array([1.0, 2.0, 6.0, 1.0, 10.0, 21.0]), [""] * 6)
    row, start, end = png._merged_bars(seg, tol_ms=0.1)
    assert row.tolist() == [0, 0, 1]
    assert start.tolist() == [0.0, 20.0, 0.5]
    assert end.tolist() == [10.0, 21.0, 1.0]


def test_empty_plots_still_render() -> None:
    for plot in (TimelinePlot("empty", [], []), XYPlot("e", "x", "y", []), BarPlot("e", [], [], "v"),
                 HeatmapPlot("e", "x", "y", [], [], [], "z")):
        assert render_png(plot).startswith(PNG_SIGNATURE)


def test_heatmap_with_missing_cells_renders_and_leaves_them_blank() -> None:
    z: list[list[float | None]] = [[1.0, None], [None, 4.0]]
    img = _assert_drawn(render_png(HeatmapPlot("holes", "x", "y", ["a", "b"], ["c", "d"], z, "ms")))
    assert img.shape[2] in (3, 4)
    all_none = HeatmapPlot("none", "x", "y", ["a"], ["b"], [[None]], "ms")
    assert render_png(all_none).startswith(PNG_SIGNATURE)


def test_large_heatmap_renders_without_annotations() -> None:
    z: list[list[float | None]] = [[float(i * j) for j in range(30)] for i in range(20)]
    plot = HeatmapPlot("big", "x", "y", [str(j) for j in range(30)], [str(i) for i in range(20)], z, "v")
    _assert_drawn(render_png(plot))


def _report() -> tuple[Report, list[Plot]]:
    """Two sections, with a table between plots and colliding titles."""
    plots: list[Plot] = [_timeline(4), _xy(), _bars(), _heatmap(), _xy()]
    table = Table("numbers", ["a", "b"], [["1", "2"]])
    sections = [
        Section("Simulation: GPT-3 175B (TP=8, PP=16)!", "simulation", items=[plots[0], table, plots[1]]),
        Section("Sweep über Größen", "sweep", items=[plots[2], table, plots[3], plots[4]]),
        Section("", "comparison", items=[table]),
    ]
    return Report("report", sections), plots


def test_png_files_one_safe_uniquely_named_file_per_plot_in_page_order() -> None:
    report, plots = _report()
    files = png_files(report)
    names = list(files)
    assert len(names) == len(plots) == len(report.plots)  # tables skipped
    assert len(set(names)) == len(names)
    assert names == sorted(names)
    assert [int(n[:2]) for n in names] == list(range(1, len(plots) + 1))
    for name in names:
        assert re.fullmatch(r"\d\d-[a-z0-9-]+\.png", name), name
        assert "--" not in name
    assert names[0].startswith("01-simulation-gpt-3-175b-tp-8-pp-16-")
    assert names[2].startswith("03-sweep-uber-grossen-")
    assert files[names[1]] == render_png(plots[1])  # keyed to the right plot


def test_slugs_are_short_and_never_empty() -> None:
    assert png.slugify("  ***  ", "plot") == "plot"
    long = png.slugify("a very long title " * 10, "plot")
    assert len(long) <= png.SLUG_MAX and not long.endswith("-")
    assert png.slugify("Step time: TP × PP", "plot") == "step-time-tp-pp"


def test_require_matplotlib_explains_the_fix_when_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    require_matplotlib()  # installed here: no error
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, **k: None)
    with pytest.raises(ConfigError) as err:
        require_matplotlib("--png")
    assert err.value.field == "--png"
    assert "matplotlib" in err.value.problem and "pip install" in err.value.fix
    with pytest.raises(ConfigError):
        render_png(_xy())


def test_render_png_rejects_a_table() -> None:
    with pytest.raises(TypeError):
        render_png(Table("t", ["a"], [["1"]]))  # type: ignore[arg-type]
