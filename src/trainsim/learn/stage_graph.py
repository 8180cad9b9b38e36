"""A pipeline stage as PredTOP sees it: the operator DAG of one micro-batch's forward and backward on one
stage, after the strategy is applied, with per-op features, plus trainsim's analytical times.

Built from trainsim's own IR (the lowered, costed program), so a compiled model, a search candidate and a
validation row all give the same kind of graph. Symmetry first: the transformer blocks of a stage are
identical, so the graph holds one block's ops (and whatever is unique to the stage: embedding, LM head,
loss) and the graph features carry how many blocks the stage runs; a stage's graph stays at tens of nodes
whatever the depth of the model.

The learned part predicts a correction of the analytical stage time; the iteration follows the pipeline:
`iteration = base_iter_s + slots * (stage_s - base_stage_s)` with `slots` = micro-batches + stages - 1
(PredTOP's T = sum(t_i) + (B - 1) max(t_i) for identical stages, laid over trainsim's own simulation,
which keeps the data-parallel and optimizer terms).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ..compile.program import ChunkProgram, Program, Step, Stream

if TYPE_CHECKING:
    from ..sim.result import SimulationResult

KINDS = ("compute", "collective", "memory")
PHASES = ("fwd", "bwd", "recompute", "other")
CATEGORIES = ("compute", "recompute", "tp", "other")
OP_KINDS = ("matmul", "bmm", "attention", "elementwise", "norm", "softmax", "embedding", "loss", "other")
NODE_FEATURES = (*(f"kind:{k}" for k in KINDS), *(f"phase:{p}" for p in PHASES),
                 *(f"category:{c}" for c in CATEGORIES), *(f"op:{o}" for o in OP_KINDS),
                 "log_flops", "log_bytes", "log_time_us", "efficiency", "repeats")
GRAPH_FEATURES = ("log_micro_batch", "log_tp", "log_dp", "log_pp", "log_hidden", "log_layers", "log_seq",
                  "log_micro_batches", "log_blocks", "log_base_stage_us", "log_base_iter_ms", "log_nodes")
_BLOCK = re.compile(r"^(.*?)(\d+)$")  # layer names of repeated blocks end in their index ("block7")


@dataclass(frozen=True)
class StageGraph:
    """One stage's DAG (see the module docstring); `key` names the configuration (the unit of splits)."""

    x: np.ndarray  # float32 [n_nodes, len(NODE_FEATURES)]
    edges: np.ndarray  # int64 [2, n_edges], src -> dst, src < dst (node ids in topological order)
    g: np.ndarray  # float32 [len(GRAPH_FEATURES)]
    base_stage_s: float
    base_iter_s: float
    slots: float
    label_s: float | None
    key: str
    device: str = ""  # the GPU it ran on (trainsim's device name): a model says what it was trained on
    # the event simulation's own composition: d iteration / d stage (api.compute_response), where `slots` is
    # PredTOP's micro-batches + stages - 1; a model trained with it (composition "simulation") is consistent
    # with the event simulation it supplies stage times to
    sim_slots: float | None = None


def _one_hot(value: str, choices: tuple[str, ...]) -> list[float]:
    v = value if value in choices else choices[-1]
    return [1.0 if c == v else 0.0 for c in choices]


def _block_of(layer: str) -> tuple[str, int] | None:
    m = _BLOCK.match(layer)
    return (m.group(1), int(m.group(2))) if m else None


def _stage_steps(ch: ChunkProgram) -> tuple[list[Step], list[tuple[int, int]], float, int]:
    """The steps of one representative block plus the stage's unique layers, their dataflow edges, the
    stage's analytical time (compute and TP communication of every step: the stream a micro-batch waits
    on) and how many blocks the stage runs."""
    steps = [*ch.fwd, *ch.bwd]
    offsets = [0] * len(ch.fwd) + [len(ch.fwd)] * len(ch.bwd)
    blocks = {b for s in steps if (b := _block_of(s.layer)) is not None}
    first = min(blocks, key=lambda b: b[1]) if blocks else None
    keep = [i for i, s in enumerate(steps) if _block_of(s.layer) is None or _block_of(s.layer) == first]
    new = {old: i for i, old in enumerate(keep)}
    edges: list[tuple[int, int]] = []
    for old in keep:
        s = steps[old]
        previous = (old - 1,) if old > 0 else ()
        deps = previous if s.deps is None else tuple(d + offsets[old] for d in s.deps)
        if old == len(ch.fwd) and len(ch.fwd):  # the backward starts after the forward
            deps = (*deps, len(ch.fwd) - 1)
        for d in deps:
            src = _nearest_kept(d, new)
            if src is not None and src < new[old]:
                edges.append((src, new[old]))
    base = sum(s.duration_s for s in steps if s.stream in (Stream.COMPUTE, Stream.FEATURE))
    return [steps[i] for i in keep], sorted(set(edges)), base, max(1, len({b for b in blocks}))


def _nearest_kept(index: int, new: dict[int, int]) -> int | None:
    """A dependency on a step of another block stands for the same step of the kept block: the nearest
    kept step at or before it."""
    while index >= 0 and index not in new:
        index -= 1
    return new.get(index)


