"""Run a validation file: detect its format, simulate every row, summarise errors and ranking.

Formats (by header): training_runs.csv, vTrain ground truth, collectives.csv, alltoall.csv, ASTRA-sim reference
files (astra_reference.csv, predicted in ASTRA-sim's semantics or NCCL's). Rows run in
worker processes (each simulation is independent and pure), in input order.
"""

from __future__ import annotations

import math
import os
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from ..errors import ConfigError
from ..files import read_csv
from .cases import MEMORY_METRIC, Outcome, skip, skips_by_reason
from .stats import error_summary, group_stats, kendall, memory_stats, spearman

MIN_GROUP = 3  # a ranking group needs at least this many strategies
T = TypeVar("T")
R = TypeVar("R")


@dataclass
class ValidationReport:
    kind: str
    outcomes: list[Outcome]
    groups: dict[str, dict[str, float]] = field(default_factory=dict)
    by: list[str] = field(default_factory=list)  # the --by columns, when rows are grouped
    by_group: dict[str, dict[str, Any]] = field(default_factory=dict)  # stats_by_group per --by value
    # a file's own groupings, shown without --by (moe_runs.csv: per model and per GPU): column -> stats per value
    default_groups: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    semantics: str | None = None  # ASTRA-sim reference files: the collective semantics predicted in

    def term_table(self) -> list[tuple[str, str, int, float, float]]:
        """ASTRA-sim reference predicted with NCCL's semantics: the gap per term (validate.astra_reference)."""
        from .astra_reference import term_table

        return term_table(self.compared)

    @property
    def compared(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.skipped is None and o.error_pct is not None]

    @property
    def skipped(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.skipped is not None]

    @property
    def memory_compared(self) -> list[Outcome]:
        """Simulated rows with a measured peak memory (those with a time metric and the memory-only ones)."""
        return [o for o in self.outcomes if o.skipped is None and o.memory_error_pct is not None]

    @property
    def listed(self) -> list[Outcome]:
        """The rows the JSON lists: every time-compared row and every memory-only row, in input order."""
        return [o for o in self.outcomes if o.skipped is None
                and (o.error_pct is not None or (o.metric == MEMORY_METRIC and o.memory_error_pct is not None))]

    def memory_summary(self) -> dict[str, Any]:
        """memory_stats over every memory-compared row."""
        return _memory_stats(self.memory_compared)

    def memory_by_kind(self) -> dict[str, dict[str, Any]]:
        """memory_stats per mem_kind (allocated, reserved, unstated) of the rows that have one."""
        by: dict[str, list[Outcome]] = defaultdict(list)
        for o in self.memory_compared:
            by[o.mem_kind or ""].append(o)
        return {k: _memory_stats(v) for k, v in sorted(by.items())}

    def reserved_summary(self) -> dict[str, Any]:
        """memory_stats of the reserved peaks: the rows whose figure is reserved, and those that state a reserved
        peak beside their allocated one (each row once; the overall memory summary counts its own figure)."""
        rows = [o for o in self.outcomes if o.skipped is None and o.reserved_error_pct is not None]
        return memory_stats([o.reserved_error_pct or 0.0 for o in rows], [bool(o.oom_predicted) for o in rows])

    def summary(self) -> dict[str, Any]:
        errs = [o.error_pct for o in self.compared if o.error_pct is not None]
        s = error_summary(errs)
        rho, tau = _weighted_rank_quality(self.groups)
        memory = {"memory": self.memory_summary(), "memory_by_kind": self.memory_by_kind(),
                  "memory_reserved": self.reserved_summary()} \
            if self.kind == "training_runs" else {}
        return {"n": len(errs), "skipped": len(self.skipped), "mape": s["mape"], "median_ape": s["median_ape"],
                "max_ape": s["max_ape"], "mean_signed_error": s["mean_signed"], "spearman": rho, "kendall": tau,
                "ranking_groups": len(self.groups), **memory}

    def to_json(self) -> dict[str, Any]:
        def num(x: Any) -> Any:
            if isinstance(x, dict):
                return {k: num(v) for k, v in x.items()}
            return None if isinstance(x, float) and math.isnan(x) else x

        return {
            "kind": self.kind,
            **({"semantics": self.semantics} if self.semantics else {}),
            "summary": num(self.summary()),
            "rows": [{"row": o.row, "case_id": o.case_id, "predicted": o.predicted, "measured": o.measured,
                      "metric": o.metric, "error_pct": o.error_pct, **({"group": o.group} if o.group else {}),
                      **_memory_row(o), **({"assumptions": o.tags} if o.tags else {})}
                     for o in self.listed],
            "skipped_rows": [{"row": o.row, "case_id": o.case_id, "reason": o.skipped} for o in self.skipped],
            "skipped_by_reason": {reason: len(os_) for reason, os_ in skips_by_reason(self.skipped)},
            "ranking_groups": {k: {kk: num(vv) for kk, vv in v.items()} for k, v in self.groups.items()},
            **({"gap_terms": [{"term": n, "what": w, "rows": r, "total_us": t, "mean_share_pct": m}
                              for n, w, r, t, m in self.term_table()]} if self.semantics == "nccl" else {}),
            **({"group_by": self.by, "group_bias": BIAS_MEANING,
                "groups": {k: {kk: num(vv) if isinstance(vv, float) else vv for kk, vv in v.items()}
                           for k, v in self.by_group.items()}} if self.by else {}),
            **({"groups_by_column": {col: {k: {kk: num(vv) if isinstance(vv, float) else vv for kk, vv in v.items()}
                                           for k, v in stats.items()} for col, stats in self.default_groups.items()},
                "group_bias": BIAS_MEANING} if self.default_groups else {}),
        }


