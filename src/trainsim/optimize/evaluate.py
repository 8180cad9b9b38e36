"""One job in, one flat row out: what a sweep, a search and the results store share.

`evaluate(job)` simulates a nested job dict (what `parse_job` takes) and returns one flat, picklable and
JSON-able row: every job key as its own column (the two `name` keys as `model` and `cluster`), the
results (throughput, MFU, memory, what dominates) and `key`, the job's identity for resuming. A job that
is invalid is a row with `error` set, never an exception.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
import types
import typing
from functools import cache
from typing import Any, Literal

from pydantic import BaseModel

from ..errors import ConfigError

RESULT_COLUMNS: dict[str, str] = {
    "device": "VARCHAR",
    "n_gpus": "BIGINT",
    "grad_accumulation": "BIGINT",
    "iteration_time_s": "DOUBLE",
    "tokens_per_s": "DOUBLE",
    "samples_per_s": "DOUBLE",
    "mfu": "DOUBLE",
    "hfu": "DOUBLE",
    "tflops_per_gpu": "DOUBLE",
    "peak_memory_gib": "DOUBLE",
    "memory_headroom_gib": "DOUBLE",
    "fits": "BOOLEAN",
    "dominant": "VARCHAR",
    "sim_wall_s": "DOUBLE",
    "error": "VARCHAR",
    "key": "VARCHAR",
    "job": "VARCHAR",
}
"""Result columns of a row and their SQL types (`dp`, the derived data-parallel degree, is the job column
`dp`; `job` is the canonical JSON of the job dict, `key` its hash)."""

NONDETERMINISTIC_COLUMNS = frozenset({"sim_wall_s"})
"""Columns that differ between two evaluations of one job (everything else is reproducible)."""

_NAME_COLUMNS = {"model": "model", "cluster": "cluster"}  # section -> the column of its `name` key
_SECTIONS = ("model", "cluster", "strategy", "simulation")


def job_key(job: Any) -> str:  # noqa: ANN401 - any job dict, even a malformed one
    """The job's identity: sha256 of its canonical JSON (sorted keys), 32 hex digits."""
    return hashlib.sha256(canonical_json(job).encode()).hexdigest()[:32]


def canonical_json(job: Any) -> str:  # noqa: ANN401
    """The job dict as compact JSON with sorted keys (values JSON cannot hold are written as their repr)."""
    return json.dumps(job, sort_keys=True, separators=(",", ":"), default=repr)


