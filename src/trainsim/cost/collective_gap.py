"""Why ASTRA-sim's number and trainsim's NCCL-like number differ for one collective, term by term.

Starting from ASTRA-sim's semantics, each term of `semantics.TERMS` is switched to its NCCL-like
setting in turn; the change in time at each switch is that term's part of the gap. The last switch
lands on the NCCL-like semantics, so the parts add up to the whole gap exactly. The order matters
when terms interact (a latency paid per chunk is cheaper once chunks pipeline); `TERMS` lists it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .semantics import NCCL, TERMS, Semantics, without


@dataclass(frozen=True)
class GapTerm:
    """One term: its name, what it is, and how much longer ASTRA-sim's time is for it (negative: shorter)."""

    name: str
    description: str
    delta_s: float


@dataclass(frozen=True)
class Gap:
    """ASTRA-sim's and the NCCL-like time of one collective and the terms between them."""

    astra_s: float
    nccl_s: float
    terms: tuple[GapTerm, ...]

    @property
    def gap_s(self) -> float:
        return self.astra_s - self.nccl_s

    def share(self, term: GapTerm) -> float:
        """The term's part of the gap (a fraction; nan when the two agree)."""
        return term.delta_s / self.gap_s if self.gap_s else float("nan")

    def as_dict(self) -> dict[str, object]:
        return {"astra_us": self.astra_s * 1e6, "nccl_us": self.nccl_s * 1e6, "gap_us": self.gap_s * 1e6,
                "terms": [{"term": t.name, "what": t.description, "delta_us": t.delta_s * 1e6,
                           "share": None if not self.gap_s else self.share(t)} for t in self.terms]}


def explain(time_of: Callable[[Semantics], float], sem: Semantics, terms: Sequence[tuple[str, str]] = TERMS) -> Gap:
    """Walk from `sem` to NCCL's semantics one term at a time; `time_of(semantics)` prices the collective."""
    cur, t_cur = sem, time_of(sem)
    start = t_cur
    out = []
    for name, what in terms:
        nxt = without(cur, name)
        if nxt == cur:
            continue
        t_next = time_of(nxt)
        out.append(GapTerm(name, what, t_cur - t_next))
        cur, t_cur = nxt, t_next
    if cur != NCCL:  # every ASTRA term has a switch in TERMS; a new field without one must fail loudly
        raise AssertionError(f"semantics left after every term: {cur}")
    return Gap(start, t_cur, tuple(t for t in out if t.delta_s != 0.0))


__all__ = ["Gap", "GapTerm", "explain"]
