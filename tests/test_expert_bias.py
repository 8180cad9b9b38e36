"""Biased routed experts (gpt-oss): where the expert GEMMs run one per local expert (Megatron-Core's TEGroupedMLP,
model.expert_gemm per_expert), the fc2 bias is added by an eager PyTorch chain per local expert, `t + b * p` with
FP32 routing probabilities, then a cat and a cast (workload.zoo.transformer.EXPERT_BIAS_*). Its HBM bytes and
kernel counts are checked by hand; a fused grouped expert MLP, or experts without biases, have no such op."""

from __future__ import annotations

from typing import Any

import pytest

import trainsim
from trainsim.api import simulate_costed
from trainsim.compile.recompute import recompute_plan
from trainsim.config import JobConfig
from trainsim.cost.calibration import load_calibration
from trainsim.cost.compute import RooflineCompute
from trainsim.hardware.devices import get_device
from trainsim.workload.ir import Op
from trainsim.workload.zoo import build_model
from trainsim.workload.zoo.transformer import EXPERT_BIAS_KERNELS, EXPERT_BIAS_TRAFFIC

MOE = {"experts": 16, "top_k": 2}


def _layer(**features: Any) -> list[Op]:
    m = build_model("custom", 2, 512, "flash", {**MOE, **features}, layers=1, hidden=256, heads=4, ffn=512)
    return [op for lay in m.layers if lay.kind == "transformer" for op in lay.ops]


def test_the_chain_follows_the_biased_per_expert_gemms_only() -> None:
    names = [op.name for op in _layer(bias=True, expert_gemm="per_expert")]
    i = names.index("expert_fc2")
    assert names[i + 1:i + 3] == ["expert_bias", "combine"]
    for features in ({"bias": True}, {"bias": True, "expert_gemm": "grouped"},
                     {"bias": False, "expert_gemm": "per_expert"}):
        assert "expert_bias" not in [op.name for op in _layer(**features)], features


def test_the_bytes_are_the_chains_by_hand() -> None:
    """68 bytes per element of the routed output over forward and backward: 28 forward (b * p written in FP32, the
    FP32 add, the cat, the cast to BF16) and 40 backward."""
    assert pytest.approx(68.0 / 12.0) == EXPERT_BIAS_TRAFFIC
    op = next(o for o in _layer(bias=True, expert_gemm="per_expert") if o.name == "expert_bias")
    dev = get_device("h100-sxm")
    model = RooflineCompute(load_calibration().compute_for(dev))
    local = {**op.dims, "e": 4}
    elems = local["e"] * local["c"] * local["h"]
    hbm = dev.hbm_gbps * 1e9 * model.params.hbm_efficiency
    gap = model.params.kernel_overhead_s
    total = sum(model.op_time(op, local, phase, dev, "bf16") - model.kernels(op, phase, local) * gap
                for phase in ("fwd", "bwd"))
    assert total == pytest.approx(68.0 * elems / hbm)


@pytest.mark.parametrize("local_experts", [1, 4, 16])
def test_the_kernels_are_the_chains_by_hand(local_experts: int) -> None:
    """A cat and a cast a phase (framework launches), and per local expert 2 forward and 6 backward plain PyTorch
    calls; the forward's again in a recompute."""
    own, (fwd, bwd) = EXPERT_BIAS_KERNELS
    assert (own, fwd, bwd) == (2, 2, 6)
    op = next(o for o in _layer(bias=True, expert_gemm="per_expert") if o.name == "expert_bias")
    model = RooflineCompute(load_calibration().compute_for(get_device("h100-sxm")))
    h, op_h = model.params.host_overhead_s, model.params.torch_op_host_s
    local = {**op.dims, "e": local_experts}
    for phase, per in (("fwd", 2), ("recompute", 2), ("bwd", 6)):
        assert model.kernels(op, phase, local) == 2 + per * local_experts
        assert model.host_time(op, phase, local) == pytest.approx(2 * h + per * local_experts * op_h)


def test_it_runs_on_each_ranks_local_experts_without_a_collective_of_its_own() -> None:
    """The chain's expert dim is split over EP like the expert GEMMs around it: no resharding collective lands on
    it in the forward, and a whole-MoE recompute re-runs it."""
    job = {"model": {"name": "custom", "layers": 2, "hidden": 256, "heads": 4, "ffn": 512, "seq_len": 512,
                     "bias": True, "expert_gemm": "per_expert", **MOE},
           "cluster": {"name": "dgx-h100", "nodes": 1}, "strategy": {"dp": 8, "ep": 4, "global_batch": 16}}
    _, costed = simulate_costed(JobConfig.model_validate(job))
    steps = [s for s in costed.program.chunks[0].fwd if "expert_bias" in s.label]
    assert [s.op.name for s in steps if s.op is not None] == ["expert_bias"] * 2  # one per layer
    assert all(s.op is not None for s in steps)  # nothing but the op itself: no all-gather before it
    ops = _layer(bias=True, expert_gemm="per_expert")
    assert "expert_bias" in recompute_plan(ops, frozenset({"moe"})).rerun
    assert "expert_bias" not in recompute_plan(ops, frozenset({"moe_act"})).rerun


def test_the_chain_slows_biased_per_expert_experts_and_nothing_else() -> None:
    base = {"model": {"name": "custom", "layers": 2, "hidden": 512, "heads": 8, "ffn": 1024, "seq_len": 1024,
                      **MOE}, "cluster": {"name": "dgx-h100", "nodes": 1},
            "strategy": {"dp": 8, "ep": 8, "global_batch": 16}}

    def iteration(**model: Any) -> float:
        return trainsim.simulate({**base, "model": {**base["model"], **model}}).iteration_time_s

    per_expert = iteration(bias=True, expert_gemm="per_expert") / iteration(bias=False, expert_gemm="per_expert")
    grouped = iteration(bias=True, expert_gemm="grouped") / iteration(bias=False, expert_gemm="grouped")
    assert grouped == pytest.approx(1.0, abs=1e-4)  # the attention and norm biases' few parameters only
    assert per_expert > 1.01
