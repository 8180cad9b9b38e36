"""`trainsim sweep SWEEP.yaml`: a what-if grid (or a seeded random sample of it) over one base job, evaluated
in this process, in local worker processes or on Ray, resumable through the results store (--db).

The sweep file:

    name: a100-vs-h100            # optional: the study name in the store
    base:                         # a job (model/cluster/strategy/simulation), or the path of a job YAML
      model: {name: gpt2}
      cluster: {name: dgx-a100, nodes: 1}
      strategy: {global_batch: 64}
    grid:                         # dotted job keys -> the values to try (their cartesian product)
      cluster.gpu: [a100-80gb, h100-sxm]
      strategy.tp: [1, 2, 4]
    random: {samples: 4, seed: 0}  # optional: a seeded sample of the grid, without replacement
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import math
import os
import random
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from .errors import ConfigError
from .files import Outputs, OutputTarget, Payload, json_text, write_outputs
from .optimize.space import value_text

Opt = typer.Option

MAX_SWEEP_JOBS = 100_000
"""Jobs in one sweep (a grid larger than this is sampled with `random:`)."""
DEFAULT_TOP = 50
"""Rows the table shows without --top (--json writes all)."""

SECTIONS = ("model", "cluster", "strategy", "simulation")
_KINDS = {"int_type": "an integer", "float_type": "a number", "bool_type": "true or false",
          "string_type": "a string", "list_type": "a list", "literal_error": None}
EXAMPLE = "e.g. grid: {strategy.tp: [1, 2, 4]}"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class RandomSpec(_Strict):
    samples: int = Field(ge=1, le=MAX_SWEEP_JOBS, description="jobs drawn from the grid (all of it when fewer)")
    seed: int = Field(0, ge=0, le=2**63 - 1, description="the seed: the same seed draws the same jobs")


class SweepSpec(_Strict):
    name: str | None = Field(None, min_length=1, max_length=200, description="the study name in the store")
    base: dict[str, Any] | str = Field(description="a job (model/cluster/strategy/simulation) or a job YAML path")
    grid: dict[str, list[Any]] = Field(default_factory=dict, description="dotted job key -> values to try")
    random: RandomSpec | None = None


# ------------------------------------------------------------------------------------------- the file


def _section_models() -> dict[str, type[BaseModel]]:
    from .config import JobConfig

    out: dict[str, type[BaseModel]] = {}
    for s in SECTIONS:
        ann = JobConfig.model_fields[s].annotation
        assert isinstance(ann, type) and issubclass(ann, BaseModel)
        out[s] = ann
    return out


@functools.cache
def _job_keys() -> dict[str, Any]:
    """'section.key' -> its pydantic FieldInfo, for every job key."""
    return {f"{s}.{k}": info for s, spec in _section_models().items() for k, info in spec.model_fields.items()}


@functools.cache
def _adapter(dotted: str) -> TypeAdapter[Any]:
    info = _job_keys()[dotted]
    tp: Any = Annotated[info.annotation, *info.metadata] if info.metadata else info.annotation
    return TypeAdapter(tp, config=ConfigDict(strict=True, allow_inf_nan=False))


def _short(value: Any, limit: int = 40) -> str:  # noqa: ANN401
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _check_value(dotted: str, value: Any, field: str) -> None:  # noqa: ANN401
    """A value of one job key: its type and bounds, without the cross-key checks (those are per job)."""
    if value is None and dotted in ("model.name", "cluster.name"):
        raise ConfigError(field, f"{dotted} cannot be null", "name a model or cluster preset")
    if value is None:
        return  # the key's default
    try:
        _adapter(dotted).validate_python(value)
    except ValidationError as exc:
        err = exc.errors()[0]
        kind = _KINDS.get(str(err.get("type")), "")
        msg = f"must be {kind}, not {type(value).__name__}" if kind else str(err.get("msg", "invalid value"))
        raise ConfigError(field, f"{_short(value)}: {' '.join(msg.split())}", f"fix the value of {dotted}") from None


def _unknown_key(dotted: str, field: str) -> ConfigError:
    keys = list(_job_keys())
    bare = {k.split(".", 1)[1]: k for k in keys if not k.endswith(".name")}
    if dotted in bare:
        return ConfigError(field, f"'{dotted}' needs its section", f"write {bare[dotted]}")
    close = difflib.get_close_matches(dotted, keys, n=3, cutoff=0.6)
    if not close and "." in dotted:
        close = [bare[k] for k in difflib.get_close_matches(dotted.rsplit(".", 1)[1], list(bare), n=3)]
    hint = f"did you mean {' or '.join(close)}?" if close else \
        "use section.key with a section of model/cluster/strategy/simulation (trainsim simulate --help)"
    return ConfigError(field, f"'{dotted}' is not a job key", hint)


def _check_base(base: dict[str, Any], where: str) -> None:
    for section, keys in base.items():
        if section not in SECTIONS:
            close = difflib.get_close_matches(str(section), SECTIONS, n=1)
            raise ConfigError(f"{where}.{section}", "is not a job section",
                              f"did you mean {close[0]}?" if close else f"use {', '.join(SECTIONS)}")
        if not isinstance(keys, dict):
            raise ConfigError(f"{where}.{section}", f"must be a mapping of {section} keys, not "
                              f"{type(keys).__name__}", f"write {section}: followed by indented key: value lines")
        for key, value in keys.items():
            dotted = f"{section}.{key}"
            if dotted not in _job_keys():
                raise _unknown_key(dotted, f"{where}.{dotted}")
            _check_value(dotted, value, f"{where}.{dotted}")


def _validation_error(exc: ValidationError) -> ConfigError:
    errors = exc.errors()
    err = next((e for e in errors if e.get("type") == "extra_forbidden"), errors[0])  # a typo before what it hides
    loc = [str(x) for x in err.get("loc", ())]
    if "[key]" in loc:
        return ConfigError(".".join(loc[:-1]), "is not a job key", "use section.key, e.g. strategy.tp")
    # a value of `base: dict | str` fails both: name the field once, without pydantic's union branch
    loc = [x for x in loc if x not in ("dict[str,any]", "str", "dict[str,list[any]]")]
    field = ".".join(loc) or "SWEEP"
    kind = err.get("type")
    if kind == "extra_forbidden":
        close = difflib.get_close_matches(loc[-1], list(SweepSpec.model_fields) if len(loc) == 1 else
                                          list(RandomSpec.model_fields), n=1)
        return ConfigError(field, "is not a sweep key", f"did you mean {close[0]}?" if close else
                           "a sweep file has name, base, grid and random (see README)")
    if kind == "missing":
        fix = {"base": "add base: a job (model/cluster/strategy) or the path of a job YAML",
               "random.samples": "add samples: N"}.get(field, "add it")
        return ConfigError(field, "is missing", fix)
    if kind in ("model_type", "dict_type") and field in ("random", "grid"):
        example = "random: {samples: N, seed: S}" if field == "random" else EXAMPLE
        return ConfigError(field, f"must be a mapping, not {type(err.get('input')).__name__}", f"write {example}")
    if field == "base":
        return ConfigError(field, f"must be a job mapping or the path of a job YAML, not {type(err.get('input')).__name__}",
                           "write base: followed by model:/cluster:/strategy: lines, or base: job.yaml")
    if field.startswith("grid"):
        return ConfigError(field, f"must be a list of values, not {_short(err.get('input'))}", EXAMPLE)
    what = _KINDS.get(str(kind), "")
    msg = f"must be {what}, not {type(err.get('input')).__name__}" if what else str(err.get("msg", "invalid value"))
    return ConfigError(field, " ".join(msg.split()), f"got {_short(err.get('input'))}")


def load_sweep(path: str) -> SweepSpec:
    """Read and check a sweep file: one-line ConfigErrors naming the key and the fix."""
    from .files import load_yaml

    data = load_yaml(path, "SWEEP", what="sweep file", fix="pass an existing sweep YAML (see README)")
    if not isinstance(data, dict):
        raise ConfigError("SWEEP", f"{path} must hold a mapping with base: and grid:",
                          "see README (a sweep file has base:, grid:, and optionally random: and name:)")
    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as exc:
        raise _validation_error(exc) from None
    if isinstance(spec.base, str):
        from .config import load_yaml as load_job

        base_path = Path(spec.base)
        if not base_path.is_absolute():  # relative to the sweep file, wherever it is run from
            base_path = Path(path).parent / base_path
        spec.base = load_job(base_path, "base")
        where = f"base ({base_path})"
    else:
        where = "base"
    _check_base(spec.base, where)
    size = 1
    for dotted, values in spec.grid.items():
        field = f"grid.{dotted}"
        if dotted not in _job_keys():
            raise _unknown_key(dotted, field)
        if not values:
            raise ConfigError(field, "has no values", "list at least one value, e.g. [1, 2]")
        seen: set[str] = set()
        for v in values:
            _check_value(dotted, v, field)
            canon = repr(float(v)) if isinstance(v, int | float) and not isinstance(v, bool) else repr(v)
            if canon in seen:
                raise ConfigError(field, f"{_short(v)} is listed twice", "list each value once")
            seen.add(canon)
        size *= len(values)
    if spec.random is None and size > MAX_SWEEP_JOBS:
        raise ConfigError("grid", f"has {size:,} combinations, above the limit of {MAX_SWEEP_JOBS:,} jobs",
                          "sample it with random: {samples: N, seed: S}, or list fewer values")
    return spec


def sweep_jobs(spec: SweepSpec) -> list[dict[str, Any]]:
    """The job dicts of a checked sweep: the base with each grid combination set on it (a null value drops
    the key: its default), in grid order; with `random`, a seeded sample of them, still in grid order."""
    assert isinstance(spec.base, dict)
    keys = list(spec.grid)
    lists = [spec.grid[k] for k in keys]
    size = math.prod(len(v) for v in lists)
    if spec.random is not None and spec.random.samples < size:
        picks: Any = sorted(random.Random(spec.random.seed).sample(range(size), spec.random.samples))
    else:
        picks = range(size)
    jobs = []
    for index in picks:
        combo = []
        for values in reversed(lists):  # mixed radix, the last key fastest (itertools.product's order)
            index, i = divmod(index, len(values))
            combo.append(values[i])
        job = {s: dict(v) for s, v in spec.base.items()}
        for dotted, value in zip(keys, reversed(combo), strict=True):
            section, key = dotted.split(".", 1)
            part = job.setdefault(section, {})
            if value is None:
                part.pop(key, None)
            else:
                part[key] = value
        jobs.append(job)
    return jobs


def study_name(spec: SweepSpec) -> str:
    """The sweep's name, or 'sweep-' and a hash of its base, grid and sample."""
    if spec.name:
        return spec.name
    from .optimize.evaluate import canonical_json

    text = canonical_json({"base": spec.base, "grid": spec.grid,
                           "random": spec.random.model_dump() if spec.random else None})
    return "sweep-" + hashlib.sha256(text.encode()).hexdigest()[:12]


