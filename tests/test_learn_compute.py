"""The learned compute model behind the roofline's interface (simulation.compute_model learned:FILE): a
model's stage times reach the event simulation, agree with PredTOP's formula where the analysis says they
must, and every way of pointing at a bad model is one line."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from trainsim import simulate  # noqa: E402
from trainsim.errors import ConfigError  # noqa: E402
from trainsim.learn import models as M  # noqa: E402
from trainsim.learn.stage_graph import GRAPH_FEATURES, NODE_FEATURES, StageGraph  # noqa: E402


def _graphs(n: int = 6) -> list[StageGraph]:
    rng = np.random.default_rng(0)
    return [StageGraph(rng.normal(size=(4, len(NODE_FEATURES))).astype(np.float32), np.array([[0, 1, 2], [1, 2, 3]]),
                       rng.normal(size=len(GRAPH_FEATURES)).astype(np.float32), 0.1, 1.0, 4.0, 1.0 + 0.1 * i, f"k{i}")
            for i in range(n)]


def constant_model(path: Path, scale: float, kind: str = "features", devices: str = "a100-80gb",
                   domain: tuple[np.ndarray, np.ndarray] | None = None) -> Path:
    """A model file whose every stage prediction is `scale` x the roofline's (weights zero, the output bias
    set so that r = log(scale) exactly through the bounding tanh), trained on every stage (`domain`: the
    ranges of the graph features it was trained on instead)."""
    f = M.fit(kind, _graphs(), epochs=0)
    with torch.no_grad():
        f.model.head.out.bias.fill_(M.R_BOUND * math.atanh(math.log(scale) / M.R_BOUND))
    f.meta = {"trained_on": "a test", "devices": devices}
    wide = np.full(len(GRAPH_FEATURES), 1e9, np.float32)
    f.g_min, f.g_max = domain if domain is not None else (-wide, wide)
    f.save(path)
    return path


def job(pp: int = 1, tp: int = 1, dp: int = 1, mb: int = 1, gb: int = 4, gpu: str | None = None,
        compute: str = "roofline", model: str = "gpt2") -> dict:
    cluster = {"name": "dgx-a100", "nodes": 1, "gpus_per_node": tp * pp * dp}
    if gpu:
        cluster["gpu"] = gpu
    return {"model": {"name": model, "layers": 8, "seq_len": 512},
            "cluster": cluster,
            "strategy": {"tp": tp, "pp": pp, "dp": dp, "micro_batch": mb, "global_batch": gb, "schedule": "1f1b"},
            "simulation": {"compute_model": compute}}


def test_an_untrained_model_reproduces_the_roofline_exactly(tmp_path: Path) -> None:
    m = constant_model(tmp_path / "m.pt", 1.0)
    for kw in ({}, {"pp": 2, "tp": 2, "gb": 8}):
        base = simulate(job(**kw))
        learned = simulate(job(**kw, compute=f"learned:{m}"))
        assert learned.iteration_time_s == pytest.approx(base.iteration_time_s, rel=1e-12)
        lr = learned.learned
        assert lr is not None and lr["roofline_iteration_s"] == pytest.approx(base.iteration_time_s, rel=1e-12)
        assert all(s["compute_factor"] == pytest.approx(1.0) for s in lr["stages"])
        assert lr["formula_iteration_s"] == pytest.approx(base.iteration_time_s, rel=1e-12)
        assert "compute_model" in learned.to_json() and "compute_model" not in base.to_json()


def test_on_one_gpu_the_event_simulation_and_the_formula_agree(tmp_path: Path) -> None:
    """One GPU, one stage, no communication, kernels long enough that the host's issue gaps hide under them:
    the iteration is its micro-batches' compute plus the optimizer, so stretching every stage by 1.25 adds
    micro-batches x 0.25 x stage (PredTOP's formula) up to the few kernels the host still paces."""
    m = constant_model(tmp_path / "m.pt", 1.25)
    one = {"model": {"name": "gpt3-1.3b", "layers": 4, "seq_len": 2048},
           "cluster": {"name": "dgx-a100", "nodes": 1, "gpus_per_node": 1},
           "strategy": {"tp": 1, "pp": 1, "dp": 1, "micro_batch": 4, "global_batch": 16}}
    base = simulate(one)
    learned = simulate({**one, "simulation": {"compute_model": f"learned:{m}"}})
    (stage,) = learned.learned["stages"]
    assert stage["compute_factor"] == pytest.approx(1.25, rel=1e-6)
    assert stage["stage_s"] == pytest.approx(1.25 * stage["roofline_stage_s"], rel=1e-6)
    expected = base.iteration_time_s + 4 * 0.25 * stage["roofline_stage_s"]
    assert learned.learned["formula_iteration_s"] == pytest.approx(expected, rel=1e-6)
    assert learned.iteration_time_s == pytest.approx(expected, rel=1e-3)


def test_the_slowest_stage_sets_one_compute_factor_and_tp_communication_keeps_its_time(tmp_path: Path) -> None:
    """The model predicts the bottleneck stage (what it was trained on); every chunk's compute takes the
    factor that gives that stage its predicted time, and TP all-reduces keep theirs, so compute stretches by
    more than the stage does."""
    m = constant_model(tmp_path / "m.pt", 1.5)
    big = {"pp": 2, "tp": 2, "mb": 4, "gb": 32, "model": "gpt3-1.3b"}  # kernels long enough to outlast their issue
    base = simulate(job(**big))
    learned = simulate(job(**big, compute=f"learned:{m}"))
    lr = learned.learned
    stages = lr["stages"]
    slowest = stages[lr["slowest_chunk"]]
    assert slowest["roofline_stage_s"] == max(st["roofline_stage_s"] for st in stages)
    assert slowest["stage_s"] == pytest.approx(1.5 * slowest["roofline_stage_s"], rel=1e-6)
    assert slowest["compute_factor"] > 1.5
    assert len({st["compute_factor"] for st in stages}) == 1
    assert base.iteration_time_s < learned.iteration_time_s < 1.5 * base.iteration_time_s + 1e-9
    formula = learned.learned["formula_iteration_s"]
    assert abs(learned.iteration_time_s - formula) / formula < 0.1  # 1F1B with equal stages: close to the formula


def test_a_model_trained_on_other_gpus_keeps_the_roofline_there(tmp_path: Path) -> None:
    m = constant_model(tmp_path / "m.pt", 1.5)
    h100 = {"gpu": "h100-sxm", "mb": 4, "model": "gpt3-1.3b"}
    base = simulate(job(**h100))
    res = simulate(job(**h100, compute=f"learned:{m}"))
    assert res.iteration_time_s == pytest.approx(base.iteration_time_s, rel=1e-12)
    assert res.learned["outside_training_range"] == ["GPU h100-sxm (trained on a100-80gb)"]
    assert any("GPU h100-sxm (trained on a100-80gb)" in a and "roofline's times kept" in a
               for a in res.model_assumptions)
    forced = simulate({**job(**h100, compute=f"learned:{m}"), "simulation": {
        "compute_model": f"learned:{m}", "learned_extrapolation": True}})
    assert forced.iteration_time_s > 1.2 * base.iteration_time_s
    assert not simulate(job(compute=f"learned:{m}")).model_assumptions  # its own GPU: nothing to say


def test_two_learned_simulations_in_one_process_do_not_interfere(tmp_path: Path) -> None:
    slow, same = constant_model(tmp_path / "a.pt", 2.0), constant_model(tmp_path / "b.pt", 1.0)
    big = {"mb": 4, "model": "gpt3-1.3b"}
    a1 = simulate(job(**big, compute=f"learned:{slow}")).iteration_time_s
    b = simulate(job(**big, compute=f"learned:{same}")).iteration_time_s
    a2 = simulate(job(**big, compute=f"learned:{slow}")).iteration_time_s
    assert a1 == a2 and b == pytest.approx(simulate(job(**big)).iteration_time_s, rel=1e-12) and a1 > 1.5 * b


def test_stages_outside_the_training_ranges_keep_the_roofline_unless_asked(tmp_path: Path) -> None:
    """A model knows the ranges of the graph features it was trained on: a stage outside them (here a
    hidden size above the largest seen) keeps the roofline's times and the result says why, unless
    learned_extrapolation asks for the correction anyway."""
    from trainsim.api import simulate_costed
    from trainsim.learn.stage_graph import program_stage_graphs

    big = {**job(model="gpt3-1.3b"), "simulation": {}}
    res, costed = simulate_costed(big)
    (g,) = program_stage_graphs(costed.program, res.iteration_time_s, costed.peak_flops)
    lo, hi = g.g.copy(), g.g.copy()
    h = GRAPH_FEATURES.index("log_hidden")
    lo[h], hi[h] = math.log(256), math.log(1024)  # trained on hidden 256-1024; gpt3-1.3b has 2048
    m = constant_model(tmp_path / "m.pt", 1.25, domain=(lo, hi))
    kept = simulate({**big, "simulation": {"compute_model": f"learned:{m}"}})
    assert kept.iteration_time_s == pytest.approx(res.iteration_time_s, rel=1e-12)
    (stage,) = kept.learned["stages"]
    assert stage["compute_factor"] == 1.0
    assert kept.learned["outside_training_range"] == ["hidden 2048 (trained on 256-1024)"]
    assert any("outside the learned compute model's training ranges (hidden 2048 (trained on 256-1024))" in a
               and "roofline's times kept" in a for a in kept.model_assumptions)
    forced = simulate({**big, "simulation": {"compute_model": f"learned:{m}", "learned_extrapolation": True}})
    assert forced.learned["stages"][0]["compute_factor"] == pytest.approx(1.25, rel=1e-6)
    assert forced.iteration_time_s > 1.01 * res.iteration_time_s
    assert any("extrapolated (learned_extrapolation)" in a for a in forced.model_assumptions)
    with pytest.raises(ConfigError, match="applies to a learned compute model only"):
        simulate({**big, "simulation": {"learned_extrapolation": True}})


@pytest.mark.parametrize("spec, problem", [
    ("learned:", "is unknown"), ("gpu", "is unknown"), ("learned:{tmp}/missing.pt", "does not exist"),
    ("learned:{tmp}/garbage.pt", "is not a trainsim learned model"),
    ("learned:{tmp}/foreign.pt", "is not a trainsim learned model"),
    ("learned:{tmp}/old.pt", "other stage-graph features"), ("learned:{tmp}/damaged.pt", "is damaged"),
])
def test_bad_models_are_one_line_errors(tmp_path: Path, spec: str, problem: str) -> None:
    (tmp_path / "garbage.pt").write_bytes(b"\x00not a model")
    torch.save({"weights": torch.zeros(2)}, tmp_path / "foreign.pt")
    old = torch.load(constant_model(tmp_path / "m.pt", 1.0), weights_only=True)
    old["node_features"] = old["node_features"][:-1]
    torch.save(old, tmp_path / "old.pt")
    damaged = torch.load(tmp_path / "m.pt", weights_only=True)
    damaged["x_mean"] = "not a tensor"
    torch.save(damaged, tmp_path / "damaged.pt")
    with pytest.raises(ConfigError, match=problem) as err:
        simulate(job(compute=spec.format(tmp=tmp_path)))
    assert err.value.field == "simulation.compute_model" and "\n" not in err.value.one_line()


def test_without_torch_the_error_names_the_extra(tmp_path: Path) -> None:
    m = constant_model(tmp_path / "m.pt", 1.0)
    code = ("import sys; sys.modules['torch'] = None\nimport trainsim\n"
            f"try:\n    trainsim.simulate(model='gpt2', cluster='pcie-titanxp', compute_model='learned:{m}')\n"
            "except Exception as e:\n    print(type(e).__name__, e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == ("ConfigError simulation.compute_model: the learned compute model needs torch, which is "
                           "not installed; pip install 'trainsim[learn]'")


def test_the_search_keeps_no_time_bound_under_a_learned_model(tmp_path: Path) -> None:
    """A learned model may make compute faster than the roofline times a bound adds up: the bound must not
    prune on time then (memory still prunes)."""
    from trainsim.api import cluster_and_model
    from trainsim.optimize.bounds import BoundModel
    from trainsim.optimize.space import Candidate

    m = constant_model(tmp_path / "m.pt", 0.3)
    base = {"model": {"name": "gpt3-1.3b", "layers": 8, "seq_len": 2048}, "cluster": {"name": "dgx-a100", "nodes": 1},
            "simulation": {}}
    cl, model = cluster_and_model(base)
    c = Candidate(tp=2, pp=2, dp=2, cp=1, ep=1, vpp=1, sequence_parallel=False, micro_batch=4, recompute="none",
                  zero=0, overlap_grad_reduce=True, overlap_param_gather=False, tp_comm_overlap=False,
                  schedule="1f1b", global_batch=64)
    roofline = BoundModel(base, model, cl).bounds(c)
    learned = BoundModel({**base, "simulation": {"compute_model": f"learned:{m}"}}, model, cl).bounds(c)
    assert roofline[0] > 0 and learned[0] == 0.0 and learned[1] == roofline[1] > 0
    full = simulate({**base, "strategy": c.strategy(), "simulation": {"compute_model": f"learned:{m}"}})
    assert full.iteration_time_s < roofline[0]  # the roofline's bound would have pruned the learned answer


def test_the_event_simulation_responds_to_a_stage_as_the_pipeline_says() -> None:
    """api.compute_response: on one GPU the iteration grows by micro-batches x the added stage time; on a
    1F1B pipeline of equal stages by about micro-batches + stages - 1 (PredTOP's slots); a host-paced job
    responds too (the host's issue time stretches with the stage)."""
    from trainsim.api import compute_response, simulate_costed
    from trainsim.config import parse_job

    def response(**kw: object) -> tuple[float, float]:
        cfg = parse_job(job(**kw))
        res, costed = simulate_costed(cfg)
        slowest = max(range(len(costed.program.chunks)), key=lambda c: sum(
            s.duration_s for s in (*costed.program.chunks[c].fwd, *costed.program.chunks[c].bwd)))
        n_mb = costed.program.tree.schedule.n_micro_batch
        return compute_response(cfg, costed, slowest, res.iteration_time_s), n_mb + cfg.strategy.pp - 1

    one, slots = response(model="gpt3-1.3b", mb=4, gb=16)
    assert one == pytest.approx(slots, rel=2e-3) and slots == 4
    piped, slots = response(model="gpt3-1.3b", mb=4, gb=32, pp=2)
    assert slots == 9 and 0.8 * slots < piped < 1.2 * slots
    tiny, _ = response()  # gpt2, micro-batch 1: paced by the host, which the stretch slows as much
    assert tiny > 0


def test_composed_graphs_swap_the_pipeline_slots() -> None:
    from dataclasses import replace

    from trainsim.learn.stage_graph import composed

    gs = [replace(g, sim_slots=2.5) for g in _graphs(3)]
    assert composed(gs, "formula") == gs
    assert [g.slots for g in composed(gs, "simulation")] == [2.5] * 3
    assert all(a.g is b.g for a, b in zip(composed(gs, "simulation"), gs, strict=True))
    with pytest.raises(ValueError, match="no simulation response"):
        composed(_graphs(2), "simulation")
