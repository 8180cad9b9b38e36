"""GPU what-if ratios (trainsim.whatif.gpu): known answers from the catalogue and calibration, trace device
names -> presets, and unknown presets / dtypes refused with one ConfigError."""

from __future__ import annotations

import pytest

from trainsim.cost.calibration import load_calibration
from trainsim.errors import ConfigError
from trainsim.hardware import DEVICES, get_device
from trainsim.trace.kineto.kernels import OP_CLASSES
from trainsim.whatif import achievable_rates, gpu_from_trace_name, time_ratios

MEMORY_BOUND = ("elementwise", "norm", "reduction", "optimizer", "memcpy", "memset", "other")


def _matmul_flops_per_s(gpu: str, dtype: str) -> float:
    """Dense peak x the family's GEMM peak fraction for the dtype: the compute model's large-GEMM rate."""
    device = get_device(gpu)
    params = load_calibration().compute_for(device)
    return device.peak_flops(dtype) * params.dtype_gemm_fraction.get(dtype, params.gemm_peak_fraction)


def _hbm_bytes_per_s(gpu: str) -> float:
    device = get_device(gpu)
    return device.hbm_gbps * 1e9 * load_calibration().compute_for(device).hbm_efficiency


@pytest.mark.parametrize("gpu", sorted(DEVICES))
def test_same_gpu_is_one(gpu: str) -> None:
    ratios = time_ratios(gpu, gpu)
    assert set(ratios) == {c.value for c in OP_CLASSES}
    assert all(r == 1.0 for r in ratios.values())


@pytest.mark.parametrize(("src", "dst", "dtype"), [
    ("a100-80gb", "h100-sxm", "bf16"), ("v100-sxm2-32gb", "a100-80gb", "fp16"), ("v100-sxm2-32gb", "a100-40gb", "fp32"),
    ("a100-40gb", "b200", "tf32"), ("gtx-1080-ti", "a40", "fp32"), ("h100-sxm", "h200-sxm", "fp8"),
])
def test_ratios_follow_the_cost_model(src: str, dst: str, dtype: str) -> None:
    ratios = time_ratios(src, dst, dtype)
    matmul = _matmul_flops_per_s(src, dtype) / _matmul_flops_per_s(dst, dtype)
    memory = _hbm_bytes_per_s(src) / _hbm_bytes_per_s(dst)
    assert ratios["gemm"] == pytest.approx(matmul, rel=1e-3) and ratios["conv"] == ratios["gemm"]
    for cls in MEMORY_BOUND:
        assert ratios[cls] == pytest.approx(memory, rel=1e-6)
    assert ratios["collective"] == 1.0
    rates = achievable_rates(src, dtype)
    assert rates.matmul_flops_per_s == pytest.approx(_matmul_flops_per_s(src, dtype), rel=1e-3)
    assert rates.hbm_bytes_per_s == pytest.approx(_hbm_bytes_per_s(src), rel=1e-6)


def test_memory_bound_is_the_bandwidth_ratio_within_a_family() -> None:
    """Same family, same calibrated efficiency: the preset HBM bandwidths' ratio exactly; compute unchanged."""
    ratios = time_ratios("a100-80gb", "a100-40gb")
    assert ratios["elementwise"] == pytest.approx(2039.0 / 1555.0, rel=1e-6)
    assert ratios["gemm"] == pytest.approx(1.0, rel=1e-9) and ratios["attention"] == pytest.approx(1.0, rel=1e-9)
    # h100 -> h200: same compute, 4.8 vs 3.35 TB/s
    hopper = time_ratios("h100-sxm", "h200-sxm")
    assert hopper["norm"] == pytest.approx(3350.0 / 4800.0, rel=1e-6) and hopper["gemm"] == pytest.approx(1.0)


