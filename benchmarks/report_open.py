"""How heavy and how fast the HTML report is: its size, the seconds to build it, and the seconds headless
Chromium takes to draw every plot (median of --opens), split into its phases (inflating the embedded
library and figures, running plotly.js, drawing each plot).

    python benchmarks/report_open.py [--opens 3] [--replay TRACE]

Needs Debian's `chromium` and `pip install playwright` (tests/browser.py drives it). The issue's targets
for the default job: opens in < 2 s, weighs < 5 MB.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from trainsim.cli import main as trainsim

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from browser import LAUNCH_ARGS, chromium_path, skip_reason  # noqa: E402

PHASES_JS = """() => Object.fromEntries(performance.getEntriesByType('mark').map(m => [m.name, m.startTime]))"""


def open_times(path: Path, opens: int) -> list[dict[str, float]]:
    """Marks (ms since navigation) of each open: ts-start, ts-inflated, ts-plotly-loaded, ts-drawn-plot-N."""
    from playwright.sync_api import sync_playwright

    out = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium_path(), args=LAUNCH_ARGS, headless=True)
        try:
            for _ in range(opens):
                page = browser.new_page(viewport={"width": 1400, "height": 900})
                page.goto(path.resolve().as_uri())
                page.wait_for_selector("body[data-ready]", state="attached", timeout=60_000)
                assert page.evaluate("document.body.dataset.ready") == "1", "the page did not draw"
                out.append(page.evaluate(PHASES_JS))
                page.close()
        finally:
            browser.close()
    return out


def report_row(name: str, path: Path, build_s: float, opens: int) -> None:
    marks = open_times(path, opens)
    drawn = [max(v for k, v in m.items() if k.startswith("ts-drawn")) for m in marks]
    med = marks[drawn.index(statistics.median_low(drawn))]
    plots = sorted((k for k in med if k.startswith("ts-drawn")), key=lambda k: med[k])
    steps, prev = [], med["ts-plotly-loaded"]
    for k in plots:
        steps.append(f"{k.removeprefix('ts-drawn-')} {med[k] - prev:.0f}")
        prev = med[k]
    print(f"{name:<34} {path.stat().st_size / 1e6:6.2f} MB  build {build_s:5.2f} s  open {statistics.median(drawn) / 1e3:5.2f} s"
          f"  (min {min(drawn) / 1e3:.2f}, max {max(drawn) / 1e3:.2f}; inflate {med['ts-inflated'] - med['ts-start']:.0f} ms,"
          f" plotly.js {med['ts-plotly-loaded'] - med['ts-inflated']:.0f} ms, draw ms: {', '.join(steps)})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--opens", type=int, default=3)
    ap.add_argument("--replay", default=str(Path(__file__).resolve().parents[2] / "shared/traces/kineto/tb_plugin/"
                                            "samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"))
    args = ap.parse_args()
    if skip_reason() is not None:
        sys.exit(f"cannot open pages: {skip_reason()}")
    with tempfile.TemporaryDirectory() as d:
        page = Path(d) / "default.html"
        t0 = time.perf_counter()
        trainsim(["simulate", "-q", "--report", str(page)])
        report_row("default job (simulate --report)", page, time.perf_counter() - t0, args.opens)
        if Path(args.replay).exists():
            trainsim(["replay", args.replay, "--json", str(Path(d) / "replay.json")])
            page = Path(d) / "replay.html"
            t0 = time.perf_counter()
            trainsim(["report", str(Path(d) / "replay.json"), "-o", str(page), "-q"])
            report_row("replay of a ResNet-50 trace", page, time.perf_counter() - t0, args.opens)


if __name__ == "__main__":
    main()
