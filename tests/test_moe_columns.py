"""Issue 23, first pieces: Qwen3's attention (head_size wider than hidden / heads, QK-norm) against the published
parameter counts, moe_runs.csv's expert columns mapped to the model keys (and the named reasons for what is not
modelled yet), its rows compared on tokens/s, and NVL72 racks holding jobs larger than one rack."""

from __future__ import annotations

from typing import Any

import pytest
from training_row import training_row

import trainsim
from trainsim.validate import training_runs as tr
from trainsim.validate.moe_rows import moe_column_fields
from trainsim.workload.zoo import build_model

QWEN3 = {"experts": 128, "top_k": 8, "head_size": 128, "qk_norm": True}


@pytest.mark.parametrize(("dims", "width", "params"), [
    # Hugging Face Qwen/Qwen3-30B-A3B and Qwen/Qwen3-235B-A22B safetensors totals
    ({"layers": 48, "hidden": 2048, "heads": 32, "kv_heads": 4}, 768, 30_532_122_624),
    ({"layers": 94, "hidden": 4096, "heads": 64, "kv_heads": 4}, 1536, 235_093_634_560),
])
def test_qwen3_moe_parameters_equal_the_published_checkpoints(dims: dict[str, int], width: int, params: int) -> None:
    m = build_model("llama3-8b", 1, 4096, "flash", {**QWEN3, "expert_ffn": width}, ffn=width, vocab=151936, **dims)
    assert m.params == params


def test_head_size_and_qk_norm_by_hand() -> None:
    base = {"mlp": "swiglu", "bias": False, "norm": "rmsnorm"}
    dims = {"layers": 3, "hidden": 512, "heads": 8, "kv_heads": 2, "ffn": 1024, "vocab": 1000}
    plain = build_model("custom", 1, 256, "flash", base, **dims)
    wide = build_model("custom", 1, 256, "flash", {**base, "head_size": 128}, **dims)
    normed = build_model("custom", 1, 256, "flash", {**base, "head_size": 128, "qk_norm": True}, **dims)
    # q and o grow from 8 x 64 to 8 x 128 columns, k and v from 2 x 64 to 2 x 128 (per layer)
    assert wide.params - plain.params == 3 * (2 * 512 * 8 * 64 + 2 * 512 * 2 * 64)
    assert normed.params - wide.params == 3 * 2 * 128  # one head_dim weight for q_norm, one for k_norm
    layer = next(lay for lay in normed.layers if any(op.name == "qk_norm" for op in lay.ops))
    qk = next(op for op in layer.ops if op.name == "qk_norm")
    # it reads the q and k heads only: (8 + 2) of the (8 + 2 x 2) heads of the QKV output
    saved = qk.saved[0]
    assert saved.bytes_per_elem == pytest.approx(2.0 * 10 / 12)
    assert qk.traffic == pytest.approx(10 / 12)


def test_model_keys_reach_the_job() -> None:
    job = {"model": {"name": "custom", "layers": 2, "hidden": 512, "heads": 8, "head_size": 96, "qk_norm": True},
           "cluster": {"name": "dgx-h100", "nodes": 1}, "strategy": {"global_batch": 8}}
    plain = {**job, "model": {k: v for k, v in job["model"].items() if k not in ("head_size", "qk_norm")}}
    assert trainsim.simulate(job).model_params > trainsim.simulate(plain).model_params


def _moe_row(**cells: str) -> dict[str, str]:
    base = {"n_experts": "128", "top_k": "8", "moe_ffn_hidden": "768", "n_shared_experts": "0", "first_k_dense": "0",
            "moe_layer_freq": "1 (all layers MoE)", "attention": "GQA (qk-layernorm)", "etp": "1"}
    return {**base, **cells}


@pytest.mark.parametrize(("cells", "tp", "want"), [
    ({}, 1, {"experts": 128, "top_k": 8, "expert_ffn": 768}),
    ({"n_shared_experts": "1", "moe_ffn_hidden": "2048", "first_k_dense": "3", "moe_layer_freq": "[0]*3+[1]*58",
      "attention": "GQA"}, 1, {"experts": 128, "top_k": 8, "expert_ffn": 2048, "shared_expert_ffn": 2048,
                                "first_dense_layers": 3}),
    ({"etp": "2"}, 2, {"experts": 128, "top_k": 8, "expert_ffn": 768}),
])
def test_expert_columns_map_to_model_keys(cells: dict[str, str], tp: int, want: dict[str, Any]) -> None:
    assert moe_column_fields(_moe_row(**cells), tp) == want


