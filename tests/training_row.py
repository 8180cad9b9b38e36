"""A synthetic row of training_runs.csv (every column validate reads), for tests of validate's mapping."""

from __future__ import annotations

BASE: dict[str, str] = {
    "case_id": "SYN-1", "tier": "A", "subset": "core", "case_kind": "train_iter", "source_group": "synthetic",
    "source": "synthetic row", "model_name": "GPT-tiny", "arch": "GPT (pre-LN, GeLU MLP 4h, MHA, learned pos-emb)",
    "n_layers": "4", "hidden": "256", "n_heads": "8", "n_kv_heads": "8", "ffn_hidden": "1024", "seq_len": "512",
    "vocab": "50304", "params_b": "", "precision": "bf16", "gpu": "A100 80GB", "gpu_mem_gb": "80", "n_gpus": "8",
    "gpus_per_node": "8", "intra_node_link": "NVLink3 + NVSwitch", "inter_node_net": "", "dp": "8", "tp": "1",
    "pp": "1", "vpp": "", "cp": "1", "ep": "1", "seq_parallel": "no", "sharding": "none", "recompute": "none",
    "micro_batch": "2", "global_batch": "16", "grad_accum": "", "other_settings": "", "iter_time_s": "0.5",
    "flops_convention": "",
}


def training_row(**columns: str) -> dict[str, str]:
    """BASE with `columns` replaced."""
    return {**BASE, **columns}
