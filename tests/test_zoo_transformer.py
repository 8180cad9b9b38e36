"""Transformer zoo: parameter counts against published checkpoints, FLOPs against closed forms."""

import pytest

from trainsim.workload.ir import CONTRACTION_KINDS
from trainsim.workload.zoo import build_model, model_names


@pytest.mark.parametrize(("name", "params"), [
    ("llama3-8b", 8_030_261_248),  # Hugging Face meta-llama/Meta-Llama-3-8B
    ("llama2-7b", 6_738_415_616),  # meta-llama/Llama-2-7b-hf
    ("llama3-70b", 70_553_706_496),
    ("llama3.1-405b", 405_853_388_800),
    ("mixtral-8x7b", 46_702_792_704),  # mistralai/Mixtral-8x7B-v0.1
])
def test_published_parameter_counts(name: str, params: int) -> None:
    assert build_model(name, 1).params == params


def test_gpt_parameters_follow_12lh2_formula() -> None:
    n_l, h, v, s = 96, 12288, 50257, 2048
    expected = n_l * (12 * h * h + 13 * h) + v * h + s * h + 2 * h  # blocks, tied embedding, positions, final LN
    assert build_model("gpt3-175b", 1).params == expected


def test_forward_flops_match_megatron_closed_form() -> None:
    """Forward matmul FLOPs = 24 B s l h^2 (1 + s/6h + V/12lh): Narayanan eq. 3 without recompute and backward."""
    b, s = 2, 2048
    m = build_model("megatron-1.7b", b, s, "unfused")
    n_l, h, v = 24, 2304, 51200
    closed = 24 * b * s * n_l * h * h * (1 + s / (6 * h) + v / (12 * n_l * h))
    got = sum(op.fwd_flops() for la in m.layers for op in la.ops if op.kind in CONTRACTION_KINDS)
    assert got == pytest.approx(closed, rel=1e-12)


def test_gqa_shrinks_qkv_and_moe_has_experts() -> None:
    llama = build_model("llama3-70b", 1)
    qkv = next(op for op in llama.layers[1].ops if op.name == "qkv")
    assert qkv.dims["q"] == (64 + 2 * 8) * 128
    moe = build_model("mixtral-8x7b", 1)
    assert any(op.name == "expert_fc1" and op.dims["e"] == 8 for la in moe.layers for op in la.ops)


def test_custom_dims_and_overrides() -> None:
    m = build_model("custom", 1, 512, layers=2, hidden=256, heads=4, vocab=1000)
    assert m.hyper["layers"] == 2 and m.seq_len == 512
    assert build_model("llama3-8b", 1, layers=4).hyper["layers"] == 4
    assert {"gpt3-175b", "llama3-70b", "mixtral-8x7b", "bert-large", "resnet50", "vgg19", "dlrm"} <= set(model_names())
