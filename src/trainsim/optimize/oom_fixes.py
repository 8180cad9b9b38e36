"""What to change when a job does not fit (issue 22 item 5): the largest memory component of the fullest
stage, and the cheapest single change that fits, each candidate tried with the same simulation `simulate`
runs (same model, cluster and simulation settings; only the strategy field changed).

Candidates, cheapest first by what they cost the step: more ZeRO/FSDP sharding (communication only), then
recompute (selective, then full: extra forward work), then a smaller micro-batch (the largest that fits,
optimize.micro_batch; the global batch stays), then more tensor or pipeline parallelism (dp halves, the GPU
count stays). Each kept suggestion carries its predicted iteration time and reserved peak, so "cheapest" is
also ordered by the simulated step time among the changes that fit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..config import JobConfig
from ..errors import ConfigError
from ..sim.result import SimulationResult, fullest_stage

GIB = 2**30


@dataclass(frozen=True)
class OomFix:
    """One change that makes the job fit: the strategy keys it sets, the flag a user types, its result."""

    change: dict[str, Any]
    flags: str
    iteration_time_s: float
    peak_reserved_bytes: float
    capacity_bytes: float

    def to_json(self) -> dict[str, Any]:
        return {"change": self.change, "flags": self.flags, "iteration_time_s": self.iteration_time_s,
                "peak_reserved_gib": self.peak_reserved_bytes / GIB, "capacity_gib": self.capacity_bytes / GIB}

    def describe(self) -> str:
        return (f"fits with {self.flags}: {self.peak_reserved_bytes / GIB:.1f} of {self.capacity_bytes / GIB:.1f} "
                f"GiB reserved, {self.iteration_time_s:.3f} s per iteration")


def _candidates(job: JobConfig, result: SimulationResult) -> list[tuple[dict[str, Any], str]]:
    """(strategy update, flags) for each single change worth trying, cheapest kind first."""
    s, echo = job.strategy, result.strategy
    dp, tp, pp = int(echo["dp"]), int(echo["tp"]), int(echo["pp"])
    gb = int(echo["global_batch"])
    out: list[tuple[dict[str, Any], str]] = []
    if not s.fsdp and s.zero < 3 and dp > 1:
        for z in range(s.zero + 1, 4):
            out.append(({"zero": z}, f"--zero {z}"))
    if s.recompute == "none":
        out.append(({"recompute": "selective"}, "--recompute selective"))
    if s.recompute != "full":
        out.append(({"recompute": "full"}, "--recompute full"))
    for key, deg in (("tp", tp), ("pp", pp)):
        if dp % 2 == 0:
            upd: dict[str, Any] = {key: deg * 2, "global_batch": gb}
            if s.dp is not None:
                upd["dp"] = dp // 2
            out.append((upd, f"--{key} {deg * 2}" + (f" --dp {dp // 2}" if s.dp is not None else "")))
    return out


def oom_fixes(job: JobConfig, result: SimulationResult,
              simulate: Callable[[JobConfig], SimulationResult] | None = None, limit: int = 3) -> list[OomFix]:
    """Up to `limit` single changes that fit, cheapest (shortest predicted iteration) first; [] when the job
    fits or none of the candidates does. A saved strategy tree is not changed (its fields are the tree's)."""
    if not result.oom or job.strategy.tree is not None:
        return []
    if simulate is None:
        from ..api import simulate as run

        simulate = run
    fits: list[OomFix] = []
    for update, flags in _candidates(job, result):
        trial = job.model_copy(update={"strategy": job.strategy.model_copy(update=update)})
        try:
            res = simulate(trial)
        except ConfigError:  # a degree the model or cluster does not allow
            continue
        if not res.oom:
            st = fullest_stage(res.memory)
            fits.append(OomFix(update, flags, res.iteration_time_s, st.reserved_bytes, st.capacity_bytes))
    from .micro_batch import largest_fitting_micro_batch

    mb = int(result.strategy["micro_batch"])
    try:
        fit = largest_fitting_micro_batch(job, result)
    except ConfigError:
        fit = None
    if fit is not None and fit.micro_batch is not None and fit.micro_batch < mb:
        update = {"micro_batch": fit.micro_batch, "global_batch": int(result.strategy["global_batch"])}
        res = simulate(job.model_copy(update={"strategy": job.strategy.model_copy(update=update)}))
        if not res.oom:
            st = fullest_stage(res.memory)
            fits.append(OomFix(update, f"--micro-batch {fit.micro_batch}", res.iteration_time_s, st.reserved_bytes,
                               st.capacity_bytes))
    return sorted(fits, key=lambda f: f.iteration_time_s)[:limit]


def oom_report(job: JobConfig, result: SimulationResult) -> dict[str, Any]:
    """The OOM account for the JSON: the largest component and the suggestions (empty when it fits)."""
    if not result.oom:
        return {}
    st = fullest_stage(result.memory)
    name, size = st.largest_component()
    fixes = oom_fixes(job, result)
    return {"stage": st.stage, "largest_component": name, "largest_component_gib": size / GIB,
            "over_gib": (st.reserved_bytes - st.capacity_bytes) / GIB, "message": st.over_line(),
            "suggestions": [f.to_json() for f in fixes],
            "suggestion_lines": [f.describe() for f in fixes] or
            ["no single change tried (more ZeRO sharding, recompute, smaller micro-batch, tp/pp x2) fits"]}
