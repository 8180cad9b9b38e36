"""Lowering a model and its strategy tree into per-chunk step templates (before costing).

A template is the program one rank runs for one micro-batch of one pipeline chunk, forward or
backward: compute steps per op on its local shard, the resharding collectives the layouts imply,
recompute steps, memory allocation at production and release at last use. Micro-batches and
ranks of a stage are identical, so each template is built once and instantiated by the graph
builder (symmetry first).

Layers repeat (a transformer's blocks are identical): what one layer lowers to (its forward, backward and
recompute steps with their resharding collectives, its stored states and gradient buckets) is built once per
distinct (layer kind and op shapes, leaf configs, recompute, incoming layouts) and copied, renamed, for every
layer that shares it (`_Templates`). So are whole chunks: the stages of a pipeline of identical blocks differ
only in their layers' names, so a chunk's forward and backward are lowered once per distinct (layers, what
it receives, whether it sends) and copied to the others (`_ChunkTemplate`). Each copy gets its own Step
objects, so the later in-place edits of a step (zero-3 and offload dependencies, durations, fusion) stay with
that step. Which chunk phases are copies of which is recorded on the Program (`ChunkCopies`): cost.annotate
prices an original once and copies its costs, and the graph builder coarsens it once, without comparing the
copies step by step again.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from enum import IntEnum
from functools import partial
from operator import attrgetter
from typing import Any, NamedTuple, TypeVar

import numpy as np

from ..strategy.mesh import AXIS_ORDER, REPLICA_AXES, DeviceMesh
from ..strategy.precision import FP8_ACTIVATION_BYTES, NF4_BYTES_PER_PARAM, Precision, low_precision_gemm
from ..strategy.presets import EXPERT_OPS
from ..strategy.schedules import ZERO_BUBBLE_KINDS, chunk_place
from ..strategy.tree import (
    FULL_ITERATION,
    LeafConfig,
    Split,
    StateConfig,
    StrategyNode,
    StrategyTree,
    recompute_modules,
)
from ..workload.ir import CONTRACTION_KINDS, Layer, Op, OpValues, SavedTensor
from .layout import (
    Layout,
    input_grad_layout,
    local_sizes,
    output_layout,
    reshard,
    restrict,
    tensor_bytes,
    weight_grad_partial,
)
from .recompute import RecomputePlan, recompute_plan


class Stream(IntEnum):
    COMPUTE = 0
    FEATURE = 1  # TP / CP / EP activation collectives (Proteus: feature communication)
    GRAD = 2  # DP gradient sync, ZeRO gathers (Proteus: gradient communication)
    P2P = 3  # pipeline sends
    MEMORY = 4  # loads/stores of offloaded parameters, gradients, optimizer states (ASTRA-sim memory nodes)


STREAM_NAMES = ("compute", "feature-comm", "grad-comm", "pp-p2p", "memory")


@dataclass
class Step:
    """One task of a template; `deps` are template indices (None: the previous step)."""

    label: str
    kind: str  # compute | collective | memory
    stream: int
    category: str  # compute | recompute | optimizer | tp | cp | ep | dp | pp
    layer: str = ""
    deps: tuple[int, ...] | None = None
    op: Op | None = None
    local: dict[str, float] | None = None
    phase: str = "fwd"  # fwd | bwd (dgrad + wgrad) | dgrad | wgrad | recompute | optimizer
    model_flops: float = 0.0
    hw_flops: float = 0.0
    collective: str = ""
    axes: tuple[str, ...] = ()
    size_bytes: float = 0.0
    alloc_bytes: float = 0.0
    free_bytes: float = 0.0
    grad_bucket: str | None = None  # this step finishes the gradients of layer `grad_bucket`
    duration_s: float = 0.0  # filled by the cost models (cost.annotate)
    host_s: float = 0.0  # framework (CPU) time to issue this step, filled by cost.annotate
    parts: dict[str, float] | None = None  # category split when several steps were fused into one
    access: str = ""  # memory steps: load | store of `size_bytes` (remote), priced by the memory system
    # memory steps: the pool's switches gather the shard while loading / reduce-scatter it while storing over the
    # group `axes` (ASTRA-sim 2.0 in-switch collectives; tree.offload_in_switch)
    in_switch: bool = False
    # the host waits for the GPU to finish what came before before it issues this step: a device-to-host read (a
    # dropless MoE's token counts, which its dispatch and grouped GEMMs need on the host)
    host_sync: bool = False


STEP_LISTS = ("fwd", "bwd", "grad_sync", "post_step")
"""A ChunkProgram's step lists."""


@dataclass
class ChunkProgram:
    """Everything one pipeline chunk (model chunk on one pipeline rank) runs per iteration."""

    chunk: int
    pp_rank: int
    vchunk: int
    layers: list[str]
    fwd: list[Step] = field(default_factory=list)
    bwd: list[Step] = field(default_factory=list)
    grad_sync: list[Step] = field(default_factory=list)  # one per layer bucket, anchored by grad_bucket
    post_step: list[Step] = field(default_factory=list)  # ZeRO-1/2 parameter all-gather
    send_fwd_bytes: float = 0.0
    send_bwd_bytes: float = 0.0
    params_local: float = 0.0  # parameters stored (after TP/PP and ZeRO-3 sharding)
    grads_local: float = 0.0
    optimizer_params_local: float = 0.0
    # bytes to add to params_local x param_bytes for weights stored in another format (FP8 under fp8_params, NF4
    # under QLoRA): each such weight's elements x (its bytes - param_bytes)
    param_bytes_adjust: float = 0.0
    # bytes to add to optimizer_params_local x optimizer_bytes: Adafactor's factored moments (negative)
    optimizer_bytes_adjust: float = 0.0
    embedding_grad_bytes: float = 0.0  # tied embedding/head weight on this chunk (for the cross-stage sum)
    send_fwd_s: float = 0.0  # filled by cost.annotate
    send_bwd_s: float = 0.0
    offload: str = "none"  # where its parameters, gradients and optimizer states live (compile.offload)
    # per layer: (parameters, gradients, optimizer-state parameters) this rank stores (the local counts above, by layer)
    layer_states: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    # bumped by every in-place edit of its steps after lowering (stretch_compute): a ChunkCopies record made at
    # other revisions no longer holds (not part of the chunk's value)
    revision: int = field(default=0, compare=False, repr=False)

    # -- step lists lowering copied from another chunk, made when first read -------------------------------
    # Lowering copies a chunk that repeats another's (ChunkCopies) as a deferred list: a template and the layers
    # to rename it to. Reading the list (attribute access, equality, repr, an edit) makes it, with the costs
    # annotate gave the original's steps when it priced the copy by copying them (`copy_costs`); annotate, the
    # allocator replay and the graph builder read what they need of a deferred list without making it
    # (`deferred`, `step_names`, the original's steps), so a pipeline of identical stages builds one stage's
    # steps, not every stage's. Not thread-safe (as nothing here is).

    def __getattr__(self, name: str) -> Any:
        deferred = self.__dict__.get("_deferred")
        if deferred is None or name not in deferred:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        d = deferred.pop(name)
        steps: list[Step] = []
        d.template.copy_to(d.layers, steps)
        if d.costs is not None:
            for st, (duration, host) in zip(steps, d.costs, strict=True):
                st.duration_s, st.host_s = duration, host
        self.__dict__[name] = steps
        return steps

    def defer(self, name: str, template: _StepsTemplate, layers: list[Layer]) -> bool:
        """Hold step list `name` (empty now) as `template` renamed to `layers`, made when first read; False (and
        nothing deferred) where the list already has steps."""
        if self.__dict__.get(name):
            return False
        self.__dict__.pop(name, None)
        self.__dict__.setdefault("_deferred", {})[name] = _Deferred(template, layers)
        return True

    def deferred(self, name: str) -> bool:
        """Whether step list `name` is still a deferred copy (not made yet)."""
        return name in self.__dict__.get("_deferred", ())

    def step_names(self, name: str) -> list[Step] | StepNames:
        """Each step's label and gradient bucket of list `name`: its steps, or a deferred list's names."""
        d = self.__dict__.get("_deferred", {}).get(name)
        return getattr(self, name) if d is None else d.template.names(d.layers)

    def copy_costs(self, name: str, costs: list[tuple[float, float]]) -> None:
        """Give list `name`'s steps these (duration_s, host_s), in order (annotate's priced copy)."""
        d = self.__dict__.get("_deferred", {}).get(name)
        if d is not None:
            assert len(costs) == len(d.template.rows)
            d.costs = costs
            return
        for st, (duration, host) in zip(getattr(self, name), costs, strict=True):
            st.duration_s, st.host_s = duration, host


