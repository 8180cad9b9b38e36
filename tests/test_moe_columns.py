"""Issue 23, first pieces: Qwen3's attention (head_size wider than hidden / heads, QK-norm) against the published
parameter counts, moe_runs.csv's expert columns mapped to the model keys (and the named reasons for what is not
modelled yet), its rows compared on tokens/s, and NVL72 racks holding jobs larger than one rack."""

from __future__ import annotations

import math
from pathlib import Path
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


@pytest.mark.parametrize(("cells", "want"), [
    ({}, {"experts": 128, "top_k": 8, "expert_ffn": 768}),
    ({"n_shared_experts": "1", "moe_ffn_hidden": "2048", "first_k_dense": "3", "moe_layer_freq": "[0]*3+[1]*58",
      "attention": "GQA"}, {"experts": 128, "top_k": 8, "expert_ffn": 2048, "shared_expert_ffn": 2048,
                             "first_dense_layers": 3}),
])
def test_expert_columns_map_to_model_keys(cells: dict[str, str], want: dict[str, Any]) -> None:
    assert moe_column_fields(_moe_row(**cells)) == want


@pytest.mark.parametrize(("cells", "reason"), [
    ({"attention": "MLA (qk_nope=128, qk_rope=64, v_head=128)"}, "kv_lora_rank"),
    ({"attention": "GQA, alternating sliding-window/full attention"}, "without its window size"),
    ({"moe_layer_freq": "hybrid pattern MEMEM*EMEMEM*EM"}, "Mamba2"),
    ({"moe_layer_freq": "[0]*2+[1]*10"}, "disagrees with first_k_dense 0"),
    ({"top_k": ""}, "top_k or moe_ffn_hidden not stated"),
])
def test_what_the_moe_layer_cannot_represent_is_named(cells: dict[str, str], reason: str) -> None:
    got = moe_column_fields(_moe_row(**cells))
    assert isinstance(got, str) and reason in got


def test_a_row_without_expert_columns_is_left_to_its_settings() -> None:
    assert moe_column_fields({"n_experts": ""}) is None
    assert moe_column_fields({}) is None


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
    cl = tr.cluster_spec(training_row(gpu="GB200 (DGX GB200 NVL72)", n_gpus=str(n_gpus), gpus_per_node="4"),
                     n_gpus, notes)
    assert isinstance(cl, dict)
    assert cl["gpus_per_node"] == per_rack and cl["nodes"] * per_rack == n_gpus
    assert ("nvlink_domain" in notes) == (per_rack < 72 and n_gpus > 72)


DEEPSEEK_V3 = {"experts": 256, "top_k": 8, "expert_ffn": 2048, "shared_expert_ffn": 2048, "first_dense_layers": 3,
               "head_size": 192, "qk_rope_dim": 64, "v_head_size": 128, "kv_lora_rank": 512, "q_lora_rank": 1536}
DEEPSEEK_DIMS = {"layers": 61, "hidden": 7168, "heads": 128, "kv_heads": 128, "ffn": 18432, "vocab": 129280}


def test_deepseek_v3_counts_671b_parameters_and_37b_active() -> None:
    """The DeepSeek-V3 report (arXiv:2412.19437): 671B total parameters, 37B activated per token (the main model;
    its multi-token-prediction module is not counted in either)."""
    m = build_model("llama3-8b", 1, 4096, "flash", DEEPSEEK_V3, **DEEPSEEK_DIMS)
    assert m.params == pytest.approx(671e9, rel=0.01)
    # active counts the embedding and the head, as Mistral's 12.9B for Mixtral and Qwen's 3.3B for Qwen3-30B-A3B
    # do; DeepSeek's rounded 37B sits 1.5% under that count (37.55B)
    assert m.active_params == pytest.approx(37e9, rel=0.02)
    assert build_model("mixtral-8x7b", 1).active_params == pytest.approx(12.9e9, rel=0.01)
    dense = build_model("llama3-8b", 1)
    assert dense.active_params == dense.params


def test_mla_attention_by_hand() -> None:
    """One MLA layer's attention parameters and FLOPs, by the formulas of DeepSeek-V2 sec. 2.1."""
    h, a, ql, kc, rope, dq, dv = 1024, 8, 256, 128, 32, 96, 64
    feats = {"mlp": "swiglu", "bias": False, "norm": "rmsnorm", "kv_lora_rank": kc, "q_lora_rank": ql,
             "head_size": dq, "qk_rope_dim": rope, "v_head_size": dv}
    b, s = 2, 512
    m = build_model("custom", b, s, "flash", feats, layers=1, hidden=h, heads=a, ffn=2048, vocab=1000)
    ops = {op.name: op for lay in m.layers for op in lay.ops}
    assert ops["q_down"].params == h * ql and ops["q_up"].params == ql * a * dq
    assert ops["kv_down"].params == h * (kc + rope) and ops["kv_up"].params == kc * a * (dq - rope + dv)
    assert ops["q_norm"].params == ql and ops["kv_norm"].params == kc and ops["proj"].params == a * dv * h
    # scores over dq, values over dv (before the causal halving the cost model applies)
    assert ops["attention"].fwd_flops() == pytest.approx(2 * b * a * s * s * (dq + dv))
    assert not ops["kv_down"].saved  # it reads the layer input that q_down keeps


