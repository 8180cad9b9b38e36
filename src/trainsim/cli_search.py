"""`trainsim search`: the fastest strategy that fits, with the top-k table, the Pareto fronts and what
was pruned and why; and the auto-strategy `simulate` runs when no parallel degree is given."""

from __future__ import annotations

import math
import os
import time
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from .config import DEFAULT_JOB, JobConfig, LayeredJob, apply_flags, load_yaml, parse_job
from .console import PhaseProgress
from .errors import ConfigError
from .files import Outputs, json_text, write_outputs
from .optimize.space import held_knobs, strategy_text

if TYPE_CHECKING:
    from .optimize.search import SearchResult

Opt = typer.Option

DEGREES = ("dp", "tp", "pp", "cp", "ep", "vpp")
FLAG_KNOBS = {"sequence_parallel": "sequence_parallel", "recompute": "recompute", "micro_batch": "micro_batch",
              "overlap_grad_reduce": "overlap_grad_reduce", "overlap_param_gather": "overlap_param_gather",
              "tp_comm_overlap": "tp_comm_overlap"}
"""Strategy keys a job may fix while the rest is searched (the key and its SearchSpace knob)."""


def parse_nodes(text: str | None, field: str = "--nodes") -> list[int] | None:
    """'8' or '8,16,32' -> [8, 16, 32]; a bad entry is a ConfigError naming the flag."""
    if text is None:
        return None
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise ConfigError(field, f"'{part}' is not a positive node count", "e.g. --nodes 8 or --nodes 8,16,32")
        out.append(int(part))
    return sorted(set(out))


def search_bar(quiet: bool) -> PhaseProgress:
    """The search's progress(what, done, total): a transient rich bar with ETA on a terminal's stderr."""

    def columns() -> tuple[Any, ...]:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        return (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                TextColumn("ETA"), TimeRemainingColumn())

    return PhaseProgress(columns, quiet=quiet)


def print_search(result: SearchResult, console: Console, global_batch: int) -> None:
    """The top-k table, the fronts, the pruning counts and how long it took."""
    from .optimize.search import throughput
    from .optimize.space import PRUNE_REASONS

    unit = "tokens/s" if result.best is None or result.best.get("tokens_per_s") else "samples/s"

    gpus = "" if len(result.per_nodes) > 1 else f"{result.per_nodes[0].n_gpus} GPUs, " if result.per_nodes else ""
    title = (f"top {len(result.top)} of {result.evaluated:,} simulated ({gpus}global batch {global_batch}"
             f"{'' if result.proven else '; stopped by --time-limit: not proven best'})")
    t = Table(title=title, title_justify="left")
    many = len(result.per_nodes) > 1
    cols = ("#", *(("GPUs",) if many else ()), "strategy", "iter s", unit, "MFU %", "free GiB", "dominant")
    for col in cols:
        t.add_column(col, justify="left" if col in ("strategy", "dominant") else "right",
                     min_width=22 if col == "strategy" else None)
    for i, r in enumerate(result.top, 1):
        t.add_row(str(i), *((str(r.get("n_gpus")),) if many else ()), strategy_text(r),
                  f"{r['iteration_time_s']:.3f}", f"{throughput(r):,.0f}", f"{100 * r['mfu']:.1f}",
                  f"{r['memory_headroom_gib']:.1f}", str(r.get("dominant")))
    console.print(t)
    if not result.top:
        console.print("no configuration fits in memory: try more nodes, a smaller micro-batch or global batch",
                      highlight=False)
    if len(result.per_nodes) > 1:
        g = Table(title="throughput vs GPUs (best per cluster size; * = on the Pareto front)", title_justify="left")
        for col in ("GPUs", "nodes", unit, f"{unit} per GPU", "MFU %", "strategy"):
            g.add_column(col, justify="right" if col != "strategy" else "left")
        front = {id(r) for r in result.pareto_gpus()}
        for n in result.per_nodes:
            feas = n.feasible
            if not feas:
                g.add_row(str(n.n_gpus), str(n.nodes), "does not fit", "", "", "")
                continue
            b = max(feas, key=throughput)
            g.add_row(f"{n.n_gpus}{'*' if id(b) in front else ''}", str(n.nodes), f"{throughput(b):,.0f}",
                      f"{throughput(b) / n.n_gpus:,.0f}", f"{100 * b['mfu']:.1f}", strategy_text(b))
        console.print(g)
    front = result.pareto_memory()
    if front:
        how = ("down to 90% of the best throughput" if result.front_exact else
               "of the configurations simulated; --pareto-memory completes it")
        m = Table(title=f"throughput vs memory headroom (Pareto front, {how})", title_justify="left")
        for col in ("GPUs", unit, "free GiB", "strategy"):
            m.add_column(col, justify="right" if col != "strategy" else "left")
        for r in front[:12]:
            m.add_row(str(r.get("n_gpus")), f"{throughput(r):,.0f}", f"{r['memory_headroom_gib']:.1f}",
                      strategy_text(r))
        console.print(m)
    p = Table(title=f"pruned ({result.space:,} configurations in the space)", title_justify="left")
    p.add_column("reason")
    p.add_column("configurations", justify="right")
    p.add_column("what it means")
    for k, v in result.pruned.items():
        p.add_row(k, f"{v:,}", PRUNE_REASONS[k])
    p.add_row("simulated", f"{result.evaluated:,}", "the event simulation (OOM and errors included)")
    console.print(p)
    rate = result.space / result.wall_s if result.wall_s > 0 else float("inf")
    console.print(f"settled {result.space:,} configurations in {result.wall_s:.1f} s ({rate:,.0f}/s), "
                  f"{result.evaluated:,} simulated, {result.reduced_jobs:,} one-block jobs costed for the bounds",
                  highlight=False)


