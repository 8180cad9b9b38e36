"""NVFP4 training (simulation.dtype fp4, Blackwell): the FP4 tensor-core peaks, weighted GEMMs at that rate with
their NVFP4 casts, everything else in BF16, GPUs without FP4 refused, and moe_runs' NVFP4 rows mapped."""

from __future__ import annotations

import pytest
from training_row import training_row

import trainsim
from trainsim.cost.calibration import load_calibration
from trainsim.cost.compute import CAST_BYTES_PER_ELEM, RooflineCompute
from trainsim.cost.fit_compute import attention_op, gemm_op
from trainsim.hardware.devices import get_device
from trainsim.validate import training_runs as tr

CAL = load_calibration()


@pytest.mark.parametrize(("name", "fp4_tflops"), [("b200", 9000), ("gb200", 10000), ("b300", 13500),
                                                  ("gb300", 15000)])
def test_blackwell_fp4_peaks(name: str, fp4_tflops: float) -> None:
    dev = get_device(name)
    assert dev.peak_flops("fp4") == fp4_tflops * 1e12 and dev.peak_flops("nvfp4") == fp4_tflops * 1e12
    assert dev.peak_flops("fp4") >= 2 * dev.peak_flops("fp8")  # Blackwell Ultra: 3x (15 against 5 PF)
    assert not get_device("h100-sxm").supports("fp4")


def test_nvfp4_casts_by_hand() -> None:
    # four 2-byte reads (amax, quantise; Hadamard amax, Hadamard quantise), a row-wise and a column-wise copy of a
    # 4-bit value plus an E4M3 scale per 16
    assert CAST_BYTES_PER_ELEM["fp4"] == pytest.approx(4 * 2 + 2 * (0.5 + 1 / 16)) == pytest.approx(9.125)
    dev = get_device("b200")
    p = CAL.compute_for(dev)
    m = RooflineCompute(p)
    hbm = dev.hbm_gbps * 1e9 * p.hbm_efficiency
    gemm = gemm_op(8192, 8192, 8192)
    t4 = m.op_time(gemm, gemm.dims, "fwd", dev, "fp4")
    expected = m.contraction_time(gemm, gemm.dims, "fwd", dev, "fp4") + 9.125 * 8192 * 8192 / hbm \
        + 2 * p.kernel_overhead_s
    assert t4 == pytest.approx(expected, rel=1e-12)
    # the GEMM alone at the FP4 rate: twice the FP8 one's throughput at the same share of peak
    t4_gemm = m.contraction_time(gemm, gemm.dims, "fwd", dev, "fp4")
    t8_gemm = m.contraction_time(gemm, gemm.dims, "fwd", dev, "fp8")
    assert t4_gemm == pytest.approx(t8_gemm / 2, rel=0.01)
    assert t4 < m.op_time(gemm, gemm.dims, "fwd", dev, "fp8")
    attn = attention_op(4, 16, 4096, 128, causal=True)  # attention stays BF16
    assert m.op_time(attn, attn.dims, "bwd", dev, "fp4") == m.op_time(attn, attn.dims, "bwd", dev, "bf16")


def test_fp4_gains_less_than_fp8_did() -> None:
    """Each halving of the GEMM's bytes doubles its peak only: FP4 over FP8 gains less than FP8 over BF16, and
    both well under 2x on a whole step."""
    def step(dtype: str) -> float:
        return trainsim.simulate({"model": {"name": "llama3-8b", "layers": 4}, "cluster": {"name": "dgx-b200"},
                                  "strategy": {"dp": 8, "global_batch": 8}, "simulation": {"dtype": dtype}}
                                 ).iteration_time_s

    bf16, fp8, fp4 = step("bf16"), step("fp8"), step("fp4")
    assert 1.0 < fp8 / fp4 < bf16 / fp8 < 2.0


def test_fp4_is_refused_where_the_gpu_has_none() -> None:
    with pytest.raises(trainsim.ConfigError, match=r"^simulation\.dtype: h100-sxm does not support fp4"):
        trainsim.simulate({"model": {"name": "llama3-8b", "layers": 2}, "cluster": {"name": "dgx-h100"},
                           "simulation": {"dtype": "fp4"}})


def test_an_nvfp4_row_maps_to_fp4() -> None:
    rj = tr.row_job(training_row(precision="NVFP4", gpu="B200 (DGX-B200)"))
    assert not isinstance(rj, str), rj
    assert rj.job["simulation"]["dtype"] == "fp4" and "NVFP4" in rj.assumptions["precision"]
    other = tr.row_job(training_row(precision="MXFP4", gpu="B200 (DGX-B200)"))
    assert isinstance(other, str) and other.startswith("precision not modelled")
