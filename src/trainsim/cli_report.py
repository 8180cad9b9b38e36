"""`trainsim report INPUT... -o report.html`: one self-contained page (or one PNG per plot) from job YAMLs and
the --json outputs of simulate, replay, search, sweep and validate; several inputs make one page."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

import typer

from .errors import ConfigError
from .files import Outputs, OutputTarget, check_output_dir, write_outputs
from .report.figures import Report, Section
from .report.inputs import ReportInput, load_input

Opt = typer.Option
FORMATS = ("html", "png")
SAME_RESULT_RTOL = 1e-9  # a JSON re-simulated to draw its timeline must give its own iteration time back


def parse_axes(text: str | None, field: str = "--axes") -> tuple[str, str] | None:
    """`x,y`: the two keys of a search's or sweep's heat map."""
    if text is None:
        return None
    parts = [p.strip() for p in text.split(",")]
    if len(parts) != 2 or not all(parts) or parts[0] == parts[1]:
        raise ConfigError(field, f"'{text}' is not two different keys", "pass two keys such as --axes tp,pp")
    return parts[0], parts[1]


def _job_section(inp: ReportInput, quiet: bool) -> tuple[Section, dict[str, Any]]:
    """A job YAML: resolved as `simulate FILE` resolves it (degrees searched when none are given) and simulated."""
    from .api import simulate, simulation_json
    from .cli_search import resolve_job
    from .console import simulate_bar
    from .report.simulation_section import simulation_section

    job, searched, _ = resolve_job(inp.path, {}, quiet)
    with simulate_bar() as bar:
        result = simulate(job, progress=bar, timeline=True)
    data = simulation_json(job, result, searched)
    return simulation_section(data, result, source=inp.path), data


def _simulation_json_section(inp: ReportInput) -> tuple[Section, dict[str, Any]]:
    """A simulate JSON: its numbers as written; the timeline and memory over time from simulating its
    resolved job again, said when that no longer gives the same iteration time."""
    from .api import simulate
    from .config import parse_job
    from .console import simulate_bar
    from .report.simulation_section import simulation_section

    data = inp.data or {}
    job_data = data.get("job")
    if not isinstance(job_data, dict):
        return simulation_section(data, None, source=inp.path), data
    try:
        job = parse_job(job_data)
        with simulate_bar() as bar:
            result = simulate(job, progress=bar, timeline=True)
    except ConfigError as exc:  # a model or calibration file it names has gone: the file's numbers still stand
        return simulation_section(data, None, source=inp.path, notes=[
            f"No timeline: simulating this file's job again failed ({exc.one_line()})."]), data
    notes = []
    written = float(data["iteration_time_s"])
    if not math.isclose(result.iteration_time_s, written, rel_tol=SAME_RESULT_RTOL):
        notes.append(f"Simulating this job again gives {result.iteration_time_s:.6g} s per iteration, not the "
                     f"{written:.6g} s this file records (written by another trainsim version, or a calibration "
                     "or model file it names has changed): the timeline and memory plots are the new simulation's.")
    return simulation_section(data, result, source=inp.path, notes=notes), data


def _replay_section(inp: ReportInput) -> Section:
    """A replay JSON: the traces replayed again under its what-if (for the timelines), or its numbers alone
    when the traces are no longer there."""
    from .cli_replay import run_replay
    from .report.replay_section import replay_section

    data = inp.data or {}
    base = Path(inp.path).resolve().parent
    paths = []
    for p in data.get("paths") or []:
        cand = Path(p)
        paths.append(cand if cand.exists() else base / cand)
    if not paths or not all(p.exists() for p in paths):
        missing = next((str(p) for p in paths if not p.exists()), "no trace path")
        return replay_section(data, None, source=inp.path,
                              notes=[f"No timelines: {missing} is not there to replay again; the step numbers are "
                                     "the file's."])
    result = run_replay([str(p) for p in paths], data.get("what_if") or {})
    return replay_section(data, result, source=inp.path)


def build_report(inputs: list[ReportInput], axes: tuple[str, str] | None, quiet: bool, title: str | None
                 ) -> Report:
    """Every input's section in the order given, led by a comparison when several simulations are there."""
    from .report.compare_section import comparison_section
    from .report.study_sections import search_section, sweep_section
    from .report.validation_section import validation_section

    sections: list[Section] = []
    runs: list[tuple[str, dict[str, Any]]] = []
    for inp in inputs:
        if inp.kind == "simulation":
            sec, data = _job_section(inp, quiet) if inp.data is None else _simulation_json_section(inp)
            sections.append(sec)
            runs.append((Path(inp.path).name, data))
        elif inp.kind == "replay":
            sections.append(_replay_section(inp))
        elif inp.kind == "search":
            sections.append(search_section(inp.data or {}, axes, source=inp.path))
        elif inp.kind == "sweep":
            sections.append(sweep_section(inp.data or {}, axes, source=inp.path))
        else:
            sections.append(validation_section(inp.data or {}, source=inp.path))
    if len(runs) > 1:
        if len({label for label, _ in runs}) < len(runs):  # same file names from different folders
            runs = [(inp.path, d) for inp, (_, d) in zip([i for i in inputs if i.kind == "simulation"], runs,
                                                         strict=True)]
        sections.insert(0, comparison_section(runs))
    default = sections[0].title if len(sections) == 1 else f"{len(inputs)} results compared"
    return Report(title or f"trainsim report: {default}", sections)


