"""Tensor layouts over the device mesh and the collective that turns one layout into another.

A layout says which mesh axes split which tensor dimension and over which axes the tensor is a
partial sum (a contraction over a split dimension). Resharding is inferred per mesh axis by
pattern (Proteus section V): partial -> replicated is an all-reduce, partial -> split a
reduce-scatter, split -> replicated an all-gather, split on one dim -> split on another an
all-to-all. Dimensions of producer and consumer are matched by position when the tensors have
the same rank (a reshape keeps positions), by name otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..strategy.mesh import AXIS_ORDER, DeviceMesh
from ..strategy.tree import Split
from ..workload.ir import CONTRACTION_KINDS, Op, OpKind

PARTIAL_KINDS = CONTRACTION_KINDS | {OpKind.EMBEDDING, OpKind.LOSS}


@dataclass(frozen=True)
class Layout:
    dims: tuple[str, ...]
    split: Mapping[str, tuple[str, ...]]
    partial: frozenset[str] = frozenset()

    def axis_position(self, axis: str) -> int | None:
        for i, d in enumerate(self.dims):
            if axis in self.split.get(d, ()):
                return i
        return None


@dataclass(frozen=True)
class Reshard:
    """One collective needed at an edge: kind, the mesh axes of its group, bytes per rank (nccl-tests)."""

    collective: str
    axes: tuple[str, ...]
    size_bytes: float


def local_sizes(dims: Mapping[str, int], split: Split, mesh: DeviceMesh) -> dict[str, float]:
    """Per-rank extent of every dimension under a split (may be fractional for uneven splits)."""
    return {d: n / (mesh.group_size(split[d]) if d in split else 1) for d, n in dims.items()}


def tensor_bytes(op: Op, dims: tuple[str, ...], split: Split, mesh: DeviceMesh, bytes_per_elem: float) -> float:
    """Bytes per rank of `op`'s tensor over `dims` under `split` (a loop: lowering calls it most)."""
    n = 1.0
    sizes = op.dims
    for d in dims:
        n *= sizes[d] / (mesh.group_size(split[d]) if d in split else 1)
    return bytes_per_elem * n


def restrict(split: Split, dims: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    return {d: split[d] for d in dims if d in split and split[d]}


def _partial_axes(op: Op, split: Split, kept: tuple[str, ...]) -> frozenset[str]:
    """Axes over which a result that keeps only `kept` dims is a partial sum."""
    if op.kind not in PARTIAL_KINDS:
        return frozenset()
    kept_axes = {a for d in kept for a in split.get(d, ())}
    return frozenset(a for d, axes in split.items() if d not in kept for a in axes if a not in kept_axes)


def output_layout(op: Op, split: Split) -> Layout:
    return Layout(op.output, restrict(split, op.output), _partial_axes(op, split, op.output))


def input_grad_layout(op: Op, split: Split, index: int = 0) -> Layout:
    """Layout of the gradient w.r.t. input `index` produced by the op's backward."""
    dims = op.inputs[index]
    return Layout(dims, restrict(split, dims), _partial_axes(op, split, dims))


def weight_grad_partial(op: Op, split: Split) -> tuple[str, ...]:
    """Axes over which the weight gradient is a partial sum: its data-parallel group."""
    assert op.weight is not None
    axes = _partial_axes(op, split, op.weight) if op.kind in PARTIAL_KINDS else frozenset(
        a for d, ax in split.items() if d not in op.weight for a in ax)
    return tuple(a for a in AXIS_ORDER if a in axes)


def reshard(src: Layout, dst_dims: tuple[str, ...], dst_split: Split, mesh: DeviceMesh,
            src_bytes: float) -> list[Reshard]:
    """Collectives turning `src` into the layout `dst_split` over `dst_dims` (empty when equal)."""
    positional = len(src.dims) == len(dst_dims)
    dst = Layout(dst_dims, restrict(dst_split, dst_dims))

    def dst_pos(axis: str) -> int | None:
        p = dst.axis_position(axis)
        if p is None or positional:
            return p
        name = dst_dims[p]
        return src.dims.index(name) if name in src.dims else -1

    groups: dict[str, list[str]] = {}
    for axis in AXIS_ORDER:
        if mesh.size(axis) == 1:
            continue
        sp, dp = src.axis_position(axis), dst_pos(axis)
        if axis in src.partial:
            kind = "all_reduce" if dp is None else "reduce_scatter"
        elif sp is None:
            continue  # replicated -> anything: a local slice, no traffic
        elif dp is None:
            kind = "all_gather"
        elif dp != sp:
            kind = "all_to_all"
        else:
            continue
        groups.setdefault(kind, []).append(axis)
    out: list[Reshard] = []
    size = src_bytes
    for kind in ("all_reduce", "reduce_scatter", "all_to_all", "all_gather"):
        if kind not in groups:
            continue
        axes = tuple(groups[kind])
        n = mesh.group_size(axes)
        if kind == "all_gather":
            size *= n
            out.append(Reshard(kind, axes, size))
        else:
            out.append(Reshard(kind, axes, size))
            if kind == "reduce_scatter":
                size /= n
    return out
