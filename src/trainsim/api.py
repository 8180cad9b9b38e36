"""Python API: `simulate(...)` runs the whole pipeline and returns a SimulationResult.

workload -> strategy -> compile (templates) -> cost (annotate) -> compile (graph) -> sim -> result
"""

from __future__ import annotations

import difflib
import gc
import math
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import trainsim as _public

from .compile.graph import ExecutionGraph, WorkEstimate, build_graph, predict_tasks
from .compile.program import Program, Stream, lower, stretch_compute
from .config import (
    DEFAULT_JOB,
    LEARNED_PREFIX,
    ClusterSpec,
    JobConfig,
    ModelSpec,
    RemoteMemorySpec,
    SimulationSpec,
    StrategySpec,
    job_dict,
    learned_path,
    load_yaml,
    parse_job,
)
from .cost.allocator import replay_stages
from .cost.annotate import FlowBook, annotate, optimizer_time
from .cost.calibration import load_calibration
from .cost.comm import CommModel, NcclComm
from .cost.compute import RooflineCompute
from .cost.memory import (
    CUBLASLT_WORKSPACE_BYTES,
    RUNTIME_RESERVED_BYTES,
    StaticMemory,
    job_precision,
    static_memory,
)
from .cost.multidim import AnalyticalComm
from .cost.offload import offload_memory_system
from .errors import ConfigError
from .hardware.cluster import CLUSTERS, Cluster, get_cluster
from .hardware.devices import get_device
from .hardware.memory_systems import HierarchicalPool, MemorySystem
from .hardware.topology import TOPOLOGY_PRESETS, cluster_from_topology, format_topology, resolve_topology
from .limits import BYTES_PER_TASK, MAX_GPUS, MAX_PREDICTED_TASKS
from .sim.engine import SimTrace, run
from .sim.periodic import (
    Fold,
    FoldedSummary,
    find_fold,
    fold_summary,
    period_candidates,
    reduced_micro_batches,
)
from .sim.result import (
    BREAKDOWN_KEYS,
    SimulationResult,
    StageMemory,
    class_breakdowns,
    critical_path,
    fullest_stage,
    task_columns,
    time_by_category,
)
from .strategy.placement import placement
from .strategy.precision import Precision
from .strategy.presets import ParallelSpec, build_strategy
from .strategy.tree import StrategyTree, cuda_graph_scope, selective_mode
from .workload.hf import build_hf_model
from .workload.ir import Model
from .workload.zoo import FEATURES, build_model, is_transformer, model_names

ProgressFn = Callable[[str, int, int], None]
"""progress(phase, done, total): 'building graph' (tasks built of those predicted), then 'simulating' (tasks
finished of the graph's); called every few thousand tasks from the simulating thread. Only when asked."""


@contextmanager
def _gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off for one simulation (simulate, simulate_tree, simulate_costed), back on
    after it (even on an error) if it was on.

    Why: a call's tens of thousands of new container objects, most alive until it returns, set off ~25
    generation-0 passes a call and a full pass every few calls (~25 ms for Llama-3.1 405B) that re-scan
    survivors and free next to nothing: ~4 ms of a 60 ms warm default job in the mean, and a full pass landing in one
    stage inflates that stage's time (Llama's job_tree: 3 ms, 27 ms on the calls a full pass hit). Safe: the
    cyclic garbage a call leaves is its strategy tree and model (nodes point back at their tree; ~5k objects for
    GPT-3), alive to the end of the call anyway; they and whatever else the call drops are collected after it, as
    before. Only the caller's setting is restored: nested calls (the outer one re-enables) and a collector the
    caller turned off stay as they were. The switch is process-wide, so a thread that runs while a simulation
    does also runs without the collector for that while (memory only, never a different answer); a thread
    that turns the collector off during a simulation has it turned back on when the simulation ends."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def default_job() -> JobConfig:
    """The embedded default: GPT-3 175B on 1024 A100-80GB (128 DGX A100), Megatron 3D parallel."""
    return parse_job(DEFAULT_JOB)


def _topology_cluster(job: JobConfig) -> Cluster:
    """A cluster whose interconnect is the job's topology (ASTRA-sim notation or a preset)."""
    c, s = job.cluster, job.strategy
    world = s.dp * s.tp * s.pp * s.cp if s.dp is not None else None  # ep divides dp
    topo = c.topology or c.name  # a topology preset may also be named as the cluster (--cluster conv-4d)
    try:
        levels = resolve_topology(topo, c.bandwidth_gbps, c.latency_ns, npus=world)
    except ValueError as exc:
        fix = "or set strategy.dp so dp x tp x pp x cp equals it" if "NPUs but" in str(exc) else ""
        raise ConfigError("cluster.topology", str(exc), fix) from None
    preset = TOPOLOGY_PRESETS.get(topo.strip().lower())
    try:
        base = get_cluster(c.name)
    except KeyError:
        base = None
    name = c.gpu or (preset.device if preset and preset.device else None) or (base.device.name if base else "a100-80gb")
    try:
        device = get_device(name)
    except KeyError:
        raise ConfigError("cluster.gpu", f"unknown GPU '{name}'", "see `trainsim clusters` for device names") from None
    return cluster_from_topology(levels, device, name=f"topology {format_topology(levels)}")


def preset_cluster(name: str, field: str = "cluster.name") -> Cluster:
    """A cluster preset by name at its default size; an unknown name is a one-line ConfigError on `field`."""
    try:
        return get_cluster(name)
    except KeyError:
        raise ConfigError(field, f"unknown cluster '{name}'",
                          f"use one of {', '.join(sorted(CLUSTERS))} (trainsim clusters)") from None


def _check_gpus(nodes: int, gpus_per_node: int, job: JobConfig) -> None:
    """Refuse a cluster above MAX_GPUS before anything is sized to it, naming the key that made it so big."""
    if nodes * gpus_per_node <= MAX_GPUS:
        return
    c = job.cluster
    field = ("cluster.nodes" if c.nodes is not None else "cluster.gpus_per_node" if c.gpus_per_node is not None
             else "strategy.dp")
    raise ConfigError(field, f"{nodes:,} node{'s' if nodes > 1 else ''} x {gpus_per_node:,} GPUs = "
                      f"{nodes * gpus_per_node:,} GPUs is above the limit of {MAX_GPUS:,}",
                      "simulate a smaller cluster (fewer nodes or smaller degrees)")


