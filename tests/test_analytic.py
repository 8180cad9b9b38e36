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
# batch (reduced-job pieces) vs single (the job's own program): measured within 0.3% here; pipelines whose stages
# share a node, which the two-stage reduced job cannot place alike, differ up to ~6%
BATCH_REL = 0.035
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
                                             (1, 1, 4, "full", 3, "1f1b", 1), (2, 2, 1, "selective", 3, "zb-h1", 1),
                                             (1, 2, 2, "none", 2, "1f1b", 2), (1, 2, 1, "none", 1, "dualpipev", 2),
                                             (2, 2, 2, "selective", 3, "dualpipev", 2)]:
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


DP_CASES = [  # (tp, pp, dp, zero): degrees and ZeRO stages the batch prices without lowering again
    (1, 1, 8, 0), (2, 1, 4, 1), (1, 2, 4, 1), (2, 2, 2, 3), (1, 2, 4, 3), (4, 2, 1, 3), (1, 1, 8, 3), (2, 2, 2, 2),
]


@pytest.mark.parametrize(("tp", "pp", "dp", "zero"), DP_CASES)
def test_dp_priced_terms_are_the_reduced_job_with_that_dp(tp: int, pp: int, dp: int, zero: int) -> None:
    """AnalyticBatch.dp_terms (compile.program.layer_sync + the comm model per degree) equals what lowering and
    annotating the reduced job at that data-parallel degree and ZeRO stage gives, layer by layer: gradient
    buckets, ZeRO-1/2 post-step gathers, ZeRO-3 gathers, stored states and the optimizer shard."""
    from trainsim.api import cluster_and_model

    base = {"model": {"name": "gpt2"}, "cluster": {"name": "dgx-a100"}, "simulation": {}}
    cl, model = cluster_and_model({**base, "strategy": {}})
    c = Candidate(tp, pp, dp, 1, 1, 1, tp > 1, 2, "selective", zero, True, False, False, "1f1b", 32)
    ab = AnalyticBatch(base, model, cl)
    terms = ab.dp_terms(c)
    reduced = 1 if pp == 1 else 2
    job = parse_job(ab._job(c, dp=dp, pp=reduced, zero=zero, micro_batch=2, recompute="selective", zb=False))
    rcl, _, tree = job_tree(job)
    costed = costed_program(tree, rcl, job.simulation)
    prec = costed.precision
    kinds = {la.name: la.kind for la in tree.model.layers}
    role = {name: {"embedding": "embedding", "transformer": "block"}.get(k, f"tail:{name}")
            for name, k in kinds.items()}
    checked = set()
    for ch in costed.program.chunks:
        for name in ch.layers:
            r = role[name]
            mine = [s for s in ch.grad_sync if s.layer == name]
            assert terms.reduce_s[r] == pytest.approx(sum(s.duration_s for s in mine), rel=1e-9, abs=1e-15), name
            post = [s for s in ch.post_step if s.layer == name]
            assert terms.post_s[r] == pytest.approx(sum(s.duration_s for s in post), rel=1e-9, abs=1e-15), name
            p, g, o = ch.layer_states[name]
            assert terms.state_bytes[r] == pytest.approx(p * prec.param_bytes + g * prec.grad_bytes
                                                         + o * prec.optimizer_bytes, rel=1e-9), name
            assert terms.optimizer_params[r] == pytest.approx(o, rel=1e-9), name
            for steps in (ch.fwd, ch.bwd):
                gathers = [s for s in steps if s.layer == name and s.label.endswith(".params:all_gather")]
                assert len(gathers) == (1 if terms.gather_bytes[r] > 0 else 0), name
                for s in gathers:
                    assert (s.size_bytes, s.duration_s) == pytest.approx((terms.gather_bytes[r], terms.gather_s[r]),
                                                                         rel=1e-9), name
            checked.add(r)
    assert zero != 3 or dp == 1 or any(terms.gather_s[r] > 0 for r in checked)
    assert zero == 0 or dp == 1 or any(terms.reduce_s[r] > 0 for r in checked)


def test_compute_pieces_do_not_depend_on_zero_1_or_2() -> None:
    """The compute key leaves ZeRO out: the reduced job's layer templates replay alike at ZeRO 0, 1 and 2 (3 adds
    its gathers, which the batch prices per degree)."""
    from trainsim.api import cluster_and_model
    from trainsim.sim.analytic import replay_layers

    base = {"model": {"name": "gpt2"}, "cluster": {"name": "dgx-a100"}, "simulation": {}}
    cl, model = cluster_and_model({**base, "strategy": {}})
    ab = AnalyticBatch(base, model, cl)
    out = []
    for zero in (0, 1, 2):
        c = Candidate(2, 2, 2, 1, 1, 1, True, 2, "full", zero, True, False, False, "1f1b", 32)
        job = parse_job(ab._job(c, dp=2, pp=2, zero=zero, micro_batch=2, recompute="full", zb=False))
        rcl, _, tree = job_tree(job)
        prog = costed_program(tree, rcl, job.simulation).program
        out.append([(name, pc.busy_s, pc.net_bytes, pc.peak_bytes) for ch in prog.chunks
                    for steps in (ch.fwd, ch.bwd) for name, pc in replay_layers(steps, 0.1).items()])
    assert out[0] == out[1] == out[2]


def test_batch_keys_leave_out_dp_and_zero() -> None:
    """Candidates that differ only in dp (beyond a node's worth) and ZeRO share one reduced job."""
    from trainsim.api import cluster_and_model

    base = {"model": {"name": "gpt2"}, "cluster": {"name": "dgx-a100", "nodes": 4}, "simulation": {}}
    cl, model = cluster_and_model({**base, "strategy": {}})
    cands = [Candidate(2, pp, 32 // (2 * pp), 1, 1, 1, True, 2, "none", zero, True, False, False, "1f1b", 64)
             for pp in (1, 2, 4) for zero in (0, 1, 3)]
    ab = AnalyticBatch(base, model, cl)
    est = ab.evaluate(cands)
    assert ab.reduced_jobs == 1 and ab.dp_trees == 3
    assert len({ab._key(c) for c in cands}) == 1 and bool((est.iteration_s > 0).all())