def test_mla_splits_its_heads_over_tp() -> None:
    model = {"name": "custom", "layers": 2, "hidden": 1024, "heads": 8, "ffn": 2048, "vocab": 1000,
             "kv_lora_rank": 128, "q_lora_rank": 256, "head_size": 96, "qk_rope_dim": 32, "v_head_size": 64}
    job = {"model": model, "cluster": {"name": "dgx-h100", "nodes": 1}}
    one = trainsim.simulate({**job, "strategy": {"global_batch": 8, "tp": 1}})
    two = trainsim.simulate({**job, "strategy": {"global_batch": 8, "tp": 2}})
    assert one.model_params == two.model_params and two.breakdown["tp"] > 0
    unfused = trainsim.simulate({**job, "model": {**model, "attention": "unfused"}, "strategy": {"global_batch": 8}})
    assert unfused.model_params == one.model_params and max(unfused.peak_memory_bytes) > max(one.peak_memory_bytes)


@pytest.mark.parametrize("dropout", [False, True])
def test_unfused_mla_keeps_what_its_backward_reads_by_hand(dropout: bool) -> None:
    """The unfused chain: scores keep each head's query and key (head_size each, the rope key copied into every
    head), the softmax its probabilities, the context the values (v_head_size each) and, only behind a dropout,
    the dropped probabilities as a tensor of their own (autograd saves the softmax's output once)."""
    h, a, ql, kc, rope, dq, dv, b, s = 512, 8, 192, 64, 8, 24, 16, 2, 256
    feats = {"kv_lora_rank": kc, "q_lora_rank": ql, "head_size": dq, "qk_rope_dim": rope, "v_head_size": dv,
             "dropout": dropout}
    m = build_model("custom", b, s, "unfused", feats, layers=1, hidden=h, heads=a, ffn=2048, vocab=1000)
    ops = {op.name: op for lay in m.layers for op in lay.ops}
    assert "attention" not in ops

    def kept(name: str) -> float:
        op = ops[name]
        return sum(math.prod(op.dims[d] for d in t.dims) * t.bytes_per_elem for t in op.saved)

    assert kept("scores") == pytest.approx(2 * b * s * a * dq * 2)  # queries and keys, BF16
    assert kept("softmax") == pytest.approx(2 * b * a * s * s)
    assert kept("context") == pytest.approx(2 * b * s * a * dv + (2 * b * a * s * s if dropout else 0))
    assert ops["scores"].fwd_flops() + ops["context"].fwd_flops() == pytest.approx(2 * b * a * s * s * (dq + dv))
    assert ("attn_dropout" in ops) == dropout


def test_unfused_attention_keeps_the_probabilities_once_without_dropout() -> None:
    """Without attention dropout the context GEMM reads the softmax's output: one (a x s x t) tensor per layer."""
    job = {"model": {"name": "custom", "layers": 2, "hidden": 1024, "heads": 32, "ffn": 4096, "seq_len": 4096,
                     "dropout": False},
           "cluster": {"name": "dgx-h100", "nodes": 1},
           "strategy": {"dp": 4, "tp": 2, "micro_batch": 4, "global_batch": 16, "sequence_parallel": True}}

    def per_layer(attention: str) -> float:
        peaks = []
        for layers in (2, 4):
            r = trainsim.simulate({**job, "model": {**job["model"], "layers": layers, "attention": attention}})
            peaks.append(r.memory[0].activation_peak_bytes)
        return (peaks[1] - peaks[0]) / 2

    probs = 4 * 16 * 4096 * 4096 * 2  # micro-batch 4, 32 heads over tp 2, BF16
    assert per_layer("unfused") - per_layer("flash") == pytest.approx(probs, rel=0.05)


def test_megatron_mla_flags_map() -> None:
    """--multi-latent-attention with its sizes (a Megatron CI row): head_size = qk-head-dim + qk-pos-emb-head-dim;
    the size flags alone are inert, as in Megatron."""
    flags = ("multi-latent-attention=True; q-lora-rank=192; kv-lora-rank=64; qk-head-dim=16; qk-pos-emb-head-dim=8; "
             "v-head-dim=16; kv-channels=128")
    rj = tr.row_job(training_row(other_settings=flags))
    assert not isinstance(rj, str), rj
    got = {k: rj.job["model"][k] for k in ("kv_lora_rank", "q_lora_rank", "head_size", "qk_rope_dim", "v_head_size")}
    assert got == {"kv_lora_rank": 64, "q_lora_rank": 192, "head_size": 24, "qk_rope_dim": 8, "v_head_size": 16}
    partial = tr.row_job(training_row(other_settings="multi-latent-attention=True; kv-lora-rank=64"))
    assert not isinstance(partial, str) and partial.job["model"]["head_size"] == 128 + 64
    assert "not stated" in partial.assumptions["mla"]
    inert = tr.row_job(training_row(other_settings="kv-lora-rank=64"))
    assert not isinstance(inert, str) and "kv_lora_rank" not in inert.job["model"]


def test_an_mla_row_reads_its_head_sizes_and_ranks() -> None:
    row = _moe_row(attention="MLA (qk_nope=128, qk_rope=64, v_head=128; no GQA)", kv_lora_rank="512",
                   q_lora_rank="1536", n_experts="256", moe_ffn_hidden="2048", n_shared_experts="1",
                   first_k_dense="3", moe_layer_freq="[0]*3+[1]*58")
    got = moe_column_fields(row)
    assert isinstance(got, dict)
    assert {k: got[k] for k in ("kv_lora_rank", "q_lora_rank", "head_size", "qk_rope_dim", "v_head_size")} == {
        "kv_lora_rank": 512, "q_lora_rank": 1536, "head_size": 192, "qk_rope_dim": 64, "v_head_size": 128}
    missing = moe_column_fields({**row, "kv_lora_rank": ""})
    assert isinstance(missing, str) and "kv_lora_rank" in missing


