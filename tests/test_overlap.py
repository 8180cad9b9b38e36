"""Communication overlap knobs (--tp-comm-overlap, --overlap-param-gather), batched-GEMM efficiency,
and the precision of reduced gradients: closed forms and monotone properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainsim.api import simulate
from trainsim.compile.program import Step, Stream
from trainsim.cost.annotate import _overlap_tp_comm
from trainsim.cost.calibration import load_calibration
from trainsim.cost.compute import RooflineCompute
from trainsim.hardware.devices import get_device
from trainsim.strategy.precision import Precision
from trainsim.validate.training_runs import row_job
from trainsim.workload.ir import Op, OpKind


def _gemm(duration_s: float) -> Step:
    op = Op("fc", OpKind.MATMUL, {"t": 1, "h": 1, "f": 1}, (("t", "h"),), ("t", "f"), weight=("h", "f"))
    return Step("fc", "compute", Stream.COMPUTE, "compute", op=op, local={"t": 1, "h": 1, "f": 1},
                duration_s=duration_s)


def _coll(kind: str, duration_s: float) -> Step:
    return Step(f"x:{kind}", "collective", Stream.FEATURE, "tp", collective=kind, axes=("tp",),
                duration_s=duration_s)


@settings(max_examples=60, deadline=None)
@given(comm=st.floats(1e-6, 1e-2), gemm=st.floats(1e-6, 1e-2), tp=st.sampled_from([2, 4, 8]))
def test_tp_comm_overlap_leaves_the_pipelined_remainder(comm: float, gemm: float, tp: int) -> None:
    """All-gather feeding a GEMM and reduce-scatter after one: max(0, c - g) + min(c, g) / tp exposed."""
    expected = max(0.0, comm - gemm) + min(comm, gemm) / tp
    ag = [_coll("all_gather", comm), _gemm(gemm)]
    _overlap_tp_comm(ag, tp)
    assert ag[0].duration_s == pytest.approx(expected)
    rs = [_gemm(gemm), _coll("reduce_scatter", comm)]
    _overlap_tp_comm(rs, tp)
    assert rs[1].duration_s == pytest.approx(expected)
    assert expected <= comm + 1e-15


def test_tp_comm_overlap_leaves_all_reduce_and_forks_alone() -> None:
    ar = [_gemm(1e-3), _coll("all_reduce", 2e-3)]
    _overlap_tp_comm(ar, 8)
    assert ar[1].duration_s == 2e-3  # Megatron overlaps TP comm only with sequence parallelism
    fork = [_gemm(1e-3), _coll("all_gather", 2e-3)]
    fork[1].deps = ()  # explicit deps: a fork (weight-gradient re-gather) the graph already fuses
    _overlap_tp_comm(fork, 8)
    assert fork[1].duration_s == 2e-3


TP_JOB = {"model": {"name": "custom", "layers": 4, "hidden": 4096, "heads": 32, "seq_len": 2048},
          "cluster": {"name": "dgx-a100", "nodes": 1},
          "strategy": {"tp": 8, "dp": 1, "sequence_parallel": True, "micro_batch": 1, "global_batch": 4}}


def test_tp_comm_overlap_hides_tensor_parallel_time_end_to_end() -> None:
    off = simulate(TP_JOB)
    on = simulate({**TP_JOB, "strategy": {**TP_JOB["strategy"], "tp_comm_overlap": True}})
    assert off.breakdown["tp"] > 0
    assert on.breakdown["tp"] < off.breakdown["tp"]
    assert on.iteration_time_s < off.iteration_time_s


ZERO_JOB = {"model": {"name": "custom", "layers": 8, "hidden": 2048, "heads": 16, "seq_len": 2048},
            "cluster": {"name": "dgx-a100", "nodes": 4},
            "strategy": {"dp": 32, "zero": 1, "micro_batch": 1, "global_batch": 64}}


def test_overlap_param_gather_hides_at_most_the_gather() -> None:
    off = simulate(ZERO_JOB)
    on = simulate({**ZERO_JOB, "strategy": {**ZERO_JOB["strategy"], "overlap_param_gather": True}})
    gathers = sum(off.trace.end_s[t] - off.trace.start_s[t] for t in range(len(off.graph))
                  if "params:all_gather" in off.graph.name[t])
    assert gathers > 0
    saved = off.iteration_time_s - on.iteration_time_s
    assert 0 < saved <= gathers * (1 + 1e-9)
    # every gather still runs, now at the start of the step, before the first forward finishes
    names = [n for n in on.graph.name if "params:all_gather" in n]
    assert len(names) == len([n for n in off.graph.name if "params:all_gather" in n])


def test_batched_gemm_size_penalty_counts_the_whole_batch() -> None:
    """A batched GEMM is one kernel: its tiles fill the GPU together, so batch x m x n sets the size term."""
    p = load_calibration().compute["a100"]
    dev = get_device("a100-80gb")
    model = RooflineCompute(p)
    one = model.gemm_efficiency(128, 128, 64, 1, dev)
    many = model.gemm_efficiency(128, 128, 64, 4096, dev)
    out = 128 * 128 * 4096
    k_eff = 64 / (64 + p.k_half)
    waves = -(-4096 // dev.sms)  # one 128 x 128 tile per matrix: 4096 tiles in whole waves over the SMs
    wave_eff = 4096 / (waves * dev.sms)
    assert many == pytest.approx(p.gemm_peak_fraction * wave_eff * k_eff * out / (out + p.small_mn_half))
    assert many > 5 * one


def test_bf16_gradients_are_reduced_in_fp32_like_megatron() -> None:
    """Megatron forces fp32 gradient accumulation and reduction for bf16: 2 + 4 + 12 bytes per parameter."""
    bf16, fp16 = Precision.named("bf16"), Precision.named("fp16")
    assert (bf16.param_bytes, bf16.grad_bytes, bf16.optimizer_bytes) == (2.0, 4.0, 12.0)
    assert (fp16.param_bytes, fp16.grad_bytes, fp16.optimizer_bytes) == (2.0, 2.0, 12.0)


def test_training_row_reads_the_overlap_flags() -> None:
    row = {"case_id": "x", "model_name": "GPT", "arch": "gpt", "gpu": "H100-SXM", "n_gpus": "16",
           "gpus_per_node": "8", "n_layers": "4", "hidden": "4096", "n_heads": "32", "seq_len": "2048",
           "dp": "2", "tp": "8", "pp": "1", "seq_parallel": "yes", "sharding": "distributed optimizer",
           "global_batch": "8", "micro_batch": "1", "recompute": "none", "precision": "bf16",
           "other_settings": "--overlap-grad-reduce --overlap-param-gather --tp-comm-overlap",
           "tflops_per_gpu": "400", "flops_convention": "Megatron model FLOPs"}
    rj = row_job(row)
    assert not isinstance(rj, str)
    assert rj.job["strategy"]["overlap_param_gather"] is True
    assert rj.job["strategy"]["tp_comm_overlap"] is True
    row["other_settings"] = ""
    rj = row_job(row)
    assert not isinstance(rj, str)
    assert "overlap_param_gather" not in rj.job["strategy"] and "tp_comm_overlap" not in rj.job["strategy"]


# --- Megatron's fused scale-mask-softmax and its PyTorch fallback -----------------------------------

def test_softmax_rows_per_block_follow_the_kernel() -> None:
    from trainsim.cost.compute import softmax_batch_per_block

    # 128-thread blocks; warps of min(next_pow2(sk), 32) threads; 2 rows per warp up to 128 columns
    assert softmax_batch_per_block(1024) == 4  # 4 warps x 1 row
    assert softmax_batch_per_block(2048) == 4
    assert softmax_batch_per_block(128) == 8  # 4 warps x 2 rows
    assert softmax_batch_per_block(100) == 8  # next_pow2 = 128
    assert softmax_batch_per_block(16) == 16  # 8 warps of 16 threads x 2 rows


def test_fused_softmax_availability() -> None:
    from trainsim.cost.compute import fused_softmax_available

    def shape(b: int, a: int, s: int) -> dict[str, float]:
        return {"b": b, "a": a, "s": s, "t": s}

    assert fused_softmax_available(shape(1, 16, 1024), causal=True)
    assert not fused_softmax_available(shape(1, 2, 1024), causal=True)  # GPT 16 heads / TP8, micro-batch 1
    assert fused_softmax_available(shape(2, 2, 1024), causal=True)
    assert not fused_softmax_available(shape(2, 3, 1024), causal=True)  # 6 rows: not a multiple of 4
    assert not fused_softmax_available(shape(4, 16, 8192), causal=True)  # sk > 4096
    assert not fused_softmax_available(shape(4, 16, 16), causal=True)  # sk <= 16
    # padding mask (BERT): sq must be a multiple of the rows per block instead
    assert fused_softmax_available(shape(1, 4, 128), causal=False)
    assert not fused_softmax_available(shape(1, 4, 100), causal=False)  # 8 rows per block (sk <= 128); 100 % 8 != 0


def test_softmax_fallback_costs_five_kernels_and_fp32_traffic() -> None:
    from trainsim.cost.calibration import load_calibration
    from trainsim.cost.compute import RooflineCompute
    from trainsim.workload.ir import Op, OpKind

    dev = get_device("a100-80gb")
    params = load_calibration().compute["a100"]
    model = RooflineCompute(params)
    op = Op("softmax", OpKind.SOFTMAX, {"b": 8, "a": 16, "s": 1024, "t": 1024}, (("b", "a", "s", "t"),),
            ("b", "a", "s", "t"), flops_per_point=5.0, causal=True)
    fused = {"b": 8, "a": 4, "s": 1024, "t": 1024}
    fallback = {"b": 1, "a": 2, "s": 1024, "t": 1024}
    hbm = dev.hbm_gbps * 1e9 * params.hbm_efficiency
    n = 1024 * 1024
    k = params.kernel_overhead_s
    # fused: read 2 B + write 2 B per score forward; fallback: 36 B in five kernels
    assert model.op_time(op, fused, "fwd", dev, "fp16") == pytest.approx(8 * 4 * n * 4.0 / hbm + k)
    assert model.op_time(op, fallback, "fwd", dev, "fp16") == pytest.approx(2 * n * 36.0 / hbm + 5 * k)
    assert model.op_time(op, fallback, "bwd", dev, "fp16") == pytest.approx(2 * n * 40.0 / hbm + 5 * k)
    assert model.host_time(op, "fwd", fallback) == pytest.approx(5 * params.host_overhead_s)
    assert model.host_time(op, "fwd", fused) == pytest.approx(params.host_overhead_s)
    assert model.host_time(op, "fwd") == pytest.approx(params.host_overhead_s)  # no shape: the fused kernel
