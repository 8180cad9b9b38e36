"""Collective semantics: the terms that separate ASTRA-sim's analytical backends from an NCCL-like model.

One collective cost model (`multidim.run_collective`), two settings of its parameters:

- `nccl` (trainsim's default): a phase keeps a dimension busy for its bytes only, at the NPU's
  bandwidth in that dimension shared by the messages it sends at once; step latencies delay the
  chunk but not the link, so chunks pipeline and latency is paid once per chunk path; no endpoint
  delay, free local reduction, real-valued time, a ring all-to-all takes the shorter way round.
- `astra` (ASTRA-sim 2.0's analytical backends, as `../shared/validation/astra_reference.md`
  reproduces them): a chunk holds a dimension for every step of its phase, latency included; each
  message is priced floor(hops x latency + bytes / link bandwidth) ns plus the endpoint delay, and
  each concurrent message gets a whole link (FC peer links; a switch port in the congestion-unaware
  backend); a reducing step adds 3 x floor(bytes / local-mem-bw) ns; each phase adds one endpoint
  delay; a ring all-to-all goes one way round in k(k-1)/2 neighbour steps; a chunk smaller than the
  group is raised to npus bytes. The congestion-aware backend (1-D) stores and forwards a message
  through a switch: both of its links serialise the bytes, and concurrent sends share the uplink.

Each term is a field, so `trainsim collective --compare astra` can switch them off one at a time and
say how much of the gap each one makes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

SEMANTICS = ("nccl", "astra")
BACKENDS = ("unaware", "aware")
POLICIES = ("LIFO", "FIFO")
RING_A2A = ("shortest", "one_way")


@dataclass(frozen=True)
class Semantics:
    """What one collective's chunks, steps and messages cost (see the module docstring)."""

    name: str = "nccl"
    latency_per_chunk: bool = False  # a chunk holds the dimension for its whole phase, latency included
    per_link_bandwidth: bool = False  # concurrent messages each get a whole link (vs share the NPU's bandwidth)
    endpoint_delay_ns: float = 0.0  # per message (per step) and once per phase
    local_mem_bw_gbps: float | None = None  # reduction cost 3 x bytes / local-mem-bw (None: free)
    truncate_ns: bool = False  # whole ns per message, whole bytes per message
    ring_all_to_all: str = "shortest"  # shortest: both ways round; one_way: k(k-1)/2 neighbour steps
    chunk_floor_npus: bool = False  # a chunk below npus bytes is raised to npus bytes (not all-gather)
    backend: str = "unaware"  # aware: store-and-forward through switches, concurrent sends share the uplink
    queues_per_dim: int = 1  # chunks in flight per dimension (each at full bandwidth when per_link_bandwidth)
    active_chunks_per_dim: int = 1  # chunks admitted at once into the first phase (ASTRA's active chunks)
    scheduling: str = "FIFO"  # ASTRA-sim's policy between collectives; a collective's chunks queue FIFO
    astra_tree: bool = False  # double binary tree priced as ASTRA-sim's tree all-reduce (vs NCCL's)
    local_bw_aware: bool = True  # all-reduce: reduce-scatter up, all-reduce on top, all-gather down (vs an
    # all-reduce in every dimension: ASTRA-sim's collective-optimization "baseline")

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"semantics.backend: '{self.backend}' is not one of {', '.join(BACKENDS)}")
        if self.scheduling not in POLICIES:
            raise ValueError(f"semantics.scheduling: '{self.scheduling}' is not one of {', '.join(POLICIES)}")
        if self.ring_all_to_all not in RING_A2A:
            raise ValueError(f"semantics.ring_all_to_all: '{self.ring_all_to_all}' is not one of "
                             f"{', '.join(RING_A2A)}")
        if self.queues_per_dim < 1 or self.active_chunks_per_dim < 1:
            raise ValueError("semantics: queues_per_dim and active_chunks_per_dim must be >= 1")
        if not self.endpoint_delay_ns >= 0:
            raise ValueError(f"semantics.endpoint_delay_ns: must be >= 0, got {self.endpoint_delay_ns}")
        if self.local_mem_bw_gbps is not None and not self.local_mem_bw_gbps > 0:
            raise ValueError(f"semantics.local_mem_bw_gbps: must be > 0, got {self.local_mem_bw_gbps}")

    @property
    def is_nccl(self) -> bool:
        return self == NCCL