def test_the_result_reports_active_parameters() -> None:
    r = trainsim.simulate({"model": {"name": "mixtral-8x7b"}, "cluster": {"name": "dgx-h100", "nodes": 1},
                           "strategy": {"global_batch": 8, "tp": 8}})
    assert r.to_json()["active_params"] == r.active_params < r.model_params


def test_sliding_window_score_share_by_hand() -> None:
    """A causal t x t score matrix: half of it; a window of w keys: t*w - w(w-1)/2 of its entries."""
    from trainsim.cost.compute import attention_score_share
    from trainsim.workload.ir import Op, OpKind

    def op(window: int, causal: bool = True) -> Op:
        return Op("attention", OpKind.ATTENTION, {"b": 1, "s": 8, "t": 8}, (("b", "s"),), ("b", "s"),
                  causal=causal, window=window)

    local = {"s": 8, "t": 8}
    assert attention_score_share(op(0), local) == 0.5
    assert attention_score_share(op(0, causal=False), local) == 1.0
    assert attention_score_share(op(8), local) == 0.5  # a window as long as the sequence changes nothing
    assert attention_score_share(op(3), local) == pytest.approx((8 * 3 - 3) / 64)  # rows see 1, 2, 3, 3, ... keys


def test_gpt_oss_alternates_windowed_and_full_blocks() -> None:
    """gpt-oss-120b (OpenAI's model card: 116.8B parameters): 36 blocks, every other one from the first on a
    128-key window, a sink logit per head; the windowed blocks' attention is the cheaper."""
    feats = {"experts": 128, "top_k": 4, "expert_ffn": 2880, "head_size": 64, "sliding_window": 128,
             "window_layers": "alternate", "attention_sinks": True, "bias": True}
    m = build_model("llama3-8b", 1, 4096, "flash", feats, layers=36, hidden=2880, heads=64, kv_heads=8, ffn=2880,
                    vocab=201088)
    assert m.params == pytest.approx(116.8e9, rel=0.01)
    blocks = [lay for lay in m.layers if lay.kind == "transformer"]
    windows = [next(op for op in lay.ops if op.name == "attention").window for lay in blocks]
    assert windows == [128, 0] * 18
    plain = build_model("llama3-8b", 1, 4096, "flash", {**feats, "attention_sinks": False}, layers=36, hidden=2880,
                        heads=64, kv_heads=8, ffn=2880, vocab=201088)
    assert m.params - plain.params == 36 * 64
    job = {"model": {"name": "custom", "layers": 2, "hidden": 1024, "heads": 8, "seq_len": 8192},
           "cluster": {"name": "dgx-h100", "nodes": 1}, "strategy": {"global_batch": 8}}
    full = trainsim.simulate(job)
    windowed = trainsim.simulate({**job, "model": {**job["model"], "sliding_window": 512}})
    assert windowed.iteration_time_s < full.iteration_time_s


def test_a_gpt_oss_row_maps_its_window_and_sinks() -> None:
    row = _moe_row(attention="GQA, alternating sliding-window(128)/full attention, learnable softmax sinks",
                   top_k="4", moe_ffn_hidden="2880")
    got = moe_column_fields(row)
    assert isinstance(got, dict)
    assert (got["sliding_window"], got["window_layers"], got["attention_sinks"]) == (128, "alternate", True)
    assert moe_column_fields({**row, "attention": "GQA, sliding-window attention"}) == \
        "sliding-window attention without its window size"


def test_mtp_modules_add_a_block_and_a_projection_on_the_last_stage() -> None:
    """DeepSeek-V3's MTP module (its report, sec. 2.2): one more block, a 2h -> h projection and two norms, the
    embedding and output head shared with the main model (so not counted again)."""
    feats = {"mlp": "swiglu", "bias": False, "norm": "rmsnorm", "tied_embeddings": False}
    dims = {"layers": 4, "hidden": 512, "heads": 8, "ffn": 1024, "vocab": 1000}
    plain = build_model("custom", 1, 256, "flash", feats, **dims)
    mtp = build_model("custom", 1, 256, "flash", {**feats, "mtp_layers": 1}, **dims)
    block = next(lay for lay in plain.layers if lay.kind == "transformer").params
    assert mtp.params - plain.params == block + 2 * 512 * 512 + 2 * 512 + 512  # block, eh_proj, 2 norms, final norm
    names = [lay.name for lay in mtp.layers]
    assert names[-3:] == ["mtp.0.embed", "mtp.0", "head"]
    job = {"model": {"name": "custom", **dims, **feats}, "cluster": {"name": "dgx-h100", "nodes": 1},
           "strategy": {"global_batch": 16, "pp": 2, "dp": 4}}
    base = trainsim.simulate(job)
    more = trainsim.simulate({**job, "model": {**job["model"], "mtp_layers": 1}})
    # the MTP module lives on the last stage: its memory grows, the first stage's does not
    assert more.memory[0].peak_bytes == pytest.approx(base.memory[0].peak_bytes)
    assert more.memory[-1].peak_bytes > base.memory[-1].peak_bytes
    assert more.iteration_time_s > base.iteration_time_s


