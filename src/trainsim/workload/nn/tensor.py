"""Symbolic tensors as trainsim.nn forward code sees them: shapes and the usual methods, no data.

Arithmetic (`x + y`, `x * y`) records an elementwise op; `view` / `reshape` / `flatten` /
`transpose` / `permute` / `contiguous` are free views that record nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..record import SymTensor, ops
from .context import active


def _sizes(shape: tuple[Any, ...]) -> tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    return tuple(int(s) for s in shape)


class Tensor:
    """A symbolic activation: shape plus the op that produced it."""

    __slots__ = ("sym",)

    def __init__(self, sym: SymTensor) -> None:
        self.sym = sym

    # -- shape -----------------------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self.sym.shape

    @property
    def ndim(self) -> int:
        return self.sym.ndim

    def dim(self) -> int:
        return self.sym.ndim

    def size(self, dim: int | None = None) -> Any:
        return self.sym.shape if dim is None else self.sym.shape[dim]

    def numel(self) -> int:
        return self.sym.numel

    def __repr__(self) -> str:
        return f"Tensor(shape={self.shape}, dims={self.sym.names})"

    # -- views -----------------------------------------------------------------------------------------
    def view(self, *shape: Any) -> Tensor:
        return Tensor(active("Tensor.view").builder.reshape(self.sym, _sizes(shape)))

    reshape = view

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        return Tensor(active("Tensor.flatten").builder.flatten(self.sym, start_dim, end_dim))

    def transpose(self, dim0: int, dim1: int) -> Tensor:
        return Tensor(active("Tensor.transpose").builder.transpose(self.sym, dim0, dim1))

    def permute(self, *dims: Any) -> Tensor:
        return Tensor(active("Tensor.permute").builder.permute(self.sym, _sizes(dims)))

    def contiguous(self) -> Tensor:
        return self

    # -- elementwise -----------------------------------------------------------------------------------
    def relu(self) -> Tensor:
        return Tensor(ops.activation(active("Tensor.relu").builder, self.sym, "relu"))

    def _binary(self, kind: str, other: Any, reverse: bool = False) -> Tensor:
        ctx = active(f"Tensor.{kind}")
        o = _operand(ctx, other)
        x, y = (o, self.sym) if reverse else (self.sym, o)
        return Tensor(ops.binary(ctx.builder, kind, x, y))

    def __add__(self, other: Any) -> Tensor:
        return self._binary("add", other)

    def __radd__(self, other: Any) -> Tensor:
        return self._binary("add", other, reverse=True)

    def __sub__(self, other: Any) -> Tensor:
        return self._binary("sub", other)

    def __rsub__(self, other: Any) -> Tensor:
        return self._binary("sub", other, reverse=True)

    def __mul__(self, other: Any) -> Tensor:
        return self._binary("mul", other)

    def __rmul__(self, other: Any) -> Tensor:
        return self._binary("mul", other, reverse=True)

    def __truediv__(self, other: Any) -> Tensor:
        return self._binary("div", other)


def _operand(ctx: Any, other: Any) -> SymTensor | float:
    from .module import Parameter

    if isinstance(other, Tensor):
        return other.sym
    if isinstance(other, Parameter):
        return ctx.builder.param(ctx.ref(other))
    if isinstance(other, (int, float)):
        return float(other)
    raise TypeError(f"unsupported operand {type(other).__name__} for a trainsim.nn Tensor")


def unwrap(values: Sequence[Any]) -> list[Any]:
    return [v.sym if isinstance(v, Tensor) else v for v in values]
