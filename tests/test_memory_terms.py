"""Memory terms beyond Korthikanti's per-layer formula: the pipeline hand-off checkpoint under full recompute,
the loss temporaries, framework-specific saved tensors. Every expected figure is computed by hand here."""

from __future__ import annotations

import pytest

from trainsim.compile.program import lower
from trainsim.strategy.precision import Precision
from trainsim.strategy.presets import ParallelSpec, build_strategy
from trainsim.workload.zoo import build_model

H, A, V, S, B = 256, 4, 1024, 128, 2


@pytest.mark.parametrize(("tp", "sp"), [(2, False), (2, True), (4, False)])
def test_full_recompute_frees_what_it_allocates_after_a_scattered_pipeline_hand_off(tp: int, sp: bool) -> None:
    """Megatron's scatter/gather hand-off sends 1/tp of the activation, but the receiving stage gathers it whole
    before its first layer runs, and that whole tensor is the layer's checkpoint: forward must allocate the
    b s h bf16 bytes its backward frees (a chunk that frees more never folds into periods, sim.periodic)."""
    mdl = build_model("custom", B, S, "flash", layers=4, hidden=H, heads=A, vocab=V)
    spec = ParallelSpec(tp=tp, pp=2, sequence_parallel=sp, recompute="full", micro_batch=B, global_batch=2 * B)
    prog = lower(build_strategy(mdl, spec), Precision())
    for ch in prog.chunks:
        alloc = sum(s.alloc_bytes for s in ch.fwd + ch.bwd)
        free = sum(s.free_bytes for s in ch.fwd + ch.bwd)
        assert alloc == pytest.approx(free, rel=1e-12) and alloc > 0
    last = prog.chunks[1]
    first_layer = last.layers[0]
    checkpoint = sum(s.alloc_bytes for s in last.fwd if s.layer == first_layer and s.phase == "fwd")
    assert checkpoint == 2.0 * B * S * H / (tp if sp else 1)  # the layer input, bf16, whole (or seq-split by SP)


# --- framework-specific saved tensors (workload.zoo.transformer; hand-computed per-layer bytes) ---------------

F = 512  # SwiGLU ffn width of the llama-shaped test layer
LLAMA = {"norm": "rmsnorm", "mlp": "swiglu", "position": "rope", "bias": False, "dropout": False,
         "tied_embeddings": False}


def _chunk(features: dict[str, object], tp: int = 1, sp: bool = False, pp: int = 1) -> list:
    mdl = build_model("custom", B, S, "flash", features=features, layers=2 * pp, hidden=H, heads=A, vocab=V,
                      ffn=F, kv_heads=A)
    spec = ParallelSpec(tp=tp, pp=pp, sequence_parallel=sp, micro_batch=B, global_batch=B * pp)
    return lower(build_strategy(mdl, spec), Precision()).chunks


def _layer_bytes(features: dict[str, object], tp: int = 1, sp: bool = False) -> float:
    ch = _chunk(features, tp, sp)[0]
    return sum(s.alloc_bytes - s.free_bytes for s in ch.fwd if s.layer == "layers.1")


def test_fused_llama_layer_keeps_its_inputs_and_flash_statistics() -> None:
    """The reference the framework variants add to: per token, norm inputs 2h each, QKV input 2h, q/k/v
    2(h + 2h) [MHA], proj input 2h, fc1 input 2h, the SwiGLU input 2(2f), fc2 input 2f; flash's fp32 lse 4a."""
    tokens = B * S
    expected = tokens * (2 * 2 * H + 2 * H + 2 * (H + 2 * H) + 2 * H + 2 * H + 2 * 2 * F + 2 * F + 4 * A)
    assert _layer_bytes(LLAMA) == expected


def test_unfused_glu_also_keeps_silus_output() -> None:
    """silu(gate) * up: the multiply keeps silu's bf16 output, f per token beside the gate and up halves."""
    assert _layer_bytes({**LLAMA, "glu": "unfused"}) - _layer_bytes(LLAMA) == B * S * 2 * F


