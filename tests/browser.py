"""Opening a self-contained HTML report in headless system Chromium (Playwright) and reading what tests assert."""

# The page contract: each plot is `<div class="ts-plot" id="plot-N" data-kind="...">` drawn by Plotly; the page
# sets `document.body.dataset.ready` to "1" when every plot is drawn, or to "error" with the message in `.ts-error`;
# tables are `<table class="ts-table">`. The page must be offline: the context is offline and requests are reported.

from __future__ import annotations

import contextlib
import importlib.util
import io
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome")
ENV_VAR = "TRAINSIM_CHROMIUM"
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu"]  # --no-sandbox: CI runs as root, where Chromium refuses to sandbox

# Installed before any page script: records performance.now() (ms since navigation start) when body gets
# data-ready="1"; MutationObserver callbacks run as a microtask right after the script that set it.
_READY_PROBE = """
(() => {
  const mark = () => {
    if (document.body && document.body.dataset.ready === '1' && window.__tsReadyAt === undefined)
      window.__tsReadyAt = performance.now();
  };
  new MutationObserver(mark).observe(document, {attributes: true, subtree: true, attributeFilter: ['data-ready']});
})();
"""

# Reads every `.ts-plot`: its Plotly traces, their data points and the SVG marks drawn for them.
_PLOTS_JS = """
() => {
  const SIZES = {i1: 1, u1: 1, u1c: 1, i2: 2, u2: 2, i4: 4, u4: 4, f4: 4, f8: 8};
  const len = (a) => {
    if (a === null || a === undefined || typeof a === 'string') return 0;
    if (typeof a === 'object' && typeof a.bdata === 'string') {  // plotly.py's base64 typed-array spec
      if (a.shape !== undefined) return String(a.shape).split(',').reduce((p, s) => p * Number(s), 1);
      const b64 = a.bdata.replace(/=+$/, '');
      return Math.floor(Math.floor(b64.length * 3 / 4) / (SIZES[a.dtype] || 8));
    }
    if (typeof a.length !== 'number') return 0;
    if (a.length > 0 && typeof a[0] === 'object' && a[0] !== null && typeof a[0].length === 'number')
      return Array.from(a).reduce((s, row) => s + len(row), 0);  // 2-D z: count cells
    return a.length;  // plain arrays and typed arrays alike
  };
  const tracePoints = (t) => Math.max(len(t.x), len(t.y), len(t.z), len(t.values));
  const shows = (path) => {
    const d = path.getAttribute('d');
    return !!d && d !== 'M0,0Z' && d !== 'M0,0';
  };
  const marks = (root) => {
    let n = 0;
    const count = (sel, keep = () => true) => {
      for (const e of root.querySelectorAll(sel)) if (keep(e)) n += 1;
    };
    count('.scatterlayer path.js-line', shows);
    count('.scatterlayer path.js-fill', shows);
    count('.scatterlayer path.point', shows);
    for (const layer of ['barlayer', 'waterfalllayer', 'funnellayer'])
      count('.' + layer + ' g.point > path', shows);
    count('.boxlayer path.box', shows);
    count('.violinlayer path.violin', shows);
    count('.heatmaplayer image');
    count('.imagelayer image');
    count('.contourlayer path', shows);
    count('.pielayer g.slice');
    count('.shapelayer path', shows);
    return n;
  };
  return Array.from(document.querySelectorAll('.ts-plot')).map((el) => {
    const gd = Array.isArray(el.data) ? el : (el.querySelector('.js-plotly-plot') || el);
    const data = Array.isArray(gd.data) ? gd.data : [];
    const full = Array.isArray(gd._fullData) && gd._fullData.length === data.length ? gd._fullData : data;
    return {
      id: el.id,
      kind: el.dataset.kind || '',
      traces: data.length,
      points: full.reduce((s, t) => s + tracePoints(t), 0),
      dom_marks: marks(el),
    };
  });
}
"""


@dataclass
class PageReport:
    """What a test asserts about one opened report page."""

    console_errors: list[str] = field(default_factory=list)
    ready: str = ""
    error_text: str = ""
    plots: list[dict] = field(default_factory=list)
    tables: int = 0
    screenshot_png: bytes = b""
    load_ms: float = math.nan
    requests: list[str] = field(default_factory=list)
    interaction: Any = None  # what open_report's `interact` returned


