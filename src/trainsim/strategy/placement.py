"""Where the parallel groups land on the topology: which dimensions each mesh axis spans, and how wide.

Ranks follow the strategy's mesh order (tp innermost, then cp, ep, dp, pp) and the topology numbers
NPUs innermost-dimension-fastest, so a group's footprint per dimension is its number of distinct
coordinates there (`fanouts`). Printed by `trainsim simulate` so users see, e.g., that TP stays on
NVLink while DP crosses the network.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..hardware.cluster import Level
from ..hardware.topology import fanouts
from .mesh import AXIS_ORDER, DeviceMesh


@dataclass(frozen=True)
class AxisPlacement:
    """One parallel axis: its degree and its fan-out in every topology dimension (product = degree)."""

    axis: str
    degree: int
    fanout: tuple[int, ...]

    def describe(self, levels: Sequence[Level]) -> str:
        spans = [f"dim{i + 1}{'' if lv.name == f'dim{i + 1}' else ' ' + lv.name} {lv.kind}({lv.size}) x{f}"
                 for i, (lv, f) in enumerate(zip(levels, self.fanout, strict=True)) if f > 1]
        return f"{self.axis}={self.degree}: " + (", ".join(spans) if spans else "one NPU")


def placement(mesh: DeviceMesh, levels: Sequence[Level]) -> list[AxisPlacement]:
    """Fan-out of each parallel axis (degree > 1) over the topology's dimensions, innermost axis first."""
    out = []
    for axis in AXIS_ORDER:
        if mesh.size(axis) > 1:
            group = mesh.group_ranks((axis,), 0)
            out.append(AxisPlacement(axis, mesh.size(axis), tuple(fanouts(levels, group))))
    return out
