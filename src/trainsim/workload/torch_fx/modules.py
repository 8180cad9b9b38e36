"""torch.nn module classes -> record.ops calls (one handler per class; subclasses use their base's)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torch import nn

from ..record import SymTensor, ops

if TYPE_CHECKING:
    from .trace import FxContext


def _conv(ctx: FxContext, m: nn.Conv2d, x: SymTensor) -> SymTensor:
    return ops.conv2d(ctx.builder, x, m.out_channels, m.kernel_size, ctx.ref(m.weight), ctx.ref(m.bias), m.stride,
                      m.padding, m.dilation, m.groups)


def _linear(ctx: FxContext, m: nn.Linear, x: SymTensor) -> SymTensor:
    return ops.linear(ctx.builder, x, m.out_features, ctx.ref(m.weight), ctx.ref(m.bias))  # name: `dim_names`


def _batch_norm(ctx: FxContext, m: nn.modules.batchnorm._BatchNorm, x: SymTensor) -> SymTensor:
    return ops.batch_norm(ctx.builder, x, ctx.ref(m.weight), ctx.ref(m.bias))


def _norm(ctx: FxContext, m: nn.Module, x: SymTensor) -> SymTensor:
    return ops.layer_norm(ctx.builder, x, ctx.ref(getattr(m, "weight", None)), ctx.ref(getattr(m, "bias", None)))


def _activation(kind: str) -> Callable[..., SymTensor]:
    def handler(ctx: FxContext, m: nn.Module, x: SymTensor) -> SymTensor:
        return ops.activation(ctx.builder, x, kind)

    return handler


def _dropout(ctx: FxContext, m: nn.Dropout, x: SymTensor) -> SymTensor:
    return ops.dropout(ctx.builder, x, float(m.p))


def _max_pool(ctx: FxContext, m: nn.MaxPool2d, x: SymTensor) -> SymTensor:
    return ops.max_pool2d(ctx.builder, x, m.kernel_size, m.stride, m.padding, m.dilation, m.ceil_mode)


def _avg_pool(ctx: FxContext, m: nn.AvgPool2d, x: SymTensor) -> SymTensor:
    return ops.avg_pool2d(ctx.builder, x, m.kernel_size, m.stride, m.padding, m.ceil_mode)


def _adaptive_avg_pool(ctx: FxContext, m: nn.AdaptiveAvgPool2d, x: SymTensor) -> SymTensor:
    return ops.adaptive_avg_pool2d(ctx.builder, x, m.output_size)


def _embedding(ctx: FxContext, m: nn.Embedding, ids: SymTensor) -> SymTensor:
    return ops.embedding(ctx.builder, ids, m.num_embeddings, m.embedding_dim, ctx.ref(m.weight), ctx.out_dim("h"))


def _flatten(ctx: FxContext, m: nn.Flatten, x: SymTensor) -> SymTensor:
    return ctx.builder.reshape(x, ctx.shape())


def _identity(ctx: FxContext, m: nn.Module, x: SymTensor) -> SymTensor:
    return x


def _cross_entropy(ctx: FxContext, m: nn.Module, logits: SymTensor, *rest: Any, **kw: Any) -> SymTensor:
    return ctx.reduced(ops.cross_entropy(ctx.builder, logits))


MODULES: dict[type, Callable[..., Any]] = {
    nn.Conv2d: _conv,
    nn.Linear: _linear,
    nn.modules.batchnorm._BatchNorm: _batch_norm,
    nn.LayerNorm: _norm,
    nn.ReLU: _activation("relu"),
    nn.GELU: _activation("gelu"),
    nn.SiLU: _activation("silu"),
    nn.Sigmoid: _activation("sigmoid"),
    nn.Tanh: _activation("tanh"),
    nn.Dropout: _dropout,
    nn.MaxPool2d: _max_pool,
    nn.AvgPool2d: _avg_pool,
    nn.AdaptiveAvgPool2d: _adaptive_avg_pool,
    nn.Embedding: _embedding,
    nn.Flatten: _flatten,
    nn.Identity: _identity,
    nn.CrossEntropyLoss: _cross_entropy,
}
if hasattr(nn, "RMSNorm"):
    MODULES[nn.RMSNorm] = _norm

__all__ = ["MODULES"]
