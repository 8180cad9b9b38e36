"""Proteus-style strategy tree (Proteus sections IV and VII) and its primitives.

The tree mirrors the model's module tree. Leaf nodes (layers) hold computation configs (which
mesh axes split which dimension of each op) and memory configs (how each weight, its gradient,
its optimizer state and each saved activation is partitioned). Non-leaf nodes hold schedule
configs (micro-batching, pipeline schedule) and recompute, inherited top-down unless overridden.

Users write strategies with a few primitives on any node, reached by attribute access that
mirrors the model (`S.layers[3].qkv.split("q", "tp")`): `split` (an op dimension over mesh
axes; on a non-leaf node it applies to every op below that has the dimension; `select` picks ops
by name across the subtree), `map` (the
pipeline chunk of a subtree), `shard` (ZeRO: partition weights / gradients / optimizer states
over the data axes), `store` (the storage layout of a saved activation), `schedule` and
`recompute`. `resolve` fills the rest by dataflow propagation: an op dimension nobody set takes
its producer's layout, a weight follows its op's split, so only the critical nodes need
settings. Presets (strategy.presets) fill this tree too; the compiler only ever reads the tree.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..errors import ConfigError
from ..workload.ir import CONTRACTION_KINDS, Layer, Model, Module, Op, OpKind
from .mesh import AXIS_ORDER, REPLICA_AXES, DeviceMesh

CUDA_GRAPH_MODULES = ("attn", "mlp", "moe_router", "moe_preprocess", "moe", "mamba")
"""What a scoped CUDA graph may capture (Megatron-Core --cuda-graph-scope with Transformer Engine's graphs; the ops'
Op.module): attention sublayers, dense MLPs, a MoE sublayer up to its router, the dispatcher's preprocessing, the
whole MoE sublayer (drop-and-pad routing only: dropless shapes change every step), Mamba mixers."""
FULL_ITERATION = "full_iteration"


def cuda_graph_scope(value: object, where: str = "strategy.cuda_graphs") -> tuple[str, ...]:
    """strategy.cuda_graphs as a tuple: () for none, (FULL_ITERATION,) or the captured modules (a list, or one
    comma-separated string); unknown names and a moe_preprocess without moe_router (Megatron refuses it) are
    one-line errors."""
    if value is None or value in ("none", "") or value in ((), []):
        return ()
    items = [v.strip() for v in value.split(",")] if isinstance(value, str) else list(value) \
        if isinstance(value, (list, tuple)) else None
    if items is None or not all(isinstance(v, str) and v for v in items):
        raise ConfigError(where, f"bad value {value!r}", f"use none, {FULL_ITERATION} or modules from "
                          f"{', '.join(CUDA_GRAPH_MODULES)}")
    if FULL_ITERATION in items:
        if len(items) > 1:
            raise ConfigError(where, f"{FULL_ITERATION} captures every module already", f"give {FULL_ITERATION} alone")
        return (FULL_ITERATION,)
    unknown = [v for v in items if v not in CUDA_GRAPH_MODULES]
    if unknown:
        raise ConfigError(where, f"unknown module '{unknown[0]}'", f"use {', '.join(CUDA_GRAPH_MODULES)}, or "
                          f"{FULL_ITERATION}")
    if "moe_preprocess" in items and "moe_router" not in items:
        raise ConfigError(where, "moe_preprocess is captured with moe_router only (as Megatron-Core requires)",
                          "add moe_router")
    return tuple(dict.fromkeys(items))

Split = dict[str, tuple[str, ...]]  # dimension name -> mesh axes that split it (outermost last)

RECOMPUTE_MODES = ("none", "selective", "full")
RECOMPUTE_MODULES = ("core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "shared_experts", "moe")
"""The parts of a block selective recompute may re-run (Megatron-Core's --recompute-modules; compile.recompute
says what each drops and re-runs). 'selective' alone is core_attn; 'selective:moe_act+layernorm' names them."""


def selective_mode(modules: Iterable[str] | None) -> str:
    """The recompute mode of selective recompute of `modules` ('selective' for the attention core alone)."""
    chosen = sorted(set(modules or ()))
    return "selective" if not chosen or chosen == ["core_attn"] else "selective:" + "+".join(chosen)


def recompute_modules(mode: str) -> frozenset[str] | None:
    """The modules a selective recompute mode re-runs (None: 'none' or 'full'); raises ValueError on a mode that
    is none of RECOMPUTE_MODES or 'selective:' with known module names."""
    if mode in ("none", "full"):
        return None
    if mode == "selective":
        return frozenset({"core_attn"})
    head, _, rest = mode.partition(":")
    chosen = frozenset(rest.split("+")) if rest else frozenset()
    if head != "selective" or not chosen or not chosen <= set(RECOMPUTE_MODULES):
        raise ValueError(mode)
    return chosen


def valid_recompute_mode(mode: str) -> bool:
    try:
        recompute_modules(mode)
    except ValueError:
        return False
    return True
SCHEDULES = ("gpipe", "1f1b", "interleaved", "dynamic", "zb-h1", "dualpipev")
STATE_ITEMS = ("weight", "grad", "optimizer")
PARTIAL_KINDS = CONTRACTION_KINDS | {OpKind.EMBEDDING, OpKind.LOSS}


@dataclass
class ScheduleConfig:
    """Subgraph-level schedule: how many micro-batches and in which order (pipeline)."""

    n_micro_batch: int = 1
    # gpipe | 1f1b | interleaved | dynamic (Proteus' HTAE scheduler at run time) | zb-h1 (zero bubble:
    # backward split into input- and weight-gradient halves, the latter postponed into the bubble) |
    # dualpipev (DeepSeek's DualPipeV: two chunks per rank in a V, zero-bubble backwards; schedules.dualpipev)
    kind: str = "1f1b"
    virtual_stages: int = 1  # model chunks per pipeline rank (interleaved 1F1B; 2 under dualpipev)
    # micro-batches in flight per rank: 1f1b: a cap below pp - rank; dynamic: the cap (None: all)
    max_ongoing_micro_batch: int | None = None


T = TypeVar("T")

@dataclass
class WeightConfig:
    """Memory configs of one op's parameter items (ZeRO = partitioning these over data axes)."""

    weight: Split = field(default_factory=dict)
    grad: Split = field(default_factory=dict)
    optimizer: Split = field(default_factory=dict)


@dataclass
class StateConfig:
    """Mesh axes over which an op's dimensionless parameters (norm scales, biases of unweighted ops)
    are partitioned, per item."""

    weight: tuple[str, ...] = ()
    grad: tuple[str, ...] = ()
    optimizer: tuple[str, ...] = ()


