"""Micro-batch folding: simulate a pipeline with fewer identical micro-batches and add the periods left out.

A training iteration runs m identical micro-batches through the same schedule (1F1B, interleaved,
zero-bubble). After the warm-up the engine settles into a steady state in which micro-batch k + d does
exactly what micro-batch k did, Delta seconds later, on every stream of every rank class. The engine is
deterministic and each task's times depend only on a bounded neighbourhood (its dependencies, its
predecessors on its streams and the host that issues it, and the tasks running beside it, which share
its links and its overlap slowdown): so once a stretch of micro-batches wider than twice that
neighbourhood repeats exactly (start, end and the predecessor that released each task; the host's issue
time too, or the host runs further ahead every period and never holds a task up after the cut), an
iteration of m micro-batches is the simulated one of m' < m with (m - m') / d copies of one period
inserted in the middle, every later task Delta x copies later. That is what this module checks and uses:

- `reduced_micro_batches`: how many micro-batches to try simulating (a few pipeline depths, congruent to
  m mod d);
- `find_fold`: in that simulation, the longest run of micro-batches k whose tasks equal those of k - d
  shifted by one Delta (times within 1e-12 of the iteration; durations, releasing predecessors and
  memory per period exactly), its neighbourhood width H (in micro-batches, from dependencies, stream
  order and what runs concurrently) and a cut c with H verified micro-batches on both sides;
- `fold_summary`: the full iteration's numbers from the reduced one: iteration time + copies x Delta,
  each class's breakdown + copies x one period's (its tasks' compute, and the exposed communication and
  bubble swept over one period of time), the critical path's categories + copies x its periodic segment,
  and the task count. Peak memory needs nothing: a period allocates and frees the same bytes.

Anything that breaks the repetition (GPipe's growing activations, a host that falls behind a little more
every period, contention that drifts) fails the check and the caller simulates every micro-batch.
`tests/test_periodic.py` compares folded and full simulations on random small jobs.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from ..compile.graph import ExecutionGraph
from ..compile.program import Stream
from .engine import SimTrace
from .result import (
    BREAKDOWN_KEYS,
    add_compute_parts,
    class_breakdown,
    critical_path,
    exposed_time,
    is_compute,
    time_by_category,
)

TIME_TOL = 1e-12  # relative to the iteration: two floats that agree to this are the same time
MIN_SAVING = 1.5  # fold only when the full run has this many times the micro-batches of the reduced one


@dataclass(frozen=True)
class Fold:
    """How a reduced simulation stands for the full one: `copies` periods of `period_micro_batches`
    micro-batches, `period_s` each, inserted at micro-batch `cut`."""

    simulated_micro_batches: int
    micro_batches: int
    period_micro_batches: int
    period_s: float
    cut: int
    neighbourhood: int

    @property
    def copies(self) -> int:
        return (self.micro_batches - self.simulated_micro_batches) // self.period_micro_batches

    def describe(self) -> str:
        return (f"folded: simulated {self.simulated_micro_batches} of {self.micro_batches} micro-batches, the steady "
                f"state repeats every {self.period_micro_batches} micro-batch(es) ({self.period_s * 1e3:.3f} ms); "
                f"{self.copies} periods added")


@dataclass
class FoldedSummary:
    """The full iteration's numbers, read off a folded (reduced) simulation."""

    iteration_s: float
    per_class: list[dict[str, float]]
    critical_path_by_category: dict[str, float]
    critical_path_length: int
    n_tasks: int


def period_candidates(kind: str, pp: int) -> tuple[int, ...]:
    """Micro-batch periods worth trying per schedule: Megatron's interleaving works in groups of pp."""
    return (pp,) if kind == "interleaved" else (1,)


def reduced_micro_batches(kind: str, pp: int, v: int, m: int, period: int) -> list[int]:
    """The micro-batch counts to try simulating in place of m, smallest first: three pipeline depths (the
    warm-up, then twice the neighbourhood) plus two periods, congruent to m modulo the period, and twice
    that where it still saves half the work (a steady state that takes longer to settle, zero bubble's
    postponed weight gradients say). Empty when folding saves too little or the schedule does not repeat
    (GPipe's activations grow with m; HTAE chooses its order at run time)."""
    if kind not in ("1f1b", "interleaved", "zb-h1"):
        return []
    depth = pp * v
    tries = []
    for want, saving in ((3 * depth + 2 * period + 2, MIN_SAVING), (6 * depth + 4 * period + 4, 2.0)):
        reduced = want + (m - want) % period
        if kind == "interleaved" and reduced % pp:
            break
        if reduced * saving > m:
            break
        tries.append(reduced)
    return tries