@pytest.mark.parametrize(("text", "want"), [
    ("et*4|(t*4|)*14tml", "etttt|" + "tttt|" * 14 + "tml"),
    ("et*2|(t*2|)*2tml", "ett|tt|tt|tml"),
    ("e|t*3|t*3l", "e|ttt|tttl"),
])
def test_megatron_pipeline_layouts_expand(text: str, want: str) -> None:
    assert tr._expand_layout(text) == want


def test_a_pipeline_layout_gives_the_layers_per_chunk() -> None:
    notes: dict[str, str] = {}
    assert tr._layout_split("etttt|tttt|tttt|tml", 13, 1, 4, 1, notes) == [4, 4, 4, 1]
    assert "layers per chunk" in notes["stage_layers"]
    for layout, layers, mtp, pp, why in (("ett|ttl", 4, 0, 3, "chunks for pp"), ("ett|tml", 4, 0, 2, "multi-token-prediction"),
                                         ("ett|ttl", 5, 0, 2, "the model has 5"), ("tt|ettl", 4, 0, 2, "embedding")):
        with pytest.raises(tr.RowSkip, match=why):
            tr._layout_split(layout, layers, mtp, pp, 1, {})


def test_mtp_and_layout_settings_map() -> None:
    st = tr._settings("MTP: recipe default mtp_num_layers=1 (not stated in table); pp_layout=Et*2|(t*2|)*2tmL")
    assert st.features["mtp_layers"] == 1 and st.layout == "ett|tt|tt|tml"
    assert tr._settings("mtp-num-layers=2").features["mtp_layers"] == 2
    assert "mtp_layers" not in tr._settings("MTP disabled").features
    rj = tr.row_job(training_row(other_settings="mtp-num-layers=1", pp="2", dp="4"))  # a dense GPT with an MTP
    assert not isinstance(rj, str) and rj.job["model"]["mtp_layers"] == 1
    laid = tr.row_job(training_row(other_settings="pp_layout=Et*2|t*2mL", pp="2", dp="4"))  # m: an MTP module
    assert not isinstance(laid, str), laid
    assert laid.job["model"]["mtp_layers"] == 1 and laid.job["strategy"]["stage_layers"] == [2, 2]
    # a layout of more chunks than stages, vpp unstated: Megatron's virtual stages come from the layout
    chunked = tr.row_job(training_row(other_settings="pp_layout=Et|(t|)*2tL", pp="2", dp="4", global_batch="32"))
    assert not isinstance(chunked, str), chunked
    assert chunked.job["strategy"]["vpp"] == 2 and chunked.job["strategy"]["stage_layers"] == [1, 1, 1, 1]


def test_recompute_plans_by_module() -> None:
    """What each of Megatron's recompute modules re-runs and stops keeping, on a MoE block with a shared expert."""
    from trainsim.compile.recompute import recompute_plan

    m = build_model("custom", 2, 256, "flash", {"mlp": "swiglu", "bias": False, "experts": 4, "top_k": 2,
                                                "shared_expert_ffn": 512}, layers=1, hidden=256, heads=4, ffn=512)
    ops = next(lay for lay in m.layers if lay.kind == "transformer").ops
    act = recompute_plan(ops, frozenset({"moe_act"}))
    assert act.rerun == {"expert_act"} and act.dropped == {("expert_fc2", "input")}
    assert act.remakes == {"expert_act": (("expert_fc2", "input"),)}  # remade by the re-run activation
    norms = recompute_plan(ops, frozenset({"layernorm"}))
    assert norms.rerun == {"ln1", "ln2"} and norms.dropped == {("qkv", "input"), ("router", "input")}
    core = recompute_plan(ops, frozenset({"core_attn"}))
    assert core.rerun == {"attention"} and core.dropped == {("attention", "lse")}
    moe = recompute_plan(ops, frozenset({"moe"}))
    assert ("router", "input") not in moe.dropped and ("expert_fc1", "input") in moe.dropped  # the input stays
    assert recompute_plan(ops, frozenset({"mla_up_proj"})).rerun == frozenset()  # no MLA in this block


def test_recompute_modules_trade_memory_for_time() -> None:
    job = {"model": {"name": "custom", "layers": 4, "hidden": 1024, "heads": 8, "mlp": "swiglu", "bias": False,
                     "experts": 8, "top_k": 2, "seq_len": 2048},
           "cluster": {"name": "dgx-h100", "nodes": 1}, "strategy": {"global_batch": 16, "ep": 8, "dp": 8}}

    def run(recompute: str, modules: list[str] | None = None) -> tuple[float, float]:
        strategy = {**job["strategy"], "recompute": recompute, **({"recompute_modules": modules} if modules else {})}
        r = trainsim.simulate({**job, "strategy": strategy})
        return r.iteration_time_s, max(r.peak_memory_bytes)

    none, core, act, moe, full = (run("none"), run("selective"), run("selective", ["moe_act"]),
                                  run("selective", ["moe"]), run("full"))
    assert run("selective", ["core_attn"]) == core  # the attention core is what selective has always meant
    assert none[1] > act[1] > moe[1] > full[1]  # each drops more of what the block keeps
    assert none[0] < act[0] < moe[0] < full[0]  # and re-runs more of it
    with pytest.raises(trainsim.ConfigError, match=r"^strategy\.recompute_modules:"):
        trainsim.simulate({**job, "strategy": {**job["strategy"], "recompute_modules": ["moe_act"]}})