@dataclass
class LeafConfig:
    """Per-op computation configs and per-tensor memory configs of one layer.

    `explicit` records the dimensions a user (or preset) decided per op; `resolve` only fills the
    others. `memory` holds per-item storage overrides; `weights` / `extras` are the resolved
    memory configs the compiler reads."""

    ops: dict[str, Split] = field(default_factory=dict)
    weights: dict[str, WeightConfig] = field(default_factory=dict)
    extras: dict[str, StateConfig] = field(default_factory=dict)
    saved: dict[tuple[str, str], Split] = field(default_factory=dict)  # (op, tensor) -> storage split
    explicit: dict[str, set[str]] = field(default_factory=dict)
    memory: dict[tuple[str, str], Split] = field(default_factory=dict)  # (op, item) -> storage override
    propagated: dict[str, set[str]] = field(default_factory=dict)  # dims `resolve` inferred, redone each time
    derived: set[str] = field(default_factory=set)  # ops whose weights / extras `resolve` derived
    # several nodes hold this object (a preset's identical layers): never edited in place; a node that edits
    # its configs takes its own copy first (StrategyNode.own_leaf: copy on write)
    shared: bool = field(default=False, compare=False, repr=False)

    def copy(self) -> LeafConfig:
        """An independent, unshared copy: every dict, set and config object fresh (primitives edit them in
        place), the axis tuples shared (immutable)."""
        new = object.__new__(LeafConfig)  # the fields set directly: cheaper than the constructor
        new.__dict__.update(
            ops={o: s.copy() for o, s in self.ops.items()},
            weights={o: _fresh(w, weight=w.weight.copy(), grad=w.grad.copy(), optimizer=w.optimizer.copy())
                     for o, w in self.weights.items()},
            extras={o: _fresh(c, **c.__dict__) for o, c in self.extras.items()},
            saved={k: s.copy() for k, s in self.saved.items()},
            explicit={o: d.copy() for o, d in self.explicit.items()},
            memory={k: s.copy() for k, s in self.memory.items()},
            propagated={o: d.copy() for o, d in self.propagated.items()},
            derived=self.derived.copy(), shared=False)
        return new


def _fresh(like: T, **fields: object) -> T:
    """A new instance of plain dataclass `like`'s class with exactly `fields` (all of them) set, without the
    constructor's keyword handling (LeafConfig.copy makes a few per op of the layer it copies)."""
    new = object.__new__(type(like))
    new.__dict__.update(fields)
    return new


def _axes_product(mesh: DeviceMesh, axes: Iterable[str]) -> int:
    return math.prod(mesh.size(a) for a in axes)


def sharded_weight_config(op: Op, split: Split, items: Iterable[str],
                          overrides: dict[str, Split] | None = None) -> WeightConfig:
    """A weight's memory configs: its op's split on its own dims, plus, for every item in `items`
    (ZeRO), the data axes that partial-sum its gradient, on its first dim."""
    assert op.weight is not None
    base = {d: split[d] for d in op.weight if d in split}
    data = tuple(a for d, axes in split.items() if d not in op.weight for a in axes if a not in REPLICA_AXES)
    first = op.weight[0]
    sharded = {**base, first: base.get(first, ()) + data} if data else dict(base)
    chosen = set(items)
    ov = overrides or {}
    return WeightConfig(**{it: {**(sharded if it in chosen else dict(base)), **ov.get(it, {})} for it in STATE_ITEMS})


def state_config(split: Split, items: Iterable[str]) -> StateConfig:
    """Norm scales and other dimensionless parameters: replicated over tp, partitioned over the data
    axes of the op's split for every item in `items` (ZeRO)."""
    axes = tuple(a for a in AXIS_ORDER if a != "tp" and a not in REPLICA_AXES
                 and any(a in ax for ax in split.values()))
    chosen = set(items)
    return StateConfig(**{it: (axes if it in chosen else ()) for it in STATE_ITEMS})


