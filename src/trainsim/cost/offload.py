"""The memory system that prices offload loads/stores (strategy.offload) on a given cluster.

Defaults, per GPU, with every GPU of a node transferring at once:
- PCIe: H100/H200/H800/B200/B300 on Gen5 x16 (B300's Gen6 taken at Gen5's rate; the Grace-Blackwell parts, GB200
  and GB300, reach their host over NVLink-C2C, not modelled: priced as Gen5, a lower bound): 52.7 GB/s, the pinned host->device copy rate (256 MiB) measured on an H100
  SXM (trainsim/data/transfers/h100_memcpy.csv; 52.5-54.7 GB/s from 64 MiB up); A100 (Gen4): half (assumption);
  older parts (Gen3): 12 GB/s, the single-GPU DGX-2 figure reported by the ZeRO-Infinity authors
  (github.com/deepspeedai/DeepSpeed/issues/1137).
- cpu: CPU DRAM is taken not to limit below PCIe (one offload device per node carrying PCIe x GPUs).
  The same authors measured ~3 GB/s per GPU on a 16-GPU DGX-2 with all GPUs active; use
  `ZeroInfinityOffload.dgx2_cpu` to price that machine.
- nvme: 3 GB/s of NVMe per GPU, the bandwidth ZeRO-Infinity's efficiency analysis asks for (issue #998).
- remote: ASTRA-sim 2.0's HierMem baseline (TABLE V): one out-node switch per node, one remote memory
  group of 100 GB/s per GPU, 256 GB/s in-node pooled fabric, 64 KiB chunks.

`cluster.remote_memory` (config.RemoteMemorySpec) describes the remote pool instead: hiermem with its own
bandwidths and counts (the defaults above for the keys left out), zero_infinity (ZeRO-Infinity's offload
devices: by default one 100 GB/s device per GPU as in TABLE V, reached over the GPU's PCIe) or astra
(ASTRA-sim's remote memory JSON, astra_inputs.AstraRemoteMemory).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..hardware.cluster import Cluster
from ..hardware.memory_systems import HierarchicalPool, LocalHBM, MemorySystem, ZeroInfinityOffload

if TYPE_CHECKING:
    from ..config import RemoteMemorySpec

PCIE_GEN5_GBPS = 52.7
PCIE_GEN4_GBPS = PCIE_GEN5_GBPS / 2
PCIE_GEN3_GBPS = 12.0
NVME_GBPS_PER_GPU = 3.0
HIERMEM_GROUP_GBPS = 100.0
HIERMEM_IN_NODE_GBPS = 256.0
CHUNK_BYTES = 64 * 1024


def pcie_gbps(cluster: Cluster) -> float:
    """Host<->device bandwidth per GPU of the cluster's device generation (see module docstring)."""
    name = cluster.device.name.lower()
    if name.startswith(("h100", "h200", "h800", "b200", "gh200", "gb200", "b300", "gb300")):
        return PCIE_GEN5_GBPS
    if name.startswith("a100"):
        return PCIE_GEN4_GBPS
    return PCIE_GEN3_GBPS


def offload_memory_system(target: str, cluster: Cluster, spec: RemoteMemorySpec | None = None
                          ) -> MemorySystem | None:
    """The memory system behind `strategy.offload` (None for 'none'); `spec` (cluster.remote_memory) describes
    the remote pool, None: the HierMem baseline."""
    if target == "none":
        return None
    if spec is not None:
        if target != "remote":
            raise ConfigError("cluster.remote_memory", f"only applies with strategy.offload remote (offload is "
                              f"{target})", "add --offload remote, or drop it")
        return remote_memory_system(spec, cluster)
    gpn, nodes = cluster.gpus_per_node, cluster.nodes
    local = LocalHBM(cluster.device.hbm_gbps)
    if target == "cpu":
        link = pcie_gbps(cluster)
        return ZeroInfinityOffload(n_nodes=nodes, gpus_per_node=gpn, n_remote_groups=nodes,
                                   remote_group_gbps=link * gpn, pcie_gbps=link, tier="cpu",
                                   chunk_bytes=CHUNK_BYTES, local=local)
    if target == "nvme":
        return ZeroInfinityOffload(n_nodes=nodes, gpus_per_node=gpn, n_remote_groups=nodes,
                                   remote_group_gbps=NVME_GBPS_PER_GPU * gpn, pcie_gbps=pcie_gbps(cluster),
                                   tier="nvme", chunk_bytes=CHUNK_BYTES, local=local)
    if target == "remote":
        return HierarchicalPool.from_group_bandwidth(
            n_nodes=nodes, gpus_per_node=gpn, n_out_switches=nodes, n_remote_groups=nodes * gpn,
            in_node_gbps=HIERMEM_IN_NODE_GBPS, remote_group_gbps=HIERMEM_GROUP_GBPS, chunk_bytes=CHUNK_BYTES,
            local=local)
    raise ValueError(f"strategy.offload: unknown target '{target}'; use none, cpu, nvme or remote")


