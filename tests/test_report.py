"""The report's content: what each plot shows must be what the simulation, search, sweep, validation or
replay computed (tests/test_report_browser.py opens the pages in a real browser)."""

from __future__ import annotations

import base64
import gzip
import json
import re
from pathlib import Path

import numpy as np
import pytest
from cli_helpers import one_line_error

from trainsim import api
from trainsim.cli import main
from trainsim.compile.program import Stream
from trainsim.errors import ConfigError
from trainsim.report.figures import BarPlot, HeatmapPlot, Report, Table, TimelinePlot, XYPlot
from trainsim.report.html import plotly_js_gz, render_html
from trainsim.report.inputs import json_kind, load_input
from trainsim.report.simulation_section import MIN_GAP_FRACTION, simulation_section
from trainsim.report.study_sections import search_section, sweep_section
from trainsim.report.validation_section import validation_section
from trainsim.sim.result import critical_path

SMALL = ["--model", "gpt2", "--cluster", "pcie-titanxp", "--nodes", "1"]
SMALL_JOB = {"model": {"name": "gpt2"}, "cluster": {"name": "pcie-titanxp", "nodes": 1},
             "strategy": {"tp": 2, "pp": 2, "dp": 2, "global_batch": 16, "micro_batch": 2}}
GIB = 2**30


@pytest.fixture(scope="module")
def small() -> tuple:
    job = api.parse_job(SMALL_JOB)
    result = api.simulate(job)
    return result, api.simulation_json(job, result)


def _plot(items: list, kind: type, title: str = "") -> object:
    return next(i for i in items if isinstance(i, kind) and title in i.title)


def _rows_of(tl: TimelinePlot, name: str) -> list[int]:
    return [i for i, r in enumerate(tl.rows) if r.endswith(name)]


def test_timeline_bars_are_the_schedule(small: tuple) -> None:
    """Every row holds its queue's tasks: the drawn time of each row (waits aside) is the tasks' run time;
    bars on a row never overlap; the compute row's waits fill the iteration up to the undrawn tiny gaps."""
    result, data = small
    sec = simulation_section(data, result)
    tl = _plot(sec.items, TimelinePlot)
    g, tr = result.graph, result.trace
    assert len(tl.rows) == sum(1 for (c, _), q in g.queues.items() if q)
    spans: dict[int, list[tuple[float, float, str]]] = {}
    for grp in tl.groups:
        for r, s, e in zip(grp.row.tolist(), grp.start_ms.tolist(), grp.end_ms.tolist(), strict=True):
            spans.setdefault(r, []).append((s, e, grp.name))
    for (c, stream), q in g.queues.items():
        row = tl.rows.index(next(r for r in tl.rows if r.startswith(g.classes[c].name + " ")
                                 and r.endswith(g.stream_name(stream))))
        bars = sorted(spans.get(row, []))
        busy = sum(e - s for s, e, name in bars if name != "waiting (bubble)")
        assert busy == pytest.approx(sum(tr.end_s[t] - tr.start_s[t] for t in q) * 1e3, rel=1e-9)
        assert all(b[0] >= a[1] - 1e-9 for a, b in zip(bars, bars[1:], strict=False)), "bars overlap"
        if stream == Stream.COMPUTE:
            drawn = sum(e - s for s, e, _ in bars)
            t_ms = result.iteration_time_s * 1e3
            assert t_ms * (1 - MIN_GAP_FRACTION * (len(q) + 1)) <= drawn <= t_ms * (1 + 1e-12)


def test_fused_tasks_split_in_their_parts(small: tuple) -> None:
    """A fused chunk's TP share is drawn as TP: the drawn TP time equals the breakdown's split of the tasks."""
    from trainsim.sim.result import task_parts

    result, data = small
    tl = _plot(simulation_section(data, result).items, TimelinePlot)
    g, tr = result.graph, result.trace
    want = sum(v * len(g.participants[t]) for t in range(len(g)) for k, v in task_parts(g, tr, t) if k == "tp")
    drawn = sum(float((grp.end_ms - grp.start_ms).sum()) for grp in tl.groups if grp.name == "TP collectives")
    assert want > 0 and drawn == pytest.approx(want * 1e3, rel=1e-9)