@dataclass
class StrategyNode:
    """A node of the strategy tree; `layer` is set on leaves."""

    name: str
    children: list[StrategyNode] = field(default_factory=list)
    layer: Layer | None = None
    leaf: LeafConfig = field(default_factory=LeafConfig)
    schedule_config: ScheduleConfig | None = None
    recompute_mode: str | None = None  # None: inherit from the parent
    chunk: int | None = None  # pipeline model chunk (virtual stage) index; None: inherit
    shard_items: frozenset[str] | None = None  # ZeRO: state items partitioned over the data axes; None: inherit
    tree: StrategyTree | None = field(default=None, repr=False, compare=False)

    # -- navigation: attribute access mirrors the model --------------------------------------------
    def __getattr__(self, key: str) -> Any:
        if key.startswith("__"):
            raise AttributeError(key)
        d = self.__dict__
        for c in d.get("children", []):
            if c.name == key or c.name.rsplit(".", 1)[-1] == key:
                return c
        layer = d.get("layer")
        if layer is not None:
            found = _op_path(self, layer, key)
            if found is not None:
                return found
        raise AttributeError(f"strategy node '{d.get('name', '?')}' has no child or op '{key}'")

    def __getitem__(self, i: int) -> StrategyNode:
        return self.children[i]

    def __len__(self) -> int:
        return len(self.children)

    def __iter__(self) -> Iterator[StrategyNode]:
        return iter(self.children)

    def own_leaf(self) -> LeafConfig:
        """This node's configs, to edit: its own copy first when it shares them with other nodes (a preset
        gives identical layers one LeafConfig; every edit goes through here, so an edit stays on its node)."""
        if self.leaf.shared:
            self.leaf = self.leaf.copy()
        return self.leaf

    def walk(self) -> Iterator[StrategyNode]:
        yield self
        for c in self.children:
            yield from c.walk()

    def ops(self) -> Iterator[tuple[StrategyNode, Op]]:
        """Every (leaf, op) below this node, in model order."""
        for n in self.walk():
            if n.layer is not None:
                for op in n.layer.ops:
                    yield n, op

    def op(self, name: str) -> OpNode:
        """The op `name` of this layer (for names that clash with a method)."""
        if self.layer is None:
            raise ConfigError(f"strategy.{self.name}", "only a layer (leaf) has ops", "pick a layer below it")
        for op in self.layer.ops:
            if op.name == name:
                return OpNode(self, op)
        raise ConfigError(f"strategy.{self.name}", f"no op '{name}'",
                          f"its ops are {', '.join(o.name for o in self.layer.ops)}")

    def select(self, *op_names: str) -> OpSet:
        """Every op below this node with one of these names (e.g. every block's 'ln1'), to set together;
        names no op has are skipped (one recipe fits GPT and Llama), but at least one must match."""
        found = [OpNode(n, op) for n, op in self.ops() if op.name in op_names]
        if not found:
            have = sorted({op.name for _, op in self.ops()})
            raise ConfigError(f"strategy.{self.name}", f"no op named {', '.join(op_names)} below it",
                              f"op names are {', '.join(have)}")
        return OpSet(found)

    def _mesh(self) -> DeviceMesh:
        if self.tree is None:
            raise ConfigError(f"strategy.{self.name}", "node is not part of a strategy tree",
                              "build it with StrategyTree.from_model")
        return self.tree.mesh

    # -- primitives ---------------------------------------------------------------------------------
    def split(self, dims: str | Sequence[str], *axes: str, pad: bool = False) -> StrategyNode:
        """Split dimension(s) `dims` of every op below this node that has them over mesh `axes`
        (innermost first); no axes: replicate. `pad`: allow a size the axes do not divide (padded,
        as Megatron pads the vocabulary)."""
        names = (dims,) if isinstance(dims, str) else tuple(dims)
        targets = [(leaf, op, d) for leaf, op in self.ops() for d in names if d in op.dims]
        if targets:
            _set_splits(targets, tuple(axes), pad)
        else:
            have = sorted({d for _, op in self.ops() for d in op.dims})
            raise ConfigError(f"strategy.{self.name}", f"no op below it has dimension(s) {', '.join(names)}",
                              f"use one of {', '.join(have)}")
        return self

    def map(self, chunk: int) -> StrategyNode:
        """Place this subtree on pipeline chunk `chunk` (chunk c runs on pipeline rank c % pp)."""
        if not isinstance(chunk, int) or chunk < 0:
            raise ConfigError(f"strategy.{self.name}", f"pipeline chunk must be an integer >= 0, got {chunk!r}",
                              "use 0 .. pp x virtual stages - 1")
        self.chunk = chunk
        return self

    def shard(self, *items: str) -> StrategyNode:
        """ZeRO as tensor partitioning: partition the given state items ('weight', 'grad',
        'optimizer') of every op below over the data axes that reduce their gradients; no items:
        none (undo an inherited setting). ZeRO-1 = shard('optimizer'), ZeRO-3 = all three."""
        bad = [i for i in items if i not in STATE_ITEMS]
        if bad:
            raise ConfigError(f"strategy.{self.name}", f"unknown state item(s) {', '.join(bad)}",
                              f"use {', '.join(STATE_ITEMS)}")
        self.shard_items = frozenset(items)
        return self

    def recompute(self, mode: str = "full") -> StrategyNode:
        """Recompute this subtree's activations in the backward pass: 'full', 'selective' or 'none'."""
        if not valid_recompute_mode(mode):
            raise ConfigError(f"strategy.{self.name}", f"unknown recompute mode '{mode}'",
                              f"use one of {', '.join(RECOMPUTE_MODES)}, or selective:<modules> joined by + "
                              f"(modules: {', '.join(RECOMPUTE_MODULES)})")
        self.recompute_mode = mode
        return self

    def schedule(self, n_micro_batch: int, max_ongoing_micro_batch: int | None = None,
                 kind: str | None = None, virtual_stages: int = 1) -> StrategyNode:
        """Micro-batching and pipeline order. `max_ongoing_micro_batch`: micro-batches a stage may hold
        in flight: n_micro_batch (more than the stages) is GPipe, the number of pipeline stages is 1F1B
        (the default), fewer is a memory-bounded 1F1B (shorter warm-up, less activation memory).
        kind='dynamic' is Proteus' HTAE scheduler: each rank picks forward or backward at run time
        (backward first, else the next forward while under the cap), played out on the stage costs.
        kind='zb-h1' is the zero-bubble ZB-H1 schedule (Qi et al. 2024): 1F1B's memory, the weight-gradient
        half of each backward postponed to fill the bubble (strategy.schedules.zb_h1). kind='dualpipev' is
        DeepSeek's DualPipeV with virtual_stages=2: chunk pp + i on rank pp - 1 - i (strategy.schedules)."""
        tree = self.tree
        if tree is None or self is not tree.root:
            raise ConfigError(f"strategy.{self.name}", "a schedule is set on the root (one pipeline schedule "
                              "per job)", "call schedule() on the tree's root")
        if n_micro_batch < 1:
            raise ConfigError(f"strategy.{self.name}", f"n_micro_batch must be >= 1, got {n_micro_batch}",
                              "use a positive integer")
        pp = tree.mesh.pp
        k = max_ongoing_micro_batch
        if k is not None and k < 1:
            raise ConfigError(f"strategy.{self.name}", f"max_ongoing_micro_batch must be >= 1, got {k}",
                              f"use 1 .. {n_micro_batch}")
        if kind is None:
            if k is not None and k >= n_micro_batch > pp:
                kind = "gpipe"  # every micro-batch in flight
            else:
                kind = "interleaved" if virtual_stages > 1 else "1f1b"
        if kind == "dynamic":
            if virtual_stages != 1:
                raise ConfigError(f"strategy.{self.name}", "the dynamic (HTAE) scheduler runs one chunk per rank",
                                  "use virtual_stages 1, or the interleaved schedule")
            self.schedule_config = ScheduleConfig(n_micro_batch, kind, 1, k)
            tree.schedule_set = True
            return self
        cap = k if k is not None and k < min(pp, n_micro_batch) else None  # memory-bounded 1F1B
        if cap is not None and kind != "1f1b":
            raise ConfigError(f"strategy.{self.name}", f"max_ongoing_micro_batch={cap} below the {pp} stages needs "
                              f"the 1f1b schedule, not {kind}", "drop kind or the cap")
        if kind not in SCHEDULES:
            raise ConfigError(f"strategy.{self.name}", f"unknown pipeline schedule '{kind}'",
                              f"use one of {', '.join(SCHEDULES)}")
        if kind == "dualpipev":
            if virtual_stages != 2:
                raise ConfigError(f"strategy.{self.name}", f"dualpipev runs two chunks per rank (a V), not "
                                  f"{virtual_stages} virtual stages", "use virtual_stages 2 with dualpipev")
        elif virtual_stages < 1 or (kind == "interleaved") != (virtual_stages > 1):
            raise ConfigError(f"strategy.{self.name}", f"schedule '{kind}' with {virtual_stages} virtual stages",
                              "interleaved needs virtual_stages > 1, dualpipev 2, the others 1")
        self.schedule_config = ScheduleConfig(n_micro_batch, kind, virtual_stages, cap)
        tree.schedule_set = True
        return self


