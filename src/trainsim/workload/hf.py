"""Import a local Hugging Face `config.json` (nothing is downloaded) as a trainsim transformer.

One reader per `model_type` maps every field the IR can represent onto a TransformerConfig.
What the IR cannot represent and that changes FLOPs, parameters or memory is never dropped
silently: it is named in the config's `assumptions` (and so in the model's description).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..files import load_json
from .ir import Model
from .zoo.transformer import TransformerConfig, build_transformer

FIELD = "model.hf_config"
GELU_ACTS = frozenset({"gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "gelu_python", "gelu_accurate",
                       "quick_gelu"})
ARCH_PREFIXES = (("Qwen3Moe", "qwen3_moe"), ("Qwen3", "qwen3"), ("Qwen2Moe", "qwen2_moe"), ("Qwen2", "qwen2"),
                 ("DeepseekV3", "deepseek_v3"), ("GptOss", "gpt_oss"), ("NemotronH", "nemotron_h"), ("Llama4", "llama4"),
                 ("Mixtral", "mixtral"), ("Mistral", "mistral"), ("Llama", "llama"), ("GPTNeoX", "gpt_neox"), ("GPT2", "gpt2"),
                 ("Bert", "bert"))
UNSUPPORTED_WHY: dict[str, str] = {}
OVERRIDABLE = ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab")
_MISSING = object()


@dataclass
class _Fields:
    """A config.json's top-level object plus its path, with typed getters that fail with a named key."""

    path: Path
    data: dict[str, Any]
    notes: list[str] = field(default_factory=list)  # informational: no effect on the cost
    assumptions: list[str] = field(default_factory=list)  # named approximations that do affect it

    def _error(self, key: str, problem: str, fix: str) -> ConfigError:
        return ConfigError(f"hf_config.{key}", f"{problem} in {self.path}", fix)

    def get(self, key: str, default: Any = _MISSING) -> Any:
        value = self.data.get(key)
        if value is None:
            if default is _MISSING:
                raise self._error(key, "missing", f"add \"{key}\" (the published config.json of this model "
                                  "states it)")
            return default
        return value

    def positive_int(self, key: str, default: Any = _MISSING, *, alias: str | None = None) -> int:
        if alias is not None and self.data.get(key) is None and self.data.get(alias) is not None:
            key = alias
        value = self.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self._error(key, f"must be a positive integer, got {value!r}", "fix the value")
        return value

    def max_probability(self, *keys: str) -> float:
        """The largest of the dropout probabilities stated under `keys` (absent: 0)."""
        out = 0.0
        for key in keys:
            value = self.data.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
                raise self._error(key, f"must be a probability in [0, 1), got {value!r}", "fix the value")
            out = max(out, float(value))
        return out

    def _typed(self, key: str, default: Any, kind: type, what: str) -> Any:
        value = self.data.get(key)
        if value is None:
            return default
        if not isinstance(value, kind):
            raise self._error(key, f"must be {what}, got {value!r}", "fix the value")
        return value

    def boolean(self, key: str, default: bool) -> bool:
        return bool(self._typed(key, default, bool, "true or false"))

    def string(self, key: str, default: str) -> str:
        return str(self._typed(key, default, str, "a string"))

    def architecture(self) -> str | None:
        archs = self.data.get("architectures")
        if isinstance(archs, list) and archs and isinstance(archs[0], str):
            return archs[0]
        return None