def _by_micro_batch(graph: ExecutionGraph, m: int) -> list[np.ndarray]:
    """Task ids of each micro-batch 0..m-1, in creation order."""
    mb = np.asarray(graph.micro_batch, dtype=np.int64)
    order = np.argsort(mb, kind="stable")
    bounds = np.searchsorted(mb[order], np.arange(m + 1))
    return [order[bounds[k]:bounds[k + 1]] for k in range(m)]


def _neighbourhood(graph: ExecutionGraph, trace: SimTrace, mb: np.ndarray, tasks: np.ndarray) -> int:
    """H: how many micro-batches away a task's times can be influenced from (for `tasks`): its dependencies
    and stream predecessors, the micro-batches of tasks started before it ended and of tasks still running
    when it started (everything that may share its links, its host or its overlap slowdown)."""
    h = 0
    mine = np.zeros(len(graph), dtype=bool)
    mine[tasks] = True
    for q in graph.queues.values():  # each task's predecessor on every stream it runs on
        if len(q) > 1:
            ids = np.asarray(q)
            before, after = ids[:-1], ids[1:]
            keep = mine[after] & (mb[before] >= 0)
            if keep.any():
                h = max(h, int(np.abs(mb[after][keep] - mb[before][keep]).max()))
    for t in tasks.tolist():
        k = mb[t]
        for d in graph.deps[t]:
            if mb[d] >= 0:
                h = max(h, abs(k - mb[d]))
    start = np.asarray(trace.start_s)
    end = np.asarray(trace.end_s)
    valid = np.flatnonzero(mb >= 0)
    by_start = valid[np.argsort(start[valid], kind="stable")]
    hi = np.maximum.accumulate(mb[by_start])  # the largest micro-batch started so far
    by_end = valid[np.argsort(end[valid], kind="stable")]
    lo = np.minimum.accumulate(mb[by_end][::-1])[::-1]  # the smallest micro-batch yet to end
    started = np.searchsorted(start[by_start], end[tasks], side="left")
    ended = np.searchsorted(end[by_end], start[tasks], side="right")
    k = mb[tasks]
    ahead = np.where(started > 0, hi[np.maximum(started - 1, 0)] - k, 0)
    behind = np.where(ended < len(by_end), k - lo[np.minimum(ended, len(by_end) - 1)], 0)
    return int(max(h, ahead.max(initial=0), behind.max(initial=0)))


def find_fold(graph: ExecutionGraph, trace: SimTrace, m_reduced: int, m: int, period: int) -> Fold | None:
    """The fold of a simulation of `m_reduced` micro-batches that stands for `m`, or None if its steady state
    does not repeat exactly over a wide enough stretch (see the module docstring)."""
    if m_reduced < 2 * period + 1 or (m - m_reduced) % period:
        return None
    iteration = max(trace.end_s)
    tol = TIME_TOL * iteration
    groups = _by_micro_batch(graph, m_reduced)
    sizes = {len(x) for x in groups[1:-1]}
    if len(sizes) != 1:
        return None
    width = sizes.pop()
    mb = np.asarray(graph.micro_batch, dtype=np.int64)
    pos = np.full(len(graph), -1, dtype=np.int64)
    for ids in groups[1:-1]:
        pos[ids] = np.arange(width)
    start = np.asarray(trace.start_s)
    end = np.asarray(trace.end_s)
    issue = np.asarray(trace.issue_s) if trace.issue_s else np.full(len(graph), np.nan)
    issued = ~np.isnan(issue)
    dur = np.asarray(graph.duration_s)
    pred = np.asarray(trace.critical_pred, dtype=np.int64)
    net = np.asarray(graph.mem_net_bytes)
    # pairs (k - period, k) for the micro-batches with the common task count (not the first and the last)
    shifts: list[float | None] = [None] * m_reduced
    lockstep = [True] * m_reduced  # the host issues Delta later too (else it runs further ahead every period)
    for k in range(1 + period, m_reduced - 1):
        a, b = groups[k - period], groups[k]
        delta = start[b[0]] - start[a[0]]
        if not (np.all(np.abs(start[b] - start[a] - delta) <= tol) and np.all(np.abs(end[b] - end[a] - delta) <= tol)
                and np.array_equal(issued[a], issued[b]) and np.array_equal(dur[a], dur[b])):
            continue
        host_step = issue[b][issued[b]] - issue[a][issued[a]]
        if np.any(host_step > delta + tol):  # the host falls behind the GPU: it would bind more every period
            continue
        lockstep[k] = bool(np.all(np.abs(host_step - delta) <= tol))
        pa, pb = pred[a], pred[b]
        has = pa >= 0
        if not np.array_equal(has, pb >= 0):
            continue
        qa, qb = pa[has], pb[has]
        if not (np.array_equal(mb[qb] - mb[qa], np.full(len(qa), period)) and np.array_equal(pos[qa], pos[qb])):
            continue
        shifts[k] = float(delta)
    # the longest run of repeating micro-batches with one Delta
    best: tuple[int, int] = (0, 0)
    k = 0
    while k < m_reduced:
        if shifts[k] is None:
            k += 1
            continue
        j = k
        while j + 1 < m_reduced and shifts[j + 1] is not None and abs(shifts[j + 1] - shifts[k]) <= tol:  # type: ignore[operator]
            j += 1
        if j - k > best[1] - best[0]:
            best = (k, j + 1)
        k = j + 1
    lo, hi = best  # micro-batches lo - period .. hi - 1 are verified: each of lo..hi-1 repeats the one d before
    if hi - lo < period:
        return None
    verified = np.concatenate(groups[lo - period:hi])
    h = _neighbourhood(graph, trace, mb, verified)
    cut = lo - period + h
    if cut + period + h > hi or cut < 1:
        return None
    delta = shifts[lo]
    assert delta is not None
    if delta <= 0:
        return None
    if not all(lockstep[lo:hi]) and not _host_never_binds(graph, trace, np.flatnonzero((mb >= cut) | (mb < 0)), tol):
        return None
    period_tasks = np.concatenate(groups[cut:cut + period])
    for c in range(len(graph.classes)):  # a period frees what it allocates: memory does not drift
        own = [t for t in period_tasks.tolist() if c in graph.participants[t]]
        total = float(net[own].sum()) if own else 0.0
        if abs(total) > 1e-9 * max(float(np.abs(net[own]).sum()) if own else 0.0, 1.0):
            return None
    return Fold(m_reduced, m, period, delta, cut, h)


