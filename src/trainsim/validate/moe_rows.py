"""Mixture-of-experts rows that trainsim's MoE layer represents, and why the others are not: Megatron-Core's
MoE test models (their experts in other_settings: moe_model_fields) and moe_runs.csv's rows (their experts,
multi-latent attention and windows in columns: moe_column_fields).

trainsim's MoE block (workload/zoo/transformer.py `_moe_ops`) routes a layer's MLP through `experts` experts
of `expert_ffn` features each (--moe-ffn-hidden-size; default the dense --ffn-hidden-size), `top_k` per token,
with the experts split over the expert-parallel axis and, like every MLP, their ffn dimension over tp, and a
shared expert beside them (--moe-shared-expert-intermediate-size); the first `first_dense_layers` layers keep
a dense MLP (--moe-layer-freq of the form [0]*k+[1]*n). That is Megatron-Core's layout when:
- the experts' tensor parallelism is the dense layers' (Megatron: --expert-tensor-parallel-size defaults to
  --tensor-model-parallel-size, megatron/training/arguments.py), or 1, whole experts folded over tp x ep
  (strategy.etp; expert_tp reads it);
- attention is ordinary or multi-latent: a Megatron row's MLA flags (--multi-latent-attention, --q-lora-rank, ...)
  are read with its other settings (training_runs), moe_runs.csv states MLA's sizes in columns; both map to
  model.kv_lora_rank, ...
Multi-token-prediction layers (--mtp-num-layers) map to model.mtp_layers (training_runs' settings rules).
--moe-router-topk defaults to 2 (Megatron's arguments.py).

Megatron routes droplessly by default (no --moe-expert-capacity-factor): each expert's tokens are the mean,
tokens * top_k / experts, under the balanced routing the benchmarks force (model.moe_imbalance 1, its default); a
stated capacity factor (and --moe-pad-expert-input-to-capacity) maps to model.moe_capacity_factor (and
moe_pad_to_capacity). The token dispatcher (allgather, Megatron's default, or
alltoall) changes the communication, not what is saved for backward: both hand each expert its permuted
tokens, which expert_fc1 keeps.
"""

from __future__ import annotations

import math
import re
from typing import Any

from ..workload.zoo.transformer import SUPER_PATTERN

MEGATRON_DEFAULT_TOP_K = 2
"""--moe-router-topk's default (megatron/training/arguments.py)."""

_BLOCKERS: tuple[tuple[str, str], ...] = (
)


def moe_model_fields(settings: str, framework: str) -> dict[str, Any] | str:
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
    experts = int(found.group(1))
    top = re.search(r"moe-router-topk\s*=\s*(\d+)", text)
    out: dict[str, Any] = {"experts": experts, "top_k": int(top.group(1)) if top else MEGATRON_DEFAULT_TOP_K}
    ffn = re.search(r"moe-ffn-hidden-size\s*=\s*(\d+)", text)
    if ffn:
        out["expert_ffn"] = int(ffn.group(1))
    capacity = re.search(r"moe-expert-capacity-factor\s*=\s*([\d.]+)", text)
    if capacity and float(capacity.group(1)) > 0:  # Megatron: a capacity per expert, tokens beyond it dropped
        out["moe_capacity_factor"] = float(capacity.group(1))
        if re.search(r"moe-pad-expert-input-to-capacity(?:\s*=\s*true)?(?:;|$|\s)", text + ";"):
            out["moe_pad_to_capacity"] = True
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


def _cells(row: dict[str, str], *columns: str) -> str:
    return " ".join((row.get(c) or "").strip() for c in columns).lower()


def _int_cell(row: dict[str, str], column: str) -> int | None:
    m = re.match(r"\s*(\d+)", row.get(column) or "")
    return int(m.group(1)) if m else None


