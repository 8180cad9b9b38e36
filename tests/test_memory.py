"""Memory: static bytes under ZeRO 0-3 by hand, activations per layer against Korthikanti et al. 2022, OOM."""

from __future__ import annotations

import pytest

from trainsim.api import simulate
from trainsim.compile.program import Program, lower
from trainsim.cost.memory import static_memory
from trainsim.strategy.precision import Precision
from trainsim.strategy.presets import ParallelSpec, build_strategy
from trainsim.workload.zoo import build_model

L, H, A, V, S = 2, 256, 4, 1024, 128


def gpt_params(layers: int, h: int, v: int, s: int) -> int:
    """GPT with biases: tied embedding V h, learned positions s h, 12h^2 + 13h per block, final LN 2h."""
    return v * h + s * h + layers * (12 * h * h + 13 * h) + 2 * h


def lowered(dp: int = 1, tp: int = 1, pp: int = 1, zero: int = 0, layers: int = L, **kw: object) -> Program:
    mdl = build_model("custom", dp, S, "flash", layers=layers, hidden=H, heads=A, vocab=V)
    spec = ParallelSpec(dp=dp, tp=tp, pp=pp, zero=zero, micro_batch=1, global_batch=dp * pp, **kw)
    return lower(build_strategy(mdl, spec), Precision())


def test_model_parameter_count_is_the_closed_form() -> None:
    mdl = build_model("custom", 1, S, layers=L, hidden=H, heads=A, vocab=V)
    assert mdl.params == gpt_params(L, H, V, S)
    head = next(la for la in mdl.layers if la.kind == "head")
    assert head.tied_to == "embedding" and head.stored_params - head.params == V * H


@pytest.mark.parametrize(("zero", "per_param"), [
    (0, (2.0, 2.0, 12.0)),
    (1, (2.0, 2.0, 12.0 / 4)),
    (2, (2.0, 2.0 / 4, 12.0 / 4)),
    (3, (2.0 / 4, 2.0 / 4, 12.0 / 4)),
])
def test_static_memory_under_zero_matches_rajbhandari(zero: int, per_param: tuple[float, float, float]) -> None:
    """ZeRO (Rajbhandari et al. 2020, fig. 1) with dp = 4 and the tied embedding stored once on one stage."""
    n = gpt_params(L, H, V, S)
    mem = static_memory(lowered(dp=4, zero=zero).chunks, Precision())
    assert mem.params_bytes == pytest.approx(per_param[0] * n, rel=1e-12)
    assert mem.grads_bytes == pytest.approx(per_param[1] * n, rel=1e-12)
    assert mem.optimizer_bytes == pytest.approx(per_param[2] * n, rel=1e-12)
    assert mem.total_bytes == pytest.approx(sum(per_param) * n, rel=1e-12)


def test_tied_weight_is_stored_and_reduced_once_on_one_stage_but_on_both_ends_of_a_pipeline() -> None:
    one = lowered(dp=2)
    assert sum(ch.params_local for ch in one.chunks) == gpt_params(L, H, V, S)
    grad_bytes = sum(s.size_bytes for ch in one.chunks for s in ch.grad_sync)
    assert grad_bytes == pytest.approx(2.0 * gpt_params(L, H, V, S), rel=1e-12)  # every gradient once, bf16
    two = lowered(dp=2, pp=2)
    first, last = two.chunks
    # Megatron keeps a copy of the word embedding on the last stage and all-reduces the two gradients
    assert first.params_local + last.params_local == gpt_params(L, H, V, S) + V * H
    assert first.embedding_grad_bytes == last.embedding_grad_bytes == 2.0 * V * H


def test_tensor_parallel_shards_weights_and_column_biases_not_norms_or_row_biases() -> None:
    tp = 4
    prog = lowered(tp=tp)
    per_layer = 12 * H * H / tp + (3 * H + 4 * H) / tp + (H + H) + 4 * H  # qkv/fc1 biases split; proj/fc2, LNs not
    expected = V * H / tp + S * H + L * per_layer + 2 * H  # vocab-parallel embedding, replicated positions
    assert sum(ch.params_local for ch in prog.chunks) == pytest.approx(expected, rel=1e-12)


# --- activations (Korthikanti et al. 2022, "Reducing Activation Recomputation", Table 2) -----------------

GH, GA, GS, GB, GT = 12288, 96, 2048, 1, 8  # GPT-3 175B layer, micro-batch 1, tp 8


