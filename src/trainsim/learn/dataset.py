"""Labelled stage graphs from measured runs, and the split by configuration PredTOP evaluates with.

Two formats of measured runs: vTrain's ground-truth files and the training_runs.csv format `validate` reads
(so users can train on their own measurements the way they validate with them).

vTrain's ground-truth files (Megatron-DeepSpeed GPT on A100, `../shared/validation/vtrain/`): each row is
one configuration with its measured iteration time; the row's job (validate.vtrain.row_job) is lowered,
costed and simulated by trainsim, and its slowest stage becomes a StageGraph labelled with the measurement.
trainsim's own simulation is a feature (the analytical time the model corrects), never a label.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

from ..errors import ConfigError
from .stage_graph import StageGraph, job_stage_graph, simulated_stage_graph

CONFIG_COLUMNS_SKIP = ("iteration time (ms)",)


def config_key(row: dict[str, str]) -> str:
    """A row's configuration: every column but the measurement (rows of one configuration split together)."""
    return "|".join(f"{k.strip()}={v.strip()}" for k, v in sorted(row.items()) if k.strip() not in
                    CONFIG_COLUMNS_SKIP)


def _vtrain_graph(row: dict[str, str]) -> StageGraph | str:
    from ..validate.vtrain import _measured_s, row_job

    job = row_job(row)
    if isinstance(job, str):
        return job
    try:
        return job_stage_graph(job, _measured_s(row), config_key(row))
    except ConfigError as exc:
        return exc.one_line()


def _training_run_graph(row: dict[str, str]) -> StageGraph | str:
    """A training_runs.csv row: its measured metric becomes an iteration time by the conversion `validate`
    uses (tokens/s, TFLOP/s or MFU with the row's FLOP convention); the configuration is its job."""
    from ..validate.training_runs import implied_iteration_s, predicted_metric, row_job

    rj = row_job(row)
    if isinstance(rj, str):
        return rj
    try:
        res, graph = simulated_stage_graph(rj.job)
    except ConfigError as exc:
        return exc.one_line()
    pred = predicted_metric(rj, row, res.iteration_time_s, res.hw_flops, float(res.model_params))
    if isinstance(pred, str):
        return pred
    label = implied_iteration_s(rj, pred, rj.measured, res.iteration_time_s)
    key = json.dumps({k: rj.job.get(k) for k in ("model", "cluster", "strategy")}, sort_keys=True, default=str)
    return replace(graph, label_s=label, key=key)


def measured_graphs(path: str | Path, jobs: int = 1, progress: Callable[[int], None] | None = None,
                    limit: int | None = None, field: str = "--data") -> tuple[list[StageGraph], list[str]]:
    """The labelled stage graphs of a file of measured runs (vTrain's ground_truth_*.csv or the
    training_runs.csv format `validate` reads) and the reasons of the rows that could not be built (in file
    order; `limit` keeps the first rows only)."""
    from ..validate.runner import detect_kind, map_rows, read_rows

    header, rows = read_rows(Path(path), field)
    try:
        kind = detect_kind(header)
    except ConfigError:
        kind = ""
    if kind not in ("vtrain", "training_runs"):
        raise ConfigError(field, f"{path} is not a file of measured training runs",
                          "pass vTrain's ground_truth_*.csv or a training_runs.csv-format file "
                          "(see shared/validation/README.md)")
    fn = _vtrain_graph if kind == "vtrain" else _training_run_graph
    results = map_rows(fn, rows[:limit] if limit is not None else rows, jobs, progress, batches_per_job=16)
    return [r for r in results if not isinstance(r, str)], [r for r in results if isinstance(r, str)]


def split_by_config(graphs: list[StageGraph], train_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Train and test indices: a seeded random `train_fraction` of the configurations, the rest held back."""
    if not 0 < train_fraction < 1:
        raise ConfigError("--train-fraction", f"{train_fraction} is not a fraction", "use a number in (0, 1)")
    keys = sorted({g.key for g in graphs})
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(keys))
    n_train = max(1, min(len(keys) - 1, math.floor(train_fraction * len(keys) + 0.5)))
    train_keys = {keys[i] for i in order[:n_train]}
    train = [i for i, g in enumerate(graphs) if g.key in train_keys]
    test = [i for i, g in enumerate(graphs) if g.key not in train_keys]
    return train, test


def analytical_mre_pct(graphs: list[StageGraph]) -> float:
    """trainsim's analytical model on the same graphs: mean relative error of its iteration, in %."""
    errs = [abs(g.base_iter_s - g.label_s) / g.label_s for g in graphs if g.label_s]
    return 100.0 * sum(errs) / len(errs) if errs else math.nan


__all__ = ["analytical_mre_pct", "config_key", "measured_graphs", "split_by_config"]
