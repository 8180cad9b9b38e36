"""Memory systems behind ASTRA-sim 2.0's memory API (section IV-D): what a load or store costs.

A memory access names its direction, its size per NPU and where the tensor lives (local HBM or a
remote pool); `time_s(access)` of a memory system returns how long it takes. Three systems:

- `LocalHBM`: latency + size / bandwidth (the paper's local memory model).
- `HierarchicalPool`: the paper's hierarchical disaggregated pool (Fig. 6): GPUs behind in-node
  switches, out-node switches, remote memory groups; link loads per hop and a chunked pipeline
  (Fig. 7), with the in-switch collective variant (gather on load, reduce-scatter on store, Fig. 8).
- `ZeroInfinityOffload`: ZeRO-Infinity (Rajbhandari et al., SC 2021) offload of parameters, gradients
  and optimizer states to a node's CPU DRAM or NVMe, reached over PCIe; each GPU reads and writes
  its own partition from its node's devices (the paper's "remote memory groups" of Table V).

Units: sizes in bytes, bandwidths in GB/s (1e9 B/s), times in seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

ACCESS_KINDS = ("load", "store")
LOCATIONS = ("local", "remote")
OFFLOAD_TIERS = ("cpu", "nvme")

_GB = 1e9


@dataclass(frozen=True)
class MemoryAccess:
    """One memory node of the execution graph: load or store `size_bytes` per NPU, local or remote.

    `in_switch_collective`: the switches gather the NPUs' shards while loading (each NPU ends with
    the whole tensor, N x size) and reduce-scatter while storing (ASTRA-sim 2.0 Fig. 8)."""

    kind: str
    size_bytes: float
    location: str = "local"
    in_switch_collective: bool = False

    def __post_init__(self) -> None:
        if self.kind not in ACCESS_KINDS:
            raise ValueError(f"MemoryAccess.kind: '{self.kind}' is not one of {', '.join(ACCESS_KINDS)}")
        if not math.isfinite(self.size_bytes) or self.size_bytes < 0:
            raise ValueError(f"MemoryAccess.size_bytes: must be a finite number >= 0, got {self.size_bytes}")
        if self.location not in LOCATIONS:
            raise ValueError(f"MemoryAccess.location: '{self.location}' is not one of {', '.join(LOCATIONS)}")
        if self.in_switch_collective and self.location != "remote":
            raise ValueError("MemoryAccess.in_switch_collective: only a remote access goes through the switches; "
                             "set location='remote' or in_switch_collective=False")


class MemorySystem(Protocol):
    """What the cost layer needs of a memory system (DESIGN: `MemoryModel.time(access)`)."""

    def time_s(self, access: MemoryAccess) -> float: ...


def _positive(owner: str, **values: float) -> None:
    for name, v in values.items():
        if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
            raise ValueError(f"{owner}.{name}: must be a positive number, got {v!r}")


def _count(owner: str, **values: int) -> None:
    for name, v in values.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{owner}.{name}: must be an integer >= 1, got {v!r}")


def _non_negative(owner: str, **values: float) -> None:
    for name, v in values.items():
        if not (isinstance(v, int | float) and math.isfinite(v) and v >= 0):
            raise ValueError(f"{owner}.{name}: must be a number >= 0, got {v!r}")


@dataclass(frozen=True)
class PipelineTiming:
    """A chunked transfer over a chain of hops (ASTRA-sim 2.0 Fig. 7).

    Every stage moves one chunk over every hop, in order (a flow shop). With whole chunks the transfer
    takes `fill + stages x bottleneck`, `fill` being the other hops' time for one chunk (the first
    chunk's trip through all hops + (stages - 1) bottleneck stages). The last chunk may be a part
    (`last_fraction` of a full one); `total_s` is then the flow shop's exact makespan, which grows
    continuously and monotonically with the size."""

    stages: int
    hop_s: dict[str, float]  # seconds of one full chunk on each hop, in path order
    latency_s: float = 0.0
    last_fraction: float = 1.0  # size of the last chunk / a full chunk, in (0, 1]

    @property
    def bottleneck_s(self) -> float:
        return max(self.hop_s.values(), default=0.0)

    @property
    def bottleneck_hop(self) -> str:
        return max(self.hop_s, key=lambda k: self.hop_s[k]) if self.hop_s else ""

    @property
    def fill_s(self) -> float:
        return sum(self.hop_s.values()) - self.bottleneck_s

    @property
    def total_s(self) -> float:
        if self.stages == 0:
            return self.latency_s
        # identical chunks k = 1..s-1 leave hop h at sum_{h' <= h} t_h' + (k - 1) max_{h' <= h} t_h';
        # the last (partial) chunk follows each hop once both it and the chunk before are through
        full = self.stages - 1
        before = last = run_max = prefix = 0.0
        for t in self.hop_s.values():
            prefix += t
            run_max = max(run_max, t)
            before = prefix + (full - 1) * run_max if full else 0.0
            last = max(last, before) + t * self.last_fraction
        return self.latency_s + last


def pipelined(loads_bytes: dict[str, float], bandwidths_gbps: dict[str, float], chunk_bytes: float,
              lead: str, latency_s: float = 0.0) -> PipelineTiming:
    """Split the per-link loads into stages: the `lead` hop carries one chunk per stage (the paper's
    number of stages = load on the remote-group links / chunk size), every other hop the same share
    of its own load. A load that is not a whole number of chunks ends with a partial chunk, as a
    fixed chunk size does, so the time is exact and monotone in the size."""
    lead_load = loads_bytes[lead]
    if lead_load <= 0:
        return PipelineTiming(0, {k: 0.0 for k in loads_bytes}, latency_s)
    stages = max(1, math.ceil(lead_load / chunk_bytes - 1e-9))
    share = min(1.0, chunk_bytes / lead_load)  # a full chunk's share of every hop's load
    last = 1.0 if stages == 1 else min(1.0, max(0.0, lead_load / chunk_bytes - (stages - 1)))
    hop_s = {k: load * share / (bandwidths_gbps[k] * _GB) for k, load in loads_bytes.items()}
    return PipelineTiming(stages, hop_s, latency_s, last)


@dataclass(frozen=True)
class LocalHBM:
    """ASTRA-sim 2.0 local memory model: access latency + tensor size / memory bandwidth."""

    bandwidth_gbps: float
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        _positive("LocalHBM", bandwidth_gbps=self.bandwidth_gbps)
        _non_negative("LocalHBM", latency_s=self.latency_s)

    def time_s(self, access: MemoryAccess) -> float:
        if access.location != "local":
            raise ValueError("MemoryAccess.location: LocalHBM serves only local accesses; use a remote memory "
                             "system (HierarchicalPool, ZeroInfinityOffload) for location='remote'")
        return self.latency_s + access.size_bytes / (self.bandwidth_gbps * _GB)


def _local_or_raise(local: LocalHBM | None, owner: str, access: MemoryAccess) -> float:
    if local is None:
        raise ValueError(f"{owner}.local: a local access needs the local HBM model; pass local=LocalHBM(...)")
    return local.time_s(access)


@dataclass(frozen=True)
class HierarchicalPool:
    """ASTRA-sim 2.0 hierarchical disaggregated memory (section IV-D, Figs. 6-8).

    `n_nodes` nodes of `gpus_per_node` GPUs, each GPU on its node's in-node switch
    (`in_node_gbps` per GPU link); every in-node switch links to each of `n_out_switches` out-node
    switches (`gpu_side_out_gbps` per link); each of `n_remote_groups` memory groups links to every
    out-node switch (`mem_side_out_gbps` per link). Transfers are pipelined in `chunk_bytes` units.
    Local accesses go to `local` (HBM)."""

    n_nodes: int
    gpus_per_node: int
    n_out_switches: int
    n_remote_groups: int
    in_node_gbps: float
    gpu_side_out_gbps: float
    mem_side_out_gbps: float
    chunk_bytes: float = 1 << 20
    latency_s: float = 0.0
    local: LocalHBM | None = None

    def __post_init__(self) -> None:
        _count("HierarchicalPool", n_nodes=self.n_nodes, gpus_per_node=self.gpus_per_node,
               n_out_switches=self.n_out_switches, n_remote_groups=self.n_remote_groups)
        _positive("HierarchicalPool", in_node_gbps=self.in_node_gbps, gpu_side_out_gbps=self.gpu_side_out_gbps,
                  mem_side_out_gbps=self.mem_side_out_gbps, chunk_bytes=self.chunk_bytes)
        _non_negative("HierarchicalPool", latency_s=self.latency_s)

    @classmethod
    def from_group_bandwidth(cls, *, n_nodes: int, gpus_per_node: int, n_out_switches: int, n_remote_groups: int,
                             in_node_gbps: float, remote_group_gbps: float, gpu_side_out_gbps: float | None = None,
                             **kw: object) -> HierarchicalPool:
        """A pool described as in TABLE V: a memory group's total bandwidth is spread over its links to
        the out-node switches (mem-side link = group BW / switches). Without `gpu_side_out_gbps` a node's
        uplinks carry what its GPUs' in-node links carry (non-blocking in-node switch:
        in_node_gbps x gpus_per_node / n_out_switches per link)."""
        _count("HierarchicalPool", n_out_switches=n_out_switches, gpus_per_node=gpus_per_node)
        _positive("HierarchicalPool", remote_group_gbps=remote_group_gbps, in_node_gbps=in_node_gbps)
        up = gpu_side_out_gbps if gpu_side_out_gbps is not None else in_node_gbps * gpus_per_node / n_out_switches
        return cls(n_nodes=n_nodes, gpus_per_node=gpus_per_node, n_out_switches=n_out_switches,
                   n_remote_groups=n_remote_groups, in_node_gbps=in_node_gbps, gpu_side_out_gbps=up,
                   mem_side_out_gbps=remote_group_gbps / n_out_switches, **kw)  # type: ignore[arg-type]

    @property
    def n_gpus(self) -> int:
        return self.n_nodes * self.gpus_per_node

    def link_loads(self, size_bytes: float, in_switch_collective: bool = False) -> dict[str, float]:
        """Bytes on one link of each hop when every GPU loads (or stores) `size_bytes` (paper's example,
        16x16 GPUs, 4 switches, 8 groups: 32W per group, 8W / 4W / W per link; in-switch 8W / 64W / 256W)."""
        n, r, s = self.n_gpus, self.n_remote_groups, self.n_out_switches
        rem = n * size_bytes / (r * s)  # each group serves N W / R, spread over its S switch links
        if in_switch_collective:
            # an out-node switch gathers one slice from every group (R x rem) and forwards the whole of
            # it to every node; the in-node switch broadcasts the reconstructed tensor (N W) to each GPU
            return {"rem2outsw": rem, "outsw2insw": r * rem, "insw2gpu": n * size_bytes}
        return {"rem2outsw": rem, "outsw2insw": self.gpus_per_node * size_bytes / s, "insw2gpu": size_bytes}

    def timing(self, access: MemoryAccess) -> PipelineTiming:
        """Stages and per-stage hop times of a remote access (a store runs the same hops backwards)."""
        return self.timing_together([access])

    def timing_together(self, accesses: list[MemoryAccess]) -> PipelineTiming:
        """Remote accesses of the same direction issued at once share every link: their loads add up
        per hop (e.g. a layer's expert weights loaded plainly while its dense weights are gathered in the
        switches), then move as one chunked pipeline."""
        if not accesses:
            return PipelineTiming(0, {}, 0.0)
        if len({a.kind for a in accesses}) > 1:
            raise ValueError("accesses: loads and stores run in opposite directions; time them separately")
        loads: dict[str, float] = {}
        for a in accesses:
            for hop, b in self.link_loads(a.size_bytes, a.in_switch_collective).items():
                loads[hop] = loads.get(hop, 0.0) + b
        bw = {"rem2outsw": self.mem_side_out_gbps, "outsw2insw": self.gpu_side_out_gbps, "insw2gpu": self.in_node_gbps}
        return pipelined(loads, bw, self.chunk_bytes, "rem2outsw", self.latency_s)

    def time_s(self, access: MemoryAccess) -> float:
        if access.location == "local":
            return _local_or_raise(self.local, "HierarchicalPool", access)
        return self.timing(access).total_s


@dataclass(frozen=True)
class ZeroInfinityOffload:
    """ZeRO-Infinity offload: model states in each node's CPU DRAM (`tier='cpu'`) or NVMe (`'nvme'`).

    The tier is `n_remote_groups` devices of `remote_group_gbps` each, spread evenly over the nodes
    (TABLE V's "remote memory groups"; one per GPU there). ZeRO-Infinity's bandwidth-centric
    partitioning has every GPU move its own 1/N partition at once, so a GPU gets its node's tier
    bandwidth / gpus_per_node, capped by its PCIe link (`pcie_gbps`, with all GPUs active). NVMe data
    is staged through pinned CPU buffers: NVMe -> DRAM -> GPU, pipelined in `chunk_bytes` blocks, with
    `cpu_dram_gbps` the node's DRAM bandwidth left for that staging (None: not a bottleneck).

    Published figures (DGX-2, 16 V100 on PCIe Gen3, reported by the ZeRO-Infinity authors,
    github.com/deepspeedai/DeepSpeed/issues/1137): ~12 GB/s GPU<->CPU for one GPU alone, ~3 GB/s per
    GPU (~48 GB/s per node) with all 16 GPUs moving data at once; ZeRO-Infinity's efficiency analysis
    asks for ~3 GB/s of NVMe per GPU (issue #998). See `dgx2_cpu`. There are no in-network collectives:
    shards are gathered by GPU collectives, priced by the comm model."""

    n_nodes: int
    gpus_per_node: int
    n_remote_groups: int
    remote_group_gbps: float
    pcie_gbps: float
    tier: str = "cpu"
    cpu_dram_gbps: float | None = None
    chunk_bytes: float = 1 << 20
    latency_s: float = 0.0
    local: LocalHBM | None = None

    def __post_init__(self) -> None:
        _count("ZeroInfinityOffload", n_nodes=self.n_nodes, gpus_per_node=self.gpus_per_node,
               n_remote_groups=self.n_remote_groups)
        _positive("ZeroInfinityOffload", remote_group_gbps=self.remote_group_gbps, pcie_gbps=self.pcie_gbps,
                  chunk_bytes=self.chunk_bytes)
        _non_negative("ZeroInfinityOffload", latency_s=self.latency_s)
        if self.cpu_dram_gbps is not None:
            _positive("ZeroInfinityOffload", cpu_dram_gbps=self.cpu_dram_gbps)
        if self.tier not in OFFLOAD_TIERS:
            raise ValueError(f"ZeroInfinityOffload.tier: '{self.tier}' is not one of {', '.join(OFFLOAD_TIERS)}")
        if self.n_remote_groups % self.n_nodes:
            raise ValueError(f"ZeroInfinityOffload.n_remote_groups: {self.n_remote_groups} devices do not spread "
                             f"evenly over {self.n_nodes} nodes; use a multiple of n_nodes")

    @classmethod
    def dgx2_cpu(cls, n_nodes: int = 1, **kw: object) -> ZeroInfinityOffload:
        """CPU offload on DGX-2 nodes as measured by the ZeRO-Infinity authors (issue #1137): 12 GB/s
        PCIe per GPU, ~48 GB/s of CPU memory bandwidth per node when all 16 GPUs transfer at once."""
        return cls(n_nodes=n_nodes, gpus_per_node=16, n_remote_groups=n_nodes, remote_group_gbps=48.0,
                   pcie_gbps=12.0, tier="cpu", **kw)  # type: ignore[arg-type]

    @property
    def n_gpus(self) -> int:
        return self.n_nodes * self.gpus_per_node

    @property
    def tier_gbps_per_gpu(self) -> float:
        """A GPU's share of its node's offload devices."""
        return self.remote_group_gbps * (self.n_remote_groups // self.n_nodes) / self.gpus_per_node

    def timing(self, access: MemoryAccess) -> PipelineTiming:
        return self.timing_together([access])

    def timing_together(self, accesses: list[MemoryAccess]) -> PipelineTiming:
        """Accesses issued at once share the GPU's PCIe link and device share: their sizes add up."""
        if any(a.in_switch_collective for a in accesses):
            raise ValueError("MemoryAccess.in_switch_collective: ZeRO-Infinity has no in-network collectives; "
                             "load the shard and price the all-gather with the comm model")
        if len({a.kind for a in accesses}) > 1:
            raise ValueError("accesses: loads and stores run in opposite directions; time them separately")
        w = sum(a.size_bytes for a in accesses)
        if self.tier == "cpu":
            rate = min(self.pcie_gbps, self.tier_gbps_per_gpu)
            if self.cpu_dram_gbps is not None:
                rate = min(rate, self.cpu_dram_gbps / self.gpus_per_node)
            return pipelined({"cpu2gpu": w}, {"cpu2gpu": rate}, self.chunk_bytes, "cpu2gpu", self.latency_s)
        pcie = self.pcie_gbps if self.cpu_dram_gbps is None else min(self.pcie_gbps,
                                                                       self.cpu_dram_gbps / self.gpus_per_node)
        return pipelined({"nvme2cpu": w, "cpu2gpu": w}, {"nvme2cpu": self.tier_gbps_per_gpu, "cpu2gpu": pcie},
                         self.chunk_bytes, "nvme2cpu", self.latency_s)

    def time_s(self, access: MemoryAccess) -> float:
        if access.location == "local":
            return _local_or_raise(self.local, "ZeroInfinityOffload", access)
        return self.timing(access).total_s
