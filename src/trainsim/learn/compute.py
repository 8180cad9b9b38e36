"""The learned compute model (`simulation.compute_model: learned:FILE`): a PredTOP stage-latency model
corrects the roofline's stage times, and the event simulation runs on the corrected steps.

The roofline costs every step first (the features the model reads are its times); the model then predicts
the job's slowest stage (one micro-batch's forward and backward: compute plus the tensor-parallel
communication it waits on), and every chunk's compute steps are scaled by the factor that gives that stage
its predicted time (and the host time of issuing it alike: compile.program.stretch_compute, so a host-paced
stage stretches too), the communication keeping the communication model's times. Everything downstream (the pipeline schedule,
data-parallel overlap, bandwidth sharing, memory) is the event simulation's, so the learned model works
wherever the roofline does: simulate, search, sweep and validate. PredTOP's own composition,
T = sum(t_i) + (B - 1) max(t_i) laid over the roofline's iteration, is kept beside it for comparison.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..compile.program import Program, Stream, stretch_compute
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


@dataclass(frozen=True)
class LearnedCorrection:
    """What the learned model changed in one job (SimulationResult.learned holds its JSON)."""

    model_path: str
    kind: str
    trained_on: str
    stages: tuple[LearnedStage, ...]
    roofline_iteration_s: float
    formula_iteration_s: float  # PredTOP's composition of the slowest stage over the roofline's iteration
    slowest_chunk: int  # the stage the model predicted (the one it was trained on: the bottleneck)
    outside: tuple[str, ...] = ()  # what of that stage lies outside the model's training ranges, GPU included
    note: str | None = None  # why the correction was not applied, or was extrapolated

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model_path, "kind": self.kind, "trained_on": self.trained_on,
                "roofline_iteration_s": self.roofline_iteration_s,
                "formula_iteration_s": self.formula_iteration_s, "slowest_chunk": self.slowest_chunk,
                "outside_training_range": list(self.outside), "note": self.note,
                "stages": [{"chunk": s.chunk, "pp_rank": s.pp_rank, "roofline_stage_s": s.roofline_stage_s,
                            "stage_s": s.stage_s, "compute_factor": s.compute_factor} for s in self.stages]}


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
    """Predict the job's slowest stage with the model of `learned:FILE` and scale the compute steps of every
    chunk by the factor that gives that stage its predicted time, in place (`program` is the roofline-costed
    program the roofline iteration was simulated from, on `device`).

    The slowest stage is what the model was trained on (a measured iteration constrains the bottleneck stage
    through the pipeline composition, not each stage apart), so its correction is the job's: one compute
    factor for every chunk. If that stage's graph features lie outside the ranges the model was trained on,
    or the job runs on a GPU the model was not trained on, the roofline's times are kept unless `extrapolate`
    (simulation.learned_extrapolation): a learned correction is trusted where it was learned only."""
    from .models import Fitted

    path = learned_path(compute_model)
    if path is None:
        raise ConfigError(field, f"'{compute_model}' is not a learned model", "use learned:FILE")
    fitted = Fitted.load(path, field)
    graphs = program_stage_graphs(program, roofline_iteration_s, peak_flops)
    slowest = max(range(len(graphs)), key=lambda i: graphs[i].base_stage_s)  # as stage_graph picks it to train
    g = graphs[slowest]
    devices = [d for d in fitted.meta.get("devices", "").split(",") if d]
    other_gpu = (f"GPU {device} (trained on {', '.join(devices)})",) if devices and device not in devices else ()
    outside = other_gpu + tuple(fitted.outside_domain(g))
    (stage_s,) = fitted.predict_stage_s([g])
    compute_s, comm_s = _stage_parts(program, slowest)
    lo, hi = FACTOR_RANGE
    factor = min(hi, max(lo, (float(stage_s) - comm_s) / compute_s)) if compute_s > 0 else 1.0
    if outside and not extrapolate:
        factor = 1.0
    stages: list[LearnedStage] = []
    for ch, graph in zip(program.chunks, graphs, strict=True):
        compute_c, comm_c = _stage_parts(program, ch.chunk)
        stretch_compute(ch, factor)
        stages.append(LearnedStage(ch.chunk, ch.pp_rank, graph.base_stage_s, compute_c * factor + comm_c, factor))
    formula = roofline_iteration_s + g.slots * (stages[slowest].stage_s - g.base_stage_s)
    note = None
    if outside:
        done = "extrapolated (learned_extrapolation)" if extrapolate else "not applied: the roofline's times kept"
        note = (f"the job's slowest stage lies outside the learned compute model's training ranges "
                f"({'; '.join(outside)}): its correction {done}")
    return LearnedCorrection(str(Path(path)), fitted.kind, fitted.meta.get("trained_on", ""), tuple(stages),
                             roofline_iteration_s, formula, slowest, outside, note)


__all__ = ["FACTOR_RANGE", "LearnedCorrection", "LearnedStage", "correct_program"]