class StepName(NamedTuple):
    """What names a step (the graph builder's renaming reads only these)."""

    label: str
    grad_bucket: str | None


class StepNames:
    """The names of a deferred copy's steps, each made when asked for (the graph builder reads a few per
    coarsened task): `names[i]` is step i's StepName."""

    __slots__ = ("_rows", "_layers")

    def __init__(self, rows: list[tuple[list[Any], int, str, int, int]], layers: list[str]) -> None:
        self._rows, self._layers = rows, layers

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, i: int) -> StepName:
        _, layer, suffix, _, owner = self._rows[i]
        return StepName(self._layers[layer] + suffix, self._layers[owner] if owner >= 0 else None)


@dataclass
class _Deferred:
    """A step list lowering copied but has not made yet (ChunkProgram.defer): the template, the layers it is
    renamed to, and the costs annotate gave it (None: not priced by copying)."""

    template: _StepsTemplate
    layers: list[Layer]
    costs: list[tuple[float, float]] | None = None


@dataclass
class ChunkCopies:
    """Which chunk phases lowering made as renamed copies of another chunk's, so that annotate and the graph
    builder can reuse the work they did for the original instead of finding the equality again.

    `lowered`: (chunk, "fwd" | "bwd") -> the chunk whose steps it copied ("fwd": its forward, gradient buckets
    and post-step all-gathers; "bwd": its backward), step for step, equal but for the names of layers and ops.
    `complete`: every chunk phase lowered with the key of an earlier one is among them (lowering with its caches
    on, each copy made), so the others were lowered from distinct keys.
    `priced`: those of them annotate priced by copying the original's costs (each step its duration and host
    time, the FlowBook `book` the link demands of its stage equal to the original's); None: not annotated.
    The record holds only while every chunk's `revision` is `revisions` (`valid`): an in-place edit of a
    chunk's steps (stretch_compute) bumps it, and readers then compare the steps themselves as without it."""

    lowered: dict[tuple[int, str], int]
    complete: bool
    revisions: tuple[int, ...]
    priced: dict[tuple[int, str], int] | None = None
    book: object | None = None

    def valid(self, chunks: list[ChunkProgram]) -> bool:
        """Whether no chunk was edited since the record was made."""
        return len(chunks) == len(self.revisions) and all(
            ch.revision == r for ch, r in zip(chunks, self.revisions, strict=True))


@dataclass
class Program:
    tree: StrategyTree
    precision: Precision
    chunks: list[ChunkProgram]
    model_flops_per_iteration: float
    hw_flops_per_iteration: float
    embedding_sync_s: float = 0.0  # filled by cost.annotate
    # the lowering's op value ids, which cost.annotate reuses for its cost cache (not part of the program's value)
    op_values: OpValues | None = field(default=None, compare=False, repr=False)
    # which chunk phases are renamed copies of others (lowering's record, for annotate and build_graph; not part
    # of the program's value)
    copies: ChunkCopies | None = field(default=None, compare=False, repr=False)

    @property
    def mesh(self) -> DeviceMesh:
        return self.tree.mesh


def stretch_compute(chunk: ChunkProgram, factor: float) -> None:
    """Stretch one chunk's per-micro-batch work by `factor`, in place: its compute kernels' GPU time and the
    host (framework) time of issuing every forward and backward step, so that the stage takes `factor` times
    longer whether the GPU or the host paces it (the learned compute model's correction, trainsim.learn). The
    chunk's revision is bumped: it may no longer equal the chunks recorded as its copies (ChunkCopies)."""
    chunk.revision += 1
    for s in (*chunk.fwd, *chunk.bwd):
        if s.stream == Stream.COMPUTE:
            s.duration_s *= factor
        s.host_s *= factor


Tensor = tuple[Layout, float]
"""A tensor crossing a layer boundary: its layout and bytes per rank."""

R = TypeVar("R")


def _leaf_value(leaf: LeafConfig) -> tuple:
    """A hashable value of the resolved configs lowering reads from a leaf: op splits, weight memory configs
    (every field a Split), states of dimensionless parameters (every field a tuple of axes), saved storage."""
    return (tuple((k, tuple(v.items())) for k, v in leaf.ops.items()),
            tuple((k, tuple(tuple(s.items()) for s in vars(w).values())) for k, w in leaf.weights.items()),
            tuple((k, tuple(vars(c).values())) for k, c in leaf.extras.items()),
            tuple((k, tuple(v.items())) for k, v in leaf.saved.items()))


def _same_leaf(a: LeafConfig, b: LeafConfig) -> bool:
    """Whether two resolved leaves lower alike: their configs are equal. (Dict equality ignores the order of
    keys, which `_leaf_value` sees; lowering does not: it looks splits and configs up by op, tensor and
    dimension, and collects axes in AXIS_ORDER or as sets.)"""
    return a.ops == b.ops and a.weights == b.weights and a.extras == b.extras and a.saved == b.saved


def _same_ops(a: list[Op], b: list[Op]) -> bool:
    """Op by op `x.key() == y.key()`, by comparing (dataclass equality, plus the order of the dims)."""
    return all(x is y or (x == y and list(x.dims) == list(y.dims)) for x, y in zip(a, b, strict=True))


def _tensor_key(tensor: Tensor | None) -> tuple | None:
    if tensor is None:
        return None
    layout, size = tensor
    return layout.dims, tuple(layout.split.items()), layout.partial, size


_STEP_FIELDS = tuple(f.name for f in fields(Step))
_LABEL, _LAYER, _OP, _LOCAL, _DEPS, _BUCKET = (_STEP_FIELDS.index(n) for n in
                                               ("label", "layer", "op", "local", "deps", "grad_bucket"))
_step_values = attrgetter(*_STEP_FIELDS)


@dataclass
class _StepsTemplate:
    """Steps kept as a template for layers equal to theirs but for their names and op objects: per step its
    field values (in Step's field order) and where its names and op come from. A copy is one Step call per
    step on a copy of its values: the cheapest copy of a step that is still its own object (and a compact one:
    no per-object dict is made)."""

    # per step: (its field values as made, the index of its layer among the template's layers, its label after
    # its layer's name, the position of its op in its layer or -1, the index of the layer its grad_bucket
    # names or -1)
    rows: list[tuple[list[Any], int, str, int, int]]

    @classmethod
    def of(cls, steps: list[Step], layers: list[Layer]) -> _StepsTemplate | None:
        """`steps` (of `layers`) as a template, copied before any later edit; None where a step's names or op are
        not its layer's (a step that no renaming copies)."""
        index = {layer.name: i for i, layer in enumerate(layers)}
        positions = [{id(op): p for p, op in enumerate(layer.ops)} for layer in layers]
        rows = []
        for s in steps:
            i = index.get(s.layer)
            if (i is None or not s.label.startswith(s.layer) or s.parts is not None
                    or (s.local is None) != (s.op is None)
                    or (s.op is not None and id(s.op) not in positions[i])
                    or (s.grad_bucket is not None and s.grad_bucket not in index)):
                return None
            v = list(_step_values(s))
            if s.local is not None:
                v[_LOCAL] = dict(s.local)
            rows.append((v, i, s.label[len(s.layer):], positions[i][id(s.op)] if s.op is not None else -1,
                         index[s.grad_bucket] if s.grad_bucket is not None else -1))
        return cls(rows)

    def names(self, layers: list[Layer]) -> StepNames:
        """Each step's label and gradient bucket in a copy for `layers`, without making the copy."""
        return StepNames(self.rows, [layer.name for layer in layers])

    def copy_to(self, layers: list[Layer], steps: list[Step], shift: int = 0) -> None:
        """Append a copy for `layers` to `steps`: renamed to its layers, ops mapped to theirs, deps shifted by
        `shift`, each compute step its own local shape (lowering copies every step of every repeated layer:
        this is its hot loop)."""
        names = [layer.name for layer in layers]
        ops = [layer.ops for layer in layers]
        append = steps.append
        label, layer, op, local, deps, bucket = _LABEL, _LAYER, _OP, _LOCAL, _DEPS, _BUCKET
        for src, i, suffix, pos, owner in self.rows:
            v = src.copy()
            name = names[i]
            v[label] = name + suffix
            v[layer] = name
            if pos >= 0:
                v[op] = ops[i][pos]
                v[local] = v[local].copy()
            if owner >= 0:
                v[bucket] = names[owner]
            if shift and v[deps]:
                v[deps] = tuple(d + shift for d in v[deps])
            append(Step(*v))


