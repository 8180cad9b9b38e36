"""Communication cost models: NCCL's own tuned model (`NcclComm`) and hierarchical alpha-beta.

`NcclComm` prices a collective in two steps, as NCCL runs it (NVIDIA/nccl src/graph/tuning.cc,
`ncclTopoTuneModel` / `ncclTopoGetAlgoTime`):

1. Choice. NCCL's own estimate, latency + bytes / bandwidth, with NCCL's tables (2.23+, or the
   2.18-2.22 ones for `nccl_version` < 2.23: `CommParams.before_2_23`), is computed for every
   (algorithm, protocol) NCCL would enable, and the smallest wins:
     latency = baseLat[algo][proto] + hop latencies (hwLat[link][algo][proto]; nInterSteps of a
               ring across nodes, 2 log2(nodes) tree levels, max(hop, net overhead) inside nodes
               of a multi-node ring, x1.4 plateau for a multi-node Simple ring all-reduce)
     bandwidth = link bandwidth x NCCL's factor (ring LL 1/2 capped by llMaxBws, LL128 0.92, tree
               0.92 with LL 1/3.8 and LL128 120/128 and treeCorrectionFactor, NVLS 5/6)
   NVLS needs NVSwitch gen3+ (H100/H200/B200) and NCCL >= 2.17, NVLS-tree >= 2.18; tree and
   NVLS-tree are multi-node all-reduce algorithms. NCCL_ALGO / NCCL_PROTO-like restrictions
   (`algorithms`, `protocols`) remove options as NCCL's enable masks do.
2. Time. The chosen option is timed with the same latencies plus the calibrated extras:
     time = launch (+ serial launches of a thread's further GPUs) + the protocol's extra latency
            + latency + bytes / (bandwidth x measured efficiencies) + pipeline fill
   where the fill is the first chunk crossing every step before data streams: steps x min(window,
   bytes per rank) / bandwidth (per protocol, per network link, and for NVLS).
So the switch points are NCCL's, and the time is what was measured for the algorithm NCCL runs.

Algorithms: ring (every collective; a ring across nodes sends the same bytes out of every node
as out of every rank, so it is bounded by each node's NICs, i.e. by each rank's rail NIC), tree
(all-reduce across nodes: a chain inside each node, NCCL's double binary tree across nodes),
NVLS (in-switch all-reduce) and NVLS-tree (NVLS inside the node, tree across nodes). Protocols:
LL (8-byte flag+data stores: lowest latency, a fraction of the bandwidth, capped per GPU), LL128
(128-byte lines), Simple (full bandwidth, highest latency). Point-to-point traffic (send/recv,
all-to-all) uses NCCL's p2p path: Simple, or LL up to NCCL_P2P_LL_THRESHOLD. Which link types allow
which protocols, and every constant, come from `CommParams` (the `comm:` section of the
calibration file, where each is marked NCCL's value or fitted).

Bandwidths: NVLink per GPU (the cluster's intra-node level x the link efficiency); across nodes
each GPU reaches the network through its own rail NIC (NICs shared where a node has fewer NICs
than GPUs) and a group's ranks on one node share that node's NICs. `concurrency` = how many groups
of this shape run at once on disjoint ranks: they divide each node's NICs, the port of every block
they leave on a level with a shared port (`Level.port_gbps`: a socket's QPI link, a PCIe switch's
uplink; Proteus Fig. 7), and a GPU's own links only when the groups outnumber the GPUs (stacked on
the same GPUs).

Sizes follow nccl-tests (and trainsim's compiler): all-reduce / broadcast / reduce = buffer,
all-gather = gathered output per rank, reduce-scatter = input per rank, all-to-all = send buffer
per rank, send_recv = bytes each rank sends (a group of more than two ranks is a ring shift: every
rank sends to the next one at once). Ranks are numbered node-major.

`HierarchicalAlphaBeta` is the earlier model: alpha-beta collectives over the cluster's levels
(ASTRA-sim 2.0's analytical backend, Rashidi et al.), kept for callers that want its closed forms.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import cached_property
from types import MappingProxyType
from typing import Any, ClassVar, NamedTuple, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..hardware.cluster import Cluster, Level
from .calibration import device_family, load_calibration

COLLECTIVES: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
                                "reduce", "send_recv")
PROTOCOLS: tuple[str, ...] = ("ll", "ll128", "simple")
ALGORITHMS: tuple[str, ...] = ("ring", "tree", "nvls", "nvls_tree", "p2p")
_HOPPER = ("h100", "h200", "h800")
_BLACKWELL = ("b200", "gb200", "b300", "gb300")
_NVLS_FAMILIES = _HOPPER + _BLACKWELL
"""Device families (calibration.device_family) on NVSwitch gen3 and later, which NVLink SHARP (NVLS) runs on;
NCCL's llMaxBws tables are per compute capability: Hopper (9.0) and Blackwell (10.x)."""

ALGORITHM_ALIASES = MappingProxyType({"nvlstree": "nvls_tree", "nvls-tree": "nvls_tree"})
"""NCCL_ALGO spellings -> `ALGORITHMS` names (NCCL writes NVLSTree)."""

LINK_TYPES = MappingProxyType({
    "nvswitch": "nvlink", "nvlink": "nvlink", "intra-node": "nvlink",
    "pcie": "pcie", "qpi": "pcie",
    "infiniband": "infiniband", "network": "infiniband", "roce": "infiniband",
    "ethernet": "ethernet", "efa": "efa", "tcpxo": "tcpxo",
})
"""Level name -> link type whose NCCL constants apply (unknown names: nvlink inside, infiniband across)."""


class CommModel(Protocol):
    def time(self, collective: str, size_bytes: float, group: tuple[int, ...],
             concurrency: int = 1) -> float: ...


# --------------------------------------------------------------------------------------------------
# Parameters (defaults: NCCL's published tuning constants; the packaged calibration refits some)
# --------------------------------------------------------------------------------------------------

class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PerProtocol(_Strict):
    """One value per NCCL protocol."""

    ll: float = Field(ge=0)
    ll128: float = Field(ge=0)
    simple: float = Field(ge=0)

    def of(self, protocol: str) -> float:
        return float(getattr(self, protocol))


class LinkParams(_Strict):
    """Constants of one link type: achievable bandwidth and per-hop latency per protocol (us)."""

    efficiency: float = Field(gt=0, le=1.5, description="Simple-protocol bandwidth / the level's bandwidth")
    ring_hop_us: PerProtocol
    tree_hop_us: PerProtocol
    nvls_tree_hop_us: float | None = Field(None, ge=0, description="NVLS-tree hop over this network "
                                           "(NCCL hwLat[NET][NVLSTree]; None: the tree Simple hop)")
    window_bytes: PerProtocol | None = Field(None, description="bytes per GPU a hop across this network "
                                             "holds in flight before data streams, per protocol (None: the "
                                             "protocol's own window)")
    protocols: tuple[str, ...] = PROTOCOLS
    source: str = ""

    @model_validator(mode="after")
    def _known_protocols(self) -> LinkParams:
        unknown = set(self.protocols) - set(PROTOCOLS)
        if unknown or "simple" not in self.protocols:
            raise ValueError(f"protocols must be a subset of {PROTOCOLS} that includes 'simple'")
        return self


