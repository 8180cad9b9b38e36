"""torch functions and Tensor methods -> record.ops calls or free views.

Recorded: add/sub/mul/div (operators, torch.* and methods, in-place too), relu/gelu/silu/sigmoid/
tanh, dropout, cat, F.scaled_dot_product_attention (the zoo's fused attention op), cross_entropy.
Views (no op, shapes from PyTorch): view, reshape, flatten, squeeze, unsqueeze, transpose, permute,
t, contiguous, dtype casts, split, chunk, indexing. Sizes (`size`, `dim`, `.shape`) are plain values.
Tensor factories (arange, zeros, ...) make constants.
"""

from __future__ import annotations

import builtins
import operator
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch.fx._symbolic_trace import _assert_is_none

from ...errors import ConfigError
from ..record import SymTensor, ops

if TYPE_CHECKING:
    from .trace import FxContext

Handler = Callable[..., Any]


def _binary(kind: str) -> Handler:
    def handler(ctx: FxContext, x: Any, y: Any, *rest: Any, **kw: Any) -> SymTensor:
        return ops.binary(ctx.builder, kind, x, y)

    return handler


def _act(kind: str) -> Handler:
    def handler(ctx: FxContext, x: SymTensor, *rest: Any, **kw: Any) -> SymTensor:
        return ops.activation(ctx.builder, x, kind)

    return handler


