"""Fitted constants of the cost models, loaded from a versioned YAML data file.

The packaged `trainsim/data/calibration.yaml` holds every fitted number (GEMM efficiency per
device family, memory-bound efficiency, kernel and framework overheads, link efficiencies and
NCCL-style latencies, the overlap slowdown gamma) next to where it came from. `trainsim
calibrate` writes a file of the same shape; `--calibration FILE` uses it instead.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import ConfigError
from ..hardware.devices import Device


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ComputeParams(_Strict):
    """Compute-model constants of one device family (see cost/compute.py for how each is used)."""

    gemm_peak_fraction: float = Field(gt=0, le=1, description="large well-shaped GEMM throughput / dense peak")
    dtype_gemm_fraction: dict[str, float] = Field(
        default_factory=dict,
        description="gemm_peak_fraction for a dtype whose kernels reach a different share of that dtype's peak "
                    "(fp32 SIMT SGEMM, tf32), fitted from that dtype's GEMM rows")
    tile: int = Field(128, ge=16, description="output tile edge used for tile/wave quantisation")
    k_half: float = Field(64.0, ge=0, description="reduction length at which a GEMM runs at half speed")
    small_mn_half: float = Field(0.0, ge=0, description="output elements (m x n) at which a GEMM runs at half speed")
    flash_fraction_fwd: float = Field(gt=0, le=1, description="FlashAttention-2 forward at head dim 128, long "
                                      "sequences, no mask: achieved / dense peak")
    flash_fraction_bwd: float = Field(gt=0, le=1, description="the same for the backward pass")
    attention_seq_half: float = Field(0.0, ge=0, description="key length (tokens) at which a fused attention kernel "
                                      "runs at half its long-sequence speed")
    attention_head_dim_half: float = Field(0.0, ge=0, description="head dim at which it runs at half speed "
                                           "(normalised to head dim 128; larger head dims count as 128)")
    attention_causal_max: float = Field(1.0, gt=0, le=1, description="causal speed / unmasked speed at long sequence "
                                        "(load imbalance of the triangular work)")
    attention_causal_tiles: float = Field(0.0, ge=0, description="128-token key blocks of diagonal waste: a causal "
                                          "kernel runs at n / (n + this) of its long-sequence speed, n = keys / 128")
    attention_kernel_speed: dict[str, float] = Field(
        default_factory=dict, description="speed of another fused attention kernel relative to FlashAttention-2 "
        "on this family (flash3, cudnn, triton)")
    ssd_fp32_multiple_fwd: float = Field(
        1.263, gt=0, description="Mamba2's chunked SSD scan (mamba_ssm's Triton kernels), forward: FLOP/s reached "
        "as a multiple of the device's FP32 (CUDA-core) peak; measured on an H200 over 10 shapes "
        "(benchmarks/data/gpu_h200/mamba_ssd.csv, geometric mean)")
    ssd_fp32_multiple_bwd: float = Field(
        0.668, gt=0, description="the same for its backward (FLOPs counted as twice the forward's)")
    hbm_efficiency: float = Field(gt=0, le=1, description="achievable / peak HBM bandwidth for streaming ops")
    kernel_overhead_s: float = Field(ge=0, description="GPU-side gap per kernel (launch + ramp)")
    host_overhead_s: float = Field(0.0, ge=0, description="framework (CPU) time to dispatch one op, per kernel")
    torch_op_host_s: float = Field(
        1.348e-5, ge=0, description="CPU time of one plain PyTorch call that launches a kernel (the MoE router's and "
        "token dispatcher's bookkeeping kernels, Op.side_kernels): torch.nn.Linear's forward, 13.48 us on a DGX H100 "
        "host (Xeon Platinum 8480C), NVIDIA/TransformerEngine issue #2053")
    collective_host_s: float = Field(0.0, ge=0, description="framework time to issue one collective")
    source: str = ""


class Calibration(_Strict):
    """Every fitted constant trainsim uses; `compute` is keyed by device family ('default' as fallback)."""

    version: int = 1
    description: str = ""
    gamma: float = Field(0.189, ge=0, le=5)
    gamma_source: str = ""
    p2p_host_sync: bool = Field(True, description="host waits for pipeline sends/receives (Megatron batch_p2p_sync)")
    compute: dict[str, ComputeParams]
    comm: dict[str, Any] = Field(default_factory=dict)

    def compute_for(self, device: Device) -> ComputeParams:
        """Constants of the device's family, else the 'default' entry."""
        fam = device_family(device)
        return self.compute.get(fam) or self.compute["default"]


def device_family(device: Device) -> str:
    """Family key of a device: its name up to the first '-' (a100-80gb -> a100, h100-sxm -> h100)."""
    name = device.name.lower()
    for prefix in ("gtx-", "rtx-"):
        if name.startswith(prefix):
            return name
    return name.split("-")[0]


def _parse(data: Any, where: str) -> Calibration:
    if not isinstance(data, dict):
        raise ConfigError("calibration", f"{where} must hold a mapping", "start from trainsim/data/calibration.yaml")
    try:
        cal = Calibration.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = "calibration." + ".".join(str(x) for x in err.get("loc", ()))
        raise ConfigError(field, err.get("msg", "invalid value"), f"fix {where}") from None
    if "default" not in cal.compute:
        raise ConfigError("calibration.compute", "needs a 'default' family", f"add compute.default to {where}")
    return cal


@lru_cache(maxsize=8)
def _load_cached(path: str | None) -> Calibration:
    if path is None:
        text = resources.files("trainsim").joinpath("data/calibration.yaml").read_text()
        # libyaml's safe loader where PyYAML has it: the same document in a tenth of the time (a cold call's cost)
        return _parse(yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)), "the packaged calibration")
    from ..files import load_yaml

    p = Path(path)
    data = load_yaml(p, "simulation.calibration", what="calibration file",
                     fix="pass a file written by `trainsim calibrate`")
    return _parse(data, str(p))


def load_calibration(path: str | Path | None = None) -> Calibration:
    """The packaged calibration, or the file at `path` (validated; cached per path, immutable use only)."""
    if path is not None and str(path) == "":
        raise ConfigError("simulation.calibration", "empty path", "pass a file written by `trainsim calibrate`")
    return _load_cached(None if path is None else str(Path(path).resolve()))


def dump_calibration(cal: Calibration) -> str:
    return yaml.safe_dump(cal.model_dump(), sort_keys=False)
