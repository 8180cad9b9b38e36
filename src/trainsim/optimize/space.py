"""The space a strategy search walks: parallel degrees, micro-batch, recompute, ZeRO, overlap flags and
pipeline schedule, with the model's and cluster's constraints applied as counted pruning reasons.

Enumeration is nested (degrees first, then per-stage knobs) and a rule that fails at an outer level
prunes the whole subtree at once, counting every configuration under it, so a space of millions is
settled in well under a second.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict, dataclass
from itertools import product
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..strategy.schedules import run_kind
from ..workload.ir import Model

PRUNE_REASONS = {
    "tp_across_nodes": "tensor parallelism would cross a node (allow with --tp-across-nodes)",
    "divisibility": "degrees do not divide the GPUs, heads, layers, sequence, experts or batch (or leave the schedule "
                    "too few micro-batches)",
    "invalid_combination": "knobs that contradict each other (SP without TP, overlap of nothing, ...)",
    "duplicate": "the same run as another configuration (ZeRO / DP flags with one data-parallel rank)",
    "memory_bound": "states plus the smallest activation footprint exceed the GPU's memory",
    "throughput_bound": "even its best case is slower than the top configurations found",
    "time_limit": "not reached before --time-limit",
}


class SearchSpace(BaseModel):
    """Values each knob may take (None: chosen from the model and cluster). The job YAML's names."""

    model_config = ConfigDict(extra="forbid")

    tp: list[int] | None = Field(None, description="tensor-parallel degrees (default: powers of 2 up to 64)")
    pp: list[int] | None = Field(None, description="pipeline stages (default: the divisors of the layer count and the "
                                 "powers of 2 up to it, split as evenly as possible; 1 for models without a sequence, "
                                 "CNNs and DLRM)")
    cp: list[int] | None = Field(None, description="context-parallel degrees (default 1, 2, 4, 8 for language models)")
    ep: list[int] | None = Field(None, description="expert-parallel degrees (default: powers of 2 dividing the experts)")
    vpp: list[int] = Field([1, 2, 3, 4, 6, 8], description="virtual stages per rank (interleaved 1F1B when > 1)")
    sequence_parallel: list[bool] = [False, True]
    micro_batch: list[int] = [1, 2, 4, 8, 16]
    recompute: list[Literal["none", "selective", "full"]] = ["none", "selective", "full"]
    zero: list[int] = Field([0, 1, 2, 3], description="ZeRO stage (3 = FSDP full shard)")
    overlap_grad_reduce: list[bool] = [True, False]
    overlap_param_gather: list[bool] = [False, True]
    tp_comm_overlap: list[bool] = [False, True]
    schedule: list[Literal["1f1b", "zb-h1", "dualpipev"]] | None = Field(
        None, description="pipeline schedule: 1F1B or ZB-H1 at vpp 1 (1F1B at vpp > 1 runs interleaved), DualPipeV at "
        "vpp 2 (its V of 2 x pp chunks, at least 2 x pp micro-batches; default: 1f1b and zb-h1, and dualpipev for a "
        "mixture of experts, whose all-to-alls DualPipe was made to hide)")
    tp_across_nodes: bool = False


@dataclass(frozen=True)
class Candidate:
    """One configuration of the space: the strategy section of a job."""

    tp: int
    pp: int
    dp: int
    cp: int
    ep: int
    vpp: int
    sequence_parallel: bool
    micro_batch: int
    recompute: str
    zero: int
    overlap_grad_reduce: bool
    overlap_param_gather: bool
    tp_comm_overlap: bool
    schedule: str
    global_batch: int
    cp_comm: str = "p2p"

    @property
    def micro_batches(self) -> int:
        return self.global_batch // (self.micro_batch * self.dp)

    def strategy(self) -> dict[str, object]:
        """The job YAML's strategy section for this configuration."""
        return strategy_section(asdict(self))


EP_KNOBS = ("ep_dispatcher", "ep_node_limit", "ep_dispatcher_sms", "ep_overlap")
HELD_KNOBS = (*EP_KNOBS, "cuda_graphs")
"""Strategy keys a search takes from the job as given (the space does not vary them): how expert parallelism
dispatches and overlaps its all-to-alls (EP_KNOBS, for every candidate with ep > 1) and which modules run as CUDA
graphs (for every candidate)."""


