"""`trainsim predictor train | eval` and `--compute learned:FILE` from the command line: the JSON the checks
rely on, determinism, the analytical baseline against `validate`, the training-runs format, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from cli_helpers import one_line_error  # noqa: E402

from trainsim.cli import main  # noqa: E402
from trainsim.files import read_csv  # noqa: E402
from trainsim.learn.models import Fitted  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared" / "validation"
VTRAIN = SHARED / "vtrain" / "ground_truth_single.csv"
TRAINING_RUNS = SHARED / "training_runs.csv"
needs_shared = pytest.mark.skipif(not VTRAIN.is_file(), reason="../shared/validation is not beside the clone")


def vtrain_rows(tmp_path: Path, n: int) -> Path:
    """The first `n` rows of vTrain's single-node file (a small real dataset)."""
    lines = VTRAIN.read_text(encoding="utf-8-sig").splitlines()[: n + 1]
    out = tmp_path / "runs.csv"
    out.write_text("\n".join(lines) + "\n")
    return out


def run_json(argv: list[str], out: Path) -> dict:
    main([*argv, "--json", str(out)])
    return json.loads(out.read_text())


@needs_shared
def test_eval_writes_the_interface_and_is_deterministic(tmp_path: Path) -> None:
    data = vtrain_rows(tmp_path, 40)
    argv = ["predictor", "eval", "--data", str(data), "--train-fraction", "0.3", "--seed", "1", "--epochs", "3", "-q"]
    a = run_json([*argv, "--jobs", "1"], tmp_path / "a.json")
    b = run_json([*argv, "--jobs", "2"], tmp_path / "b.json")  # models in worker processes: the same numbers
    assert a["test_mre_pct"] == b["test_mre_pct"] and a["baselines"] == b["baselines"]
    assert set(a["baselines"]) == {"gcn", "gat", "features", "analytical"}
    assert a["n_train"] + a["n_test"] == 40 and a["n_train"] == 12  # 30% of 40 configurations, one run each
    assert a["train_s"] > 0 and a["model"] == "dag-transformer" and a["composition"] == "formula"
    sim = run_json([*argv, "--composition", "simulation"], tmp_path / "s.json")
    assert sim["composition"] == "simulation" and sim["baselines"]["analytical"] == a["baselines"]["analytical"]
    c = run_json([*argv, "--model", "gcn"], tmp_path / "c.json")
    assert c["test_mre_pct"] == a["baselines"]["gcn"] and c["baselines"]["dag-transformer"] == a["test_mre_pct"]


@needs_shared
def test_the_analytical_baseline_is_validate_on_the_held_back_rows(tmp_path: Path) -> None:
    """The analytical model's error in `eval` is trainsim's own prediction against the measurement: what
    `validate` reports for the same rows."""
    data = vtrain_rows(tmp_path, 12)
    ev = run_json(["predictor", "eval", "--data", str(data), "--train-fraction", "0.5", "--epochs", "0", "-q"],
                  tmp_path / "e.json")
    report = run_json(["validate", str(data), "-q", "--jobs", "1"], tmp_path / "v.json")
    apes = {r["row"]: abs(r["error_pct"]) for r in report["rows"]}
    assert len(apes) == 12
    from trainsim.learn.dataset import measured_graphs, split_by_config

    graphs, skipped = measured_graphs(data)
    assert not skipped
    _, test = split_by_config(graphs, 0.5, 0)  # the same seeded split: graphs are in file order
    assert ev["baselines"]["analytical"] == pytest.approx(sum(apes[i] for i in test) / len(test), rel=1e-6)
    # with epochs 0 every model is the analytical one (r = 0 exactly)
    assert ev["test_mre_pct"] == pytest.approx(ev["baselines"]["analytical"], rel=1e-9)


