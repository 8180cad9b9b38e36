"""validate's row mapping (training_runs.csv format): every strategy / precision / architecture value maps to a
job field or skips the row with a reason counted by category; ALiBi and squared-ReLU transformers by hand."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from training_row import BASE, training_row

import trainsim
from trainsim.cli import main
from trainsim.validate import training_runs as tr
from trainsim.validate.cases import Outcome, skip, skip_category, skips_by_reason
from trainsim.workload.ir import CONTRACTION_KINDS
from trainsim.workload.zoo.transformer import TransformerConfig, build_transformer


def _row(**kw: str) -> dict[str, str]:
    return training_row(**kw)


def _job(**kw: str) -> tr.RowJob:
    rj = tr.row_job(_row(**kw))
    assert not isinstance(rj, str), rj
    return rj


def _skip(**kw: str) -> str:
    reason = tr.row_job(_row(**kw))
    assert isinstance(reason, str), "expected a skip"
    return reason


def _strategy(**kw: str) -> dict[str, Any]:
    return _job(**kw).job["strategy"]


def test_the_synthetic_row_maps_and_simulates() -> None:
    rj = _job()
    assert rj.job["model"] == {"name": "custom", "layers": 4, "hidden": 256, "heads": 8, "kv_heads": 8, "ffn": 1024,
                               "vocab": 50304, "seq_len": 512, "attention": "unfused", "mlp": "gelu",
                               "norm": "layernorm", "position": "learned"}  # as the arch text states them
    assert rj.job["strategy"]["recompute"] == "none" and "fsdp" not in rj.job["strategy"]
    res = trainsim.simulate(rj.job)
    assert res.iteration_time_s > 0


# --- virtual pipeline size ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("vpp", "expected"), [("2", 2), ("2 (interleaved)", 2), ("3 (--num-layers-per-vs 2)", 3),
                                               ("", 1), ("1", 1), ("no", 1), ("n/a", 1)])
def test_vpp_numbers_and_text(vpp: str, expected: int) -> None:
    s = _strategy(vpp=vpp, pp="2", dp="4")
    assert s["vpp"] == expected and (s.get("schedule") == "interleaved") == (expected > 1)


@pytest.mark.parametrize(("vpp", "category"), [("yes", "virtual pipeline size not stated"),
                                               ("interleaved", "virtual pipeline size not stated"),
                                               ("1.5", "vpp not understood"), ("many", "vpp not understood")])
def test_vpp_without_a_number_skips(vpp: str, category: str) -> None:
    assert skip_category(_skip(vpp=vpp, pp="2", dp="4")) == category


def test_pp_schedule_column_must_agree_with_vpp() -> None:
    assert _skip(pp="2", dp="4", pp_schedule="interleaved 1F1B").startswith("virtual pipeline size not stated")
    assert _strategy(pp="2", dp="4", vpp="2", pp_schedule="interleaved 1F1B")["vpp"] == 2
    assert _skip(pp="2", dp="4", vpp="2", pp_schedule="1F1B").startswith("vpp not understood")
    assert _skip(pp="2", dp="4", pp_schedule="DualPipe").startswith("pipeline schedule not expressible")


# --- sharding ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "expected"), [
    ("PyTorch FSDP FULL_SHARD", {"fsdp": True}),
    ("FSDP2 (PyTorch fully_shard)", {"fsdp": True}),
    ("fully_shard", {"fsdp": True}),
    ("FSDP2 full shard over all 8 GPUs (data_parallel_shard_degree=-1)", {"fsdp": True}),
    ("Megatron-FSDP strategy=optim_grads_params", {"fsdp": True}),
    ("Megatron-FSDP strategy=optim_grads", {"zero": 2}),
    ("Megatron-FSDP strategy=optim", {"zero": 1}),
    ("FSDP FULL_SHARD (ZeRO-3), auto-wrap per Block", {"fsdp": True}),
    ("DeepSpeed ZeRO stage 3", {"fsdp": True}),
    ("PyTorch FSDP SHARD_GRAD_OP", {"zero": 2}),
    ("ZeRO-2", {"zero": 2}),
    ("ZeRO-1 (Megatron distributed optimizer)", {"zero": 1}),
    ("distributed optimizer (ZeRO-1-style)", {"zero": 1}),
    ("none (DDP allreduce)", {}),
    ("none (zero_stage=1 but dp=1)", {}),
    ("NO_SHARD", {}),
])
def test_sharding_spellings(text: str, expected: dict[str, Any]) -> None:
    s = _strategy(sharding=text)
    assert {k: s[k] for k in ("fsdp", "zero", "dp_replicate") if k in s} == expected


def test_unstated_sharding_is_a_recorded_default() -> None:
    rj = _job(sharding="")
    assert "fsdp" not in rj.job["strategy"] and "zero" not in rj.job["strategy"] and "sharding" in rj.assumptions
    rj = _job(sharding="not stated (distributed optimizer likely)")
    assert rj.job["strategy"]["zero"] == 1 and "sharding" in rj.assumptions


def test_plain_fsdp_is_pytorchs_default_full_shard() -> None:
    rj = _job(sharding="FSDP")
    assert rj.job["strategy"]["fsdp"] is True and "FULL_SHARD" in rj.assumptions["sharding"]


@pytest.mark.parametrize(("text", "dp", "other", "replicas"), [
    ("HSDP (shard 4, replicate 4)", "16", "", 4),
    ("FSDP2 HSDP, replicate degree 2", "16", "", 2),
    ("FSDP HYBRID_SHARD", "16", "", 2),  # FSDP1's documented default: FULL_SHARD inside an 8-GPU node
    ("FSDP2 (PyTorch fully_shard), FSDP column=8", "16", "", 2),
    ("ZeRO-1 (Megatron distributed optimizer); num-distributed-optimizer-instances=2", "16", "", 2),
    ("ZeRO-1 (Megatron distributed optimizer)", "16", "num-distributed-optimizer-instances=4", 4),
])
def test_hybrid_sharding_maps_to_dp_replicate_or_skips(text: str, dp: str, other: str, replicas: int) -> None:
    kw = {"sharding": text, "dp": dp, "n_gpus": dp, "global_batch": str(2 * int(dp)), "other_settings": other}
    if not tr.hsdp_supported():
        assert skip_category(_skip(**kw)) == "sharding not expressible"
        return
    s = _strategy(**kw)
    assert s["dp_replicate"] == replicas and (s.get("fsdp") or s.get("zero"))


def test_hybrid_sharding_that_cannot_be_sized_skips() -> None:
    for text in ("HSDP", "FSDP2 (PyTorch fully_shard), FSDP column=3"):
        assert skip_category(_skip(sharding=text, dp="16", n_gpus="16", global_batch="32")) == \
            "sharding not expressible"
    assert skip_category(_skip(sharding="sharded somehow")) == "sharding not understood"
    assert "states sharded across the replicas" in _skip(sharding="Megatron-FSDP strategy=optim_grads_params",
                                                          other_settings="outer-dp-sharding-strategy=optim")


# --- recompute ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "mode"), [
    ("per-op selective", "selective"), ("selective (op-level)", "selective"),
    ("selective per-op (selective_ac_option=op)", "selective"), ("selective", "selective"),
    ("selective (modules=[core_attn])", "selective"), ("selective: core_attn", "selective"),
    ("full (uniform, every layer)", "full"), ("full (method=uniform, num_layers=1)", "full"),
    ("yes (--checkpoint-activations in 2019 scripts)", "full"), ("full (FSDP activation checkpointing)", "full"),
    ("activation checkpointing on (matched recipe yaml)", "full"), ("full (HF gradient_checkpointing)", "full"),
    ("none", "none"), ("no", "none"), ("none (Qwen3 perf scripts set recompute_granularity=None)", "none"),
])
def test_recompute_spellings(text: str, mode: str) -> None:
    rj = _job(recompute=text)
    assert rj.job["strategy"]["recompute"] == mode and rj.checkpointing == (mode == "full")
    if "op" in text and mode == "selective" and "core_attn" not in text and text != "selective":
        assert "per-op" in rj.assumptions["recompute"]


@pytest.mark.parametrize("text", ["", "not stated"])
def test_only_an_empty_recompute_cell_takes_the_default(text: str) -> None:
    rj = _job(recompute=text)
    assert rj.job["strategy"]["recompute"] == "none" and rj.assumptions["recompute"].startswith("not stated")


@pytest.mark.parametrize(("text", "modules"), [
    ("selective: mlp", ["mlp"]),
    ("selective (modules=[layernorm mla_up_proj mlp moe_act])", ["layernorm", "mla_up_proj", "mlp", "moe_act"]),
    ("selective (modules=[core_attn])", None),
])
def test_recompute_modules_map(text: str, modules: list[str] | None) -> None:
    strategy = _strategy(recompute=text)
    assert strategy["recompute"] == "selective" and strategy.get("recompute_modules") == modules


@pytest.mark.parametrize(("text", "category"), [
    ("selective: attention_projection", "recompute not expressible"),
    ("selective (modules = base-recipe default, not resolved by extractor)", "recompute not expressible"),
    ("selective_ac_option=2 (selective)", "recompute not expressible"),
    ("full (method=block, num_layers=2)", "recompute not expressible"),
    ("some layers", "recompute not understood"), ("selective (attn + mlp)", "recompute not understood"),
])
def test_recompute_that_is_not_expressible_skips(text: str, category: str) -> None:
    assert skip_category(_skip(recompute=text)) == category


# --- sequence parallelism and TP communication overlap ----------------------------------------------------

def test_sequence_parallel_cells() -> None:
    assert _strategy(tp="2", dp="4", seq_parallel="yes (tp_mode=REDUCE_SCATTER)")["sequence_parallel"] is True
    rj = _job(seq_parallel="yes")  # tp = 1: Megatron turns it off
    assert "sequence_parallel" not in rj.job["strategy"] and "tp = 1" in rj.assumptions["sequence_parallel"]
    assert "sequence_parallel" not in _strategy(tp="2", dp="4", seq_parallel="n/a (tp=1)")
    rj = _job(tp="2", dp="4", seq_parallel="not stated")
    assert "sequence_parallel" not in rj.job["strategy"] and "not stated" in rj.assumptions["sequence_parallel"]
    assert skip_category(_skip(tp="2", dp="4", seq_parallel="partly")) == "sequence parallel not understood"


@pytest.mark.parametrize("setting", ["TP comm overlap (userbuffers)", "--tp-comm-overlap", "tp-comm-overlap=True",
                                     "userbuffers", "tp_linear_async_communication=true"])
def test_tp_comm_overlap_maps_with_sequence_parallel(setting: str) -> None:
    s = _strategy(tp="2", dp="4", seq_parallel="yes", other_settings=setting)
    assert s["tp_comm_overlap"] is True and s["sequence_parallel"] is True
    rj = _job(other_settings=setting)  # tp = 1: nothing to overlap
    assert "tp_comm_overlap" not in rj.job["strategy"] and "tp = 1" in rj.assumptions["tp_comm_overlap"]
    assert skip_category(_skip(tp="2", dp="4", seq_parallel="no", other_settings=setting)) == \
        "setting not expressible"
    # an unstated seq_parallel with TP is on when the overlap (which needs it) is stated
    s = _strategy(tp="2", dp="4", seq_parallel="not stated", other_settings=setting)
    assert s["tp_comm_overlap"] is True and s["sequence_parallel"] is True


def test_tp_comm_overlap_off_stays_off() -> None:
    assert "tp_comm_overlap" not in _strategy(tp="2", dp="4", seq_parallel="yes",
                                              other_settings="tp-comm-overlap=False")


# --- other_settings ----------------------------------------------------------------------------------------

def test_other_settings_map_to_strategy_fields() -> None:
    s = _strategy(sharding="ZeRO-1", other_settings="--overlap-grad-reduce --overlap-param-gather")
    assert s["overlap_grad_reduce"] is True and s["overlap_param_gather"] is True
    assert _strategy(other_settings="DDP impl=local; fused kernels")["overlap_grad_reduce"] is False
    assert _strategy(other_settings="DDP impl=torch")["overlap_grad_reduce"] is True
    assert _strategy(other_settings="scatter/gather p2p opt off")["p2p_scatter_gather"] is False
    assert _strategy(pp="2", dp="4", other_settings="pp_engine=afab")["schedule"] == "gpipe"
    rj = _job(other_settings="--overlap-param-gather")  # nothing sharded
    assert "overlap_param_gather" not in rj.job["strategy"] and "overlap_param_gather" in rj.assumptions


@pytest.mark.parametrize(("setting", "kernel"), [("attention-backend=unfused", "unfused"),
                                                 ("attention-backend=flash", "flash"),
                                                 ("attention-backend=fused", "cudnn"),
                                                 ("transformer-impl=local", "unfused"),
                                                 ("executors=sdpa, torchcompile", "flash")])
def test_attention_backend_flags(setting: str, kernel: str) -> None:
    assert _job(gpu="H100 80GB", source="Megatron-LM CI", other_settings=setting).job["model"]["attention"] == kernel


@pytest.mark.parametrize(("setting", "category"), [
    ("fine-grained-activation-offloading=True", "setting not expressible"),
    ("finetune=LoRA alpha=128 on q,v", "setting not expressible"),
    ("finetune=LoRA r=8 on q,gate_proj", "setting not expressible"),
    ("packed=False", "setting not expressible"),
    ("decoder-first-pipeline-num-layers=2", "setting not expressible"),
    ("Shampoo optimizer (page note)", "setting not expressible"),
    ("position-embedding-type=none", "architecture not modelled"),
    ("num-experts=8", "mixture of experts"),
    ("bucket-size=40MB", "setting not understood"),
    ("weird pipeline trick", "setting not understood"),
])
def test_other_settings_that_change_the_step_skip(setting: str, category: str) -> None:
    assert skip_category(_skip(other_settings=setting)) == category


def test_other_settings_known_or_harmless_are_recorded() -> None:
    rj = _job(other_settings="LAMB optimizer; torch.compile=True; CUDA graphs on; composer; my favourite dataset")
    assert "lamb optimizer priced as Adam" in rj.assumptions["settings"]
    assert "CUDA graphs" in rj.assumptions["settings"]
    assert rj.job["model"]["kernels"] == "fused"  # torch.compile: fused kernels, as trainsim prices by default
    assert rj.assumptions["other_settings"] == "not interpreted: my favourite dataset"
    assert "settings" not in _job(other_settings="deterministic-mode=True; mock-data=True").assumptions


# --- precision ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "dtype"), [
    ("amp_bf16 (FSDP mixed_precision=DEFAULT)", "bf16"), ("bf16 (FSDP mixed_precision=PURE)", "bf16"),
    ("AMP (fp16 mixed)", "fp16"), ("fp16 mixed (--fp16)", "fp16"), ("AMP (fp16, NHWC)", "fp16"),
    ("FP32", "fp32"), ("TF32", "tf32"), ("amp_fp8 (FSDP mixed_precision=DEFAULT)", "fp8"),
    ("not stated (MFU = TFLOP/s / 989 => BF16 dense peak used)", "bf16"), ("not stated (BF16 peak basis)", "bf16"),
    ("bf16 + fp8 (hybrid, recipe=tensorwise)", "fp8"), ("fp16 AMP (fp32 master)", "fp16"),
    ("bf16 params/compute, fp32 grad accumulation buffers (accumulate_grad_in_fp32)", "bf16"),
    ("bf16-true (bf16 params, grads and AdamW states)", "bf16"), ("float8 tensorwise linears", "fp8"),
])
def test_precision_spellings(text: str, dtype: str) -> None:
    assert _job(precision=text, gpu="H100 80GB").job["simulation"]["dtype"] == dtype


def test_precision_defaults_and_skips() -> None:
    rj = _job(precision="")
    assert rj.job["simulation"]["dtype"] == "bf16" and rj.assumptions["precision"].startswith("not stated")
    assert _job(precision="not stated", gpu="V100-SXM2 32GB").job["simulation"]["dtype"] == "fp16"
    assert "autocast" in _job(precision="AMP").assumptions["precision"]
    assert skip_category(_skip(precision="MXFP4", gpu="B200")) == "precision not modelled"
    assert _job(precision="NVFP4", gpu="B200").job["simulation"]["dtype"] == "fp4"  # Blackwell's FP4 rate
    for text in ("MXFP8 (1x32 block scaling, E8M0 scales)", "bf16 + fp8 (hybrid, recipe=blockwise)"):
        rj = _job(precision=text, gpu="H100 80GB")  # block-scaled FP8: the FP8 tensor-core rate, said so
        assert rj.job["simulation"]["dtype"] == "fp8" and "block-scaled" in rj.assumptions["precision"], text
    assert skip_category(_skip(precision="int4 weights")) == "precision not understood"


def test_fp8_weights_map_to_fp8_params() -> None:
    """Megatron's --fp8-param-gather and torchao's float8 all-gather of FSDP shards keep the blocks' linear
    weights in FP8 (simulation.fp8_params); with bf16 GEMMs they are a contradiction the row cannot map."""
    for kw in ({"precision": "bf16 + fp8 (hybrid, recipe=tensorwise)", "other_settings": "fp8-param-gather=True"},
               {"precision": "bf16; float8 linears (fsdp float8 all-gather)"}):
        sim = _job(gpu="H100 80GB", **kw).job["simulation"]
        assert sim["dtype"] == "fp8" and sim["fp8_params"] is True, kw
    assert "fp8_params" not in _job(gpu="H100 80GB", precision="bf16 + fp8 (hybrid)").job["simulation"]
    assert skip_category(_skip(gpu="H100 80GB", precision="bf16", other_settings="fp8-param-gather=True")) == \
        "setting not expressible"


def test_activation_offloading_maps_on_full_recompute() -> None:
    """torchtune's activation_offloading=True with per-layer activation checkpointing: strategy.offload_activations;
    on any other recompute there is no checkpointed input to offload (a skip)."""
    rj = _job(recompute="full (per transformer layer)", other_settings="activation_offloading=True")
    assert rj.job["strategy"]["offload_activations"] is True and rj.job["strategy"]["recompute"] == "full"
    assert "offload_activations" not in _job(recompute="full", other_settings="activation_offloading=False").job[
        "strategy"]
    assert skip_category(_skip(recompute="none", other_settings="activation_offloading=True")) == \
        "setting not expressible"


def test_lora_rows_map_rank_targets_and_base() -> None:
    """torchtune's 'finetune=LoRA r=64 alpha=128 on q,v,output_proj + MLP' (QLoRA: an NF4 base): model.lora_*."""
    m = _job(arch="Llama (RMSNorm, SwiGLU, GQA, RoPE)", n_kv_heads="8",
             other_settings="finetune=LoRA r=64 alpha=128 on q,v,output_proj + MLP (3B_lora_single_device)").job["model"]
    assert (m["lora_rank"], m["lora_targets"], m["lora_base"]) == (64, ["q", "v", "o", "mlp"], "bf16")
    m = _job(arch="Llama (RMSNorm, SwiGLU, GQA, RoPE)", n_kv_heads="8",
             other_settings="finetune=QLoRA (NF4 base) r=64 alpha=128 on q,v,output_proj + MLP").job["model"]
    assert m["lora_base"] == "nf4" and m["lora_rank"] == 64
    assert _job(other_settings="loss=chunked CE").job["model"]["loss"] == "chunked"


