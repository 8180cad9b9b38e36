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
    assert moe_model_fields("num-experts=8; moe-router-topk=2; moe-ffn-hidden-size=1024", mlm) == {
        "experts": 8, "top_k": 2, "expert_ffn": 1024}
    assert moe_model_fields("num-experts=8; moe-shared-expert-intermediate-size=512; moe-layer-freq=([0]*1+[1]*3)",
                            mlm) == {"experts": 8, "top_k": 2, "shared_expert_ffn": 512, "first_dense_layers": 1}
    assert moe_model_fields("num-experts=4", mlm) == {"experts": 4, "top_k": 2}  # Megatron's default top-k
    assert moe_model_fields("num-experts=4; expert-tensor-parallel-size=2", mlm) == {"experts": 4, "top_k": 2}


def test_only_megatron_flags_map() -> None:
    """Another framework's defaults (top-k, expert TP) are not Megatron's: its MoE rows keep a named skip."""
    assert "only Megatron-Core" in str(moe_model_fields("num-experts=8", "torchtitan"))
    assert "only Megatron-Core" in str(moe_model_fields("", "Megatron-LM"))  # experts not in the flags


@pytest.mark.parametrize(("settings", "reason"), [
    ("num-experts=8; moe-layer-freq=([1]*1+[0]*3)", "moe-layer-freq"),
    ("num-experts=8; moe-layer-freq=2", "moe-layer-freq"),
])
def test_unrepresentable_moe_is_named(settings: str, reason: str) -> None:
    got = moe_model_fields(settings, "megatron_ci_golden")
    assert isinstance(got, str) and reason in got


def _moe_row(settings: str, **columns: str) -> dict[str, str]:
    return training_row(source_group="megatron_ci_golden", arch=MOE_ARCH, n_layers="4", hidden="512",
                        n_heads="8", ffn_hidden="2048", other_settings=settings, **columns)


def test_validate_maps_an_every_layer_moe_row() -> None:
    rj = tr.row_job(_moe_row("num-experts=8; moe-router-topk=2; moe-ffn-hidden-size=1024; moe-grouped-gemm=True; "
                             "moe-token-dispatcher-type=alltoall", n_gpus="8", dp="8", ep="4"))
    assert not isinstance(rj, str), rj
    assert (rj.job["model"]["experts"], rj.job["model"]["top_k"], rj.job["model"]["expert_ffn"]) == (8, 2, 1024)
    assert rj.job["strategy"]["ep"] == 4
    assert "alltoall" in rj.assumptions["mixture_of_experts"]
    assert trainsim.simulate(rj.job).iteration_time_s > 0


def test_validate_maps_a_shared_expert_and_first_dense_layers() -> None:
    rj = tr.row_job(_moe_row("num-experts=8; moe-shared-expert-intermediate-size=512; moe-layer-freq=([0]*1+[1]*3)",
                             n_gpus="8", dp="8", ep="2"))
    assert not isinstance(rj, str), rj
    model = rj.job["model"]
    assert (model["shared_expert_ffn"], model["first_dense_layers"], model["ffn"]) == (512, 1, 2048)
    assert "shared expert of 512" in rj.assumptions["mixture_of_experts"]
    assert trainsim.simulate(rj.job).iteration_time_s > 0


