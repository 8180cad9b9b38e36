"""PredTOP on vTrain multi-node: a stage-latency model trained on every single-node run supplies the stage
times of the event simulation (`--compute learned:FILE`), on configurations it never saw (2-16 nodes).

Prints, over the 109 multi-node runs: the error of trainsim's roofline, of the learned model through the event
simulation (what `validate --compute learned:FILE` reports: stages outside the model's training ranges keep
the roofline's times), the same with the correction forced everywhere (learned_extrapolation), and PredTOP's
own composition T = roofline iteration + slots x (learned stage - roofline stage) with the forced stage times;
and on the pipelined runs (pp > 1) the gap between the event simulation and the formula with the same stage
times. The training set is the single-node
file only (leave-the-multi-node-file-out: nothing is fitted to the rows scored here).

`--multi-train-fraction F` adds a seeded F of the multi-node configurations to the training set (what a user
with a few measured runs of the cluster would do) and scores the other multi-node runs only.

Run: python benchmarks/predtop_multinode.py [--model dag-transformer] [--epochs 500] [--cache FILE]
     [--model-file FILE (skip training)] [--multi-train-fraction F] [--json OUT]
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

from trainsim.api import simulate
from trainsim.files import read_csv
from trainsim.learn.dataset import measured_graphs
from trainsim.validate.vtrain import _measured_s, row_job

VTRAIN = Path(__file__).resolve().parents[2] / "shared" / "validation" / "vtrain"


def _stats(pred: list[float], meas: list[float]) -> tuple[float, float, float]:
    rel = np.abs(np.asarray(pred) - np.asarray(meas)) / np.asarray(meas) * 100
    return float(rel.mean()), float(np.median(rel)), float(rel.max())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="dag-transformer")
    ap.add_argument("--epochs", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache", type=Path, default=None, help="pickle of the single-node stage graphs")
    ap.add_argument("--model-file", type=Path, default=None, help="a trained model (skips training)")
    ap.add_argument("--out", type=Path, default=Path("predtop_single.pt"), help="where the trained model goes")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--multi-train-fraction", type=float, default=0.0)
    ap.add_argument("--composition", default="simulation", help="formula (PredTOP's) | simulation (the event "
                    "simulation's response: predictor train's default)")
    args = ap.parse_args()
    _, rows = read_csv(VTRAIN / "ground_truth_multi.csv", "multi")
    scored = list(range(len(rows)))
    extra: list = []
    if args.multi_train_fraction > 0:
        from trainsim.learn.dataset import split_by_config

        multi, skipped = measured_graphs(VTRAIN / "ground_truth_multi.csv", jobs=args.jobs)
        assert not skipped and len(multi) == len(rows), skipped  # graphs in row order
        train_idx, scored = split_by_config(multi, args.multi_train_fraction, args.seed)
        extra = [multi[i] for i in train_idx]
    con = Console()
    model_file = args.model_file
    train_s = None
    if model_file is None:
        from trainsim.learn.models import fit
        from trainsim.learn.stage_graph import composed

        if args.cache is not None and args.cache.exists():
            with args.cache.open("rb") as fh:
                graphs = pickle.load(fh)  # noqa: S301 - a file predtop_eval.py wrote
        else:
            graphs, _ = measured_graphs(VTRAIN / "ground_truth_single.csv", jobs=args.jobs)
        graphs = composed([*graphs, *extra], args.composition)
        t0 = time.perf_counter()
        fitted = fit(args.model, graphs, seed=args.seed, epochs=args.epochs)
        train_s = time.perf_counter() - t0
        fitted.meta = {"trained_on": f"{len(graphs) - len(extra)} vTrain single-node and {len(extra)} multi-node "
                                     "runs", "devices": "a100-80gb"}
        fitted.save(args.out)
        model_file = args.out
        con.print(f"trained {args.model} ({args.composition} composition) on {len(graphs)} runs ({len(extra)} "
                  f"multi-node) in {train_s:.0f} s "
                  f"(best epoch {fitted.best_epoch}) -> {model_file} ({model_file.stat().st_size / 1e6:.2f} MB)")
    out: dict[str, list[float]] = {"measured": [], "roofline": [], "learned": [], "event": [], "formula": [],
                                   "pp": [], "inside": []}
    wall = []
    for row in (rows[i] for i in scored):
        job = row_job(row)
        if isinstance(job, str):
            continue
        base = simulate(job)
        job["simulation"]["compute_model"] = f"learned:{model_file}"
        t0 = time.perf_counter()
        guarded = simulate(job)
        wall.append(time.perf_counter() - t0)
        job["simulation"]["learned_extrapolation"] = True
        res = simulate(job)
        out["measured"].append(_measured_s(row))
        out["roofline"].append(base.iteration_time_s)
        out["learned"].append(guarded.iteration_time_s)
        out["inside"].append(not guarded.learned["outside_training_range"])
        out["event"].append(res.iteration_time_s)
        out["formula"].append(res.learned["formula_iteration_s"])
        out["pp"].append(job["strategy"]["pp"])
    meas = out["measured"]
    trained_on = "single-node only" if not extra else f"single-node and {len(extra)} other multi-node runs"
    t = Table(title=f"vTrain multi-node ({len(meas)} runs), {args.model} trained on {trained_on}")
    for c in ("prediction", "mean error", "median", "max"):
        t.add_column(c, justify="left" if c == "prediction" else "right")
    summary: dict[str, object] = {"n": len(meas), "model": args.model, "train_s": train_s,
                                  "learned_simulate_wall_s_mean": float(np.mean(wall))}
    summary["inside_training_ranges"] = int(sum(out["inside"]))
    for key, label in (("roofline", "roofline (analytical)"),
                       ("learned", f"learned (default: {sum(out['inside'])} runs inside its ranges)"),
                       ("event", "learned, forced everywhere, event simulation"),
                       ("formula", "learned, forced everywhere, PredTOP formula")):
        mean, med, mx = _stats(out[key], meas)
        summary[key] = {"mre_pct": mean, "median_pct": med, "max_pct": mx}
        t.add_row(label, f"{mean:.2f}%", f"{med:.2f}%", f"{mx:.2f}%")
    con.print(t)
    piped = [i for i, p in enumerate(out["pp"]) if p > 1]
    if piped:
        gap = [abs(out["event"][i] - out["formula"][i]) / out["event"][i] * 100 for i in piped]
        ev = _stats([out["event"][i] for i in piped], [meas[i] for i in piped])
        fo = _stats([out["formula"][i] for i in piped], [meas[i] for i in piped])
        summary["pipelined"] = {"n": len(piped), "event_mre_pct": ev[0], "formula_mre_pct": fo[0],
                                "event_vs_formula_mean_pct": float(np.mean(gap)),
                                "event_vs_formula_max_pct": float(np.max(gap))}
        con.print(f"pipelined runs (pp > 1, n={len(piped)}): event simulation {ev[0]:.2f}%, formula {fo[0]:.2f}%; "
                  f"event vs formula: mean {np.mean(gap):.2f}%, max {np.max(gap):.2f}% apart")
    con.print(f"learned simulate: {np.mean(wall) * 1e3:.0f} ms per job on average (two simulations and the model)")
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