def test_a_row_naming_recompute_modules_maps_them() -> None:
    rj = tr.row_job(training_row(recompute="selective: layernorm,moe_act", **{k: v for k, v in QWEN3_ROW.items()
                                                                            if k != "recompute"}))
    assert not isinstance(rj, str), rj
    assert rj.job["strategy"]["recompute"] == "selective"
    assert rj.job["strategy"]["recompute_modules"] == ["layernorm", "moe_act"]
    why = tr.row_job(training_row(recompute="selective: attention_projection"))
    assert isinstance(why, str) and "attention_projection" in why


@pytest.mark.parametrize(("model", "field"), [
    ({"q_lora_rank": 64}, "model.q_lora_rank"),  # MLA keys without kv_lora_rank
    ({"kv_lora_rank": 64, "head_size": 64, "qk_rope_dim": 64}, "model.qk_rope_dim"),
    ({"kv_lora_rank": 64, "head_size": 96, "qk_rope_dim": 32, "qk_norm": True}, "model.qk_norm"),
    ({"kv_lora_rank": 64, "head_size": 96, "qk_rope_dim": 32, "sliding_window": 128}, "model.sliding_window"),
    ({"window_layers": "every_third"}, "model.window_layers"),
])
def test_attention_keys_that_do_not_fit_are_refused(model: dict[str, Any], field: str) -> None:
    job = {"model": {"name": "custom", "layers": 2, "hidden": 512, "heads": 8, **model},
           "cluster": {"name": "dgx-h100", "nodes": 1}}
    with pytest.raises(trainsim.ConfigError, match=rf"^{field.replace('.', '[.]')}:"):
        trainsim.simulate(job)


def test_a_moe_runs_row_without_its_expert_columns_says_so() -> None:
    row = training_row(**{**QWEN3_ROW, "n_experts": "", "top_k": "", "moe_ffn_hidden": ""})
    why = tr.row_job(row)
    assert isinstance(why, str) and "architecture not stated" in why


def test_expert_tensor_parallelism_folds_whole_experts_over_tp_and_ep() -> None:
    """Megatron's MoE parallel folding: with etp 1 the experts are whole and spread over tp x ep ranks, so the
    ep group (here tp 2 x 4 inside one node) carries the dispatch, the experts add no tp collective, and each
    rank stores its whole experts (twice the expert weights of etp = tp, which halves each expert)."""
    job = {"model": {"name": "mixtral-8x7b", "seq_len": 4096}, "cluster": {"name": "dgx-h100", "nodes": 2},
           "strategy": {"tp": 2, "ep": 8, "dp": 8, "global_batch": 64, "sequence_parallel": True, "zero": 1}}
    split = trainsim.simulate(job)
    folded = trainsim.simulate({**job, "strategy": {**job["strategy"], "etp": 1}})
    assert folded.breakdown["tp"] < split.breakdown["tp"]  # the experts' reduce-scatters are gone
    assert folded.breakdown["ep"] < split.breakdown["ep"]  # the dispatch stays inside a node
    assert max(folded.peak_memory_bytes) > max(split.peak_memory_bytes)
    assert trainsim.simulate({**job, "strategy": {**job["strategy"], "etp": 2}}).iteration_time_s == \
        split.iteration_time_s  # etp = tp is the default
    for strategy, field in (({"etp": 4}, "strategy.etp"), ({"etp": 1, "ep": 3}, "strategy.ep")):
        with pytest.raises(trainsim.ConfigError, match=rf"^{field.replace('.', '[.]')}:"):
            trainsim.simulate({**job, "strategy": {**job["strategy"], **strategy}})


def test_rows_map_their_expert_tensor_parallelism() -> None:
    rows = {"etp": "1", "tp": "2", "dp": "4", "n_gpus": "8", "seq_parallel": "true"}
    rj = tr.row_job(training_row(**{**QWEN3_ROW, **rows}))
    assert not isinstance(rj, str), rj
    assert rj.job["strategy"]["etp"] == 1
    unstated = tr.row_job(training_row(**{**QWEN3_ROW, **rows, "etp": ""}))
    assert not isinstance(unstated, str) and "etp" not in unstated.job["strategy"]
    assert "Megatron's default" in unstated.assumptions["etp"]


NANO = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"  # Nemotron 3 Nano's 52 layers


def test_nemotron_3_nano_counts_its_published_parameters() -> None:
    """NVIDIA's Nemotron 3 Nano: 31.6B total parameters, 3.6B active with the embeddings (its model card)."""
    feats = {"layer_pattern": NANO, "mamba_heads": 64, "mamba_head_dim": 64, "mamba_state": 128, "mamba_groups": 8,
             "experts": 128, "top_k": 6, "expert_ffn": 1856, "shared_expert_ffn": 3712, "mlp": "relu2",
             "head_size": 128}
    m = build_model("llama3-8b", 1, 8192, "flash", feats, layers=52, hidden=2688, heads=32, kv_heads=2, ffn=1856,
                    vocab=131072)
    assert m.params == pytest.approx(31.6e9, rel=0.01) and m.active_params == pytest.approx(3.6e9, rel=0.01)
    kinds = ["M" if any(op.name == "ssd" for op in lay.ops) else "*" if any(op.name == "attention" for op in lay.ops)
             else "E" for lay in m.layers if lay.kind == "transformer"]
    assert "".join(kinds) == NANO


