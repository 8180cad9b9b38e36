"""`trainsim replay | scale | optimize`: replay torch.profiler traces, predict data-parallel scaling from a
one-node profile (PerfEstimator), and search what-if knobs on a replay (dPRO)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from .files import Outputs, OutputTarget, Payload, json_text, write_outputs
from .replay import expand_traces

Opt = typer.Option
def _emit(json_target: OutputTarget | None, trace_target: OutputTarget | None, data: dict,
          trace_text: str | None = None) -> None:
    payloads: dict[OutputTarget | None, Payload] = {json_target: json_text(data, "--json")}
    if trace_target is not None and trace_text is not None:
        payloads[trace_target] = trace_text
    write_outputs(payloads)


def _ms(x: float) -> str:
    return f"{x:,.3f}"


def print_replay(result: object, console: Console) -> None:
    """The replay summary: steps per rank, the error, where the time goes, the critical path."""
    from .replay import ReplayResult

    assert isinstance(result, ReplayResult)
    t = Table(title=f"replay of {len(result.paths)} trace(s): error {result.replay_error_pct:.2f}% "
                    "(mean |replayed - measured| / measured)", title_justify="left")
    for col in ("rank", "step", "measured ms", "replayed ms", "error %"):
        t.add_column(col, justify="right")
    rows = result.steps if len(result.steps) <= 24 else [*result.steps[:12], *result.steps[-12:]]
    for s in rows:
        t.add_row(str(s.rank), str(s.step), _ms(s.measured_ms), _ms(s.replayed_ms), f"{s.error_pct:.2f}")
    console.print(t)
    if len(result.ranks) > 1:
        console.print(f"clock offsets (us, vs rank {result.ranks[0]}): " +
                      ", ".join(f"rank {r}: {v:+.1f}" for r, v in result.clock_offsets_us.items()), highlight=False)
    b = Table(title="where a step's time goes (ms per step, mean over steps and ranks)", title_justify="left")
    b.add_column("category")
    b.add_column("ms", justify="right")
    b.add_column("%", justify="right")
    total = sum(result.breakdown.values()) or 1.0
    for k, v in result.breakdown.items():
        b.add_row(k, _ms(v), f"{100 * v / total:.1f}")
    console.print(b)
    cp_total = sum(result.critical_path.values()) or 1.0
    console.print("critical path: " + ", ".join(f"{k} {100 * v / cp_total:.1f}%"
                                                for k, v in list(result.critical_path.items())[:6]), highlight=False)
    for a in result.assumptions:
        console.print(f"assumed: {a}", highlight=False, markup=False)


def replay_cmd(
    traces: Annotated[list[str], typer.Argument(help="torch.profiler traces, one per rank: files, a folder or a glob "
                                                     "(.json / .json.gz)", show_default=False)],
    json_out: Annotated[str | None, Opt("--json", help="write the replay as JSON ('-' for stdout)")] = None,
    trace_out: Annotated[str | None, Opt("--trace", help="write a Perfetto trace of the replay beside the original")]
        = None,
    modelled_latency: Annotated[bool, Opt("--modelled-latency", help="cut launch-bound kernels at launch + the median "
                                          "launch latency instead of their measured start")] = False,
) -> None:
    """Replay torch.profiler traces (one per rank) and compare each step with its measurement."""
    outs = Outputs()
    json_target = outs.add(json_out, "--json")
    trace_target = outs.add(trace_out, "--trace")
    paths = expand_traces(traces)  # refused before any work
    from .console import progress_bar
    from .replay import replay

    with progress_bar() as bar:
        task = bar.add_task(f"replaying {len(paths)} trace(s)", total=None)
        result = replay(paths, measured_latency=not modelled_latency,
                        progress=lambda done, total: bar.update(task, completed=done, total=total))
    trace_text = None
    if trace_target is not None:
        from .report.replay_perfetto import replay_trace_json

        trace_text = replay_trace_json(result)
    if not outs.to_stdout:
        print_replay(result, Console(width=None))
    _emit(json_target, trace_target, result.to_json(), trace_text)


__all__ = ["print_replay", "replay_cmd"]
