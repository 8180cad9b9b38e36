"""ASTRA-sim's multi-dimensional topology notation <-> trainsim's interconnect levels.

`Ring(4)_FC(2)_Switch(8)` stacks building blocks innermost first, one per dimension (ASTRA-sim 2.0,
section IV-A): `Ring(k)`, `FullyConnected(k)` (also `FC(k)`) and `Switch(k)`. Each dimension gets its
own bandwidth (GB/s per NPU, one direction) and latency (ns per hop), given as comma lists in the same
order, as ASTRA-sim's network configs take them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from ..limits import MAX_BANDWIDTH_GBPS, MAX_GPUS, MAX_LATENCY_NS, MIN_BANDWIDTH_GBPS
from .cluster import CLUSTERS, Cluster, Level, _canonical_cluster, get_cluster
from .devices import Device, get_device

GIB_PER_S_IN_GBPS = 2**30 / 1e9
"""ASTRA-sim's "GB/s" is 2^30 B/s (its analytical backend converts GB/s with 1 << 30); trainsim's is 1e9 B/s."""

_BLOCKS = {"ring": "ring", "fc": "fc", "fullyconnected": "fc", "switch": "switch"}
_NAMES = {"ring": "Ring", "fc": "FC", "switch": "Switch"}
_DIM = re.compile(r"^([A-Za-z]+)\((\d+)\)$")


def parse_topology(spec: str, bandwidths_gbps: Sequence[float], latencies_ns: Sequence[float]) -> tuple[Level, ...]:
    """Levels of a topology string; ValueError naming the bad part and the fix on any mistake."""
    parts = [p.strip() for p in spec.strip().split("_")] if spec.strip() else []
    if not parts:
        raise ValueError("topology is empty: give dimensions like 'Ring(4)_FC(2)_Switch(8)'")
    kinds, sizes = [], []
    for i, part in enumerate(parts):
        m = _DIM.match(part)
        kind = _BLOCKS.get(m.group(1).lower()) if m else None
        if m is None or kind is None:
            raise ValueError(f"topology dimension {i + 1} '{part}' is not Ring(k), FC(k), FullyConnected(k) or "
                             f"Switch(k): write e.g. 'Ring(4)_FC(2)_Switch(8)'")
        size = int(m.group(2)) if len(m.group(2)) <= 12 else MAX_GPUS + 1  # no 10,000-digit int parsing
        if size < 2:
            raise ValueError(f"topology dimension {i + 1} '{part}' has {size} NPUs: a dimension needs at least 2")
        if size > MAX_GPUS:
            raise ValueError(f"topology dimension {i + 1} '{part[:40]}' has more than {MAX_GPUS:,} NPUs, the limit")
        kinds.append(kind)
        sizes.append(size)
    for what, values in (("bandwidth", bandwidths_gbps), ("latency", latencies_ns)):
        if len(values) != len(parts):
            raise ValueError(f"{what} has {len(values)} value(s) for {len(parts)} topology dimension(s): give one "
                             f"per dimension, innermost first")
    levels = []
    for i, (kind, size, bw, lat) in enumerate(zip(kinds, sizes, bandwidths_gbps, latencies_ns, strict=True)):
        if not bw > 0:
            raise ValueError(f"bandwidth of dimension {i + 1} is {bw}: give a positive GB/s value")
        if not lat >= 0:
            raise ValueError(f"latency of dimension {i + 1} is {lat}: give a latency >= 0 ns")
        levels.append(Level(f"dim{i + 1}", kind, size, float(bw), float(lat) * 1e-9))
    return tuple(levels)


def format_topology(levels: Sequence[Level]) -> str:
    """The ASTRA-sim notation of a level tuple; size-1 levels (a one-node network) are left out, and a
    shared 'bus' level has no building block there."""
    out = []
    for lv in levels:
        if lv.size == 1:
            continue
        if lv.kind not in _NAMES:
            raise ValueError(f"level '{lv.name}' is a {lv.kind}: ASTRA-sim's notation has Ring, FC and Switch only")
        out.append(f"{_NAMES[lv.kind]}({lv.size})")
    return "_".join(out)


@dataclass(frozen=True)
class TopologyPreset:
    """A named topology: notation, per-dimension bandwidth (GB/s per NPU per direction) and latency (ns)."""

    name: str
    spec: str
    bandwidths_gbps: tuple[float, ...]
    latencies_ns: tuple[float, ...]
    description: str
    source: str
    device: str | None = None  # the NPU it is usually built from, where trainsim's catalogue has it

    def levels(self) -> tuple[Level, ...]:
        return parse_topology(self.spec, self.bandwidths_gbps, self.latencies_ns)


def _astra(name: str, spec: str, bw_astra_gbps: Sequence[float], description: str) -> TopologyPreset:
    """A preset from ASTRA-sim 2.0's Table II (its GB/s are GiB/s; 500 ns per hop, the issue's example)."""
    return TopologyPreset(name, spec, tuple(b * GIB_PER_S_IN_GBPS for b in bw_astra_gbps), (500.0,) * len(bw_astra_gbps),
                          description, "ASTRA-sim 2.0 (Won et al., ISPASS 2023) Table II; bandwidth given there "
                          "in GB/s = 2^30 B/s, converted; latency 500 ns per hop is an assumption (not stated)")


_NODE_LATENCY_NS = 1000.0  # NVLink/PCIe hop (hardware/cluster.py NVLINK_LATENCY_S)

TOPOLOGY_PRESETS: Mapping[str, TopologyPreset] = MappingProxyType({p.name: p for p in (
    _astra("wafer-1d-350", "Switch(512)", [350], "wafer-scale proxy W-1D: 512 NPUs on one on-wafer switch"),
    _astra("wafer-1d-500", "Switch(512)", [500], "wafer-scale proxy W-1D at 500 GB/s"),
    _astra("wafer-1d-600", "Switch(512)", [600], "wafer-scale proxy W-1D at 600 GB/s"),
    _astra("wafer-2d", "Switch(32)_Switch(16)", [250, 250], "wafer-scale proxy W-2D: 32 x 16 NPUs"),
    _astra("conv-3d", "Ring(16)_FC(8)_Switch(4)", [200, 100, 50],
           "conventional 3D: on-chip ring, scale-up fully connected, scale-out switch (NIC)"),
    _astra("conv-4d", "Ring(2)_FC(8)_Ring(8)_Switch(4)", [250, 200, 100, 50],
           "conventional 4D: on-package ring, on-node fully connected, scale-up ring, scale-out switch"),
    TopologyPreset("tpuv4-3d-torus", "Ring(4)_Ring(4)_Ring(4)", (50.0, 50.0, 50.0), (1000.0,) * 3,
                   "TPU v4 cube of 64 chips: a 4x4x4 3D torus of ICI links (wraparound through the optical "
                   "circuit switches); 6 ICI links per chip, one per direction of each dimension",
                   "Jouppi et al., ISCA 2023 'TPU v4' (4x4x4 cubes joined by OCS into a 3D torus); 50 GB/s per "
                   "ICI link per direction is an assumption (Google Cloud lists 2,400 Gb/s ICI per v4 chip)"),
    TopologyPreset("pcie-2socket", "Switch(4)_FC(2)", (12.0, 6.0), (2000.0, 3000.0),
                   "two-socket PCIe box: 4 GPUs behind each socket's PCIe switch, sockets joined by QPI",
                   "NCCL topo.h PCI_BW 12 GB/s (Gen3 x16) and BDW_QPI_BW 6 GB/s; as cluster 'pcie-titanxp'",
                   device="titan-xp"),
)})
"""Named topologies; every cluster preset (`trainsim clusters`) is one as well (see `resolve_topology`)."""


def _known_cluster(name: str) -> bool:
    try:
        _canonical_cluster(name)
    except KeyError:
        return False
    return True


def cluster_topology(cluster: Cluster) -> str:
    """A cluster preset's topology in ASTRA-sim notation (e.g. DGX A100 x 4 nodes: Switch(8)_Switch(4))."""
    return format_topology(cluster.levels)


