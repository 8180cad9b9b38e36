"""The README's worked case: DeepSeek-V3 as published (arXiv 2412.19437, sec. 3: 2048 H800, PP16, EP64 over 8
nodes, ZeRO-1 data parallelism, FP8, MTP 1, recompute of RMSNorm and the MLA up-projections) and Megatron's layouts
of the same model on H100 and GB200 (the moe_runs.csv rows of Megatron-Bridge's tables).

Prints, per case: tokens/s per GPU, MFU, where the time goes and the fullest stage's memory; for the published
setup also DualPipeV as the schedule and what an all-to-all that costs nothing would give (under 1F1B),
and for the Megatron rows the measured figure beside the prediction. Prints numbers; asserts nothing.
Usage: python benchmarks/deepseek_v3_case.py
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from trainsim.api import simulate
from trainsim.validate.training_runs import row_job

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "validation"
PUBLISHED_TOKENS_PER_GPU_S = 1e12 / (180e3 * 3600)  # the report: 180K H800 GPU hours per trillion tokens

PUBLISHED: dict[str, Any] = {
    "model": {"name": "deepseek-v3", "seq_len": 4096},
    "cluster": {"name": "dgx-h800", "nodes": 256},
    # 61 layers over 16 stages: 3 beside the embedding, 4 each, 2 beside the MTP module, head and loss
    "strategy": {"pp": 16, "ep": 64, "dp": 128, "zero": 1, "global_batch": 15360, "micro_batch": 1,
                 "stage_layers": [3] + [4] * 14 + [2],
                 "recompute": "selective", "recompute_modules": ["layernorm", "mla_up_proj"]},
    "simulation": {"dtype": "fp8"},
}


def report(name: str, job: dict[str, Any], tokens: int, measured: float | None = None) -> float:
    r = simulate(job)
    tps = tokens / r.iteration_time_s / r.n_gpus
    top = max(r.memory, key=lambda m: m.peak_reserved_bytes)
    parts = ", ".join(f"{k} {v:.2f}" for k, v in r.breakdown.items() if v > 0.005)
    vs = f"  measured {measured:,.0f} ({100 * (tps / measured - 1):+.0f}%)" if measured else ""
    print(f"{name}\n  {tps:,.0f} tokens/s per GPU{vs}, MFU {100 * r.mfu:.1f}%, iteration {r.iteration_time_s:.2f} s"
          f" ({r.strategy['grad_accumulation']} micro-batches per pipeline)\n  time (s per GPU): {parts}\n"
          f"  fullest stage: {top.peak_reserved_bytes / 2**30:.1f} GiB reserved of {top.capacity_bytes / 2**30:.1f}")
    return tps


def main() -> None:
    tokens = 15360 * 4096
    print(f"published: {PUBLISHED_TOKENS_PER_GPU_S:,.0f} tokens/s per GPU (180K H800 GPU hours per trillion tokens)\n")
    report("DeepSeek-V3's layout on 2048 H800: PP16 x EP64 x DP128, ZeRO-1, FP8; 1F1B, NCCL all-to-all", PUBLISHED,
           tokens, PUBLISHED_TOKENS_PER_GPU_S)
    two_hop = {**PUBLISHED, "strategy": {**PUBLISHED["strategy"], "ep_dispatcher": "deepep", "ep_node_limit": 4}}
    report("+ its dispatch: one copy per node over InfiniBand, NVLink forwarding, each token to at most 4 nodes",
           two_hop, tokens, PUBLISHED_TOKENS_PER_GPU_S)
    overlap = {**two_hop, "strategy": {**two_hop["strategy"], "ep_overlap": True}}
    report("+ its overlap: each layer's all-to-all under another micro-batch's opposite pass (as DualPipe pairs "
           "them)", overlap, tokens, PUBLISHED_TOKENS_PER_GPU_S)
    # DualPipeV (the V of DualPipe, without its second copy of the parameters): 32 chunks in a V, rank 0 holding the
    # embedding with 1 layer and the MTP module with the head, every other rank 2 + 2 layers
    dual = {**overlap, "strategy": {**overlap["strategy"], "schedule": "dualpipev",
                                    "stage_layers": [1] + [2] * 30 + [0]}}
    report("+ its schedule: DualPipeV (two chunks per rank in a V, zero-bubble backwards)", dual, tokens,
           PUBLISHED_TOKENS_PER_GPU_S)
    cached = {**dual, "simulation": {**dual["simulation"], "fp8_activations": True}}
    report("+ its activation caching: the linear layers' inputs kept in FP8 for the backward", cached, tokens,
           PUBLISHED_TOKENS_PER_GPU_S)
    free = {**PUBLISHED, "cluster": {**PUBLISHED["cluster"], "nic_gbps": 1e4, "intra_node_gbps": 1e5}}
    report("bound: every transfer nearly free (1F1B)", free, tokens, PUBLISHED_TOKENS_PER_GPU_S)
    rows = {r["case_id"]: r for r in csv.DictReader((SHARED / "moe_runs.csv").open())}
    for cid, what in (("MBRIDGE-191", "Megatron on 1024 H100: TP2 x PP8 (VPP4) x EP64, FP8"),
                      ("MBRIDGE-145", "Megatron on 256 GB200 NVL72: PP4 (VPP4) x EP64, MXFP8"),
                      ("MBRIDGE-122", "the same GB200 layout, a later container (26.02.01)")):
        row = rows[cid]
        rj = row_job(row)
        if isinstance(rj, str):
            print(f"{cid}: not mapped ({rj})")
            continue
        s = rj.job["strategy"]
        report(f"{what} [{cid}, {row['software_version']}]", rj.job, s["global_batch"] * rj.job["model"]["seq_len"],
               float(row["tokens_per_s_per_gpu"]))


if __name__ == "__main__":
    main()
