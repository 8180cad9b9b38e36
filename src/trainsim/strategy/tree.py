"""Proteus-style strategy tree (Proteus section IV).

The tree mirrors the model's module tree. Leaf nodes (layers) hold computation configs (which
mesh axes split which dimension of each op) and memory configs (how each weight, its gradient,
its optimizer state and each saved activation is partitioned). Non-leaf nodes hold schedule
configs (micro-batching, pipeline schedule) and recompute, inherited top-down unless overridden.
Presets (strategy.presets) fill this tree; the compiler only ever reads the tree.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from ..workload.ir import Layer, Model, Module
from .mesh import DeviceMesh

Split = dict[str, tuple[str, ...]]  # dimension name -> mesh axes that split it (outermost last)

RECOMPUTE_MODES = ("none", "selective", "full")
SCHEDULES = ("gpipe", "1f1b", "interleaved")


@dataclass
class ScheduleConfig:
    """Subgraph-level schedule: how many micro-batches and in which order (pipeline)."""

    n_micro_batch: int = 1
    kind: str = "1f1b"  # gpipe | 1f1b | interleaved
    virtual_stages: int = 1  # model chunks per pipeline rank (interleaved 1F1B)


@dataclass
class WeightConfig:
    """Memory configs of one op's parameter items (ZeRO = partitioning these over data axes)."""

    weight: Split = field(default_factory=dict)
    grad: Split = field(default_factory=dict)
    optimizer: Split = field(default_factory=dict)


@dataclass
class LeafConfig:
    """Per-op computation configs and per-tensor memory configs of one layer."""

    ops: dict[str, Split] = field(default_factory=dict)
    weights: dict[str, WeightConfig] = field(default_factory=dict)
    saved: dict[tuple[str, str], Split] = field(default_factory=dict)  # (op, tensor) -> storage split


@dataclass
class StrategyNode:
    """A node of the strategy tree; `layer` is set on leaves."""

    name: str
    children: list[StrategyNode] = field(default_factory=list)
    layer: Layer | None = None
    leaf: LeafConfig = field(default_factory=LeafConfig)
    schedule: ScheduleConfig | None = None
    recompute: str | None = None  # None: inherit from the parent
    stage: int | None = None  # pipeline model chunk (virtual stage) index; None: inherit

    def __getattr__(self, key: str) -> StrategyNode:
        # attribute access mirrors the model: tree.root.layers[3]
        children = self.__dict__.get("children", [])
        for c in children:
            if c.name == key or c.name.rsplit(".", 1)[-1] == key:
                return c
        raise AttributeError(key)

    def __getitem__(self, i: int) -> StrategyNode:
        return self.children[i]

    def walk(self) -> Iterator[StrategyNode]:
        yield self
        for c in self.children:
            yield from c.walk()


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
    zero_stage: int = 0
    offload: str = "none"  # none | cpu | nvme | remote: model states live off the GPU (ZeRO-Infinity style)

    @classmethod
    def from_model(cls, model: Model, mesh: DeviceMesh, global_batch: int, micro_batch: int) -> StrategyTree:
        def build(m: Module | Layer) -> StrategyNode:
            if isinstance(m, Layer):
                return StrategyNode(m.name, layer=m)
            return StrategyNode(m.name, [build(c) for c in m.children])

        root = build(model.root)
        root.schedule = ScheduleConfig()
        root.recompute = "none"
        root.stage = 0
        return cls(model, mesh, root, global_batch, micro_batch)

    def leaves(self) -> list[tuple[StrategyNode, str, int]]:
        """(leaf, effective recompute, effective chunk) in execution order, inheritance applied."""
        out: list[tuple[StrategyNode, str, int]] = []

        def rec(node: StrategyNode, recompute: str, stage: int) -> None:
            recompute = node.recompute or recompute
            stage = node.stage if node.stage is not None else stage
            if node.layer is not None:
                out.append((node, recompute, stage))
            for c in node.children:
                rec(c, recompute, stage)

        rec(self.root, self.root.recompute or "none", self.root.stage or 0)
        return out

    @property
    def schedule(self) -> ScheduleConfig:
        assert self.root.schedule is not None
        return self.root.schedule

    @property
    def grad_accumulation(self) -> int:
        return self.schedule.n_micro_batch
