"""Fit calibration constants to end-to-end measurements (what `trainsim calibrate` runs).

Coordinate descent in log space over named constants of one device family (ComputeParams
fields) and the global overlap slowdown gamma, minimising the mean absolute log error of
predicted vs measured rows, each input file weighted equally. Constants are per device family
or global, never per row.

`cross_validate` (`trainsim calibrate --cv COL`) measures what a fit is worth on runs it has not
seen: leave one group out, fit on the rest, predict the group.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import yaml

from ..cost.calibration import Calibration, ComputeParams
from ..errors import ConfigError
from .cases import Outcome
from .runner import ValidationReport, is_time_metric, natural_key, run_rows
from .stats import group_stats

# what may be fitted, with bounds (a fit never leaves them)
BOUNDS: dict[str, tuple[float, float]] = {
    "gemm_peak_fraction": (0.3, 1.0),
    "k_half": (1.0, 1024.0),
    "small_mn_half": (1e3, 1e8),
    "flash_fraction_fwd": (0.2, 1.0),
    "flash_fraction_bwd": (0.2, 1.0),
    "hbm_efficiency": (0.3, 1.0),
    "kernel_overhead_s": (1e-7, 5e-5),
    "host_overhead_s": (1e-7, 5e-4),
    "collective_host_s": (1e-7, 2e-3),
    "gamma": (0.0, 1.0),
}


@dataclass
class Dataset:
    """Rows of one input file (`indices`: their 0-based positions in it); `groups`, when given, names each
    row's cross-validation group."""

    kind: str
    rows: list[dict[str, str]]
    indices: list[int]
    name: str = ""
    groups: list[str] | None = None

    def select(self, keep: Callable[[str], bool]) -> Dataset | None:
        """The rows whose group `keep` accepts (None when there is none)."""
        groups = self.groups or [""] * len(self.rows)
        picked = [k for k, g in enumerate(groups) if keep(g)]
        if not picked:
            return None
        return Dataset(self.kind, [self.rows[k] for k in picked], [self.indices[k] for k in picked], self.name,
                       [groups[k] for k in picked])


@dataclass
class FitResult:
    calibration: Calibration
    loss_before: float
    loss_after: float
    history: list[dict[str, Any]] = field(default_factory=list)


def with_values(cal: Calibration, family: str, values: dict[str, float]) -> Calibration:
    """A copy of `cal` with `values` set on the family's ComputeParams (created from 'default')."""
    data = cal.model_dump()
    fam = dict(data["compute"].get(family) or data["compute"]["default"])
    for k, v in values.items():
        if k == "gamma":
            data["gamma"] = v
        else:
            fam[k] = v
    data["compute"][family] = fam
    return Calibration.model_validate(data)


@contextlib.contextmanager
def _calibration_file(cal: Calibration) -> Iterator[str]:
    """`cal` as a temporary YAML file (what worker processes load)."""
    fd, path = tempfile.mkstemp(suffix=".yaml", prefix="trainsim-cal-")
    try:
        with os.fdopen(fd, "w") as fh:
            yaml.safe_dump(cal.model_dump(), fh)
        yield path
    finally:
        os.unlink(path)


def predict(cal: Calibration, datasets: list[Dataset], jobs: int = 1) -> list[ValidationReport]:
    """Every dataset's rows simulated with `cal` (one report per dataset)."""
    with _calibration_file(cal) as path:
        return [run_rows(ds.kind, ds.rows, path, jobs, None, ds.indices) for ds in datasets]


def loss(reports: list[ValidationReport]) -> float:
    """Mean over datasets of the mean |log(predicted / measured)| of their compared rows."""
    total = 0.0
    for rep in reports:
        errs = [abs(math.log(o.predicted / o.measured)) for o in rep.compared
                if o.predicted and o.measured and o.predicted > 0 and o.measured > 0]
        total += (sum(errs) / len(errs)) if errs else 0.0
    return total / max(1, len(reports))


def _loss(cal: Calibration, datasets: list[Dataset], jobs: int) -> float:
    return loss(predict(cal, datasets, jobs))


def current_value(cal: Calibration, family: str, name: str) -> float:
    if name == "gamma":
        return cal.gamma
    params: ComputeParams = cal.compute.get(family) or cal.compute["default"]
    return float(getattr(params, name))


def evaluations(n_names: int, sweeps: int = 2, steps: int = 7) -> int:
    """How many times `fit` simulates the datasets (its `on_eval` calls)."""
    return 1 + sweeps * n_names * max(2, steps)