class ProtocolParams(_Strict):
    """Constants of one protocol: base latency per algorithm, bandwidth factor and caps."""

    base_ring_us: float = Field(ge=0)
    base_tree_us: float = Field(ge=0)
    bw_factor: float = Field(gt=0, le=1, description="ring bandwidth / Simple's bandwidth over the same links")
    tree_bw_factor: float | None = Field(None, gt=0, le=1, description="the same for tree (None: bw_factor)")
    max_busbw_single_node_gbps: float | dict[str, float] | None = Field(
        None, description="per-GPU cap inside one node: GB/s, or GB/s per device family ('default' for others)")
    max_busbw_multi_node_gbps: float | None = Field(None, gt=0, description="per-GPU cap across 2 nodes")
    max_busbw_many_nodes_gbps: float | None = Field(None, gt=0, description="per-GPU cap across > 2 nodes "
                                                    "(None: the 2-node cap)")
    window_bytes: float = Field(0.0, ge=0, description="bytes per GPU in flight per pipeline step (fill)")
    efficiency: float = Field(1.0, gt=0, le=1.5, description="measured bandwidth / NCCL's model bandwidth of "
                              "this protocol (the calibrated time only; NCCL's choice uses its own model)")
    extra_us: float = Field(0.0, description="measured latency beyond NCCL's model of this protocol "
                            "(the calibrated time only)")
    extra_hop_us: float = Field(0.0, description="the same per pipeline step (ring step, tree level)")
    source: str = ""


class NvlsParams(_Strict):
    """NVLink SHARP (in-switch reduction) all-reduce.

    Default efficiency 0.6: ~475 GB/s NVLS all-reduce busbw on H100 (alibaba SimAI's astra-sim
    calbusbw.h H100_NVLS_BW) is 271 GB/s algbw on 8 GPUs, 0.6 of NVLink4's 450 GB/s per direction.
    """

    device_families: tuple[str, ...] = _NVLS_FAMILIES
    hop_us: float = Field(25.0, ge=0, description="NCCL hwLat[NVLINK][NVLS][Simple] (2.23; 23 before)")
    efficiency: float = Field(0.6, gt=0, le=1.5, description="all-reduce algbw / NVLink per-GPU bandwidth")
    window_bytes: float = Field(0.0, ge=0, description="bytes per GPU in flight before NVLS streams")
    nccl_ratio: float = Field(5 / 6, gt=0, le=1, description="NCCL tuning.cc: NVLS algBw = busBw x 5/6")
    source: str = ""


class P2PParams(_Strict):
    """Point-to-point (send/recv, all-to-all) path."""

    base_us: float = Field(ge=0)
    efficiency: float = Field(gt=0, le=1.5, description="p2p bandwidth / the link's Simple bandwidth")
    ll_threshold_bytes: float = Field(16384.0, ge=0, description="NCCL_P2P_LL_THRESHOLD")
    source: str = ""


class LegacyTables(_Strict):
    """Where an older NCCL's tuning tables differ from the current ones (`CommParams.before_2_23`)."""

    ll_bw_factor: float = Field(0.25, gt=0, le=1, description="ring LL busBw factor")
    ll_max_busbw_single_node_gbps: dict[str, float] = Field(default_factory=dict,
                                                            description="LL per-GPU caps inside a node")
    simple_base_tree_us: float = Field(0.0, ge=0, description="baseLat[Tree][Simple]")
    tree_simple_hop_us: dict[str, float] = Field(default_factory=dict,
                                                 description="hwLat[link][Tree][Simple] per link type")
    nvls_hop_us: float | None = Field(None, ge=0, description="hwLat[NVLINK][NVLS][Simple]")
    source: str = ""


def _nccl_links() -> dict[str, LinkParams]:
    """NCCL tuning.cc hwLat (NCCL 2.23+) per link type; efficiencies from NCCL topo.h link rates."""
    nvl_ring = PerProtocol(ll=0.6, ll128=1.9, simple=3.4)
    nvl_tree = PerProtocol(ll=0.6, ll128=1.25, simple=4.0)
    pci_ring = PerProtocol(ll=1.0, ll128=2.5, simple=5.7)
    pci_tree = PerProtocol(ll=1.0, ll128=1.9, simple=4.0)
    net_ring = PerProtocol(ll=2.7, ll128=4.0, simple=14.0)
    net_tree = PerProtocol(ll=5.0, ll128=8.5, simple=14.0)
    no_ll128 = ("ll", "simple")
    net = {"ring_hop_us": net_ring, "tree_hop_us": net_tree, "nvls_tree_hop_us": 14.0}
    return {
        "nvlink": LinkParams(efficiency=0.8, ring_hop_us=nvl_ring, tree_hop_us=nvl_tree,
                             source="NCCL topo.h SM80_NVLINK_BW 20 GB/s of a 25 GB/s link; hwLat NVLINK"),
        "pcie": LinkParams(efficiency=1.0, ring_hop_us=pci_ring, tree_hop_us=pci_tree, protocols=no_ll128,
                           source="cluster PCIe/QPI levels already carry NCCL's effective rates; hwLat PCI"),
        "infiniband": LinkParams(efficiency=0.9, **net, source="NCCL tuning.cc hwLat NET; LL128 enabled "
                                 "as NCCL enables it for GPU-direct NICs (Volta-Hopper)"),
        "ethernet": LinkParams(efficiency=0.85, **net, protocols=no_ll128,
                               source="NCCL tuning.cc hwLat NET; LL128 needs GPU-direct NICs"),
        "efa": LinkParams(efficiency=0.9, **net, protocols=no_ll128,
                          source="NCCL tuning.cc hwLat NET; LL128 needs GPU-direct NICs"),
        "tcpxo": LinkParams(efficiency=0.9, **net, protocols=no_ll128,
                            source="NCCL tuning.cc hwLat NET; LL128 needs GPU-direct NICs"),
    }


def _nccl_before_2_23() -> LegacyTables:
    """NCCL 2.18-2.22 tuning.cc where it differs from 2.23+."""
    return LegacyTables(
        ll_bw_factor=0.25, ll_max_busbw_single_node_gbps={**dict.fromkeys(_NVLS_FAMILIES, 87.7)},
        simple_base_tree_us=0.0, nvls_hop_us=23.0,
        tree_simple_hop_us={k: 28.0 for k in ("nvlink", "pcie", "infiniband", "ethernet", "efa", "tcpxo")},
        source="NCCL 2.19 tuning.cc: ring LL busBw/4, llMaxBws Hopper N1 87.7, baseLat[Tree][Simple] 0, "
        "hwLat[*][Tree][Simple] 28, hwLat[NVLINK][NVLS] 23")


