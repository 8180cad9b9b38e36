"""Mamba2's SSD scan priced at its measured throughput: a multiple of the FP32 peak per direction (issue 23)."""

from __future__ import annotations

import csv
import statistics
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainsim.cost.calibration import load_calibration
from trainsim.cost.compute import RooflineCompute
from trainsim.hardware.devices import get_device
from trainsim.workload.ir import Op
from trainsim.workload.zoo import transformer_config
from trainsim.workload.zoo.transformer import _mamba2_ops

MEASURED = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "gpu_h200" / "mamba_ssd.csv"


def _ssd(heads: int = 64, head_dim: int = 64, state: int = 128, groups: int = 8, chunk: int = 128,
         batch: int = 1, seq: int = 8192) -> Op:
    cfg = replace(transformer_config("nemotron-3-nano"), mamba_heads=heads, mamba_head_dim=head_dim,
                  mamba_state=state, mamba_groups=groups, mamba_chunk=chunk)
    return next(op for op in _mamba2_ops(cfg, batch, seq) if op.name == "ssd")


def _model(device) -> RooflineCompute:
    return RooflineCompute(load_calibration().compute_for(device))


def test_the_scan_runs_at_its_fp32_multiple_by_hand() -> None:
    """Nemotron 3 Nano's scan at 8192 tokens on an H100: FLOPs 8192 x 64 x 64 x (2 x 128 + 4 x 128 + 2 x 128 x 128 x 8
    / 4096) over 67 TFLOP/s x the forward multiple, plus the kernel gap; backward twice the FLOPs at its own multiple."""
    dev = get_device("h100-sxm")
    model = _model(dev)
    p = model.params
    op = _ssd()
    flops = 8192 * 64 * 64 * (2 * 128 + 4 * 128 + 2 * 128 * 128 * 8 / 4096)
    assert op.fwd_flops(op.dims) == pytest.approx(flops)
    assert model.op_time(op, op.dims, "fwd", dev, "bf16") == pytest.approx(
        flops / (67e12 * p.ssd_fp32_multiple_fwd) + p.kernel_overhead_s)
    assert model.op_time(op, op.dims, "bwd", dev, "bf16") == pytest.approx(
        2 * flops / (67e12 * p.ssd_fp32_multiple_bwd) + p.kernel_overhead_s)


def test_the_scan_follows_the_cuda_cores_not_the_tensor_cores() -> None:
    """From an H100 to a B200 the scan speeds up by the FP32 peaks' ratio (75 / 67), not the BF16 one (2250 / 989);
    the job's precision (BF16 on one, FP8 on the other here) does not move it."""
    h100, b200 = get_device("h100-sxm"), get_device("b200")
    op = _ssd()
    gap = load_calibration().compute_for(h100).kernel_overhead_s
    t_h100 = _model(h100).op_time(op, op.dims, "fwd", h100, "bf16") - gap
    t_b200 = _model(b200).op_time(op, op.dims, "fwd", b200, "fp8") - _model(b200).params.kernel_overhead_s
    assert t_h100 / t_b200 == pytest.approx(75 / 67)


@settings(max_examples=30, deadline=None)
@given(heads=st.sampled_from([8, 16, 32, 64, 128]), batch=st.integers(1, 4), seq=st.sampled_from([1024, 4096, 8192]))
def test_the_scan_costs_what_its_flops_say(heads: int, batch: int, seq: int) -> None:
    """Twice the batch costs twice; twice the heads (at a fixed head dim: the C B^T term per channel halves) costs
    the FLOPs' ratio: the compute term, kernel gap aside, is FLOPs over one rate per direction."""
    dev = get_device("h100-sxm")
    model = _model(dev)
    gap = model.params.kernel_overhead_s
    one = _ssd(heads=heads, batch=batch, seq=seq)
    for other in (_ssd(heads=heads, batch=2 * batch, seq=seq), _ssd(heads=2 * heads, batch=batch, seq=seq)):
        ratio = other.fwd_flops(other.dims) / one.fwd_flops(one.dims)
        for phase in ("fwd", "bwd"):
            t1 = model.op_time(one, one.dims, phase, dev, "bf16") - gap
            t2 = model.op_time(other, other.dims, phase, dev, "bf16") - gap
            assert t2 / t1 == pytest.approx(ratio)


def test_the_packaged_multiples_reproduce_the_h200_measurements() -> None:
    """Over every shape measured on an H200 (benchmarks/data/gpu_h200/mamba_ssd.csv, kernel time), the predicted
    scan time is within 12% on average per direction and within 25% on each shape."""
    dev = get_device("h200")
    model = _model(dev)
    with MEASURED.open() as f:
        rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
    assert len(rows) >= 10
    for phase in ("fwd", "bwd"):
        errors = []
        for r in rows:
            op = _ssd(int(r["heads"]), int(r["head_dim"]), int(r["state"]), int(r["groups"]), int(r["chunk"]),
                      int(r["batch"]), int(r["seq"]))
            measured = float(r[f"{phase}_kernel_us"]) * 1e-6
            errors.append(model.op_time(op, op.dims, phase, dev, "bf16") / measured - 1)
        assert statistics.mean(abs(e) for e in errors) < 0.12, (phase, errors)
        assert max(abs(e) for e in errors) < 0.25, (phase, errors)
