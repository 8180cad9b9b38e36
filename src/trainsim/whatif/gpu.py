"""What-if "the same trace on another GPU": how much each op class's kernel time changes, per trainsim's model.

A replayed trace keeps its measured kernel times; moving it to another GPU multiplies each kernel's time by
the ratio for its op class (trace.kineto.kernels) between the two catalogue presets:

* `gemm`, `conv`: achievable matmul throughput (dense peak of the dtype x the GEMM efficiency the compute
  model applies, with the device family's calibrated constants);
* `attention`: achievable fused-attention throughput (peak x the family's flash fractions, forward plus
  backward as a training step runs them);
* `elementwise`, `norm`, `reduction`, `optimizer`, `memcpy`, `memset`: achievable HBM bandwidth (peak x the
  family's calibrated HBM efficiency), as the model prices every memory-bound op (host copies, HtoD/DtoH,
  really follow the host link, which no device preset describes: they are scaled like device copies here);
* `collective`: 1.0; the network what-if re-times collectives;
* `other`: the memory-bound ratio. Unrecognised kernels are mostly small glue kernels (index arithmetic,
  sleeps, asserts) whose time follows memory and launch latency rather than tensor-core throughput; on the
  shared traces they are no kernel time at all but one sleep test program's spin, so a blend would add a
  parameter for nothing.

Every rate is the compute model's own answer (`RooflineCompute.op_time` / `memory_time`) for one very large
problem of each kind, so tile and wave quantisation, short-K, small-output and per-kernel launch terms fall
below 1e-4 and what remains is the model's asymptotic rate. Per-kernel shapes are not in a Kineto trace, so
a shape-dependent efficiency could not be applied to a kernel anyway.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..cost.calibration import Calibration, load_calibration
from ..cost.compute import RooflineCompute
from ..cost.fit_compute import attention_op, gemm_op
from ..errors import ConfigError
from ..hardware import DEVICES, DTYPES, Device, get_device
from ..trace.kineto.kernels import OP_CLASSES, OpClass

_PROBE_GEMM = 1 << 20  # m = n = k: tiles and waves whole to ~1e-6, K-efficiency 1 - 7e-5
_PROBE_ATTENTION = {"batch": 1, "heads": 64, "seq_len": 1 << 17, "head_dim": 128}  # ~1e15 FLOPs, compute-bound
_PROBE_BYTES = float(1 << 50)  # the 3 us kernel overhead is 1e-8 of the streaming time
_COMPUTE_CLASSES = {OpClass.GEMM: "matmul", OpClass.CONV: "matmul", OpClass.ATTENTION: "attention"}

# deviceProperties spellings (lower case, vendor words dropped, spaces/dashes/underscores removed) that the
# catalogue's aliases do not already cover; a board whose numbers differ from every preset (PCIe or NVL
# variants, other memory sizes) is deliberately absent so it maps to None rather than to a near miss
_TRACE_NAMES = {
    "a100pg509200": "a100-40gb",  # Meta's A100 SXM4 board; the shared traces report 39.4 GiB (totalGlobalMem)
    "v100dgxs32gb": "v100-sxm2-32gb",  # DGX Station: V100 SXM2 modules
    "v100dgxs16gb": "v100-sxm2-16gb",
    "h10080gbhbm3": "h100-sxm",  # what the driver calls the H100 SXM5 80 GB
    "h100sxm580gb": "h100-sxm",
    "h200141gbhbm3e": "h200-sxm",
}
_VENDOR_WORDS = re.compile(r"\b(nvidia|tesla|geforce|amd|corporation)\b")


@dataclass(frozen=True)
class AchievableRates:
    """What trainsim's compute model says one GPU sustains in one dtype (for `time_ratios`)."""

    gpu: str  # catalogue preset id
    dtype: str
    matmul_flops_per_s: float
    attention_flops_per_s: float
    hbm_bytes_per_s: float


