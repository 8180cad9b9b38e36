"""How far is the analytic tier from the event simulation? Every row of the shared training_runs.csv that
`trainsim validate` maps (its own row -> job mapping, trainsim.validate.training_runs) predicted both ways.

    python benchmarks/analytic_vs_event.py [--jobs N] [--csv PATH]

Prints: rows compared (n); the analytic iteration time's relative difference from the event simulation's
(median, max, and the rows furthest apart); both tiers' MAPE against the measurements in each row's own
metric (what `trainsim validate` reports); the worst stage's peak memory difference; the wall time per row of
each tier. Needs ../shared beside the clone.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CSV = ROOT.parent / "shared" / "validation" / "training_runs.csv"


def _row(args: tuple[int, dict[str, str]]) -> dict[str, Any] | None:
    """One row simulated by both tiers (None: the row is not mapped or not expressible)."""
    from trainsim.api import simulate
    from trainsim.errors import ConfigError
    from trainsim.validate import training_runs

    i, row = args
    built = training_runs.row_job(row)
    if isinstance(built, str):
        return None
    out: dict[str, Any] = {"row": i, "case": row.get("case_id") or f"row{i}"}
    for fidelity in ("event", "analytic"):
        job = copy.deepcopy(built.job)
        job["simulation"]["fidelity"] = fidelity
        t0 = time.perf_counter()
        try:
            res = simulate(job)
        except ConfigError:
            return None
        out[f"{fidelity}_wall_s"] = time.perf_counter() - t0
        out[f"{fidelity}_s"] = res.iteration_time_s
        out[f"{fidelity}_peak_bytes"] = max(res.peak_memory_bytes)
        o = training_runs.outcome(i, row, built, res.iteration_time_s, res.hw_flops, float(res.model_params))
        out[f"{fidelity}_error_pct"] = o.error_pct
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", default=str(CSV))
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    args = ap.parse_args()
    from trainsim.validate.runner import map_rows, read_rows

    _, rows = read_rows(Path(args.csv))
    results = [r for r in map_rows(_row, list(enumerate(rows)), args.jobs) if r is not None]
    diff = np.array([r["analytic_s"] / r["event_s"] - 1.0 for r in results])
    mem = np.array([r["analytic_peak_bytes"] / r["event_peak_bytes"] - 1.0 for r in results])
    print(f"{args.csv}: {len(results)} rows mapped and simulated by both tiers (of {len(rows)})")
    print(f"analytic vs event iteration time: median |diff| {100 * np.median(np.abs(diff)):.2f}%, "
          f"max |diff| {100 * np.max(np.abs(diff)):.2f}%, mean signed {100 * diff.mean():+.2f}%, "
          f"within 5%: {int((np.abs(diff) <= 0.05).sum())}/{len(diff)}")
    for k in np.argsort(-np.abs(diff))[:5]:
        r = results[k]
        print(f"    {r['case']:<40} event {r['event_s']:.4g} s  analytic {r['analytic_s']:.4g} s  {100 * diff[k]:+.1f}%")
    for tier in ("event", "analytic"):
        errs = np.array([abs(r[f"{tier}_error_pct"]) for r in results if r[f"{tier}_error_pct"] is not None
                         and math.isfinite(r[f"{tier}_error_pct"])])
        print(f"{tier:>8} vs measured: n {len(errs)}  MAPE {errs.mean():.2f}%  median {np.median(errs):.2f}%  "
              f"max {errs.max():.2f}%")
    print(f"peak memory (worst stage), analytic vs event: median |diff| {100 * np.median(np.abs(mem)):.2f}%, "
          f"max |diff| {100 * np.max(np.abs(mem)):.2f}%")
    for tier in ("event", "analytic"):
        walls = np.array([r[f"{tier}_wall_s"] for r in results])
        print(f"{tier:>8} wall per row (lowering and costing included): median {1e3 * np.median(walls):.1f} ms, "
              f"total {walls.sum():.1f} s")


if __name__ == "__main__":
    main()