def layer_activation_bytes(tp: int, sp: bool, recompute: str) -> float:
    mdl = build_model("custom", GB, GS, "unfused", layers=2, hidden=GH, heads=GA, vocab=51200)
    spec = ParallelSpec(tp=tp, sequence_parallel=sp, recompute=recompute, micro_batch=GB, global_batch=GB)
    ch = lower(build_strategy(mdl, spec), Precision()).chunks[0]
    return sum(s.alloc_bytes for s in ch.fwd if s.layer == "layers.1")


SBH = GS * GB * GH


@pytest.mark.parametrize(("tp", "sp", "recompute", "expected"), [
    (1, False, "none", SBH * (34 + 5 * GA * GS / GH)),
    (GT, False, "none", SBH * (10 + 24 / GT + 5 * GA * GS / (GH * GT))),
    (GT, True, "none", SBH * (34 + 5 * GA * GS / GH) / GT),
    (GT, True, "selective", SBH * 34 / GT),
    (GT, False, "selective", SBH * (10 + 24 / GT)),
    (1, False, "full", 2 * SBH),
    (GT, False, "full", 2 * SBH),
    (GT, True, "full", 2 * SBH / GT),
])
def test_activation_memory_per_layer(tp: int, sp: bool, recompute: str, expected: float) -> None:
    assert layer_activation_bytes(tp, sp, recompute) == expected


def test_recompute_rematerialises_what_forward_dropped() -> None:
    mdl = build_model("custom", GB, GS, "unfused", layers=2, hidden=GH, heads=GA, vocab=51200)
    spec = ParallelSpec(tp=GT, sequence_parallel=True, recompute="selective", micro_batch=GB, global_batch=GB)
    ch = lower(build_strategy(mdl, spec), Precision()).chunks[0]
    recomputed = sum(s.alloc_bytes for s in ch.bwd if s.layer == "layers.1" and s.phase == "recompute")
    assert recomputed == 5 * GA * GS * GS * GB / GT  # the attention scores, softmax and dropout mask
    kinds = {s.op.name for s in ch.bwd if s.layer == "layers.1" and s.phase == "recompute"}
    assert kinds == {"scores", "softmax", "attn_dropout", "context"}


# --- OOM verdict ----------------------------------------------------------------------------------------


def test_big_model_on_small_gpu_is_oom_with_advice_and_following_it_helps() -> None:
    job = {"model": {"name": "gpt2", "seq_len": 1024}, "cluster": {"name": "pcie-titanxp"},
           "strategy": {"dp": 8, "global_batch": 256, "micro_batch": 32}}
    r = simulate(job)
    assert r.oom and r.to_json()["oom"] is True
    assert r.advice and any("recompute" in tip for tip in r.advice)
    assert r.memory[0].peak_bytes > r.memory[0].capacity_bytes
    fixed = simulate({**job, "strategy": {**job["strategy"], "recompute": "full"}})
    assert fixed.memory[0].peak_bytes < r.memory[0].peak_bytes

    big = simulate({"model": {"name": "gpt3-13b", "seq_len": 1024, "layers": 4}, "cluster": {"name": "pcie-titanxp"},
                    "strategy": {"dp": 8, "global_batch": 8}})
    assert big.oom and any("zero" in tip for tip in big.advice)  # parameters and Adam states dominate


def test_small_model_fits_without_advice() -> None:
    r = simulate({"model": {"name": "gpt2"}, "cluster": {"name": "pcie-titanxp"}, "strategy": {"dp": 8, "global_batch": 8}})
    assert not r.oom and r.advice == []
    assert all(0 < m.peak_bytes <= m.capacity_bytes for m in r.memory)
    assert r.memory[0].peak_bytes == r.memory[0].static_bytes + r.memory[0].activation_peak_bytes


@pytest.mark.parametrize(("name", "params"), [("resnet50", 25_557_032), ("vgg16", 138_357_544)])  # torchvision
@pytest.mark.parametrize("zero", [0, 1, 3])
def test_cnn_static_memory_counts_every_parameter_once(name: str, params: int, zero: int) -> None:
    """Batch-norm scales and shifts are parameters too (they have no weight tensor of their own)."""
    mdl = build_model(name, 8)
    assert mdl.params == params
    prog = lower(build_strategy(mdl, ParallelSpec(dp=8, zero=zero, micro_batch=1, global_batch=8)), Precision())
    per_param = {0: 16.0, 1: 2 + 2 + 12 / 8, 3: 16.0 / 8}[zero]
    assert static_memory(prog.chunks, Precision()).total_bytes == pytest.approx(per_param * params, rel=1e-12)
    synced = sum(s.size_bytes for ch in prog.chunks for s in ch.grad_sync)
    assert synced == pytest.approx(2.0 * params, rel=1e-12)  # every gradient reduced once, in bf16
