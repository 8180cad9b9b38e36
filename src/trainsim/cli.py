"""Command line: `trainsim simulate | validate | calibrate | models | clusters`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from .config import DEFAULT_JOB, dump_yaml, load_yaml, merge, parse_job
from .errors import ConfigError

app = typer.Typer(add_completion=False, no_args_is_help=False, pretty_exceptions_enable=False,
                  help="Predict distributed training performance before paying for the GPUs.")

Opt = typer.Option


def _write_atomic(path: Path, text: str) -> None:
    try:
        tmp = path.with_name(path.name + ".part")
        tmp.write_text(text)
        tmp.replace(path)
    except OSError as exc:
        raise ConfigError(str(path), f"cannot write: {exc.strerror}", "choose a writable path") from None


@app.command()
def simulate(
    config: Annotated[Path | None, typer.Argument(help="YAML job file (model/cluster/strategy/simulation)")] = None,
    model: Annotated[str | None, Opt(help="model name (trainsim models) or 'custom'")] = None,
    cluster: Annotated[str | None, Opt(help="cluster preset (trainsim clusters)")] = None,
    nodes: Annotated[int | None, Opt(help="number of nodes (default: what the degrees need)")] = None,
    gpu: Annotated[str | None, Opt(help="replace the preset's GPU (e.g. h100-sxm)")] = None,
    gpus_per_node: Annotated[int | None, Opt(help="GPUs per node (switch-based presets)")] = None,
    intra_node_gbps: Annotated[float | None, Opt(help="NVLink GB/s per GPU per direction")] = None,
    nics_per_node: Annotated[int | None, Opt(help="network NICs per node")] = None,
    nic_gbps: Annotated[float | None, Opt(help="GB/s per NIC per direction (400 Gb/s = 50)")] = None,
    dp: Annotated[int | None, Opt(help="data-parallel degree (default: GPUs / (tp*pp*cp))")] = None,
    tp: Annotated[int | None, Opt(help="tensor-parallel degree (Megatron column/row)")] = None,
    pp: Annotated[int | None, Opt(help="pipeline-parallel degree")] = None,
    cp: Annotated[int | None, Opt(help="context-parallel degree")] = None,
    ep: Annotated[int | None, Opt(help="expert-parallel degree (MoE; divides dp)")] = None,
    vpp: Annotated[int | None, Opt(help="virtual stages per pipeline rank (interleaved 1F1B)")] = None,
    sp: Annotated[bool | None, Opt("--sp/--no-sp", help="sequence parallelism with TP")] = None,
    zero: Annotated[int | None, Opt(help="ZeRO stage 0-3")] = None,
    fsdp: Annotated[bool | None, Opt("--fsdp/--no-fsdp", help="FSDP full shard (= ZeRO-3)")] = None,
    recompute: Annotated[str | None, Opt(help="none | selective | full")] = None,
    schedule: Annotated[str | None, Opt(help="gpipe | 1f1b | interleaved")] = None,
    micro_batch: Annotated[int | None, Opt(help="micro-batch size per data-parallel rank")] = None,
    global_batch: Annotated[int | None, Opt(help="global batch (sequences/samples per iteration)")] = None,
    overlap_grad_reduce: Annotated[bool | None, Opt("--overlap-grad-reduce/--no-overlap-grad-reduce",
                                                    help="overlap DP gradient sync with backward")] = None,
    overlap_param_gather: Annotated[bool | None, Opt("--overlap-param-gather/--no-overlap-param-gather",
                                                     help="ZeRO/distributed-optimizer parameter all-gather "
                                                          "overlapped with the next forward")] = None,
    tp_comm_overlap: Annotated[bool | None, Opt("--tp-comm-overlap/--no-tp-comm-overlap",
                                                help="TP all-gather/reduce-scatter pipelined with the GEMMs "
                                                     "they feed (Megatron --tp-comm-overlap)")] = None,
    seq_len: Annotated[int | None, Opt(help="sequence length (tokens)")] = None,
    layers: Annotated[int | None, Opt(help="override/define number of layers")] = None,
    hidden: Annotated[int | None, Opt(help="override/define hidden size")] = None,
    heads: Annotated[int | None, Opt(help="override/define attention heads")] = None,
    kv_heads: Annotated[int | None, Opt(help="override/define kv heads (GQA)")] = None,
    ffn: Annotated[int | None, Opt(help="override/define FFN hidden size")] = None,
    vocab: Annotated[int | None, Opt(help="override/define vocabulary size")] = None,
    attention: Annotated[str | None, Opt(help="flash | unfused")] = None,
    dtype: Annotated[str | None, Opt(help="bf16 | fp16 | fp8 | tf32 | fp32")] = None,
    gamma: Annotated[float | None, Opt(help="compute slowdown while overlapped with grad comm (Proteus)")] = None,
    exact: Annotated[bool | None, Opt("--exact/--symmetric", help="simulate every rank (slow) or rank classes")] = None,
    granularity: Annotated[str | None, Opt(help="auto | layer | op (task granularity)")] = None,
    calibration: Annotated[Path | None, Opt(help="calibration YAML from `trainsim calibrate`")] = None,
    json_out: Annotated[Path | None, Opt("--json", help="write the result summary as JSON")] = None,
    trace: Annotated[Path | None, Opt(help="write a Chrome/Perfetto trace JSON")] = None,
    dump_config: Annotated[Path | None, Opt(help="write the resolved job as YAML")] = None,
    quiet: Annotated[bool, Opt("--quiet", "-q", help="no summary on stdout")] = False,
) -> None:
    """Predict one training iteration (no arguments: GPT-3 175B on 1024 A100-80GB, Megatron 3D parallel)."""
    flags: dict[str, Any] = {
        "model": {"name": model, "seq_len": seq_len, "layers": layers, "hidden": hidden, "heads": heads,
                  "kv_heads": kv_heads, "ffn": ffn, "vocab": vocab, "attention": attention},
        "cluster": {"name": cluster, "nodes": nodes, "gpu": gpu, "gpus_per_node": gpus_per_node,
                    "intra_node_gbps": intra_node_gbps, "nics_per_node": nics_per_node, "nic_gbps": nic_gbps},
        "strategy": {"dp": dp, "tp": tp, "pp": pp, "cp": cp, "ep": ep, "vpp": vpp, "sequence_parallel": sp,
                     "zero": zero, "fsdp": fsdp, "recompute": recompute, "schedule": schedule,
                     "micro_batch": micro_batch, "global_batch": global_batch,
                     "overlap_grad_reduce": overlap_grad_reduce, "overlap_param_gather": overlap_param_gather,
                     "tp_comm_overlap": tp_comm_overlap},
        "simulation": {"dtype": dtype, "gamma": gamma, "exact": exact, "granularity": granularity,
                       "calibration": str(calibration) if calibration else None},
    }
    job_flags = any(v is not None for sec in ("model", "cluster", "strategy") for v in flags[sec].values())
    if config is not None:
        base = load_yaml(config)
    elif job_flags:
        base = {}
    else:
        base = DEFAULT_JOB
    job = parse_job(merge(base, flags))
    from .api import simulate as run_simulation
    from .report.chrome_trace import write_chrome_trace
    from .report.summary import print_summary

    result = run_simulation(job)
    if not quiet:
        print_summary(result)
    if json_out is not None:
        _write_atomic(json_out, json.dumps(result.to_json(), indent=2))
    if trace is not None:
        try:
            write_chrome_trace(result, trace)
        except OSError as exc:
            raise ConfigError("--trace", f"cannot write {trace}: {exc.strerror}", "choose a writable path") from None
    if dump_config is not None:
        s = result.strategy
        resolved = job.model_copy(deep=True)
        resolved.strategy.dp = s["dp"]
        resolved.strategy.global_batch = s["global_batch"]
        resolved.cluster.nodes = result.n_gpus // max(1, _gpus_per_node(job.cluster.name))
        _write_atomic(dump_config, dump_yaml(resolved))


def _gpus_per_node(name: str) -> int:
    from .hardware.cluster import get_cluster

    return get_cluster(name).gpus_per_node


@app.command()
def validate(
    cases: Annotated[Path, typer.Argument(help="CSV of measured runs: training_runs.csv, vTrain ground_truth_*.csv "
                                          "or collectives.csv format (see shared/validation/README.md)")],
    json_out: Annotated[Path | None, Opt("--json", help="write summary, rows and skipped rows as JSON")] = None,
    plot: Annotated[Path | None, Opt(help="write a predicted-vs-measured scatter (PNG; needs trainsim[plot])")] = None,
    max_mape: Annotated[float | None, Opt(help="exit 1 when the mean absolute % error exceeds this")] = None,
    tier: Annotated[str | None, Opt(help="only these tiers, e.g. A,B (training_runs format)")] = None,
    subset: Annotated[str | None, Opt(help="only these subsets, e.g. core (training_runs format)")] = None,
    calibration: Annotated[Path | None, Opt(help="calibration YAML (default: the packaged one)")] = None,
    jobs: Annotated[int | None, Opt(help="worker processes (default: CPU count, at most 8)")] = None,
    all_rows: Annotated[bool, Opt("--all", help="print every row, not only the largest errors")] = False,
    quiet: Annotated[bool, Opt("-q", "--quiet", help="print only the summary line")] = False,
) -> None:
    """Compare predictions with published measurements, row by row, and summarise the error."""
    from rich.progress import Progress

    from .validate.report import plot_validation, print_validation
    from .validate.runner import default_jobs, detect_kind, filter_rows, read_rows, run_rows

    if max_mape is not None and max_mape < 0:
        raise ConfigError("--max-mape", "must be >= 0", "pass a percentage such as 7")
    if calibration is not None:
        from .cost.calibration import load_calibration

        load_calibration(calibration)  # validate it up front: one clear error, not one per row
    header, rows = read_rows(cases)
    kind = detect_kind(header)
    split = (lambda x: {t.strip() for t in x.split(",") if t.strip()} if x else None)  # noqa: E731
    idx, rows = filter_rows(kind, rows, split(tier), split(subset))
    if not rows:
        raise ConfigError("CASES", f"no rows in {cases} (after filters)", "check --tier/--subset")
    cal = str(calibration) if calibration else None
    with Progress(transient=True, disable=quiet) as bar:
        task = bar.add_task(f"simulating {len(rows)} {kind} rows", total=len(rows))
        report = run_rows(kind, rows, cal, jobs or default_jobs(), lambda k: bar.advance(task, k), idx)
    if json_out is not None:
        _write_atomic(json_out, json.dumps(report.to_json(), indent=2))
    if plot is not None:
        plot_validation(report, plot)
    s = report.summary()
    if quiet:
        print(f"{kind}: n={s['n']} skipped={s['skipped']} mape={s['mape']:.2f}% median={s['median_ape']:.2f}% "
              f"max={s['max_ape']:.2f}% spearman={s['spearman']:.3f} kendall={s['kendall']:.3f}")
    else:
        print_validation(report, show_all=all_rows)
    if max_mape is not None and not s["mape"] <= max_mape:
        print(f"MAPE {s['mape']:.2f}% is above --max-mape {max_mape:g}%", file=sys.stderr)
        raise typer.Exit(1)


@app.command()
def calibrate(
    measurements: Annotated[list[Path], typer.Argument(help="CSV files: end-to-end runs (training_runs.csv or vTrain "
                                                       "format) and/or kernel measurements (gemm/attention/memory "
                                                       "CSVs as in trainsim/data/measurements)")],
    out: Annotated[Path, Opt(help="where to write the fitted calibration YAML")],
    family: Annotated[str, Opt(help="device family the constants belong to (a100, h100, v100, ...)")] = "a100",
    fit_params: Annotated[str, Opt("--fit", help="comma-separated constants fitted to end-to-end runs")] =
        "gemm_peak_fraction,hbm_efficiency,host_overhead_s,collective_host_s",
    calibration: Annotated[Path | None, Opt(help="starting calibration (default: the packaged one)")] = None,
    every: Annotated[int, Opt(help="use every N-th row of large files (faster fits)")] = 1,
    sweeps: Annotated[int, Opt(help="coordinate-descent sweeps")] = 2,
    jobs: Annotated[int | None, Opt(help="worker processes")] = None,
) -> None:
    """Re-fit trainsim's constants to your own measurements and write a calibration file."""
    from .cost.calibration import dump_calibration, load_calibration
    from .validate.calibrate import Dataset, fit, fit_kernels
    from .validate.runner import default_jobs, detect_kind, read_rows

    if every < 1 or sweeps < 1:
        raise ConfigError("--every/--sweeps", "must be >= 1", "pass a positive integer")
    cal = load_calibration(calibration)
    datasets, kernel_files = [], []
    for path in measurements:
        header, rows = read_rows(path)
        cols = set(header)
        if {"m", "n", "k", "tflops"} <= cols or {"seq_len", "head_dim", "tflops"} <= cols or {"op", "gbps"} <= cols:
            kernel_files.append(path)
            continue
        kind = detect_kind(header)
        if kind == "collectives":
            raise ConfigError(str(path), "collective measurements are fitted per link type in the comm section",
                              "edit the comm: section, then check it with `trainsim validate` on the file")
        idx = list(range(len(rows)))[::every]
        datasets.append(Dataset(kind, rows[::every], idx, path.name))
    con = Console()
    if kernel_files:
        cal, report = fit_kernels(cal, kernel_files)
        for fam, rep in report.items():
            con.print(f"kernel fit {fam}: {rep}")
    names = [n.strip() for n in fit_params.split(",") if n.strip()]
    if datasets and names:
        res = fit(cal, family, names, datasets, sweeps=sweeps, jobs=jobs or default_jobs(),
                  progress=lambda msg: con.print(msg))
        cal = res.calibration
        con.print(f"mean |log error| {res.loss_before:.4f} -> {res.loss_after:.4f}")
    _write_atomic(out, dump_calibration(cal))
    con.print(f"wrote {out}; use it with --calibration {out}")


