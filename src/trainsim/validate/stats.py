"""Error and rank statistics (no SciPy needed: average ranks for ties, Kendall tau-b)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def _ranks(x: Sequence[float]) -> np.ndarray:
    a = np.asarray(x, dtype=float)
    order = np.argsort(a, kind="mergesort")
    ranks = np.empty(len(a))
    sorted_a = a[order]
    i = 0
    while i < len(a):
        j = i
        while j + 1 < len(a) and sorted_a[j + 1] == sorted_a[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman rho: Pearson correlation of average ranks; nan when undefined (n<2 or constant)."""
    if len(x) != len(y):
        raise ValueError("spearman: x and y differ in length")
    if len(x) < 2:
        return math.nan
    rx, ry = _ranks(x), _ranks(y)
    sx, sy = rx.std(), ry.std()
    if sx == 0 or sy == 0:
        return math.nan
    return float(((rx - rx.mean()) * (ry - ry.mean())).mean() / (sx * sy))


def kendall(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall tau-b (ties in either variable handled); nan when undefined."""
    if len(x) != len(y):
        raise ValueError("kendall: x and y differ in length")
    n = len(x)
    if n < 2:
        return math.nan
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    dx = np.sign(a[:, None] - a[None, :])
    dy = np.sign(b[:, None] - b[None, :])
    iu = np.triu_indices(n, 1)
    sx, sy = dx[iu], dy[iu]
    concordant_minus_discordant = float((sx * sy).sum())
    n_x = float((sx != 0).sum())
    n_y = float((sy != 0).sum())
    if n_x == 0 or n_y == 0:
        return math.nan
    return concordant_minus_discordant / math.sqrt(n_x * n_y)


def error_summary(errors_pct: Sequence[float]) -> dict[str, float]:
    """Mean / median / max absolute percentage error of signed errors given in percent."""
    if not errors_pct:
        return {"mape": math.nan, "median_ape": math.nan, "max_ape": math.nan, "mean_signed": math.nan}
    a = np.abs(np.asarray(errors_pct, dtype=float))
    return {"mape": float(a.mean()), "median_ape": float(np.median(a)), "max_ape": float(a.max()),
            "mean_signed": float(np.mean(errors_pct))}


def memory_stats(errors_pct: Sequence[float], oom_predicted: Sequence[bool]) -> dict[str, float]:
    """Peak-memory error of a group of rows that ran: n, MAPE, median and max |error| (%) of the signed errors
    `errors_pct`, and oom_wrong, the rows trainsim predicted out of memory (every measured row ran, so each
    such verdict is wrong; a run that ran out of memory has no measured peak to compare)."""
    if len(oom_predicted) != len(errors_pct):
        raise ValueError("memory_stats: errors and OOM verdicts differ in length")
    s = error_summary(errors_pct)
    return {"n": len(errors_pct), "mape": s["mape"], "median_ape": s["median_ape"], "max_ape": s["max_ape"],
            "oom_wrong": sum(bool(x) for x in oom_predicted)}


MIN_RANK_N = 3  # Spearman of a group needs at least this many rows


def group_stats(errors_pct: Sequence[float], signs: Sequence[float] | None = None,
                predicted: Sequence[float] | None = None, measured: Sequence[float] | None = None) -> dict[str, float]:
    """Error statistics of one group of rows: n, MAPE, median and max |error|, bias and Spearman.

    `errors_pct` are signed errors in percent; `bias` is the mean of `signs[i] * errors_pct[i]` (signs of
    +-1 orient every row's error the same way; default +1). `spearman` ranks `predicted` against `measured`
    (nan below MIN_RANK_N rows or without them)."""
    s = error_summary(errors_pct)
    sg = [1.0] * len(errors_pct) if signs is None else list(signs)
    if len(sg) != len(errors_pct):
        raise ValueError("group_stats: signs and errors differ in length")
    bias = float(np.mean([g * e for g, e in zip(sg, errors_pct, strict=True)])) if errors_pct else math.nan
    rho = math.nan
    if predicted is not None and measured is not None and len(predicted) >= MIN_RANK_N:
        rho = spearman(predicted, measured)
    return {"n": float(len(errors_pct)), "mape": s["mape"], "median_ape": s["median_ape"], "max_ape": s["max_ape"],
            "bias": bias, "spearman": rho}