@pytest.mark.parametrize(("cells", "tp", "reason"), [
    ({"attention": "MLA (qk_nope=128, qk_rope=64, v_head=128)"}, 1, "multi-latent attention"),
    ({"attention": "GQA, alternating sliding-window(128)/full attention"}, 1, "sliding-window"),
    ({"moe_layer_freq": "hybrid pattern MEMEM*EMEMEM*EM"}, 1, "Mamba2"),
    ({"etp": "1"}, 2, "expert tensor parallelism 1 differs from tp 2"),
    ({"etp": ""}, 2, "not stated with tp 2"),
    ({"moe_layer_freq": "[0]*2+[1]*10"}, 1, "disagrees with first_k_dense 0"),
    ({"top_k": ""}, 1, "top_k or moe_ffn_hidden not stated"),
])
def test_what_the_moe_layer_cannot_represent_is_named(cells: dict[str, str], tp: int, reason: str) -> None:
    got = moe_column_fields(_moe_row(**cells), tp)
    assert isinstance(got, str) and reason in got


def test_a_row_without_expert_columns_is_left_to_its_settings() -> None:
    assert moe_column_fields({"n_experts": ""}, 1) is None
    assert moe_column_fields({}, 1) is None


QWEN3_ROW = dict(
    model_name="Qwen3-30B-A3B", arch="MoE (GQA (qk-layernorm); 128 routed + 0 shared experts, top-8)",
    n_layers="48", hidden="2048", n_heads="32", n_kv_heads="4", ffn_hidden="", seq_len="4096", vocab="151936",
    head_dim="128", gpu="GB300 (DGX GB300 NVL72)", gpu_mem_gb="288", n_gpus="8", gpus_per_node="4", dp="8",
    tp="1", pp="1", cp="1", ep="8", micro_batch="8", global_batch="512", precision="MXFP8 (1x32 block scaling)",
    iter_time_s="", tflops_per_gpu="1029", tokens_per_s_per_gpu="44544", token_dispatcher="flex (hybridep)",
    sharding="distributed optimizer", **_moe_row())


def test_a_moe_runs_row_maps_to_qwen3_and_is_compared_on_tokens_per_second() -> None:
    rj = tr.row_job(training_row(**QWEN3_ROW))
    assert not isinstance(rj, str), rj
    model = rj.job["model"]
    assert {k: model[k] for k in ("experts", "top_k", "expert_ffn", "head_size", "qk_norm", "ffn")} == {
        "experts": 128, "top_k": 8, "expert_ffn": 768, "head_size": 128, "qk_norm": True, "ffn": 768}
    assert rj.job["simulation"]["dtype"] == "fp8" and "block-scaled" in rj.assumptions["precision"]
    assert rj.job["cluster"]["name"] == "gb300-nvl72" and rj.job["cluster"]["gpus_per_node"] == 8
    # the moe_runs format (expert columns) prefers the convention-free tokens/s to the framework's TFLOP/s
    assert (rj.metric, rj.measured) == ("tokens_per_s_per_gpu", 44544.0)
    measured = {"iter_time_s": "", "tflops_per_gpu": "1029", "tokens_per_s_per_gpu": "44544"}
    assert tr._measured(measured) == ("tflops_per_gpu", 1029.0)  # training_runs.csv's order, unchanged
    assert tr._measured({**measured, "moe_ffn_hidden": ""}) == ("tokens_per_s_per_gpu", 44544.0)


@pytest.mark.parametrize(("n_gpus", "per_rack"), [(256, 64), (144, 72), (72, 72), (8, 8), (1024, 64)])
def test_nvl72_jobs_spread_over_the_fewest_even_racks(n_gpus: int, per_rack: int) -> None:
    notes: dict[str, str] = {}
    cl = tr._cluster(training_row(gpu="GB200 (DGX GB200 NVL72)", n_gpus=str(n_gpus), gpus_per_node="4"),
                     n_gpus, notes)
    assert isinstance(cl, dict)
    assert cl["gpus_per_node"] == per_rack and cl["nodes"] * per_rack == n_gpus
    assert ("nvlink_domain" in notes) == (per_rack < 72 and n_gpus > 72)
