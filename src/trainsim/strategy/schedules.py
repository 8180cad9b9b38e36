"""Pipeline schedules as explicit per-rank orders of forward/backward work items.

Each item is (phase, micro_batch, virtual_chunk) with phase "F" or "B". The engine follows this
order on the compute stream, so the bubble and the in-flight activations come out of the
simulation instead of a formula (tests check them against the closed forms).
"""

from __future__ import annotations

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


def schedule_order(kind: str, p: int, m: int, rank: int, v: int = 1, max_ongoing: int | None = None) -> list[WorkItem]:
    if kind == "gpipe":
        return gpipe(p, m, rank)
    if kind == "1f1b":
        return one_f_one_b(p, m, rank, max_ongoing)
    if kind == "interleaved":
        return interleaved(p, m, rank, v)
    raise ValueError(f"unknown schedule {kind}")
