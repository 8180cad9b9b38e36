"""The headless-Chromium report harness (tests/browser.py) on hand-written pages that follow the report contract."""

from __future__ import annotations

import base64
import gzip
import json
import math
import sys
import time
from functools import cache
from pathlib import Path

import pytest
from browser import chromium_path, is_blank, open_report, skip_reason

SKIP = skip_reason()
needs_browser = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")


@cache
def plotly_js() -> str:
    """plotly.js as shipped with the plotly Python package."""
    plotly_offline = pytest.importorskip("plotly.offline")
    return plotly_offline.get_plotlyjs()


def write_page(tmp_path: Path, body: str, head: str = "", name: str = "page.html") -> Path:
    """Write a minimal HTML page into TMP_PATH and return its path."""
    page = tmp_path / name
    page.write_text(f"<!doctype html><html><head><meta charset='utf-8'>{head}</head>"
                    f"<body>{body}</body></html>", encoding="utf-8")
    return page


@needs_browser
def test_scatter_page_is_drawn_and_offline(tmp_path: Path) -> None:
    """A one-scatter page: no errors, one trace of 3 points drawn as SVG marks, a table, a non-blank screenshot."""
    body = f"""
      <div class="ts-plot" id="plot-0" data-kind="xy" style="width:600px;height:400px"></div>
      <table class="ts-table"><tr><th>a</th></tr><tr><td>1</td></tr></table>
      <div class="ts-error"></div>
      <script>{plotly_js()}</script>
      <script>
        Plotly.newPlot('plot-0', [{{x: [1, 2, 3], y: [3, 1, 2], type: 'scatter', mode: 'lines+markers'}}])
          .then(() => {{ document.body.dataset.ready = '1'; }});
      </script>"""
    report = open_report(write_page(tmp_path, body), timeout_s=20)
    assert report.ready == "1", report.console_errors
    assert report.console_errors == []
    assert report.requests == []
    assert report.error_text == ""
    assert report.tables == 1
    [plot] = report.plots
    assert (plot["id"], plot["kind"], plot["traces"]) == ("plot-0", "xy", 1)
    assert plot["points"] >= 3
    assert plot["dom_marks"] > 0
    assert 0 < report.load_ms < 20_000
    assert report.screenshot_png.startswith(b"\x89PNG")
    assert not is_blank(report.screenshot_png)


@needs_browser
def test_gzip_plotly_bar_heatmap_and_empty_plot(tmp_path: Path) -> None:
    """plotly.js from a gzip+base64 blob (DecompressionStream) draws bar and heatmap marks; an empty plot has none."""
    np = pytest.importorskip("numpy")
    go = pytest.importorskip("plotly.graph_objects")
    blob = base64.b64encode(gzip.compress(plotly_js().encode("utf-8"))).decode("ascii")
    bar = json.loads(go.Figure(go.Bar(x=np.arange(4), y=np.array([3.0, 1.0, 4.0, 1.5]))).to_json())
    figures = {
        "plot-0": bar,  # numpy arrays arrive as plotly.py's {"dtype", "bdata"} typed-array specs
        "plot-1": {"data": [{"type": "heatmap", "z": [[1, 2, 3], [4, 5, 6]]}], "layout": {}},
        "plot-2": {"data": [{"type": "scatter", "x": [], "y": []}], "layout": {}},
    }
    divs = "".join(f'<div class="ts-plot" id="{pid}" data-kind="{kind}" style="width:500px;height:300px"></div>'
                   for pid, kind in zip(figures, ("bar", "heatmap", "xy"), strict=True))
    body = f"""{divs}<div class="ts-error"></div>
      <script id="plotly-gz" type="application/octet-stream">{blob}</script>
      <script>
        (async () => {{
          try {{
            const b64 = document.getElementById('plotly-gz').textContent.trim();
            const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
            const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip'));
            const lib = document.createElement('script');
            lib.textContent = await new Response(stream).text();
            document.head.appendChild(lib);
            const figures = {json.dumps(figures)};
            for (const [id, fig] of Object.entries(figures)) await Plotly.newPlot(id, fig.data, fig.layout);
            document.body.dataset.ready = '1';
          }} catch (e) {{
            document.querySelector('.ts-error').textContent = String(e);
            document.body.dataset.ready = 'error';
          }}
        }})();
      </script>"""
    report = open_report(write_page(tmp_path, body), timeout_s=20)
    assert report.ready == "1", (report.error_text, report.console_errors)
    assert report.console_errors == [] and report.requests == []
    by_id = {p["id"]: p for p in report.plots}
    assert by_id["plot-0"]["kind"] == "bar" and by_id["plot-0"]["traces"] == 1
    assert by_id["plot-0"]["points"] == 4 and by_id["plot-0"]["dom_marks"] == 4
    assert by_id["plot-1"]["points"] == 6 and by_id["plot-1"]["dom_marks"] >= 1
    assert by_id["plot-2"]["traces"] == 1
    assert by_id["plot-2"]["points"] == 0 and by_id["plot-2"]["dom_marks"] == 0


@needs_browser
def test_errors_and_network_requests_are_reported(tmp_path: Path) -> None:
    """console.error, an uncaught exception and a remote request all reach the report; ready="error" is read."""
    body = """
      <div class="ts-error"></div>
      <img src="https://cdn.example.invalid/logo.png">
      <script>
        console.error("boom");
        document.querySelector('.ts-error').textContent = 'plot-0 failed';
        document.body.dataset.ready = 'error';
        throw new Error("kaboom");
      </script>"""
    report = open_report(write_page(tmp_path, body), timeout_s=10)
    assert report.ready == "error"
    assert report.error_text == "plot-0 failed"
    assert math.isnan(report.load_ms)
    assert any("boom" in e and e.startswith("console:") for e in report.console_errors), report.console_errors
    assert any("kaboom" in e and e.startswith("pageerror:") for e in report.console_errors), report.console_errors
    assert report.requests == ["https://cdn.example.invalid/logo.png"]


@needs_browser
def test_page_that_never_gets_ready_returns_empty_ready(tmp_path: Path) -> None:
    """A page that never sets data-ready comes back with ready="" after the timeout instead of raising."""
    page = write_page(tmp_path, "<p>still drawing...</p>")
    started = time.monotonic()
    report = open_report(page, timeout_s=1.5)
    assert time.monotonic() - started < 15
    assert report.ready == ""
    assert math.isnan(report.load_ms)
    assert report.console_errors == []


@needs_browser
def test_blank_white_page_is_blank(tmp_path: Path) -> None:
    """The screenshot of an empty white page is one flat colour."""
    page = write_page(tmp_path, "<script>document.body.dataset.ready = '1';</script>",
                      head="<style>html, body { background: #fff; margin: 0; }</style>")
    report = open_report(page, timeout_s=10)
    assert report.ready == "1"
    assert report.plots == [] and report.tables == 0
    assert is_blank(report.screenshot_png)


def test_chromium_path_env_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """$TRAINSIM_CHROMIUM wins over the search; pointing it at nothing gives a skip reason naming it."""
    monkeypatch.setenv("TRAINSIM_CHROMIUM", sys.executable)
    assert chromium_path() == sys.executable
    missing = str(tmp_path / "no-such-chromium")
    monkeypatch.setenv("TRAINSIM_CHROMIUM", missing)
    assert chromium_path() is None
    reason = skip_reason()
    assert reason is not None and ("TRAINSIM_CHROMIUM" in reason or "playwright" in reason)
