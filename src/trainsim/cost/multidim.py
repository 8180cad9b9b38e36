"""Topology-aware collectives on multi-dimensional topologies (ASTRA-sim 2.0's analytical backend).

A topology is a stack of dimensions, each a building block with its own algorithm (ASTRA-sim 2.0
Table I): Ring -> ring, FullyConnected -> direct, Switch -> halving-doubling; a switch may also run
a double binary tree or reduce in the switch (NVLS/SHARP-like). A collective runs multi-rail and
hierarchically: reduce-scatter up the dimensions, the last dimension all-reduces, all-gather back
down (an all-gather alone runs outermost first, so the innermost, fastest dimension carries the
most data). The buffer is split into chunks that pipeline across dimensions; each dimension serves
one chunk phase at a time, so the slowest dimension dominates. A chunk phase costs
steps x hops x latency + bytes / bandwidth (the analytical backend's equation per message).

Schedulers: `baseline` sends every chunk through the dimensions in the same order; `themis`
(Rashidi et al., ISCA 2022) gives each chunk its own order, putting its heaviest phase on the
dimension with the least load so far, which balances load over dimensions.

Sizes follow nccl-tests: all-reduce / broadcast / reduce = the buffer, all-gather = gathered
output per NPU, reduce-scatter = input per NPU, all-to-all = send buffer per NPU, send/recv =
bytes sent. Bandwidth is per NPU per direction in each dimension (GB/s = 1e9 B/s), latency per hop.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..hardware.cluster import Level
from ..hardware.topology import fanouts
from .semantics import NCCL, Semantics, algorithm_steps, links_per_npu, phase_ns, whole

BLOCK_ALGORITHM = {"ring": "ring", "fc": "direct", "switch": "halving_doubling", "bus": "ring"}
"""Default topology-aware algorithm of each building block (ASTRA-sim 2.0 Table I)."""

ALGORITHMS: tuple[str, ...] = ("ring", "direct", "halving_doubling", "double_binary_tree", "in_switch")
SWITCH_ONLY: frozenset[str] = frozenset({"in_switch"})
COLLECTIVES: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast",
                                "reduce", "send_recv")
SCHEDULERS: tuple[str, ...] = ("baseline", "themis")
DEFAULT_CHUNKS = 64  # chunks per collective (ASTRA-sim's preferred dataset splits in the Themis study)


@dataclass(frozen=True)
class DimResult:
    """What one dimension did in a collective: per-NPU bytes sent, busy time, algorithm."""

    index: int
    kind: str
    size: int
    algorithm: str
    bytes_sent: float
    busy_s: float
    bandwidth_gbps: float
    latency_s: float


@dataclass(frozen=True)
class CollectiveResult:
    """A collective's time and its nccl-tests bandwidths, with the per-dimension breakdown."""

    op: str
    size_bytes: float
    npus: int
    time_s: float
    per_dim: tuple[DimResult, ...] = field(default_factory=tuple)

    @property
    def algbw_gbps(self) -> float:
        return self.size_bytes / self.time_s / 1e9 if self.time_s > 0 else math.inf

    @property
    def busbw_gbps(self) -> float:
        return self.algbw_gbps * bus_factor(self.op, self.npus)


def bus_factor(op: str, n: int) -> float:
    """nccl-tests busbw / algbw: 2(n-1)/n for all-reduce, (n-1)/n for gathers/scatters/all-to-all, else 1."""
    if n <= 1:
        return 1.0
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def _log2c(k: int) -> int:
    return max(1, math.ceil(math.log2(k))) if k > 1 else 0