def _host_never_binds(graph: ExecutionGraph, trace: SimTrace, tasks: np.ndarray, tol: float) -> bool:
    """No host-issued task among `tasks` waited for its issue: it started after it, and (compute) ended after
    its issue plus host path, (a collective) its launch did not delay it. A host that runs further ahead every
    period then changes nothing after the inserted periods either: those tasks' times do not depend on it."""
    issue = np.asarray(trace.issue_s)[tasks]
    issued = ~np.isnan(issue)
    t = tasks[issued]
    issue = issue[issued]
    start = np.asarray(trace.start_s)[t]
    end = np.asarray(trace.end_s)[t]
    path = np.asarray(graph.host_path_s)[t]
    dur = np.asarray(graph.duration_s)[t]
    compute = np.asarray(graph.stream)[t] == Stream.COMPUTE
    done = np.where(compute, issue + path < end - tol, issue + path <= start + dur + tol)
    return bool(np.all((issue < start - tol) & done))


def fold_summary(graph: ExecutionGraph, trace: SimTrace, fold: Fold) -> FoldedSummary | None:
    """The full iteration's numbers from the reduced simulation (module docstring); None if the critical
    path does not pass through the repeating stretch as a repeating segment."""
    n = fold.copies
    iteration_reduced = max(trace.end_s)
    groups = _by_micro_batch(graph, fold.simulated_micro_batches)
    period_tasks = np.concatenate(groups[fold.cut:fold.cut + fold.period_micro_batches])
    tau = min(trace.start_s[t] for t in groups[fold.cut].tolist())
    per_class = []
    for c in range(len(graph.classes)):
        base = class_breakdown(graph, trace, c, iteration_reduced)
        period = dict.fromkeys(BREAKDOWN_KEYS, 0.0)  # before the last backward: a gap is bubble, not idle
        for k, v in exposed_time(graph, trace, c, tau, tau + fold.period_s, math.inf).items():
            period[k] += v
        for t in period_tasks.tolist():
            if c not in graph.participants[t]:
                continue
            if is_compute(graph, t):
                add_compute_parts(period, graph, trace, t)
        per_class.append({k: base[k] + n * period[k] for k in BREAKDOWN_KEYS})
    path = critical_path(graph, trace)
    index = {t: i for i, t in enumerate(path)}
    near = range(fold.cut - fold.neighbourhood, fold.cut + fold.neighbourhood)  # a task and its twin verified
    pos = {t: (k, j) for k in near for j, t in enumerate(groups[k].tolist())}
    segment: tuple[int, int] | None = None  # path[a] and path[b] are one task and its copy a period later
    for i, t in enumerate(path):
        if t not in pos:
            continue
        k, j = pos[t]
        if k + fold.period_micro_batches >= len(groups):
            continue
        twin = int(groups[k + fold.period_micro_batches][j])
        if index.get(twin, -1) > i:
            segment = (i, index[twin])
            break
    if segment is None:
        return None
    by_cat = defaultdict(float, time_by_category(graph, trace, path))
    for k, v in time_by_category(graph, trace, path[segment[0] + 1:segment[1] + 1]).items():
        by_cat[k] += n * v
    return FoldedSummary(iteration_reduced + n * fold.period_s, per_class, dict(by_cat),
                         len(path) + n * (segment[1] - segment[0]), len(graph) + n * len(period_tasks))