@needs_shared
def test_train_writes_a_model_that_simulate_and_validate_use(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = vtrain_rows(tmp_path, 24)
    model = tmp_path / "m.pt"
    summary = run_json(["predictor", "train", str(data), "--out", str(model), "--model", "features", "--epochs", "40",
                        "-q"], tmp_path / "t.json")
    assert summary["n_train"] == 24 and summary["devices"] == ["a100-80gb"]
    assert summary["train_mre_pct"] < summary["analytical_mre_pct"]  # it learned something on its own data
    fitted = Fitted.load(model)
    assert fitted.kind == "features" and fitted.meta["devices"] == "a100-80gb"
    assert summary["composition"] == fitted.meta["composition"] == "simulation"  # what --compute runs
    assert model.stat().st_size < 5 * 2**20
    learned = run_json(["validate", str(data), "-q", "--jobs", "1", "--compute", f"learned:{model}"],
                       tmp_path / "vl.json")
    roofline = run_json(["validate", str(data), "-q", "--jobs", "1"], tmp_path / "vr.json")
    assert learned["summary"]["mape"] != roofline["summary"]["mape"]
    sim = run_json(["simulate", "-q", "--model", "gpt3-1.3b", "--cluster", "dgx-a100", "--nodes", "1", "--tp", "2",
                    "--pp", "2", "--dp", "2", "--global-batch", "32", "--compute", f"learned:{model}"],
                   tmp_path / "s.json")
    assert sim["compute_model"]["kind"] == "features" and len(sim["compute_model"]["stages"]) == 2


@needs_shared
def test_training_runs_rows_become_labelled_stages(tmp_path: Path) -> None:
    """The training_runs.csv format: a row's measured metric becomes the iteration `validate` compares (a row
    that states its iteration time is labelled with it exactly)."""
    import csv

    from trainsim.learn.dataset import measured_graphs
    from trainsim.validate.training_runs import row_job

    header, rows = read_csv(TRAINING_RUNS, "x")
    timed = [r for r in rows if r.get("iter_time_s") and
             not isinstance(row_job(r), str) and row_job(r).metric == "iter_time_s"][:4]
    assert timed, "training_runs.csv has rows measured as iteration times"
    subset = tmp_path / "runs.csv"
    with subset.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=header)
        w.writeheader()
        w.writerows(timed)
    graphs, skipped = measured_graphs(subset)
    assert graphs and len(graphs) + len(skipped) == len(timed)
    labels = sorted(round(g.label_s, 9) for g in graphs)
    assert set(labels) <= {round(float(r["iter_time_s"]), 9) for r in timed}
    assert all(g.label_s > 0 and g.base_iter_s > 0 for g in graphs)


def test_refusals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    assert "--data" in one_line_error(["predictor", "eval", "--data", str(bad)], capsys)
    assert "--data" in one_line_error(["predictor", "train", str(tmp_path / "none.csv")], capsys)
    assert "--model" in one_line_error(["predictor", "eval", "--data", str(bad), "--model", "mlp"], capsys)
    assert "--train-fraction" in one_line_error(["predictor", "eval", "--data", str(bad), "--train-fraction", "1"],
                                                capsys)
    assert "--out" in one_line_error(["predictor", "train", str(bad), "--out", "-"], capsys)
    assert "--composition" in one_line_error(["predictor", "eval", "--data", str(bad), "--composition", "x"], capsys)
    runs = tmp_path / "runs.csv"
    runs.write_text("# GPUs,global batch,micro batch,hidden size,attention heads,# layers,sequence length,tensor "
                    "parallelism,data parallelism,pipeline parallelism,iteration time (ms)\n1,4,1,256,4,2,128,1,1,1,10\n")
    err = one_line_error(["validate", str(runs), "--compute", f"learned:{tmp_path / 'x.pt'}"], capsys)
    assert err.startswith("error: --compute:") and "does not exist" in err
    assert "--compute" in one_line_error(["validate", str(runs), "--compute", "gpu"], capsys)
    err = one_line_error(["simulate", "--model", "gpt2", "--compute", f"learned:{tmp_path / 'missing.pt'}"], capsys)
    assert "simulation.compute_model" in err and "does not exist" in err
    assert not list(tmp_path.glob("*.pt"))
