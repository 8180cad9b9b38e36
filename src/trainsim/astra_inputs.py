"""ASTRA-sim 2.0's own input files, read as they are: network config, system config, remote memory.

- Network (`--network-configuration`, the analytical backend's YAML or JSON): `topology`
  (Ring / FullyConnected / Switch per dimension, innermost first), `npus_count`, `bandwidth` (GB/s
  per link per direction, where ASTRA-sim's GB is 2^30 B) and `latency` (ns per hop), one list entry
  per dimension. It becomes trainsim's levels: bandwidth per NPU in 1e9 B/s, an FC dimension carrying
  its k-1 peer links.
- System (`--system-configuration`, JSON): scheduling policy, endpoint delay, active chunks per
  dimension, preferred dataset splits, per-op implementation lists, collective optimization,
  local-mem-bw (decimal GB/s), roofline / peak perf. It becomes `cost.semantics.astra(...)` with the
  chunk count and per-op algorithms.
- Remote memory (`--remote-memory-configuration`, JSON): memory type, latency (ns), bandwidth (GB/s
  = 1e9 B/s), node grouping. It becomes an `AstraRemoteMemory` memory system.

Keys ASTRA-sim reads but trainsim cannot honour, and unknown keys, are refused with one line naming
the key. Keys ASTRA-sim itself ignores in 2.0 (`boost-mode`, trace and memory-tracking switches) are
accepted and have no effect on time, as there.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .cost.semantics import Semantics, astra
from .errors import ConfigError
from .files import load_json, load_yaml
from .hardware.cluster import Level
from .hardware.memory_systems import MemoryAccess
from .hardware.topology import GIB_PER_S_IN_GBPS, format_topology
from .limits import MAX_BANDWIDTH_GBPS, MAX_COLLECTIVE_CHUNKS, MAX_GPUS, MAX_LATENCY_NS

if TYPE_CHECKING:
    from .cost.multidim import AnalyticalComm

BLOCKS = {"Ring": "ring", "FullyConnected": "fc", "Switch": "switch"}
OPS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")
ALGORITHM_NAMES = {"ring": "ring", "halvingDoubling": "halving_doubling", "direct": "direct",
                   "doubleBinaryTree": "double_binary_tree"}
_UNSUPPORTED_ALGORITHMS = {"oneRing", "oneHalvingDoubling", "oneDirect"}


def _check(model: type[BaseModel], data: Any, source: str, what: str) -> Any:  # noqa: ANN401
    """Validate `data` into `model`; the first problem becomes a one-line ConfigError naming the key."""
    if not isinstance(data, dict):
        raise ConfigError(source, f"must hold a mapping of {what} keys, not {type(data).__name__}",
                          f"write an ASTRA-sim {what} ({'{'}\"key\": value, ...{'}'})")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(x) for x in err.get("loc", ())) or what
        if err.get("type") == "extra_forbidden":
            raise ConfigError(f"{source}: {key}", f"is not a key of ASTRA-sim's {what} that trainsim reads",
                              f"remove it (keys: {', '.join(f.alias or n for n, f in model.model_fields.items())})") \
                from None
        cause = (err.get("ctx") or {}).get("error")
        msg = str(cause) if cause is not None else err.get("msg", "invalid value")
        raise ConfigError(f"{source}: {key}", msg, f"got {str(err.get('input'))[:60]!s}") from None


def _read(path: str | Path, field: str, what: str) -> Any:  # noqa: ANN401
    """JSON or YAML (ASTRA-sim's network configs are YAML in older releases, JSON since 2025)."""
    p = Path(path)
    if p.suffix.lower() == ".json":
        return load_json(p, field, what=f"ASTRA-sim {what}", fix=f"pass an ASTRA-sim {what} file")
    return load_yaml(p, field, what=f"ASTRA-sim {what}", fix=f"pass an ASTRA-sim {what} file")


# --------------------------------------------------------------------------------------------------
# network
# --------------------------------------------------------------------------------------------------

class AstraNetwork(BaseModel):
    """The analytical backend's network config: one entry per dimension, innermost first."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    topology: list[Literal["Ring", "FullyConnected", "Switch"]] = Field(min_length=1, max_length=8)
    npus_count: list[int] = Field(min_length=1, max_length=8)
    bandwidth: list[float | int] = Field(min_length=1, max_length=8)
    latency: list[float | int] = Field(min_length=1, max_length=8)

    def check(self, source: str) -> AstraNetwork:
        n = len(self.topology)
        for key in ("npus_count", "bandwidth", "latency"):
            if len(getattr(self, key)) != n:
                raise ConfigError(f"{source}: {key}", f"has {len(getattr(self, key))} entries for {n} dimension(s)",
                                  "give one entry per topology dimension, innermost first")
        for i, k in enumerate(self.npus_count):
            if not 1 < k <= MAX_GPUS:
                raise ConfigError(f"{source}: npus_count", f"dimension {i + 1} has {k} NPUs",
                                  f"use 2..{MAX_GPUS:,} NPUs per dimension (ASTRA-sim needs more than 1)")
        for i, b in enumerate(self.bandwidth):
            if not 0 < b * GIB_PER_S_IN_GBPS <= MAX_BANDWIDTH_GBPS:
                raise ConfigError(f"{source}: bandwidth", f"dimension {i + 1} has {b} GB/s",
                                  f"give a positive link bandwidth up to {MAX_BANDWIDTH_GBPS:g} GB/s")
        for i, lat in enumerate(self.latency):
            if not 0 <= lat <= MAX_LATENCY_NS:
                raise ConfigError(f"{source}: latency", f"dimension {i + 1} has {lat} ns",
                                  f"give a latency of 0..{MAX_LATENCY_NS:g} ns per hop")
        if math.prod(self.npus_count) > MAX_GPUS:
            raise ConfigError(f"{source}: npus_count", f"{math.prod(self.npus_count):,} NPUs in all",
                              f"use at most {MAX_GPUS:,}")
        return self

    @property
    def npus(self) -> int:
        return math.prod(self.npus_count)

    def levels(self) -> tuple[Level, ...]:
        """trainsim's levels: GB/s per NPU per direction in 1e9 B/s (ASTRA's per-link GiB/s x links)."""
        out = []
        for i, (name, k, bw, lat) in enumerate(zip(self.topology, self.npus_count, self.bandwidth, self.latency,
                                                   strict=True)):
            kind = BLOCKS[name]
            links = k - 1 if kind == "fc" else 1
            out.append(Level(f"dim{i + 1}", kind, k, float(bw) * GIB_PER_S_IN_GBPS * links, float(lat) * 1e-9))
        return tuple(out)

    @property
    def notation(self) -> str:
        return format_topology(self.levels())


def load_network(path: str | Path, field: str = "--network") -> AstraNetwork:
    data = _read(path, field, "network config")
    return _check(AstraNetwork, data, str(path), "network config").check(str(path))


def network_of(levels: tuple[Level, ...]) -> AstraNetwork:
    """The ASTRA-sim network config of trainsim levels (the inverse of `AstraNetwork.levels`)."""
    names = {v: k for k, v in BLOCKS.items()}
    topo, npus, bw, lat = [], [], [], []
    for lv in levels:
        if lv.size == 1:
            continue
        if lv.kind not in names:
            raise ValueError(f"level '{lv.name}' is a {lv.kind}: ASTRA-sim has Ring, FullyConnected and Switch only")
        links = lv.size - 1 if lv.kind == "fc" else 1
        topo.append(names[lv.kind])
        npus.append(lv.size)
        bw.append(lv.bandwidth_gbps / GIB_PER_S_IN_GBPS / links)
        lat.append(lv.latency_s * 1e9)
    return AstraNetwork(topology=topo, npus_count=npus, bandwidth=bw, latency=lat)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------
# system
# --------------------------------------------------------------------------------------------------

def _algorithm(name: str) -> str:
    if name in ALGORITHM_NAMES:
        return ALGORITHM_NAMES[name]
    if re.fullmatch(r"direct\d+", name):
        return "direct"  # a window on concurrent direct sends; every peer is sent to at once either way here
    if any(name.startswith(u) for u in _UNSUPPORTED_ALGORITHMS):
        raise ValueError(f"'{name}' (one logical group over all dimensions) is not supported; use per-dimension "
                         f"names: ring, halvingDoubling, direct, doubleBinaryTree")
    raise ValueError(f"'{name}' is not an ASTRA-sim collective implementation; use ring, halvingDoubling, direct "
                     f"or doubleBinaryTree per dimension")


class AstraSystem(BaseModel):
    """The system layer's JSON. Keys as ASTRA-sim spells them; defaults: ASTRA-sim's shipped example
    `examples/system/native_collectives/Ring_4chunks.json` (LIFO, endpoint delay 10 ns, one active chunk,
    4 chunks, localBWAware, local-mem-bw 1600, roofline off, peak-perf 900), with each dimension's own
    algorithm where no implementation list is given (Ring: ring, FC: direct, Switch: halving-doubling)."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    scheduling_policy: Literal["LIFO", "FIFO"] = Field("LIFO", alias="scheduling-policy")
    endpoint_delay: int | float = Field(10, alias="endpoint-delay", ge=0, le=1e9)
    active_chunks_per_dimension: int = Field(1, alias="active-chunks-per-dimension", ge=1, le=MAX_COLLECTIVE_CHUNKS)
    preferred_dataset_splits: int = Field(4, alias="preferred-dataset-splits", ge=1, le=MAX_COLLECTIVE_CHUNKS)
    all_reduce_implementation: list[str] | None = Field(None, alias="all-reduce-implementation", min_length=1)
    reduce_scatter_implementation: list[str] | None = Field(None, alias="reduce-scatter-implementation",
                                                            min_length=1)
    all_gather_implementation: list[str] | None = Field(None, alias="all-gather-implementation", min_length=1)
    all_to_all_implementation: list[str] | None = Field(None, alias="all-to-all-implementation", min_length=1)
    collective_optimization: Literal["localBWAware", "baseline"] = Field("localBWAware",
                                                                         alias="collective-optimization")
    local_reduction_delay: int = Field(1, alias="local-reduction-delay", ge=0)
    local_mem_bw: int | float = Field(1600, alias="local-mem-bw", gt=0, le=1e12)
    peak_perf: int | float = Field(900, alias="peak-perf", gt=0, le=1e9)
    # 0/1 switches: a JSON true is refused (ASTRA-sim compares with 0, so it would read true and false as on)
    roofline_enabled: int = Field(0, alias="roofline-enabled", ge=0, le=1)
    boost_mode: int = Field(0, alias="boost-mode", ge=0, le=1)
    trace_enabled: int = Field(0, alias="trace-enabled", ge=0, le=1)
    replay_only: int = Field(0, alias="replay-only", ge=0, le=1)
    track_local_mem: int = Field(0, alias="track-local-mem", ge=0, le=1)
    local_mem_trace_filename: str | None = Field(None, alias="local-mem-trace-filename")
    model_shared_bus: int = Field(0, alias="model-shared-bus", ge=0, le=0)

    def check(self, source: str, dims: int | None = None) -> AstraSystem:
        for op in OPS:
            names = getattr(self, f"{op}_implementation")
            if names is None:
                continue
            for name in names:
                try:
                    _algorithm(name)
                except ValueError as exc:
                    raise ConfigError(f"{source}: {op.replace('_', '-')}-implementation", str(exc), "") from None
            if dims is not None and len(names) > dims:
                raise ConfigError(f"{source}: {op.replace('_', '-')}-implementation",
                                  f"has {len(names)} entries for a {dims}-dimension network",
                                  "give at most one implementation per network dimension")
            if op == "all_to_all" and "halvingDoubling" in names:
                raise ConfigError(f"{source}: all-to-all-implementation", "halvingDoubling has no all-to-all "
                                  "(ASTRA-sim exits)", "use direct or ring")
        return self

    def algorithms(self, op: str, levels: tuple[Level, ...]) -> dict[int, str]:
        """Per-dimension algorithm of `op` (ASTRA-sim's list; unlisted dimensions: the block's default)."""
        names = getattr(self, f"{op}_implementation", None) if op in OPS else None
        return {i: _algorithm(n) for i, n in enumerate(names or []) if i < len(levels)}

    def comm(self, levels: tuple[Level, ...], backend: str = "unaware", queues_per_dim: int = 1,
             scheduler: str = "baseline") -> AnalyticalComm:
        """trainsim's analytical collective model over `levels` with this system layer's settings."""
        from .cost.multidim import AnalyticalComm

        return AnalyticalComm(levels, scheduler=scheduler, chunks=self.preferred_dataset_splits,
                              semantics=self.semantics(backend, queues_per_dim),
                              op_algorithms={op: self.algorithms(op, levels) for op in OPS})

    def semantics(self, backend: str = "unaware", queues_per_dim: int = 1, injection_scale: float = 1.0) -> Semantics:
        return astra(float(self.endpoint_delay) * injection_scale, float(self.local_mem_bw), backend=backend,
                     queues_per_dim=queues_per_dim, active_chunks_per_dim=self.active_chunks_per_dimension,
                     scheduling=self.scheduling_policy, local_bw_aware=self.collective_optimization == "localBWAware")


