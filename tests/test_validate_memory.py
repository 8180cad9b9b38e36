"""validate compares peak memory (issue 22, item 2): a training-runs row with peak_mem_gib gets the predicted
peak of the stage its mem_scope names (the fullest without one), its error and trainsim's OOM verdict; the summary gains memory statistics overall
and per mem_kind, all computed here by hand from hand-made rows."""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path
from typing import Any

import pytest
from training_row import BASE, training_row

from trainsim.api import simulate
from trainsim.cli import main
from trainsim.validate import training_runs as tr
from trainsim.validate.cases import MEMORY_METRIC, Outcome
from trainsim.validate.stats import memory_stats

GIB = 2.0 ** 30
COLUMNS = [*BASE, "peak_mem_gib", "mem_kind", "n_experts"]
HUGE = {"n_layers": "32", "hidden": "4096", "n_heads": "32", "n_kv_heads": "32", "ffn_hidden": "16384",
        "gpu": "A100 40GB", "gpu_mem_gb": "40", "n_gpus": "1", "dp": "1", "micro_batch": "2", "global_batch": "2"}
ROWS: list[dict[str, str]] = [
    training_row(case_id="alloc", peak_mem_gib="2.0", mem_kind="allocated"),
    training_row(case_id="resv", peak_mem_gib="3.0", mem_kind="reserved", micro_batch="1", global_batch="8"),
    training_row(case_id="mem-only", iter_time_s="", peak_mem_gib="1.5", mem_kind=""),
    training_row(case_id="no-mem", peak_mem_gib="", mem_kind=""),
    training_row(case_id="huge", peak_mem_gib="30", mem_kind="allocated", **HUGE),
    training_row(case_id="smi", peak_mem_gib="4", mem_kind="nvidia-smi used"),
    training_row(case_id="moe", peak_mem_gib="4", mem_kind="allocated", n_experts="8"),
    training_row(case_id="nothing", iter_time_s="", peak_mem_gib="", mem_kind=""),
]


def _write(path: Path, rows: list[dict[str, str]]) -> Path:
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS, restval="")
        w.writeheader()
        w.writerows(rows)
    return path


def _predicted(row: dict[str, str]) -> tuple[float, bool]:
    """trainsim's peak memory of the fullest stage (GiB) and OOM verdict for a row, straight from simulate:
    the allocated peak, or the caching allocator's reserved peak for a reserved row."""
    rj = tr.row_job(row)
    assert not isinstance(rj, str), rj
    res = simulate(rj.job)
    if row["mem_kind"] == "reserved":
        return max(m.reserved_bytes for m in res.memory) / GIB, res.oom
    return max(res.peak_memory_bytes) / GIB, res.oom


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("mem")
    out = d / "v.json"
    main(["validate", str(_write(d / "runs.csv", ROWS)), "--json", str(out), "-q", "--jobs", "1"])
    return json.loads(out.read_text())


def test_memory_of_each_row_by_hand(report: dict[str, Any]) -> None:
    rows = {r["case_id"]: r for r in report["rows"]}
    assert set(rows) == {"alloc", "resv", "mem-only", "no-mem", "huge", "smi"}
    for case, measured, kind in (("alloc", 2.0, "allocated"), ("resv", 3.0, "reserved"),
                                 ("mem-only", 1.5, "unstated"), ("huge", 30.0, "allocated")):
        row = next(r for r in ROWS if r["case_id"] == case)
        pred_gib, oom = _predicted(row)
        r = rows[case]
        assert r["memory_measured_gib"] == measured and r["mem_kind"] == kind
        assert r["memory_predicted_gib"] == pytest.approx(pred_gib, rel=1e-12)
        assert r["memory_error"] == pytest.approx((pred_gib - measured) / measured * 100.0, rel=1e-12)
        assert r["oom_predicted"] is oom
    assert rows["huge"]["oom_predicted"] is True  # ~6.4B parameters with Adam on one 40 GB A100
    assert rows["alloc"]["oom_predicted"] is False
    for case in ("no-mem", "smi"):  # no measured memory / a kind that is not allocated or reserved: no memory keys
        assert "memory_error" not in rows[case] and "memory_measured_gib" not in rows[case]
    assert "mem_kind = 'nvidia-smi used'" in rows["smi"]["assumptions"]["memory"]


