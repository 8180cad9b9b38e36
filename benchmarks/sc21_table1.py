"""Megatron-LM SC'21 Table 1 (GPT 1.7B-1T on 32-3072 A100): predicted vs published TFLOP/s per GPU.

Not a test: prints the comparison. Every row is built from its own columns (model dims, degrees,
micro/global batch, recompute); the published number counts FLOPs the recompute-inclusive way
(Narayanan eq. 3), which is trainsim's hardware-FLOP count (HFU) under full recompute.
Usage: python benchmarks/sc21_table1.py [path/to/training_runs.csv]
"""

from __future__ import annotations

import csv
import statistics
import sys
from pathlib import Path

from trainsim.api import simulate

DEFAULT = Path(__file__).resolve().parents[2] / "shared" / "validation" / "training_runs.csv"


def job_for(row: dict[str, str]) -> dict:
    n_gpus, gpn = int(row["n_gpus"]), int(row["gpus_per_node"])
    return {
        "model": {"name": "custom", "layers": int(row["n_layers"]), "hidden": int(row["hidden"]),
                  "heads": int(row["n_heads"]), "vocab": int(row["vocab"]), "seq_len": int(row["seq_len"]),
                  "attention": "unfused"},
        "cluster": {"name": "dgx-a100", "nodes": n_gpus // gpn},
        "strategy": {"dp": int(row["dp"]), "tp": int(row["tp"]), "pp": int(row["pp"]), "vpp": int(row["vpp"]),
                     "micro_batch": int(row["micro_batch"]), "global_batch": int(row["global_batch"]),
                     "recompute": "full", "overlap_grad_reduce": "DDP impl=torch" in row["other_settings"]},
        "simulation": {"dtype": "fp16"},
    }


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT
    rows = [r for r in csv.DictReader(path.open()) if r["source_group"] == "megatron_sc21_table1"]
    seen, errs = set(), []
    print(f"{'case':<22}{'GPUs':>6}{'predicted':>11}{'published':>11}{'error':>9}{'MFU':>7}{'sim s':>8}")
    for row in rows:
        if row["case_id"] in seen:
            continue
        seen.add(row["case_id"])
        r = simulate(job_for(row))
        pred, pub = r.hw_tflops_per_gpu, float(row["tflops_per_gpu"])
        err = 100 * (pred - pub) / pub
        errs.append(abs(err))
        print(f"{row['case_id']:<22}{row['n_gpus']:>6}{pred:>11.1f}{pub:>11.1f}{err:>8.1f}%{100 * r.mfu:>6.1f}%"
              f"{r.simulation_wall_s:>8.3f}")
    print(f"mean absolute error {statistics.mean(errs):.1f}% (max {max(errs):.1f}%) over {len(errs)} rows")


if __name__ == "__main__":
    main()
