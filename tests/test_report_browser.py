"""Every kind of report opened in headless Chromium (Debian's `chromium`, driven by Playwright; .ci/run
installs it): the page draws with no console error and no network request, every plot has data in the DOM,
the screenshot is not blank; the timeline answers a hover and a zoom."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import pytest
from browser import is_blank, open_report, skip_reason

from trainsim.cli import main

SKIP = skip_reason()
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")

SHARED = Path(__file__).resolve().parents[2] / "shared"
SMALL = ["--model", "gpt2", "--cluster", "pcie-titanxp", "--nodes", "1"]
SWEEP = """
base:
  model: {name: gpt2}
  cluster: {name: pcie-titanxp, nodes: 1}
  strategy: {global_batch: 16, micro_batch: 2}
grid:
  strategy.tp: [1, 2, 4]
  strategy.pp: [1, 2]
  cluster.gpu: [titan-xp, v100]
"""


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One page of each kind, made the way a user makes them (the commands' --json, then `trainsim report`)."""
    d = tmp_path_factory.mktemp("reports")
    out: dict[str, Path] = {}

    def report(name: str, *inputs: str) -> None:
        out[name] = d / f"{name}.html"
        main(["report", *inputs, "-o", str(out[name]), "-q"])

    out["default job"] = d / "default.html"
    main(["simulate", "-q", "--report", str(out["default job"])])
    (d / "sweep.yaml").write_text(SWEEP)
    main(["sweep", str(d / "sweep.yaml"), "--json", str(d / "sweep.json"), "--jobs", "1", "-q"])
    report("sweep", str(d / "sweep.json"))
    (d / "space.yaml").write_text("tp: [1, 2]\npp: [1, 2]\nzero: [1]\nrecompute: [none]\n")
    main(["search", *SMALL, "--space", str(d / "space.yaml"), "--json", str(d / "search.json"), "--jobs", "1",
          "-q"])
    report("search", str(d / "search.json"))
    runs = SHARED / "validation" / "training_runs.csv"
    if runs.exists():  # the first rows of the shared file (CI has ../shared beside the clone)
        text = runs.read_text(encoding="utf-8-sig")
        rows = list(csv.reader(io.StringIO(text)))
        buf = io.StringIO()
        csv.writer(buf).writerows(rows[:13])
        (d / "runs.csv").write_text(buf.getvalue())
        main(["validate", str(d / "runs.csv"), "--json", str(d / "validate.json"), "--jobs", "1", "-q"])
        report("validation", str(d / "validate.json"))
    trace = SHARED / "traces/param/et_replay/tests/inputs/linear_kineto.json.gz"
    if trace.exists():
        main(["replay", str(trace), "--json", str(d / "replay.json"), "--network-speedup", "2"])
        report("replay", str(d / "replay.json"))
    for name, tp in (("a", "2"), ("b", "4")):
        main(["simulate", *SMALL, "--tp", tp, "--pp", "2", "-q", "--dump-config", str(d / f"{name}.yaml")])
    report("comparison", str(d / "a.yaml"), str(d / "b.yaml"))
    return out


KINDS = ["default job", "sweep", "search", "validation", "replay", "comparison"]


@pytest.mark.parametrize("kind", KINDS)
def test_each_report_draws_offline_with_data(kind: str, pages: dict[str, Path]) -> None:
    if kind not in pages:
        pytest.skip(f"{kind}: its input is in ../shared, which is not beside this clone")
    page = open_report(pages[kind])
    assert page.ready == "1", (page.error_text, page.console_errors)
    assert page.console_errors == [] and page.error_text == ""
    assert page.requests == [], "the report must open offline"
    assert page.plots, "no plot on the page"
    empty = [p for p in page.plots if p["points"] == 0 or p["dom_marks"] == 0]
    assert not empty, f"plots with no data drawn: {empty}"
    assert page.tables >= 1
    assert not is_blank(page.screenshot_png)


def _hover_and_zoom(page: Any) -> dict:  # noqa: ANN401 - a Playwright page
    """Hover the middle of the first compute row, then zoom the x axis to its first tenth."""
    geo = page.evaluate("""() => { const gd = document.getElementById('plot-0'), fl = gd._fullLayout,
        r = gd.getBoundingClientRect();
        return {x: r.left + fl._size.l + fl._size.w / 2, y: r.top + fl._size.t + fl.yaxis.c2p(0),
                range: fl.xaxis.range.slice()}; }""")
    page.mouse.move(geo["x"], geo["y"])
    tip = page.evaluate("() => { const t = document.querySelector('.ts-tip'); "
                        "return t && t.style.display === 'block' ? t.innerText : ''; }")
    lo, hi = geo["range"]
    page.evaluate(f"() => Plotly.relayout('plot-0', {{'xaxis.range[0]': {lo}, 'xaxis.range[1]': {lo + (hi - lo) / 10}}})")
    page.wait_for_timeout(300)
    after = page.evaluate("() => document.getElementById('plot-0')._fullLayout.xaxis.range.slice()")
    return {"tip": tip, "range": geo["range"], "after": after}


def test_timeline_hover_names_the_bar_and_zoom_redraws(pages: dict[str, Path]) -> None:
    page = open_report(pages["default job"], interact=_hover_and_zoom)
    got = page.interaction
    assert page.console_errors == []
    lines = got["tip"].splitlines()
    assert len(lines) == 3 and lines[2].endswith(" ms)"), got["tip"]  # name, category, start - end (duration)
    assert lines[1].split(" · ")[0] in {"compute", "TP collectives", "waiting (bubble)", "recompute"}
    lo, hi = got["range"]
    assert got["after"][1] == pytest.approx(lo + (hi - lo) / 10)


def test_default_job_report_weighs_under_5_mb(pages: dict[str, Path]) -> None:
    """The acceptance's size bound (its time bound is measured by benchmarks/report_open.py: tests time nothing)."""
    size = pages["default job"].stat().st_size
    assert size < 5 * 2**20, f"the default job's report weighs {size / 2**20:.2f} MiB"
