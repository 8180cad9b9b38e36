"""Rows of vTrain's ground-truth files (Megatron-DeepSpeed GPT on A100) -> trainsim jobs.

vTrain's own simulation configs for these runs (shared/validation/README.md): A100, 8 GPUs per
node, 4x200 Gb/s HDR per node (800 Gb/s), activation checkpointing, 1F1B, fp16, no gradient
bucketing (one all-reduce after the backward pass), Megatron's GPT-2 BPE vocabulary padded to a
multiple of 128 x TP. Attention is Megatron's unfused path (fused scale-mask-softmax kernel).
"""

from __future__ import annotations

import math
from typing import Any

from .cases import Outcome

REQUIRED_COLUMNS = ("# GPUs", "global batch", "micro batch", "hidden size", "attention heads", "# layers",
                    "sequence length", "tensor parallelism", "data parallelism", "pipeline parallelism",
                    "iteration time (ms)")
GPT2_VOCAB = 50257


def padded_vocab(tp: int, vocab: int = GPT2_VOCAB) -> int:
    """Megatron pads the vocabulary to a multiple of 128 x TP (make-vocab-size-divisible-by)."""
    unit = 128 * tp
    return math.ceil(vocab / unit) * unit


def row_job(row: dict[str, str]) -> dict[str, Any] | str:
    try:
        g, gb, mb = int(row["# GPUs"]), int(row["global batch"]), int(row["micro batch"])
        h, a, lay, s = (int(row[k]) for k in ("hidden size", "attention heads", "# layers", "sequence length"))
        tp, dp, pp = (int(row[k]) for k in ("tensor parallelism", "data parallelism", "pipeline parallelism"))
    except (KeyError, ValueError) as exc:
        return f"unreadable column: {exc}"
    if min(g, gb, mb, h, a, lay, s, tp, dp, pp) < 1:
        return "counts and sizes must be positive"
    if tp * dp * pp != g:
        return f"tp*dp*pp = {tp * dp * pp} != # GPUs {g}"
    if gb % (mb * dp):
        return f"global batch {gb} is not a multiple of micro batch x dp = {mb * dp}"
    if _measured_s(row) is None:
        return f"unreadable measurement: 'iteration time (ms)' = {row.get('iteration time (ms)', '')!r}"
    gpn = min(8, g)
    return {
        "model": {"name": "custom", "layers": lay, "hidden": h, "heads": a, "seq_len": s, "vocab": padded_vocab(tp),
                  "attention": "unfused"},
        "cluster": {"name": "dgx-a100", "nodes": max(1, g // 8), "gpus_per_node": gpn, "nics_per_node": 4,
                    "nic_gbps": 25.0},
        "strategy": {"tp": tp, "dp": dp, "pp": pp, "micro_batch": mb, "global_batch": gb, "recompute": "full",
                     "schedule": "1f1b", "overlap_grad_reduce": False},
        "simulation": {"dtype": "fp16"},
    }


def _measured_s(row: dict[str, str]) -> float | None:
    """The row's measured iteration time in seconds, None when the cell is empty, not a number or not positive."""
    try:
        ms = float(row.get("iteration time (ms)", ""))
    except ValueError:
        return None
    return ms / 1e3 if math.isfinite(ms) and ms > 0 else None


def outcome(row_index: int, row: dict[str, str], job: dict[str, Any], iteration_s: float) -> Outcome:
    measured_s = _measured_s(row)
    assert measured_s is not None, "row_job skips rows without a measurement"
    st = job["strategy"]
    m = job["model"]
    case_id = (f"vtrain-{row['# GPUs']}gpu-h{m['hidden']}-l{m['layers']}-tp{st['tp']}-dp{st['dp']}-pp{st['pp']}"
               f"-mb{st['micro_batch']}-gb{st['global_batch']}")
    group = f"vtrain|h{m['hidden']}-l{m['layers']}-a{m['heads']}-s{m['seq_len']}"
    gb = st["global_batch"]
    return Outcome(row_index, case_id, "iter_time_s", iteration_s, measured_s, group, gb / iteration_s,
                   gb / measured_s)


__all__ = ["REQUIRED_COLUMNS", "outcome", "padded_vocab", "row_job"]
