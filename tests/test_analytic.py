"""The analytic tier (simulation.fidelity analytic, sim/analytic.py; batched: optimize/analytic.py).

Checked against closed forms computed here from the costed steps (one stage: m micro-batches of forward and
backward, the gradient reduction, the optimizer step; uniform pipelines without communication: (m + p - 1) t
and the interleaved / ZB-H1 bubbles), against the event simulation on small jobs, the batch against the
single-configuration path, and through the CLI.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import one_line_error
from test_pipeline_schedules import pipeline

from trainsim.api import costed_program, job_tree, simulate
from trainsim.cli import main
from trainsim.compile.program import Stream
from trainsim.config import parse_job
from trainsim.cost.annotate import optimizer_time
from trainsim.optimize.analytic import AnalyticBatch
from trainsim.optimize.space import Candidate
from trainsim.sim.analytic import evaluate, program_batch

GPT2 = {"model": {"name": "gpt2"}, "cluster": {"name": "dgx-a100"}}

EVENT_REL = 0.05  # the analytic tier vs the event simulation on these small jobs (measured: within 4.3%)
BATCH_REL = 0.035  # batch (reduced-job pieces) vs single (the job's own program) (measured: within 3.3%)
MEM_REL = 0.01  # peak memory, analytic vs event (measured: exact but interleaved 0.08%, ZeRO-3 0.9%)


def _job(**strategy: object) -> dict:
    return {**GPT2, "strategy": strategy}


def test_one_stage_is_micro_batches_of_forward_and_backward_then_gradients_and_optimizer() -> None:
    """No pipeline, no overlap: m x (forward + backward) + every gradient bucket + the Adam step, each
    phase paced by the slower of the GPU and the host issuing it."""
    job = parse_job(_job(tp=1, pp=1, dp=8, micro_batch=4, global_batch=64, overlap_grad_reduce=False))
    cl, _, tree = job_tree(job)
    costed = costed_program(tree, cl, job.simulation)
    (ch,) = costed.program.chunks
    assert all(s.stream == Stream.COMPUTE for s in ch.fwd + ch.bwd)  # dp only: a serial chain of kernels

    def phase(steps: list) -> float:
        return max(sum(s.duration_s for s in steps), sum(s.host_s for s in steps))

    m = tree.schedule.n_micro_batch
    opt = optimizer_time(ch.optimizer_params_local, cl, costed.compute)
    expected = m * (phase(ch.fwd) + phase(ch.bwd)) + sum(s.duration_s for s in ch.grad_sync) + opt
    res = simulate({**_job(tp=1, pp=1, dp=8, micro_batch=4, global_batch=64, overlap_grad_reduce=False),
                    "simulation": {"fidelity": "analytic"}})
    assert m == 2 and res.iteration_time_s == pytest.approx(expected, rel=1e-9)
    assert res.breakdown["optimizer"] == pytest.approx(opt, rel=1e-9)
    assert sum(res.breakdown.values()) == pytest.approx(res.iteration_time_s, rel=1e-9)


def _analytic(run: object) -> float:
    prog = run.program
    p = prog.mesh.pp
    return float(evaluate(program_batch(prog, dict.fromkeys(range(p), 0.0), dict.fromkeys(range(p), 0.0), 0.0,
                                        False)).iteration_s[0])


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (4, 4), (8, 3), (2, 1)])
def test_uniform_pipeline_without_communication_is_the_closed_form(kind: str, p: int, m: int) -> None:
    """(m + p - 1)(tf + tb), the number the event simulation also gives (test_pipeline_schedules)."""
    r = pipeline(p, m, kind)
    assert _analytic(r) == pytest.approx((m + p - 1) * (r.tf + r.tb), rel=1e-9)
    assert _analytic(r) == pytest.approx(r.iteration_s, rel=1e-9)


@pytest.mark.parametrize(("p", "v", "m"), [(2, 2, 4), (4, 2, 8), (4, 3, 8)])
def test_interleaved_bubble_shrinks_by_the_virtual_stages(p: int, v: int, m: int) -> None:
    r = pipeline(p, m, "interleaved", v=v)
    assert _analytic(r) == pytest.approx((m + (p - 1) / v) * (r.tf + r.tb), rel=1e-9)


@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (4, 2)])
def test_zero_bubble_h1_is_its_closed_form(p: int, m: int) -> None:
    """Qi et al. 2024 (strategy.schedules.zb_h1): m (F + B + W) + (p - 1)(F + B) - (min(m, p) - 1) min(F, B, W)."""
    r = pipeline(p, m, "zb-h1")
    ch = r.program.chunks[1]  # a middle chunk: blocks only
    f = sum(s.duration_s for s in ch.fwd)
    w = sum(s.duration_s for s in ch.bwd if s.phase == "wgrad")
    b = sum(s.duration_s for s in ch.bwd) - w
    assert _analytic(r) == pytest.approx(m * (f + b + w) + (p - 1) * (f + b) - (min(m, p) - 1) * min(f, b, w),
                                         rel=1e-9)


SMALL_JOBS = [
    {"tp": 1, "pp": 1, "dp": 8, "micro_batch": 2, "global_batch": 64},
    {"tp": 2, "pp": 4, "dp": 1, "micro_batch": 2, "global_batch": 16},
    {"tp": 2, "pp": 2, "dp": 2, "micro_batch": 2, "global_batch": 32},
    {"tp": 1, "pp": 4, "dp": 2, "micro_batch": 2, "global_batch": 32, "schedule": "gpipe"},
    {"tp": 1, "pp": 4, "dp": 2, "micro_batch": 2, "global_batch": 32, "vpp": 3},
    {"tp": 1, "pp": 4, "dp": 2, "micro_batch": 2, "global_batch": 32, "schedule": "zb-h1"},
    {"tp": 2, "pp": 2, "dp": 2, "micro_batch": 2, "global_batch": 32, "zero": 3},
    {"tp": 2, "pp": 2, "dp": 2, "micro_batch": 2, "global_batch": 32, "zero": 1, "overlap_grad_reduce": False},
    {"tp": 2, "pp": 2, "dp": 2, "micro_batch": 2, "global_batch": 32, "recompute": "full",
     "sequence_parallel": True},
]


@pytest.mark.parametrize("strategy", SMALL_JOBS, ids=lambda s: " ".join(f"{k}={v}" for k, v in s.items()))
def test_analytic_is_close_to_the_event_simulation(strategy: dict) -> None:
    event = simulate(_job(**strategy))
    analytic = simulate({**_job(**strategy), "simulation": {"fidelity": "analytic"}})
    assert analytic.iteration_time_s == pytest.approx(event.iteration_time_s, rel=EVENT_REL)
    assert analytic.peak_memory_bytes == pytest.approx(event.peak_memory_bytes, rel=MEM_REL)
    assert analytic.model_flops == event.model_flops and analytic.strategy == event.strategy
    assert analytic.graph is None and analytic.trace is None and analytic.fidelity == "analytic"
    assert sum(analytic.breakdown.values()) == pytest.approx(analytic.iteration_time_s, rel=1e-6)
    assert any("analytic tier" in a for a in analytic.model_assumptions)


def test_default_stays_event() -> None:
    assert parse_job({}).simulation.fidelity == "event"
    res = simulate(_job(tp=2, pp=2, dp=2, global_batch=16))
    assert res.fidelity == "event" and res.graph is not None


def test_batch_agrees_with_the_single_configuration_path() -> None:
    base = {"model": {"name": "gpt2"}, "cluster": {"name": "dgx-a100"}, "simulation": {}}
    from trainsim.api import cluster_and_model

    cl, model = cluster_and_model({**base, "strategy": {}})
    cands = []
    for tp, pp, mb, rc, zero, sched, vpp in [(1, 1, 2, "none", 0, "1f1b", 1), (2, 2, 1, "selective", 1, "1f1b", 1),
                                             (2, 4, 2, "full", 3, "1f1b", 1), (1, 4, 1, "none", 1, "zb-h1", 1),
                                             (1, 2, 2, "none", 0, "1f1b", 3), (4, 2, 1, "selective", 0, "gpipe", 1),
                                             (1, 1, 4, "full", 3, "1f1b", 1)]:
        dp = 8 // (tp * pp)
        cands.append(Candidate(tp, pp, dp, 1, 1, vpp, tp > 1, mb, rc, zero, zero != 2, False, False, sched, 32))
    ab = AnalyticBatch(base, model, cl)
    est = ab.evaluate(cands)
    assert ab.reduced_jobs == len({ab._key(c) for c in cands})
    for i, c in enumerate(cands):
        single = simulate({**base, "strategy": c.strategy(), "simulation": {"fidelity": "analytic"}})
        assert est.iteration_s[i] == pytest.approx(single.iteration_time_s, rel=BATCH_REL), c
        assert est.mfu[i] == pytest.approx(single.mfu, rel=BATCH_REL), c
        assert est.peak_bytes[i] == pytest.approx(max(single.peak_memory_bytes), rel=1e-6), c
        assert bool(est.fits[i]) == (not single.oom)
    again = ab.evaluate(cands[::-1])  # cached pieces, any order: the same answers
    assert list(again.iteration_s[::-1]) == pytest.approx(list(est.iteration_s), rel=1e-12)


def test_cli_analytic_json_has_the_event_keys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--model", "gpt2", "--cluster", "dgx-a100", "--tp", "2", "--pp", "2", "--global-batch", "16",
            "-q"]
    main([*args, "--json", str(tmp_path / "e.json")])
    main([*args, "--fidelity", "analytic", "--json", str(tmp_path / "a.json"), "--report", str(tmp_path / "a.html")])
    event, analytic = (json.loads((tmp_path / f"{x}.json").read_text()) for x in ("e", "a"))
    assert set(analytic) == set(event) | {"model_assumptions"}  # gpt2 has none; the tier says it is analytic
    assert analytic["simulation_wall_s"] > 0 and analytic["job"]["simulation"]["fidelity"] == "analytic"
    assert analytic["iteration_time_s"] == pytest.approx(event["iteration_time_s"], rel=EVENT_REL)
    assert "the analytic tier" in (tmp_path / "a.html").read_text()
    main(["report", str(tmp_path / "a.json"), "-o", str(tmp_path / "r.html")])
    assert "the analytic tier" in (tmp_path / "r.html").read_text()


def test_cli_console_summary_says_analytic(capsys: pytest.CaptureFixture[str]) -> None:
    main(["simulate", "--model", "gpt2", "--cluster", "dgx-a100", "--global-batch", "16", "--fidelity", "analytic"])
    assert "analytic tier (closed form, no timeline)" in capsys.readouterr().out


def test_bad_fidelity_and_trace_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = one_line_error(["simulate", "--model", "gpt2", "--cluster", "dgx-a100", "--fidelity", "fast"], capsys)
    assert "simulation.fidelity" in err
    err = one_line_error(["simulate", "--model", "gpt2", "--cluster", "dgx-a100", "--fidelity", "analytic",
                          "--trace", str(tmp_path / "t.json")], capsys)
    assert "--trace" in err and not (tmp_path / "t.json").exists()
