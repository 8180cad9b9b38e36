"""trainsim's compute model against the kernels measured on an H200 (benchmarks/data/gpu_h200, issue 23).

Prices every measured kernel with the packaged calibration (RooflineCompute on the `h200` device) and prints, per
section, the number of rows, the mean absolute error of the predicted time and its bias (+ = predicted slower
than measured): dense GEMMs (BF16 torch.mm, FP8 torch._scaled_mm), the experts' grouped GEMMs (by implementation,
pass, and small / large tokens per expert), attention per SDPA backend (flash2_sdpa priced as trainsim's `flash`,
cudnn as `cudnn`), Mamba2's SSD scan, and one MoE layer (forward + backward, GPU kernel time) against trainsim's
ops of the same layer. Prints numbers; asserts nothing.

Usage: python benchmarks/gpu_kernels_vs_model.py [--dir benchmarks/data/gpu_h200] [--rows]
"""

from __future__ import annotations

import argparse
import csv
import statistics
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

from trainsim.cost.calibration import load_calibration
from trainsim.cost.compute import RooflineCompute
from trainsim.cost.fit_compute import (
    attention_kernel,
    gemm_op,
    measured_attention_time,
    measured_gemm_time,
    predict_attention,
    predict_gemm,
)
from trainsim.hardware.devices import get_device
from trainsim.workload.zoo import transformer_config
from trainsim.workload.zoo.transformer import _mamba2_ops, build_transformer

HERE = Path(__file__).resolve().parent


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(line for line in f if not line.startswith("#")))


def _line(name: str, errors: list[float]) -> str:
    if not errors:
        return f"  {name:44s}     0 rows"
    mean_abs = 100 * statistics.mean(abs(e) for e in errors)
    return (f"  {name:44s} {len(errors):5d} rows  mean |error| {mean_abs:6.1f}%  bias {100 * statistics.mean(errors):+6.1f}%"
            f"  max {100 * max(errors, key=abs):+6.1f}%")


def _print(groups: dict[str, list[float]]) -> None:
    """One line per group of rows, in name order."""
    for key in sorted(groups):
        print(_line(key, groups[key]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=HERE / "data" / "gpu_h200")
    ap.add_argument("--rows", action="store_true", help="print every row")
    args = ap.parse_args()
    dev = get_device("h200")
    params = load_calibration().compute_for(dev)
    model = RooflineCompute(params)

    print("dense GEMMs (time error, + = trainsim slower)")
    dense: dict[str, list[float]] = defaultdict(list)
    for r in _rows(args.dir / "gemm.csv"):
        row = {"m": int(r["m"]), "n": int(r["n"]), "k": int(r["k"]), "batch": 1, "dtype": r["dtype"],
               "tflops": float(r["tflops"])}
        err = predict_gemm(params, row, dev) / measured_gemm_time(row) - 1
        small_n = "router (n <= 256)" if row["n"] <= 256 else "n > 256"
        dense[f"{r['dtype']}, {small_n}"].append(err)
        if args.rows:
            print(f"    {r['dtype']} {row['m']}x{row['n']}x{row['k']} {r['notes'][:30]}: {100 * err:+.1f}%")
    _print(dense)

    print("grouped GEMMs of the experts (as a batched GEMM over the local experts)")
    grouped: dict[str, list[float]] = defaultdict(list)
    for r in _rows(args.dir / "grouped_gemm.csv"):
        op = gemm_op(int(r["m"]), int(r["n"]), int(r["k"]), int(r["groups"]))
        dtype = "fp8" if r["impl"] == "fp8_grouped" else "bf16"
        t = model.contraction_time(op, op.dims, "fwd", dev, dtype) + params.kernel_overhead_s
        err = t / (float(r["time_us"]) * 1e-6) - 1
        size = ">= 1024" if int(r["m_per_group"]) >= 1024 else "< 1024"
        grouped[f"{r['impl']:11s} {r['pass']:5s} tokens/expert {size}"].append(err)
    _print(grouped)

    print("attention (causal; trainsim's kernel for the backend)")
    attn: dict[str, list[float]] = defaultdict(list)
    for r in _rows(args.dir / "attention.csv"):
        if attention_kernel(r["impl"]) is None and r["impl"] != "flash2_sdpa":
            continue  # PyTorch's memory-efficient kernel: no trainsim counterpart
        row = {"batch": int(r["batch"]), "heads": int(r["heads"]), "seq_len": int(r["seq_len"]),
               "head_dim": int(r["head_dim"]), "causal": r["causal"] == "true", "direction": r["direction"],
               "dtype": "bf16", "impl": "flash2" if r["impl"] == "flash2_sdpa" else r["impl"],
               "tflops": float(r["tflops"])}
        err = predict_attention(params, row, dev) / measured_attention_time(row) - 1
        attn[f"{r['impl']} {r['direction']}"].append(err)
    _print(attn)

    print("Mamba2 SSD scan (GPU kernel time)")
    ssd: dict[str, list[float]] = defaultdict(list)
    for r in _rows(args.dir / "mamba_ssd.csv"):
        cfg = replace(transformer_config("nemotron-3-nano"), mamba_heads=int(r["heads"]),
                      mamba_head_dim=int(r["head_dim"]), mamba_state=int(r["state"]),
                      mamba_groups=int(r["groups"]), mamba_chunk=int(r["chunk"]))
        op = next(o for o in _mamba2_ops(cfg, int(r["batch"]), int(r["seq"])) if o.name == "ssd")
        for phase in ("fwd", "bwd"):
            err = model.op_time(op, op.dims, phase, dev, "bf16") / (float(r[f"{phase}_kernel_us"]) * 1e-6) - 1
            ssd[phase].append(err)
            if args.rows:
                print(f"    {r['model']} {phase}: {100 * err:+.1f}%")
    _print(ssd)

    print("one MoE layer, forward + backward, GPU kernel time (the eager PyTorch layer of moe_layer.csv)")
    for r in _rows(args.dir / "moe_layer.csv"):
        name = r["model"]
        cfg = replace(transformer_config(name), layers=1, experts=int(r["local_experts"]), layer_pattern="")
        built = build_transformer(cfg, 1, int(r["seq"]))
        total = sum(model.op_time(op, op.dims, ph, dev, "bf16") for layer in built.layers
                    if layer.name.startswith("layers.") for op in layer.ops for ph in ("fwd", "bwd"))
        print(f"  {name:18s} measured {float(r['gpu_ms']):6.2f} ms ({r['kernels']} kernels), trainsim "
              f"{1e3 * total:6.2f} ms ({100 * (1e3 * total / float(r['gpu_ms']) - 1):+.0f}%)")
    print("  (the measured layer gathers and scatters tokens with index_select / index_add, slower than Megatron's "
          "fused permutation; its router covers the local experts only in trainsim's copy)")


if __name__ == "__main__":
    main()
