"""`validate --by` (error statistics per group) and `calibrate --cv` (leave-one-group-out cross-validation).

Known answers: the simulator is stubbed (a row's prediction is a column of the row, or gamma x a column),
so every statistic and every held-out fit is computable by hand; a few CLI runs check the flags, the
JSON and the one-line errors.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainsim.cli import main
from trainsim.errors import ConfigError
from trainsim.validate import calibrate as fitting
from trainsim.validate import runner
from trainsim.validate.cases import Outcome, skip
from trainsim.validate.stats import group_stats

VTRAIN_HEADER = ("# GPUs,global batch,micro batch,hidden size,attention heads,# layers,sequence length,"
                 "tensor parallelism,data parallelism,pipeline parallelism,iteration time (ms)")
TRAINING_HEADER = "case_id,source_group,source,model_name,arch,gpu,n_gpus,flops_convention,global_batch"


def _cli(argv: list[str]) -> int:
    try:
        main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


# ---- statistics ---------------------------------------------------------------------------------------------

def test_group_stats_by_hand() -> None:
    g = group_stats([10.0, -20.0, 30.0], signs=[1, 1, -1], predicted=[1, 2, 3], measured=[1, 3, 2])
    assert g["n"] == 3 and g["mape"] == pytest.approx(20.0) and g["median_ape"] == pytest.approx(20.0)
    assert g["max_ape"] == pytest.approx(30.0)
    assert g["bias"] == pytest.approx((10 - 20 - 30) / 3)  # the third row's sign is flipped
    assert g["spearman"] == pytest.approx(0.5)  # one swapped pair of three: 1 - 6*2/(3*8)
    two = group_stats([5.0, -5.0], predicted=[1, 2], measured=[1, 2])
    assert two["bias"] == 0.0 and math.isnan(two["spearman"])  # rank correlation needs n >= 3
    assert math.isnan(group_stats([])["mape"])


def _o(row: int, metric: str, pred: float, meas: float) -> Outcome:
    inverse = "time" in metric
    return Outcome(row, f"r{row}", metric, pred, meas, None, 1 / pred if inverse else pred,
                   1 / meas if inverse else meas)


def test_stats_by_group_orients_bias_and_counts_skips() -> None:
    outs = [_o(0, "iter_time_s", 1.1, 1.0), _o(1, "iter_time_s", 1.8, 2.0), _o(2, "iter_time_s", 4.0, 4.0),
            _o(3, "tflops_per_gpu", 120.0, 100.0), _o(4, "tflops_per_gpu", 90.0, 100.0), skip(5, "r5", "bad")]
    keys = {0: "a", 1: "a", 2: "a", 3: "b", 4: "b", 5: "b"}
    g = runner.stats_by_group(outs, lambda o: keys[o.row])
    assert list(g) == ["a", "b"]
    a, b = g["a"], g["b"]
    # a: errors +10, -10, 0 (time): |e| mean 20/3, median 10; bias flips time errors: -(10 - 10 + 0)/3 = 0
    assert a["n"] == 3 and a["skipped"] == 0 and a["metrics"] == ["iter_time_s"]
    assert a["mape"] == pytest.approx(20 / 3) and a["median_ape"] == pytest.approx(10)
    assert a["max_ape"] == pytest.approx(10)
    assert a["bias"] == pytest.approx(0.0, abs=1e-12)
    assert a["spearman"] == pytest.approx(1.0)  # predicted throughputs 1/1.1 > 1/1.8 > 1/4, as measured
    # b: errors +20 and -10 (throughput: sign kept), the skipped row counted apart
    assert b["n"] == 2 and b["skipped"] == 1 and b["bias"] == pytest.approx(5.0) and math.isnan(b["spearman"])


def test_stats_by_group_bias_is_positive_when_predicted_faster() -> None:
    faster = [_o(0, "iter_time_s", 0.9, 1.0), _o(1, "samples_per_s", 110.0, 100.0)]
    g = runner.stats_by_group(faster, lambda o: "x")["x"]
    assert g["bias"] == pytest.approx(10.0)


def test_columns_resolve_through_aliases_case_and_file() -> None:
    tr = TRAINING_HEADER.split(",")
    assert runner.resolve_column("training_runs", tr, "source") == "source_group"  # not the long citation
    assert runner.resolve_column("training_runs", tr, "gpu") == "gpu"
    assert runner.resolve_column("training_runs", tr, "GPU") == "gpu"
    assert runner.resolve_column("training_runs", tr, "model") == "model_name"
    assert runner.resolve_column("training_runs", tr, "nosuch") is None
    vt = VTRAIN_HEADER.split(",")
    assert runner.resolve_column("vtrain", vt, "tp") == "tensor parallelism"
    assert runner.resolve_column("vtrain", vt, "source") == runner.FILE_COLUMN  # vTrain has no source column
    coll = ["source_id", "hardware", "collective", "n_nodes", "n_gpus"]
    assert [runner.resolve_column("collectives", coll, c) for c in ("hardware", "collective", "nodes")] == \
        ["hardware", "collective", "n_nodes"]
    with pytest.raises(ConfigError) as exc:
        runner.resolve_columns("vtrain", vt, "tp,nosuch", "--by")
    assert exc.value.field == "--by" and "nosuch" in exc.value.problem and "tp (tensor parallelism)" in exc.value.fix
    assert runner.file_label("vtrain", "x/ground_truth_multi.csv") == "vtrain_multi"
    assert sorted(["16", "2", "1|b", "1|a"], key=runner.natural_key) == ["1|a", "1|b", "2", "16"]


# ---- validate --by with a stubbed simulator ---------------------------------------------------------------

def _stub_row(args: tuple[str, int, dict[str, str], str | None, dict]) -> Outcome:
    """Prediction = the row's `pred` column (ms), as if the simulator had said so."""
    _, i, row, _, _ = args
    pred, meas = float(row["pred"]) / 1e3, float(row["iteration time (ms)"]) / 1e3
    return Outcome(i, f"row{i}", "iter_time_s", pred, meas, None, 1 / pred, 1 / meas)