def _memory_stats(outcomes: list[Outcome]) -> dict[str, Any]:
    return memory_stats([o.memory_error_pct or 0.0 for o in outcomes], [bool(o.oom_predicted) for o in outcomes])


def _memory_row(o: Outcome) -> dict[str, Any]:
    """A JSON row's memory keys (none where the row measured no memory): GiB, signed error in %."""
    if o.memory_error_pct is None:
        return {}
    return {"memory_measured_gib": o.memory_measured_gib, "memory_predicted_gib": o.memory_predicted_gib,
            "memory_error": o.memory_error_pct, "mem_kind": o.mem_kind, "oom_predicted": o.oom_predicted,
            **({"reserved_measured_gib": o.reserved_measured_gib, "reserved_predicted_gib": o.reserved_predicted_gib,
                "reserved_error": o.reserved_error_pct} if o.reserved_measured_gib is not None else {})}


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
    from . import astra_reference, training_runs, vtrain

    cols = set(header)
    if set(astra_reference.REQUIRED_COLUMNS) <= cols:
        return "astra_reference"
    if set(training_runs.REQUIRED_COLUMNS) <= cols:
        return "training_runs"
    if set(vtrain.REQUIRED_COLUMNS) - {"# GPUs"} <= cols:
        return "vtrain"
    if {"reported_bw_gbps", "bw_definition", "collective", "n_gpus"} <= cols:
        return "alltoall"
    if {"collective", "size_bytes", "time_us", "n_gpus"} <= cols:
        return "collectives"
    raise ConfigError("CASES", "unrecognised columns", "use the header of training_runs.csv, vTrain's "
                      "ground_truth_*.csv, collectives.csv, alltoall.csv or astra_reference.csv (see "
                      "shared/validation/README.md)")


def _simulate_row(args: tuple[str, int, dict[str, str], str | None, dict[str, Any]]) -> Outcome:
    """Simulate one training_runs or vTrain row (a worker-process entry point)."""
    from ..api import simulate
    from . import training_runs, vtrain

    kind, i, row, calibration, simulation = args
    case_id = row.get("case_id") or f"row{i}"
    built = training_runs.row_job(row) if kind == "training_runs" else vtrain.row_job(row)
    if isinstance(built, str):
        return skip(i, case_id, built)
    job = built.job if isinstance(built, training_runs.RowJob) else built
    if calibration:
        job["simulation"]["calibration"] = calibration
    job["simulation"].update(simulation)
    try:
        res = simulate(job)
    except ConfigError as exc:
        return skip(i, case_id, f"not expressible: {exc.one_line()}")
    if isinstance(built, training_runs.RowJob):
        if res.oom:
            built.assumptions["oom"] = "trainsim predicts out-of-memory for this configuration"
        out = training_runs.outcome(i, row, built, res.iteration_time_s, res.hw_flops, float(res.model_params))
        return out if out.skipped is not None else training_runs.with_memory(out, row, res.peak_memory_bytes, res.oom,
                                                                               [m.reserved_bytes for m in res.memory])
    return vtrain.outcome(i, row, job, res.iteration_time_s)


