"""Fitting the compute model to kernel measurements (trainsim.cost.fit_compute)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from trainsim.cost.calibration import Calibration, ComputeParams, load_calibration
from trainsim.cost.fit_compute import (
    ATTENTION_COLUMNS,
    GEMM_COLUMNS,
    MEMORY_COLUMNS,
    attention_op,
    fit_all,
    fit_compute_params,
    gemm_op,
    load_measurement_dir,
    load_measurements,
    minimise_box,
    model_uses,
    packaged_measurement_dir,
    predict_attention,
    predict_gemm,
    predict_memory,
)
from trainsim.hardware.devices import get_device

A100 = get_device("a100-80gb")


@pytest.fixture(scope="module")
def base() -> ComputeParams:
    return load_calibration().compute["default"]


def _synthetic_gemm_rows(truth: ComputeParams, dtype: str = "bf16") -> list[dict]:
    shapes = [(8192, 8192, 64, 1), (8192, 8192, 128, 1), (8192, 8192, 256, 1), (8192, 8192, 512, 1),
              (4096, 4096, 4096, 1), (8192, 8192, 8192, 1), (16384, 4096, 1024, 1), (2048, 8192, 2048, 1),
              (1024, 1024, 1024, 8), (12288, 12288, 192, 1)]
    rows = []
    for m, n, k, b in shapes:
        row = {"device": "a100-80gb", "dtype": dtype, "m": m, "n": n, "k": k, "batch": b, "source": "synthetic"}
        t = predict_gemm(truth, row, A100)
        row["tflops"] = 2.0 * m * n * k * b / t / 1e12
        rows.append(row)
    return rows


def test_recovers_gemm_params_from_synthetic_data(base: ComputeParams) -> None:
    truth = base.model_copy(update={"gemm_peak_fraction": 0.7, "k_half": 100.0})
    fitted, report = fit_compute_params(base, _synthetic_gemm_rows(truth), [], [], A100)
    assert fitted.gemm_peak_fraction == pytest.approx(0.7, rel=0.03)
    assert fitted.k_half == pytest.approx(100.0, rel=0.05)
    assert report["params"]["gemm_peak_fraction"]["status"].startswith("fitted")
    assert report["gemm"]["mape_after"] < 0.01 < report["gemm"]["mape_before"]
    assert report["gemm"]["n_used"] == 10


def test_recovers_attention_and_memory_params(base: ComputeParams) -> None:
    truth = base.model_copy(update={"flash_fraction_fwd": 0.55, "flash_fraction_bwd": 0.4, "hbm_efficiency": 0.88})
    att = []
    for s in (1024, 2048, 4096, 8192):
        for causal in (False, True):
            for direction in ("fwd", "bwd"):
                row = {"device": "a100-80gb", "dtype": "bf16", "impl": "flash2", "batch": 16384 // s, "heads": 16,
                       "seq_len": s, "head_dim": 128, "causal": causal, "direction": direction, "source": "synthetic"}
                flops = 4.0 * row["batch"] * 16 * s * s * 128 * (0.5 if causal else 1.0) * (2.5 if direction == "bwd"
                                                                                            else 1.0)
                row["tflops"] = flops / predict_attention(truth, row, A100) / 1e12
                att.append(row)
    mem = []
    for size in (2**26, 2**28, 2**30, 2**32):
        row = {"device": "a100-80gb", "op": "copy", "bytes": size, "source": "synthetic"}
        row["gbps"] = size / predict_memory(truth, row, A100) / 1e9
        mem.append(row)
    fitted, report = fit_compute_params(base, [], att, mem, A100)
    assert fitted.flash_fraction_fwd == pytest.approx(0.55, rel=0.02)
    assert fitted.flash_fraction_bwd == pytest.approx(0.4, rel=0.02)
    assert fitted.hbm_efficiency == pytest.approx(0.88, rel=0.02)
    assert report["attention_impls"] == ["flash2"]
    # no GEMM rows: the GEMM constants stay where they were and the report says so
    assert fitted.gemm_peak_fraction == base.gemm_peak_fraction
    assert fitted.k_half == base.k_half
    assert report["params"]["gemm_peak_fraction"]["status"].startswith("no data")


def test_uninformative_rows_leave_parameters_alone(base: ComputeParams) -> None:
    # only huge-K GEMMs: k_half cannot be told from the data, so it keeps its base value
    truth = base.model_copy(update={"gemm_peak_fraction": 0.75})
    rows = [r for r in _synthetic_gemm_rows(truth) if r["k"] >= 4096]
    fitted, report = fit_compute_params(base, rows, [], [], A100)
    assert fitted.k_half == base.k_half
    assert report["params"]["k_half"]["status"].startswith("insufficient data")
    assert fitted.gemm_peak_fraction == pytest.approx(0.75, rel=0.02)


def test_small_mn_half_only_fitted_when_the_model_uses_it(base: ComputeParams) -> None:
    fitted, report = fit_compute_params(base, _synthetic_gemm_rows(base), [], [], A100)
    if not model_uses("small_mn_half", base, A100):
        assert fitted.small_mn_half == base.small_mn_half
        assert report["params"]["small_mn_half"]["status"].startswith("not used")


def test_rows_outside_the_fit_are_reported(base: ComputeParams) -> None:
    rows = _synthetic_gemm_rows(base)
    rows.append({"device": "a100-80gb", "dtype": "bf16", "m": None, "n": None, "k": None, "batch": 1,
                 "tflops": 250.0, "source": "x"})
    rows.append({"device": "a100-80gb", "dtype": "tf32", "m": 8192, "n": 8192, "k": 8192, "batch": 1,
                 "tflops": 120.0, "source": "x"})
    rows.append({"device": "a100-80gb", "dtype": "bf16", "m": 8190, "n": 8192, "k": 8192, "batch": 1,
                 "tflops": 120.0, "source": "x"})
    rows.append({"device": "a100-80gb", "dtype": "bf16", "m": 256, "n": 256, "k": 256, "batch": 1,
                 "tflops": 5.0, "source": "x"})
    _, report = fit_compute_params(base, rows, [], [], A100)
    reasons = [r["reason"] for r in report["gemm"]["rows"] if not r["used"]]
    assert len(reasons) == 4
    assert any("shape not stated" in r for r in reasons)
    assert any("tf32" in r for r in reasons)
    assert any("misaligned" in r for r in reasons)
    assert any("launch/dispatch" in r for r in reasons)
    assert "tf32" in report["gemm_dtype_bias_after"]


def test_minimise_box_stays_in_bounds() -> None:
    x, fx = minimise_box(lambda v: (v[0] - 2.0) ** 2 + (v[1] + 5.0) ** 2, [0.5, 0.5], [(0.0, 1.0), (-1.0, 1.0)])
    assert x[0] == pytest.approx(1.0, abs=1e-3) and x[1] == pytest.approx(-1.0, abs=1e-3)
    x, _ = minimise_box(lambda v: (v[0] - 0.3) ** 2, [0.9], [(0.0, 1.0)])
    assert x[0] == pytest.approx(0.3, abs=1e-4)


def test_ops_follow_the_model_conventions() -> None:
    op = gemm_op(128, 256, 512, 4)
    assert op.fwd_flops() == 2 * 128 * 256 * 512 * 4
    att = attention_op(2, 16, 1024, 128, causal=True)
    assert att.fwd_flops() == 4 * 2 * 16 * 1024 * 1024 * 128


def test_packaged_measurements_load_and_cite_sources() -> None:
    directory = packaged_measurement_dir()
    expected = {"gemm_published.csv": GEMM_COLUMNS, "attention_published.csv": ATTENTION_COLUMNS,
                "memory_published.csv": MEMORY_COLUMNS}
    for name, columns in expected.items():
        path = directory / name
        with path.open(newline="", encoding="utf-8") as f:
            assert tuple(csv.DictReader(f).fieldnames or ()) == columns
        rows = load_measurements(path)
        assert rows, name
        for row in rows:
            assert row["source"].strip(), (name, row)
            get_device(row["device"])  # every device is a trainsim device
            value = row.get("tflops") if "tflops" in row else row["gbps"]
            assert value is not None and value > 0
    data = load_measurement_dir(directory)
    assert len(data["gemm"]) >= 30 and data["attention"] and data["memory"]
    devices = {r["device"] for r in data["gemm"]}
    assert {"a100-80gb", "h100-sxm"} <= devices


def test_fit_all_on_packaged_data() -> None:
    cal = load_calibration()
    fitted, report = fit_all(cal)
    assert isinstance(fitted, Calibration)
    assert {"a100", "h100", "v100"} <= set(report["families"])
    a100 = fitted.compute["a100"]
    assert 0.6 <= a100.gemm_peak_fraction <= 0.95
    assert "gemm_published.csv" in a100.source and "rows" in a100.source
    assert report["families"]["a100"]["params"]["gemm_peak_fraction"]["status"].startswith("fitted")
    assert fitted.compute["default"] == cal.compute["default"]
    for fam in report["families"]:
        rep = report["families"][fam]["gemm"]
        if rep["n_used"]:
            assert rep["mape_after"] <= rep["mape_before"] + 1e-9 or rep["mape_after"] < 0.1


def test_user_csv_with_the_same_columns(tmp_path: Path, base: ComputeParams) -> None:
    path = tmp_path / "mine.csv"
    rows = _synthetic_gemm_rows(base.model_copy(update={"gemm_peak_fraction": 0.65}))
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(GEMM_COLUMNS))
        w.writeheader()
        for r in rows:
            w.writerow({**{k: r.get(k, "") for k in GEMM_COLUMNS}, "dtype": "bfloat16", "notes": ""})
    loaded = load_measurements(path)
    assert loaded[0]["dtype"] == "bf16" and loaded[0]["kind"] == "gemm" and loaded[0]["file"] == "mine.csv"
    fitted, report = fit_all(load_calibration(), tmp_path)
    assert set(report["families"]) == {"a100"}
    assert fitted.compute["a100"].gemm_peak_fraction == pytest.approx(0.65, rel=0.03)
    assert "mine.csv x10" in fitted.compute["a100"].source


def test_bad_csv_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("device,dtype,m,n,k,batch,tflops,source,notes\na100-80gb,bf16,1024,x,1024,1,100,src,\n")
    with pytest.raises(ValueError, match="not a number"):
        load_measurements(bad)
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="unrecognised"):
        load_measurements(other)


def test_a_second_dtype_gets_its_own_peak_fraction(base: ComputeParams) -> None:
    # fp16 rows at 0.7 of the fp16 peak, fp32 (SGEMM) rows at 0.9 of the fp32 peak: the shared shape terms
    # come from the fp16 rows, the fp32 rows only set dtype_gemm_fraction["fp32"]
    truth = base.model_copy(update={"gemm_peak_fraction": 0.7, "dtype_gemm_fraction": {"fp32": 0.9}})
    rows = _synthetic_gemm_rows(truth, "fp16") + _synthetic_gemm_rows(truth, "fp32")[:4]
    fitted, report = fit_compute_params(base, rows, [], [], A100)
    assert fitted.gemm_peak_fraction == pytest.approx(0.7, rel=0.03)
    assert fitted.dtype_gemm_fraction["fp32"] == pytest.approx(0.9, rel=0.03)
    assert report["dtype_gemm_fraction"]["fp32"]["status"].startswith("fitted")
    # a fraction only prices its own dtype
    fp16_row = {**rows[0], "dtype": "fp16"}
    assert predict_gemm(fitted, fp16_row, A100) == pytest.approx(predict_gemm(
        fitted.model_copy(update={"dtype_gemm_fraction": {}}), fp16_row, A100))


def test_too_few_rows_of_a_dtype_keep_the_shared_fraction(base: ComputeParams) -> None:
    rows = _synthetic_gemm_rows(base, "fp16") + _synthetic_gemm_rows(base, "tf32")[:2]
    fitted, report = fit_compute_params(base, rows, [], [], A100)
    assert "tf32" not in fitted.dtype_gemm_fraction
    assert report["dtype_gemm_fraction"]["tf32"]["status"].startswith("kept")