NCCL = Semantics()

ASTRA_ENDPOINT_DELAY_NS = 10.0  # the smallest that runs: 0 aborts ASTRA-sim (astra_reference.md item 5)
ASTRA_LOCAL_MEM_BW_GBPS = 1600.0  # local-mem-bw of ASTRA-sim's shipped system configs


def astra(endpoint_delay_ns: float = ASTRA_ENDPOINT_DELAY_NS,
          local_mem_bw_gbps: float | None = ASTRA_LOCAL_MEM_BW_GBPS, *, backend: str = "unaware",
          queues_per_dim: int = 1, active_chunks_per_dim: int = 1, scheduling: str = "LIFO",
          local_bw_aware: bool = True) -> Semantics:
    """ASTRA-sim's analytical backend with these system-layer settings."""
    return Semantics("astra", latency_per_chunk=True, per_link_bandwidth=True, endpoint_delay_ns=endpoint_delay_ns,
                     local_mem_bw_gbps=local_mem_bw_gbps, truncate_ns=True, ring_all_to_all="one_way",
                     chunk_floor_npus=True, backend=backend, queues_per_dim=queues_per_dim,
                     active_chunks_per_dim=active_chunks_per_dim, scheduling=scheduling, astra_tree=True,
                     local_bw_aware=local_bw_aware)


# The terms, in the order `collective_gap.explain` switches them off from ASTRA's semantics on the way to NCCL's.
TERMS: tuple[tuple[str, str], ...] = (
    ("queues", "several chunks in flight per dimension, each at full bandwidth (num-queues-per-dim)"),
    ("latency_per_chunk", "latency paid per chunk and step, one chunk at a time per dimension"),
    ("endpoint_delay", "endpoint delay per message and per phase"),
    ("reduction", "local reduction cost (3 x bytes / local-mem-bw per reducing step)"),
    ("all_to_all_routing", "ring all-to-all one way round, neighbour to neighbour"),
    ("store_and_forward", "congestion-aware switch: bytes serialised on both links"),
    ("bandwidth_per_link", "bandwidth per link to each peer vs the NPU's bandwidth shared by its sends"),
    ("truncation", "whole-ns message times, whole-byte messages, chunks raised to npus bytes"),
    ("tree", "ASTRA-sim's double binary tree vs NCCL's"),
    ("collective_optimization", "all-reduce run in every dimension (collective-optimization baseline)"),
    ("scheduling", "chunks a queue serves at once (active-chunks-per-dimension; LIFO/FIFO only orders "
                   "different collectives, a collective's own chunks queue first come, first served)"),
)


def without(sem: Semantics, term: str) -> Semantics:
    """`sem` with one ASTRA term switched to its NCCL-like setting."""
    changes: dict[str, object] = {
        "queues": {"queues_per_dim": 1},
        "latency_per_chunk": {"latency_per_chunk": False},
        "endpoint_delay": {"endpoint_delay_ns": 0.0},
        "reduction": {"local_mem_bw_gbps": None},
        "all_to_all_routing": {"ring_all_to_all": "shortest"},
        "store_and_forward": {"backend": "unaware"},
        "bandwidth_per_link": {"per_link_bandwidth": False},
        "truncation": {"truncate_ns": False, "chunk_floor_npus": False},
        "tree": {"astra_tree": False},
        "scheduling": {"scheduling": "FIFO", "active_chunks_per_dim": 1},
        "collective_optimization": {"local_bw_aware": True},
    }[term]
    out = replace(sem, **changes)  # type: ignore[arg-type]
    return NCCL if replace(out, name="nccl") == NCCL else replace(out, name="custom")


