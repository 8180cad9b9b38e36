"""Memory: static bytes under ZeRO 0-3 by hand, activations per layer against Korthikanti et al. 2022, OOM."""

from __future__ import annotations

import math

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


# --- state layouts (issue 22): master weights, 8-bit moments, DDP bucket copies, optimizer in backward ---------

EIGHT_BIT = 2 * (1 + 4 / 2048)  # two 1-byte moments + one fp32 scale per 2048-element block each


@pytest.mark.parametrize(("dtype", "kw", "bytes_per_param"), [
    ("bf16", {}, (2.0, 4.0, 12.0)),  # Megatron: bf16 weights, fp32 gradients, fp32 master + two moments
    ("bf16", {"master_weights": False}, (2.0, 2.0, 4.0)),  # bf16-true: two bf16 moments, no master
    ("fp16", {"master_weights": False}, (2.0, 2.0, 4.0)),
    ("fp32", {}, (4.0, 4.0, 8.0)),
    ("fp32", {"master_weights": False}, (4.0, 4.0, 8.0)),  # fp32 weights are their own master
    ("bf16", {"optimizer": "adam_8bit"}, (2.0, 4.0, 4.0 + EIGHT_BIT)),
    ("bf16", {"optimizer": "adam_8bit", "master_weights": False}, (2.0, 2.0, EIGHT_BIT)),
    ("fp8", {}, (2.0, 2.0, 12.0)),
])
def test_state_bytes_per_parameter_by_hand(dtype: str, kw: dict[str, object],
                                           bytes_per_param: tuple[float, float, float]) -> None:
    p = Precision.named(dtype, **kw)  # type: ignore[arg-type]
    assert (p.param_bytes, p.grad_bytes, p.optimizer_bytes) == pytest.approx(bytes_per_param, rel=1e-15)
    assert p.state_bytes(10, 10, 10) == pytest.approx(10 * sum(bytes_per_param), rel=1e-15)


def test_named_precision_refuses_what_it_cannot_price() -> None:
    with pytest.raises(ValueError, match="unknown optimizer"):
        Precision.named("bf16", optimizer="sgd")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="grad_buffers"):
        Precision.named("bf16", grad_buffers=0)


def test_bucket_copy_doubles_the_gradients_and_optimizer_in_backward_keeps_one_layer() -> None:
    n = gpt_params(L, H, V, S)
    chunks = lowered(dp=4).chunks
    twice = static_memory(chunks, Precision(grad_buffers=2))
    assert twice.grads_bytes == pytest.approx(2 * 2.0 * n, rel=1e-12)
    assert twice.params_bytes == pytest.approx(2.0 * n, rel=1e-12)
    assert Precision(grad_buffers=2).state_bytes(n, n, n) == pytest.approx((2 + 4 + 12) * n, rel=1e-12)
    # with the optimizer in backward only the largest layer's gradients are alive at once: a block of
    # 12h^2 + 13h parameters (the embedding has V h + S h = 294,912; the head's tied weight is the embedding's)
    block = 12 * H * H + 13 * H
    assert block > V * H + S * H
    inbwd = static_memory(chunks, Precision(optimizer_in_backward=True))
    assert inbwd.grads_bytes == pytest.approx(2.0 * block, rel=1e-12)
    assert inbwd.optimizer_bytes == pytest.approx(12.0 * n, rel=1e-12)
    assert Precision(optimizer_in_backward=True).state_bytes(n, n, n) == pytest.approx(14.0 * n, rel=1e-12)


def test_gemm_workspaces_by_generation() -> None:
    from trainsim.cost.memory import workspace_bytes
    from trainsim.hardware.devices import get_device

    mib = 2**20
    assert workspace_bytes(get_device("a100-80gb")) == (8 * 1024 + 128) * 1024 + mib  # ':4096:2:16:8' + Lt 1 MiB
    assert workspace_bytes(get_device("v100-sxm2-16gb")) == 8.125 * mib + mib
    for name in ("h100-sxm", "h200-sxm", "b200"):
        assert workspace_bytes(get_device(name)) == 33 * mib  # ':4096:8' + Lt 1 MiB
    mem = static_memory(lowered().chunks, Precision(), get_device("h100-sxm"))
    assert mem.workspace_bytes == 33 * mib
    assert mem.total_bytes == pytest.approx(16.0 * gpt_params(L, H, V, S) + 33 * mib, rel=1e-12)


