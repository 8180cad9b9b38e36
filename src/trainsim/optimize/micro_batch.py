"""The largest micro-batch that fits in memory for a job's strategy (`trainsim simulate --max-micro-batch`).

The micro-batch must divide the global batch per data-parallel replica (global batch = micro-batch x dp x
micro-batches), so the candidates are those divisors. Peak memory grows with the micro-batch (activations,
logits and the hand-offs scale with it; states do not), so a binary search over the divisors settles it in a
few simulations, each the same event simulation `simulate` runs (micro-batches folded), with the same OOM
verdict: peak of the fullest stage against the GPU's capacity.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..api import simulate
from ..config import JobConfig
from ..errors import ConfigError
from ..sim.result import SimulationResult

GIB = 2**30


@dataclass(frozen=True)
class MicroBatchFit:
    """The largest micro-batch that fits (None: not even the smallest) and the next larger that does not."""

    micro_batch: int | None
    peak_bytes: float | None  # the fitting micro-batch's peak (fullest stage)
    capacity_bytes: float
    next_micro_batch: int | None  # the smallest candidate above it (None: it is the largest candidate)
    next_peak_bytes: float | None
    simulations: int

    def to_json(self) -> dict[str, Any]:
        def gib(x: float | None) -> float | None:
            return None if x is None else x / GIB

        return {"micro_batch": self.micro_batch, "peak_memory_gib": gib(self.peak_bytes),
                "capacity_gib": self.capacity_bytes / GIB, "next_micro_batch": self.next_micro_batch,
                "next_peak_memory_gib": gib(self.next_peak_bytes)}

    def describe(self) -> str:
        cap = self.capacity_bytes / GIB
        if self.micro_batch is None:
            assert self.next_micro_batch is not None and self.next_peak_bytes is not None
            return (f"no micro-batch fits: {self.next_micro_batch} needs {self.next_peak_bytes / GIB:.1f} GiB of "
                    f"{cap:.1f} GiB")
        assert self.peak_bytes is not None
        text = f"largest micro-batch that fits: {self.micro_batch} ({self.peak_bytes / GIB:.1f} of {cap:.1f} GiB)"
        if self.next_micro_batch is not None and self.next_peak_bytes is not None:
            text += f"; {self.next_micro_batch} would need {self.next_peak_bytes / GIB:.1f} GiB"
        return text


def micro_batch_candidates(global_batch: int, dp: int) -> list[int]:
    """Micro-batches a global batch allows with `dp` replicas: the divisors of global_batch / dp, ascending."""
    per_replica = global_batch // dp
    small = [d for d in range(1, int(per_replica**0.5) + 1) if per_replica % d == 0]
    return sorted({*small, *(per_replica // d for d in small)})


def _peak(result: SimulationResult) -> float:
    """The fullest stage's reserved peak: what the OOM verdict compares with the capacity."""
    return max(m.reserved_bytes for m in result.memory)


def largest_fitting_micro_batch(job: JobConfig, result: SimulationResult) -> MicroBatchFit:
    """Binary search over the candidates of `job` (whose simulation `result` is reused for its own micro-batch);
    the global batch stays the job's. A saved strategy tree fixes its micro-batch: refused in one line."""
    if job.strategy.tree is not None:
        raise ConfigError("--max-micro-batch", "a saved strategy tree (--strategy-tree) fixes its micro-batch",
                          "give the strategy as flags or keys, or drop --max-micro-batch")
    dp = int(result.strategy["dp"])
    candidates = micro_batch_candidates(result.global_batch, dp)
    capacity = result.memory[0].capacity_bytes
    peaks: dict[int, float] = {int(result.strategy["micro_batch"]): _peak(result)}
    runs = 0

    def peak(mb: int) -> float:
        nonlocal runs
        if mb not in peaks:
            runs += 1
            strategy = job.strategy.model_copy(update={"micro_batch": mb, "global_batch": result.global_batch})
            peaks[mb] = _peak(simulate(job.model_copy(update={"strategy": strategy})))
        return peaks[mb]

    lo, hi = 0, len(candidates) - 1  # the answer is the last index whose peak fits, or none
    best: int | None = None
    while lo <= hi:
        mid = (lo + hi) // 2
        if peak(candidates[mid]) <= capacity:
            best, lo = mid, mid + 1
        else:
            hi = mid - 1
    nxt = (best + 1) if best is not None else 0
    next_mb = candidates[nxt] if nxt < len(candidates) else None
    return MicroBatchFit(candidates[best] if best is not None else None,
                         peaks[candidates[best]] if best is not None else None, capacity, next_mb,
                         peak(next_mb) if next_mb is not None else None, runs)
