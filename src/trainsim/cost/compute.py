"""Compute cost model: roofline against the device with a named, documented efficiency model.

time(op) = max(FLOPs / (peak(dtype) * efficiency), bytes / (HBM bandwidth * HBM_EFFICIENCY))
           + KERNEL_OVERHEAD_S per kernel.

Efficiency of a contraction (GEMM, convolution, batched matmul) is the product of
  * GEMM_PEAK_FRACTION: what cuBLAS reaches on large, well-shaped GEMMs (a device-family constant),
  * wave quantisation: output tiles (TILE x TILE) spread over the SMs in whole waves, and
  * a small-reduction penalty K / (K + K_HALF): short inner dimensions cannot hide the
    prologue/epilogue of each tile.
This follows NVIDIA's "Matrix Multiplication Background User's Guide" (tile and wave quantisation)
and is the structure the accuracy issue calibrates per device family; a dtype whose kernels reach a
different share of their own peak (fp32 SGEMM on CUDA cores, tf32, fp8) has its own peak fraction.
Mamba2's SSD scan runs at its measured throughput, a multiple of the FP32 peak (`ssd_rate`).
Megatron's unfused attention uses its fused scale-mask-softmax kernel only where that kernel takes the
per-rank shape; elsewhere PyTorch's five-kernel fp32 softmax runs. Fused attention runs at the kernel's
share of peak (`attention_efficiency`): FlashAttention-2's long-sequence, head-dim-128 fraction, slower at
short keys and small head dims, slower again under a causal mask (diagonal blocks and load imbalance),
and scaled by the kernel actually used (FlashAttention-3 / cuDNN on Hopper, the 2022 Triton kernel); the
masked half of a causal score matrix is skipped.
FP8 (Transformer Engine / torchao float8 semantics): only weighted GEMMs run in FP8; each casts its input
to FP8 on the way in (forward) and its output gradient (backward), cast and transpose fused (read 2 bytes,
write 2 per element); weights are cast once per iteration (not charged); attention, batched GEMMs, norms
and element-wise ops stay BF16, and so do the embedding's, the output layers' and the MoE router's GEMMs
(cost.annotate prices those in BF16: strategy.precision.low_precision_gemm). FP4 (Transformer Engine's NVFP4
recipe, Blackwell) is the same with 4-bit values and an FP8 scale per 16: each cast writes a row-wise and a
column-wise copy of 0.5 + 1/16 bytes per element (the column-wise one, for the weight gradient, through a 16 x 16
random Hadamard transform fused into the cast), 3.125 bytes moved per element; the GEMMs run at the FP4
tensor-core rate.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from ..hardware.devices import Device
from ..workload.ir import Op, OpKind
from .calibration import ComputeParams, load_calibration

_ELEM_SCALE = {"fp32": 2.0, "tf32": 2.0}
LOW_PRECISION_GEMM = frozenset({"fp8", "fp4"})
"""Compute dtypes in which only weighted GEMMs run at that precision (the rest of the step in BF16)."""
NVFP4_READS = 4
"""BF16 reads of a tensor NVIDIA's NVFP4 training recipe makes to quantise it (Transformer Engine's NVFP4BlockScaling;
NVIDIA, "Pretraining Large Language Models with NVFP4", arXiv:2509.25149): the row-wise copy needs the tensor's amax
first (its two-level scaling's per-tensor FP32 scale), then the quantise; the column-wise copy the weight gradient
reads is a 16x16 random Hadamard transform of the tensor, whose amax is again taken in a pass of its own before the
transform-and-quantise pass."""
CAST_BYTES_PER_ELEM = {"fp8": 4.0, "fp4": 2.0 * NVFP4_READS + 2 * (0.5 + 1 / 16)}
"""HBM bytes one element's cast moves: read 2 (BF16) per pass, write the row-wise and column-wise copies (FP8: one fused
cast-transpose pass, 1 + 1; NVFP4: NVFP4_READS passes, 0.5 + 1/16 each, a 4-bit value and an E4M3 scale per 16)."""
# Megatron's softmax when its fused kernel cannot take the shape (FusedScaleMaskSoftmax.
# forward_torch_softmax, softmax in fp32): cast to fp32, scale, masked_fill_, softmax, cast back.
# HBM bytes per score element: 6 + 8 + 8 + 8 + 6 forward; backward runs the same five kernels
# (cast 6, softmax-backward 12, mask 8, scale 8, cast 6). The fused kernel moves 4 and 6 bytes
# (the IR's 4 and 8 are kept for it).
_UNFUSED_SOFTMAX = {"fwd": (5, 36.0 / 4.0), "bwd": (5, 40.0 / 8.0)}


def softmax_batch_per_block(sk: int) -> int:
    """Rows of the score matrix one 128-thread block of Megatron's fused softmax kernel handles
    (scaled_masked_softmax.h get_batch_per_block: warps of min(next_pow2(sk), 32) threads, two
    rows per warp when next_pow2(sk) <= 128)."""
    pow2 = 1 << max(0, math.ceil(math.log2(max(sk, 1))))
    warp = min(pow2, 32)
    return (128 // warp) * (2 if pow2 <= 128 else 1)


def attention_score_share(op: Op, local: Mapping[str, float]) -> float:
    """The share of an attention op's queries x keys scores its kernel computes: all of them, half under a causal
    mask, and under a sliding window of w keys (causal) the t*w - w(w-1)/2 of a t x t matrix that lie within w of
    the diagonal (Mistral, gpt-oss's windowed layers)."""
    if not op.causal:
        return 1.0
    t = float(local.get("t", local.get("s", 1)))
    w = float(op.window)
    if not w or w >= t:
        return 0.5
    return (t * w - w * (w - 1) / 2) / (t * t)


def fused_softmax_available(local: Mapping[str, float], causal: bool) -> bool:
    """Megatron's FusedScaleMaskSoftmax.is_kernel_available on the per-rank shape (b, a, s, t):
    16 < sk <= 4096, sq and sk multiples of 4, b x heads a multiple of 4 and of the rows per
    block (causal) or sq a multiple of them (padding mask). Otherwise PyTorch's softmax runs."""
    b, a = int(local.get("b", 1)), int(local.get("a", 1))
    sq, sk = int(local.get("s", 1)), int(local.get("t", 1))
    batches = b * a
    if not (16 < sk <= 4096 and sq % 4 == 0 and sk % 4 == 0 and batches % 4 == 0):
        return False
    per_block = softmax_batch_per_block(sk)
    return batches % per_block == 0 if causal else sq % per_block == 0


def _cast_bytes(op: Op, local: Mapping[str, float], phase: str, dtype: str = "fp8") -> float:
    """HBM bytes of the FP8 (or NVFP4) casts around one weighted GEMM in a phase (fused cast + transpose:
    CAST_BYTES_PER_ELEM). Forward: the input activation; backward: the output gradient (once for dgrad
    and wgrad together, charged to dgrad when the phases are split). Weights are cast once per iteration
    and reused by every micro-batch (Transformer Engine's is_first_microbatch, float8 FSDP all-gather), which
    is small next to the GEMMs and not charged here."""
    per_elem = CAST_BYTES_PER_ELEM[dtype]
    if phase == "wgrad":
        return 0.0
    if phase in ("bwd", "dgrad"):
        return per_elem * math.prod(local.get(d, 1) for d in op.output)
    return per_elem * math.prod(local.get(d, 1) for d in op.inputs[0]) if op.inputs else 0.0


def _launches_per(op: Op, local: Mapping[str, float] | None) -> int:
    """Launches of one GEMM phase: one per local index of `op.launch_per` (a per-expert GEMM: one per local
    expert), else one."""
    if not op.launch_per:
        return 1
    sizes = local if local is not None else op.dims
    return max(1, int(round(sizes.get(op.launch_per, 1))))


LOW_PRECISION_BYTES = {"fp8": 1.0, "fp4": 0.5 + 1 / 16}
"""Bytes per element of a low-precision GEMM's operands as its kernel reads them (FP8: 1; NVFP4: a 4-bit value and
an E4M3 scale per 16); the output is written in BF16."""


def _low_precision_gemm_bytes(op: Op, local: Mapping[str, float], dtype: str) -> float:
    """HBM bytes of a low-precision weighted GEMM's forward: its quantised input and weight, its BF16 output (the
    backward, dgrad and wgrad, moves twice that, as the BF16 one does)."""
    operands = sum(math.prod(local[d] for d in t) for t in op.inputs) + math.prod(local[d] for d in op.weight or ())
    return operands * LOW_PRECISION_BYTES[dtype] + math.prod(local[d] for d in op.output) * op.bytes_per_elem


def _side_kernels(op: Op, phase: str, local: Mapping[str, float] | None = None) -> int:
    """The op's bookkeeping kernels in a phase (Op.side_kernels): the forward's in a recompute, the backward's with
    the input-gradient GEMM of a split backward; once per local index of `op.launch_per` (a per-expert chain)."""
    if phase in ("fwd", "recompute"):
        count = op.side_kernels[0]
    else:
        count = 0 if phase == "wgrad" else op.side_kernels[1]
    return count * _launches_per(op, local) if count else 0


def _torch_softmax(op: Op, local: Mapping[str, float] | None) -> bool:
    """A softmax op whose per-rank shape sends Megatron to PyTorch's kernels (no shape: fused)."""
    return op.kind == OpKind.SOFTMAX and local is not None and not fused_softmax_available(local, op.causal)


class ComputeModel(Protocol):
    """How long one operator takes on one device (the small interface the engine relies on)."""

    def op_time(self, op: Op, local: Mapping[str, float], phase: str, device: Device, dtype: str) -> float: ...

    def memory_time(self, bytes_moved: float, device: Device) -> float: ...

    def host_time(self, op: Op, phase: str, local: Mapping[str, float] | None = None) -> float: ...


@dataclass(frozen=True)
class RooflineCompute:
    """Roofline with GEMM efficiency (tiles, waves, short-K) and achievable HBM bandwidth.

    Every constant comes from a ComputeParams entry of the calibration file (per device family)."""

    params: ComputeParams = field(default_factory=lambda: load_calibration().compute["default"])

    def gemm_efficiency(self, m: float, n: float, k: float, batch: float, device: Device,
                        dtype: str | None = None) -> float:
        p = self.params
        peak_fraction = p.dtype_gemm_fraction.get(dtype, p.gemm_peak_fraction) if dtype else p.gemm_peak_fraction
        tiles_m, tiles_n = math.ceil(max(m, 1) / p.tile), math.ceil(max(n, 1) / p.tile)
        tiles = tiles_m * tiles_n * max(1, math.ceil(batch))
        waves = math.ceil(tiles / device.sms)
        wave_eff = tiles / (waves * device.sms)
        tile_eff = (m * n) / (tiles_m * p.tile * tiles_n * p.tile)
        k_eff = k / (k + p.k_half)
        out = m * n * max(1.0, batch)  # a batched GEMM is one kernel: its tiles fill the GPU together
        half = p.small_mn_half  # small outputs cannot amortise prologue/epilogue and launch ramp
        size_eff = out / (out + half) if half > 0 else 1.0
        return peak_fraction * wave_eff * min(1.0, tile_eff) * k_eff * size_eff

    def _mnk(self, op: Op, local: Mapping[str, float]) -> tuple[float, float, float, float]:
        """Map an einsum op to GEMM (M, N, K, batch) by its weight/output/reduction dims."""
        out = set(op.output)
        if op.kind == OpKind.MATMUL and op.weight is not None:
            w = set(op.weight)
            n_dims = [d for d in op.weight if d in out]
            k_dims = [d for d in op.weight if d not in out]
            # grouped experts act as a batch of GEMMs: an expert dim their input carries too (the router's
            # expert scores, weight (e, h) on tokens (b, s, h), are one GEMM whose N is the expert count)
            batch_dims = [d for d in n_dims if d == "e" and all(d in t for t in op.inputs)]
            n_dims = [d for d in n_dims if d not in batch_dims]
            m_dims = [d for d in op.output if d not in w]
            return (math.prod(local[d] for d in m_dims), math.prod(local[d] for d in n_dims),
                    math.prod(local[d] for d in k_dims), math.prod(local[d] for d in batch_dims))
        if op.kind == OpKind.CONV:
            m = local["n"] * local["p"] * local["q"]
            return m, local["k"], local["c"] * local["r"] * local["s"], 1.0
        if "s" in op.dims and "t" in op.dims:  # attention: batch (b, a) of (s x t) by d
            return local.get("s", 1), local.get("t", 1), local.get("d", 1), local.get("b", 1) * local.get("a", 1)
        # generic batched matmul: batch dims shared by every tensor, K = dims contracted away
        ins = [set(t) for t in op.inputs] or [set()]
        out_d = set(op.output)
        shared = set.intersection(*ins) if len(ins) > 1 else set()
        batch = [d for d in op.dims if d in shared and d in out_d]
        m_d = [d for d in op.output if d not in batch][:1]
        n_d = [d for d in op.output if d not in batch and d not in m_d]
        k_d = [d for d in op.dims if d not in out_d]
        prod = math.prod
        return (prod(local[d] for d in m_d), prod(local[d] for d in n_d), prod(local[d] for d in k_d),
                prod(local[d] for d in batch))

    def contraction_time(self, op: Op, local: Mapping[str, float], phase: str, device: Device, dtype: str) -> float:
        """The GEMM / convolution kernel(s) of a phase alone (no launch gap, no FP8 casts)."""
        bwd = phase == "bwd"
        flops = op.bwd_flops(local) if bwd else op.fwd_flops(local)
        if dtype in LOW_PRECISION_BYTES and op.kind == OpKind.MATMUL and op.weight is not None:
            bytes_ = _low_precision_gemm_bytes(op, local, dtype) * (1.0 if phase == "fwd" else 2.0)
        else:
            bytes_ = (op.bwd_bytes(local) if bwd else op.fwd_bytes(local)) * _ELEM_SCALE.get(dtype, 1.0)
        if phase in ("dgrad", "wgrad"):  # one of the two backward GEMMs of a weighted op
            flops, bytes_ = op.bwd_flops(local) / 2, bytes_ / 2
        m, n, k, b = self._mnk(op, local)
        eff = self.gemm_efficiency(m, n, k, b, device, dtype)
        hbm = device.hbm_gbps * 1e9 * self.params.hbm_efficiency
        return max(flops / (device.peak_flops(dtype) * eff), bytes_ / hbm)

    def attention_efficiency(self, op: Op, local: Mapping[str, float], bwd: bool) -> float:
        """Share of dense peak a fused attention kernel reaches on this shape (per FlashAttention convention:
        causal FLOPs halved, backward 2.5x forward)."""
        p = self.params
        eff = (p.flash_fraction_bwd if bwd else p.flash_fraction_fwd) * p.attention_kernel_speed.get(op.kernel, 1.0)
        keys = max(1.0, float(local.get("t", local.get("s", 1))))
        if op.window:  # a sliding window: every query's row of blocks is as short as the window
            keys = min(keys, float(op.window))
        eff *= keys / (keys + p.attention_seq_half)
        d, dh = min(float(local.get("d", 128)), 128.0), p.attention_head_dim_half
        eff *= (d / (d + dh)) * ((128.0 + dh) / 128.0)
        if op.causal:
            blocks = keys / 128.0
            eff *= p.attention_causal_max * blocks / (blocks + p.attention_causal_tiles)
        return min(1.0, eff)

    def ssd_rate(self, device: Device, bwd: bool) -> float:
        """FLOP/s of Mamba2's chunked SSD scan (mamba_ssm's Triton kernels). Measured on an H200 at 9% (forward)
        and 4.5% (backward) of the BF16 tensor peak, and far under the HBM bandwidth: the chunk-serial state passing
        and small per-chunk matmuls bound it, not the tensor cores. So it is priced per device as a multiple of the
        FP32 (CUDA-core) peak, which follows SMs x clock across generations (an assumption off Hopper)."""
        p = self.params
        return device.peak_flops("fp32") * (p.ssd_fp32_multiple_bwd if bwd else p.ssd_fp32_multiple_fwd)

    def op_time(self, op: Op, local: Mapping[str, float], phase: str, device: Device, dtype: str) -> float:
        low = dtype in LOW_PRECISION_GEMM and op.kind == OpKind.MATMUL and op.weight is not None
        if dtype in LOW_PRECISION_GEMM and not low:
            dtype = "bf16"  # FP8 / NVFP4 recipes run only weighted GEMMs in that precision
        peak = device.peak_flops(dtype)
        bwd = phase == "bwd"
        flops = op.bwd_flops(local) if bwd else op.fwd_flops(local)
        bytes_ = (op.bwd_bytes(local) if bwd else op.fwd_bytes(local))
        elem_scale = _ELEM_SCALE.get(dtype, 1.0)  # the IR counts 2-byte activations; fp32/tf32 runs move 4
        bytes_ *= elem_scale
        if phase in ("dgrad", "wgrad"):  # one of the two backward GEMMs of a weighted op
            flops, bytes_ = op.bwd_flops(local) / 2, op.bwd_bytes(local) / 2 * elem_scale
        hbm = device.hbm_gbps * 1e9 * self.params.hbm_efficiency
        if op.kind in (OpKind.MATMUL, OpKind.CONV, OpKind.BMM):
            t = self.contraction_time(op, local, phase, device, dtype)
            kernels = self.kernels(op, phase, local)
            if low:
                cast_bytes = _cast_bytes(op, local, phase, dtype)
                t += cast_bytes / hbm
                kernels += _launches_per(op, local) if cast_bytes else 0  # a per-expert GEMM's input: per expert
        elif op.kind == OpKind.ATTENTION and op.kernel == "ssd":
            t = max(flops / self.ssd_rate(device, bwd), bytes_ / hbm)
            kernels = 1
        elif op.kind == OpKind.ATTENTION:
            frac = self.attention_efficiency(op, local, bwd)
            hw_flops = flops * attention_score_share(op, local) * (1.25 if bwd else 1.0)  # bwd recomputes P
            t = max(hw_flops / (peak * frac), bytes_ / hbm)
            kernels = 1
        elif op.kind == OpKind.EMBEDDING:
            # a gather reads only the looked-up rows (not the table) and writes the output
            out = math.prod(local[d] for d in op.output) * op.bytes_per_elem * elem_scale
            t = (2.0 * out * (2.0 if bwd else 1.0)) / hbm
            kernels = 1
        else:
            # elementwise / norm / softmax / pool / loss / routing: memory-bound streaming kernels;
            # fp32 CUDA-core FLOPs bound them only when arithmetic intensity is high
            kernels = self.kernels(op, phase, local)
            if _torch_softmax(op, local):
                bytes_ *= _UNFUSED_SOFTMAX["bwd" if bwd else "fwd"][1]
            bytes_ *= op.traffic  # an eager chain re-reads and re-writes its tensor per kernel
            t = max(bytes_ / hbm, flops / device.peak_flops("fp32"))
        return t + kernels * self.params.kernel_overhead_s

    def kernels(self, op: Op, phase: str, local: Mapping[str, float] | None = None) -> int:
        """CUDA kernels one op launches in a phase (a weighted op's backward is dgrad + wgrad; a GEMM launched per
        local expert, `op.launch_per`, as many of each; a softmax whose shape Megatron's fused kernel rejects runs
        five PyTorch kernels; an op built as a PyTorch-eager chain launches `op.launches`), plus its bookkeeping
        kernels (`op.side_kernels`; a split backward counts them with its input-gradient GEMM)."""
        side = _side_kernels(op, phase, local)
        if op.kind in (OpKind.MATMUL, OpKind.CONV, OpKind.BMM):
            return (2 if phase == "bwd" else 1) * _launches_per(op, local) + side
        if _torch_softmax(op, local):
            return _UNFUSED_SOFTMAX["bwd" if phase == "bwd" else "fwd"][0] + side
        return (1 if op.kind == OpKind.ATTENTION else op.launches) + side

    def host_time(self, op: Op, phase: str, local: Mapping[str, float] | None = None) -> float:
        """Framework (CPU) time to issue the op's kernels: bounds throughput when kernels are tiny. A framework
        kernel costs `host_overhead_s` (a module's Python around it included); a bookkeeping kernel
        (`op.side_kernels`) is one plain PyTorch call, `torch_op_host_s`."""
        side = _side_kernels(op, phase, local)
        return (self.kernels(op, phase, local) - side) * self.params.host_overhead_s + side * self.params.torch_op_host_s

    def memory_time(self, bytes_moved: float, device: Device) -> float:
        return bytes_moved / (device.hbm_gbps * 1e9 * self.params.hbm_efficiency) + self.params.kernel_overhead_s
