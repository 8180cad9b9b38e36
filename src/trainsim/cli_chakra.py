"""`trainsim chakra export | run`: write a job as Chakra ET for ASTRA-sim, or simulate an ET workload."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from .config import apply_flags, load_yaml, parse_job
from .errors import ConfigError
from .files import Outputs, check_file_prefix, check_output_dir, json_text, write_outputs

chakra_app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                         help="Chakra execution traces (ASTRA-sim 2.0 workloads): export a job, run a trace.")

Opt = typer.Option


def parse_ranks(text: str | None) -> list[int] | None:
    """'0-3,8' -> [0, 1, 2, 3, 8]; None -> None (every rank)."""
    if text is None:
        return None
    out: list[int] = []
    try:
        for part in (p.strip() for p in text.split(",") if p.strip()):
            lo, _, hi = part.partition("-")
            out.extend(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise ConfigError("--ranks", f"'{text}' is not a rank list", "write e.g. --ranks 0-7,16") from None
    if not out:
        raise ConfigError("--ranks", "no ranks given", "write e.g. --ranks 0-7,16")
    return out


@chakra_app.command("export")
def export(
    config: Annotated[str | None, typer.Argument(help="YAML job file, as for `trainsim simulate`")] = None,
    out: Annotated[str, Opt(help="directory for <prefix>.<rank>.et and <prefix>.comm_group.json")] = "chakra",
    prefix: Annotated[str | None, Opt(help="file prefix (default: the model name)")] = None,
    ranks: Annotated[str | None, Opt(help="only these ranks, e.g. 0-7,16 (default: all)")] = None,
    model: Annotated[str | None, Opt(help="model name (trainsim models)")] = None,
    cluster: Annotated[str | None, Opt(help="cluster preset (trainsim clusters)")] = None,
    nodes: Annotated[int | None, Opt(help="number of nodes")] = None,
    dp: Annotated[int | None, Opt(help="data-parallel degree")] = None,
    tp: Annotated[int | None, Opt(help="tensor-parallel degree")] = None,
    pp: Annotated[int | None, Opt(help="pipeline-parallel degree")] = None,
    cp: Annotated[int | None, Opt(help="context-parallel degree")] = None,
    ep: Annotated[int | None, Opt(help="expert-parallel degree")] = None,
    vpp: Annotated[int | None, Opt(help="virtual stages per pipeline rank")] = None,
    sp: Annotated[bool | None, Opt("--sp/--no-sp", help="sequence parallelism with TP")] = None,
    zero: Annotated[int | None, Opt(help="ZeRO stage 0-3")] = None,
    recompute: Annotated[str | None, Opt(help="none | selective | full")] = None,
    schedule: Annotated[str | None, Opt(help="gpipe | 1f1b | interleaved")] = None,
    micro_batch: Annotated[int | None, Opt(help="micro-batch size per data-parallel rank")] = None,
    global_batch: Annotated[int | None, Opt(help="global batch")] = None,
    seq_len: Annotated[int | None, Opt(help="sequence length (tokens)")] = None,
    layers: Annotated[int | None, Opt(help="override number of layers")] = None,
    dtype: Annotated[str | None, Opt(help="bf16 | fp16 | fp8 | fp4 | tf32 | fp32")] = None,
    granularity: Annotated[str, Opt(help="op (every collective a COMM node) | layer | auto (TP collectives fused "
                                    "into COMP nodes)")] = "op",
) -> None:
    """Write a job's execution graph as Chakra ET, one file per rank, for ASTRA-sim."""
    check_output_dir(out, "--out")  # before simulating: a bad --out or --prefix fails at once
    if prefix is not None:
        check_file_prefix(prefix, "--prefix")
    wanted_ranks = parse_ranks(ranks)
    flags: dict[str, Any] = {
        "model": {"name": model, "seq_len": seq_len, "layers": layers},
        "cluster": {"name": cluster, "nodes": nodes},
        "strategy": {"dp": dp, "tp": tp, "pp": pp, "cp": cp, "ep": ep, "vpp": vpp, "sequence_parallel": sp,
                     "zero": zero, "recompute": recompute, "schedule": schedule, "micro_batch": micro_batch,
                     "global_batch": global_batch},
        "simulation": {"dtype": dtype, "granularity": granularity, "bandwidth_sharing": False},
    }
    job = parse_job(apply_flags(load_yaml(config) if config is not None else None, flags).data)
    from .api import simulate
    from .trace.chakra import write_chakra

    result = simulate(job, timeline=True)
    name = prefix or job.model.name
    from .console import progress_bar

    with progress_bar() as bar:
        task = bar.add_task(f"writing {name}.<rank>.et", total=None)
        paths = write_chakra(result.graph, out, name, wanted_ranks,
                             progress=lambda done, total: bar.update(task, completed=done, total=total))
    n_et = len(paths) - 1
    print(f"wrote {n_et} Chakra ET files ({name}.<rank>.et, {result.n_gpus} ranks, {len(result.graph)} tasks) "
          f"and {paths[-1].name} to {out}")
    print(f"simulated iteration time {result.iteration_time_s * 1e3:.3f} ms (simulator wall time "
          f"{result.simulation_wall_s:.2f} s)")
    print(f"ASTRA-sim: --workload-configuration={Path(out) / name} --comm-group-configuration={paths[-1]}")