def test_embedding_and_loss_counted_in_the_pipeline_split() -> None:
    """Megatron's account-for-embedding/loss-in-pipeline-split: 6 layers + embedding + loss over pp 4 x vpp 2 =
    one per virtual stage, the first holding only the embedding, the last only the loss."""
    settings = "account-for-embedding-in-pipeline-split=True; account-for-loss-in-pipeline-split=True"
    common = {"n_layers": "6", "pp": "4", "vpp": "2", "dp": "2", "global_batch": "32", "micro_batch": "2"}
    rj = _job(other_settings=settings, **common)
    assert rj.job["strategy"]["stage_layers"] == [0, 1, 1, 1, 1, 1, 1, 0]
    rj = _job(other_settings="account-for-embedding-in-pipeline-split=True", **{**common, "n_layers": "7"})
    assert rj.job["strategy"]["stage_layers"] == [0, 1, 1, 1, 1, 1, 1, 1]
    assert "stage_layers" not in _job(other_settings="account-for-loss-in-pipeline-split=False", **common).job[
        "strategy"]
    assert skip_category(_skip(other_settings=settings, **{**common, "n_layers": "8"})) == "setting not expressible"


def test_per_op_sac_is_compared_for_time_not_memory() -> None:
    """torchtitan's op SAC keeps every other matmul's output: priced as selective for time (a note), its measured
    peak is not compared (every activation kept would be far off)."""
    rj = _job(recompute="selective per-op (selective_ac_option=op)")
    assert rj.job["strategy"]["recompute"] == "selective" and "per-op" in rj.assumptions["recompute"]
    why = tr.measured_memory({"recompute": "selective per-op (selective_ac_option=op)", "peak_mem_gib": "40",
                              "mem_kind": "reserved"})
    assert isinstance(why, str) and "per-op selective" in why
    assert isinstance(tr.measured_memory({"recompute": "selective (per-op SAC)", "peak_mem_gib": "82.4"}), str)
    assert tr.measured_memory({"recompute": "selective", "peak_mem_gib": "40", "mem_kind": "reserved"}) == \
        (40.0, "reserved")