@dataclass
class OpNode:
    """One op of a layer, for op-level primitives: `S.layers[0].qkv.split("q", "tp")`."""

    node: StrategyNode
    op: Op

    @property
    def name(self) -> str:
        return f"{self.node.name}.{self.op.name}"

    def split(self, dims: str | Sequence[str], *axes: str, pad: bool = False) -> OpNode:
        names = (dims,) if isinstance(dims, str) else tuple(dims)
        for d in names:
            if d not in self.op.dims:
                raise ConfigError(f"strategy.{self.name}", f"op has no dimension '{d}'",
                                  f"its dimensions are {', '.join(self.op.dims)}")
        _set_splits([(self.node, self.op, d) for d in names], tuple(axes), pad)
        return self

    def store(self, tensor: str, dim: str, *axes: str) -> OpNode:
        """Keep saved activation `tensor` partitioned on `dim` over `axes` between forward and backward
        (sequence parallelism stores the LayerNorm outputs split over tp); gathered back for backward."""
        saved = {t.name: t for t in self.op.saved}
        if tensor not in saved:
            raise ConfigError(f"strategy.{self.name}", f"op saves no tensor '{tensor}'",
                              f"it saves {', '.join(saved) or 'nothing'}")
        if dim not in saved[tensor].dims:
            raise ConfigError(f"strategy.{self.name}.{tensor}", f"saved tensor has no dimension '{dim}'",
                              f"its dimensions are {', '.join(saved[tensor].dims)}")
        _check_axes(self.node, self.op, dim, tuple(axes), pad=False)
        self.node.own_leaf().saved.setdefault((self.op.name, tensor), {})[dim] = tuple(axes)
        return self

    def __getattr__(self, item: str) -> ItemNode:
        if item in STATE_ITEMS:
            if self.op.weight is None:
                raise ConfigError(f"strategy.{self.name}", "op has no weight matrix", "pick a weighted op")
            return ItemNode(self, item)
        raise AttributeError(item)


def _op_path(node: StrategyNode, layer: Layer, path: str) -> OpNode | OpGroup | None:
    """The op named `path` in the layer, or the ops under the module path `path` (traced models name
    ops by their module path inside the layer: 'attn.qkv')."""
    for op in layer.ops:
        if op.name == path:
            return OpNode(node, op)
    members = [OpNode(node, op) for op in layer.ops if op.name.startswith(path + ".")]
    return OpGroup(node, path, members) if members else None


@dataclass
class OpSet:
    """Several ops set together (`S.root.select("ln1", "ln2").split("s", "tp")`)."""

    members: list[OpNode]

    def split(self, dims: str | Sequence[str], *axes: str, pad: bool = False) -> OpSet:
        names = (dims,) if isinstance(dims, str) else tuple(dims)
        for m in self.members:
            missing = [d for d in names if d not in m.op.dims]
            if missing:
                raise ConfigError(f"strategy.{m.name}", f"op has no dimension '{missing[0]}'",
                                  f"its dimensions are {', '.join(m.op.dims)}")
        _set_splits([(m.node, m.op, d) for m in self.members for d in names], tuple(axes), pad)
        return self

    def store(self, tensor: str, dim: str, *axes: str) -> OpSet:
        for m in self.members:
            m.store(tensor, dim, *axes)
        return self

    def __iter__(self) -> Iterator[OpNode]:
        return iter(self.members)


@dataclass
class OpGroup(OpSet):
    """The ops of one submodule inside a layer (`S.blocks[3].mlp`), reached by attribute like the model's
    code; `split` applies to every member op that has the dimension."""

    node: StrategyNode
    path: str

    def __init__(self, node: StrategyNode, path: str, members: list[OpNode]) -> None:
        super().__init__(members)
        self.node, self.path = node, path

    def split(self, dims: str | Sequence[str], *axes: str, pad: bool = False) -> OpGroup:
        names = (dims,) if isinstance(dims, str) else tuple(dims)
        hit = [m for m in self.members if any(d in m.op.dims for d in names)]
        if not hit:
            raise ConfigError(f"strategy.{self.node.name}.{self.path}", f"no op below it has dimension(s) "
                              f"{', '.join(names)}", f"use one of {', '.join(sorted({d for m in self.members for d in m.op.dims}))}")
        _set_splits([(m.node, m.op, d) for m in hit for d in names if d in m.op.dims], tuple(axes), pad)
        return self

    def __getattr__(self, key: str) -> OpNode | OpGroup:
        if key.startswith("__"):
            raise AttributeError(key)
        layer = self.node.layer
        assert layer is not None
        found = _op_path(self.node, layer, f"{self.path}.{key}")
        if found is None:
            raise AttributeError(f"'{self.node.name}.{self.path}' has no op or submodule '{key}'")
        return found


@dataclass
class ItemNode:
    """A parameter item (weight, grad, optimizer state) of one op, for explicit memory configs."""

    opnode: OpNode
    item: str

    def split(self, dim: str, *axes: str) -> ItemNode:
        op = self.opnode.op
        assert op.weight is not None
        if dim not in op.weight:
            raise ConfigError(f"strategy.{self.opnode.name}.{self.item}", f"weight has no dimension '{dim}'",
                              f"its dimensions are {', '.join(op.weight)}")
        _check_axes(self.opnode.node, op, dim, tuple(axes), pad=False)
        self.opnode.node.own_leaf().memory.setdefault((op.name, self.item), {})[dim] = tuple(axes)
        return self


def _check_axes(node: StrategyNode, op: Op, dim: str, axes: tuple[str, ...], pad: bool) -> None:
    mesh = node._mesh()
    where = f"strategy.{node.name}.{op.name}"
    unknown = [a for a in axes if a not in AXIS_ORDER]
    if unknown:
        raise ConfigError(where, f"unknown mesh axis '{unknown[0]}'", f"use mesh axes {', '.join(AXIS_ORDER)}")
    if len(set(axes)) != len(axes):
        raise ConfigError(where, f"dimension '{dim}' names a mesh axis twice ({', '.join(axes)})", "name each once")
    n, k = op.dims[dim], _axes_product(mesh, axes)
    if not pad and n % k:
        raise ConfigError(where, f"dimension '{dim}' of size {n} is not divisible by {' x '.join(axes)} = {k}",
                          "choose axes whose sizes divide it, or split(..., pad=True) to pad it "
                          "(as Megatron pads the vocabulary)")