@chakra_app.command("run")
def run(
    prefix: Annotated[str, typer.Argument(help="workload prefix (DIR/NAME for DIR/NAME.<rank>.et) or directory")],
    cluster: Annotated[str, Opt(help="cluster preset that prices uncosted nodes (trainsim clusters)")] = "dgx-a100",
    nodes: Annotated[int | None, Opt(help="number of nodes (default: what the ranks need)")] = None,
    durations: Annotated[str, Opt(help="model: price communication and memory with trainsim's models | recorded: "
                                  "keep durations the trace carries")] = "model",
    cpu_ops: Annotated[str, Opt(help="serial: CPU ops run on the compute stream | skip: they are free")] = "serial",
    dtype: Annotated[str, Opt(help="dtype of the roofline peak for num_ops nodes (auto: what the GPU trains in; "
                                   "bf16 | fp16 | fp8 | tf32 | fp32)")] = "auto",
    comm_groups: Annotated[str | None, Opt(help="ASTRA-sim comm group JSON (default <prefix>.comm_group.json)")]
        = None,
    json_out: Annotated[str | None, Opt("--json", help="write iteration time and counts as JSON")] = None,
    topology: Annotated[str | None, Opt(help="network in ASTRA-sim notation ('Ring(8)_Switch(4)') or a topology "
                                        "preset, instead of the cluster's; collectives on the analytical model")]
        = None,
    bandwidth: Annotated[str | None, Opt(help="with --topology: GB/s per NPU per direction, one per dimension")]
        = None,
    latency: Annotated[str | None, Opt(help="with --topology: ns per hop, one per dimension")] = None,
    semantics: Annotated[str, Opt(help="nccl (default) | astra: collectives as ASTRA-sim's analytical backend "
                                       "prices them (its default system config; `trainsim astra run` takes "
                                       "yours)")] = "nccl",
) -> None:
    """Simulate a Chakra ET workload with trainsim's engine and print the iteration time."""
    json_target = Outputs().add(json_out, "--json")
    from .cli_astra import check_semantics

    check_semantics(semantics, "--semantics")
    if topology is None and (bandwidth is not None or latency is not None):
        raise ConfigError("--bandwidth" if bandwidth is not None else "--latency", "only applies with --topology",
                          "add --topology, or drop it")
    from .cost.calibration import load_calibration
    from .hardware.devices import DTYPES
    from .sim.engine import run as simulate_graph
    from .trace.chakra import load_chakra

    if dtype != "auto" and dtype not in DTYPES:  # refused before any trace is read
        raise ConfigError("--dtype", f"'{dtype}' is not a dtype", f"use auto or one of {', '.join(DTYPES)}")
    if nodes is not None and nodes < 1:
        raise ConfigError("--nodes", f"must be >= 1, got {nodes}", "pass a node count, or leave it out")
    comm = None
    target: Any = cluster
    if topology is not None or semantics == "astra":
        from .api import preset_cluster
        from .astra_inputs import AstraSystem
        from .cli import _floats
        from .cost.multidim import AnalyticalComm
        from .hardware.topology import cluster_from_topology, resolve_topology
        from .trace.chakra import et_files, resolve_cluster

        world = len(et_files(prefix))
        if topology is not None:
            try:
                levels = resolve_topology(topology, _floats(bandwidth, "--bandwidth"), _floats(latency, "--latency"),
                                          npus=world)
            except ValueError as exc:
                raise ConfigError("--topology", str(exc), "") from None
            if nodes is not None:
                raise ConfigError("--nodes", "has no effect with --topology (the topology fixes the NPUs)", "drop it")
            target = cluster_from_topology(levels, preset_cluster(cluster, "--cluster").device)
        else:
            target = resolve_cluster(cluster, nodes, world)
            levels = tuple(lv for lv in target.levels if lv.size > 1)
        comm = AstraSystem().comm(levels) if semantics == "astra" else AnalyticalComm(levels)
    graph = load_chakra(prefix, target, nodes=nodes if topology is None else None, durations=durations,
                        cpu_ops=cpu_ops, dtype=dtype, comm_groups=comm_groups, comm=comm)
    cal = load_calibration(None)
    trace = simulate_graph(graph, gamma=cal.gamma, p2p_host_sync=cal.p2p_host_sync, bandwidth_sharing=False)
    iteration = max(trace.end_s, default=0.0)
    counts = {k: graph.kind.count(k) for k in ("compute", "collective", "p2p", "memory")}
    if json_target is None or not json_target.to_stdout:
        print(f"{prefix}: {len(graph.classes)} ranks, {len(graph)} tasks "
              f"({', '.join(f'{v} {k}' for k, v in counts.items() if v)}); iteration time {iteration * 1e3:.4f} ms")
    data = {"iteration_time_s": iteration, "ranks": len(graph.classes), "tasks": len(graph), **counts}
    write_outputs({json_target: json_text(data, "--json")})