# --- architecture ------------------------------------------------------------------------------------------

def test_bloom_alibi_and_nemotron_relu2_rows() -> None:
    m = _job(arch="BLOOM (ALiBi, embedding LayerNorm, GeLU 4h, MHA)").job["model"]
    assert m["name"] == "custom" and m["position"] == "alibi" and m["mlp"] == "gelu" and m["norm"] == "layernorm"
    m = _job(arch="Nemotron-4 (squared-ReLU MLP, RoPE, GQA, LayerNorm, no bias, untied embeddings)",
             n_kv_heads="2").job["model"]
    assert (m["mlp"], m["position"], m["bias"], m["tied_embeddings"], m["kv_heads"]) == \
        ("relu2", "rope", False, False, 2)
    assert trainsim.simulate(_job(arch="Nemotron (relu^2 MLP, rotary)").job).iteration_time_s > 0


def test_llama_rows_state_every_feature() -> None:
    m = _job(arch="Llama (RMSNorm, SwiGLU, MHA, RoPE, tied embeddings)").job["model"]
    assert {k: m[k] for k in ("norm", "mlp", "position", "bias", "dropout", "tied_embeddings")} == \
        {**tr.LLAMA_FEATURES, "tied_embeddings": True}
    assert m["kv_heads"] == 8  # MHA: the row's n_kv_heads
    assert skip_category(_skip(arch="Llama (SwiGLU, RoPE)", ffn_hidden="")) == "missing column"
    assert skip_category(_skip(arch="Llama (GQA)", n_kv_heads="")) == "missing column"
    assert _job(arch="GPT (MQA)", n_kv_heads="").job["model"]["kv_heads"] == 1