def test_expert_width_shared_expert_and_first_dense_layers_count_by_hand() -> None:
    """A 4-layer GPT-style MoE (h 256, 8 experts, biases in the dense MLPs, none in the experts): each layer's
    attention and norms 4h^2 + 8h, a router 8h, experts 8 x 2 h f_e; a shared expert adds a dense MLP of its width
    (2 h f_s + f_s + h); a first dense layer swaps its router, experts and shared expert for the dense MLP of ffn
    features (2 h f + f + h). Embedding, positions and the final norm: V h + S h + 2h."""
    h, v, s, f, e = 256, 1024, 128, 1024, 8
    base = {"name": "custom", "layers": 4, "hidden": h, "heads": 4, "vocab": v, "seq_len": s, "experts": e,
            "top_k": 2, "ffn": f}
    ends = v * h + s * h + 2 * h
    attention = 4 * h * h + 8 * h

    def params(**extra: int) -> int:
        job = {"model": {**base, **extra}, "cluster": {"name": "dgx-a100", "nodes": 1},
               "strategy": {"dp": 8, "ep": 2, "micro_batch": 1, "global_batch": 8}}
        result = trainsim.simulate(job)
        assert result.iteration_time_s > 0
        return result.model_params

    assert params() == ends + 4 * (attention + e * h + e * 2 * h * f)
    fe, fs = 256, 512
    moe_layer = attention + e * h + e * 2 * h * fe + (2 * h * fs + fs + h)
    assert params(expert_ffn=fe, shared_expert_ffn=fs) == ends + 4 * moe_layer
    dense_layer = attention + 2 * h * f + f + h
    assert params(expert_ffn=fe, shared_expert_ffn=fs, first_dense_layers=1) == ends + 3 * moe_layer + dense_layer


@pytest.mark.parametrize(("model", "field"), [
    ({"expert_ffn": 256}, "model.expert_ffn"),
    ({"shared_expert_ffn": 512}, "model.shared_expert_ffn"),
    ({"experts": 8, "first_dense_layers": 2}, "model.first_dense_layers"),
])
def test_moe_keys_refused_where_they_mean_nothing(model: dict[str, int], field: str) -> None:
    job = {"model": {"name": "custom", "layers": 2, "hidden": 256, "heads": 4, **model},
           "cluster": {"name": "dgx-a100", "nodes": 1}}
    with pytest.raises(ConfigError) as err:
        trainsim.simulate(job)
    assert err.value.field == field


def test_the_router_is_one_gemm_over_the_experts_and_the_experts_a_grouped_one() -> None:
    """The router's expert scores (weight (e, h) on the tokens) are one GEMM whose N is the expert count, priced
    as a dense projection of that width; only the expert MLPs (whose input carries e) are a batch of GEMMs.
    Taking the router's e as a batch made it 128 GEMMs of N = 1: 29x its cost, slower than the expert MLP it feeds."""
    from trainsim.cost.calibration import load_calibration
    from trainsim.cost.compute import RooflineCompute
    from trainsim.hardware.devices import get_device
    from trainsim.workload.ir import Op, OpKind

    h100 = get_device("h100-sxm")
    compute = RooflineCompute(load_calibration().compute_for(h100))
    moe = build_model("custom", 1, 4096, "flash", {"mlp": "swiglu", "bias": False, "experts": 128, "top_k": 4},
                      layers=1, hidden=2880, heads=64, kv_heads=8, ffn=2880, vocab=1000)
    ops = {op.name: op for layer in moe.layers for op in layer.ops}
    router, fc1 = ops["router"], ops["expert_fc1"]
    dense = Op("dense", OpKind.MATMUL, {"b": 1, "s": 4096, "h": 2880, "n": 128}, (("b", "s", "h"),), ("b", "s", "n"),
               weight=("n", "h"))
    local = dict(router.dims)
    t_router = compute.op_time(router, local, "fwd", h100, "bf16")
    # its score function, top-k and aux-loss kernels beside the GEMM each add a kernel gap (MOE_ROUTER_KERNELS)
    gaps = router.side_kernels[0] * compute.params.kernel_overhead_s
    assert t_router == pytest.approx(compute.op_time(dense, dict(dense.dims), "fwd", h100, "bf16") + gaps)
    assert compute._mnk(router, local) == (4096, 128, 2880, 1)
    assert compute._mnk(fc1, dict(fc1.dims))[3] == 128  # the experts: a grouped GEMM, one per expert
    # 2 x 4096 x 2880 x 128 FLOPs: the router is a fraction of the experts' time, not a multiple of it
    assert t_router < 0.1 * compute.op_time(fc1, dict(fc1.dims), "fwd", h100, "bf16")
