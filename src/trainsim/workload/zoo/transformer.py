"""Transformer family builder: GPT-2/3 and Megatron configs, Llama 2/3/3.1, Mixtral MoE, BERT.

Dimension names used throughout (the strategy splits these by name):
  b batch, s sequence (query), t key/value sequence, h hidden, a heads, g kv heads, d head dim,
  q fused qkv features ((a + 2g) * d), o attention output features (a * d), f ffn features,
  f2 ffn-in features (2f for gated MLPs, else f), v vocabulary, e experts, c expert capacity.
Saved tensors follow Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models", section 4.1) so activation memory reproduces sbh(34 + 5as/h).

Architecture features (TransformerConfig.mlp / position / norm, and model.* of a job):
  mlp gelu: fc1 (h -> f), GeLU, fc2 (f -> h); swiglu: gated, fc1 (h -> 2f), SiLU x gate, fc2 (Llama);
  relu2: fc1, squared ReLU max(x, 0)^2, fc2 - non-gated like gelu, two matrices (Nemotron, Primer).
  position learned: a (positions x h) table added to the token embedding; rope: rotary q/k (an
  element-wise pass over q, k); alibi: no position parameters, a per-head linear bias added to the
  attention scores (BLOOM; Press et al. 2022) - inside a fused attention kernel it costs nothing
  measurable, unfused it is one element-wise pass over the (a x s x t) score matrix.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ...errors import ConfigError
from ...limits import MAX_FFN, MAX_HEADS, MAX_HIDDEN, MAX_LAYERS, MAX_SEQ_LEN, MAX_VOCAB
from ..ir import Layer, Model, Module, Op, OpKind, SavedTensor

NORM_FLOPS_PER_ELEM = 5.0  # mean, var, normalise, scale, shift
SOFTMAX_FLOPS_PER_ELEM = 5.0
LOSS_BYTES_PER_LOGIT = 30.0  # fp32 multi-pass cross-entropy (see _head)
ACT_FLOPS_PER_ELEM = {"gelu": 8.0, "swiglu": 6.0, "relu2": 2.0}  # tanh-GeLU; SiLU x gate; max then square
MLPS = tuple(ACT_FLOPS_PER_ELEM)
POSITIONS = ("learned", "rope", "alibi")
NORMS = ("layernorm", "rmsnorm")
LOSSES = ("upcast", "upcast_twice", "chunked")
CE_CHUNKS = 8
"""Chunks of torchtune's chunked cross-entropy (CEWithChunkedOutputLoss, num_output_chunks = 8)."""
SP_SAVES = ("shard", "gathered")
GLUS = ("fused", "unfused")
EXPERT_GEMMS = ("grouped", "per_expert")
"""How the routed experts' GEMMs launch (model.expert_gemm): one grouped kernel for all local experts (CUTLASS grouped
GEMM, torch._grouped_mm, Megatron's fused grouped MLP) or one GEMM per local expert (Transformer Engine's
GroupedLinear, Megatron-Core's TEGroupedMLP: a cuBLAS call per expert from a loop, each a launch the host issues)."""
EXPERT_ACTS = ("fused", "eager")
"""How the routed experts' activation and its weighting by the routing probabilities run (model.expert_act): one fused
kernel (Megatron's weighted SwiGLU / quick-GeGLU under --bias-swiglu-fusion, the Transformer Engine op fuser, a
grouped-MLP kernel) or Megatron-Core TEGroupedMLP's eager path (EXPERT_ACT_EAGER)."""
FEATURES = ("position", "mlp", "norm", "bias", "tied_embeddings", "dropout", "kernels", "loss", "sp_saves", "glu",
            "experts", "top_k", "head", "lora_rank", "lora_targets", "lora_base", "expert_ffn", "shared_expert_ffn",
            "first_dense_layers", "head_size", "qk_norm", "q_lora_rank", "kv_lora_rank", "qk_rope_dim", "v_head_size",
            "sliding_window", "window_layers", "attention_sinks", "mtp_layers", "layer_pattern", "mamba_heads",
            "mamba_head_dim", "mamba_state", "mamba_groups", "mamba_chunk", "moe_latent", "moe_imbalance",
            "moe_capacity_factor", "moe_pad_to_capacity", "expert_gemm", "expert_act", "moe_router_fusion",
            "rope_fusion")
"""TransformerConfig fields a job may override on any transformer (model.position, model.mlp, ...)."""


@dataclass(frozen=True)
class TransformerConfig:
    """Architecture of a decoder (or encoder) transformer; all sizes are global (unsharded)."""

    name: str
    family: str
    layers: int
    hidden: int
    heads: int
    ffn: int
    vocab: int
    seq_len: int
    kv_heads: int | None = None
    norm: str = "layernorm"  # layernorm | rmsnorm
    mlp: str = "gelu"  # gelu | swiglu | relu2 (squared ReLU, non-gated)
    position: str = "learned"  # learned | rope | alibi (bias on the attention scores, no parameters)
    bias: bool = True
    dropout: bool = True
    tied_embeddings: bool = True
    kernels: str = "fused"  # fused (Megatron / TE / torch.compile kernels) | eager (PyTorch eager op chains)
    # How the training framework stores tensors (activation memory; see _head, _mlp_ops, _attention_ops):
    loss: str = "upcast"  # upcast: one fp32 copy of the logits (Megatron) | upcast_twice: two (nanotron, fused CE)
    sp_saves: str = "shard"  # shard: SP keeps linear inputs sharded (Megatron) | gathered: whole (nanotron sync)
    glu: str | None = None  # fused: SwiGLU saves its input only | unfused: also silu's output; None: per kernels
    causal: bool = True
    head: str = "lm"  # lm: final norm, LM head and loss over the vocabulary | classifier: see _classifier_head
    experts: int = 0  # >0: every layer's MLP (but the first `first_dense_layers`) is a mixture of experts
    expert_ffn: int = 0  # each routed expert's features (0: ffn); ffn stays the dense layers' (Megatron's split)
    shared_expert_ffn: int = 0  # a shared expert every token also runs, of these features (0: none; DeepSeek)
    moe_latent: int = 0  # LatentMoE (Nemotron 3 Super): routed experts work in this width, tokens projected to it
    first_dense_layers: int = 0  # MoE models: the first layers keep a dense MLP of ffn features (DeepSeek-V3: 3)
    # LoRA fine-tuning: >0 freezes every parameter and adds rank-r adapters to `lora_targets`; lora_base "nf4" stores
    # the adapted matrices as 4-bit NormalFloat (QLoRA)
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = ("q", "v")
    lora_base: str = "bf16"
    top_k: int = 2
    # routed load (_expert_load): the busiest expert's tokens over the mean (1: balanced routing, what the published
    # benchmarks force with Megatron's --moe-router-force-load-balancing); every rank is priced as the busiest, which
    # the others wait for. moe_capacity_factor (Megatron --moe-expert-capacity-factor; 0: dropless) caps an expert at
    # that times the mean, the rest dropped; moe_pad_to_capacity (--moe-pad-expert-input-to-capacity) fills it up
    moe_imbalance: float = 1.0
    moe_capacity_factor: float = 0.0
    moe_pad_to_capacity: bool = False
    expert_gemm: str = "grouped"  # EXPERT_GEMMS: one grouped kernel, or one launch per local expert
    expert_act: str = "fused"  # EXPERT_ACTS: the experts' activation and probability weighting fused, or eager
    rope_fusion: bool = True  # Megatron --apply-rope-fusion: off, the rotary embedding runs as MEGATRON_UNFUSED_ROPE
    moe_router_fusion: bool = True  # Megatron --moe-router-fusion: the router's kernels (MOE_ROUTER_KERNELS)
    max_positions: int | None = None
    description: str = ""
    # Finer-grained features (imported Hugging Face configs); the defaults reproduce the built-in zoo.
    head_size: int | None = None  # explicit head dim when it is not hidden // heads (HF `head_dim`)
    qk_norm: bool = False  # an RMSNorm over each query and key head (head_dim weights each) before RoPE: Qwen3
    # multi-latent attention (DeepSeek-V2/V3, Kimi K2; _mla_ops): kv_lora_rank > 0 compresses keys and values to that
    # rank (and queries to q_lora_rank, 0: no query compression); head_size is a query/key head's size (no-RoPE
    # part + qk_rope_dim), v_head_size a value head's (None: head_size)
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_dim: int = 0
    v_head_size: int | None = None
    # sliding-window attention: each query attends to the last `sliding_window` keys (0: all) in every layer
    # (window_layers "all": Mistral) or every other one, from the first (window_layers "alternate": gpt-oss)
    sliding_window: int = 0
    window_layers: str = "all"
    attention_sinks: bool = False  # a learned logit per head in the softmax's denominator (gpt-oss): heads params
    mtp_layers: int = 0  # multi-token prediction modules after the blocks (DeepSeek-V3: 1; _mtp_layers)
    # hybrid models (Nemotron-H): one mixer per layer, by a pattern of M (Mamba2), * (attention), E (MoE MLP),
    # - (dense MLP); "" is the transformer's attention + MLP blocks. Mamba2 (_mamba2_ops): heads x head_dim
    # channels, a state of mamba_state per head in mamba_groups groups of B/C
    layer_pattern: str = ""
    mamba_heads: int = 0
    mamba_head_dim: int = 64
    mamba_state: int = 128
    mamba_groups: int = 8
    mamba_chunk: int = 256  # the SSD scan's chunk length (mamba_ssm's default 256; Nemotron-H's configs: 128)
    qkv_bias: bool | None = None  # None: follow `bias` (Qwen2 has q/k/v biases only)
    out_bias: bool | None = None  # attention output projection bias; None: follow `bias`
    mlp_bias: bool | None = None  # MLP / expert-free FFN biases; None: follow `bias`
    position_rows: int | None = None  # rows of the learned position table; None: seq_len rows
    token_types: int = 0  # BERT token-type (segment) embedding rows: parameters only
    assumptions: tuple[str, ...] = ()  # named approximations of the source architecture

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden // self.heads

    @property
    def has_qkv_bias(self) -> bool:
        return self.bias if self.qkv_bias is None else self.qkv_bias

    @property
    def has_out_bias(self) -> bool:
        return self.bias if self.out_bias is None else self.out_bias

    @property
    def has_mlp_bias(self) -> bool:
        return self.bias if self.mlp_bias is None else self.mlp_bias

    @property
    def kv(self) -> int:
        return self.kv_heads or self.heads

    @property
    def gated(self) -> bool:
        """A gated MLP (SwiGLU): fc1 makes value and gate, 2f features."""
        return self.mlp == "swiglu"

    @property
    def glu_unfused(self) -> bool:
        """SwiGLU runs as silu(gate) then a multiply (PyTorch eager, nanotron's GLUActivation), not one kernel."""
        return self.gated and (self.glu == "unfused" if self.glu is not None else self.kernels == "eager")