def test_mamba2_mixer_by_hand() -> None:
    """One Mamba2 mixer's parameters: in_proj h x (2 di + 2 G N + H), the convolution (di + 2 G N) x (4 + 1),
    dt bias, A and D per head, the gated norm's di and out_proj di x h."""
    h, H, P, N, G = 256, 8, 32, 16, 2
    di = H * P
    m = build_model("custom", 1, 512, "flash", {"layer_pattern": "M", "mamba_heads": H, "mamba_head_dim": P,
                                                "mamba_state": N, "mamba_groups": G, "norm": "rmsnorm",
                                                "bias": False}, layers=1, hidden=h, heads=4, vocab=1000)
    ops = {op.name: op for lay in m.layers for op in lay.ops}
    assert ops["in_proj"].params == h * (2 * di + 2 * G * N + H)
    assert ops["conv1d"].params == (di + 2 * G * N) * 5 and ops["ssd"].params == 3 * H
    assert ops["mamba_norm"].params == di and ops["out_proj"].params == di * h
    # the scan's work per token: 2 Q di (causal chunk mixing) + 4 N di (states) + 2 Q N G (C B^T), Q = 256
    assert ops["ssd"].fwd_flops() == pytest.approx(512 * (2 * 256 * di + 4 * N * di + 2 * 256 * N * G))


@pytest.mark.parametrize(("model", "field"), [
    ({"layer_pattern": "MX"}, "model.layer_pattern"),
    ({"layer_pattern": "M*M"}, "model.layer_pattern"),  # 3 letters for 2 layers
    ({"layer_pattern": "M*"}, "model.mamba_heads"),
    ({"layer_pattern": "*E"}, "model.experts"),
    ({"mamba_heads": 8}, "model.mamba_heads"),
])
def test_hybrid_patterns_that_do_not_fit_are_refused(model: dict[str, Any], field: str) -> None:
    job = {"model": {"name": "custom", "layers": 2, "hidden": 512, "heads": 8, **model},
           "cluster": {"name": "dgx-h100", "nodes": 1}}
    with pytest.raises(trainsim.ConfigError, match=rf"^{field.replace('.', '[.]')}:"):
        trainsim.simulate(job)


def test_a_nemotron_row_maps_its_pattern_and_mamba_sizes() -> None:
    row = _moe_row(attention="GQA in 6 attention layers; other mixers are Mamba2 (64 heads x 64, state 128)",
                   moe_layer_freq=f"hybrid pattern {NANO} (M=Mamba2, E=MoE, *=attention)", n_shared_experts="1",
                   moe_ffn_hidden="1856", notes="shared expert intermediate 3712; squared-ReLU experts")
    got = moe_column_fields(row)
    assert isinstance(got, dict)
    assert (got["layer_pattern"], got["mamba_heads"], got["mamba_head_dim"], got["mamba_state"]) == (NANO, 64, 64, 128)
    assert got["shared_expert_ffn"] == 3712  # the notes' width, not 1 x 1856
    assert "without their layer pattern" in str(moe_column_fields({**row, "moe_layer_freq": "hybrid"}))


# ---- zoo presets of the MoE families (issue 23) ----------------------------------------------------------------

@pytest.mark.parametrize(("preset", "file"), [("deepseek-v3", "deepseek-v3.json"), ("qwen3-30b-a3b", "qwen3-30b-a3b.json"),
                                              ("gpt-oss-120b", "gpt-oss-120b.json"),
                                              ("nemotron-3-nano", "nemotron-3-nano-30b-a3b.json")])
def test_moe_presets_are_their_published_configs(preset: str, file: str) -> None:
    """A preset builds the same model, op for op, as its Hugging Face config.json read by --hf-config."""
    from trainsim.workload.hf import build_hf_model

    zoo, hf = build_model(preset, 2, 4096), build_hf_model(Path(__file__).parent / "data" / "hf" / file, 2, 4096)
    assert (zoo.params, zoo.active_params) == (hf.params, hf.active_params)
    assert [[(op.name, op.fwd_flops()) for op in lay.ops] for lay in zoo.layers] == \
        [[(op.name, op.fwd_flops()) for op in lay.ops] for lay in hf.layers]


@pytest.mark.parametrize(("preset", "total", "active"), [
    ("kimi-k2", 1.03e12, 32.9e9),  # Moonshot's card: 1T total, 32B activated (embedding-inclusive here)
    ("qwen3-235b-a22b", 235_093_634_560, 22.2e9),  # the safetensors total, exactly; Qwen: 22B activated
    ("gpt-oss-20b", 20.91e9, 4.19e9),  # OpenAI's card: 20.91B total, 3.61B active without the embedding's 0.58B
    ("nemotron-3-nano", 31.6e9, 3.6e9),  # NVIDIA's card: 31.6B total, 3.6B active with the embeddings
])
def test_moe_presets_count_their_published_parameters(preset: str, total: float, active: float) -> None:
    m = build_model(preset, 1)
    assert m.params == pytest.approx(total, rel=0.005) and m.active_params == pytest.approx(active, rel=0.01)


