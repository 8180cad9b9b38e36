"""`trainsim predictor train | eval`: PredTOP's learned stage-latency models, trained on measured runs and
used as the compute model of any simulation (`--compute learned:FILE`)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from .console import progress_bar
from .errors import ConfigError
from .files import Outputs, json_text, write_outputs

if TYPE_CHECKING:
    from .learn.stage_graph import StageGraph

predictor_app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                            rich_markup_mode=None,
                            help="Learned stage-latency models (PredTOP; needs trainsim[learn]): train on measured "
                                 "runs, evaluate on held-back configurations, use with --compute learned:FILE.")

Opt = typer.Option
MODEL_HELP = "dag-transformer (PredTOP) | gcn | gat | features (an MLP on graph-level features)"
COMPOSITION_HELP = ("how a stage time makes the iteration the model is trained on: formula (PredTOP's: micro-batches + "
                    "stages - 1 slots) | simulation (the event simulation's own response: what --compute uses)")


def _learn() -> None:
    """Refuse at once, before reading any data, when the trainsim[learn] extra is missing."""
    from .learn.models import require_torch

    require_torch("predictor")


def _check(model: str, epochs: int, jobs: int | None, seed: int, composition: str) -> None:
    from .learn.models import MODELS
    from .learn.stage_graph import COMPOSITIONS

    if composition not in COMPOSITIONS:
        raise ConfigError("--composition", f"'{composition}' is unknown", f"use one of {', '.join(COMPOSITIONS)}")
    if model not in MODELS:
        raise ConfigError("--model", f"'{model}' is unknown", f"use one of {', '.join(MODELS)}")
    if not 0 <= epochs <= 100_000:
        raise ConfigError("--epochs", f"must be in 0..100000, got {epochs}", "pass e.g. 500 (PredTOP's)")
    if jobs is not None and jobs < 1:
        raise ConfigError("--jobs", f"must be >= 1, got {jobs}", "pass a worker count, or leave it out")
    if not 0 <= seed < 2**32:
        raise ConfigError("--seed", f"must be in 0..2^32-1, got {seed}", "pass e.g. 0")


def _graphs(data: str, jobs: int, quiet: bool) -> tuple[list[StageGraph], list[str]]:
    """The labelled stage graphs of a measured-runs file, with a progress bar over its rows."""
    from .learn.dataset import measured_graphs
    from .validate.runner import read_rows

    _, rows = read_rows(data, "--data")  # the row count for the bar (and an early one-line error)
    with progress_bar(quiet=quiet) as bar:
        task = bar.add_task(f"building {len(rows)} stage graphs", total=len(rows))
        graphs, skipped = measured_graphs(data, jobs, lambda k: bar.advance(task, k))
    if not graphs:
        why = f" ({skipped[0]})" if skipped else ""
        raise ConfigError("--data", f"no row of {data} gives a trainable stage{why}",
                          "pass measured runs trainsim can simulate (vTrain or training_runs.csv format)")
    return graphs, skipped


@predictor_app.command("train")
def train(
    data: Annotated[str, typer.Argument(help="measured runs: vTrain's ground_truth_*.csv or the training_runs.csv "
                                             "format `trainsim validate` reads")],
    out: Annotated[str, Opt(help="where to write the model (use it with --compute learned:FILE)")] = "model.pt",
    model: Annotated[str, Opt(help=MODEL_HELP)] = "dag-transformer",
    epochs: Annotated[int, Opt(help="at most this many epochs (early stopping on a held-out tenth)")] = 500,
    seed: Annotated[int, Opt(help="seed of the initialisation, shuffling and validation split")] = 0,
    jobs: Annotated[int | None, Opt(help="worker processes building the stage graphs (default: CPU count)")] = None,
    composition: Annotated[str, Opt(help=COMPOSITION_HELP)] = "simulation",
    json_out: Annotated[str | None, Opt("--json", help="write the training summary as JSON")] = None,
    quiet: Annotated[bool, Opt("-q", "--quiet", help="print only the summary line")] = False,
) -> None:
    """Train a stage-latency model on every measured run of DATA and write it to --out."""
    _learn()
    _check(model, epochs, jobs, seed, composition)
    outs = Outputs()
    model_target, json_target = outs.add(out, "--out"), outs.add(json_out, "--json")
    if model_target is not None and model_target.to_stdout:
        raise ConfigError("--out", "a model is binary, not for standard output", "pass a file name such as model.pt")
    from .learn.evaluate import mre_pct
    from .learn.models import fit
    from .learn.stage_graph import composed
    from .validate.runner import default_jobs

    graphs, skipped = _graphs(data, jobs or default_jobs(), quiet)
    graphs = composed(graphs, composition)
    with progress_bar(quiet=quiet) as bar:
        task = bar.add_task(f"training {model}", total=epochs)
        t0 = time.perf_counter()
        fitted = fit(model, graphs, seed=seed, epochs=epochs, progress=lambda e, t, v: bar.advance(task, 1))
        train_s = time.perf_counter() - t0
    devices = sorted({g.device for g in graphs if g.device})
    fitted.meta = {"trained_on": f"{len(graphs)} measured runs of {data}", "devices": ",".join(devices),
                   "data": str(data), "rows": str(len(graphs)), "epochs": str(epochs), "seed": str(seed),
                   "composition": composition}
    import numpy as np

    label = np.array([g.label_s for g in graphs])
    summary = {"model": model, "data": str(data), "out": out, "n_train": len(graphs), "skipped": len(skipped),
               "devices": devices, "epochs": epochs, "best_epoch": fitted.best_epoch, "seed": seed,
               "composition": composition,
               "train_s": train_s, "val_mre_pct": None if fitted.val_error is None else 100.0 * fitted.val_error,
               "train_mre_pct": mre_pct(fitted.predict_iter_s(graphs), label),
               "analytical_mre_pct": mre_pct(np.array([g.base_iter_s for g in graphs]), label)}
    payloads: dict[Any, Any] = {model_target: fitted.save}
    if json_target is not None:
        payloads[json_target] = json_text(summary, "--json")
    write_outputs(payloads)
    if outs.to_stdout:
        return
    val = "-" if summary["val_mre_pct"] is None else f"{summary['val_mre_pct']:.2f}%"
    print(f"{model}: {len(graphs)} runs ({len(skipped)} skipped), best epoch {fitted.best_epoch} of {epochs}, "
          f"{train_s:.1f} s; error on the runs {summary['train_mre_pct']:.2f}% (validation {val}, analytical "
          f"{summary['analytical_mre_pct']:.2f}%) -> {out}")


@predictor_app.command("eval")
def eval_cmd(
    data: Annotated[str, Opt(help="measured runs: vTrain's ground_truth_*.csv or the training_runs.csv format")],
    train_fraction: Annotated[float, Opt(help="share of the configurations trained on (the rest is tested)")] = 0.3,
    seed: Annotated[int, Opt(help="seed of the split and of every model")] = 0,
    model: Annotated[str, Opt(help=f"the headline model: {MODEL_HELP}; the others are its baselines")] =
        "dag-transformer",
    epochs: Annotated[int, Opt(help="at most this many epochs per model (early stopping)")] = 500,
    jobs: Annotated[int | None, Opt(help="worker processes (stage graphs, then one model each; default: CPU "
                                         "count)")] = None,
    composition: Annotated[str, Opt(help=COMPOSITION_HELP)] = "formula",
    json_out: Annotated[str | None, Opt("--json", help="write test_mre_pct, baselines, n_train, n_test, train_s "
                                                       "as JSON")] = None,
    quiet: Annotated[bool, Opt("-q", "--quiet", help="print only the summary line")] = False,
) -> None:
    """Split DATA by configuration, train every model on --train-fraction of them, report the error on the rest."""
    _learn()
    _check(model, epochs, jobs, seed, composition)
    if not 0 < train_fraction < 1:
        raise ConfigError("--train-fraction", f"{train_fraction} is not a fraction", "use a number in (0, 1)")
    outs = Outputs()
    json_target = outs.add(json_out, "--json")
    from .learn.evaluate import evaluate
    from .learn.models import MODELS
    from .validate.runner import default_jobs

    n_jobs = jobs or default_jobs()
    graphs, skipped = _graphs(data, n_jobs, quiet)
    if len({g.key for g in graphs}) < 2:
        raise ConfigError("--data", "fewer than two configurations: nothing to hold back",
                          "pass more measured runs")
    with progress_bar(quiet=quiet) as bar:
        task = bar.add_task(f"training {len(MODELS)} models", total=len(MODELS))
        ev = evaluate(graphs, train_fraction, seed, model, epochs=epochs, jobs=n_jobs, composition=composition,
                      progress=lambda k: bar.advance(task, 1))
    result = {"data": str(data), "skipped": len(skipped), **ev.to_json()}
    if json_target is not None:
        write_outputs({json_target: json_text(result, "--json")})
    if outs.to_stdout:
        return
    if quiet:
        base = ", ".join(f"{k} {v:.2f}%" for k, v in result["baselines"].items())
        print(f"{model}: {ev.scores[model].test_mre_pct:.2f}% on {ev.n_test} held-back runs ({ev.n_train} trained "
              f"on); {base}")
        return
    t = Table(title=f"{data}: trained on {ev.n_train} runs ({ev.n_train_configs} configurations, "
                    f"{train_fraction:.0%}), tested on {ev.n_test} ({ev.n_test_configs}); seed {seed}")
    for col, just in (("model", "left"), ("mean error", "right"), ("median", "right"), ("max", "right"),
                      ("best epoch", "right"), ("train s", "right")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for s in [*ev.scores.values(), ev.analytical]:
        if s is None:
            continue
        trained = s.kind != "analytical"
        t.add_row(s.kind + (" (headline)" if s.kind == model else ""), f"{s.test_mre_pct:.2f}%",
                  f"{s.median_re_pct:.2f}%", f"{s.max_re_pct:.2f}%", str(s.best_epoch) if trained else "-",
                  f"{s.train_s:.1f}" if trained else "-")
    Console().print(t)
    if skipped:
        print(f"{len(skipped)} rows skipped (first: {skipped[0]})")

