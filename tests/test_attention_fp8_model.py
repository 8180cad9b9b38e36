"""Fused-attention efficiency by kernel and shape, and FP8 semantics (cost/compute.py): closed-form answers
from the calibration's constants, monotonic properties, the fit recovering a kernel's speed, and how
`validate` maps a published run's attention kernel."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from training_row import training_row

import trainsim
from trainsim.cost.calibration import load_calibration
from trainsim.cost.compute import RooflineCompute
from trainsim.cost.fit_compute import attention_op, fit_compute_params, gemm_op, predict_attention
from trainsim.hardware.devices import get_device
from trainsim.validate.training_runs import row_job
from trainsim.workload.ir import Op, OpKind

H100 = get_device("h100-sxm")
A100 = get_device("a100-80gb")
CAL = load_calibration()


def _model(device=H100) -> RooflineCompute:
    return RooflineCompute(CAL.compute_for(device))


def test_long_unmasked_head_dim_128_runs_at_the_flash_fraction() -> None:
    p = CAL.compute_for(H100)
    keys = 1 << 20
    op = attention_op(1, 8, keys, 128, causal=False)
    eff = _model().attention_efficiency(op, op.dims, bwd=False)
    assert eff == pytest.approx(p.flash_fraction_fwd * keys / (keys + p.attention_seq_half), rel=1e-12)
    assert _model().attention_efficiency(op, op.dims, bwd=True) == pytest.approx(
        p.flash_fraction_bwd * keys / (keys + p.attention_seq_half), rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(s=st.sampled_from([256, 512, 1024, 2048, 4096, 8192, 32768]), d=st.sampled_from([32, 64, 96, 128]),
       bwd=st.booleans())
def test_efficiency_grows_with_keys_and_head_dim_and_drops_under_causal(s: int, d: int, bwd: bool) -> None:
    m = _model()

    def eff(seq: int, hd: int, causal: bool) -> float:
        op = attention_op(2, 16, seq, hd, causal)
        return m.attention_efficiency(op, op.dims, bwd)

    assert eff(2 * s, d, False) > eff(s, d, False)
    assert eff(s, 128, False) >= eff(s, d, False)
    assert eff(s, 256, False) == eff(s, 128, False)  # head dims above 128 are not modelled as faster
    assert eff(s, d, True) < eff(s, d, False)


def test_kernel_speed_scales_compute_bound_time() -> None:
    """A long, compute-bound attention: the Triton kernel takes 1/speed as long as FlashAttention-2, FA3
    (on Hopper) 1/1.71 as long; on Ampere FA3 is not available and costs what FA2 does."""
    speeds = CAL.compute_for(H100).attention_kernel_speed
    base = attention_op(1, 16, 16384, 128, causal=True)
    t = {k: _model().op_time(dataclasses.replace(base, kernel=k), base.dims, "bwd", H100, "bf16")
         for k in ("flash", "flash3", "triton")}
    overhead = CAL.compute_for(H100).kernel_overhead_s
    assert (t["triton"] - overhead) / (t["flash"] - overhead) == pytest.approx(1.0 / speeds["triton"], rel=1e-9)
    assert (t["flash3"] - overhead) / (t["flash"] - overhead) == pytest.approx(1.0 / speeds["flash3"], rel=1e-9)
    a100 = {k: _model(A100).op_time(dataclasses.replace(base, kernel=k), base.dims, "fwd", A100, "bf16")
            for k in ("flash", "flash3")}
    assert a100["flash3"] == a100["flash"]


def test_fp8_runs_only_weighted_gemms_in_fp8_and_pays_for_the_casts() -> None:
    m, p = _model(), CAL.compute_for(H100)
    hbm = H100.hbm_gbps * 1e9 * p.hbm_efficiency
    attn = attention_op(4, 16, 4096, 128, causal=True)
    for phase in ("fwd", "bwd"):
        assert m.op_time(attn, attn.dims, phase, H100, "fp8") == m.op_time(attn, attn.dims, phase, H100, "bf16")
    scores = Op("scores", OpKind.BMM, {"b": 4, "a": 16, "s": 1024, "t": 1024, "d": 128},
                (("b", "s", "a", "d"), ("b", "t", "a", "d")), ("b", "a", "s", "t"), flop_dims=("b", "a", "s", "t", "d"))
    for phase in ("fwd", "bwd"):  # unfused attention's batched GEMMs: BF16, no casts
        assert m.op_time(scores, scores.dims, phase, H100, "fp8") == m.op_time(scores, scores.dims, phase, H100, "bf16")
    norm = Op("ln", OpKind.NORM, {"b": 4, "s": 4096, "h": 4096}, (("b", "s", "h"),), ("b", "s", "h"))
    assert m.op_time(norm, norm.dims, "fwd", H100, "fp8") == m.op_time(norm, norm.dims, "fwd", H100, "bf16")
    gemm = gemm_op(8192, 8192, 8192)
    t8 = m.op_time(gemm, gemm.dims, "fwd", H100, "fp8")
    cast_bytes = 4.0 * 8192 * 8192  # the input (m x k): read 2, write 1 + 1; the weight is cast once per step
    expected = m.contraction_time(gemm, gemm.dims, "fwd", H100, "fp8") + cast_bytes / hbm + 2 * p.kernel_overhead_s
    assert t8 == pytest.approx(expected, rel=1e-12)
    assert t8 < m.op_time(gemm, gemm.dims, "fwd", H100, "bf16")
    # backward: one cast of the output gradient (charged to dgrad), none for wgrad
    dgrad = m.op_time(gemm, gemm.dims, "dgrad", H100, "fp8") - m.contraction_time(gemm, gemm.dims, "dgrad", H100, "fp8")
    wgrad = m.op_time(gemm, gemm.dims, "wgrad", H100, "fp8") - m.contraction_time(gemm, gemm.dims, "wgrad", H100, "fp8")
    assert dgrad == pytest.approx(4.0 * 8192 * 8192 / hbm + 2 * p.kernel_overhead_s, rel=1e-12)
    assert wgrad == pytest.approx(p.kernel_overhead_s, rel=1e-12)


def test_fp8_training_gains_less_than_the_peak_ratio() -> None:
    """FP8 doubles the GEMM peak only: a long-sequence job gains well under 2x, and less at 16K than at 2K."""
    def step(dtype: str, seq: int) -> float:
        return trainsim.simulate(model={"name": "llama3-8b", "layers": 4, "seq_len": seq}, cluster="dgx-h100",
                                 strategy={"dp": 8, "global_batch": 8}, nodes=1,
                                 dtype=dtype).iteration_time_s

    short = step("bf16", 2048) / step("fp8", 2048)
    long = step("bf16", 16384) / step("fp8", 16384)
    assert 1.0 < long < short < 2.0


def test_attention_kernel_option_reaches_the_model() -> None:
    def step(kernel: str) -> float:
        return trainsim.simulate(model={"name": "gpt2", "seq_len": 8192, "attention": kernel}, cluster="dgx-h100",
                                 strategy={"dp": 8, "global_batch": 8}, nodes=1).iteration_time_s

    assert step("flash3") < step("flash") < step("triton")
    assert step("cudnn") == pytest.approx(step("flash3"))


def test_fit_recovers_a_kernel_speed() -> None:
    base = CAL.compute["h100"]
    rows = []
    truth = base.model_copy(update={"attention_kernel_speed": {"triton": 0.5}})
    for impl in ("flash2", "triton"):
        for s in (1024, 4096, 16384):
            for causal in (False, True):
                for direction in ("fwd", "bwd"):
                    row = {"device": "h100-sxm", "dtype": "bf16", "impl": impl, "batch": 16384 // s, "heads": 16,
                           "seq_len": s, "head_dim": 128, "causal": causal, "direction": direction}
                    flops = (4.0 * row["batch"] * 16 * s * s * 128 * (0.5 if causal else 1.0)
                             * (2.5 if direction == "bwd" else 1.0))
                    row["tflops"] = flops / predict_attention(truth, row, H100) / 1e12
                    rows.append(row)
    fitted, report = fit_compute_params(base.model_copy(update={"attention_kernel_speed": {}}), [], rows, [], H100)
    assert fitted.attention_kernel_speed["triton"] == pytest.approx(0.5, rel=0.02)
    assert report["attention_impls"] == ["flash2"]
    assert math.isclose(fitted.flash_fraction_fwd, base.flash_fraction_fwd, rel_tol=0.03)


def _row(**over: str) -> dict[str, str]:
    return training_row(**{"gpu": "H100-SXM5", **over})


@pytest.mark.parametrize(("over", "kernel", "noted"), [
    ({"arch": "MPT (triton/flash attn)"}, "triton", False),
    ({"other_settings": "FlashAttention-3"}, "flash3", False),
    ({"other_settings": "Transformer Engine fused attention"}, "cudnn", False),
    ({"arch": "GPT (flash attention)"}, "flash", False),
    ({"source": "Megatron-LM README"}, "cudnn", True),
    ({"source": "pytorch/torchtune README"}, "flash", True),  # torch's scaled_dot_product_attention
    ({"source_group": "litgpt_thunder", "other_settings": "compiler=Eager"}, "flash", True),
    ({"source": "pytorch/torchtitan benchmarks", "gpu": "V100-SXM2"}, "unfused", True),  # no flash before Ampere
    ({}, "unfused", True),
])
def test_validate_maps_the_attention_kernel(over: dict[str, str], kernel: str, noted: bool) -> None:
    rj = row_job(_row(**over))
    assert not isinstance(rj, str)
    assert rj.job["model"]["attention"] == kernel
    assert ("attention" in rj.assumptions) == noted


def test_eager_pytorch_runs_rmsnorm_swiglu_rope_and_loss_as_kernel_chains() -> None:
    """model.kernels: eager: each chained op moves EAGER_CHAINS' multiple of the fused op's bytes over as many
    kernels; LayerNorm (one ATen kernel) and GEMMs are unchanged; a whole step gets slower, not faster."""
    from trainsim.workload.zoo import TRANSFORMERS
    from trainsim.workload.zoo.transformer import EAGER_CHAINS, build_transformer

    cfg = TRANSFORMERS["llama3-8b"]
    fused = build_transformer(cfg, 1, 2048)
    eager = build_transformer(dataclasses.replace(cfg, kernels="eager"), 1, 2048)
    m, p = _model(), CAL.compute_for(H100)
    hbm = H100.hbm_gbps * 1e9 * p.hbm_efficiency
    f_ops = {op.name: op for la in fused.layers if la.name == "layers.0" for op in la.ops}
    e_ops = {op.name: op for la in eager.layers if la.name == "layers.0" for op in la.ops}
    for name, chain in (("ln1", "rmsnorm"), ("act", "swiglu"), ("rope", "rope")):
        f, e = f_ops[name], e_ops[name]
        scale, launches = EAGER_CHAINS[chain]
        assert e.launches == launches and m.kernels(e, "fwd") == launches
        extra = m.op_time(e, e.dims, "fwd", H100, "bf16") - m.op_time(f, f.dims, "fwd", H100, "bf16")
        assert extra == pytest.approx((scale - 1) * f.fwd_bytes() / hbm + (launches - 1) * p.kernel_overhead_s)
    assert e_ops["qkv"] == f_ops["qkv"] and e_ops["attention"] == f_ops["attention"]
    gpt = TRANSFORMERS["gpt2"]  # LayerNorm + GeLU: only the loss changes
    g_f, g_e = build_transformer(gpt, 1, 1024), build_transformer(dataclasses.replace(gpt, kernels="eager"), 1, 1024)
    changed = {op.name for a, b in zip(g_f.layers, g_e.layers, strict=True)
               for op, op2 in zip(a.ops, b.ops, strict=True) if op != op2}
    assert changed == {"loss"}

    def step(kernels: str) -> float:
        return trainsim.simulate(model={"name": "llama3-8b", "layers": 2, "seq_len": 4096, "kernels": kernels},
                                 cluster="dgx-h100", nodes=1, strategy={"dp": 8, "global_batch": 8}).iteration_time_s

    assert step("eager") > step("fused")


@pytest.mark.parametrize(("setting", "kernels"), [("torch.compile = false", "eager"), ("torch.compile on", "fused"),
                                                   ("", None)])
def test_validate_reads_torch_compile(setting: str, kernels: str | None) -> None:
    rj = row_job(_row(other_settings=setting, arch="Llama 3 (RMSNorm, SwiGLU, GQA, RoPE)", n_kv_heads="8",
                      ffn_hidden="5632", vocab="32000"))
    assert not isinstance(rj, str), rj
    assert rj.job["model"].get("kernels") == kernels


def _gemm_steps(job: dict) -> dict[str, float]:
    """Forward, dgrad and wgrad seconds of each weighted GEMM step of a costed job, by op and phase."""
    from trainsim.api import simulate_costed

    _, costed = simulate_costed(job)
    out: dict[str, float] = {}
    for ch in costed.program.chunks:
        for s in ch.fwd + ch.bwd:
            if s.kind == "compute" and s.op is not None and s.op.kind == OpKind.MATMUL and s.op.weight is not None:
                out[f"{s.layer}.{s.op.name}.{s.phase}"] = s.duration_s
    return out


@pytest.mark.parametrize("dtype", ["fp8", "fp4"])
def test_low_precision_recipes_keep_the_output_layer_and_the_router_in_bf16(dtype: str) -> None:
    """FP8 and NVFP4 recipes run the blocks' linears (the experts included) at the low-precision rate with their
    casts, but the output layer and the MoE router in BF16, as Megatron (a plain output layer and TopKRouter),
    torchao (output projection skipped) and DeepSeek-V3 (gating in higher precision) do: those steps cost exactly
    what they cost in a BF16 job. (A hidden size of 4096: at 1024 NVFP4's four-pass casts outweigh its faster
    GEMMs in the backward, test_nvfp4_needs_wide_gemms_to_pay.)"""
    job = {"model": {"name": "custom", "layers": 2, "hidden": 4096, "heads": 32, "seq_len": 2048, "vocab": 32768,
                     "experts": 8, "top_k": 2, "norm": "rmsnorm", "mlp": "swiglu", "position": "rope"},
           "cluster": {"name": "dgx-b200", "nodes": 1}, "strategy": {"dp": 8, "global_batch": 8}}
    bf16 = _gemm_steps({**job, "simulation": {"dtype": "bf16"}})
    low = _gemm_steps({**job, "simulation": {"dtype": dtype}})
    assert bf16.keys() == low.keys()
    kept = {k for k in bf16 if k.startswith("head.") or ".router." in k}
    assert {k.split(".")[-2] for k in kept} == {"lm_head", "router"}
    for k in bf16:
        if k in kept:
            assert low[k] == bf16[k], k
        elif "expert_fc1" in k or ".qkv." in k or ".fc1." in k:
            assert low[k] < bf16[k], k


def test_nvfp4_needs_wide_gemms_to_pay() -> None:
    """NVFP4's casts read each tensor four times (amax, quantise, Hadamard amax, Hadamard quantise: 9.125 bytes an
    element) while its GEMM work per element of a cast tensor grows with the reduction width: a narrow expert's
    backward runs slower than in BF16, a wide one's faster (B200: the crossover near hidden 2048)."""
    def expert_bwd(hidden: int, dtype: str) -> float:
        job = {"model": {"name": "custom", "layers": 1, "hidden": hidden, "heads": 8, "seq_len": 2048,
                         "vocab": 32768, "experts": 8, "top_k": 2, "norm": "rmsnorm", "mlp": "swiglu"},
               "cluster": {"name": "dgx-b200", "nodes": 1}, "strategy": {"dp": 8, "global_batch": 8},
               "simulation": {"dtype": dtype}}
        steps = _gemm_steps(job)
        return sum(v for k, v in steps.items() if ".expert_fc1.bwd" in k)

    assert expert_bwd(1024, "fp4") > expert_bwd(1024, "bf16")
    assert expert_bwd(8192, "fp4") < expert_bwd(8192, "bf16")
