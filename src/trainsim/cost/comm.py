"""Communication cost model: alpha-beta collectives over the cluster's level hierarchy.

A group named by mesh axes is mapped onto the topology: at each level i the group has a fan-out
f_i (how many level-(i-1) domains of the group one level-i domain joins). Collectives run
hierarchically (reduce-scatter up the levels, all-gather back down, rail-parallel: at level i
each rank carries 1/prod(f_j, j<i) of the data over its own share of that level's links).
Chunks pipeline across levels, so the bandwidth term is the slowest level's (ASTRA-sim 2.0's
analytical backend; Rashidi et al.) and latencies add up:

  all-reduce      T = max_i 2 (f_i-1)/f_i * S_i / B_i  +  sum_i 2 (f_i-1) alpha_i
  all-gather / reduce-scatter: half of that (S = the gathered / the input size per rank)
  all-to-all      T = max_i S * (share of peers reached over level i) / B_i + sum_i alpha_i
  send/recv       T = S / B_level + alpha_level

B_i is the level's per-GPU bandwidth times LINK_EFFICIENCY (what NCCL reaches: ~0.78 of NVLink
on A100/H100 NVSwitch systems, from the nccl-tests rows in shared/validation/collectives.csv;
0.9 of InfiniBand line rate) and every collective pays a launch base of COLLECTIVE_BASE_S.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from ..hardware.cluster import Cluster

COLLECTIVE_BASE_S = 5.0e-6  # NCCL kernel launch + proxy wake-up per collective
DEFAULT_LINK_EFFICIENCY = {"nvlink": 0.78, "nvswitch": 0.78, "infiniband": 0.90, "ethernet": 0.85,
                           "pcie": 0.85, "qpi": 0.85}


class CommModel(Protocol):
    def time(self, collective: str, size_bytes: float, group: tuple[int, ...], concurrency: int = 1) -> float: ...


@dataclass
class HierarchicalAlphaBeta:
    """Alpha-beta collectives over a multi-level topology (the two-level case included)."""

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