def test_memory_only_row_leaves_time_statistics_alone(report: dict[str, Any]) -> None:
    rows = {r["case_id"]: r for r in report["rows"]}
    only = rows["mem-only"]
    assert only["metric"] == MEMORY_METRIC and only["predicted"] is None and only["error_pct"] is None
    time_rows = [r for r in report["rows"] if r["error_pct"] is not None]
    assert report["summary"]["n"] == len(time_rows) == 5
    assert report["summary"]["mape"] == pytest.approx(statistics.fmean(abs(r["error_pct"]) for r in time_rows))
    skipped = {r["case_id"]: r["reason"] for r in report["skipped_rows"]}
    assert set(skipped) == {"moe", "nothing"} and report["summary"]["skipped"] == 2
    assert skipped["moe"].startswith("mixture of experts") and skipped["nothing"].startswith("no measured outcome")


def test_memory_summary_by_hand_overall_and_by_kind(report: dict[str, Any]) -> None:
    rows = [r for r in report["rows"] if "memory_error" in r]
    apes = [abs(r["memory_error"]) for r in rows]
    m = report["summary"]["memory"]
    assert m["n"] == 4 and m["oom_wrong"] == 1
    assert m["mape"] == pytest.approx(sum(apes) / 4) and m["max_ape"] == pytest.approx(max(apes))
    assert m["median_ape"] == pytest.approx(sorted(apes)[1] / 2 + sorted(apes)[2] / 2)
    by_kind = report["summary"]["memory_by_kind"]
    assert set(by_kind) == {"allocated", "reserved", "unstated"}
    alloc = [abs(r["memory_error"]) for r in rows if r["mem_kind"] == "allocated"]
    assert by_kind["allocated"]["n"] == 2 and by_kind["allocated"]["oom_wrong"] == 1
    assert by_kind["allocated"]["mape"] == pytest.approx(sum(alloc) / 2)
    assert by_kind["reserved"]["n"] == 1 and by_kind["reserved"]["oom_wrong"] == 0
    assert by_kind["reserved"]["max_ape"] == pytest.approx(abs(next(r for r in rows
                                                                    if r["mem_kind"] == "reserved")["memory_error"]))


def test_memory_stats_by_hand() -> None:
    s = memory_stats([10.0, -20.0, 40.0], [False, True, False])
    assert s == {"n": 3, "mape": pytest.approx(70 / 3), "median_ape": 20.0, "max_ape": 40.0, "oom_wrong": 1}
    with pytest.raises(ValueError):
        memory_stats([1.0], [])


def test_measured_memory_never_guesses() -> None:
    assert tr.measured_memory(training_row(peak_mem_gib="")) is None
    assert tr.measured_memory(training_row(peak_mem_gib="not stated")) is None
    assert tr.measured_memory(training_row(peak_mem_gib="2.5", mem_kind="Reserved")) == (2.5, "reserved")
    assert tr.measured_memory(training_row(peak_mem_gib="2.5", mem_kind="unknown")) == (2.5, "unstated")
    smi = training_row(peak_mem_gib="2.5", mem_kind="unknown", notes="pynvml device used memory after training")
    assert tr.measured_memory(smi) == (2.5, "used")  # nvidia-smi 'used': reserved + the CUDA context
    assert "not a positive number" in str(tr.measured_memory(training_row(peak_mem_gib="lots")))
    assert "not a positive number" in str(tr.measured_memory(training_row(peak_mem_gib="0")))


