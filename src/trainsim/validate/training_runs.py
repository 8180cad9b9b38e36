"""Rows of `training_runs.csv` (any rows with its header) -> trainsim jobs and outcomes.

Everything comes from the row's own columns. Where the source leaves a setting unstated, a
documented framework default is used and recorded in the outcome's tags (never silently).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from .cases import Outcome, skip
from .conventions import GPTShape, convention_of, iteration_flops

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


def _num(row: dict[str, str], key: str) -> float | None:
    v = (row.get(key) or "").strip()
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


def _dtype(precision: str, gpu: str) -> str:
    p = precision.lower()
    if "fp8" in p:
        return "fp8"
    if "bf16" in p:
        return "bf16"
    if "tf32" in p:
        return "tf32"
    if "fp16" in p or "amp" in p:
        return "fp16"
    if "fp32" in p:
        return "fp32"
    return "bf16" if "h100" in gpu.lower() or "a100" in gpu.lower() else "fp16"


def _cluster(row: dict[str, str], n_gpus: int, notes: dict[str, str]) -> dict[str, Any] | str:
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
    elif "h200" in gpu:
        out = {"name": "hgx-h200"}
    elif "v100" in gpu:
        dev = "v100-sxm2-16gb" if mem == 16 or "16gb" in gpu else "v100-sxm2-32gb"
        if "cube" in intra or ("sxm2" in gpu and "nvswitch" not in intra):
            out = {"name": "dgx1-v100", "gpu": dev}
        else:  # DGX-2(H): 16 V100 on NVSwitch, 6 NVLink2 x 25 GB/s = 150 GB/s per direction
            out = {"name": "dgx-a100", "gpu": dev, "gpus_per_node": gpn, "intra_node_gbps": 150.0}
    else:
        return f"unknown GPU '{row['gpu']}'"
    if out["name"] == "dgx1-v100" and n_gpus < gpn:
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
    elif out["nodes"] > 1:
        notes["network"] = "not stated: preset's 8 NICs per node"
    return {k: v for k, v in out.items() if v is not None}


def _model(row: dict[str, str], arch: str) -> dict[str, Any] | str:
    name = row.get("model_name", "")
    if "resnet-50" in name.lower() or "resnet50" in name.lower():
        return {"name": "resnet50"}
    dims = {k: _int(row, c) for k, c in (("layers", "n_layers"), ("hidden", "hidden"), ("heads", "n_heads"),
                                         ("kv_heads", "n_kv_heads"), ("ffn", "ffn_hidden"), ("vocab", "vocab"),
                                         ("seq_len", "seq_len"))}
    if any(dims[k] is None for k in ("layers", "hidden", "heads", "seq_len")):
        return "architecture columns (n_layers/hidden/n_heads/seq_len) missing"
    if "bert" in arch:
        return {"name": "bert-large", **{k: v for k, v in dims.items() if v is not None}}
    if "cnn" in arch:
        return f"CNN '{name}' is not in the model zoo"
    if "llama" in arch or "swiglu" in arch:
        return {"name": "llama3-8b", **{k: v for k, v in dims.items() if v is not None}}
    if any(w in arch for w in ("gpt", "mpt")):
        return {"name": "custom", **{k: v for k, v in dims.items() if v is not None}}
    return f"architecture '{row.get('arch')}' is not expressible"


def _recompute(text: str, notes: dict[str, str]) -> str:
    t = text.lower()
    if t.startswith(("full", "yes")):
        return "full"
    if t.startswith("selective"):
        return "selective"
    if t.startswith("none") or t == "no":
        return "none"
    notes["recompute"] = "not stated: Megatron default (none)"
    return "none"


def _attention(row: dict[str, str], notes: dict[str, str]) -> str:
    """The attention kernel the run used: as stated in its text, else the framework's documented default."""
    text = " ".join(row.get(c) or "" for c in ("arch", "other_settings")).lower()
    if "triton" in text:  # llm-foundry: attn_impl triton, submit_benchmarks.py's default for its tables
        return "triton"
    if any(k in text for k in ("flashattention-3", "flash-attention-3", "flash attention 3", "fa3")):
        return "flash3"
    if "cudnn" in text or "transformer engine" in text:
        return "cudnn"
    if "flash" in text:
        return "flash"
    gpu = row.get("gpu", "").lower()
    if "megatron" in (row.get("source") or "").lower() and any(g in gpu for g in ("h100", "h200", "h800")):
        notes["attention"] = "not stated: Megatron-Core on Hopper runs Transformer Engine's cuDNN fused attention"
        return "cudnn"
    notes["attention"] = "not stated: unfused (softmax + two batched GEMMs, the framework's default then)"
    return "unfused"


