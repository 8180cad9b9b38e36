"""Proteus' HTAE scheduler (schedule 'dynamic'): per rank, a ready backward first, else the next forward
while fewer than max_ongoing micro-batches are in flight; played out on the stage costs."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainsim.api import simulate
from trainsim.strategy.schedules import dynamic_orders, one_f_one_b


def _inflight_max(order: list[tuple[str, int, int]]) -> int:
    live = peak = 0
    for ph, _, _ in order:
        live += 1 if ph == "F" else -1
        peak = max(peak, live)
    return peak


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 12), st.one_of(st.none(), st.integers(1, 8)),
       st.lists(st.floats(0.1, 5.0), min_size=6, max_size=6), st.lists(st.floats(0.1, 5.0), min_size=6, max_size=6))
def test_orders_are_complete_causal_and_capped(p: int, m: int, cap: int | None, f: list[float], b: list[float]) -> None:
    orders = dynamic_orders(f[:p], b[:p], m, cap)
    for order in orders:
        assert sorted(order) == sorted([("F", i, 0) for i in range(m)] + [("B", i, 0) for i in range(m)])
        fwd = [i for ph, i, _ in order if ph == "F"]
        assert fwd == list(range(m))  # forwards in micro-batch order
        assert all(order.index(("F", i, 0)) < order.index(("B", i, 0)) for i in range(m))
        assert _inflight_max(order) <= (m if cap is None else cap)
    assert orders[-1] == [x for i in range(m) for x in (("F", i, 0), ("B", i, 0))]  # last stage: F then its B


def test_cap_one_alternates_and_two_stages_is_1f1b() -> None:
    assert all(o == [x for i in range(5) for x in (("F", i, 0), ("B", i, 0))]
               for o in dynamic_orders([1.0] * 3, [2.0] * 3, 5, 1))
    assert dynamic_orders([1.0, 1.0], [2.0, 2.0], 6, 2) == [one_f_one_b(2, 6, r) for r in range(2)]


def test_a_fast_first_stage_runs_ahead_by_hand() -> None:
    """Stage 0: 1 s per forward, 2 s per backward; stage 1: 4 s and 8 s; cap 3. Stage 0 runs F0..F2 by t = 3
    and must stop (3 in flight); stage 1 runs F0 (1-5) then its backward B0 (5-13), which reaches stage 0
    at 13: B0, then F3, alternating from there."""
    o = dynamic_orders([1.0, 4.0], [2.0, 8.0], 6, 3)
    assert o[0][:5] == [("F", 0, 0), ("F", 1, 0), ("F", 2, 0), ("B", 0, 0), ("F", 3, 0)]
    assert _inflight_max(o[0]) == 3


def _job(schedule: str, cap: int | None = None) -> dict:
    return {"model": {"name": "gpt2"}, "cluster": {"name": "dgx-a100"},
            "strategy": {"pp": 4, "dp": 2, "global_batch": 32, "micro_batch": 2, "schedule": schedule,
                         "max_ongoing_micro_batch": cap}}


def test_dynamic_end_to_end_against_1f1b() -> None:
    """Balanced stages: HTAE with the cap at pp finishes as fast as 1F1B (the extra forwards fill idle
    slots) but middle stages hold more micro-batches; a cap of 1 is the slowest and leanest."""
    one = simulate(_job("1f1b"))
    dyn = simulate(_job("dynamic", 4))
    lean = simulate(_job("dynamic", 1))
    assert dyn.iteration_time_s == pytest.approx(one.iteration_time_s, rel=0.02)
    assert dyn.memory[1].activation_peak_bytes > one.memory[1].activation_peak_bytes
    assert lean.iteration_time_s > one.iteration_time_s
    assert lean.memory[0].activation_peak_bytes < one.memory[0].activation_peak_bytes
    assert dyn.strategy["schedule"] == "dynamic"


def test_cli_schedule_flags() -> None:
    base = [sys.executable, "-m", "trainsim", "simulate", "--model", "gpt2", "--cluster", "dgx-a100", "--pp", "4",
            "--dp", "2", "--global-batch", "32", "--micro-batch", "2", "-q"]
    ok = subprocess.run([*base, "--schedule", "dynamic", "--max-ongoing", "2"], capture_output=True, text=True,
                        timeout=120)
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run([*base, "--schedule", "gpipe", "--max-ongoing", "2"], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "max_ongoing_micro_batch" in bad.stderr