def _iteration_dims(op: Op) -> tuple[str, ...]:
    """The op's independent loop dimensions (its FLOP space); others are views of them (an attention
    op's q / o / kv widths are heads x head size), so they may share a mesh axis with them."""
    if op.flop_dims is not None:
        return op.flop_dims
    return tuple(op.dims) if op.kind in CONTRACTION_KINDS else op.output


def _set_splits(targets: Sequence[tuple[StrategyNode, Op, str]], axes: tuple[str, ...], pad: bool) -> None:
    """Set every (leaf, op, dim) split, all or none: on an error the touched configs are restored."""
    def copy(d: dict[str, Any], name: str) -> Any:
        return None if name not in d else type(d[name])(d[name])

    saved = {(id(n), op.name): (n, op.name, copy(n.own_leaf().ops, op.name), copy(n.leaf.explicit, op.name))
             for n, op, _ in targets}
    try:
        for n, op, d in targets:
            _set_split(n, op, d, axes, pad)
    except ConfigError:
        for n, name, split, explicit in saved.values():
            for store, old in ((n.leaf.ops, split), (n.leaf.explicit, explicit)):
                if old is None:
                    store.pop(name, None)
                else:
                    store[name] = old
        raise


def _set_split(node: StrategyNode, op: Op, dim: str, axes: tuple[str, ...], pad: bool) -> None:
    _check_axes(node, op, dim, axes, pad)
    leaf = node.own_leaf()
    split = leaf.ops.setdefault(op.name, {})
    loops = _iteration_dims(op)
    clash = ([a for d, ax in split.items() if d != dim and d in loops for a in ax if a in axes]
             if dim in loops else [])
    if clash:
        other = next(d for d, ax in split.items() if d != dim and d in loops and clash[0] in ax)
        raise ConfigError(f"strategy.{node.name}.{op.name}", f"mesh axis '{clash[0]}' already splits dimension "
                          f"'{other}'", f"split '{other}' over other axes first, or pick another axis for '{dim}'")
    if axes:
        split[dim] = axes
    else:
        split.pop(dim, None)
    leaf.explicit.setdefault(op.name, set()).add(dim)


EP_DISPATCHERS = ("alltoall", "deepep", "hybridep")
"""strategy.ep_dispatcher's values: NCCL's all-to-all, DeepEP, HybridEP (cost.annotate prices them)."""
TWO_HOP_DISPATCHERS = ("deepep", "hybridep")
"""The dispatchers that send a token once per GPU (and node) it reaches, forwarded over NVLink."""