def golden_min(f: Callable[[float], float], a: float, b: float, steps: int) -> tuple[float, float]:
    """Golden-section search for the least f over [a, b] in `steps` evaluations (at least 2): the best point it
    evaluated and its value."""
    phi = (math.sqrt(5) - 1) / 2
    c, d = b - phi * (b - a), a + phi * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(max(0, steps - 2)):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - phi * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + phi * (b - a)
            fd = f(d)
    return (c, fc) if fc < fd else (d, fd)


def fit(cal: Calibration, family: str, names: list[str], datasets: list[Dataset], *, sweeps: int = 2,
        steps: int = 7, jobs: int = 1, progress: Callable[[str], None] | None = None,
        on_eval: Callable[[], None] | None = None) -> FitResult:
    """Coordinate descent: per constant a golden-section search in log space inside its bounds.

    `progress` gets a line per fitted constant, `on_eval` a call per simulation of the datasets."""
    for n in names:
        if n not in BOUNDS:
            raise ConfigError("--fit", f"'{n}' cannot be fitted", f"choose from {', '.join(BOUNDS)}")

    def evaluate(c: Calibration) -> float:
        value = _loss(c, datasets, jobs)
        if on_eval:
            on_eval()
        return value

    values = {n: current_value(cal, family, n) for n in names}
    best = evaluate(with_values(cal, family, values))
    before = best
    history: list[dict[str, Any]] = [{"values": dict(values), "loss": best}]
    for sweep in range(sweeps):
        width = math.inf if sweep == 0 else 1.0 / sweep  # whole range first, then +-e^width around the value
        for n in names:
            lo_b, hi_b = BOUNDS[n]
            shift = 1e-3 if n == "gamma" else 0.0  # gamma may be 0: search log(x + shift)
            x0 = math.log(max(values[n], lo_b) + shift + 1e-12)
            a = max(math.log(lo_b + shift + 1e-12), x0 - width)
            b = min(math.log(hi_b + shift), x0 + width)

            def f(x: float, n: str = n, shift: float = shift) -> float:
                return evaluate(with_values(cal, family, {**values, n: math.exp(x) - shift}))

            x, fx = golden_min(f, a, b, steps)
            if fx < best:
                best, values[n] = fx, math.exp(x) - shift
            history.append({"param": n, "values": dict(values), "loss": best})
            if progress:
                progress(f"sweep {sweep + 1}: {n} = {values[n]:.4g} (mean |log error| {best:.4f})")
    return FitResult(with_values(cal, family, values), before, best, history)


def fit_kernels(cal: Calibration, paths: list[Any]) -> tuple[Calibration, dict[str, Any]]:
    """Fit per-family kernel constants (GEMM, attention, HBM) from microbenchmark CSVs."""
    import shutil
    from pathlib import Path

    from ..cost.fit_compute import fit_all

    with tempfile.TemporaryDirectory(prefix="trainsim-kernels-") as d:
        for i, p in enumerate(paths):
            shutil.copy(p, Path(d) / f"{i}_{Path(p).name}")
        new, report = fit_all(cal, d)
    return new, {fam: {k: v.get("status") for k, v in rep["params"].items()}
                 for fam, rep in report["families"].items()}


@dataclass
class CVRow:
    """One compared row: its errors (%) with the starting calibration, the fit on every row (in-sample) and
    the fit without its group (held out)."""

    dataset: str
    row: int
    case_id: str
    group: str
    metric: str
    measured: float
    start: float
    in_sample: float
    held_out: float

    def error(self, which: str) -> float:
        pred = getattr(self, which)
        return (pred - self.measured) / self.measured * 100.0


