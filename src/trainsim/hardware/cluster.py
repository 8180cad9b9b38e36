"""Cluster presets: a device plus a hierarchy of interconnect levels, innermost first.

A topology is a tuple of `Level`s (e.g. NVSwitch inside a node, then InfiniBand across nodes) so
it maps one-to-one onto ASTRA-sim's multi-dimensional notation (one Ring/FC/Switch per dimension).
Ranks are numbered innermost-fastest: rank = node * gpus_per_node + local_rank.

Bandwidth convention: NVLink/NVSwitch, InfiniBand and Ethernet levels carry the vendor's peak
per-direction link rate (the communication model applies its own efficiency), while PCIe and
QPI levels carry NCCL's effective GPU-to-GPU figures, because their nominal rates are never
reached by peer-to-peer traffic. Latencies are per-hop alphas of the order NCCL's tuning model
uses (src/graph/tuning.cc `hwLat`): NVLink ~0.6-1.9 us, PCIe ~1-2.5 us, network ~2.7-5 us.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

from trainsim.hardware.devices import Device, get_device

LEVEL_KINDS: frozenset[str] = frozenset({"switch", "ring", "fc", "bus"})
"""Allowed `Level.kind` values: switch, ring, fully connected (fc), or shared bus."""

NVLINK_LATENCY_S = 1.0e-6  # NCCL hwLat NVLink ring: LL 0.6 us, LL128 1.9 us
PCIE_LATENCY_S = 2.0e-6  # NCCL hwLat PCI ring: LL 1.0 us, LL128 2.5 us
QPI_LATENCY_S = 3.0e-6  # assumption: PCIe hop plus a bounce through host memory across sockets
IB_LATENCY_S = 5.0e-6  # NCCL hwLat NET tree LL 5.0 us (RDMA plus proxy-thread overhead)
TCP_LATENCY_S = 40.0e-6  # assumption: kernel TCP sockets on 10 GbE, 30-50 us small-message RTT/2


@dataclass(frozen=True)
class Level:
    """One dimension of the topology: `size` children joined by a fabric of a given kind.

    `bandwidth_gbps` is per GPU, one direction, GB/s (1e9 B/s), with every GPU using the level at once.
    `port_gbps` is what one child block (the GPUs below one port of this level: a socket behind its QPI
    link, a PCIe switch behind its uplink) can send into the level in all, one direction; the flows
    leaving a block divide it (Proteus Fig. 7 link hierarchy). None: every GPU has its own path at
    `bandwidth_gbps` (ASTRA-sim's per-NPU dimension bandwidth; NVLink, NVSwitch).
    """

    name: str
    kind: str
    size: int
    bandwidth_gbps: float
    latency_s: float
    port_gbps: float | None = None

    def __post_init__(self) -> None:
        if self.kind not in LEVEL_KINDS:
            raise ValueError(f"level '{self.name}': kind '{self.kind}' not in {sorted(LEVEL_KINDS)}")
        if self.size < 1:
            raise ValueError(f"level '{self.name}': size must be >= 1, got {self.size}")
        if self.bandwidth_gbps <= 0:
            raise ValueError(f"level '{self.name}': bandwidth_gbps must be positive")
        if self.latency_s < 0:
            raise ValueError(f"level '{self.name}': latency_s must be >= 0")
        if self.port_gbps is not None and self.port_gbps <= 0:
            raise ValueError(f"level '{self.name}': port_gbps must be positive (or None: per-GPU links)")


@dataclass(frozen=True)
class Cluster:
    """A homogeneous cluster: `nodes` identical nodes of `gpus_per_node` devices and a level hierarchy.

    A cluster with a network (nic_gbps > 0) has the inter-node level last, with size == nodes.
    """

    name: str
    device: Device
    gpus_per_node: int
    nodes: int
    levels: tuple[Level, ...]
    nics_per_node: int
    nic_gbps: float
    description: str
    source: str
    # the nodes' CPUs: framework (host) time per op relative to the x86 hosts the host overheads were measured on
    # (cost.calibration host_overhead_s, torch_op_host_s); a job sets it with cluster.host_overhead_scale
    host_overhead_scale: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "levels", tuple(self.levels))
        if not self.host_overhead_scale > 0:
            raise ValueError(f"cluster '{self.name}': host_overhead_scale must be positive")
        if self.gpus_per_node < 1 or self.nodes < 1:
            raise ValueError(f"cluster '{self.name}': gpus_per_node and nodes must be >= 1")
        if not self.levels:
            raise ValueError(f"cluster '{self.name}': needs at least one level")
        product = math.prod(level.size for level in self.levels)
        if product != self.world_size:
            raise ValueError(
                f"cluster '{self.name}': product of level sizes {product} != world size {self.world_size}"
            )
        if self.nics_per_node < 0 or self.nic_gbps < 0:
            raise ValueError(f"cluster '{self.name}': nics_per_node and nic_gbps must be >= 0")
        if self.has_network:
            if self.nics_per_node < 1:
                raise ValueError(f"cluster '{self.name}': nic_gbps > 0 needs nics_per_node >= 1")
            if self.levels[-1].size != self.nodes:
                raise ValueError(f"cluster '{self.name}': network level size must equal nodes")
        elif self.nodes != 1:
            raise ValueError(f"cluster '{self.name}': no network, so nodes must be 1")

    @property
    def world_size(self) -> int:
        """Total number of GPUs (ranks)."""
        return self.gpus_per_node * self.nodes

    @property
    def has_network(self) -> bool:
        """Whether nodes have NICs, i.e. the last level is an inter-node network."""
        return self.nic_gbps > 0

    @property
    def intra_node_levels(self) -> tuple[Level, ...]:
        """Levels inside one node (all levels but the network one)."""
        return self.levels[:-1] if self.has_network else self.levels

    @property
    def network_level(self) -> Level | None:
        """The inter-node level, or None for a single-box preset without a network."""
        return self.levels[-1] if self.has_network else None

    @property
    def intra_node_bandwidth_gbps(self) -> float:
        """Slowest intra-node level's per-GPU bandwidth (what a node-wide ring sees); inf if 1 GPU/node."""
        intra = self.intra_node_levels
        return min(level.bandwidth_gbps for level in intra) if intra else math.inf

    @property
    def inter_node_bandwidth_gbps(self) -> float:
        """Per-GPU share of the node's NIC bandwidth when every GPU talks across nodes; 0 if no network."""
        level = self.network_level
        return level.bandwidth_gbps if level is not None else 0.0

    def with_nodes(self, nodes: int) -> Cluster:
        """Same node design scaled to `nodes` nodes (only the network level's size changes)."""
        if nodes < 1:
            raise ValueError(f"nodes must be >= 1, got {nodes}")
        if nodes == self.nodes:
            return self
        network = self.network_level
        if network is None:
            raise ValueError(f"cluster '{self.name}' has no inter-node network; it supports only 1 node")
        levels = (*self.levels[:-1], replace(network, size=nodes))
        return replace(self, nodes=nodes, levels=levels)

    def customised(self, *, device: Device | None = None, gpus_per_node: int | None = None,
                   intra_gbps: float | None = None, nics_per_node: int | None = None,
                   nic_gbps: float | None = None) -> Cluster:
        """The same node design with another GPU, GPU count per node, NVLink or NIC bandwidth.

        `intra_gbps` is per GPU per direction; `nic_gbps` per NIC (GB/s). A changed GPU count
        needs a single intra-node level (the switch-based presets)."""
        levels = list(self.levels)
        gpn = self.gpus_per_node if gpus_per_node is None else gpus_per_node
        intra = list(self.intra_node_levels)
        if gpn != self.gpus_per_node or intra_gbps is not None:
            if len(intra) != 1:
                raise ValueError(f"cluster '{self.name}' has {len(intra)} intra-node levels; "
                                 "only single-switch nodes can change GPUs per node or NVLink bandwidth")
            lvl = intra[0]
            levels[0] = replace(lvl, size=gpn, bandwidth_gbps=lvl.bandwidth_gbps if intra_gbps is None else intra_gbps)
        nics = self.nics_per_node if nics_per_node is None else nics_per_node
        nic = self.nic_gbps if nic_gbps is None else nic_gbps
        net = self.network_level
        if net is not None:
            levels[-1] = replace(net, bandwidth_gbps=_per_gpu_nic_gbps(nics, nic, gpn))
        return replace(self, device=device or self.device, gpus_per_node=gpn, levels=tuple(levels),
                       nics_per_node=nics, nic_gbps=nic)

    def level_of(self, rank_a: int, rank_b: int) -> int:
        """Index into `levels` of the innermost level that joins two distinct ranks."""
        for rank in (rank_a, rank_b):
            if not 0 <= rank < self.world_size:
                raise ValueError(f"rank {rank} out of range for world size {self.world_size}")
        if rank_a == rank_b:
            raise ValueError(f"rank {rank_a} is not joined to itself by any level")
        span = 1
        for index, level in enumerate(self.levels):
            span *= level.size
            if rank_a // span == rank_b // span:
                return index
        raise AssertionError("unreachable: the outermost level spans the whole world")


def _per_gpu_nic_gbps(nics_per_node: int, nic_gbps: float, gpus_per_node: int) -> float:
    """Per-GPU network bandwidth when all GPUs of a node send across nodes at once."""
    return nics_per_node * nic_gbps / gpus_per_node


def _hgx8(
    name: str,
    device: str,
    nodes: int,
    nvlink_gbps: float,
    nvlink_gen: str,
    nic_gbps: float,
    description: str,
    source: str,
) -> Cluster:
    """An 8-GPU NVSwitch node with one InfiniBand NIC per GPU (DGX/HGX A100, H100, H200, B200)."""
    return Cluster(
        name=name,
        device=get_device(device),
        gpus_per_node=8,
        nodes=nodes,
        levels=(
            Level("nvswitch", "switch", 8, nvlink_gbps, NVLINK_LATENCY_S),
            Level("infiniband", "switch", nodes, _per_gpu_nic_gbps(8, nic_gbps, 8), IB_LATENCY_S),
        ),
        nics_per_node=8,
        nic_gbps=nic_gbps,
        description=f"{description} {nvlink_gen} NVSwitch inside the node; rail-optimised, non-blocking "
        "InfiniBand fat tree across nodes modelled as one switch.",
        source=source,
    )


def dgx_a100(nodes: int = 1) -> Cluster:
    """DGX A100 (640 GB): 8x A100-80GB on NVLink3/NVSwitch, 8x 200 Gb/s HDR InfiniBand."""
    return _hgx8(
        "dgx-a100",
        "a100-80gb",
        nodes,
        nvlink_gbps=300.0,
        nvlink_gen="NVLink3 (12 links x 25 GB/s = 300 GB/s per GPU per direction)",
        nic_gbps=25.0,
        description="8x A100 SXM4 80GB per node.",
        source="NVIDIA DGX A100 datasheet / DGX A100 User Guide: 6x NVSwitch, 600 GB/s bidirectional "
        "GPU-to-GPU per GPU; 8x single-port ConnectX-6 200 Gb/s HDR InfiniBand for compute (storage "
        "NICs not modelled).",
    )


def dgx_h100(nodes: int = 1) -> Cluster:
    """DGX H100: 8x H100-SXM on NVLink4/NVSwitch, 8x 400 Gb/s NDR InfiniBand."""
    return _hgx8(
        "dgx-h100",
        "h100-sxm",
        nodes,
        nvlink_gbps=450.0,
        nvlink_gen="NVLink4 (18 links x 25 GB/s = 450 GB/s per GPU per direction)",
        nic_gbps=50.0,
        description="8x H100 SXM5 80GB per node.",
        source="NVIDIA DGX H100 datasheet: 4x NVSwitch, 900 GB/s bidirectional GPU-to-GPU per GPU; "
        "8x single-port ConnectX-7 400 Gb/s NDR InfiniBand (OSFP) for compute.",
    )


def hgx_h200(nodes: int = 1) -> Cluster:
    """HGX H200: 8x H200 on the same NVLink4/NVSwitch fabric and NICs as DGX H100."""
    return _hgx8(
        "hgx-h200",
        "h200-sxm",
        nodes,
        nvlink_gbps=450.0,
        nvlink_gen="NVLink4 (18 links x 25 GB/s = 450 GB/s per GPU per direction)",
        nic_gbps=50.0,
        description="8x H200 SXM 141GB per node.",
        source="NVIDIA H200 Tensor Core GPU datasheet (HGX H200: NVLink 900 GB/s bidirectional per "
        "GPU); NICs assumed as in DGX H100 / DGX H200: 8x ConnectX-7 400 Gb/s NDR.",
    )


def dgx_b200(nodes: int = 1) -> Cluster:
    """DGX B200: 8x B200 on NVLink5/NVSwitch, 8x 400 Gb/s ConnectX-7."""
    return _hgx8(
        "dgx-b200",
        "b200",
        nodes,
        nvlink_gbps=900.0,
        nvlink_gen="NVLink5 (18 links x 50 GB/s = 900 GB/s per GPU per direction)",
        nic_gbps=50.0,
        description="8x B200 (180 GB usable) per node.",
        source="NVIDIA DGX B200 datasheet: 2x NVSwitch chips, 14.4 TB/s aggregate NVLink bandwidth "
        "(1.8 TB/s bidirectional per GPU); 4x OSFP ports serving 8x single-port ConnectX-7 VPI, up to "
        "400 Gb/s InfiniBand/Ethernet.",
    )


def dgx_h800(nodes: int = 1) -> Cluster:
    """DGX/HGX H800: 8x H800-SXM on NVSwitch with NVLink cut to 8 links (200 GB/s per direction), 8x 400 Gb/s."""
    return _hgx8(
        "dgx-h800",
        "h800-sxm",
        nodes,
        nvlink_gbps=200.0,
        nvlink_gen="NVLink4 cut to 8 links (8 x 25 GB/s = 200 GB/s per GPU per direction)",
        nic_gbps=50.0,
        description="8x H800 SXM5 80GB per node.",
        source="H800: 400 GB/s bidirectional NVLink per GPU against the H100's 900 (public H800 vs H100 "
        "comparisons); one 400 Gb/s InfiniBand NIC per GPU as in DeepSeek-V3's H800 cluster (DeepSeek-V3 "
        "technical report, arXiv:2412.19437, sec. 3.1: 8 GPUs per node on NVLink/NVSwitch, InfiniBand across).",
    )


def dgx_b300(nodes: int = 1) -> Cluster:
    """DGX B300: 8x B300 (Blackwell Ultra) on NVLink5/NVSwitch, 8x 800 Gb/s ConnectX-8."""
    return _hgx8(
        "dgx-b300",
        "b300",
        nodes,
        nvlink_gbps=900.0,
        nvlink_gen="NVLink5 (18 links x 50 GB/s = 900 GB/s per GPU per direction)",
        nic_gbps=100.0,
        description="8x B300 (288 GB) per node.",
        source="NVIDIA HGX/DGX B300 specification: NVLink5 Switch, 1.8 TB/s GPU-to-GPU bidirectional per GPU, "
        "14.4 TB/s per node; networking 1.6 TB/s per node (8x ConnectX-8 SuperNIC, 800 Gb/s per GPU).",
    )


GRACE_HOST_OVERHEAD_SCALE = 37.08 / 13.48
"""How much longer a Grace CPU (Arm Neoverse V2: GH200, GB200, GB300) took per framework op than a DGX's x86 host in
one microbenchmark: torch.nn.Linear's forward cost 37.08 us of CPU time on a GB200 and 13.48 us on a DGX H100 (Xeon
Platinum 8480C), NVIDIA/TransformerEngine issue #2053 (August 2025; GH200: 33.17 us). The NVL72 presets do not apply
it: the measured MoE runs of moe_runs.csv show no such host penalty on GB200 against HGX B200 with the same
configuration (Nemotron 3 Nano, 8 GPUs, micro-batch 2: 32.7-34.8 against 32.8 thousand tokens/s per GPU), the
containers' CPU binding and Transformer Engine's later CPU-side work having closed it. A job asks for it with
cluster.host_overhead_scale (what a slower or faster host costs)."""


def _nvl72(name: str, device: str, nodes: int, nic_gbps: float, nic: str, source: str) -> Cluster:
    """A rack of 72 GPUs in one NVLink5 switch domain (18 links x 50 GB/s = 900 GB/s per GPU per direction),
    one NIC per GPU to the next rack. A 'node' here is the NVLink domain (the rack), not a compute tray: GPUs in
    different trays of a rack talk over NVLink, not the NIC."""
    return Cluster(
        name=name,
        device=get_device(device),
        gpus_per_node=72,
        nodes=nodes,
        levels=(
            Level("nvswitch", "switch", 72, 900.0, NVLINK_LATENCY_S),
            Level("infiniband", "switch", nodes, _per_gpu_nic_gbps(72, nic_gbps, 72), IB_LATENCY_S),
        ),
        nics_per_node=72,
        nic_gbps=nic_gbps,
        description=f"72x {device.upper()} GPUs per NVLink domain (NVLink5, 18 links x 50 GB/s = 900 GB/s per GPU "
        f"per direction, 130 TB/s aggregate), one {nic} per GPU; InfiniBand across racks modelled as one switch.",
        source=source,
    )


def gb300_nvl72(nodes: int = 1) -> Cluster:
    """GB300 NVL72: 72 Blackwell Ultra GPUs in one NVLink5 switch domain, one 800 Gb/s ConnectX-8 per GPU."""
    return _nvl72("gb300-nvl72", "gb300", nodes, 100.0, "800 Gb/s ConnectX-8",
                  "NVIDIA GB300 NVL72 datasheet: 72 Blackwell Ultra GPUs, 130 TB/s NVLink bandwidth (1.8 TB/s "
                  "bidirectional per GPU), 72 ConnectX-8 SuperNICs (800 Gb/s per GPU).")


def gb200_nvl72(nodes: int = 1) -> Cluster:
    """GB200 NVL72: 72 Blackwell GPUs (36 GB200 superchips in 18 compute trays of 4) in one NVLink5 switch
    domain, one 400 Gb/s ConnectX-7 per GPU to the next rack."""
    return _nvl72("gb200-nvl72", "gb200", nodes, 50.0, "400 Gb/s ConnectX-7",
                  "NVIDIA GB200 NVL72 datasheet: 72 Blackwell GPUs, 130 TB/s NVLink bandwidth (1.8 TB/s "
                  "bidirectional per GPU); NICs assumed one ConnectX-7 400 Gb/s per GPU as in the reference "
                  "architecture's compute fabric.")


def dgx1_v100(nodes: int = 1) -> Cluster:
    """DGX-1 (Volta): 8x V100-32GB on the NVLink2 hybrid cube-mesh, one 100 Gb/s EDR NIC per node."""
    nic_gbps = 12.5
    return Cluster(
        name="dgx1-v100",
        device=get_device("v100-sxm2-32gb"),
        gpus_per_node=8,
        nodes=nodes,
        levels=(
            Level("nvlink", "ring", 8, 150.0, NVLINK_LATENCY_S),
            Level("infiniband", "switch", nodes, _per_gpu_nic_gbps(1, nic_gbps, 8), IB_LATENCY_S),
        ),
        nics_per_node=1,
        nic_gbps=nic_gbps,
        description="8x V100 SXM2 32GB per node on the NVLink2 hybrid cube-mesh, modelled as one ring "
        "level at 150 GB/s per GPU per direction: each V100 has 6 NVLink2 links of 25 GB/s/dir, and the "
        "mesh decomposes into 3 undirected Hamiltonian rings, i.e. 6 directed rings that each use one "
        "outgoing link per GPU (NCCL's own model rates a V100 link at 20 GB/s, i.e. ~120 GB/s). Only "
        "ring-shaped traffic gets this; point-to-point between non-neighbours is far slower. One "
        "100 Gb/s EDR InfiniBand NIC per node shared by its 8 GPUs (1.5625 GB/s each when all send).",
        source="NVIDIA DGX-1 with Tesla V100 System Architecture whitepaper (hybrid cube-mesh, 6 NVLink2 "
        "links per GPU, 25 GB/s per direction each); single-NIC network as in Proteus "
        "(JF-D/Proteus examples/clusters/dgx1_v100_1ib: inter_node 12.5 GB/s); a stock DGX-1 has "
        "4 EDR NICs.",
    )


def pcie_titanxp(nodes: int = 1) -> Cluster:
    """One dual-socket box with 8x Titan Xp on PCIe 3.0 (4 per socket behind PCIe switches), no network."""
    if nodes != 1:
        raise ValueError("cluster 'pcie-titanxp' has no inter-node network; it supports only 1 node")
    return Cluster(
        name="pcie-titanxp",
        device=get_device("titan-xp"),
        gpus_per_node=8,
        nodes=1,
        levels=(
            Level("pcie", "switch", 4, 12.0, PCIE_LATENCY_S),
            Level("qpi", "fc", 2, 6.0, QPI_LATENCY_S, port_gbps=6.0),
        ),
        nics_per_node=0,
        nic_gbps=0.0,
        description="8x Titan Xp on PCIe 3.0 x16 in a dual-socket (Broadwell) server, 4 GPUs per socket "
        "behind a PCIe switch. GPU-to-GPU within a switch ~12 GB/s effective (15.75 GB/s nominal x16 "
        "Gen3); across sockets traffic crosses QPI through host memory at ~6 GB/s, and that is the "
        "socket link's capacity: concurrent cross-socket flows divide it. No network.",
        source="NCCL topology constants (src/graph/topo.h): PCI_BW 12.0 GB/s for PCIe Gen3 x16 and "
        "BDW_QPI_BW 6.0 GB/s for Broadwell QPI (a link capacity: NCCL's search subtracts each channel "
        "crossing it); Proteus (JF-D/Proteus examples/clusters/titanxp: "
        "gpu_to_gpu 12 GB/s, Broadwell CPUs in topos/topo-n1.xml).",
    )


def pcie_1080ti_10gbe(nodes: int = 1) -> Cluster:
    """One GTX 1080 Ti per node, nodes joined by 10 Gb/s Ethernet (TCP sockets)."""
    nic_gbps = 1.25
    return Cluster(
        name="pcie-1080ti-10gbe",
        device=get_device("gtx-1080-ti"),
        gpus_per_node=1,
        nodes=nodes,
        levels=(Level("ethernet", "switch", nodes, _per_gpu_nic_gbps(1, nic_gbps, 1), TCP_LATENCY_S),),
        nics_per_node=1,
        nic_gbps=nic_gbps,
        description="Single-GPU GTX 1080 Ti workstations joined by a 10 GbE switch; NCCL falls back to "
        "its TCP socket transport (no RDMA), so per-message latency is tens of microseconds.",
        source="10GBASE-T line rate 10 Gb/s = 1.25 GB/s per direction (TCP goodput ~1.1-1.2 GB/s); "
        "latency ~40 us is an assumption for kernel TCP small messages (typically 30-50 us).",
    )


CLUSTERS: dict[str, Callable[[int], Cluster]] = {
    "dgx-a100": dgx_a100,
    "dgx-h100": dgx_h100,
    "hgx-h200": hgx_h200,
    "dgx-b200": dgx_b200,
    "gb200-nvl72": gb200_nvl72,
    "dgx-h800": dgx_h800,
    "dgx-b300": dgx_b300,
    "gb300-nvl72": gb300_nvl72,
    "dgx1-v100": dgx1_v100,
    "pcie-titanxp": pcie_titanxp,
    "pcie-1080ti-10gbe": pcie_1080ti_10gbe,
}
"""Preset name -> factory(nodes) building that cluster."""

_DEFAULT_NODES: Mapping[str, int] = MappingProxyType({name: 1 for name in CLUSTERS})

_CLUSTER_ALIASES: Mapping[str, str] = MappingProxyType(
    {
        "dgx1": "dgx1-v100",
        "dgx1-v100-1ib": "dgx1-v100",
        "titanxp": "pcie-titanxp",
        "dgxa100": "dgx-a100",
        "dgxh100": "dgx-h100",
        "h200": "hgx-h200",
    }
)


def _canonical_cluster(name: str) -> str:
    """Normalise case and '_'/' ' separators, then resolve aliases; KeyError if unknown."""
    key = name.strip().lower().replace("_", "-").replace(" ", "-")
    key = _CLUSTER_ALIASES.get(key, key)
    if key not in CLUSTERS:
        raise KeyError(f"unknown cluster '{name}'; known: {', '.join(sorted(CLUSTERS))}")
    return key


def get_cluster(name: str, nodes: int | None = None) -> Cluster:
    """Build preset `name` with `nodes` nodes (the preset's default when None)."""
    key = _canonical_cluster(name)
    return CLUSTERS[key](_DEFAULT_NODES[key] if nodes is None else nodes)


def custom_cluster(
    device: str | Device,
    gpus_per_node: int,
    nodes: int,
    intra_gbps: float,
    inter_gbps: float,
    intra_latency_s: float = NVLINK_LATENCY_S,
    inter_latency_s: float = IB_LATENCY_S,
    *,
    name: str = "custom",
) -> Cluster:
    """A two-level cluster from per-GPU bandwidths: a switch inside the node, a network across nodes.

    `inter_gbps` is per GPU, so it is modelled as one NIC of that speed per GPU; `inter_gbps=0`
    builds a single box with no network (then nodes must be 1 and gpus_per_node > 1).
    """
    dev = device if isinstance(device, Device) else get_device(device)
    networked = inter_gbps != 0 or gpus_per_node == 1
    levels: list[Level] = []
    if gpus_per_node > 1:
        levels.append(Level("intra-node", "switch", gpus_per_node, intra_gbps, intra_latency_s))
    if networked:
        levels.append(Level("network", "switch", nodes, inter_gbps, inter_latency_s))
    return Cluster(
        name=name,
        device=dev,
        gpus_per_node=gpus_per_node,
        nodes=nodes,
        levels=tuple(levels),
        nics_per_node=gpus_per_node if networked else 0,
        nic_gbps=inter_gbps if networked else 0.0,
        description=f"{nodes} node(s) x {gpus_per_node} {dev.name}: {intra_gbps} GB/s per GPU inside a "
        f"node, {inter_gbps} GB/s per GPU across nodes.",
        source="user-specified (custom_cluster)",
    )