@dataclass
class StrategyTree:
    """The whole parallelization strategy of one job."""

    model: Model
    mesh: DeviceMesh
    root: StrategyNode
    global_batch: int
    micro_batch: int
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = False  # ZeRO-1/2 parameter all-gather runs under the next forward
    tp_comm_overlap: bool = False  # TP collectives pipelined with the GEMM they feed or follow
    cp_comm: str = "p2p"  # context-parallel attention: p2p ring (K/V passed under compute) | all_gather
    ep_dispatcher: str = "alltoall"  # MoE all-to-alls: alltoall (NCCL) | deepep, hybridep (two-hop, one copy per node)
    ep_node_limit: int | None = None  # node-limited routing (two-hop): nodes a token reaches at most
    ep_dispatcher_sms: int | None = None  # SMs HybridEP's kernels run on (None: HYBRIDEP_DEFAULT_SMS)
    ep_overlap: bool = False  # EP all-to-alls hidden under another micro-batch's opposite pass (cost.annotate)
    p2p_scatter_gather: bool = True  # Megatron: a pipeline hand-off replicated over tp goes 1/tp per rank
    zero_stage: int = 0  # informational (what a preset asked for); the compiler reads memory configs
    offload: str = "none"  # none | cpu | nvme | remote: model states live off the GPU (ZeRO-Infinity style)
    # offload remote: the pool's switches gather ZeRO-3 parameters while loading and reduce-scatter gradients
    # while storing (ASTRA-sim 2.0 in-switch collectives); the GPUs run neither collective
    offload_in_switch: bool = False
    # each layer's checkpointed input (recompute full) stored to CPU memory after its forward and loaded back before
    # its backward, on the memory stream (torchtune's activation offloading; compile.offload)
    offload_activations: bool = False
    # CUDA graphs (Megatron --cuda-graph-impl / --cuda-graph-scope): the modules captured (CUDA_GRAPH_MODULES) or
    # ("full_iteration",): a captured op's launches cost the host nothing (cost.annotate); (): none
    cuda_graphs: tuple[str, ...] = ()
    schedule_set: bool = False  # a schedule was given (preset or schedule()); else derived from the batch at resolve
    # inside `held_resolved()`: resolved once, and resolve() returns at once (nothing edits the tree meanwhile)
    _resolve_held: bool = field(default=False, init=False, repr=False, compare=False)

    @classmethod
    def from_model(cls, model: Model, mesh: DeviceMesh, global_batch: int, micro_batch: int) -> StrategyTree:
        root = _node_of(model.root)
        root.schedule_config = ScheduleConfig()
        root.recompute_mode = "none"
        root.chunk = 0
        root.shard_items = frozenset()
        tree = cls(model, mesh, root, global_batch, micro_batch)
        for n in root.walk():
            n.tree = tree
        return tree

    def __getattr__(self, key: str) -> Any:
        # S.layers[3] == S.root.layers[3]
        root = self.__dict__.get("root")
        if key.startswith("__") or root is None:
            raise AttributeError(key)
        return getattr(root, key)

    def leaves(self) -> list[tuple[StrategyNode, str, int]]:
        """(leaf, effective recompute, effective chunk) in execution order, inheritance applied."""
        return [(n, rc, c) for n, rc, c, _ in self._inherited()]

    def _inherited(self) -> list[tuple[StrategyNode, str, int, frozenset[str]]]:
        out: list[tuple[StrategyNode, str, int, frozenset[str]]] = []
        _inherit(self.root, self.root.recompute_mode or "none", self.root.chunk or 0,
                 self.root.shard_items or frozenset(), out)
        return out

    @property
    def schedule(self) -> ScheduleConfig:
        assert self.root.schedule_config is not None
        return self.root.schedule_config

    @property
    def grad_accumulation(self) -> int:
        return self.schedule.n_micro_batch

    @property
    def data_parallel(self) -> int:
        """Replicas of the batch: the mesh axes that split the batch dimension."""
        return self.mesh.dp * self.mesh.ep * self.mesh.dr

    # -- resolution -----------------------------------------------------------------------------------
    def resolve(self) -> StrategyTree:
        """Check the strategy and fill what the user left to inference (in place; idempotent):
        the micro-batch count, dataflow propagation of op layouts, weight and state memory configs.
        Raises ConfigError naming the node and the fix. A no-op inside `held_resolved()`."""
        if self._resolve_held:
            return self
        self._resolve_schedule()
        inherited = self._inherited()
        self._check_chunks(inherited)
        self._propagate(inherited)
        filled: set[int] = set()  # shared leaves this pass found complete (the loop below writes nothing there)
        for node, _, _, items in inherited:  # per op of every layer: a plain loop (a simulation resolves ~10^3)
            assert node.layer is not None
            leaf = node.leaf
            if leaf.shared:  # edited by none of its nodes: complete, or the node takes its own copy
                if id(leaf) in filled:
                    continue
                if _filled(leaf, node.layer.ops):
                    filled.add(id(leaf))
                    continue
                leaf = node.own_leaf()
            splits, weights, extras, derived = leaf.ops, leaf.weights, leaf.extras, leaf.derived
            for op in node.layer.ops:
                name = op.name
                split = splits.get(name)
                if split is None:
                    split = splits[name] = {}
                if name in derived:  # derived last time: the splits may have changed since
                    weights.pop(name, None)
                    extras.pop(name, None)
                if op.weight is not None:
                    if name not in weights:
                        ov = {it: s for (o, it), s in leaf.memory.items() if o == name}
                        weights[name] = sharded_weight_config(op, split, items, ov)
                        derived.add(name)
                elif op.extra_params and name not in extras:
                    extras[name] = state_config(split, items)
                    derived.add(name)
        return self

    def release(self) -> None:
        """Drop the nodes' references back to this tree, for a tree nothing reads again (api.simulate's own):
        without the cycle its few thousand objects are freed by reference counting when the last reference
        goes, not by a pass of the cyclic collector (~1 ms a simulation). A released tree's nodes no longer
        know their mesh; the tree itself still works."""
        for n in self.root.walk():
            n.tree = None

    @contextmanager
    def held_resolved(self) -> Iterator[StrategyTree]:
        """Resolve the tree once and make every further `resolve()` a no-op until the block ends: for a caller
        that reads one unedited tree through several passes which each resolve it (api._run_tree: predict_tasks,
        then lower; about 0.6 ms a pass for GPT-3). Edit nothing inside the block (an edit is not re-resolved);
        edits before it or after it are (a what-if edit between two simulations resolves as before). Nested
        blocks leave the hold to the outermost; the hold does not outlive the block, even on an error."""
        if self._resolve_held:
            yield self
            return
        self.resolve()
        self._resolve_held = True
        try:
            yield self
        finally:
            self._resolve_held = False

    def _resolve_schedule(self) -> None:
        sched = self.schedule
        where = "strategy.schedule"
        data = self.micro_batch * self.data_parallel
        if self.global_batch < 1 or self.micro_batch < 1:
            raise ConfigError("strategy.global_batch", "batch sizes must be >= 1", "use positive integers")
        built = self.model.batch_size_in_graph
        if built != data:
            raise ConfigError("strategy.micro_batch", f"{self.model.name} was built with a batch of {built} but "
                              f"micro_batch x data-parallel (dp x ep) = {self.micro_batch} x {self.data_parallel} "
                              f"= {data}", f"build the model with batch {data}, or use micro_batch "
                              f"{built // self.data_parallel if built % self.data_parallel == 0 else '?'}")
        if not self.schedule_set:  # derived from the batch, again at every resolve
            if self.global_batch % data:
                raise ConfigError("strategy.global_batch", f"{self.global_batch} is not divisible by micro_batch x "
                                  f"data-parallel = {self.micro_batch} x {self.data_parallel} = {data}",
                                  f"use a multiple of {data}")
            sched.n_micro_batch = self.global_batch // data
        elif sched.n_micro_batch * data != self.global_batch:
            raise ConfigError(where, f"{sched.n_micro_batch} micro-batches x micro_batch {self.micro_batch} x "
                              f"data-parallel {self.data_parallel} != global batch {self.global_batch}",
                              f"use n_micro_batch = {self.global_batch // data if self.global_batch % data == 0 else '?'}")
        if sched.kind == "interleaved" and sched.n_micro_batch % self.mesh.pp:
            raise ConfigError(where, f"interleaved 1F1B needs micro-batches ({sched.n_micro_batch}) divisible by "
                              f"pp={self.mesh.pp}", f"use a multiple of {self.mesh.pp} micro-batches")
        if sched.kind == "dualpipev" and sched.n_micro_batch < 2 * self.mesh.pp:
            raise ConfigError(where, f"DualPipeV needs at least 2 x pp = {2 * self.mesh.pp} micro-batches, got "
                              f"{sched.n_micro_batch}", f"use {2 * self.mesh.pp} or more micro-batches")

    def _check_chunks(self, inherited: list[tuple[StrategyNode, str, int, frozenset[str]]]) -> None:
        n_chunks = self.mesh.pp * self.schedule.virtual_stages
        last, last_name = 0, ""
        used: set[int] = set()
        for node, _, chunk, _ in inherited:
            if chunk >= n_chunks:
                raise ConfigError(f"strategy.{node.name}", f"mapped to pipeline chunk {chunk} but there are only "
                                  f"{n_chunks} (pp={self.mesh.pp} x {self.schedule.virtual_stages} virtual stages)",
                                  f"map it to 0 .. {n_chunks - 1}")
            if chunk < last:
                raise ConfigError(f"strategy.{node.name}", f"mapped to chunk {chunk} after {last_name} on chunk "
                                  f"{last}: a later layer on an earlier chunk makes the pipeline's dependencies "
                                  "cyclic", "map layers to non-decreasing chunks in model order")
            last, last_name = chunk, node.name
            used.add(chunk)
        missing = sorted(set(range(n_chunks)) - used)
        if missing:
            raise ConfigError("strategy.map", f"pipeline chunk(s) {', '.join(map(str, missing))} have no layers",
                              f"map layers onto every chunk 0 .. {n_chunks - 1} (pp={self.mesh.pp})")

    def _propagate(self, inherited: list[tuple[StrategyNode, str, int, frozenset[str]]]) -> None:
        """Dataflow propagation (Proteus section VII): a dimension of an op nobody set takes the
        split its producer's output has on the same dimension, less the mesh axes the op already uses."""
        for node, _, _, _ in inherited:  # forget what the last resolve inferred: the user may have changed things
            if not node.leaf.propagated:  # (a shared leaf's is empty: only an owned leaf is propagated into)
                continue
            for o, dims in node.leaf.propagated.items():
                split = node.leaf.ops.get(o, {})
                for d in dims:
                    if d not in node.leaf.explicit.get(o, set()):
                        split.pop(d, None)
            node.leaf.propagated.clear()
        prev: Split = {}
        handed: tuple[Split, Op] | None = None  # a decided layer's last split and op: what it hands on, unread yet
        decided: set[int] = set()  # shared leaves found decided (their nodes have the same ops: build_strategy)
        for node, _, _, _ in inherited:
            assert node.layer is not None
            leaf = node.leaf
            if id(leaf) in decided or _decided(leaf, node.layer.ops):  # nothing to infer: only its output layout
                if leaf.shared:
                    decided.add(id(leaf))
                last = node.layer.ops[-1]
                handed = (leaf.ops[last.name], last)
                continue
            if handed is not None:
                split, last = handed
                prev, handed = {d: split[d] for d in last.output if d in split}, None
            leaf = node.own_leaf()
            outs: dict[str, Split] = {}
            cur = prev
            for op in node.layer.ops:
                split = leaf.ops.setdefault(op.name, {})
                explicit = leaf.explicit.setdefault(op.name, set())
                for i, dims in enumerate(op.inputs):
                    src_name = op.input_from[i] if i < len(op.input_from) else None
                    if src_name == "@skip":
                        continue
                    src = outs.get(src_name, {}) if src_name else cur
                    for d in dims:
                        if d in explicit or d in split or d not in src or d not in op.dims:
                            continue
                        used = {a for ax in split.values() for a in ax}
                        axes = tuple(a for a in src[d] if a not in used)  # the part of the layout still free
                        if axes and op.dims[d] % _axes_product(self.mesh, axes) == 0:
                            split[d] = axes
                            leaf.propagated.setdefault(op.name, set()).add(d)
                out = {d: split[d] for d in op.output if d in split}
                outs[op.name] = out
                cur = out
            prev = cur

    # -- YAML ---------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The resolved strategy as plain data (identical layers share one mapping: YAML anchors)."""
        self.resolve()
        shared: dict[str, dict[str, Any]] = {}
        layers: dict[str, Any] = {}
        for node, rc, chunk, _ in self._inherited():
            leaf = node.leaf
            cfg = {
                "ops": {o: {d: list(a) for d, a in s.items()} for o, s in leaf.ops.items() if s},
                "weights": {o: {it: {d: list(a) for d, a in getattr(w, it).items()} for it in STATE_ITEMS}
                            for o, w in leaf.weights.items()},
                "states": {o: {it: list(getattr(s, it)) for it in STATE_ITEMS} for o, s in leaf.extras.items()
                           if any(getattr(s, it) for it in STATE_ITEMS)},
                "saved": {f"{o}/{t}": {d: list(a) for d, a in s.items()} for (o, t), s in leaf.saved.items()},
            }
            ops = {op.name: op for op in node.layer.ops} if node.layer is not None else {}
            padded = {o: [d for d, a in sp.items() if ops[o].dims[d] % _axes_product(self.mesh, a)]
                      for o, sp in leaf.ops.items() if o in ops}
            padded = {o: ds for o, ds in padded.items() if ds}
            if padded:
                cfg["padded"] = padded  # uneven splits the strategy chose to pad (Megatron's vocabulary)
            key = repr(cfg)
            layers[node.name] = {"chunk": chunk, "recompute": rc, "config": shared.setdefault(key, cfg)}
        s = self.schedule
        return {
            "mesh": {a: self.mesh.size(a) for a in AXIS_ORDER},
            "global_batch": self.global_batch, "micro_batch": self.micro_batch,
            "schedule": {"n_micro_batch": s.n_micro_batch, "kind": s.kind, "virtual_stages": s.virtual_stages,
                         "max_ongoing_micro_batch": s.max_ongoing_micro_batch},
            "overlap_grad_reduce": self.overlap_grad_reduce, "overlap_param_gather": self.overlap_param_gather,
            "tp_comm_overlap": self.tp_comm_overlap, "cp_comm": self.cp_comm,
            "ep_dispatcher": self.ep_dispatcher, "ep_node_limit": self.ep_node_limit, "ep_overlap": self.ep_overlap,
            "ep_dispatcher_sms": self.ep_dispatcher_sms,
            "p2p_scatter_gather": self.p2p_scatter_gather,
            "offload": self.offload, "offload_in_switch": self.offload_in_switch,
            "offload_activations": self.offload_activations, "zero_stage": self.zero_stage,
            "cuda_graphs": list(self.cuda_graphs),
            "layers": layers,
        }

    def to_yaml(self) -> str:
        import yaml

        return yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=None, width=110)

    @classmethod
    def from_dict(cls, model: Model, data: dict[str, Any]) -> StrategyTree:
        """Rebuild a saved strategy for `model`; every name and value is checked (one-line errors)."""
        def need(d: Any, key: str, where: str) -> Any:
            if not isinstance(d, dict) or key not in d:
                raise ConfigError(where, f"missing '{key}'", f"write the '{key}' key (see StrategyTree.to_yaml)")
            return d[key]

        mesh_d = need(data, "mesh", "strategy")
        bad = [a for a in mesh_d if a not in AXIS_ORDER] if isinstance(mesh_d, dict) else ["?"]
        if bad:
            raise ConfigError("strategy.mesh", f"unknown mesh axis '{bad[0]}'", f"use {', '.join(AXIS_ORDER)}")
        try:
            mesh = DeviceMesh(**{a: int(v) for a, v in mesh_d.items()})
            tree = cls.from_model(model, mesh, int(need(data, "global_batch", "strategy")),
                                  int(need(data, "micro_batch", "strategy")))
        except (TypeError, ValueError) as exc:
            raise ConfigError("strategy.mesh", f"bad value ({exc})", "use positive integers") from None
        s = need(data, "schedule", "strategy")
        cap = s.get("max_ongoing_micro_batch")
        tree.root.schedule(int(need(s, "n_micro_batch", "strategy.schedule")),
                           None if cap is None else int(cap), kind=str(s.get("kind", "1f1b")),
                           virtual_stages=int(s.get("virtual_stages", 1)))
        for flag in ("overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap", "p2p_scatter_gather",
                     "ep_overlap"):
            setattr(tree, flag, bool(data.get(flag, getattr(tree, flag))))
        tree.offload = str(data.get("offload", "none"))
        tree.offload_in_switch = bool(data.get("offload_in_switch", False))
        tree.offload_activations = bool(data.get("offload_activations", False))
        tree.cuda_graphs = cuda_graph_scope(data.get("cuda_graphs", ()), "strategy.cuda_graphs")
        cp_comm = data.get("cp_comm", "p2p")
        if cp_comm not in ("p2p", "all_gather"):
            raise ConfigError("strategy.cp_comm", f"unknown value {cp_comm!r}", "use p2p or all_gather")
        tree.cp_comm = str(cp_comm)
        dispatcher, limit = data.get("ep_dispatcher", "alltoall"), data.get("ep_node_limit")
        sms = data.get("ep_dispatcher_sms")
        if dispatcher not in EP_DISPATCHERS:
            raise ConfigError("strategy.ep_dispatcher", f"unknown value {dispatcher!r}",
                              "use alltoall, deepep or hybridep")
        for key, value in (("ep_node_limit", limit), ("ep_dispatcher_sms", sms)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"strategy.{key}", f"must be a positive integer, got {value!r}",
                                  "fix the value or drop it")
        if sms is not None and dispatcher != "hybridep":
            raise ConfigError("strategy.ep_dispatcher_sms", "applies to HybridEP's kernels only",
                              "set ep_dispatcher: hybridep, or drop ep_dispatcher_sms")
        tree.ep_dispatcher, tree.ep_node_limit, tree.ep_dispatcher_sms = str(dispatcher), limit, sms
        tree.zero_stage = int(data.get("zero_stage", 0))
        nodes = {n.name: n for n in tree.root.walk() if n.layer is not None}
        layers = need(data, "layers", "strategy")
        unknown = [k for k in layers if k not in nodes]
        if unknown:
            raise ConfigError(f"strategy.layers.{unknown[0]}", f"{model.name} has no layer '{unknown[0]}'",
                              "save the strategy for this model (layer names must match)")
        for name, node in nodes.items():
            entry = need(layers, name, "strategy.layers")
            node.chunk = int(entry.get("chunk", 0))
            node.recompute(str(entry.get("recompute", "none")))
            cfg = need(entry, "config", f"strategy.layers.{name}")
            _load_leaf(node, cfg)
        return tree.resolve()

    @classmethod
    def from_yaml(cls, model: Model, text: str) -> StrategyTree:
        from ..files import parse_yaml

        data = parse_yaml(text, "strategy", "the strategy tree")
        if not isinstance(data, dict):
            raise ConfigError("strategy", "the file is not a mapping", "write it with StrategyTree.to_yaml")
        return cls.from_dict(model, data)