def _norm(name: str, cfg: TransformerConfig, b: int, s: int) -> Op:
    """LayerNorm / RMSNorm; a fused kernel saves its bf16 input (and per-row statistics, negligible).

    RMSNorm in PyTorch eager (Llama's, torchtune's and LitGPT's RMSNorm: x.float(), pow(2).mean, rsqrt,
    x * rsqrt, .type_as(x) or .to(dtype), * weight) leaves autograd two tensors per element: the fp32 copy that
    pow and x * rsqrt keep (4 bytes) and the bf16 normalised tensor the weight multiply keeps (2 bytes), not the
    2-byte input. (Casts save nothing; a multiply by a tensor that needs no gradient keeps only the other one.)"""
    dims = {"b": b, "s": s, "h": cfg.hidden}
    params = 2 * cfg.hidden if cfg.norm == "layernorm" else cfg.hidden
    saved = (SavedTensor("input", ("b", "s", "h")),)
    if cfg.kernels == "eager" and cfg.norm == "rmsnorm":
        saved = (SavedTensor("input_fp32", ("b", "s", "h"), 4.0), SavedTensor("normed", ("b", "s", "h"), 2.0))
    return Op(name, OpKind.NORM, dims, (("b", "s", "h"),), ("b", "s", "h"), extra_params=params,
              flops_per_point=NORM_FLOPS_PER_ELEM, saved=saved)


def _dropout_add(name: str, cfg: TransformerConfig, b: int, s: int) -> Op:
    dims = {"b": b, "s": s, "h": cfg.hidden}
    saved = (SavedTensor("mask", ("b", "s", "h"), 1.0),) if cfg.dropout else ()
    return Op(name, OpKind.ELEMENTWISE, dims, (("b", "s", "h"), ("b", "s", "h")), ("b", "s", "h"),
              flops_per_point=2.0, saved=saved, input_from=(None, "@skip"))


