"""One-machine profile -> data-parallel training at N ranks (PerfEstimator): compute from the replayed
profile, gradient synchronisation re-costed for groups of N on the target network, compute/sync overlap
from the replay's dependencies; p_n = p_1 * (n / r) * alpha with alpha = t_1 / t_n (r: the profile's ranks).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from ..replay import GraphEdit, read_traces, replay
from ..trace.kineto import KinetoTrace
from .edits import CommCost, recost_network, share_host_cores


@dataclass(frozen=True)
class ScalePoint:
    """Predicted data-parallel training at `ranks` ranks (on `nodes` nodes)."""

    ranks: int
    nodes: int
    step_ms: float
    alpha: float  # scaling factor: profile step time / step time at this scale
    throughput_x: float  # samples/s relative to the profile (= ranks / profile ranks * alpha)


@dataclass
class ScaleResult:
    """The profile's replayed step time and the prediction at each scale."""

    paths: list[str]
    profile_ranks: int
    measured_step_ms: float
    profile_step_ms: float
    network: str
    points: list[ScalePoint]
    assumptions: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"kind": "scale", "paths": self.paths, "profile_ranks": self.profile_ranks,
                "measured_step_ms": self.measured_step_ms, "profile_step_ms": self.profile_step_ms,
                "network": self.network,
                "points": [{"ranks": p.ranks, "nodes": p.nodes, "step_ms": p.step_ms, "alpha": p.alpha,
                            "throughput_x": p.throughput_x} for p in self.points],
                "assumptions": self.assumptions}


def scale(paths: Sequence[str | Path | KinetoTrace], comm: CommCost, network: str, ranks: Sequence[int],
          ranks_per_node: int, cores_per_node: int | None = None,
          progress: Callable[[int, int], None] | None = None) -> ScaleResult:
    """Predict the step time at each rank count from a profile of one node (its ranks' traces)."""
    traces = read_traces(list(paths))
    r0 = max(len(traces), traces[0].world_size or 1)
    if not any(len(t.collectives) for t in traces):
        raise ConfigError(traces[0].path, "has no collectives to scale (no gradient all-reduce was profiled)",
                          "profile the job under DistributedDataParallel (a world size of 1 is enough)")
    base_edits: list[GraphEdit] = []
    if cores_per_node is not None:
        base_edits.append(share_host_cores(cores_per_node, min(r0, ranks_per_node)))
    base = replay(traces, edits=base_edits)
    if not any(len(rk.rg.coll_task) for rk in base.graphs.ranks):  # type: ignore[union-attr]
        raise ConfigError(traces[0].path, "its collectives launch no work the replay can re-cost (e.g. NCCL "
                          "with one rank launches no kernel)",
                          "profile on two or more GPUs, or with the gloo backend for a CPU job")
    points: list[ScalePoint] = []
    for i, n in enumerate(ranks):
        if n < 1:
            raise ConfigError("--ranks", f"must be >= 1, got {n}", "pass rank counts such as 1,2,4")
        edits = [recost_network(comm, network, group=n)] if n != r0 else []
        if cores_per_node is not None:
            edits.append(share_host_cores(cores_per_node, min(n, ranks_per_node)))
        res = replay(traces, edits=edits) if edits else base
        alpha = base.step_ms / res.step_ms if res.step_ms > 0 else 0.0
        points.append(ScalePoint(n, -(-n // ranks_per_node), res.step_ms, alpha, n / r0 * alpha))
        if progress is not None:
            progress(i + 1, len(ranks))
    notes = [*base.assumptions]
    if cores_per_node is None and all(t.platform == "cpu" for t in traces):
        notes.append("CPU job without --cores-per-node: host work is not slowed by other ranks on the node")
    return ScaleResult(base.paths, r0, base.measured_step_ms, base.step_ms, network, points, notes)


__all__ = ["ScalePoint", "ScaleResult", "scale"]