def test_console_prints_the_memory_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path / "runs.csv", ROWS[:4])
    main(["validate", str(path), "--jobs", "1"])
    text = capsys.readouterr().out
    assert "memory (predicted peak of the measured rank's stage vs measured): n=3" in text
    assert "allocated: n=1" in text and "reserved: n=1" in text and "unstated: n=1" in text
    main(["validate", str(path), "--jobs", "1", "-q"])
    quiet = capsys.readouterr().out
    assert "memory: n=3 mape=" in quiet and "oom_wrong=0" in quiet


def test_no_memory_column_prints_no_memory_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "runs.csv"
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(BASE))
        w.writeheader()
        w.writerow(training_row())
    out = tmp_path / "v.json"
    main(["validate", str(path), "--jobs", "1", "--json", str(out)])
    assert "memory" not in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["summary"]["memory"] == {"n": 0, "mape": None, "median_ape": None, "max_ape": None, "oom_wrong": 0}
    assert data["summary"]["memory_by_kind"] == {} and "memory_error" not in data["rows"][0]


# --- which stage, which states (issue 22): mem_scope, the optimizer column, bf16-true, DDP bucket copies --------

@pytest.mark.parametrize(("scope", "stages", "stage"), [
    ("rank0", 4, 0), ("rank0 (global rank 0 = PP stage 0)", 4, 0), ("global rank 0", 2, 0),
    ("last global rank (rank world_size-1, which logs to TensorBoard)", 4, 3), ("last rank", 2, 1),
    ("", 4, None), ("max over ranks", 4, None), ("unknown", 3, None), ("last global rank", 1, 0), ("rank 5", 1, 0),
])
def test_memory_stage_reads_mem_scope(scope: str, stages: int, stage: int | None) -> None:
    assert tr.memory_stage(training_row(mem_scope=scope), stages) == stage


def test_memory_stage_refuses_a_scope_it_cannot_place() -> None:
    why = tr.memory_stage(training_row(mem_scope="rank 5 (TP rank 1)"), 4)
    assert isinstance(why, str) and "rank 5 (TP rank 1)" in why


def _memory_outcome() -> Outcome:
    """A fresh outcome of a memory-only row."""
    return Outcome(0, "x", MEMORY_METRIC)


def test_with_memory_compares_the_named_stage() -> None:
    peaks = [3 * GIB, 5 * GIB, 2 * GIB]
    for scope, gib, tag in (("rank0", 3.0, "pipeline stage 0 of 3"), ("last global rank", 2.0, "stage 2 of 3"),
                            ("", 5.0, "not stated: the fullest of 3")):
        row = training_row(peak_mem_gib="4", mem_kind="allocated", mem_scope=scope)
        out = tr.with_memory(_memory_outcome(), row, peaks, False)
        assert out.memory_predicted_gib == gib and out.memory_measured_gib == 4.0
        assert tag in out.tags["memory_scope"]
    out = tr.with_memory(_memory_outcome(), training_row(peak_mem_gib="4", mem_scope="rank 7"), peaks, True)
    assert out.memory_predicted_gib is None and out.oom_predicted is True
    assert out.tags["memory"].startswith("not compared: mem_scope = 'rank 7'")


def test_a_reserved_peak_stated_beside_the_allocated_one_is_compared_with_the_same_stage() -> None:
    peaks, reserved = [3 * GIB, 5 * GIB, 2 * GIB], [3.5 * GIB, 5.25 * GIB, 2.5 * GIB]
    note = "log_memory on rank 0: max_memory_allocated; peak reserved = 4.2 GiB; 20 steps"
    for scope, gib in (("rank0", 3.5), ("last global rank", 2.5), ("", 5.25)):  # unstated: the fullest stage's
        row = training_row(peak_mem_gib="4", mem_kind="allocated", mem_scope=scope, notes=note)
        out = tr.with_memory(_memory_outcome(), row, peaks, False, reserved)
        assert out.reserved_measured_gib == 4.2 and out.reserved_predicted_gib == gib
        assert out.reserved_error_pct == pytest.approx((gib - 4.2) / 4.2 * 100.0)
        assert out.memory_error_pct == pytest.approx((peaks[{"rank0": 0, "last global rank": 2, "": 1}[scope]]
                                                      / GIB - 4.0) / 4.0 * 100.0)  # its own figure unchanged
    plain = tr.with_memory(_memory_outcome(), training_row(peak_mem_gib="4", mem_kind="allocated"), peaks, False,
                           reserved)
    assert plain.reserved_measured_gib is None and plain.reserved_error_pct is None
    resv = tr.with_memory(_memory_outcome(), training_row(peak_mem_gib="4", mem_kind="reserved", mem_scope="rank0"),
                          peaks, False, reserved)  # a reserved row: its own figure is the reserved comparison
    assert resv.reserved_measured_gib is None and resv.reserved_error_pct == pytest.approx((3.5 - 4) / 4 * 100)