PUBLISHED_ARCHITECTURES: dict[str, tuple[dict[str, str], dict[str, Any], str]] = {
    # nvidia/NVIDIA-Nemotron-3-Super-120B-A12B's config.json (model_type nemotron_h; its values as quoted in public
    # code): 88 layers, 40 Mamba2 mixers (128 heads x 64, state 128, 8 groups, chunk 128), 40 LatentMoE MLPs (512
    # experts of 2688 top-22 in a latent width of 1024, a shared expert of 5376, squared ReLU), 8 GQA layers (32
    # heads of 128, 2 kv heads), vocab 131072, one multi-token-prediction module (attention + MoE); the layer order
    # is the zoo's SUPER_PATTERN (public Megatron launch scripts' --hybrid-override-pattern)
    "nemotron 3 super": (
        {"n_layers": "88", "hidden": "4096", "n_heads": "32", "n_kv_heads": "2", "head_dim": "128",
         "ffn_hidden": "2688", "vocab": "131072", "n_experts": "512", "top_k": "22", "moe_ffn_hidden": "2688",
         "n_shared_experts": "1", "moe_layer_freq": "hybrid pattern " + SUPER_PATTERN,
         "attention": "GQA in 8 attention layers; other mixers are Mamba2 (128 heads x 64, state 128)",
         "notes": "shared expert intermediate 5376", "arch": "hybrid Mamba2 + LatentMoE (squared ReLU)"},
        {"moe_latent": 1024, "mtp_layers": 1},
        "its published config (nvidia/NVIDIA-Nemotron-3-Super-120B-A12B): 88 layers (40 Mamba2, 40 LatentMoE, 8 "
        "attention, in its published order), 512 experts of 2688 top-22 in a latent width of 1024 beside a shared "
        "expert of 5376, one MTP module"),
}
"""Architectures a row names but does not state in its columns (moe_runs.md: 'map them too where their published
configs give the shapes'): model name (lower case, its start) -> (the columns to fill, model keys beyond the
columns, the assumption text)."""


def published_architecture(row: dict[str, str]) -> tuple[dict[str, str], dict[str, Any], str] | str | None:
    """A row of a model in PUBLISHED_ARCHITECTURES with its architecture columns empty: (the row with them filled,
    the further model keys, the note); why it cannot be mapped; None for every other row."""
    name = row.get("model_name", "").strip().lower()
    key = next((k for k in PUBLISHED_ARCHITECTURES if name.startswith(k)), None)
    if key is None or row.get("n_experts", "").strip():
        return None
    cells, fields, note = PUBLISHED_ARCHITECTURES[key]
    return {**row, **cells}, dict(fields), note


def moe_column_fields(row: dict[str, str]) -> dict[str, Any] | str | None:
    """The model keys of a row that states its experts in columns (moe_runs.csv: n_experts, top_k,
    moe_ffn_hidden, n_shared_experts, first_k_dense, moe_layer_freq, attention), or why trainsim's MoE layer
    cannot represent it; None where the row has no n_experts (its other_settings may say: moe_model_fields).
    Multi-latent attention, sliding windows, attention sinks and hybrid Mamba2 patterns are read from the attention
    and moe_layer_freq columns. `n_shared_experts` shared experts of moe_ffn_hidden features each are one shared
    expert of their sum (how Megatron sizes --moe-shared-expert-intermediate-size), unless the notes give its width."""
    experts = _int_cell(row, "n_experts")
    if experts is None or experts < 2:
        return None
    top_k, width = _int_cell(row, "top_k"), _int_cell(row, "moe_ffn_hidden")
    if top_k is None or width is None:
        return "top_k or moe_ffn_hidden not stated"
    out: dict[str, Any] = {"experts": experts, "top_k": top_k, "expert_ffn": width}
    if re.search(r"\bmla\b|multi-latent", _cells(row, "attention", "arch")):
        mla = _mla_fields(row)
        if isinstance(mla, str):
            return mla
        out.update(mla)
    attention = _cells(row, "attention")
    if re.search(r"sliding[- ]window", attention):
        window = re.search(r"sliding[- ]window\s*\(?\s*(\d+)", attention)
        if window is None:
            return "sliding-window attention without its window size"
        out["sliding_window"] = int(window.group(1))
        out["window_layers"] = "alternate" if re.search(r"alternat", attention) else "all"
    if re.search(r"sinks", attention):
        out["attention_sinks"] = True
    shared = _int_cell(row, "n_shared_experts") or 0
    if shared:  # their sum, unless the notes give the shared expert's own width (Nemotron 3: twice a routed one)
        stated = re.search(r"shared expert intermediate\s*(\d+)", _cells(row, "notes"))
        out["shared_expert_ffn"] = int(stated.group(1)) if stated else shared * width
    if re.search(r"mamba|hybrid", _cells(row, "attention", "moe_layer_freq")):
        hybrid = _hybrid_fields(row)
        if isinstance(hybrid, str):
            return hybrid
        out.update(hybrid)
    capacity = _cells(row, "capacity_factor")
    if factor := re.search(r"capacity factor\s*([\d.]+)", capacity):
        if not re.search(r"token[- ]drop", capacity):
            return f"capacity factor without token dropping ('{capacity}')"
        out["moe_capacity_factor"] = float(factor.group(1))
        if re.search(r"with padding|padded", capacity):
            out["moe_pad_to_capacity"] = True
    dense = _int_cell(row, "first_k_dense") or 0
    freq = "" if "layer_pattern" in out else _cells(row, "moe_layer_freq")
    pattern = re.fullmatch(r"\(?\[0\]\s*\*\s*(\d+)\s*\+\s*\[1\]\s*\*\s*(\d+)\)?", freq)
    if pattern is not None:
        if int(pattern.group(1)) != dense:
            return f"moe_layer_freq {freq} disagrees with first_k_dense {dense}"
    elif freq and not re.match(r"1\b", freq):
        return f"moe_layer_freq {freq} (trainsim keeps the first layers dense, then MoE) is not modelled"
    if dense:
        out["first_dense_layers"] = dense
    return out