class CommParams(_Strict):
    """Every constant of `NcclComm` (the `comm:` section of the calibration file)."""

    launch_us: float = Field(0.0, ge=0, description="kernel launch + start per call, beyond NCCL's model")
    serial_launch_us: float = Field(0.0, ge=0, description="host time per further GPU one thread drives "
                                    "(nccl-tests -g N launches the N ranks' kernels one after another)")
    tree_efficiency: float = Field(0.92, gt=0, le=1, description="NCCL tuning.cc: tree busBw *= .92")
    tree_many_nodes: float = Field(1.0, gt=0, le=1, description="tree / NVLS-tree bandwidth beyond 2 nodes "
                                   "relative to 2 nodes (NCCL's per-channel tree caps, Hopper N4 / N2)")
    tree_correction: bool = Field(True, description="apply NCCL's treeCorrectionFactor (medium sizes)")
    net_overhead_us: float = Field(1.0, ge=0, description="NCCL getNetOverhead (x86 Intel): floor of every "
                                   "ring step of a multi-node ring, x3 for Simple")
    ring_plateau: float = Field(1.4, ge=1, description="NCCL: multi-node Simple ring all-reduce latency "
                                "x1.4 (Ampere+; 1.9 on Volta) once a channel carries >= 64 B per rank")
    channels: int = Field(16, ge=1, description="NCCL channels (nChannels) of the plateau threshold")
    links: dict[str, LinkParams] = Field(default_factory=_nccl_links)
    ll: ProtocolParams = ProtocolParams(base_ring_us=6.6, base_tree_us=6.8, bw_factor=0.5,
                                        tree_bw_factor=1 / 3.8,
                                        max_busbw_single_node_gbps={"v100": 39.0, "a100": 87.7,
                                                                    **dict.fromkeys(_HOPPER, 141.0),
                                                                    **dict.fromkeys(_BLACKWELL, 282.0),
                                                                    "default": 87.7},
                                        max_busbw_multi_node_gbps=39.0, max_busbw_many_nodes_gbps=20.4,
                                        source="NCCL 2.23 tuning.cc baseLat, ring LL busBw/2, tree LL "
                                        "busBw/3.8, llMaxBws (N1 per GPU generation, Intel N2 / N4)")
    ll128: ProtocolParams = ProtocolParams(base_ring_us=14.0, base_tree_us=14.0, bw_factor=0.92,
                                           tree_bw_factor=120 / 128,
                                           source="NCCL tuning.cc baseLat, ring LL128 busBw*0.92, "
                                           "multi-node tree LL128 busBw*120/128")
    simple: ProtocolParams = ProtocolParams(base_ring_us=8.4, base_tree_us=8.4, bw_factor=1.0,
                                            source="NCCL 2.23 tuning.cc baseLat")
    nvls: NvlsParams = NvlsParams()
    p2p: P2PParams = P2PParams(base_us=8.4, efficiency=1.0, source="NCCL Simple ring base latency")
    before_2_23: LegacyTables | None = Field(default_factory=_nccl_before_2_23,
                                             description="tables of NCCL < 2.23 where they differ")
    source: str = ""

    def for_release(self, version: tuple[int, ...] | None) -> CommParams:
        """These constants as NCCL `version` had them (None: the current tables, i.e. unchanged)."""
        old = self.before_2_23
        if version is None or version >= (2, 23) or old is None:
            return self
        ll_cap = self.ll.max_busbw_single_node_gbps
        if old.ll_max_busbw_single_node_gbps:
            ll_cap = {**(ll_cap if isinstance(ll_cap, dict) else {"default": ll_cap} if ll_cap else {}),
                      **old.ll_max_busbw_single_node_gbps}
        links = {name: lp.model_copy(update={"tree_hop_us": lp.tree_hop_us.model_copy(
                     update={"simple": old.tree_simple_hop_us[name]})}) if name in old.tree_simple_hop_us else lp
                 for name, lp in self.links.items()}
        return self.model_copy(update={
            "links": links,
            "ll": self.ll.model_copy(update={"bw_factor": old.ll_bw_factor, "max_busbw_single_node_gbps": ll_cap}),
            "simple": self.simple.model_copy(update={"base_tree_us": old.simple_base_tree_us}),
            "nvls": self.nvls if old.nvls_hop_us is None else self.nvls.model_copy(update={"hop_us": old.nvls_hop_us}),
        })

    @model_validator(mode="after")
    def _needs_base_links(self) -> CommParams:
        missing = {"nvlink", "pcie", "infiniband"} - set(self.links)
        if missing:
            raise ValueError(f"links needs entries for {sorted(missing)}")
        return self

    def protocol(self, name: str) -> ProtocolParams:
        return {"ll": self.ll, "ll128": self.ll128, "simple": self.simple}[name]

    def link(self, link_type: str) -> LinkParams:
        """Constants of a link type; an unlisted network fabric falls back to InfiniBand's."""
        return self.links.get(link_type) or self.links["infiniband"]


# --------------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------------

class CommChoice(NamedTuple):
    """What NCCL would run for one call and how long it takes."""

    algorithm: str
    protocol: str
    time_s: float


@dataclass(frozen=True)
class _Shape:
    """A group laid onto the cluster: sizes, bottleneck links and their effective bandwidths (GB/s)."""

    n: int
    nodes: int
    per_node: int
    intra_link: str
    intra_gbps: float  # per GPU, Simple-effective, of the slowest intra-node level spanned (inf if none)
    net_link: str
    node_net_gbps: float  # this group's share of one node's NICs, Simple-effective (inf within a node)
    rail_gbps: float  # one rank's own NIC share, Simple-effective (inf within a node)
    nvls_gbps: float  # NVLS all-reduce algbw per GPU (0 where the switch cannot reduce)

    @property
    def multi_node(self) -> bool:
        return self.nodes > 1


def _all_to_all_bytes(size: float, n: int, k: int, multi_node: bool, remote_share: float = 1.0) -> tuple[float, float]:
    """(bytes through one GPU's NVLink, bytes through its node's NICs) of an all-to-all of `size` bytes per rank
    over n ranks, k per node. Direct (NCCL's, remote_share 1): size (k - 1) / n on NVLink, the node's k ranks'
    size (n - k) / n over the NICs. Two-hop (a MoE dispatch that sends a token once per destination node and
    forwards it there over NVLink, as DeepEP's and HybridEP's inter-node kernels do): the NICs carry
    `remote_share` of that, and NVLink also forwards what arrives to the node's other k - 1 GPUs, size (n - k) / n
    (k - 1) / k, beside its own share."""
    net = k * size * (n - k) / n if multi_node else 0.0
    intra = size * (k - 1) / n if k > 1 else 0.0
    if remote_share < 1.0 and multi_node:
        net *= remote_share
        intra += size * (n - k) / n * (k - 1) / k if k > 1 else 0.0
    return intra, net


def _missed(pool: float, held: float, top_k: int) -> float:
    """Probability that top_k experts drawn uniformly without replacement from `pool` avoid the `held` ones of one
    GPU or node: C(pool - held, top_k) / C(pool, top_k) as a product (0 when top_k exhausts the pool)."""
    miss = 1.0
    for i in range(top_k):
        if pool - i <= 0:
            return 0.0
        miss *= max(0.0, (pool - held - i) / (pool - i))
    return miss


def two_hop_remote_share(experts: int, top_k: int, nodes: int, node_limit: int | None = None) -> float:
    """Cross-node bytes of a two-hop MoE dispatch over those of a direct all-to-all: a token routed to top_k of
    `experts` spread evenly over `nodes` nodes sends one copy per remote node it reaches instead of one per remote
    expert. Balanced routing (top_k experts uniformly without replacement): a remote node is reached with
    probability 1 - C(experts - experts / nodes, top_k) / C(experts, top_k), against top_k / experts x experts /
    nodes copies it would get; with node-limited routing (DeepSeek-V3: each token to at most `node_limit`
    nodes, every chosen node reached) node_limit (nodes - 1) / nodes remote nodes against top_k (nodes - 1) /
    nodes copies."""
    if nodes <= 1 or top_k <= 1:
        return 1.0
    copies = top_k * (nodes - 1) / nodes
    if node_limit is not None and node_limit < nodes:
        reached = node_limit * (nodes - 1) / nodes
    else:
        reached = (nodes - 1) * (1.0 - _missed(experts, experts / nodes, top_k))
    return min(1.0, reached / copies)