def _small_job(strategy: dict[str, object], simulation: dict[str, object]) -> dict[str, object]:
    """The small GPT on one A100 node's first dp x pp GPUs (all 8 when dp is left to the cluster)."""
    model = {"name": "custom", "layers": L, "hidden": H, "heads": A, "vocab": V, "seq_len": S}
    world = int(strategy.get("dp", 8)) * int(strategy.get("pp", 1))  # type: ignore[call-overload]
    return {"model": model, "cluster": {"name": "dgx-a100", "nodes": 1, "gpus_per_node": world},
            "strategy": strategy, "simulation": {"dtype": "bf16", **simulation}}


def test_simulated_static_memory_follows_the_state_keys_by_hand() -> None:
    n = gpt_params(L, H, V, S)
    ws = (8 * 1024 + 128) * 1024 + 2**20  # A100
    one = {"dp": 1, "micro_batch": 1, "global_batch": 1}
    cases = [({}, 2 + 4 + 12), ({"master_weights": False}, 2 + 2 + 4),
             ({"optimizer": "adam_8bit"}, 2 + 4 + 4 + EIGHT_BIT),
             ({"master_weights": False, "optimizer": "adam_8bit"}, 2 + 2 + EIGHT_BIT)]
    base = simulate(_small_job(one, {}))
    for sim, per_param in cases:
        r = simulate(_small_job(one, sim))
        assert r.memory[0].static_bytes == pytest.approx(per_param * n + ws, rel=1e-12), sim
        assert r.iteration_time_s == base.iteration_time_s  # one GPU: the states' layout moves no time
    dp8 = {"dp": 8, "micro_batch": 1, "global_batch": 8}
    r = simulate(_small_job(dp8, {"master_weights": False, "grad_bucket_copy": True}))
    assert r.memory[0].static_bytes == pytest.approx((2 + 2 * 2 + 4) * n + ws, rel=1e-12)
    r = simulate(_small_job(dp8, {"optimizer_in_backward": True}))
    assert r.memory[0].static_bytes == pytest.approx((2 + 12) * n + 4 * (12 * H * H + 13 * H) + ws, rel=1e-12)


def test_bf16_true_reduces_gradients_in_bf16() -> None:
    """Without a master copy the gradients are bf16, so the data-parallel all-reduce moves half the bytes."""
    n = gpt_params(L, H, V, S)
    mdl = build_model("custom", 4, S, "flash", layers=L, hidden=H, heads=A, vocab=V)
    spec = ParallelSpec(dp=4, micro_batch=1, global_batch=4)
    for prec, per_grad in ((Precision.named("bf16"), 4.0), (Precision.named("bf16", master_weights=False), 2.0)):
        prog = lower(build_strategy(mdl, spec), prec)
        assert sum(s.size_bytes for ch in prog.chunks for s in ch.grad_sync) == pytest.approx(per_grad * n, rel=1e-12)


@pytest.mark.parametrize(("strategy", "simulation", "field"), [
    ({"dp": 8, "fsdp": True}, {"grad_bucket_copy": True}, "simulation.grad_bucket_copy"),
    ({"dp": 8, "zero": 2}, {"grad_bucket_copy": True}, "simulation.grad_bucket_copy"),
    ({"dp": 1}, {"grad_bucket_copy": True}, "simulation.grad_bucket_copy"),
    ({"dp": 4, "pp": 2}, {"optimizer_in_backward": True}, "simulation.optimizer_in_backward"),
    ({"dp": 8, "micro_batch": 1, "global_batch": 16}, {"optimizer_in_backward": True},
     "simulation.optimizer_in_backward"),
])
def test_state_keys_that_contradict_the_strategy_are_refused(strategy: dict[str, object],
                                                              simulation: dict[str, object], field: str) -> None:
    from trainsim.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        simulate(_small_job(strategy, simulation))
    assert err.value.field == field