@app.command()
def models() -> None:
    """List the built-in models."""
    from .workload.zoo import model_names

    t = Table(title="Built-in models")
    t.add_column("name")
    t.add_column("description")
    for name, desc in model_names().items():
        t.add_row(name, desc)
    Console().print(t)


@app.command()
def clusters() -> None:
    """List the built-in cluster presets."""
    from .hardware.cluster import CLUSTERS

    t = Table(title="Built-in clusters (per-GPU bandwidth; --nodes N scales the network level)")
    for col in ("name", "GPU", "GPUs/node", "levels (bandwidth GB/s, latency us)", "NICs"):
        t.add_column(col)
    for name, factory in CLUSTERS.items():
        c = factory(1)
        levels = ", ".join(f"{lv.name} x{lv.size} {lv.bandwidth_gbps:g} GB/s {lv.latency_s * 1e6:g} us"
                           for lv in c.levels)
        nic = f"{c.nics_per_node} x {c.nic_gbps:g} GB/s" if c.nic_gbps else "none"
        t.add_row(name, c.device.name, str(c.gpus_per_node), levels, nic)
    Console().print(t)


def main(argv: list[str] | None = None) -> None:
    """Entry point: bad input is one line on stderr and exit code 2, never a traceback."""
    from .sim.engine import SimulationError

    try:
        rc = app(args=argv, standalone_mode=False)
        if isinstance(rc, int) and rc:  # typer.Exit(code) comes back as a return value here
            sys.exit(rc)
    except ConfigError as exc:
        print(f"error: {exc.one_line()}", file=sys.stderr)
        sys.exit(2)
    except SimulationError as exc:
        print(f"error: strategy: {exc}", file=sys.stderr)
        sys.exit(2)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except Exception as exc:  # usage errors (bad flag, wrong type) arrive here in non-standalone mode
        if hasattr(exc, "format_message") and getattr(exc, "exit_code", 0) == 2:
            print(f"error: {exc.format_message()}", file=sys.stderr)
            sys.exit(2)
        if type(exc).__name__ == "Abort":
            sys.exit(130)
        raise