def _node_features(s: Step, blocks: int, repeated: bool, peak_flops: float) -> list[float]:
    op_kind = str(s.op.kind) if s.op is not None else ("other" if s.kind != "compute" else "elementwise")
    time_us = s.duration_s * 1e6
    flops = s.hw_flops
    moved = s.size_bytes or (s.alloc_bytes if s.kind == "compute" else 0.0)
    eff = min(1.0, flops / max(s.duration_s, 1e-12) / peak_flops) if flops else 0.0  # of the device's peak
    return [*_one_hot(s.kind, KINDS),
            *_one_hot(s.phase if s.phase in PHASES else "other", PHASES),
            *_one_hot(s.category, CATEGORIES),
            *_one_hot(op_kind, OP_KINDS),
            math.log1p(flops / 1e9), math.log1p(moved / 1e6), math.log1p(time_us), eff,
            math.log(blocks) if repeated else 0.0]


def _context(program: Program) -> dict[str, int]:
    """The graph features every stage of a program shares (the strategy's degrees, the model's sizes)."""
    tree = program.tree
    mesh, model = tree.mesh, tree.model
    blocks = len([layer for layer in model.layers if _block_of(layer.name)]) or len(model.layers)
    return {"micro_batch": max(1, tree.micro_batch), "tp": mesh.size("tp"), "dp": mesh.size("dp"), "pp": mesh.pp,
            "hidden": int(model.hyper.get("hidden", 1) or 1), "layers": blocks, "seq": model.seq_len or 1,
            "micro_batches": tree.schedule.n_micro_batch}


def program_stage_graphs(program: Program, base_iter_s: float, peak_flops: float) -> list[StageGraph]:
    """One StageGraph per chunk of a costed program (cost.annotate has filled every step's duration), in
    chunk order; `base_iter_s`: trainsim's simulated iteration, `peak_flops`: the device's peak in the job's
    precision (an op's efficiency feature is its share of it)."""
    context = _context(program)
    return [_graph_of(_stage_steps(ch), **context, base_iter_s=base_iter_s, peak_flops=peak_flops, label_s=None,
                      key=f"chunk{ch.chunk}") for ch in program.chunks]


def _graph_of(stage: tuple[list[Step], list[tuple[int, int]], float, int], *, micro_batch: int, tp: int, dp: int,
              pp: int, hidden: int, layers: int, seq: int, micro_batches: int, base_iter_s: float,
              peak_flops: float, label_s: float | None, key: str) -> StageGraph:
    steps, edges, base_stage, blocks = stage
    x = np.array([_node_features(s, blocks, _block_of(s.layer) is not None, peak_flops) for s in steps],
                 dtype=np.float32)
    e = np.array(edges, dtype=np.int64).T if edges else np.zeros((2, 0), dtype=np.int64)
    g = np.array([math.log(micro_batch), math.log(tp), math.log(dp), math.log(pp), math.log(hidden),
                  math.log(layers), math.log(seq), math.log(micro_batches), math.log(blocks),
                  math.log(base_stage * 1e6), math.log(base_iter_s * 1e3), math.log(len(steps))], dtype=np.float32)
    return StageGraph(x, e, g, base_stage, base_iter_s, float(micro_batches + pp - 1), label_s, key)


def simulated_stage_graph(job: dict[str, Any]) -> tuple[SimulationResult, StageGraph]:
    """trainsim's simulation of a job and the unlabelled graph of its slowest stage, in the analytical
    (roofline) compute model whatever the job says: its times are the features a learned model corrects
    (api.simulate_costed: the job is lowered and costed once for both)."""
    from ..api import compute_response, simulate_costed
    from ..config import parse_job

    cfg = parse_job(job)
    cfg = cfg.model_copy(update={"simulation": cfg.simulation.model_copy(update={"compute_model": "roofline"})})
    res, costed = simulate_costed(cfg)
    stages = [_stage_steps(c) for c in costed.program.chunks]
    slowest = max(range(len(stages)), key=lambda i: stages[i][2])
    graph = _graph_of(stages[slowest], **_context(costed.program), base_iter_s=res.iteration_time_s,
                      peak_flops=costed.peak_flops, label_s=None, key="")
    response = compute_response(cfg, costed, slowest, res.iteration_time_s)  # after the graph: it stretches
    return res, replace(graph, device=res.device, sim_slots=response)


COMPOSITIONS = ("formula", "simulation")


def composed(graphs: list[StageGraph], composition: str) -> list[StageGraph]:
    """The graphs with the iteration composed as `composition` says: PredTOP's formula (`slots`, as built) or
    the event simulation's response (`sim_slots` in place of `slots`)."""
    if composition == "formula":
        return list(graphs)
    missing = sum(1 for g in graphs if g.sim_slots is None)
    if missing:
        raise ValueError(f"{missing} graphs have no simulation response (built before sim_slots existed)")
    return [replace(g, slots=float(g.sim_slots)) for g in graphs]


def job_stage_graph(job: dict[str, Any], label_s: float | None = None, key: str = "") -> StageGraph:
    """The graph of a job's slowest stage (simulated_stage_graph) with its measured label and its key."""
    return replace(simulated_stage_graph(job)[1], label_s=label_s, key=key)


__all__ = ["GRAPH_FEATURES", "NODE_FEATURES", "StageGraph", "job_stage_graph", "program_stage_graphs",
           "simulated_stage_graph", "COMPOSITIONS", "composed"]
