"""Fit each Blackwell family's sustained tensor-core share to the dense Megatron-Bridge runs and print it.

The packaged Blackwell GEMM shares are short-run matmul peaks (stas00's MAMF table) times the A100's
sustained/burst ratio, and the attention shares are Hopper's. Whether a GPU holds that rate through a training
run is a question for end-to-end measurements: `benchmarks/data/nemo_dense_runs.csv` holds the dense Llama 3
8B / 70B / 3.1 405B runs of the Megatron-Bridge performance pages on DGX B200, GB200 NVL72 and GB300 NVL72 (FP8
current scaling and MXFP8, 8-256 GPUs). For each family this scales every tensor-core share of its calibration
entry (the GEMM shares of every dtype and the fused-attention shares) by one factor, a sustained clock, and
finds the factor with the least mean |log error| over that family's rows (golden-section search, 16 steps). It prints the
factor, the rows' errors before and after, and the shares it implies for `trainsim/data/calibration.yaml`.

The packaged shares are this fit (b200 x 0.856, gb200 x 0.839, gb300 x 1.040 of the MAMF-based shares), so against the
packaged calibration it prints factors of 1.00 and the rows' errors as they stand (b200 4.3%, gb200 4.6%, gb300 4.1%).
The MoE runs (`shared/validation/moe_runs.csv`) are not read: they are the held-out check of what is fitted here.
Prints numbers; asserts nothing.

Usage: python benchmarks/fit_blackwell_sustained.py [--families b200,gb200,gb300] [--jobs 2] [--rows]
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from trainsim.cost.calibration import Calibration, load_calibration
from trainsim.validate.calibrate import Dataset, golden_min, loss, predict, with_values

HERE = Path(__file__).resolve().parent
DENSE = HERE / "data" / "nemo_dense_runs.csv"
SCALED = ("gemm_peak_fraction", "dtype_gemm_fraction", "flash_fraction_fwd", "flash_fraction_bwd")
GPU_OF = {"b200": "dgx-b200", "gb200": "gb200", "gb300": "gb300", "b300": "dgx-b300"}
"""Family -> how its rows name the GPU (lower case, in the `gpu` column)."""


def _rows_of(family: str, rows: list[dict[str, str]]) -> tuple[list[dict[str, str]], list[int]]:
    key = GPU_OF[family]
    picked = [(i, r) for i, r in enumerate(rows)
              if key in r["gpu"].lower().replace(" ", "-") and r["source_group"] == "megatron_bridge_dense"]
    return [r for _, r in picked], [i for i, _ in picked]


def scaled(cal: Calibration, family: str, factor: float) -> Calibration:
    """`cal` with every tensor-core share of `family` times `factor`."""
    p = cal.compute[family]
    values = {"gemm_peak_fraction": p.gemm_peak_fraction * factor,
              "dtype_gemm_fraction": {k: v * factor for k, v in p.dtype_gemm_fraction.items()},
              "flash_fraction_fwd": p.flash_fraction_fwd * factor,
              "flash_fraction_bwd": p.flash_fraction_bwd * factor}
    return with_values(cal, family, values)  # type: ignore[arg-type]


def _errors(cal: Calibration, ds: Dataset, jobs: int) -> list[tuple[str, float]]:
    rep = predict(cal, [ds], jobs)[0]
    return [(ds.rows[ds.indices.index(o.row)]["case_id"], 100 * (o.predicted / o.measured - 1)) for o in rep.compared]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default="b200,gb200,gb300")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--rows", action="store_true", help="print every row's error before and after")
    args = ap.parse_args()
    rows = list(csv.DictReader(DENSE.open()))
    base = load_calibration()
    for family in args.families.split(","):
        picked, idx = _rows_of(family, rows)
        if not picked:
            print(f"{family}: no dense Megatron-Bridge rows")
            continue
        ds = Dataset("training_runs", picked, idx, DENSE.name)
        factor, _ = golden_min(lambda x, fam=family, d=ds: loss(predict(scaled(base, fam, x), [d], args.jobs)),
                               0.6, 1.3, 16)
        before, after = _errors(base, ds, args.jobs), _errors(scaled(base, family, factor), ds, args.jobs)

        def stats(errs: list[tuple[str, float]]) -> str:
            e = [x for _, x in errs]
            return f"MAPE {sum(map(abs, e)) / len(e):5.1f}%  bias {sum(e) / len(e):+5.1f}%"

        p = base.compute[family]
        print(f"{family}: {len(before)} rows; sustained factor {factor:.3f}")
        print(f"  before: {stats(before)}   after: {stats(after)}")
        print(f"  gemm_peak_fraction {p.gemm_peak_fraction:.3f} -> {p.gemm_peak_fraction * factor:.3f}; "
              + ", ".join(f"{k} {v:.3f} -> {v * factor:.3f}" for k, v in p.dtype_gemm_fraction.items())
              + f"; flash_fraction_fwd {p.flash_fraction_fwd:.3f} -> {p.flash_fraction_fwd * factor:.3f}, "
              f"bwd {p.flash_fraction_bwd:.3f} -> {p.flash_fraction_bwd * factor:.3f}")
        if args.rows:
            for (cid, b), (_, a) in zip(before, after, strict=True):
                print(f"    {cid:52s} {b:+6.1f}% -> {a:+6.1f}%")


if __name__ == "__main__":
    main()
