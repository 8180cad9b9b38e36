"""Rows of `training_runs.csv` (any rows with its header) -> trainsim jobs and outcomes.

Everything comes from the row's own columns. Every value of the strategy, precision and architecture
columns either maps to a job field or skips the row with a reason "<category>: <detail>" (the report
counts skips by category). Only a cell that is empty or says "not stated" takes a documented default,
and that default is recorded in the outcome's tags (never silently). `other_settings` is free text:
settings trainsim can express are mapped, those that change the simulated step and cannot be expressed
skip the row, a strategy-sounding setting this module does not know skips it too, and anything else
(data loaders, logging, library versions) is recorded in the tags as not interpreted.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..strategy.tree import RECOMPUTE_MODULES, selective_mode
from .cases import MEMORY_METRIC, Outcome, skip
from .conventions import GPTShape, convention_of, iteration_flops
from .moe_rows import (
    ep_dispatcher,
    expert_tp,
    hybridep_sms,
    moe_column_fields,
    moe_model_fields,
    moe_note,
    published_architecture,
    recipe_layout,
    recipe_recompute,
    unstated_ep,
)
from .pipeline_splits import nanotron_stage_layers

REQUIRED_COLUMNS = ("case_id", "model_name", "arch", "gpu", "n_gpus", "flops_convention", "global_batch")


@dataclass
class RowJob:
    """A row turned into a job dict plus what is needed to convert the prediction back."""

    job: dict[str, Any]
    metric: str
    measured: float
    shape: GPTShape | None
    convention: str | None
    checkpointing: bool
    assumptions: dict[str, str] = field(default_factory=dict)


class RowSkip(Exception):
    """A row that cannot be expressed. `category` is what the report counts skips by; `detail` names the
    value. The skip reason is "<category>: <detail>"."""

    def __init__(self, category: str, detail: str) -> None:
        self.category, self.detail = category, detail
        super().__init__(f"{category}: {detail}")


MOE = "mixture of experts"
ARCH_MODELLED = "architecture not modelled"
ARCH_UNKNOWN = "architecture not understood"
SETTING = "setting not expressible"


def _cell(row: dict[str, str], key: str) -> str:
    return (row.get(key) or "").strip()


def _unstated(text: str) -> bool:
    """An empty cell, or one that says the source is silent ("not stated ...", "unknown")."""
    return not text or re.match(r"(not stated|unstated|unknown|\?)", text.lower()) is not None


def _num(row: dict[str, str], key: str) -> float | None:
    v = _cell(row, key)
    if not v:
        return None
    try:
        x = float(v)
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def _int(row: dict[str, str], key: str) -> int | None:
    v = _num(row, key)
    return None if v is None else int(round(v))


def _count(row: dict[str, str], key: str) -> int | None:
    """A whole number (degrees, batch sizes): empty -> None; '8', '8.0' or '8 (...)' -> 8; anything else skips."""
    v = _cell(row, key)
    if not v:
        return None
    m = re.fullmatch(r"(\d+)(?:\.0*)?\s*(?:\(.*\))?", v)
    if m is None:
        raise RowSkip("unreadable number", f"{key} = '{v}' is not a whole number")
    return int(m.group(1))


def _vpp(row: dict[str, str], pp: int, notes: dict[str, str]) -> int:
    """Model chunks per pipeline rank: a number ('2', '2 (interleaved)'); 'no'/'none' = 1; an empty cell is 1
    unless the row's pp_schedule (moe_runs) says interleaved; 'yes' without a number skips."""
    text = _cell(row, "vpp")
    t = text.lower()
    sched = _cell(row, "pp_schedule").lower()
    if not t:
        if "interleaved" in sched and pp > 1:
            raise RowSkip("virtual pipeline size not stated", f"pp_schedule '{_cell(row, 'pp_schedule')}' "
                          "without a vpp (model chunks per pipeline rank)")
        vpp = 1
        if pp > 1 and not sched:
            notes["vpp"] = "not stated: 1 (non-interleaved 1F1B)"
    elif m := re.match(r"(\d+)(?![\d.])", t):
        vpp = int(m.group(1))
    elif re.match(r"(no|none|off|false|n/?a)\b", t):
        vpp = 1
    elif re.match(r"(yes|true|on|interleaved)\b", t):
        raise RowSkip("virtual pipeline size not stated", f"vpp = '{text}': interleaved without its number of "
                      "model chunks per pipeline rank")
    else:
        raise RowSkip("vpp not understood", f"vpp = '{text}'")
    if sched and not sched.startswith("none"):  # moe_runs' pp_schedule column, where stated
        if "dualpipe" in sched or not re.search(r"1f1b", sched):
            raise RowSkip("pipeline schedule not expressible", f"pp_schedule '{_cell(row, 'pp_schedule')}'")
        if ("interleaved" in sched) != (vpp > 1):
            raise RowSkip("vpp not understood", f"pp_schedule '{_cell(row, 'pp_schedule')}' with vpp = {vpp}")
    return vpp


def hsdp_supported() -> bool:
    """Whether this trainsim expresses hybrid sharding (strategy.dp_replicate)."""
    from ..config import StrategySpec

    return "dp_replicate" in StrategySpec.model_fields


def _replicas(replicas: int, dp: int, text: str) -> dict[str, Any]:
    """strategy.dp_replicate for states sharded over dp / `replicas` ranks and replicated `replicas` times."""
    if replicas <= 1:
        return {}
    if not hsdp_supported():
        raise RowSkip("sharding not expressible", f"'{text}': hybrid sharding ({replicas} replicas of a "
                      "sharding group); trainsim shards over the whole data-parallel group")
    if dp % replicas or dp == replicas:
        raise RowSkip("sharding not expressible", f"'{text}': {replicas} replicas do not split dp = {dp} into "
                      "sharding groups of two or more ranks")
    return {"dp_replicate": replicas}