# ------------------------------------------------------------------------------------------ the output


def _column(dotted: str) -> str:
    section, key = dotted.split(".", 1)
    return section if key == "name" and section in ("model", "cluster") else key


def _sort_key(row: dict[str, Any]) -> tuple[int, float, float]:
    return (row.get("error") is not None, -(row.get("tokens_per_s") or 0.0), -(row.get("samples_per_s") or 0.0))


def print_sweep(rows: list[dict[str, Any]], varied: list[str], top: int | None, title: str) -> None:
    """The rows as a table, fastest first (errors last), `top` of them (None: all)."""
    from rich.console import Console
    from rich.table import Table

    ranked = sorted(rows, key=_sort_key)
    shown = ranked[:top] if top is not None else ranked
    table = Table(title=title, title_justify="left")
    cols = list(dict.fromkeys(_column(d) for d in varied))
    for c in cols:
        table.add_column(c, no_wrap=True)
    for name in ("iter s", "tokens/s", "MFU %", "peak GiB", "fits"):
        table.add_column(name, justify="right", no_wrap=True)
    errors = any(r.get("error") for r in shown)
    if errors:
        table.add_column("error", overflow="fold", min_width=20)
    for r in shown:
        fits = None if r.get("fits") is None else ("yes" if r["fits"] else "OOM")
        cells = [*(value_text(r.get(c)) for c in cols),
                 "-" if r.get("iteration_time_s") is None else f"{r['iteration_time_s']:.4g}",
                 "-" if r.get("tokens_per_s") is None else f"{r['tokens_per_s']:,.0f}",
                 "-" if r.get("mfu") is None else f"{100 * r['mfu']:.1f}",
                 "-" if r.get("peak_memory_gib") is None else f"{r['peak_memory_gib']:.1f}",
                 fits or "-"]
        table.add_row(*cells, *([r.get("error") or ""] if errors else []))
    Console().print(table)
    if len(shown) < len(ranked):
        print(f"(top {len(shown)} of {len(ranked)} rows; --top changes it, --json writes all)")


