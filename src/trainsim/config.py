"""Job configuration validated at the boundary (pydantic); every CLI flag has a YAML key here."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import ConfigError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelSpec(_Strict):
    name: str = "gpt3-175b"
    hf_config: str | None = Field(None, description="local Hugging Face config.json (or its folder) to import "
                                  "instead of a built-in model; a relative path is taken from the working "
                                  "directory; the other model keys override it")
    seq_len: int | None = Field(None, ge=1)
    layers: int | None = Field(None, ge=1)
    hidden: int | None = Field(None, ge=1)
    heads: int | None = Field(None, ge=1)
    kv_heads: int | None = Field(None, ge=1)
    ffn: int | None = Field(None, ge=1)
    vocab: int | None = Field(None, ge=1)
    attention: Literal["flash", "unfused"] = "flash"


class ClusterSpec(_Strict):
    name: str = "dgx-a100"
    nodes: int | None = Field(None, ge=1)
    gpu: str | None = Field(None, description="replace the preset's GPU (see `trainsim clusters`)")
    gpus_per_node: int | None = Field(None, ge=1)
    intra_node_gbps: float | None = Field(None, gt=0, description="NVLink/switch GB/s per GPU per direction")
    nics_per_node: int | None = Field(None, ge=1)
    nic_gbps: float | None = Field(None, gt=0, description="GB/s per NIC per direction (200 Gb/s HDR = 25)")
    topology: str | None = Field(None, description="ASTRA-sim notation 'Ring(4)_FC(2)_Switch(8)' or a topology "
                                 "preset; replaces the preset's interconnect (the last dimension is the network)")
    bandwidth_gbps: list[float] | None = Field(None, description="with topology: GB/s per NPU per dimension")
    latency_ns: list[float] | None = Field(None, description="with topology: ns per hop per dimension")


class StrategySpec(_Strict):
    tree: str | None = Field(None, description="a saved strategy tree (YAML from --dump-strategy or "
                             "StrategyTree.to_yaml) that replaces the other strategy keys")
    dp: int | None = Field(None, ge=1, description="data-parallel degree; derived from the world size if omitted")
    tp: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)
    cp: int = Field(1, ge=1)
    ep: int = Field(1, ge=1)
    vpp: int = Field(1, ge=1)
    sequence_parallel: bool = False
    zero: int = Field(0, ge=0, le=3)
    fsdp: bool = False
    recompute: Literal["none", "selective", "full"] = "none"
    schedule: Literal["gpipe", "1f1b", "interleaved", "dynamic"] = Field(
        "1f1b", description="pipeline order; dynamic: Proteus' HTAE scheduler (backward first, forward under "
        "the cap) played out on the stage costs")
    max_ongoing_micro_batch: int | None = Field(None, ge=1, description="micro-batches a pipeline rank holds "
                                                "between forward and backward (1f1b: a lower cap; dynamic: the cap)")
    micro_batch: int = Field(1, ge=1)
    global_batch: int | None = Field(None, ge=1)
    overlap_grad_reduce: bool = True
    overlap_param_gather: bool = Field(False, description="ZeRO parameter all-gather hidden behind the next forward")
    tp_comm_overlap: bool = Field(False, description="TP collectives pipelined with their GEMMs (TE userbuffers)")
    p2p_scatter_gather: bool = Field(True, description="Megatron's scatter/gather pipeline hand-off: a tensor "
                                     "replicated over tp is sent 1/tp per rank and all-gathered on arrival")
    offload: Literal["none", "cpu", "nvme", "remote"] = Field(
        "none", description="keep parameters, gradients and optimizer states in CPU DRAM / NVMe (ZeRO-Infinity) or "
        "a disaggregated pool (ASTRA-sim HierMem): each layer's weights are loaded before its forward and "
        "backward and its gradients stored after, on the memory stream")


class SimulationSpec(_Strict):
    dtype: Literal["auto", "fp32", "tf32", "fp16", "bf16", "fp8"] = Field(
        "auto", description="auto: what the GPU trains in (bf16 from Ampere on, fp16 on V100, fp32 on Pascal)")
    gamma: float | None = Field(None, ge=0.0, le=5.0,
                                description="compute slowdown while overlapped with gradient comm (calibrated)")
    exact: bool = False
    granularity: Literal["op", "layer", "auto"] = "auto"
    calibration: str | None = Field(None, description="calibration YAML from `trainsim calibrate`")
    comm_model: Literal["nccl", "analytical"] = Field(
        "nccl", description="nccl: NCCL's tuned algorithm/protocol choice; analytical: ASTRA-sim's "
        "multi-dimensional topology-aware collectives")
    scheduler: Literal["baseline", "themis"] = Field("baseline", description="collective scheduler (analytical)")
    bandwidth_sharing: bool = Field(True, description="concurrent communication shares links (max-min fair "
                                    "flows, Proteus VI-C); false: fixed durations, every group alone")


class JobConfig(_Strict):
    """One simulated job: what is trained, on what, how it is parallelised, how it is simulated."""

    model: ModelSpec = ModelSpec()
    cluster: ClusterSpec = ClusterSpec()
    strategy: StrategySpec = StrategySpec()
    simulation: SimulationSpec = SimulationSpec()


DEFAULT_JOB: dict[str, Any] = {
    "model": {"name": "gpt3-175b", "seq_len": 2048},
    "cluster": {"name": "dgx-a100", "nodes": 128},
    "strategy": {"tp": 8, "pp": 16, "dp": 8, "micro_batch": 1, "global_batch": 1536, "sequence_parallel": True,
                 "recompute": "selective", "zero": 1, "schedule": "1f1b"},
}


def _field_of(err: dict[str, Any]) -> str:
    return ".".join(str(x) for x in err.get("loc", ())) or "config"


def parse_job(data: dict[str, Any]) -> JobConfig:
    """Validate a nested dict into a JobConfig, turning the first error into a ConfigError."""
    try:
        return JobConfig.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = _field_of(err)
        msg = err.get("msg", "invalid value")
        fix = "remove it (see `trainsim simulate --help` for the keys)" if err.get("type") == "extra_forbidden" else \
            f"got {err.get('input')!r}"
        raise ConfigError(field, msg, fix) from None


def load_yaml(path: Path) -> dict[str, Any]:
    """Safely load a YAML job file into a dict (no arbitrary object construction)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError("config", f"cannot read {path}: {exc.strerror}", "pass an existing YAML file") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError("config", f"malformed YAML in {path}{where}", "fix the YAML syntax") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("config", f"{path} must hold a mapping with model/cluster/strategy keys", "see README")
    return data


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge `override` into `base` (values of None in override are ignored)."""
    out = dict(base)
    for k, v in override.items():
        if v is None:
            continue
        if isinstance(v, dict):
            out[k] = merge(out[k] if isinstance(out.get(k), dict) else {}, v)
        else:
            out[k] = v
    return out


def dump_yaml(job: JobConfig) -> str:
    data = job.model_dump(exclude_none=True)
    if job.model.hf_config is not None:  # the imported config is the model: no built-in name beside it
        data["model"].pop("name", None)
    return yaml.safe_dump(data, sort_keys=False)
