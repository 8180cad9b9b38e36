"""`trainsim replay | scale | optimize`: replay torch.profiler traces, predict data-parallel scaling from a
one-node profile (PerfEstimator), and search what-if knobs on a replay (dPRO)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from .errors import ConfigError
from .files import Outputs, OutputTarget, Payload, json_text, write_outputs
from .replay import expand_traces

if TYPE_CHECKING:
    from .replay import GraphEdit, RankGraph, ReplayResult
    from .whatif.edits import CommCost

Opt = typer.Option
def _emit(json_target: OutputTarget | None, trace_target: OutputTarget | None, data: dict,
          trace_text: str | None = None) -> None:
    payloads: dict[OutputTarget | None, Payload] = {json_target: json_text(data, "--json")}
    if trace_target is not None and trace_text is not None:
        payloads[trace_target] = trace_text
    write_outputs(payloads)


def _ms(x: float) -> str:
    return f"{x:,.3f}"


def print_replay(result: ReplayResult, console: Console) -> None:
    """The replay summary: steps per rank, the error, where the time goes, the critical path."""
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


def _comm(cluster: str | None, comm_table: str | None) -> tuple[CommCost | None, str]:
    """The network a what-if prices collectives on: a cluster preset or a measured all-reduce curve."""
    from .whatif.edits import ClusterComm, load_comm_table

    if cluster is not None and comm_table is not None:
        raise ConfigError("--cluster", "given with --comm-table", "price collectives on one of the two")
    if cluster is not None:
        from .api import preset_cluster

        preset_cluster(cluster, "--cluster")  # an unknown name is refused before any trace is read
        return ClusterComm(cluster), f"cluster {cluster}"
    if comm_table is not None:
        return load_comm_table(comm_table), f"measured curve {Path(comm_table).name}"
    return None, ""


def _gpu_edit(target: str, source: str | None) -> GraphEdit:
    """Re-time kernels for `target`, from the GPU the trace names (or `source`)."""
    from .whatif.edits import retime_gpu
    from .whatif.gpu import gpu_from_trace_name, time_ratios

    time_ratios(source or target, target)  # refuse an unknown target before any trace is read

    def ratios_for(rk: RankGraph) -> dict[str, float]:
        src = source
        if src is None:
            names = rk.trace.gpu_names
            src = next((g for g in map(gpu_from_trace_name, names) if g is not None), None)
            if src is None:
                raise ConfigError("--source-gpu", f"{rk.trace.path} names no GPU trainsim knows "
                                  f"({', '.join(names) or 'no deviceProperties'})", "pass --source-gpu PRESET")
        return time_ratios(src, target)
    return retime_gpu(ratios_for, target)


def _check_cores(cores_per_node: int | None) -> None:
    if cores_per_node is not None and cores_per_node < 1:
        raise ConfigError("--cores-per-node", f"must be >= 1, got {cores_per_node}", "pass the node's cores")


def what_if_edits(gpu: str | None, source_gpu: str | None, comm: CommCost | None, label: str, group: int | None,
                  network_speedup: float | None, no_overlap: bool, fuse: bool, bucket_mb: float | None,
                  compress_bits: int | None, cores_per_node: int | None, ranks_per_node: int) -> list[GraphEdit]:
    """The edits the flags ask for, in the order they must apply (host-core sharing last: it reads durations)."""
    from .whatif import edits as w

    out: list[GraphEdit] = []
    if gpu is not None:
        out.append(_gpu_edit(gpu, source_gpu))
    if network_speedup is not None:
        if not network_speedup > 0:
            raise ConfigError("--network-speedup", f"must be > 0, got {network_speedup}", "e.g. 2 for twice as fast")
        out.append(w.scale_network(network_speedup))
    if comm is None:
        if bucket_mb is not None or compress_bits is not None:
            flag = "--bucket-mb" if bucket_mb is not None else "--compress-bits"
            raise ConfigError(flag, "needs a network to price the new messages on",
                              "add --cluster PRESET or --comm-table CSV")
    else:
        out.append(w.recost_network(comm, label, group))
    if bucket_mb is not None and comm is not None:
        if not 0 < bucket_mb <= 1e6:
            raise ConfigError("--bucket-mb", f"must be in (0, 1e6], got {bucket_mb}", "e.g. 25 (DDP's default)")
        out.append(w.bucket(bucket_mb * 2**20, comm, label, group))
    if compress_bits is not None and comm is not None:
        if compress_bits not in (1, 2, 4, 8, 16):
            raise ConfigError("--compress-bits", f"must be 1, 2, 4, 8 or 16, got {compress_bits}",
                              "2 is TernGrad")
        out.append(w.compress(compress_bits, comm, label, group))
    if fuse:
        out.append(w.fuse_elementwise())
    if no_overlap:
        out.append(w.overlap_off())
    _check_cores(cores_per_node)
    if cores_per_node is not None:
        out.append(w.share_host_cores(cores_per_node, ranks_per_node))
    return out


def replay_cmd(
    traces: Annotated[list[str], typer.Argument(help="torch.profiler traces, one per rank: files, a folder or a glob "
                                                     "(.json / .json.gz)", show_default=False)],
    json_out: Annotated[str | None, Opt("--json", help="write the replay as JSON ('-' for stdout)")] = None,
    trace_out: Annotated[str | None, Opt("--trace", help="write a Perfetto trace of the replay beside the original")]
        = None,
    modelled_latency: Annotated[bool, Opt("--modelled-latency", help="cut launch-bound kernels at launch + the median "
                                          "launch latency instead of their measured start")] = False,
    gpu: Annotated[str | None, Opt(help="what-if: another GPU (preset, e.g. h100-sxm); kernels re-timed by op class")]
        = None,
    source_gpu: Annotated[str | None, Opt(help="the traced GPU's preset when deviceProperties do not say")] = None,
    cluster: Annotated[str | None, Opt(help="what-if: collectives re-costed on this cluster preset")] = None,
    comm_table: Annotated[str | None, Opt(help="what-if: collectives re-costed from a measured all-reduce curve "
                                          "(CSV bytes,time_us)")] = None,
    network_speedup: Annotated[float | None, Opt(help="what-if: collectives this many times faster")] = None,
    bucket_mb: Annotated[float | None, Opt(help="what-if: DDP bucket_cap_mb (needs --cluster or --comm-table)")]
        = None,
    compress_bits: Annotated[int | None, Opt(help="what-if: gradient compression to N bits (2 = TernGrad)")] = None,
    fuse: Annotated[bool, Opt("--fuse", help="what-if: fuse chains of element-wise kernels")] = False,
    no_overlap: Annotated[bool, Opt("--no-overlap", help="what-if: communication does not overlap compute")] = False,
    cores_per_node: Annotated[int | None, Opt(help="CPU jobs: cores the node's ranks share")] = None,
) -> None:
    """Replay torch.profiler traces (one per rank) and compare each step with its measurement; what-if
    flags change the replay (the steps' error is then against the original measurement)."""
    outs = Outputs()
    json_target = outs.add(json_out, "--json")
    trace_target = outs.add(trace_out, "--trace")
    paths = expand_traces(traces)  # refused before any work
    what_if = {"gpu": gpu, "source_gpu": source_gpu, "cluster": cluster,
               "comm_table": str(Path(comm_table).resolve()) if comm_table else None,
               "network_speedup": network_speedup, "bucket_mb": bucket_mb, "compress_bits": compress_bits,
               "fuse": fuse, "no_overlap": no_overlap, "cores_per_node": cores_per_node,
               "modelled_latency": modelled_latency}
    result = run_replay(paths, what_if)
    trace_text = None
    if trace_target is not None:
        from .report.replay_perfetto import replay_trace_json

        trace_text = replay_trace_json(result)
    if not outs.to_stdout:
        print_replay(result, Console(width=None))
    _emit(json_target, trace_target, replay_json(result, what_if), trace_text)


WHAT_IF_KEYS = ("gpu", "source_gpu", "cluster", "comm_table", "network_speedup", "bucket_mb", "compress_bits",
                "fuse", "no_overlap", "cores_per_node", "modelled_latency")


def run_replay(paths: list[str], what_if: dict[str, Any]) -> ReplayResult:
    """Replay the traces under `replay`'s what-if options (WHAT_IF_KEYS, as its flags name them), with a
    progress bar; `trainsim report` replays a replay JSON's traces the same way."""
    opt = {k: what_if.get(k) for k in WHAT_IF_KEYS}
    comm, label = _comm(opt["cluster"], opt["comm_table"])
    edits = what_if_edits(opt["gpu"], opt["source_gpu"], comm, label, None, opt["network_speedup"],
                          bool(opt["no_overlap"]), bool(opt["fuse"]), opt["bucket_mb"], opt["compress_bits"],
                          opt["cores_per_node"], len(paths))
    from .console import progress_bar
    from .replay import replay

    with progress_bar() as bar:
        task = bar.add_task(f"replaying {len(paths)} trace(s)", total=None)
        return replay(paths, measured_latency=not opt["modelled_latency"], edits=edits,
                      progress=lambda done, total: bar.update(task, completed=done, total=total))


def replay_json(result: ReplayResult, what_if: dict[str, Any]) -> dict[str, Any]:
    """What `replay --json` writes: the replay and the what-if options it ran under (those set)."""
    return {**result.to_json(), "what_if": {k: v for k, v in what_if.items() if v not in (None, False)}}


def _int_list(text: str, field: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(field, f"'{text}' is not a list of integers", "write e.g. 1,2,4") from None
    if not out or min(out) < 1 or max(out) > 1 << 20:
        raise ConfigError(field, f"'{text}' must list integers from 1 to 1048576", "write e.g. 1,2,4")
    return out


def scale_cmd(
    traces: Annotated[list[str], typer.Argument(help="the profile: traces of one node's ranks (or one GPU)",
                                                show_default=False)],
    cluster: Annotated[str | None, Opt(help="target cluster preset: gradient sync on its network")] = None,
    nodes: Annotated[str | None, Opt(help="with --cluster: node counts, e.g. 1,2,4,8")] = None,
    comm_table: Annotated[str | None, Opt(help="measured all-reduce curve (CSV bytes,time_us) instead of a cluster")]
        = None,
    ranks: Annotated[str | None, Opt(help="with --comm-table: rank counts, e.g. 1,2,4")] = None,
    ranks_per_node: Annotated[int | None, Opt(help="ranks per node (default: the cluster's GPUs per node, "
                                              "or every rank on one node with --comm-table)")] = None,
    cores_per_node: Annotated[int | None, Opt(help="CPU jobs: cores the node's ranks share")] = None,
    json_out: Annotated[str | None, Opt("--json", help="write the prediction as JSON ('-' for stdout)")] = None,
) -> None:
    """Predict data-parallel training at N nodes from a one-node profile (PerfEstimator): step time,
    throughput and the scaling factor alpha (p_n = p_1 * n * alpha)."""
    outs = Outputs()
    json_target = outs.add(json_out, "--json")
    paths = expand_traces(traces)
    comm, label = _comm(cluster, comm_table)
    if comm is None:
        raise ConfigError("--cluster", "no target network", "pass --cluster PRESET --nodes 1,2,4 or "
                          "--comm-table CSV --ranks 1,2")
    if cluster is not None:
        from .hardware.cluster import get_cluster

        gpn = ranks_per_node or get_cluster(cluster, 1).gpus_per_node
        counts = [n * gpn for n in _int_list(nodes or "1,2,4,8", "--nodes")]
    else:
        counts = _int_list(ranks or "1,2,4", "--ranks")
        gpn = ranks_per_node or max(counts)
    if gpn < 1:
        raise ConfigError("--ranks-per-node", f"must be >= 1, got {gpn}", "pass ranks per node")
    _check_cores(cores_per_node)
    from .whatif.scale import scale

    res = scale(paths, comm, label, counts, gpn, cores_per_node)
    if not outs.to_stdout:
        con = Console(width=None)
        t = Table(title=f"data-parallel scaling on {label} (profile: {res.profile_ranks} rank(s), replayed step "
                        f"{res.profile_step_ms:.3f} ms, measured {res.measured_step_ms:.3f} ms)",
                  title_justify="left")
        for col in ("ranks", "nodes", "step ms", "throughput x", "alpha"):
            t.add_column(col, justify="right")
        for p in res.points:
            t.add_row(str(p.ranks), str(p.nodes), _ms(p.step_ms), f"{p.throughput_x:.2f}", f"{p.alpha:.3f}")
        con.print(t)
        for a in res.assumptions:
            con.print(f"assumed: {a}", highlight=False, markup=False)
    _emit(json_target, None, res.to_json())


def optimize_cmd(
    traces: Annotated[list[str], typer.Argument(help="torch.profiler traces, one per rank", show_default=False)],
    cluster: Annotated[str | None, Opt(help="price re-shaped collectives on this cluster preset")] = None,
    comm_table: Annotated[str | None, Opt(help="... or on a measured all-reduce curve (CSV bytes,time_us)")] = None,
    ranks: Annotated[int | None, Opt(help="data-parallel ranks to optimise for (default: the traces' world size)")]
        = None,
    cores_per_node: Annotated[int | None, Opt(help="CPU jobs: cores the node's ranks share")] = None,
    ranks_per_node: Annotated[int, Opt(help="ranks per node (CPU jobs: for --cores-per-node)")] = 1,
    top: Annotated[int, Opt(help="settings to print")] = 10,
    json_out: Annotated[str | None, Opt("--json", help="write every setting's prediction as JSON")] = None,
) -> None:
    """dPRO's search on a replay: DDP bucket size, element-wise fusion, gradient compression and overlap,
    alone and combined; prints the settings to apply, best first, with the predicted step time."""
    outs = Outputs()
    json_target = outs.add(json_out, "--json")
    paths = expand_traces(traces)
    comm, label = _comm(cluster, comm_table)
    if comm is None:
        raise ConfigError("--cluster", "no network to price re-shaped collectives on",
                          "pass --cluster PRESET or --comm-table CSV")
    if ranks is not None and not 1 <= ranks <= 1 << 20:
        raise ConfigError("--ranks", f"must be 1..1048576, got {ranks}", "pass the data-parallel size")
    if top < 1:
        raise ConfigError("--top", f"must be >= 1, got {top}", "e.g. --top 10")
    from .console import progress_bar
    from .replay import read_traces, replay

    tr = read_traces(paths)
    grid = [(b, f, c) for b in (None, 1.0, 5.0, 25.0, 100.0) for f in (False, True) for c in (None, 2)]
    rows = []
    with progress_bar() as bar:
        task = bar.add_task("what-if settings", total=len(grid))
        for b, f, c in grid:
            edits = what_if_edits(None, None, comm, label, ranks, None, False, f, b, c, cores_per_node,
                                  ranks_per_node)
            r = replay(tr, edits=edits)
            rows.append({"bucket_cap_mb": b, "fuse_elementwise": f, "compress_bits": c, "step_ms": r.step_ms})
            bar.advance(task)
    base = rows[0]["step_ms"]
    for row in rows:
        row["gain_pct"] = (base / row["step_ms"] - 1) * 100 if row["step_ms"] > 0 else 0.0
    def changes(r: dict) -> int:
        return sum(bool(r[k]) for k in ("bucket_cap_mb", "fuse_elementwise", "compress_bits"))

    ranked = sorted(rows, key=lambda r: (round(r["step_ms"], 6), changes(r)))  # ties: the simpler change first
    if not outs.to_stdout:
        t = Table(title=f"what to change (predicted on {label}; now {base:.3f} ms per step)", title_justify="left")
        for col in ("settings to apply", "step ms", "gain %"):
            t.add_column(col, justify="left" if col.startswith("settings") else "right")
        for row in ranked[:top]:
            parts = [f"DDP bucket_cap_mb={row['bucket_cap_mb']:g}" if row["bucket_cap_mb"] else "",
                     "fuse element-wise ops (torch.compile)" if row["fuse_elementwise"] else "",
                     f"{row['compress_bits']}-bit gradient compression" if row["compress_bits"] else ""]
            t.add_row(", ".join(p for p in parts if p) or "as profiled", _ms(row["step_ms"]), f"{row['gain_pct']:+.1f}")
        Console(width=None).print(t)
    _emit(json_target, None, {"kind": "optimize", "paths": [str(p) for p in paths], "network": label,
                              "baseline_step_ms": base, "settings": ranked})


__all__ = ["optimize_cmd", "print_replay", "replay_cmd", "scale_cmd", "what_if_edits"]