def test_megatron_flags_describe_the_test_model() -> None:
    m = _job(arch="GPT (Megatron-Core test model; MLP, attention and embeddings in other_settings)",
             other_settings="swiglu=True; normalization=RMSNorm; position-embedding-type=rope; "
                            "disable-bias-linear=True; untie-embeddings-and-output-weights=True; "
                            "hidden-dropout=0.0; attention-dropout=0.0").job["model"]
    assert (m["mlp"], m["norm"], m["position"], m["bias"], m["tied_embeddings"], m["dropout"]) == \
        ("swiglu", "rmsnorm", "rope", False, False, False)
    assert skip_category(_skip(other_settings="swiglu=True")) == "architecture not understood"  # arch says GeLU


@pytest.mark.parametrize(("arch", "category"), [
    ("MoE (GQA; 128 routed + 0 shared experts, top-8)", "mixture of experts"),
    ("GPT (SwiGLU and GeLU MLPs)", "architecture not understood"),
    ("RWKV-5", "architecture not understood"),
    ("T5 encoder-decoder", "architecture not modelled"),
    ("dense (hybrid (few attention layers))", "architecture not modelled"),
    ("GPT (sliding-window attention)", "architecture not modelled"),
    ("OPT (ReLU MLP, learned pos-emb)", "architecture not modelled"),
])
def test_architectures_that_skip(arch: str, category: str) -> None:
    assert skip_category(_skip(arch=arch)) == category