def held_knobs(strategy: Any) -> dict[str, Any]:  # noqa: ANN401 - a job's section as given (checked here)
    """The HELD_KNOBS a job's strategy section sets (none where the section is missing or not a mapping)."""
    if not isinstance(strategy, dict):
        return {}
    return {k: v for k, v in strategy.items() if k in HELD_KNOBS and v is not None}


def with_held(section: dict[str, Any], held: dict[str, Any], ep: int) -> dict[str, Any]:
    """A candidate's strategy section with the job's held knobs (expert-parallel ones: where ep > 1)."""
    keep = held if ep > 1 else {k: v for k, v in held.items() if k not in EP_KNOBS}
    return {**keep, **section} if keep else section


def strategy_section(values: dict[str, Any]) -> dict[str, Any]:
    """A configuration's knobs (a Candidate's fields, or the same columns of a results row) as the job YAML's
    strategy section: vpp > 1 runs the interleaved schedule (DualPipeV its own), cp_comm only where there is context
    parallelism."""
    out = {k: values[k] for k in Candidate.__dataclass_fields__ if k in values}
    kind = run_kind(str(out.get("schedule")), out.get("vpp") or 1)
    if kind == "interleaved" or "schedule" in out:
        out["schedule"] = kind
    if (out.get("cp") or 1) == 1:
        out.pop("cp_comm", None)
    return out


def _powers(limit: int) -> list[int]:
    return [2**i for i in range(int(math.log2(max(1, limit))) + 1)]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@dataclass
class Enumeration:
    """The candidates that pass the static rules, how many configurations the space has, and how many
    each rule pruned."""

    candidates: list[Candidate]
    space_size: int
    pruned: Counter


def knob_values(space: SearchSpace, model: Model, world: int) -> dict[str, list]:
    """The value list of every knob, defaults filled in from the model and the GPU count."""
    hyper = model.hyper
    blocks = sum(1 for la in model.layers if la.kind == "transformer") or len(model.layers)
    lm = model.is_language_model
    experts = int(hyper.get("experts", 0) or 0)
    return {
        "tp": space.tp or ([t for t in _powers(min(world, 64))] if lm else [1]),
        "pp": space.pp or ([d for d in sorted(set(_divisors(blocks)) | set(_powers(blocks))) if d <= world]
                           if lm else [1]),
        "cp": space.cp or ([c for c in (1, 2, 4, 8) if c <= world] if lm else [1]),
        "ep": space.ep or ([e for e in _powers(min(world, experts)) if experts % e == 0] if experts else [1]),
        "vpp": space.vpp if lm or space.pp else [1],
        "sequence_parallel": space.sequence_parallel if lm else [False],
        "micro_batch": space.micro_batch,
        "recompute": space.recompute,
        "zero": space.zero,
        "overlap_grad_reduce": space.overlap_grad_reduce,
        "overlap_param_gather": space.overlap_param_gather,
        "tp_comm_overlap": space.tp_comm_overlap if lm else [False],
        "schedule": space.schedule or (["1f1b", "zb-h1", "dualpipev"] if experts else ["1f1b", "zb-h1"]),
    }


def enumerate_space(space: SearchSpace, model: Model, world: int, gpus_per_node: int,
                    global_batch: int) -> Enumeration:
    """Every configuration of the space, pruned by the static rules (divisibility, node size, knobs that
    contradict or duplicate each other), with the count per rule."""
    v = knob_values(space, model, world)
    hyper = model.hyper
    heads, kv = int(hyper.get("heads", 0) or 0), int(hyper.get("kv_heads", 0) or 0)
    experts = int(hyper.get("experts", 0) or 0)
    blocks = sum(1 for la in model.layers if la.kind == "transformer") or len(model.layers)
    seq = model.seq_len or 0
    inner = ("sequence_parallel", "recompute", "zero", "overlap_grad_reduce", "overlap_param_gather",
             "tp_comm_overlap", "schedule")
    n_inner = math.prod(len(v[k]) for k in inner)
    space_size = math.prod(len(x) for x in v.values())
    pruned: Counter = Counter()
    out: list[Candidate] = []
    for tp, pp, cp, ep, vpp, mb in product(v["tp"], v["pp"], v["cp"], v["ep"], v["vpp"], v["micro_batch"]):
        reason = _outer_reason(tp, pp, cp, ep, vpp, mb, world, gpus_per_node, space.tp_across_nodes, heads, kv,
                               blocks, seq, experts, global_batch)
        if reason:
            pruned[reason] += n_inner
            continue
        dp = world // (tp * pp * cp)
        for sp, rc, zero, ogr, opg, tco, sched in product(*(v[k] for k in inner)):
            reason = _inner_reason(tp, pp, dp, cp, vpp, sp, zero, ogr, opg, tco, sched, global_batch // (mb * dp),
                                   blocks)
            if reason:
                pruned[reason] += 1
                continue
            out.append(Candidate(tp, pp, dp, cp, ep, vpp, sp, mb, rc, zero, ogr, opg, tco, sched, global_batch))
    return Enumeration(out, space_size, pruned)


