"""trainsim.nn leaf layers: torch.nn's constructor signatures, each recording one IR op (record.ops)
when called under trace (Flatten and Identity are views and record nothing)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...errors import ConfigError
from ..record import SymTensor, ops
from .context import TraceContext
from .module import Module, Parameter


def _pair(v: int | Sequence[int]) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


class Linear(Module):
    """y = x W^T + b over the last dim; `out_dim` names the output-feature dimension (default: the
    module's attribute name, e.g. "fc1"), so a strategy can split it by name."""

    _leaf = True

    def __init__(self, in_features: int, out_features: int, bias: bool = True, out_dim: str | None = None) -> None:
        super().__init__()
        self.in_features, self.out_features, self.out_dim = in_features, out_features, out_dim
        self.weight = Parameter(out_features, in_features)
        self.bias = Parameter(out_features) if bias else None

    def _record(self, ctx: TraceContext, x: SymTensor) -> SymTensor:
        return ops.linear(ctx.builder, x, self.out_features, ctx.ref(self.weight),
                          ctx.ref(self.bias) if self.bias is not None else None, self.out_dim)


class Conv2d(Module):
    _leaf = True

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | Sequence[int], stride: int | Sequence[int] = 1,
                 padding: int | str | Sequence[int] = 0, dilation: int | Sequence[int] = 1, groups: int = 1,
                 bias: bool = True) -> None:
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.stride, self.padding = _pair(kernel_size), stride, padding
        self.dilation, self.groups = dilation, groups
        self.weight = Parameter(out_channels, in_channels // groups, *self.kernel_size)
        self.bias = Parameter(out_channels) if bias else None

    def _record(self, ctx: TraceContext, x: SymTensor) -> SymTensor:
        if x.ndim == 4 and x.shape[1] != self.in_channels:
            raise ConfigError(f"trace.{ctx.builder.where}", f"Conv2d expects {self.in_channels} channels, got shape "
                              f"{x.shape}", "fix in_channels or the input")
        return ops.conv2d(ctx.builder, x, self.out_channels, self.kernel_size, ctx.ref(self.weight),
                          ctx.ref(self.bias) if self.bias is not None else None, self.stride, self.padding,
                          self.dilation, self.groups)


class BatchNorm2d(Module):
    _leaf = True

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1, affine: bool = True) -> None:
        super().__init__()
        self.num_features = num_features
        self.weight = Parameter(num_features) if affine else None
        self.bias = Parameter(num_features) if affine else None

    def _record(self, ctx: TraceContext, x: SymTensor) -> SymTensor:
        refs = [ctx.ref(p) for p in (self.weight, self.bias) if p is not None]
        return ops.batch_norm(ctx.builder, x, *refs)


class LayerNorm(Module):
    _leaf = True

    def __init__(self, normalized_shape: int | Sequence[int], eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True) -> None:
        super().__init__()
        shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
        self.weight = Parameter(*shape) if elementwise_affine else None
        self.bias = Parameter(*shape) if elementwise_affine and bias else None

    def _record(self, ctx: TraceContext, x: SymTensor) -> SymTensor:
        return ops.layer_norm(ctx.builder, x, *(ctx.ref(p) if p is not None else None for p in (self.weight, self.bias)))


class Embedding(Module):
    """Lookup table (num_embeddings, embedding_dim); output features named `out_dim` ("h")."""

    _leaf = True

    def __init__(self, num_embeddings: int, embedding_dim: int, out_dim: str = "h") -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim, self.out_dim = num_embeddings, embedding_dim, out_dim
        self.weight = Parameter(num_embeddings, embedding_dim)

    def _record(self, ctx: TraceContext, ids: SymTensor) -> SymTensor:
        return ops.embedding(ctx.builder, ids, self.num_embeddings, self.embedding_dim, ctx.ref(self.weight),
                             self.out_dim)


class _Activation(Module):
    _leaf = True
    kind = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # inplace= / approximate= do not change the cost
        super().__init__()

    def _record(self, ctx: TraceContext, x: SymTensor) -> SymTensor:
        return ops.activation(ctx.builder, x, self.kind)


