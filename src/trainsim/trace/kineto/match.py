"""Collectives matched across ranks, and each rank's clock offset (dPRO section 4.2).

No trace in the wild records a per-collective sequence number that survives every PyTorch version, so
calls are matched by order within (process group, collective kind) on each member, and the message size
is checked where the kind requires equal sizes. A collective is *coupled* (its members' kernels start
together in the replay) only when every member's trace is given; a rank whose peers are absent keeps
its measured collective times, waits for absent peers included.

Clock offsets: a collective completes at (nearly) the same instant on all of its members, so a rank's
offset from the reference rank is the median, over the collectives it shares with an aligned rank, of
the difference of their measured end times; ranks are aligned breadth-first from the first rank given.
This is the end-time form of dPRO's observation that a communication op's true duration is its end minus
the latest start among its peers; the residual spread of aligned ends is reported.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field

import numpy as np

from ...errors import ConfigError
from .model import KinetoTrace

EQUAL_SIZE_KINDS = ("allreduce", "broadcast", "reduce", "allgather", "reducescatter")


@dataclass(frozen=True)
class CollCall:
    """One rank's side of a collective call: `rank` is the global rank, times on that rank's own clock."""

    rank: int
    row: int  # index into the rank's trace.collectives
    group: tuple[int, ...]  # the members' global ranks
    group_name: str  # process group name (or the member list when the trace names none)
    kind: str
    nelems: int
    start_us: float  # absolute (trace clock)
    end_us: float


@dataclass
class Matching:
    """Matched collectives (each a list of its members' calls), the offsets, and what was assumed."""

    matched: list[list[CollCall]] = field(default_factory=list)
    offsets_us: dict[int, float] = field(default_factory=dict)  # rank -> its clock minus the reference's
    residual_us: float = 0.0  # median |aligned end - median aligned end| over matched collectives
    uncoupled: int = 0  # collective calls left with their measured times (peers absent)
    assumptions: list[str] = field(default_factory=list)


def rank_of(traces: list[KinetoTrace]) -> list[int]:
    """Each trace's global rank (distributedInfo, else its position); bad combinations are a ConfigError."""
    if len(traces) == 1:
        return [traces[0].rank or 0]
    have = [t.rank is not None for t in traces]
    if any(have) and not all(have):
        missing = next(t.path for t in traces if t.rank is None)
        raise ConfigError(missing, "has no distributedInfo.rank while the other traces have one",
                          "give the traces of one job, each written by torch.profiler on its rank")
    ranks = [int(t.rank) if t.rank is not None else i for i, t in enumerate(traces)]
    seen: dict[int, str] = {}
    for r, t in zip(ranks, traces, strict=True):
        if r in seen:
            raise ConfigError(t.path, f"is rank {r} again (so is {seen[r]})", "give one trace per rank")
        seen[r] = t.path
    worlds = {t.world_size for t in traces if t.world_size is not None}
    if len(worlds) > 1:
        raise ConfigError("TRACE", f"the traces disagree on world_size ({sorted(worlds)})",
                          "give the traces of one job")
    if worlds:
        w = worlds.pop()
        bad = [(r, t.path) for r, t in zip(ranks, traces, strict=True) if not 0 <= r < w]
        if bad:
            raise ConfigError(bad[0][1], f"rank {bad[0][0]} is outside world_size {w}",
                              "give the traces of one job")
    return ranks


def _calls(trace: KinetoTrace, rank: int, world: tuple[int, ...], include: set[int]) -> list[CollCall]:
    c = trace.collectives
    out: list[CollCall] = []
    for j in range(len(c)):
        if j not in include or not c.kind[j]:
            continue
        members = c.pg_ranks[j]
        if members is None:
            if c.group_size[j] not in (-1, len(world)):
                continue  # a subgroup whose members the trace does not name: cannot be coupled
            members = world
        name = c.pg_name[j] if c.pg_name[j] is not None else ",".join(map(str, members))
        ts = trace.origin_us + c.ts_us[j]
        out.append(CollCall(rank, j, tuple(members), name, c.kind[j], c.in_nelems[j], ts, ts + c.dur_us[j]))
    return out


def match_collectives(traces: list[KinetoTrace], ranks: list[int], include: list[set[int]]) -> Matching:
    """Match collective calls across ranks; `include[i]`: the trace.collectives indices of trace i that do a
    collective's work (GPU kernels, CPU work ranges), the ones a replay can couple."""
    m = Matching()
    present = set(ranks)
    world_size = next((t.world_size for t in traces if t.world_size is not None), len(traces))
    world = tuple(range(world_size))
    by_key: dict[tuple[str, str, tuple[int, ...]], dict[int, list[CollCall]]] = defaultdict(dict)
    path_of = dict(zip(ranks, (t.path for t in traces), strict=True))
    for t, r, inc in zip(traces, ranks, include, strict=True):
        for call in _calls(t, r, world, inc):
            if len(call.group) < 2 or r not in call.group:
                continue
            if not set(call.group) <= present:
                m.uncoupled += 1
                continue
            by_key[(call.group_name, call.kind, call.group)].setdefault(r, []).append(call)
    for (gname, kind, group), per_rank in by_key.items():
        counts = {r: len(per_rank.get(r, [])) for r in group}
        if len(set(counts.values())) > 1:
            lo = min(counts, key=lambda r: counts[r])
            hi = max(counts, key=lambda r: counts[r])
            raise ConfigError(path_of[hi], f"{kind} #{counts[lo] + 1} of process group {gname} has no peer on "
                              f"rank {lo} ({path_of[lo]} has {counts[lo]}, rank {hi} {counts[hi]})",
                              "give traces of the same steps from every member")
        for i in range(counts[group[0]]):
            calls = [per_rank[r][i] for r in group]
            sizes = {c.nelems for c in calls if c.nelems >= 0}
            if kind in EQUAL_SIZE_KINDS and len(sizes) > 1:
                a, b = calls[0], next(c for c in calls if c.nelems != calls[0].nelems)
                raise ConfigError(path_of[b.rank], f"{kind} #{i + 1} of process group {gname} moves {b.nelems} "
                                  f"elements on rank {b.rank} but {a.nelems} elements on rank {a.rank}",
                                  "give traces of the same steps from every member")
            m.matched.append(calls)
    m.offsets_us, m.residual_us = _offsets(m.matched, ranks)
    if m.uncoupled:
        m.assumptions.append(f"{m.uncoupled} collective calls involve ranks whose traces are not given: they keep "
                             "their measured times (waits for the absent peers included)")
    if len(ranks) > 1:
        unaligned = [r for r in ranks if r not in m.offsets_us]
        if unaligned:
            m.assumptions.append(f"ranks {unaligned} share no matched collective with rank {ranks[0]}: "
                                 "their clocks are taken as aligned")
        if m.matched:
            m.assumptions.append(f"clock offsets from {len(m.matched)} matched collectives (equal end times); "
                                 f"residual {m.residual_us:.1f} us")
    for r in ranks:
        m.offsets_us.setdefault(r, 0.0)
    return m


def _offsets(matched: list[list[CollCall]], ranks: list[int]) -> tuple[dict[int, float], float]:
    diffs: dict[tuple[int, int], list[float]] = defaultdict(list)
    for calls in matched:
        for a in calls:
            for b in calls:
                if a.rank != b.rank:
                    diffs[(a.rank, b.rank)].append(b.end_us - a.end_us)
    if not ranks:
        return {}, 0.0
    off = {ranks[0]: 0.0}
    todo = deque([ranks[0]])
    while todo:
        a = todo.popleft()
        for (x, b), d in diffs.items():
            if x == a and b not in off:
                off[b] = off[a] + float(np.median(d))
                todo.append(b)
    spread = [abs((c.end_us - off.get(c.rank, 0.0)) - float(np.median([k.end_us - off.get(k.rank, 0.0) for k in calls])))
              for calls in matched for c in calls]
    return off, float(np.median(spread)) if spread else 0.0


__all__ = ["EQUAL_SIZE_KINDS", "CollCall", "Matching", "match_collectives", "rank_of"]
