"""Fit the compute model to the packaged published measurements and print what changed per device family.

Runs `trainsim.cost.fit_compute.fit_all` on `trainsim/data/measurements/*.csv` starting from the packaged
calibration, then prints, per family: each fitted constant (base -> fitted, and why a constant was kept), the
MAPE of predicted vs measured time before/after over the rows used, the rows left out, and the per-dtype bias
of the fitted GEMM model. Prints numbers; asserts nothing.

Usage: python benchmarks/fit_compute_published.py [--dir DIR] [--yaml OUT.yaml] [--rows]
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

from trainsim.cost.calibration import dump_calibration, load_calibration
from trainsim.cost.fit_compute import fit_all, packaged_measurement_dir


def _pct(x: float | None) -> str:
    return "   -  " if x is None else f"{100 * x:5.1f}%"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=None, help="measurement directory (default: packaged)")
    ap.add_argument("--yaml", type=Path, default=None, help="write the fitted calibration here")
    ap.add_argument("--rows", action="store_true", help="print every row's measured and predicted time")
    args = ap.parse_args()

    cal, report = fit_all(load_calibration(), args.dir)
    print(f"measurements: {args.dir or packaged_measurement_dir()}")
    for fam, rep in report["families"].items():
        print(f"\n=== {fam} (priced on {rep['device']}; GEMM dtypes {rep['gemm_dtypes']}, "
              f"attention impl {rep['attention_impls'] or '-'}) ===")
        for name, p in rep["params"].items():
            print(f"  {name:20s} {p['base']:10.4g} -> {p['value']:10.4g}   {p['status']}")
        print(f"  {'section':10s} {'rows':>5s} {'used':>5s}  MAPE before  after   (all priced rows: before  after)")
        for sec in ("gemm", "attention", "memory"):
            s = rep[sec]
            print(f"  {sec:10s} {s['n_rows']:5d} {s['n_used']:5d}     {_pct(s['mape_before'])}  "
                  f"{_pct(s['mape_after'])}                     {_pct(s['mape_before_all_priced'])}  "
                  f"{_pct(s['mape_after_all_priced'])}")
            reasons = Counter(re.sub(r"[\d.]+ us <", "# us <", r["reason"].split(":")[0]) for r in s["rows"]
                              if not r["used"])
            for why, n in sorted(reasons.items()):
                print(f"      left out x{n}: {why}")
            if args.rows:
                for r in s["rows"]:
                    if "measured_s" in r:
                        shape = {k: r[k] for k in r if k not in ("file", "used", "reason") and not k.endswith("_s")}
                        print(f"      {'*' if r['used'] else ' '} {shape} measured {r['measured_s'] * 1e6:9.1f} us "
                              f"before {r['predicted_before_s'] * 1e6:9.1f} after {r['predicted_after_s'] * 1e6:9.1f}")
        for dt, b in rep["gemm_dtype_bias_after"].items():
            print(f"  GEMM {dt:5s} measured/predicted (geomean, fitted model) = {b['measured_over_predicted_geomean']:.3f}"
                  f" over {b['n']} rows")
        for kernel, d in rep["attention_kernel_speed"].items():
            print(f"  attention_kernel_speed[{kernel}]: {d['status']} ({d['n']} rows)")
        for dt, d in rep["dtype_gemm_fraction"].items():
            print(f"  dtype_gemm_fraction[{dt}]: {d['status']} ({d['n']} rows)")
        for w in rep["warnings"]:
            print(f"  WARNING: {w}")
    if report["unknown_devices"]:
        print(f"\nrows with unknown devices: {report['unknown_devices']}")
    if args.yaml:
        args.yaml.write_text(dump_calibration(cal))
        print(f"\nwrote {args.yaml}")


if __name__ == "__main__":
    main()
