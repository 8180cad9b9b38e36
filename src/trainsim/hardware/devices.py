"""GPU catalogue: vendor peak compute, memory capacity and memory bandwidth per device.

Numbers are the vendor's *dense* peaks (no 2:4 sparsity) so the compute model can apply its own
efficiency factors on top; every entry names the datasheet or whitepaper it was taken from.
Memory capacities: the vendors' "GB" for these parts is GiB (it matches what nvidia-smi reports),
so `hbm_bytes` is GiB * 2**30. Bandwidths are in GB/s with 1 GB = 1e9 bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

DTYPES: tuple[str, ...] = ("fp32", "tf32", "fp16", "bf16", "fp8", "fp4")
"""Data types a `Device.peak_tflops` table may list."""

_DTYPE_ALIASES: Mapping[str, str] = MappingProxyType(
    {
        "float32": "fp32",
        "float": "fp32",
        "f32": "fp32",
        "float16": "fp16",
        "half": "fp16",
        "f16": "fp16",
        "bfloat16": "bf16",
        "float8": "fp8",
        "fp8_e4m3": "fp8",
        "fp8_e5m2": "fp8",
        "nvfp4": "fp4",
    }
)

_HALF_PAIR: Mapping[str, str] = MappingProxyType({"fp16": "bf16", "bf16": "fp16"})

_GIB = 2**30


def _normalise_dtype(dtype: str) -> str:
    """Lower-case a dtype name and map common spellings ("bfloat16", "torch.float16") to ours."""
    key = dtype.strip().lower().removeprefix("torch.")
    return _DTYPE_ALIASES.get(key, key)


@dataclass(frozen=True)
class Device:
    """One accelerator model: dense peak FLOP rates per dtype, memory size and bandwidth.

    `peak_tflops` is stored read-only; dtypes the part lacks are simply absent.
    """

    name: str
    peak_tflops: Mapping[str, float] = field(hash=False)
    hbm_bytes: int
    hbm_gbps: float
    sms: int
    source: str

    def __post_init__(self) -> None:
        table = {str(k): float(v) for k, v in dict(self.peak_tflops).items()}
        unknown = sorted(set(table) - set(DTYPES))
        if unknown:
            raise ValueError(f"device '{self.name}': unknown dtype(s) {unknown}; allowed: {list(DTYPES)}")
        if not table:
            raise ValueError(f"device '{self.name}': peak_tflops is empty")
        if any(v <= 0 for v in table.values()):
            raise ValueError(f"device '{self.name}': peak_tflops values must be positive")
        if self.hbm_bytes <= 0 or self.hbm_gbps <= 0 or self.sms <= 0:
            raise ValueError(f"device '{self.name}': hbm_bytes, hbm_gbps and sms must be positive")
        if not self.source:
            raise ValueError(f"device '{self.name}': source must name where the numbers come from")
        object.__setattr__(self, "peak_tflops", MappingProxyType(table))

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickle/deepcopy via the constructor, since the read-only mapping proxy is not picklable."""
        values = tuple(getattr(self, f.name) for f in fields(self))
        return (type(self), tuple(dict(v) if isinstance(v, Mapping) else v for v in values))

    @property
    def dtypes(self) -> tuple[str, ...]:
        """The dtypes this device lists a peak for, in catalogue order."""
        return tuple(d for d in DTYPES if d in self.peak_tflops)

    @property
    def training_dtype(self) -> str:
        """What mixed-precision training runs in on this part: bf16 where it is listed (Ampere on),
        else fp16 where it is faster than fp32 (Volta tensor cores), else fp32 (Pascal: fp16 buys nothing)."""
        t = self.peak_tflops
        if "bf16" in t:
            return "bf16"
        if "fp16" in t and t["fp16"] > 1.5 * t.get("fp32", 0.0):
            return "fp16"
        return "fp32" if "fp32" in t else self.dtypes[0]

    def supports(self, dtype: str) -> bool:
        """Whether the part itself lists `dtype` (what a job may ask for; `peak_flops`' fp16/bf16 stand-in aside)."""
        return _normalise_dtype(dtype) in self.peak_tflops

    def peak_flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for `dtype`; fp16 and bf16 stand in for each other if only one is listed."""
        key = _normalise_dtype(dtype)
        if key in self.peak_tflops:
            return self.peak_tflops[key] * 1e12
        twin = _HALF_PAIR.get(key)
        if twin is not None and twin in self.peak_tflops:
            return self.peak_tflops[twin] * 1e12
        raise KeyError(
            f"device '{self.name}' has no peak for dtype '{dtype}'; supported: {list(self.dtypes)}"
        )


def _device(
    name: str,
    tflops: Mapping[str, float],
    hbm_gib: float,
    hbm_gbps: float,
    sms: int,
    source: str,
) -> Device:
    """Build a catalogue entry from a capacity in GiB (the unit the vendors' "GB" means here)."""
    return Device(name, tflops, int(hbm_gib * _GIB), hbm_gbps, sms, source)


_V100_TFLOPS = {"fp32": 15.7, "fp16": 125.0}
_V100_SOURCE = (
    "NVIDIA Tesla V100 GPU Accelerator datasheet, 'V100 SXM2' column: single-precision 15.7 TFLOPS, "
    "tensor (fp16 in, fp32 accumulate) 125 TFLOPS, HBM2 {gib} GB at 900 GB/s; 80 SMs from the NVIDIA "
    "Tesla V100 GPU Architecture (Volta) whitepaper, Table 1. Volta has no tf32/bf16/fp8."
)

_A100_TFLOPS = {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0}
_A100_SOURCE = (
    "NVIDIA A100 Tensor Core GPU datasheet, 'A100 {gib}GB SXM' column, dense figures (the starred "
    "with-sparsity values halved): FP32 19.5, TF32 156, BF16/FP16 312 TFLOPS, HBM2e {gib} GB at "
    "{bw} GB/s; 108 SMs from the NVIDIA A100 Tensor Core GPU Architecture whitepaper, Table 1."
)

_HOPPER_TFLOPS = {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4, "fp8": 1978.9}
_HOPPER_COMPUTE_SOURCE = (
    "compute: NVIDIA H100 Tensor Core GPU datasheet, 'H100 SXM' column (FP32 67 TFLOPS) and NVIDIA "
    "H100 Tensor Core GPU Architecture whitepaper, H100 SXM5 table, dense values: TF32 494.7, "
    "BF16/FP16 (fp32 accumulate) 989.4, FP8 1978.9 TFLOPS; 132 SMs"
)

_GA102_SOURCE_NOTE = (
    "GA102 professional parts run fp16/bf16 tensor math with fp32 accumulate at full rate and tf32 at "
    "half the fp16 rate (A40 datasheet ratio: 74.8 vs 149.7)"
)

_PASCAL_FP16_NOTE = (
    "GP102 has no tensor cores and its native fp16 rate is 1/64 of fp32, so 'fp16' here is the fp32 "
    "rate: mixed precision on Pascal stores fp16 but computes in fp32 (bf16 falls back to it)"
)

DEVICES: dict[str, Device] = {
    d.name: d
    for d in (
        _device("v100-sxm2-16gb", _V100_TFLOPS, 16, 900.0, 80, _V100_SOURCE.format(gib=16)),
        _device("v100-sxm2-32gb", _V100_TFLOPS, 32, 900.0, 80, _V100_SOURCE.format(gib=32)),
        _device("a100-40gb", _A100_TFLOPS, 40, 1555.0, 108, _A100_SOURCE.format(gib=40, bw=1555)),
        _device("a100-80gb", _A100_TFLOPS, 80, 2039.0, 108, _A100_SOURCE.format(gib=80, bw=2039)),
        _device(
            "h100-sxm",
            _HOPPER_TFLOPS,
            80,
            3350.0,
            132,
            f"{_HOPPER_COMPUTE_SOURCE}; memory: H100 datasheet, H100 SXM: 80 GB HBM3 at 3.35 TB/s.",
        ),
        _device(
            "h100-96gb-500w",
            {"fp32": 63.5, "tf32": 456.1, "fp16": 912.5, "bf16": 912.5, "fp8": 1824.7},
            96,
            3350.0,
            132,
            "H100 96 GB parts run at a 500 W power limit (Meta's Grand Teton hosts, as in torchtitan's "
            "benchmarks/llama3_h100_202412_torchtitan.md, which says their true peak lies between the H100 SXM "
            "and H100 NVL figures): dense peaks taken as the midpoint of the two datasheet columns (H100 "
            "datasheet: SXM BF16 1,979 / NVL 1,671 TFLOPS sparse -> 989.4 and 835.5 dense; FP8, TF32, FP32 "
            "likewise); memory bandwidth not stated by the source, taken as the H100 SXM's 3.35 TB/s.",
        ),
        _device(
            "h200-sxm",
            _HOPPER_TFLOPS,
            141,
            4800.0,
            132,
            "NVIDIA H200 Tensor Core GPU datasheet, 'H200 SXM' column: same compute as H100 SXM "
            f"({_HOPPER_COMPUTE_SOURCE}), 141 GB HBM3e at 4.8 TB/s (nvidia-smi shows ~140 GiB usable).",
        ),
        _device(
            "b200",
            {"fp32": 75.0, "tf32": 1100.0, "fp16": 2250.0, "bf16": 2250.0, "fp8": 4500.0, "fp4": 9000.0},
            180,
            8000.0,
            148,
            "compute: NVIDIA HGX B200 per-GPU specification table (NVIDIA HGX platform page), halved "
            "sparse tensor figures: TF32 2.2 PF -> 1100, FP16/BF16 4.5 PF -> 2250, FP8 9 PF -> 4500 "
            "TFLOPS dense, FP4 (NVFP4) 18 PF -> 9000; FP32 75 TFLOPS (an earlier revision of that table said 80). Memory: NVIDIA "
            "DGX B200 datasheet, 1,440 GB total and 64 TB/s HBM3e over 8 GPUs = 180 GB and 8 TB/s per "
            "GPU (192 GB physical; the later HGX table and the driver's 7680-bit bus give ~7.7 TB/s). "
            "148 SMs from cudaGetDeviceProperties (not in the datasheets).",
        ),
        _device(
            "gb200",
            {"fp32": 80.0, "tf32": 1250.0, "fp16": 2500.0, "bf16": 2500.0, "fp8": 5000.0, "fp4": 10000.0},
            186,
            8000.0,
            148,
            "NVIDIA GB200 NVL72 datasheet (rack of 72 Blackwell GPUs, tensor figures stated with "
            "sparsity): TF32 180 PF, FP16/BF16 360 PF, FP8 720 PF, FP4 1,440 PF -> per GPU halved to dense "
            "1250, 2500, 5000, 10000 TFLOPS; FP32 5,760 TF -> 80; up to 13.4 TB HBM3e at 576 TB/s -> 186 GB and 8 TB/s per "
            "GPU. The GB200 runs its B200 GPUs at 1.2 kW, hence 2.5 PF dense BF16 against the HGX B200's "
            "2.25 PF (some third-party tables give GB200 2.25: they copy the HGX part). SMs as b200 "
            "(not in the datasheet).",
        ),
        _device(
            "h800-sxm",
            _HOPPER_TFLOPS,
            80,
            3350.0,
            132,
            "H800 SXM5: the H100 SXM's silicon, compute and memory for the export market with its NVLink cut to "
            "400 GB/s bidirectional (8 links) and FP64 restricted (public H800 vs H100 comparisons, e.g. "
            f"philisun.com's H800 analysis): compute as H100 SXM ({_HOPPER_COMPUTE_SOURCE}); 80 GB HBM3 at "
            "3.35 TB/s. The NVLink cut is the cluster's (dgx-h800).",
        ),
        _device(
            "b300",
            {"fp32": 75.0, "tf32": 1125.0, "fp16": 2250.0, "bf16": 2250.0, "fp8": 4500.0, "fp4": 13500.0},
            288,
            8000.0,
            160,
            "NVIDIA HGX/DGX B300 (Blackwell Ultra) specification table, per 8-GPU node with sparsity: FP8/FP6 72 "
            "PF, FP16/BF16 36 PF, TF32 18 PF, FP32 600 TF, up to 2.3 TB HBM3e at 64 TB/s -> per GPU dense FP8 "
            "4500, BF16/FP16 2250, TF32 1125, FP32 75 TFLOPS, 288 GB and 8 TB/s; FP4 (NVFP4) 144 PF sparse, 108 PF "
            "dense -> 13500 (Blackwell Ultra raises dense FP4 1.5x over the B200, not FP8). Dense MXFP8 runs at the FP8 "
            "rate (Blackwell's tensor cores scale 1x32 blocks in hardware). 160 SMs: Blackwell Ultra's 20,480 "
            "CUDA cores / 128 per SM (not in the datasheet).",
        ),
        _device(
            "gb300",
            {"fp32": 80.0, "tf32": 1250.0, "fp16": 2500.0, "bf16": 2500.0, "fp8": 5000.0, "fp4": 15000.0},
            278,
            8000.0,
            160,
            "NVIDIA GB300 NVL72 datasheet (rack of 72 Blackwell Ultra GPUs; tensor figures with sparsity): "
            "FP8/FP6 720 PF (360 PF dense 'for training'), FP16/BF16 360 PF, TF32 180 PF, up to 20 TB HBM3e at "
            "576 TB/s -> per GPU dense FP8 5000, BF16/FP16 2500, TF32 1250 TFLOPS, 278 GB and 8 TB/s; FP4 (NVFP4) 1,440 PF "
            "sparse, 1,080 PF dense -> 15000; FP32 80 "
            "TFLOPS as the GB200. The GB300 runs its B300 GPUs at 1.4 kW, hence more than the HGX B300's rates. "
            "MXFP8 and SMs as b300.",
        ),
        _device(
            "a40",
            {"fp32": 37.4, "tf32": 74.8, "fp16": 149.7, "bf16": 149.7},
            48,
            696.0,
            84,
            "NVIDIA A40 datasheet, dense figures (starred with-sparsity values halved): FP32 37.4, TF32 "
            "74.8, BF16/FP16 149.7 TFLOPS, 48 GB GDDR6 at 696 GB/s; 84 SMs (10,752 CUDA cores / 128, "
            "full GA102 per the NVIDIA Ampere GA102 GPU Architecture whitepaper).",
        ),
        _device(
            "rtx-a5500",
            {"fp32": 34.1, "tf32": 68.2, "fp16": 136.4, "bf16": 136.4},
            24,
            768.0,
            80,
            "NVIDIA RTX A5500 datasheet: single-precision 34.1 TFLOPS, tensor 272.8 TFLOPS with sparsity "
            "-> 136.4 dense fp16/bf16, 24 GB GDDR6 at 768 GB/s, 10,240 CUDA cores = 80 SMs. TF32 is not "
            f"on the datasheet: 68.2 is derived because {_GA102_SOURCE_NOTE}.",
        ),
        _device(
            "gtx-1080-ti",
            {"fp32": 11.3, "fp16": 11.3},
            11,
            484.0,
            28,
            "NVIDIA GeForce GTX 1080 Ti specifications: 3,584 CUDA cores (28 SMs) at 1,582 MHz boost "
            "-> 11.3 TFLOPS fp32, 11 GB GDDR5X at 11 Gbps on 352 bits = 484 GB/s. "
            f"{_PASCAL_FP16_NOTE}.",
        ),
        _device(
            "titan-xp",
            {"fp32": 12.1, "fp16": 12.1},
            12,
            547.7,
            30,
            "NVIDIA TITAN Xp specifications: 3,840 CUDA cores (30 SMs) at 1,582 MHz boost -> 12.1 "
            "TFLOPS fp32, 12 GB GDDR5X at 11.4 Gbps on 384 bits = 547.7 GB/s. "
            f"{_PASCAL_FP16_NOTE}.",
        ),
    )
}
"""Canonical device name -> Device. Look names up with `get_device` to get aliases for free."""

_DEVICE_ALIASES: Mapping[str, str] = MappingProxyType(
    {
        "v100": "v100-sxm2-32gb",
        "v100-32gb": "v100-sxm2-32gb",
        "v100-sxm2": "v100-sxm2-32gb",
        "v100-16gb": "v100-sxm2-16gb",
        "a100": "a100-80gb",
        "a100-sxm": "a100-80gb",
        "a100-sxm4-80gb": "a100-80gb",
        "a100-sxm4-40gb": "a100-40gb",
        "h100": "h100-sxm",
        "h100-sxm5": "h100-sxm",
        "h100-80gb": "h100-sxm",
        "h100-96gb": "h100-96gb-500w",
        "h200": "h200-sxm",
        "hgx-b200": "b200",
        "gb200-nvl72": "gb200",
        "h800": "h800-sxm",
        "h800-sxm5": "h800-sxm",
        "hgx-b300": "b300",
        "dgx-b300": "b300",
        "b300-sxm": "b300",
        "gb300-nvl72": "gb300",
        "a5500": "rtx-a5500",
        "1080ti": "gtx-1080-ti",
        "titanxp": "titan-xp",
    }
)


def _compact(name: str) -> str:
    """Case- and separator-insensitive key: 'GTX_1080 Ti' and 'gtx-1080-ti' both become 'gtx1080ti'."""
    return "".join(ch for ch in name.lower() if ch not in " -_")


def _build_lookup() -> Mapping[str, str]:
    """Map every compacted canonical name and alias to its canonical name, refusing collisions."""
    lookup: dict[str, str] = {}
    pairs = [(n, n) for n in DEVICES] + list(_DEVICE_ALIASES.items())
    for alias, canonical in pairs:
        if canonical not in DEVICES:
            raise AssertionError(f"alias '{alias}' points at unknown device '{canonical}'")
        key = _compact(alias)
        if lookup.setdefault(key, canonical) != canonical:
            raise AssertionError(f"alias '{alias}' is ambiguous")
    return MappingProxyType(lookup)


_LOOKUP = _build_lookup()


def get_device(name: str) -> Device:
    """Return the catalogue entry for `name` (case-insensitive; aliases like 'a100' or '1080ti' work)."""
    canonical = _LOOKUP.get(_compact(name))
    if canonical is None:
        raise KeyError(f"unknown device '{name}'; known: {', '.join(sorted(DEVICES))}")
    return DEVICES[canonical]