def test_attention_follows_the_flash_fractions() -> None:
    """Within a family the attention ratio is the dtype peaks' ratio; across families the flash fractions
    (forward 4 FLOPs/point at its fraction, backward 2x2.5 at its own) weigh in."""
    assert time_ratios("a100-80gb", "a100-40gb")["attention"] == pytest.approx(1.0)
    cal = load_calibration()
    a100, h100 = cal.compute["a100"], cal.compute["h100"]

    def step_s(p: float, fwd: float, bwd: float) -> float:  # one unit of forward FLOPs, backward 2 x 1.25
        return 1.0 / (p * fwd) + 2.5 / (p * bwd)

    expected = step_s(989.4, h100.flash_fraction_fwd, h100.flash_fraction_bwd) / step_s(
        312.0, a100.flash_fraction_fwd, a100.flash_fraction_bwd)
    assert time_ratios("a100-80gb", "h100-sxm", "bf16")["attention"] == pytest.approx(expected, rel=1e-4)


def test_a100_to_h100_speeds_gemms_more_than_elementwise() -> None:
    ratios = time_ratios("a100-80gb", "h100-sxm")
    assert ratios["gemm"] < ratios["elementwise"] < 1.0
    # FlashAttention-2 (the trace's kernel) gains ~1.6x on H100 (FA3 paper figures), far less than cuBLAS GEMMs
    assert ratios["gemm"] < ratios["attention"] < 1.0
    back = time_ratios("h100-sxm", "a100-80gb")
    assert all(back[c] == pytest.approx(1.0 / ratios[c]) for c in ratios)


def test_auto_dtype_is_what_the_source_trains_in() -> None:
    assert time_ratios("v100-sxm2-32gb", "a100-80gb") == time_ratios("v100-sxm2-32gb", "a100-80gb", "fp16")
    assert time_ratios("gtx-1080-ti", "a100-80gb") == time_ratios("gtx-1080-ti", "a100-80gb", "fp32")
    assert achievable_rates("h100-sxm").dtype == "bf16" and achievable_rates("H100").gpu == "h100-sxm"


@pytest.mark.parametrize(("name", "preset"), [
    ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
    ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
    ("NVIDIA A100-PG509-200", "a100-40gb"),
    ("A100-PG509-200", "a100-40gb"),
    ("Tesla V100-DGXS-32GB", "v100-sxm2-32gb"),
    ("Tesla V100-SXM2-32GB", "v100-sxm2-32gb"),
    ("Tesla V100-SXM2-16GB", "v100-sxm2-16gb"),
    ("NVIDIA H100 80GB HBM3", "h100-sxm"),
    ("NVIDIA H200", "h200-sxm"),
    ("NVIDIA B200", "b200"),
    ("NVIDIA A40", "a40"),
    ("NVIDIA RTX A5500", "rtx-a5500"),
    ("NVIDIA GeForce GTX 1080 Ti", "gtx-1080-ti"),
    ("NVIDIA TITAN Xp", "titan-xp"),
    ("NVIDIA GeForce RTX 2080 Ti", None),
    ("AMD Instinct MI300X", None),
    ("AMD Radeon Graphics", None),
    ("Quadro GP100", None),
    ("NVIDIA H100 PCIe", None),
    ("NVIDIA A100 80GB PCIe", None),
    ("NVIDIA", None),
    ("", None),
])
def test_trace_device_names(name: str, preset: str | None) -> None:
    assert gpu_from_trace_name(name) == preset


def test_unknown_gpu_and_dtype_are_config_errors() -> None:
    with pytest.raises(ConfigError) as err:
        time_ratios("a100-80gb", "mi300x")
    assert err.value.field == "target_gpu" and "mi300x" in err.value.problem
    assert all(name in err.value.fix for name in DEVICES)
    with pytest.raises(ConfigError) as err:
        time_ratios("rtx-2080-ti", "a100-80gb")
    assert err.value.field == "source_gpu"
    with pytest.raises(ConfigError) as err:
        time_ratios("a100-80gb", "v100-sxm2-32gb", "tf32")  # Volta has no tf32
    assert err.value.field == "dtype" and "target_gpu" in err.value.problem
    with pytest.raises(ConfigError) as err:
        time_ratios("a100-80gb", "h100-sxm", "int4")
    assert err.value.field == "dtype" and "bf16" in err.value.fix
    with pytest.raises(ConfigError) as err:
        achievable_rates("nope")
    assert err.value.field == "gpu"