def test_critical_path_overlay_is_the_critical_path(small: tuple) -> None:
    result, data = small
    tl = _plot(simulation_section(data, result).items, TimelinePlot)
    path = critical_path(result.graph, result.trace)
    tr = result.trace
    n = [len(result.graph.participants[t]) for t in path]
    assert tl.overlay is not None and len(tl.overlay) == sum(n)
    drawn = float((tl.overlay.end_ms - tl.overlay.start_ms).sum())
    assert drawn == pytest.approx(sum(k * (tr.end_s[t] - tr.start_s[t]) for k, t in zip(n, path, strict=True)) * 1e3)
    assert float(tl.overlay.end_ms.max()) == pytest.approx(result.iteration_time_s * 1e3)


def test_memory_plot_peaks_are_the_stage_peaks(small: tuple) -> None:
    """Memory over the iteration reaches each class's reported peak and starts at its static memory."""
    result, data = small
    mem = _plot(simulation_section(data, result).items, XYPlot, "Memory over")
    assert len(mem.series) == len(result.graph.classes) == len(result.memory)
    for s, m in zip(mem.series, result.memory, strict=True):
        assert max(s.y) == pytest.approx(m.peak_bytes / GIB, rel=1e-9)
        assert s.y[0] == pytest.approx(m.static_bytes / GIB, rel=1e-9)
        assert s.x[-1] == pytest.approx(result.iteration_time_s * 1e3)
    (cap, label, _), = mem.hlines
    assert cap == pytest.approx(result.memory[0].capacity_bytes / GIB) and "OOM" in label


def test_breakdown_bars_sum_to_each_stage(small: tuple) -> None:
    result, data = small
    bars = _plot(simulation_section(data, result).items, BarPlot, "Where the time goes")
    for i, per in enumerate(data["breakdown_per_stage"]):
        assert sum(v[i] for _, v, _ in bars.stacks) == pytest.approx(sum(per.values()), rel=1e-9)


def test_json_alone_gives_the_numbers_and_says_no_timeline(small: tuple) -> None:
    _, data = small
    sec = simulation_section({k: v for k, v in data.items() if k != "job"}, None)
    assert not any(isinstance(i, TimelinePlot) for i in sec.items)
    assert any("No timeline" in n for n in sec.notes)
    job = _plot(sec.items, Table, "The job")
    assert ["resolved.tp", "2"] in job.rows


@pytest.mark.parametrize("argv", [
    [*SMALL, "--tp", "2", "--pp", "2"],
    ["--model", "gpt2", "--cluster", "dgx-a100", "--gpus-per-node", "4", "--nodes", "2", "--tp", "2"],
    ["--model", "gpt2", "--cluster", "conv-4d", "--tp", "4", "--pp", "2", "--global-batch", "512"],
    ["--model", "gpt2", "--topology", "Ring(4)_Switch(2)", "--bandwidth", "100,25", "--latency", "500,500", "--tp", "2"],
    ["--model", "gpt2", "--cluster", "dgx-a100", "--dp", "16", "--global-batch", "32"],
])
def test_simulate_json_carries_kind_and_a_job_that_reproduces_it(argv: list[str], tmp_path: Path) -> None:
    """The JSON's `job` is the job as it ran: simulated again (what the report does) it gives the same iteration
    on the same GPUs, whatever the flags derived (dp, nodes, a node size, a topology preset as the cluster)."""
    out = tmp_path / "sim.json"
    main(["simulate", "-q", *argv, "--json", str(out)])
    data = json.loads(out.read_text())
    assert data["kind"] == "simulation" and json_kind(data, "f") == "simulation"
    again = api.simulate(api.parse_job(data["job"]))
    assert again.iteration_time_s == data["iteration_time_s"] and again.n_gpus == data["n_gpus"]