def search_cmd(
    config: Annotated[str | None, typer.Argument(help="YAML job file: its model, cluster and simulation sections "
                                                 "are searched over (its strategy is ignored but for "
                                                 "global_batch)")] = None,
    model: Annotated[str | None, Opt(help="model name (trainsim models); default GPT-3 175B")] = None,
    hf_config: Annotated[str | None, Opt(help="a local Hugging Face config.json instead of --model")] = None,
    cluster: Annotated[str | None, Opt(help="cluster preset (trainsim clusters); default dgx-a100")] = None,
    nodes: Annotated[str | None, Opt(help="node count, or several (8,16,32) for the throughput-vs-GPUs "
                                          "front")] = None,
    gpu: Annotated[str | None, Opt(help="replace the preset's GPU")] = None,
    global_batch: Annotated[int | None, Opt(help="sequences per iteration (default: ~4M tokens, at most 16 "
                                                 "per GPU)")] = None,
    seq_len: Annotated[int | None, Opt(help="sequence length")] = None,
    dtype: Annotated[str | None, Opt(help="auto | bf16 | fp16 | fp8 | ...")] = None,
    space_file: Annotated[str | None, Opt("--space", help="YAML of knob: [values] restricting the space "
                                          "(tp, pp, cp, ep, vpp, sequence_parallel, micro_batch, recompute, zero, "
                                          "overlap_grad_reduce, overlap_param_gather, tp_comm_overlap, "
                                          "schedule, tp_across_nodes)")] = None,
    tp_across_nodes: Annotated[bool, Opt("--tp-across-nodes", help="let tensor parallelism span nodes")] = False,
    ep_dispatcher: Annotated[str | None, Opt(help="held for every candidate with ep > 1: alltoall | deepep | "
                                             "hybridep (two-hop dispatch)")] = None,
    ep_overlap: Annotated[bool | None, Opt("--ep-overlap/--no-ep-overlap", help="held for every candidate with "
                                           "ep > 1: all-to-alls under a paired micro-batch's compute")] = None,
    cuda_graphs: Annotated[str | None, Opt(help="held for every candidate: none | full_iteration | captured "
                                           "modules, comma-separated (attn, mlp, moe_router, moe_preprocess, moe, "
                                           "mamba)")] = None,
    top: Annotated[int, Opt(help="configurations in the table (found exactly: more costs more simulations)")] = 3,
    time_limit: Annotated[float | None, Opt("--time-limit", help="stop after this many seconds (the best so "
                                            "far, not proven)")] = None,
    jobs: Annotated[int | None, Opt(help="local worker processes (default: the CPU count, at most 8); with --ray, "
                                          "Ray tasks in flight (default: the cluster's CPUs)")] = None,
    ray: Annotated[str | None, Opt(help="run on Ray: auto (a running cluster, else a local one) or an "
                                        "address (pip install 'trainsim[ray]')")] = None,
    db: Annotated[str | None, Opt(help="DuckDB file keeping every simulated configuration (resumable; pip "
                                       "install 'trainsim[search]')")] = None,
    pareto_memory: Annotated[bool, Opt("--pareto-memory", help="complete the throughput / memory-headroom front "
                                       "down to 90% of the best throughput (simulates more)")] = False,
    exhaustive: Annotated[bool, Opt("--exhaustive", help="simulate every configuration the static rules "
                                    "leave (slow: the reference the bounds are checked against)")] = False,
    json_out: Annotated[str | None, Opt("--json", help="write best/top/evaluated/pruned/space/wall_s as JSON "
                                        "(- for stdout)")] = None,
    quiet: Annotated[bool, Opt("--quiet", "-q", help="no tables on stdout")] = False,
) -> None:
    """Find the fastest parallel strategy that fits (branch and bound over the event simulation)."""
    from .optimize.search import parse_space, run_search

    outs = Outputs()
    json_target = outs.add(json_out, "--json")
    if model is not None and hf_config is not None:
        raise ConfigError("--hf-config", "and --model both name the model", "pass only one of them")
    data = load_yaml(config, "CONFIG") if config is not None else {}
    if not isinstance(data, dict):
        raise ConfigError("CONFIG", "must be a job mapping (model/cluster/strategy/simulation)", "see --help")
    job: dict[str, Any] = {k: dict(data.get(k) or {}) for k in ("model", "cluster", "simulation")}
    strategy = data.get("strategy") if isinstance(data.get("strategy"), dict) else {}
    if config is None and model is None and hf_config is None:
        job["model"] = dict(DEFAULT_JOB["model"])
        if cluster is None:
            job["cluster"] = dict(DEFAULT_JOB["cluster"])
        if global_batch is None and seq_len is None:
            global_batch = DEFAULT_JOB["strategy"]["global_batch"]
    if model is not None or hf_config is not None:
        job["model"] = {"name": model} if model is not None else {"hf_config": hf_config}
    for key, value in (("seq_len", seq_len),):
        if value is not None:
            job["model"][key] = value
    if cluster is not None:
        job["cluster"] = {"name": cluster}
    if gpu is not None:
        job["cluster"]["gpu"] = gpu
    if dtype is not None:
        job["simulation"]["dtype"] = dtype
    node_list = parse_nodes(nodes) or [int(job["cluster"].pop("nodes", 0) or 0) or _one_node(job)]
    job["cluster"].pop("nodes", None)
    held = _checked_held({**strategy, **{k: v for k, v in (("ep_dispatcher", ep_dispatcher),
                                                           ("ep_overlap", ep_overlap), ("cuda_graphs", cuda_graphs))
                                         if v is not None}})
    if held:
        job["strategy"] = held
    checked = parse_job({**job, "strategy": {}})  # the job's keys checked before any search work
    from .api import check_compute_model

    check_compute_model(checked.simulation)
    if global_batch is None and isinstance(strategy.get("global_batch"), int):
        global_batch = strategy["global_batch"]
    space = parse_space(load_yaml(space_file, "--space") if space_file is not None else None)
    if tp_across_nodes:
        space.tp_across_nodes = True
    wall0 = time.perf_counter()
    with search_bar(quiet or json_target is not None and json_target.to_stdout) as bar:
        workers = jobs if jobs is not None else 0 if ray is not None else max(1, min(8, os.cpu_count() or 1))
        result, gb = run_search(job, node_list, global_batch, space=space, top=top, time_limit_s=time_limit,
                                jobs=workers, ray=ray, db=db, exhaustive=exhaustive, pareto_memory=pareto_memory,
                                progress=bar)
    result.wall_s = time.perf_counter() - wall0
    if not quiet and not outs.to_stdout:
        print_search(result, Console(), gb)
    if json_target is not None:
        write_outputs({json_target: json_text({**result.to_json(), "global_batch": gb}, "--json")})


