"""`trainsim validate`: statistics, FLOP conventions, row parsing, and accuracy on fixed subsets."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainsim.cli import main
from trainsim.validate import training_runs, vtrain
from trainsim.validate.conventions import GPTShape, korthikanti_model, narayanan_eq3, six_n_plus_attention
from trainsim.validate.stats import kendall, spearman

DATA = Path(__file__).parent / "data"


def test_spearman_and_kendall_known_values() -> None:
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # one swapped pair of four: rho = 1 - 6*2/(4*15) = 0.8; tau = (5-1)/6
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert kendall([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)
    # ties: tau-b = (C - D) / sqrt((n0 - n1)(n0 - n2)) = (5 - 0) / sqrt(6 * 5)
    assert kendall([1, 2, 3, 4], [1, 1, 2, 3]) == pytest.approx(5 / math.sqrt(30))
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))


@given(st.lists(st.integers(-1000, 1000), min_size=3, max_size=12, unique=True))
def test_rank_statistics_are_invariant_under_monotone_maps(xs: list[int]) -> None:
    ys = [x ** 3 + 7 for x in xs]
    assert spearman(xs, ys) == pytest.approx(1.0)
    assert kendall(xs, ys) == pytest.approx(1.0)
    assert kendall(xs, [-y for y in ys]) == pytest.approx(-1.0)


def test_flop_conventions_by_hand() -> None:
    # Megatron SC'21 1.7B row: B=512, s=2048, l=24, h=2304, V=51200
    m = GPTShape(24, 2304, 2048, 51200, 1.7e9, 1.58e9)
    f = narayanan_eq3(m, 512)
    assert f == pytest.approx(96 * 512 * 2048 * 24 * 2304**2 * (1 + 2048 / (6 * 2304) + 51200 / (16 * 24 * 2304)))
    # eq. 3 counts the recompute forward: exactly 4/3 of the model FLOPs' layer term
    assert narayanan_eq3(m, 1) / korthikanti_model(m, 1) == pytest.approx(
        (96 * (1 + 2048 / 13824 + 51200 / 884736)) / (72 * (1 + 2048 / 13824 + 51200 / 663552)))
    # 6N + 12 L h s per token
    assert six_n_plus_attention(m, 2) == pytest.approx((6 * 1.7e9 + 12 * 24 * 2304 * 2048) * 2048 * 2)


def test_vtrain_vocab_padding_and_job() -> None:
    assert vtrain.padded_vocab(1) == 50304
    assert vtrain.padded_vocab(8) == 51200
    job = vtrain.row_job({"# GPUs": "16", "global batch": "64", "micro batch": "2", "hidden size": "1024",
                          "attention heads": "16", "# layers": "4", "sequence length": "1024",
                          "tensor parallelism": "2", "data parallelism": "4", "pipeline parallelism": "2",
                          "iteration time (ms)": "100"})
    assert isinstance(job, dict)
    assert job["cluster"]["nodes"] == 2 and job["cluster"]["nics_per_node"] == 4
    assert job["model"]["vocab"] == 50432 and job["strategy"]["recompute"] == "full"
    assert "not a multiple" in vtrain.row_job({**{"# GPUs": "8", "global batch": "10", "micro batch": "4",
                                                  "hidden size": "64", "attention heads": "4", "# layers": "2",
                                                  "sequence length": "64", "tensor parallelism": "1",
                                                  "data parallelism": "8", "pipeline parallelism": "1"}})


def _row(**kw: str) -> dict[str, str]:
    import csv

    with (DATA / "training_runs_subset.csv").open() as fh:
        base = next(csv.DictReader(fh))
    return {**base, **kw}


def test_training_row_reads_hardware_and_strategy_from_its_columns() -> None:
    rj = training_runs.row_job(_row())
    assert not isinstance(rj, str)
    c = rj.job["cluster"]
    assert c["name"] == "dgx-a100" and c["nodes"] == 4 and c["nics_per_node"] == 8 and c["nic_gbps"] == 25.0
    assert rj.job["strategy"]["recompute"] == "full" and rj.metric == "tflops_per_gpu"
    assert rj.convention == "narayanan_eq3"
    # unstated micro-batch falls back to a documented default, recorded as an assumption
    rj2 = training_runs.row_job(_row(micro_batch="", grad_accum=""))
    assert not isinstance(rj2, str) and rj2.job["strategy"]["micro_batch"] == 1 and "micro_batch" in rj2.assumptions
    # rows that cannot be expressed say why
    assert "unknown GPU" in training_runs.row_job(_row(gpu="MI300X"))
    assert "!= n_gpus" in training_runs.row_job(_row(dp="3"))


def _validate(tmp_path: Path, name: str, *extra: str) -> tuple[int, dict]:
    out = tmp_path / "v.json"
    code = 0
    try:
        main(["validate", str(DATA / name), "--json", str(out), "-q", "--jobs", "1", *extra])
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, (json.loads(out.read_text()) if out.exists() else {})


def test_validate_json_shape_and_accuracy_on_vtrain_subset(tmp_path: Path) -> None:
    code, data = _validate(tmp_path, "vtrain_subset.csv", "--max-mape", "10")
    assert code == 0, data.get("summary")
    s = data["summary"]
    assert set(s) >= {"n", "skipped", "mape", "median_ape", "max_ape", "spearman", "kendall"}
    assert s["n"] == 22 and s["skipped"] == 0
    row = data["rows"][0]
    assert set(row) >= {"row", "case_id", "predicted", "measured", "metric", "error_pct"}
    assert [r["row"] for r in data["rows"]] == list(range(22))
    assert s["spearman"] > 0.0  # a sparse subset; the full files' ranking is reported in the closing note


def test_validate_accuracy_on_training_runs_subset(tmp_path: Path) -> None:
    code, data = _validate(tmp_path, "training_runs_subset.csv", "--max-mape", "12", "--tier", "A,B")
    assert code == 0, data.get("summary")
    assert data["summary"]["n"] == 13
    sc21 = [r for r in data["rows"] if r["case_id"].startswith("MEG-SC21")]
    assert len(sc21) == 10 and all(abs(r["error_pct"]) < 8 for r in sc21)


def test_max_mape_exit_code_and_bad_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _ = _validate(tmp_path, "vtrain_subset.csv", "--max-mape", "0.001")
    assert code == 1
    capsys.readouterr()
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(SystemExit) as exc:
        main(["validate", str(bad)])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "CASES" in err


def test_calibrate_fits_within_bounds_and_never_worsens(tmp_path: Path) -> None:
    from trainsim.cost.calibration import load_calibration
    from trainsim.validate.calibrate import BOUNDS, Dataset, fit, with_values
    from trainsim.validate.runner import read_rows

    _, rows = read_rows(DATA / "vtrain_subset.csv")
    ds = Dataset("vtrain", rows[:4], list(range(4)))
    start = with_values(load_calibration(), "a100", {"gemm_peak_fraction": 0.45})  # a deliberately bad start
    res = fit(start, "a100", ["gemm_peak_fraction"], [ds], sweeps=1, steps=4)
    got = res.calibration.compute["a100"].gemm_peak_fraction
    assert res.loss_after <= res.loss_before
    assert BOUNDS["gemm_peak_fraction"][0] <= got <= BOUNDS["gemm_peak_fraction"][1]
    assert got > 0.45  # the bad start was too slow; the fit moves toward the data


def test_calibrate_cli_writes_a_loadable_file(tmp_path: Path) -> None:
    from trainsim.cost.calibration import load_calibration

    sub = tmp_path / "few.csv"
    lines = (DATA / "vtrain_subset.csv").read_text().splitlines()
    sub.write_text("\n".join(lines[:4]) + "\n")
    out = tmp_path / "cal.yaml"
    main(["calibrate", str(sub), "--out", str(out), "--fit", "host_overhead_s", "--sweeps", "1", "--jobs", "1"])
    cal = load_calibration(out)
    assert cal.compute["a100"].host_overhead_s > 0
    code, data = _validate(tmp_path, "vtrain_subset.csv", "--calibration", str(out))
    assert code == 0 and data["summary"]["n"] == 22
