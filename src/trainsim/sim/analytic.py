"""The analytic tier: one iteration in closed form from the costed per-layer templates the event engine runs.

Where the event engine plays every task of every micro-batch through streams, this tier reads the same
annotated steps (compile.program.Step: durations, host times, memory allocations; the pipeline sends,
gradient buckets and optimizer step of cost.annotate) and composes them with formulas:

1. Per layer and phase (forward, backward, and the zero-bubble schedule's weight-gradient half W): the
   template replayed as soon as possible, every stream in order and every task alone on its link (what
   optimize.bounds does for its lower bound). The compute stream's time per micro-batch is its busy time
   plus the waits its dependencies force (exposed TP/CP/EP collectives, ZeRO-3 gathers, offload loads),
   split by category; where the framework needs longer to issue the steps than the GPU to run them, the
   host time wins (compile.graph._htae_orders reads a stage the same way). Compute overlapped with
   gradient-stream work (ZeRO-3 gathers) runs slower by the overlap factor gamma (Proteus VI-C).
2. Per pipeline stage: the sums over its layers and chunks (`StageBatch`).
3. The pipeline formula (Narayanan et al. 2021; Qi et al. 2024 for ZB-H1), with c_r = a stage's forward +
   backward per micro-batch (+ its pipeline sends when the host waits on them, Megatron's batch_p2p_sync),
   m micro-batches, p stages, v virtual stages:
     1F1B, dynamic:  (m - 1) max_r c_r + sum_r (F_r + B_r + sends_r)
     GPipe:          (m - 1) (max_r F'_r + max_r B'_r) + sum_r (F_r + B_r + sends_r)
     interleaved:    m max_r c_r + (sum_r (F_r + B_r + sends_r) - max_r c_r) / v      (the bubble / v)
     ZB-H1:          m max_r (F + B + W)_r + sum_r (F_r + B_r + sends_r) - (F + B)_slowest
                     - (min(m, p) - 1) min(F, B, W)                                    (its smaller bubble)
   A cap on the micro-batches in flight k < p (max_ongoing_micro_batch) bounds the steady state by the
   round trip: cycle >= sum_r c_r / k (Little's law). DualPipeV, whose two-way order has no closed form here,
   is replayed instead (`replay_order`: its per-rank orders as a max-plus recurrence on the per-chunk costs,
   O(p m) per configuration), which also gives each stage's last backward and its activations at the peak.
4. After a stage's last backward (stage r ends sum_{r' < r} (B_r' / v + send) before stage 0): the
   gradient reduction still exposed after overlap with that backward (buckets launched as their layers
   finish: max(the last bucket, all buckets - the backward after the first one), or all of it without
   overlap) stretched by gamma where it overlaps, the tied-embedding sum, the optimizer step and the
   ZeRO parameter all-gather (or, overlapped with the next forward, what of it the first forward cannot hide).
5. Peak memory per stage: static states + the activations of the micro-batches in flight at once (1F1B:
   min(p - r, m); GPipe: m; interleaved: Megatron's warm-up + 1 chunks; ZB-H1: 1F1B's plus the output
   gradients its postponed W's hold) + the larger transient peak of one forward or backward.

It differs from the engine only in what the event schedule resolves (link sharing among concurrent flows,
the exact overlap, uneven fill and drain), never in the costs. Every array is per configuration (N) and
stage (P, padded): the same formula ranks a batch of strategies at once (optimize.analytic).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

import numpy as np

from ..compile.graph import split_backward
from ..compile.program import ChunkProgram, Program, Step, Stream
from ..strategy.schedules import ZERO_BUBBLE_KINDS, chunk_index, schedule_order

CATEGORIES = ("compute", "recompute", "tp", "cp", "ep", "dp", "offload")
"""Categories of a stage's compute-stream time per micro-batch (busy or waiting on a blocker)."""
SCHEDULES = ("1f1b", "gpipe", "interleaved", "zb-h1", "dynamic", "dualpipev")
_REPLAYED = SCHEDULES.index("dualpipev")
"""Schedules without a closed form here: `program_batch` replays their order (`replay_order`)."""
_WAIT_KINDS = frozenset(CATEGORIES) - {"compute", "recompute"}