def gpu_from_trace_name(device_name: str) -> str | None:
    """The catalogue preset a trace's deviceProperties `name` denotes ("NVIDIA A100-SXM4-80GB" -> "a100-80gb"),
    or None for a GPU without its own preset (e.g. "NVIDIA GeForce RTX 2080 Ti", "AMD Instinct MI300X")."""
    words = _VENDOR_WORDS.sub(" ", device_name.lower())
    key = re.sub(r"[\s_-]+", "", words)
    if not key:
        return None
    if key in _TRACE_NAMES:
        return _TRACE_NAMES[key]
    try:
        return get_device(key).name
    except KeyError:
        return None


def _preset(gpu: str, field: str) -> Device:
    """The catalogue device for a preset id (aliases accepted), else a ConfigError naming `field`."""
    try:
        return get_device(gpu)
    except KeyError:
        raise ConfigError(field, f"unknown GPU '{gpu}'", f"use one of {', '.join(sorted(DEVICES))}") from None


def _dtype(dtype: str, device: Device) -> str:
    """A trainsim dtype name; "auto" is what `device` trains in (bf16 from Ampere on, fp16 on V100, fp32 before)."""
    key = dtype.strip().lower()
    if key == "auto":
        return device.training_dtype
    if key not in DTYPES:
        raise ConfigError("dtype", f"unknown dtype '{dtype}'", f"use auto or one of {', '.join(DTYPES)}")
    return key


def achievable_rates(gpu: str, dtype: str = "auto", calibration: Calibration | None = None) -> AchievableRates:
    """Matmul, fused-attention and HBM rates of one preset as trainsim's compute model prices them (the
    device family's calibrated constants; `calibration` defaults to the packaged one)."""
    device = _preset(gpu, "gpu")
    key = _dtype(dtype, device)
    try:
        device.peak_flops(key)
    except KeyError:
        raise ConfigError("dtype", f"{device.name} has no {key} peak",
                          f"use auto or one of {', '.join(device.dtypes)}") from None
    model = RooflineCompute((calibration or load_calibration()).compute_for(device))
    gemm = gemm_op(_PROBE_GEMM, _PROBE_GEMM, _PROBE_GEMM)
    attn = attention_op(causal=False, **_PROBE_ATTENTION)
    attn_s = sum(model.op_time(attn, attn.dims, phase, device, key) for phase in ("fwd", "bwd"))
    return AchievableRates(
        gpu=device.name,
        dtype=key,
        matmul_flops_per_s=gemm.fwd_flops() / (model.contraction_time(gemm, gemm.dims, "fwd", device, key)
                                               + model.params.kernel_overhead_s),
        attention_flops_per_s=(attn.fwd_flops() + attn.bwd_flops()) / attn_s,
        hbm_bytes_per_s=_PROBE_BYTES / model.memory_time(_PROBE_BYTES, device),
    )


def time_ratios(source_gpu: str, target_gpu: str, dtype: str = "auto",
                calibration: Calibration | None = None) -> dict[str, float]:
    """Per op class, the factor a kernel's time on `source_gpu` is multiplied by to estimate it on `target_gpu`
    (< 1: faster). `dtype` is what the traced job computes in on both GPUs; "auto" is what the source trains
    in (the trace's program keeps its precision). Unknown presets or dtypes are a ConfigError."""
    src = _preset(source_gpu, "source_gpu")
    dst = _preset(target_gpu, "target_gpu")
    key = _dtype(dtype, src)
    rates = []
    for device, field in ((src, "source_gpu"), (dst, "target_gpu")):
        try:
            rates.append(achievable_rates(device.name, key, calibration))
        except ConfigError as exc:
            raise ConfigError("dtype", f"{field} {exc.problem}", exc.fix) from None
    before, after = rates
    by_kind = {
        "matmul": before.matmul_flops_per_s / after.matmul_flops_per_s,
        "attention": before.attention_flops_per_s / after.attention_flops_per_s,
    }
    memory = before.hbm_bytes_per_s / after.hbm_bytes_per_s
    out: dict[str, float] = {}
    for cls in OP_CLASSES:
        if cls == OpClass.COLLECTIVE:
            out[cls.value] = 1.0
        else:
            out[cls.value] = by_kind[_COMPUTE_CLASSES[cls]] if cls in _COMPUTE_CLASSES else memory
    return out
