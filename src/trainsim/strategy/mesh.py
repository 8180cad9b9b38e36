"""Device mesh: named parallel axes laid over global ranks (Megatron order, innermost first)."""

from __future__ import annotations

import math
from dataclasses import dataclass

# Innermost (fastest-varying rank coordinate) first: TP stays inside a node, PP is outermost.
AXIS_ORDER: tuple[str, ...] = ("tp", "cp", "ep", "dp", "pp")


@dataclass(frozen=True)
class DeviceMesh:
    """Sizes of the parallel axes; rank = sum(coord[axis] * stride(axis))."""

    tp: int = 1
    cp: int = 1
    ep: int = 1
    dp: int = 1  # data-parallel replicas *outside* the expert axis (total data parallel = ep * dp)
    pp: int = 1

    def size(self, axis: str) -> int:
        return int(getattr(self, axis))

    @property
    def world_size(self) -> int:
        return math.prod(self.size(a) for a in AXIS_ORDER)

    def stride(self, axis: str) -> int:
        s = 1
        for a in AXIS_ORDER:
            if a == axis:
                return s
            s *= self.size(a)
        raise KeyError(axis)

    def coords(self, rank: int) -> dict[str, int]:
        out = {}
        for a in AXIS_ORDER:
            out[a] = rank % self.size(a)
            rank //= self.size(a)
        return out

    def rank(self, coords: dict[str, int]) -> int:
        return sum(coords.get(a, 0) * self.stride(a) for a in AXIS_ORDER)

    def group_size(self, axes: tuple[str, ...]) -> int:
        return math.prod(self.size(a) for a in axes)

    def group_ranks(self, axes: tuple[str, ...], rank: int = 0) -> list[int]:
        """Global ranks of the group along `axes` that contains `rank`."""
        base = self.coords(rank)
        ranks = [rank - sum(base[a] * self.stride(a) for a in axes)]
        for a in axes:
            ranks = [r + i * self.stride(a) for r in ranks for i in range(self.size(a))]
        return sorted(ranks)