def two_hop_rank_share(experts: int, top_k: int, ranks: int, nodes: int, node_limit: int | None = None) -> float:
    """GPU-level copies of a two-hop MoE dispatch over its (token, expert) copies: DeepEP's and HybridEP's kernels
    send a token once to each GPU holding some of its experts (the experts there take it from one buffer), so
    each copy on NVLink, direct or forwarded, stands for every expert of that GPU the token chose. Balanced
    routing: top_k of the experts uniformly (with node-limited routing, of the `node_limit` chosen nodes'
    experts), `experts / ranks` per GPU, a GPU reached with probability 1 - C(pool - per GPU, top_k) /
    C(pool, top_k) (DeepEP's benchmark routing, sampled: 5.30 GPUs per token on 8 GPUs, 7.26 on 32)."""
    if ranks <= 1 or top_k <= 1:
        return 1.0
    nodes = max(1, nodes)
    chosen = node_limit if node_limit is not None and node_limit < nodes else nodes
    pool = experts * chosen / nodes  # the experts a token picks from (all of them if top_k exhausts the pool)
    reached = ranks * chosen / nodes * (1.0 - _missed(pool, experts / ranks, top_k))
    return min(1.0, reached / top_k)


HYBRIDEP_DEFAULT_SMS = 16
"""SMs HybridEP's dispatch and combine kernels run on by default: Megatron-Core's TransformerConfig
moe_hybridep_num_sms (--moe-hybridep-num-sms), 16, which Megatron-Bridge's library MoE recipes also set (its
benchmark recipes use 32: validate.moe_rows.RECIPE_HYBRIDEP_SMS)."""

HYBRIDEP_GBPS_PER_SM = (362.01 + 310.21) / 2 / 16
"""GB/s one SM of HybridEP's kernels moves: its BF16 dispatch (362.01 GB/s) and combine (310.21 GB/s) on 8 GB200
ranks with 16 SMs, kernel only (deepseek-ai/DeepEP pull request 420, which added HybridEP; 32 SMs moved a little less
than twice that: 615.78 and 519.57 GB/s). Within an NVLink domain that, not the links' 900 GB/s, bounds the transfer
at 16 SMs; larger groups measured lower (combine at 24 ranks: 126.53 GB/s with 16 SMs), which is not modelled.
Assumed per SM on every GPU."""

HYBRIDEP_CROSS_DOMAIN_GBPS_PER_SM = (136.54 + 128.92) / 2 / 24
"""GB/s one SM of HybridEP's kernels moves when its group spans NVLink domains (RDMA between them): its BF16 dispatch
(136.54 GB/s, 393.84 MB received over NVLink in 2,884 us) and combine (128.92 GB/s) on two 8-GPU B300 nodes with 24
SMs each, 4,096 tokens of 7,168 per rank, top-8 of 128 experts (deepseek-ai/DeepEP issue 590, April 2026). Its RDMA
side moved 40.6 GB/s over 800 Gb/s ConnectX-8 NICs: the kernels, not the links, bound it. Megatron-Bridge keeps
HybridEP within one 8-GPU domain on such systems for this reason (NVIDIA-NeMo/Megatron-Bridge issue 2883: 'HybridEP
for NVL8 with EP>8' not yet performant). Counted on the bytes a rank receives, as HYBRIDEP_GBPS_PER_SM."""


def two_hop_dispatch(experts: int, top_k: int, ranks: int, nodes: int, node_limit: int | None = None
                     ) -> tuple[float, float]:
    """How NcclComm prices a two-hop MoE dispatch (or combine) of a per-(token, expert) buffer over `ranks` GPUs
    on `nodes` nodes: (the share of the buffer it moves, two_hop_rank_share; the cross-node share of that,
    one copy per node reached over one per GPU reached: the `remote_share` to pass with the moved size)."""
    moved = two_hop_rank_share(experts, top_k, ranks, nodes, node_limit)
    return moved, min(1.0, two_hop_remote_share(experts, top_k, nodes, node_limit) / moved)


def _link_type(level: Level, network: bool) -> str:
    return LINK_TYPES.get(level.name, "infiniband" if network else "nvlink")


def port_key(index: int, level: Level) -> str:
    """Link key of a level's per-block port (one shared resource per child block, see compile.graph)."""
    return f"port{index}:{level.name}"