def _mla_ops(cfg: TransformerConfig, b: int, s: int, impl: str) -> list[Op]:
    """Multi-latent attention (DeepSeek-V2, arXiv:2405.04434, sec. 2.1; V3 and Kimi K2 keep it): the layer input is
    projected down to a query latent of q_lora_rank (normed, then up to heads x head_size) and to a key-value
    latent of kv_lora_rank plus one shared RoPE key of qk_rope_dim (the latent normed, then up to heads x (head_size
    - qk_rope_dim) keys and heads x v_head_size values); RoPE turns the rope part of each query and the shared key;
    attention runs over head_size query/key and v_head_size value dims; the output projection reads heads x
    v_head_size. The down projections are not split over tp (Megatron-Core keeps them 'duplicated'), the up
    projections split their heads as QKV does. The key-value down projection reads the layer input the query's
    keeps (saved once). A fused kernel does 2 x (head_size + v_head_size) FLOPs per score; the unfused chain
    (Megatron's attention-backend unfused) runs the same two batched GEMMs around a materialised softmax and keeps
    what its backward reads: each head's query and key (the shared rope key copied into every head), the values
    and the probabilities (`_mla_unfused_core`)."""
    a, h, dq, rope = cfg.heads, cfg.hidden, cfg.head_dim, cfg.qk_rope_dim
    dv = cfg.v_head_size or dq
    ql, kc = cfg.q_lora_rank, cfg.kv_lora_rank
    o, ko, vo, kl = a * dq, a * (dq - rope + dv), a * dv, kc + rope
    tok = {"b": b, "s": s, "h": h}
    norm_params = 2 if cfg.norm == "layernorm" else 1
    ops: list[Op] = []
    if ql:
        ops += [
            Op("q_down", OpKind.MATMUL, {**tok, "ql": ql}, (("b", "s", "h"),), ("b", "s", "ql"), weight=("ql", "h"),
               saved=(_linear_input(cfg, ("b", "s", "h")),)),
            Op("q_norm", OpKind.NORM, {"b": b, "s": s, "ql": ql}, (("b", "s", "ql"),), ("b", "s", "ql"),
               extra_params=norm_params * ql, flops_per_point=NORM_FLOPS_PER_ELEM,
               saved=(SavedTensor("input", ("b", "s", "ql")),)),
            Op("q_up", OpKind.MATMUL, {"b": b, "s": s, "ql": ql, "o": o}, (("b", "s", "ql"),), ("b", "s", "o"),
               weight=("o", "ql"), saved=(SavedTensor("input", ("b", "s", "ql")),)),
        ]
    else:
        ops.append(Op("q_proj", OpKind.MATMUL, {**tok, "o": o}, (("b", "s", "h"),), ("b", "s", "o"),
                      weight=("o", "h"), saved=(_linear_input(cfg, ("b", "s", "h")),)))
    ops += [
        Op("kv_down", OpKind.MATMUL, {**tok, "kl": kl}, (("b", "s", "h"),), ("b", "s", "kl"), weight=("kl", "h"),
           input_from=("ln1",)),
        Op("kv_norm", OpKind.NORM, {"b": b, "s": s, "kl": kl, "kc": kc}, (("b", "s", "kl"),), ("b", "s", "kc"),
           extra_params=norm_params * kc, flops_per_point=NORM_FLOPS_PER_ELEM,
           saved=(SavedTensor("input", ("b", "s", "kc")),)),
        Op("kv_up", OpKind.MATMUL, {"b": b, "s": s, "kc": kc, "kv": ko}, (("b", "s", "kc"),), ("b", "s", "kv"),
           weight=("kv", "kc"), saved=(SavedTensor("input", ("b", "s", "kc")),)),
        # RoPE on each query head's rope part and the one shared rope key (a few FLOPs per element turned)
        _rope_as_run(cfg, Op("rope", OpKind.ELEMENTWISE, {"b": b, "s": s, "o": o}, (("b", "s", "o"),), ("b", "s", "o"),
                             flops_per_point=3.0 * (a + 1) * rope / o, traffic=(a + 1) * rope / o,
                             input_from=("q_up" if ql else "q_proj",))),
    ]
    core = {"b": b, "s": s, "t": s, "a": a, "d": dq, "o": o, "kv": ko, "vo": vo}
    if impl == "unfused":
        ops += _mla_unfused_core(cfg, core, dq, dv, ko // a)
    else:
        # scores over head_size, values over v_head_size: 2 x (head_size + v_head_size) FLOPs per score; the
        # kernel keeps the queries, the keys (each head's no-RoPE part and the shared rope key) and the values
        ops.append(Op(
            "attention", OpKind.ATTENTION, core, (("b", "s", "o"), ("b", "t", "kv")), ("b", "s", "vo"),
            input_from=(None, "kv_up"), flop_dims=("b", "a", "s", "t", "d"), flops_per_point=2.0 * (dq + dv) / dq,
            causal=cfg.causal,
            saved=(SavedTensor("q", ("b", "s", "o")), SavedTensor("kv", ("b", "t", "kv"), 2.0 * (dq + dv) / (ko // a)),
                   SavedTensor("lse", ("b", "a", "s"), 4.0, selective_drop=True)),
            selective_recompute=True, bwd_flops_factor=2.0, kernel=impl))
    ops += [
        Op("proj", OpKind.MATMUL, {"b": b, "s": s, "vo": vo, "h": h}, (("b", "s", "vo"),), ("b", "s", "h"),
           weight=("h", "vo"), extra_params=h if cfg.has_out_bias else 0,
           saved=(SavedTensor("input", ("b", "s", "vo")),)),
    ]
    return ops


def _mla_unfused_core(cfg: TransformerConfig, core: dict[str, int], dq: int, dv: int, per_head: int) -> list[Op]:
    """Multi-latent attention's core on the unfused chain: scores (2 x head_size FLOPs each), the softmax (and
    dropout) over the materialised (a x s x t) matrix, the context (2 x v_head_size FLOPs per score). The key-value
    up projection's output holds `per_head` = head_size - qk_rope_dim + v_head_size values per head; the scores keep
    the queries and the heads' keys (head_size each, the rope key copied in), the context the probabilities and
    the values (v_head_size each)."""
    b, a, s = core["b"], core["a"], core["s"]
    probs = {"b": b, "a": a, "s": s, "t": s}
    ops = [
        Op("scores", OpKind.BMM, core, (("b", "s", "o"), ("b", "t", "kv")), ("b", "a", "s", "t"),
           input_from=(None, "kv_up"), flop_dims=("b", "a", "s", "t", "d"), flops_per_point=2.0, causal=cfg.causal,
           saved=(SavedTensor("q", ("b", "s", "o")), SavedTensor("k", ("b", "t", "kv"), 2.0 * dq / per_head)),
           selective_recompute=True),
        Op("softmax", OpKind.SOFTMAX, probs, (("b", "a", "s", "t"),), ("b", "a", "s", "t"),
           flops_per_point=SOFTMAX_FLOPS_PER_ELEM, causal=cfg.causal,
           saved=(SavedTensor("probs", ("b", "a", "s", "t"), 2.0, selective_drop=True),), selective_recompute=True),
    ]
    if cfg.dropout:
        ops.append(Op("attn_dropout", OpKind.ELEMENTWISE, probs, (("b", "a", "s", "t"),), ("b", "a", "s", "t"),
                      flops_per_point=1.0, saved=(SavedTensor("mask", ("b", "a", "s", "t"), 1.0, selective_drop=True),),
                      selective_recompute=True))
    ops.append(Op("context", OpKind.BMM, core, (("b", "a", "s", "t"), ("b", "t", "kv")), ("b", "s", "vo"),
                  input_from=(None, "kv_up"), flop_dims=("b", "a", "s", "t", "d"), flops_per_point=2.0 * dv / dq,
                  causal=cfg.causal,
                  saved=(*_dropped_probs(cfg), SavedTensor("v", ("b", "t", "kv"), 2.0 * dv / per_head)),
                  selective_recompute=True))
    return ops


def _dropped_probs(cfg: TransformerConfig) -> tuple[SavedTensor, ...]:
    """What the context GEMM keeps of the probabilities beside what the softmax keeps: with attention dropout its
    input is the dropout's output, a tensor of its own; without, it is the softmax's output, already kept (autograd
    saves one tensor once)."""
    return (SavedTensor("probs", ("b", "a", "s", "t"), 2.0, selective_drop=True),) if cfg.dropout else ()


def _attention_ops(cfg: TransformerConfig, b: int, s: int, impl: str, window: int = 0) -> list[Op]:
    """The attention of one block; `window`: its sliding window (keys per query, 0: all). A fused kernel
    computes only the scores inside the window (cost.compute.attention_score_share); the unfused chain masks
    the whole score matrix, at the whole cost. Attention sinks add one learned logit per head."""
    if cfg.kv_lora_rank:
        return _mla_ops(cfg, b, s, impl)
    a, g, d = cfg.heads, cfg.kv, cfg.head_dim
    sinks = a if cfg.attention_sinks else 0
    q, o, kv = (a + 2 * g) * d, a * d, g * d
    h = cfg.hidden
    ops = [
        Op("qkv", OpKind.MATMUL, {"b": b, "s": s, "h": h, "q": q}, (("b", "s", "h"),), ("b", "s", "q"),
           weight=("q", "h"), extra_params=q if cfg.has_qkv_bias else 0,
           saved=(_linear_input(cfg, ("b", "s", "h")),)),
    ]
    if cfg.qk_norm:
        ops.append(_qk_norm(cfg, b, s))
    if cfg.position == "rope":
        ops.append(_rope_as_run(cfg, Op("rope", OpKind.ELEMENTWISE, {"b": b, "s": s, "q": q}, (("b", "s", "q"),),
                                        ("b", "s", "q"), flops_per_point=3.0)))
    core = {"b": b, "s": s, "t": s, "a": a, "g": g, "d": d, "q": q, "o": o, "kv": kv}
    if impl != "unfused":
        ops.append(Op(
            "attention", OpKind.ATTENTION, core, (("b", "s", "o"), ("b", "t", "kv"), ("b", "t", "kv")),
            ("b", "s", "o"),
            flop_dims=("b", "a", "s", "t", "d"), flops_per_point=4.0, causal=cfg.causal,
            saved=(SavedTensor("q", ("b", "s", "o")), SavedTensor("kv", ("b", "t", "kv")),
                   SavedTensor("kv2", ("b", "t", "kv")),
                   SavedTensor("lse", ("b", "a", "s"), 4.0, selective_drop=True)),
            # Megatron-core's selective recompute checkpoints core attention with flash kernels too
            selective_recompute=True, bwd_flops_factor=2.0, kernel=impl, window=window, extra_params=sinks))
    else:
        ops += [
            Op("scores", OpKind.BMM, core, (("b", "s", "o"), ("b", "t", "kv")), ("b", "a", "s", "t"),
               flop_dims=("b", "a", "s", "t", "d"), flops_per_point=2.0, causal=cfg.causal,
               saved=(SavedTensor("q", ("b", "s", "o")), SavedTensor("k", ("b", "t", "kv"))),
               selective_recompute=True),
        ]
        if cfg.position == "alibi":  # scores + slope_a * (j - i): one add per score, nothing saved
            ops.append(Op("alibi", OpKind.ELEMENTWISE, {"b": b, "a": a, "s": s, "t": s}, (("b", "a", "s", "t"),),
                          ("b", "a", "s", "t"), flops_per_point=1.0, causal=cfg.causal, selective_recompute=True))
        ops += [
            Op("softmax", OpKind.SOFTMAX, {"b": b, "a": a, "s": s, "t": s}, (("b", "a", "s", "t"),),
               ("b", "a", "s", "t"), flops_per_point=SOFTMAX_FLOPS_PER_ELEM, causal=cfg.causal, extra_params=sinks,
               saved=(SavedTensor("probs", ("b", "a", "s", "t"), 2.0, selective_drop=True),),
               selective_recompute=True),
        ]
        if cfg.dropout:
            ops.append(Op("attn_dropout", OpKind.ELEMENTWISE, {"b": b, "a": a, "s": s, "t": s},
                          (("b", "a", "s", "t"),), ("b", "a", "s", "t"), flops_per_point=1.0,
                          saved=(SavedTensor("mask", ("b", "a", "s", "t"), 1.0, selective_drop=True),),
                          selective_recompute=True))
        qkv_src = "rope" if cfg.position == "rope" else "qkv"
        ops.append(Op("context", OpKind.BMM, core, (("b", "a", "s", "t"), ("b", "t", "kv")), ("b", "s", "o"),
                      input_from=(None, qkv_src),
                      flop_dims=("b", "a", "s", "t", "d"), flops_per_point=2.0, causal=cfg.causal,
                      saved=(*_dropped_probs(cfg), SavedTensor("v", ("b", "t", "kv"))),
                      selective_recompute=True))
    ops.append(Op("proj", OpKind.MATMUL, {"b": b, "s": s, "o": o, "h": h}, (("b", "s", "o"),),
                  ("b", "s", "h"), weight=("h", "o"), extra_params=h if cfg.has_out_bias else 0,
                  saved=(SavedTensor("input", ("b", "s", "o")),)))
    return ops


def _qk_norm(cfg: TransformerConfig, b: int, s: int) -> Op:
    """QK-norm (Qwen3's q_norm and k_norm; Megatron's qk-layernorm): the model's norm over each query and key
    head, one head_dim weight each (its bias too for LayerNorm), after the QKV projection. It reads the q and k
    heads of the QKV output: an op over that tensor (its "q" dimension, so it splits over tp with it) whose
    FLOPs, HBM traffic and saved input are scaled from all (heads + 2 kv heads) to the (heads + kv heads) it
    normalises; the kernel keeps its input as the model's other norms do."""
    a, g, d = cfg.heads, cfg.kv, cfg.head_dim
    share = (a + g) / (a + 2 * g)
    params = 2 * d * (2 if cfg.norm == "layernorm" else 1)
    return Op("qk_norm", OpKind.NORM, {"b": b, "s": s, "q": (a + 2 * g) * d}, (("b", "s", "q"),), ("b", "s", "q"),
              extra_params=params, flops_per_point=NORM_FLOPS_PER_ELEM * share, traffic=share,
              saved=(SavedTensor("input", ("b", "s", "q"), 2.0 * share),))


def _linear_input(cfg: TransformerConfig, dims: tuple[str, ...]) -> SavedTensor:
    """The input a column-parallel linear (QKV, fc1, LM head) keeps for its weight gradient. Megatron keeps
    the sequence-parallel shard and all-gathers it again in backward (Korthikanti et al. 2022, section 4.2.2);
    nanotron's synchronous REDUCE_SCATTER mode (tp_linear_async_communication false) all-gathers the input
    with a differentiable all-gather and calls F.linear on the whole tensor, which autograd keeps
    (nanotron/parallel/tensor_parallel/functional.py, column_linear): `sp_saves: gathered`."""
    return SavedTensor("input", dims, as_used=cfg.sp_saves == "gathered")


def _mlp_ops(cfg: TransformerConfig, b: int, s: int) -> list[Op]:
    h, f = cfg.hidden, cfg.ffn
    f2 = 2 * f if cfg.gated else f
    act_in = ("b", "s", "f2") if cfg.gated else ("b", "s", "f")
    act_dims = {"b": b, "s": s, "f": f, "f2": f2}
    act_saved: tuple[SavedTensor, ...] = (SavedTensor("input", act_in),)
    if cfg.glu_unfused:
        # silu(gate) * up as two ops: silu keeps its input (the gate), the multiply keeps both its operands, the
        # bf16 silu output (f per token) besides the up half: PyTorch eager SwiGLU (Llama's, torchtune's, LitGPT's
        # LLaMAMLP) and nanotron's GLUActivation (self.act(gate_states) * up_states)
        act_saved += (SavedTensor("silu_out", ("b", "s", "f")),)
    return [
        Op("fc1", OpKind.MATMUL, {"b": b, "s": s, "h": h, "f2": f2} if cfg.gated
           else {"b": b, "s": s, "h": h, "f": f}, (("b", "s", "h"),), act_in,
           weight=(act_in[-1], "h"), extra_params=f2 if cfg.has_mlp_bias else 0,
           saved=(_linear_input(cfg, ("b", "s", "h")),)),
        Op("act", OpKind.ELEMENTWISE, act_dims, (act_in,), ("b", "s", "f"),
           flops_per_point=ACT_FLOPS_PER_ELEM[cfg.mlp],
           saved=act_saved),
        Op("fc2", OpKind.MATMUL, {"b": b, "s": s, "f": f, "h": h}, (("b", "s", "f"),), ("b", "s", "h"),
           weight=("h", "f"), extra_params=h if cfg.has_mlp_bias else 0,
           saved=(SavedTensor("input", ("b", "s", "f")),)),
    ]


def _moe_ops(cfg: TransformerConfig, b: int, s: int) -> list[Op]:
    """Top-k routed experts: router GEMM, dispatch (all-to-all when e is split), expert MLPs, combine; then a
    shared expert (`shared_expert_ffn`), a dense MLP every token runs, added to the routed output. LatentMoE
    (`moe_latent`, Nemotron 3 Super; Megatron --moe-latent-size): the router reads the hidden state, the tokens are
    projected down to the latent width before dispatch, the experts work in it, and the combined output is
    projected back up; what crosses the all-to-all and the experts' weights shrink by latent / hidden."""
    f, e = cfg.expert_ffn or cfg.ffn, cfg.experts
    h = cfg.moe_latent or cfg.hidden  # the width the experts and the dispatch work in
    f2 = 2 * f if cfg.gated else f
    load = _expert_load(cfg)
    c = max(1, int(round(b * s * cfg.top_k * load / e)))
    useful = 1.0 if load == 1.0 else b * s * cfg.top_k / (c * e)  # the mean's share of the busiest expert's work
    tok = {"b": b, "s": s, "h": h}
    ex = {"e": e, "c": c, "h": h}
    per = "e" if cfg.expert_gemm == "per_expert" else ""
    router = MOE_ROUTER_KERNELS[cfg.moe_router_fusion]
    dispatch, combine = MOE_TOKEN_KERNELS["alltoall"]["dispatch"], MOE_TOKEN_KERNELS["alltoall"]["combine"]
    hid = {"b": b, "s": s, "h": cfg.hidden}
    latent_down = [Op("latent_down", OpKind.MATMUL, {**hid, "l": h}, (("b", "s", "h"),), ("b", "s", "l"),
                      weight=("l", "h"))] if cfg.moe_latent else []  # its input: the router's, which keeps it
    latent_up = [Op("latent_up", OpKind.MATMUL, {**hid, "l": h}, (("b", "s", "l"),), ("b", "s", "h"),
                    weight=("h", "l"), saved=(SavedTensor("input", ("b", "s", "l")),))] if cfg.moe_latent else []
    return [
        Op("router", OpKind.MATMUL, {**hid, "e": e}, (("b", "s", "h"),), ("b", "s", "e"),
           weight=("e", "h"), saved=(SavedTensor("input", ("b", "s", "h")),),
           side_kernels=(router[0] - 1, router[1] - 2)),
        *latent_down,
        Op("dispatch", OpKind.ROUTER, {**tok, "e": e, "c": c}, (("b", "s", "h"),), ("e", "c", "h"),
           flops_per_point=0.0, saved=(SavedTensor("routing", ("b", "s", "e"), 4.0),),
           side_kernels=(dispatch[0] - 1, dispatch[1] - 1)),
        Op("expert_fc1", OpKind.MATMUL, {**ex, "f2": f2}, (("e", "c", "h"),), ("e", "c", "f2"),
           weight=("e", "f2", "h"), saved=(SavedTensor("input", ("e", "c", "h")),), useful=useful, launch_per=per),
        _expert_act_op(cfg, e, c, f, f2),
        Op("expert_fc2", OpKind.MATMUL, {**ex, "f": f}, (("e", "c", "f"),), ("e", "c", "h"),
           weight=("e", "h", "f"), saved=(SavedTensor("input", ("e", "c", "f")),), useful=useful, launch_per=per),
        *_expert_bias_ops(cfg, ex),
        Op("combine", OpKind.ROUTER, {**tok, "e": e, "c": c}, (("e", "c", "h"),), ("b", "s", "h"),
           flops_per_point=0.0, side_kernels=(combine[0] - 1, combine[1] - 1)),
        *latent_up,
        *_shared_expert_ops(cfg, b, s),
    ]


def _rope_as_run(cfg: TransformerConfig, rope: Op) -> Op:
    """The rotary embedding as the framework runs it: one fused kernel, or (model.rope_fusion false) Megatron-Core's
    unfused chain (MEGATRON_UNFUSED_ROPE) on the same elements."""
    return rope if cfg.rope_fusion else _as_chain(rope, MEGATRON_UNFUSED_ROPE)


def _as_chain(op: Op, chain: tuple[float, int, tuple[int, int]]) -> Op:
    """The op run as an unfused chain of kernels: (its HBM bytes over the fused op's, its own launches a phase,
    (forward, backward) plain PyTorch calls beside them)."""
    traffic, launches, side = chain
    return replace(op, traffic=op.traffic * traffic, launches=launches, side_kernels=side)


def _expert_act_op(cfg: TransformerConfig, e: int, c: int, f: int, f2: int) -> Op:
    """The routed experts' activation, weighted by each token's routing probability: one fused kernel, or (model
    expert_act eager) Megatron-Core TEGroupedMLP's eager chain (EXPERT_ACT_EAGER), which also keeps the activation's
    output for the probabilities' gradient and holds the FP32 product while it runs."""
    dims = {"e": e, "c": c, "f": f, "f2": f2}
    saved = (SavedTensor("input", ("e", "c", "f2")),)
    op = Op("expert_act", OpKind.ELEMENTWISE, dims, (("e", "c", "f2"),), ("e", "c", "f"),
            flops_per_point=ACT_FLOPS_PER_ELEM[cfg.mlp], saved=saved)
    if cfg.expert_act != "eager":
        return op
    return replace(_as_chain(op, EXPERT_ACT_EAGER["gated" if cfg.gated else "plain"]),
                   saved=(*saved, SavedTensor("activation", ("e", "c", "f"))),
                   transient=(SavedTensor("fp32_product", ("e", "c", "f"), 4.0),))


def _expert_bias_ops(cfg: TransformerConfig, ex: dict[str, int]) -> list[Op]:
    """The eager per-expert chain that adds biased experts' output bias (EXPERT_BIAS_KERNELS), where the experts'
    GEMMs run one per local expert; none for bias-free experts or a fused grouped expert MLP. Its FP32 sums and their
    concatenation live only while it runs (transient, 8 bytes an element)."""
    if not (cfg.has_mlp_bias and cfg.expert_gemm == "per_expert"):
        return []
    own, per_expert = EXPERT_BIAS_KERNELS
    return [Op("expert_bias", OpKind.ELEMENTWISE, ex, (("e", "c", "h"),), ("e", "c", "h"), flops_per_point=2.0,
               traffic=EXPERT_BIAS_TRAFFIC, launches=own, side_kernels=per_expert, launch_per="e",
               transient=(SavedTensor("fp32_sums", ("e", "c", "h"), 8.0),))]


def _expert_load(cfg: TransformerConfig) -> float:
    """Tokens the busiest expert computes over the mean, tokens x top_k / experts: the imbalance, capped by a capacity
    factor (dropped beyond it), or the capacity itself where inputs are padded to it."""
    if not cfg.moe_capacity_factor:
        return cfg.moe_imbalance
    return cfg.moe_capacity_factor if cfg.moe_pad_to_capacity else min(cfg.moe_imbalance, cfg.moe_capacity_factor)


def _shared_expert_ops(cfg: TransformerConfig, b: int, s: int) -> list[Op]:
    """DeepSeek's shared expert (Megatron --moe-shared-expert-intermediate-size: all shared experts as one): a
    dense MLP of `shared_expert_ffn` features on every token, split over tp like the dense MLP, its output added
    to the routed experts'. Its input is the router's (the second norm's output), which the router already keeps,
    so its first matrix saves nothing of its own; it runs after the routed experts here (Megatron may overlap it
    with their dispatch)."""
    if not cfg.shared_expert_ffn:
        return []
    dense = _mlp_ops(replace(cfg, ffn=cfg.shared_expert_ffn), b, s)
    fc1, act, fc2 = (replace(op, name=f"shared_{op.name}") for op in dense)
    return [replace(fc1, saved=()), act, fc2,
            Op("shared_add", OpKind.ELEMENTWISE, {"b": b, "s": s, "h": cfg.hidden},
               (("b", "s", "h"), ("b", "s", "h")), ("b", "s", "h"), flops_per_point=1.0,
               input_from=(None, "latent_up" if cfg.moe_latent else "combine"))]


MAMBA_CONV = 4
"""Mamba2's depthwise causal convolution width (mamba_ssm's d_conv default)."""


def _mamba2_ops(cfg: TransformerConfig, b: int, s: int) -> list[Op]:
    """A Mamba2 mixer (Dao and Gu 2024, arXiv:2405.21060; mamba_ssm's Mamba2): one input projection to the gate z,
    the channels x, the B and C of `mamba_groups` groups of `mamba_state` and a step per head; a depthwise causal
    convolution of width 4 over x, B and C; the chunked SSD scan; an RMSNorm gated by z; the output projection.
    The scan's work per token and head channel: 2 Q (the chunk's causal mixing of its outputs, chunk length Q),
    4 N (its chunk states and their read-out) and 2 Q N G / (heads x head_dim) (the chunk's C B^T per group);
    its kernels (mamba_ssm's Triton chunk scan, `kernel="ssd"`) are priced at their measured throughput
    (cost.compute: ComputeParams.ssd_fp32_multiple_*). It keeps what mamba_ssm keeps: the projection's input, the
    convolution's, the scan's input and output, the norm's input and gate, the output projection's input; its chunk
    states are recomputed in backward. Heads (and every channel dimension) split over tp, as Megatron's Mamba does."""
    h, H, P, N, G = cfg.hidden, cfg.mamba_heads, cfg.mamba_head_dim, cfg.mamba_state, cfg.mamba_groups
    di = H * P
    mc = di + 2 * G * N  # x, B and C: what the convolution mixes
    mz = di + mc + H  # z, x, B, C and the step dt
    tok = {"b": b, "s": s}
    Q = cfg.mamba_chunk
    per_channel = 2 * Q + 4 * N + 2 * Q * N * G / di
    return [
        Op("in_proj", OpKind.MATMUL, {**tok, "h": h, "mz": mz}, (("b", "s", "h"),), ("b", "s", "mz"),
           weight=("mz", "h"), saved=(_linear_input(cfg, ("b", "s", "h")),)),
        Op("conv1d", OpKind.ELEMENTWISE, {**tok, "mz": mz, "mc": mc}, (("b", "s", "mz"),), ("b", "s", "mc"),
           extra_params=mc * (MAMBA_CONV + 1), flops_per_point=2.0 * MAMBA_CONV,
           saved=(SavedTensor("input", ("b", "s", "mc")),)),
        Op("ssd", OpKind.ATTENTION, {**tok, "t": Q, "hm": H, "p": P, "mc": mc, "md": di},
           (("b", "s", "mc"),), ("b", "s", "md"), flop_dims=("b", "s", "hm", "p"), flops_per_point=per_channel,
           extra_params=3 * H, bwd_flops_factor=2.0, kernel="ssd",  # dt bias, A and D per head
           saved=(SavedTensor("input", ("b", "s", "mc")), SavedTensor("out", ("b", "s", "md")))),
        Op("mamba_norm", OpKind.NORM, {**tok, "md": di}, (("b", "s", "md"),), ("b", "s", "md"), extra_params=di,
           flops_per_point=NORM_FLOPS_PER_ELEM + 2.0,
           saved=(SavedTensor("input", ("b", "s", "md")), SavedTensor("gate", ("b", "s", "md")))),
        Op("out_proj", OpKind.MATMUL, {**tok, "md": di, "h": h}, (("b", "s", "md"),), ("b", "s", "h"),
           weight=("h", "md"), saved=(SavedTensor("input", ("b", "s", "md")),)),
    ]


MOE_ROUTER_KERNELS = {True: (31, 10), False: (72, 23)}
"""CUDA kernels Megatron-Core's MoE router launches per layer, its gating GEMM included, (forward, backward), with and
without --moe-router-fusion (model.moe_router_fusion). Forward: NVIDIA's DeepSeek-V3 on GB200 guide (Megatron-LM
docs/discussions/deepseek-v3-gb200-optimization, sec. 2.1.4: score function, top-k and aux-loss statistics, 72 kernels
fused to 31 by Transformer Engine's router kernels). Backward: an estimate, as the guide counts the forward only: the
GEMM's two, the fused top-k, aux-loss score and aux-loss backward kernels and the elementwise chain between them (10);
unfused, the same share of its forward (23)."""

MEGATRON_UNFUSED_ROPE = (50.0 / 12.0, 6, (6, 1))
"""Megatron-Core's rotary embedding without --apply-rope-fusion (model.rope_fusion false;
megatron/core/models/common/embeddings/rope_utils.py, _apply_rotary_pos_emb_bshd): per query and key element, the
rotate-half's negation (2 bytes) and cat (4), the products with cos and sin (4 each), their sum (6) and the cat with
the unrotated part (4) forward, 24 bytes against the fused kernel's 4; backward the two products (4 each), the
negation (2), the chunk's cat (4), the two paths' sum (6) and the slice's copy (6), 26 against 8. Kernels: those 6 a
phase, plus forward 6 small ones making cos and sin (cos, sin, scale, cast) and backward one more (traffic over both
phases, the op's launches, (forward, backward) plain PyTorch calls beside them). Megatron-Bridge turns the fusion off
where position_embedding_type is not 'rope' (utils/fusions.py, validate_rope_fusion_compatibility): gpt-oss's 'yarn'."""

EXPERT_ACT_EAGER = {"plain": (56.0 / 12.0, 1, (2, 5)), "gated": (82.0 / 18.0, 1, (3, 7))}
"""The routed experts' activation where Megatron-Core's TEGroupedMLP cannot fuse it with the routing probabilities
(model.expert_act eager): outside its --bias-swiglu-fusion kernels, which take SwiGLU and quick-GeGLU only, TEGroupedMLP
(megatron/core/transformer/moe/experts.py, bias_act_func) runs the activation (squared ReLU is one torch.compile'd
kernel, megatron/core/activations.py), multiplies it by the FP32 probabilities (Nemotron-H's moe_router_dtype fp32:
an FP32 product) and casts the product back. Bytes per element of the activation's output: plain (squared ReLU,
GeLU) forward 4 + 6 + 6 (16) against the fused op's 4; backward the cast's 6, the input gradient (8 in FP32, 6 to
BF16), the probabilities' gradient (a product of 10 and its row sum of 4) and the activation's own 6 (40) against 8:
(traffic over both phases, the op's own launch, (forward, backward) plain PyTorch calls beside it). Gated (chunk,
activation, gate product, weighting, cast), 22 forward and 60 backward against 6 and 12."""

EXPERT_BIAS_TRAFFIC = 68.0 / 12.0
EXPERT_BIAS_KERNELS = (2, (2, 6))
"""The routed experts' output bias where the expert MLP is not one fused kernel (model.bias with expert_gemm
per_expert): Megatron-Core's TEGroupedMLP._apply_bias (megatron/core/transformer/moe/experts.py; NeMo AutoModel's
experts.py has the same function) adds each local expert's bias scaled by the FP32 routing probabilities in eager
PyTorch: per expert `t + b * p` on its slice, then one cat and one cast back to BF16. Bytes per element of the
[tokens, hidden] output: forward b * p writes 4, the add reads 2 + 4 and writes 4, the cat reads and writes 4, the cast
reads 4 and writes 2 (28); backward the cast's 6, the BF16 gradient of each slice 6, the two products for the bias
and probability gradients (8 each) and their sums (4 each), the split's cat 4 (40). Against a fused element-wise op's
4 and 8 bytes, one factor over both phases: EXPERT_BIAS_TRAFFIC. Kernels: the cat and the cast a phase (the op's own),
and per local expert 2 forward (mul, add) and 6 backward (the slice's cast, two products, two sums, the bias
gradient's cast), each a plain PyTorch call (Op.side_kernels, per local expert). Megatron's fused grouped MLP (the
Transformer Engine op fuser) adds the bias inside its GEMMs instead."""

MOE_TOKEN_KERNELS = {
    "alltoall": {"dispatch": (12, 2), "combine": (11, 3)},
    "local": {"dispatch": (6, 1), "combine": (6, 3)},
    "deepep": {"dispatch": (4, 1), "combine": (3, 2)},
}
"""CUDA kernels of Megatron-Core's token dispatcher per MoE layer, (forward, backward), the all-to-alls aside (priced as
collectives), read from its code path (megatron/core/transformer/moe/token_dispatcher.py, dropless, permute fusion on).
`alltoall` (MoEAlltoAllTokenDispatcher, EP > 1): dispatch = the preprocess's token counts and splits (sum, cast, the
split sums, the counts' all-gather over the EP group, a slice and three more sums: 8) and the fused permute (its
row-id map, 3, and the permute, 1); combine = the device-to-host copies of the counts and splits (5), the probs'
all-to-all, the chunk sort by local expert after the dispatch (2), the unsort before the combine (2) and the fused
unpermute. `local` (the same dispatcher without EP): no splits, no all-gather, one copy. `deepep` (flex dispatcher,
DeepEP / HybridEP): the guide above counts 17 kernels for router and preprocess together, as DeepEP's fused preprocess
kernel replaces the counts, splits and global permute: 13 router (18 fewer) and 4 dispatch here, the rest (a copy,
the permute after the dispatch and the unpermute) on the combine. The dispatch's kernels are what
--cuda-graph-scope moe_preprocess captures; the combine's (dynamic shapes: the copies, sorts and all-to-alls of a
dropless dispatch) stay eager."""

DEEPEP_ROUTER_SAVED = 18
"""Router kernels the flex dispatcher's fused preprocess takes over: the guide's 17 for router and preprocess together,
less the dispatch's 4 here, leave the fused router 13 of its 31."""


MOE_CHUNK_SORT_TRAFFIC = 4.0 / 3.0
"""Megatron-Core's all-to-all dispatcher with more than one local expert sorts the tokens it received by local expert
after the dispatch all-to-all and restores their order before the combine's (sort_chunks_by_idxs in
megatron/core/transformer/moe/token_dispatcher.py; one fused kernel each with permute fusion): a read and a write of
the dispatched tokens in the forward, and again for their gradients in the backward. The dispatch and combine ops
price their permute as tokens + dispatched elements moved forward and twice that backward (3 passes); the sorts add 2
dispatched elements forward and 2 backward, so their traffic grows by 4 / 3 x dispatched / (tokens + dispatched)."""


def as_dispatched(op: Op, dispatcher: str, ep: int) -> Op:
    """The op as its token dispatcher runs it (the model is built for Megatron-Core's all-to-all dispatcher with
    EP): the bookkeeping kernels it launches (fewer without EP, DeepEP's counts under the flex dispatcher) and, with
    EP and more than one local expert, the chunk sort's traffic (MOE_CHUNK_SORT_TRAFFIC)."""
    key = "deepep" if dispatcher != "alltoall" else "alltoall" if ep > 1 else "local"  # DeepEP's and HybridEP's alike
    if key == "alltoall" and op.name in ("dispatch", "combine") and op.dims["e"] // ep > 1:
        dispatched = op.dims["e"] * op.dims["c"]
        share = dispatched / (op.dims["b"] * op.dims["s"] + dispatched)
        return replace(op, traffic=op.traffic * (1.0 + MOE_CHUNK_SORT_TRAFFIC * share))
    if key == "alltoall" or op.name not in ("router", "dispatch", "combine"):
        return op
    if op.name == "router":
        if key != "deepep":
            return op
        return replace(op, side_kernels=(max(0, op.side_kernels[0] - DEEPEP_ROUTER_SAVED), op.side_kernels[1]))
    fwd, bwd = MOE_TOKEN_KERNELS[key][op.name]
    return replace(op, side_kernels=(fwd - 1, bwd - 1))


MOE_MODULES = {"ln2": "moe_router", "router": "moe_router", "latent_down": "moe_router", "shared_fc1": "moe_router",
               "shared_act": "moe_router", "shared_fc2": "moe_router", "dispatch": "moe_preprocess"}
"""Megatron-Core's CUDA-graph scopes over a MoE sublayer (--cuda-graph-scope): moe_router holds everything up to the
router (its pre-norm and, unless overlapped, the shared experts), moe_preprocess the dispatcher's preprocessing
(the routing's permutation here); the rest (all-to-alls, experts, combine) is the moe scope, whose dynamic shapes
only drop-and-pad routing can capture."""


def _in_module(ops: list[Op], module: str) -> list[Op]:
    """The ops tagged with the framework module they run in (Op.module; a MoE sublayer's ops by MOE_MODULES), an
    op already tagged keeping its own."""
    return [op if op.module else replace(op, module=MOE_MODULES.get(op.name, "moe") if module == "moe" else module)
            for op in ops]


def _pattern_block_ops(cfg: TransformerConfig, kind: str, b: int, s: int, impl: str) -> list[Op]:
    """One layer of a hybrid pattern: its pre-norm, its one mixer (M Mamba2, * attention, E MoE MLP, - dense MLP)
    and the residual add, tagged with the module they run in (the pre-norm of a MoE layer: its router's)."""
    mixer = {"M": lambda: _mamba2_ops(cfg, b, s), "*": lambda: _attention_ops(cfg, b, s, impl),
             "E": lambda: _moe_ops(cfg, b, s), "-": lambda: _mlp_ops(cfg, b, s)}[kind]()
    module = {"M": "mamba", "*": "attn", "E": "moe", "-": "mlp"}[kind]
    return [*_in_module([_norm("ln1", cfg, b, s)], "moe_router" if kind == "E" else module),
            *_in_module([*mixer, _dropout_add("mlp_residual", cfg, b, s)], module)]


def _block_ops(cfg: TransformerConfig, b: int, s: int, impl: str, moe: bool | None = None, window: int = 0
               ) -> list[Op]:
    """The ops of one transformer block (every block of a kind has the same ones: only the layer's name
    differs); `moe`: a mixture-of-experts block (default: whenever the model has experts); `window`: its
    attention's sliding window (0: none)."""
    moe = bool(cfg.experts) if moe is None else moe
    return [*_in_module([_norm("ln1", cfg, b, s), *_attention_ops(cfg, b, s, impl, window),
                         _dropout_add("attn_residual", cfg, b, s)], "attn"),
            *_in_module([_norm("ln2", cfg, b, s), *(_moe_ops(cfg, b, s) if moe else _mlp_ops(cfg, b, s)),
                         _dropout_add("mlp_residual", cfg, b, s)], "moe" if moe else "mlp")]


def _embedding(cfg: TransformerConfig, b: int, s: int) -> Layer:
    h, v = cfg.hidden, cfg.vocab
    pos = (cfg.position_rows or cfg.seq_len) * h if cfg.position == "learned" else 0
    pos += cfg.token_types * h
    ops = [Op("embed", OpKind.EMBEDDING, {"b": b, "s": s, "h": h, "v": v}, (("b", "s"),), ("b", "s", "h"),
              weight=("v", "h"), extra_params=pos, flop_dims=("b", "s", "h"), flops_per_point=1.0)]
    if cfg.dropout:
        ops.append(Op("embed_dropout", OpKind.ELEMENTWISE, {"b": b, "s": s, "h": h}, (("b", "s", "h"),),
                      ("b", "s", "h"), flops_per_point=1.0, saved=(SavedTensor("mask", ("b", "s", "h"), 1.0),)))
    return Layer("embedding", "embedding", ops)


def _head(cfg: TransformerConfig, b: int, s: int) -> Layer:
    h, v = cfg.hidden, cfg.vocab
    ops = [
        _norm("final_norm", cfg, b, s),
        Op("lm_head", OpKind.MATMUL, {"b": b, "s": s, "h": h, "v": v}, (("b", "s", "h"),), ("b", "s", "v"),
           weight=("v", "h"), saved=(_linear_input(cfg, ("b", "s", "h")),)),
        # Megatron's vocab-parallel cross-entropy upcasts the logits to fp32 and makes about five
        # passes over them (cast, max, subtract, exp, sum; the backward: softmax - one-hot, scale,
        # cast back): ~30 bytes per logit forward, twice that backward, not a single 2-byte read.
        Op("loss", OpKind.LOSS, {"b": b, "s": s, "v": v}, (("b", "s", "v"),), ("b", "s"),
           flop_dims=("b", "s", "v"), flops_per_point=4.0, bytes_per_elem=LOSS_BYTES_PER_LOGIT / 2,
           saved=(SavedTensor("logits", ("b", "s", "v"), 2.0 if cfg.loss == "chunked" else 4.0),),
           bwd_flops_factor=1.0, transient=_loss_temporaries(cfg)),
    ]
    tied = cfg.tied_embeddings
    return Layer("head", "head", ops, tied_to="embedding" if tied else None, tied_op="lm_head" if tied else None)


def _mtp_layers(cfg: TransformerConfig, b: int, s: int, impl: str) -> list[Layer]:
    """Multi-token prediction (DeepSeek-V3, arXiv:2412.19437, sec. 2.2; Megatron --mtp-num-layers), one module
    per depth on the last pipeline stage: the tokens one further ahead embedded with the main embedding's
    weight (a copy where the embedding lives on another stage, its gradient summed with it), that embedding and
    the hidden state normed, their concatenation projected from 2 x hidden to hidden, one more block (a MoE
    block in a MoE model) and the output head and loss again, with the main head's weight. Each module is two
    layers: the embedding lookup (its own layer, for its weight's tie) and the rest. They run after the blocks
    and before the main head: the same work as Megatron's order (its head runs first), on the same stage."""
    h, v = cfg.hidden, cfg.vocab
    head_tie = "embedding" if cfg.tied_embeddings else "head"
    out: list[Layer] = []
    for k in range(cfg.mtp_layers):
        embed = Op("mtp_embed", OpKind.EMBEDDING, {"b": b, "s": s, "h": h, "v": v}, (("b", "s"),), ("b", "s", "h"),
                   weight=("v", "h"), flop_dims=("b", "s", "h"), flops_per_point=1.0)
        out.append(Layer(f"mtp.{k}.embed", "mtp_embedding", [embed], tied_to="embedding", tied_op="mtp_embed"))
        head = {op.name: op for op in _head(cfg, b, s).ops}
        ops = [_norm("mtp_enorm", cfg, b, s), _norm("mtp_hnorm", cfg, b, s),
               Op("mtp_concat", OpKind.ELEMENTWISE, {"b": b, "s": s, "h": h, "h2": 2 * h}, (("b", "s", "h"),),
                  ("b", "s", "h2"), flops_per_point=0.0),
               Op("eh_proj", OpKind.MATMUL, {"b": b, "s": s, "h2": 2 * h, "h": h}, (("b", "s", "h2"),),
                  ("b", "s", "h"), weight=("h", "h2"), saved=(_linear_input(cfg, ("b", "s", "h2")),)),
               *_block_ops(cfg, b, s, impl),
               replace(head["final_norm"], name="mtp_final_norm"), replace(head["lm_head"], name="mtp_lm_head"),
               replace(head["loss"], name="mtp_loss")]
        out.append(Layer(f"mtp.{k}", "mtp", ops, tied_to=head_tie, tied_op="mtp_lm_head"))
    return out


CLASSIFIER_LABELS = 2
"""Labels of the sequence-classification head: transformers' PretrainedConfig.num_labels default (2), which
AutoModelForSequenceClassification keeps unless num_labels is given."""
HEADS = ("lm", "classifier")


def _classifier_head(cfg: TransformerConfig, b: int, s: int) -> Layer:
    """BERT's sequence-classification head (transformers BertForSequenceClassification): BertPooler takes the
    first token's hidden state, a dense h x h layer and tanh; dropout; a linear classifier to the labels; the
    cross-entropy over b x labels. No final norm (post-LN BERT's blocks end in their own LayerNorm) and no
    vocabulary logits. Next to the encoder it is tiny: h*h + h + (h + 1) * labels parameters (1.05M of
    bert-large's 335M) and a few b x h tensors saved (the pooler's input rows, tanh's output, the dropout mask
    and the classifier's input).

    The (h + 1) x labels classifier is carried as extra parameters of the pooler, its saved input on the last
    element-wise op, and its 2*b*h*labels FLOPs are left out: a b x labels GEMM is one launch-bound kernel,
    which the GEMM efficiency curve (cost/compute.py, tiles of 128 x 128) would price at its tile-filling
    worst."""
    h, n = cfg.hidden, CLASSIFIER_LABELS
    classifier_input = SavedTensor("classifier_input", ("b", "p"))
    ops = [
        Op("pooler", OpKind.MATMUL, {"b": b, "s": s, "h": h, "p": h}, (("b", "s", "h"),), ("b", "p"),
           weight=("p", "h"), extra_params=h + (h + 1) * n, flop_dims=("b", "h", "p"),
           saved=(SavedTensor("input", ("b", "h")),)),
        Op("pooler_act", OpKind.ELEMENTWISE, {"b": b, "p": h}, (("b", "p"),), ("b", "p"), flops_per_point=4.0,
           saved=(SavedTensor("output", ("b", "p")),) + (() if cfg.dropout else (classifier_input,))),
    ]
    if cfg.dropout:
        ops.append(Op("pooler_dropout", OpKind.ELEMENTWISE, {"b": b, "p": h}, (("b", "p"),), ("b", "p"),
                      flops_per_point=1.0, saved=(SavedTensor("mask", ("b", "p"), 1.0), classifier_input)))
    ops.append(Op("loss", OpKind.LOSS, {"b": b, "p": h, "n": n}, (("b", "p"),), ("b",), flop_dims=("b", "n"),
                  flops_per_point=4.0, saved=(SavedTensor("logits", ("b", "n"), 4.0),), bwd_flops_factor=1.0))
    return Layer("head", "head", ops)


def _lora(op: Op, cfg: TransformerConfig) -> Op:
    """An op of a LoRA fine-tune (Hu et al. 2021; torchtune's LoRA recipes): every parameter frozen, rank-r
    adapters (A: in x r, B: r x out) on the targeted matrices, and under QLoRA (lora_base nf4) those matrices
    stored as NF4. Targets (model.lora_targets): q, k, v, o (the attention's projections; the fused qkv matrix
    is adapted per part), mlp (the dense MLP's matrices; the gated fc1 holds two; a MoE's experts stay frozen,
    unadapted) and output (the LM head), as torchtune's lora_attn_modules and apply_lora_to_mlp/_output.
    The adapters' GEMMs (2 r (in + out) FLOPs per token each way, a few percent of the frozen GEMM at r 64) and
    the NF4 dequantisation are not priced; what each op saves for backward is as in full training."""
    r, h, t = cfg.lora_rank, cfg.hidden, set(cfg.lora_targets)
    q_out, kv_out = cfg.heads * cfg.head_dim, cfg.kv * cfg.head_dim
    parts: list[tuple[int, int]] = []  # adapted matrices: (in, out)
    total_out = 0
    if op.name == "qkv":
        total_out = q_out + 2 * kv_out
        parts = [(h, out) for name, out in (("q", q_out), ("k", kv_out), ("v", kv_out)) if name in t]
    elif op.name == "proj" and "o" in t:
        parts, total_out = [(q_out, h)], h
    elif op.name == "fc1" and "mlp" in t:
        total_out = op.dims.get("f2", op.dims.get("f", 0))
        parts = [(h, cfg.ffn)] * (2 if cfg.gated else 1)
    elif op.name == "fc2" and "mlp" in t:
        parts, total_out = [(cfg.ffn, h)], h
    elif op.name == "lm_head" and "output" in t:
        parts, total_out = [(h, cfg.vocab)], cfg.vocab
    adapters = sum(r * (i + o) for i, o in parts)
    nf4 = sum(o for _, o in parts) / total_out if parts and cfg.lora_base == "nf4" else 0.0
    return replace(op, frozen=True, adapter_params=adapters, nf4_fraction=nf4)


def _loss_temporaries(cfg: TransformerConfig) -> tuple[SavedTensor, ...]:
    """What the cross-entropy holds at its peak beside the fp32 softmax it saves (4 bytes per logit).

    upcast (Megatron's vocab_parallel_cross_entropy, megatron/core/tensor_parallel/cross_entropy.py): the bf16
    logits the LM head made stay referenced by the caller while `.float()` makes the fp32 copy, which the loss
    then works on in place (subtract max, exp into itself, divide) and saves: +2 bytes per logit; the backward
    turns the saved softmax into the fp32 gradient in place and casts it to a bf16 gradient: 4 + 2 again.
    upcast_twice: a second fp32 tensor beside the first, +6 bytes: nanotron's sharded_cross_entropy (called
    with dtype=torch.float: `.to(float)`, then `sharded_logits - logits_max` out of place) and Megatron's
    fused cross-entropy (--cross-entropy-loss-fusion: its jit-fused functions return exp_logits as a new
    tensor next to the fp32 copy instead of overwriting it), and PyTorch eager F.cross_entropy(logits.float())
    (the fp32 copy beside the log_softmax output it saves).
    chunked: torchtune's CEWithChunkedOutputLoss (compiled): the bf16 logits, made chunk by chunk, are what the
    loss keeps (2 bytes per logit; the softmax is recomputed from them in backward), and only one chunk at a time
    is upcast to fp32 (4 / CE_CHUNKS bytes per logit)."""
    if cfg.loss == "chunked":
        return (SavedTensor("chunk_fp32", ("b", "s", "v"), 4.0 / CE_CHUNKS),)
    temps = (SavedTensor("logits_bf16", ("b", "s", "v"), 2.0),)
    if cfg.loss == "upcast_twice":
        temps += (SavedTensor("logits_fp32_copy", ("b", "s", "v"), 4.0),)
    return temps


# PyTorch eager (no torch.compile, no fused kernels): an op of the fused model that eager PyTorch runs as a
# chain of element-wise kernels -> (HBM bytes / the fused op's bytes, kernels per phase), counted from the
# eager code: RMSNorm x.float(), pow(2), mean, +eps, rsqrt, x * r, .to(bf16), * weight (36 bytes per element
# against the fused kernel's 4); SwiGLU silu(gate) then * up (10 against 6 bytes per output element);
# rotary embedding x.float() as complex, * freqs, .type_as (20 against 4); cross-entropy logits.float(),
# log_softmax, nll (14 against 2 bytes per logit). LayerNorm, GeLU, residual adds and dropout are single
# kernels in eager PyTorch too.
EAGER_CHAINS = {"rmsnorm": (9.0, 8), "swiglu": (10.0 / 6.0, 2), "rope": (5.0, 3), "loss": (7.0, 3)}
KERNELS = ("fused", "eager")


def _eager(op: Op, cfg: TransformerConfig) -> Op:
    """The op as eager PyTorch runs it (more HBM traffic, more launches), or unchanged."""
    key = ("rmsnorm" if op.kind == OpKind.NORM and cfg.norm == "rmsnorm" else
           "swiglu" if op.name in ("act", "expert_act") and cfg.mlp == "swiglu" else
           "rope" if op.name == "rope" and cfg.rope_fusion else "loss" if op.kind == OpKind.LOSS else None)
    if key is None:
        return op
    scale, launches = EAGER_CHAINS[key]
    return replace(op, traffic=op.traffic * scale, launches=launches)  # an op's own share (qk_norm) stays


WINDOW_LAYERS = ("all", "alternate")
"""Which blocks a sliding window applies to: all (Mistral) or every other one from the first (gpt-oss)."""


def _check_features(cfg: TransformerConfig) -> None:
    """mlp / position / norm must be ones the builder knows (a config from Python is not schema-checked)."""
    for key, value, known in (("mlp", cfg.mlp, MLPS), ("position", cfg.position, POSITIONS),
                              ("norm", cfg.norm, NORMS), ("kernels", cfg.kernels, KERNELS),
                              ("loss", cfg.loss, LOSSES), ("sp_saves", cfg.sp_saves, SP_SAVES),
                              ("glu", cfg.glu or "fused", GLUS), ("head", cfg.head, HEADS),
                              ("window_layers", cfg.window_layers, WINDOW_LAYERS),
                              ("expert_gemm", cfg.expert_gemm, EXPERT_GEMMS),
                              ("expert_act", cfg.expert_act, EXPERT_ACTS)):
        if value not in known:
            raise ConfigError(f"model.{key}", f"unknown {key} '{value}' for {cfg.name or 'the model'}",
                              f"use one of {', '.join(known)}")


def _check_size(cfg: TransformerConfig, seq_len: int) -> None:
    """The work bounds of trainsim.limits for a config from any source (built-in, --hf-config, Python)."""
    for key, value, limit in (("layers", cfg.layers, MAX_LAYERS), ("hidden", cfg.hidden, MAX_HIDDEN),
                              ("heads", cfg.heads, MAX_HEADS), ("kv_heads", cfg.kv, MAX_HEADS),
                              ("ffn", cfg.ffn, MAX_FFN), ("vocab", cfg.vocab, MAX_VOCAB),
                              ("seq_len", seq_len, MAX_SEQ_LEN)):
        if value > limit:
            raise ConfigError(f"model.{key}", f"{cfg.name or 'the model'} has {key} = {value:,}, above the limit of "
                              f"{limit:,}", f"use a smaller model.{key} (or the matching Hugging Face config key)")


def build_transformer(cfg: TransformerConfig, batch: int, seq_len: int | None = None,
                      attention: str = "flash") -> Model:
    """Instantiate the module tree for `batch` sequences of `seq_len` tokens."""
    s = seq_len or cfg.seq_len
    _check_features(cfg)
    _check_size(cfg, s)
    if cfg.position == "learned" and cfg.max_positions and s > cfg.max_positions:
        raise ValueError(f"seq_len {s} exceeds {cfg.name}'s {cfg.max_positions} learned positions")
    cfg_s = replace(cfg, seq_len=s)
    embedding = _embedding(cfg_s, batch, s)
    head = _classifier_head(cfg_s, batch, s) if cfg.head == "classifier" else _head(cfg_s, batch, s)
    # One block's ops, built once: ops are frozen values, so every block's own list holds the same objects
    # (the blocks differ only by name; lowering and costing key ops by value or per layer anyway).
    # a block's kind: (dense MLP (a MoE model's first layers), windowed attention); built once per kind
    dense = cfg.first_dense_layers if cfg.experts else 0  # fewer than the layers (zoo._check_heads)
    windowed = [bool(cfg.sliding_window) and (cfg.window_layers == "all" or i % 2 == 0) for i in range(cfg.layers)]
    kind_of: list[tuple[bool, bool] | str] = (list(cfg.layer_pattern) if cfg.layer_pattern else
                                               [(i < dense, windowed[i]) for i in range(cfg.layers)])
    keys = list(dict.fromkeys(kind_of))
    kinds = [_pattern_block_ops(cfg_s, key, batch, s, attention) if isinstance(key, str) else
             _block_ops(cfg_s, batch, s, attention, moe=None if not key[0] else False,
                        window=cfg.sliding_window if key[1] else 0) for key in keys]
    mtp = _mtp_layers(cfg_s, batch, s, attention)
    if cfg.kernels == "eager":
        kinds = [[_eager(op, cfg) for op in ops] for ops in kinds]
        for layer in (embedding, head, *mtp):
            layer.ops = [_eager(op, cfg) for op in layer.ops]
    if cfg.lora_rank:
        kinds = [[_lora(op, cfg) for op in ops] for ops in kinds]
        for layer in (embedding, head, *mtp):
            layer.ops = [_lora(op, cfg) for op in layer.ops]
    blocks: list[Module | Layer] = [Layer(f"layers.{i}", "transformer", list(kinds[keys.index(kind_of[i])]))
                                    for i in range(cfg.layers)]
    root = Module(cfg.name, [embedding, Module("layers", blocks), *mtp, head])
    return Model(cfg.name, cfg.family, root, seq_len=s, description=cfg.description,
                 assumptions=cfg.assumptions, hyper={
        "layers": cfg.layers, "hidden": cfg.hidden, "heads": cfg.heads, "kv_heads": cfg.kv,
        "ffn": cfg.ffn, "vocab": cfg.vocab, "experts": cfg.experts, "top_k": cfg.top_k if cfg.experts else 0,
        "expert_ffn": (cfg.expert_ffn or cfg.ffn) if cfg.experts else 0, "shared_expert_ffn": cfg.shared_expert_ffn,
        "first_dense_layers": dense, "attention": attention, "mtp_layers": cfg.mtp_layers,
        "moe_padded": bool(cfg.experts and cfg.moe_pad_to_capacity)})


def _gpt(name: str, layers: int, hidden: int, heads: int, vocab: int = 50257, seq: int = 2048,
         desc: str = "") -> TransformerConfig:
    return TransformerConfig(name, "gpt", layers, hidden, heads, 4 * hidden, vocab, seq,
                             max_positions=seq, description=desc)


def _llama(name: str, layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int, seq: int,
           desc: str, family: str = "llama", **kw: int | float | str | bool) -> TransformerConfig:
    return TransformerConfig(name, family, layers, hidden, heads, ffn, vocab, seq, kv_heads=kv,  # type: ignore[arg-type]
                             norm="rmsnorm", mlp="swiglu", position="rope", bias=False, dropout=False,
                             tied_embeddings=False, description=desc, **kw)


_MLA = {"head_size": 192, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_rope_dim": 64, "v_head_size": 128}
"""DeepSeek-V3's (and Kimi K2's) multi-latent attention: query and key-value ranks, decoupled RoPE dims."""
_NANO_PATTERN = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"
"""Nemotron 3 Nano's 52 layers: 23 Mamba2 mixers, 23 MoE MLPs, 6 attention layers (its hybrid_override_pattern)."""
SUPER_PATTERN = "MEMEMEM*EMEMEMEM*EMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEM*EMEMEMEME"
"""Nemotron 3 Super's 88 layers: 40 Mamba2 mixers, 40 LatentMoE MLPs, attention at 7, 16, 25, 36, 47, 58, 69 and 78
(the --hybrid-override-pattern of public Megatron launch scripts for NVIDIA-Nemotron-3-Super-120B-A12B, the same as
its checkpoint's layers_block_type as quoted in public conversion tests)."""
_LLAMA4 = {"head_size": 128, "top_k": 1, "expert_ffn": 8192, "shared_expert_ffn": 8192}
"""Llama 4's text model (meta-llama Llama-4-Scout-17B-16E / Maverick-17B-128E text_config): GQA 40 heads of 128 over
8 kv heads, one routed expert of 8192 per token beside a shared expert of 8192."""


_MEG = "Megatron-LM SC'21 Table 1 (Narayanan et al.), vocab 51200"
TRANSFORMERS: dict[str, TransformerConfig] = {c.name: c for c in [
    _gpt("gpt2", 12, 768, 12, seq=1024, desc="GPT-2 small 124M (Radford et al. 2019)"),
    _gpt("gpt2-medium", 24, 1024, 16, seq=1024, desc="GPT-2 medium 355M"),
    _gpt("gpt2-large", 36, 1280, 20, seq=1024, desc="GPT-2 large 774M"),
    _gpt("gpt2-xl", 48, 1600, 16, seq=1024,
         desc="GPT-2 XL 1.5B with 16 heads as in Proteus' gpt-1.5b (HF uses 25; same params and FLOPs)"),
    _gpt("gpt2-proteus", 12, 768, 12, vocab=40478, seq=1024,
         desc="GPT-2 as defined in Proteus' code (12 layers, 768 hidden, vocab 40478)"),
    _gpt("gpt3-125m", 12, 768, 12, desc="GPT-3 Small (Brown et al. 2020, Table 2.1)"),
    _gpt("gpt3-350m", 24, 1024, 16, desc="GPT-3 Medium"),
    _gpt("gpt3-760m", 24, 1536, 16, desc="GPT-3 Large"),
    _gpt("gpt3-1.3b", 24, 2048, 16, desc="GPT-3 XL"),
    _gpt("gpt3-2.7b", 32, 2560, 32, desc="GPT-3 2.7B"),
    _gpt("gpt3-6.7b", 32, 4096, 32, desc="GPT-3 6.7B"),
    _gpt("gpt3-13b", 40, 5120, 40, desc="GPT-3 13B"),
    _gpt("gpt3-175b", 96, 12288, 96, desc="GPT-3 175B (Brown et al. 2020)"),
    _gpt("megatron-1.7b", 24, 2304, 24, 51200, desc=_MEG),
    _gpt("megatron-3.6b", 30, 3072, 32, 51200, desc=_MEG),
    _gpt("megatron-7.5b", 36, 4096, 32, 51200, desc=_MEG),
    _gpt("megatron-18.4b", 40, 6144, 48, 51200, desc=_MEG),
    _gpt("megatron-39.1b", 48, 8192, 64, 51200, desc=_MEG),
    _gpt("megatron-76.1b", 60, 10240, 80, 51200, desc=_MEG),
    _gpt("megatron-145.6b", 80, 12288, 96, 51200, desc=_MEG),
    _gpt("megatron-310.1b", 96, 16384, 128, 51200, desc=_MEG),
    _gpt("megatron-529.6b", 105, 20480, 128, 51200, desc=_MEG),
    _gpt("megatron-1t", 128, 25600, 160, 51200, desc=_MEG),
    _llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096, "Llama 2 7B (Touvron et al. 2023)"),
    _llama("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096, "Llama 2 13B"),
    _llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096, "Llama 2 70B (GQA 8 kv heads)"),
    _llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, "Llama 3 8B (Meta 2024)"),
    _llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192, "Llama 3 70B"),
    _llama("llama3.1-8b", 32, 4096, 32, 8, 14336, 128256, 8192, "Llama 3.1 8B (128k context; default seq 8192)"),
    _llama("llama3.1-70b", 80, 8192, 64, 8, 28672, 128256, 8192, "Llama 3.1 70B"),
    _llama("llama3.1-405b", 126, 16384, 128, 8, 53248, 128256, 8192, "Llama 3.1 405B (Dubey et al. 2024)"),
    _llama("llama3-405b", 126, 16384, 128, 8, 53248, 128256, 8192, "alias of llama3.1-405b"),
    _llama("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, 4096, "Mixtral 8x7B: 8 experts, top-2 (Jiang et al. 2024)",
           experts=8, top_k=2),
    _llama("mixtral-8x22b", 56, 6144, 48, 8, 16384, 32768, 4096, "Mixtral 8x22B: 8 experts, top-2",
           experts=8, top_k=2),
    # the MoE families of issue 23, each as its published config.json (tests/data/hf) at a 4096-token training length
    _llama("deepseek-v3", 61, 7168, 128, 128, 18432, 129280, 4096,
           "DeepSeek-V3 671B-A37B (arXiv 2412.19437): MLA, 256 routed experts of 2048 top-8 + 1 shared, "
           "first 3 layers dense, 1 MTP module", family="deepseek", experts=256, top_k=8, expert_ffn=2048,
           shared_expert_ffn=2048, first_dense_layers=3, mtp_layers=1, **_MLA),
    _llama("kimi-k2", 61, 7168, 64, 64, 18432, 163840, 4096,
           "Kimi K2 1.04T-A32B (Moonshot AI): DeepSeek-V3's layers with 64 heads, 384 routed experts top-8 + 1 "
           "shared, first layer dense, no MTP", family="deepseek", experts=384, top_k=8, expert_ffn=2048,
           shared_expert_ffn=2048, first_dense_layers=1, **_MLA),
    _llama("qwen3-30b-a3b", 48, 2048, 32, 4, 6144, 151936, 4096,
           "Qwen3-30B-A3B (Qwen 2025): 128 experts of 768 top-8, QK-norm, head size 128", family="qwen",
           head_size=128, qk_norm=True, experts=128, top_k=8, expert_ffn=768),
    _llama("qwen3-235b-a22b", 94, 4096, 64, 4, 12288, 151936, 4096,
           "Qwen3-235B-A22B: 128 experts of 1536 top-8, QK-norm, head size 128", family="qwen",
           head_size=128, qk_norm=True, experts=128, top_k=8, expert_ffn=1536),
    _llama("gpt-oss-120b", 36, 2880, 64, 8, 2880, 201088, 4096,
           "gpt-oss-120b (OpenAI 2025): 128 experts of 2880 top-4, sliding window 128 on every other layer, "
           "attention sinks, biased attention", family="gpt-oss", head_size=64, experts=128, top_k=4,
           expert_ffn=2880, sliding_window=128, window_layers="alternate", attention_sinks=True, qkv_bias=True,
           out_bias=True, mlp_bias=False),
    _llama("gpt-oss-20b", 24, 2880, 64, 8, 2880, 201088, 4096,
           "gpt-oss-20b: gpt-oss-120b's layers, 24 of them, 32 experts top-4", family="gpt-oss", head_size=64,
           experts=32, top_k=4, expert_ffn=2880, sliding_window=128, window_layers="alternate",
           attention_sinks=True, qkv_bias=True, out_bias=True, mlp_bias=False),
    replace(_llama("nemotron-3-nano", 52, 2688, 32, 2, 1856, 131072, 8192,
                   "Nemotron 3 Nano 31.6B-A3.6B (NVIDIA 2025): hybrid Mamba2 + MoE (128 experts of 1856 top-6 + a "
                   "shared 3712, squared ReLU), 6 attention layers", family="nemotron", head_size=128, experts=128,
                   top_k=6, expert_ffn=1856, shared_expert_ffn=3712, layer_pattern=_NANO_PATTERN, mamba_heads=64,
                   mamba_head_dim=64, mamba_state=128, mamba_groups=8, mamba_chunk=128), mlp="relu2"),
    replace(_llama("nemotron-3-super", 88, 4096, 32, 2, 2688, 131072, 8192,
                   "Nemotron 3 Super 120.7B-A12.8B (NVIDIA 2026): hybrid Mamba2 + LatentMoE (512 experts of 2688 "
                   "top-22 in a 1024 latent + a shared 5376, squared ReLU), 8 attention layers, 1 MTP module",
                   family="nemotron", head_size=128, experts=512, top_k=22, expert_ffn=2688, shared_expert_ffn=5376,
                   moe_latent=1024, layer_pattern=SUPER_PATTERN, mamba_heads=128, mamba_head_dim=64, mamba_state=128,
                   mamba_groups=8, mamba_chunk=128, mtp_layers=1), mlp="relu2"),
    _llama("llama4-scout", 48, 5120, 40, 8, 8192, 202048, 8192,
           "Llama 4 Scout 107.8B-A17B text model (Meta 2025): 16 experts top-1 + a shared expert on every layer, "
           "QK-norm (the vision tower not modelled)", family="llama4", experts=16, qk_norm=True, **_LLAMA4),
    _llama("llama4-maverick", 96, 5120, 40, 8, 16384, 202048, 8192,
           "Llama 4 Maverick 400.7B-A17.2B text model (Meta 2025): 128 experts top-1 + a shared expert on every "
           "other layer, dense MLPs of 16384 between (the vision tower not modelled)", family="llama4", experts=128,
           layer_pattern="*-*E" * 24, **_LLAMA4),
    TransformerConfig("bert-base", "bert", 12, 768, 12, 3072, 30522, 512, causal=False, max_positions=512,
                      description="BERT-base 110M (Devlin et al. 2019), encoder, seq 512"),
    TransformerConfig("bert-large", "bert", 24, 1024, 16, 4096, 30522, 512, causal=False, max_positions=512,
                      description="BERT-large 340M, encoder, seq 512"),
]}