def phase_cost(algorithm: str, phase: str, k: int, data_bytes: float) -> tuple[float, int]:
    """(bytes each NPU sends, sequential steps) of one phase on a block of k NPUs.

    `data_bytes` is the phase's full per-NPU buffer: the input of a reduce-scatter, the output of
    an all-gather, the buffer of an all-reduce / broadcast / reduce, the send buffer of an all-to-all.
    """
    if k <= 1:
        return 0.0, 0
    frac = (k - 1) / k
    if phase in ("rs", "ag"):
        steps = {"ring": k - 1, "direct": 1, "halving_doubling": _log2c(k), "double_binary_tree": _log2c(k),
                 "in_switch": 1}[algorithm]
        return data_bytes * frac, steps
    if phase == "ar":
        if algorithm == "in_switch":  # reduce on the way up, multicast on the way down: D each direction
            return data_bytes, 1
        steps = {"ring": 2 * (k - 1), "direct": 2, "halving_doubling": 2 * _log2c(k),
                 "double_binary_tree": 2 * _log2c(k)}[algorithm]
        return 2 * data_bytes * frac, steps
    if phase == "a2a":
        if algorithm == "ring":  # shortest way round a bidirectional ring: sum of distances / 2 directions
            hops = sum(min(d, k - d) for d in range(1, k))
            return data_bytes / k * hops / 2, k // 2
        return data_bytes * frac, 1
    if phase == "bcast":  # pipelined chain (ring) or tree: every NPU forwards the buffer once
        steps = {"ring": k - 1, "direct": 1}.get(algorithm, _log2c(k))
        return data_bytes, steps
    raise ValueError(f"unknown phase {phase}")


@dataclass(frozen=True)
class Dimension:
    """One dimension as a collective uses it."""

    kind: str
    size: int
    bandwidth_gbps: float  # the NPU's, per direction, over all its links in this dimension
    latency_s: float
    algorithm: str
    links: int = 1  # links per NPU per direction (one per peer on FC): a link carries bandwidth / links

    @classmethod
    def of(cls, level: Level, algorithm: str | None = None, size: int | None = None) -> Dimension:
        algo = algorithm or BLOCK_ALGORITHM[level.kind]
        if algo not in ALGORITHMS:
            raise ValueError(f"algorithm '{algo}' is not one of {', '.join(ALGORITHMS)}")
        if algo in SWITCH_ONLY and level.kind != "switch":
            raise ValueError(f"algorithm '{algo}' needs a Switch dimension, not {level.kind}: use "
                             f"'{BLOCK_ALGORITHM[level.kind]}' there")
        return cls(level.kind, level.size if size is None else size, level.bandwidth_gbps, level.latency_s, algo,
                   links_per_npu(level.kind, level.size))

    @property
    def link_gbps(self) -> float:
        return self.bandwidth_gbps / self.links


def _stages(op: str, order: Sequence[int], local_bw_aware: bool = True) -> list[tuple[int, str]]:
    """(dimension, phase) sequence of one chunk, given its reduce-scatter order of dimensions."""
    if op == "all_reduce" and not local_bw_aware:  # ASTRA-sim's collective-optimization "baseline"
        return [(d, "ar") for d in order]
    if op == "all_reduce":
        *up, top = order
        return [(d, "rs") for d in up] + [(top, "ar")] + [(d, "ag") for d in reversed(up)]
    if op == "reduce_scatter":
        return [(d, "rs") for d in order]
    if op == "all_gather":
        return [(d, "ag") for d in reversed(order)]
    if op == "all_to_all":
        return [(d, "a2a") for d in order]
    if op in ("broadcast", "reduce"):
        return [(d, "bcast") for d in order]
    raise ValueError(f"unknown collective '{op}'")