def _shared_row(case_id: str) -> dict[str, str]:
    import csv

    path = Path(__file__).resolve().parents[2] / "shared" / "validation" / "moe_runs.csv"
    if not path.exists():
        pytest.skip("../shared/validation/moe_runs.csv is not beside the clone")
    return next(r for r in csv.DictReader(path.open()) if r["case_id"] == case_id)


def test_a_named_model_without_its_columns_takes_its_published_config() -> None:
    """Nemotron 3 Super's rows state no architecture; its published config gives it (LatentMoE 1024, 512 experts
    top-22, 40 Mamba2 + 40 MoE + 8 attention layers in their published order, one MTP module), on one pipeline
    stage or several."""
    from trainsim.validate.moe_rows import published_architecture
    from trainsim.workload.zoo.transformer import SUPER_PATTERN

    row = _shared_row("MBRIDGE-013")
    rj = tr.row_job(row)
    assert not isinstance(rj, str), rj
    m = rj.job["model"]
    assert (m["moe_latent"], m["experts"], m["top_k"], m["layers"], m["mtp_layers"]) == (1024, 512, 22, 88, 1)
    assert m["layer_pattern"] == SUPER_PATTERN and sorted(SUPER_PATTERN) == sorted("M" * 40 + "E" * 40 + "*" * 8)
    assert "published config" in rj.assumptions["published_architecture"]
    got = published_architecture({**row, "pp": "4"})
    assert isinstance(got, tuple) and got[0]["moe_layer_freq"].endswith(SUPER_PATTERN)
    assert published_architecture({**row, "model_name": "Nemotron 3 Ultra (550B-A55B)"}) is None


def test_recipe_default_layouts_are_deepseek_v3s_layout_map() -> None:
    """Megatron-Bridge's DeepSeek-V3 layout_map: 61 layers over pp x vpp chunks, the embedding first, the MTP
    modules and the loss last; pp 4 x vpp 4 is 'Et*4|(t*4|)*14tmL', the layout the GB300 rows name."""
    from trainsim.validate.moe_rows import recipe_layout

    row = {"model_name": "DeepSeek-V3 (671B-A37B)"}
    for (pp, vpp), counts in {(4, 1): [16, 16, 16, 13], (8, 1): [8] * 7 + [5], (4, 2): [8] * 7 + [5],
                              (4, 4): [4] * 15 + [1], (8, 2): [4] * 15 + [1], (16, 1): [4] * 15 + [1]}.items():
        layout = tr._expand_layout(recipe_layout(row, pp, vpp, 1).lower())
        assert tr._layout_split(layout, 61, 1, pp, vpp, {}) == counts
    assert recipe_layout(row, 4, 4, 1) == "Et*4|(t*4|)*14tmL"
    assert recipe_layout(row, 4, 4, 0).endswith("tL")
    for bad_row, pp, vpp, why in ((row, 2, 2, "pp 2, vpp 2"), ({"model_name": "Qwen3-235B-A22B"}, 4, 1, "Qwen3")):
        with pytest.raises(ValueError, match=why):
            recipe_layout(bad_row, pp, vpp, 1)


def test_base_recipe_recompute_reads_the_recipe_version_the_row_ran() -> None:
    from trainsim.validate.moe_rows import recipe_recompute

    notes = "recipe: NVIDIA-NeMo/Megatron-Bridge@4ab94dfad:src/x.py::deepseek_v3_pretrain_256gpu_gb300_fp8mx_config"
    graphed = "grad_accum=32; cuda_graph=full_iteration:; EP a2a overlap=on"
    got = recipe_recompute({"notes": notes, "other_settings": graphed, "micro_batch": "1"})
    assert got is not None and got[0] == () and "recompute off" in got[1]
    assert recipe_recompute({"notes": notes, "other_settings": graphed, "micro_batch": "2"}) is None  # mla_up_proj
    assert recipe_recompute({"notes": notes, "other_settings": "grad_accum=32", "micro_batch": "1"}) is None
    assert recipe_recompute({"notes": "recipe: x.py::some_other_config", "other_settings": graphed}) is None


DEEPSEEK_V3_CELLS = {
    "model_name": "DeepSeek-V3 (671B-A37B)", "arch": "MoE (MLA)", "n_layers": "61", "hidden": "7168", "n_heads": "128",
    "n_kv_heads": "128", "ffn_hidden": "18432", "seq_len": "4096", "vocab": "129280", "head_dim": "128",
    "moe_ffn_hidden": "2048", "n_experts": "256", "n_shared_experts": "1", "top_k": "8", "first_k_dense": "3",
    "moe_layer_freq": "[0]*3+[1]*58", "attention": "MLA (qk_nope=128, qk_rope=64, v_head=128; no GQA)",
    "kv_lora_rank": "512", "q_lora_rank": "1536"}
"""A moe_runs.csv DeepSeek-V3 row's architecture cells, as the file states them."""