def test_moe_is_read_from_every_column() -> None:
    assert skip_category(_skip(n_experts="64")) == "mixture of experts"
    assert skip_category(_skip(model_name="Qwen3-30B-A3B")) == "mixture of experts"
    assert tr.row_job(_row(other_settings="num-experts=1")) is not None  # one expert is a dense MLP


def test_unreadable_numbers_skip() -> None:
    assert skip_category(_skip(tp="two")) == "unreadable number"
    assert skip_category(_skip(micro_batch="2 or 4")) == "unreadable number"
    assert skip_category(_skip(micro_batch="1", grad_accum="4")) == "batch sizes"  # 1 x 8 x 4 != 16


# --- skips counted by reason -------------------------------------------------------------------------------

def test_skip_categories_group_rows_that_differ_only_in_values() -> None:
    assert skip_category("mixture of experts: 'x': not mapped yet") == "mixture of experts"
    assert skip_category("not expressible: strategy.ep: expert parallelism needs ...") == \
        "not expressible: strategy.ep"
    assert skip_category("collective 'alltoallv' is not modelled") == "collective '...' is not modelled"
    outs = [skip(0, "a", "vpp not understood: vpp = 'x'"), skip(1, "b", "vpp not understood: vpp = 'y'"),
            Outcome(2, "c", "iter_time_s", 1.0, 1.0), skip(3, "d", "no measured outcome: none")]
    grouped = skips_by_reason(outs)
    assert [(k, [o.case_id for o in v]) for k, v in grouped] == [("vpp not understood", ["a", "b"]),
                                                                 ("no measured outcome", ["d"])]