@dataclass
class PhaseCost:
    """One layer's (or a chunk's) forward, backward or W per micro-batch, replayed as soon as possible."""

    busy_s: float = 0.0  # compute-stream occupancy: kernels, forced waits, gamma slowdown under ZeRO-3 gathers
    host_s: float = 0.0  # framework time to issue its steps
    parts: dict[str, float] = field(default_factory=dict)  # busy_s by CATEGORIES
    net_bytes: float = 0.0  # allocated minus freed
    peak_bytes: float = 0.0  # highest allocation above the level it started at
    # issued from a host that starts with the GPU (after a pipeline receive, Megatron's batch_p2p_sync): the
    # two-stage flow host -> GPU, max over steps k of (host time up to k + GPU time from k on)
    synced_s: float = 0.0
    # its host waits for the GPU inside it (Step.host_sync: a device-to-host read), so its host time reaches at least
    # the GPU's end through it: composed after another phase, that one's GPU work is waited for too
    host_waits: bool = False

    def add(self, other: PhaseCost) -> PhaseCost:
        """This phase followed by `other` (sums; the peak is other's on top of this one's net; the synced time
        composes as a flow line: max(this synced + other's GPU time, this host time + other synced); a host that
        waits in `other` waits for this one's GPU as well, so `other` runs its line after this one's, and the host is
        held to the result)."""
        parts = dict(self.parts)
        for k, v in other.parts.items():
            parts[k] = parts.get(k, 0.0) + v
        synced = max(self.synced_s + other.busy_s, self.host_s + other.synced_s)
        if other.host_waits:
            synced = max(synced, self.synced_s + other.synced_s)
        host = self.host_s + other.host_s
        return PhaseCost(self.busy_s + other.busy_s, max(host, synced) if other.host_waits else host, parts,
                         self.net_bytes + other.net_bytes,
                         max(self.peak_bytes, self.net_bytes + other.peak_bytes), synced,
                         self.host_waits or other.host_waits)

    def scaled(self, k: int) -> PhaseCost:
        """k copies in a row (k whole layers alike), as k - 1 calls of `add` would give."""
        if k <= 0:
            return PhaseCost()
        return PhaseCost(self.busy_s * k, self.host_s * k, {c: v * k for c, v in self.parts.items()},
                         self.net_bytes * k, self.peak_bytes + max(0.0, self.net_bytes) * (k - 1),
                         self.synced_s + (k - 1) * max(self.busy_s, self.host_s), self.host_waits)


def replay_layers(steps: list[Step], gamma: float) -> dict[str, PhaseCost]:
    """Per layer (in template order) the compute-stream time of one template replayed as soon as possible,
    every stream in order and every task alone. A wait before a compute step is charged to its layer, by
    the category of the step that released it; what the chain still runs after the last compute step
    (a closing TP all-reduce) to the layer of the step that ends last."""
    out: dict[str, PhaseCost] = {}
    synced_layers: set[str] = set()  # layers whose host waits for their GPU (Step.host_sync)
    start_level: dict[str, float] = {}
    grad_busy: dict[str, float] = {}
    end: list[float] = []
    free: dict[int, float] = {}
    last_on: dict[int, int] = {}  # stream -> its latest step
    cursor = level = 0.0
    tail_end, tail_layer, tail_cat = 0.0, "", "compute"
    for i, s in enumerate(steps):
        deps = (i - 1,) if s.deps is None and i > 0 else (s.deps or ())
        blockers = [*deps, last_on.get(s.stream, -1)]
        t0 = max([end[d] for d in deps] + [free.get(s.stream, 0.0)])
        e = t0 + s.duration_s
        end.append(e)
        free[s.stream] = e
        last_on[s.stream] = i
        pc = out.get(s.layer)
        if pc is None:
            pc = out[s.layer] = PhaseCost()
            start_level[s.layer] = level
            grad_busy[s.layer] = 0.0
        pc.peak_bytes = max(pc.peak_bytes, level + s.alloc_bytes - start_level[s.layer])
        level += s.alloc_bytes - s.free_bytes
        pc.net_bytes += s.alloc_bytes - s.free_bytes
        step_busy = 0.0
        if s.stream == Stream.COMPUTE:
            wait = t0 - cursor
            step_busy = max(wait, 0.0) + s.duration_s
            if wait > 0:
                blocker = max((b for b in blockers if b >= 0), key=lambda b: end[b], default=-1)
                cat = steps[blocker].category if blocker >= 0 else "compute"
                cat = cat if cat in _WAIT_KINDS else "compute"
                pc.parts[cat] = pc.parts.get(cat, 0.0) + wait
                pc.busy_s += wait
            cat = s.category if s.category in ("compute", "recompute") else "compute"
            pc.parts[cat] = pc.parts.get(cat, 0.0) + s.duration_s
            pc.busy_s += s.duration_s
            cursor = max(cursor, e)
        elif s.stream == Stream.GRAD:
            grad_busy[s.layer] += s.duration_s
        host = s.host_s if s.stream in (Stream.COMPUTE, Stream.FEATURE) else 0.0
        if s.host_sync and s.stream in (Stream.COMPUTE, Stream.FEATURE):  # the host waits for the GPU's work so far
            pc.host_s = max(pc.host_s, pc.synced_s)
            synced_layers.add(s.layer)
        pc.synced_s = max(pc.synced_s + step_busy, pc.host_s + max(step_busy, host))
        pc.host_s += host
        if s.stream in (Stream.COMPUTE, Stream.FEATURE) and e > tail_end:
            tail_end, tail_layer, tail_cat = e, s.layer, s.category
    if tail_end > cursor and tail_layer in out:
        pc = out[tail_layer]
        cat = tail_cat if tail_cat in CATEGORIES else "compute"
        pc.parts[cat] = pc.parts.get(cat, 0.0) + tail_end - cursor
        pc.busy_s += tail_end - cursor
        pc.synced_s += tail_end - cursor
    for name, pc in out.items():  # compute under a ZeRO-3 gather runs slower by gamma while they overlap
        slow = gamma * min(grad_busy[name], pc.parts.get("compute", 0.0) + pc.parts.get("recompute", 0.0))
        if slow > 0:
            pc.parts["compute"] = pc.parts.get("compute", 0.0) + slow
            pc.busy_s += slow
            pc.synced_s += slow
    for name in synced_layers:  # the next layer's wait starts from this one's GPU end: the host is held to its line
        pc = out[name]
        pc.host_s, pc.host_waits = max(pc.host_s, pc.synced_s), True
    return out