def test_a_row_with_the_recipes_default_layout_and_recompute_maps() -> None:
    """moe_runs.csv's DeepSeek-V3 rows that leave the layout to set_layout(cfg.model) and the recompute to the
    base recipe: both read from Megatron-Bridge's source, the rest of the row as stated."""
    cells = {**DEEPSEEK_V3_CELLS, "gpu": "GB200 (DGX GB200 NVL72)",
             "n_gpus": "256", "dp": "64", "tp": "1", "pp": "4", "vpp": "4", "cp": "1", "ep": "64", "micro_batch": "1",
             "global_batch": "4096", "precision": "BF16", "iter_time_s": "", "tokens_per_s_per_gpu": "4912",
             "recompute": "selective (modules = base-recipe default, not resolved by extractor)",
             "notes": "recipe: NVIDIA-NeMo/Megatron-Bridge@4ab94dfad:src/megatron/bridge/perf_recipes/deepseek/gb300/"
                      "deepseek_v3.py::deepseek_v3_pretrain_256gpu_gb300_fp8mx_config",
             "other_settings": "grad_accum=64; cuda_graph=full_iteration:; pp_layout:set_layout(cfg.model); "
                               "MTP: recipe default mtp_num_layers=1 (not stated in table)"}
    rj = tr.row_job(training_row(**cells))
    assert not isinstance(rj, str), rj
    assert rj.job["strategy"]["stage_layers"] == [4] * 15 + [1] and rj.job["strategy"]["recompute"] == "none"
    assert rj.job["model"]["mtp_layers"] == 1
    unknown = tr.row_job(training_row(**{**cells, "pp": "2", "vpp": "8", "dp": "128"}))
    assert isinstance(unknown, str) and "no default layout for pp 2, vpp 8" in unknown


def test_a_bridge_row_naming_no_layout_gets_the_recipes_default() -> None:
    """deepseek_v3_pretrain_config(layout=None) sets its layout_map's layout for the (pp, vpp): a Megatron-Bridge row
    that names no layout runs it (pp 16: 4 layers a stage, the last one's MTP and loss beside one layer); a (pp, vpp)
    the map lacks, and a framework other than Megatron-Bridge, keep the even split."""
    cells = {**DEEPSEEK_V3_CELLS, "gpu": "B200 (DGX-B200)",
             "n_gpus": "256", "dp": "16", "tp": "1", "pp": "16", "vpp": "", "cp": "1", "ep": "8", "micro_batch": "1",
             "global_batch": "4096", "precision": "BF16", "iter_time_s": "", "tokens_per_s_per_gpu": "2790",
             "framework": "Megatron-Bridge / Megatron-Core (NeMo container)",
             "other_settings": "grad_accum=256; MTP: recipe default mtp_num_layers=1 (not stated in table)"}
    rj = tr.row_job(training_row(**cells))
    assert not isinstance(rj, str), rj
    assert rj.job["strategy"]["stage_layers"] == [4] * 15 + [1]
    assert "Et*4|(t*4|)*14tmL" in rj.assumptions["pp_layout"]
    for other in ({"pp": "2", "vpp": "4", "dp": "128"}, {"framework": "NeMo AutoModel (PyTorch FSDP2 + EP)"}):
        rj = tr.row_job(training_row(**{**cells, **other}))
        assert not isinstance(rj, str), rj
        assert "stage_layers" not in rj.job["strategy"] and "pp_layout" not in rj.assumptions


def _hf_model_of(data: dict[str, Any], seq: int) -> Any:
    import json
    import tempfile

    from trainsim.workload.hf import build_hf_model

    path = Path(tempfile.mkdtemp()) / "config.json"
    path.write_text(json.dumps(data))
    return build_hf_model(path, 2, seq)


def test_llama4_and_nemotron_3_super_presets_are_their_published_configs() -> None:
    """Llama 4 Maverick's published text_config, Scout's (16 experts on every layer, QK-norm) and Nemotron 3 Super's
    sizes with its published 88-layer order, read by --hf-config, build the presets op for op."""
    import json

    from trainsim.workload.zoo.transformer import SUPER_PATTERN

    hf_dir = Path(__file__).parent / "data" / "hf"
    mav = json.loads((hf_dir / "llama-4-maverick-17b-128e.json").read_text())
    scout = {**mav, "text_config": {**mav["text_config"], "num_local_experts": 16, "interleave_moe_layer_step": 1,
                                    "use_qk_norm": True}}
    nano = json.loads((hf_dir / "nemotron-3-nano-30b-a3b.json").read_text())
    sup = {**nano, "hidden_size": 4096, "num_hidden_layers": 88, "hybrid_override_pattern": SUPER_PATTERN,
           "mamba_num_heads": 128, "n_routed_experts": 512, "num_experts_per_tok": 22, "moe_intermediate_size": 2688,
           "moe_latent_size": 1024, "moe_shared_expert_intermediate_size": 5376, "num_nextn_predict_layers": 1,
           "mtp_hybrid_override_pattern": "*E", "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128,
           "intermediate_size": 2688}
    assert len(SUPER_PATTERN) == 88 and [i for i, c in enumerate(SUPER_PATTERN) if c == "*"] == \
        [7, 16, 25, 36, 47, 58, 69, 78]
    for preset, data in (("llama4-maverick", mav), ("llama4-scout", scout), ("nemotron-3-super", sup)):
        zoo, hf = build_model(preset, 2, 4096), _hf_model_of(data, 4096)
        assert (zoo.params, zoo.active_params) == (hf.params, hf.active_params), preset
        assert [[(op.name, op.fwd_flops()) for op in lay.ops] for lay in zoo.layers] == \
            [[(op.name, op.fwd_flops()) for op in lay.ops] for lay in hf.layers], preset
    assert build_model("llama4-maverick", 1).params == pytest.approx(400e9, rel=0.01)  # Meta: 400B, 17B active
    assert build_model("llama4-scout", 1).active_params == pytest.approx(17e9, rel=0.02)
