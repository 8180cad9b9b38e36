"""Routed load as an input (issue 23: 'load imbalance as a parameter whose default is the balanced routing the
benchmarks force'): model.moe_imbalance prices every rank as the busiest expert's, a capacity factor caps (or, with
padding, fixes) what an expert computes, model FLOPs stay the balanced ones, and rows map their capacity settings."""

from __future__ import annotations

from typing import Any

import pytest
from training_row import training_row

import trainsim
from trainsim.validate.moe_rows import moe_column_fields, moe_model_fields
from trainsim.workload.zoo import build_model

MOE = {"experts": 8, "top_k": 2}


def _ops(**features: Any) -> dict[str, Any]:
    m = build_model("custom", 4, 1024, "flash", {**MOE, **features}, layers=1, hidden=512, heads=8, ffn=1024)
    return {op.name: op for lay in m.layers for op in lay.ops}


@pytest.mark.parametrize(("features", "load"), [
    ({}, 1.0), ({"moe_imbalance": 1.5}, 1.5),
    ({"moe_imbalance": 1.5, "moe_capacity_factor": 1.25}, 1.25),  # dropped beyond the capacity
    ({"moe_imbalance": 1.1, "moe_capacity_factor": 1.25}, 1.1),  # under it: the load itself
    ({"moe_capacity_factor": 1.25, "moe_pad_to_capacity": True}, 1.25),  # padded: always the capacity
])
def test_the_busiest_expert_sets_the_work_and_the_balanced_one_the_model_flops(features: dict[str, Any],
                                                                            load: float) -> None:
    balanced, ops = _ops(), _ops(**features)
    mean = 4 * 1024 * 2 / 8  # tokens x top_k / experts
    assert ops["dispatch"].dims["c"] == round(mean * load)  # what crosses the all-to-all too
    ratio = ops["dispatch"].dims["c"] / mean  # the load in whole tokens
    assert ratio == pytest.approx(load, rel=1e-3)
    for name in ("expert_fc1", "expert_fc2"):
        assert ops[name].fwd_flops() == pytest.approx(balanced[name].fwd_flops() * ratio)
        assert ops[name].fwd_flops() * ops[name].useful == pytest.approx(balanced[name].fwd_flops())


def test_imbalance_slows_the_step_but_not_the_model_flops() -> None:
    job = {"model": {"name": "qwen3-30b-a3b", "layers": 4, "seq_len": 2048}, "cluster": {"name": "dgx-h100"},
           "strategy": {"ep": 8, "dp": 8, "global_batch": 16}}
    even = trainsim.simulate(job)
    skew = trainsim.simulate({**job, "model": {**job["model"], "moe_imbalance": 1.5}})
    assert skew.iteration_time_s > even.iteration_time_s and skew.breakdown["ep"] > even.breakdown["ep"]
    assert skew.model_flops == even.model_flops and skew.hw_flops > even.hw_flops and skew.mfu < even.mfu


@pytest.mark.parametrize(("model", "field"), [
    ({"name": "llama3-8b", "layers": 2, "moe_imbalance": 1.2}, "model.moe_imbalance"),  # no experts
    ({"name": "qwen3-30b-a3b", "layers": 2, "moe_pad_to_capacity": True}, "model.moe_pad_to_capacity"),
    ({"name": "qwen3-30b-a3b", "layers": 2, "moe_imbalance": 0.5}, "model.moe_imbalance"),  # below balanced
])
def test_load_keys_that_mean_nothing_are_refused(model: dict[str, Any], field: str) -> None:
    with pytest.raises(trainsim.ConfigError, match=rf"^{field}:"):
        trainsim.simulate({"model": model, "cluster": {"name": "dgx-h100"}})


def test_rows_map_their_capacity() -> None:
    got = moe_model_fields("num-experts=8; moe-expert-capacity-factor=1.25; moe-pad-expert-input-to-capacity=True",
                           "megatron_ci_golden")
    assert isinstance(got, dict) and (got["moe_capacity_factor"], got["moe_pad_to_capacity"]) == (1.25, True)
    dropless = moe_model_fields("num-experts=8", "megatron_ci_golden")
    assert isinstance(dropless, dict) and "moe_capacity_factor" not in dropless
    row = training_row(n_experts="256", top_k="8", moe_ffn_hidden="2048",
                       capacity_factor="token-drop, capacity factor 1.0 with padding (apply_moe_token_drop default)")
    cols = moe_column_fields(row)
    assert isinstance(cols, dict) and (cols["moe_capacity_factor"], cols["moe_pad_to_capacity"]) == (1.0, True)
    balanced = moe_column_fields({**row, "capacity_factor": "dropless; routing force-balanced for benchmark"})
    assert isinstance(balanced, dict) and "moe_capacity_factor" not in balanced and "moe_imbalance" not in balanced