def run_rows(kind: str, rows: list[dict[str, str]], calibration: str | None = None, jobs: int = 1,
             progress: Callable[[int], None] | None = None, row_indices: list[int] | None = None,
             semantics: str = "astra", simulation: dict[str, Any] | None = None) -> ValidationReport:
    """Simulate `rows` (their 0-based file positions in `row_indices`) and build the report.
    `semantics` applies to ASTRA-sim reference files: predict as ASTRA-sim (astra) or as NCCL (nccl);
    `simulation`: keys set in every training run's simulation section (compute_model: learned:FILE, say)."""
    idx = row_indices if row_indices is not None else list(range(len(rows)))
    if kind == "astra_reference":
        from .astra_reference import astra_outcomes

        outs = astra_outcomes(rows, semantics)
        for o, i in zip(outs, idx, strict=True):
            o.row = i
        if progress:
            progress(len(rows))
        return ValidationReport(kind, outs, {}, semantics=semantics)
    if kind in ("collectives", "alltoall"):
        from ..cost.calibration import load_calibration
        from .alltoall import alltoall_outcomes
        from .collectives import collective_outcomes

        outs = (collective_outcomes if kind == "collectives" else alltoall_outcomes)(rows, load_calibration(calibration))
        for o, i in zip(outs, idx, strict=True):
            o.row = i
        if progress:
            progress(len(rows))
        return ValidationReport(kind, outs, ranking_groups(outs))
    args = [(kind, i, r, calibration, dict(simulation or {})) for i, r in zip(idx, rows, strict=True)]
    outcomes = map_rows(_simulate_row, args, jobs, progress)
    return ValidationReport(kind, outcomes, ranking_groups(outcomes))