def _hybrid_fields(row: dict[str, str]) -> dict[str, Any] | str:
    """A hybrid Mamba2 model's keys: its layer pattern (moe_layer_freq 'hybrid pattern MEM*E...') and its Mamba2
    sizes (attention '... Mamba2 (64 heads x 64, state 128)'), or what is missing. Groups of B and C: 8, and the
    scan's chunk: 128, where unstated (Nemotron-H's published n_groups and chunk_size)."""
    pattern = re.search(r"pattern\s+([me*\-]+)", _cells(row, "moe_layer_freq"))
    sizes = re.search(r"mamba2?\s*\((\d+)\s*heads?\s*x\s*(\d+),\s*state\s*(\d+)", _cells(row, "attention"))
    if pattern is None or sizes is None:
        return "hybrid Mamba2 layers without their layer pattern or Mamba2 sizes (heads x head dim, state)"
    return {"layer_pattern": pattern.group(1).upper(), "mamba_heads": int(sizes.group(1)),
            "mamba_head_dim": int(sizes.group(2)), "mamba_state": int(sizes.group(3)), "mamba_chunk": 128}


def _mla_fields(row: dict[str, str]) -> dict[str, Any] | str:
    """Multi-latent attention's model keys from the attention column ('MLA (qk_nope=128, qk_rope=64,
    v_head=128)') and the kv_lora_rank / q_lora_rank columns, or what is missing."""
    text = _cells(row, "attention")
    sizes = {k: int(v) for k, v in re.findall(r"(qk_nope|qk_rope|v_head)\s*=\s*(\d+)", text)}
    kv_rank, q_rank = _int_cell(row, "kv_lora_rank"), _int_cell(row, "q_lora_rank")
    if len(sizes) < 3 or kv_rank is None:
        return "multi-latent attention without its head sizes (qk_nope, qk_rope, v_head) or kv_lora_rank"
    return {"kv_lora_rank": kv_rank, "q_lora_rank": q_rank or 0, "head_size": sizes["qk_nope"] + sizes["qk_rope"],
            "qk_rope_dim": sizes["qk_rope"], "v_head_size": sizes["v_head"]}


def expert_tp(row: dict[str, str]) -> int | None:
    """The row's expert tensor parallelism (its etp column, else Megatron's --expert-tensor-parallel-size in
    other_settings), None where it states none (Megatron's default: tp)."""
    etp = _int_cell(row, "etp")
    if etp is None:
        flag = re.search(r"expert-tensor-parallel-size\s*=\s*(\d+)", (row.get("other_settings") or "").lower())
        etp = int(flag.group(1)) if flag else None
    return etp


TWO_HOP = re.compile(r"flex|deepep|hybrid[-_ ]?ep", re.IGNORECASE)
"""Dispatchers that send a token once per destination GPU and node and forward it over NVLink there (DeepEP's and
HybridEP's kernels; Megatron's flex dispatcher runs one of them, DeepEP unless the row names HybridEP)."""
HYBRID_EP = re.compile(r"hybrid[-_ ]?ep", re.IGNORECASE)


def ep_dispatcher(settings: str, dispatcher_cell: str = "") -> str:
    """strategy.ep_dispatcher of a row: hybridep where its dispatcher (the token_dispatcher column, else
    --moe-token-dispatcher-type in its settings) names HybridEP, deepep for another two-hop one (TWO_HOP), else
    alltoall (NCCL's all-to-all, which also prices Megatron's allgather dispatcher)."""
    flag = re.search(r"moe-token-dispatcher-type\s*=\s*(\w+)", settings.lower())
    text = dispatcher_cell.strip() or (flag.group(1) if flag else "")
    if HYBRID_EP.search(text) or (TWO_HOP.search(text) and HYBRID_EP.search(settings)):
        return "hybridep"
    return "deepep" if TWO_HOP.search(text) else "alltoall"