def _summary(rows: list[dict[str, Any]], evaluated: int, reused: int, wall_s: float) -> str:
    failed = sum(r.get("error") is not None for r in rows)
    oom = sum(r.get("fits") is False for r in rows)
    return (f"{len(rows)} jobs ({evaluated} simulated, {reused} from --db), {failed} refused, {oom} OOM, "
            f"{wall_s:.1f} s")


def _default_workers(n_jobs: int) -> int:
    return max(1, min(8, os.cpu_count() or 1, n_jobs))


def sweep_cmd(
    sweep: Annotated[str, typer.Argument(help="sweep YAML: base (a job or a job YAML path), grid (dotted job key "
                                         "-> values), optional random {samples, seed} and name")],
    db: Annotated[str | None, Opt("--db", help="DuckDB results store: finished jobs are kept there and not run "
                                  "again (resume a killed sweep by rerunning it); needs trainsim[search]")] = None,
    json_out: Annotated[str | None, Opt("--json", help="write the rows, evaluated/reused counts and wall time as "
                                        "JSON")] = None,
    jobs: Annotated[int | None, Opt(help="worker processes (default: CPU count, at most 8); with --ray, Ray tasks "
                                    "in flight (default: the cluster's CPUs)")] = None,
    ray: Annotated[str | None, Opt("--ray", help="evaluate on Ray: auto (a running cluster, else a local one) or a "
                                   "cluster address; needs trainsim[ray]")] = None,
    top: Annotated[int | None, Opt(help=f"print only the K fastest rows (default {DEFAULT_TOP})")] = None,
    quiet: Annotated[bool, Opt("-q", "--quiet", help="no table and no progress bar: one summary line")] = False,
) -> None:
    """Evaluate a grid of what-if jobs (GPU, network, nodes, degrees, ...) and rank them by throughput."""
    wall0 = time.perf_counter()
    outs = Outputs()
    if db == "":
        raise ConfigError("--db", "empty path", "pass a database file path such as runs.db")
    json_target = outs.add(json_out, "--json")
    db_target = outs.add(db, "--db")
    if db_target is not None and (db_target.to_stdout or db_target.in_place):
        raise ConfigError("--db", f"{db} is not a regular file", "pass a database file path such as runs.db")
    if jobs is not None and jobs < 1:
        raise ConfigError("--jobs", f"must be >= 1, got {jobs}", "pass a worker count, or leave it out for the default")
    if top is not None and top < 1:
        raise ConfigError("--top", f"must be >= 1, got {top}", "pass how many rows to print")
    spec = load_sweep(sweep)
    job_list = sweep_jobs(spec)
    from .api import check_compute_model
    from .config import parse_job

    sims = [j.get("simulation") for j in job_list]
    for learned in sorted({str(s.get("compute_model", "roofline")) for s in sims if isinstance(s, dict)}):
        # a bad model once, not as every row's error
        check_compute_model(parse_job({"simulation": {"compute_model": learned}}).simulation)
    study = study_name(spec)
    from .optimize.runners import Runner, import_ray, run_with_store

    if ray is not None:
        import_ray()
    store = None
    if db is not None:
        from .optimize.store import ResultsStore, import_duckdb

        import_duckdb()
    workers = jobs if jobs is not None else (0 if ray is not None else _default_workers(len(job_list)))
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from .console import progress_bar

    with Runner(workers, ray=ray) as runner:
        if db is not None:
            store = ResultsStore(db, "--db")
        try:
            with progress_bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                              TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
                              quiet=quiet) as bar:
                task = bar.add_task(f"sweep {study}", total=None)
                rows, evaluated, reused = run_with_store(
                    job_list, runner, store, study,
                    lambda done, total: bar.update(task, completed=done, total=total))
        finally:
            if store is not None:
                store.close()
    wall_s = time.perf_counter() - wall0
    payloads: dict[OutputTarget | None, Payload] = {}
    if json_target is not None:
        payloads[json_target] = json_text({"kind": "sweep", "study": study,
                                           "varied": list(dict.fromkeys(_column(d) for d in spec.grid)),
                                           "rows": rows, "evaluated": evaluated, "reused": reused,
                                           "wall_s": wall_s}, "--json")
    write_outputs(payloads)
    if outs.to_stdout:
        return
    if quiet:
        print(f"sweep {study}: {_summary(rows, evaluated, reused, wall_s)}")
        return
    title = f"sweep {study}: {_summary(rows, evaluated, reused, wall_s)}"
    print_sweep(rows, list(spec.grid), top or DEFAULT_TOP, title)
