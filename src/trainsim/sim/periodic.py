"""Micro-batch folding: simulate a pipeline with fewer identical micro-batches and add the periods left out.

A training iteration runs m identical micro-batches through the same schedule (1F1B, interleaved, DualPipeV,
zero-bubble). After the warm-up the engine settles into a steady state in which micro-batch k + d does
exactly what micro-batch k did, Delta seconds later, on every stream of every rank class. So the iteration
of m micro-batches is a simulated one of m' < m with n = (m - m') / d copies of one period inserted at a
seam time T: the reduced run's tasks that start before T as they ran; n copies of its period, the tasks
that start in [T, T + Delta) (copy i: each task's twin i d micro-batches later, i Delta later); then the
tasks that start from T on, n d micro-batches and n Delta later.

Why that is exact. The engine is deterministic and causal: a task's start, end and releasing predecessor
are fixed by the tasks that influence it, every one started before it ends: its dependencies (less those
implied by its stream's order), its predecessor on each stream it runs on, the task its host issued
before it and the pipeline send its host syncs on, and every task running beside it (they share its links,
its overlap slowdown). A schedule in which each task agrees with its influencers as the engine's rules
say is the engine's schedule. In the spliced one, a task and an influencer on the same side of T and of
T + Delta agree because they agree in the reduced run, shifted alike. A pair that straddles T or T + Delta
agrees when the earlier task is repeated by its twin a period later and every task starting between them
repeats its twin: the same start, end and duration shifted by Delta, the releasing predecessor a period
apart, the same influencers a period apart (micro-batch offset and position) and the host's issue time
shifted by Delta too, or else a host that never holds up a task from T on (it runs further ahead every
period). So `find_fold` verifies the band of time from the earliest straddling task (plus a period) to the
latest, and that no per-iteration task (an optimizer step, a gradient reduction) straddles. The copies
are the full run's own tasks because the schedule's steady pattern does not depend on m (its warm-up and
cool-down depend on the pipeline depth): the copied period holds each task position once (per micro-batch
of a period), each with its twins' influencers. Peak memory needs nothing: a period must free what it
allocates.

- `reduced_micro_batches`: how many micro-batches to try simulating: the warm-up (about a pipeline depth)
  and four periods first, congruent to m mod d, then more;
- `find_fold`: in that simulation, Delta (the shift most tasks have from their twin d micro-batches
  earlier), which tasks repeat their twin, and the earliest seam T the argument above holds for, with the
  band of time it verified (`Fold.band_s`);
- `fold_summary`: the full iteration's numbers from the reduced one: iteration time + n x Delta, each
  class's breakdown + n x one period's (the period's compute, and the exposed communication and bubble
  swept over [T, T + Delta)), the critical path's categories + n x a periodic segment of it inside the
  band, and the task count.

Anything that breaks the repetition (GPipe's growing activations, a host that falls behind a little more
every period, contention that drifts, memory that does not come back) fails the check and the caller
simulates more micro-batches, then every one. `tests/test_periodic.py` compares folded and full
simulations on random small jobs and deeper pipelines.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain

import numpy as np

from ..compile.graph import ExecutionGraph
from ..compile.program import Stream
from .engine import SimTrace
from .result import (
    BREAKDOWN_KEYS,
    Sweep,
    TaskColumns,
    breakdown_seconds,
    compute_seconds,
    critical_path,
    task_columns,
    time_by_category,
)

TIME_TOL = 1e-12  # relative to the iteration: two floats that agree to this are the same time
MIN_SAVING = 1.5  # fold only when the full run has this many times the micro-batches of the reduced one


@dataclass(frozen=True)
class Fold:
    """How a reduced simulation stands for the full one: `copies` periods of `period_micro_batches`
    micro-batches, `period_s` each: the reduced run's tasks starting in [seam_s, seam_s + period_s),
    inserted there. Every task starting in `band_s` repeats its twin a period before (verified)."""

    simulated_micro_batches: int
    micro_batches: int
    period_micro_batches: int
    period_s: float
    seam_s: float
    band_s: tuple[float, float]
    grid: _Grid | None = field(default=None, compare=False, repr=False)  # the reduced run's micro-batch grid

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
    """The micro-batch counts to try simulating in place of m, smallest first, each congruent to m modulo the
    period and tried only where it saves enough work (MIN_SAVING; twice that for the last). Empty when folding
    saves too little or the schedule does not repeat (GPipe's activations grow with m; HTAE chooses its order
    at run time).

    The first: the micro-batches that enter before every stage runs its steady pattern (1F1B: the pipeline
    depth; interleaved: two groups of pp; zero bubble, whose postponed weight gradients settle slowly: four
    depths; DualPipeV: two depths of its 2 pp chunks, 4 pp), then four periods (one to settle, the copied period and its twins, the band around the seam)
    and two more (the first and the last micro-batch have tasks of their own). Measured, the seam is found
    from one micro-batch fewer for 1F1B (pp 1..32) and interleaving (pp 2..8, v 2..4), and five fewer for zero
    bubble (pp 2..16). Then, where a steady state settles later: three depths plus two periods plus two,
    then twice that."""
    if kind not in ("1f1b", "interleaved", "zb-h1", "dualpipev"):
        return []
    depth = pp * v
    warm_up = {"1f1b": depth, "interleaved": 2 * pp, "zb-h1": 4 * depth, "dualpipev": 2 * depth}[kind]
    tries: list[int] = []
    wants = ((warm_up + 4 * period + 2, MIN_SAVING), (3 * depth + 2 * period + 2, MIN_SAVING),
             (6 * depth + 4 * period + 4, 2.0))
    for want, saving in wants:
        reduced = want + (m - want) % period
        if kind == "interleaved" and reduced % pp:
            break
        if reduced * saving > m:
            break
        if not tries or reduced > tries[-1]:
            tries.append(reduced)
    return tries


@dataclass(frozen=True)
class _Grid:
    """The tasks of micro-batches 1..m-2 (those with the common task count) as a matrix: row = micro-batch,
    column = position in creation order; `row` and `col` per task, -1 for the first and last micro-batch's
    tasks and the per-iteration ones (which have no twins)."""

    ids: np.ndarray
    row: np.ndarray
    col: np.ndarray

    def twin(self, tasks: np.ndarray, shift: int) -> np.ndarray:
        """The task `shift` micro-batches after each of `tasks` (-1 where there is none in the grid)."""
        r = self.row[tasks] + shift
        ok = (self.row[tasks] >= 0) & (r >= 1) & (r < len(self.ids) - 1)
        return np.where(ok, self.ids[np.where(ok, r, 0), self.col[tasks]], -1)


def _grid(graph: ExecutionGraph, m: int) -> _Grid | None:
    """The grid of a run of m micro-batches; None unless micro-batches 1..m-2 have one task count."""
    mb = np.asarray(graph.micro_batch, dtype=np.int64)
    order = np.argsort(mb, kind="stable")
    bounds = np.searchsorted(mb[order], np.arange(m + 1))
    sizes = np.diff(bounds)[1:-1]
    if not len(sizes) or np.any(sizes != sizes[0]) or sizes[0] == 0:
        return None
    width = int(sizes[0])
    ids = np.full((m, width), -1, dtype=np.int64)
    ids[1:-1] = order[bounds[1]:bounds[m - 1]].reshape(m - 2, width)
    row = np.full(len(mb), -1, dtype=np.int64)
    col = np.full(len(mb), -1, dtype=np.int64)
    inner = ids[1:-1].ravel()
    row[inner] = np.repeat(np.arange(1, m - 1), width)
    col[inner] = np.tile(np.arange(width), m - 2)
    return _Grid(ids, row, col)


@dataclass(frozen=True)
class _Edges:
    """Who influences whom, as (influenced x, influencer y, channel) arrays: dependencies (channel 0; those
    implied by stream order left out), each stream's predecessor (1 + class), the task the host issued
    before (1 + classes + class) and the pipeline send the host syncs on (1 + 2 classes + class)."""

    x: np.ndarray
    y: np.ndarray
    channel: np.ndarray
    host: np.ndarray  # the host's pairs (issue order, sync), which matter only while the host is in lockstep


def _edges(graph: ExecutionGraph, cols: TaskColumns, issued: np.ndarray) -> _Edges:
    """The influence pairs of a simulated graph (see _Edges); `issued`: which tasks its host issued."""
    n, n_cls = len(graph), cols.n_classes
    lengths = np.fromiter(map(len, graph.queues.values()), np.int64, len(graph.queues))
    members = np.fromiter(chain.from_iterable(graph.queues.values()), np.int64, int(lengths.sum()))
    which = np.repeat(np.arange(len(lengths)), lengths)
    place = np.arange(len(members)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    queue_of = np.full(n, -1, dtype=np.int64)  # the one queue a task is on (-1: several, or none)
    queue_of[members] = which
    queue_of[np.bincount(members, minlength=n) > 1] = -1
    position = np.zeros(n, dtype=np.int64)
    position[members] = place
    chained = which[1:] == which[:-1]
    owner = np.fromiter((c for c, _ in graph.queues), np.int64, len(lengths))
    sizes = np.fromiter(map(len, graph.deps), np.int64, n)
    dx = np.repeat(np.arange(n), sizes)
    dy = np.fromiter(chain.from_iterable(graph.deps), np.int64, int(sizes.sum()))
    implied = (queue_of[dx] >= 0) & (queue_of[dx] == queue_of[dy]) & (position[dy] < position[dx])
    # the host issues a class's compute and feature tasks in start order ...
    mt, mc = cols.member_task, cols.member_class
    ht, hc = mt[issued[mt]], mc[issued[mt]]
    order = np.argsort(cols.start[ht], kind="stable")  # by start, then (stable, radix for int16) by class
    order = order[np.argsort(hc[order].astype(np.int16) if n_cls < 2**15 else hc[order], kind="stable")]
    ht, hc = ht[order], hc[order]
    same = hc[1:] == hc[:-1]
    # ... and waits for the class's latest pipeline send before a task in program order (engine._sync_points:
    # its compute queue and the feature tasks it is the first participant of)
    kind = cols.stream[mt]
    first = np.r_[True, mt[1:] != mt[:-1]]
    send = kind == Stream.P2P
    sel = send | (kind == Stream.COMPUTE) | ((kind == Stream.FEATURE) & first)
    order = np.lexsort((mt[sel], mc[sel]))
    st, sc, ss = mt[sel][order], mc[sel][order], send[sel][order]
    latest = np.maximum.accumulate(np.where(ss, sc * n + st, sc * n - 1)) - sc * n
    synced = ~ss & (latest >= 0)
    x = np.concatenate([dx[~implied], members[1:][chained], ht[1:][same], st[synced]])
    y = np.concatenate([dy[~implied], members[:-1][chained], ht[:-1][same], latest[synced]])
    channel = np.concatenate([np.zeros(int((~implied).sum()), dtype=np.int64), 1 + owner[which[1:][chained]],
                              1 + n_cls + hc[1:][same], 1 + 2 * n_cls + sc[synced]])
    return _Edges(x, y, channel, channel > n_cls)


def _same_structure(grid: _Grid, edges: _Edges, d: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per task, whether its influencers (micro-batch offset and column, or the task itself outside the grid)
    are its twin's d micro-batches earlier, channel by channel: through its own pairs, and through the host's.
    False for tasks without a twin."""
    m, width = grid.ids.shape
    same = np.zeros(n, dtype=bool)
    same[grid.ids[1 + d:m - 1].ravel()] = True
    same_host = same.copy()
    keep = grid.row[edges.x] >= 0
    x, y, channel, host = edges.x[keep], edges.y[keep], edges.channel[keep], edges.host[keep]
    if not len(x):
        return same, same_host
    inside = grid.row[y] >= 0
    offset = np.where(inside, grid.row[y] - grid.row[x], 0) + m
    who = np.where(inside, grid.col[y], width + 1 + y)
    code = (channel * (2 * m + 1) + offset) * (n + width + 2) + who
    span = int(code.max()) + 1
    if m * width * span >= 2**62:  # keep the keys below int64's range
        code = np.unique(code, return_inverse=True)[1].reshape(-1)
        span = int(code.max()) + 1
    slot = grid.row[x] * width + grid.col[x]
    mine = (slot * span + code)[grid.row[x] >= 1 + d]  # each task's, where it has an earlier twin
    later = ((slot + d * width) * span + code)[grid.row[x] + d < m - 1]  # placed on its later twin
    host_mine, host_later = host[grid.row[x] >= 1 + d], host[grid.row[x] + d < m - 1]
    by_mine, by_later = np.argsort(mine), np.argsort(later)
    mine, later, host_mine, host_later = mine[by_mine], later[by_later], host_mine[by_mine], host_later[by_later]
    for a, b, a_host in ((mine, later, host_mine), (later, mine, host_later)):
        found = b[np.minimum(np.searchsorted(b, a), len(b) - 1)] == a if len(b) else np.zeros(len(a), dtype=bool)
        tasks = grid.ids.reshape(-1)[a // span]
        same[tasks[~found & ~a_host]] = False
        same_host[tasks[~found & a_host]] = False
    return same, same_host


def _mode(values: np.ndarray, tol: float) -> float:
    """The value most of `values` agree with (within tol)."""
    s = np.sort(values)
    counts = np.searchsorted(s, s + tol, side="right") - np.arange(len(s))
    return float(s[int(np.argmax(counts))])


def _straddling(lo: np.ndarray, hi: np.ndarray, bad: np.ndarray, at: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each time in `at`, over the intervals [lo, hi]: the smallest lo of those with hi >= at, the largest
    hi of those with lo < at, and the largest hi of the `bad` ones with lo < at (inf and -inf where there are
    none). Below `at`, at least `at` and at least `at` respectively, they come from intervals with
    lo < at <= hi, the ones that straddle it."""
    if not len(lo):
        none = np.full(len(at), -np.inf)
        return -none, none, none
    by_lo = np.argsort(lo, kind="stable")
    i = np.searchsorted(lo[by_lo], at, side="left") - 1
    reach = np.maximum.accumulate(hi[by_lo])
    reach_bad = np.maximum.accumulate(np.where(bad[by_lo], hi[by_lo], -np.inf))
    top = np.where(i >= 0, reach[i], -np.inf)
    top_bad = np.where(i >= 0, reach_bad[i], -np.inf)
    by_hi = np.argsort(hi, kind="stable")
    j = np.searchsorted(hi[by_hi], at, side="left")
    low = np.minimum.accumulate(lo[by_hi][::-1])[::-1]
    bottom = np.where(j < len(lo), low[np.minimum(j, len(lo) - 1)], np.inf)
    return bottom, top, top_bad


def find_fold(graph: ExecutionGraph, trace: SimTrace, m_reduced: int, m: int, period: int,
              cols: TaskColumns | None = None) -> Fold | None:
    """The fold of a simulation of `m_reduced` micro-batches that stands for `m`, or None if its steady state
    does not repeat exactly over a wide enough stretch (see the module docstring). `cols`: the run's columns
    (result.task_columns), where the caller has them."""
    if m_reduced < 2 * period + 3 or (m - m_reduced) % period:
        return None
    grid = _grid(graph, m_reduced)
    if grid is None:
        return None
    n, d = len(graph), period
    cols = cols or task_columns(graph, trace)
    start, end, stream = cols.start, cols.end, cols.stream
    tol = TIME_TOL * float(end.max())
    issue = np.asarray(trace.issue_s, dtype=float) if trace.issue_s else np.full(n, np.nan)
    issued = ~np.isnan(issue)
    dur = np.asarray(graph.duration_s, dtype=float)
    pred = np.asarray(trace.critical_pred, dtype=np.int64)
    # each task against its twin d micro-batches earlier
    x, y = grid.ids[1 + d:m_reduced - 1].ravel(), grid.ids[1:m_reduced - 1 - d].ravel()
    shift = start[x] - start[y]
    delta = _mode(shift, tol)
    if delta <= 0:
        return None
    px, py = pred[x], pred[y]
    both = (px >= 0) & (py >= 0)
    same_pred = ((px < 0) & (py < 0)) | (both & (grid.row[px] >= 0) & (grid.row[py] >= 0)
                                         & (grid.row[px] - grid.row[py] == d) & (grid.col[px] == grid.col[py]))
    host_step = issue[x] - issue[y]
    repeats = ((np.abs(shift - delta) <= tol) & (np.abs(end[x] - end[y] - delta) <= tol) & (dur[x] == dur[y])
               & (stream[x] == stream[y]) & (issued[x] == issued[y]) & same_pred
               & ~(host_step > delta + tol))  # a host falling behind would bind a little more every period
    in_step = ~issued[x] | (np.abs(host_step - delta) <= tol)
    edges = _edges(graph, cols, issued)
    same, same_host = _same_structure(grid, edges, d, n)
    loose = np.zeros(n, dtype=bool)
    loose[x] = repeats
    loose &= same
    lockstep = np.zeros(n, dtype=bool)
    lockstep[x] = in_step
    lockstep &= loose & same_host
    # the host in lockstep (its pairs count), else running ahead: then it may not hold up a task from the seam on
    found = _seam(graph, grid, cols, edges, lockstep, d, delta, tol, True, -np.inf)
    if found is None:
        found = _seam(graph, grid, cols, edges, loose, d, delta, tol, False, _host_binds_until(graph, cols, issue, tol))
    if found is None:
        return None
    seam, band = found
    return Fold(m_reduced, m, d, delta, seam, band, grid)


def _seam(graph: ExecutionGraph, grid: _Grid, cols: TaskColumns, edges: _Edges, repeats: np.ndarray, d: int,
          delta: float, tol: float, with_host: bool, not_before: float) -> tuple[float, tuple[float, float]] | None:
    """The earliest seam time T (after `not_before`) the module docstring's argument holds for, and the band of
    time around it in which every task starts repeating its twin; None if there is none. `repeats`: per task,
    whether it repeats its twin d micro-batches earlier; `with_host`: the host's pairs count (lockstep)."""
    start, end = cols.start, cols.end
    later = grid.twin(np.arange(len(repeats)), d)
    ahead = np.zeros(len(repeats), dtype=bool)  # repeated by its twin d micro-batches later
    ahead[later >= 0] = repeats[later[later >= 0]]
    keep = slice(None) if with_host else ~edges.host
    x, y = edges.x[keep], edges.y[keep]
    first, last = np.where(start[x] <= start[y], x, y), np.where(start[x] <= start[y], y, x)
    # what straddles a seam: influence pairs (by start) and running tasks; the earlier one must be repeated
    # by its twin, the later one repeat its own (and all between them: the band)
    lo, hi = np.concatenate([start[first], start]), np.concatenate([start[last], end])
    fine = np.concatenate([ahead[first] & repeats[last], ahead])
    starts = np.sort(start)
    halfway = (starts[:-1] + starts[1:]) / 2
    taus = halfway[(np.diff(starts) > 8 * tol) & (halfway > not_before)]  # well clear of any start
    unverified = np.sort(start[~repeats])

    def clean(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:  # every task starting in [lo, hi] repeats its twin
        return np.searchsorted(unverified, lo - 2 * tol, side="left") == np.searchsorted(unverified, hi + 2 * tol,
                                                                                         side="right")

    taus = taus[clean(taus, taus + 2 * delta)]  # the copied period and its twins a period later at least
    if not len(taus):
        return None
    at = np.concatenate([taus, taus + delta])  # both edges of the first copy
    near = (hi >= taus[0]) & (lo < taus[-1] + delta)  # only these straddle any of them
    bottom, top, top_bad = (v.reshape(2, -1) for v in _straddling(lo[near], hi[near], ~fine[near], at))
    band_lo = np.minimum(bottom.min(axis=0) + delta, taus)
    band_hi = np.maximum(top.max(axis=0), taus + 2 * delta)
    valid = np.all(top_bad < at.reshape(2, -1), axis=0) & clean(band_lo, band_hi)
    net = np.asarray(graph.mem_net_bytes, dtype=float)[cols.member_task]
    width = grid.ids.shape[1]
    for i in np.flatnonzero(valid).tolist():
        tau = float(taus[i])
        period = np.flatnonzero((start >= tau) & (start < tau + delta))
        slots = grid.col[period] * d + grid.row[period] % d  # a whole period: each task's twin once
        if len(period) != d * width or len(set(slots.tolist())) != len(period):  # (np.unique: numpy.ma on a cold call)
            continue
        mine = np.zeros(len(start), dtype=bool)
        mine[period] = True
        own = mine[cols.member_task]  # a period frees what it allocates: memory does not drift
        total = np.bincount(cols.member_class[own], net[own], cols.n_classes)
        scale = np.bincount(cols.member_class[own], np.abs(net[own]), cols.n_classes)
        if np.any(np.abs(total) > 1e-9 * np.maximum(scale, 1.0)):
            return None  # every whole period of the band allocates as much
        return tau, (float(band_lo[i] - 2 * tol), float(band_hi[i] + 2 * tol))
    return None


def _host_binds_until(graph: ExecutionGraph, cols: TaskColumns, issue: np.ndarray, tol: float) -> float:
    """The latest start of a host-issued task its host held up: it started at its issue, or (compute) ended at
    its issue plus host path, or (a collective) its launch delayed it. A host that runs further ahead every
    period changes nothing after that: the tasks' times do not depend on it."""
    t = np.flatnonzero(~np.isnan(issue))
    start, end = cols.start[t], cols.end[t]
    path = np.asarray(graph.host_path_s, dtype=float)[t]
    dur = np.asarray(graph.duration_s, dtype=float)[t]
    compute = cols.stream[t] == Stream.COMPUTE
    free = (issue[t] < start - tol) & np.where(compute, issue[t] + path < end - tol, issue[t] + path <= start + dur + tol)
    return float(start[~free].max(initial=-np.inf))


def fold_summary(graph: ExecutionGraph, trace: SimTrace, fold: Fold, cols: TaskColumns | None = None
                 ) -> FoldedSummary | None:
    """The full iteration's numbers from the reduced simulation (module docstring); None if the critical
    path does not pass through the verified band as a repeating segment. `cols`: as for find_fold."""
    n = fold.copies
    cols = cols or task_columns(graph, trace)
    start = cols.start
    iteration_reduced = float(cols.end.max())
    seam, delta = fold.seam_s, fold.period_s
    in_period = (start >= seam) & (start < seam + delta)
    # one period: its compute, and over [T, T + Delta) what no compute covers (all before the last backward)
    sweep = Sweep(cols, 0.0, iteration_reduced)
    seconds = breakdown_seconds(cols, sweep) + n * (compute_seconds(cols, in_period)
                                                    + sweep.seconds(seam, seam + delta, np.inf))
    per_class = [dict(zip(BREAKDOWN_KEYS, row, strict=True)) for row in seconds.tolist()]
    grid = fold.grid or _grid(graph, fold.simulated_micro_batches)
    if grid is None:
        return None
    path = np.asarray(critical_path(graph, trace, cols), dtype=np.int64)
    index = np.full(len(graph), -1, dtype=np.int64)
    index[path] = np.arange(len(path))
    twin = grid.twin(path, fold.period_micro_batches)  # a path task and its twin a period later, both verified
    lo, hi = fold.band_s
    ok = (twin >= 0) & (start[path] >= lo) & (start[twin] <= hi) & (index[twin] > np.arange(len(path)))
    if not ok.any():
        return None
    a = int(np.argmax(ok))
    b = int(index[twin[a]])
    by_cat = time_by_category(graph, trace, path, cols)
    for k, v in time_by_category(graph, trace, path[a + 1:b + 1], cols).items():
        by_cat[k] += n * v
    return FoldedSummary(iteration_reduced + n * delta, per_class, by_cat, len(path) + n * (b - a),
                         len(graph) + n * int(in_period.sum()))