def _one_node(job: dict[str, Any]) -> int:
    """The cluster preset's own node count (a search given no --nodes searches the preset as it is)."""
    from .api import preset_cluster

    return preset_cluster(job["cluster"].get("name", "dgx-a100")).nodes


def _checked_held(strategy: dict[str, Any]) -> dict[str, Any]:
    """The knobs a search holds (optimize.space.held_knobs) of a strategy section, checked as an expert-parallel
    strategy takes them (a bad value is the usual one-line error)."""
    held = held_knobs(strategy)
    if held:
        parse_job({"strategy": {**held, "ep": 2}})
    return held


AUTO_TIME_LIMIT_S = 60.0
"""How long `simulate` searches when it is given no parallel degree (the best so far is used after that)."""
_AUTO_FIXED = {"recompute", "zero", "fsdp", "micro_batch", "sequence_parallel", "schedule", "overlap_grad_reduce",
               "overlap_param_gather", "tp_comm_overlap", "global_batch", "ep_dispatcher", "ep_node_limit",
               "ep_dispatcher_sms", "ep_overlap", "cuda_graphs"}
"""Strategy keys a job may set and still have its parallel degrees chosen by the search (as fixed knobs)."""


def wants_search(data: dict[str, Any]) -> bool:
    """A job with no parallel degree, no strategy tree and only knobs the search can hold fixed; on a
    cluster preset (a --topology fixes the GPU count the search would choose)."""
    strat = data.get("strategy") if isinstance(data.get("strategy"), dict) else {}
    cluster = data.get("cluster") if isinstance(data.get("cluster"), dict) else {}
    if any(strat.get(k) is not None for k in (*DEGREES, "tree")) or cluster.get("topology") is not None:
        return False
    if strat.get("schedule") not in (None, "1f1b", "zb-h1", "dualpipev"):
        return False
    return all(k in _AUTO_FIXED for k, v in strat.items() if v is not None)