def _outer_reason(tp: int, pp: int, cp: int, ep: int, vpp: int, mb: int, world: int, gpn: int, across: bool,
                  heads: int, kv: int, blocks: int, seq: int, experts: int, gb: int) -> str | None:
    if tp > gpn and not across:
        return "tp_across_nodes"
    per = tp * pp * cp
    if world % per:
        return "divisibility"
    dp = world // per
    if tp > 1 and (heads % tp or not (kv % tp == 0 or tp % kv == 0)):
        return "divisibility"
    if blocks < pp * vpp:  # a split that does not divide takes its remainder from the end chunks (_inner_reason)
        return "divisibility"
    if cp > 1 and seq % (2 * cp):
        return "divisibility"
    if ep > 1 and (not experts or experts % ep or dp % ep):
        return "divisibility"
    if gb % (mb * dp):
        return "divisibility"
    if vpp > 1 and pp == 1:
        return "invalid_combination"
    return None


def _inner_reason(tp: int, pp: int, dp: int, cp: int, vpp: int, sp: bool, zero: int, ogr: bool, opg: bool,
                  tco: bool, sched: str, m: int, blocks: int) -> str | None:
    """The rules on the per-stage knobs and the schedule, which needs the micro-batch count `m` and the layers
    (`blocks`): a pipeline whose chunks do not divide the layers takes the remainder from its end chunks (the
    presets' split, strategy.presets._even_counts; Megatron's uneven first and last stages), except under
    interleaving, whose virtual stages Megatron splits evenly."""
    if sched == "dualpipev":  # a V of two chunks per rank over a pipeline, fed 2 pp micro-batches at least
        if vpp != 2:
            return "invalid_combination"
        if m < 2 * pp:
            return "divisibility"
    elif vpp > 1 and (m % pp or blocks % (pp * vpp)):  # interleaving works in groups of pp micro-batches
        return "divisibility"
    if sp and tp == 1:
        return "invalid_combination"
    if tco and not sp:
        return "invalid_combination"
    if opg and zero == 0:
        return "invalid_combination"
    if opg and zero == 3:
        return "duplicate"  # FSDP gathers per layer; there is no post-step all-gather to hide
    if sched == "zb-h1" and (vpp > 1 or pp == 1):
        return "invalid_combination" if vpp > 1 else "duplicate"
    if dp * cp == 1 and (zero or not ogr):
        return "duplicate"
    return None


def strategy_text(row: dict[str, Any]) -> str:
    """A configuration in one short line: degrees, micro-batch, recompute, ZeRO, flags, schedule."""
    sched = run_kind(str(row.get("schedule")), row.get("vpp") or 1)
    degrees = f"tp{row['tp']} pp{row['pp']} dp{row['dp']}" + "".join(
        f" {k}{row[k]}" for k in ("cp", "ep", "vpp") if (row.get(k) or 1) > 1)
    return (f"{degrees} mb{row['micro_batch']} {row['recompute']} zero{row['zero']} {_flags_text(row)} "
            f"{sched}").replace(" - ", " ")


def _flags_text(row: dict[str, Any]) -> str:
    parts = []
    if row.get("sequence_parallel"):
        parts.append("sp")
    if row.get("tp_comm_overlap"):
        parts.append("tp-ovl")
    if not row.get("overlap_grad_reduce", True):
        parts.append("no-grad-ovl")
    if row.get("overlap_param_gather"):
        parts.append("param-ovl")
    return " ".join(parts) or "-"


def value_text(value: Any, none: str = "-") -> str:  # noqa: ANN401 - a job key's value
    """A job key's value in a table cell: yes/no, %g floats, lists comma-joined, `none` for an unset key."""
    if value is None:
        return none
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list):
        return ",".join(value_text(v, none) for v in value)
    return str(value)
