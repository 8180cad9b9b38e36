"""Device mesh: named parallel axes laid over global ranks (Megatron order, innermost first)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

# Innermost (fastest-varying rank coordinate) first: TP stays inside a node, PP is outermost. `dr` holds the
# replicas of hybrid sharding (HSDP): the batch is split over ep x dp x dr, sharded states only over ep x dp.
AXIS_ORDER: tuple[str, ...] = ("tp", "cp", "ep", "dp", "dr", "pp")
REPLICA_AXES: frozenset[str] = frozenset({"dr"})
"""Data axes that split the batch but never shard model states (HSDP replicas)."""


@dataclass(frozen=True)
class DeviceMesh:
    """Sizes of the parallel axes; rank = sum(coord[axis] * stride(axis))."""

    tp: int = 1
    cp: int = 1
    ep: int = 1
    dp: int = 1  # data-parallel replicas *outside* the expert axis (total data parallel = ep * dp * dr)
    dr: int = 1  # HSDP: replicas of each sharding group (states are sharded over ep x dp only)
    pp: int = 1

    @cached_property
    def _sizes(self) -> dict[str, int]:
        return {a: int(getattr(self, a)) for a in AXIS_ORDER}

    @cached_property
    def _strides(self) -> dict[str, int]:
        out, s = {}, 1
        for a in AXIS_ORDER:
            out[a] = s
            s *= self._sizes[a]
        return out

    def size(self, axis: str) -> int:
        return self._sizes[axis]

    @property
    def world_size(self) -> int:
        return math.prod(self._sizes.values())

    def stride(self, axis: str) -> int:
        return self._strides[axis]

    @cached_property
    def _axis_sizes(self) -> tuple[tuple[str, int], ...]:
        return tuple(self._sizes.items())

    def coords(self, rank: int) -> dict[str, int]:
        """Coordinate of `rank` on every axis (a fresh dict: callers edit it). Called per task by the graph
        builder, so a plain loop."""
        out = {}
        for a, n in self._axis_sizes:
            rank, out[a] = divmod(rank, n)
        return out

    def rank(self, coords: dict[str, int]) -> int:
        """The rank at `coords` (axes left out are 0; names that are not axes are ignored)."""
        st = self._strides
        r = 0
        for a, c in coords.items():
            s = st.get(a)
            if s is not None:
                r += c * s
        return r

    def group_size(self, axes: tuple[str, ...]) -> int:
        sz = self._sizes
        return math.prod(sz[a] for a in axes)

    def group_ranks(self, axes: tuple[str, ...], rank: int = 0) -> list[int]:
        """Global ranks of the group along `axes` that contains `rank`."""
        base = self.coords(rank)
        ranks = [rank - sum(base[a] * self.stride(a) for a in axes)]
        for a in axes:
            ranks = [r + i * self.stride(a) for r in ranks for i in range(self.size(a))]
        return sorted(ranks)