def resolve_job(config: str | None, flags: dict[str, Any], quiet: bool, time_limit_s: float | None = None
                ) -> tuple[JobConfig, dict[str, Any] | None, LayeredJob]:
    """The job a command runs: the job file (or the default) with the flags on top and, where no parallel
    degree is given, the strategy searched (`auto_strategy`). Returns the job, what the search did (None
    without one) and the layering (for the summary's job line)."""
    from .api import check_compute_model

    layered = apply_flags(load_yaml(config) if config is not None else None, flags)
    searching = wants_search(layered.data)
    raw = layered.data.get("strategy")
    held = _checked_held(raw) if searching else {}
    if held:  # held for the search's ep > 1 candidates, not a strategy that needs ep > 1 before it chose one
        job = parse_job({**layered.data, "strategy": {k: v for k, v in raw.items() if k not in held}})
    else:
        job = parse_job(layered.data)
    check_compute_model(job.simulation)
    if time_limit_s is not None and not 0 < time_limit_s < math.inf:
        raise ConfigError("--search-time-limit", f"must be > 0 seconds, got {time_limit_s}",
                          "pass a positive number of seconds")
    if not searching:
        return job, None, layered
    given = {k: v for k, v in (flags.get("strategy") or {}).items() if v is not None}
    if not layered.from_default and config is not None:  # a job file's own strategy keys hold too
        given = {**(load_yaml(config).get("strategy") or {}), **given}
    data, searched = auto_strategy(layered.data, given, quiet=quiet, time_limit_s=time_limit_s)
    layered = layered._replace(notes=[n for n in layered.notes if "sp off" not in n])
    return parse_job(data), searched, layered


