"""PredTOP on vTrain single-node: stage-latency models trained on a fraction of the configurations.

For each train fraction (10%, 30%, 50% of the configurations, split by configuration, seeds fixed) and
each model (DAG Transformer, GCN, GAT, the graph-feature MLP), trains on the measured iterations of the
training configurations and prints the mean relative error of the predicted iteration on the held-back
ones, next to trainsim's analytical model on the same rows (issue 18: target <= 4% for the DAG
Transformer at 30%; the analytical model is 7.6% on the whole file). Also the training time.

The stage graphs (one per row: lowering, costing and simulating 1,440 jobs) take about a minute on two
cores; `--cache FILE` keeps them between runs (a pickle of trainsim's own StageGraph objects).
Run: python benchmarks/predtop_eval.py [--fractions 0.1,0.3,0.5] [--seeds 0,1,2] [--models ...] [--epochs 500]
"""

from __future__ import annotations

import argparse
import json
import pickle
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from trainsim.learn.dataset import analytical_mre_pct, measured_graphs, split_by_config

DATA = Path(__file__).resolve().parents[2] / "shared" / "validation" / "vtrain" / "ground_truth_single.csv"


def load_graphs(path: Path, cache: Path | None, jobs: int) -> list:
    if cache is not None and cache.exists():
        with cache.open("rb") as fh:
            return pickle.load(fh)  # noqa: S301 - a file this script wrote
    graphs, skipped = measured_graphs(path, jobs=jobs)
    if skipped:
        print(f"{len(skipped)} rows skipped: {skipped[:3]}")
    if cache is not None:
        with cache.open("wb") as fh:
            pickle.dump(graphs, fh)
    return graphs


def mre_pct(pred: np.ndarray, label: np.ndarray) -> float:
    return float(np.mean(np.abs(pred - label) / label) * 100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--cache", type=Path, default=None)
    ap.add_argument("--fractions", default="0.1,0.3,0.5")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--models", default="dag-transformer,gcn,gat,features")
    ap.add_argument("--epochs", type=int, default=500)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    from trainsim.learn.models import fit

    con = Console()
    t0 = time.perf_counter()
    graphs = load_graphs(args.data, args.cache, args.jobs)
    con.print(f"{len(graphs)} stage graphs in {time.perf_counter() - t0:.1f} s; analytical model on all rows: "
              f"{analytical_mre_pct(graphs):.2f}%")
    fractions = [float(f) for f in args.fractions.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    models = args.models.split(",")
    results: dict[str, dict[str, list[float]]] = {}
    times: dict[str, list[float]] = {}
    for frac in fractions:
        for seed in seeds:
            train, test = split_by_config(graphs, frac, seed)
            tr, te = [graphs[i] for i in train], [graphs[i] for i in test]
            label = np.array([g.label_s for g in te])
            results.setdefault(f"{frac:g}", {}).setdefault("analytical", []).append(analytical_mre_pct(te))
            for kind in models:
                t = time.perf_counter()
                fitted = fit(kind, tr, seed=seed, epochs=args.epochs)
                times.setdefault(f"{kind}@{frac:g}", []).append(time.perf_counter() - t)
                err = mre_pct(fitted.predict_iter_s(te), label)
                results[f"{frac:g}"].setdefault(kind, []).append(err)
                con.print(f"train {frac:.0%} seed {seed} {kind}: {err:.2f}% ({len(tr)} train, {len(te)} test, "
                          f"{times[f'{kind}@{frac:g}'][-1]:.1f} s)")
    t = Table(title=f"vTrain single-node: mean relative error on held-back configurations, mean of seeds {seeds}")
    t.add_column("model")
    for frac in fractions:
        t.add_column(f"train {frac:.0%}", justify="right")
    t.add_column("train s (30%)", justify="right")
    for kind in [*models, "analytical"]:
        cells = [f"{np.mean(results[f'{f:g}'][kind]):.2f}%" for f in fractions]
        tt = times.get(f"{kind}@0.3")
        t.add_row(kind, *cells, f"{np.mean(tt):.1f}" if tt else "-")
    con.print(t)
    if args.json is not None:
        args.json.write_text(json.dumps({"mre_pct": results, "train_s": times}, indent=2))


if __name__ == "__main__":
    main()