def test_reserved_summary_by_hand(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [training_row(case_id="both", peak_mem_gib="2.0", mem_kind="allocated", notes="peak reserved = 2.5 GiB"),
            training_row(case_id="resv", peak_mem_gib="3.0", mem_kind="reserved", micro_batch="1", global_batch="8"),
            training_row(case_id="alloc", peak_mem_gib="2.0", mem_kind="allocated")]
    path = tmp_path / "runs.csv"
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=[*COLUMNS, "notes"], restval="")
        w.writeheader()
        w.writerows(rows)
    out = tmp_path / "v.json"
    main(["validate", str(path), "--json", str(out), "--jobs", "1"])
    assert "reserved peaks (incl. those stated beside allocated): n=2" in capsys.readouterr().out
    data = json.loads(out.read_text())
    by_case = {r["case_id"]: r for r in data["rows"]}
    rj = tr.row_job(rows[0])
    assert not isinstance(rj, str), rj
    want = max(m.reserved_bytes for m in simulate(rj.job).memory) / GIB
    assert by_case["both"]["reserved_predicted_gib"] == pytest.approx(want, rel=1e-12)
    assert by_case["both"]["memory_error"] != by_case["both"]["reserved_error"]
    assert "reserved_error" not in by_case["alloc"] and "reserved_error" not in by_case["resv"]
    errors = [abs(by_case["both"]["reserved_error"]), abs(by_case["resv"]["memory_error"])]
    summary = data["summary"]["memory_reserved"]
    assert summary["n"] == 2 and summary["mape"] == pytest.approx(sum(errors) / 2)
    assert summary["max_ape"] == pytest.approx(max(errors))
    assert data["summary"]["memory"]["n"] == 3  # the overall figure counts each row's own figure once


def test_pipeline_row_compares_its_last_stage() -> None:
    row = training_row(pp="2", dp="4", peak_mem_gib="2", mem_kind="allocated", mem_scope="last global rank")
    rj = tr.row_job(row)
    assert not isinstance(rj, str), rj
    res = simulate(rj.job)
    assert len(res.memory) == 2 and res.memory[0].peak_bytes != res.memory[1].peak_bytes
    out = tr.with_memory(_memory_outcome(), row, res.peak_memory_bytes, False)
    assert out.memory_predicted_gib == pytest.approx(res.memory[1].peak_bytes / GIB, rel=1e-12)


@pytest.mark.parametrize(("cell", "simulation"), [
    ("AdamW", {}), ("Adam/AdamW (Megatron --optimizer adam, decoupled wd=1e-2)", {}),
    ("AdamW fused (torch), beta2 0.95, wd 0.01", {}),
    ("AdamW fused into backward (optimizer_in_bwd)", {"optimizer_in_backward": True}),
    ("bitsandbytes Adam8bit", {"optimizer": "adam_8bit"}),
    ("8-bit AdamW (implementation not stated) fused into backward (optimizer_in_bwd)",
     {"optimizer": "adam_8bit", "optimizer_in_backward": True}),
    ("Adafactor", {"optimizer": "adafactor"}), ("muon", {"optimizer": "muon"}),
])
def test_optimizer_column_maps_to_the_state_keys(cell: str, simulation: dict[str, Any]) -> None:
    rj = tr.row_job(training_row(optimizer=cell, dp="1", n_gpus="1", global_batch="2"))
    assert not isinstance(rj, str), rj
    assert rj.job["simulation"] == {"dtype": "bf16", **simulation}