def test_optimizer_in_backward_refuses_a_derived_accumulation() -> None:
    """dp left to the cluster's size: the accumulation is only known once the tree is built."""
    from trainsim.errors import ConfigError

    job = _small_job({"micro_batch": 1, "global_batch": 16}, {"optimizer_in_backward": True})
    with pytest.raises(ConfigError, match="accumulates 2 micro-batch"):
        simulate(job)


def test_fp8_params_keep_the_blocks_linear_weights_in_one_byte() -> None:
    """simulation.fp8_params (Megatron --fp8-param-gather, torchao float8 all-gather): each block's four linear
    weights (qkv 3h^2, proj h^2, fc1 4h^2, fc2 4h^2 = 12h^2 per block) take 1 byte instead of 2; embeddings,
    biases, norms stay in bf16. By hand on one GPU, then the ZeRO-1 parameter all-gather and the ZeRO-3 gather."""
    from trainsim.compile.program import layer_sync

    n = gpt_params(L, H, V, S)
    one = {"dp": 1, "micro_batch": 1, "global_batch": 1}
    gemm = L * 12 * H * H
    for sim, params_bytes in (({"dtype": "fp8"}, 2 * n), ({"dtype": "fp8", "fp8_params": True}, 2 * n - gemm)):
        job = _small_job(one, sim)
        job["cluster"] = {"name": "dgx-h100", "nodes": 1, "gpus_per_node": 1}
        r = simulate(job)
        assert r.memory[0].components_bytes["params"] == pytest.approx(params_bytes, rel=1e-12), sim
    mdl = build_model("custom", 4, S, "flash", layers=L, hidden=H, heads=A, vocab=V)
    block = mdl.layers[2]
    assert block.kind == "transformer"
    for zero, gathered in ((1, "post_step"), (3, "gather")):
        tree = build_strategy(mdl, ParallelSpec(dp=4, zero=zero, micro_batch=1, global_batch=4))
        leaf = next(n for n, _, _ in tree.resolve().leaves() if n.layer is block).leaf
        sizes = []
        for prec in (Precision.named("fp8"), Precision.named("fp8", fp8_params=True)):
            ls = layer_sync(tree, prec, block, leaf, False)
            sizes.append(sum(s.size_bytes for s in ls.post_step) if gathered == "post_step" else ls.gather_bytes)
            stored = 12 * H * H / (4 if zero == 3 else 1)  # ZeRO-3 stores a quarter of each weight on dp 4
            assert ls.param_bytes_adjust == (-stored if prec.fp8_params else 0.0)  # 1 byte each instead of 2
        # ZeRO-1 gathers the whole block after the step (its 13h biases and norms stay 2 bytes); ZeRO-3 gathers
        # the weights before use
        want = (2 * (12 * H * H + 13 * H), 12 * H * H + 2 * 13 * H) if zero == 1 else (2 * 12 * H * H, 12 * H * H)
        assert sizes == [pytest.approx(w, rel=1e-12) for w in want], zero


def test_fp8_params_need_fp8_training() -> None:
    from trainsim.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        simulate(_small_job({"dp": 1, "micro_batch": 1, "global_batch": 1}, {"fp8_params": True}))
    assert err.value.field == "simulation.fp8_params"
    with pytest.raises(ValueError, match="fp8_params"):
        Precision.named("bf16", fp8_params=True)