def resolve_topology(spec_or_name: str, bandwidths_gbps: Sequence[float] | None = None,
                     latencies_ns: Sequence[float] | None = None, npus: int | None = None) -> tuple[Level, ...]:
    """Levels from a preset name (topology or cluster preset, sized to `npus` for clusters) or a notation
    string; explicit bandwidths/latencies override a preset's; `npus` must match the product of sizes."""
    key = spec_or_name.strip().lower()
    if npus is not None and npus > MAX_GPUS:
        raise ValueError(f"{npus:,} NPUs were asked for, above the limit of {MAX_GPUS:,}")
    if key in TOPOLOGY_PRESETS:
        pre = TOPOLOGY_PRESETS[key]
        levels = parse_topology(pre.spec, bandwidths_gbps or pre.bandwidths_gbps, latencies_ns or pre.latencies_ns)
    elif _known_cluster(key):
        key = _canonical_cluster(key)
        base = get_cluster(key)
        gpn = base.gpus_per_node
        nodes = 1 if npus is None else max(1, npus // gpn) if npus > gpn else 1
        levels = tuple(lv for lv in get_cluster(key, nodes if base.has_network else 1).levels if lv.size > 1)
        if npus is not None and npus < gpn and len(levels) == 1:
            levels = (Level(levels[0].name, levels[0].kind, npus, levels[0].bandwidth_gbps, levels[0].latency_s),)
        if bandwidths_gbps or latencies_ns:
            n = len(levels)
            levels = parse_topology(format_topology(levels), bandwidths_gbps or [lv.bandwidth_gbps for lv in levels],
                                    latencies_ns or [lv.latency_s * 1e9 for lv in levels][:n])
    else:
        if bandwidths_gbps is None or latencies_ns is None:
            raise ValueError(f"topology '{spec_or_name}' needs --bandwidth and --latency (one value per dimension), "
                             f"or use a preset: {', '.join([*TOPOLOGY_PRESETS, *CLUSTERS])}")
        levels = parse_topology(spec_or_name, bandwidths_gbps, latencies_ns)
    for i, lv in enumerate(levels):
        if not MIN_BANDWIDTH_GBPS <= lv.bandwidth_gbps <= MAX_BANDWIDTH_GBPS:
            raise ValueError(f"dimension {i + 1} bandwidth {lv.bandwidth_gbps:g} GB/s is outside "
                             f"{MIN_BANDWIDTH_GBPS:g}..{MAX_BANDWIDTH_GBPS:g} GB/s: give GB/s per NPU per direction")
        if not 0 <= lv.latency_s * 1e9 <= MAX_LATENCY_NS:
            raise ValueError(f"dimension {i + 1} latency {lv.latency_s * 1e9:g} ns is outside 0..{MAX_LATENCY_NS:g} "
                             f"ns: give ns per hop")
    total = math.prod(lv.size for lv in levels)
    if total > MAX_GPUS:
        raise ValueError(f"topology '{format_topology(levels)}' has {total:,} NPUs, above the limit of {MAX_GPUS:,}: "
                         f"use smaller dimensions")
    if npus is not None and total != npus:
        raise ValueError(f"topology '{format_topology(levels)}' has {total} NPUs but {npus} were asked for: make the "
                         f"product of the dimension sizes equal {npus}")
    return levels


def fanouts(levels: Sequence[Level], ranks: Sequence[int]) -> list[int]:
    """How many distinct coordinates a group of ranks spans in each dimension (ranks innermost-fastest)."""
    out = []
    span = 1
    for lv in levels:
        out.append(len({(r // span) % lv.size for r in ranks}))
        span *= lv.size
    return out


def cluster_from_topology(levels: Sequence[Level], device: str | Device = "a100-80gb", name: str = "topology") -> Cluster:
    """A trainsim cluster over a topology: the last dimension is the scale-out network (one NIC per NPU at
    that dimension's bandwidth), the ones before it live inside a node; one dimension = one box."""
    dev = device if isinstance(device, Device) else get_device(device)
    levels = tuple(levels)
    if len(levels) == 1:
        return Cluster(name, dev, levels[0].size, 1, levels, 0, 0.0, f"{format_topology(levels)} (one box)",
                       "user topology")
    gpn = math.prod(lv.size for lv in levels[:-1])
    net = levels[-1]
    return Cluster(name, dev, gpn, net.size, levels, gpn, net.bandwidth_gbps,
                   f"{format_topology(levels)}: {gpn} NPUs per node, the last dimension is the network",
                   "user topology")


__all__ = ["GIB_PER_S_IN_GBPS", "TOPOLOGY_PRESETS", "TopologyPreset", "cluster_from_topology", "cluster_topology",
           "fanouts", "format_topology", "parse_topology", "resolve_topology"]