def _chunk_phases(op: str, dims: Sequence[Dimension], order: Sequence[int], chunk_bytes: float,
                  sem: Semantics = NCCL) -> list[tuple[int, float, float, float]]:
    """(dimension, busy seconds, delay seconds, bytes sent) per stage of one chunk.

    Reduce-scatter phases shrink the buffer by the dimension's size, all-gather phases grow it back;
    each phase is priced on its full per-NPU buffer (`phase_cost`'s convention), step by step under
    the semantics (`semantics.phase_ns`)."""
    stages = _stages(op, order, sem.local_bw_aware)
    out: list[tuple[int, float, float, float]] = []
    data = chunk_bytes
    if op == "all_gather":  # the chunk is the gathered output: start from the per-NPU input
        data /= math.prod(dims[d].size for d in order)
    for d, ph in stages:
        if ph == "ag":
            data *= dims[d].size
        out.append(_priced(dims[d], d, ph, data, sem))
        if ph == "rs":
            data /= dims[d].size
    return out


def _priced(dim: Dimension, d: int, phase: str, data: float, sem: Semantics) -> tuple[int, float, float, float]:
    """One phase: under NCCL semantics the link is busy for the bytes and the step latencies delay only
    the chunk (propagation); under ASTRA's the chunk holds the dimension for every step."""
    steps = algorithm_steps(dim.algorithm, phase, dim.kind, dim.size, data, sem)
    busy, delay, sent = phase_ns(dim.kind, dim.link_gbps, dim.bandwidth_gbps, dim.latency_s * 1e9, steps, sem)
    return d, busy * 1e-9, delay * 1e-9, sent


def _themis_order(load_s: Sequence[float]) -> list[int]:
    """Themis: a chunk's phases in order of decreasing data go to dimensions in order of increasing
    load so far (reduce-scatter's first phase carries the most; an all-gather runs the order reversed)."""
    return sorted(range(len(load_s)), key=lambda d: (load_s[d], d))


def run_collective(op: str, size_bytes: float, dims: Sequence[Dimension], scheduler: str = "baseline",
                   chunks: int = DEFAULT_CHUNKS, semantics: Semantics = NCCL) -> CollectiveResult:
    """Time one collective over `dims` (innermost first); see the module docstring for the model and
    `semantics` for the NCCL-like and ASTRA-sim settings of its terms."""
    if op not in COLLECTIVES or op == "send_recv":
        raise ValueError(f"collective '{op}' is not one of {', '.join(c for c in COLLECTIVES if c != 'send_recv')}")
    if scheduler not in SCHEDULERS:
        raise ValueError(f"scheduler '{scheduler}' is not one of {', '.join(SCHEDULERS)}")
    if chunks < 1:
        raise ValueError(f"chunks must be >= 1, got {chunks}")
    active = [i for i, d in enumerate(dims) if d.size > 1]
    npus = math.prod(d.size for d in dims)
    if not active or size_bytes <= 0:
        return CollectiveResult(op, size_bytes, npus, 0.0, tuple(
            DimResult(i, d.kind, d.size, d.algorithm, 0.0, 0.0, d.bandwidth_gbps, d.latency_s)
            for i, d in enumerate(dims)))
    chunk_bytes = size_bytes / chunks
    splits = chunks
    if semantics.truncate_ns:
        # ASTRA-sim (Sys::determine_chunk_size): chunk = comm_size // splits in whole bytes (an all-gather's
        # comm_size is its input per rank), every chunk carries a full chunk, so a remainder adds a chunk
        per = npus if op == "all_gather" else 1
        comm = whole(size_bytes / per)
        piece = max(1.0, whole(comm / chunks))
        chunk_bytes = piece * per
        chunks = max(1, math.ceil(comm / piece - 1e-9))
    if semantics.chunk_floor_npus and op != "all_gather" and chunk_bytes < npus:
        chunk_bytes = float(npus)  # ASTRA-sim raises a chunk below npus bytes to npus bytes, `splits` of them
        chunks = splits
    if semantics.astra_tree and any(dims[i].algorithm == "double_binary_tree" for i in active):
        from .astra_tree import tree_collective

        return tree_collective(op, size_bytes, dims, active, chunks, chunk_bytes, semantics)
    load = [0.0] * len(dims)
    sent = [0.0] * len(dims)
    plans: list[list[tuple[int, float, float, float]]] = []
    base = _chunk_phases(op, dims, active, chunk_bytes, semantics) if scheduler == "baseline" else None
    for _ in range(chunks):
        if base is not None:
            plan = base
        else:
            order = [active[j] for j in _themis_order([load[i] for i in active])]
            plan = _chunk_phases(op, dims, order, chunk_bytes, semantics)
        for d, busy, _lat, b in plan:
            load[d] += busy
            sent[d] += b
        plans.append(plan)
    queue_of = _queue_allocation(op, plans, semantics.queues_per_dim, semantics.local_bw_aware)
    capacity = math.ceil(semantics.active_chunks_per_dim / semantics.queues_per_dim)
    time_s = _pipeline(plans, queue_of, smallest_first=scheduler == "themis", capacity=capacity)
    per_dim = tuple(DimResult(i, d.kind, d.size, d.algorithm, sent[i], load[i], d.bandwidth_gbps, d.latency_s)
                    for i, d in enumerate(dims))
    return CollectiveResult(op, size_bytes, npus, time_s, per_dim)