def test_activation_offloading_moves_each_checkpointed_input_to_the_host() -> None:
    """strategy.offload_activations with recompute full: each block's checkpointed input (s b h bf16 values) is
    stored to CPU memory after the block's forward and loaded before its backward, on the memory stream. The
    activation peak drops by the checkpoints no longer held: in backward the GPU holds the block's own and the
    next one's (prefetched), so all but two at least, all of them at most. (Blocks big enough that a store, 34
    MB over PCIe, takes less than a block's forward: the stores keep up.)"""
    layers, h, s, b = 6, 2048, 4096, 2
    job = {"model": {"name": "custom", "layers": layers, "hidden": h, "heads": 16, "vocab": V, "seq_len": s},
           "cluster": {"name": "dgx-a100", "nodes": 1, "gpus_per_node": 1},
           "strategy": {"dp": 1, "micro_batch": b, "global_batch": b, "recompute": "full"},
           "simulation": {"dtype": "bf16"}}
    plain = simulate(job, timeline=True)
    job["strategy"]["offload_activations"] = True
    off = simulate(job, timeline=True)
    checkpoint = 2.0 * s * b * h
    assert off.graph is not None
    stores = [n for n in off.graph.name if n.endswith("activations:store")]
    loads = [n for n in off.graph.name if n.endswith("activations:load")]
    assert len(stores) == len(loads) == layers
    drop = plain.memory[0].activation_peak_bytes - off.memory[0].activation_peak_bytes
    assert (layers - 2) * checkpoint - 1e-6 <= drop <= layers * checkpoint + 1e-6
    assert off.memory[0].static_bytes == plain.memory[0].static_bytes


@pytest.mark.parametrize(("strategy", "fix"), [({"recompute": "selective"}, "recompute full"),
                                                ({"recompute": "full", "offload": "nvme"}, "offload cpu")])
def test_activation_offloading_needs_full_recompute_and_host_memory(strategy: dict[str, object], fix: str) -> None:
    from trainsim.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        simulate(_small_job({"dp": 1, "micro_batch": 1, "global_batch": 1, "offload_activations": True, **strategy},
                            {}))
    assert err.value.field == "strategy.offload_activations" and fix in str(err.value)


def test_lora_freezes_the_base_and_trains_rank_r_adapters_by_hand() -> None:
    """model.lora_rank r on q and v (Hu et al. 2021): every base parameter frozen (no gradients or optimizer
    states), adapters r (in + out) per adapted matrix trained: L r 4h for the small GPT (q and v are h x h). In
    mixed precision the adapters take 2 + 4 + 12 bytes, the frozen base 2. QLoRA (lora_base nf4) stores the
    adapted q and v parts of each qkv matrix (2h^2 of its 3h^2) at 4.127 bits. The backward skips the frozen
    weights' gradient GEMMs, so the step is shorter."""
    from trainsim.strategy.precision import NF4_BYTES_PER_PARAM

    n, r = gpt_params(L, H, V, S), 8
    adapters = L * r * 4 * H
    one = {"dp": 1, "micro_batch": 1, "global_batch": 1}
    full = simulate(_small_job(one, {}))
    job = _small_job(one, {})
    job["model"].update(lora_rank=r, lora_targets=["q", "v"])
    lora = simulate(job)
    parts = lora.memory[0].components_bytes
    assert lora.model_params == n + adapters
    assert parts["params"] == pytest.approx(2 * (n + adapters), rel=1e-12)
    assert parts["grads"] == pytest.approx(4 * adapters, rel=1e-12)
    assert parts["optimizer_states"] == pytest.approx(12 * adapters, rel=1e-12)
    assert lora.iteration_time_s < full.iteration_time_s
    job["model"]["lora_base"] = "nf4"
    qlora = simulate(job).memory[0].components_bytes
    assert qlora["params"] == pytest.approx(2 * (n + adapters) - L * 2 * H * H * (2 - NF4_BYTES_PER_PARAM), rel=1e-12)
    assert qlora["grads"] == parts["grads"]