class ReLU(_Activation):
    kind = "relu"


class GELU(_Activation):
    kind = "gelu"


class SiLU(_Activation):
    kind = "silu"


class Dropout(Module):
    _leaf = True

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__()
        self.p = p

    def _record(self, ctx: TraceContext, x: SymTensor) -> SymTensor:
        return ops.dropout(ctx.builder, x, self.p)


class MaxPool2d(Module):
    _leaf = True

    def __init__(self, kernel_size: int | Sequence[int], stride: int | Sequence[int] | None = None,
                 padding: int | Sequence[int] = 0, dilation: int | Sequence[int] = 1, ceil_mode: bool = False) -> None:
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        self.dilation, self.ceil_mode = dilation, ceil_mode

    def _record(self, ctx: TraceContext, x: SymTensor) -> SymTensor:
        return ops.max_pool2d(ctx.builder, x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode)


class AdaptiveAvgPool2d(Module):
    _leaf = True

    def __init__(self, output_size: int | Sequence[int | None]) -> None:
        super().__init__()
        self.output_size = output_size

    def _record(self, ctx: TraceContext, x: SymTensor) -> SymTensor:
        return ops.adaptive_avg_pool2d(ctx.builder, x, self.output_size)


class Flatten(Module):
    """A view: records nothing."""

    _leaf = True

    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def _record(self, ctx: TraceContext, x: SymTensor) -> SymTensor:
        return ctx.builder.flatten(x, self.start_dim, self.end_dim)


class Identity(Module):
    _leaf = True

    def _record(self, ctx: TraceContext, x: SymTensor) -> SymTensor:
        return x


class FlashAttention(Module):
    """Fused causal (flash) attention core on a fused qkv tensor (b, s, (heads + 2 kv_heads) x d)
    -> (b, s, heads x d): the zoo's attention op (no parameters)."""

    _leaf = True

    def __init__(self, num_heads: int, num_kv_heads: int | None = None, causal: bool = True) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.causal = num_heads, num_kv_heads or num_heads, causal

    def _record(self, ctx: TraceContext, qkv: SymTensor) -> SymTensor:
        b = ctx.builder
        width = self.num_heads + 2 * self.num_kv_heads
        if qkv.ndim != 3 or qkv.shape[-1] % width:
            raise ConfigError(f"trace.{b.where}", f"attention expects (batch, seq, (heads + 2 kv_heads) x head_dim) with "
                              f"{self.num_heads} + 2 x {self.num_kv_heads} heads, got shape {qkv.shape}",
                              "fix num_heads / num_kv_heads or the qkv projection's width")
        bsz, seq, _ = qkv.shape
        return ops.attention(b, qkv, qkv, qkv, batch=bsz, seq_q=seq, seq_k=seq, heads=self.num_heads,
                             kv_heads=self.num_kv_heads, head_dim=qkv.shape[-1] // width, causal=self.causal,
                             batch_name=qkv.names[0], seq_name=qkv.names[1])


class CausalSelfAttention(Module):
    """qkv projection (features "q"), fused causal attention (output "o") and output projection."""

    def __init__(self, dim: int, num_heads: int, num_kv_heads: int | None = None, bias: bool = True,
                 out_dim: str | None = None) -> None:
        super().__init__()
        kv = num_kv_heads or num_heads
        head = dim // num_heads
        self.qkv = Linear(dim, (num_heads + 2 * kv) * head, bias=bias, out_dim="q")
        self.attention = FlashAttention(num_heads, kv)
        self.proj = Linear(num_heads * head, dim, bias=bias, out_dim=out_dim)

    def forward(self, x: Any) -> Any:
        return self.proj(self.attention(self.qkv(x)))


class CrossEntropyLoss(Module):
    """Softmax cross-entropy over the last dim of the logits; targets, if given, cost nothing."""

    _leaf = True

    def _record(self, ctx: TraceContext, logits: SymTensor, target: Any = None) -> SymTensor:
        return ops.cross_entropy(ctx.builder, logits)