def test_validate_counts_skips_by_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [_row(case_id="ok"), _row(case_id="moe1", arch="MoE (top-2)"), _row(case_id="moe2", n_experts="8"),
            _row(case_id="v", vpp="yes", pp="2", dp="4"), _row(case_id="p", precision="MXFP4")]
    path = tmp_path / "runs.csv"
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=[*BASE, "n_experts"])
        w.writeheader()
        w.writerows(rows)
    out = tmp_path / "v.json"
    main(["validate", str(path), "--json", str(out), "-q", "--jobs", "1"])
    data = json.loads(out.read_text())
    assert data["summary"]["n"] == 1 and data["summary"]["skipped"] == 4
    assert data["skipped_by_reason"] == {"mixture of experts": 2, "precision not modelled": 1,
                                         "virtual pipeline size not stated": 1}
    capsys.readouterr()
    main(["validate", str(path), "--jobs", "1"])
    text = capsys.readouterr().out
    assert "skipped: 4 rows, 3 reasons" in text and "mixture of experts" in text


def test_the_shared_files_map_every_value() -> None:
    """No row of the shared files leaves an other_settings token uninterpreted, and every skip has a category."""
    root = Path(__file__).resolve().parents[2] / "shared" / "validation"
    files = [root / f for f in ("training_runs.csv", "memory_runs.csv", "moe_runs.csv")]
    if not all(f.is_file() for f in files):
        pytest.skip("../shared/validation is absent")
    for f in files:
        with f.open(newline="") as fh:
            for row in csv.DictReader(fh):
                rj = tr.row_job(row)
                if isinstance(rj, str):
                    assert ": " in rj, rj
                else:
                    assert "other_settings" not in rj.assumptions, (row["case_id"], rj.assumptions)
                    if f.name == "training_runs.csv":
                        continue
                    assert rj.job["model"].get("name") in ("custom", "bert-large", "resnet50")


