"""Op constructors: the zoo's conventions for dimension names, FLOPs, bytes and saved tensors.

Both front ends (trainsim.nn, torch.fx) call these, so a traced ResNet-50 or GPT costs exactly what
the hand-written zoo model costs. Conventions (see workload.zoo.cnn / zoo.transformer):
  * Conv2d: dims n k c p q r s hi wi (input (n, c, hi, wi), output (n, k, p, q), weight (k, c, r, s));
    2 FLOPs per multiply-add; saves its input. Grouped convs call the per-group input channels "c"
    and the input tensor's channels "ci". The batch dimension must be named "n" (the cost model
    reads it).
  * BatchNorm: 5 FLOPs per element, 2 parameters per channel, saves its input.
  * LayerNorm / RMSNorm: 5 FLOPs per element, saves its input.
  * ReLU: 1 FLOP, saves a 1-byte mask; GELU: 8 FLOPs, saves its input; dropout (p > 0): 1 FLOP,
    saves a 1-byte mask (p = 0 records nothing: PyTorch returns the input).
  * MaxPool2d: input (n, k, hi, wi) -> (n, k, p, q), 1 FLOP per window element, saves its input and
    int64 argmax indices; average pools save nothing. A pool with stride > 1 ends a CNN stage.
  * Linear: leading dims keep the input's names, in-features take the input's last name, out-features
    are named `out_dim` (default: the module's attribute name, record.naming); saves its input.
  * Embedding: table (v, h) with output features named `out_dim` (default "h"); a gather, no FLOPs.
  * Fused (flash) attention: the zoo's op (dims b s t a g d q o kv, 4 FLOPs per (b, a, s, t, d)
    point, saves q, k, v and the fp32 log-sum-exp, selectively recomputable).
  * Cross-entropy: 4 FLOPs per logit, keeps fp32 logits; per-token logits (rank >= 3) move the
    Megatron fp32 multi-pass 30 bytes per logit, as the zoo's LM head does.
  * Residual add (and sub): 1 FLOP per element, saves nothing; mul/div save their operands.
A parameter read directly by forward (a learned position table) is counted by the op that reads it.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...errors import ConfigError
from ..ir import Op, OpKind, SavedTensor
from ..zoo.cnn import BN_FLOPS_PER_ELEM, LOSS_FLOPS_PER_ELEM
from ..zoo.transformer import LOSS_BYTES_PER_LOGIT, NORM_FLOPS_PER_ELEM
from .builder import GraphBuilder
from .naming import fresh, unique
from .tensor import ParamRef, SymTensor

ACTIVATIONS: dict[str, tuple[float, str, float]] = {
    # kind -> (FLOPs per element, saved tensor, bytes per saved element)
    "relu": (1.0, "mask", 1.0),
    "gelu": (8.0, "input", 2.0),
    "silu": (4.0, "input", 2.0),
    "sigmoid": (4.0, "output", 2.0),
    "tanh": (4.0, "output", 2.0),
}
BINARY_OPS = ("add", "sub", "mul", "div")


def _pair(v: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(v, int):
        return v, v
    a, b = tuple(v)
    return int(a), int(b)


def _need_rank(b: GraphBuilder, x: SymTensor, ranks: Sequence[int], what: str) -> None:
    if x.ndim not in ranks:
        raise ConfigError(f"trace.{b.where}", f"{what} needs a rank-{' or '.join(map(str, ranks))} input, got shape "
                          f"{x.shape}", "reshape the input first")


def pool_out(size: int, kernel: int, stride: int, pad: int, dilation: int = 1, ceil_mode: bool = False) -> int:
    """Output extent of a convolution or pool (PyTorch's formula, floor or ceil mode)."""
    span = size + 2 * pad - dilation * (kernel - 1) - 1
    out = (span + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def _spatial(b: GraphBuilder, what: str, hw: tuple[int, int], kernel: tuple[int, int], stride: tuple[int, int],
             pad: tuple[int, int], dilation: tuple[int, int], ceil_mode: bool = False) -> tuple[int, int]:
    out = tuple(pool_out(hw[i], kernel[i], stride[i], pad[i], dilation[i], ceil_mode) for i in range(2))
    if min(out) < 1:
        raise ConfigError(f"trace.{b.where}", f"input {hw[0]}x{hw[1]} is too small for the {what}'s kernel "
                          f"{kernel[0]}x{kernel[1]}", "use a larger input")
    return out[0], out[1]


# -- convolutional networks ----------------------------------------------------------------------------
def conv2d(b: GraphBuilder, x: SymTensor, out_channels: int, kernel: int | Sequence[int], weight: ParamRef,
           bias: ParamRef | None = None, stride: int | Sequence[int] = 1, padding: int | str | Sequence[int] = 0,
           dilation: int | Sequence[int] = 1, groups: int = 1) -> SymTensor:
    """nn.Conv2d over (n, c, hi, wi)."""
    _need_rank(b, x, (4,), "Conv2d")
    if x.names[0] != "n":
        raise ConfigError(f"trace.{b.where}", f"convolutions name the batch dimension 'n', this input calls it "
                          f"'{x.names[0]}'", "trace with batch_dim='n'")
    n, c, h, w = x.shape
    kr, ks = _pair(kernel)
    st, dl = _pair(stride), _pair(dilation)
    if isinstance(padding, str):
        if padding not in ("valid", "same"):
            raise ConfigError(f"trace.{b.where}", f"unknown padding '{padding}'", "use 'valid', 'same' or sizes")
        p, q = (h, w) if padding == "same" else _spatial(b, "convolution", (h, w), (kr, ks), st, (0, 0), dl)
    else:
        p, q = _spatial(b, "convolution", (h, w), (kr, ks), st, _pair(padding), dl)
    if c % groups or out_channels % groups:
        raise ConfigError(f"trace.{b.where}", f"groups={groups} does not divide {c} -> {out_channels} channels",
                          "use a divisor of both")
    dims = {"n": n, "k": out_channels, "c": c // groups, "p": p, "q": q, "r": kr, "s": ks, "hi": h, "wi": w}
    x_dims = ("n", "c", "hi", "wi")
    if groups != 1:
        dims["ci"] = c
        x_dims = ("n", "ci", "hi", "wi")
    op = Op("", OpKind.CONV, dims, (x_dims,), ("n", "k", "p", "q"), weight=("k", "c", "r", "s"),
            flop_dims=("n", "k", "c", "p", "q", "r", "s"), flops_per_point=2.0, saved=(SavedTensor("input", x_dims),))
    return b.record(op, [x], (n, out_channels, p, q), ("n", "k", "p", "q"), weight=weight,
                    extras=(bias,) if bias is not None else ())


def batch_norm(b: GraphBuilder, x: SymTensor, weight: ParamRef | None = None, bias: ParamRef | None = None) -> SymTensor:
    """Training-mode BatchNorm over channel dim 1: statistics, normalise, scale, shift; saves its input."""
    _need_rank(b, x, (2, 3, 4, 5), "BatchNorm")
    op = Op("", OpKind.NORM, x.sizes(), (x.names,), x.names, flops_per_point=BN_FLOPS_PER_ELEM,
            saved=(SavedTensor("input", x.names),))
    return b.record(op, [x], x.shape, x.names, extras=tuple(p for p in (weight, bias) if p is not None))


def _pool(b: GraphBuilder, x: SymTensor, kernel: int | Sequence[int], stride: int | Sequence[int] | None,
          padding: int | Sequence[int], dilation: int | Sequence[int], ceil_mode: bool, indices: bool) -> SymTensor:
    _need_rank(b, x, (4,), "pooling")
    n, k, h, w = x.shape
    kr, ks = _pair(kernel)
    st = _pair(stride) if stride is not None and stride != [] else (kr, ks)
    p, q = _spatial(b, "pool", (h, w), (kr, ks), st, _pair(padding), _pair(dilation), ceil_mode)
    bn = x.names[0]
    dims = {bn: n, "k": k, "hi": h, "wi": w, "p": p, "q": q, "r": kr, "s": ks}
    xin, out = (bn, "k", "hi", "wi"), (bn, "k", "p", "q")
    saved = (SavedTensor("input", xin), SavedTensor("indices", out, 8.0)) if indices else ()
    op = Op("", OpKind.POOL, dims, (xin,), out, flop_dims=(bn, "k", "p", "q", "r", "s"), flops_per_point=1.0,
            bwd_flops_factor=1.0, saved=saved)
    return b.record(op, [x], (n, k, p, q), out, ends_stage=max(st) > 1)


def max_pool2d(b: GraphBuilder, x: SymTensor, kernel: int | Sequence[int], stride: int | Sequence[int] | None = None,
               padding: int | Sequence[int] = 0, dilation: int | Sequence[int] = 1, ceil_mode: bool = False) -> SymTensor:
    """nn.MaxPool2d: saves its input and int64 indices (PyTorch's max_pool2d_with_indices)."""
    return _pool(b, x, kernel, stride, padding, dilation, ceil_mode, indices=True)


def avg_pool2d(b: GraphBuilder, x: SymTensor, kernel: int | Sequence[int], stride: int | Sequence[int] | None = None,
               padding: int | Sequence[int] = 0, ceil_mode: bool = False) -> SymTensor:
    """nn.AvgPool2d: backward needs only the shapes."""
    return _pool(b, x, kernel, stride, padding, 1, ceil_mode, indices=False)


def adaptive_avg_pool2d(b: GraphBuilder, x: SymTensor, output_size: int | Sequence[int | None]) -> SymTensor:
    """nn.AdaptiveAvgPool2d: one FLOP per input element, output (n, k, p, q) (1 x 1 for a classifier head)."""
    _need_rank(b, x, (4,), "AdaptiveAvgPool2d")
    n, k, h, w = x.shape
    sizes = (output_size, output_size) if isinstance(output_size, int) or output_size is None else tuple(output_size)
    p = h if sizes[0] is None else int(sizes[0])
    q = w if sizes[1] is None else int(sizes[1])
    bn = x.names[0]
    dims = {bn: n, "k": k, "hi": h, "wi": w, "p": p, "q": q}
    op = Op("", OpKind.POOL, dims, ((bn, "k", "hi", "wi"),), (bn, "k", "p", "q"), flop_dims=(bn, "k", "hi", "wi"),
            flops_per_point=1.0, bwd_flops_factor=1.0)
    return b.record(op, [x], (n, k, p, q), (bn, "k", "p", "q"))


# -- dense layers ----------------------------------------------------------------------------------------
def linear(b: GraphBuilder, x: SymTensor, out_features: int, weight: ParamRef, bias: ParamRef | None = None,
           out_dim: str | None = None) -> SymTensor:
    """nn.Linear on the last dimension; weight (out, in), bias follows the output features."""
    if x.ndim < 1 or x.shape[-1] != weight.shape[-1]:
        raise ConfigError(f"trace.{b.where}", f"Linear expects {weight.shape[-1]} input features, got shape {x.shape}",
                          "fix in_features or the input's shape")
    lead = x.names[:-1]
    out = b.feature_name(out_dim)
    if out in lead:
        out = fresh(out, x.names)
    inn = x.names[-1] if x.names[-1] != out else fresh(f"{out}_in", x.names)
    dims = {**dict(zip(lead, x.shape[:-1], strict=True)), inn: x.shape[-1], out: out_features}
    op = Op("", OpKind.MATMUL, dims, ((*lead, inn),), (*lead, out), weight=(out, inn), flops_per_point=2.0,
            saved=(SavedTensor("input", (*lead, inn)),))
    return b.record(op, [x], (*x.shape[:-1], out_features), (*lead, out), weight=weight,
                    extras=(bias,) if bias is not None else ())


def embedding(b: GraphBuilder, ids: SymTensor, num_embeddings: int, dim: int, weight: ParamRef,
              out_dim: str | None = "h") -> SymTensor:
    """nn.Embedding: a gather from table (v, h); memory-bound, one 'FLOP' per output element."""
    lead = ids.names
    h = fresh(out_dim or "h", lead)
    v = fresh("v", (*lead, h))
    dims = {**ids.sizes(), h: dim, v: num_embeddings}
    op = Op("", OpKind.EMBEDDING, dims, (lead,), (*lead, h), weight=(v, h), flop_dims=(*lead, h), flops_per_point=1.0)
    return b.record(op, [ids], (*ids.shape, dim), (*lead, h), weight=weight)


def layer_norm(b: GraphBuilder, x: SymTensor, weight: ParamRef | None = None, bias: ParamRef | None = None) -> SymTensor:
    """nn.LayerNorm / nn.RMSNorm over the trailing dims: saves its input."""
    op = Op("", OpKind.NORM, x.sizes(), (x.names,), x.names, flops_per_point=NORM_FLOPS_PER_ELEM,
            saved=(SavedTensor("input", x.names),))
    return b.record(op, [x], x.shape, x.names, extras=tuple(p for p in (weight, bias) if p is not None))


# -- elementwise -----------------------------------------------------------------------------------------
def activation(b: GraphBuilder, x: SymTensor, kind: str) -> SymTensor:
    """relu / gelu / silu / sigmoid / tanh (see ACTIVATIONS for FLOPs and what backward keeps)."""
    flops, saved, nbytes = ACTIVATIONS[kind]
    op = Op("", OpKind.ELEMENTWISE, x.sizes(), (x.names,), x.names, flops_per_point=flops,
            saved=(SavedTensor(saved, x.names, nbytes),))
    return b.record(op, [x], x.shape, x.names, name=None if b.leaf else kind)


def dropout(b: GraphBuilder, x: SymTensor, p: float) -> SymTensor:
    """Training-mode dropout: a 1-byte mask kept for backward; p = 0 is the identity."""
    if p <= 0.0:
        return x
    op = Op("", OpKind.ELEMENTWISE, x.sizes(), (x.names,), x.names, flops_per_point=1.0,
            saved=(SavedTensor("mask", x.names, 1.0),))
    return b.record(op, [x], x.shape, x.names, name=None if b.leaf else "dropout")


def _broadcast(b: GraphBuilder, shapes: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
    rank = max(len(s) for s in shapes)
    out = [1] * rank
    for s in shapes:
        for i, d in enumerate(s, rank - len(s)):
            if d != 1 and out[i] not in (1, d):
                raise ConfigError(f"trace.{b.where}", f"shapes {' and '.join(map(str, shapes))} do not broadcast",
                                  "fix the operands' shapes")
            out[i] = max(out[i], d)
    return tuple(out)


def binary(b: GraphBuilder, kind: str, x: SymTensor | float, y: SymTensor | float) -> SymTensor:
    """x + y, x - y, x * y, x / y with broadcasting; a parameter operand is counted, a scalar ignored."""
    tensors = [t for t in (x, y) if isinstance(t, SymTensor)]
    if not tensors:
        raise AssertionError("binary op without a tensor operand")
    shape = _broadcast(b, [t.shape for t in tensors])
    full = next((t for t in tensors if t.shape == shape and not t.is_param), None) or next(
        (t for t in tensors if t.shape == shape), None)
    if full is not None:
        names = full.names
    else:
        names = unique([next((t.names[i - (len(shape) - t.ndim)] for t in tensors
                              if i >= len(shape) - t.ndim and t.shape[i - (len(shape) - t.ndim)] == shape[i]), f"d{i}")
                        for i in range(len(shape))])
    reads = [t for t in tensors if not t.is_param]
    params = tuple(t.param for t in tensors if t.is_param and t.param is not None)
    ins = tuple(tuple(names[i + len(shape) - t.ndim] for i in range(t.ndim)
                      if t.shape[i] == shape[i + len(shape) - t.ndim]) for t in reads)
    saved = tuple(SavedTensor(f"operand{j}", dims) for j, dims in enumerate(ins)) if kind in ("mul", "div") else ()
    op = Op("", OpKind.ELEMENTWISE, dict(zip(names, shape, strict=True)), ins, names, flops_per_point=1.0, saved=saved)
    return b.record(op, reads, shape, names, extras=params, name=kind)


def cat(b: GraphBuilder, xs: Sequence[SymTensor], dim: int) -> SymTensor:
    """torch.cat: a copy into one tensor (memory-bound, no FLOPs); each input's slice of the
    concatenated dimension gets its own name."""
    first = xs[0]
    d = dim % first.ndim
    total = sum(x.shape[d] for x in xs)
    names = first.names
    dims = dict(zip(names, first.shape, strict=True))
    dims[names[d]] = total
    ins = []
    for x in xs:
        piece = fresh(f"{names[d]}_part", [*dims, *names])
        dims[piece] = x.shape[d]
        ins.append(tuple(piece if i == d else n for i, n in enumerate(names)))
    op = Op("", OpKind.ELEMENTWISE, dims, tuple(ins), names, flops_per_point=0.0)
    shape = tuple(total if i == d else s for i, s in enumerate(first.shape))
    return b.record(op, list(xs), shape, names, name="cat")


# -- attention and loss ----------------------------------------------------------------------------------
def attention(b: GraphBuilder, q: SymTensor, k: SymTensor, v: SymTensor, *, batch: int, seq_q: int, seq_k: int,
              heads: int, kv_heads: int, head_dim: int, causal: bool, batch_name: str = "b", seq_name: str = "s",
              heads_first: bool = False) -> SymTensor:
    """Fused (flash) attention core, the zoo's op. Output (b, s, o) with o = heads x head_dim, or
    (b, a, s, d) when `heads_first` (F.scaled_dot_product_attention's layout; merging a and d back
    gives "o")."""
    if heads % kv_heads:
        raise ConfigError(f"trace.{b.where}", f"{heads} query heads are not a multiple of {kv_heads} kv heads",
                          "use kv heads dividing the heads")
    bn = batch_name if batch_name not in ("t", "a", "g", "d", "q", "o", "kv") else "b"
    sn = seq_name if seq_name not in ("t", "a", "g", "d", "q", "o", "kv", bn) else "s"
    a, g, d = heads, kv_heads, head_dim
    core = {bn: batch, sn: seq_q, "t": seq_k, "a": a, "g": g, "d": d, "q": (a + 2 * g) * d, "o": a * d, "kv": g * d}
    op = Op("", OpKind.ATTENTION, core, ((bn, sn, "o"), (bn, "t", "kv"), (bn, "t", "kv")), (bn, sn, "o"),
            flop_dims=(bn, "a", sn, "t", "d"), flops_per_point=4.0, causal=causal,
            saved=(SavedTensor("q", (bn, sn, "o")), SavedTensor("kv", (bn, "t", "kv")), SavedTensor("kv2", (bn, "t", "kv")),
                   SavedTensor("lse", (bn, "a", sn), 4.0, selective_drop=True)),
            selective_recompute=True, bwd_flops_factor=2.0)
    if heads_first:
        b.views.register(("a", "d"), (a, d), "o")
        return b.record(op, [q, k, v], (batch, a, seq_q, d), (bn, "a", sn, "d"), name=None if b.leaf else "attention")
    return b.record(op, [q, k, v], (batch, seq_q, a * d), (bn, sn, "o"), name=None if b.leaf else "attention")


def cross_entropy(b: GraphBuilder, logits: SymTensor) -> SymTensor:
    """Softmax cross-entropy over the last dimension (targets are inputs: no cost). A flattened
    (b*s, v) view is costed over its original (b, s, v) dimensions so a batch split still applies."""
    names: list[str] = []
    shape: list[int] = []
    for n, s in zip(logits.names[:-1], logits.shape[:-1], strict=True):
        parts = b.views.parts(n)
        if parts is not None:
            names.extend(parts[0])
            shape.extend(parts[1])
        else:
            names.append(n)
            shape.append(s)
    names.append(logits.names[-1])
    shape.append(logits.shape[-1])
    names_t = unique(names)
    lm = len(names_t) >= 3
    op = Op("", OpKind.LOSS, dict(zip(names_t, shape, strict=True)), (names_t,), names_t[:-1], flop_dims=names_t,
            flops_per_point=LOSS_FLOPS_PER_ELEM, bytes_per_elem=LOSS_BYTES_PER_LOGIT / 2 if lm else 2.0,
            saved=(SavedTensor("logits", names_t, 4.0),), bwd_flops_factor=1.0)
    return b.record(op, [logits], tuple(shape[:-1]), names_t[:-1], name=None if b.leaf else "loss")