_IGNORED_BY_ASTRA = {"intra-dimension-scheduling", "inter-dimension-scheduling"}
_UNSUPPORTED_SYSTEM = {"all-reduce-implementation-custom", "reduce-scatter-implementation-custom",
                       "all-gather-implementation-custom", "all-to-all-implementation-custom",
                       "per-node-custom-implementation", "L", "o", "g", "G"}


def load_system(path: str | Path, field: str = "--system", dims: int | None = None) -> AstraSystem:
    data = _read(path, field, "system config")
    src = str(path)
    if isinstance(data, dict):
        for key in data:
            if key in _IGNORED_BY_ASTRA:
                raise ConfigError(f"{src}: {key}", "is an ASTRA-sim 1.0 key that ASTRA-sim 2.0 does not read (it "
                                  "always schedules dimensions in ascending order, FIFO within one)",
                                  "remove it; trainsim's own Themis scheduler is --scheduler themis")
            if key in _UNSUPPORTED_SYSTEM:
                raise ConfigError(f"{src}: {key}", "is not supported by trainsim (custom collectives as Chakra ETs, "
                                  "LogGP memory bus)", "remove it")
            if key == "scheduling-policy" and data[key] == "EXPLICIT":
                raise ConfigError(f"{src}: scheduling-policy", "EXPLICIT (priorities from the trace) is not "
                                  "supported", "use LIFO or FIFO")
    return _check(AstraSystem, data, src, "system config").check(src, dims)


