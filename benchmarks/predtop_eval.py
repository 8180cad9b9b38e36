"""PredTOP on vTrain single-node: stage-latency models trained on a fraction of the configurations.

For each train fraction (10%, 30%, 50% of the configurations, split by configuration, seeds fixed) and
each model (DAG Transformer, GCN, GAT, the graph-feature MLP), trains on the measured iterations of the
training configurations and prints the mean relative error of the predicted iteration on the held-back
ones, next to trainsim's analytical model on the same rows (issue 18: target <= 4% for the DAG
Transformer at 30%; the analytical model is 7.6% on the whole file), the training time and the batched
prediction time per stage. One (fraction, seed) is what `trainsim predictor eval` runs (learn.evaluate).

The stage graphs (one per row: lowering, costing and simulating 1,440 jobs) take about a minute on two
cores; `--cache FILE` keeps them between runs (a pickle of trainsim's own StageGraph objects).
`--leave-out COLUMN` (e.g. "hidden size", "# layers"): instead of random splits, train on every other value of
a vTrain column and test on each value's rows in turn: how far the models carry to a size never measured.
`--simulate`: for the first fraction and seed, the first model is also used as the compute model of the
event simulation (`simulate --compute learned:FILE`) on every held-back row: its error there, PredTOP's
formula beside it, and how far apart the two are on the pipelined rows.
Run: python benchmarks/predtop_eval.py [--fractions 0.1,0.3,0.5] [--seeds 0,1,2] [--models ...] [--epochs 500]
     [--leave-out COLUMN] [--simulate]
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

from trainsim.learn.dataset import measured_graphs
from trainsim.learn.evaluate import evaluate, fit_and_score, score_model

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--cache", type=Path, default=None)
    ap.add_argument("--fractions", default="0.1,0.3,0.5")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--models", default="dag-transformer,gcn,gat,features")
    ap.add_argument("--epochs", type=int, default=500)
    ap.add_argument("--jobs", type=int, default=1, help="models trained in parallel processes")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--leave-out", default=None, help="a vTrain column: leave each of its values out in turn")
    ap.add_argument("--composition", default="formula", help="formula (PredTOP's) | simulation (the event "
                    "simulation's response)")
    ap.add_argument("--simulate", action="store_true", help="also run the held-back rows through the event "
                    "simulation with the learned model (first fraction and seed)")
    args = ap.parse_args()
    con = Console()
    t0 = time.perf_counter()
    graphs = load_graphs(args.data, args.cache, max(2, args.jobs))
    con.print(f"{len(graphs)} stage graphs in {time.perf_counter() - t0:.1f} s")
    if args.leave_out is not None:
        leave_out(con, graphs, args.leave_out, args.models.split(","), args.epochs, int(args.seeds.split(",")[0]))
        return
    fractions = [float(f) for f in args.fractions.split(",")]
    seeds = [int(s) for s in args.seeds.split(",")]
    models = args.models.split(",")
    if args.simulate:
        through_simulation(con, graphs, args.data, fractions[0], seeds[0], models[0], args.epochs, args.composition)
        return
    runs: list[dict] = []
    for frac in fractions:
        for seed in seeds:
            ev = evaluate(graphs, frac, seed, models[0], epochs=args.epochs, jobs=args.jobs, models=models,
                          composition=args.composition)
            runs.append(ev.to_json())
            for s in [*ev.scores.values(), ev.analytical]:
                con.print(f"train {frac:.0%} seed {seed} {s.kind}: {s.test_mre_pct:.2f}% ({ev.n_train} train, "
                          f"{ev.n_test} test, {s.train_s:.1f} s, best epoch {s.best_epoch}, "
                          f"{s.predict_ms_per_stage:.3f} ms per stage)")
    t = Table(title=f"vTrain single-node: mean relative error on held-back configurations, mean (min-max) of "
                    f"seeds {seeds}")
    t.add_column("model")
    for frac in fractions:
        t.add_column(f"train {frac:.0%}", justify="right")
    t.add_column("train s (30%)", justify="right")
    t.add_column("ms per stage", justify="right")
    for kind in [*models, "analytical"]:
        cells = []
        for frac in fractions:
            errs = [r["models"][kind]["test_mre_pct"] for r in runs if r["train_fraction"] == frac]
            cells.append(f"{np.mean(errs):.2f}% ({min(errs):.2f}-{max(errs):.2f})")
        tt = [r["models"][kind]["train_s"] for r in runs if r["train_fraction"] == 0.3]
        pm = [r["models"][kind]["predict_ms_per_stage"] for r in runs]
        t.add_row(kind, *cells, f"{np.mean(tt):.1f}" if tt and kind != "analytical" else "-",
                  f"{np.mean(pm):.3f}" if kind != "analytical" else "-")
    con.print(t)
    if args.json is not None:
        args.json.write_text(json.dumps(runs, indent=2))


def through_simulation(con: Console, graphs: list, data: Path, frac: float, seed: int, kind: str,
                       epochs: int, composition: str) -> None:
    """Train `kind` on a split, then simulate every held-back row with it as the compute model."""
    import tempfile

    from trainsim.api import simulate
    from trainsim.files import read_csv
    from trainsim.learn.dataset import config_key, split_by_config
    from trainsim.learn.models import fit
    from trainsim.learn.stage_graph import composed
    from trainsim.validate.vtrain import row_job

    graphs = composed(graphs, composition)
    train, test = split_by_config(graphs, frac, seed)
    fitted = fit(kind, [graphs[i] for i in train], seed=seed, epochs=epochs)
    fitted.meta = {"devices": "a100-80gb"}
    _, rows = read_csv(data, "--data")
    by_key = {config_key(r): r for r in rows}
    out: dict[str, list[float]] = {"measured": [], "roofline": [], "event": [], "formula": [], "direct": [],
                                   "pp": [], "inside": []}
    direct = fitted.predict_iter_s([graphs[i] for i in test])
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "m.pt"
        fitted.save(path)
        for i, pred in zip(test, direct, strict=True):
            job = row_job(by_key[graphs[i].key])
            job["simulation"]["compute_model"] = f"learned:{path}"
            res = simulate(job)
            out["measured"].append(graphs[i].label_s)
            out["roofline"].append(res.learned["roofline_iteration_s"])
            out["event"].append(res.iteration_time_s)
            out["formula"].append(res.learned["formula_iteration_s"])
            out["direct"].append(float(pred))
            out["pp"].append(job["strategy"]["pp"])
            out["inside"].append(not res.learned["outside_training_range"])
    meas = np.asarray(out["measured"])

    def mre(key: str, idx: list[int]) -> float:
        return float(np.mean(np.abs(np.asarray(out[key])[idx] - meas[idx]) / meas[idx]) * 100)

    every = list(range(len(meas)))
    piped = [i for i in every if out["pp"][i] > 1]
    con.print(f"{kind}, {composition} composition, train {frac:.0%} seed {seed}: {len(meas)} held-back rows ({sum(out['inside'])} inside the "
              f"training ranges), {len(piped)} pipelined")
    for key, label in (("roofline", "roofline"), ("direct", "learned, graph prediction (predictor eval)"),
                       ("formula", "learned, PredTOP formula in simulate"), ("event", "learned, event simulation")):
        con.print(f"  {label}: {mre(key, every):.2f}% (pipelined rows {mre(key, piped):.2f}%)")
    gap = np.abs(np.asarray(out["event"]) - np.asarray(out["formula"])) / np.asarray(out["formula"]) * 100
    con.print(f"  event simulation vs formula on the pipelined rows: mean {gap[piped].mean():.2f}%, max "
              f"{gap[piped].max():.2f}% apart")


def leave_out(con: Console, graphs: list, column: str, models: list[str], epochs: int, seed: int) -> None:
    """Train on every value of `column` but one, test on that one's rows, for each value."""
    def value(g: object) -> str:
        fields = dict(part.split("=", 1) for part in g.key.split("|"))  # config_key: "column=value|..."
        return fields[column]

    values = sorted({value(g) for g in graphs}, key=lambda v: float(v))
    t = Table(title=f"vTrain single-node, leave one '{column}' out: mean relative error on the left-out rows")
    t.add_column(column)
    t.add_column("rows", justify="right")
    for kind in [*models, "analytical"]:
        t.add_column(kind, justify="right")
    for v in values:
        train = [g for g in graphs if value(g) != v]
        test = [g for g in graphs if value(g) == v]
        scores = [fit_and_score((kind, train, test, seed, epochs)) for kind in models]
        scores.append(score_model("analytical", None, test, 0.0))
        for s in scores:
            con.print(f"{column}={v} left out: {s.kind} {s.test_mre_pct:.2f}% ({s.train_s:.0f} s)")
        t.add_row(v, str(len(test)), *(f"{s.test_mre_pct:.2f}%" for s in scores))
    con.print(t)


if __name__ == "__main__":
    main()
