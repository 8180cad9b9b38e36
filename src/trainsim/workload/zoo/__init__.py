"""Built-in models by name, plus free dimensions for custom transformers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ...errors import ConfigError
from ..ir import Model
from .cnn import CNN_MODELS, build_cnn
from .dlrm import build_dlrm
from .transformer import FEATURES, TRANSFORMERS, TransformerConfig, build_transformer

OTHER_MODELS = {
    "resnet50": "ResNet-50 v1.5 (torchvision), ImageNet 224x224",
    "vgg16": "VGG-16 (torchvision, no BN), ImageNet 224x224",
    "vgg19": "VGG-19 (torchvision, no BN), ImageNet 224x224",
    "dlrm": "DLRM, MLPerf Criteo 1TB config (26 tables x 128, 40M-row cap)",
}


def model_names() -> dict[str, str]:
    """Every built-in model with a one-line description."""
    out = {name: cfg.description for name, cfg in TRANSFORMERS.items()}
    out.update(OTHER_MODELS)
    out["custom"] = "GPT-style transformer from --layers --hidden --heads [--ffn --vocab --seq-len]"
    return out


def with_features(cfg: TransformerConfig, features: Mapping[str, Any] | None) -> TransformerConfig:
    """`cfg` with architecture features (FEATURES: position, mlp, norm, bias, tied_embeddings, dropout)
    replaced; None values keep the model's own. An unknown key is a KeyError (a programming error)."""
    given = {k: v for k, v in (features or {}).items() if v is not None}
    unknown = sorted(set(given) - set(FEATURES))
    if unknown:
        raise KeyError(f"unknown architecture feature(s) {', '.join(unknown)}; known: {', '.join(FEATURES)}")
    if not given:
        return cfg
    if "lora_targets" in given:
        given["lora_targets"] = tuple(given["lora_targets"])
    return replace(cfg, **given)