def test_chunked_cross_entropy_keeps_the_bf16_logits_and_one_fp32_chunk() -> None:
    """model.loss chunked (torchtune's CEWithChunkedOutputLoss, 8 chunks): the loss keeps the bf16 logits (2 bytes
    a logit) and upcasts one chunk at a time (4 / 8), against upcast's fp32 softmax (4) and bf16 logits beside it
    (2): 3.5 bytes a logit less at the loss, where a large vocabulary puts the activation peak."""
    vocab, s, b = 32768, 512, 2
    peaks = []
    for loss in ("upcast", "chunked"):
        job = _small_job({"dp": 1, "micro_batch": b, "global_batch": b}, {})
        job["model"].update(vocab=vocab, seq_len=s, loss=loss)
        peaks.append(simulate(job).memory[0].activation_peak_bytes)
    assert peaks[0] - peaks[1] == pytest.approx(3.5 * b * s * vocab, rel=0.01)


def test_adafactor_keeps_row_and_column_statistics_by_hand() -> None:
    """simulation.optimizer adafactor (Hugging Face's, no first moment): a weight matrix n = r x c keeps r + c
    second-moment values, a vector (bias, norm scale) one per element, fp32 when training in fp32 (no master
    copy). The small GPT's blocks: qkv 3h x h, proj, fc1 4h x h, fc2; the embedding V x h (the tied LM head
    stores none of its own). The learned position table S x h, which the IR carries as the embedding's extra
    parameters, keeps one value per element (S h; Hugging Face would factor it too: S + h)."""
    one = {"dp": 1, "micro_batch": 1, "global_batch": 1}
    r = simulate(_small_job(one, {"dtype": "fp32", "optimizer": "adafactor"}))
    matrices = L * ((3 * H + H) + (H + H) + (4 * H + H) + (H + 4 * H)) + (V + H)
    vectors = L * (3 * H + H + 4 * H + H + 4 * H) + 2 * H + S * H  # biases, norms, the final norm, positions
    assert r.memory[0].components_bytes["optimizer_states"] == pytest.approx(4 * (matrices + vectors), rel=1e-12)
    adam = simulate(_small_job(one, {"dtype": "fp32"})).memory[0].components_bytes
    assert adam["optimizer_states"] == pytest.approx(8 * gpt_params(L, H, V, S), rel=1e-12)
    assert r.memory[0].components_bytes["params"] == adam["params"]


def test_muon_keeps_one_momentum_per_block_matrix_by_hand() -> None:
    """simulation.optimizer muon (Megatron-Core's): each block's weight matrix keeps an fp32 master copy and one
    momentum (8 bytes), where AdamW keeps two moments (12); the embedding (and the LM head it is tied to) and the
    vectors stay with AdamW."""
    one = {"dp": 1, "micro_batch": 1, "global_batch": 1}
    n = gpt_params(L, H, V, S)
    block_matrices = L * 12 * H * H
    r = simulate(_small_job(one, {"optimizer": "muon"})).memory[0].components_bytes
    assert r["optimizer_states"] == pytest.approx(12 * n - 4 * block_matrices, rel=1e-12)


def test_fp8_activations_cache_the_blocks_linear_inputs_in_one_byte() -> None:
    """simulation.fp8_activations (DeepSeek-V3's low-precision activation storage): the input each block linear
    keeps for its backward takes 1 byte and a 1x128 tile's fp32 scale instead of 2; the output layer's does not,
    nor do the other saved tensors (norm inputs, attention's); the times do not change."""
    from trainsim.api import costed_program, job_tree
    from trainsim.config import JobConfig
    from trainsim.strategy.precision import FP8_ACTIVATION_BYTES

    steps = {}
    results = {}
    for cached in (False, True):
        job = _small_job({"dp": 1, "micro_batch": 1, "global_batch": 1}, {"dtype": "fp8", "fp8_activations": cached})
        job["cluster"] = {"name": "dgx-h100", "nodes": 1, "gpus_per_node": 1}
        cfg = JobConfig.model_validate(job)
        cl, _, tree = job_tree(cfg)
        program = costed_program(tree, cl, cfg.simulation).program
        steps[cached] = {s.label: s.alloc_bytes for ch in program.chunks for s in ch.fwd if s.kind == "compute"}
        results[cached] = simulate(job)
    plain, fp8 = steps[False], steps[True]
    assert plain.keys() == fp8.keys()
    block = [k for k in plain if k.startswith("layers.0.")]
    linears = [k for k in block if k.split(".")[-1] in ("qkv", "proj", "fc1", "fc2")]
    assert len(linears) == 4
    for k in linears:  # the input of a linear is all it keeps (b x s x its input width, bf16 -> fp8 + scales)
        assert fp8[k] == pytest.approx(plain[k] * FP8_ACTIVATION_BYTES / 2, rel=1e-12), k
    assert any(fp8[k] == plain[k] > 0 for k in block if k not in linears)  # norm inputs, attention: unchanged
    head = [k for k in plain if not k.startswith("layers.") and plain[k] > 0]
    assert head and all(fp8[k] == plain[k] for k in head)
    assert results[True].iteration_time_s == pytest.approx(results[False].iteration_time_s, rel=1e-12)
    assert results[True].memory[0].activation_peak_bytes < results[False].memory[0].activation_peak_bytes