def test_validate_by_column_known_answers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(runner, "_simulate_row", _stub_row)
    cells = [("1", 100, 110), ("1", 200, 190), ("1", 400, 400), ("2", 100, 150), ("2", 300, 150)]
    lines = [VTRAIN_HEADER + ",pred"] + [f"8,16,2,1024,16,4,512,{tp},{8 // int(tp)},1,{m},{p}" for tp, m, p in cells]
    (tmp_path / "runs.csv").write_text("\n".join(lines) + "\n")
    out = tmp_path / "v.json"
    assert _cli(["validate", str(tmp_path / "runs.csv"), "--by", "tp", "--json", str(out), "--jobs", "1"]) == 0
    printed = capsys.readouterr().out
    words = " ".join(printed.split())  # the caption wraps at the console width
    assert "errors by tensor parallelism" in words and "all rows" in words and "predicts faster" in words
    data = json.loads(out.read_text())
    assert data["group_by"] == ["tensor parallelism"] and list(data["groups"]) == ["1", "2"]
    one, two = data["groups"]["1"], data["groups"]["2"]
    # tp 1: errors +10, -5, 0 % of the measured time
    assert one["n"] == 3 and one["mape"] == pytest.approx(5.0) and one["median_ape"] == pytest.approx(5.0)
    assert one["max_ape"] == pytest.approx(10.0) and one["bias"] == pytest.approx(-5 / 3)  # slower on the whole
    assert one["spearman"] == pytest.approx(1.0)
    # tp 2: errors +50, -50; two rows have no rank correlation (null in JSON)
    assert two["mape"] == pytest.approx(50.0) and two["bias"] == pytest.approx(0.0) and two["spearman"] is None
    # the summary is unchanged by grouping
    assert data["summary"]["mape"] == pytest.approx((10 + 5 + 0 + 50 + 50) / 5)