def combine(costs: list[PhaseCost]) -> PhaseCost:
    """Layers in the order they run, as one phase."""
    out = PhaseCost()
    for c in costs:
        out = out.add(c)
    return out


@dataclass
class ChunkCosts:
    """One chunk's phases per micro-batch, and its gradient buckets: what the stage sums read."""

    fwd: PhaseCost
    bwd: PhaseCost  # the whole backward (zero bubble: B, the input-gradient half)
    w: PhaseCost  # zero bubble: the weight-gradient half (else empty)
    reduce_s: float  # gradient reduction of all its buckets
    first_layer_reduce_s: float  # the bucket of its first layer (the last to be ready)
    last_layer_bwd_s: float  # backward of its last layer (the first bucket is ready after it)
    post_s: float  # ZeRO-1/2 parameter all-gather after the step


def chunk_costs(ch: ChunkProgram, zero_bubble: bool, gamma: float) -> ChunkCosts:
    """A costed chunk's phases and buckets (see the module doc)."""
    fwd = combine(list(replay_layers(ch.fwd, gamma).values()))
    if zero_bubble:
        b_half, w_half = split_backward(ch.bwd)
        bwd_layers = replay_layers(b_half, gamma)
        w = combine(list(replay_layers(w_half, gamma).values()))
    else:
        bwd_layers = replay_layers(ch.bwd, gamma)
        w = PhaseCost()
    bwd = combine(list(bwd_layers.values()))
    first = ch.layers[0] if ch.layers else ""
    last = bwd_layers.get(ch.layers[-1]) if ch.layers else None
    return ChunkCosts(fwd, bwd, w, sum(s.duration_s for s in ch.grad_sync),
                      sum(s.duration_s for s in ch.grad_sync if s.layer == first),
                      last.busy_s if last is not None else 0.0, sum(s.duration_s for s in ch.post_step))