def test_sweep_heatmap_is_the_best_per_cell() -> None:
    rows = [{"tp": t, "nic": n, "gpu": gpu, "n_gpus": 8, "tokens_per_s": 8.0 * (t * 10 + n + (gpu == "h100")),
             "fits": not (t == 4 and n == 1), "iteration_time_s": 1.0, "mfu": 0.5, "memory_headroom_gib": 1.0 * t}
            for t in (1, 2, 4) for n in (1, 2) for gpu in ("a100", "h100")]
    sec = sweep_section({"kind": "sweep", "rows": rows, "varied": ["tp", "nic", "gpu"]}, ("tp", "nic"))
    hm = _plot(sec.items, HeatmapPlot)
    assert hm.x == ["1", "2", "4"] and hm.y == ["1", "2"]
    for yi, n in enumerate((1, 2)):
        for xi, t in enumerate((1, 2, 4)):
            want = None if (t == 4 and n == 1) else t * 10 + n + 1  # best over gpu, per GPU; OOM is blank
            assert hm.z[yi][xi] == want
    top = _plot(sec.items, Table)
    assert top.rows[0][:3] == ["4", "2", "h100"] and top.rows[-1][-1] == "OOM"


def test_sweep_axes_must_be_columns() -> None:
    rows = [{"tp": t, "gpu": g, "tokens_per_s": 1.0} for t in (1, 2) for g in ("a", "b")]
    with pytest.raises(ConfigError, match="--axes"):
        sweep_section({"rows": rows}, ("tp", "nosuch"))
    hm = _plot(sweep_section({"rows": rows}, ("strategy.tp", "cluster.gpu")).items, HeatmapPlot)  # grid keys
    assert (hm.x_label, hm.y_label) == ("tp", "gpu")


