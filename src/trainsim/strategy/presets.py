"""Presets (DP, Megatron TP+SP, PP schedules, CP, EP, ZeRO/FSDP, recompute) that fill the strategy tree.

A preset only writes per-op splits, per-tensor memory configs and schedule configs into the
tree; it never lowers anything itself, so every strategy goes through one compiler.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from ..workload.ir import Layer, Model, Op
from .mesh import DeviceMesh
from .schedules import run_kind
from .tree import (
    RECOMPUTE_MODES,
    SCHEDULES,
    LeafConfig,
    ScheduleConfig,
    Split,
    StrategyTree,
    WeightConfig,
    sharded_weight_config,
    state_config,
    valid_recompute_mode,
)

TP_DIMS = frozenset({"q", "a", "g", "o", "kv", "vo", "f", "f2", "v", "mz", "mc", "md", "hm"})
SP_OPS = frozenset({"ln1", "ln2", "attn_residual", "mlp_residual", "final_norm", "embed_dropout", "dispatch",
                    "combine", "mtp_enorm", "mtp_hnorm", "mtp_concat", "mtp_final_norm"})
SP_SAVED = (("qkv", "input"), ("q_down", "input"), ("q_proj", "input"), ("fc1", "input"), ("router", "input"),
            ("lm_head", "input"), ("in_proj", "input"))
EXPERT_OPS = frozenset({"expert_fc1", "expert_act", "expert_fc2", "expert_bias"})


@dataclass(frozen=True)
class ParallelSpec:
    """The knobs of the Megatron/DeepSpeed-style presets; validated by `build_strategy`."""

    dp: int = 1  # total data-parallel degree (includes the expert-parallel factor)
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    # expert tensor parallelism (Megatron --expert-tensor-parallel-size): None or tp, the experts split their
    # features over tp as the dense MLP does; 1 (with tp > 1), MoE parallel folding: the experts are whole and
    # spread over tp x ep ranks (ep counts them all, so tp divides it)
    etp: int | None = None
    vpp: int = 1  # virtual pipeline stages per rank (interleaved 1F1B when > 1)
    sequence_parallel: bool = False
    zero: int = 0  # 0..3; FSDP full-shard is 3
    recompute: str = "none"
    schedule: str = "1f1b"
    max_ongoing: int | None = None  # micro-batches in flight per rank (1f1b: a lower cap; dynamic: the cap)
    micro_batch: int = 1
    global_batch: int = 1
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = False
    tp_comm_overlap: bool = False
    cp_comm: str = "p2p"  # p2p (ring attention) | all_gather (K/V gathered before attention)
    ep_dispatcher: str = "alltoall"  # alltoall (NCCL) | deepep, hybridep (two-hop: one copy per node, NVLink forwarding)
    ep_node_limit: int | None = None  # node-limited routing with a two-hop dispatcher (DeepSeek-V3: 4)
    ep_dispatcher_sms: int | None = None  # SMs HybridEP's kernels run on (None: its default)
    ep_overlap: bool = False  # EP all-to-alls under the other micro-batch's compute (Megatron, DualPipe)
    dp_replicate: int = 1  # HSDP: replicas of each sharding group (dp / dp_replicate ranks shard the states)
    first_stage_layers: int | None = None  # uneven pipeline: transformer layers on the first / last stage
    last_stage_layers: int | None = None  # (Megatron --decoder-first/last-pipeline-num-layers)
    stage_layer_counts: tuple[int, ...] | None = None  # transformer layers per chunk (pp x vpp), all given
    p2p_scatter_gather: bool = True  # Megatron's scatter/gather pipeline hand-off (--no-scatter-gather-... off)
    offload: str = "none"  # none | cpu | nvme | remote (parameters/gradients/optimizer states off the GPU)
    offload_activations: bool = False  # checkpointed layer inputs kept in CPU memory between forward and backward
    cuda_graphs: tuple[str, ...] = ()  # captured modules (CUDA_GRAPH_MODULES), ("full_iteration",), () none


def _require(cond: bool, field: str, problem: str, fix: str) -> None:
    if not cond:
        raise ConfigError(f"strategy.{field}", problem, fix)


def validate_spec(model: Model, p: ParallelSpec) -> None:
    """Reject combinations that cannot run, naming the field and the fix."""
    for name in ("dp", "tp", "pp", "cp", "ep", "vpp", "micro_batch", "global_batch"):
        _require(getattr(p, name) >= 1, name, f"must be >= 1, got {getattr(p, name)}", "use a positive integer")
    hyper = model.hyper
    heads, kv = int(hyper.get("heads", 0) or 0), int(hyper.get("kv_heads", 0) or 0)
    if p.tp > 1:
        _require(model.is_language_model, "tp", f"tensor parallelism needs a transformer, {model.name} is {model.family}",
                 "use --tp 1 (data or pipeline parallelism) for this model")
        _require(heads % p.tp == 0, "tp", f"{heads} attention heads of {model.name} are not divisible by tp={p.tp}",
                 f"choose tp among {[d for d in range(1, heads + 1) if heads % d == 0 and d <= 64]}")
        _require(kv % p.tp == 0 or p.tp % kv == 0, "tp", f"{kv} kv heads do not divide into tp={p.tp}",
                 "choose tp dividing the kv heads or a multiple of them")
    _require(p.schedule in SCHEDULES, "schedule", f"unknown pipeline schedule '{p.schedule}'",
             f"use one of {', '.join(SCHEDULES)}")
    _require(valid_recompute_mode(p.recompute), "recompute", f"unknown recompute mode '{p.recompute}'",
             f"use one of {', '.join(RECOMPUTE_MODES)}")
    _require(0 <= p.zero <= 3, "zero", f"ZeRO stage must be 0..3, got {p.zero}", "use 0, 1, 2 or 3 (3 = FSDP)")
    _require(p.offload in ("none", "cpu", "nvme", "remote"), "offload", f"unknown offload target '{p.offload}'",
             "use none, cpu, nvme or remote")
    if p.schedule == "dualpipev":
        _require(p.vpp == 2, "vpp", f"dualpipev runs two chunks per rank (a V), not vpp={p.vpp}", "use vpp 2")
        _require(p.pp > 1, "pp", "DualPipeV needs pipeline parallelism", "set --pp 2 or more")
    if p.vpp > 1:
        _require(p.pp > 1, "vpp", "virtual pipeline stages need pipeline parallelism", "set --pp > 1 or --vpp 1")
    if p.max_ongoing is not None:
        _require(p.max_ongoing >= 1, "max_ongoing_micro_batch", f"must be >= 1, got {p.max_ongoing}",
                 "use a positive integer")
        _require(p.schedule in ("1f1b", "dynamic"), "max_ongoing_micro_batch",
                 f"caps the 1f1b and dynamic schedules, not {p.schedule}", "use --schedule 1f1b or dynamic")
    if p.schedule == "dynamic" and p.vpp > 1:
        raise ConfigError("strategy.schedule", "the dynamic (HTAE) scheduler runs one model chunk per rank",
                          "use --vpp 1, or --schedule interleaved")
    if p.schedule == "zb-h1" and p.vpp > 1:
        raise ConfigError("strategy.schedule", f"zb-h1 runs one model chunk per rank, not vpp={p.vpp}",
                          "use --vpp 1 with zb-h1, or --schedule interleaved with --vpp")
    if p.schedule == "interleaved" and p.vpp == 1:
        raise ConfigError("strategy.schedule", "interleaved 1F1B needs more than one virtual stage", "set --vpp 2 or more")
    data = p.micro_batch * p.dp
    _require(p.global_batch % data == 0, "global_batch",
             f"{p.global_batch} is not divisible by micro_batch x dp = {p.micro_batch} x {p.dp} = {data}",
             f"use a multiple of {data}, e.g. {max(data, (p.global_batch // data) * data) or data}")
    m = p.global_batch // data
    if p.schedule == "dualpipev":
        _require(m >= 2 * p.pp, "global_batch", f"DualPipeV needs at least 2 x pp = {2 * p.pp} micro-batches, "
                 f"got {m}", f"use a global batch of at least {2 * p.pp * data}")
    elif p.vpp > 1:
        _require(m % p.pp == 0, "global_batch",
                 f"interleaved schedule needs micro-batches ({m}) divisible by pp={p.pp}",
                 f"use a global batch that is a multiple of {data * p.pp}")
    if p.cp > 1:
        _require(model.is_language_model and (model.seq_len or 0) % (2 * p.cp) == 0, "cp",
                 f"context parallelism needs seq_len divisible by 2*cp, got seq_len={model.seq_len}",
                 "choose cp with seq_len % (2*cp) == 0")
    if p.dp_replicate > 1:
        _require(p.zero > 0, "dp_replicate", "hybrid sharding replicates sharded states; nothing is sharded "
                 "(zero 0, no FSDP)", "add --fsdp (HSDP) or --zero, or drop --dp-replicate")
        _require(p.dp % p.dp_replicate == 0 and p.dp > p.dp_replicate, "dp_replicate",
                 f"dp={p.dp} is not a multiple (> 1x) of dp_replicate={p.dp_replicate}",
                 "choose dp_replicate dividing dp, leaving a sharding group of 2 or more")
    if p.sequence_parallel:
        _require(p.tp > 1, "sequence_parallel", "sequence parallelism needs tp > 1", "set --tp > 1 or drop --sp")
    experts = int(hyper.get("experts", 0) or 0)
    if p.ep > 1:
        _require(experts > 0, "ep", f"expert parallelism needs a mixture-of-experts model, {model.name} has none",
                 "use --ep 1 or a MoE model such as mixtral-8x7b")
        _require(experts % p.ep == 0, "ep", f"{experts} experts not divisible by ep={p.ep}", "choose ep dividing the experts")
    if p.etp is not None and p.etp != p.tp:
        _require(p.etp == 1, "etp", f"expert tensor parallelism {p.etp} with tp={p.tp}: trainsim splits the experts "
                 "over tp (etp = tp) or folds them over tp x ep (etp = 1)", f"use etp {p.tp} or 1")
        _require(p.ep % p.tp == 0, "ep", f"with etp 1 the experts spread over tp x ep ranks: ep={p.ep} must be a "
                 f"multiple of tp={p.tp}", f"use an ep that is a multiple of {p.tp}")
    if p.ep > 1:
        carved = p.ep // _folded(p) // _over_cp(p)  # the part of ep the data axis holds
        what = f"ep={p.ep}" if carved == p.ep else f"ep / tp = {p.ep} / {p.tp} = {carved}"
        _require(p.dp % carved == 0, "ep", f"{what} must divide dp={p.dp} (experts are sharded inside the data "
                 "axis, or over all cp ranks and a part of it)", "choose ep dividing dp, or a multiple of cp dividing "
                 "cp x dp" if carved == p.ep else "choose ep dividing dp x tp")
    blocks = [la for la in model.layers if la.kind == "transformer"]
    chunks = p.pp * p.vpp
    n_layers = len(blocks) or len(model.layers)
    if stage_layers(model, p) is None:  # uneven first/last stages: Megatron's checks; listed: its own
        _require(n_layers >= chunks, "pp", f"{model.name} has only {n_layers} layers for pp x vpp = {chunks} chunks",
                 "use fewer pipeline stages or virtual stages")


def stage_layers(model: Model, p: ParallelSpec) -> list[int] | None:
    """Transformer layers per pipeline chunk: the list given whole (`stage_layer_counts`, strategy.stage_layers:
    a framework's own split, such as nanotron's by compute cost), or the first and/or last stage set apart
    (Megatron's --decoder-first/last-pipeline-num-layers) with the other stages sharing the rest evenly, as
    Megatron requires. None when none is set (the even split of `chunk_assignment`)."""
    if p.stage_layer_counts is not None:
        return _listed_stage_layers(model, p)
    if p.first_stage_layers is None and p.last_stage_layers is None:
        return None
    n_blocks = sum(1 for la in model.layers if la.kind == "transformer")
    field = "first_stage_layers" if p.first_stage_layers is not None else "last_stage_layers"
    _require(n_blocks > 0, field, "uneven pipeline stages need a transformer", f"drop {field}")
    _require(p.pp > 1, field, f"needs pipeline parallelism (pp = {p.pp})", f"add --pp, or drop {field}")
    _require(p.vpp == 1, field, f"first/last stage layer counts with {p.vpp} chunks per rank ({p.schedule}) are "
             "not modelled", "list every chunk's layers in strategy.stage_layers instead")
    first = p.first_stage_layers
    last = p.last_stage_layers
    fixed = [s for s in (first, last) if s is not None]
    middle = p.pp - len(fixed)
    rest = n_blocks - sum(fixed)
    _require(all(s >= 1 for s in fixed) and rest >= middle and (middle == 0 and rest == 0 or middle > 0
             and rest % middle == 0), field,
             f"{n_blocks} layers: first {first}, last {last} leave {rest} for {middle} other stage(s), "
             "not an even split of at least one each",
             "choose counts that leave a multiple of the other stages' count")
    even = rest // middle if middle else 0
    return [first if first is not None and i == 0 else last if last is not None and i == p.pp - 1 else even
            for i in range(p.pp)]


def _listed_stage_layers(model: Model, p: ParallelSpec) -> list[int]:
    """`stage_layer_counts` checked against the model and the pipeline: one count per chunk (pp x vpp), the
    counts summing to the transformer layers, and a chunk without layers only at either end, where the
    embedding (first) or the final norm and LM head (last) still give it work."""
    counts = list(p.stage_layer_counts or ())
    field = "stage_layers"
    n_blocks = sum(1 for la in model.layers if la.kind == "transformer")
    chunks = p.pp * p.vpp
    _require(n_blocks > 0, field, "per-stage layer counts need a transformer", f"drop {field}")
    _require(p.pp > 1, field, f"needs pipeline parallelism (pp = {p.pp})", f"add --pp, or drop {field}")
    _require(len(counts) == chunks, field, f"{len(counts)} counts for pp x vpp = {p.pp} x {p.vpp} = {chunks} "
             "pipeline chunks", f"give exactly {chunks} counts, one per chunk in pipeline order")
    _require(all(n >= 0 for n in counts), field, f"negative layer count in {counts}", "use counts >= 0")
    _require(sum(counts) == n_blocks, field, f"{counts} sum to {sum(counts)}, {model.name} has {n_blocks} "
             "transformer layers", f"make the counts sum to {n_blocks}")
    empty = [i for i, n in enumerate(counts) if n == 0 and i not in (0, chunks - 1)]
    _require(not empty, field, f"chunk(s) {empty} would hold no layer at all (only the end chunks keep the "
             "embedding or the LM head)", "give every middle chunk at least one layer")
    return counts


def _folded(p: ParallelSpec) -> int:
    """The tp ranks the experts fold over (MoE parallel folding, etp 1 with tp > 1), else 1."""
    return p.tp if p.etp == 1 and p.tp > 1 else 1


def _over_cp(p: ParallelSpec) -> int:
    """The cp ranks the experts fold over: all of them where the expert-parallel group does not fit in the data axis
    but spans the context-parallel ranks and a part of the data axis (Megatron's MoE parallel folding forms EP from
    consecutive ranks of cp x dp, cp first), else 1. Where it fits in the data axis it stays there."""
    carved = p.ep // _folded(p)
    if p.cp > 1 and carved > 1 and p.dp % carved and carved % p.cp == 0 and p.dp % (carved // p.cp) == 0:
        return p.cp
    return 1


def _data_axes(expert: bool) -> tuple[str, ...]:
    return ("dp", "dr") if expert else ("ep", "dp", "dr")


def op_split(op: Op, p: ParallelSpec, batch_dim: str) -> Split:
    """Megatron-LM layout of one op: batch over data axes, s over cp (+tp under SP), heads/ffn/vocab over tp."""
    split: Split = {}
    expert = op.name in EXPERT_OPS
    if batch_dim in op.dims:
        split[batch_dim] = _data_axes(False)
    if "s" in op.dims:
        axes = ("cp",) + (("tp",) if p.sequence_parallel and op.name in SP_OPS else ())
        split["s"] = axes
    if op.name in ("dispatch", "combine"):
        split["c"] = _data_axes(False) + ("cp",) + (("tp",) if p.sequence_parallel else ())
    folded = expert and _folded(p) > 1  # whole experts over tp x ep: their features stay unsplit
    if expert:
        over_cp = _over_cp(p) > 1  # the experts over cp x ep, their tokens over what is left of the data axis
        split["e"] = ("tp",) * folded + ("cp",) * over_cp + ("ep",)
        split["c"] = ("dp",) + ("dr",) * (p.dp_replicate > 1) + ("cp",) * (not over_cp)
    kv = int(op.dims.get("g", 0))
    for d in op.dims:
        if d in TP_DIMS and not (d in ("g", "kv") and kv and kv % p.tp != 0) and not folded:
            split[d] = ("tp",)
    return {d: tuple(a for a in axes) for d, axes in split.items() if axes}


ZERO_ITEMS = {0: (), 1: ("optimizer",), 2: ("optimizer", "grad"), 3: ("optimizer", "grad", "weight")}
"""ZeRO stage -> the state items it partitions over the data axes (FSDP full shard = 3)."""


def weight_config(op: Op, split: Split, zero: int) -> WeightConfig:
    """Weight keeps the op's split on its own dims; ZeRO adds the data axes (which partial-sum its grad)."""
    return sharded_weight_config(op, split, ZERO_ITEMS[zero])


def _even_counts(blocks: int, chunks: int) -> list[int]:
    """Blocks per chunk, as even as possible; a remainder is taken from the end chunks first (they also hold
    the embedding and the LM head), as Llama 3 405B did with 126 layers on 16 stages (Dubey et al. 2024,
    section 3.3.2)."""
    per = -(-blocks // chunks)
    counts = [per] * chunks
    ends = [i for pair in zip(range(chunks), range(chunks - 1, -1, -1), strict=True) for i in pair]
    deficit, k = per * chunks - blocks, 0
    while deficit:
        c = ends[k % len(ends)]
        if counts[c] > 1:
            counts[c] -= 1
            deficit -= 1
        k += 1
    return counts


def chunk_assignment(model: Model, chunks: int, counts: list[int] | None = None) -> dict[str, int]:
    """Contiguous chunk per layer: transformer blocks evenly (or `counts` per chunk), embedding first, head
    last; else FLOP-balanced."""
    layers = model.layers
    blocks = [la for la in layers if la.kind == "transformer"]
    out: dict[str, int] = {}
    if blocks:
        counts = counts or _even_counts(len(blocks), chunks)
        i = 0
        for c, n in enumerate(counts):
            for la in blocks[i:i + n]:
                out[la.name] = c
            i += n
        for la in layers:
            if la.name not in out:
                out[la.name] = 0 if la.kind == "embedding" else chunks - 1
        return out
    flops = [max(la.fwd_flops(), 1.0) for la in layers]
    total, acc = sum(flops), 0.0
    for la, f in zip(layers, flops, strict=True):
        out[la.name] = min(chunks - 1, int((acc + f / 2) / total * chunks))
        acc += f
    if len(set(out.values())) < chunks:  # a single heavy layer swallowed a chunk: balance by count
        out = {la.name: i * chunks // len(layers) for i, la in enumerate(layers)}
    return out


def build_strategy(model: Model, p: ParallelSpec) -> StrategyTree:
    """Fill a strategy tree with the preset's configs (the general representation every later issue edits)."""
    validate_spec(model, p)
    ep = p.ep // _folded(p) // _over_cp(p)  # the part of ep carved from dp (the rest is tp or cp, folded)
    mesh = DeviceMesh(tp=p.tp, cp=p.cp, ep=ep, dp=p.dp // ep // p.dp_replicate, dr=p.dp_replicate, pp=p.pp)
    tree = StrategyTree.from_model(model, mesh, p.global_batch, p.micro_batch)
    tree.zero_stage = p.zero
    tree.overlap_grad_reduce = p.overlap_grad_reduce
    tree.overlap_param_gather = p.overlap_param_gather
    tree.tp_comm_overlap = p.tp_comm_overlap
    tree.cp_comm = p.cp_comm
    tree.ep_dispatcher, tree.ep_node_limit, tree.ep_overlap = p.ep_dispatcher, p.ep_node_limit, p.ep_overlap
    tree.ep_dispatcher_sms = p.ep_dispatcher_sms
    tree.p2p_scatter_gather = p.p2p_scatter_gather
    tree.offload = p.offload
    tree.offload_activations = p.offload_activations
    tree.cuda_graphs = p.cuda_graphs
    m = p.global_batch // (p.micro_batch * p.dp)
    kind = run_kind(p.schedule, p.vpp)
    cap = p.max_ongoing if kind == "dynamic" or (p.max_ongoing is not None and p.max_ongoing < min(p.pp, m)) \
        else None
    tree.root.schedule_config = ScheduleConfig(n_micro_batch=m, kind=kind, virtual_stages=p.vpp,
                                               max_ongoing_micro_batch=cap)
    tree.schedule_set = True
    tree.root.recompute_mode = p.recompute
    tree.root.shard_items = frozenset(ZERO_ITEMS[p.zero])
    chunk_of = chunk_assignment(model, p.pp * p.vpp, stage_layers(model, p))
    # A leaf's configs depend only on its ops (and the spec), and the blocks of a zoo model share their op
    # objects: derive them once per op list and share that LeafConfig among the layers with the list (copy on
    # write: a node that is edited takes its own copy, StrategyNode.own_leaf). Lowering then keys each shared
    # leaf once, and a simulation that edits nothing never copies one.
    derived: dict[tuple[int, ...], LeafConfig] = {}
    for node in tree.root.walk():
        layer: Layer | None = node.layer
        if layer is None:
            continue
        node.chunk = chunk_of[layer.name]
        if layer.kind in ("embedding", "head", "mtp_embedding") and p.recompute != "none":
            node.recompute_mode = "none"  # Megatron checkpoints transformer layers only
        key = tuple(map(id, layer.ops))  # the ops live as long as the model: ids are stable here
        first = derived.get(key)
        if first is None:
            node.leaf = derived[key] = preset_leaf(layer, p, model.batch_dim)
        else:
            first.shared = True
            node.leaf = first
    return tree


def preset_leaf(layer: Layer, p: ParallelSpec, batch_dim: str) -> LeafConfig:
    """The preset's configs of one layer: every op's split (all its dimensions decided), weight and state
    memory configs under ZeRO, and sequence parallelism's saved-tensor storage."""
    leaf = LeafConfig()
    for op in layer.ops:
        split = op_split(op, p, batch_dim)
        leaf.ops[op.name] = split
        leaf.explicit[op.name] = set(op.dims)  # a preset decides every dimension
        if op.weight is not None:
            leaf.weights[op.name] = weight_config(op, split, p.zero)
        elif op.extra_params:
            leaf.extras[op.name] = state_config(split, ZERO_ITEMS[p.zero])
    if p.sequence_parallel:
        for op_name, tensor in SP_SAVED:
            if op_name in leaf.ops:
                leaf.saved[(op_name, tensor)] = {"s": ("cp", "tp")}
    return leaf
