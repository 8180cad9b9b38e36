"""One collective on its own, as `trainsim collective` prices it (nccl-tests style micro-benchmark).

Two models: `analytical` runs ASTRA-sim's multi-dimensional collectives (`multidim.py`) over any
topology; `nccl` prices the call the way NCCL's tuner would on a GPU cluster preset (`comm.NcclComm`).
Both report the time, nccl-tests algbw/busbw and, per dimension, the bytes each NPU sends there and
how long that dimension is busy.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from ..hardware.cluster import Cluster, Level
from ..hardware.topology import format_topology
from ..limits import MAX_MESSAGE_BYTES
from .collective_gap import Gap, explain
from .comm import NcclComm, _ring_steps
from .multidim import (
    COLLECTIVES,
    AnalyticalComm,
    CollectiveResult,
    DimResult,
    bus_factor,
)
from .semantics import NCCL, Semantics, astra

_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str) -> float:
    """'1073741824', '1GiB', '64MiB', '1e9', '500MB' -> bytes; ValueError naming the fix."""
    m = _SIZE.match(str(text))
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise ValueError(f"--bytes '{text}' is not a size: write e.g. 1073741824, 1GiB, 64MiB or 500MB")
    value = float(m.group(1)) * _UNITS[unit]
    if not 1 <= value <= MAX_MESSAGE_BYTES:
        raise ValueError(f"--bytes '{text}' must be 1 B to {MAX_MESSAGE_BYTES / 2**50:g} PiB")
    if value != math.floor(value):
        raise ValueError(f"--bytes '{text}' is {value:g} B, not a whole number of bytes")
    return value


@dataclass(frozen=True)
class CollectiveReport:
    """What `trainsim collective` prints and writes as JSON."""

    result: CollectiveResult
    model: str
    topology: str
    scheduler: str
    choice: str  # NCCL's (algorithm, protocol), or the per-dimension algorithms

    def as_dict(self) -> dict[str, object]:
        r = self.result
        return {
            "op": r.op, "bytes": r.size_bytes, "npus": r.npus, "model": self.model, "topology": self.topology,
            "scheduler": self.scheduler, "algorithm": self.choice,
            "time_us": r.time_s * 1e6, "algbw_gbps": r.algbw_gbps, "busbw_gbps": r.busbw_gbps,
            "per_dim": [{"dim": d.index + 1, "block": d.kind, "size": d.size, "algorithm": d.algorithm,
                         "bytes": d.bytes_sent, "time_us": d.busy_s * 1e6, "bandwidth_gbps": d.bandwidth_gbps,
                         "latency_ns": d.latency_s * 1e9} for d in r.per_dim],
        }


def analytical_collective(op: str, size_bytes: float, levels: tuple[Level, ...], scheduler: str = "baseline",
                          chunks: int = 64, algorithms: dict[int, str] | None = None, peer: int = 1,
                          semantics: Semantics = NCCL) -> CollectiveReport:
    """ASTRA-sim-style collective over every NPU of the topology (send/recv: NPU 0 to `peer`), in NCCL's
    semantics or ASTRA-sim's (`semantics`)."""
    model = analytical_model(levels, scheduler, chunks, algorithms, semantics)
    npus = math.prod(lv.size for lv in levels)
    group = (0, peer) if op == "send_recv" else tuple(range(npus))
    res = model.run(op, size_bytes, group)
    algos = ",".join(d.algorithm for d in res.per_dim)
    name = "analytical" if semantics.is_nccl else f"analytical, {semantics.name} semantics"
    return CollectiveReport(res, name, format_topology(levels), scheduler, algos)


def analytical_model(levels: tuple[Level, ...], scheduler: str = "baseline", chunks: int = 64,
                     algorithms: dict[int, str] | None = None, semantics: Semantics = NCCL) -> AnalyticalComm:
    return AnalyticalComm(levels, scheduler=scheduler, chunks=chunks, algorithms=dict(algorithms or {}),
                          semantics=semantics)


def collective_gap(op: str, size_bytes: float, levels: tuple[Level, ...], scheduler: str = "baseline",
                   chunks: int = 64, algorithms: dict[int, str] | None = None,
                   semantics: Semantics | None = None) -> Gap:
    """ASTRA-sim's time and the NCCL-like time of one collective over every NPU, and the terms between them."""
    model = analytical_model(levels, scheduler, chunks, algorithms)
    group = tuple(range(math.prod(lv.size for lv in levels)))
    return explain(lambda sem: replace(model, semantics=sem).run(op, size_bytes, group).time_s,
                   semantics or astra())


def nccl_collective(op: str, size_bytes: float, cluster: Cluster, ranks: int, comm: NcclComm | None = None,
                    peer: int = 1) -> CollectiveReport:
    """NCCL-like choice of algorithm and protocol for a group of the first `ranks` GPUs of `cluster`.

    Per level: the bytes each rank sends over it for a ring-shaped schedule (the share of ring edges
    that cross that level) and how long the level's bandwidth needs for them."""
    if op not in COLLECTIVES:
        raise ValueError(f"--op '{op}' is not one of {', '.join(COLLECTIVES)}")
    model = comm or NcclComm(cluster)
    group = (0, peer) if op == "send_recv" else tuple(range(ranks))
    choice = model.choose(op, size_bytes, group)
    n = len(group)
    per_dim = []
    span = 1
    prev = n
    levels = [lv for lv in cluster.levels if lv.size > 1]
    for i, lv in enumerate(levels):
        span *= lv.size
        outer = len({r // span for r in group})
        edges = prev - outer if n > 1 else 0  # ring edges that first leave a block at this level
        prev = outer
        if op == "send_recv":
            moved = size_bytes if (group[0] // (span // lv.size)) != (group[1] // (span // lv.size)) and \
                group[0] // span == group[1] // span else 0.0
        else:
            _, factor = _ring_steps(op, n) if op not in ("all_to_all",) else (0, (n - 1) / n)
            moved = factor * size_bytes * edges / n if n > 1 else 0.0
        per_dim.append(DimResult(i, lv.kind, lv.size, f"{choice.algorithm}/{choice.protocol}", moved,
                                 moved / (lv.bandwidth_gbps * 1e9), lv.bandwidth_gbps, lv.latency_s))
    res = CollectiveResult(op, size_bytes, n, choice.time_s, tuple(per_dim))
    return CollectiveReport(res, "nccl", format_topology(levels), "nccl", f"{choice.algorithm}/{choice.protocol}")


__all__ = ["CollectiveReport", "analytical_collective", "analytical_model", "bus_factor", "collective_gap",
           "nccl_collective", "parse_bytes"]
