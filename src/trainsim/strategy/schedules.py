"""Pipeline schedules as explicit per-rank orders of forward/backward work items.

Each item is (phase, micro_batch, virtual_chunk) with phase "F" (forward), "B" (backward) or, for the
zero-bubble schedule, "W" (the weight-gradient half of a backward whose "B" then computes only the input
gradients). The engine follows this order on the compute stream, so the bubble and the in-flight
activations come out of the simulation instead of a formula (tests check them against the closed forms).
"""

from __future__ import annotations

import heapq
import math

WorkItem = tuple[str, int, int]


def gpipe(p: int, m: int, rank: int) -> list[WorkItem]:
    """All forwards, then all backwards (Huang et al. 2019): m micro-batches in flight."""
    return [("F", i, 0) for i in range(m)] + [("B", i, 0) for i in range(m)]


def one_f_one_b(p: int, m: int, rank: int, max_ongoing: int | None = None) -> list[WorkItem]:
    """PipeDream-flush / Megatron 1F1B: warm-up p-rank-1 forwards, then alternate (Narayanan et al. 2021).

    `max_ongoing` (Proteus' max_ongoing_micro_batch) caps the micro-batches a rank holds between its
    forward and its backward below the p - rank that 1F1B keeps: the warm-up shrinks to max_ongoing - 1
    (less activation memory, a longer pipeline fill); 1 runs each micro-batch's backward before the
    next forward."""
    inflight = p - rank if max_ongoing is None else max(1, min(p - rank, max_ongoing))
    warmup = min(inflight - 1, m)
    order: list[WorkItem] = [("F", i, 0) for i in range(warmup)]
    f, b = warmup, 0
    while f < m:
        order.append(("F", f, 0))
        f += 1
        order.append(("B", b, 0))
        b += 1
    order += [("B", i, 0) for i in range(b, m)]
    return order


def interleaved(p: int, m: int, rank: int, v: int) -> list[WorkItem]:
    """Megatron's interleaved 1F1B with v model chunks per rank (needs m % p == 0)."""
    total = m * v

    def fwd(k: int) -> WorkItem:
        group, within = divmod(k, p * v)
        chunk = within // p
        return ("F", group * p + within % p, chunk)

    def bwd(k: int) -> WorkItem:
        group, within = divmod(k, p * v)
        chunk = v - 1 - within // p
        return ("B", group * p + within % p, chunk)

    warmup = min((p - rank - 1) * 2 + (v - 1) * p, total)
    order = [fwd(k) for k in range(warmup)]
    f, b = warmup, 0
    while f < total:
        order.append(fwd(f))
        f += 1
        order.append(bwd(b))
        b += 1
    order += [bwd(k) for k in range(b, total)]
    return order