def _dropout(ctx: FxContext, x: SymTensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> SymTensor:
    return ops.dropout(ctx.builder, x, float(p)) if training else x


def _view(ctx: FxContext, x: SymTensor, *args: Any, **kw: Any) -> SymTensor:
    return ctx.builder.reshape(x, ctx.shape())


def _identity(ctx: FxContext, x: SymTensor, *args: Any, **kw: Any) -> SymTensor:
    return x


def _transpose(ctx: FxContext, x: SymTensor, dim0: int = 0, dim1: int = 1) -> SymTensor:
    return ctx.builder.transpose(x, dim0, dim1)


def _permute(ctx: FxContext, x: SymTensor, *dims: Any, **kw: Any) -> SymTensor:
    order = kw.get("dims", dims[0] if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims)
    return ctx.builder.permute(x, [int(d) for d in order])


def _t(ctx: FxContext, x: SymTensor) -> SymTensor:
    return ctx.builder.transpose(x, 0, 1) if x.ndim == 2 else x


def _pieces(ctx: FxContext, x: SymTensor, *args: Any, **kw: Any) -> tuple[SymTensor, ...]:
    """split / chunk: slices of x along one dim, sized as PyTorch computed."""
    return tuple(ctx.builder.resize(x, s, list(range(x.ndim))) for s in ctx.shapes())


def _getitem(ctx: FxContext, x: Any, index: Any) -> Any:
    if not isinstance(x, SymTensor):
        return x[index]
    idx = index if isinstance(index, tuple) else (index,)
    if any(isinstance(i, SymTensor) for i in idx):
        raise ConfigError(f"torch_fx.{ctx.node.name}", "indexing with a tensor (a gather) is not supported",
                          "use an Embedding module or move it into a leaf module with a handler")
    explicit = sum(1 for i in idx if i is not None and i is not Ellipsis)
    kept: list[int | None] = []
    d = 0
    for i in idx:
        if i is Ellipsis:
            for _ in range(x.ndim - explicit):
                kept.append(d)
                d += 1
        elif i is None:
            kept.append(None)
        elif isinstance(i, int):
            d += 1
        else:
            kept.append(d)
            d += 1
    kept += list(range(d, x.ndim))
    return ctx.builder.resize(x, ctx.shape(), kept)


def _size(ctx: FxContext, x: SymTensor, dim: int | None = None) -> Any:
    return torch.Size(x.shape) if dim is None else x.shape[dim]


def _getattr(ctx: FxContext, x: Any, name: str) -> Any:
    if not isinstance(x, SymTensor):
        return getattr(x, name)
    if name == "shape":
        return torch.Size(x.shape)
    if name == "ndim":
        return x.ndim
    if name in ("dtype", "device"):
        meta = ctx.node.meta.get("tensor_meta")
        return getattr(meta, name, None)
    raise ConfigError(f"torch_fx.{ctx.node.name}", f"tensor attribute '{name}' is not supported",
                      "use .shape / .size() / .ndim")


def _cat(ctx: FxContext, tensors: Sequence[SymTensor], dim: int = 0) -> SymTensor:
    return ops.cat(ctx.builder, list(tensors), dim)


def _sdpa(ctx: FxContext, q: SymTensor, k: SymTensor, v: SymTensor, attn_mask: Any = None, dropout_p: float = 0.0,
          is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> SymTensor:
    if q.ndim != 4 or k.ndim != 4:
        raise ConfigError(f"torch_fx.{ctx.node.name}", f"scaled_dot_product_attention on shapes {q.shape}, {k.shape}",
                          "pass (batch, heads, seq, head_dim) tensors")
    b, a, s, d = q.shape
    return ops.attention(ctx.builder, q, k, v, batch=b, seq_q=s, seq_k=k.shape[2], heads=a, kv_heads=k.shape[1],
                         head_dim=d, causal=bool(is_causal), batch_name=q.names[0], seq_name=q.names[2],
                         heads_first=True)


def _cross_entropy(ctx: FxContext, logits: SymTensor, *rest: Any, **kw: Any) -> SymTensor:
    return ctx.reduced(ops.cross_entropy(ctx.builder, logits))


_ACTS = {"relu": (torch.relu, F.relu), "gelu": (F.gelu,), "silu": (F.silu,), "sigmoid": (torch.sigmoid, F.sigmoid),
         "tanh": (torch.tanh, F.tanh)}
_BINARY = {"add": (operator.add, operator.iadd, torch.add), "sub": (operator.sub, operator.isub, torch.sub),
           "mul": (operator.mul, operator.imul, torch.mul), "div": (operator.truediv, operator.itruediv, torch.div)}

FUNCTIONS: dict[Any, Handler] = {
    F.dropout: _dropout,
    torch.flatten: _view, torch.reshape: _view, torch.squeeze: _view, torch.unsqueeze: _view,
    torch.transpose: _transpose, torch.permute: _permute,
    torch.split: _pieces, torch.chunk: _pieces,
    operator.getitem: _getitem, builtins.getattr: _getattr,
    torch.cat: _cat, torch.concat: _cat,
    F.scaled_dot_product_attention: _sdpa,
    F.cross_entropy: _cross_entropy,
    _assert_is_none: lambda ctx, *a, **k: None,  # fx's guard on a None default kept as a concrete arg
    torch._assert: lambda ctx, *a, **k: None,
}
METHODS: dict[str, Handler] = {
    "view": _view, "reshape": _view, "flatten": _view, "squeeze": _view, "unsqueeze": _view, "view_as": _view,
    "transpose": _transpose, "permute": _permute, "t": _t,
    "contiguous": _identity, "float": _identity, "half": _identity, "bfloat16": _identity, "to": _identity,
    "type_as": _identity, "detach": _identity, "clone": _identity,
    "split": _pieces, "chunk": _pieces, "size": _size, "dim": lambda ctx, x: x.ndim,
}
for _kind, _fns in _ACTS.items():
    FUNCTIONS.update(dict.fromkeys(_fns, _act(_kind)))
    METHODS[_kind] = METHODS[f"{_kind}_"] = _act(_kind)
for _kind, _fns in _BINARY.items():
    FUNCTIONS.update(dict.fromkeys(_fns, _binary(_kind)))
    METHODS[_kind] = METHODS[f"{_kind}_"] = _binary(_kind)

CONSTANT_FUNCTIONS = frozenset({torch.arange, torch.zeros, torch.ones, torch.full, torch.empty, torch.rand,
                                torch.randn, torch.zeros_like, torch.ones_like, torch.empty_like, torch.full_like,
                                torch.tril, torch.triu})
