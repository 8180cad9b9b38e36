"""Run a validation file: detect its format, simulate every row, summarise errors and ranking.

Formats (by header): training_runs.csv, vTrain ground truth, collectives.csv. Rows run in
worker processes (each simulation is independent and pure), in input order.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..files import read_csv
from .cases import Outcome, skip
from .stats import error_summary, kendall, spearman

MIN_GROUP = 3  # a ranking group needs at least this many strategies


@dataclass
class ValidationReport:
    kind: str
    outcomes: list[Outcome]
    groups: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def compared(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.skipped is None and o.error_pct is not None]

    @property
    def skipped(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.skipped is not None]

    def summary(self) -> dict[str, Any]:
        errs = [o.error_pct for o in self.compared if o.error_pct is not None]
        s = error_summary(errs)
        rho, tau = _weighted_rank_quality(self.groups)
        return {"n": len(errs), "skipped": len(self.skipped), "mape": s["mape"], "median_ape": s["median_ape"],
                "max_ape": s["max_ape"], "mean_signed_error": s["mean_signed"], "spearman": rho, "kendall": tau,
                "ranking_groups": len(self.groups)}

    def to_json(self) -> dict[str, Any]:
        def num(x: float | None) -> float | None:
            return None if x is None or (isinstance(x, float) and math.isnan(x)) else x

        return {
            "kind": self.kind,
            "summary": {k: num(v) if isinstance(v, float) else v for k, v in self.summary().items()},
            "rows": [{"row": o.row, "case_id": o.case_id, "predicted": o.predicted, "measured": o.measured,
                      "metric": o.metric, "error_pct": o.error_pct, **({"assumptions": o.tags} if o.tags else {})}
                     for o in self.compared],
            "skipped_rows": [{"row": o.row, "case_id": o.case_id, "reason": o.skipped} for o in self.skipped],
            "ranking_groups": {k: {kk: num(vv) for kk, vv in v.items()} for k, v in self.groups.items()},
        }


def _weighted_rank_quality(groups: dict[str, dict[str, float]]) -> tuple[float, float]:
    """Mean of per-group rho and tau weighted by group size (nan when no group qualifies)."""
    rows = [(g["n"], g["spearman"], g["kendall"]) for g in groups.values()
            if not math.isnan(g["spearman"]) and not math.isnan(g["kendall"])]
    if not rows:
        return math.nan, math.nan
    w = sum(r[0] for r in rows)
    return sum(r[0] * r[1] for r in rows) / w, sum(r[0] * r[2] for r in rows) / w


def ranking_groups(outcomes: Iterable[Outcome]) -> dict[str, dict[str, float]]:
    """Spearman / Kendall of predicted vs measured throughput inside each group of >= MIN_GROUP rows."""
    by: dict[str, list[Outcome]] = defaultdict(list)
    for o in outcomes:
        if o.skipped is None and o.group and o.throughput_pred and o.throughput_meas:
            by[o.group].append(o)
    out = {}
    for g, os_ in sorted(by.items()):
        if len(os_) < MIN_GROUP:
            continue
        p = [o.throughput_pred for o in os_]
        m = [o.throughput_meas for o in os_]
        out[g] = {"n": float(len(os_)), "spearman": spearman(p, m), "kendall": kendall(p, m)}
    return out


def read_rows(path: Path, field: str = "CASES") -> tuple[list[str], list[dict[str, str]]]:
    """Header and rows of a measurement CSV (files.read_csv: bounded, UTF-8, one-line errors)."""
    return read_csv(path, field, what="measurement CSV")


def detect_kind(header: list[str]) -> str:
    from . import training_runs, vtrain

    cols = set(header)
    if set(training_runs.REQUIRED_COLUMNS) <= cols:
        return "training_runs"
    if set(vtrain.REQUIRED_COLUMNS) - {"# GPUs"} <= cols:
        return "vtrain"
    if {"collective", "size_bytes", "time_us", "n_gpus"} <= cols:
        return "collectives"
    raise ConfigError("CASES", "unrecognised columns", "use the header of training_runs.csv, vTrain's "
                      "ground_truth_*.csv or collectives.csv (see shared/validation/README.md)")


def _simulate_row(args: tuple[str, int, dict[str, str], str | None]) -> Outcome:
    """Simulate one training_runs or vTrain row (a worker-process entry point)."""
    from ..api import simulate
    from . import training_runs, vtrain

    kind, i, row, calibration = args
    case_id = row.get("case_id") or f"row{i}"
    built = training_runs.row_job(row) if kind == "training_runs" else vtrain.row_job(row)
    if isinstance(built, str):
        return skip(i, case_id, built)
    job = built.job if isinstance(built, training_runs.RowJob) else built
    if calibration:
        job["simulation"]["calibration"] = calibration
    try:
        res = simulate(job)
    except ConfigError as exc:
        return skip(i, case_id, f"not expressible: {exc.one_line()}")
    if isinstance(built, training_runs.RowJob):
        if res.oom:
            built.assumptions["oom"] = "trainsim predicts out-of-memory for this configuration"
        return training_runs.outcome(i, row, built, res.iteration_time_s, res.hw_flops, float(res.model_params))
    return vtrain.outcome(i, row, job, res.iteration_time_s)


def run_rows(kind: str, rows: list[dict[str, str]], calibration: str | None = None, jobs: int = 1,
             progress: Callable[[int], None] | None = None, row_indices: list[int] | None = None) -> ValidationReport:
    """Simulate `rows` (their 0-based file positions in `row_indices`) and build the report."""
    idx = row_indices if row_indices is not None else list(range(len(rows)))
    if kind == "collectives":
        from ..cost.calibration import load_calibration
        from .collectives import collective_outcomes

        outs = collective_outcomes(rows, load_calibration(calibration))
        for o, i in zip(outs, idx, strict=True):
            o.row = i
        if progress:
            progress(len(rows))
        return ValidationReport(kind, outs, ranking_groups(outs))
    fn = _simulate_row
    args = [(kind, i, r, calibration) for i, r in zip(idx, rows, strict=True)]
    outcomes: list[Outcome] = []
    if jobs <= 1 or len(args) < 8:
        for a in args:
            outcomes.append(fn(a))
            if progress:
                progress(1)
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            for o in pool.map(fn, args, chunksize=max(1, len(args) // (jobs * 8))):
                outcomes.append(o)
                if progress:
                    progress(1)
    return ValidationReport(kind, outcomes, ranking_groups(outcomes))


def filter_rows(kind: str, rows: list[dict[str, str]], tiers: set[str] | None,
                subsets: set[str] | None) -> tuple[list[int], list[dict[str, str]]]:
    """Keep rows of the given tiers/subsets (training_runs format only); returns (indices, rows)."""
    if (tiers or subsets) and kind != "training_runs":
        raise ConfigError("--tier/--subset", f"only training_runs.csv has tier/subset columns, not {kind}",
                          "drop the filter")
    keep = [(i, r) for i, r in enumerate(rows)
            if (not tiers or r.get("tier", "") in tiers) and (not subsets or r.get("subset", "") in subsets)]
    return [i for i, _ in keep], [r for _, r in keep]


def default_jobs() -> int:
    return max(1, min(8, (os.cpu_count() or 1)))