@dataclass
class StageBatch:
    """What the formula reads, per configuration (N) and pipeline stage (P, zero-padded past `pp`).

    Seconds are per micro-batch unless named otherwise; a stage's values sum its v chunks."""

    pp: np.ndarray  # (N,) int
    vpp: np.ndarray  # (N,) int
    micro_batches: np.ndarray  # (N,) int
    schedule: np.ndarray  # (N,) int, index into SCHEDULES
    max_ongoing: np.ndarray  # (N,) int, 0: no cap
    overlap_grad_reduce: np.ndarray  # (N,) bool
    overlap_param_gather: np.ndarray  # (N,) bool
    host_sync: np.ndarray  # (N,) bool: the host waits on pipeline sends (p2p_host_sync)
    gamma: np.ndarray  # (N,)
    fwd_s: np.ndarray  # (N, P) GPU time (PhaseCost.busy_s)
    fwd_host_s: np.ndarray  # issue time (PhaseCost.host_s)
    fwd_sync_s: np.ndarray  # issued after a pipeline send (PhaseCost.synced_s; summed over the stage's chunks)
    bwd_s: np.ndarray  # the same for the backward (zero bubble: its input-gradient half B)
    bwd_host_s: np.ndarray
    bwd_sync_s: np.ndarray
    w_s: np.ndarray  # and for the zero-bubble weight-gradient half W (else zeros)
    w_host_s: np.ndarray
    w_sync_s: np.ndarray
    parts_s: np.ndarray  # (N, P, len(CATEGORIES)): fwd + bwd + w GPU time by category
    send_fwd_s: np.ndarray
    send_bwd_s: np.ndarray
    reduce_s: np.ndarray  # per iteration: every gradient bucket of the stage
    first_reduce_s: np.ndarray  # the bucket ready last (the stage's first layer)
    last_layer_bwd_s: np.ndarray  # the backward before the first bucket is ready
    embedding_s: np.ndarray  # per iteration: the tied-embedding gradient sum this stage joins
    optimizer_s: np.ndarray  # per iteration
    post_s: np.ndarray  # per iteration: ZeRO-1/2 parameter all-gather
    static_bytes: np.ndarray
    act_bytes: np.ndarray  # (N, P, V) kept by a chunk's forward until its backward, per virtual chunk
    fwd_peak_bytes: np.ndarray  # one chunk forward's transient peak (largest over the stage's chunks)
    bwd_peak_bytes: np.ndarray  # one chunk backward's peak with that chunk's activations held
    w_held_bytes: np.ndarray  # zero bubble: held between a micro-batch's B and its W
    # a schedule replayed instead of a closed form (DualPipeV; None: none in the batch): per stage the end of its
    # last backward-side item (B or W) from the start of the iteration, and the chunk forwards it holds per
    # virtual chunk at its activation peak, less the forward that reaches it (its transient peak sits on top)
    pipeline_end_s: np.ndarray | None = None
    held_chunks: np.ndarray | None = None

    @property
    def size(self) -> int:
        return len(self.pp)


@dataclass
class Estimate:
    """The formula's answers per configuration (N) and stage (P)."""

    iteration_s: np.ndarray  # (N,)
    breakdown_s: np.ndarray  # (N, P, len(BREAKDOWN_KEYS)) seconds per stage
    dynamic_bytes: np.ndarray  # (N, P) peak activations and transients
    peak_bytes: np.ndarray  # (N, P) static + dynamic (0 past pp)