@dataclass
class CrossValidation:
    """Leave-one-group-out cross-validation of a fit (what `trainsim calibrate --cv` prints)."""

    names: list[str]
    family: str
    groups: list[str]
    rows: list[CVRow]
    all_fit: FitResult
    folds: dict[str, FitResult]
    train_rows: dict[str, int]
    start: dict[str, float] = field(default_factory=dict)  # the constants before any fit
    by: list[str] = field(default_factory=list)  # what the groups are values of (--cv), for the table

    def stats(self, group: str | None = None) -> dict[str, dict[str, float]]:
        """MAPE etc. (stats.group_stats) of the start, in-sample and held-out predictions of one group (None:
        every row)."""
        rows = [r for r in self.rows if group is None or r.group == group]
        signs = [-1.0 if is_time_metric(r.metric) else 1.0 for r in rows]  # bias: + = predicted faster
        return {w: group_stats([r.error(w) for r in rows], signs) for w in ("start", "in_sample", "held_out")}

    def fitted(self, res: FitResult) -> dict[str, float]:
        """The fitted constants of one fit (the all-rows fit or a fold)."""
        return {n: current_value(res.calibration, self.family, n) for n in self.names}

    def to_json(self) -> dict[str, Any]:
        def num(x: float) -> float | None:
            return None if math.isnan(x) else x

        def block(st: dict[str, dict[str, float]]) -> dict[str, Any]:
            return {w: {k: num(v) for k, v in d.items() if k not in ("spearman", "n")} for w, d in st.items()}

        everything = self.stats()
        return {
            "family": self.family, "fit": self.names, "cv": self.by,
            "summary": {"n": len(self.rows), "groups": len(self.groups), **block(everything),
                        "held_out_mape": num(everything["held_out"]["mape"]),
                        "in_sample_mape": num(everything["in_sample"]["mape"]),
                        "start_mape": num(everything["start"]["mape"])},
            "start_values": self.start,
            "all_rows_fit": {"values": self.fitted(self.all_fit), "loss_before": self.all_fit.loss_before,
                             "loss_after": self.all_fit.loss_after},
            "groups": {g: {"n": sum(r.group == g for r in self.rows), "train_rows": self.train_rows[g],
                           **block(self.stats(g)), "values": self.fitted(self.folds[g]),
                           "loss_before": self.folds[g].loss_before, "loss_after": self.folds[g].loss_after}
                       for g in self.groups},
            "rows": [{"dataset": r.dataset, "row": r.row, "case_id": r.case_id, "group": r.group, "metric": r.metric,
                      "measured": r.measured, "start": r.start, "in_sample": r.in_sample, "held_out": r.held_out,
                      "held_out_error_pct": r.error("held_out")} for r in self.rows],
        }


def cv_evaluations(n_groups: int, n_names: int, sweeps: int = 2, steps: int = 7) -> int:
    """How many times `cross_validate` simulates (its `on_eval` calls): start and in-sample predictions,
    one fit on every row and per group a fit and a held-out prediction."""
    return 2 + (n_groups + 1) * evaluations(n_names, sweeps, steps) + n_groups


def cross_validate(cal: Calibration, family: str, names: list[str], datasets: list[Dataset], *, sweeps: int = 2,
                   steps: int = 7, jobs: int = 1, on_eval: Callable[[], None] | None = None,
                   on_fold: Callable[[str], None] | None = None) -> CrossValidation:
    """Leave one group out: per group g, fit `names` on every row outside g (same `fit`, same start `cal`),
    then predict g's rows with that fit. Every dataset needs `groups`. A row counts where all three
    predictions (start, all-rows fit, fit without its group) compare with its measurement."""
    if not names:
        raise ConfigError("--fit", "nothing to fit", "name the constants to cross-validate, e.g. --fit gamma")
    groups = sorted({g for ds in datasets for g in (ds.groups or [])}, key=natural_key)
    if len(groups) < 2:
        raise ConfigError("--cv", f"the rows form {len(groups)} group(s): {', '.join(groups) or 'none'}",
                          "choose a column with at least two values (or give several files)")
    tick = on_eval or (lambda: None)

    def predicted(reports: list[ValidationReport], sets: list[Dataset]) -> dict[tuple[str, int], Outcome]:
        return {(ds.name, o.row): o for ds, rep in zip(sets, reports, strict=True) for o in rep.compared}

    start = predicted(predict(cal, datasets, jobs), datasets)
    tick()
    if on_fold:
        on_fold("all rows")
    all_fit = fit(cal, family, names, datasets, sweeps=sweeps, steps=steps, jobs=jobs, on_eval=on_eval)
    in_sample = predicted(predict(all_fit.calibration, datasets, jobs), datasets)
    tick()
    held: dict[tuple[str, int], Outcome] = {}
    folds: dict[str, FitResult] = {}
    train_rows: dict[str, int] = {}
    for g in groups:
        if on_fold:
            on_fold(g)
        train = [d for d in (ds.select(lambda k, g=g: k != g) for ds in datasets) if d is not None]
        test = [d for d in (ds.select(lambda k, g=g: k == g) for ds in datasets) if d is not None]
        folds[g] = fit(cal, family, names, train, sweeps=sweeps, steps=steps, jobs=jobs, on_eval=on_eval)
        train_rows[g] = sum(len(d.rows) for d in train)
        held.update(predicted(predict(folds[g].calibration, test, jobs), test))
        tick()
    rows = []
    for ds in datasets:
        group_of = dict(zip(ds.indices, ds.groups or [], strict=True))
        for i in ds.indices:
            key = (ds.name, i)
            if key in start and key in in_sample and key in held:
                o = held[key]
                assert o.measured is not None and o.predicted is not None
                rows.append(CVRow(ds.name, i, o.case_id, group_of[i], o.metric, o.measured,
                                  start[key].predicted or 0.0, in_sample[key].predicted or 0.0, o.predicted))
    return CrossValidation(names, family, groups, rows, all_fit, folds, train_rows,
                           {n: current_value(cal, family, n) for n in names})