# --- ALiBi and squared ReLU by hand ------------------------------------------------------------------------

H, A, F, V, S, L, B = 64, 4, 256, 1000, 32, 2, 2


def _cfg(**kw: Any) -> TransformerConfig:
    return TransformerConfig("t", "gpt", L, H, A, F, V, S, **kw)


def _op(model: Any, name: str) -> Any:
    return next(op for op in model.layers[1].ops if op.name == name)


def test_relu2_mlp_has_two_matrices_and_two_flops_per_element() -> None:
    gelu, relu2 = build_transformer(_cfg(), B), build_transformer(_cfg(mlp="relu2"), B)
    swiglu = build_transformer(_cfg(mlp="swiglu"), B)
    # per block: qkv 3h^2 + 3h, proj h^2 + h, fc1 hf + f, fc2 fh + h, two LayerNorms 2 x 2h
    block = 3 * H * H + 3 * H + H * H + H + H * F + F + F * H + H + 4 * H
    expected = L * block + V * H + S * H + 2 * H  # + tied embedding, learned positions, final LayerNorm
    assert relu2.params == gelu.params == expected
    assert swiglu.params == expected + L * (H * F + F)  # the gate: a third matrix (and its bias)
    fc1, act = _op(relu2, "fc1"), _op(relu2, "act")
    assert fc1.weight == ("f", "h") and fc1.fwd_flops() == 2 * B * S * H * F
    assert act.fwd_flops() == 2 * B * S * F  # max(x, 0), then x * x
    assert _op(gelu, "act").fwd_flops() == 8 * B * S * F
    assert relu2.fwd_flops_per_sample() == gelu.fwd_flops_per_sample()  # the contractions are the same