def _stage_max(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return np.where(mask, x, -np.inf).max(axis=1)


def evaluate(b: StageBatch) -> Estimate:
    """The closed form of the module doc over a batch of configurations (numpy, no Python loop over N)."""
    from .result import BREAKDOWN_KEYS

    n, p_max = b.fwd_s.shape
    stage = np.arange(p_max)[None, :]
    p = b.pp[:, None]
    mask = stage < p
    m = b.micro_batches.astype(float)
    mm = m[:, None]
    v = b.vpp.astype(float)
    sched = b.schedule[:, None]
    replayed = sched == _REPLAYED
    sync = b.host_sync[:, None] & (p > 1) & ~replayed  # a replayed order prices its sends on the edges
    first, last = stage == 0, stage == p - 1
    # phases as (GPU, host, synced) triples; a stage's steady state as the flow lines between the host's waits on
    # its own pipeline sends (Megatron's batch_p2p_sync): 1F1B stage r sends after F unless last, after B unless
    # first, so the last stage runs F+B as one line, the first B+F, the others F and B apart
    fwd = (b.fwd_s, b.fwd_host_s, b.fwd_sync_s)
    bwd = (b.bwd_s, b.bwd_host_s, b.bwd_sync_s)
    wgt = (b.w_s, b.w_host_s, b.w_sync_s)
    free_f, free_b, free_w = (np.maximum(x[0], x[1]) for x in (fwd, bwd, wgt))  # host ahead: the slower side
    one_f = np.select([last, first], [_line(fwd, bwd)[2], _line(bwd, fwd)[2]], b.fwd_sync_s + b.bwd_sync_s)
    gp_f = np.where(last, free_f, b.fwd_sync_s)
    gp_b = np.where(first, free_b, b.bwd_sync_s)
    zb = np.select([last, first], [_line(wgt, fwd, bwd)[2], _line(bwd, wgt, fwd)[2]],
                   b.bwd_sync_s + _line(wgt, fwd)[2])
    cyc_sync = np.select([sched == 1, sched == 2, sched == 3], [gp_f + gp_b, b.fwd_sync_s + b.bwd_sync_s, zb],
                         one_f)
    work = np.where(mask, np.where(sync, cyc_sync, free_f + free_b + free_w), 0.0)  # a stage's compute per mb
    f_t = np.where(sync & (sched == 1), gp_f, free_f)
    b_t = np.where(sync & (sched == 1), gp_b, free_b)
    sends = np.where(mask, b.send_fwd_s + b.send_bwd_s, 0.0)
    cycle = work + np.where(sync, sends, 0.0)
    c_max = _stage_max(cycle, mask)
    total = (work + sends).sum(axis=1)
    # 1F1B (and dynamic, and a capped 1F1B): (m - 1) slowest stage + one micro-batch through every stage
    cap = np.where(b.max_ongoing > 0, np.minimum(b.max_ongoing, b.pp), b.pp).astype(float)
    t_pipe = (m - 1) * np.maximum(c_max, total / cap) + total
    gpipe = (m - 1) * (_stage_max(f_t + np.where(sync, b.send_fwd_s, 0.0), mask)
                       + _stage_max(b_t + np.where(sync, b.send_bwd_s, 0.0), mask)) + total
    inter = m * c_max + (total - c_max) / v
    slowest = np.argmax(np.where(mask, cycle, -np.inf), axis=1)
    w_t = np.where(mask, free_w, 0.0)
    fb_slow = (work - w_t)[np.arange(n), slowest]
    pf = np.maximum(b.pp.astype(float), 1.0)
    f_sum, b_sum, w_sum = (np.where(mask, x, 0.0).sum(1) for x in (free_f, free_b, free_w))
    mean_min = np.minimum(np.minimum(f_sum, b_sum), w_sum) / pf
    zb_t = m * c_max + total - w_t.sum(axis=1) - fb_slow - (np.minimum(m, b.pp) - 1) * mean_min
    t_pipe = np.select([b.schedule == 1, b.schedule == 2, b.schedule == 3], [gpipe, inter, zb_t], t_pipe)
    replay_end = np.zeros((n, p_max)) if b.pipeline_end_s is None else b.pipeline_end_s
    t_pipe = np.where(b.schedule == _REPLAYED, _stage_max(replay_end, mask), t_pipe)
    bw, w = np.where(mask, b_t, 0.0), w_t
    # each stage's last backward: the last micro-batch's backward reaches stage 0 last
    b_down = np.where(mask, bw / v[:, None] + np.where(sync, b.send_bwd_s, 0.0), 0.0)
    before = np.cumsum(b_down, axis=1) - b_down
    is_zb = sched == 3
    w_after = np.minimum(stage + 1, mm) * w  # ZB-H1: rank r runs its last r + 1 W's after its last B
    end = np.where(is_zb, t_pipe[:, None] - w[:, :1] - before + w_after, t_pipe[:, None] - before)
    end = np.where(mask, np.where(replayed, replay_end, end), 0.0)
    # gradient reduction after the last backward (overlapped: what the backward did not hide)
    ogr = b.overlap_grad_reduce[:, None]
    hidden_room = np.maximum(bw + w - b.last_layer_bwd_s, 0.0)
    exposed_ovl = np.maximum(np.maximum(b.first_reduce_s, b.reduce_s - hidden_room), 0.0)
    exposed = np.where(ogr, np.minimum(exposed_ovl, b.reduce_s), b.reduce_s)
    slow = np.where(ogr, b.gamma[:, None] * np.minimum(b.reduce_s - exposed, bw + w), 0.0)
    opg = b.overlap_param_gather[:, None]
    post = np.where(opg, 0.0, b.post_s)
    grad_tail = exposed + b.embedding_s + post
    finish = np.where(mask, end + slow + grad_tail + b.optimizer_s, 0.0)
    # overlapped parameter gather: the first forward waits for what it could not hide
    delay = np.where(b.overlap_param_gather, _stage_max(np.maximum(b.post_s - free_f, 0.0) / v[:, None], mask), 0.0)
    iteration = _stage_max(finish, mask) + delay
    # breakdown per stage
    keys = {k: i for i, k in enumerate(BREAKDOWN_KEYS)}
    out = np.zeros((n, p_max, len(BREAKDOWN_KEYS)))
    for j, cat in enumerate(CATEGORIES):
        out[:, :, keys[cat]] = np.where(mask, mm * b.parts_s[:, :, j], 0.0)
    out[:, :, keys["compute"]] += np.where(mask, slow + mm * (work - b.fwd_s - b.bwd_s - b.w_s), 0.0)  # issue waits
    busy = mm * work
    pp_exposed = np.where(mask & sync, np.minimum(mm * sends, np.maximum(end - busy, 0.0)), 0.0)
    out[:, :, keys["pp"]] = pp_exposed
    out[:, :, keys["dp"]] += np.where(mask, grad_tail + delay[:, None], 0.0)
    out[:, :, keys["optimizer"]] = np.where(mask, b.optimizer_s, 0.0)
    out[:, :, keys["bubble"]] = np.where(mask, np.maximum(end - busy - pp_exposed, 0.0), 0.0)
    accounted = out.sum(axis=2)
    out[:, :, keys["idle"]] = np.where(mask, np.maximum(iteration[:, None] - accounted, 0.0), 0.0)
    dynamic = _dynamic_bytes(b, mask, stage)
    peak = np.where(mask, b.static_bytes + dynamic, 0.0)
    return Estimate(iteration, out, dynamic, peak)


def _line(*phases: tuple[np.ndarray, np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Phases issued one after the other as one flow line: (GPU, host, synced) of the whole (PhaseCost.add)."""
    gpu, host, synced = phases[0]
    for g, h, s in phases[1:]:
        gpu, host, synced = gpu + g, host + h, np.maximum(synced + g, host + s)
    return gpu, host, synced


def in_flight(b: StageBatch, stage: np.ndarray) -> np.ndarray:
    """(N, P) chunk forwards a stage holds at most before their backward, per schedule."""
    p, m, v = b.pp[:, None], b.micro_batches[:, None], b.vpp[:, None]
    cap = np.where(b.max_ongoing[:, None] > 0, b.max_ongoing[:, None], m)
    one_f = np.maximum(np.minimum(np.minimum(p - stage, cap), m), 1)
    inter = np.minimum((p - stage - 1) * 2 + (v - 1) * p + 1, m * v)
    sched = b.schedule[:, None]
    return np.select([sched == 1, sched == 2], [m, inter], one_f)


def _dynamic_bytes(b: StageBatch, mask: np.ndarray, stage: np.ndarray) -> np.ndarray:
    """Activations of the forwards in flight (the interleaved warm-up walks the virtual chunks p micro-batches
    at a time) but the last one, whose forward or backward transient peak sits on top."""
    n = in_flight(b, stage)  # (N, P)
    p = b.pp[:, None, None]
    v_max = b.act_bytes.shape[2]
    vc = np.arange(v_max)[None, None, :]
    per_round = p * b.vpp[:, None, None]
    rounds, rest = np.divmod(n[:, :, None], per_round)
    count = np.where(vc < b.vpp[:, None, None], rounds * p + np.clip(rest - vc * p, 0, p), 0)  # (N, P, V)
    last_vc = ((n - 1) % (b.pp[:, None] * b.vpp[:, None])) // b.pp[:, None]
    last_act = np.take_along_axis(b.act_bytes, last_vc[:, :, None], axis=2)[:, :, 0]
    held = (count * b.act_bytes).sum(axis=2) - last_act
    if b.held_chunks is not None:  # a replayed order: what it holds at its peak (but the forward reaching it)
        held = np.where((b.schedule == _REPLAYED)[:, None], (b.held_chunks * b.act_bytes).sum(axis=2), held)
    transient = np.maximum(b.fwd_peak_bytes, b.bwd_peak_bytes)
    zb_w = np.where((b.schedule == 3)[:, None], np.minimum(stage, b.micro_batches[:, None]) * b.w_held_bytes, 0.0)
    return np.where(mask, np.maximum(held, 0.0) + transient + zb_w, 0.0)


def stack(batches: list[StageBatch]) -> StageBatch:
    """Several batches as one (stages padded to the widest)."""
    out: dict[str, np.ndarray] = {}
    for f in fields(StageBatch):
        arrays = [getattr(x, f.name) for x in batches]
        if all(a is None for a in arrays):  # an optional field no batch has
            out[f.name] = None  # type: ignore[assignment]
            continue
        if any(a is None for a in arrays):  # zeros where a batch has none (shaped like its activations)
            ndim = next(a.ndim for a in arrays if a is not None)
            arrays = [a if a is not None else np.zeros(x.act_bytes.shape[:ndim]) for a, x in zip(arrays, batches,
                                                                                                  strict=True)]
        if arrays[0].ndim == 1:
            out[f.name] = np.concatenate(arrays)
        else:
            width = [max(a.shape[k] for a in arrays) for k in range(1, arrays[0].ndim)]
            pad = [np.pad(a, [(0, 0)] + [(0, w - a.shape[k + 1]) for k, w in enumerate(width)]) for a in arrays]
            out[f.name] = np.concatenate(pad)
    return StageBatch(**out)


def program_batch(program: Program, optimizer_s: dict[int, float], static_bytes: dict[int, float], gamma: float,
                  host_sync: bool) -> StageBatch:
    """The one configuration of a costed program as a batch of one (its own chunk templates, sends and
    buckets; `optimizer_s` and `static_bytes` per pipeline rank as the event simulation takes them)."""
    tree = program.tree
    sched = tree.schedule
    pp, v = program.mesh.pp, sched.virtual_stages
    zb = sched.kind in ZERO_BUBBLE_KINDS
    costs = [chunk_costs(ch, zb, gamma) for ch in program.chunks]
    phases = ("fwd", "bwd", "w")
    rows: dict[str, list[float]] = {k: [0.0] * pp for k in (
        *phases, *(f"{x}_host" for x in phases), *(f"{x}_sync" for x in phases),
        "sf", "sb", "reduce", "first_reduce", "last_bwd", "emb", "post", "pf", "pb", "wh")}
    act = np.zeros((pp, v))
    parts = np.zeros((pp, len(CATEGORIES)))
    for ch, cc in zip(program.chunks, costs, strict=True):
        r = ch.pp_rank
        for key, pc in zip(phases, (cc.fwd, cc.bwd, cc.w), strict=True):
            rows[key][r] += pc.busy_s
            rows[f"{key}_host"][r] += pc.host_s
            rows[f"{key}_sync"][r] += pc.synced_s
            for j, cat in enumerate(CATEGORIES):
                parts[r, j] += pc.parts.get(cat, 0.0)
        rows["sf"][r] += ch.send_fwd_s
        rows["sb"][r] += ch.send_bwd_s
        rows["reduce"][r] += cc.reduce_s
        rows["post"][r] += cc.post_s
        act[r, ch.vchunk] = cc.fwd.net_bytes
        rows["pf"][r] = max(rows["pf"][r], cc.fwd.peak_bytes)
        rows["pb"][r] = max(rows["pb"][r], cc.fwd.net_bytes + cc.bwd.peak_bytes)
        rows["wh"][r] = max(rows["wh"][r], cc.fwd.net_bytes + cc.bwd.net_bytes if zb else 0.0)
        if ch.vchunk == 0:
            rows["first_reduce"][r] = cc.first_layer_reduce_s
        if ch.vchunk == v - 1:
            rows["last_bwd"][r] = cc.last_layer_bwd_s
    emb = [ch for ch in program.chunks if ch.embedding_grad_bytes > 0]
    if len(emb) >= 2 and emb[0].pp_rank != emb[-1].pp_rank:
        rows["emb"][emb[0].pp_rank] += program.embedding_sync_s
        rows["emb"][emb[-1].pp_rank] += program.embedding_sync_s
    replayed: dict[str, np.ndarray] = {}
    if sched.kind == SCHEDULES[_REPLAYED]:
        def free(pc: PhaseCost) -> float:
            return max(pc.busy_s, pc.host_s)  # the host ahead: the slower side

        ends, held = replay_order(sched.kind, pp, sched.n_micro_batch, v,
                                  [(ch.pp_rank, ch.vchunk, free(cc.fwd), free(cc.bwd), free(cc.w), ch.send_fwd_s,
                                    ch.send_bwd_s) for ch, cc in zip(program.chunks, costs, strict=True)],
                                  host_sync and pp > 1)
        replayed = {"pipeline_end_s": ends[None], "held_chunks": held[None]}
    return StageBatch(
        pp=np.array([pp]), vpp=np.array([v]), micro_batches=np.array([sched.n_micro_batch]),
        schedule=np.array([SCHEDULES.index(sched.kind)]), max_ongoing=np.array([sched.max_ongoing_micro_batch or 0]),
        overlap_grad_reduce=np.array([tree.overlap_grad_reduce]),
        overlap_param_gather=np.array([tree.overlap_param_gather]), host_sync=np.array([host_sync]),
        gamma=np.array([gamma]), **{f"{k}_s": np.array([rows[k]]) for k in rows if k.split("_")[0] in phases},
        parts_s=parts[None], send_fwd_s=np.array([rows["sf"]]),
        send_bwd_s=np.array([rows["sb"]]), reduce_s=np.array([rows["reduce"]]),
        first_reduce_s=np.array([rows["first_reduce"]]), last_layer_bwd_s=np.array([rows["last_bwd"]]),
        embedding_s=np.array([rows["emb"]]), optimizer_s=np.array([[optimizer_s.get(r, 0.0) for r in range(pp)]]),
        post_s=np.array([rows["post"]]), static_bytes=np.array([[static_bytes.get(r, 0.0) for r in range(pp)]]),
        act_bytes=act[None], fwd_peak_bytes=np.array([rows["pf"]]),
        bwd_peak_bytes=np.array([rows["pb"]]), w_held_bytes=np.array([rows["wh"]]), **replayed)


def replay_order(kind: str, pp: int, m: int, v: int, chunks: list[tuple[int, int, float, float, float, float, float]],
                 host_sync: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """A schedule's per-rank orders (strategy.schedules) played as a max-plus recurrence: each item starts when its
    rank finished the item before it and its inputs arrived (a forward the previous chunk's forward plus that
    chunk's send, a backward its own forward and the next chunk's backward plus its send, a W its B). `chunks`: per
    pipeline chunk in order (rank, virtual chunk, F, B, W seconds per micro-batch, forward send, backward send).
    `host_sync`: the rank's host waits for each of its sends to finish before it issues the next item (Megatron's
    batch_p2p_sync, the engine's p2p_host_sync). Returns per rank the end of its last B or W, and the chunk
    forwards it holds per virtual chunk at its activation peak (F to B) less the forward that reaches the peak.
    Exact for the orders on these costs; what it leaves to the event engine: links shared by concurrent sends, the
    host's own pace against the GPU's."""
    n_chunks = len(chunks)
    cost = {(r, vc): (f, b, w, sf, sb) for r, vc, f, b, w, sf, sb in chunks}
    orders = [schedule_order(kind, pp, m, r, v) for r in range(pp)]
    # each item compiled once: the slots (phase, micro-batch, chunk) it waits on (its own chunk's earlier phase
    # ended, the neighbouring chunk's hand-off arrived; -1: none) and its own, its seconds and its send's
    slot = {"F": 0, "B": m * n_chunks, "W": 2 * m * n_chunks}
    items: list[list[tuple[int, int, int, float, float, bool]]] = []
    for r in range(pp):
        row = []
        for ph, mb, vc in orders[r]:
            c = chunk_index(r, vc, pp, kind)
            f, b, w, sf, sb = cost[(r, vc)]
            at = mb * n_chunks + c
            own = slot["F"] + at if ph == "B" else slot["B"] + at if ph == "W" else -1
            hand = (slot["F"] + at - 1 if ph == "F" and c > 0 else
                    slot["B"] + at + 1 if ph == "B" and c < n_chunks - 1 else -1)
            row.append((own, hand, slot[ph] + at, f if ph == "F" else b if ph == "B" else w,
                        sf if ph == "F" else sb if ph == "B" else 0.0, ph != "F"))
        items.append(row)
    nan = math.nan
    ended, arrived = [nan] * (3 * m * n_chunks), [nan] * (3 * m * n_chunks)  # nan: not yet
    pos, free = [0] * pp, [0.0] * pp
    last_bw = np.zeros(pp)
    moved = True
    while moved:
        moved = False
        for r in range(pp):
            row, k, f_r = items[r], pos[r], free[r]
            while k < len(row):
                own, hand, me, dur, send, bw = row[k]
                e_own = ended[own] if own >= 0 else 0.0
                a_hand = arrived[hand] if hand >= 0 else 0.0
                if e_own != e_own or a_hand != a_hand:  # nan: what it waits on has not run yet
                    break
                end = max(f_r, e_own, a_hand) + dur
                ended[me] = end
                arrived[me] = end + send
                f_r = arrived[me] if host_sync else end
                if bw:
                    last_bw[r] = end
                k += 1
            if k > pos[r]:
                pos[r], free[r], moved = k, f_r, True
    if any(pos[r] < len(orders[r]) for r in range(pp)):
        raise ValueError(f"the {kind} orders deadlock (pp={pp}, m={m})")
    held = np.zeros((pp, v))
    for r in range(pp):
        count, top, best = [0] * v, -1, np.zeros(v)
        for ph, _, vc in orders[r]:
            if ph == "F":
                count[vc] += 1
                if sum(count) > top:
                    top, best = sum(count), np.array(count, dtype=float)
                    best[vc] -= 1  # the forward reaching the peak: its transient peak is counted on top
            elif ph == "B":
                count[vc] -= 1
        held[r] = best
    return last_bw, held