def map_rows(fn: Callable[[T], R], args: list[T], jobs: int, progress: Callable[[int], None] | None = None,
             batches_per_job: int = 8) -> list[R]:
    """`fn` over `args` in input order: in this process for one job or a handful of rows, else in `jobs`
    worker processes (`fn` and its arguments must pickle); `progress(1)` after each row."""
    out: list[R] = []
    if jobs <= 1 or len(args) < 8:
        for a in args:
            out.append(fn(a))
            if progress:
                progress(1)
        return out
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for res in pool.map(fn, args, chunksize=max(1, len(args) // (jobs * batches_per_job))):
            out.append(res)
            if progress:
                progress(1)
    return out


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


# --by / --cv: short names for the columns of each format (any header column is accepted as well)
COLUMN_ALIASES: dict[str, dict[str, str]] = {
    "training_runs": {"source": "source_group", "model": "model_name", "gpus": "n_gpus", "kind": "case_kind"},
    "vtrain": {"gpus": "# GPUs", "tp": "tensor parallelism", "dp": "data parallelism", "pp": "pipeline parallelism",
               "micro_batch": "micro batch", "global_batch": "global batch", "hidden": "hidden size",
               "heads": "attention heads", "layers": "# layers", "seq_len": "sequence length",
               "params": "Parameters (billion)"},
    "collectives": {"source": "source_id", "nodes": "n_nodes", "gpus": "n_gpus", "size": "size_bytes",
                    "algorithm": "algo_proto_or_env"},
    "alltoall": {"gpus": "n_gpus", "size": "size_bytes", "kind": "collective"},
    "astra_reference": {"group": "group_id", "algorithm": "algorithms_per_dim", "size": "comm_size_bytes"},
}
FILE_COLUMN = "file"  # pseudo-column: the input file (vTrain's files have no source column: 'source' is the file)
BIAS_MEANING = ("bias = mean signed % error oriented so that + means trainsim predicts faster than measured "
                "(higher throughput / TFLOP/s / MFU, shorter time): throughput metrics keep the sign of "
                "(predicted - measured) / measured, time metrics (iter_time_s, time_us) flip it")


def default_groupings(kind: str, header: list[str]) -> list[str]:
    """The columns a file's errors are grouped by when no --by is given: moe_runs.csv (training_runs format with
    expert columns) per model and per GPU, as its README compares them; none for the others."""
    return ["model_name", "gpu"] if kind == "training_runs" and {"n_experts", "moe_ffn_hidden"} <= set(header) else []


def resolve_column(kind: str, header: list[str], name: str) -> str | None:
    """The header column (or FILE_COLUMN) that `name` means in a `kind` file, None when there is none.

    The format's aliases first (`source` is training_runs' source_group, not its long `source` citation),
    then exact header names, then a case-insensitive header match; 'file' is the input file, and so is
    'source' in a format without a source column (vTrain)."""
    alias = COLUMN_ALIASES.get(kind, {}).get(name.lower())
    if alias is not None and alias in header:  # before the header: training_runs' 'source' is the long citation
        return alias
    if name in header:
        return name
    folded = [h for h in header if h.strip().lower() == name.strip().lower()]
    if folded:
        return folded[0]
    if name.lower() in (FILE_COLUMN, "source"):
        return FILE_COLUMN
    return None


def column_choices(kind: str, header: list[str]) -> str:
    """The names --by / --cv accept for a file: aliases (with what they mean), then the header."""
    names = COLUMN_ALIASES.get(kind, {})
    aliases = [f"{a} ({c})" for a, c in names.items() if c in header]
    plain = [h for h in header if h not in names.values() and h.lower() not in names]  # (an alias shadows it)
    return ", ".join([*aliases, FILE_COLUMN, *plain])


def split_columns(spec: str, flag: str) -> list[str]:
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        raise ConfigError(flag, "no column named", "pass a column such as source, gpu or dp (comma-separated)")
    return names


def resolve_columns(kind: str, header: list[str], spec: str, flag: str) -> list[str]:
    """`--by COL[,COL...]` -> header columns (FILE_COLUMN for the file); an unknown name is a ConfigError."""
    out = []
    for name in split_columns(spec, flag):
        col = resolve_column(kind, header, name)
        if col is None:
            raise ConfigError(flag, f"'{name}' is not a column of this {kind} file",
                              f"use one of: {column_choices(kind, header)}")
        out.append(col)
    return out


def file_label(kind: str, path: str | Path) -> str:
    """A file's group name where grouping falls back to the file: vtrain_multi for ground_truth_multi.csv."""
    stem = Path(path).stem
    if kind == "vtrain":
        return "vtrain_" + (stem.removeprefix("ground_truth_") or stem)
    return stem


def group_key(row: dict[str, str], columns: list[str], label: str) -> str:
    """The group of one row: its values of `columns` joined by '|' (a blank cell reads '(blank)')."""
    return "|".join(label if c == FILE_COLUMN else (row.get(c, "").strip() or "(blank)") for c in columns)


def natural_key(key: str) -> tuple:
    """Sort group names with numbers in numeric order (dp 2 before dp 16)."""
    return tuple((0, float(p), "") if re.fullmatch(r"-?\d+(\.\d+)?", p) else (1, 0.0, p) for p in key.split("|"))


def is_time_metric(metric: str) -> bool:
    """Whether a bigger value of the metric is slower (iter_time_s, time_us, ...)."""
    return "time" in metric or metric.endswith(("_ms", "_us"))


def stats_by_group(outcomes: Iterable[Outcome], key_of: Callable[[Outcome], str]) -> dict[str, dict[str, Any]]:
    """Per group: n (compared), skipped, MAPE, median and max |error|, bias (BIAS_MEANING), Spearman of
    predicted vs measured throughput (n >= 3; in the row metric where a row has no throughput) and the metrics."""
    by: dict[str, list[Outcome]] = defaultdict(list)
    skipped: Counter[str] = Counter()
    for o in outcomes:
        if o.skipped is not None:
            skipped[key_of(o)] += 1
        elif o.error_pct is not None:
            by[key_of(o)].append(o)
    out: dict[str, dict[str, Any]] = {}
    for k in sorted(set(by) | set(skipped), key=natural_key):
        os_ = by.get(k, [])
        errs = [o.error_pct for o in os_ if o.error_pct is not None]
        signs = [-1.0 if is_time_metric(o.metric) else 1.0 for o in os_]
        metrics = sorted({o.metric for o in os_})
        pred: list[float] | None = None
        meas: list[float] | None = None
        if all(o.throughput_pred and o.throughput_meas for o in os_):
            pred, meas = [o.throughput_pred or 0.0 for o in os_], [o.throughput_meas or 0.0 for o in os_]
        elif len(metrics) == 1:
            pred, meas = [o.predicted or 0.0 for o in os_], [o.measured or 0.0 for o in os_]
        st = group_stats(errs, signs, pred, meas)
        out[k] = {**st, "n": len(errs), "skipped": skipped[k], "metrics": metrics}
    return out