def _queue_allocation(op: str, plans: list[list[tuple[int, float, float, float]]], queues: int,
                      local_bw_aware: bool = True) -> list[list[tuple[int, int]]]:
    """(dimension, queue) of each phase of each chunk: ASTRA-sim hands a dimension's queues round-robin
    to the chunks, an all-reduce's reduce-scatter and all-reduce phases to the first half and its
    all-gather phases to the second half (one queue: every phase of a dimension shares it)."""
    if queues == 1:
        return [[(d, 0) for d, *_ in plan] for plan in plans]
    first, last = max(1, queues // 2), queues - queues // 2
    out = []
    for c, plan in enumerate(plans):
        row = []
        top = len(plan) // 2 if local_bw_aware else len(plan)  # the all-reduce phase: the turning point
        for j, (d, *_) in enumerate(plan):
            if op != "all_reduce":
                row.append((d, c % queues))
            elif j <= top:
                row.append((d, c % first))
            else:
                row.append((d, queues // 2 + c % last))
        out.append(row)
    return out


def _pipeline(plans: list[list[tuple[int, float, float, float]]], queue_of: list[list[tuple[int, int]]],
              smallest_first: bool, capacity: int = 1) -> float:
    """Finish time when chunks flow through their stages and each queue serves `capacity` phases at a
    time (non-preemptive; with one queue per dimension, one phase per dimension); a phase's delay holds
    only its chunk. A free queue takes the earliest-arrived phase (FIFO) or, with `smallest_first`, the
    shortest one (Themis' intra-dimension smallest-chunk-first policy, which keeps the other dimensions fed)."""
    waiting: dict[tuple[int, int], list[tuple[float, float, int, int]]] = {}
    free: dict[tuple[int, int], int] = {}
    events: list[tuple[float, int, int, int, tuple[int, int]]] = [(0.0, 0, c, 0, queue_of[c][0])
                                                                  for c in range(len(plans))]
    heapq.heapify(events)  # (time, kind 0 = stage ready / 1 = queue free, chunk, stage, queue)
    finish = 0.0
    while events:
        now, kind, a, b, q = heapq.heappop(events)
        if kind == 0:
            busy = plans[a][b][1]
            heapq.heappush(waiting.setdefault(q, []), ((busy if smallest_first else now), now, a, b))
        else:
            free[q] = free.get(q, capacity) + 1
        queue = waiting.get(q)
        while queue and free.get(q, capacity):
            _, _, c, j = heapq.heappop(queue)
            _, busy, lat, _ = plans[c][j]
            free[q] = free.get(q, capacity) - 1
            heapq.heappush(events, (now + busy, 1, c, j, q))
            end = now + busy + lat
            if j + 1 < len(plans[c]):
                heapq.heappush(events, (end, 0, c, j + 1, queue_of[c][j + 1]))
            elif end > finish:
                finish = end
    return finish


def send_recv(size_bytes: float, dims: Sequence[Dimension], src: int, dst: int) -> CollectiveResult:
    """Point-to-point: the message crosses each dimension where the coordinates differ, store-and-forward
    in chunks, so the slowest crossed dimension sets the rate and the hop latencies add."""
    npus = math.prod(d.size for d in dims)
    for r in (src, dst):
        if not 0 <= r < npus:
            raise ValueError(f"rank {r} is outside the topology's {npus} NPUs: pick 0..{npus - 1}")
    per_dim = []
    lat, slowest = 0.0, math.inf
    a, b = src, dst
    for i, d in enumerate(dims):
        ca, cb = a % d.size, b % d.size
        a //= d.size
        b //= d.size
        moved = size_bytes if ca != cb else 0.0
        if ca != cb:
            dist = abs(ca - cb)
            hops = min(dist, d.size - dist) if d.kind == "ring" else (2 if d.kind == "switch" else 1)
            lat += hops * d.latency_s
            slowest = min(slowest, d.bandwidth_gbps)
        busy = moved / (d.bandwidth_gbps * 1e9) if moved else 0.0
        per_dim.append(DimResult(i, d.kind, d.size, "p2p", moved, busy, d.bandwidth_gbps, d.latency_s))
    t = lat + (size_bytes / (slowest * 1e9) if slowest < math.inf else 0.0)
    return CollectiveResult("send_recv", size_bytes, 2, t, tuple(per_dim))


@dataclass
class AnalyticalComm:
    """`CommModel` over a topology's levels with ASTRA-sim's multi-dimensional collectives.

    A group uses the dimensions it spans, each with the group's fan-out there (a group of 4 on a
    Ring(8) runs a 4-NPU ring at that ring's bandwidth). `algorithms` overrides the per-block
    default by dimension index. Bandwidth is per NPU in every dimension, so groups on disjoint NPUs
    (`concurrency`) do not slow each other here, as in ASTRA-sim's congestion-free analytical backend.
    """

    levels: tuple[Level, ...]
    scheduler: str = "baseline"
    chunks: int = DEFAULT_CHUNKS
    algorithms: dict[int, str] = field(default_factory=dict)
    semantics: Semantics = NCCL
    op_algorithms: dict[str, dict[int, str]] = field(default_factory=dict)  # per collective, over `algorithms`

    def dims_for(self, ranks: Sequence[int], op: str | None = None) -> list[Dimension]:
        algos = {**self.algorithms, **self.op_algorithms.get(op or "", {})}
        return [Dimension.of(lv, algos.get(i), size=f)
                for i, (lv, f) in enumerate(zip(self.levels, fanouts(self.levels, ranks), strict=True))]

    def run(self, collective: str, size_bytes: float, group: Sequence[int], concurrency: int = 1) -> CollectiveResult:
        ranks = list(dict.fromkeys(group))
        if collective == "send_recv":
            if len(ranks) < 2:
                return CollectiveResult("send_recv", size_bytes, len(ranks), 0.0)
            return send_recv(size_bytes, [Dimension.of(lv) for lv in self.levels], ranks[0], ranks[1])
        return run_collective(collective, size_bytes, self.dims_for(ranks, collective), self.scheduler, self.chunks,
                              self.semantics)

    def time(self, collective: str, size_bytes: float, group: tuple[int, ...], concurrency: int = 1) -> float:
        if len(set(group)) <= 1 or size_bytes <= 0:
            return 0.0
        return self.run(collective, size_bytes, group, concurrency).time_s


__all__ = ["ALGORITHMS", "AnalyticalComm", "BLOCK_ALGORITHM", "COLLECTIVES", "CollectiveResult", "DimResult",
           "Dimension", "SCHEDULERS", "bus_factor", "fanouts", "phase_cost", "run_collective", "send_recv"]