def _cluster(job: JobConfig) -> Cluster:
    """The job's cluster: its preset or topology, resized and customised, on hosts as fast as it says."""
    cl = _sized_cluster(job)
    scale = job.cluster.host_overhead_scale
    return cl if scale is None else replace(cl, host_overhead_scale=scale)


def _sized_cluster(job: JobConfig) -> Cluster:
    s = job.strategy
    nodes = job.cluster.nodes
    if job.cluster.topology is not None:
        return _topology_cluster(job)
    if job.cluster.name.strip().lower() in TOPOLOGY_PRESETS:  # --cluster conv-4d: the topology preset's NPUs
        c = job.cluster
        for key in ("nodes", "gpus_per_node", "intra_node_gbps", "nics_per_node", "nic_gbps"):
            if getattr(c, key) is not None:
                raise ConfigError(f"cluster.{key}", f"'{c.name}' is a topology preset: its size and links are "
                                  "fixed", "drop it, or give --topology with your own dimensions")
        return _topology_cluster(job)
    base = preset_cluster(job.cluster.name)
    gpn = job.cluster.gpus_per_node or base.gpus_per_node
    if nodes is None and s.dp is not None and base.has_network:  # a single box keeps its GPUs
        world = s.dp * s.tp * s.pp * s.cp
        if world % gpn and world > gpn:
            raise ConfigError("strategy.dp", f"dp x tp x pp x cp = {world} GPUs is not a whole number of "
                              f"{gpn}-GPU nodes", "adjust the degrees or pass --nodes")
        nodes = max(1, world // gpn)
    _check_gpus((nodes or base.nodes) if base.has_network else 1, gpn, job)
    try:
        cl = base.with_nodes(nodes or base.nodes)
    except ValueError as exc:
        raise ConfigError("cluster.nodes", str(exc), "use --nodes 1 for this single-box preset") from None
    c = job.cluster
    if c.gpu is None and c.gpus_per_node is None and c.intra_node_gbps is None and c.nics_per_node is None \
            and c.nic_gbps is None:
        return cl
    try:
        device = get_device(c.gpu) if c.gpu is not None else None
    except KeyError:
        raise ConfigError("cluster.gpu", f"unknown GPU '{c.gpu}'", "see `trainsim clusters` for device names") from None
    try:
        return cl.customised(device=device, gpus_per_node=c.gpus_per_node, intra_gbps=c.intra_node_gbps,
                             nics_per_node=c.nics_per_node, nic_gbps=c.nic_gbps)
    except ValueError as exc:
        raise ConfigError("cluster.gpus_per_node", str(exc), "use a switch-based preset such as dgx-a100") from None


def _spec(job: JobConfig, world: int) -> ParallelSpec:
    s = job.strategy
    per_replica = s.tp * s.pp * s.cp
    dp = s.dp
    if dp is None:
        if world % per_replica:
            raise ConfigError("strategy.tp", f"tp x pp x cp = {per_replica} does not divide the {world} GPUs",
                              "choose degrees whose product divides the GPU count")
        dp = world // per_replica
    if dp * per_replica != world:
        raise ConfigError("strategy.dp", f"dp x tp x pp x cp = {dp}x{s.tp}x{s.pp}x{s.cp} = {dp * per_replica} "
                          f"does not match the cluster's {world} GPUs",
                          f"set --dp {world // per_replica if world % per_replica == 0 else '?'} or change --nodes")
    if s.vpp > 1 and s.schedule == "gpipe":
        raise ConfigError("strategy.schedule", f"gpipe has no virtual stages (vpp={s.vpp})",
                          "use --schedule interleaved (or 1f1b) with --vpp, or --vpp 1 with gpipe")
    vpp = s.vpp
    if s.schedule == "dualpipev":  # two chunks per rank, the V
        if vpp not in (1, 2):
            raise ConfigError("strategy.vpp", f"dualpipev runs two chunks per rank (a V), not vpp={vpp}",
                              "drop --vpp (dualpipev sets 2) or use --schedule interleaved")
        vpp = 2
    gb = s.global_batch or s.micro_batch * dp
    return ParallelSpec(dp=dp, tp=s.tp, pp=s.pp, cp=s.cp, ep=s.ep, etp=s.etp, vpp=vpp,
                        sequence_parallel=s.sequence_parallel,
                        zero=3 if s.fsdp else s.zero,
                        recompute=selective_mode(s.recompute_modules) if s.recompute == "selective" else s.recompute,
                        schedule="interleaved" if vpp > 1 and s.schedule not in ("dynamic", "zb-h1", "dualpipev")
                        else s.schedule,
                        max_ongoing=s.max_ongoing_micro_batch, micro_batch=s.micro_batch,
                        global_batch=gb, overlap_grad_reduce=s.overlap_grad_reduce,
                        overlap_param_gather=s.overlap_param_gather, tp_comm_overlap=s.tp_comm_overlap,
                        cp_comm=s.cp_comm, ep_dispatcher=s.ep_dispatcher, ep_node_limit=s.ep_node_limit,
                        ep_dispatcher_sms=s.ep_dispatcher_sms, ep_overlap=s.ep_overlap,
                        dp_replicate=s.dp_replicate, first_stage_layers=s.first_stage_layers,
                        last_stage_layers=s.last_stage_layers,
                        stage_layer_counts=tuple(s.stage_layers) if s.stage_layers is not None else None,
                        p2p_scatter_gather=s.p2p_scatter_gather,
                        offload=s.offload, offload_activations=s.offload_activations,
                        cuda_graphs=cuda_graph_scope(s.cuda_graphs))


def _zoo_model(name: str, batch: int, seq_len: int | None, attention: str, dims: dict[str, int | None],
               features: dict[str, Any] | None = None) -> Model:
    """A built-in model by name, bad names and dimensions turned into ConfigErrors."""
    try:
        return build_model(name, batch, seq_len, attention, features, **dims)
    except ConfigError:
        raise
    except KeyError as exc:
        if name not in model_names():
            raise ConfigError("model.name", f"unknown model '{name}'", "see `trainsim models` for the names") from None
        raise ConfigError("model", str(exc).strip("'\""), "") from None
    except ValueError as exc:
        raise ConfigError("model.seq_len", str(exc), "use a shorter --seq-len") from None


def _advice(mem: list[StageMemory], spec: ParallelSpec) -> list[str]:
    """What to change when a stage does not fit, sized by how far over it is: the fullest stage's largest
    component first (optimize.oom_fixes tries the changes; `trainsim simulate` prints the ones that fit)."""
    worst = fullest_stage(mem)
    if worst.fits:
        return []
    tips = [worst.over_line()]
    if worst.static_bytes > worst.capacity_bytes:
        need = worst.static_bytes / worst.capacity_bytes
        tips.append(f"weights, gradients and optimizer states alone take {worst.static_bytes / 2**30:.0f} GiB: shard "
                    f"them at least {need:.1f}x further (--zero 3 shards over dp={spec.dp}; --tp/--pp split the model)")
    elif worst.activation_peak_bytes > worst.static_bytes:
        if spec.recompute != "full":
            tips.append("activations dominate: try --recompute " + ("selective" if spec.recompute == "none" else "full"))
        if spec.micro_batch > 1:
            tips.append("or lower --micro-batch")
        if not spec.sequence_parallel and spec.tp > 1:
            tips.append("or enable --sp (sequence parallelism)")
    else:
        if spec.zero < 3:
            tips.append(f"parameters/optimizer dominate: try --zero {spec.zero + 1}")
        tips.append("or raise --tp / --pp to shard the model further")
    return tips


@_gc_paused()
def simulate(job: JobConfig | dict[str, Any] | None = None, *, model: str | dict[str, Any] | None = None,
             cluster: str | dict[str, Any] | None = None, strategy: dict[str, Any] | None = None,
             bandwidth_sharing: bool | None = None, progress: ProgressFn | None = None, timeline: bool = False,
             **options: Any) -> SimulationResult:
    # docstring: trainsim.simulate's, assigned below (one text; help() shows it without importing this)
    wall0 = time.perf_counter()
    if job is None:
        job = parse_job(job_from_keywords(model, cluster, strategy, options))
    else:
        given = [k for k, v in (("model", model), ("cluster", cluster), ("strategy", strategy)) if v is not None]
        given += list(options)
        if given:
            raise ConfigError(given[0], "is ignored when a job is passed", "put it into the job, or pass keywords only")
        if isinstance(job, dict):
            job = parse_job(job)
        elif not isinstance(job, JobConfig):
            raise ConfigError("job", f"must be a JobConfig or a dict of model/cluster/strategy/simulation sections, "
                              f"not {type(job).__name__}", "or use keywords: simulate(model='gpt2', cluster='dgx-a100')")
    if bandwidth_sharing is not None and not isinstance(bandwidth_sharing, bool):
        raise ConfigError("bandwidth_sharing", f"must be True or False, not {bandwidth_sharing!r}", "")
    if bandwidth_sharing is not None:
        job = job.model_copy(update={"simulation": job.simulation.model_copy(
            update={"bandwidth_sharing": bool(bandwidth_sharing)})})
    if job.strategy.tree is not None:
        tree = _tree_from_file(job)
        spec = _spec_of_tree(tree)
        if job.cluster.nodes is None and job.cluster.topology is None:
            gpn = job.cluster.gpus_per_node or preset_cluster(job.cluster.name).gpus_per_node
            job = job.model_copy(update={"cluster": job.cluster.model_copy(
                update={"nodes": max(1, -(-tree.mesh.world_size // gpn))})})
        cl = _cluster(job)
    else:
        cl, spec, tree = job_tree(job)
    try:
        return _run_tree(tree, cl, job.simulation, spec, wall0, progress, job.cluster.remote_memory,
                         timeline=timeline)
    finally:
        tree.release()  # the tree is this call's own: freed at once, not by a pass of the cyclic collector


def resolved_job(job: JobConfig, result: SimulationResult) -> JobConfig:
    """The job as it ran, runnable from anywhere: the derived dp, global batch and node count set, and the
    files it names (tree, HF config, remote memory, learned model) made absolute."""
    resolved = job.model_copy(deep=True)
    s = result.strategy
    if resolved.strategy.tree is None:
        resolved.strategy.dp = s["dp"]
        resolved.strategy.global_batch = s["global_batch"]
    else:
        resolved.strategy.tree = str(Path(resolved.strategy.tree).resolve())
    if resolved.model.hf_config is not None:
        resolved.model.hf_config = str(Path(resolved.model.hf_config).resolve())
    remote = resolved.cluster.remote_memory
    if remote is not None and remote.config is not None:
        remote.config = str(Path(remote.config).resolve())
    learned = learned_path(resolved.simulation.compute_model)
    if learned is not None:
        resolved.simulation.compute_model = LEARNED_PREFIX + str(Path(learned).resolve())
    c = job.cluster
    if c.topology is None and c.name.strip().lower() not in TOPOLOGY_PRESETS:  # a topology's size is fixed
        gpus_per_node = c.gpus_per_node or preset_cluster(c.name).gpus_per_node
        resolved.cluster.nodes = max(1, result.n_gpus // max(1, gpus_per_node))
    return resolved


def simulation_json(job: JobConfig, result: SimulationResult, searched: dict[str, Any] | None = None
                    ) -> dict[str, Any]:
    """What `simulate --json` writes: the result, its kind and the resolved job (so a report can draw the
    schedule again), with the strategy search's account when the degrees were searched."""
    return {"kind": "simulation", **result.to_json(), "job": job_dict(resolved_job(job, result)),
            **({"strategy_search": searched} if searched else {})}


_SECTIONS: dict[str, type[ModelSpec | ClusterSpec | StrategySpec | SimulationSpec]] = {
    "model": ModelSpec, "cluster": ClusterSpec, "strategy": StrategySpec, "simulation": SimulationSpec}


def keyword_sections() -> dict[str, str]:
    """simulate() keyword -> its JobConfig section, read off the pydantic models' fields (a key two sections
    share, i.e. `name`, is left out: model= and cluster= give the names)."""
    seen: dict[str, list[str]] = {}
    for section, spec in _SECTIONS.items():
        for key in spec.model_fields:
            seen.setdefault(key, []).append(section)
    return {k: v[0] for k, v in seen.items() if len(v) == 1}


def job_from_keywords(model: Any, cluster: Any, strategy: Any, options: dict[str, Any],  # noqa: ANN401
                      caller: str = "simulate") -> dict[str, Any]:
    """The nested job dict `simulate`'s (or `caller`'s) keywords describe; wrong types and unknown keywords
    are ConfigErrors."""
    data: dict[str, dict[str, Any]] = {section: {} for section in _SECTIONS}
    for section, value, what in (("model", model, "a model name"), ("cluster", cluster, "a cluster preset name"),
                                 ("strategy", strategy, None)):
        if value is None:
            continue
        if isinstance(value, dict):
            data[section].update(value)
        elif isinstance(value, str) and what is not None:
            data[section]["name"] = value
        else:
            example = "{'tp': 8, 'pp': 2}" if section == "strategy" else "{'name': ...}"
            raise ConfigError(section, f"must be {what + ' or ' if what else ''}a dict of {section} keys, not "
                              f"{type(value).__name__} {value!r}"[:160], f"e.g. {section}={example}")
    routes = keyword_sections()
    for key, value in options.items():
        section = routes.get(key)
        if section is None:
            close = difflib.get_close_matches(key, [*routes, "job", "model", "cluster", "strategy"], n=3)
            raise ConfigError(key, f"is not a {caller}() keyword",
                              f"did you mean {' or '.join(close)}?" if close else
                              f"use the keys of the model/cluster/strategy/simulation sections (help(trainsim.{caller}))")
        if key in data[section]:
            raise ConfigError(f"{section}.{key}", f"given twice (as {key}= and inside {section}=)", "pass it once")
        data[section][key] = os.fspath(value) if isinstance(value, os.PathLike) else value
    return data


def job_tree(job: JobConfig) -> tuple[Cluster, ParallelSpec, StrategyTree]:
    """The cluster, preset knobs and strategy tree of a job given by its strategy keys (not a tree file)."""
    cl = _cluster(job)
    spec = _spec(job, cl.world_size)
    tree = build_strategy(_job_model(job, spec.micro_batch * spec.dp), spec)
    tree.offload_in_switch = job.strategy.offload_in_switch  # a strategy key the presets do not carry
    return cl, spec, tree


def cluster_and_model(job: JobConfig | dict[str, Any]) -> tuple[Cluster, Model]:
    """A job's cluster and model (one sample per replica: for their shapes), whatever its strategy; what a
    strategy search needs before it chooses one."""
    job = parse_job({**job, "strategy": {}}) if isinstance(job, dict) else job
    return _cluster(job), _job_model(job, 1)


def strategy_tree(job: JobConfig | dict[str, Any]) -> StrategyTree:
    """The job's strategy tree, resolved (what `--dump-strategy` writes), without simulating it."""
    job = parse_job(job) if isinstance(job, dict) else job
    if job.strategy.tree is not None:
        return _tree_from_file(job)
    return job_tree(job)[2].resolve()


@_gc_paused()
def simulate_tree(tree: StrategyTree, cluster: str = "dgx-a100", *, nodes: int | None = None,
                  progress: ProgressFn | None = None, **simulation: Any) -> SimulationResult:
    # docstring: trainsim.simulate_tree's, assigned below
    wall0 = time.perf_counter()
    if not isinstance(tree, StrategyTree):
        raise ConfigError("tree", f"must be a StrategyTree, not {type(tree).__name__}",
                          "build one with StrategyTree.from_model(...), or call simulate() for a job")
    if not isinstance(cluster, str):
        raise ConfigError("cluster", f"must be a cluster preset name, not {type(cluster).__name__}",
                          f"use one of {', '.join(sorted(CLUSTERS))}")
    base = preset_cluster(cluster)
    world = tree.mesh.world_size
    if nodes is None:
        nodes = max(1, -(-world // base.gpus_per_node)) if base.has_network else 1
    spec: dict[str, Any] = {"name": cluster, "nodes": nodes}
    if nodes == 1 and world < base.gpus_per_node:
        spec["gpus_per_node"] = world  # part of one node
    job = parse_job({"cluster": spec, "simulation": simulation})
    cl = _cluster(job)
    return _run_tree(tree, cl, job.simulation, _spec_of_tree(tree), wall0, progress)


simulate.__doc__ = _public.simulate.__doc__
simulate_tree.__doc__ = _public.simulate_tree.__doc__

def _job_model(job: JobConfig, batch: int) -> Model:
    """The job's model (built-in or imported Hugging Face config) with `batch` samples per step of one replica."""
    m = job.model
    dims = {"layers": m.layers, "hidden": m.hidden, "heads": m.heads, "kv_heads": m.kv_heads, "ffn": m.ffn,
            "vocab": m.vocab}
    features = {k: getattr(m, k) for k in FEATURES if getattr(m, k) is not None}
    if "attention" in m.model_fields_set and m.hf_config is None and not is_transformer(m.name) \
            and m.name in model_names():
        raise ConfigError("model.attention", f"{m.name} has no attention layers", "drop --attention for this model")
    if features and m.hf_config is None and not is_transformer(m.name) and m.name in model_names():
        key = next(iter(features))
        raise ConfigError(f"model.{key}", f"{m.name} is not a transformer", f"drop model.{key} for this model")
    if m.hf_config is not None:
        if "name" in m.model_fields_set:
            raise ConfigError("model.name", f"and model.hf_config both name the model ('{m.name}' and "
                              f"{m.hf_config})", "keep only one of them (--model or --hf-config)")
        return build_hf_model(m.hf_config, batch, m.seq_len, m.attention, features=features, **dims)
    return _zoo_model(m.name, batch, m.seq_len, m.attention, dims, features)


def _tree_from_file(job: JobConfig) -> StrategyTree:
    """A saved strategy tree (`strategy.tree`, from `--dump-strategy` or `StrategyTree.to_yaml`) for the job's model."""
    s = job.strategy
    extra = sorted(k for k in s.model_fields_set if k != "tree")
    if extra:
        raise ConfigError(f"strategy.{extra[0]}", "a strategy tree file replaces the other strategy keys",
                          "edit the tree file, or drop strategy.tree")
    path = Path(str(s.tree))
    data = load_yaml(path, "strategy.tree")
    mesh = data.get("mesh") if isinstance(data.get("mesh"), dict) else {}
    try:
        replicas = int(mesh.get("dp", 1)) * int(mesh.get("ep", 1))
        batch = int(data.get("micro_batch", 1)) * replicas
    except (TypeError, ValueError):
        raise ConfigError("strategy.tree", f"{path}: mesh and micro_batch must be integers",
                          "write it with --dump-strategy") from None
    return StrategyTree.from_dict(_job_model(job, batch), data)


def _spec_of_tree(tree: StrategyTree) -> ParallelSpec:
    """The preset knobs a tree amounts to, for the result's strategy echo and the OOM advice."""
    mesh, sched = tree.mesh, tree.schedule
    tree.resolve()
    sp = any(leaf.leaf.saved for leaf, _ in tree.root.ops())
    items = tree.root.shard_items or frozenset()
    zero = max(tree.zero_stage, 3 if "weight" in items else 2 if "grad" in items else 1 if "optimizer" in items else 0)
    recompute = tree.root.recompute_mode or "none"
    return ParallelSpec(dp=mesh.dp * mesh.ep * mesh.dr, dp_replicate=mesh.dr, tp=mesh.tp, pp=mesh.pp, cp=mesh.cp, ep=mesh.ep,
                        vpp=sched.virtual_stages, sequence_parallel=sp, zero=zero, recompute=recompute,
                        schedule=sched.kind, max_ongoing=sched.max_ongoing_micro_batch,
                        micro_batch=tree.micro_batch, global_batch=tree.global_batch,
                        overlap_grad_reduce=tree.overlap_grad_reduce, overlap_param_gather=tree.overlap_param_gather,
                        tp_comm_overlap=tree.tp_comm_overlap, cp_comm=tree.cp_comm,
                        ep_dispatcher=tree.ep_dispatcher, ep_node_limit=tree.ep_node_limit,
                        ep_dispatcher_sms=tree.ep_dispatcher_sms, ep_overlap=tree.ep_overlap,
                        p2p_scatter_gather=tree.p2p_scatter_gather, offload=tree.offload,
                        offload_activations=tree.offload_activations, cuda_graphs=tree.cuda_graphs)


def check_work(tree: StrategyTree, sim: SimulationSpec) -> WorkEstimate:
    """The job's predicted execution-graph size (compile.graph.predict_tasks, O(layers)); a ConfigError naming
    what to lower when it is above MAX_PREDICTED_TASKS (about 3 GiB and a minute)."""
    est = predict_tasks(tree, exact=sim.exact, granularity=sim.granularity)
    if est.tasks <= MAX_PREDICTED_TASKS:
        return est
    problem = (f"the job would build ~{est.tasks:,} tasks (~{est.tasks * BYTES_PER_TASK / 2**30:,.1f} GiB), above "
               f"the limit of {MAX_PREDICTED_TASKS:,}")
    if sim.exact and predict_tasks(tree, granularity=sim.granularity).tasks <= MAX_PREDICTED_TASKS:
        raise ConfigError("simulation.exact", f"per-rank simulation of {tree.mesh.world_size:,} GPUs: {problem}",
                          "drop --exact: rank classes give the same answer")
    if sim.granularity != "auto" and predict_tasks(tree, exact=sim.exact).tasks <= MAX_PREDICTED_TASKS:
        raise ConfigError("simulation.granularity", f"{sim.granularity} granularity: {problem}",
                          "use --granularity auto")
    fit = (MAX_PREDICTED_TASKS - est.fixed) // max(1, est.per_micro_batch)
    if est.micro_batches > 1 and fit >= 1:
        raise ConfigError("strategy.global_batch", f"{est.micro_batches:,} micro-batches: {problem}",
                          f"lower --global-batch or raise --micro-batch to at most {fit:,} micro-batches "
                          f"(global batch / (micro-batch x dp))")
    raise ConfigError("model.layers", f"{len(tree.leaves()):,} layers: {problem} for one micro-batch",
                      "use fewer --layers" + (" or drop --exact" if sim.exact else "")
                      + (" or --granularity auto" if sim.granularity != "auto" else ""))


@dataclass
class CostedProgram:
    """A lowered program with every step costed by the job's models: what the graph builder, the memory
    accounting and the search's bounds (optimize.bounds) all read."""

    program: Program
    precision: Precision
    compute: RooflineCompute
    flows: FlowBook | None
    peak_flops: float
    gamma: float
    p2p_host_sync: bool


def offload_memory(tree: StrategyTree, cl: Cluster, remote_memory: RemoteMemorySpec | None = None
                   ) -> MemorySystem | None:
    """The memory system that prices the tree's offload loads and stores (`cluster.remote_memory` for a remote
    pool); what a tree file asks for that the pool cannot do is a one-line ConfigError."""
    if remote_memory is not None and tree.offload != "remote":
        raise ConfigError("cluster.remote_memory", f"only applies with strategy.offload remote (the strategy's "
                          f"offload is {tree.offload})", "offload to remote, or drop it")
    # activation offloading moves checkpointed inputs to CPU memory whatever holds the model states
    target = "cpu" if tree.offload_activations and tree.offload == "none" else tree.offload
    if tree.offload_activations and target != "cpu":
        raise ConfigError("strategy.offload_activations", f"moves activations to CPU memory; the model states are "
                          f"offloaded to {tree.offload}", "offload the states to cpu (or not at all) with it")
    memory = offload_memory_system(target, cl, remote_memory)
    if tree.offload_in_switch and (tree.offload != "remote" or not isinstance(memory, HierarchicalPool)):
        where = f"offload {tree.offload}" if tree.offload != "remote" or remote_memory is None \
            else f"the {remote_memory.pool} pool"
        raise ConfigError("strategy.offload_in_switch", f"in-switch collectives need a hierarchical remote pool "
                          f"(hiermem), not {where}", "offload to remote with pool hiermem, or drop it")
    return memory


def comm_model(cl: Cluster, sim: SimulationSpec) -> CommModel:
    """The job's communication model on `cl` (simulation.semantics, comm_model and calibration), as
    `costed_program` prices collectives with it."""
    if sim.semantics == "astra":  # ASTRA-sim's analytical backend: its system layer's settings, trainsim's levels
        from .astra_inputs import AstraSystem, load_system

        system = load_system(sim.astra_system, "simulation.astra_system", len(cl.levels)) \
            if sim.astra_system is not None else AstraSystem()
        return system.comm(cl.levels, scheduler=sim.scheduler)
    if sim.comm_model == "analytical":
        return AnalyticalComm(cl.levels, scheduler=sim.scheduler)
    return NcclComm(cl, load_calibration(sim.calibration).comm or None)


def job_cluster(job: JobConfig | dict[str, Any]) -> Cluster:
    """The cluster a job runs on (its strategy sizes a preset without --nodes), without its model or tree."""
    return _cluster(parse_job(job) if isinstance(job, dict) else job)


def costed_program(tree: StrategyTree, cl: Cluster, sim: SimulationSpec,
                   remote_memory: RemoteMemorySpec | None = None, *, flows: bool = True,
                   comm: CommModel | None = None) -> CostedProgram:
    """Lower the tree in the job's precision and cost every step (compute, communication, memory);
    `remote_memory` is the job's cluster.remote_memory (the pool behind offload remote). `flows=False`: no
    FlowBook for the graph builder (the analytic tier reads durations only; they are the same). `comm`: the
    job's comm model on `cl` (`comm_model(cl, sim)`, the default) when the caller keeps one for many programs."""
    memory = offload_memory(tree, cl, remote_memory)  # before lowering: a pool that cannot serve it is refused
    if sim.dtype != "auto" and not cl.device.supports(sim.dtype):
        raise ConfigError("simulation.dtype", f"{cl.device.name} does not support {sim.dtype}",
                          f"use one of {', '.join(cl.device.dtypes)} or auto ({cl.device.training_dtype})")
    precision = job_precision(tree, cl.device, sim)
    try:
        peak = cl.device.peak_flops(precision.compute_dtype)
    except KeyError:
        raise ConfigError("simulation.dtype", f"{cl.device.name} has no {precision.compute_dtype} peak",
                          f"use one of {', '.join(cl.device.dtypes)}") from None
    program = lower(tree, precision)
    if tree.offload_in_switch and not any(s.in_switch for ch in program.chunks for s in ch.fwd):
        raise ConfigError("strategy.offload_in_switch", "needs sharded parameters (ZeRO-3 or FSDP): there is no "
                          "parameter all-gather to do in the switches", "shard the weights (zero 3), or drop it")
    cal = load_calibration(sim.calibration)
    cparams = cal.compute_for(cl.device)
    compute = RooflineCompute(cparams)
    gamma = cal.gamma if sim.gamma is None else sim.gamma
    book = annotate(program, cl, compute, comm or comm_model(cl, sim), collective_host_s=cparams.collective_host_s,
                    sharing=sim.bandwidth_sharing, exact=sim.exact, memory=memory, flows=flows, gamma=gamma)
    return CostedProgram(program, precision, compute, book, peak, gamma, cal.p2p_host_sync)


def check_compute_model(sim: SimulationSpec) -> None:
    """Read a learned compute model once, up front (a command that simulates many jobs, a search say, would
    otherwise report a damaged file as every job's error); the roofline needs no check."""
    if sim.compute_model != "roofline":
        from .learn.models import Fitted

        Fitted.load(learned_path(sim.compute_model) or "", "simulation.compute_model")


@_gc_paused()
def simulate_costed(job: JobConfig | dict[str, Any]) -> tuple[SimulationResult, CostedProgram]:
    """A job given by its strategy keys simulated, and the costed program it ran: what a model that reads
    the program (trainsim.learn's stage graphs) needs beside the prediction, lowered once."""
    job = parse_job(job) if isinstance(job, dict) else job
    wall0 = time.perf_counter()
    cl, spec, tree = job_tree(job)
    with tree.held_resolved():  # resolved once for the three passes below (nothing edits it in between)
        check_work(tree, job.simulation)
        costed = costed_program(tree, cl, job.simulation, job.cluster.remote_memory)
        return _run_tree(tree, cl, job.simulation, spec, wall0, costed=costed), costed


def compute_response(job: JobConfig, costed: CostedProgram, chunk: int, iteration_s: float,
                     scale: float = 1.1) -> float:
    """How much the simulated iteration grows per second added to one micro-batch's compute on `chunk` when
    every chunk's work is stretched alike (compile.program.stretch_compute) (d iteration / d stage compute, by a second simulation with
    compute x `scale`): the event simulation's own pipeline composition, where PredTOP's formula assumes
    micro-batches + stages - 1. Stretches `costed`'s compute steps in place (done with it afterwards)."""
    cl, spec, tree = job_tree(job)
    ch = costed.program.chunks[chunk]
    stretched = (scale - 1.0) * sum(s.duration_s for s in (*ch.fwd, *ch.bwd) if s.stream == Stream.COMPUTE)
    for c in costed.program.chunks:
        stretch_compute(c, scale)
    if stretched <= 0:
        return 0.0
    probe = _simulate_program(costed.program.tree, cl, job.simulation, spec, costed,
                              check_work(tree, job.simulation).tasks, None)
    return (probe.iteration_time_s - iteration_s) / stretched


def _run_tree(tree: StrategyTree, cl: Cluster, sim: SimulationSpec, spec: ParallelSpec,
              wall0: float, progress: ProgressFn | None = None,
              remote_memory: RemoteMemorySpec | None = None, costed: CostedProgram | None = None,
              timeline: bool = False) -> SimulationResult:
    """Compile, cost and simulate one strategy tree on a cluster (the one path every job takes);
    `remote_memory`: the pool behind offload remote (cluster.remote_memory); `costed`: the tree already
    lowered and costed on `cl` with `sim` (simulate_costed); `timeline`: keep every task's times."""
    if tree.mesh.world_size != cl.world_size:
        raise ConfigError("strategy.tree", f"the strategy's mesh has {tree.mesh.world_size} GPUs, the cluster "
                          f"{cl.world_size}", "set --nodes (or the mesh) so that they match")
    analytic = sim.fidelity == "analytic"  # closed form: no graph, so no task limit
    # predict_tasks and lower both resolve the tree; nothing below edits it, so once is enough
    with tree.held_resolved():
        predicted = 0 if analytic else check_work(tree, sim).tasks  # before lowering: a too-large job is refused
        costed = costed or costed_program(tree, cl, sim, remote_memory, flows=not analytic)
        run_program = _analytic_program if analytic else _simulate_program
        result = run_program(tree, cl, sim, spec, costed, predicted, progress, timeline)
        if sim.compute_model != "roofline":  # the roofline's times are the learned model's features
            from .learn.compute import correct_program

            correction = correct_program(sim.compute_model, costed.program, result.iteration_time_s,
                                         costed.peak_flops, cl.device.name, sim.learned_extrapolation)
            result = run_program(tree, cl, sim, spec, costed, predicted, progress, timeline)
            result.learned = correction.to_json()
            if correction.note:
                result.model_assumptions.append(correction.note)
    result.simulation_wall_s = time.perf_counter() - wall0
    return result


def _folded_run(program: Program, build: dict[str, Any], engine: dict[str, Any], predicted: int,
                progress: ProgressFn | None
                ) -> tuple[tuple[ExecutionGraph, SimTrace, Fold, FoldedSummary] | None, str | None]:
    """Simulate fewer identical micro-batches and add the repeating periods (sim.periodic: the counts it
    proposes, smallest first); None (and why, for verbose output) when the schedule does not repeat exactly or
    folding would save too little. The reduced run's columns are read once, for the fold and its summary.
    `progress` sees the reduced graph: its tasks built (of `predicted` scaled down) and simulated."""
    mesh, sched = program.tree.mesh, program.tree.schedule
    m = sched.n_micro_batch
    tries = [(period, reduced) for period in period_candidates(sched.kind, mesh.pp)
             for reduced in reduced_micro_batches(sched.kind, mesh.pp, sched.virtual_stages, m, period)]
    if not tries:
        return None, None
    for period, reduced in tries:
        share = max(1, predicted * reduced // m)
        graph = build_graph(program, **build, micro_batches=reduced,
                            progress=(lambda k, n=share: progress("building graph", k, n)) if progress else None)
        trace = run(graph, **engine, record_memory=False,  # a folded result keeps no timeline
                    progress=(lambda k, n: progress("simulating", k, n)) if progress else None)
        cols = task_columns(graph, trace)
        fold = find_fold(graph, trace, reduced, m, period, cols)
        summary = fold_summary(graph, trace, fold, cols) if fold is not None else None
        if fold is not None and summary is not None:
            return (graph, trace, fold, summary), fold.describe()
    return None, (f"simulated every one of the {m} micro-batches: a simulation of fewer did not settle into an "
                  "exactly repeating steady state")


def _stage_terms(costed: CostedProgram, cl: Cluster) -> tuple[dict[int, Any], dict[int, float]]:
    """Per pipeline rank: its static memory (cost.memory.static_memory) and its optimizer step's seconds."""
    by_rank: dict[int, list] = defaultdict(list)
    for ch in costed.program.chunks:
        by_rank[ch.pp_rank].append(ch)
    statics = {r: static_memory(chs, costed.precision, cl.device) for r, chs in by_rank.items()}
    opt_s = {r: optimizer_time(sum(c.optimizer_params_local for c in chs), cl, costed.compute)
             for r, chs in by_rank.items()}
    return statics, opt_s


def _static_blocks(chunks: list[Any], static: StaticMemory, precision: Precision) -> list[float]:
    """A rank's long-lived tensors as the caching allocator sees them: per layer one block each of parameters,
    gradients and optimizer states (the layer's share of `static`, which already counts gradient copies and
    the optimizer in backward), then the cuBLAS and cuBLASLt workspaces (cost.memory.workspace_bytes)."""
    states = [st for c in chunks if c.offload == "none" for st in c.layer_states.values()]
    blocks: list[float] = []
    for i, total in enumerate((static.params_bytes, static.grads_bytes, static.optimizer_bytes)):
        count = sum(st[i] for st in states)
        blocks += [total * st[i] / count for st in states] if count > 0 else []
    if static.workspace_bytes > CUBLASLT_WORKSPACE_BYTES:
        blocks += [static.workspace_bytes - CUBLASLT_WORKSPACE_BYTES, CUBLASLT_WORKSPACE_BYTES]
    return blocks


def _phase_copies(program: Program) -> dict[tuple[int, str], Any]:
    """(chunk, fwd | bwd) -> the chunk whose steps of that phase lowering copied to it (ChunkCopies), while no
    chunk was edited since; else none."""
    record = program.copies
    lowered = record.lowered if record is not None and record.valid(program.chunks) else {}
    return {key: program.chunks[o] for key, o in lowered.items()}


def _stage_memory(costed: CostedProgram, statics: dict[int, StaticMemory], dynamic: dict[int, float],
                  capacity: float, sim: SimulationSpec) -> list[StageMemory]:
    """Each stage's allocated peak (statics + the simulation's dynamic peak), its reserved peak (the allocated
    one plus what a replay of the stage through PyTorch's caching allocator holds beyond its own allocated
    peak: cost.allocator.replay_stages, all ranks in one pass) and its components by kind for the OOM message."""
    program = costed.program
    sched, pp = program.tree.schedule, program.mesh.pp
    by_rank: dict[int, list[Any]] = defaultdict(list)
    for ch in program.chunks:
        by_rank[ch.pp_rank].append(ch)
    ranks = sorted(statics)
    replays = replay_stages([(by_rank[r], _static_blocks(by_rank[r], statics[r], costed.precision)) for r in ranks],
                            sched.kind, pp, sched.n_micro_batch, sched.virtual_stages,
                            sched.max_ongoing_micro_batch, sim.expandable_segments, _phase_copies(program))
    out = []
    for r, est in zip(ranks, replays, strict=True):
        st = statics[r]
        allocated = st.total_bytes + dynamic[r]
        parts = {"params": st.params_bytes, "grads": st.grads_bytes, "optimizer_states": st.optimizer_bytes,
                 "activations": dynamic[r], "workspaces": st.workspace_bytes}
        out.append(StageMemory(r, st.total_bytes, dynamic[r], allocated, capacity,
                               peak_reserved_bytes=allocated + est.overhead_bytes, components_bytes=parts))
    return out


def _active_params(mdl: Model, params: int) -> int:
    """The model's active parameters (Model.active_params), `params` itself for a dense model (no second pass)."""
    return mdl.active_params if mdl.hyper.get("experts") else params


def _check_iteration(iteration: float) -> None:
    if not (math.isfinite(iteration) and iteration > 0):  # the field bounds should make this unreachable
        raise ConfigError("simulation", f"the predicted iteration time is {iteration!r} s, not a positive number",
                          "check the cluster's bandwidths and the model's sizes for extreme values")


def _strategy_echo(tree: StrategyTree, spec: ParallelSpec, precision: Precision) -> dict[str, Any]:
    """The strategy as it ran (the result's `strategy`)."""
    return {"dp": spec.dp, "tp": spec.tp, "pp": spec.pp, "cp": spec.cp, "ep": spec.ep, "vpp": spec.vpp,
            "sequence_parallel": spec.sequence_parallel, "zero": spec.zero, "dp_replicate": spec.dp_replicate,
            "recompute": spec.recompute, "schedule": tree.schedule.kind, "micro_batch": spec.micro_batch,
            "global_batch": spec.global_batch, "grad_accumulation": tree.schedule.n_micro_batch,
            "dtype": precision.compute_dtype, **({"cuda_graphs": list(tree.cuda_graphs)} if tree.cuda_graphs else {})}


def _simulate_program(tree: StrategyTree, cl: Cluster, sim: SimulationSpec, spec: ParallelSpec,
                      costed: CostedProgram, predicted: int, progress: ProgressFn | None,
                      timeline: bool = False) -> SimulationResult:
    """Build the execution graph of a costed program, run the event engine and read the result off it;
    `timeline`: keep every task's times (result.graph / trace), so simulate every micro-batch."""
    mdl = tree.model
    program, precision, flows = costed.program, costed.precision, costed.flows
    peak = costed.peak_flops
    sharing = sim.bandwidth_sharing
    statics, opt_s = _stage_terms(costed, cl)
    capacity = cl.device.hbm_bytes - RUNTIME_RESERVED_BYTES
    build = {"exact": sim.exact, "granularity": sim.granularity, "optimizer_s": opt_s, "flows": flows,
             "static_bytes": {r: s.total_bytes for r, s in statics.items()}}
    engine = {"gamma": costed.gamma, "p2p_host_sync": costed.p2p_host_sync, "bandwidth_sharing": sharing}
    folded, fold_note = (None, None) if timeline else _folded_run(program, build, engine, predicted,
                                                                          progress)
    if folded is not None:
        graph, trace, fold, summary = folded
        iteration, per_class = summary.iteration_s, summary.per_class
        path_by_category, path_tasks, n_tasks = (summary.critical_path_by_category, summary.critical_path_length,
                                                 summary.n_tasks)
        path: list[int] = []
    else:
        graph = build_graph(program, **build,
                            progress=(lambda k: progress("building graph", k, predicted)) if progress else None)
        trace = run(graph, **engine, progress=(lambda k, n: progress("simulating", k, n)) if progress else None)
        iteration = max(trace.end_s) if len(graph) else 0.0
        cols = task_columns(graph, trace)
        per_class = class_breakdowns(graph, trace, iteration, cols)
        path = critical_path(graph, trace, cols)
        path_by_category, path_tasks, n_tasks = time_by_category(graph, trace, path, cols), len(path), len(graph)
    _check_iteration(iteration)
    weights = [rc.multiplicity for rc in graph.classes]
    total_w = sum(weights)
    breakdown = {k: sum(b[k] * w for b, w in zip(per_class, weights, strict=True)) / total_w for k in BREAKDOWN_KEYS}
    stage_dyn: dict[int, float] = defaultdict(float)
    for c, rc in enumerate(graph.classes):
        stage_dyn[rc.stage] = max(stage_dyn[rc.stage], trace.peak_dynamic_bytes[c])
    memory = _stage_memory(costed, statics, stage_dyn, capacity, sim)
    stage_breakdown: list[dict[str, float]] = []
    for r in sorted(statics):
        cls = [c for c, rc in enumerate(graph.classes) if rc.stage == r]
        stage_breakdown.append({k: sum(per_class[c][k] for c in cls) / len(cls) for k in BREAKDOWN_KEYS})
    result = SimulationResult(
        model=mdl.name, cluster=cl.name, device=cl.device.name, n_gpus=cl.world_size,
        strategy=_strategy_echo(tree, spec, precision), iteration_time_s=iteration, global_batch=spec.global_batch,
        tokens_per_sample=mdl.seq_len, model_flops=program.model_flops_per_iteration,
        hw_flops=program.hw_flops_per_iteration, peak_tflops=peak / 1e12, breakdown=breakdown, breakdown_per_stage=stage_breakdown, memory=memory,
        critical_path=[(graph.name[t], graph.category[t], trace.start_s[t], trace.end_s[t]) for t in path],
        critical_path_by_category=path_by_category, critical_path_tasks=path_tasks, n_tasks=n_tasks,
        advice=_advice(memory, spec), graph=None if folded else graph, trace=None if folded else trace,
        fold=fold_note, model_params=(params := mdl.params), active_params=_active_params(mdl, params),
        model_assumptions=list(mdl.assumptions),
        placement=[p.describe(cl.levels) for p in placement(tree.mesh, cl.levels)])
    return result


def _analytic_program(tree: StrategyTree, cl: Cluster, sim: SimulationSpec, spec: ParallelSpec,
                      costed: CostedProgram, predicted: int, progress: ProgressFn | None,
                      timeline: bool = False) -> SimulationResult:
    """The analytic tier (simulation.fidelity analytic, sim.analytic): the costed program's iteration, breakdown
    and peak memory in closed form, with the event simulation's statics and optimizer step; no graph, no
    timeline, no critical path. (`predicted`, `progress` and `timeline` are the event path's: unused here.)"""
    from .sim.analytic import evaluate, program_batch

    program, precision = costed.program, costed.precision
    statics, opt_s = _stage_terms(costed, cl)
    est = evaluate(program_batch(program, opt_s, {r: s.total_bytes for r, s in statics.items()}, costed.gamma,
                                 costed.p2p_host_sync))
    iteration = float(est.iteration_s[0])
    _check_iteration(iteration)
    capacity = cl.device.hbm_bytes - RUNTIME_RESERVED_BYTES
    ranks = sorted(statics)
    per_stage = [{k: float(est.breakdown_s[0, r, i]) for i, k in enumerate(BREAKDOWN_KEYS)} for r in ranks]
    breakdown = {k: sum(b[k] for b in per_stage) / len(per_stage) for k in BREAKDOWN_KEYS}
    memory = _stage_memory(costed, statics, {r: float(est.dynamic_bytes[0, r]) for r in ranks}, capacity, sim)
    mdl = tree.model
    return SimulationResult(
        model=mdl.name, cluster=cl.name, device=cl.device.name, n_gpus=cl.world_size,
        strategy=_strategy_echo(tree, spec, precision), iteration_time_s=iteration, global_batch=spec.global_batch,
        tokens_per_sample=mdl.seq_len, model_flops=program.model_flops_per_iteration,
        hw_flops=program.hw_flops_per_iteration, peak_tflops=costed.peak_flops / 1e12, breakdown=breakdown, breakdown_per_stage=per_stage, memory=memory,
        critical_path=[], critical_path_by_category={}, n_tasks=0, advice=_advice(memory, spec),
        model_params=(params := mdl.params), active_params=_active_params(mdl, params), fidelity="analytic",
        model_assumptions=[*mdl.assumptions, "analytic tier (simulation.fidelity analytic): the costed per-layer "
                           "templates composed in closed form (pipeline formula, exposed communication after "
                           "overlap, optimizer step); no link sharing, no timeline or critical path"],
        placement=[p.describe(cl.levels) for p in placement(tree.mesh, cl.levels)])