def unstated_ep(experts: int, dp_cp: int, dispatcher_cell: str) -> tuple[int, str] | None:
    """EP of a row that names an expert-parallel dispatcher (DeepEP, HybridEP, flex, all-to-all) but no EP degree:
    such a dispatcher means EP > 1, and the FSDP2 + EP frameworks that leave the column blank fold the experts over
    the whole data-parallel group, so the largest EP dividing both the experts and dp x cp. None where the row
    names no dispatcher (EP 1)."""
    if not (TWO_HOP.search(dispatcher_cell) or re.search(r"all[-_ ]?to[-_ ]?all|a2a", dispatcher_cell, re.IGNORECASE)):
        return None
    ep = math.gcd(experts, dp_cp)
    return ep, (f"not stated: the {dispatcher_cell.strip()} dispatcher needs EP > 1; EP {ep}, the largest that divides "
                f"both the {experts} experts and dp x cp ({dp_cp}), as FSDP2 + EP frameworks fold it")


RECIPE_HYBRIDEP_SMS = 32
"""SMs Megatron-Bridge's benchmark recipes give HybridEP: `_benchmark_common` sets moe_hybridep_num_sms = 32 for every
recipe whose flex dispatcher runs HybridEP (src/megatron/bridge/perf_recipes/_common.py)."""
RECIPE_HYBRIDEP_SMS_BY_MODEL = {"nemotron 3 nano": 16}
"""Model name (lower case, its start) -> the SMs its benchmark recipes set after `_benchmark_common`: Nemotron 3
Nano's, 16 (src/megatron/bridge/perf_recipes/nemotronh/gb200/nemotronh.py)."""


def _by_model(table: dict[str, Any], row: dict[str, str]) -> Any:  # noqa: ANN401 - the table's own value type
    """The entry of a table keyed by model name (lower case, its start) for the row's model, None if none."""
    name = row.get("model_name", "").strip().lower()
    return next((v for k, v in table.items() if name.startswith(k)), None)


def hybridep_sms(row: dict[str, str]) -> tuple[int, str]:
    """strategy.ep_dispatcher_sms of a HybridEP row (the Megatron-Bridge benchmark recipes' setting) and why."""
    sms = _by_model(RECIPE_HYBRIDEP_SMS_BY_MODEL, row)
    if sms is not None:
        return sms, f"not stated: {sms} SMs for HybridEP, what the model's Megatron-Bridge benchmark recipes set"
    return RECIPE_HYBRIDEP_SMS, (f"not stated: {RECIPE_HYBRIDEP_SMS} SMs for HybridEP, what Megatron-Bridge's "
                                 "benchmark recipes set (_benchmark_common)")


def moe_note(fields: dict[str, Any], settings: str, dispatcher_cell: str = "") -> str:
    """The row's assumption text for its MoE mapping (`dispatcher_cell`: a token_dispatcher column, where the row
    has one)."""
    dispatcher = re.search(r"moe-token-dispatcher-type\s*=\s*(\w+)", settings.lower())
    kind = (dispatcher_cell.strip() if dispatcher_cell.strip() else dispatcher.group(1) if dispatcher
            else "allgather (Megatron's default)")
    width = (f"{fields['expert_ffn']} features each" if "expert_ffn" in fields else "ffn features each")
    layers = (f"every layer after the first {fields['first_dense_layers']} (dense)" if fields.get("first_dense_layers")
              else "every layer")
    shared = (f", beside a shared expert of {fields['shared_expert_ffn']} features"
              if fields.get("shared_expert_ffn") else "")
    dispatcher = ep_dispatcher(settings, dispatcher_cell)
    priced = {"deepep": "a two-hop dispatch (one copy per destination GPU and node, forwarded over NVLink: "
                        "strategy.ep_dispatcher deepep)",
              "hybridep": "a two-hop dispatch at HybridEP's kernels' rate on the recipe's SMs (strategy."
                          "ep_dispatcher hybridep, ep_dispatcher_sms)"}.get(dispatcher, "trainsim's all-to-all")
    return (f"MoE: {layers} routes to {fields['top_k']} of {fields['experts']} experts, {width}{shared}; "
            f"dropless routing priced at the mean load (tokens x top_k / experts per expert); the {kind} "
            f"dispatcher's traffic is priced as {priced} (what expert_fc1 saves is the same)")