def _port_flows(locals_by_node: list[list[int]], child: int, gpus_per_node: int, concurrency: int,
                all_to_all: bool) -> float:
    """Per-rank flows through one child block's port when `concurrency` groups of this shape run at once.

    The identical groups tile the node, so the blocks they occupy spread evenly over the node's
    blocks: each of the node's `gpus_per_node / child` blocks sees concurrency x (blocks one group
    occupies) / (blocks per node) groups. A ring or tree leaves a block by one edge per direction
    (NCCL orders rings to cross a slow link once): one flow per group, carrying what one rank sends.
    In an all-to-all the block's m members (of k on the node) each send (k - m)/n of their buffer out
    through the port, against the (k - 1)/n a rank sends on the node: m (k - m)/(k - 1) flows."""
    per_node_blocks = max(1, gpus_per_node // child)
    occupied = max(len({r // child for r in loc}) for loc in locals_by_node)
    groups = max(1, math.ceil(concurrency * occupied / per_node_blocks))
    if not all_to_all:
        return float(groups)
    k = max(len(loc) for loc in locals_by_node)
    m = max(max(Counter(r // child for r in loc).values()) for loc in locals_by_node)
    return groups * max(1.0, m * (k - m) / (k - 1)) if k > 1 else float(groups)


def _log2_ceil(n: int) -> int:
    return max(1, math.ceil(math.log2(n))) if n > 1 else 0


# NCCL tuning.cc (2.19-2.21) treeCorrectionFactor[protocol][log2(bytes / 64)], 64 B .. 256 MB: trees run
# slower than NCCL's model at medium sizes, so NCCL scales their bandwidth by these factors.
_TREE_CORRECTION = MappingProxyType({
    "ll": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0),
    "ll128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0),
    "simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
})


def tree_correction(protocol: str, size_bytes: float) -> float:
    """NCCL's treeCorrectionFactor at `size_bytes`, linear in log2(size) between its power-of-two points.

    NCCL looks the factor up by floor(log2(bytes / 64)), a step function whose rises would make a
    tree's time drop where the size crosses a power of two; interpolating keeps every point NCCL uses
    and makes the time monotone in size (the factor never rises faster than the size)."""
    table = _TREE_CORRECTION[protocol]
    x = math.log2(max(size_bytes, 64.0) / 64.0)
    if x >= len(table) - 1:
        return 1.0 if x >= len(table) else table[-1] + (1.0 - table[-1]) * (x - (len(table) - 1))
    i = int(x)
    return table[i] + (table[i + 1] - table[i]) * (x - i)


def nccl_version_tuple(version: str | None) -> tuple[int, ...] | None:
    """'2.17.1 + aws-ofi-nccl 1.5.0' -> (2, 17, 1); None where no NCCL version can be read."""
    m = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", version or "")
    if m is None:
        return None
    return tuple(int(g) for g in m.groups() if g is not None)


def _ring_steps(collective: str, n: int) -> tuple[int, float]:
    """(pipeline steps, bytes each rank sends / size) of a ring collective (nccl-tests busbw factors)."""
    if collective == "all_reduce":
        return 2 * (n - 1), 2 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter"):
        return n - 1, (n - 1) / n
    return n - 1, 1.0  # broadcast / reduce: a pipelined chain, every link carries the buffer once


@dataclass
class NcclComm:
    """NCCL-like collective times on a cluster; see the module docstring for the model.

    `params` is a `CommParams`, the `comm:` dict of a calibration file, or None for the packaged
    calibration. `protocols` / `algorithms` restrict the choice like NCCL_PROTO / NCCL_ALGO.
    `nccl_version` ('2.17.1'; None = a current NCCL) gates what that release could run: NVLS from
    2.17, NVLS-tree from 2.18. `gpus_per_thread` > 1 prices a caller whose one thread drives that
    many GPUs (nccl-tests -g N): their kernels launch one after another.
    """

    # prices depend on a group's ranks only through their node-relative layout (node ids are compared, never
    # used; local indices are r % gpus_per_node): a group shifted by whole nodes costs the same (cost.annotate
    # prices such copies, one per pipeline stage, once)
    node_shift_invariant: ClassVar[bool] = True

    cluster: Cluster
    params: CommParams | dict[str, Any] | None = None
    protocols: tuple[str, ...] = PROTOCOLS
    algorithms: tuple[str, ...] = ALGORITHMS
    nccl_version: str | None = None
    gpus_per_thread: int = 1

    def __post_init__(self) -> None:
        if self.params is None:
            self.params = CommParams.model_validate(load_calibration().comm)
        elif isinstance(self.params, dict):
            self.params = CommParams.model_validate(self.params)
        self.protocols = tuple(p.lower() for p in self.protocols)
        self.algorithms = tuple(ALGORITHM_ALIASES.get(a.lower(), a.lower()) for a in self.algorithms)
        bad = (set(self.protocols) - set(PROTOCOLS)) | (set(self.algorithms) - set(ALGORITHMS))
        if bad or not self.protocols or not self.algorithms:
            raise ValueError(f"unknown or no protocol/algorithm: {sorted(bad)}")
        if self.gpus_per_thread < 1:
            raise ValueError(f"gpus_per_thread must be >= 1, got {self.gpus_per_thread}")

    def _since(self, *release: int) -> bool:
        version = nccl_version_tuple(self.nccl_version)
        return version is None or version >= release

    @cached_property
    def p(self) -> CommParams:
        """The constants in force: the parameters as the NCCL release `nccl_version` had them."""
        assert isinstance(self.params, CommParams)
        return self.params.for_release(nccl_version_tuple(self.nccl_version))

    @cached_property
    def _nvls_capable(self) -> bool:
        intra = self.cluster.intra_node_levels
        return (len(intra) == 1 and intra[0].kind == "switch" and _link_type(intra[0], False) == "nvlink"
                and device_family(self.cluster.device) in self.p.nvls.device_families and self._since(2, 17))

    def _launch_us(self, shape: _Shape) -> float:
        """Host-side start of one call: launch, plus the serial launches of a thread's further GPUs."""
        serial = min(self.gpus_per_thread, shape.per_node) - 1
        return self.p.launch_us + max(0, serial) * self.p.serial_launch_us

    # -- public API ----------------------------------------------------------------------------
    def time(self, collective: str, size_bytes: float, group: tuple[int, ...], concurrency: int = 1, *,
             remote_share: float = 1.0) -> float:
        """Seconds for one collective of `size_bytes` (nccl-tests convention) over `group`. `remote_share`: an
        all-to-all whose cross-node bytes are that share of what every rank sending to every peer moves (a
        two-hop MoE dispatch sends each token once per destination node: `two_hop_remote_share`)."""
        return self.choose(collective, size_bytes, group, concurrency, remote_share=remote_share).time_s

    def choose(self, collective: str, size_bytes: float, group: tuple[int, ...],
               concurrency: int = 1, *, remote_share: float = 1.0) -> CommChoice:
        """The (algorithm, protocol) NCCL's own tuning model picks (its fastest estimate among the
        enabled options), with the calibrated time of that choice."""
        return self._choose(self.options(collective, size_bytes, group, concurrency, remote_share=remote_share))

    @staticmethod
    def _choose(options: list[tuple[CommChoice, float]]) -> CommChoice:
        return min(options, key=lambda o: o[1])[0] if options else CommChoice("none", "none", 0.0)

    def options(self, collective: str, size_bytes: float, group: tuple[int, ...],
                concurrency: int = 1, *, remote_share: float = 1.0) -> list[tuple[CommChoice, float]]:
        """Every (algorithm, protocol) NCCL could run for the call, as (calibrated choice, NCCL's estimate
        in seconds), after NCCL_ALGO / NCCL_PROTO-like restrictions; empty for a trivial call.

        Each option's calibrated time is monotone in size, so the chosen time never falls below the
        fastest option at any smaller size; it can dip where NCCL's estimate switches to an option
        that really is faster, as measured curves do."""
        if collective not in COLLECTIVES:
            raise ValueError(f"unknown collective {collective}")
        ranks = tuple(dict.fromkeys(group))
        if len(ranks) <= 1 or size_bytes <= 0:
            return []
        return self._options(collective, size_bytes, ranks, self._shape(ranks, max(1, int(concurrency)), collective),
                             remote_share)

    def _options(self, collective: str, size_bytes: float, ranks: tuple[int, ...],
                 shape: _Shape, remote_share: float = 1.0) -> list[tuple[CommChoice, float]]:
        """`options` of a non-trivial call whose group's layout is `shape`."""
        if collective == "send_recv":
            choice = self._send_recv(size_bytes, ranks, shape)
            return [(choice, choice.time_s)]
        if collective == "all_to_all":
            choice = self._all_to_all(size_bytes, shape, remote_share)
            return [(choice, choice.time_s)]
        options = [self._ring(collective, size_bytes, shape, p) for p in self._protocols(shape)]
        if collective == "all_reduce" and shape.multi_node:
            options += [self._tree(size_bytes, shape, p) for p in self._protocols(shape)]
        if collective == "all_reduce" and shape.nvls_gbps > 0 and (not shape.multi_node or self._since(2, 18)):
            options.append(self._nvls(size_bytes, shape))
        return [o for o in options if o[0].algorithm in self.algorithms] or options

    def demand(self, collective: str, size_bytes: float, group: tuple[int, ...],
               concurrency: int = 1, *, remote_share: float = 1.0) -> tuple[float, dict[str, float]]:
        """(latency_s, {link key: work seconds}) of the call `time()` prices: latency + max(work) == time.

        The latency is what the chosen algorithm/protocol takes with every link infinitely fast
        (launch, base and hop latencies, and the rate a protocol caps by itself); the rest is the
        bandwidth part, and each physical resource the group crosses gets the seconds it would need
        to carry the call's bytes alone (the bottleneck gets the whole bandwidth part). Keys:
        'intra<i>:<level name>' (a GPU's link at intra-node level i), 'rail' (a rank's own NIC
        share), 'nic' (the node's NICs, whose share among `concurrency` groups is in the work)."""
        return self.priced(collective, size_bytes, group, concurrency, remote_share=remote_share)[1]

    def priced(self, collective: str, size_bytes: float, group: tuple[int, ...],
               concurrency: int = 1, *, remote_share: float = 1.0) -> tuple[float, tuple[float, dict[str, float]]]:
        """`time()` and `demand()` of one call from a single choice of algorithm (the cost layer wants both
        for every collective under bandwidth sharing, and choosing is most of the price)."""
        if collective not in COLLECTIVES:
            raise ValueError(f"unknown collective {collective}")
        ranks = tuple(dict.fromkeys(group))
        if len(ranks) <= 1 or size_bytes <= 0:
            return 0.0, (0.0, {})
        conc = max(1, int(concurrency))
        shape = self._shape(ranks, conc, collective)  # one layout for the choice and its demand
        choice = self._choose(self._options(collective, size_bytes, ranks, shape, remote_share))
        return choice.time_s, self._demand(choice, collective, size_bytes, ranks, conc, shape, remote_share)

    def _demand(self, choice: CommChoice, collective: str, size_bytes: float, ranks: tuple[int, ...],
                conc: int, shape: _Shape, remote_share: float = 1.0) -> tuple[float, dict[str, float]]:
        if choice.time_s <= 0:
            return 0.0, {}
        fast = replace(shape, intra_gbps=math.inf, node_net_gbps=math.inf, rail_gbps=math.inf,
                       nvls_gbps=math.inf if shape.nvls_gbps > 0 else 0.0)
        algo = choice.algorithm
        if algo == "ring":
            latency = self._ring(collective, size_bytes, fast, choice.protocol)[0].time_s
        elif algo == "tree":
            latency = self._tree(size_bytes, fast, choice.protocol)[0].time_s
        elif algo in ("nvls", "nvls_tree"):
            latency = self._nvls(size_bytes, fast)[0].time_s
        elif collective == "send_recv":
            latency = self._send_recv(size_bytes, ranks, fast).time_s
        else:
            latency = self._all_to_all(size_bytes, fast, remote_share).time_s
        latency = min(latency, choice.time_s)
        weights = self._link_weights(collective, size_bytes, ranks, shape, algo, conc, remote_share)
        top = max(weights.values(), default=0.0)
        bw_s = choice.time_s - latency
        if top <= 0 or bw_s <= 0:
            return choice.time_s, {}
        return latency, {k: bw_s * w / top for k, w in weights.items() if w > 0}

    def _link_weights(self, collective: str, size: float, ranks: tuple[int, ...], shape: _Shape, algo: str,
                      concurrency: int, remote_share: float = 1.0) -> dict[str, float]:
        """Relative seconds each physical resource needs for the call (the largest is the bottleneck);
        their maximum is 1 / the bandwidth `time()` uses, so `demand()` stays consistent with it."""
        cl = self.cluster
        gpn = cl.gpus_per_node
        by_node: dict[int, list[int]] = {}
        for r in ranks:
            by_node.setdefault(r // gpn, []).append(r % gpn)
        gpu_share = max(1.0, concurrency * shape.per_node / gpn)
        w: dict[str, float] = {}
        net_scale = 1.0  # bytes through the network per byte of the bandwidth term
        intra_scale = 1.0
        on_node = shape.per_node > 1
        if algo == "tree":
            net_scale = 0.5 if shape.nodes == 2 else 1.0
        elif algo in ("nvls", "nvls_tree"):
            net_scale = (1.0 if shape.nodes == 2 else 2.0) / self._tree_efficiency(shape.nodes)
            on_node = False
            w["intra0:" + cl.intra_node_levels[0].name] = 1.0 / shape.nvls_gbps
        elif collective == "send_recv":
            gpn_pairs = [(ranks[0], ranks[1])] if len(ranks) == 2 else list(zip(ranks, ranks[1:] + ranks[:1],
                                                                               strict=True))
            crossing = Counter(a // gpn for a, b in gpn_pairs if a // gpn != b // gpn)
            on_node = len(crossing) < len(gpn_pairs)
            net_scale = float(max(crossing.values())) if crossing else 0.0
        elif collective == "all_to_all":
            n, k = shape.n, shape.per_node
            intra_scale, net_scale = _all_to_all_bytes(size, n, k, shape.multi_node, remote_share)
            on_node = k > 1
        if on_node and intra_scale > 0:
            span = 1
            locals_by_node = list(by_node.values())
            for i, level in enumerate(cl.intra_node_levels):
                fans_out = any(len({r // span for r in loc}) > len({r // (span * level.size) for r in loc})
                               for loc in locals_by_node)
                child = span
                span *= level.size
                if fans_out:
                    eff = self.p.link(_link_type(level, False)).efficiency
                    w[f"intra{i}:{level.name}"] = intra_scale / (level.bandwidth_gbps * eff / gpu_share)
                    if level.port_gbps is not None:
                        flows = _port_flows(locals_by_node, child, gpn, concurrency, collective == "all_to_all")
                        w[port_key(i, level)] = intra_scale / (level.port_gbps * eff / flows)
        net = cl.network_level
        if shape.multi_node and net is not None and net_scale > 0:
            eff = self.p.link(_link_type(net, True)).efficiency
            node_gbps = cl.nics_per_node * cl.nic_gbps * eff / concurrency
            if collective == "send_recv":
                w["rail"] = 1.0 / shape.rail_gbps
                w["nic"] = net_scale / node_gbps
            else:
                w["rail"] = net_scale / (shape.per_node * shape.rail_gbps)
                w["nic"] = net_scale / node_gbps
        return w

    # -- group layout --------------------------------------------------------------------------
    def _shape(self, ranks: tuple[int, ...], concurrency: int, collective: str = "all_reduce") -> _Shape:
        cl = self.cluster
        world, gpn = cl.world_size, cl.gpus_per_node
        if ranks and not (min(ranks) >= 0 and max(ranks) < world):
            bad = next(r for r in ranks if not 0 <= r < world)
            raise ValueError(f"rank {bad} out of range for world size {world}")
        by_node: dict[int, list[int]] = {}
        for r in ranks:
            by_node.setdefault(r // gpn, []).append(r % gpn)
        per_node = max(len(v) for v in by_node.values())
        gpu_share = max(1.0, concurrency * per_node / cl.gpus_per_node)  # groups stacked on the same GPUs
        # the distinct local layouts (a group spread over many nodes repeats one): _intra reads only these
        layouts = [list(t) for t in dict.fromkeys(map(tuple, by_node.values()))]
        intra_link, intra_gbps, nvls_gbps = self._intra(layouts, gpu_share, concurrency, collective == "all_to_all")
        net_link, node_net, rail = self._network(len(by_node), per_node, concurrency, gpu_share)
        return _Shape(len(ranks), len(by_node), per_node, intra_link, intra_gbps, net_link, node_net, rail,
                      nvls_gbps)

    def _intra(self, locals_by_node: list[list[int]], gpu_share: float, concurrency: int = 1,
               all_to_all: bool = False) -> tuple[str, float, float]:
        """(link type, per-GPU GB/s) of the slowest intra-node level the group spans, and NVLS GB/s.

        A level with a `port_gbps` (a socket's QPI link, a PCIe switch's uplink) gives each flow leaving
        a child block its share of the block's port (see `_port_flows`)."""
        link, gbps, nvls = "nvlink", math.inf, 0.0
        span = 1
        for level in self.cluster.intra_node_levels:
            fans_out = any(len({r // span for r in loc}) > len({r // (span * level.size) for r in loc})
                           for loc in locals_by_node)
            child = span
            span *= level.size
            if not fans_out:
                continue
            kind = _link_type(level, False)
            level_gbps = level.bandwidth_gbps * self.p.link(kind).efficiency / gpu_share
            if level.port_gbps is not None:
                flows = _port_flows(locals_by_node, child, self.cluster.gpus_per_node, concurrency, all_to_all)
                level_gbps = min(level_gbps, level.port_gbps * self.p.link(kind).efficiency / flows)
            if level_gbps < gbps:
                link, gbps = kind, level_gbps
            if self._nvls_capable:
                nvls = level.bandwidth_gbps * self.p.nvls.efficiency / gpu_share
        return link, gbps, nvls

    def _network(self, nodes: int, per_node: int, concurrency: int,
                 gpu_share: float) -> tuple[str, float, float]:
        """(link type, this group's GB/s per node, GB/s of one rank's rail NIC) across nodes; inf within one.

        Each GPU reaches the network through its own rail NIC (NICs shared when there are fewer NICs
        than GPUs); the node's NICs are shared by the `concurrency` groups running at once."""
        cl, net = self.cluster, self.cluster.network_level
        if nodes <= 1 or net is None:
            return "infiniband", math.inf, math.inf
        kind = _link_type(net, True)
        eff = self.p.link(kind).efficiency
        rail_gbps = cl.nic_gbps * max(1.0, cl.nics_per_node / cl.gpus_per_node)
        node_gbps = min(per_node * rail_gbps / gpu_share, cl.nics_per_node * cl.nic_gbps / concurrency)
        return kind, node_gbps * eff, rail_gbps * eff / gpu_share

    def _protocols(self, shape: _Shape) -> list[str]:
        """Protocols every link the group uses supports, within the NCCL_PROTO-like restriction."""
        links = [shape.intra_link] if shape.per_node > 1 else []
        if shape.multi_node:
            links.append(shape.net_link)
        usable = [pr for pr in self.protocols if all(pr in self.p.link(k).protocols for k in links)]
        return usable or ["simple"]  # a forced protocol the links cannot run: NCCL falls back to Simple

    def _proto_gbps(self, bus_gbps: float, protocol: str, nodes: int, tree: bool = False) -> float:
        """Bus bandwidth NCCL's model gives a protocol over links of `bus_gbps`: its factor and per-GPU caps."""
        pp = self.p.protocol(protocol)
        cap = (self._single_node_cap(pp) if nodes <= 1 else pp.max_busbw_multi_node_gbps if nodes == 2
               else pp.max_busbw_many_nodes_gbps or pp.max_busbw_multi_node_gbps)
        factor = pp.tree_bw_factor if tree and pp.tree_bw_factor is not None else pp.bw_factor
        return min(bus_gbps * factor, cap if cap is not None else math.inf)

    def _single_node_cap(self, pp: ProtocolParams) -> float | None:
        cap = pp.max_busbw_single_node_gbps
        if isinstance(cap, dict):
            return cap.get(device_family(self.cluster.device), cap.get("default"))
        return cap

    def _hop_us(self, link: str, tree: bool, protocol: str) -> float:
        lp = self.p.link(link)
        return (lp.tree_hop_us if tree else lp.ring_hop_us).of(protocol)

    def _tree_efficiency(self, nodes: int) -> float:
        return self.p.tree_efficiency * (self.p.tree_many_nodes if nodes > 2 else 1.0)

    def _net_window(self, shape: _Shape, protocol: str) -> float:
        """Pipeline window of a hop across the group's network (the protocol's own where unset)."""
        w = self.p.link(shape.net_link).window_bytes
        return w.of(protocol) if w is not None else self.p.protocol(protocol).window_bytes

    def _fill_s(self, window_bytes: float, steps: float, piece_bytes: float, gbps: float) -> float:
        """Pipeline fill: the first chunk (<= the window) crosses every step before data streams."""
        return steps * min(window_bytes, piece_bytes) / (gbps * 1e9)

    # -- algorithms: each returns (the calibrated time of the option, NCCL's own estimate of it) ------
    def _ring(self, collective: str, size: float, shape: _Shape, protocol: str) -> tuple[CommChoice, float]:
        """NCCL ring: nsteps hops, nInterSteps of them across nodes (tuning.cc), each hop at its link's
        latency; across nodes every hop costs at least NCCL's network post overhead, and a Simple
        all-reduce ring pays NCCL's plateau factor once each channel carries >= 64 B per rank."""
        n = shape.n
        steps, factor = _ring_steps(collective, n)
        inter = 0
        if shape.multi_node:  # NCCL nInterSteps
            inter = min(steps, 2 * (shape.nodes - 1) if collective == "all_reduce" else shape.nodes - 1
                        if collective in ("all_gather", "reduce_scatter") else shape.nodes)
        bus = self._proto_gbps(min(shape.intra_gbps, shape.node_net_gbps), protocol, shape.nodes)
        pp = self.p.protocol(protocol)
        intra_hop = self._hop_us(shape.intra_link, False, protocol)
        if shape.multi_node:
            intra_hop = max(intra_hop, self.p.net_overhead_us * (3.0 if protocol == "simple" else 1.0))
        # one GPU per node leaves every hop's latency exposed: NCCL (2.23+) prices it as a tree hop
        net_hop = self._hop_us(shape.net_link, shape.per_node == 1, protocol)
        lat_us = pp.base_ring_us + (steps - inter) * intra_hop + inter * net_hop
        if (shape.multi_node and collective == "all_reduce" and protocol == "simple"
                and size / (self.p.channels * n) >= 64):
            lat_us *= self.p.ring_plateau
        nccl_s = lat_us * 1e-6 + factor * size / (bus * 1e9)
        bus *= pp.efficiency
        piece = size if collective in ("broadcast", "reduce") else size / n
        fill = (self._fill_s(pp.window_bytes, steps - inter, piece, bus)
                + self._fill_s(self._net_window(shape, protocol), inter, piece, bus))
        extra_us = pp.extra_us + steps * pp.extra_hop_us
        t = (self._launch_us(shape) + extra_us + lat_us) * 1e-6 + factor * size / (bus * 1e9) + fill
        return CommChoice("ring", protocol, t), nccl_s

    def _tree(self, size: float, shape: _Shape, protocol: str) -> tuple[CommChoice, float]:
        """NCCL tree all-reduce: a chain inside each node, a double binary tree across nodes.

        NCCL's treeCorrectionFactor scales the streaming bandwidth at medium sizes; the pipeline fill
        moves whole chunks at the uncorrected rate (so the time stays monotone in size)."""
        k, m = shape.per_node, shape.nodes
        chain = shape.intra_gbps if k > 1 else math.inf
        net = shape.node_net_gbps * (2.0 if m == 2 else 1.0)  # a node of a 2-node tree forwards S, else 2S
        bus = self._proto_gbps(min(chain, net) * self._tree_efficiency(m), protocol, m, tree=True)
        stream = bus * (tree_correction(protocol, size) if self.p.tree_correction else 1.0)
        pp = self.p.protocol(protocol)
        lat_us = pp.base_tree_us + 2 * ((k - 1) * self._hop_us(shape.intra_link, True, protocol)
                                        + _log2_ceil(m) * self._hop_us(shape.net_link, True, protocol))
        nccl_s = lat_us * 1e-6 + size / (stream / 2 * 1e9)
        bus *= pp.efficiency
        stream *= pp.efficiency
        fill = (self._fill_s(pp.window_bytes, 2 * (k - 1), size, bus)
                + self._fill_s(self._net_window(shape, protocol), 2 * _log2_ceil(m), size, bus))
        extra_us = pp.extra_us + 2 * ((k - 1) + _log2_ceil(m)) * pp.extra_hop_us
        t = (self._launch_us(shape) + extra_us + lat_us) * 1e-6 + size / (stream / 2 * 1e9) + fill
        return CommChoice("tree", protocol, t), nccl_s

    def _nvls(self, size: float, shape: _Shape) -> tuple[CommChoice, float]:
        """NVLS all-reduce inside the node (NVLS-tree across nodes); Simple protocol only.

        NCCL's estimate: busBw = min(NVLink, network (halved beyond 2 nodes)) x 5/6 (tuning.cc); the
        calibrated time uses the switch's measured all-reduce rate (`NvlsParams.efficiency`)."""
        q = self.p.nvls
        algbw, nccl_gbps = shape.nvls_gbps, shape.intra_gbps
        lat_us = q.hop_us
        name = "nvls"
        fill = self._fill_s(q.window_bytes, 1, size, algbw)
        if shape.multi_node:
            name = "nvls_tree"
            net_gbps = shape.node_net_gbps * (1.0 if shape.nodes == 2 else 0.5)
            nccl_gbps = min(nccl_gbps, net_gbps)
            net_gbps *= self._tree_efficiency(shape.nodes)
            algbw = min(algbw, net_gbps)
            link = self.p.link(shape.net_link)
            hop = link.nvls_tree_hop_us if link.nvls_tree_hop_us is not None else link.tree_hop_us.simple
            lat_us += 2 * _log2_ceil(shape.nodes) * hop
            # the tree's hops across nodes each hold a Simple chunk in flight before data streams
            fill += self._fill_s(self._net_window(shape, "simple"), 2 * _log2_ceil(shape.nodes), size, net_gbps)
        nccl_s = lat_us * 1e-6 + size / (nccl_gbps * q.nccl_ratio * 1e9)
        t = (self._launch_us(shape) + lat_us) * 1e-6 + size / (algbw * 1e9) + fill
        return CommChoice(name, "simple", t), nccl_s

    def _p2p(self, size: float, transfer_s_at_simple: float, link: str) -> CommChoice:
        """NCCL p2p: Simple, or LL (at LL's bandwidth factor) up to NCCL_P2P_LL_THRESHOLD where faster."""
        q = self.p.p2p
        protocols = ["simple"]  # NCCL's p2p path always has Simple
        if size <= q.ll_threshold_bytes and "ll" in self.protocols:
            protocols.append("ll")
        options = [CommChoice("p2p", pr, (self.p.launch_us + q.base_us + self._hop_us(link, False, pr)) * 1e-6
                              + transfer_s_at_simple / (q.efficiency * self.p.protocol(pr).bw_factor))
                   for pr in protocols]
        return min(options, key=lambda o: o.time_s)

    def _send_recv(self, size: float, ranks: tuple[int, ...], shape: _Shape) -> CommChoice:
        """First rank to second (two ranks) or a ring shift (every rank sends `size` to the next at once)."""
        gpn = self.cluster.gpus_per_node
        nxt = ranks[1:] + ranks[:1]
        pairs = [(ranks[0], ranks[1])] if len(ranks) == 2 else list(zip(ranks, nxt, strict=True))
        crossing = Counter(a // gpn for a, b in pairs if a // gpn != b // gpn)
        gbps = shape.intra_gbps if len(crossing) < len(pairs) else math.inf
        if crossing:  # each crossing sender uses its rail; senders of one node share the node's NICs
            gbps = min(gbps, shape.rail_gbps, shape.node_net_gbps / max(crossing.values()))
        link = shape.net_link if crossing else shape.intra_link
        return self._p2p(size, size / (gbps * 1e9), link)

    def _all_to_all(self, size: float, shape: _Shape, remote_share: float = 1.0) -> CommChoice:
        """Every rank sends size/n to each peer: NVLink carries the on-node share, the NICs the rest (a two-hop
        dispatch, `remote_share` < 1: the NICs carry that share of it and NVLink forwards it on, see
        `_all_to_all_bytes`)."""
        n, k = shape.n, shape.per_node
        intra, net = _all_to_all_bytes(size, n, k, shape.multi_node, remote_share)
        intra_s = intra / (shape.intra_gbps * 1e9) if k > 1 else 0.0
        inter_s = net / (shape.node_net_gbps * 1e9) if shape.multi_node else 0.0
        link = shape.net_link if shape.multi_node else shape.intra_link
        return self._p2p(size, max(intra_s, inter_s), link)


# --------------------------------------------------------------------------------------------------
# Hierarchical alpha-beta (the earlier model)
# --------------------------------------------------------------------------------------------------

COLLECTIVE_BASE_S = 5.0e-6  # NCCL kernel launch + proxy wake-up per collective
DEFAULT_LINK_EFFICIENCY = {"nvlink": 0.78, "nvswitch": 0.78, "infiniband": 0.90, "ethernet": 0.85,
                           "pcie": 0.85, "qpi": 0.85}


@dataclass
class HierarchicalAlphaBeta:
    """Alpha-beta collectives over a multi-level topology (the two-level case included).

    At each level i the group has a fan-out f_i; collectives run hierarchically and rail-parallel,
    chunks pipeline across levels, so the bandwidth term is the slowest level's and latencies add:
    all-reduce T = max_i 2 (f_i-1)/f_i * S_i / B_i + sum_i 2 (f_i-1) alpha_i; all-gather and
    reduce-scatter half of that; B_i = level bandwidth x link efficiency; plus COLLECTIVE_BASE_S.
    """

    cluster: Cluster
    link_efficiency: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_LINK_EFFICIENCY))
    base_s: float = COLLECTIVE_BASE_S

    def fanouts(self, ranks: tuple[int, ...]) -> list[int]:
        """Fan-out of the group at each topology level (product = group size)."""
        out, prev, domain = [], len(set(ranks)), 1
        for level in self.cluster.levels:
            domain *= level.size
            n = len({r // domain for r in ranks})
            out.append(max(1, prev // max(n, 1)))
            prev = n
        return out

    def _bw(self, i: int, concurrency: int) -> float:
        level = self.cluster.levels[i]
        eff = self.link_efficiency.get(level.name, 0.85)
        return level.bandwidth_gbps * 1e9 * eff / max(1, concurrency)

    def time(self, collective: str, size_bytes: float, group: tuple[int, ...], concurrency: int = 1) -> float:
        n = len(group)
        if n <= 1 or size_bytes <= 0:
            return 0.0
        levels = self.cluster.levels
        if collective == "send_recv":
            i = self.cluster.level_of(group[0], group[1])
            return self.base_s + levels[i].latency_s + size_bytes / self._bw(i, concurrency)
        f = self.fanouts(group)
        bw_terms, lat = [], 0.0
        shrink = 1.0
        for i, fi in enumerate(f):
            if fi <= 1:
                continue
            s_i = size_bytes / shrink
            b = self._bw(i, concurrency)
            if collective == "all_reduce":
                bw_terms.append(2 * (fi - 1) / fi * s_i / b)
                lat += 2 * (fi - 1) * levels[i].latency_s
            elif collective in ("all_gather", "reduce_scatter"):
                bw_terms.append((fi - 1) / fi * s_i / b)
                lat += (fi - 1) * levels[i].latency_s
            elif collective == "all_to_all":
                reached = (fi - 1) * shrink / n  # share of peers first reached through this level
                bw_terms.append(size_bytes * reached / b)
                lat += levels[i].latency_s
            elif collective in ("broadcast", "reduce"):
                bw_terms.append(s_i / b if shrink == 1.0 else 0.0)
                lat += (fi - 1) * levels[i].latency_s
            else:
                raise ValueError(f"unknown collective {collective}")
            shrink *= fi
        if collective in ("broadcast", "reduce"):
            slowest = min(self._bw(i, concurrency) for i, fi in enumerate(f) if fi > 1)
            return self.base_s + lat + size_bytes / slowest
        return self.base_s + lat + max(bw_terms, default=0.0)