def simulation_page(job: Any, result: Any, searched: dict[str, Any] | None, source: str) -> str:  # noqa: ANN401
    """`simulate --report`: the page of the run just simulated (no second simulation)."""
    from . import __version__
    from .api import simulation_json
    from .report.html import render_html
    from .report.simulation_section import simulation_section

    sec = simulation_section(simulation_json(job, result, searched), result, source=source)
    return render_html(Report(f"trainsim report: {sec.title}", [sec]), __version__)


def check_format(fmt: str) -> None:
    """The renderer is there before any input is read or simulated (HTML needs nothing beyond trainsim:
    plotly.js ships inside it; PNG needs matplotlib)."""
    if fmt not in FORMATS:
        raise ConfigError("--format", f"'{fmt}' is not one of {', '.join(FORMATS)}", "pass --format html or png")
    if fmt == "png":
        from .report.png import require_matplotlib

        require_matplotlib("--format png")


def write_report(report: Report, fmt: str, target: OutputTarget | Path) -> list[str]:
    """Render the page (html) or the images (png, one per plot) and write them through the shared writer,
    all or nothing; returns what was written."""
    from . import __version__

    if fmt == "html":
        from .report.html import render_html

        assert isinstance(target, OutputTarget)
        write_outputs({target: render_html(report, __version__)})
        return [target.path]
    from .report.png import png_files

    assert isinstance(target, Path)
    files = png_files(report)
    target.mkdir(exist_ok=True)  # after rendering: a failed render leaves no folder behind
    outs = Outputs()
    write_outputs({outs.add(target / name, "--out"): data for name, data in files.items()})
    return [str(target / name) for name in files]


def report_cmd(
    inputs: Annotated[list[str], typer.Argument(help="job YAMLs and --json outputs of simulate, replay, search, sweep "
                                                     "or validate (the kind is read from each file)",
                                                show_default=False)],
    out: Annotated[str | None, Opt("--out", "-o", help="the page (html; default report.html) or the folder of images "
                                                       "(png; default report-png)")] = None,
    fmt: Annotated[str, Opt("--format", help="html (one self-contained page) | png (one image per plot)")] = "html",
    axes: Annotated[str | None, Opt(help="the heat map's two keys for a search or sweep, e.g. tp,pp or "
                                         "strategy.tp,cluster.gpu (default: tp,pp for a search, else the two "
                                         "varied keys with the most values)")] = None,
    title: Annotated[str | None, Opt(help="the page's title")] = None,
    quiet: Annotated[bool, Opt("--quiet", "-q", help="no summary line")] = False,
) -> None:
    """One page that shows results at a glance: timelines, where the time goes, memory, fronts, errors."""
    check_format(fmt)
    if fmt == "html":
        target: OutputTarget | Path = Outputs().add("report.html" if out is None else out, "--out")  # type: ignore[assignment]
        if target.to_stdout:  # type: ignore[union-attr]
            raise ConfigError("--out", "a report is a file, not standard output", "pass a file such as report.html")
    else:
        target = check_output_dir("report-png" if out is None else out, "--out")
        if not target.parent.is_dir():  # one new folder at most, as a file output needs its folder
            raise ConfigError("--out", f"{target.parent} does not exist", "create it, or name a folder in an "
                              "existing one")
    pair = parse_axes(axes)
    loaded = [load_input(p) for p in inputs]  # every input read and checked before anything is simulated
    report = build_report(loaded, pair, quiet, title)
    written = write_report(report, fmt, target)
    if not quiet:
        n_plots = len(report.plots)
        where = written[0] if fmt == "html" else f"{len(written)} images in {target}"
        print(f"report: {len(report.sections)} section(s), {n_plots} plots -> {where}")