def test_alibi_has_no_position_parameters_and_one_pass_over_the_scores() -> None:
    learned = build_transformer(_cfg(), B, attention="unfused")
    alibi = build_transformer(_cfg(position="alibi"), B, attention="unfused")
    assert learned.params - alibi.params == S * H  # the learned table is gone
    names = [op.name for op in alibi.layers[1].ops]
    assert names[names.index("scores") + 1] == "alibi" and "rope" not in names
    bias = _op(alibi, "alibi")
    assert bias.fwd_flops() == B * A * S * S and bias.saved == () and bias.causal
    flash = build_transformer(_cfg(position="alibi"), B, attention="flash")
    assert "alibi" not in [op.name for op in flash.layers[1].ops]  # inside the fused kernel: free
    got = sum(op.fwd_flops() for la in flash.layers for op in la.ops if op.kind in CONTRACTION_KINDS)
    ref = build_transformer(_cfg(), B, attention="flash")
    assert got == sum(op.fwd_flops() for la in ref.layers for op in la.ops if op.kind in CONTRACTION_KINDS)


def test_job_model_features_reach_the_built_model() -> None:
    base = {"model": {"name": "custom", "layers": L, "hidden": H, "heads": A, "ffn": F, "vocab": V, "seq_len": S},
            "cluster": {"name": "dgx-a100", "nodes": 1, "gpus_per_node": 1}}
    plain = trainsim.simulate(base)
    alibi = trainsim.simulate({**base, "model": {**base["model"], "position": "alibi", "mlp": "relu2"}})
    assert plain.model_params - alibi.model_params == S * H
    llama = trainsim.simulate({**base, "model": {**base["model"], "mlp": "swiglu", "norm": "rmsnorm",
                                                 "bias": False, "dropout": False, "tied_embeddings": False}})
    # no biases, RMSNorm (h per norm), a gate matrix, an untied head
    block = 4 * H * H + 3 * H * F + 2 * H
    assert llama.model_params == L * block + V * H + S * H + H + V * H
    with pytest.raises(trainsim.ConfigError, match=r"^model\.mlp: resnet50 is not a transformer"):
        trainsim.simulate(model="resnet50", cluster="dgx-a100", nodes=1, mlp="relu2")
    with pytest.raises(trainsim.ConfigError, match=r"^model\.position"):
        trainsim.simulate({**base, "model": {**base["model"], "position": "sinusoidal"}})


def test_an_unknown_feature_from_python_is_a_config_error() -> None:
    with pytest.raises(trainsim.ConfigError, match=r"^model\.mlp: unknown mlp 'geglu'"):
        build_transformer(replace(_cfg(), mlp="geglu"), 1)


def test_nemo_recipes_run_tp_with_sp_and_comm_overlap() -> None:
    """NeMo / Megatron-Bridge performance tables rarely state SP: their recipes run TP with SP and TP comm
    overlap; a stated value wins, and other sources keep Megatron's default (SP off)."""
    kw = {"tp": "2", "dp": "4", "seq_parallel": "not stated", "micro_batch": "1", "global_batch": "8"}
    nemo = _job(source="NeMo 24.07 performance summary", **kw)
    assert nemo.job["strategy"]["sequence_parallel"] and nemo.job["strategy"]["tp_comm_overlap"]
    assert "tp_comm_overlap" in nemo.assumptions
    stated = _strategy(source="NeMo 24.07 performance summary", **{**kw, "seq_parallel": "no"})
    assert not stated.get("sequence_parallel") and not stated.get("tp_comm_overlap")
    other = _strategy(**kw)
    assert not other.get("sequence_parallel") and not other.get("tp_comm_overlap")