def test_validate_by_unknown_column_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "runs.csv").write_text(VTRAIN_HEADER + "\n8,16,2,1024,16,4,512,2,4,1,120.5\n")
    for by in ("nosuch", ",", "tp,nope"):
        assert _cli(["validate", str(tmp_path / "runs.csv"), "--by", by]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--by" in err


# ---- calibrate --cv: leave one group out on a synthetic problem --------------------------------------------

def _stub_run_rows(kind: str, rows: list[dict[str, str]], calibration: str | None, jobs: int = 1,
                   progress: Any = None, row_indices: list[int] | None = None  # noqa: ANN401
                   ) -> runner.ValidationReport:
    """A simulator whose prediction is gamma * x for measured m: the fit of gamma is the (weighted) median of
    m / x over the training rows."""
    gamma = yaml.safe_load(Path(calibration or "").read_text())["gamma"]
    idx = row_indices if row_indices is not None else list(range(len(rows)))
    outs = [skip(i, f"r{i}", "not expressible") if r.get("skip") else
            Outcome(i, f"r{i}", "tflops_per_gpu", gamma * float(r["x"]), float(r["m"]))
            for i, r in zip(idx, rows, strict=True)]
    return runner.ValidationReport(kind, outs)


# group A: three rows with m/x = 0.5, B: two with 0.25, C: one with 0.8 (and one row the simulator skips)
SYNTHETIC = [("A", 2.0, 1.0), ("A", 4.0, 2.0), ("A", 1.0, 0.5), ("B", 4.0, 1.0), ("B", 2.0, 0.5), ("C", 1.0, 0.8)]


def test_leave_one_group_out_known_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainsim.cost.calibration import load_calibration

    monkeypatch.setattr(fitting, "run_rows", _stub_run_rows)
    rows = [{"x": str(x), "m": str(m)} for _, x, m in SYNTHETIC] + [{"x": "1", "m": "1", "skip": "1"}]
    ds = fitting.Dataset("training_runs", rows, list(range(len(rows))), "syn.csv",
                         [g for g, _, _ in SYNTHETIC] + ["C"])
    start = fitting.with_values(load_calibration(), "a100", {"gamma": 0.4})
    evals: list[int] = []
    cv = fitting.cross_validate(start, "a100", ["gamma"], [ds], sweeps=1, steps=40, on_eval=lambda: evals.append(1))
    assert len(evals) == fitting.cv_evaluations(3, 1, sweeps=1, steps=40)
    # fits: every row -> median 0.5; without A -> 0.25; without B -> 0.5; without C -> 0.5
    got = {g: cv.fitted(cv.folds[g])["gamma"] for g in cv.groups}
    assert cv.fitted(cv.all_fit)["gamma"] == pytest.approx(0.5, rel=1e-4)
    assert got == pytest.approx({"A": 0.25, "B": 0.5, "C": 0.5}, rel=1e-4)
    assert cv.train_rows == {"A": 4, "B": 5, "C": 5}  # the skipped row belongs to C
    held = {g: cv.stats(g)["held_out"]["mape"] for g in cv.groups}
    assert held == pytest.approx({"A": 50.0, "B": 100.0, "C": 37.5}, rel=1e-3)
    every = cv.stats()
    assert every["held_out"]["n"] == 6  # the skipped row is in no statistic
    assert every["held_out"]["mape"] == pytest.approx((3 * 50 + 2 * 100 + 37.5) / 6, rel=1e-3)
    assert every["in_sample"]["mape"] == pytest.approx((0 + 2 * 100 + 37.5) / 6, rel=1e-3)
    assert every["start"]["mape"] == pytest.approx((3 * 20 + 2 * 60 + 50) / 6, rel=1e-3)  # gamma 0.4
    assert cv.stats("A")["held_out"]["bias"] == pytest.approx(-50.0, rel=1e-3)  # predicted 50% too slow
    js = cv.to_json()
    assert js["summary"]["held_out_mape"] == pytest.approx(every["held_out"]["mape"])
    assert js["groups"]["A"]["values"]["gamma"] == pytest.approx(0.25, rel=1e-4)
    assert len(js["rows"]) == 6


def test_cross_validation_needs_two_groups() -> None:
    from trainsim.cost.calibration import load_calibration

    ds = fitting.Dataset("training_runs", [{"x": "1", "m": "1"}], [0], "one.csv", ["A"])
    with pytest.raises(ConfigError) as exc:
        fitting.cross_validate(load_calibration(), "a100", ["gamma"], [ds])
    assert exc.value.field == "--cv"


def _write_cv_files(tmp_path: Path) -> tuple[Path, Path]:
    tr = tmp_path / "runs.csv"
    tr.write_text(TRAINING_HEADER + ",x,m\n" + "".join(
        f"c{i},{g},cite,GPT,GPT,A100,8,x,8,{x},{m}\n" for i, (g, x, m) in enumerate(SYNTHETIC[:5])))
    vt = tmp_path / "ground_truth_multi.csv"
    vt.write_text(VTRAIN_HEADER + ",x,m\n8,16,2,1024,16,4,512,2,4,1,120.5,1.0,0.8\n")
    return tr, vt


def test_calibrate_cv_cli_groups_files_without_the_column(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(fitting, "run_rows", _stub_run_rows)
    tr, vt = _write_cv_files(tmp_path)
    out = tmp_path / "cv.json"
    code = _cli(["calibrate", str(tr), str(vt), "--cv", "source", "--fit", "gamma", "--sweeps", "1", "--jobs", "1",
                 "--json", str(out)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "held out: source" in printed and "vtrain_multi" in printed and "fitted constants" in printed
    data = json.loads(out.read_text())
    assert list(data["groups"]) == ["A", "B", "vtrain_multi"]
    assert [data["groups"][g]["n"] for g in data["groups"]] == [3, 2, 1]
    assert data["summary"]["held_out_mape"] == pytest.approx(
        sum(abs(r["held_out_error_pct"]) for r in data["rows"]) / len(data["rows"]))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cv.json", "ground_truth_multi.csv", "runs.csv"]  # no --out


def test_calibrate_cv_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tr, vt = _write_cv_files(tmp_path)
    cases = [(["calibrate", str(tr), "--cv", "nosuch"], "--cv"),
             (["calibrate", str(vt), "--cv", "tp"], "--cv"),  # one row: one group
             (["calibrate", str(tr), "--cv", "source", "--fit", ""], "--fit"),
             (["calibrate", str(tr)], "--out")]  # without --cv the fitted file must go somewhere
    for argv, field in cases:
        assert _cli(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and field in err, (argv, err)



def test_moe_files_are_grouped_by_model_and_gpu_unasked(tmp_path: Path) -> None:
    """A file with expert columns (moe_runs.csv's format) reports its errors per model and per GPU without --by;
    other training_runs files do not; --by replaces the defaults."""
    import csv

    from training_row import training_row

    from trainsim.validate.training_runs import row_job

    cols = {"n_experts": "8", "top_k": "2", "moe_ffn_hidden": "1024"}
    rows = [training_row(case_id=f"r{i}", model_name=name, gpu=gpu, **cols)
            for i, (name, gpu) in enumerate((("A", "H100 80GB"), ("A", "H100 80GB"), ("B", "H100 80GB")))]
    assert not isinstance(row_job(rows[0]), str)
    path = tmp_path / "moe.csv"
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    out = tmp_path / "v.json"
    assert _cli(["validate", str(path), "--json", str(out), "-q", "--jobs", "1"]) == 0
    grouped = json.loads(out.read_text())["groups_by_column"]
    assert sorted(grouped) == ["gpu", "model_name"]
    assert {k: v["n"] for k, v in grouped["model_name"].items()} == {"A": 2, "B": 1}
    assert [v["n"] for v in grouped["gpu"].values()] == [3]
    assert _cli(["validate", str(path), "--json", str(out), "-q", "--jobs", "1", "--by", "model_name"]) == 0
    data = json.loads(out.read_text())
    assert "groups_by_column" not in data and data["group_by"] == ["model_name"]
    plain = tmp_path / "dense.csv"
    with plain.open("w", newline="") as fh:
        dense = [{k: v for k, v in r.items() if k not in cols} for r in rows]
        w = csv.DictWriter(fh, fieldnames=list(dense[0]))
        w.writeheader()
        w.writerows(dense)
    assert _cli(["validate", str(plain), "--json", str(out), "-q", "--jobs", "1"]) == 0
    assert "groups_by_column" not in json.loads(out.read_text())
