"""PredTOP's evaluation: train on a fraction of the configurations, report the error on the rest.

Every model of `models.MODELS` is trained on the same split (the one asked for is the headline, the others
and trainsim's analytical model its baselines), so one run answers "how much does learning buy over the
analytical model, and does the graph structure matter". Models train in parallel worker processes when
`jobs` > 1 (each on one torch thread: the same numbers whatever `jobs` is).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .dataset import split_by_config
from .models import MODELS, Fitted, fit
from .stage_graph import StageGraph, composed


def mre_pct(predicted: np.ndarray, measured: np.ndarray) -> float:
    """Mean relative error in %."""
    return float(np.mean(np.abs(predicted - measured) / measured) * 100.0)


@dataclass
class ModelScore:
    """One model on the held-back configurations."""

    kind: str
    test_mre_pct: float
    median_re_pct: float
    max_re_pct: float
    train_s: float
    best_epoch: int
    predict_ms_per_stage: float  # batched prediction of the held-back stages, per stage


@dataclass
class Evaluation:
    """The headline model, its baselines and the split they all share."""

    model: str
    train_fraction: float
    seed: int
    epochs: int
    n_train: int
    n_test: int
    n_train_configs: int
    n_test_configs: int
    composition: str
    scores: dict[str, ModelScore] = field(default_factory=dict)
    analytical: ModelScore | None = None

    def to_json(self) -> dict[str, Any]:
        head = self.scores[self.model]
        baselines = {k: s.test_mre_pct for k, s in self.scores.items() if k != self.model}
        if self.analytical is not None:
            baselines["analytical"] = self.analytical.test_mre_pct
        return {"model": self.model, "train_fraction": self.train_fraction, "seed": self.seed, "epochs": self.epochs,
                "composition": self.composition,
                "test_mre_pct": head.test_mre_pct, "baselines": baselines, "n_train": self.n_train,
                "n_test": self.n_test, "n_train_configs": self.n_train_configs, "n_test_configs": self.n_test_configs,
                "train_s": head.train_s,
                "models": {k: vars(s) for k, s in [*self.scores.items(), ("analytical", self.analytical)]
                           if s is not None}}


def score_model(kind: str, fitted: Fitted | None, test: Sequence[StageGraph], train_s: float) -> ModelScore:
    label = np.array([g.label_s for g in test], dtype=np.float64)
    t0 = time.perf_counter()
    pred = fitted.predict_iter_s(test) if fitted is not None else np.array([g.base_iter_s for g in test])
    predict_ms = (time.perf_counter() - t0) / len(test) * 1e3
    rel = np.abs(pred - label) / label * 100.0
    return ModelScore(kind, float(rel.mean()), float(np.median(rel)), float(rel.max()), train_s,
                      fitted.best_epoch if fitted is not None else -1, predict_ms)


def fit_and_score(args: tuple[str, list[StageGraph], list[StageGraph], int, int]) -> ModelScore:
    """Train one model and score it (a worker-process entry point)."""
    kind, train, test, seed, epochs = args
    t0 = time.perf_counter()
    fitted = fit(kind, train, seed=seed, epochs=epochs)
    return score_model(kind, fitted, test, time.perf_counter() - t0)


def evaluate(graphs: Sequence[StageGraph], train_fraction: float, seed: int, model: str = "dag-transformer",
             *, epochs: int = 500, jobs: int = 1, models: Sequence[str] = MODELS, composition: str = "formula",
             progress: Callable[[str], None] | None = None) -> Evaluation:
    """Split `graphs` by configuration, train `model` and the other `models` on the training part and
    score each (and the analytical model) on the held-back part, the iteration composed as `composition`
    says (stage_graph.composed); `progress(kind)` after each model."""
    graphs = composed(list(graphs), composition)
    train_idx, test_idx = split_by_config(graphs, train_fraction, seed)
    train, test = [graphs[i] for i in train_idx], [graphs[i] for i in test_idx]
    kinds = [model, *[k for k in models if k != model]]
    out = Evaluation(model, train_fraction, seed, epochs, len(train), len(test),
                     len({g.key for g in train}), len({g.key for g in test}), composition)
    out.analytical = score_model("analytical", None, test, 0.0)
    work = [(k, train, test, seed, epochs) for k in kinds]
    if jobs > 1 and len(work) > 1:
        with ProcessPoolExecutor(max_workers=min(jobs, len(work))) as pool:
            for future in as_completed([pool.submit(fit_and_score, w) for w in work]):
                score = future.result()
                out.scores[score.kind] = score
                if progress:
                    progress(score.kind)
    else:
        for w in work:
            score = fit_and_score(w)
            out.scores[score.kind] = score
            if progress:
                progress(score.kind)
    out.scores = {k: out.scores[k] for k in kinds}  # the headline first, then MODELS' order
    return out


__all__ = ["Evaluation", "ModelScore", "evaluate", "fit_and_score", "mre_pct", "score_model"]