def read_hf_json(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """Read a config.json (or a directory holding one) into its top-level JSON object."""
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "config.json"
    data = load_json(p, FIELD, what="Hugging Face config.json",
                     fix="pass the path of a local Hugging Face config.json (nothing is downloaded)")
    if not isinstance(data, dict):
        raise ConfigError(FIELD, f"{p} holds a JSON {type(data).__name__}, not an object",
                          "pass a Hugging Face config.json") from None
    return p, data


def _model_type(f: _Fields) -> str:
    mt = f.data.get("model_type")
    if mt is None:
        arch = f.architecture() or ""
        mt = next((t for prefix, t in ARCH_PREFIXES if arch.startswith(prefix)), None)
        if mt is None:
            raise f._error("model_type", "missing (and no known \"architectures\" entry)",
                           f"add \"model_type\": one of {', '.join(READERS)}")
    if not isinstance(mt, str):
        raise f._error("model_type", f"must be a string, got {mt!r}", f"use one of {', '.join(READERS)}")
    if mt not in READERS:
        why = f" ({UNSUPPORTED_WHY[mt]})" if mt in UNSUPPORTED_WHY else ""
        raise f._error("model_type", f"'{mt}' is not supported{why}",
                       f"use a config whose model_type is one of {', '.join(READERS)}")
    return mt


def _head_size(f: _Fields, hidden: int, heads: int) -> int | None:
    """An explicit `head_dim` only where it differs from hidden // heads (Mistral NeMo: 128 vs 160)."""
    if f.data.get("head_dim") is None:
        return None
    d = f.positive_int("head_dim")
    return None if hidden % heads == 0 and d == hidden // heads else d


def _lm_head_note(f: _Fields, mt: str) -> None:
    arch = f.architecture()
    if arch is None:
        f.assumptions.append(f"no \"architectures\": trained as a {mt} language model with an LM head over the "
                             "vocabulary")
    elif not arch.endswith(("ForCausalLM", "LMHeadModel", "ForMaskedLM", "ForPreTraining")):
        f.assumptions.append(f"{arch} is modelled with an LM head and cross-entropy over the vocabulary "
                             "(its task head is smaller)")


def _dropout(f: _Fields, *keys: str) -> bool:
    """Dropout on (the IR has one switch for every site) when any stated probability is > 0."""
    probs = {k: f.max_probability(k) for k in keys if f.data.get(k) is not None}
    on = [k for k, v in probs.items() if v > 0]
    if on and len(on) < len(probs):
        f.assumptions.append(f"dropout modelled at every site although only {', '.join(on)} > 0")
    return bool(on)


def _rope_notes(f: _Fields) -> None:
    scaling = f.data.get("rope_scaling")
    if scaling is not None and not isinstance(scaling, dict):
        raise f._error("rope_scaling", f"must be an object or null, got {scaling!r}", "fix the value")
    theta = f.data.get("rope_theta")
    if theta is not None:
        f.notes.append(f"rope_theta {theta:.10g}" if isinstance(theta, int | float) else f"rope_theta {theta!r}")
    if scaling:
        kind = scaling.get("rope_type") or scaling.get("type") or "?"
        f.notes.append(f"rope_scaling {kind} x{scaling.get('factor', '?')} (no effect on FLOPs, parameters "
                       "or memory)")


def _sliding_window(f: _Fields, active: bool) -> int:
    """The sliding window every layer's attention keeps (Mistral), 0 where none is active."""
    window = f.data.get("sliding_window")
    if active and window is not None:
        window = f.positive_int("sliding_window")
        f.notes.append(f"sliding_window {window} on every layer (fused kernels compute only the scores in it)")
        return int(window)
    return 0


def _llama_like(f: _Fields, mt: str) -> TransformerConfig:
    """Llama 1/2/3/3.1, Mistral, Mixtral and Qwen2: RMSNorm, SwiGLU, RoPE, GQA, untied by default."""
    layers, hidden = f.positive_int("num_hidden_layers"), f.positive_int("hidden_size")
    heads = f.positive_int("num_attention_heads")
    kv = f.positive_int("num_key_value_heads", heads)
    act = f.string("hidden_act", "silu")
    if act != "silu":
        f.assumptions.append(f"gated MLP activation {act} costed as SiLU (elementwise only)")
    attn_bias = f.boolean("attention_bias", False)
    qkv_bias = True if mt == "qwen2" else attn_bias  # Qwen2 hard-codes q/k/v biases, no o_proj bias
    _rope_notes(f)
    window = _sliding_window(f, mt != "qwen2" or f.boolean("use_sliding_window", False))
    experts, top_k = 0, 2
    if mt == "mixtral":
        experts, top_k = f.positive_int("num_local_experts"), f.positive_int("num_experts_per_tok")
        if top_k > experts:
            raise f._error("num_experts_per_tok", f"{top_k} exceeds num_local_experts {experts}",
                           "route each token to at most num_local_experts experts")
        f.assumptions.append("expert load assumed balanced (capacity factor 1.0, no dropped tokens)")
    _lm_head_note(f, mt)
    seq = f.positive_int("max_position_embeddings")
    ffn, vocab = f.positive_int("intermediate_size"), f.positive_int("vocab_size")
    return TransformerConfig(
        "", "llama", layers, hidden, heads, ffn, vocab, seq,
        kv_heads=kv, norm="rmsnorm", mlp="swiglu", position="rope", bias=False,
        dropout=_dropout(f, "attention_dropout"), tied_embeddings=f.boolean("tie_word_embeddings", False),
        experts=experts, top_k=top_k, max_positions=seq, head_size=_head_size(f, hidden, heads),
        qkv_bias=qkv_bias, out_bias=attn_bias, mlp_bias=f.boolean("mlp_bias", False), sliding_window=window)


def _experts(f: _Fields, experts_key: str) -> tuple[int, int]:
    """A MoE config's routed experts and experts per token (checked against each other)."""
    experts, top_k = f.positive_int(experts_key), f.positive_int("num_experts_per_tok")
    if top_k > experts:
        raise f._error("num_experts_per_tok", f"{top_k} exceeds {experts_key} {experts}",
                       f"route each token to at most {experts_key} experts")
    f.assumptions.append("expert load assumed balanced (capacity factor 1.0, no dropped tokens)")
    return experts, top_k


def _qwen_moe_layers(f: _Fields) -> None:
    """Qwen MoE's decoder_sparse_step / mlp_only_layers: every layer routed is what trainsim builds."""
    step = f.data.get("decoder_sparse_step", 1)
    dense = f.data.get("mlp_only_layers") or []
    if step != 1 or dense:
        raise f._error("decoder_sparse_step" if step != 1 else "mlp_only_layers",
                       f"MoE on every {step} layer(s), dense layers {dense}: trainsim routes every layer",
                       "use a config whose every layer is a mixture of experts")


def _qwen3(f: _Fields, mt: str) -> TransformerConfig:
    """Qwen3 and Qwen3-MoE: the Llama layout with an RMSNorm over each query and key head (q_norm, k_norm) and
    an explicit head_dim; qwen3_moe routes every layer (moe_intermediate_size per expert); qwen2_moe too,
    beside a shared expert (shared_expert_intermediate_size, its sigmoid gate's h parameters not counted)."""
    base = _llama_like(f, "qwen2" if mt == "qwen2_moe" else "llama")
    hidden, heads = base.hidden, base.heads
    extra: dict[str, Any] = {"head_size": f.positive_int("head_dim") if mt != "qwen2_moe" else base.head_size,
                             "qk_norm": mt != "qwen2_moe"}
    if extra["head_size"] is not None and hidden % heads == 0 and extra["head_size"] == hidden // heads:
        extra["head_size"] = None
    if mt in ("qwen3_moe", "qwen2_moe"):
        _qwen_moe_layers(f)
        experts, top_k = _experts(f, "num_experts")
        extra.update(experts=experts, top_k=top_k, expert_ffn=f.positive_int("moe_intermediate_size"))
        if mt == "qwen2_moe":
            extra["shared_expert_ffn"] = f.positive_int("shared_expert_intermediate_size")
            f.assumptions.append("the shared expert's sigmoid gate (hidden parameters per layer) not counted")
    return replace(base, family="qwen", **extra)


def _deepseek_v3(f: _Fields, mt: str) -> TransformerConfig:
    """DeepSeek-V3 (and Kimi K2, which keeps its layout): multi-latent attention, first_k_dense_replace dense
    layers, then routed experts (moe_intermediate_size) beside n_shared_experts shared ones, and
    num_nextn_predict_layers multi-token-prediction modules; grouped sigmoid routing priced as top-k."""
    layers, hidden = f.positive_int("num_hidden_layers"), f.positive_int("hidden_size")
    heads = f.positive_int("num_attention_heads")
    nope, rope, dv = (f.positive_int("qk_nope_head_dim"), f.positive_int("qk_rope_head_dim"),
                      f.positive_int("v_head_dim"))
    experts, top_k = _experts(f, "n_routed_experts")
    width = f.positive_int("moe_intermediate_size")
    shared = f.data.get("n_shared_experts") or 0
    freq = f.data.get("moe_layer_freq", 1)
    if freq != 1:
        raise f._error("moe_layer_freq", f"MoE every {freq} layers: trainsim routes every layer after the dense ones",
                       "use a config with moe_layer_freq 1")
    dense = f.data.get("first_k_dense_replace", 0)
    if not isinstance(dense, int) or isinstance(dense, bool) or not 0 <= dense < layers:
        raise f._error("first_k_dense_replace", f"must be 0 .. {layers - 1}, got {dense!r}", "fix the value")
    q_rank = f.data.get("q_lora_rank") or 0
    if f.data.get("topk_method") not in (None, "greedy") or f.data.get("scoring_func") not in (None, "softmax"):
        f.notes.append(f"routing {f.data.get('scoring_func', 'softmax')} / {f.data.get('topk_method', 'greedy')} "
                       "(group-limited) priced as plain top-k on balanced load")
    _rope_notes(f)
    _lm_head_note(f, mt)
    seq = f.positive_int("max_position_embeddings")
    return TransformerConfig(
        "", "deepseek", layers, hidden, heads, f.positive_int("intermediate_size"), f.positive_int("vocab_size"), seq,
        kv_heads=heads, norm="rmsnorm", mlp="swiglu", position="rope", bias=False, dropout=False,
        tied_embeddings=f.boolean("tie_word_embeddings", False), max_positions=seq, experts=experts, top_k=top_k,
        expert_ffn=width, shared_expert_ffn=int(shared) * width, first_dense_layers=dense,
        head_size=nope + rope, qk_rope_dim=rope, v_head_size=dv, kv_lora_rank=f.positive_int("kv_lora_rank"),
        q_lora_rank=int(q_rank), mtp_layers=int(f.data.get("num_nextn_predict_layers") or 0))


def _gpt_oss(f: _Fields, mt: str) -> TransformerConfig:
    """gpt-oss: the Llama layout with biased attention projections, an attention-sink logit per head, sliding-
    window and full attention alternating (layer_types), and routed experts of intermediate_size (their clamped
    SwiGLU priced as SwiGLU, their biases not counted)."""
    base = _llama_like(f, "llama")
    f.notes[:] = [n for n in f.notes if not n.startswith("sliding_window")]  # alternating, below
    experts, top_k = _experts(f, "num_local_experts")
    kinds = f.data.get("layer_types") or []
    window = f.positive_int("sliding_window")
    alternate = all(k == "sliding_attention" for k in kinds[::2]) and all(k == "full_attention" for k in kinds[1::2])
    if kinds and not alternate:
        raise f._error("layer_types", "not sliding and full attention alternating from the first layer",
                       "use a config whose layer_types alternate sliding_attention, full_attention")
    f.assumptions.append("the experts' clamped SwiGLU priced as SwiGLU; expert and router biases not counted")
    return replace(base, family="gpt-oss", experts=experts, top_k=top_k, expert_ffn=base.ffn,
                   sliding_window=window, window_layers="alternate", attention_sinks=True,
                   qkv_bias=f.boolean("attention_bias", True), out_bias=f.boolean("attention_bias", True))


_BLOCK_LETTERS = {"mamba": "M", "attention": "*", "full_attention": "*", "moe": "E", "mlp": "-"}
"""Nemotron-H's layers_block_type names as the letters of its hybrid_override_pattern (and model.layer_pattern)."""


def _nemotron_h(f: _Fields, mt: str) -> TransformerConfig:
    """Nemotron-H and Nemotron 3 (hybrid Mamba2 + attention + MLP or MoE): one mixer per layer by
    hybrid_override_pattern (or layers_block_type): M a Mamba2 mixer (mamba_num_heads x mamba_head_dim channels,
    ssm_state_size per head in n_groups groups, chunk_size), * GQA attention (head_dim), - a squared-ReLU MLP of
    intermediate_size, E routed experts of moe_intermediate_size (in moe_latent_size's width: LatentMoE, Nemotron
    3 Super) beside a shared one of moe_shared_expert_intermediate_size; num_nextn_predict_layers MTP modules of
    one attention and one MLP layer (mtp_hybrid_override_pattern *E)."""
    layers, hidden = f.positive_int("num_hidden_layers"), f.positive_int("hidden_size")
    heads = f.positive_int("num_attention_heads")
    pattern = f.data.get("hybrid_override_pattern")
    if pattern is None and isinstance(f.data.get("layers_block_type"), list):
        kinds = f.data["layers_block_type"]
        if any(k not in _BLOCK_LETTERS for k in kinds):
            raise f._error("layers_block_type", f"has a layer kind outside {', '.join(_BLOCK_LETTERS)}",
                           "use mamba, attention, moe or mlp")
        pattern = "".join(_BLOCK_LETTERS[k] for k in kinds)
    if not isinstance(pattern, str) or len(pattern) != layers or set(pattern) - set("M*E-"):
        raise f._error("hybrid_override_pattern", f"must be {layers} letters of M * E -, got {pattern!r}",
                       "state the published pattern (one letter per layer)")
    act = f.string("mlp_hidden_act", "relu2")
    if act != "relu2":
        f.assumptions.append(f"MLP activation {act} costed as squared ReLU (elementwise only)")
    if f.positive_int("conv_kernel", 4) != 4:
        f.assumptions.append(f"Mamba2 convolution width {f.data['conv_kernel']} costed as 4 (elementwise only)")
    extra: dict[str, Any] = {}
    if "E" in pattern:
        experts, top_k = _experts(f, "n_routed_experts")
        shared = f.data.get("moe_shared_expert_intermediate_size") or 0
        extra = {"experts": experts, "top_k": top_k, "expert_ffn": f.positive_int("moe_intermediate_size"),
                 "shared_expert_ffn": int(shared) if f.data.get("n_shared_experts", 1) else 0}
        if f.data.get("routed_scaling_factor") is not None:
            f.notes.append(f"routed_scaling_factor {f.data['routed_scaling_factor']} (no effect on the cost)")
    mtp = f.data.get("num_nextn_predict_layers") or 0
    if mtp and f.data.get("mtp_hybrid_override_pattern", "*E") != ("*E" if "E" in pattern else "*-"):
        raise f._error("mtp_hybrid_override_pattern", "a multi-token-prediction module other than one attention "
                       "and one MLP layer is not modelled", "use a config whose MTP pattern is *E")
    if f.data.get("moe_latent_size") is not None:
        extra["moe_latent"] = f.positive_int("moe_latent_size")
    _rope_notes(f)
    _lm_head_note(f, mt)
    seq = f.positive_int("max_position_embeddings")
    head_size = f.positive_int("head_dim", hidden // heads)
    return TransformerConfig(
        "", "nemotron", layers, hidden, heads, f.positive_int("intermediate_size"), f.positive_int("vocab_size"),
        seq, kv_heads=f.positive_int("num_key_value_heads", heads), norm="rmsnorm", mlp="relu2", position="rope",
        bias=False, dropout=False, tied_embeddings=f.boolean("tie_word_embeddings", False), max_positions=seq,
        head_size=None if head_size * heads == hidden else head_size, layer_pattern=pattern,
        mamba_heads=f.positive_int("mamba_num_heads") if "M" in pattern else 0,
        mamba_head_dim=f.positive_int("mamba_head_dim", 64), mamba_state=f.positive_int("ssm_state_size", 128),
        mamba_groups=f.positive_int("n_groups", 8), mamba_chunk=f.positive_int("chunk_size", 256),
        qkv_bias=f.boolean("attention_bias", False), out_bias=f.boolean("attention_bias", False),
        mlp_bias=f.boolean("mlp_bias", False), mtp_layers=int(mtp), **extra)


def _llama4(f: _Fields, mt: str) -> TransformerConfig:
    """Llama 4 (Scout, Maverick): its text model (`text_config` of a llama4 config, or a llama4_text config):
    GQA with head_dim, routed experts of intermediate_size top-k beside a shared expert of the same size on the
    layers interleave_moe_layer_step picks (every one: Scout; every other, from the second: Maverick, whose other
    layers run a dense MLP of intermediate_size_mlp), written as a layer pattern of attention and MLP mixers
    where they alternate. The vision tower is not modelled."""
    if mt == "llama4" and not (f.data.get("text_config") is None and "hidden_size" in f.data):
        text = f.data.get("text_config")
        if not isinstance(text, dict):
            raise f._error("text_config", "missing (a llama4 config keeps its language model there)",
                           "use the model's published config.json")
        f.assumptions.append("the vision tower (vision_config) and its projector not modelled: the text model only")
        # its language model is Llama4ForCausalLM, whatever wraps it (an LM head over the vocabulary either way)
        f = _Fields(f.path, {"architectures": ["Llama4ForCausalLM"], **text}, f.notes, f.assumptions)
    layers, hidden = f.positive_int("num_hidden_layers"), f.positive_int("hidden_size")
    heads = f.positive_int("num_attention_heads")
    experts, top_k = _experts(f, "num_local_experts")
    step = f.data.get("interleave_moe_layer_step", 1)
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise f._error("interleave_moe_layer_step", f"must be a positive integer, got {step!r}", "fix the value")
    moe = f.data.get("moe_layers")
    if moe is None:
        moe = list(range(step - 1, layers, step))
    if not isinstance(moe, list) or any(not isinstance(i, int) or not 0 <= i < layers for i in moe):
        raise f._error("moe_layers", f"must list layer indices below {layers}, got {moe!r}", "fix the value")
    width = f.positive_int("intermediate_size")
    chunk = f.data.get("attention_chunk_size")
    if chunk:
        f.notes.append(f"attention_chunk_size {chunk} (chunked attention) priced as full causal attention: exact at "
                       "sequences up to the chunk")
    if f.boolean("use_qk_norm", False):
        f.assumptions.append("its weightless L2 QK-norm priced as QK-norm (2 x head_dim weights per layer)")
    _rope_notes(f)
    _lm_head_note(f, mt)
    seq = f.positive_int("max_position_embeddings")
    extra: dict[str, Any] = {}
    ffn = width
    if len(moe) < layers:  # dense MLP layers between the MoE ones: one mixer per layer, attention and MLP apart
        extra["layer_pattern"] = "".join("*" + ("E" if i in set(moe) else "-") for i in range(layers))
        layers, ffn = 2 * layers, f.positive_int("intermediate_size_mlp")
    head_size = f.positive_int("head_dim", hidden // heads)
    return TransformerConfig(
        "", "llama", layers, hidden, heads, ffn, f.positive_int("vocab_size"), seq,
        kv_heads=f.positive_int("num_key_value_heads", heads), norm="rmsnorm", mlp="swiglu", position="rope",
        bias=False, dropout=False, tied_embeddings=f.boolean("tie_word_embeddings", False), max_positions=seq,
        head_size=None if head_size * heads == hidden else head_size, qk_norm=f.boolean("use_qk_norm", False),
        experts=experts, top_k=top_k, expert_ffn=width, shared_expert_ffn=width,
        qkv_bias=f.boolean("attention_bias", False), out_bias=f.boolean("attention_bias", False), **extra)


def _gpt2(f: _Fields, mt: str) -> TransformerConfig:
    """GPT-2: LayerNorm, GELU MLP (n_inner, null = 4 n_embd), learned positions, biases, tied LM head."""
    hidden, heads = f.positive_int("n_embd"), f.positive_int("n_head")
    act = f.string("activation_function", "gelu_new")
    if act not in GELU_ACTS:
        f.assumptions.append(f"MLP activation {act} costed as GELU (elementwise only)")
    if f.boolean("add_cross_attention", False):
        f.assumptions.append("add_cross_attention ignored: decoder self-attention only")
    _lm_head_note(f, mt)
    positions = f.positive_int("n_positions", alias="n_ctx")
    layers, ffn = f.positive_int("n_layer"), f.positive_int("n_inner", 4 * hidden)
    return TransformerConfig(
        "", "gpt", layers, hidden, heads, ffn, f.positive_int("vocab_size"), positions,
        dropout=_dropout(f, "resid_pdrop", "embd_pdrop", "attn_pdrop"),
        tied_embeddings=f.boolean("tie_word_embeddings", True), max_positions=positions, position_rows=positions)


def _gpt_neox(f: _Fields, mt: str) -> TransformerConfig:
    """GPT-NeoX / Pythia: LayerNorm, GELU MLP with biases, rotary on a fraction of each head, untied."""
    hidden, heads = f.positive_int("hidden_size"), f.positive_int("num_attention_heads")
    act = f.string("hidden_act", "gelu")
    if act not in GELU_ACTS:
        f.assumptions.append(f"MLP activation {act} costed as GELU (elementwise only)")
    if f.boolean("use_parallel_residual", True):
        f.assumptions.append("use_parallel_residual: attention and MLP run one after the other (same FLOPs and "
                             "parameters; no fused TP all-reduce)")
    pct = f.data.get("rotary_pct", 0.25)
    if isinstance(pct, int | float) and not isinstance(pct, bool) and pct != 1:
        f.assumptions.append(f"rotary_pct {pct:g}: RoPE elementwise cost counted over the whole head dim")
    _rope_notes(f)
    _lm_head_note(f, mt)
    seq = f.positive_int("max_position_embeddings")
    attn_bias = f.boolean("attention_bias", True)
    layers, ffn, vocab = f.positive_int("num_hidden_layers"), f.positive_int("intermediate_size"), \
        f.positive_int("vocab_size")
    return TransformerConfig(
        "", "gpt", layers, hidden, heads, ffn, vocab, seq,
        position="rope", bias=True, qkv_bias=attn_bias, out_bias=attn_bias,
        dropout=_dropout(f, "attention_dropout", "hidden_dropout", "attention_probs_dropout_prob",
                         "hidden_dropout_prob"),
        tied_embeddings=f.boolean("tie_word_embeddings", False), max_positions=seq)


BERT_POOLER = frozenset({"BertModel", "BertForPreTraining", "BertForSequenceClassification",
                         "BertForNextSentencePrediction", "BertForMultipleChoice"})
BERT_MLM = frozenset({"BertForMaskedLM", "BertForPreTraining", "BertLMHeadModel"})


def _bert(f: _Fields, mt: str) -> TransformerConfig:
    """BERT encoder: post-LN blocks, GELU MLP, learned + token-type positions, tied MLM decoder."""
    hidden, heads = f.positive_int("hidden_size"), f.positive_int("num_attention_heads")
    vocab = f.positive_int("vocab_size")
    act = f.string("hidden_act", "gelu")
    if act not in GELU_ACTS:
        f.assumptions.append(f"MLP activation {act} costed as GELU (elementwise only)")
    pos_kind = f.string("position_embedding_type", "absolute")
    if pos_kind != "absolute":
        f.assumptions.append(f"position_embedding_type {pos_kind}: relative-position embeddings not modelled")
    arch = f.architecture() or "BertForMaskedLM"
    h = hidden
    missing = ["post-LN ordering modelled as pre-LN and the final LayerNorm stands in for the embedding "
               "LayerNorm (same FLOPs and parameters)"]
    if arch in BERT_MLM:
        missing.append(f"MLM transform dense + LayerNorm not modelled ({h * h + 3 * h:,} parameters, "
                       f"2 x {h * h:,} FLOPs per token forward) nor the decoder bias ({vocab:,} parameters)")
    else:
        missing.append(f"{arch} has no MLM head: modelled with a tied LM head over the vocabulary "
                       f"(2 x {h * vocab:,} FLOPs per token forward)")
    if arch in BERT_POOLER:
        missing.append(f"pooler not modelled ({h * h + h:,} parameters)")
    if arch == "BertForPreTraining":
        missing.append(f"next-sentence head not modelled ({2 * h + 2:,} parameters)")
    if f.architecture() is None:
        missing.append("no \"architectures\": read as BertForMaskedLM")
    f.assumptions.extend(missing)
    positions = f.positive_int("max_position_embeddings")
    layers, ffn = f.positive_int("num_hidden_layers"), f.positive_int("intermediate_size")
    return TransformerConfig(
        "", "bert", layers, hidden, heads, ffn, vocab, positions,
        dropout=_dropout(f, "hidden_dropout_prob", "attention_probs_dropout_prob"),
        tied_embeddings=f.boolean("tie_word_embeddings", True), causal=f.boolean("is_decoder", False),
        max_positions=positions, position_rows=positions, token_types=f.positive_int("type_vocab_size", 2))


READERS: dict[str, Callable[[_Fields, str], TransformerConfig]] = {
    "bert": _bert, "gpt2": _gpt2, "gpt_neox": _gpt_neox, "llama": _llama_like, "mistral": _llama_like,
    "mixtral": _llama_like, "qwen2": _llama_like, "qwen3": _qwen3, "qwen3_moe": _qwen3, "qwen2_moe": _qwen3,
    "deepseek_v3": _deepseek_v3, "kimi_k2": _deepseek_v3, "gpt_oss": _gpt_oss, "nemotron_h": _nemotron_h,
    "llama4": _llama4, "llama4_text": _llama4,
}
"""Supported `model_type`s (keys) and their readers."""

HEAD_KEYS = {"gpt2": ("n_head", "n_head"), "gpt_neox": ("num_attention_heads", "num_attention_heads"),
             "bert": ("num_attention_heads", "num_attention_heads")}
"""config.json keys holding the attention and key/value head counts (default: Llama's names)."""


def _check(cfg: TransformerConfig, heads_field: str, kv_field: str, where: str) -> None:
    """Reject shapes no checkpoint could have: heads not dividing hidden, kv heads not dividing heads."""
    if cfg.head_size is None and cfg.hidden % cfg.heads:
        raise ConfigError(heads_field, f"{cfg.heads} heads do not divide hidden size {cfg.hidden}{where}",
                          f"use a head count dividing {cfg.hidden} (or state head_dim)")
    if cfg.heads % cfg.kv:
        raise ConfigError(kv_field, f"{cfg.kv} key/value heads do not divide {cfg.heads} attention "
                          f"heads{where}", f"use a kv head count dividing {cfg.heads}")


def _name(f: _Fields, mt: str, cfg: TransformerConfig) -> str:
    """`_name_or_path` (a hub id, or a local path's last part), else model_type + parameter count."""
    given = f.data.get("_name_or_path")
    if isinstance(given, str) and given.strip():
        given = given.strip().rstrip("/\\")
        looks_local = given.startswith(("/", ".", "~")) or "\\" in given or given.count("/") > 1
        return Path(given).name if looks_local else given
    params = build_transformer(cfg, 1).params
    size = f"{params / 1e9:.3g}b" if params >= 1e9 else f"{params / 1e6:.3g}m"
    return f"{mt}-{size}"


def load_hf_config(path: str | Path) -> TransformerConfig:
    """A TransformerConfig from a local Hugging Face config.json (sequence length: max positions)."""
    p, data = read_hf_json(path)
    f = _Fields(p, data)
    mt = _model_type(f)
    cfg = READERS[mt](f, mt)
    heads_key, kv_key = HEAD_KEYS.get(mt, ("num_attention_heads", "num_key_value_heads"))
    _check(cfg, f"hf_config.{heads_key}", f"hf_config.{kv_key}", f" in {p}")
    arch = f.architecture() or mt
    desc = f"{arch} from {p} (Hugging Face model_type {mt})"
    if f.notes:
        desc += "; " + "; ".join(f.notes)
    if f.assumptions:
        desc += "; assumptions: " + "; ".join(f.assumptions)
    cfg = replace(cfg, description=desc, assumptions=tuple(f.assumptions))
    return replace(cfg, name=_name(f, mt, cfg))


def hf_transformer_config(path: str | Path, seq_len: int | None = None, **dims: int | None) -> TransformerConfig:
    """`load_hf_config` with the job's overrides (--seq-len, --layers, --hidden, ...) applied on top."""
    cfg = load_hf_config(path)
    unknown = set(dims) - set(OVERRIDABLE)
    if unknown:
        raise ConfigError("model", f"unknown override(s) {', '.join(sorted(unknown))}",
                          f"use {', '.join(OVERRIDABLE)}")
    fields: dict[str, int] = {k: int(v) for k, v in dims.items() if v is not None}
    if seq_len is not None:
        fields["seq_len"] = int(seq_len)
    if not fields:
        return cfg
    out = replace(cfg, **fields)  # type: ignore[arg-type]
    if "hidden" in fields or "heads" in fields:
        out = replace(out, head_size=None)  # a new shape: head dim follows hidden // heads
    # the file passed the same checks, so an overridden field is the culprit
    _check(out, "model.heads" if "heads" in fields else "model.hidden",
           "model.kv_heads" if "kv_heads" in fields else "model.heads", " after the overrides")
    return out


def build_hf_model(path: str | Path, batch: int, seq_len: int | None = None, attention: str = "flash",
                   features: Mapping[str, Any] | None = None, **dims: int | None) -> Model:
    """Instantiate the model a config.json describes for `batch` sequences (overrides as in the zoo;
    `features`: architecture features replaced, see zoo.with_features)."""
    from .zoo import with_features

    cfg = with_features(hf_transformer_config(path, seq_len, **dims), features)
    try:
        return build_transformer(cfg, batch, cfg.seq_len, attention)
    except ValueError as exc:
        limit = cfg.max_positions or cfg.seq_len
        raise ConfigError("model.seq_len", str(exc), f"use --seq-len {limit} or less") from None


__all__ = ["READERS", "build_hf_model", "hf_transformer_config", "load_hf_config", "read_hf_json"]
