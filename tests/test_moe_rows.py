"""Megatron MoE rows that trainsim's MoE layer represents (every layer routed, no shared expert, expert TP =
tp, no MLA), the pass-through of model.experts / model.top_k, and the named reasons for the rest."""

from __future__ import annotations

import pytest
from training_row import training_row

import trainsim
from trainsim.errors import ConfigError
from trainsim.validate import training_runs as tr
from trainsim.validate.moe_rows import moe_model_fields
from trainsim.workload.zoo import build_model

MOE_ARCH = "MoE GPT (Megatron-Core test model; experts, router and attention kind in other_settings)"


def test_experts_and_top_k_reach_the_zoo_model() -> None:
    dense = build_model("custom", 4, 1024, "flash", {"mlp": "swiglu", "bias": False}, layers=2, hidden=512,
                        heads=8, ffn=1344, vocab=1000)
    moe = build_model("custom", 4, 1024, "flash", {"mlp": "swiglu", "bias": False, "experts": 4, "top_k": 1},
                      layers=2, hidden=512, heads=8, ffn=1344, vocab=1000)
    # per layer the one SwiGLU MLP (3 * 512 * 1344) becomes 4 experts of it plus a 4 x 512 router
    assert moe.params - dense.params == 2 * (3 * 3 * 512 * 1344 + 4 * 512)
    assert moe.hyper["experts"] == 4 and moe.hyper["top_k"] == 1


@pytest.mark.parametrize("model", [{"top_k": 2}, {"experts": 4, "top_k": 8}])
def test_top_k_needs_enough_experts(model: dict[str, int]) -> None:
    job = {"model": {"name": "custom", "layers": 2, "hidden": 512, "heads": 8, **model},
           "cluster": {"name": "dgx-h100", "nodes": 1}}
    with pytest.raises(ConfigError, match=r"^model\.top_k:"):
        trainsim.simulate(job)


def test_fields_from_megatron_flags() -> None:
    mlm = "Megatron-LM CI"
    assert moe_model_fields("num-experts=8; moe-router-topk=2; moe-ffn-hidden-size=1024", 1, mlm) == {
        "experts": 8, "top_k": 2, "ffn": 1024}
    assert moe_model_fields("num-experts=4", 2, mlm) == {"experts": 4, "top_k": 2}  # Megatron's default top-k
    assert moe_model_fields("num-experts=4; expert-tensor-parallel-size=2", 2, mlm) == {"experts": 4, "top_k": 2}


def test_only_megatron_flags_map() -> None:
    """Another framework's defaults (top-k, expert TP) are not Megatron's: its MoE rows keep a named skip."""
    assert "only Megatron-Core" in str(moe_model_fields("num-experts=8", 1, "torchtitan"))
    assert "only Megatron-Core" in str(moe_model_fields("", 1, "Megatron-LM"))  # experts not in the flags


@pytest.mark.parametrize(("settings", "reason"), [
    ("num-experts=8; moe-shared-expert-intermediate-size=512", "shared expert"),
    ("num-experts=8; moe-layer-freq=([0]*1+[1]*3)", "dense and MoE layers mixed"),
    ("num-experts=8; multi-latent-attention=True", "multi-latent attention"),
    ("num-experts=8; expert-tensor-parallel-size=1", "expert tensor parallelism 1 differs from tp 2"),
])
def test_unrepresentable_moe_is_named(settings: str, reason: str) -> None:
    got = moe_model_fields(settings, 2, "megatron_ci_golden")
    assert isinstance(got, str) and reason in got


def _moe_row(settings: str, **columns: str) -> dict[str, str]:
    return training_row(source_group="megatron_ci_golden", arch=MOE_ARCH, n_layers="4", hidden="512",
                        n_heads="8", ffn_hidden="2048", other_settings=settings, **columns)


def test_validate_maps_an_every_layer_moe_row() -> None:
    rj = tr.row_job(_moe_row("num-experts=8; moe-router-topk=2; moe-ffn-hidden-size=1024; moe-grouped-gemm=True; "
                             "moe-token-dispatcher-type=alltoall", n_gpus="8", dp="8", ep="4"))
    assert not isinstance(rj, str), rj
    assert (rj.job["model"]["experts"], rj.job["model"]["top_k"], rj.job["model"]["ffn"]) == (8, 2, 1024)
    assert rj.job["strategy"]["ep"] == 4
    assert "alltoall" in rj.assumptions["mixture_of_experts"]
    assert trainsim.simulate(rj.job).iteration_time_s > 0


def test_validate_skips_a_shared_expert_row_with_its_reason() -> None:
    got = tr.row_job(_moe_row("num-experts=8; moe-shared-expert-intermediate-size=512"))
    assert isinstance(got, str) and got.startswith(tr.MOE) and "shared expert" in got