def dynamic_orders(fwd_s: list[float], bwd_s: list[float], m: int, max_ongoing: int | None = None,
                   send_fwd_s: list[float] | None = None, send_bwd_s: list[float] | None = None
                   ) -> list[list[WorkItem]]:
    """Per-rank orders chosen at run time by Proteus' HTAE scheduler (section VI-B), played out on the
    stages' costs: whenever a rank is free it runs a ready backward if there is one (prefer backward:
    it frees activations and unblocks the ranks before it), else the oldest ready forward while fewer
    than `max_ongoing` micro-batches are between their forward and backward there (default: all m).
    `fwd_s[r]` / `bwd_s[r]` are rank r's seconds per micro-batch, `send_*_s[r]` the hand-off from r.

    With balanced stages and max_ongoing = pp this is 1F1B; with unbalanced stages or a larger cap the
    order follows the costs (a fast stage runs ahead as far as the cap lets it)."""
    p = len(fwd_s)
    cap = m if max_ongoing is None else max(1, max_ongoing)
    sf = send_fwd_s or [0.0] * p
    sb = send_bwd_s or [0.0] * p
    f_ready = [[0.0] * m if r == 0 else [math.inf] * m for r in range(p)]
    b_ready = [[math.inf] * m for _ in range(p)]
    next_f = [0] * p
    done_b = [[False] * m for _ in range(p)]
    n_b = [0] * p
    free_at = [0.0] * p
    orders: list[list[WorkItem]] = [[] for _ in range(p)]
    events: list[tuple[float, int]] = [(0.0, r) for r in range(p)]  # (time a rank may decide, rank)
    while events:
        now, r = heapq.heappop(events)
        if now < free_at[r] - 1e-15 or len(orders[r]) == 2 * m:
            continue
        ready_b = [i for i in range(m) if not done_b[r][i] and b_ready[r][i] <= now + 1e-15]
        i_f = next_f[r]
        can_f = i_f < m and f_ready[r][i_f] <= now + 1e-15 and i_f - n_b[r] < cap
        if ready_b:
            i = ready_b[0]
            end = now + bwd_s[r]
            orders[r].append(("B", i, 0))
            done_b[r][i] = True
            n_b[r] += 1
            if r > 0:
                b_ready[r - 1][i] = end + sb[r]
                heapq.heappush(events, (b_ready[r - 1][i], r - 1))
        elif can_f:
            end = now + fwd_s[r]
            orders[r].append(("F", i_f, 0))
            next_f[r] += 1
            if r < p - 1:
                f_ready[r + 1][i_f] = end + sf[r]
                heapq.heappush(events, (f_ready[r + 1][i_f], r + 1))
            else:
                b_ready[r][i_f] = end
        else:
            waits = [t for t in (b_ready[r][i] for i in range(m) if not done_b[r][i]) if t > now]
            if i_f < m and i_f - n_b[r] < cap and f_ready[r][i_f] > now:
                waits.append(f_ready[r][i_f])
            if waits:
                heapq.heappush(events, (min(waits), r))
            continue
        free_at[r] = end
        heapq.heappush(events, (end, r))
    return orders


def zb_h1(p: int, m: int, rank: int) -> list[WorkItem]:
    """ZB-H1, the memory-efficient handcrafted schedule of Qi et al., "Zero Bubble Pipeline Parallelism"
    (ICLR 2024, section 2.1 and Figure 3 top; code: github.com/sail-sg/zero-bubble-pipeline-parallelism).

    Each backward is split into B (input gradients: the only part the previous stage waits for) and W
    (weight gradients, free to move). The skeleton is 1F1B's: rank r runs p - r forwards (1F1B's p - r - 1
    warm-up forwards plus the first of the steady state), then B, F, B, F, ... The W of micro-batch i
    follows its B on rank 0 and is postponed by r backwards on rank r; the postponed W's fill the cool-down,
    where 1F1B's late ranks sit idle. In steady state a rank runs B, W, F.

    Memory: a rank holds at most p - r micro-batches between F and B (1F1B's activations) and at most p
    between F and W (every rank as many as 1F1B's first; a W keeps only the GEMM inputs and output
    gradients, so rank 0 keeps 1F1B's peak). Time (F, B, W a stage's seconds per micro-batch, no
    communication): m (F + B + W) + (p - 1)(F + B) - (min(m, p) - 1) min(F, B, W), i.e. the paper's
    bubble (p - 1)(F + B - W) when m >= p and W <= F, B; against 1F1B's (p - 1)(F + B + W)."""
    warmup = min(p - rank, m)
    order: list[WorkItem] = [("F", i, 0) for i in range(warmup)]
    f, w = warmup, 0
    for b in range(m):
        order.append(("B", b, 0))
        if b >= rank:  # W postponed by `rank` backwards
            order.append(("W", w, 0))
            w += 1
        if f < m:
            order.append(("F", f, 0))
            f += 1
    order += [("W", i, 0) for i in range(w, m)]
    return order


def run_kind(schedule: str, vpp: int) -> str:
    """The schedule a strategy's `schedule` runs at `vpp` chunks per rank: 1F1B with virtual stages interleaves
    (Megatron); DualPipeV is its own two-chunk V."""
    return "interleaved" if vpp > 1 and schedule != "dualpipev" else schedule


ZERO_BUBBLE_KINDS = ("zb-h1", "dualpipev")
"""Schedules whose backwards are split into B (input gradients) and W (weight gradients) work items."""


def chunk_index(rank: int, vc: int, pp: int, kind: str) -> int:
    """The pipeline chunk that rank `rank` runs as its virtual chunk `vc`: vc x pp + rank (Megatron's
    interleaving); DualPipeV folds the 2 pp chunks into a V, its second chunk running back up the ranks, so
    rank 0 holds the first and the last chunk and rank pp - 1 the two middle ones."""
    if kind == "dualpipev" and vc == 1:
        return 2 * pp - 1 - rank
    return vc * pp + rank