def chromium_path() -> str | None:
    """The system Chromium: $TRAINSIM_CHROMIUM if set, else the first of chromium, chromium-browser, google-chrome."""
    override = os.environ.get(ENV_VAR)
    if override:
        return shutil.which(override)
    for name in BROWSER_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def skip_reason() -> str | None:
    """None when Playwright and a Chromium are both present, else why browser tests cannot run and the fix."""
    if importlib.util.find_spec("playwright") is None:
        return ("no playwright: pip install playwright (the Python package only; the system Chromium is used, "
                "never `playwright install`)")
    if chromium_path() is None:
        override = os.environ.get(ENV_VAR)
        if override:
            return f"no Chromium: {ENV_VAR}={override!r} is not an executable"
        return f"no Chromium: apt-get install -y chromium (Debian's package), or set {ENV_VAR}"
    return None


def _is_network(url: str, page_url: str) -> bool:
    """Whether a request URL leaves the page: not the page itself, nor an in-page data:/blob: URL."""
    return url.split("#")[0] != page_url and not url.startswith(("data:", "blob:", "about:"))


def open_report(path: Path, timeout_s: float = 30, width: int = 1400,
                interact: Callable[[Any], Any] | None = None) -> PageReport:
    """Open PATH headless, wait up to TIMEOUT_S for body[data-ready], return what it showed (never ready: ready="");
    `interact(page)`, when given, runs on the drawn page (hover, zoom) and its return value is kept."""
    # Not ready in time is no exception: ready="" and load_ms NaN, so a test asserts on ready with console_errors.
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    executable = chromium_path()
    if executable is None:
        raise RuntimeError(skip_reason() or "no Chromium")
    url = Path(path).resolve().as_uri()
    report = PageReport()
    all_requests: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, args=LAUNCH_ARGS, headless=True)
        try:
            context = browser.new_context(viewport={"width": width, "height": 900}, offline=True)
            page = context.new_page()
            page.on("console", lambda m: report.console_errors.append(f"console: {m.text}")
                    if m.type == "error" else None)
            page.on("pageerror", lambda e: report.console_errors.append(f"pageerror: {e}"))
            page.on("requestfailed", lambda r: report.console_errors.append(
                f"requestfailed: {r.url} ({r.failure})") if _is_network(r.url, url) else None)
            page.on("request", lambda r: all_requests.append(r.url))
            page.add_init_script(_READY_PROBE)
            deadline = time.monotonic() + timeout_s
            started = time.perf_counter()
            page.goto(url, wait_until="commit", timeout=timeout_s * 1000)
            remaining_ms = max(1.0, (deadline - time.monotonic()) * 1000)
            with contextlib.suppress(PlaywrightTimeout):
                page.wait_for_selector("body[data-ready]", state="attached", timeout=remaining_ms)
            wall_ms = (time.perf_counter() - started) * 1000
            report.ready = page.evaluate("() => (document.body && document.body.dataset.ready) || ''")
            if report.ready == "1":
                at = page.evaluate("() => window.__tsReadyAt === undefined ? null : window.__tsReadyAt")
                report.load_ms = float(at) if at is not None else wall_ms
            report.error_text = page.evaluate(
                "() => Array.from(document.querySelectorAll('.ts-error')).map(e => e.innerText).join('\\n')")
            report.plots = page.evaluate(_PLOTS_JS)
            report.tables = page.evaluate("() => document.querySelectorAll('table.ts-table').length")
            report.screenshot_png = page.screenshot(full_page=True)
            if interact is not None and report.ready == "1":
                report.interaction = interact(page)
            report.requests = [u for u in all_requests if _is_network(u, url)]
        except PlaywrightError as exc:
            raise RuntimeError(f"{url}: {exc}") from exc
        finally:
            browser.close()
    return report


def is_blank(png: bytes) -> bool:
    """Whether a PNG is one flat colour (skips the test when neither matplotlib nor PIL can decode it)."""
    import numpy as np

    if importlib.util.find_spec("matplotlib") is not None:
        import matplotlib.image

        pixels = np.asarray(matplotlib.image.imread(io.BytesIO(png), format="png"), dtype=float)
    elif importlib.util.find_spec("PIL") is not None:
        from PIL import Image

        pixels = np.asarray(Image.open(io.BytesIO(png)).convert("RGBA"), dtype=float) / 255.0
    else:
        pytest.skip("is_blank needs matplotlib or PIL to decode the screenshot")
    flat = pixels.reshape(-1, pixels.shape[-1]) if pixels.ndim == 3 else pixels.reshape(-1, 1)
    return bool(flat.std(axis=0).max() < 1e-3 or len(np.unique(flat, axis=0)) < 2)