def _sharding(text: str, dp: int, gpus_per_node: int, notes: dict[str, str]) -> dict[str, Any]:
    """The `sharding` cell -> strategy keys (zero / fsdp, and dp_replicate for hybrid sharding: states sharded
    inside a group of dp / dp_replicate ranks and replicated across the groups)."""
    t = text.lower()
    if _unstated(t):
        if "distributed optimizer" in t:
            notes["sharding"] = "not stated: distributed optimizer (ZeRO-1)"
            return {"zero": 1}
        notes["sharding"] = "not stated: none (data parallelism replicates the model states)"
        return {}
    if re.match(r"(none|no\b|no_shard|off\b|n/a|ddp\b|plain ddp)", t):
        return {}
    hybrid = re.search(r"hsdp|hybrid[_ ]?shard", t) is not None
    if m := re.search(r"strategy\s*=\s*(optim_grads_params|optim_grads|optim|no_shard)\b", t):  # Megatron-FSDP
        out: dict[str, Any] = {"optim_grads_params": {"fsdp": True}, "optim_grads": {"zero": 2},
                               "optim": {"zero": 1}, "no_shard": {}}[m.group(1)]
    elif re.search(r"shard_grad_op|zero[-_ ]?(?:stage)?[-_ =]?2\b|hybrid_shard_zero2", t):
        out = {"zero": 2}
    elif re.search(r"full[_ ]shard|fully_shard|fsdp2|zero[-_ ]?(?:stage)?[-_ =]?3\b", t) or hybrid:
        out = {"fsdp": True}
    elif re.search(r"zero[-_ ]?(?:stage)?[-_ =]?1\b|distributed optimizer|dist(?:ributed)?[-_ ]opt", t):
        out = {"zero": 1}
    elif re.search(r"\bfsdp\b", t):
        notes["sharding"] = "FSDP without a sharding strategy: PyTorch's default FULL_SHARD"
        out = {"fsdp": True}
    else:
        raise RowSkip("sharding not understood", f"'{text}'")
    if not out:
        return out
    instances = re.search(r"(?:distributed-optimizer-instances|optimizer instances)\s*=?\s*(\d+)", t)
    replicate = re.search(r"replicat\w*\s*(?:degree|size|groups?)?\s*[=:]?\s*(\d+)", t)
    shard = re.search(r"(?:fsdp column|shard(?:ing)?[_ ](?:degree|group|size)|over all)\s*[=:]?\s*(\d+)", t)
    if instances:
        return {**out, **_replicas(int(instances.group(1)), dp, text)}
    if replicate:
        return {**out, **_replicas(int(replicate.group(1)), dp, text)}
    if shard:
        size = int(shard.group(1))
        if dp % size:
            raise RowSkip("sharding not expressible", f"'{text}': sharding groups of {size} do not divide dp = {dp}")
        return {**out, **_replicas(dp // size, dp, text)}
    if hybrid:
        if re.search(r"hybrid[_ ]shard", t):  # FSDP1's HYBRID_SHARD: FULL_SHARD inside a node, replicas across
            size = min(gpus_per_node, dp)
            notes["sharding"] = f"'{text}': PyTorch's HYBRID_SHARD shards inside a node ({size} ranks)"
            return {**out, **_replicas(dp // size, dp, text)}
        raise RowSkip("sharding not expressible", f"'{text}': HSDP without its shard or replicate degree")
    return out


_CORE_ATTN = {"core_attn", "core_attention", "attention core", "core attention"}


def _recompute(text: str, notes: dict[str, str]) -> str:
    """The `recompute` cell -> none | selective | full, or selective:<modules> where it names Megatron's
    recompute modules (selective alone: the attention core, Korthikanti et al., Megatron's default)."""
    t = text.lower().strip()
    if _unstated(t):
        notes["recompute"] = "not stated: Megatron default (none)"
        return "none"
    if re.match(r"(none|no|off|false|disabled|n/a)\b", t):
        return "none"
    if re.search(r"\bselective\b|\bsac\b", t):
        if _per_op_sac(t):
            notes["recompute"] = (f"'{text}': per-op selective activation checkpointing priced as selective "
                                  "(attention core recomputed)")
            return "selective"
        if m := re.search(r"selective_ac_option\s*=\s*'?(\d+)", t):
            raise RowSkip("recompute not expressible", f"'{text}': every {m.group(1)}th layer fully recomputed")
        if re.search(r"not resolved|base-recipe default|not stated", t):
            raise RowSkip("recompute not expressible", f"'{text}': selective recompute of unstated modules")
        m = re.search(r"modules\s*=\s*\[([^\]]*)\]", t) or re.search(r"selective\s*:\s*([a-z_, ]+)$", t)
        if m:
            mods = {x.strip("'\"") for x in re.split(r"[\s,]+", m.group(1).strip()) if x.strip("'\"")}
            if mods and mods <= _CORE_ATTN:
                return "selective"
            named = {("core_attn" if x in _CORE_ATTN else x) for x in mods}
            unknown = sorted(named - set(RECOMPUTE_MODULES))
            if unknown:
                raise RowSkip("recompute not expressible", f"selective recompute of {', '.join(unknown)}: not one "
                              f"of Megatron's recompute modules trainsim re-runs ({', '.join(RECOMPUTE_MODULES)})")
            notes["recompute_modules"] = ", ".join(sorted(named))
            return selective_mode(named)
        if re.fullmatch(r"selective\s*(\((core[_ ]attn|core attention|attention core|attention)\))?", t):
            return "selective"
        raise RowSkip("recompute not understood", f"'{text}'")
    if re.match(r"(full|yes|true|on)\b", t) or re.search(r"activation checkpointing on|gradient[_ ]checkpointing|"
                                                         r"checkpoint-activations", t):
        if re.search(r"method\s*=\s*block|\bblock\b|\bpartial\b|some layers", t):
            raise RowSkip("recompute not expressible", f"'{text}': only some layers recomputed")
        return "full"
    raise RowSkip("recompute not understood", f"'{text}'")


def _per_op_sac(recompute: str) -> bool:
    """A `recompute` cell naming per-op selective activation checkpointing (torchtitan's op SAC)."""
    return bool(re.search(r"per[- ]op|op[- ]level|selective_ac_option\s*=\s*'?op", recompute.lower()))


def _nemo_recipe(row: dict[str, str]) -> bool:
    """A run from NVIDIA's NeMo / Megatron-Bridge performance tables (their recipes' settings apply)."""
    text = " ".join(_cell(row, c) for c in ("source", "source_group", "other_settings")).lower()
    return "nemo" in text or "megatron-bridge" in text


def _seq_parallel(text: str, tp: int, tp_comm_overlap: bool, notes: dict[str, str]) -> bool:
    t = text.lower()
    if _unstated(t):
        if tp == 1:
            return False
        if tp_comm_overlap:
            notes["sequence_parallel"] = "not stated: on with TP (required by --tp-comm-overlap)"
            return True
        notes["sequence_parallel"] = "not stated: off (Megatron's default without --sequence-parallel)"
        return False
    if re.match(r"(yes|true|on|enabled)\b", t):
        if tp == 1:
            notes["sequence_parallel"] = f"'{text}' with tp = 1: a no-op (Megatron turns it off)"
            return False
        return True
    if re.match(r"(no|false|off|disabled|none|n/?a)\b", t):
        return False
    raise RowSkip("sequence parallel not understood", f"seq_parallel = '{text}'")


def _dtype(precision: str, gpu: str, notes: dict[str, str]) -> str:
    """The compute dtype a `precision` cell names (FP8 means per-tensor-scaled FP8 GEMMs)."""
    p = precision.lower()
    if "nvfp4" in p:
        notes["precision"] = (f"'{precision}': Transformer Engine's NVFP4 recipe, every weighted GEMM (forward, data "
                              "and weight gradients) at the FP4 tensor-core rate with its casts (row- and column-wise "
                              "4-bit copies, E4M3 scales per 16); a recipe's layers kept in BF16, if any, are priced in FP4 too")
        return "fp4"
    if re.search(r"mxfp4|\bfp4\b", p):
        raise RowSkip("precision not modelled", f"'{precision}': FP4 training other than NVFP4")
    if re.search(r"mxfp8|fp8-mx|block[- ]?(?:wise|scal)|1x32|32x32|128x128|finer-grained", p):
        notes["precision"] = (f"'{precision}': block-scaled FP8 GEMMs priced at the FP8 tensor-core rate (Blackwell "
                              "applies MXFP8's 1x32 block scales in the tensor cores; Hopper's blockwise kernels in "
                              "the GEMM)")
        return "fp8"
    if re.search(r"fp8|float8|e4m3", p):
        return "fp8"
    if re.search(r"bf16|bfloat16", p):
        return "bf16"
    if re.search(r"fp16|float16|\bhalf\b", p):
        return "fp16"
    if "tf32" in p:
        return "tf32"
    if re.search(r"fp32|float32|single precision", p):
        return "fp32"
    if re.search(r"\bamp\b", p):
        notes["precision"] = f"'{precision}': torch.autocast's default dtype (fp16)"
        return "fp16"
    if _unstated(p):
        g = gpu.lower()
        dtype = "bf16" if any(k in g for k in ("a100", "h100", "h200", "h800", "b200", "b300")) else "fp16"
        notes["precision"] = f"not stated: {dtype} mixed precision (what the GPU trains in)"
        return dtype
    raise RowSkip("precision not understood", f"'{precision}'")


_PURE_PRECISION = r"bf16-true|full bf16|pure bf16|bf16 params, grads and \w*\s*states"
"""A precision cell that keeps weights, gradients and optimizer states all in bf16 (no fp32 master)."""


def _master_weights(precision: str, notes: dict[str, str]) -> bool:
    """Whether the run keeps an fp32 master copy (mixed precision) or everything in the training dtype."""
    if re.search(_PURE_PRECISION, precision.lower()):
        notes["precision"] = f"'{precision}': weights, gradients and optimizer states in bf16, no fp32 master"
        return False
    return True


def _torch_ddp_buckets(row: dict[str, str]) -> bool:
    """Whether the row's data parallelism is torch DistributedDataParallel with its default bucket copies:
    Lightning (LitGPT) runs it through Fabric's DDPStrategy, which leaves gradient_as_bucket_view False, unless
    the Thunder compiler runs its own ddp transform. Megatron's DDP keeps one contiguous gradient buffer."""
    framework = " ".join(_cell(row, c) for c in ("source", "source_group")).lower()
    settings = _cell(row, "other_settings").lower()
    return re.search(r"litgpt|lightning", framework) is not None and re.search(r"compiler\s*=\s*thunder",
                                                                              settings) is None


def _framework_tensors(row: dict[str, str], model: dict[str, Any], sp: bool, notes: dict[str, str]) -> None:
    """How the row's framework stores tensors for backward (model.loss / sp_saves / glu), where it is not
    Megatron's (the defaults). nanotron (bench_cluster's Llama): sharded_cross_entropy upcasts with a second
    fp32 tensor, GLUActivation runs silu then multiply, and the synchronous REDUCE_SCATTER column linear keeps
    its all-gathered input (tp_linear_async_communication false; the async one keeps the shard)."""
    framework = " ".join(_cell(row, c) for c in ("source", "source_group")).lower()
    if "nanotron" not in framework or model.get("mlp") != "swiglu":
        return
    model.setdefault("loss", "upcast_twice")
    model["glu"] = "unfused"
    said = ["sharded_cross_entropy keeps a second fp32 copy of the logits", "GLUActivation keeps silu's output"]
    if sp and re.search(r"tp_linear_async_communication\s*=\s*false", _cell(row, "other_settings").lower()):
        model["sp_saves"] = "gathered"
        said.append("synchronous column linears keep their all-gathered input")
    notes["saved_tensors"] = "nanotron: " + "; ".join(said)


def _nanotron_split(model: dict[str, Any], pp: int, vpp: int, notes: dict[str, str]) -> list[int]:
    """nanotron's pipeline layout: layers go to ranks by compute cost, not count (pipeline_splits)."""
    if vpp > 1:
        raise RowSkip(SETTING, f"nanotron with vpp = {vpp} (its pipeline engine runs one chunk per rank)")
    if model.get("mlp") != "swiglu" or not model.get("ffn") or not model.get("vocab"):
        raise RowSkip(SETTING, "nanotron pipeline split of a non-Llama model (its block costs are per model)")
    counts = nanotron_stage_layers(model["layers"], model["hidden"], model["heads"], model["ffn"], model["vocab"],
                                   pp)
    notes["pipeline_split"] = (f"nanotron balances blocks by compute cost (build_model: decoder layer 4*a*d*h + "
                               f"3*ffn*h, lm_head v*h; a rank takes blocks until the running cost passes "
                               f"total*(r+1)/pp): layers per stage {counts}")
    return counts


def _optimizer_column(row: dict[str, str], notes: dict[str, str]) -> dict[str, Any]:
    """The `optimizer` cell -> simulation keys (optimizer, optimizer_in_backward). Adam, AdamW and LAMB keep two
    moments (adam); 8-bit Adam/AdamW keeps them block-wise quantised (adam_8bit); Adafactor a factored second
    moment (adafactor); Muon one momentum per block matrix (muon); other optimizers skip. An absent
    column says nothing (Adam, as every other file's rows); a present but empty one is noted."""
    if "optimizer" not in row:
        return {}
    text = _cell(row, "optimizer")
    t = text.lower()
    if _unstated(t):
        notes["optimizer"] = "not stated: Adam"
        return {}
    out: dict[str, Any] = {}
    if re.search(r"optimizer_in_bwd|(?:fused|step) into backward|in[- ]backward", t):
        out["optimizer_in_backward"] = True
    if re.search(r"8[- ]?bit|adam8bit|adamw8bit", t):
        out["optimizer"] = "adam_8bit"
        if "paged" in t:
            raise RowSkip(SETTING, f"optimizer '{text}': paged 8-bit states live in CUDA unified memory, "
                          "outside PyTorch's allocator")
        if re.search(r"not stated|unstated", t):
            notes["optimizer"] = f"'{text}': priced as block-wise 8-bit Adam (bitsandbytes / torchao)"
    elif re.search(r"\b(?:adamw?|lamb)\b", t):
        if re.search(r"\blamb\b", t):
            notes["optimizer"] = f"'{text}': LAMB keeps Adam's two moments"
    elif re.search(r"adafactor", t):
        out["optimizer"] = "adafactor"  # Hugging Face's: no first moment, the second factored per matrix
        notes["optimizer"] = f"'{text}': factored second moments; the step's full-size temporaries not priced"
    elif re.fullmatch(r"muon\b.*", t):
        out["optimizer"] = "muon"  # Megatron-Core's: one momentum per block matrix, AdamW for the rest
        notes["optimizer"] = (f"'{text}': one momentum per block matrix; the Newton-Schulz iteration's "
                              "temporaries (and gathered matrices under a distributed optimizer) not priced")
    else:
        raise RowSkip(SETTING, f"optimizer '{text}': trainsim prices Adam-style and factored states and Muon's "
                      "(adam, adam_8bit, adafactor, muon)")
    return out


def cluster_spec(row: dict[str, str], n_gpus: int, notes: dict[str, str]) -> dict[str, Any] | str:
    """The job's cluster section for a row's GPU and n_gpus (gpu, gpu_mem_gb, gpus_per_node, intra_node_link and
    inter_node_net columns where it has them), assumptions in `notes`; why not, where no preset fits."""
    gpu = row["gpu"].lower()
    mem = _int(row, "gpu_mem_gb")
    gpn = _int(row, "gpus_per_node") or 8
    intra = row.get("intra_node_link", "").lower()
    net = row.get("inter_node_net", "").lower()
    out: dict[str, Any]
    if "a100" in gpu:
        out = {"name": "dgx-a100", "gpu": "a100-40gb" if mem == 40 or "40gb" in gpu else "a100-80gb"}
    elif "h100" in gpu:
        out = {"name": "dgx-h100"}
        if mem == 96 or "96g" in gpu:  # the 96 GB H100 ships with a 500 W limit (Meta Grand Teton)
            out["gpu"] = "h100-96gb-500w"
    elif "h200" in gpu:
        out = {"name": "hgx-h200"}
    elif "h800" in gpu:
        out = {"name": "dgx-h800"}
    elif "b200" in gpu and "gb200" not in gpu:
        out = {"name": "dgx-b200"}
    elif "b300" in gpu and "gb300" not in gpu:
        out = {"name": "dgx-b300"}
    elif "gb200" in gpu or "gb300" in gpu:  # every GPU of an NVL72 rack shares one NVLink domain: its 'node'
        out = {"name": "gb200-nvl72" if "gb200" in gpu else "gb300-nvl72"}
        racks = -(-n_gpus // 72)
        while n_gpus % racks:  # the fewest racks that hold the job evenly (256 GPUs: 4 racks of 64)
            racks += 1
        gpn = out["gpus_per_node"] = n_gpus // racks
        if racks > 1 and gpn < 72:
            notes["nvlink_domain"] = (f"not stated: {n_gpus} GPUs as {racks} NVL72 racks of {gpn} (the fewest racks "
                                      "that hold them evenly), NVLink inside a rack, InfiniBand across")
    elif "v100" in gpu:
        dev = "v100-sxm2-16gb" if mem == 16 or "16gb" in gpu else "v100-sxm2-32gb"
        if "cube" in intra or ("sxm2" in gpu and "nvswitch" not in intra):
            out = {"name": "dgx1-v100", "gpu": dev}
        else:  # DGX-2(H): 16 V100 on NVSwitch, 6 NVLink2 x 25 GB/s = 150 GB/s per direction
            out = {"name": "dgx-a100", "gpu": dev, "gpus_per_node": gpn, "intra_node_gbps": 150.0}
    else:
        return f"unknown GPU '{row['gpu']}'"
    if out["name"] == "dgx1-v100" and n_gpus < 8:  # the preset's 8 GPUs, whatever gpus_per_node says
        if n_gpus != 1:
            return f"{n_gpus} GPUs of a DGX-1 hybrid cube-mesh is not expressible"
        out = {"name": "dgx-a100", "gpu": out["gpu"]}  # one GPU: no interconnect involved
    if out["name"] != "dgx1-v100" and (n_gpus < gpn or gpn != 8):
        gpn = min(gpn, n_gpus)
        out["gpus_per_node"] = gpn
    out["nodes"] = max(1, n_gpus // gpn)
    m = re.search(r"(\d+)\s*x\s*(\d+)\s*gb/s", net)
    m2 = re.search(r"(\d+)\s*gbps node-to-node", net)
    if m:
        out["nics_per_node"], out["nic_gbps"] = int(m.group(1)), int(m.group(2)) / 8.0
    elif m2:
        out["nics_per_node"], out["nic_gbps"] = 8, int(m2.group(1)) / 8.0 / 8.0
    elif out["nodes"] > 1 and out["name"].endswith("nvl72"):
        out["nics_per_node"] = gpn  # the racks' GPUs each keep their own NIC
        notes["network"] = "not stated: the preset's one NIC per GPU"
    elif out["nodes"] > 1:
        notes["network"] = "not stated: preset's 8 NICs per node"
    return {k: v for k, v in out.items() if v is not None}


_SDPA_FRAMEWORKS = r"torchtune|litgpt|lightning|torchtitan"
"""Frameworks whose attention is torch.nn.functional.scaled_dot_product_attention (its flash backend for
fp16/bf16 on Ampere and newer): torchtune's MultiHeadAttention, LitGPT's CausalSelfAttention (eager too),
torchtitan's Attention."""


def _attention(row: dict[str, str], notes: dict[str, str]) -> str:
    """The attention kernel the run used: as stated in its text, else the framework's documented default."""
    text = " ".join(row.get(c) or "" for c in ("arch", "other_settings")).lower()
    if "triton" in text:  # llm-foundry: attn_impl triton, submit_benchmarks.py's default for its tables
        return "triton"
    if any(k in text for k in ("flashattention-3", "flash-attention-3", "flash attention 3", "fa3")):
        return "flash3"
    if "cudnn" in text or "transformer engine" in text or re.search(r"kernels\s*=\s*te\b", text):
        return "cudnn"  # Transformer Engine's fused attention (NeMo AutoModel: kernels=TE)
    if "flash" in text:
        return "flash"
    gpu = row.get("gpu", "").lower()
    framework = " ".join(row.get(c) or "" for c in ("source", "source_group")).lower()
    if re.search(_SDPA_FRAMEWORKS, framework) and any(g in gpu for g in ("a100", "h100", "h200", "h800", "b200",
                                                                     "b300")):
        notes["attention"] = ("not stated: torchtune, LitGPT and torchtitan call PyTorch's "
                              "scaled_dot_product_attention, FlashAttention-2 kernels from Ampere on")
        return "flash"
    if "megatron" in (row.get("source") or "").lower() and any(g in gpu for g in ("h100", "h200", "h800", "b200",
                                                                                 "b300")):
        notes["attention"] = ("not stated: Megatron-Core on Hopper and Blackwell (b200, gb200) runs Transformer "
                              "Engine's cuDNN fused attention")
        return "cudnn"
    notes["attention"] = "not stated: unfused (softmax + two batched GEMMs, the framework's default then)"
    return "unfused"


# --- architecture ------------------------------------------------------------------------------------------

_UNMODELLED_ARCH: tuple[tuple[str, str, frozenset[str]], ...] = (
    # (pattern, what, the model keys that express it where a row's columns give them: moe_rows)
    (r"\bmla\b|multi-latent", "multi-latent attention (MLA)", frozenset({"kv_lora_rank"})),
    (r"sliding[- ]window|\bswa\b", "sliding-window attention", frozenset({"sliding_window"})),
    (r"mamba|\bssm\b|hybrid", "Mamba / hybrid mixer layers", frozenset({"layer_pattern"})),
    (r"parallel (?:attention|block|layers?|attn)", "parallel attention and MLP blocks", frozenset()),
    (r"softmax sinks|attention sinks", "attention sinks", frozenset({"attention_sinks"})),
    (r"encoder-decoder|\bt5\b", "encoder-decoder", frozenset()),
    (r"geglu|reglu", "gated GeLU/ReLU MLP", frozenset()),
    (r"\bnope\b|no pos(?:ition)?[- ]emb", "no position encoding", frozenset()),
)
_MLP = ((r"swiglu|swi-glu|silu[- ]?glu", "swiglu"),
        (r"squared[- ]?relu|relu\s*(?:\^|\*\*)\s*2|relu²|\brelu2\b|relu squared", "relu2"),
        (r"gelu", "gelu"))
_POSITION = ((r"alibi", "alibi"), (r"\brope\b|rotary", "rope"),
             (r"learned pos|learned[- ]position|absolute pos|learned_absolute|learned abs", "learned"))
_NORM = ((r"rms ?norm", "rmsnorm"), (r"(?<!qk-)layer ?norm|\bln\b", "layernorm"))  # qk-layernorm: extra norms
_LLAMA = r"llama|mistral|qwen|\byi\b|gemma|deepseek|kimi"
_GPT = r"gpt|\bmpt\b|bloom|\bopt\b|nemotron|falcon|megatron|starcoder"
_TIED_MODELS = r"llama[- ]?3\.2[- ]?(?:1|3)b\b"
"""Published models of the Llama family whose Hugging Face config.json sets tie_word_embeddings: true (Meta's
Llama 3.2 1B and 3B), unlike the family's untied default."""
LLAMA_FEATURES = {"norm": "rmsnorm", "mlp": "swiglu", "position": "rope", "bias": False, "dropout": False,
                  "tied_embeddings": False}
"""The Llama family as the custom transformer: what an arch text saying 'Llama' means unless it says otherwise."""
GPT_FEATURES = {"norm": "layernorm", "mlp": "gelu", "position": "learned", "bias": True, "dropout": True,
                "tied_embeddings": True}
"""The GPT family (GPT-2/3, Megatron, MPT, BLOOM, ...): the custom transformer's own defaults."""


def _one_of(text: str, table: tuple[tuple[str, str], ...], what: str) -> str | None:
    found = {v for pat, v in table if re.search(pat, text)}
    if len(found) > 1:
        raise RowSkip(ARCH_UNKNOWN, f"'{text}' names more than one {what} ({', '.join(sorted(found))})")
    return found.pop() if found else None


def _moe(row: dict[str, str], arch: str) -> str | None:
    """What says the row is a mixture of experts (its arch, n_experts, other_settings or model name), or None."""
    experts = _num(row, "n_experts")
    settings = _cell(row, "other_settings").lower()
    name = _cell(row, "model_name")
    if re.search(r"\bmoe\b|mixture[- ]of[- ]experts|\bexperts?\b", arch):
        return f"'{_cell(row, 'arch')}'"
    if experts and experts > 1:
        return f"{int(experts)} experts (n_experts)"
    if (m := re.search(r"num-experts\s*=\s*(\d+)", settings)) and int(m.group(1)) > 1:
        return f"num-experts={m.group(1)} (other_settings)"
    if re.search(r"\bmoe\b|latentmoe|mixtral|-a\d+(\.\d+)?b\b", name.lower()):
        return f"'{name}' (model name)"
    return None


def _arch_features(arch: str) -> dict[str, Any]:
    """Features the arch text states explicitly (mlp, position, norm, bias, tied_embeddings)."""
    out: dict[str, Any] = {}
    for key, table in (("mlp", _MLP), ("position", _POSITION), ("norm", _NORM)):
        v = _one_of(arch, table, key)
        if v is not None:
            out[key] = v
    if re.search(r"\brelu\b(?!\s*(?:\^|\*\*|2|²|squared))", arch) and "mlp" not in out:
        raise RowSkip(ARCH_MODELLED, f"'{arch}': ReLU MLP")
    if re.search(r"no bias|bias-free|without bias|no biases", arch):
        out["bias"] = False
    if re.search(r"untied|untie", arch):
        out["tied_embeddings"] = False
    elif re.search(r"tied (?:word )?embed", arch):
        out["tied_embeddings"] = True
    return out


def _is_resnet(name: str) -> bool:
    return "resnet-50" in name.lower() or "resnet50" in name.lower()


def _model(row: dict[str, str], arch: str, settings: _Settings, notes: dict[str, str],
           read: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The model keys of a row; `read`: the model keys its expert columns already gave (moe_rows), whose
    features (multi-latent attention, sliding windows, attention sinks) are then no blocker."""
    name = row.get("model_name", "")
    if _is_resnet(name):
        return {"name": "resnet50"}
    for pat, what, keys in _UNMODELLED_ARCH:
        if keys & read:
            continue
        if re.search(pat, arch) or re.search(pat, _cell(row, "attention").lower()):
            raise RowSkip(ARCH_MODELLED, f"{what} ('{row.get('arch')}')")
    if "cnn" in arch:
        raise RowSkip(ARCH_MODELLED, f"CNN '{name}' is not in the model zoo")
    dims: dict[str, int | None] = {k: _count(row, c) for k, c in (
        ("layers", "n_layers"), ("hidden", "hidden"), ("heads", "n_heads"), ("kv_heads", "n_kv_heads"),
        ("ffn", "ffn_hidden"), ("vocab", "vocab"), ("seq_len", "seq_len"))}
    if any(dims[k] is None for k in ("layers", "hidden", "heads", "seq_len")):
        raise RowSkip("missing column", "architecture columns (n_layers/hidden/n_heads/seq_len)")
    given = {k: v for k, v in dims.items() if v is not None}
    if "bert" in arch:
        if re.search(r"classification head|classifier|sequenceclassification", arch + " " + name.lower()):
            notes["head"] = ("sequence classification (BertForSequenceClassification): pooler, 2-label classifier "
                             "and loss, no vocabulary logits")
            return {"name": "bert-large", "head": "classifier", **given}
        return {"name": "bert-large", **given}
    if re.search(_LLAMA, arch) or ("swiglu" in arch and not re.search(_GPT, arch)):
        family, base = "Llama", LLAMA_FEATURES
    elif re.search(_GPT, arch):
        family, base = "GPT", GPT_FEATURES
    elif re.search(_LLAMA, name.lower()):  # an arch text naming no family ("MoE (GQA ...)"): the model's name
        family, base = "Llama", LLAMA_FEATURES
        notes["family"] = f"'{name}': the Llama family's layers (the arch text names no family)"
    elif re.search(r"nemotron[- ]?(?:3|h)\b", name.lower()):  # Nemotron-H: RMSNorm, squared-ReLU MLPs, no bias
        family, base = "Llama", {**LLAMA_FEATURES, "mlp": "relu2"}
        notes["family"] = (f"'{name}': Nemotron-H's layers (RMSNorm, squared-ReLU experts, no biases, untied); its "
                           "attention layers have no position encoding, priced with RoPE's small element-wise op")
    elif re.search(r"gpt-oss", name.lower()):  # RMSNorm, SwiGLU, RoPE, untied, biased attention projections
        family, base = "Llama", {**LLAMA_FEATURES, "bias": True}
        notes["family"] = (f"'{name}': the Llama family's layers with biases (gpt-oss: RMSNorm, SwiGLU, RoPE, biased "
                           "attention projections; its clamped SwiGLU priced as SwiGLU)")
    else:
        raise RowSkip(ARCH_UNKNOWN, f"'{row.get('arch')}' is no transformer family trainsim knows (GPT, MPT, "
                      "BLOOM, Nemotron, Llama, BERT)")
    stated = _arch_features(arch)
    for key, value in settings.features.items():
        if key in stated and stated[key] != value:
            raise RowSkip(ARCH_UNKNOWN, f"arch says {key} {stated[key]}, other_settings says {value}")
        stated[key] = value
    if "tied_embeddings" not in stated and re.search(_TIED_MODELS, name.lower()):
        stated["tied_embeddings"] = True
        notes["tied_embeddings"] = f"not stated: '{name}' ties its embeddings (tie_word_embeddings in its config)"
    features = {**base, **stated}
    attention = _cell(row, "attention").lower()
    if re.search(r"qk[- _]?(?:layer)?norm", arch + " " + attention):
        features["qk_norm"] = True  # Qwen3's q_norm / k_norm, Megatron's --qk-layernorm
    head_dim, heads, hidden = _count(row, "head_dim"), dims["heads"], dims["hidden"]
    mla = re.search(r"\bmla\b|multi-latent", arch + " " + attention)
    if head_dim and heads and hidden and head_dim * heads != hidden and not mla:  # MLA's head sizes: moe_rows
        features["head_size"] = head_dim  # heads x head_dim wider (or narrower) than hidden: Qwen3, Gemma
    unstated = [f"{k} {v}" for k, v in base.items() if k not in stated and k != "dropout"]
    if unstated:
        notes["architecture"] = f"not stated: {', '.join(unstated)} ({family} family)"
    if family == "GPT":  # the custom model's own defaults need not be spelt out
        features = {k: v for k, v in features.items() if k in stated}
    if dims["kv_heads"] is None:
        if re.search(r"\bmqa\b|multi-query", arch):
            given["kv_heads"] = 1
        elif re.search(r"\bgqa\b", arch) and not re.search(r"\bmha\b", arch):
            raise RowSkip("missing column", "n_kv_heads of a GQA model")
        else:
            given["kv_heads"] = dims["heads"]
    if dims["ffn"] is None:
        if features.get("mlp") == "swiglu":
            raise RowSkip("missing column", "ffn_hidden of a SwiGLU model (no standard width)")
        notes["ffn"] = "not stated: 4 x hidden"
    if dims["vocab"] is None:
        notes["vocab"] = "not stated: 50257 (GPT-2 BPE)"
    return {"name": "custom", **given, **features}


# --- other_settings ----------------------------------------------------------------------------------------

@dataclass
class _Settings:
    """What the `other_settings` cell says, as far as it changes the job."""

    overlap_grad_reduce: bool | None = None
    overlap_param_gather: bool | None = None
    tp_comm_overlap: bool | None = None
    ep_overlap: bool | None = None  # Megatron --overlap-moe-expert-parallel-comm (strategy.ep_overlap)
    p2p_scatter_gather: bool | None = None
    schedule: str | None = None
    attention: str | None = None
    optimizer_instances: int = 1
    optimizer: str | None = None  # adam_8bit where other_settings names an 8-bit Adam
    fp8_params: bool = False  # FP8 GEMM weights kept and gathered in FP8 (simulation.fp8_params)
    offload_activations: bool = False  # checkpointed layer inputs in CPU memory (strategy.offload_activations)
    stages: dict[str, int] = field(default_factory=dict)  # first_stage_layers / last_stage_layers
    accounted: set[str] = field(default_factory=set)  # embedding / loss counted in the pipeline split (Megatron)
    recipe_layout: bool = False  # pp_layout:set_layout(cfg.model): the recipe's default layout (moe_rows)
    cuda_graphs: str | list[str] | None = None  # Megatron-Bridge's cuda_graph=impl:scope (strategy.cuda_graphs)
    fused_experts: bool = False  # a fused grouped expert MLP (cuteDSL, TE op fuser, torch_mm): model.expert_gemm
    layout: str | None = None  # Megatron's pipeline layout ('Et*4|(t*4|)*14tmL'), expanded: chunks split by '|'
    features: dict[str, Any] = field(default_factory=dict)
    mla: dict[str, int] = field(default_factory=dict)  # Megatron's MLA flags (--multi-latent-attention: "on")
    dropout: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)


def _on(m: re.Match[str], group: int = 1) -> bool:
    v = m.group(group) if m.lastindex and m.lastindex >= group else None
    return v is None or v.strip() in ("true", "on", "1", "yes")


Action = Callable[[re.Match[str], "_Settings"], None]


def _set(key: str, value: Any = None) -> Action:
    """Set a strategy setting: to `value`, or to whether the flag is on (a bare flag, =true/on)."""
    def act(m: re.Match[str], st: _Settings) -> None:
        setattr(st, key, _on(m) if value is None else value)
    return act


def _feature(key: str, value: Any) -> Action:
    """Set a model feature: to `value` when the flag is on, or to what a callable `value` reads off the match."""
    def act(m: re.Match[str], st: _Settings) -> None:
        if callable(value):
            st.features[key] = value(m)
        elif _on(m):
            st.features[key] = value
    return act


def _attn(kernel: str, override: bool = True) -> Action:
    def act(m: re.Match[str], st: _Settings) -> None:
        if override or st.attention is None:
            st.attention = kernel
    return act


def _account_for(m: re.Match[str], st: _Settings) -> None:
    """Megatron's --account-for-embedding/loss-in-pipeline-split: the embedding (loss) counts as a layer of the
    first (last) virtual stage in the even split."""
    if _on(m, 2):
        st.accounted.add(m.group(1))


def _expand_layout(text: str) -> str:
    """Megatron's --pipeline-model-parallel-layout with its repeats written out: 'x*n' repeats the letter before
    it and '(...)*n' the group, e.g. 'Et*2|(t*2|)*2tmL' -> 'Ett|tt|tt|tmL'."""
    group = re.compile(r"\(([^()]*)\)\*(\d+)")
    while (m := group.search(text)) is not None:
        text = text[:m.start()] + m.group(1) * int(m.group(2)) + text[m.end():]
    return re.sub(r"([a-z])\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)


def _layout(m: re.Match[str], st: _Settings) -> None:
    """A pipeline layout string (Megatron-Bridge's pp_layout): kept expanded for _layout_split."""
    st.layout = _expand_layout(m.group(1).replace(" ", ""))


def _layout_split(layout: str, layers: int, mtp: int, pp: int, vpp: int, notes: dict[str, str]) -> list[int]:
    """Transformer layers per pipeline chunk from a pipeline layout: its '|'-separated chunks (pp x vpp, in
    pipeline order), 't' a transformer layer, 'E' the embedding (first chunk), 'm' a multi-token-prediction
    module and 'L' the loss (last chunk, where trainsim places them)."""
    chunks = layout.split("|")
    where = f"pipeline layout '{layout}'"
    if len(chunks) != pp * vpp:
        raise RowSkip(SETTING, f"{where}: {len(chunks)} chunks for pp x vpp = {pp * vpp}")
    if not re.fullmatch(r"[etml|]*", layout) or "e" not in chunks[0] or "l" not in chunks[-1]:
        raise RowSkip(SETTING, f"{where}: the embedding first and the loss last, transformer layers (t) and "
                      "MTP modules (m) between, are what trainsim places")
    if any("m" in c for c in chunks[:-1]) or chunks[-1].count("m") != mtp:
        raise RowSkip(SETTING, f"{where}: {mtp} multi-token-prediction module(s), all on the last chunk")
    counts = [c.count("t") for c in chunks]
    if sum(counts) != layers:
        raise RowSkip(SETTING, f"{where}: {sum(counts)} transformer layers, the model has {layers}")
    notes["stage_layers"] = f"Megatron pipeline layout: {counts} layers per chunk"
    return counts


def _accounted_split(layers: int, pp: int, vpp: int, accounted: set[str], notes: dict[str, str]) -> list[int]:
    """Transformer layers per pipeline chunk (pp x vpp, pipeline order) when Megatron counts the embedding and/or
    the loss as a layer (megatron/core/transformer/transformer_block.py, get_num_layers_to_build): the layers
    plus those counted share the chunks evenly, the first chunk gives one of its share to the embedding and the
    last one to the loss."""
    chunks = pp * vpp
    total = layers + len(accounted)
    if pp == 1 or total % chunks:
        raise RowSkip(SETTING, f"{layers} layers + {'/'.join(sorted(accounted))} over pp x vpp = {chunks} chunks "
                      "(Megatron needs them to divide evenly)")
    counts = [total // chunks] * chunks
    counts[0] -= "embedding" in accounted
    counts[-1] -= "loss" in accounted
    notes["stage_layers"] = (f"{', '.join(sorted(accounted))} counted as a layer in the pipeline split "
                             f"(Megatron's account-for-*-in-pipeline-split): {counts} layers per chunk")
    return counts


def _stage_layers(key: str) -> Action:
    """Megatron's --decoder-first/last-pipeline-num-layers N: an uneven first or last pipeline stage."""
    def act(m: re.Match[str], st: _Settings) -> None:
        st.stages[key] = int(m.group(1))
    return act


def _cuda_graph(m: re.Match[str], st: _Settings) -> None:
    """Megatron-Bridge's `cuda_graph=IMPL:SCOPE` (moe_runs.csv): full_iteration, transformer_engine with the modules
    captured ('attn/moe_router/...'), or none; a Transformer Engine graph without its scope is recorded, not priced."""
    impl, scope = m.group(1), [s for s in m.group(2).split("/") if s]
    if impl == "full_iteration":
        st.cuda_graphs = "full_iteration"
    elif impl == "none":
        st.cuda_graphs = "none"
    elif scope:
        st.cuda_graphs = scope
    else:
        st.notes.append("CUDA graphs (Transformer Engine, scope not stated) not modelled")


def _note(text: str) -> Action:
    def act(m: re.Match[str], st: _Settings) -> None:
        st.notes.append(text)
    return act


def _skip(category: str, detail: str) -> Action:
    def act(m: re.Match[str], st: _Settings) -> None:
        raise RowSkip(category, f"{detail} ('{m.string}')")
    return act


_MLA_FLAGS = {"q-lora-rank": "q_lora_rank", "kv-lora-rank": "kv_lora_rank", "qk-head-dim": "qk_head_dim",
              "qk-pos-emb-head-dim": "qk_rope_dim", "v-head-dim": "v_head_size"}
MEGATRON_MLA_DEFAULTS = {"q_lora_rank": 0, "kv_lora_rank": 32, "qk_head_dim": 128, "qk_rope_dim": 64,
                         "v_head_size": 128}
"""Megatron-LM's multi-latent-attention flag defaults (megatron/training/arguments.py: --q-lora-rank None, i.e. no
query compression, --kv-lora-rank 32, --qk-head-dim 128, --qk-pos-emb-head-dim 64, --v-head-dim 128)."""


def _mla(m: re.Match[str], st: _Settings) -> None:
    """Megatron's multi-latent attention flags, kept for _mla_keys: --multi-latent-attention and its sizes."""
    if m.group(1) is None:
        st.mla["on"] = 1
    else:
        st.mla[_MLA_FLAGS[m.group(1)]] = int(m.group(2))


def _mla_keys(st: _Settings, notes: dict[str, str]) -> dict[str, int]:
    """The model keys of Megatron's MLA flags (head_size = qk-head-dim + qk-pos-emb-head-dim: the query/key head
    with its RoPE part); {} without --multi-latent-attention (the size flags are then inert)."""
    if not st.mla.get("on"):
        if st.mla:
            notes["mla"] = "MLA size flags without --multi-latent-attention: inert in Megatron"
        return {}
    got = {k: st.mla.get(k, v) for k, v in MEGATRON_MLA_DEFAULTS.items()}
    unstated = [k for k in MEGATRON_MLA_DEFAULTS if k not in st.mla]
    if unstated:
        notes["mla"] = f"not stated: Megatron's defaults for {', '.join(unstated)}"
    return {"kv_lora_rank": got["kv_lora_rank"], "q_lora_rank": got["q_lora_rank"],
            "head_size": got["qk_head_dim"] + got["qk_rope_dim"], "qk_rope_dim": got["qk_rope_dim"],
            "v_head_size": got["v_head_size"]}


def _ok(m: re.Match[str], st: _Settings) -> None:
    return None


_LORA_MODULES = {"q": "q", "q_proj": "q", "k": "k", "k_proj": "k", "v": "v", "v_proj": "v", "o": "o",
                 "output_proj": "o", "o_proj": "o", "mlp": "mlp", "output": "output", "lm_head": "output"}
"""torchtune's / PEFT's names of the matrices LoRA adapts -> model.lora_targets."""


def _lora(m: re.Match[str], st: _Settings) -> None:
    """'finetune=LoRA r=64 alpha=128 on q,v,output_proj + MLP' (QLoRA: NF4 base): model.lora_*."""
    text = m.string
    rank = re.search(r"\br\s*=\s*(\d+)", text)
    where = re.search(r"\bon\s+([\w, +]+?)(?:\s*\(|$)", text)
    if rank is None or where is None:
        raise RowSkip(SETTING, f"LoRA without its rank and target matrices ('{text}')")
    names = [x for x in re.split(r"[\s,+]+", where.group(1).strip()) if x]
    unknown = [x for x in names if x not in _LORA_MODULES]
    if unknown:
        raise RowSkip(SETTING, f"LoRA on {', '.join(unknown)} ('{text}')")
    st.features.update(lora_rank=int(rank.group(1)), lora_targets=list(dict.fromkeys(_LORA_MODULES[x] for x in names)),
                       lora_base="nf4" if m.group(1) == "qlora" else "bf16")


def _offload_activations(m: re.Match[str], st: _Settings) -> None:
    st.offload_activations = True  # torchtune's enable_activation_offloading (checkpointed inputs to CPU)


def _fp8_params(m: re.Match[str], st: _Settings) -> None:
    st.fp8_params = True  # Megatron --fp8-param-gather: the parameter buffer and its all-gather in FP8


def _dist_opt_instances(m: re.Match[str], st: _Settings) -> None:
    st.optimizer_instances = int(m.group(1))


def _outer_dp(m: re.Match[str], st: _Settings) -> None:
    """Megatron-FSDP's outer (replica) dimension: no_shard is plain replication, as dp_replicate prices it."""
    if m.group(1) != "no_shard":
        raise RowSkip("sharding not expressible", f"outer-dp-sharding-strategy={m.group(1)} (states sharded "
                      "across the replicas too)")


def _position(m: re.Match[str], st: _Settings) -> None:
    kind = {"rope": "rope", "learned_absolute": "learned", "alibi": "alibi"}.get(m.group(1))
    if kind is None:
        raise RowSkip(ARCH_MODELLED, f"position-embedding-type={m.group(1)}")
    st.features["position"] = kind


def _optimizer(m: re.Match[str], st: _Settings) -> None:
    """An optimizer named in other_settings: Adam/AdamW/LAMB keep two moments, 8-bit Adam keeps them quantised,
    Adafactor a factored second moment, Muon one momentum per block matrix; preconditioner ones (Shampoo, SOAP)
    are not priced."""
    name = m.group(1)
    if name in ("shampoo", "soap"):
        raise RowSkip(SETTING, f"{name} optimizer (preconditioner matrices; trainsim prices Adam, Adafactor and "
                      "Muon)")
    if name in ("adafactor", "muon"):
        st.optimizer = name
    elif name.startswith("8-bit"):
        st.optimizer = "adam_8bit"
    elif name == "lamb":
        st.notes.append("lamb optimizer priced as Adam")


def _dropout(m: re.Match[str], st: _Settings) -> None:
    st.dropout[m.group(1)] = float(m.group(2))


def _sdpa(m: re.Match[str], st: _Settings) -> None:
    """PyTorch scaled_dot_product_attention: FlashAttention-2 kernels for bf16/fp16 on Ampere and newer."""
    st.attention = st.attention or "flash"


_BACKENDS = {"flash": "flash", "fused": "cudnn", "unfused": "unfused", "local": "unfused"}

_RULES: list[tuple[str, Action]] = [
    # strategy settings that map to job fields
    (r"overlap-grad-reduce(?:\s*=\s*(true|false))?", _set("overlap_grad_reduce")),
    (r"overlap-param-gather(?:\s*=\s*(true|false))?", _set("overlap_param_gather")),
    (r"tp[- ]comm[- ]overlap(?:\s*\([^)]*\))?(?:\s*[=:]\s*(true|false|on|off))?", _set("tp_comm_overlap")),
    (r"userbuffers(?:\s*[=:]\s*(true|false|on|off))?", _set("tp_comm_overlap")),
    (r"tp_linear_async_communication\s*=\s*(true|false)", _set("tp_comm_overlap")),
    (r"ddp[ -]impl\s*=\s*torch", _set("overlap_grad_reduce", True)),
    (r"ddp[ -]impl\s*=\s*local", _set("overlap_grad_reduce", False)),
    (r"scatter/gather p2p opt(?:imi[sz]ation)? (on|off)", _set("p2p_scatter_gather")),
    (r"pp_engine\s*=\s*1f1b", _set("schedule", "1f1b")),
    (r"pp_engine\s*=\s*(?:afab|all-forward-all-backward)", _set("schedule", "gpipe")),
    (r"interleaved 1f1b when vpp\s*>\s*1\b.*", _ok),  # the vpp column says whether it is interleaved
    (r"num-distributed-optimizer-instances\s*=\s*(\d+)", _dist_opt_instances),
    (r"outer-dp-sharding-strategy\s*=\s*(\w+)", _outer_dp),
    (r"megatron-fsdp-main-(?:params|grads)-dtype\s*=\s*fp32", _ok),  # as trainsim's mixed precision
    (r"expert-tensor-parallel-size\s*=\s*\d+", _ok),  # checked against tp by moe_rows
    # attention kernels named by the framework's own flags
    (r"attention-backend\s*=\s*flash", _attn("flash")),
    (r"attention-backend\s*=\s*fused", _attn("cudnn")),
    (r"attention-backend\s*=\s*(?:unfused|local)", _attn("unfused")),
    (r"attention-backend\s*=\s*auto", _ok),
    (r"nvte_fused_attn\s*=\s*0", _attn("flash", override=False)),  # TE without cuDNN attention: flash
    (r"transformer-impl\s*=\s*local", _attn("unfused", override=False)),  # Megatron's own (unfused) attention
    (r"transformer-impl\s*=\s*transformer_engine", _ok),
    (r"executors\s*=.*\bsdpa\b.*", _sdpa),
    # architecture flags (Megatron's)
    # Megatron's fused cross-entropy keeps a second fp32 tensor of the logits (workload.zoo.transformer._head)
    (r"cross-entropy-loss-fusion(?:\s*=\s*(true))?", _feature("loss", "upcast_twice")),
    (r"loss\s*=\s*chunked\s*(?:ce|cross[- ]entropy)", _feature("loss", "chunked")),  # torchtune's, 8 chunks
    (r"swiglu(?:\s*=\s*(true|false))?", _feature("mlp", "swiglu")),
    (r"squared-relu(?:\s*=\s*(true|false))?", _feature("mlp", "relu2")),
    (r"normalization\s*=\s*(rmsnorm|layernorm)", _feature("norm", lambda m: m.group(1))),
    (r"position-embedding-type\s*=\s*(\w+)", _position),
    (r"disable-bias-linear(?:\s*=\s*(true|false))?", _feature("bias", False)),
    (r"untie-embeddings-and-output-weights(?:\s*=\s*(true|false))?", _feature("tied_embeddings", False)),
    (r"(hidden|attention)-dropout\s*=\s*([\d.]+)", _dropout),
    (r"qk-layernorm(?:\s*=\s*(true|false))?", _feature("qk_norm", True)),
    (r"kv-channels\s*=\s*\d+", _ok),  # checked against hidden / heads in _row_job
    (r"multi-latent-attention(?:\s*=\s*true)?|(q-lora-rank|kv-lora-rank|qk-head-dim|qk-pos-emb-head-dim|"
     r"v-head-dim)\s*=\s*(\d+)", _mla),
    # read by moe_rows (a MoE row that maps); grouped GEMMs and the router's dtype change kernels, not storage
    (r"(?:num-experts|moe-router-topk|moe-ffn-hidden-size|moe-token-dispatcher-type|"
     r"moe-shared-expert-intermediate-size)\s*=\s*\w+|moe-layer-freq\s*=.*|"
     r"moe-grouped-gemm(?:\s*=\s*true)?|moe-router-dtype\s*=\s*fp32", _ok),
    # Megatron-Bridge's MoE performance settings (moe_runs.csv): recorded, not modelled
    (r"ep a2a overlap.*=\s*(on|off)", _set("ep_overlap")),
    (r"moe_expert_rank_capacity_factor\s*=.*|moe_paged_stash\s*=.*",
     _note("the paged activation stash of dropless MoE (moe_paged_stash, its rank capacity factor) not modelled")),
    # Megatron's fused grouped expert MLP (one kernel for the local experts); torch._grouped_mm (AutoModel)
    (r"(?:cutedsl_fused_grouped_mlp|te_op_fuser)\s*=\s*on|kernels\s*=.*torch_mm.*", _set("fused_experts", True)),
    (r"kernels\s*=.*deepep.*", _ok),  # DeepEP's dispatch and combine priced as trainsim's all-to-all
    (r"recipe .*", _ok),  # where a recipe's settings come from (the other columns carry them)
    (r"num-experts.*|moe-.*|moe_.*|ep a2a.*|.*deepep.*", _skip(MOE, "expert layers in other_settings")),
    (r"(?:mtp-num-layers\s*=\s*|mtp: recipe default mtp_num_layers\s*=\s*)([1-9]\d*).*",
     _feature("mtp_layers", lambda m: int(m.group(1)))),
    (r"mtp enabled.*", _feature("mtp_layers", 1)),  # DeepSeek-V3's depth (its report; the recipes' default)
    (r"mtp-num-layers\s*=\s*0|mtp disabled.*", _ok),
    # settings that change the step and are not expressible
    (r"activation[_ ](?:cpu[_ ])?offload(?:ing)?\s*=\s*(?:true|on)", _offload_activations),
    (r"fine-grained-activation-offloading.*|offload-modules.*", _skip(SETTING, "per-module activation offloading")),
    (r"activation[_ ](?:cpu[_ ])?offload(?:ing)?\s*=\s*(?:false|off)", _ok),
    (r"finetune\s*=\s*(q?lora)\b.*", _lora),
    (r"packed\s*=\s*false", _skip(SETTING, "unpacked variable-length sequences (seq_len is only the maximum)")),
    (r"packed\s*=\s*true|full finetune.*", _ok),
    (r"account-for-(embedding|loss)-in-pipeline-split(?:\s*=\s*(true|false))?", _account_for),
    (r"decoder-first-pipeline-num-layers\s*[=: ]\s*(\d+)", _stage_layers("first_stage_layers")),
    (r"decoder-last-pipeline-num-layers\s*[=: ]\s*(\d+)", _stage_layers("last_stage_layers")),
    (r"(?:pipeline-model-parallel-layout\s*=\s*|pp_layout\s*[:=]\s*(?:set_layout\(cfg\.model,\s*)?)'?"
     r"([etml|()*\d\s]+?)'?\)?\s*", _layout),
    (r"pp_layout\s*[:=]\s*set_layout\(cfg\.model\)", _set("recipe_layout", True)),
    (r"decoder-(?:first|last)-pipeline-num-layers.*|account-for-(?:embedding|loss)-in-pipeline-split.*|"
     r"pipeline-model-parallel-layout.*|pp_layout.*", _skip(SETTING, "uneven pipeline layout")),
    (r"fp8-param-gather\s*=\s*true", _fp8_params),
    (r"first-last-layers-bf16\s*=\s*true", _note("first and last layers in BF16 priced as FP8")),
    # recognised, not modelled or without effect on the step: recorded (notes) or passed (_ok)
    (r"(?:step|experiment)\s*=?\s*'.*", _ok),  # a row label: its settings are in the other columns and tokens
    (r".*?\b(muon|shampoo|soap|lamb|adafactor|8-bit adamw?|adamw?)\b.*", _optimizer),
    (r"cuda_graph\s*=\s*(full_iteration|transformer_engine|none)\s*:\s*([a-z_/]*)", _cuda_graph),
    (r"cuda_graphs\s*=\s*false", _set("cuda_graphs", "none")),
    (r"cuda[-_ ]?graphs?.*", _note("CUDA graphs (launch overhead) not modelled")),
    (r"torch\.compile(?:\s*=\s*true| on)|compiler\s*=\s*thunder", _feature("kernels", "fused")),
    (r"torch\.compile\s*=\s*false|compiler\s*=\s*eager", _feature("kernels", "eager")),
    (r"executors\s*=.*", _ok),
    (r"pp comm overlap.*", _ok),  # trainsim overlaps pipeline send/recv with compute
    (r"fused kernels|composer|\d+-batch benchmark runs|deterministic-mode.*|no-gradient-accumulation-fusion.*|"
     r"calculate-per-token-loss.*|cross-entropy-loss-fusion\s*=\s*false|loss\s*=.*|mock-data.*|pytorch_cuda_alloc_conf.*|"
     r"data backend.*|optimizer_batch_size.*|global batch \d+.*|phase-\d.*|tinystories data|\d+ train steps|"
     r"torch profiler.*|torch \d.*|hf trainer.*|\d+\s*gb/s/gpu rdma|grad_accum\s*=\s*\d+|lbs\(.*|flash_attn.*|"
     r"te_op_fuser.*|delay_wgrad_compute.*|cutedsl.*|kernels\s*=.*|recipe .*|fake balanced gate.*", _ok),
]
"""`other_settings` vocabulary, matched against each whole setting (lower case, leading '--' dropped), first
match wins. A setting that matches nothing is a skip if it sounds like a strategy (_STRATEGY_WORDS), else it
is recorded in the row's tags as not interpreted."""
_COMPILED = [(re.compile(p), act) for p, act in _RULES]
_STRATEGY_WORDS = re.compile(r"overlap|shard|offload|pipeline|parallel|recompute|checkpoint|\bzero\b|zero[-_ ]?\d|"
                             r"fsdp|\bddp\b|expert|\bmoe\b|layout|schedul|interleav|fp8|float8|fp4|bucket|virtual|"
                             r"\b[tpcesd]p\b|\bvpp\b")


def _settings(text: str) -> _Settings:
    """Read `other_settings`: ';'-separated settings, a run of '--flag --flag' split into its flags."""
    st = _Settings()
    for token in text.split(";"):
        token = token.strip()
        parts = re.split(r"\s+(?=--)", token) if token.startswith("--") else [token]
        for part in parts:
            t = part.strip().lower().removeprefix("--")
            if not t:
                continue
            for pat, act in _COMPILED:
                m = pat.fullmatch(t)
                if m is not None:
                    act(m, st)
                    break
            else:
                if _STRATEGY_WORDS.search(t):
                    raise RowSkip("setting not understood", f"other_settings '{part.strip()}'")
                st.unknown.append(part.strip())
    d = st.dropout
    if d and all(v == 0 for v in d.values()) and len(d) == 2:
        st.features["dropout"] = False
    elif d and any(v == 0 for v in d.values()):
        st.notes.append("dropout in only one place: priced as dropout on")
    return st


def _attention_backend(st: _Settings, notes: dict[str, str]) -> str | None:
    if st.attention is not None:
        notes["attention"] = "from other_settings (the framework's attention backend)"
    return st.attention


# --- the row -----------------------------------------------------------------------------------------------

def row_job(row: dict[str, str]) -> RowJob | str:
    """Build the job for one row, or return why it cannot be expressed ("<category>: <detail>")."""
    try:
        return _row_job(row)
    except RowSkip as exc:
        return str(exc)


UNFUSED_EXPERT_ACTS = ("relu2", "gelu")
"""Expert activations Megatron-Core cannot fuse with the routing probabilities (its weighted bias-activation fusions
take SwiGLU and quick-GeGLU only): model.expert_act eager on its TEGroupedMLP."""


YARN_POSITION_MODELS = r"gpt-oss"
"""Models whose Megatron-Bridge provider sets position_embedding_type 'yarn' (gpt_oss_provider.py), for which
GPTModelProvider.provide turns apply_rope_fusion off (utils/fusions.py, validate_rope_fusion_compatibility: fusion
needs 'rope'): model.rope_fusion false. DeepSeek-V3 and Kimi K2 keep it (NVIDIA's DeepSeek-V3 GB200 guide lists YaRN
RoPE fusion among Megatron-Core's defaults)."""


def _stack(row: dict[str, str]) -> str:
    """The row's training stack as its framework and source name it (lower case)."""
    return " ".join(_cell(row, k) for k in ("framework", "source_group", "source")).lower()


def _megatron_core(row: dict[str, str]) -> bool:
    """Whether the row ran on Megatron-Core (Megatron-LM, Megatron-Bridge, NeMo), not another MoE stack."""
    stack = _stack(row)
    return bool(re.search(r"megatron|nemo container|nemo framework", stack)) and "automodel" not in stack


def _expert_gemm(row: dict[str, str], settings: _Settings) -> tuple[str, str] | None:
    """model.expert_gemm of a MoE row and why: one grouped kernel where other_settings names a fused grouped expert
    MLP, one GEMM per local expert on Megatron-Core and AutoModel's Transformer Engine experts (TEGroupedMLP:
    GroupedLinear's cuBLAS call per expert); None (trainsim's default, grouped) for other stacks."""
    if settings.fused_experts:
        return "grouped", "a fused grouped expert MLP (cuteDSL / Transformer Engine op fuser / torch._grouped_mm): " \
                          "one kernel for the local experts"
    if re.search(r"megatron|automodel", _stack(row)):
        return "per_expert", "Megatron-Core's TEGroupedMLP (Transformer Engine's GroupedLinear): one GEMM launch " \
                             "per local expert, each issued by the host"
    return None


def _row_job(row: dict[str, str]) -> RowJob:
    if row.get("case_kind", "train_iter") != "train_iter":
        raise RowSkip("case kind not simulated", f"'{row.get('case_kind')}' (per-layer timing)")
    metric, measured = _measured(row)
    if metric is None:
        if not isinstance(measured_memory(row), tuple):
            raise RowSkip("no measured outcome", "no iteration time, TFLOP/s, MFU, throughput or peak memory")
        metric = MEMORY_METRIC  # compared for memory only
    notes: dict[str, str] = {}
    published = published_architecture(row) if "moe_ffn_hidden" in row else None
    if isinstance(published, str):
        raise RowSkip(MOE, f"'{_cell(row, 'model_name')}': {published}")
    if published is not None:  # a model the row names without its columns: its published config fills them
        row, extra_fields, notes["published_architecture"] = published
    arch = _cell(row, "arch").lower()
    n_gpus = _count(row, "n_gpus")
    gb = _count(row, "global_batch")
    if not n_gpus or not gb:
        raise RowSkip("missing column", "n_gpus or global_batch")
    name = _cell(row, "model_name")
    routed: dict[str, Any] = {}
    if not _is_resnet(name) and (moe := _moe(row, arch)):
        fields = moe_column_fields(row)  # moe_runs.csv states them in columns
        if fields is None and "moe_ffn_hidden" in row:  # that file's format, its expert columns left empty
            raise RowSkip(MOE, f"{moe}: architecture not stated (n_experts, top_k, moe_ffn_hidden empty)")
        if fields is None:
            fields = moe_model_fields(_cell(row, "other_settings"), _cell(row, "source_group") + " " + _cell(row, "source"))
        if isinstance(fields, str):
            raise RowSkip(MOE, f"{moe}: {fields}")
        routed = {**fields, **extra_fields} if published is not None else fields
        notes["mixture_of_experts"] = moe_note(fields, _cell(row, "other_settings"), _cell(row, "token_dispatcher"))
        if _unstated(_cell(row, "ffn_hidden")) and not fields.get("first_dense_layers") and "expert_ffn" in fields:
            row = {**row, "ffn_hidden": str(fields["expert_ffn"])}  # model.ffn sizes no layer: every MLP is MoE
            notes["ffn"] = "not stated: every layer is a mixture of experts (no dense MLP to size)"
    settings = _settings(_cell(row, "other_settings"))
    model = {**_model(row, arch, settings, notes, frozenset(routed)), **routed, **_mla_keys(settings, notes)}
    if _megatron_core(row) and re.search(YARN_POSITION_MODELS, _cell(row, "model_name").lower()):
        model["rope_fusion"] = False
        notes["rope_fusion"] = ("Megatron-Bridge turns RoPE fusion off for this model's YaRN position embedding "
                                "(position_embedding_type 'yarn', utils/fusions.py): Megatron-Core's unfused rotary "
                                "embedding")
    if routed and (gemm := _expert_gemm(row, settings)) is not None:
        model["expert_gemm"], notes["expert_gemm"] = gemm
        if gemm[0] == "per_expert" and model.get("mlp") in UNFUSED_EXPERT_ACTS and _megatron_core(row):
            model["expert_act"] = "eager"
            notes["expert_act"] = (f"Megatron-Core's TEGroupedMLP weights the experts' {model['mlp']} activation by the "
                                   "FP32 routing probabilities in eager PyTorch (its fused weighted activations take "
                                   "SwiGLU and quick-GeGLU only): the activation, the product and a cast")
    cluster = cluster_spec(row, n_gpus, notes)
    if isinstance(cluster, str):
        raise RowSkip("GPU or cluster not expressible", cluster)
    dp, tp, pp, cp, ep = (_count(row, k) or 1 for k in ("dp", "tp", "pp", "cp", "ep"))
    vpp = _vpp(row, pp, notes)
    if dp * tp * pp * cp != n_gpus:
        raise RowSkip("parallel degrees", f"dp*tp*pp*cp = {dp * tp * pp * cp} != n_gpus {n_gpus}")
    if routed and _count(row, "ep") is None and (folded := unstated_ep(routed["experts"], dp * cp,
                                                                       _cell(row, "token_dispatcher"))):
        ep, notes["ep"] = folded
    strategy: dict[str, Any] = {"dp": dp, "tp": tp, "pp": pp, "cp": cp, "ep": ep, "vpp": vpp, "global_batch": gb}
    if routed and ep > 1:
        strategy["ep_dispatcher"] = ep_dispatcher(_cell(row, "other_settings"), _cell(row, "token_dispatcher"))
        if strategy["ep_dispatcher"] == "hybridep":
            strategy["ep_dispatcher_sms"], notes["ep_dispatcher_sms"] = hybridep_sms(row)
    etp = expert_tp(row) if routed else None
    if etp is not None and etp != tp:
        strategy["etp"] = etp  # 1: whole experts folded over tp x ep (other values: presets name them)
    elif routed and etp is None and tp > 1:
        notes["etp"] = f"not stated: Megatron's default, the experts split over tp ({tp})"
    strategy.update(_sharding(_cell(row, "sharding"), dp, cluster.get("gpus_per_node") or 8, notes))
    if settings.optimizer_instances > 1:  # Megatron's --num-distributed-optimizer-instances
        if not strategy.get("zero") and not strategy.get("fsdp"):
            raise RowSkip("sharding not expressible", f"{settings.optimizer_instances} distributed-optimizer "
                          "instances without a distributed optimizer")
        strategy.update(_replicas(settings.optimizer_instances, dp, _cell(row, "sharding")))
    if (settings.tp_comm_overlap is None and tp > 1 and _unstated(_cell(row, "seq_parallel").lower())
            and _nemo_recipe(row)):
        settings.tp_comm_overlap = True
        notes["tp_comm_overlap"] = ("not stated: NeMo / Megatron-Bridge performance recipes run TP with sequence "
                                    "parallelism and TP communication overlap (userbuffers)")
    sp = _seq_parallel(_cell(row, "seq_parallel"), tp, bool(settings.tp_comm_overlap), notes)
    if sp:
        strategy["sequence_parallel"] = True
    read = recipe_recompute(row) if re.search(r"base-recipe default", _cell(row, "recompute")) else None
    if read is not None:  # a Megatron-Bridge recipe whose modules the row leaves unresolved, read from its source
        recompute = selective_mode(set(read[0])) if read[0] else "none"
        notes["recompute"] = read[1]
    else:
        recompute = _recompute(_cell(row, "recompute"), notes)  # 'selective:a+b': the modules named
    strategy["recompute"] = recompute.partition(":")[0]
    if ":" in recompute:
        strategy["recompute_modules"] = sorted(recompute.partition(":")[2].split("+"))
    if settings.offload_activations:
        if strategy["recompute"] != "full":
            raise RowSkip(SETTING, f"activation offloading with recompute {strategy['recompute']} (trainsim "
                          "offloads the checkpointed inputs of full recompute)")
        strategy["offload_activations"] = True
    sharded = bool(strategy.get("zero") or strategy.get("fsdp"))
    if settings.overlap_param_gather:
        if sharded:
            strategy["overlap_param_gather"] = True
        else:
            notes["overlap_param_gather"] = "stated, but no sharded parameters to gather"
    if settings.overlap_grad_reduce is not None:
        strategy["overlap_grad_reduce"] = settings.overlap_grad_reduce
    elif dp > 1 and "megatron" in (_cell(row, "source_group") + _cell(row, "source")).lower():
        notes["overlap_grad_reduce"] = "not stated: trainsim's default (on)"
    if settings.tp_comm_overlap:
        if tp == 1:
            notes["tp_comm_overlap"] = "stated with tp = 1: a no-op"
        elif not sp:
            raise RowSkip(SETTING, "TP communication overlap without sequence parallelism (Megatron needs both)")
        else:
            strategy["tp_comm_overlap"] = True
    if settings.ep_overlap and ep > 1:
        strategy["ep_overlap"] = True
    if settings.cuda_graphs is not None:
        strategy["cuda_graphs"] = settings.cuda_graphs
    if settings.p2p_scatter_gather is not None:
        strategy["p2p_scatter_gather"] = settings.p2p_scatter_gather
    if settings.stages and (pp == 1 or vpp > 1):
        raise RowSkip(SETTING, f"uneven pipeline stages with pp = {pp}, vpp = {vpp}")
    strategy.update(settings.stages)
    if settings.recipe_layout:
        try:
            settings.layout = _expand_layout(recipe_layout(row, pp, vpp, int(model.get("mtp_layers", 0))).lower())
        except ValueError as exc:
            raise RowSkip(SETTING, f"uneven pipeline layout (pp_layout:set_layout(cfg.model)): {exc}") from None
        notes["pp_layout"] = "the recipe's default layout for its pp and vpp (Megatron-Bridge's layout_map)"
    elif (pp > 1 and settings.layout is None and not settings.stages and not settings.accounted
          and "megatron-bridge" in _cell(row, "framework").lower()):
        # a Megatron-Bridge recipe that names no layout still sets one where its model has a layout map for the
        # (pp, vpp) (DeepSeek-V3: deepseek_v3_pretrain_config(layout=None) calls
        # set_deepseek_v3_pipeline_model_parallel_layout, "predefined layouts" unless one is given)
        try:
            default = recipe_layout(row, pp, vpp, int(model.get("mtp_layers", 0)))
        except ValueError:
            default = None
        if default is not None:
            settings.layout = _expand_layout(default.lower())
            notes["pp_layout"] = (f"not stated: {default}, the recipe's default layout for pp {pp}, vpp {vpp} "
                                  "(Megatron-Bridge's layout_map, applied when the recipe names none)")
    if settings.layout is not None:
        if "m" in settings.layout and not model.get("mtp_layers"):
            model["mtp_layers"] = settings.layout.count("m")
            notes["mtp_layers"] = f"not stated: the pipeline layout's {model['mtp_layers']} m (multi-token prediction)"
        chunks = settings.layout.count("|") + 1
        if not _cell(row, "vpp") and pp > 1 and chunks > pp and chunks % pp == 0:  # Megatron derives vpp from it
            vpp = strategy["vpp"] = chunks // pp
            notes["vpp"] = f"not stated: {vpp}, the pipeline layout's {chunks} chunks over pp {pp}"
        if settings.stages or settings.accounted:
            raise RowSkip(SETTING, "a pipeline layout beside first/last stage layers or account-for-* settings")
        strategy["stage_layers"] = _layout_split(settings.layout, model["layers"], int(model.get("mtp_layers", 0)),
                                                 pp, vpp, notes)
    if settings.accounted:
        if settings.stages:
            raise RowSkip(SETTING, "account-for-*-in-pipeline-split with an uneven first or last stage")
        strategy["stage_layers"] = _accounted_split(model["layers"], pp, vpp, settings.accounted, notes)
    if pp > 1 and not settings.stages and "nanotron" in (_cell(row, "source_group") + _cell(row, "source")).lower():
        strategy["stage_layers"] = _nanotron_split(model, pp, vpp, notes)
    mb = _count(row, "micro_batch")
    ga = _count(row, "grad_accum")
    if mb is None:
        if ga:
            if gb % (dp * ga):
                raise RowSkip("batch sizes", f"global_batch {gb} is not a multiple of dp x grad_accum = {dp * ga}")
            mb = gb // (dp * ga)
        else:
            mb = 1
            notes["micro_batch"] = "not stated: Megatron default 1"
    elif ga and mb * dp * ga != gb:
        raise RowSkip("batch sizes", f"micro_batch x dp x grad_accum = {mb * dp * ga} != global_batch {gb}")
    strategy["micro_batch"] = mb
    if vpp > 1:
        strategy["schedule"] = "interleaved"
    elif settings.schedule is not None:
        strategy["schedule"] = settings.schedule
    if gb % (mb * dp):
        raise RowSkip("batch sizes", f"global_batch {gb} is not a multiple of micro_batch x dp = {mb * dp}")
    dtype = _dtype(_cell(row, "precision"), row["gpu"], notes)
    simulation: dict[str, Any] = {"dtype": dtype, **_optimizer_column(row, notes)}
    if settings.optimizer is not None and simulation.get("optimizer") != settings.optimizer:
        if not _unstated(_cell(row, "optimizer")):
            raise RowSkip(SETTING, f"other_settings names {settings.optimizer}, the optimizer column "
                          f"'{_cell(row, 'optimizer')}'")
        simulation["optimizer"] = settings.optimizer
    if not _master_weights(_cell(row, "precision"), notes):
        simulation["master_weights"] = False
    if settings.fp8_params or re.search(r"float8 all-gather|fp8 all-gather", _cell(row, "precision").lower()):
        if dtype != "fp8":
            raise RowSkip(SETTING, f"FP8 weights with {dtype} GEMMs")
        simulation["fp8_params"] = True  # the blocks' linear weights kept (and all-gathered) in FP8
    if dp > 1 and not sharded and _torch_ddp_buckets(row):
        simulation["grad_bucket_copy"] = True
        notes["grad_bucket_copy"] = ("Lightning Fabric's DDP strategy wraps torch DistributedDataParallel without "
                                     "gradient_as_bucket_view: its buckets hold a second copy of the gradients")
    if model["name"] != "resnet50":
        model["attention"] = _attention_backend(settings, notes) or _attention(row, notes)
        _framework_tensors(row, model, sp, notes)
        kv_channels = re.search(r"kv-channels\s*=\s*(\d+)", _cell(row, "other_settings").lower())
        if kv_channels and int(kv_channels.group(1)) * model["heads"] != model["hidden"] and "kv_lora_rank" not in model:
            raise RowSkip(ARCH_MODELLED, f"kv-channels={kv_channels.group(1)}: head size other than hidden / heads")
    if settings.notes:
        notes["settings"] = "; ".join(dict.fromkeys(settings.notes))
    if settings.unknown:
        notes["other_settings"] = "not interpreted: " + "; ".join(settings.unknown)
    job = {"model": model, "cluster": cluster, "strategy": strategy, "simulation": simulation}
    conv = convention_of(row.get("flops_convention") or "")
    shape = None
    if model["name"] != "resnet50":
        params = _num(row, "params_b")
        h, lay, v = model["hidden"], model["layers"], model.get("vocab") or 50257
        emb = v * h
        n = params * 1e9 if params else float("nan")
        shape = GPTShape(lay, h, model["seq_len"], v, n, n - emb if params else float("nan"))
    return RowJob(job, metric, measured, shape, conv, strategy["recompute"] == "full", notes)


_CONVENTION_FREE_FIRST = ("iter_time_s", "tokens_per_s_per_gpu", "samples_per_s", "tflops_per_gpu", "mfu_pct")
"""The metric order of moe_runs.csv rows (the file with expert columns): its README says their TFLOP/s follow each
framework's own FLOP count, which changed between releases, and tokens/s per GPU and step time are the
convention-free measures."""


def _measured(row: dict[str, str]) -> tuple[str | None, float]:
    order = (_CONVENTION_FREE_FIRST if "moe_ffn_hidden" in row else
             ("iter_time_s", "tflops_per_gpu", "mfu_pct", "samples_per_s", "tokens_per_s_per_gpu"))
    for key in order:
        v = _num(row, key)
        if v is not None and v > 0:
            return key, v
    return None, math.nan


MEM_KINDS = ("allocated", "reserved", "used")
"""allocated: torch.cuda max_memory_allocated (trainsim's peak_bytes); reserved: max_memory_reserved (the caching
allocator's segments, peak_reserved_bytes); used: nvidia-smi / pynvml device memory used, the reserved segments
plus the CUDA context (CUDA_CONTEXT_BYTES), compared only for rows that say they read it."""
CUDA_CONTEXT_BYTES = 1343 * 2**20
"""The CUDA context and kernel images a PyTorch process holds outside the caching allocator, as Hugging Face's
"Model training anatomy" page (transformers docs, perf_train_gpu_one) measured it with pynvml after
torch.ones((1, 1)).to("cuda"): 1343 MB (MiB). Only for mem_kind used; it varies with the CUDA version, driver
and the kernels loaded."""
_NVML_USED = re.compile(r"nvidia-smi|pynvml|device used memory", re.I)
UNSTATED_MEM_KIND = "unstated"
_STATED_RESERVED = re.compile(r"\bpeak reserved\s*=\s*(\d+(?:\.\d+)?)\s*GiB\b", re.I)
"""A reserved peak a row's notes state beside its allocated peak_mem_gib (nanotron's log_memory prints both)."""
GIB = 2.0 ** 30


def measured_memory(row: dict[str, str]) -> tuple[float, str] | str | None:
    """The row's measured peak memory in GiB and what it counts (allocated, reserved or unstated); None when
    the row states none, or why the stated value cannot be compared (never a guessed kind or number)."""
    cell = _cell(row, "peak_mem_gib")
    if _unstated(cell):
        return None
    gib = _num(row, "peak_mem_gib")
    if gib is None or gib <= 0:
        return f"peak_mem_gib = '{cell}' is not a positive number of GiB"
    if _per_op_sac(_cell(row, "recompute")):
        return ("per-op selective activation checkpointing: torchtitan's op SAC keeps the outputs of every other "
                "matmul and of attention and recomputes the rest; priced as selective (its time is close) every "
                "activation is kept, so the peak is not comparable")
    kind = _cell(row, "mem_kind").lower()
    if _unstated(kind) and _NVML_USED.search(_cell(row, "notes")):
        return gib, "used"  # the source read the device's used memory (its notes say so)
    if _unstated(kind):
        return gib, UNSTATED_MEM_KIND
    if kind not in MEM_KINDS:
        return f"mem_kind = '{kind}' is not one of {', '.join(MEM_KINDS)} (or empty / unknown)"
    return gib, kind


def memory_stage(row: dict[str, str], stages: int) -> int | None | str:
    """Which pipeline stage's peak the row's memory figure is (`mem_scope`): 0 for rank 0 (the first stage),
    stages - 1 for the last global rank (the last stage, in Megatron's and nanotron's rank order), None for the
    fullest stage (a maximum over ranks, or an unstated scope), or why the scope cannot be read."""
    scope = _cell(row, "mem_scope").lower()
    if stages == 1:
        return 0
    if _unstated(scope) or re.search(r"\bmax(?:imum)?\b|all ranks|any rank|fullest", scope):
        return None
    if re.search(r"\blast\b|world_size\s*-\s*1", scope):
        return stages - 1
    if re.match(r"(?:global\s+)?rank\s*0\b|first\b", scope):
        return 0
    return f"mem_scope = '{_cell(row, 'mem_scope')}' names no rank trainsim can place (rank0, last rank, max)"


def with_memory(out: Outcome, row: dict[str, str], peak_bytes: list[float], oom: bool,
                reserved_bytes: list[float] | None = None) -> Outcome:
    """`out` with trainsim's OOM verdict and, where the row measured its peak memory, the measurement, its kind
    and the predicted peak (GiB) of the stage its `mem_scope` names (memory_stage; the fullest stage where the
    scope is a maximum or unstated). The peak compared is the one the row's kind counts: allocated
    (`peak_bytes`), reserved (`reserved_bytes`, the caching allocator's), used (reserved + the CUDA
    context). An unusable memory cell or scope is noted in the tags."""
    out.oom_predicted = oom
    mem = measured_memory(row)
    if not isinstance(mem, str) and mem is not None and mem[1] in ("reserved", "used") and reserved_bytes:
        extra = CUDA_CONTEXT_BYTES if mem[1] == "used" else 0.0
        peak_bytes = [b + extra for b in reserved_bytes]
        out.tags["memory_kind"] = ("compared with peak_reserved (caching allocator segments)" if not extra else
                                   "compared with peak_reserved + the CUDA context (1343 MiB, HF's pynvml "
                                   "measurement)")
    if isinstance(mem, str):
        out.tags["memory"] = f"not compared: {mem}"
        return out
    if mem is None or not peak_bytes:
        return out
    stage = memory_stage(row, len(peak_bytes))
    if isinstance(stage, str):
        out.tags["memory"] = f"not compared: {stage}"
        return out
    out.memory_measured_gib, out.mem_kind = mem
    stated = _STATED_RESERVED.search(_cell(row, "notes")) if mem[1] == "allocated" and reserved_bytes else None
    if stated is not None and reserved_bytes:  # the same stage's reserved peak beside the allocated one
        out.reserved_measured_gib = float(stated.group(1))
        fullest = max(range(len(peak_bytes)), key=peak_bytes.__getitem__)
        out.reserved_predicted_gib = reserved_bytes[fullest if stage is None else stage] / GIB
    if stage is None:
        out.memory_predicted_gib = max(peak_bytes) / GIB
        if len(peak_bytes) > 1:
            why = "not stated" if _unstated(_cell(row, "mem_scope")) else f"'{_cell(row, 'mem_scope')}'"
            out.tags["memory_scope"] = f"{why}: the fullest of {len(peak_bytes)} pipeline stages"
    else:
        out.memory_predicted_gib = peak_bytes[stage] / GIB
        if len(peak_bytes) > 1:
            out.tags["memory_scope"] = f"'{_cell(row, 'mem_scope')}': pipeline stage {stage} of {len(peak_bytes)}"
    return out


def predicted_metric(rj: RowJob, row: dict[str, str], iteration_s: float, hw_flops: float,
                     model_params: float) -> float | str:
    """The prediction in the row's own metric (or why the conversion is impossible)."""
    gb = rj.job["strategy"]["global_batch"]
    n_gpus = _int(row, "n_gpus") or 1
    if rj.metric == "iter_time_s":
        return iteration_s
    if rj.metric == "samples_per_s":
        return gb / iteration_s
    if rj.metric == "tokens_per_s_per_gpu":
        seq = rj.shape.seq_len if rj.shape else 1
        return gb * seq / iteration_s / n_gpus
    if rj.metric in ("tflops_per_gpu", "mfu_pct"):
        if rj.convention is None:  # no stated convention: hardware FLOPs (recompute included)
            flops = hw_flops
        elif rj.shape is None or rj.convention == "unknown":
            return f"cannot convert to '{row.get('flops_convention')}'"
        else:
            shape = rj.shape
            if math.isnan(shape.params):
                h = shape.hidden
                shape = GPTShape(shape.layers, h, shape.seq_len, shape.vocab, model_params,
                                 model_params - shape.vocab * h)
            flops = iteration_flops(rj.convention, shape, gb, rj.checkpointing)
        tflops = flops / iteration_s / n_gpus / 1e12
        if rj.metric == "tflops_per_gpu":
            return tflops
        peak = _num(row, "util_peak_tflops")
        if not peak:
            return "mfu_pct given without util_peak_tflops"
        return tflops / peak * 100.0
    return f"unknown metric {rj.metric}"


def implied_iteration_s(rj: RowJob, predicted: float, measured: float, iteration_s: float) -> float:
    """Measured iteration time implied by the measured metric (same conversion as the prediction)."""
    if rj.metric == "iter_time_s":
        return measured
    # every other metric is inversely proportional to iteration time under a fixed conversion
    return iteration_s * predicted / measured


def outcome(row_index: int, row: dict[str, str], rj: RowJob, iteration_s: float, hw_flops: float,
            model_params: float) -> Outcome:
    case_id = row.get("case_id") or f"row{row_index}"
    tags = {**rj.assumptions, "tier": row.get("tier", ""), "subset": row.get("subset", "")}
    if rj.metric == MEMORY_METRIC:  # no time measured: no time prediction, no ranking
        return Outcome(row_index, case_id, MEMORY_METRIC, tags=tags)
    pred = predicted_metric(rj, row, iteration_s, hw_flops, model_params)
    if isinstance(pred, str):
        return skip(row_index, case_id, pred)
    meas_iter = implied_iteration_s(rj, pred, rj.measured, iteration_s)
    gb = rj.job["strategy"]["global_batch"]
    model = row.get("model_name") or ""
    group = f"{row.get('source_group', '')}|{model}"
    return Outcome(row_index, case_id, rj.metric, pred, rj.measured, group, gb / iteration_s, gb / meas_iter,
                   tags=tags)


