"""Micro-batch folding (sim.periodic): a folded simulation gives the full simulation's numbers."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, reject, settings
from hypothesis import strategies as st

from trainsim.api import simulate
from trainsim.errors import ConfigError
from trainsim.sim.periodic import period_candidates, reduced_micro_batches

TINY_MOE = {"name": "mixtral-8x7b", "layers": 4, "hidden": 256, "heads": 8, "ffn": 512, "vocab": 1000}


def _numbers(result: Any) -> dict[str, Any]:  # noqa: ANN401
    out = result.to_json()
    out.pop("simulation_wall_s")
    return out


def _assert_same(full: Any, folded: Any, rel: float = 1e-9, path: str = "") -> None:  # noqa: ANN401
    """Every number of the JSON within `rel` (relative; absolute for values near zero), everything else equal."""
    if isinstance(full, dict):
        assert full.keys() == folded.keys(), path
        for k in full:
            _assert_same(full[k], folded[k], rel, f"{path}.{k}")
    elif isinstance(full, list):
        assert len(full) == len(folded), path
        for i, (a, b) in enumerate(zip(full, folded, strict=True)):
            _assert_same(a, b, rel, f"{path}[{i}]")
    elif isinstance(full, float) and not isinstance(full, bool):
        assert folded == pytest.approx(full, rel=rel, abs=1e-12), path
    else:
        assert full == folded, path


def _job(model: dict[str, Any], strategy: dict[str, Any], cluster: str = "dgx-a100",
         **sim: Any) -> dict[str, Any]:  # noqa: ANN401
    return {"model": model, "cluster": {"name": cluster}, "strategy": strategy, "simulation": sim}


def test_default_like_pipeline_folds_to_the_full_answer() -> None:
    """1F1B over 4 stages with 48 micro-batches: simulated on fewer, every number of the full run."""
    job = _job({"name": "gpt2", "layers": 8, "seq_len": 256},
               {"tp": 2, "pp": 4, "dp": 1, "micro_batch": 1, "global_batch": 48, "sequence_parallel": True})
    folded, full = simulate(job), simulate(job, timeline=True)
    assert folded.fold is not None and folded.fold.startswith("folded"), folded.fold
    assert folded.graph is None and folded.trace is None
    assert full.graph is not None and full.trace is not None and full.fold is None
    assert folded.n_tasks == full.n_tasks == len(full.graph)
    _assert_same(_numbers(full), _numbers(folded))


def test_one_more_micro_batch_adds_one_period() -> None:
    """In the steady state each extra micro-batch costs exactly the detected period."""
    strategy = {"pp": 4, "dp": 2, "micro_batch": 1, "recompute": "selective"}
    model = {"name": "gpt2", "layers": 8, "seq_len": 256}
    a = simulate(_job(model, {**strategy, "global_batch": 2 * 40}))
    b = simulate(_job(model, {**strategy, "global_batch": 2 * 41}))
    assert a.fold and b.fold and a.fold.startswith("folded") and b.fold.startswith("folded")
    period_ms = float(a.fold.split("(")[-1].split(" ms")[0])
    assert (b.iteration_time_s - a.iteration_time_s) * 1e3 == pytest.approx(period_ms, rel=1e-3)


def test_gpipe_and_few_micro_batches_are_simulated_in_full() -> None:
    """GPipe holds every micro-batch's activations (memory grows with m): never folded; neither is a job
    with too few micro-batches for folding to pay."""
    assert reduced_micro_batches("gpipe", 4, 1, 400, 1) == []
    assert reduced_micro_batches("dynamic", 4, 1, 400, 1) == []
    assert reduced_micro_batches("1f1b", 4, 1, 14, 1) == []  # 10 would not save a third of the work
    # a depth + 4 periods + 2, then 3 depths + 2 periods + 2, then twice that
    assert reduced_micro_batches("1f1b", 4, 1, 400, 1) == [10, 16, 32]
    assert reduced_micro_batches("1f1b", 4, 1, 30, 1) == [10, 16]  # 32 would not save half the work
    assert reduced_micro_batches("zb-h1", 4, 1, 400, 1) == [22, 32]  # zero bubble settles over four depths
    tries = reduced_micro_batches("interleaved", 4, 2, 400, 4)
    assert tries and all(m % 4 == 0 and (400 - m) % 4 == 0 and m < 400 for m in tries)
    r = simulate(_job({"name": "gpt2", "layers": 4, "seq_len": 128},
                      {"pp": 2, "dp": 4, "micro_batch": 1, "global_batch": 4 * 40, "schedule": "gpipe"}))
    assert r.fold is None and r.graph is not None


@st.composite
def pipelined_jobs(draw: st.DrawFn) -> dict[str, Any]:
    """An 8-GPU job with many micro-batches: pipelined (1F1B, interleaved or zero-bubble) or accumulating
    gradients without a pipeline, TP with or without SP, EP or CP, recompute, ZeRO, overlap flags and bandwidth
    sharing drawn too."""
    cluster = draw(st.sampled_from(["dgx-a100", "dgx-h100", "dgx-v100", "pcie-a100"]))
    kind = draw(st.sampled_from(["1f1b", "interleaved", "zb-h1", "dualpipev", "ep", "cp", "accumulate"]))
    model: dict[str, Any] = {"name": "gpt2", "layers": draw(st.sampled_from([4, 8])),
                             "seq_len": draw(st.sampled_from([128, 512]))}
    s: dict[str, Any] = {"pp": draw(st.sampled_from([2, 4])), "tp": draw(st.sampled_from([1, 2])), "cp": 1, "ep": 1}
    if kind == "interleaved":
        model["layers"] = 8
        s.update(pp=2, vpp=2)
    elif kind == "zb-h1":
        s["schedule"] = "zb-h1"
    elif kind == "dualpipev":  # 2 pp chunks of at least one layer each
        model["layers"] = 8
        s["schedule"] = "dualpipev"
    elif kind == "ep":
        model = {**TINY_MOE, "seq_len": model["seq_len"]}
        s.update(pp=2, ep=2)
    elif kind == "cp":
        s.update(pp=2, cp=2)
    elif kind == "accumulate":  # no pipeline: gradient accumulation over many micro-batches (the host runs ahead)
        model = {"name": draw(st.sampled_from(["gpt2", "bert-large"])), "layers": 4, "seq_len": model["seq_len"]}
        s["pp"] = 1
    s["sequence_parallel"] = s["tp"] > 1 and draw(st.booleans())
    s["dp"] = 8 // (s["tp"] * s["pp"] * s["cp"])
    if s["dp"] < 1:
        reject()
    s["micro_batch"] = draw(st.sampled_from([1, 2]))
    s["global_batch"] = s["micro_batch"] * s["dp"] * draw(st.sampled_from([32, 44, 64]))
    s["recompute"] = draw(st.sampled_from(["none", "selective", "full"]))
    s["zero"] = draw(st.sampled_from([0, 1, 3]))
    s["overlap_grad_reduce"] = draw(st.booleans())
    return _job(model, s, cluster, bandwidth_sharing=draw(st.booleans()))


@settings(max_examples=80, deadline=None, derandomize=True)
@given(pipelined_jobs())
def test_folded_equals_full_on_random_pipelines(job: dict[str, Any]) -> None:
    try:
        full = simulate(job, timeline=True)
    except ConfigError:
        reject()  # a combination the job validation refuses (e.g. interleaving's micro-batch multiple)
    folded = simulate(job)
    _assert_same(_numbers(full), _numbers(folded))


def test_a_folded_run_reports_the_progress_of_what_it_simulates() -> None:
    calls: list[tuple[str, int, int]] = []
    job = _job({"name": "gpt2", "layers": 4, "seq_len": 128}, {"pp": 2, "dp": 4, "global_batch": 4 * 200})
    r = simulate(job, progress=lambda *a: calls.append(a))
    assert r.fold is not None and r.fold.startswith("folded")
    phases = [c[0] for c in calls]
    assert phases and phases == sorted(phases) and phases[0] == "building graph"
    built = [(d, n) for p, d, n in calls if p == "building graph"]
    assert len({n for _, n in built}) == 1 and built[-1][1] < r.n_tasks  # the reduced graph's share
    assert [d for d, _ in built] == sorted(d for d, _ in built)


@pytest.mark.parametrize("name, model, strategy", [
    ("interleaved", {"name": "gpt2", "layers": 8, "seq_len": 128},
     {"pp": 2, "vpp": 2, "tp": 2, "dp": 2, "global_batch": 2 * 48}),
    ("zero bubble", {"name": "gpt2", "layers": 8, "seq_len": 128},
     {"pp": 2, "tp": 2, "dp": 2, "global_batch": 2 * 48, "schedule": "zb-h1"}),
    ("DualPipeV", {"name": "gpt2", "layers": 8, "seq_len": 128},
     {"pp": 2, "tp": 2, "dp": 2, "global_batch": 2 * 48, "schedule": "dualpipev"}),
    ("accumulation, host ahead", {"name": "bert-large", "layers": 4, "seq_len": 128},
     {"pp": 1, "dp": 8, "global_batch": 8 * 32}),
    ("context parallel, ZeRO-3", {"name": "gpt2", "layers": 4, "seq_len": 512},
     {"pp": 2, "cp": 2, "dp": 2, "global_batch": 2 * 40, "zero": 3}),
    ("experts", {**TINY_MOE, "seq_len": 128}, {"pp": 2, "ep": 2, "dp": 4, "global_batch": 4 * 40}),
])
def test_each_kind_of_pipeline_folds_to_the_full_answer(name: str, model: dict[str, Any],
                                                         strategy: dict[str, Any]) -> None:
    """Each schedule and parallelism the random test draws does fold (so that test compares folded runs)."""
    job = _job(model, strategy)
    folded = simulate(job)
    assert folded.fold is not None and folded.fold.startswith("folded"), (name, folded.fold)
    assert _first_try(folded, {"pp": 1, **strategy}), (name, folded.fold)
    _assert_same(_numbers(simulate(job, timeline=True)), _numbers(folded))


def _first_try(result: Any, strategy: dict[str, Any]) -> bool:  # noqa: ANN401
    """The fold came from the first micro-batch count reduced_micro_batches proposes (no simulation wasted)."""
    simulated, m = (int(w) for w in result.fold.split("simulated ")[1].split(" micro")[0].split(" of "))
    kind, pp = strategy.get("schedule", "1f1b"), strategy["pp"]
    v = 2 if kind == "dualpipev" else strategy.get("vpp", 1)
    kind = "interleaved" if v > 1 and kind != "dualpipev" else kind
    period = period_candidates(kind, pp)[0]
    return simulated == reduced_micro_batches(kind, pp, v, m, period)[0]


@pytest.mark.parametrize("name, model, strategy", [
    ("1F1B, 8 stages", {"name": "gpt2", "layers": 16, "seq_len": 256},
     {"pp": 8, "dp": 1, "micro_batch": 1, "global_batch": 64, "recompute": "selective"}),
    ("1F1B, 8 stages, short sequences (host-bound)", {"name": "gpt2", "layers": 8, "seq_len": 128},
     {"pp": 8, "tp": 1, "dp": 1, "micro_batch": 1, "global_batch": 48}),
    ("interleaved, 4 stages x 2", {"name": "gpt2", "layers": 16, "seq_len": 256},
     {"pp": 4, "vpp": 2, "tp": 2, "dp": 1, "global_batch": 96, "sequence_parallel": True}),
    ("zero bubble, 8 stages", {"name": "gpt2", "layers": 16, "seq_len": 256},
     {"pp": 8, "dp": 1, "global_batch": 80, "schedule": "zb-h1"}),
    ("DualPipeV, 8 stages", {"name": "gpt2", "layers": 16, "seq_len": 256},
     {"pp": 8, "dp": 1, "global_batch": 96, "schedule": "dualpipev"}),
])
def test_deeper_pipelines_fold_on_the_first_try(name: str, model: dict[str, Any], strategy: dict[str, Any]) -> None:
    """The first micro-batch count tried is enough on deeper pipelines (the count grows with the depth as the
    warm-up does, not three depths), and the folded run is the full one."""
    job = _job(model, strategy)
    folded = simulate(job)
    assert folded.fold is not None and folded.fold.startswith("folded"), (name, folded.fold)
    assert _first_try(folded, strategy), (name, folded.fold)
    _assert_same(_numbers(simulate(job, timeline=True)), _numbers(folded))


@pytest.mark.parametrize("strategy", [
    {"pp": 4, "tp": 2, "dp": 1, "micro_batch": 1, "global_batch": 48, "sequence_parallel": True},
    {"pp": 4, "tp": 2, "dp": 1, "micro_batch": 1, "global_batch": 64, "schedule": "zb-h1"},
])
def test_exact_per_rank_classes_fold_to_the_full_answer(strategy: dict[str, Any]) -> None:
    """One class per rank: TP collectives are tasks several classes share (and their hosts issue together)."""
    job = _job({"name": "gpt2", "layers": 8, "seq_len": 128}, strategy, exact=True)
    folded = simulate(job)
    assert folded.fold is not None and folded.fold.startswith("folded"), folded.fold
    _assert_same(_numbers(simulate(job, timeline=True)), _numbers(folded))