@pytest.mark.parametrize(("cell", "reason"), [
    ("Shampoo", "trainsim prices Adam-style and factored states"), ("bitsandbytes PagedAdamW8bit", "unified memory"),
    ("SGD with momentum", "trainsim prices Adam-style and factored states"),
])
def test_optimizer_column_skips_what_it_cannot_price(cell: str, reason: str) -> None:
    why = tr.row_job(training_row(optimizer=cell))
    assert isinstance(why, str) and why.startswith("setting not expressible") and reason in why


def test_optimizer_column_absent_or_empty() -> None:
    rj = tr.row_job(training_row())
    assert not isinstance(rj, str) and "optimizer" not in rj.assumptions
    rj = tr.row_job(training_row(optimizer=""))
    assert not isinstance(rj, str) and rj.assumptions["optimizer"] == "not stated: Adam"
    why = tr.row_job(training_row(optimizer="AdamW", other_settings="8-bit AdamW"))
    assert isinstance(why, str) and "adam_8bit" in why  # the column and other_settings disagree
    rj = tr.row_job(training_row(other_settings="8-bit AdamW"))
    assert not isinstance(rj, str) and rj.job["simulation"]["optimizer"] == "adam_8bit"


def test_bf16_true_keeps_no_master_copy() -> None:
    for cell in ("bf16-true (bf16 params, grads and AdamW states)", "bf16 (full bf16 params, grads, optimizer states)"):
        rj = tr.row_job(training_row(precision=cell))
        assert not isinstance(rj, str) and rj.job["simulation"]["master_weights"] is False
    for cell in ("bf16", "bf16 (FSDP mixed_precision=PURE)", "fp16 AMP (fp32 master)"):
        rj = tr.row_job(training_row(precision=cell))
        assert not isinstance(rj, str) and "master_weights" not in rj.job["simulation"]


def test_lightning_ddp_holds_a_bucket_copy_unless_thunder_runs_it() -> None:
    lit = {"source": "Lightning-AI/litgpt Thunder extension benchmark", "sharding": "none (DDP)"}
    rj = tr.row_job(training_row(**lit, other_settings="compiler=Eager"))
    assert not isinstance(rj, str) and rj.job["simulation"]["grad_bucket_copy"] is True
    for row in (training_row(**lit, other_settings="compiler=Thunder"), training_row(**lit, dp="1", n_gpus="1",
                                                                                      global_batch="2"),
                training_row(**{**lit, "sharding": "FSDP FULL_SHARD"}), training_row(sharding="none (DDP)")):
        rj = tr.row_job(row)
        assert not isinstance(rj, str) and "grad_bucket_copy" not in rj.job["simulation"]


def test_llama_3_2_small_models_tie_their_embeddings() -> None:
    llama = "Llama (RMSNorm, SwiGLU, GQA, RoPE)"
    for name, tied in (("Llama 3.2 3B (Instruct)", True), ("meta-llama/Llama-3.2-1B", True),
                       ("Llama 3.1 8B", False), ("Llama 3.2 11B Vision", False)):
        rj = tr.row_job(training_row(model_name=name, arch=llama, ffn_hidden="1024", n_kv_heads="2"))
        assert not isinstance(rj, str) and rj.job["model"]["tied_embeddings"] is tied, name
        assert ("tied_embeddings" in rj.assumptions) == tied
    rj = tr.row_job(training_row(model_name="Llama 3.2 3B", arch=f"{llama}, untied embeddings", ffn_hidden="1024",
                                 n_kv_heads="2"))
    assert not isinstance(rj, str) and rj.job["model"]["tied_embeddings"] is False  # the arch text wins
