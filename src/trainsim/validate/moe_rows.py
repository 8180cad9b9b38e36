"""Mixture-of-experts rows (Megatron-Core's MoE test models) that trainsim's MoE layer represents, and why the
others are not.

trainsim's MoE block (workload/zoo/transformer.py `_moe_ops`) routes a layer's MLP through `experts` experts
of `expert_ffn` features each (--moe-ffn-hidden-size; default the dense --ffn-hidden-size), `top_k` per token,
with the experts split over the expert-parallel axis and, like every MLP, their ffn dimension over tp, and a
shared expert beside them (--moe-shared-expert-intermediate-size); the first `first_dense_layers` layers keep
a dense MLP (--moe-layer-freq of the form [0]*k+[1]*n). That is Megatron-Core's layout when:
- the experts' tensor parallelism is the dense layers' (Megatron: --expert-tensor-parallel-size defaults to
  --tensor-model-parallel-size, megatron/training/arguments.py);
- attention is ordinary (no multi-latent attention) and there are no multi-token-prediction layers.
--moe-router-topk defaults to 2 (Megatron's arguments.py).

Megatron routes droplessly by default (no --moe-expert-capacity-factor): each expert's tokens are the mean,
tokens * top_k / experts (trainsim's capacity factor 1). The token dispatcher (allgather, Megatron's default, or
alltoall) changes the communication, not what is saved for backward: both hand each expert its permuted
tokens, which expert_fc1 keeps.
"""

from __future__ import annotations

import re
from typing import Any

MEGATRON_DEFAULT_TOP_K = 2
"""--moe-router-topk's default (megatron/training/arguments.py)."""

_BLOCKERS: tuple[tuple[str, str], ...] = (
    (r"multi-latent-attention\s*=\s*true", "multi-latent attention (MLA)"),
    (r"mtp-num-layers\s*=\s*[1-9]", "multi-token-prediction layers"),
    (r"moe-expert-capacity-factor\s*=", "a token capacity per expert (dropping)"),
)


def moe_model_fields(settings: str, tp: int, framework: str) -> dict[str, Any] | str:
    """The model keys (experts, top_k, and ffn where --moe-ffn-hidden-size sets it) of a Megatron MoE row's
    `other_settings`, or why trainsim's MoE layer cannot represent it. Only Megatron rows that give
    --num-experts map: the defaults read here (top-k, expert TP, dropless routing) are Megatron's."""
    text = settings.lower()
    found = re.search(r"num-experts\s*=\s*(\d+)", text)
    if "megatron" not in framework.lower() or not found:
        return "not mapped (only Megatron-Core rows stating --num-experts: the defaults read are Megatron's)"
    for pattern, what in _BLOCKERS:
        if re.search(pattern, text):
            return f"{what} is not modelled"
    etp = re.search(r"expert-tensor-parallel-size\s*=\s*(\d+)", text)
    if etp and int(etp.group(1)) != tp:
        return (f"expert tensor parallelism {etp.group(1)} differs from tp {tp} (trainsim splits the experts "
                "over tp like the dense MLP)")
    experts = int(found.group(1))
    top = re.search(r"moe-router-topk\s*=\s*(\d+)", text)
    out: dict[str, Any] = {"experts": experts, "top_k": int(top.group(1)) if top else MEGATRON_DEFAULT_TOP_K}
    ffn = re.search(r"moe-ffn-hidden-size\s*=\s*(\d+)", text)
    if ffn:
        out["expert_ffn"] = int(ffn.group(1))
    shared = re.search(r"moe-shared-expert-intermediate-size\s*=\s*(\d+)", text)
    if shared and int(shared.group(1)):
        out["shared_expert_ffn"] = int(shared.group(1))
    freq = re.search(r"moe-layer-freq\s*=\s*(\S+)", text)
    if freq:
        pattern = re.fullmatch(r"\(?\[0\]\s*\*\s*(\d+)\s*\+\s*\[1\]\s*\*\s*(\d+)\)?", freq.group(1).rstrip(";"))
        if pattern is None:
            return f"moe-layer-freq {freq.group(1)} (trainsim keeps the first layers dense, then MoE) is not modelled"
        out["first_dense_layers"] = int(pattern.group(1))
    return out


def moe_note(fields: dict[str, Any], settings: str) -> str:
    """The row's assumption text for its MoE mapping."""
    dispatcher = re.search(r"moe-token-dispatcher-type\s*=\s*(\w+)", settings.lower())
    kind = dispatcher.group(1) if dispatcher else "allgather (Megatron's default)"
    width = (f"{fields['expert_ffn']} features each (moe-ffn-hidden-size)" if "expert_ffn" in fields
             else "ffn features each")
    layers = (f"every layer after the first {fields['first_dense_layers']} (dense)" if fields.get("first_dense_layers")
              else "every layer")
    shared = (f", beside a shared expert of {fields['shared_expert_ffn']} features"
              if fields.get("shared_expert_ffn") else "")
    return (f"Megatron MoE: {layers} routes to {fields['top_k']} of {fields['experts']} experts, {width}{shared}; "
            f"dropless routing priced at the mean load (tokens x top_k / experts per expert); the {kind} "
            "dispatcher's traffic is priced as trainsim's all-to-all (what expert_fc1 saves is the same)")
