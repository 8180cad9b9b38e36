"""The routed experts' activation weighted by the routing probabilities (model.expert_act): one fused kernel by
default, or Megatron-Core TEGroupedMLP's eager chain for activations it cannot fuse (squared ReLU: the activation, an
FP32 product with the probabilities, a cast; workload.zoo.transformer.EXPERT_ACT_EAGER). Its bytes, kernels and saved
memory are checked by hand, and the validation mapping picks it for Megatron-Core's squared-ReLU experts only."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest

import trainsim
from trainsim.cost.calibration import load_calibration
from trainsim.cost.compute import RooflineCompute
from trainsim.errors import ConfigError
from trainsim.hardware.devices import get_device
from trainsim.workload.ir import Op
from trainsim.workload.zoo import build_model
from trainsim.workload.zoo.transformer import EXPERT_ACT_EAGER

MOE = {"experts": 16, "top_k": 2}
MOE_RUNS = Path(__file__).resolve().parents[2] / "shared" / "validation" / "moe_runs.csv"


def _mapped_model(case: str) -> dict[str, Any]:
    """The model section validate builds for one moe_runs.csv row (skips where shared/ is not beside the clone)."""
    from trainsim.validate.training_runs import row_job

    if not MOE_RUNS.exists():
        pytest.skip("shared/validation not beside the clone")
    rows = {r["case_id"]: r for r in csv.DictReader(MOE_RUNS.open())}
    return row_job(rows[case]).job["model"]


def _act(**features: Any) -> Op:
    m = build_model("custom", 2, 512, "flash", {**MOE, **features}, layers=1, hidden=256, heads=4, ffn=512)
    return next(op for lay in m.layers for op in lay.ops if op.name == "expert_act")


def _priced_bytes(op: Op) -> float:
    """HBM bytes the op's forward plus backward are priced at (its kernel gaps taken out)."""
    dev = get_device("h100-sxm")
    model = RooflineCompute(load_calibration().compute_for(dev))
    hbm = dev.hbm_gbps * 1e9 * model.params.hbm_efficiency
    gap = model.params.kernel_overhead_s
    return sum(model.op_time(op, op.dims, ph, dev, "bf16") - model.kernels(op, ph, op.dims) * gap
               for ph in ("fwd", "bwd")) * hbm


@pytest.mark.parametrize(("mlp", "per_elem", "fused_per_elem"), [("relu2", 56.0, 12.0), ("swiglu", 82.0, 18.0)])
def test_the_eager_chain_moves_its_bytes_by_hand(mlp: str, per_elem: float, fused_per_elem: float) -> None:
    """Per element of the activation's output, forward + backward: squared ReLU 16 + 40 bytes against the fused
    kernel's 4 + 8; a gated activation 22 + 60 against 6 + 12."""
    fused, eager = _act(mlp=mlp), _act(mlp=mlp, expert_act="eager")
    elems = eager.dims["e"] * eager.dims["c"] * eager.dims["f"]
    assert _priced_bytes(fused) == pytest.approx(fused_per_elem * elems)
    assert _priced_bytes(eager) == pytest.approx(per_elem * elems)
    assert EXPERT_ACT_EAGER["gated" if mlp == "swiglu" else "plain"][0] == pytest.approx(per_elem / fused_per_elem)


def test_the_eager_chain_launches_its_kernels_and_keeps_its_output() -> None:
    """The activation a phase plus 2 forward and 5 backward plain PyTorch calls (squared ReLU); the weighting's input,
    the activation's BF16 output, is kept for the probabilities' gradient, and its FP32 product lives while it runs."""
    op = _act(mlp="relu2", expert_act="eager")
    model = RooflineCompute(load_calibration().compute_for(get_device("h100-sxm")))
    assert model.kernels(op, "fwd", op.dims) == 3 and model.kernels(op, "bwd", op.dims) == 6
    p = model.params
    assert model.host_time(op, "bwd", op.dims) == pytest.approx(p.host_overhead_s + 5 * p.torch_op_host_s)
    assert [t.name for t in op.saved] == ["input", "activation"]
    assert [(t.name, t.bytes_per_elem) for t in op.transient] == [("fp32_product", 4.0)]
    assert _act(mlp="relu2").saved == op.saved[:1]


def test_eager_expert_act_is_slower_and_checked() -> None:
    job = {"model": {"name": "custom", "layers": 2, "hidden": 512, "heads": 8, "ffn": 1024, "seq_len": 1024,
                     "experts": 8, "top_k": 2, "mlp": "relu2", "expert_gemm": "per_expert"},
           "cluster": {"name": "dgx-h100", "nodes": 1}, "strategy": {"ep": 8, "global_batch": 16}}
    fused = trainsim.simulate(job)
    job["model"]["expert_act"] = "eager"
    assert trainsim.simulate(job).iteration_time_s > fused.iteration_time_s
    with pytest.raises((ConfigError, ValueError), match=r"model\.expert_act"):
        trainsim.simulate({**job, "model": {**job["model"], "expert_act": "slow"}})
    dense = {**job, "model": {k: v for k, v in job["model"].items() if k not in ("experts", "top_k", "expert_gemm")}}
    dense["strategy"] = {"global_batch": 16}
    with pytest.raises(ConfigError, match=r"^model\.expert_act:"):
        trainsim.simulate(dense)


def test_rows_map_the_eager_chain_for_megatron_squared_relu_experts_only() -> None:
    """Megatron-Core's TEGroupedMLP runs squared ReLU's weighting eagerly; its SwiGLU is fused (the recipes'
    bias-activation fusion), a fused grouped MLP fuses both, and another stack (NeMo AutoModel) is not assumed to."""
    want = {"MBRIDGE-080": "eager", "MBRIDGE-013": "eager", "AUTOMODEL-001": None, "MBRIDGE-148": None}
    for case, act in want.items():
        assert _mapped_model(case).get("expert_act") == act, case


def test_unfused_rope_is_megatrons_chain_by_hand() -> None:
    """Megatron-Core's rotary embedding without fusion: 24 + 26 bytes per query/key element against the fused
    kernel's 4 + 8, 6 + 6 kernels forward (the chain and cos/sin) and 6 + 1 backward."""
    from trainsim.workload.zoo.transformer import MEGATRON_UNFUSED_ROPE

    def rope(**features: Any) -> Op:
        m = build_model("custom", 2, 512, "flash", features, layers=1, hidden=256, heads=4, ffn=512)
        return next(op for lay in m.layers for op in lay.ops if op.name == "rope")

    fused, unfused = rope(position="rope"), rope(position="rope", rope_fusion=False)
    elems = fused.size(fused.output)
    assert _priced_bytes(fused) == pytest.approx(12.0 * elems)
    assert _priced_bytes(unfused) == pytest.approx(50.0 * elems)
    assert MEGATRON_UNFUSED_ROPE[0] == pytest.approx(50.0 / 12.0)
    model = RooflineCompute(load_calibration().compute_for(get_device("h100-sxm")))
    assert [model.kernels(unfused, ph, unfused.dims) for ph in ("fwd", "bwd")] == [12, 7]


def test_gpt_oss_rows_on_megatron_run_rope_unfused() -> None:
    """Megatron-Bridge's gpt-oss provider sets position_embedding_type 'yarn', which turns RoPE fusion off."""
    for case, fused in {"MBRIDGE-148": False, "MBRIDGE-006": False, "AUTOMODEL-010": None, "MBRIDGE-010": None}.items():
        assert _mapped_model(case).get("rope_fusion") == fused, case