def _filled(leaf: LeafConfig, ops: Sequence[Op]) -> bool:
    """Whether `resolve` would write nothing into the leaf: every op has its split, nothing is derived (to
    redo), every weighted op has its memory configs and every other op with parameters its states."""
    if leaf.derived:
        return False
    splits, weights, extras = leaf.ops, leaf.weights, leaf.extras
    for op in ops:
        name = op.name
        if name not in splits:
            return False
        if op.weight is not None:
            if name not in weights:
                return False
        elif op.extra_params and name not in extras:
            return False
    return True


def _decided(leaf: LeafConfig, ops: Sequence[Op]) -> bool:
    """Whether every dimension of every op of a (non-empty) layer was set explicitly, as presets and saved
    trees do: dataflow propagation then changes nothing in the layer, and `_propagate` skips it."""
    explicit, splits = leaf.explicit, leaf.ops
    for op in ops:
        chosen = explicit.get(op.name)
        if chosen is None or op.name not in splits or not chosen.issuperset(op.dims):
            return False
    return bool(ops)


def _load_leaf(node: StrategyNode, cfg: dict[str, Any]) -> None:
    assert node.layer is not None
    ops = {op.name: op for op in node.layer.ops}
    where = f"strategy.layers.{node.name}"

    def op_of(name: str) -> Op:
        if name not in ops:
            raise ConfigError(f"{where}.{name}", f"layer has no op '{name}'", f"its ops are {', '.join(ops)}")
        return ops[name]

    leaf = node.own_leaf()
    unknown = sorted(set(cfg) - {"ops", "weights", "states", "saved", "padded"})
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}", "unknown key in a layer's config",
                          "use ops, weights, states, saved, padded (see StrategyTree.to_yaml)")
    padded = cfg.get("padded") or {}
    for o, split in (cfg.get("ops") or {}).items():
        op = op_of(o)
        for d, axes in split.items():
            if d not in op.dims:
                raise ConfigError(f"{where}.{o}", f"op has no dimension '{d}'", f"its dimensions are {', '.join(op.dims)}")
            _set_split(node, op, d, tuple(axes), pad=d in (padded.get(o) or ()))
    for op in node.layer.ops:
        leaf.explicit[op.name] = set(op.dims)  # a saved strategy is complete: nothing to propagate
    for o, items in (cfg.get("weights") or {}).items():
        op = op_of(o)
        if op.weight is None:
            raise ConfigError(f"{where}.{o}", "op has no weight", "drop its 'weights' entry")
        leaf.weights[o] = WeightConfig(**{it: {d: tuple(a) for d, a in (items.get(it) or {}).items()}
                                          for it in STATE_ITEMS})
    for o, items in (cfg.get("states") or {}).items():
        op_of(o)
        leaf.extras[o] = StateConfig(**{it: tuple(items.get(it) or ()) for it in STATE_ITEMS})
    for key, split in (cfg.get("saved") or {}).items():
        o, _, t = str(key).partition("/")
        op_of(o)
        leaf.saved[(o, t)] = {d: tuple(a) for d, a in split.items()}


def _node_of(m: Module | Layer) -> StrategyNode:
    """The strategy node mirroring module `m`, and below it its children's. (Module-level, like `_inherit`: a
    recursive closure is a reference cycle that would keep what it captured alive until the cyclic collector.)"""
    if isinstance(m, Layer):
        return StrategyNode(m.name, layer=m)
    return StrategyNode(m.name, [_node_of(c) for c in m.children])


def _inherit(node: StrategyNode, recompute: str, chunk: int, items: frozenset[str],
             out: list[tuple[StrategyNode, str, int, frozenset[str]]]) -> None:
    """Append (leaf, recompute, chunk, shard items) for every leaf below `node`, each setting inherited from the
    nearest ancestor that sets it."""
    recompute = node.recompute_mode or recompute
    chunk = node.chunk if node.chunk is not None else chunk
    items = node.shard_items if node.shard_items is not None else items
    if node.layer is not None:
        out.append((node, recompute, chunk, items))
    for c in node.children:
        _inherit(c, recompute, chunk, items, out)