def test_fp8_activations_need_fp8_training() -> None:
    from trainsim.errors import ConfigError

    with pytest.raises(ConfigError, match="simulation.fp8_activations"):
        simulate(_small_job({"dp": 1, "micro_batch": 1, "global_batch": 1}, {"dtype": "bf16", "fp8_activations": True}))


def test_fp8_activations_leave_the_router_and_cache_the_experts() -> None:
    """A MoE block under fp8_activations: the experts' linear inputs are cached in FP8, the router's input stays
    in BF16 (DeepSeek-V3 keeps its gating in higher precision)."""
    from trainsim.api import costed_program, job_tree
    from trainsim.config import JobConfig
    from trainsim.strategy.precision import FP8_ACTIVATION_BYTES

    allocs = []
    for cached in (False, True):
        job = {"model": {"name": "mixtral-8x7b", "layers": 2, "seq_len": 1024},
               "cluster": {"name": "dgx-h100", "nodes": 1}, "strategy": {"ep": 8, "dp": 8, "global_batch": 8},
               "simulation": {"dtype": "fp8", "fp8_activations": cached}}
        cfg = JobConfig.model_validate(job)
        cl, _, tree = job_tree(cfg)
        chunk = costed_program(tree, cl, cfg.simulation).program.chunks[0]
        allocs.append({s.label: s.alloc_bytes for s in chunk.fwd if s.label.startswith("layers.0.")})
    plain, fp8 = allocs
    assert fp8["layers.0.router"] == plain["layers.0.router"] > 0
    for k in ("layers.0.expert_fc1", "layers.0.qkv", "layers.0.proj"):
        assert fp8[k] == pytest.approx(plain[k] * FP8_ACTIVATION_BYTES / 2, rel=1e-12), k


def test_fp8_params_leave_the_router_weight_in_bf16() -> None:
    """fp8_params keeps the FP8 GEMMs' weights in one byte: a MoE block's attention and expert weights, not its
    router's (which runs in BF16); by hand on one Mixtral block: the stored-bytes adjustment is one byte per
    element of every weighted linear but the router's."""
    from trainsim.compile.program import layer_sync
    from trainsim.strategy.precision import Precision

    mdl = build_model("mixtral-8x7b", 1, 1024, "flash", layers=1)
    block = next(la for la in mdl.layers if la.kind == "transformer")
    tree = build_strategy(mdl, ParallelSpec(dp=1, zero=1, micro_batch=1, global_batch=1))
    leaf = next(n for n, _, _ in tree.resolve().leaves() if n.layer is block).leaf
    ls = layer_sync(tree, Precision.named("fp8", fp8_params=True), block, leaf, False)
    linears = [op for op in block.ops if op.kind.name == "MATMUL" and op.weight is not None]
    assert any(op.name == "router" for op in linears)
    low = sum(math.prod(op.dims[d] for d in op.weight) for op in linears if op.name != "router")
    assert ls.param_bytes_adjust == pytest.approx(-low, rel=1e-12)