def transformer_config(name: str, features: Mapping[str, Any] | None = None, **dims: int | None) -> TransformerConfig:
    """A named transformer with any of layers/hidden/heads/kv_heads/ffn/vocab overridden, and any of the
    architecture `features` (position, mlp, norm, bias, tied_embeddings, dropout) replaced."""
    given = {k: v for k, v in dims.items() if v is not None}
    if name == "custom":
        missing = [k for k in ("layers", "hidden", "heads") if k not in given]
        if missing:
            raise KeyError(f"custom model needs --{' --'.join(missing)}")
        hidden = int(given["hidden"])
        base = TransformerConfig("custom", "gpt", int(given["layers"]), hidden, int(given["heads"]),
                                 int(given.get("ffn") or 4 * hidden), int(given.get("vocab") or 50257),
                                 int(given.get("seq_len") or 2048), description="custom GPT-style transformer")
    else:
        base = TRANSFORMERS[name]
    fields = {k: int(v) for k, v in given.items() if k in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab")}
    if "seq_len" in given:
        fields["seq_len"] = int(given["seq_len"])
        if base.max_positions is not None:
            fields["max_positions"] = max(base.max_positions, int(given["seq_len"]))
    cfg = with_features(replace(base, **fields), features)
    _check_heads(cfg, given, features)
    return cfg


def _check_heads(cfg: TransformerConfig, given: dict[str, int | None], features: Mapping[str, Any] | None = None
                 ) -> None:
    """Heads must divide hidden and kv heads must divide heads, and a MoE routes each token to at most its
    experts; the error names the overridden key."""
    if cfg.head_size is None and cfg.hidden % cfg.heads:
        field = "model.heads" if "heads" in given or "hidden" not in given else "model.hidden"
        divisors = [d for d in range(1, min(cfg.hidden, 256) + 1) if cfg.hidden % d == 0][-6:]
        fix = (f"use a head count dividing {cfg.hidden} (e.g. {', '.join(map(str, divisors))})"
               if field == "model.heads" else f"use a hidden size that is a multiple of {cfg.heads}")
        raise ConfigError(field, f"{cfg.heads} attention heads do not divide hidden size {cfg.hidden}", fix)
    if (cfg.experts and cfg.top_k > cfg.experts) or (not cfg.experts and (features or {}).get("top_k") is not None):
        raise ConfigError("model.top_k", f"routes each token to {cfg.top_k} of {cfg.experts} experts",
                          "set model.experts (a mixture of experts) with top_k at most the experts")
    for key in ("expert_ffn", "shared_expert_ffn", "first_dense_layers", "moe_imbalance", "moe_capacity_factor",
                "moe_pad_to_capacity", "expert_gemm", "expert_act", "moe_router_fusion"):
        if not cfg.experts and (features or {}).get(key):
            raise ConfigError(f"model.{key}", "only applies to a mixture of experts",
                              "set model.experts, or drop it")
    if cfg.moe_pad_to_capacity and not cfg.moe_capacity_factor:
        raise ConfigError("model.moe_pad_to_capacity", "pads each expert's tokens to a capacity the model does not set",
                          "set model.moe_capacity_factor, or drop it")
    if not cfg.kv_lora_rank:
        for key in ("q_lora_rank", "qk_rope_dim", "v_head_size"):
            if getattr(cfg, key):
                raise ConfigError(f"model.{key}", "only applies to multi-latent attention",
                                  "set model.kv_lora_rank (MLA), or drop it")
    else:
        if cfg.qk_rope_dim >= cfg.head_dim:
            raise ConfigError("model.qk_rope_dim", f"{cfg.qk_rope_dim} RoPE dims leave none of the {cfg.head_dim}-dim "
                              "query/key heads", "use a model.head_size above model.qk_rope_dim")
        for key in ("qk_norm", "sliding_window", "attention_sinks"):
            if getattr(cfg, key):
                raise ConfigError(f"model.{key}", "is not modelled with multi-latent attention",
                                  "drop it, or model.kv_lora_rank")
    if cfg.layer_pattern:
        field = "model.layer_pattern"
        if set(cfg.layer_pattern) - set("M*E-"):
            raise ConfigError(field, f"'{cfg.layer_pattern}' has letters other than M (Mamba2), * (attention), E (MoE "
                              "MLP) and - (dense MLP)", "write one letter per layer from those")
        if len(cfg.layer_pattern) != cfg.layers:
            raise ConfigError(field, f"{len(cfg.layer_pattern)} letters for {cfg.layers} layers",
                              f"give one letter per layer (or model.layers {len(cfg.layer_pattern)})")
        if "M" in cfg.layer_pattern and not cfg.mamba_heads:
            raise ConfigError("model.mamba_heads", "the pattern has Mamba2 layers (M) but no Mamba2 heads",
                              "set model.mamba_heads (and mamba_head_dim, mamba_state, mamba_groups)")
        if "E" in cfg.layer_pattern and not cfg.experts:
            raise ConfigError("model.experts", "the pattern has MoE layers (E) but no experts", "set model.experts")
        if cfg.mamba_heads and (cfg.mamba_heads * cfg.mamba_head_dim) % cfg.mamba_groups:
            raise ConfigError("model.mamba_groups", f"{cfg.mamba_groups} groups do not divide the "
                              f"{cfg.mamba_heads * cfg.mamba_head_dim} Mamba2 channels", "use groups dividing them")
    elif cfg.mamba_heads:
        raise ConfigError("model.mamba_heads", "Mamba2 layers need a model.layer_pattern placing them (M)",
                          "set model.layer_pattern, e.g. 'M*ME'")
    if cfg.experts and cfg.first_dense_layers >= cfg.layers:
        raise ConfigError("model.first_dense_layers", f"keeps {cfg.first_dense_layers} of {cfg.layers} layers dense, "
                          "leaving no MoE layer", f"use fewer than {cfg.layers}, or a dense model (no experts)")
    if cfg.heads % cfg.kv:
        field = "model.kv_heads" if "kv_heads" in given or "heads" not in given else "model.heads"
        divisors = [d for d in range(1, cfg.heads + 1) if cfg.heads % d == 0]
        raise ConfigError(field, f"{cfg.kv} key/value heads do not divide {cfg.heads} attention heads",
                          f"use kv heads among {', '.join(map(str, divisors[-8:]))}")


def is_transformer(name: str) -> bool:
    return name in TRANSFORMERS or name == "custom"


def build_model(name: str, batch: int, seq_len: int | None = None, attention: str = "flash",
                features: Mapping[str, Any] | None = None, **dims: int | None) -> Model:
    """Instantiate a model for `batch` samples (the global micro-batch across data-parallel ranks)."""
    if is_transformer(name):
        cfg = transformer_config(name, features, seq_len=seq_len, **dims)
        return build_transformer(cfg, batch, cfg.seq_len, attention)
    if any(v is not None for v in (features or {}).values()):
        raise KeyError(f"model.position/mlp/norm/... only apply to transformers, not {name}")
    if any(v is not None for v in dims.values()):
        raise KeyError(f"--layers/--hidden/... only apply to transformers, not {name}")
    if seq_len is not None and (name in CNN_MODELS or name == "dlrm"):
        raise ConfigError("model.seq_len", f"{name} has no sequence (it takes images or feature rows)",
                          "drop --seq-len for this model")
    if name in CNN_MODELS:
        return build_cnn(name, batch)
    if name == "dlrm":
        return build_dlrm(batch)
    raise KeyError(name)


__all__ = ["FEATURES", "TRANSFORMERS", "build_model", "model_names", "transformer_config", "with_features"]
