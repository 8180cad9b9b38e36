"""The OOM message (issue 22 item 5): the largest component, with its GiB, and a change that fits."""

from __future__ import annotations

from trainsim.api import simulate
from trainsim.config import parse_job
from trainsim.optimize.oom_fixes import oom_fixes
from trainsim.sim.result import fullest_stage

GIB = 2**30


def _job(**strategy: object) -> object:
    return parse_job({"model": {"name": "llama3-8b", "seq_len": 2048}, "cluster": {"name": "dgx-a100", "nodes": 1},
                      "strategy": {"tp": 1, "pp": 1, "dp": 8, "micro_batch": 1, "global_batch": 8, **strategy}})


def test_oom_names_optimizer_states_and_a_sharding_fix_that_fits() -> None:
    job = _job()
    res = simulate(job)
    assert res.oom
    name, size = fullest_stage(res.memory).largest_component()
    # Llama 3 8B: 8,030,261,248 parameters x 12 B (fp32 master + two Adam moments), unsharded under DDP
    assert name == "optimizer states"
    assert abs(size - 8_030_261_248 * 12) < 1.0
    assert "optimizer states, 89.7 GiB" in fullest_stage(res.memory).over_line()
    assert "largest component: optimizer states" in res.advice[0]
    fixes = oom_fixes(job, res)
    assert fixes and any(f.change == {"zero": 1} for f in fixes)
    applied = simulate(_job(zero=1))  # the suggestion, applied, fits
    assert not applied.oom
    # ZeRO-1 over dp 8 leaves 12/8 B of optimizer state per parameter
    assert abs(fullest_stage(applied.memory).components_bytes["optimizer_states"] - 8_030_261_248 * 12 / 8) < 1.0


def test_reserved_is_at_least_allocated_and_drives_the_verdict() -> None:
    res = simulate(_job(zero=1))
    for m in res.memory:
        assert m.reserved_bytes >= m.peak_bytes
        assert m.fits == (m.reserved_bytes <= m.capacity_bytes)
    out = res.to_json()
    assert out["memory_per_stage"][0]["peak_reserved_bytes"] >= out["memory_per_stage"][0]["peak_allocated_bytes"]


def test_a_job_that_fits_gets_no_suggestions() -> None:
    job = _job(zero=3)
    res = simulate(job)
    assert not res.oom and oom_fixes(job, res) == []