def links_per_npu(kind: str, k: int) -> int:
    """Links an NPU has in one direction of a dimension: one per peer on FC, else one."""
    return k - 1 if kind == "fc" else 1


def hops(kind: str, k: int, distance: int = 1) -> int:
    """Links a message crosses: 2 through a switch, 1 to an FC peer, the shorter way round a ring."""
    if kind == "switch":
        return 2
    if kind == "fc":
        return 1
    d = distance % k
    return max(1, min(d, k - d))


@dataclass(frozen=True)
class Steps:
    """`count` identical steps: each sends `messages` messages of `bytes_each` at once over `hops` links."""

    count: int
    messages: int
    bytes_each: float
    hops: int
    reducing: bool = False


def whole(x: float) -> float:
    """x rounded down to a whole number, forgiving the last bits of a product that is whole in exact
    arithmetic (2^30 / 1e9 GiB conversions leave 15624.999999999998 where ASTRA-sim computes 15625)."""
    return float(math.floor(x * (1 + 1e-12) + 1e-9))


def _log2(k: int) -> int:
    return max(1, math.ceil(math.log2(k))) if k > 1 else 0


def algorithm_steps(algorithm: str, phase: str, kind: str, k: int, data_bytes: float,
                    sem: Semantics) -> list[Steps]:
    """The step structure of one phase (astra_reference.md, "Per-message and per-algorithm costs").

    `data_bytes` is the phase's per-NPU buffer in nccl-tests' convention: reduce-scatter input,
    all-gather output, all-reduce buffer, all-to-all send buffer."""
    if k <= 1:
        return []
    cut = whole if sem.truncate_ns else (lambda b: b)  # noqa: E731
    piece = cut(data_bytes / k)  # one rank's share (an all-gather's input per rank)
    if algorithm == "ring":
        h = hops(kind, k)
        if phase == "rs":
            return [Steps(k - 1, 1, piece, h, True)]
        if phase == "ag":
            return [Steps(k - 1, 1, piece, h)]
        if phase == "ar":
            return [Steps(k - 1, 1, piece, h, True), Steps(k - 1, 1, piece, h)]
        if phase == "a2a":
            if sem.ring_all_to_all == "one_way":
                return [Steps(k * (k - 1) // 2, 1, piece, h)]
            far = sum(min(d, k - d) for d in range(1, k))  # both ways round: distance-weighted bytes / 2
            return [Steps(k // 2, 1, piece * far / 2 / (k // 2), h)]
    if phase == "bcast":  # pipelined chain (ring) or tree: every NPU forwards the buffer once
        n = {"ring": k - 1, "direct": 1}.get(algorithm, _log2(k))
        return [Steps(n, 1, data_bytes / n, hops(kind, k) if algorithm != "direct" else hops(kind, k, k // 2))]
    if algorithm == "halving_doubling":
        n = _log2(k)
        if k & (k - 1) and phase in ("rs", "ar", "ag"):  # not a power of two: the bytes of a k-way split
            one = [Steps(n, 1, data_bytes * (k - 1) / k / n, hops(kind, k, k // 2), phase != "ag")]
            return one + [Steps(n, 1, data_bytes * (k - 1) / k / n, hops(kind, k, k // 2))] if phase == "ar" else one
        if phase in ("rs", "ar"):
            down = [Steps(1, 1, cut(data_bytes / 2 ** (i + 1)), hops(kind, k, k >> (i + 1)), i > 0) for i in range(n)]
            if phase == "rs":
                return down
            return down + [Steps(1, 1, s.bytes_each, s.hops) for s in reversed(down)]
        if phase == "ag":
            return [Steps(1, 1, piece * 2 ** i, hops(kind, k, 1 << i)) for i in range(n)]
        if phase == "a2a":
            return [Steps(1, k - 1, piece, hops(kind, k, k // 2))]
    if algorithm == "direct":
        h = hops(kind, k, k // 2)
        if phase == "rs":
            return [Steps(1, k - 1, piece, h, True)]
        if phase == "ag":
            return [Steps(1, k - 1, piece, h)]
        if phase == "ar":
            return [Steps(1, k - 1, piece, h, True), Steps(1, k - 1, piece, h)]
        if phase == "a2a":
            return [Steps(1, k - 1, piece, h)]
    if algorithm == "double_binary_tree":  # NCCL's: pipelined trees, ring-like bytes, 2 log2 k latency steps
        n = _log2(k)
        frac = (k - 1) / k
        if phase == "ar":
            return [Steps(2 * n, 1, 2 * data_bytes * frac / (2 * n), 2)]
        if phase in ("rs", "ag"):
            return [Steps(n, 1, data_bytes * frac / n, 2, phase == "rs")]
    if algorithm == "in_switch":
        if phase == "ar":
            return [Steps(1, 1, data_bytes, 2, False)]
        if phase in ("rs", "ag"):
            return [Steps(1, 1, data_bytes * (k - 1) / k, 2, phase == "rs")]
    raise ValueError(f"algorithm '{algorithm}' has no '{phase}' phase")


def message_ns(kind: str, link_gbps: float, npu_gbps: float, latency_ns: float, s: Steps,
               sem: Semantics) -> tuple[float, float]:
    """(time on the wire, latency part) of one step in ns: every message of the step sent at once.

    Per link: each message has a link of its own at `link_gbps`; per NPU: the messages share
    `npu_gbps`. A congestion-aware switch serialises the bytes on the uplink (all of this step's
    messages) and again on the receiver's downlink."""
    # GB/s (1e9 B/s) is 1 B/ns
    wire = s.bytes_each / link_gbps if sem.per_link_bandwidth else s.messages * s.bytes_each / npu_gbps
    lat = s.hops * latency_ns
    if sem.backend == "aware" and sem.per_link_bandwidth:
        # store and forward: every hop takes latency + bytes / bandwidth (whole ns each); the messages of a
        # step leave one after another on the sender's link, which each holds for its bytes
        cut = whole if sem.truncate_ns else (lambda x: x)  # noqa: E731
        queued = (s.messages - 1) * cut(wire) if kind == "switch" else 0.0
        return s.hops * cut(latency_ns + wire) + queued - lat, lat
    return wire, lat


def phase_ns(kind: str, link_gbps: float, npu_gbps: float, latency_ns: float, steps: list[Steps],
             sem: Semantics) -> tuple[float, float, float]:
    """(busy ns, chunk delay ns, bytes sent) of one phase of one chunk on one dimension.

    With `latency_per_chunk` the dimension is busy for the whole phase; otherwise it is busy for
    the bytes and the rest (latency, endpoint delay, reduction) delays only the chunk."""
    busy = delay = sent = 0.0
    e = sem.endpoint_delay_ns
    for s in steps:
        wire, lat = message_ns(kind, link_gbps, npu_gbps, latency_ns, s, sem)
        total = lat + wire
        if sem.truncate_ns:
            total = whole(total)
        red = 0.0
        if s.reducing and sem.local_mem_bw_gbps is not None:
            red = 3 * s.bytes_each / sem.local_mem_bw_gbps
            if sem.truncate_ns:
                red = 3 * whole(s.bytes_each / sem.local_mem_bw_gbps)
        busy += s.count * wire
        delay += s.count * (total - wire + e + red)
        sent += s.count * s.messages * s.bytes_each
    if steps:
        delay += e
    if sem.latency_per_chunk:
        return busy + delay, 0.0, sent
    return busy, delay, sent


__all__ = ["ASTRA_ENDPOINT_DELAY_NS", "ASTRA_LOCAL_MEM_BW_GBPS", "BACKENDS", "NCCL", "POLICIES", "SEMANTICS",
           "Semantics", "Steps", "TERMS", "algorithm_steps", "astra", "hops", "links_per_npu", "message_ns",
           "phase_ns", "without"]
