"""One validation row's outcome: what was predicted, what was measured, or why it was skipped."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

MEMORY_METRIC = "peak_mem_gib"  # the metric of a row compared for memory only (it measured no time)


@dataclass
class Outcome:
    """A compared (or skipped) row. `row` is the 0-based index of the data row in the input file.

    `metric` names the measured quantity in the row's own terms (iter_time_s, tflops_per_gpu, mfu_pct,
    samples_per_s, time_us, ...). `group` keys the ranking group (several strategies of one model in
    one source); `throughput_*` are what ranking compares (higher is better).

    `memory_*_gib` are the row's measured peak memory and trainsim's predicted peak of the pipeline stage the
    row measured (its mem_scope; the fullest stage where that is a maximum or unstated), in GiB (None where the row states no memory); `mem_kind` is what the measurement counts (allocated, reserved
    or unstated); `reserved_*_gib` a reserved peak the row states beside an allocated one and trainsim's (the
    caching allocator's) for the same stage; `oom_predicted` is trainsim's out-of-memory verdict (None when the row was not simulated).
    A row with a measured memory but no time metric has metric MEMORY_METRIC and no time prediction.
    """

    row: int
    case_id: str
    metric: str = ""
    predicted: float | None = None
    measured: float | None = None
    group: str | None = None
    throughput_pred: float | None = None
    throughput_meas: float | None = None
    skipped: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    memory_measured_gib: float | None = None
    memory_predicted_gib: float | None = None
    mem_kind: str | None = None
    oom_predicted: bool | None = None
    # a reserved peak the row states beside its allocated one (nanotron logs both), and trainsim's for that stage
    reserved_measured_gib: float | None = None
    reserved_predicted_gib: float | None = None

    @property
    def reserved_error_pct(self) -> float | None:
        """Signed error (%) of the predicted reserved peak: the row's own figure where its kind is reserved, else
        the reserved peak it states beside an allocated one; None without either."""
        if self.mem_kind == "reserved":
            return self.memory_error_pct
        if self.reserved_predicted_gib is None or not self.reserved_measured_gib:
            return None
        return (self.reserved_predicted_gib - self.reserved_measured_gib) / self.reserved_measured_gib * 100.0

    @property
    def memory_error_pct(self) -> float | None:
        """Signed error of the predicted peak memory in percent of the measured one (None without both)."""
        if self.memory_predicted_gib is None or not self.memory_measured_gib:
            return None
        return (self.memory_predicted_gib - self.memory_measured_gib) / self.memory_measured_gib * 100.0

    @property
    def error_pct(self) -> float | None:
        """Signed error of the prediction in percent of the measurement."""
        if self.predicted is None or self.measured is None or self.measured == 0:
            return None
        return (self.predicted - self.measured) / self.measured * 100.0


def skip(row: int, case_id: str, reason: str, **tags: str) -> Outcome:
    return Outcome(row=row, case_id=case_id, skipped=reason, tags=dict(tags))


def skip_category(reason: str) -> str:
    """The group a skip reason is counted in: its part before the first ': ' (a row mapper writes
    "<category>: <detail>"; the simulator's refusals "not expressible: <field>: ..." keep the field), with
    quoted values and numbers masked so that rows differing only in them share a group."""
    head, sep, rest = reason.partition(": ")
    if sep and head == "not expressible":
        head = f"{head}: {rest.partition(': ')[0]}"
    return re.sub(r"\b\d+(?:\.\d+)?\b", "N", re.sub(r"'[^']*'", "'...'", head)).strip()


def skips_by_reason(outcomes: Iterable[Outcome]) -> list[tuple[str, list[Outcome]]]:
    """Skipped outcomes grouped by skip_category, the largest group first (then by name)."""
    groups: dict[str, list[Outcome]] = defaultdict(list)
    for o in outcomes:
        if o.skipped is not None:
            groups[skip_category(o.skipped)].append(o)
    return sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