def auto_strategy(data: dict[str, Any], given: dict[str, Any], quiet: bool,
                  time_limit_s: float | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Search the strategy of a job given none (`wants_search`): the strategy keys the user `given` (flags or
    the job file) are held fixed, the rest searched. Returns the job with the best strategy and what the
    search did (for the summary and the JSON)."""
    from .optimize.search import default_global_batch, run_search

    strat = {k: v for k, v in given.items() if v is not None}
    job = {k: dict(data.get(k) or {}) for k in ("model", "cluster", "simulation")}
    if held := held_knobs(strat):  # the expert-parallel dispatch and overlap, for every candidate with ep > 1
        job["strategy"] = held
    from .api import cluster_and_model

    cl, model = cluster_and_model(job)
    nodes = cl.world_size // cl.gpus_per_node if cl.world_size >= cl.gpus_per_node else 1
    fixed: dict[str, list] = {}
    for key in ("recompute", "micro_batch", "sequence_parallel", "schedule", "overlap_grad_reduce",
                "overlap_param_gather", "tp_comm_overlap"):
        if key in strat:
            fixed[key] = [strat[key]]
    if "zero" in strat or strat.get("fsdp"):
        fixed["zero"] = [3 if strat.get("fsdp") else strat["zero"]]
    from .optimize.space import SearchSpace

    space = SearchSpace(**fixed)
    gb = strat.get("global_batch") or default_global_batch(cl.world_size, model.seq_len)
    with search_bar(quiet) as bar:
        result, gb = run_search(job, [nodes], gb, space=space, top=1,
                                time_limit_s=AUTO_TIME_LIMIT_S if time_limit_s is None else time_limit_s,
                                progress=bar)
    best = result.best
    if best is None and not result.proven:
        raise ConfigError("--search-time-limit", f"the strategy search found nothing that fits in {result.wall_s:.0f} s "
                          f"({result.evaluated} simulated)", "raise --search-time-limit, or give the degrees (--tp/--pp)")
    if best is None:
        raise ConfigError("strategy", f"no strategy fits {model.name} in the memory of {cl.world_size} "
                          f"{cl.device.name} GPUs ({result.evaluated} simulated, the rest bounded out)",
                          "add nodes (--nodes), lower --global-batch or --seq-len, or give the degrees (--tp/--pp)")
    chosen = {**result.entry(best)["strategy"], "global_batch": gb}
    out = {**{k: v for k, v in data.items() if k != "strategy"}, "strategy": chosen}
    out["cluster"] = {**job["cluster"], "nodes": nodes}
    info = {"chosen": chosen, "evaluated": result.evaluated, "space": result.space, "pruned": result.pruned,
            "proven_optimal": result.proven, "wall_s": result.wall_s, "global_batch_default": "global_batch" not in strat}
    return out, info


def auto_note(info: dict[str, Any]) -> str:
    """The summary's words for what the search chose."""
    s = info["chosen"]
    degrees = " x ".join(f"{k.upper()}{s[k]}" for k in ("tp", "pp", "dp", "cp", "ep") if s.get(k, 1) > 1) or "DP1"
    how = "best of" if info["proven_optimal"] else "best found in the time limit among"
    gb = f"; global batch {s['global_batch']} (default: ~4M tokens)" if info["global_batch_default"] else ""
    return (f"strategy chosen by search ({how} {info['space']:,} configurations, {info['evaluated']} simulated, "
            f"{info['wall_s']:.1f} s): {degrees}{gb}")