def test_search_section_counts_and_front() -> None:
    sim = [{"strategy": {"tp": t, "pp": p, "dp": 8 // (t * p), "micro_batch": 1, "recompute": "none", "zero": 1},
            "n_gpus": 8, "iteration_time_s": 1.0, "tokens_per_s": 100.0 * t + p, "mfu": 0.4,
            "memory_headroom_gib": 10.0 / t + p, "fits": True} for t in (1, 2, 4) for p in (1, 2)]
    data = {"kind": "search", "best": sim[-1], "top": sim[:3], "simulated": sim, "pruned": {"divisibility": 900,
            "throughput_bound": 40}, "space": 946, "evaluated": 6, "proven_optimal": True}
    sec = search_section(data)
    counts = _plot(sec.items, BarPlot, "settled")
    assert counts.categories == ["divisibility", "throughput_bound", "simulated"]
    assert counts.stacks[0][1] == [900, 40, 6] and counts.log_value
    hm = _plot(sec.items, HeatmapPlot)
    assert (hm.x_label, hm.y_label) == ("tp", "pp") and hm.z[1][2] == pytest.approx((400 + 2) / 8)
    front = _plot(sec.items, XYPlot, "headroom").series[1]
    pts = list(zip(front.x, front.y, strict=True))
    assert all(not (x2 >= x1 and y2 >= y1 and (x2, y2) != (x1, y1)) for x1, y1 in pts for x2, y2 in pts), \
        "a front point is beaten in both coordinates"


def test_validation_section_numbers() -> None:
    rows = [{"row": i, "case_id": f"c{i}", "metric": "tflops_per_gpu", "predicted": 100.0 * (1 + e / 100),
             "measured": 100.0, "error_pct": e, "group": f"g{i % 2}"} for i, e in enumerate((-5.0, 8.0, 20.0, -12.0))]
    sec = validation_section({"kind": "training_runs", "summary": {"n": 4}, "rows": rows})
    cards = dict(sec.cards)
    assert cards["MAPE"] == "11.25%" and cards["within +-10%"] == "50%"
    sc = _plot(sec.items, XYPlot, "Predicted")
    lo, hi = sc.series[0], sc.series[1]
    assert lo.y == pytest.approx([v * 0.9 for v in lo.x]) and hi.y == pytest.approx([v * 1.1 for v in hi.x])
    assert hi.fill_to_previous and "2 of 4 rows" in sc.caption
    groups = _plot(sec.items, BarPlot, "Error by")
    mape = dict(zip(groups.categories, groups.stacks[0][1], strict=True))
    assert mape == {"g0 (2)": pytest.approx(12.5), "g1 (2)": pytest.approx(10.0)}
    worst = _plot(sec.items, Table, "worst")
    assert worst.rows[0][1] == "c2"


def test_page_is_self_contained_and_deterministic(small: tuple) -> None:
    result, data = small
    report = Report("t", [simulation_section(data, result)])
    page = render_html(report, "0")
    assert page == render_html(report, "0")
    blobs = dict(re.findall(r'<script id="(ts-[a-z]+)" type="application/octet-stream">([^<]*)</script>', page))
    assert base64.b64decode(blobs["ts-plotly"]) == plotly_js_gz()
    assert gzip.decompress(plotly_js_gz()).startswith(b"/**\n* plotly.js (cartesian")
    figures = json.loads(gzip.decompress(base64.b64decode(blobs["ts-figures"])))
    ids = re.findall(r'<div class="ts-plot" id="(plot-\d+)"', page)
    assert [f["id"] for f in figures] == ids and len(ids) == len(report.plots)
    tl = next(f for f in figures if "timeline" in f)["timeline"]
    assert len(tl["bars"]["s"]) == sum(len(g) for g in report.plots[0].groups)
    assert not re.search(r'<(script|link|img)[^>]+(src|href)=', page), "the page must load nothing"


def test_load_input_kinds_and_refusals(tmp_path: Path, small: tuple) -> None:
    _, data = small
    for kind, doc in (("simulation", data), ("search", {"best": None, "pruned": {}}),
                      ("sweep", {"study": "s", "rows": []}), ("validation", {"kind": "vtrain", "summary": {}, "rows": []}),
                      ("replay", {"kind": "replay", "steps": [], "replay_error_pct": 0.0})):
        p = tmp_path / f"{kind}.json"
        p.write_text(json.dumps(doc))
        assert load_input(str(p)).kind == kind
    assert load_input("job.yaml").kind == "simulation"
    bad = tmp_path / "bad.json"
    for doc, words in (([], "JSON list"), ({"x": 1}, "not a trainsim result"),
                       ({**data, "iteration_time_s": -1}, "iteration_time_s"),
                       ({"kind": "sweep", "rows": [{"tokens_per_s": "fast"}]}, "rows.0.tokens_per_s")):
        bad.write_text(json.dumps(doc))
        with pytest.raises(ConfigError, match=re.escape(words)):
            load_input(str(bad))


def test_cli_report_html_and_png(tmp_path: Path, small: tuple, capsys: pytest.CaptureFixture[str]) -> None:
    _, data = small
    sim = tmp_path / "sim.json"
    sim.write_text(json.dumps(data))
    job = tmp_path / "job.yaml"
    job.write_text(json.dumps(SMALL_JOB))  # JSON is YAML
    main(["report", str(sim), str(job), "-o", str(tmp_path / "r.html")])
    out = capsys.readouterr().out
    assert "3 section(s)" in out  # the comparison first, then each input
    assert (tmp_path / "r.html").stat().st_size > 500_000
    main(["report", str(sim), "--format", "png", "-o", str(tmp_path / "png"), "-q"])
    files = sorted(p.name for p in (tmp_path / "png").iterdir())
    assert files and all(re.fullmatch(r"\d\d-[a-z0-9-]+\.png", f) for f in files)
    assert all((tmp_path / "png" / f).read_bytes().startswith(b"\x89PNG") for f in files)


def test_resimulated_json_that_moved_says_so(tmp_path: Path, small: tuple) -> None:
    from trainsim.cli_report import build_report

    _, data = small
    p = tmp_path / "old.json"
    p.write_text(json.dumps({**data, "iteration_time_s": data["iteration_time_s"] * 1.5}))
    report = build_report([load_input(str(p))], None, True, None)
    assert any("not the" in n for n in report.sections[0].notes)
    p.write_text(json.dumps(data))
    assert not build_report([load_input(str(p))], None, True, None).sections[0].notes
    gone = {**data, "job": {**data["job"], "simulation": {"calibration": str(tmp_path / "gone.yaml")}}}
    p.write_text(json.dumps(gone))  # a file the job names has gone: the numbers stay, the page says why
    sec = build_report([load_input(str(p))], None, True, None).sections[0]
    assert not any(isinstance(i, TimelinePlot) for i in sec.items)
    assert len(sec.notes) == 1 and "No timeline" in sec.notes[0] and "gone.yaml" in sec.notes[0]


def test_cli_refusals_write_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.html"
    garbage = tmp_path / "g.json"
    garbage.write_text("{")
    assert "INPUT" in one_line_error(["report", str(garbage), "-o", str(out)], capsys)
    assert "--axes" in one_line_error(["report", str(garbage), "--axes", "tp", "-o", str(out)], capsys)
    assert "--format" in one_line_error(["report", str(garbage), "--format", "svg", "-o", str(out)], capsys)
    assert "--out" in one_line_error(["report", str(garbage), "-o", "-"], capsys)
    assert "does not exist" in one_line_error(["report", str(garbage), "--format", "png", "-o",
                                                str(tmp_path / "missing" / "png")], capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.json"]


def test_simulate_report_writes_the_page(tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    main(["simulate", "--model", "gpt2", "--cluster", "pcie-titanxp", "--nodes", "1", "--tp", "2", "--pp", "2",
          "-q", "--report", str(out)])
    page = out.read_text()
    assert page.count('class="ts-plot"') == 5 and 'data-kind="timeline"' in page


def test_replay_section_lays_measured_above_replayed() -> None:
    """The measured GPU kernels drawn are the trace's kernels (count and total time); each rank's replayed
    rows follow its measured rows."""
    from trainsim.replay import replay
    from trainsim.report.replay_section import replay_section

    trace = Path(__file__).resolve().parents[2] / "shared/traces/param/et_replay/tests/inputs/linear_kineto.json.gz"
    if not trace.exists():
        pytest.skip(f"{trace} is not there (../shared beside the clone)")
    result = replay([str(trace)])
    sec = replay_section(result.to_json(), result)
    tl = _plot(sec.items, TimelinePlot)
    gpu = result.graphs.ranks[0].trace.gpu
    measured_rows = {i for i, r in enumerate(tl.rows) if " measured · gpu" in r}
    drawn = [(e - s) for grp in tl.groups for r, s, e in zip(grp.row, grp.start_ms, grp.end_ms, strict=True)
             if r in measured_rows]
    assert len(drawn) == len(gpu) and sum(drawn) == pytest.approx(float(np.sum(gpu.dur_us)) / 1e3, rel=1e-9)
    first_replayed = min(i for i, r in enumerate(tl.rows) if " replayed · " in r)
    assert max(measured_rows) < first_replayed
    steps = _plot(sec.items, BarPlot, "Each step")
    assert [n for n, _, _ in steps.stacks] == ["measured", "replayed"]


def test_timeline_keeps_the_pipeline_ends_under_its_caps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the class cap the first classes and the last are drawn, and the caption says so; a task cap
    drops classes from the middle."""
    from trainsim.report import simulation_section as ss

    job = api.parse_job({**SMALL_JOB, "strategy": {**SMALL_JOB["strategy"], "tp": 1, "pp": 4}})
    result = api.simulate(job)
    data = api.simulation_json(job, result)
    monkeypatch.setattr(ss, "MAX_TIMELINE_CLASSES", 3)
    tl = _plot(ss.simulation_section(data, result).items, TimelinePlot)
    assert sorted({r.split(" ")[0] for r in tl.rows}) == ["stage0", "stage1", "stage3"]
    assert "Showing 3 of 4 rank classes" in tl.caption
    monkeypatch.setattr(ss, "MAX_TIMELINE_TASKS", 1)
    tl = _plot(ss.simulation_section(data, result).items, TimelinePlot)
    assert sorted({r.split(" ")[0] for r in tl.rows}) == ["stage0", "stage3"]
    mem = _plot(ss.simulation_section(data, result).items, XYPlot, "Memory over")
    assert [s.name for s in mem.series] == ["stage0 (x2)", "stage3 (x2)"]
