"""What `trainsim report` reads: a job YAML or the `--json` of simulate, replay, search, sweep or validate.
The kind is read from the file, and the fields the report draws are validated here (pydantic), so a
damaged or foreign file is one line naming the field, never a traceback halfway through a page."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationError

from ..errors import ConfigError
from ..files import load_json

KINDS = ("simulation", "replay", "search", "sweep", "validation")
JOB_SUFFIXES = (".yaml", ".yml")


def _finite(x: float) -> float:
    if not math.isfinite(x):
        raise ValueError("must be a finite number")
    return x


def _positive(x: float) -> float:
    if not x > 0:
        raise ValueError("must be > 0")
    return x


Num = Annotated[float, AfterValidator(_finite)]
Positive = Annotated[float, AfterValidator(_finite), AfterValidator(_positive)]


class _Loose(BaseModel):
    model_config = ConfigDict(extra="allow")


class StageMemoryIn(_Loose):
    stage: int = 0
    static_bytes: Num = 0.0
    activation_peak_bytes: Num = 0.0
    peak_bytes: Num = 0.0


class SimulationIn(_Loose):
    iteration_time_s: Positive
    n_gpus: int
    model: str = "job"
    device: str = ""
    mfu: Num = 0.0
    tokens_per_s: Num | None = None
    tokens_per_s_per_gpu: Num | None = None
    samples_per_s: Num = 0.0
    samples_per_s_per_gpu: Num = 0.0
    strategy: dict[str, Any] = {}
    breakdown: dict[str, Num] = {}
    breakdown_per_stage: list[dict[str, Num]] = []
    critical_path_by_category: dict[str, Num] = {}
    memory_per_stage: list[StageMemoryIn] = []
    peak_memory_bytes: list[Num] = []
    memory_capacity_bytes: Num = 0.0
    oom: bool = False
    job: dict[str, Any] | None = None
    model_assumptions: list[str] = []
    placement: list[str] = []
    advice: list[str] = []


class EntryIn(_Loose):
    """A search JSON row: the strategy section and its results."""

    strategy: dict[str, Any] = {}
    n_gpus: int | None = None
    iteration_time_s: Num | None = None
    tokens_per_s: Num | None = None
    samples_per_s: Num | None = None
    mfu: Num = 0.0
    memory_headroom_gib: Num | None = None
    peak_memory_gib: Num | None = None


class NodesIn(_Loose):
    best: EntryIn | None = None


class SearchIn(_Loose):
    best: EntryIn | None = None
    top: list[EntryIn] = []
    simulated: list[EntryIn] = []
    pareto_gpus: list[EntryIn] = []
    per_nodes: list[NodesIn] = []
    pruned: dict[str, int] = {}
    space: int = 0
    evaluated: int = 0
    proven_optimal: bool = True
    wall_s: Num | None = None


class SweepRowIn(_Loose):
    iteration_time_s: Num | None = None
    tokens_per_s: Num | None = None
    samples_per_s: Num | None = None
    mfu: Num | None = None
    peak_memory_gib: Num | None = None
    memory_headroom_gib: Num | None = None
    n_gpus: int | None = None
    fits: bool | None = None
    error: str | None = None


class SweepIn(_Loose):
    rows: list[SweepRowIn]
    varied: list[str] | None = None
    study: str = ""


class ValidationRowIn(_Loose):
    row: int | None = None
    case_id: str = ""
    metric: str = ""
    predicted: Num | None = None
    measured: Num | None = None
    error_pct: Num | None = None
    group: str | None = None


class ValidationIn(_Loose):
    kind: str = "validation"
    summary: dict[str, Any] = {}
    rows: list[ValidationRowIn]
    skipped_by_reason: dict[str, int] = {}


class StepIn(_Loose):
    step: int
    measured_ms: Num
    replayed_ms: Num
    rank: int = 0


class ReplayIn(_Loose):
    paths: list[str] = []
    steps: list[StepIn] = []
    replay_error_pct: Num = 0.0
    measured_step_ms: Num = 0.0
    replayed_step_ms: Num = 0.0
    breakdown: dict[str, Num] = {}
    what_if: dict[str, Any] = {}
    assumptions: list[str] = []


SCHEMAS: dict[str, type[_Loose]] = {"simulation": SimulationIn, "search": SearchIn, "sweep": SweepIn,
                                    "validation": ValidationIn, "replay": ReplayIn}


@dataclass
class ReportInput:
    """One input of a report: its path, kind and (for a JSON) the validated data as plain dicts."""

    path: str
    kind: str
    data: dict[str, Any] | None  # None: a job YAML (simulated when the page is built)


def json_kind(data: Any, field: str) -> str:  # noqa: ANN401 - any JSON document
    """The kind of a trainsim --json output: its `kind` key, else (older files) the keys it has."""
    fix = "pass a job YAML or a file written by simulate, replay, search, sweep or validate with --json FILE"
    if not isinstance(data, dict):
        raise ConfigError(field, f"is a JSON {type(data).__name__}, not a trainsim result", fix)
    kind = data.get("kind")
    if kind in KINDS:
        return str(kind)
    if "summary" in data and "rows" in data:
        return "validation"  # validate writes its file kind (training_runs, vtrain, collectives, ...)
    if "iteration_time_s" in data and "breakdown" in data:
        return "simulation"
    if "best" in data and "pruned" in data:
        return "search"
    if "study" in data and "rows" in data:
        return "sweep"
    if "steps" in data and "replay_error_pct" in data:
        return "replay"
    raise ConfigError(field, "is not a trainsim result (no kind, and not the keys of any --json output)", fix)


def _validated(kind: str, data: dict[str, Any], field: str) -> dict[str, Any]:
    try:
        model = SCHEMAS[kind].model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err.get("loc", ()))
        raise ConfigError(f"{field}: {loc or kind}", f"{err.get('msg', 'invalid value')} in this {kind} JSON",
                          f"write it again with `trainsim {'validate' if kind == 'validation' else kind} ... "
                          f"--json FILE`") from None
    return model.model_dump()


def load_input(path: str, field: str = "INPUT") -> ReportInput:
    """Read one input and tell its kind (a job YAML is read when simulated, by the same loader as simulate)."""
    where = f"{field} {path}"
    if Path(path).suffix.lower() in JOB_SUFFIXES:
        return ReportInput(path, "simulation", None)
    data = load_json(path, where, what="trainsim --json output",
                     fix="pass a job YAML (.yaml) or the --json output of a trainsim command")
    kind = json_kind(data, where)
    return ReportInput(path, kind, _validated(kind, data, where))  # extra keys travel on unchanged