def chunk_place(chunk: int, pp: int, kind: str) -> tuple[int, int]:
    """(pipeline rank, virtual chunk) of pipeline chunk `chunk` (`chunk_index` inverted)."""
    vc, rank = divmod(chunk, pp)
    if kind == "dualpipev" and vc == 1:
        rank = pp - 1 - rank
    return rank, vc


def dualpipev(p: int, m: int, rank: int) -> list[WorkItem]:
    """DualPipeV, the "cut-in-half" DualPipe of DeepSeek-V3 (arXiv 2412.19437 section 3.2.1; code:
    github.com/deepseek-ai/DualPipe, dualpipev.py): 2p chunks in a V (`chunk_index`: virtual chunk 0 runs down
    the ranks, 1 back up), each backward split as in zero bubble into B (input gradients) and W (weight
    gradients). Needs m >= 2p. Rank r runs eight phases (F0 / F1: a forward of chunk 0 / 1, B: a backward, W
    a postponed weight gradient, first in first out; "full" B: its W right after it):
    2(p - r - 1) F0 | r + 1 x (F0, F1) | p - r - 1 x (B1, W, F1) | m - 2p + r + 1 x (F0, full B1, F1, full B0)
    | p - r - 1 x (full B1, F1, full B0) | r + 1 x (B1, B0), the second half postponing W | p - r - 1 x (W, B0)
    | r + 1 x W. DualPipe runs each (F0, B1) and (F1, B0) pair of the steady state at once, one's compute
    under the other's all-to-alls: trainsim runs the pair in order on the compute stream and hides the
    expert-parallel all-to-alls under the other pass as strategy.ep_overlap prices them."""
    if m < 2 * p:
        raise ValueError(f"DualPipeV needs at least 2 x pp = {2 * p} micro-batches, got {m}")
    order: list[WorkItem] = []
    fwd, bwd = [0, 0], [0, 0]  # next micro-batch per virtual chunk
    postponed: list[tuple[int, int]] = []  # (micro-batch, chunk) of the B's whose W waits, oldest first
    head = 0

    def f(vc: int) -> None:
        order.append(("F", fwd[vc], vc))
        fwd[vc] += 1

    def b(vc: int, postpone: bool = False) -> None:
        order.append(("B", bwd[vc], vc))
        if postpone:
            postponed.append((bwd[vc], vc))
        else:
            order.append(("W", bwd[vc], vc))
        bwd[vc] += 1

    def w() -> None:
        nonlocal head
        mb, vc = postponed[head]
        head += 1
        order.append(("W", mb, vc))

    later, upto = p - rank - 1, rank + 1
    for _ in range(2 * later):
        f(0)
    for _ in range(upto):
        f(0)
        f(1)
    for _ in range(later):
        b(1, postpone=True)
        w()
        f(1)
    for _ in range(m - 2 * p + rank + 1):
        f(0)
        b(1)
        f(1)
        b(0)
    for _ in range(later):
        b(1)
        f(1)
        b(0)
    postpone = False
    for i in range(upto):  # the second half of these backwards postpones its W (an odd rank's from a B1 on)
        if i == upto // 2 and rank % 2 == 1:
            postpone = True
        b(1, postpone)
        if i == upto // 2 and rank % 2 == 0:
            postpone = True
        b(0, postpone)
    for _ in range(later):
        w()
        b(0, postpone=True)
    for _ in range(upto):
        w()
    return order


def schedule_order(kind: str, p: int, m: int, rank: int, v: int = 1, max_ongoing: int | None = None) -> list[WorkItem]:
    if kind == "gpipe":
        return gpipe(p, m, rank)
    if kind == "1f1b":
        return one_f_one_b(p, m, rank, max_ongoing)
    if kind == "interleaved":
        return interleaved(p, m, rank, v)
    if kind == "zb-h1":
        return zb_h1(p, m, rank)
    if kind == "dualpipev":
        return dualpipev(p, m, rank)
    raise ValueError(f"unknown schedule {kind}")