# --------------------------------------------------------------------------------------------------
# remote memory
# --------------------------------------------------------------------------------------------------

MEMORY_TYPES = ("NO_MEMORY_EXPANSION", "PER_NPU_MEMORY_EXPANSION", "PER_NODE_MEMORY_EXPANSION", "MEMORY_POOL")


class AstraRemoteMemoryConfig(BaseModel):
    """The remote memory JSON (ASTRA-sim's analytical remote memory)."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    memory_type: Literal["NO_MEMORY_EXPANSION", "PER_NPU_MEMORY_EXPANSION", "PER_NODE_MEMORY_EXPANSION",
                         "MEMORY_POOL"] = Field(alias="memory-type")
    remote_mem_latency: int = Field(0, alias="remote-mem-latency", ge=0, le=10**12)
    remote_mem_bw: int = Field(0, alias="remote-mem-bw", ge=0, le=10**9)
    num_nodes: int = Field(0, alias="num-nodes", ge=0, le=MAX_GPUS)
    num_npus_per_node: int = Field(0, alias="num-npus-per-node", ge=0, le=MAX_GPUS)

    def check(self, source: str) -> AstraRemoteMemoryConfig:
        if self.memory_type != "NO_MEMORY_EXPANSION" and self.remote_mem_bw <= 0:
            raise ConfigError(f"{source}: remote-mem-bw", f"{self.memory_type} needs a bandwidth",
                              "give remote-mem-bw in GB/s (a whole number, as ASTRA-sim reads it)")
        if self.memory_type == "PER_NODE_MEMORY_EXPANSION" and (self.num_nodes < 1 or self.num_npus_per_node < 1):
            raise ConfigError(f"{source}: num-npus-per-node", "PER_NODE_MEMORY_EXPANSION groups NPUs into nodes",
                              "give num-nodes and num-npus-per-node")
        return self

    def memory(self, npus: int) -> AstraRemoteMemory:
        if self.memory_type == "PER_NODE_MEMORY_EXPANSION" and self.num_nodes * self.num_npus_per_node < npus:
            raise ConfigError("remote memory: num-nodes", f"{self.num_nodes} nodes of {self.num_npus_per_node} NPUs "
                              f"hold fewer than the network's {npus} NPUs",
                              f"use num-nodes >= {math.ceil(npus / self.num_npus_per_node)}")
        sharers = {"PER_NPU_MEMORY_EXPANSION": 1, "PER_NODE_MEMORY_EXPANSION": max(1, self.num_npus_per_node),
                   "MEMORY_POOL": npus}.get(self.memory_type, 1)
        return AstraRemoteMemory(self.memory_type, float(self.remote_mem_latency), float(self.remote_mem_bw),
                                 min(sharers, npus))


@dataclass(frozen=True)
class AstraRemoteMemory:
    """ASTRA-sim's analytical remote memory: an access takes latency + floor(bytes / bandwidth) ns.

    PER_NPU: every NPU has its own. PER_NODE and MEMORY_POOL: one request at a time per node (pool);
    trainsim's ranks are symmetric, so the `sharers` NPUs behind one queue issue their accesses
    together and each waits for the others: an access is priced `sharers` times its own transfer."""

    memory_type: str
    latency_ns: float
    bandwidth_gbps: float
    sharers: int = 1

    def time_s(self, access: MemoryAccess) -> float:
        if self.memory_type == "NO_MEMORY_EXPANSION":
            raise ConfigError("remote memory: memory-type", "the workload loads or stores remote memory but the "
                              "memory type is NO_MEMORY_EXPANSION (ASTRA-sim exits too)",
                              "use PER_NPU_MEMORY_EXPANSION, PER_NODE_MEMORY_EXPANSION or MEMORY_POOL")
        one = self.latency_ns + math.floor(access.size_bytes / self.bandwidth_gbps)
        return (one + (self.sharers - 1) * math.floor(access.size_bytes / self.bandwidth_gbps)) * 1e-9


def load_remote_memory(path: str | Path, field: str = "--remote-memory") -> AstraRemoteMemoryConfig:
    data = _read(path, field, "remote memory config")
    return _check(AstraRemoteMemoryConfig, data, str(path), "remote memory config").check(str(path))


__all__ = ["ALGORITHM_NAMES", "AstraNetwork", "AstraRemoteMemory", "AstraRemoteMemoryConfig", "AstraSystem",
           "MEMORY_TYPES", "load_network", "load_remote_memory", "load_system", "network_of"]