def remote_memory_system(spec: RemoteMemorySpec, cluster: Cluster) -> MemorySystem:
    """The pool `cluster.remote_memory` describes, on `cluster` (its nodes and GPUs); keys left out take the
    module's defaults. A pool the cluster cannot hold is a one-line ConfigError naming the key."""
    gpn, nodes = cluster.gpus_per_node, cluster.nodes
    local = LocalHBM(cluster.device.hbm_gbps)
    chunk = float(spec.chunk_bytes) if spec.chunk_bytes is not None else CHUNK_BYTES
    latency_s = (spec.latency_ns or 0.0) * 1e-9
    group_gbps = spec.remote_group_gbps if spec.remote_group_gbps is not None else HIERMEM_GROUP_GBPS
    groups = spec.remote_groups if spec.remote_groups is not None else nodes * gpn
    if spec.pool == "hiermem":
        return HierarchicalPool.from_group_bandwidth(
            n_nodes=nodes, gpus_per_node=gpn, n_out_switches=spec.out_switches or nodes, n_remote_groups=groups,
            in_node_gbps=spec.in_node_gbps if spec.in_node_gbps is not None else HIERMEM_IN_NODE_GBPS,
            remote_group_gbps=group_gbps, chunk_bytes=chunk, latency_s=latency_s, local=local)
    if spec.pool == "zero_infinity":
        if groups % nodes:
            raise ConfigError("cluster.remote_memory.remote_groups", f"{groups} offload devices do not spread "
                              f"evenly over the cluster's {nodes} nodes", f"use a multiple of {nodes}")
        return ZeroInfinityOffload(n_nodes=nodes, gpus_per_node=gpn, n_remote_groups=groups,
                                   remote_group_gbps=group_gbps,
                                   pcie_gbps=spec.pcie_gbps if spec.pcie_gbps is not None else pcie_gbps(cluster),
                                   tier="cpu", chunk_bytes=chunk, latency_s=latency_s, local=local)
    from ..astra_inputs import load_remote_memory  # ASTRA-sim's file format: read only when named

    assert spec.config is not None  # RemoteMemorySpec refuses pool astra without it
    cfg = load_remote_memory(spec.config, "cluster.remote_memory.config")
    if cfg.memory_type == "NO_MEMORY_EXPANSION":
        raise ConfigError(f"{spec.config}: memory-type", "NO_MEMORY_EXPANSION has no remote memory, but "
                          "strategy.offload remote keeps the model states there",
                          "use PER_NPU_MEMORY_EXPANSION, PER_NODE_MEMORY_EXPANSION or MEMORY_POOL, or drop "
                          "--offload remote")
    return cfg.memory(cluster.world_size)


def gather_group_system(memory: MemorySystem, group: int) -> MemorySystem:
    """The pool that prices an in-switch access whose collective spans `group` of its GPUs.

    HierarchicalPool's in-switch model (ASTRA-sim 2.0 Fig. 8) gathers over every GPU: each in-node switch
    broadcasts N x shard to each GPU. A ZeRO-3 group smaller than N (tp > 1, HSDP) hands each GPU only
    group x shard; carrying that on the in-node links takes what N x shard takes on links N / group times as
    fast, so the in-node bandwidth is scaled. The hops above stay the paper's (every group's tensor reaches
    every node: exact when each node holds a member of every group, e.g. tp inside a node; an over-estimate
    for HSDP replicas on separate nodes)."""
    if isinstance(memory, HierarchicalPool) and 0 < group < memory.n_gpus:
        return replace(memory, in_node_gbps=memory.in_node_gbps * memory.n_gpus / group)
    return memory
