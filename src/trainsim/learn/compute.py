"""The learned compute model (`simulation.compute_model: learned:FILE`): a PredTOP stage-latency model
corrects the roofline's stage times, and the event simulation runs on the corrected steps.

The roofline costs every step first (the features the model reads are its times); the model then predicts
each chunk's stage time (one micro-batch's forward and backward: compute plus the tensor-parallel
communication it waits on), and the chunk's compute steps are scaled so that the stage takes that long, the
communication keeping the communication model's times. Everything downstream (the pipeline schedule,
data-parallel overlap, bandwidth sharing, memory) is the event simulation's, so the learned model works
wherever the roofline does: simulate, search, sweep and validate. PredTOP's own composition,
T = sum(t_i) + (B - 1) max(t_i) laid over the roofline's iteration, is kept beside it for comparison.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..compile.program import Program, Stream
from ..config import learned_path
from ..errors import ConfigError
from .stage_graph import program_stage_graphs

# a chunk's compute is scaled by at most this much either way: the model's output is bounded (models.R_BOUND)
# but a stage whose predicted time falls below its communication would otherwise get no compute at all
FACTOR_RANGE = (0.05, 20.0)


@dataclass(frozen=True)
class LearnedStage:
    """One chunk under the learned model: its roofline and learned stage times and the compute scale."""

    chunk: int
    pp_rank: int
    roofline_stage_s: float
    stage_s: float
    compute_factor: float
    outside: tuple[str, ...] = ()  # what lies outside the model's training ranges, GPU included (correct_program)


@dataclass(frozen=True)
class LearnedCorrection:
    """What the learned model changed in one job (SimulationResult.learned holds its JSON)."""

    model_path: str
    kind: str
    trained_on: str
    stages: tuple[LearnedStage, ...]
    roofline_iteration_s: float
    formula_iteration_s: float  # PredTOP's composition of the slowest stage over the roofline's iteration
    note: str | None = None  # where the model is used outside what it was trained on

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model_path, "kind": self.kind, "trained_on": self.trained_on,
                "roofline_iteration_s": self.roofline_iteration_s,
                "formula_iteration_s": self.formula_iteration_s, "note": self.note,
                "stages": [{"chunk": s.chunk, "pp_rank": s.pp_rank, "roofline_stage_s": s.roofline_stage_s,
                            "stage_s": s.stage_s, "compute_factor": s.compute_factor,
                            "outside_training_range": list(s.outside)} for s in self.stages]}


def _stage_parts(program: Program, chunk: int) -> tuple[float, float]:
    """(compute-stream seconds, feature-communication seconds) of one chunk's forward and backward: the two
    parts of the stage time the model predicts (stage_graph._stage_steps sums the same steps)."""
    ch = program.chunks[chunk]
    steps = [*ch.fwd, *ch.bwd]
    compute = sum(s.duration_s for s in steps if s.stream == Stream.COMPUTE)
    comm = sum(s.duration_s for s in steps if s.stream == Stream.FEATURE)
    return compute, comm


def correct_program(compute_model: str, program: Program, roofline_iteration_s: float, peak_flops: float,
                    device: str, extrapolate: bool = False, field: str = "simulation.compute_model"
                    ) -> LearnedCorrection:
    """Predict every chunk's stage time with the model of `learned:FILE` and scale the chunk's compute steps
    in place (`program` is the roofline-costed program the roofline iteration was simulated from, on
    `device`). A stage whose graph features lie outside the ranges the model was trained on, or that runs on
    a GPU it was not trained on, keeps the roofline's times unless `extrapolate`
    (simulation.learned_extrapolation): a learned correction is trusted where it was learned only."""
    from .models import Fitted

    path = learned_path(compute_model)
    if path is None:
        raise ConfigError(field, f"'{compute_model}' is not a learned model", "use learned:FILE")
    fitted = Fitted.load(path, field)
    graphs = program_stage_graphs(program, roofline_iteration_s, peak_flops)
    predicted = fitted.predict_stage_s(graphs)
    stages: list[LearnedStage] = []
    lo, hi = FACTOR_RANGE
    devices = [d for d in fitted.meta.get("devices", "").split(",") if d]
    other_gpu = (f"GPU {device} (trained on {', '.join(devices)})",) if devices and device not in devices else ()
    outside = [other_gpu + tuple(fitted.outside_domain(g)) for g in graphs]
    for ch, graph, stage_s, out in zip(program.chunks, graphs, predicted, outside, strict=True):
        compute_s, comm_s = _stage_parts(program, ch.chunk)
        factor = min(hi, max(lo, (float(stage_s) - comm_s) / compute_s)) if compute_s > 0 else 1.0
        if out and not extrapolate:
            factor = 1.0
        for s in (*ch.fwd, *ch.bwd):
            if s.stream == Stream.COMPUTE:
                s.duration_s *= factor
        stages.append(LearnedStage(ch.chunk, ch.pp_rank, graph.base_stage_s, compute_s * factor + comm_s, factor,
                                   out))
    slowest = max(range(len(graphs)), key=lambda i: stages[i].roofline_stage_s)
    g = graphs[slowest]
    formula = roofline_iteration_s + g.slots * (stages[slowest].stage_s - g.base_stage_s)
    far = sorted({f for out in outside for f in out})
    note = None
    if far:
        done = "extrapolated (learned_extrapolation)" if extrapolate else "not applied: the roofline's times kept"
        note = (f"{sum(1 for o in outside if o)} of {len(graphs)} stages lie outside the learned compute model's "
                f"training ranges ({'; '.join(far)}): its correction {done}")
    return LearnedCorrection(str(Path(path)), fitted.kind, fitted.meta.get("trained_on", ""), tuple(stages),
                             roofline_iteration_s, formula, note)


__all__ = ["FACTOR_RANGE", "LearnedCorrection", "LearnedStage", "correct_program"]
