"""The memory system that prices offload loads/stores (strategy.offload) on a given cluster.

Defaults, per GPU, with every GPU of a node transferring at once:
- PCIe: H100/H200/B200 on Gen5 x16: 52.7 GB/s, the pinned host->device copy rate (256 MiB) measured on an H100
  SXM (trainsim/data/transfers/h100_memcpy.csv; 52.5-54.7 GB/s from 64 MiB up); A100 (Gen4): half (assumption);
  older parts (Gen3): 12 GB/s, the single-GPU DGX-2 figure reported by the ZeRO-Infinity authors
  (github.com/deepspeedai/DeepSpeed/issues/1137).
- cpu: CPU DRAM is taken not to limit below PCIe (one offload device per node carrying PCIe x GPUs).
  The same authors measured ~3 GB/s per GPU on a 16-GPU DGX-2 with all GPUs active; use
  `ZeroInfinityOffload.dgx2_cpu` to price that machine.
- nvme: 3 GB/s of NVMe per GPU, the bandwidth ZeRO-Infinity's efficiency analysis asks for (issue #998).
- remote: ASTRA-sim 2.0's HierMem baseline (TABLE V): one out-node switch per node, one remote memory
  group of 100 GB/s per GPU, 256 GB/s in-node pooled fabric, 64 KiB chunks.
"""

from __future__ import annotations

from ..hardware.cluster import Cluster
from ..hardware.memory_systems import HierarchicalPool, LocalHBM, MemorySystem, ZeroInfinityOffload

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
    if name.startswith(("h100", "h200", "b200", "gh200")):
        return PCIE_GEN5_GBPS
    if name.startswith("a100"):
        return PCIE_GEN4_GBPS
    return PCIE_GEN3_GBPS


def offload_memory_system(target: str, cluster: Cluster) -> MemorySystem | None:
    """The memory system behind `strategy.offload` (None for 'none')."""
    if target == "none":
        return None
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