def test_eager_rmsnorm_keeps_an_fp32_copy_and_the_bf16_normalised_tensor() -> None:
    """Two eager RMSNorms per layer, each 4h (fp32 x) + 2h (normalised) instead of 2h; eager SwiGLU +2f."""
    extra = _layer_bytes({**LLAMA, "kernels": "eager"}) - _layer_bytes(LLAMA)
    assert extra == B * S * (2 * (4 * H + 2 * H - 2 * H) + 2 * F)


@pytest.mark.parametrize("tp", [2, 4])
def test_gathered_sp_inputs_are_kept_whole_and_not_regathered(tp: int) -> None:
    """nanotron's synchronous column linears keep the all-gathered input of QKV and fc1: 2h bytes per token
    each instead of 2h / tp, and their backward all-gathers nothing again."""
    shard, whole = _layer_bytes(LLAMA, tp, True), _layer_bytes({**LLAMA, "sp_saves": "gathered"}, tp, True)
    assert whole - shard == 2 * (2 * B * S * H) * (1 - 1 / tp)
    regathers = [s for s in _chunk({**LLAMA, "sp_saves": "gathered"}, tp, True)[0].bwd
                 if s.layer == "layers.1" and s.kind == "collective" and ".input:" in s.label]
    assert regathers == []


@pytest.mark.parametrize(("loss", "temp_bytes"), [("upcast", 2.0), ("upcast_twice", 2.0 + 4.0)])
@pytest.mark.parametrize("tp", [1, 2])
def test_cross_entropy_peak_holds_its_temporaries_beside_the_fp32_softmax(loss: str, temp_bytes: float,
                                                                          tp: int) -> None:
    """The loss keeps the fp32 softmax (4 bytes per logit, vocab split over tp) and, while it runs, the bf16
    logits (+2) and with upcast_twice a second fp32 tensor (+4): allocated and freed by its own step, forward
    and backward."""
    head = _chunk({**LLAMA, "loss": loss}, tp)[0]
    logits = B * S * V / tp
    fwd = [s for s in head.fwd if s.layer == "head" and s.op is not None and s.op.name == "loss"]
    bwd = [s for s in head.bwd if s.layer == "head" and s.op is not None and s.op.name == "loss"]
    assert [(s.alloc_bytes, s.free_bytes) for s in fwd] == [(logits * (4 + temp_bytes), logits * temp_bytes)]
    assert [(s.alloc_bytes, s.free_bytes) for s in bwd] == [(logits * temp_bytes, logits * (4 + temp_bytes))]


def test_unknown_storage_feature_is_a_config_error() -> None:
    with pytest.raises(Exception, match="loss"):
        build_model("custom", B, S, features={**LLAMA, "loss": "fp64"}, layers=1, hidden=H, heads=A, vocab=V,
                    ffn=F)


def test_result_names_each_stages_memory_components_and_the_largest() -> None:
    """memory_per_stage splits static bytes into parameters, gradients, optimizer states and workspaces: they
    add up to static_bytes, and `largest` names the biggest of them and the activation peak."""
    from trainsim.api import simulate

    job = {"model": {"name": "gpt2"}, "cluster": {"name": "pcie-titanxp"},
           "strategy": {"dp": 4, "pp": 2, "global_batch": 8}}
    for fidelity in ("event", "analytic"):
        out = simulate({**job, "simulation": {"fidelity": fidelity}}).to_json()["memory_per_stage"]
        assert len(out) == 2
        for st in out:
            parts = dict(st["components_bytes"])
            static = {k: v for k, v in parts.items() if k != "activations"}
            assert set(static) == {"params", "grads", "optimizer_states", "workspaces"}
            assert sum(static.values()) == pytest.approx(st["static_bytes"], rel=1e-12)
            assert parts["optimizer_states"] == pytest.approx(2 * parts["params"], rel=1e-12)  # fp32: 2 moments
            assert parts["activations"] == st["activation_peak_bytes"]
            assert st["largest"] == max(parts, key=lambda k: parts[k])