def _sql_type(annotation: Any) -> str:  # noqa: ANN401 - a pydantic field annotation
    """The SQL type of a pydantic field: ints BIGINT, floats DOUBLE, bools BOOLEAN, strings and literals
    VARCHAR, lists of floats DOUBLE[] (None is allowed in every column)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _sql_type(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(inner) == 1:
            return _sql_type(inner[0])
        raise TypeError(f"no SQL type for {annotation!r}")
    if origin is Literal:
        if all(isinstance(v, str) for v in typing.get_args(annotation)):
            return "VARCHAR"
        raise TypeError(f"no SQL type for {annotation!r}")
    if origin is list:
        return _sql_type(typing.get_args(annotation)[0]) + "[]"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "VARCHAR"  # a nested section (cluster.remote_memory): its canonical JSON
    scalar = {bool: "BOOLEAN", int: "BIGINT", float: "DOUBLE", str: "VARCHAR"}.get(annotation)
    if scalar is None:
        raise TypeError(f"no SQL type for {annotation!r}")
    return scalar


@cache
def job_columns() -> tuple[tuple[str, str, str, str], ...]:
    """(column, section, key, SQL type) of every job key, in section and field order: the two `name` keys
    are the columns `model` and `cluster`, every other key is its own name (api.keyword_sections)."""
    from ..api import keyword_sections
    from ..config import JobConfig

    routes = keyword_sections()
    out: list[tuple[str, str, str, str]] = []
    for section in _SECTIONS:
        spec = JobConfig.model_fields[section].annotation
        assert spec is not None
        for key, info in spec.model_fields.items():
            column = _NAME_COLUMNS[section] if key == "name" else key
            if key != "name" and routes.get(key) != section:
                raise TypeError(f"job key {section}.{key} has no column of its own")
            out.append((column, section, key, _sql_type(info.annotation)))
    return tuple(out)


def columns() -> dict[str, str]:
    """Every column of a row and its SQL type: the job columns, then the result columns."""
    cols = {c: t for c, _, _, t in job_columns()}
    clash = set(cols) & set(RESULT_COLUMNS)
    if clash:
        raise TypeError(f"job keys {sorted(clash)} clash with result columns")
    return {**cols, **RESULT_COLUMNS}


_INT64 = (-(2**63), 2**63 - 1)


def _typed(value: Any, sql: str) -> Any:  # noqa: ANN401
    """`value` as its column holds it (ints of float columns as floats), or None when it is not of the
    column's type or not finite (a malformed job's value: the row's error says what is wrong with it)."""
    if value is None:
        return None
    if sql.endswith("[]"):
        if not isinstance(value, list):
            return None
        items = [_typed(v, sql[:-2]) for v in value]
        return None if any(v is None for v in items) else items
    if sql == "BOOLEAN":
        return value if isinstance(value, bool) else None
    if sql == "VARCHAR":
        if isinstance(value, dict):
            return canonical_json(value)
        return value if isinstance(value, str) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if sql == "BIGINT":
        return value if isinstance(value, int) and _INT64[0] <= value <= _INT64[1] else None
    value = float(value)
    return value if math.isfinite(value) else None


def _job_values(job: Any) -> dict[str, Any]:  # noqa: ANN401
    """The job columns of a row: each key's value (typed), None where the job leaves it out."""
    row: dict[str, Any] = {}
    for column, section, key, sql in job_columns():
        part = job.get(section) if isinstance(job, dict) else None
        row[column] = _typed(part.get(key), sql) if isinstance(part, dict) else None
    return row


def evaluate(job: dict[str, Any]) -> dict[str, Any]:
    """Simulate one nested job dict and return its flat row (see the module doc); a ConfigError (or a
    strategy the engine cannot finish) becomes the row's one-line `error`, every result then None."""
    from ..api import simulate
    from ..sim.engine import SimulationError

    wall0 = time.perf_counter()
    row = _job_values(job)
    row.update(dict.fromkeys(RESULT_COLUMNS))
    row["job"] = canonical_json(job)
    row["key"] = job_key(job)
    try:
        result = simulate(job)
    except ConfigError as exc:
        row["error"] = exc.one_line()
    except SimulationError as exc:
        row["error"] = " ".join(f"strategy: {exc}".split())
    else:
        mem = result.memory
        breakdown = result.breakdown
        row.update({
            "dp": int(result.strategy["dp"]),
            "device": result.device,
            "n_gpus": int(result.n_gpus),
            "grad_accumulation": int(result.strategy["grad_accumulation"]),
            "iteration_time_s": float(result.iteration_time_s),
            "tokens_per_s": None if result.tokens_per_s is None else float(result.tokens_per_s),
            "samples_per_s": float(result.samples_per_s),
            "mfu": float(result.mfu),
            "hfu": float(result.hfu),
            "tflops_per_gpu": float(result.tflops_per_gpu),
            "peak_memory_gib": max(m.peak_bytes for m in mem) / 2**30 if mem else None,
            "memory_headroom_gib": min(m.capacity_bytes - m.peak_bytes for m in mem) / 2**30 if mem else None,
            "fits": not result.oom,
            "dominant": max(breakdown, key=lambda k: breakdown[k]) if breakdown else None,
        })
    row["sim_wall_s"] = time.perf_counter() - wall0
    return row
