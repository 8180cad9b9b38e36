"""Fit calibration constants to end-to-end measurements (what `trainsim calibrate` runs).

Coordinate descent in log space over named constants of one device family (ComputeParams
fields) and the global overlap slowdown gamma, minimising the mean absolute log error of
predicted vs measured rows, each input file weighted equally. Constants are per device family
or global, never per row.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from ..cost.calibration import Calibration, ComputeParams
from ..errors import ConfigError
from .runner import run_rows

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
    kind: str
    rows: list[dict[str, str]]
    indices: list[int]
    name: str = ""


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


def _loss(cal: Calibration, datasets: list[Dataset], jobs: int) -> float:
    fd, path = tempfile.mkstemp(suffix=".yaml", prefix="trainsim-cal-")
    try:
        with os.fdopen(fd, "w") as fh:
            yaml.safe_dump(cal.model_dump(), fh)
        total = 0.0
        for ds in datasets:
            rep = run_rows(ds.kind, ds.rows, path, jobs, None, ds.indices)
            errs = [abs(math.log(o.predicted / o.measured)) for o in rep.compared
                    if o.predicted and o.measured and o.predicted > 0 and o.measured > 0]
            total += (sum(errs) / len(errs)) if errs else 0.0
        return total / max(1, len(datasets))
    finally:
        os.unlink(path)


def _current(cal: Calibration, family: str, name: str) -> float:
    if name == "gamma":
        return cal.gamma
    params: ComputeParams = cal.compute.get(family) or cal.compute["default"]
    return float(getattr(params, name))


def fit(cal: Calibration, family: str, names: list[str], datasets: list[Dataset], *, sweeps: int = 2,
        steps: int = 7, jobs: int = 1, progress: Callable[[str], None] | None = None) -> FitResult:
    """Coordinate descent: per constant a golden-section search in log space inside its bounds."""
    for n in names:
        if n not in BOUNDS:
            raise ConfigError("--fit", f"'{n}' cannot be fitted", f"choose from {', '.join(BOUNDS)}")
    values = {n: _current(cal, family, n) for n in names}
    best = _loss(with_values(cal, family, values), datasets, jobs)
    before = best
    history: list[dict[str, Any]] = [{"values": dict(values), "loss": best}]
    phi = (math.sqrt(5) - 1) / 2
    for sweep in range(sweeps):
        width = math.inf if sweep == 0 else 1.0 / sweep  # whole range first, then +-e^width around the value
        for n in names:
            lo_b, hi_b = BOUNDS[n]
            shift = 1e-3 if n == "gamma" else 0.0  # gamma may be 0: search log(x + shift)
            x0 = math.log(max(values[n], lo_b) + shift + 1e-12)
            a = max(math.log(lo_b + shift + 1e-12), x0 - width)
            b = min(math.log(hi_b + shift), x0 + width)

            def f(x: float, n: str = n, shift: float = shift) -> float:
                return _loss(with_values(cal, family, {**values, n: math.exp(x) - shift}), datasets, jobs)

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
            x, fx = (c, fc) if fc < fd else (d, fd)
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
