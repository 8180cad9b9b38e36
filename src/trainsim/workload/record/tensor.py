"""Symbolic tensors and parameter references: what the recorder passes between ops instead of data.

A symbolic tensor has a shape, a name per dimension (the IR's dimension names, so the op that reads
it can name its own dimensions after them) and its origin: the recorded op that produced it, a model
input, a constant made inside forward (arange, zeros) or a parameter read directly by forward (a
learned position table added to the activations). Views (reshape, transpose, slices) make a new
symbolic tensor with the same origin: they are free, so they record no op.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass

INPUT = -1  # source of a model input
CONST = -2  # source of a tensor created inside forward (no producer, no gradient)
PARAM = -3  # source of a parameter read directly by forward


@dataclass(frozen=True)
class ParamRef:
    """One trainable tensor, identified by `key` (the object's identity) so a weight shared by two
    ops (tied embeddings) is counted once; `name` is its module path for messages."""

    key: Hashable
    shape: tuple[int, ...]
    name: str = ""

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class SymTensor:
    """A tensor seen by the recorder: shape, dimension names and origin (`source` is the index of
    the recorded op that produced it, or INPUT / CONST / PARAM)."""

    shape: tuple[int, ...]
    names: tuple[str, ...]
    source: int = INPUT
    param: ParamRef | None = None

    def __post_init__(self) -> None:
        if len(self.shape) != len(self.names):
            raise ValueError(f"shape {self.shape} and names {self.names} differ in rank")
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"dimension names {self.names} repeat")

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def is_param(self) -> bool:
        return self.source == PARAM

    def sizes(self) -> dict[str, int]:
        """Dimension name -> size."""
        return dict(zip(self.names, self.shape, strict=True))

    def like(self, shape: tuple[int, ...], names: tuple[str, ...]) -> SymTensor:
        """A view of this tensor: same origin, new shape and names."""
        return SymTensor(tuple(shape), tuple(names), self.source, self.param)