_DEEPSEEK_V3_LAYOUTS: dict[tuple[int, int], str] = {
    (4, 1): "Et*16|t*16|t*16|t*13{last}",
    (8, 1): "Et*8|(t*8|)*6t*5{last}",
    (4, 2): "Et*8|(t*8|)*6t*5{last}",
    (16, 1): "Et*4|(t*4|)*14t{last}",
    (8, 2): "Et*4|(t*4|)*14t{last}",
    (4, 4): "Et*4|(t*4|)*14t{last}",
}
"""Megatron-Bridge's DeepSeek-V3 recipes, `set_deepseek_v3_pipeline_model_parallel_layout(cfg.model)` without a
layout (src/megatron/bridge/recipes/deepseek/deepseek_v3.py, its layout_map): (pp, vpp) -> Megatron's layout, the
last chunk's `{last}` the model's MTP modules then the loss ('m' * mtp_num_layers + 'L')."""

RECIPE_LAYOUTS: dict[str, dict[tuple[int, int], str]] = {"deepseek-v3": _DEEPSEEK_V3_LAYOUTS}
"""Model name (lower case, its start) -> the recipe's default pipeline layout per (pp, vpp)."""


def recipe_layout(row: dict[str, str], pp: int, vpp: int, mtp_layers: int) -> str:
    """The pipeline layout a Megatron-Bridge recipe sets by default (`pp_layout:set_layout(cfg.model)`, no layout
    named) for the row's model and (pp, vpp), in Megatron's layout syntax; ValueError naming why there is none."""
    table = _by_model(RECIPE_LAYOUTS, row)
    if table is None:
        raise ValueError(f"the recipe's default layout for '{row.get('model_name', '')}' is not in the sources read")
    layout = table.get((pp, vpp))
    if layout is None:
        raise ValueError(f"the recipe has no default layout for pp {pp}, vpp {vpp}")
    return layout.format(last="m" * mtp_layers + "L")


RECIPE_RECOMPUTE: dict[str, tuple[tuple[str, ...], bool]] = {
    # NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/perf_recipes/deepseek/gb300/deepseek_v3.py: every version
    # read with micro-batch 1 and the full-iteration CUDA graph (_enable_deepseek_full_iteration) sets
    # recompute_modules = [] ("Recompute stays off, matching the 256-GPU recipe"); the micro-batch-2 versions
    # without it recompute mla_up_proj
    "deepseek_v3_pretrain_256gpu_gb300_fp8mx_config": ((), True),
    # .../perf_recipes/gpt_oss/gb200/gpt_oss.py: the full-iteration MXFP8 variant clears the BF16 recipe's
    # layernorm + moe_act recompute (clear_recompute=True / recompute_modules = [])
    "gpt_oss_120b_pretrain_64gpu_gb200_fp8mx_config": ((), False),
}
"""Megatron-Bridge performance recipes whose selective-recompute modules a row leaves as 'base-recipe default':
recipe function -> (the modules it recomputes, whether the version read is also told apart by micro-batch 1); every
version read runs the full-iteration CUDA graph."""


def recipe_recompute(row: dict[str, str]) -> tuple[tuple[str, ...], str] | None:
    """The recompute modules of the Megatron-Bridge recipe a row names (its notes' 'recipe: ...::<function>'),
    with the note saying where they come from, when the row runs the version read (the full-iteration CUDA graph,
    and micro-batch 1 where the table says so); else None."""
    m = re.search(r"::(\w+)", row.get("notes", ""))
    if m is None or m.group(1) not in RECIPE_RECOMPUTE:
        return None
    modules, micro_batch_1 = RECIPE_RECOMPUTE[m.group(1)]
    settings = row.get("other_settings", "").lower()
    if not re.search(r"cuda_graph\s*=\s*full_iteration", settings):
        return None
    if micro_batch_1 and (_int_cell(row, "micro_batch") or 1) != 1:
        return None
    version = "micro-batch 1 with the full-iteration CUDA graph" if micro_batch_1 else "the full-iteration CUDA graph"
    what = ", ".join(modules) if modules else "nothing (recompute off)"
    return modules, f"base-recipe default: {m.group(1)} recomputes {what} in its version with {version}"