def row_job(row: dict[str, str]) -> RowJob | str:
    """Build the job for one row, or return why it cannot be expressed."""
    if row.get("case_kind", "train_iter") != "train_iter":
        return f"case_kind '{row.get('case_kind')}' (per-layer timing) is not simulated"
    notes: dict[str, str] = {}
    arch = (row.get("arch") or "").lower()
    n_gpus = _int(row, "n_gpus")
    gb = _int(row, "global_batch")
    if not n_gpus or not gb:
        return "n_gpus or global_batch missing"
    model = _model(row, arch)
    if isinstance(model, str):
        return model
    cluster = _cluster(row, n_gpus, notes)
    if isinstance(cluster, str):
        return cluster
    dp, tp, pp = (_int(row, k) or 1 for k in ("dp", "tp", "pp"))
    cp, ep, vpp = (_int(row, k) or 1 for k in ("cp", "ep", "vpp"))
    if dp * tp * pp * cp != n_gpus:
        return f"dp*tp*pp*cp = {dp * tp * pp * cp} != n_gpus {n_gpus}"
    sharding = (row.get("sharding") or "").lower()
    strategy: dict[str, Any] = {"dp": dp, "tp": tp, "pp": pp, "cp": cp, "ep": ep, "vpp": vpp, "global_batch": gb}
    if "full_shard" in sharding:
        strategy["fsdp"] = True
    elif "shard_grad_op" in sharding:
        strategy["zero"] = 2
    elif "zero" in sharding:
        m = re.search(r"zero[- ]?(?:stage)?\s*(\d)", sharding)
        strategy["zero"] = int(m.group(1)) if m else 1
    elif "distributed optimizer" in sharding:
        strategy["zero"] = 1
        notes["sharding"] = "not stated: distributed optimizer (ZeRO-1)"
    sp = (row.get("seq_parallel") or "").lower()
    if sp.startswith("yes"):
        strategy["sequence_parallel"] = True
    elif "not stated" in sp and tp > 1:
        strategy["sequence_parallel"] = True
        notes["sequence_parallel"] = "not stated: on with TP (required by --tp-comm-overlap)"
    strategy["recompute"] = _recompute(row.get("recompute") or "", notes)
    other = (row.get("other_settings") or "").lower()
    if "--overlap-param-gather" in other and strategy.get("zero"):
        strategy["overlap_param_gather"] = True
    if "--tp-comm-overlap" in other and tp > 1 and strategy.get("sequence_parallel"):
        strategy["tp_comm_overlap"] = True
    mb = _int(row, "micro_batch")
    if mb is None:
        ga = _int(row, "grad_accum")
        if ga:
            mb = gb // (dp * ga)
        else:
            mb = 1
            notes["micro_batch"] = "not stated: Megatron default 1"
    strategy["micro_batch"] = mb
    if vpp > 1:
        strategy["schedule"] = "interleaved"
    if gb % (mb * dp):
        return f"global_batch {gb} is not a multiple of micro_batch x dp = {mb * dp}"
    dtype = _dtype(row.get("precision") or "", row["gpu"])
    if "fp8" in dtype and "h100" not in row["gpu"].lower():
        return "fp8 on a GPU without fp8 tensor cores"
    if model["name"] not in ("resnet50",):
        model["attention"] = _attention(row, notes)
    job = {"model": model, "cluster": cluster, "strategy": strategy, "simulation": {"dtype": dtype}}
    metric, measured = _measured(row)
    if metric is None:
        return "no measured outcome (iteration time, TFLOP/s, MFU or throughput)"
    conv = convention_of(row.get("flops_convention") or "")
    shape = None
    if model["name"] != "resnet50":
        params = _num(row, "params_b")
        h, lay, v = model["hidden"], model["layers"], model.get("vocab") or 50257
        emb = v * h
        n = params * 1e9 if params else float("nan")
        shape = GPTShape(lay, h, model["seq_len"], v, n, n - emb if params else float("nan"))
    return RowJob(job, metric, measured, shape, conv, strategy["recompute"] == "full", notes)


def _measured(row: dict[str, str]) -> tuple[str | None, float]:
    for key in ("iter_time_s", "tflops_per_gpu", "mfu_pct", "samples_per_s", "tokens_per_s_per_gpu"):
        v = _num(row, key)
        if v is not None and v > 0:
            return key, v
    return None, math.nan


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
    pred = predicted_metric(rj, row, iteration_s, hw_flops, model_params)
    if isinstance(pred, str):
        return skip(row_index, case_id, pred)
    meas_iter = implied_iteration_s(rj, pred, rj.measured, iteration_s)
    gb = rj.job["strategy"]["global_batch"]
    model = row.get("model_name") or ""
    group = f"{row.get('source_group', '')}|{model}"
    return Outcome(row_index, case_id, rj.metric, pred, rj.measured, group, gb / iteration_s, gb / meas_iter,
                   tags={**rj.assumptions, "tier": row.get("tier", ""), "subset": row.get("subset", "")})