@dataclass
class _LayerTemplate:
    """The steps one layer lowered to (appended to a list at `start`: their deps are indices of that list),
    with what the lowering returned."""

    start: int
    steps: _StepsTemplate
    result: object


@dataclass(frozen=True)
class _StatePlan:
    """A layer's stored states and gradient collectives on one rank (`_Lowerer.grad_sync`), per op in order (and
    LoRA adapters after their op): (parameters, gradients, optimizer-state parameters stored, tied-embedding
    gradient bytes or None, the bytes its stored weight takes beyond parameters x param_bytes (FP8 or NF4
    storage), the bytes its optimizer states take beyond optimizer-state parameters x optimizer_bytes
    (Adafactor's factored or Muon's single moment))."""

    states: tuple[tuple[float, float, float, float | None, float, float], ...]
    buckets: tuple[tuple[str, tuple[str, ...], float], ...]  # (collective, axes, bytes)
    post: tuple[tuple[tuple[str, ...], float], ...]  # ZeRO-1/2 parameter all-gathers: (axes, bytes)


class _Templates:
    """Per-lowering cache of layer templates and of the layer / leaf keys they are looked up by.

    Keys are values (Op.key of every op, the leaf's resolved configs, the incoming layouts and bytes), so
    two layers share a template only when lowering them would compute the same thing; everything else a
    lowering reads (mesh, precision, schedule, offload) is fixed for one lowerer. Objects are keyed by id
    only while the tree that owns them is alive (the whole lowering)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.layers: dict[tuple, _LayerTemplate] = {}
        self.values: dict[tuple, object] = {}
        self.ops = OpValues()
        self._layer_keys: dict[int, tuple] = {}
        self._leaf_keys: dict[int, int] = {}
        self._leaf_values: dict[tuple, int] = {}
        self._last_layer: dict[tuple[str, int], Layer] = {}  # by (kind, number of ops): the last layer keyed
        self._last_leaf: LeafConfig | None = None  # the last leaf keyed

    def layer_key(self, layer: Layer) -> tuple:
        """The layer's kind, tied op and op values (as OpValues ids). A layer equal to the last one keyed of its
        kind and length (the usual run of identical blocks) takes its key by comparing the ops, which is
        cheaper than building their keys; its ops are then known to the OpValues as the same values."""
        k = self._layer_keys.get(id(layer))
        if k is None:
            bucket = (layer.kind, len(layer.ops))
            last = self._last_layer.get(bucket)
            if last is not None and layer.tied_op == last.tied_op and _same_ops(layer.ops, last.ops):
                k = self._layer_keys[id(last)]
                for op, like in zip(layer.ops, last.ops, strict=True):
                    if op is not like:
                        self.ops.alias(op, like)
            else:
                k = (layer.kind, layer.tied_op, tuple(map(self.ops, layer.ops)))
            self._layer_keys[id(layer)] = k
            self._last_layer[bucket] = layer
        return k

    def leaf_key(self, leaf: LeafConfig) -> int:
        """An id of the configs lowering reads, equal for leaves that lower alike (resolved: call after
        tree.resolve). A leaf equal to the last one keyed takes its id by comparison (cheaper than building its
        value)."""
        k = self._leaf_keys.get(id(leaf))
        if k is None:
            last = self._last_leaf
            if last is not None and _same_leaf(leaf, last):
                k = self._leaf_keys[id(last)]
            else:
                k = self._leaf_values.setdefault(_leaf_value(leaf), len(self._leaf_values))
            self._leaf_keys[id(leaf)] = k
            self._last_leaf = leaf
        return k

    def value(self, key: tuple, build: Callable[[], R]) -> R:
        """A pure per-layer value (state plan, ZeRO-3 gather), computed once per key."""
        if not self.enabled:
            return build()
        if key not in self.values:
            self.values[key] = build()
        return self.values[key]  # type: ignore[return-value]

    def steps(self, key: tuple, layer: Layer, steps: list[Step], build: Callable[[], R]) -> R:
        """Run `build` (which appends the layer's steps to `steps`) once per key; later layers with the key
        get the template's steps copied: renamed to the layer, ops mapped to its own, deps shifted."""
        if not self.enabled:
            return build()
        t = self.layers.get(key)
        if t is None:
            start = len(steps)
            result = build()
            made = _StepsTemplate.of(steps[start:], [layer])
            assert made is not None, f"{layer.name}: a step not named after its layer"
            self.layers[key] = _LayerTemplate(start, made, result)
            return result
        t.steps.copy_to([layer], steps, len(steps) - t.start)
        return t.result  # type: ignore[return-value]


def _category(axes: tuple[str, ...], grad: bool) -> str:
    """A collective's time category: dp for gradient work; else the first of ep (only expert ops split over it:
    token dispatch, even where it also crosses tp), tp, cp, dp among its axes."""
    if grad:
        return "dp"
    for c in ("ep", "tp", "cp", "dp"):
        if c in axes:
            return c
    return "dp"


class _Lowerer:
    """Lowers one tree in one precision; `cache`: share the work of identical layers (off: every layer is
    lowered from scratch, the reference the templates are tested against)."""

    def __init__(self, tree: StrategyTree, precision: Precision, cache: bool = True) -> None:
        self.tree = tree
        self.mesh = tree.mesh
        self.prec = precision
        self.act_scale = precision.activation_bytes / 2.0
        # zero-bubble schedules run a weighted op's input-gradient GEMM and weight-gradient GEMM apart
        self.split_wgrad = tree.schedule.kind in ZERO_BUBBLE_KINDS
        # offload remote with in-switch collectives: the pool reduce-scatters the gradients of layers with sharded
        # weights while storing them, so their GPU reduce-scatter is not emitted (an HSDP replica all-reduce stays)
        self.in_switch = tree.offload_in_switch and tree.offload != "none"
        # a dropless MoE reads its routing's token counts on the host before the step after its dispatch
        # (Megatron-Core: the all-to-all's splits before the EP all-to-all, the grouped GEMM's per-expert sizes;
        # DeepEP / HybridEP's received-token count): the host waits for the GPU there. Padding to a capacity fixes
        # the counts; a full-iteration CUDA graph needs (and assumes) Megatron's sync-free dispatch
        hyper = tree.model.hyper
        self.moe_sync = bool(hyper.get("experts")) and not hyper.get("moe_padded") \
            and FULL_ITERATION not in tree.cuda_graphs
        self.templates = _Templates(cache)

    # -- helpers -------------------------------------------------------------------------------
    def _out_bytes(self, op: Op, split: Split) -> float:
        return tensor_bytes(op, op.output, restrict(split, op.output), self.mesh, op.bytes_per_elem * self.act_scale)

    def _in_bytes(self, op: Op, split: Split, i: int) -> float:
        dims = op.inputs[i]
        return tensor_bytes(op, dims, restrict(split, dims), self.mesh, op.bytes_per_elem * self.act_scale)

    def _plan(self, layer: Layer, recompute: str) -> RecomputePlan | None:
        """What a selective recompute mode re-runs and drops in `layer` (None: none or full recompute)."""
        modules = recompute_modules(recompute)
        if modules is None:
            return None
        return self.templates.value(("recompute", self.templates.layer_key(layer), recompute),
                                    lambda: recompute_plan(layer.ops, modules))

    def _tensor_bytes(self, op: Op, t: SavedTensor, leaf: LeafConfig, split: Split, layer: Layer) -> float:
        s = split if t.as_used else {**split, **leaf.saved.get((op.name, t.name), {})}
        # cached in FP8: a block linear's input (not the MoE router's, which stays in higher precision: DeepSeek-V3
        # sec. 3.3.1; strategy.precision.low_precision_gemm)
        fp8 = self.prec.fp8_activations and t.name == "input" and low_precision_gemm(layer.kind, op)
        return tensor_bytes(op, t.dims, s, self.mesh, FP8_ACTIVATION_BYTES if fp8 else t.bytes_per_elem * self.act_scale)

    def _saved(self, op: Op, layer: Layer, leaf: LeafConfig, split: Split, recompute: str,
               plan: RecomputePlan | None) -> tuple[float, float]:
        """(bytes kept from forward, bytes re-materialised by recompute) of one op."""
        kept = recomputed = 0.0
        for t in op.saved:
            b = self._tensor_bytes(op, t, leaf, split, layer)
            if recompute == "full" or (plan is not None and (op.name, t.name) in plan.dropped):
                recomputed += b
            else:
                kept += b
        return kept, recomputed

    def _remade(self, op: Op, layer: Layer, leaf: LeafConfig, plan: RecomputePlan) -> float:
        """Bytes a re-run op makes again for the ops that consume its output (their dropped saved tensors)."""
        total = 0.0
        for consumer, name in plan.remakes.get(op.name, ()):
            c = next(o for o in layer.ops if o.name == consumer)
            t = next(x for x in c.saved if x.name == name)
            total += self._tensor_bytes(c, t, leaf, leaf.ops.get(c.name, {}), layer)
        return total

    def _transient(self, op: Op, split: Split) -> float:
        """Bytes of the op's transient tensors (Op.transient) in the op's own layout: its step allocates and
        frees them, so they count toward the peak but not toward what the step holds afterwards."""
        return sum(tensor_bytes(op, t.dims, restrict(split, t.dims), self.mesh, t.bytes_per_elem * self.act_scale)
                   for t in op.transient)

    def _collectives(self, steps: list[Step], src: Layout, dims: tuple[str, ...], split: Split,
                     src_bytes: float, layer: str, phase: str, label: str, expert: bool = False) -> None:
        """The collectives that take a tensor from `src` to `split`; `expert`: it enters or leaves the experts, so
        an all-to-all is the token dispatch (category ep, whatever axes it crosses: cp where EP folds over it)."""
        for r in reshard(src, dims, split, self.mesh, src_bytes):
            cat = "ep" if expert and r.collective == "all_to_all" else _category(r.axes, False)
            steps.append(Step(f"{label}:{r.collective}", "collective", Stream.FEATURE, cat,
                              layer, phase=phase, collective=r.collective, axes=r.axes, size_bytes=r.size_bytes))

    def _compute(self, op: Op, split: Split, layer: str, phase: str, alloc: float = 0.0, free: float = 0.0) -> Step:
        local = local_sizes(op.dims, split, self.mesh)
        if phase == "bwd":
            flops = op.bwd_flops(local)
        elif phase in ("dgrad", "wgrad"):  # the two halves of a weighted op's backward
            flops = op.bwd_flops(local) / 2
        else:
            flops = op.fwd_flops(local)
        contraction = op.kind in CONTRACTION_KINDS
        model = flops * op.useful if contraction and phase != "recompute" else 0.0
        hw = flops if contraction else 0.0
        cat = "recompute" if phase == "recompute" else "compute"
        return Step(f"{layer}.{op.name}", "compute", Stream.COMPUTE, cat, layer, op=op, local=local, phase=phase,
                    model_flops=model, hw_flops=hw, alloc_bytes=alloc, free_bytes=free)

    # -- forward ---------------------------------------------------------------------------------
    def forward_layer(self, layer: Layer, leaf: LeafConfig, recompute: str, prev: Tensor | None,
                      steps: list[Step], phase: str = "fwd", only_selective: bool = False,
                      checkpoint: Tensor | None = None) -> Tensor | None:
        """Append the layer's forward (or its recompute) and return the output layout and bytes. `prev`: the
        input as it arrives (its layout sets the collectives); `checkpoint`: the input as the layer keeps it
        under full recompute, when that differs (a pipeline hand-off scattered over tp arrives as 1/tp of the
        tensor but is gathered whole before the layer runs, and the whole one is what the backward frees)."""
        tp = self.templates
        ck = prev if checkpoint is None else checkpoint
        key = ("fwd", tp.layer_key(layer), tp.leaf_key(leaf), recompute, _tensor_key(prev), phase, only_selective,
               _tensor_key(ck))
        return tp.steps(key, layer, steps,
                        lambda: self._forward_layer(layer, leaf, recompute, prev, steps, phase, only_selective, ck))

    def _forward_layer(self, layer: Layer, leaf: LeafConfig, recompute: str, prev: Tensor | None,
                       steps: list[Step], phase: str, only_selective: bool,
                       checkpoint: Tensor | None) -> Tensor | None:
        outs: dict[str, tuple[Layout, float]] = {}
        producer: dict[str, Op] = {}
        cur, cur_op = prev, None
        plan = self._plan(layer, recompute)
        sync_from = -1  # the index of the step after a dropless dispatch's forward: the host syncs before it
        for k, op in enumerate(layer.ops):
            split = leaf.ops.get(op.name, {})
            run = not only_selective or (plan is not None and op.name in plan.rerun)
            for i, dims in enumerate(op.inputs):
                src_name = op.input_from[i] if i < len(op.input_from) else None
                if src_name == "@skip":
                    continue
                src = outs.get(src_name) if src_name else cur
                if src is None or not run:
                    continue
                # an input that is a slice of its producer's output (K and V of a fused QKV) moves only its share
                made_by = producer.get(src_name) if src_name else cur_op
                size = src[1]
                if made_by is not None:
                    full_in, full_out = op.size(dims), made_by.size(made_by.output)
                    if 0 < full_in < full_out:
                        size *= full_in / full_out
                expert = op.name in EXPERT_OPS or (made_by is not None and made_by.name in EXPERT_OPS)
                self._collectives(steps, src[0], dims, split, size, layer.name, phase, f"{layer.name}.{op.name}.in{i}",
                                  expert)
            kept, recomputed = self._saved(op, layer, leaf, split, recompute, plan)
            if run:
                if phase == "fwd":
                    alloc = kept
                    if recompute == "full" and k == 0 and checkpoint is not None:
                        alloc += checkpoint[1]  # the layer input is the checkpoint (freed by backward_layer)
                else:
                    alloc = recomputed + (self._remade(op, layer, leaf, plan) if plan is not None else 0.0)
                temp = self._transient(op, split) if op.transient else 0.0
                steps.append(self._compute(op, split, layer.name, phase, alloc=alloc + temp, free=temp))
                if phase == "fwd" and op.name == "dispatch" and self.moe_sync:
                    sync_from = len(steps)
            out = (output_layout(op, split), self._out_bytes(op, split))
            outs[op.name] = out
            producer[op.name] = op
            cur, cur_op = out, op
            if op.name != "dispatch" and 0 <= sync_from < len(steps):
                steps[sync_from].host_sync = True
                sync_from = -1
        return cur

    # -- backward --------------------------------------------------------------------------------
    def backward_layer(self, layer: Layer, leaf: LeafConfig, recompute: str, grad: Tensor | None,
                       prev: Tensor | None, steps: list[Step]) -> Tensor | None:
        """Append the layer's backward (after its recompute) and return its input gradient's layout and bytes."""
        tp = self.templates
        # a step that waits on "the step before" has none at the start of the list (deps () instead)
        key = ("bwd", tp.layer_key(layer), tp.leaf_key(leaf), recompute, _tensor_key(grad), _tensor_key(prev),
               not steps)
        return tp.steps(key, layer, steps, lambda: self._backward_layer(layer, leaf, recompute, grad, prev, steps))

    def _backward_layer(self, layer: Layer, leaf: LeafConfig, recompute: str, grad: Tensor | None,
                        prev: Tensor | None, steps: list[Step]) -> Tensor | None:
        plan = self._plan(layer, recompute)
        if recompute == "full" or (plan is not None and plan.rerun):
            self.forward_layer(layer, leaf, recompute, prev, steps, phase="recompute", only_selective=plan is not None)
        outs: dict[str, tuple[Layout, Split]] = {op.name: (output_layout(op, leaf.ops.get(op.name, {})),
                                                            leaf.ops.get(op.name, {})) for op in layer.ops}
        first_step = len(steps)
        for k in range(len(layer.ops) - 1, -1, -1):
            op = layer.ops[k]
            split = leaf.ops.get(op.name, {})
            if grad is not None:
                self._collectives(steps, grad[0], op.output, split, grad[1], layer.name, "bwd",
                                  f"{layer.name}.{op.name}.dout", op.name in EXPERT_OPS or op.name == "dispatch")
            kept, recomputed = self._saved(op, layer, leaf, split, recompute, plan)
            free = kept + recomputed
            if recompute == "full" and k == 0 and prev is not None:
                free += prev[1]
            temp = self._transient(op, split) if op.transient else 0.0  # the backward's own temporaries
            frozen = op.frozen and op.weight is not None  # LoRA: the input gradient only, no weight gradient
            regather = [] if frozen else self._regather(op, leaf, split, layer.name)
            # zero bubble: the weight gradient runs later (W), so the op's output gradient is kept for it
            # (with the saved input, freed by W; Qi et al. 2024, Table 1)
            held = self._out_bytes(op, split) if self.split_wgrad and op.weight is not None and not frozen else 0.0
            if frozen:
                steps.append(self._compute(op, split, layer.name, "dgrad", alloc=temp, free=free + temp))
            elif regather:
                # a saved input stored sharded (sequence parallelism) is gathered again for the weight
                # gradient while the input-gradient GEMM runs (Korthikanti et al. 2022, section 4.2.2)
                before = len(steps) - 1
                dgrad = self._compute(op, split, layer.name, "dgrad", alloc=held + temp, free=temp)
                dgrad.deps = (before,) if before >= 0 else ()
                steps.append(dgrad)
                for j, r in enumerate(regather):
                    r.deps = ((before,) if before >= 0 else ()) if j == 0 else None
                    steps.append(r)
                steps.append(self._compute(op, split, layer.name, "wgrad", free=free + held))
                steps[-1].deps = (len(steps) - 2 - len(regather), len(steps) - 2)
            elif held > 0 and op.kind in CONTRACTION_KINDS:
                steps.append(self._compute(op, split, layer.name, "dgrad", alloc=held + temp, free=temp))
                steps.append(self._compute(op, split, layer.name, "wgrad", free=free + held))
            else:
                steps.append(self._compute(op, split, layer.name, "bwd", alloc=temp, free=free + temp))
            for i in range(1, len(op.inputs)):
                src_name = op.input_from[i] if i < len(op.input_from) else None
                if src_name == "@skip":
                    continue
                target = outs.get(src_name) if src_name else (outs[layer.ops[k - 1].name] if k > 0 else None)
                if target is None:
                    continue
                g = input_grad_layout(op, split, i)
                gb = tensor_bytes(op, op.inputs[i], restrict(split, op.inputs[i]), self.mesh,
                                  op.bytes_per_elem * self.act_scale)
                self._collectives(steps, g, target[0].dims, target[1], gb, layer.name, "bwd",
                                  f"{layer.name}.{op.name}.din{i}")
            grad = (input_grad_layout(op, split, 0), self._in_bytes(op, split, 0)) if op.inputs else None
            if k == 0 and prev is None:
                grad = None  # model input (token ids / images): no gradient
        if len(steps) > first_step and any(op.weight is not None for op in layer.ops):
            mine = steps[first_step:]
            # zero bubble: the layer's gradients are complete after its last weight-gradient step (W runs
            # after the input-gradient half, B, of the same micro-batch)
            wgrads = [s for s in mine if s.phase == "wgrad"] if self.split_wgrad else []
            for s in reversed(wgrads or mine):
                if s.kind == "compute":
                    s.grad_bucket = layer.name
                    break
        return grad

    def _regather(self, op: Op, leaf: LeafConfig, split: Split, layer: str) -> list[Step]:
        """Collectives that bring saved tensors from their storage layout back to the op's layout."""
        out: list[Step] = []
        for t in op.saved:
            override = leaf.saved.get((op.name, t.name))
            if not override or op.weight is None or t.as_used:
                continue
            storage = {**split, **override}
            src = Layout(t.dims, restrict(storage, t.dims))
            size = tensor_bytes(op, t.dims, storage, self.mesh, t.bytes_per_elem * self.act_scale)
            for r in reshard(src, t.dims, split, self.mesh, size):
                out.append(Step(f"{layer}.{op.name}.{t.name}:{r.collective}", "collective", Stream.FEATURE,
                                _category(r.axes, False), layer, phase="bwd", collective=r.collective, axes=r.axes,
                                size_bytes=r.size_bytes))
        return out

    # -- chunks --------------------------------------------------------------------------------------
    def chunk_key(self, entries: list[Entry], tied: list[bool]) -> tuple:
        """The values a chunk's layers lower from: per layer its value, configs, recompute and tied flag."""
        tp = self.templates
        return tuple((tp.layer_key(node.layer), tp.leaf_key(node.leaf), rc, t)
                     for (node, rc), t in zip(entries, tied, strict=True))

    def forward_chunk(self, ch: ChunkProgram, entries: list[Entry], tied: list[bool], prev: Tensor | None,
                      received: Tensor | None, sends: bool) -> _ChunkForward:
        """Lower a chunk's forward into `ch` (its forward steps with their ZeRO-3 gathers and offload loads,
        its gradient buckets, post-step gathers and stored states) from `prev`, the previous chunk's output
        (`received`: as it arrives here, scattered over tp; None: as it is); `sends`: hand the output on."""
        first: dict[str, int] = {}
        gathers: dict[str, tuple[float, tuple[str, ...]]] = {}
        offload_sizes: dict[str, tuple[float, float]] = {}  # layer -> (parameter, gradient) bytes per rank
        inputs: list[Tensor | None] = []
        for (node, rc), tied_here in zip(entries, tied, strict=True):
            layer = node.layer
            ch.layers.append(layer.name)
            inputs.append(prev)  # what the layer keeps / recomputes from: the gathered input
            first[layer.name] = len(ch.fwd)
            prev = self.forward_layer(layer, node.leaf, rc, received or prev, ch.fwd, checkpoint=prev)
            received = None
            params0, grads0, opt0 = ch.params_local, ch.grads_local, ch.optimizer_params_local
            adjust0 = ch.param_bytes_adjust
            self.grad_sync(layer, node.leaf, ch, tied_here)
            ch.layer_states[layer.name] = (ch.params_local - params0, ch.grads_local - grads0,
                                           ch.optimizer_params_local - opt0)
            offload_sizes[layer.name] = ((ch.params_local - params0) * self.prec.param_bytes
                                         + (ch.param_bytes_adjust - adjust0),
                                         (ch.grads_local - grads0) * self.prec.grad_bytes)
            gathers[layer.name] = self.zero3_gather(layer, node.leaf)
        sent = None
        if prev and sends:
            sent = _scatter_over_tp(prev, self.mesh) if self.tree.p2p_scatter_gather else prev
            ch.send_fwd_bytes = sent[1]
        switch: dict[str, Gather] = {}
        offload = self.tree.offload != "none"
        if offload and self.in_switch:  # the pool gathers these layers' weights while loading them: no GPU all-gather
            stored = {node.layer.name: self.zero3_stored(node.layer, node.leaf, t)
                      for (node, _), t in zip(entries, tied, strict=True)}
            switch = _switch_gathered(gathers, stored, offload_sizes)
            gathers = {k: v for k, v in gathers.items() if k not in switch}
        ch.fwd = _insert_zero3(ch.fwd, first, gathers, "fwd")
        if offload:
            # compile.offload builds Steps: imported here, not at module load
            from .offload import insert_offload

            ch.offload = self.tree.offload
            ch.fwd = insert_offload(ch.fwd, offload_sizes, "fwd", switch)
        kept: dict[str, float] = {}
        if self.tree.offload_activations:  # each checkpointed layer's input to CPU memory and back (compile.offload)
            from .offload import insert_activation_offload

            full = {node.layer.name for node, rc in entries if rc == "full"}
            for s in ch.fwd:
                if s.layer in full:
                    kept[s.layer] = kept.get(s.layer, 0.0) + s.alloc_bytes - s.free_bytes
            ch.fwd = insert_activation_offload(ch.fwd, kept, "fwd")
        return _ChunkForward(inputs, list(offload_sizes.values()), [switch.get(name) for name in ch.layers], prev,
                             sent, [kept.get(name, 0.0) for name in ch.layers])

    def backward_chunk(self, ch: ChunkProgram, entries: list[Entry], fwd: _ChunkForward, grad: Tensor | None,
                       sends: bool) -> Tensor | None:
        """Lower a chunk's backward into `ch` (its backward steps with their recompute, ZeRO-3 gathers, offload
        loads and gradient stores) from `grad`, the next chunk's input gradient as it arrives; return this
        chunk's input gradient as it leaves (`sends`: scattered over tp, where the pipeline does)."""
        first: dict[str, int] = {}
        gathers: dict[str, tuple[float, tuple[str, ...]]] = {}
        for i in range(len(entries) - 1, -1, -1):
            node, rc = entries[i]
            layer = node.layer
            first[layer.name] = len(ch.bwd)
            grad = self.backward_layer(layer, node.leaf, rc, grad, fwd.inputs[i], ch.bwd)
            gathers[layer.name] = self.zero3_gather(layer, node.leaf)
        if grad and sends:
            grad = _scatter_over_tp(grad, self.mesh) if self.tree.p2p_scatter_gather else grad
            ch.send_bwd_bytes = grad[1]
        names = [node.layer.name for node, _ in entries]
        switch = {name: g for name, g in zip(names, fwd.switch, strict=True) if g is not None}
        gathers = {k: v for k, v in gathers.items() if k not in switch}
        ch.bwd = _insert_zero3(ch.bwd, first, gathers, "bwd")
        if self.tree.offload != "none":
            from .offload import insert_offload

            ch.bwd = insert_offload(ch.bwd, dict(zip(names, fwd.offload_sizes, strict=True)), "bwd", switch)
        if any(fwd.activations):  # by position: a copied forward's result names its original's layers
            from .offload import insert_activation_offload

            ch.bwd = insert_activation_offload(ch.bwd, dict(zip(names, fwd.activations, strict=True)), "bwd")
        return grad

    # -- gradients and parameters ---------------------------------------------------------------
    def grad_sync(self, layer: Layer, leaf: LeafConfig, chunk: ChunkProgram, tied_here: bool = False) -> None:
        """Count the layer's stored parameters, gradients and optimizer states and bucket its gradient sync.

        Weights follow their memory configs; biases and norm scales (`extra_params`) follow the op's output
        feature dim (split over tp for column-parallel ops, replicated for row-parallel ones and norms).
        `tied_here`: the layer's tied weight is the one its tie target already holds on this rank
        (embedding and LM head on one stage), so it is stored and synchronised once, by the target.
        """
        tp = self.templates
        plan = tp.value(("sync", tp.layer_key(layer), tp.leaf_key(leaf), tied_here),
                        lambda: self._state_plan(layer, leaf, tied_here))
        for stored, grads, opt, embedding, adjust, opt_adjust in plan.states:  # op by op, as the counts always were
            chunk.params_local += stored
            chunk.grads_local += grads
            chunk.optimizer_params_local += opt
            chunk.param_bytes_adjust += adjust
            chunk.optimizer_bytes_adjust += opt_adjust
            if embedding is not None:
                chunk.embedding_grad_bytes += embedding
        for kind, axes, size in plan.buckets:
            chunk.grad_sync.append(Step(f"{layer.name}.grads:{kind}", "collective", Stream.GRAD, "dp", layer.name,
                                        phase="grad", collective=kind, axes=axes, size_bytes=size,
                                        grad_bucket=layer.name))
        for axes, size in plan.post:
            chunk.post_step.append(Step(f"{layer.name}.params:all_gather", "collective", Stream.GRAD, "dp",
                                        layer.name, phase="optimizer", collective="all_gather", axes=axes,
                                        size_bytes=size))

    def _state_plan(self, layer: Layer, leaf: LeafConfig, tied_here: bool) -> _StatePlan:
        """What `grad_sync` adds for one layer, as values (see there)."""
        states: list[tuple[float, float, float, float | None, float, float]] = []
        buckets: dict[tuple[str, tuple[str, ...]], float] = {}
        post: dict[tuple[str, ...], float] = {}
        # in-switch collectives: the layer's gradient store (its whole shard, norms included) reduce-scatters in
        # the pool when the layer's weights are gathered there (compile.offload), so no GPU reduce-scatter
        in_switch = self.in_switch and self.zero3_gather(layer, leaf)[0] > 0
        for op in layer.ops:
            if op.params == 0:
                continue
            split = leaf.ops.get(op.name, {})
            feature_axes = split.get(op.output[-1], ()) if op.output else ()
            extra = op.extra_params / math.prod(self.mesh.size(a) for a in feature_axes if a == "tp")
            if op.weight is not None:
                wc = leaf.weights[op.name]
                n_weight = tensor_bytes(op, op.weight, restrict(split, op.weight), self.mesh, 1.0)
                f_w, f_g, f_o = (tensor_bytes(op, op.weight, s, self.mesh, 1.0) / n_weight
                                 for s in (wc.weight, wc.grad, wc.optimizer))
                axes = weight_grad_partial(op, split)
                if tied_here and op.name == layer.tied_op:
                    n_weight = 0.0
            else:  # norm scales/shifts: replicated over tp, synchronised (and ZeRO-sharded) over the data axes
                # (under SP Megatron also all-reduces them over tp: 4h values per layer, not modelled)
                n_weight = 0.0
                axes = tuple(a for a in AXIS_ORDER if a != "tp" and any(a in ax for ax in split.values()))
                sc = leaf.extras.get(op.name) or StateConfig()
                f_w, f_g, f_o = (1.0 / math.prod(self.mesh.size(a) for a in part)
                                 for part in (sc.weight, sc.grad, sc.optimizer))
            full_local = n_weight + extra
            if full_local <= 0 and not op.adapter_params:
                continue
            stored, grads, opt = full_local * f_w, full_local * f_g, full_local * f_o
            if op.frozen:  # LoRA: no gradient, optimizer state or sync for the base parameters
                grads = opt = 0.0
            tied = op.weight is not None and (layer.kind == "embedding" or op.name == layer.tied_op)
            elem = self._weight_elem_bytes(layer, op)  # a weight stored in FP8 or NF4: its bytes differ
            states.append((stored, grads, opt, n_weight * self.prec.grad_bytes if tied and not op.frozen else None,
                           n_weight * f_w * (elem - self.prec.param_bytes) if elem != self.prec.param_bytes
                           else 0.0, self._optimizer_adjust(layer, op, split, n_weight) * f_o if opt else 0.0))
            trainable = 0.0 if op.frozen else full_local
            if op.adapter_params:  # LoRA adapters: trained, replicated over tp, sharded as the weight's states
                adapters = float(op.adapter_params)
                states.append((adapters * f_w, adapters * f_g, adapters * f_o, None, 0.0, 0.0))
                trainable += adapters
            axes = tuple(a for a in axes if self.mesh.size(a) > 1)  # one bucket per real group
            if not axes or trainable <= 0:
                continue
            full_local = trainable  # what is synchronised (all of it but for a frozen op's base)
            sharded_opt = f_o < 0.999
            shard = tuple(a for a in axes if a not in REPLICA_AXES) if sharded_opt else ()
            if sharded_opt and shard:
                # ZeRO / FSDP: reduce-scatter over the sharding group; HSDP then all-reduces the shard over
                # the replicas (PyTorch HYBRID_SHARD / FSDP2 2-D mesh)
                if not in_switch:
                    key = ("reduce_scatter", shard)
                    buckets[key] = buckets.get(key, 0.0) + full_local * self.prec.grad_bytes
                replicas = tuple(a for a in axes if a in REPLICA_AXES)
                if replicas:
                    key = ("all_reduce", replicas)
                    size = full_local * self.prec.grad_bytes / self.mesh.group_size(shard)
                    buckets[key] = buckets.get(key, 0.0) + size
                if f_w >= 0.999:  # the updated parameters gathered: FP8 weights in FP8, the rest in the dtype
                    size = (full_local * self.prec.param_bytes if elem == self.prec.param_bytes or op.frozen
                            else n_weight * elem + extra * self.prec.param_bytes)
                    post[shard] = post.get(shard, 0.0) + size
            else:
                key = ("all_reduce", axes)
                buckets[key] = buckets.get(key, 0.0) + full_local * self.prec.grad_bytes
        return _StatePlan(tuple(states), tuple((kind, axes, size) for (kind, axes), size in buckets.items()),
                          tuple(post.items()))

    def _optimizer_adjust(self, layer: Layer, op: Op, split: Split, n_weight: float) -> float:
        """What a matrix optimizer saves on op's local weight against one (Adafactor) or two (Muon) full-size
        moments (bytes, <= 0). Adafactor: a weight of two or more dims keeps its second moment as row and
        column statistics (HF transformers' Adafactor: shape[:-1] and shape[:-2] + shape[-1:], n / last + n /
        second-last values) instead of n. Muon: a block's matrix keeps one momentum, not AdamW's two (the
        embedding and the output layer stay with AdamW). 0 for other optimizers and vectors."""
        if op.weight is None or len(op.weight) < 2 or n_weight <= 0:
            return 0.0
        if self.prec.muon_moment_bytes and layer.kind not in ("embedding", "head"):
            return -n_weight * self.prec.muon_moment_bytes
        moment = self.prec.factored_moment_bytes
        if not moment:
            return 0.0
        last, second = (tensor_bytes(op, (d,), restrict(split, (d,)), self.mesh, 1.0) for d in op.weight[-1:-3:-1])
        return (n_weight / last + n_weight / second - n_weight) * moment

    def _weight_elem_bytes(self, layer: Layer, op: Op) -> float:
        """Bytes of one stored element of op's weight: the training dtype's, FP8 for an FP8 GEMM under
        fp8_params, NF4 for the part a QLoRA base keeps quantised (Op.nf4_fraction)."""
        elem = self.prec.weight_bytes(self.prec.fp8_params and low_precision_gemm(layer.kind, op))
        if op.nf4_fraction:
            elem = op.nf4_fraction * NF4_BYTES_PER_PARAM + (1.0 - op.nf4_fraction) * elem
        return elem

    def zero3_gather(self, layer: Layer, leaf: LeafConfig) -> tuple[float, tuple[str, ...]]:
        """Bytes per rank of a ZeRO-3 parameter all-gather for the layer (gathered size) and its axes."""
        tp = self.templates
        return tp.value(("gather", tp.layer_key(layer), tp.leaf_key(leaf)), lambda: self._zero3_gather(layer, leaf))

    def _zero3_gather(self, layer: Layer, leaf: LeafConfig) -> tuple[float, tuple[str, ...]]:
        total, axes = 0.0, ()
        for op in layer.ops:
            if op.weight is None:
                continue
            split = leaf.ops.get(op.name, {})
            wc = leaf.weights[op.name]
            elem = self._weight_elem_bytes(layer, op)
            full = tensor_bytes(op, op.weight, restrict(split, op.weight), self.mesh, elem)
            stored = tensor_bytes(op, op.weight, wc.weight, self.mesh, elem)
            if stored < full * 0.999:
                total += full
                axes = tuple(a for a in weight_grad_partial(op, split)
                             if a not in REPLICA_AXES and self.mesh.size(a) > 1)
        return total, axes

    def zero3_stored(self, layer: Layer, leaf: LeafConfig, tied_here: bool = False) -> tuple[float, float]:
        """Bytes per rank of the shards of the weights `zero3_gather` gathers: (all of them, those the layer's
        own offload load moves). They differ by a tied weight its tie target stores on this rank (`tied_here`:
        the LM head sharing the embedding's), which the layer does not store but still gathers."""
        tp = self.templates
        return tp.value(("stored", tp.layer_key(layer), tp.leaf_key(leaf), tied_here),
                        lambda: self._zero3_stored(layer, leaf, tied_here))

    def _zero3_stored(self, layer: Layer, leaf: LeafConfig, tied_here: bool) -> tuple[float, float]:
        total = own = 0.0
        for op in layer.ops:
            if op.weight is None:
                continue
            split = leaf.ops.get(op.name, {})
            elem = self._weight_elem_bytes(layer, op)
            full = tensor_bytes(op, op.weight, restrict(split, op.weight), self.mesh, elem)
            stored = tensor_bytes(op, op.weight, leaf.weights[op.name].weight, self.mesh, elem)
            if stored < full * 0.999:
                total += stored
                own += 0.0 if tied_here and op.name == layer.tied_op else stored
        return total, own


@dataclass
class LayerSync:
    """A layer's data-parallel terms as `lower` makes them: its gradient buckets and ZeRO-1/2 post-step parameter
    all-gathers (uncosted steps), the (parameters, gradients, optimizer-state parameters) a rank stores, and its
    ZeRO-3 parameter all-gather (gathered bytes per rank, axes; 0 bytes without one)."""

    grad_sync: list[Step]
    post_step: list[Step]
    states: tuple[float, float, float]
    gather_bytes: float
    gather_axes: tuple[str, ...]
    param_bytes_adjust: float = 0.0  # bytes beside states[0] x param_bytes: weights stored in FP8 or NF4
    optimizer_bytes_adjust: float = 0.0  # bytes beside states[2] x optimizer_bytes: factored moments


def layer_sync(tree: StrategyTree, precision: Precision, layer: Layer, leaf: LeafConfig, tied_here: bool,
               mesh: DeviceMesh | None = None) -> LayerSync:
    """`layer`'s data-parallel terms (see LayerSync) on `mesh` (default: the tree's). The leaf's configs name mesh
    axes, not sizes, so one tree serves every data-parallel degree: the analytic batch (optimize.analytic) prices
    these per degree without lowering a job again."""
    lw = _Lowerer(tree, precision)
    if mesh is not None:
        lw.mesh = mesh
    ch = ChunkProgram(0, 0, 0, [])
    lw.grad_sync(layer, leaf, ch, tied_here)
    size, axes = lw.zero3_gather(layer, leaf)
    return LayerSync(ch.grad_sync, ch.post_step, (ch.params_local, ch.grads_local, ch.optimizer_params_local),
                     size, axes, ch.param_bytes_adjust, ch.optimizer_bytes_adjust)


def _switch_gathered(gathers: dict[str, tuple[float, tuple[str, ...]]], stored: dict[str, tuple[float, float]],
                     sizes: dict[str, tuple[float, float]]) -> dict[str, tuple[float, float, tuple[str, ...]]]:
    """Layers whose ZeRO-3 all-gather the pool's switches do while loading (compile.offload.insert_offload):
    layer -> (parameter bytes loaded per GPU, bytes it holds once they are gathered, gather axes). The load
    moves the shards of every gathered weight (a tied one too, which the plain load leaves to its owner) and
    the layer's other states; the gathered weights replace their shards on the GPU. (The gradient buffer stays
    the stored shard's size, as without in-switch collectives: the whole gradient a backward makes before its
    reduce-scatter is not counted in either case.)"""
    out: dict[str, tuple[float, float, tuple[str, ...]]] = {}
    for name, (gathered, axes) in gathers.items():
        shards, own = stored[name]
        other = sizes[name][0] - own  # stored states that are not gathered (norm scales, biases)
        if gathered > 0 and shards > 0:
            out[name] = (other + shards, other + gathered, axes)
    return out


def _insert_zero3(steps: list[Step], layer_first: dict[str, int], gathers: dict[str, tuple[float, tuple[str, ...]]],
                  phase: str) -> list[Step]:
    """Put a ZeRO-3 parameter all-gather before each layer, prefetched while the previous layer runs."""
    if not any(size > 0 for size, _ in gathers.values()):
        return steps
    starts = {i: name for name, i in layer_first.items()}
    out: list[Step] = []
    new_index: list[int] = []  # step i's index in `out`
    prev_layer_start: int | None = None
    for i, s in enumerate(steps):
        name = starts.get(i)
        deps = s.deps
        if deps:
            deps = tuple([new_index[d] for d in deps])
        if name is not None and gathers.get(name, (0.0, ()))[0] > 0:
            size, axes = gathers[name]
            out.append(Step(f"{name}.params:all_gather", "collective", Stream.GRAD, "dp", name,
                            deps=(prev_layer_start,) if prev_layer_start is not None else (),
                            phase=phase, collective="all_gather", axes=axes, size_bytes=size, alloc_bytes=size))
            ag = len(out) - 1
            before = deps if deps is not None else ((new_index[i - 1],) if i > 0 else ())
            deps = (*before, ag)
        if name is not None:
            prev_layer_start = len(out)
        new_index.append(len(out))
        s.deps = deps
        out.append(s)
    last_of = {s.layer: j for j, s in enumerate(out)}
    for name, (size, _) in gathers.items():
        if size > 0 and name in last_of:
            out[last_of[name]].free_bytes += size  # gathered weights are dropped after their last use
    return out


def _scatter_over_tp(tensor: tuple[Layout, float], mesh: DeviceMesh) -> tuple[Layout, float]:
    """A pipeline hand-off of a tensor replicated over tp: Megatron's scatter-gather p2p (the default
    scatter_gather_tensors_in_pipeline) sends 1/tp of it from each tp rank and all-gathers it over tp
    on the receiving stage. As a layout: split over tp on its last dimension, 1/tp of the bytes; the
    receiver's resharding then inserts that all-gather. A tensor already split (sequence parallelism)
    or a partial sum goes as it is."""
    layout, size = tensor
    tp = mesh.size("tp")
    used = {a for axes in layout.split.values() for a in axes}
    if tp <= 1 or "tp" in used or "tp" in layout.partial or not layout.dims:
        return tensor
    last = layout.dims[-1]
    split = {**layout.split, last: (*layout.split.get(last, ()), "tp")}
    return Layout(layout.dims, split, layout.partial), size / tp


Entry = tuple[StrategyNode, str]
"""A layer of a chunk as lowering reads it: its strategy-tree leaf node (layer and leaf configs) and recompute."""

Gather = tuple[float, float, tuple[str, ...]]
"""An in-switch gathered layer's (parameter bytes loaded, bytes held once gathered, gather axes)."""

_FORWARD_LISTS = ("fwd", "grad_sync", "post_step")
_FORWARD_FIELDS = ("params_local", "grads_local", "optimizer_params_local", "param_bytes_adjust",
                   "optimizer_bytes_adjust", "embedding_grad_bytes",
                   "send_fwd_bytes", "offload")


@dataclass
class _ChunkForward:
    """What lowering a chunk's forward hands on besides the ChunkProgram it fills: per layer, in the chunk's
    order, its input (what its backward keeps or recomputes from), its offloaded (parameter, gradient) bytes
    per rank and its in-switch gather (None: none); then the chunk's output and what it sends the next chunk."""

    inputs: list[Tensor | None]
    offload_sizes: list[tuple[float, float]]
    switch: list[Gather | None]
    out: Tensor | None
    sent: Tensor | None
    activations: list[float] = field(default_factory=list)  # per layer: its offloaded checkpointed input (bytes)


@dataclass
class _ChunkTemplate:
    """A chunk's forward or backward as lowered, for the chunks equal to it but for their layers' names and op
    objects (the stages of a pipeline of identical blocks): the chunk it was lowered into and what it returned.
    Its steps are read from that chunk when a second chunk first needs them (made into a `_StepsTemplate`, or
    found not copyable), which is as they were made: lowering edits a chunk's steps only during its own pass
    (its last chunk's forward, which no other chunk repeats, gets the loss after its pass)."""

    ch: ChunkProgram
    layers: list[Layer]
    forward: bool  # the forward (step lists, stored states, what it sends) or the backward
    sizes: dict[str, int]  # ChunkProgram step list -> its length after the pass
    result: object
    steps: dict[str, _StepsTemplate | None] | None = None  # made on first use

    def copy_to(self, ch: ChunkProgram, layers: list[Layer]) -> bool:
        """Set what the pass set on its chunk on `ch` (not lowered yet) for `layers`; False: not copyable."""
        if self.steps is None:
            self.steps = {f: _StepsTemplate.of(getattr(self.ch, f)[:n], self.layers) for f, n in self.sizes.items()}
        if any(t is None for t in self.steps.values()):
            return False
        for f, t in self.steps.items():
            assert t is not None
            if not ch.defer(f, t, layers):  # made when first read (ChunkProgram.defer)
                t.copy_to(layers, getattr(ch, f))
        src = self.ch
        if self.forward:
            for f in _FORWARD_FIELDS:
                setattr(ch, f, getattr(src, f))
            ch.layers = [layer.name for layer in layers]
            ch.layer_states = {layer.name: src.layer_states[like.name] for layer, like in zip(layers, self.layers,
                                                                                               strict=True)}
        else:
            ch.send_bwd_bytes = src.send_bwd_bytes
        return True


def _templated(templates: dict[tuple, _ChunkTemplate], key: tuple | None, ch: ChunkProgram,
               entries: list[Entry], forward: bool, build: Callable[[], R],
               copies: dict[tuple[int, str], int]) -> R:
    """Run `build` (which lowers chunk `ch`'s forward or backward) once per key; a later chunk with the key gets
    a copy, recorded in `copies` (key None: always build; a key whose steps are not copyable: built again,
    recorded as -1)."""
    if key is None:
        return build()
    layers = [node.layer for node, _ in entries]
    t = templates.get(key)
    if t is not None:
        copied = t.copy_to(ch, layers)
        copies[(ch.chunk, "fwd" if forward else "bwd")] = t.ch.chunk if copied else -1
        if copied:
            return t.result  # type: ignore[return-value]
    result = build()
    if t is None:
        sizes = {f: len(getattr(ch, f)) for f in (_FORWARD_LISTS if forward else ("bwd",))}
        templates[key] = _ChunkTemplate(ch, layers, forward, sizes, result)
    return result


def lower(tree: StrategyTree, precision: Precision, *, cache: bool = True) -> Program:
    """Compile model x strategy into per-chunk templates and per-iteration steps; `cache`: lower each distinct
    layer once and copy it to the layers that repeat it, and each distinct chunk once and copy it to the chunks
    that repeat it (off: lower every layer anew; the same program)."""
    lw = _Lowerer(tree, precision, cache)
    mesh = tree.mesh
    sched = tree.schedule
    n_chunks = mesh.pp * sched.virtual_stages
    chunks = [ChunkProgram(c, *chunk_place(c, mesh.pp, sched.kind), []) for c in range(n_chunks)]
    leaves = tree.leaves()
    by_chunk: dict[int, list[Entry]] = {c: [] for c in range(n_chunks)}
    for node, rc, c in leaves:
        by_chunk[c].append((node, rc))
    rank_of = {node.layer.name: chunks[c].pp_rank for node, _, c in leaves}
    tree.resolve()
    # a chunk's forward and backward are lowered once per key and copied to the chunks with that key: its
    # layers (values, configs, recompute, tied weight on this rank), what it receives, whether it sends
    templates: dict[tuple, _ChunkTemplate] = {}
    copies: dict[tuple[int, str], int] = {}
    keys: list[tuple | None] = []
    forwards: list[_ChunkForward] = []
    prev: Tensor | None = None
    received: Tensor | None = None  # what the previous chunk sent (scattered over tp)
    for c in range(n_chunks):
        ch, entries = chunks[c], by_chunk[c]
        # the layer's tied weight is stored by its tie target on this rank
        tied = [node.layer.tied_to is not None and rank_of.get(node.layer.tied_to) == rank_of[node.layer.name]
                for node, _ in entries]
        # a pipeline send to the next chunk; none where it runs on the same rank (the bottom of DualPipeV's V hands
        # its output over whole, with no scatter over tp to gather again)
        sends = c < n_chunks - 1 and chunks[c + 1].pp_rank != ch.pp_rank
        key = (lw.chunk_key(entries, tied), _tensor_key(prev), _tensor_key(received), sends) if cache else None
        keys.append(key)
        fwd = _templated(templates, key and ("fwd", *key), ch, entries, True,
                         partial(lw.forward_chunk, ch, entries, tied, prev, received, sends), copies)
        forwards.append(fwd)
        prev, received = fwd.out, fwd.sent
    # the loss must end replicated (vocab-parallel cross-entropy all-reduces its statistics)
    last = chunks[-1]
    if prev is not None:
        lw._collectives(last.fwd, prev[0], prev[0].dims, dict(prev[0].split), prev[1], last.layers[-1], "fwd",
                        "loss.out")
    grad: Tensor | None = None
    for c in range(n_chunks - 1, -1, -1):
        ch, entries, key = chunks[c], by_chunk[c], keys[c]
        sends = c > 0 and chunks[c - 1].pp_rank != ch.pp_rank
        grad = _templated(templates, key and ("bwd", *key, _tensor_key(grad), sends), ch, entries, False,
                          partial(lw.backward_chunk, ch, entries, forwards[c], grad, sends), copies)
    replicas = mesh.world_size // mesh.pp  # ranks per pipeline stage
    model_flops, hw_flops = _program_flops(chunks, copies, sched.n_micro_batch)
    return Program(tree, precision, chunks, model_flops * replicas, hw_flops * replicas, op_values=lw.templates.ops,
                   copies=ChunkCopies({k: c for k, c in copies.items() if c >= 0},
                                      cache and all(c >= 0 for c in copies.values()),
                                      tuple(ch.revision for ch in chunks)))


def _program_flops(chunks: list[ChunkProgram], copies: dict[tuple[int, str], int], m: int) -> tuple[float, float]:
    """(model, hardware) FLOPs of one pipeline's iteration: each chunk's forward and backward summed in step order
    (`_flops`), then the chunks in order. A phase lowering copied (`copies`, chunk -> its original, -1: built
    anew) has its original's steps' values, so it takes its original's sums: the same floats, without the
    steps being read again (lowering without caches sums every phase, to the same floats)."""
    sums: dict[tuple[int, str], tuple[float, float]] = {}  # (chunk built anew, phase) -> its sums
    model = hw = 0.0
    for ch in chunks:
        for phase in ("fwd", "bwd"):
            src = copies.get((ch.chunk, phase), -1)  # an original is never itself a copy
            key = (src if src >= 0 else ch.chunk, phase)
            got = sums.get(key)
            if got is None:
                steps = chunks[key[0]].fwd if phase == "fwd" else chunks[key[0]].bwd
                got = sums[key] = (_flops(steps, "model_flops", m), _flops(steps, "hw_flops", m))
            model += got[0]
            hw += got[1]
    return model, hw


def _flops(steps: list[Step], field: str, m: int) -> float:
    """Sum of every step's `field` x `m`, added one step at a time in order from 0.0 (so always the same float),
    as `total += s.field * m` would: numpy's add.accumulate adds in order, one element at a time."""
    if not steps:
        return 0.0
    values = np.fromiter(map(attrgetter(field), steps), float, len(steps)) * float(m)
    return float(np.add.accumulate(values)[-1])
