"""One validation row's outcome: what was predicted, what was measured, or why it was skipped."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Outcome:
    """A compared (or skipped) row. `row` is the 0-based index of the data row in the input file.

    `metric` names the measured quantity in the row's own terms (iter_time_s, tflops_per_gpu, mfu_pct,
    samples_per_s, time_us, ...). `group` keys the ranking group (several strategies of one model in
    one source); `throughput_*` are what ranking compares (higher is better).
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

    @property
    def error_pct(self) -> float | None:
        """Signed error of the prediction in percent of the measurement."""
        if self.predicted is None or self.measured is None or self.measured == 0:
            return None
        return (self.predicted - self.measured) / self.measured * 100.0


def skip(row: int, case_id: str, reason: str, **tags: str) -> Outcome:
    return Outcome(row=row, case_id=case_id, skipped=reason, tags=dict(tags))
