"""The ZB-H1 zero-bubble schedule (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024) through the real
compiler and engine against its closed forms.

Each backward is split into B (input gradients) and W (weight gradients). With p uniform stages, free
communication and F, B, W one stage's seconds per micro-batch, ZB-H1 takes
    m (F + B + W) + (p - 1)(F + B) - (min(m, p) - 1) min(F, B, W),
i.e. the paper's bubble (p - 1)(F + B - W) once m >= p and W <= F, B, against 1F1B's (m + p - 1)(F + B + W).
Rank r holds at most p - r micro-batches between F and B (1F1B's activations) and at most p between F and W;
what W needs (the GEMM inputs and output gradients) stays until W runs, the rest is freed by B.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pipeline_helpers import make_uniform_and_free, play_orders

from trainsim import api
from trainsim.compile.graph import ExecutionGraph, build_graph, predict_tasks, split_backward
from trainsim.compile.program import Program, Step, Stream, lower
from trainsim.cost.annotate import annotate
from trainsim.cost.comm import HierarchicalAlphaBeta
from trainsim.cost.compute import RooflineCompute
from trainsim.cost.offload import offload_memory_system
from trainsim.errors import ConfigError
from trainsim.hardware.cluster import get_cluster
from trainsim.sim.engine import SimTrace, run
from trainsim.strategy.precision import Precision
from trainsim.strategy.presets import ParallelSpec, build_strategy
from trainsim.strategy.schedules import one_f_one_b, schedule_order, zb_h1
from trainsim.workload.ir import CONTRACTION_KINDS
from trainsim.workload.zoo import build_model

CLUSTER = get_cluster("dgx-a100")


def zb_time(p: int, m: int, f: float, b: float, w: float) -> float:
    """ZB-H1's iteration time on p uniform stages with free communication."""
    return m * (f + b + w) + (p - 1) * (f + b) - (min(m, p) - 1) * min(f, b, w)


# --- the per-rank orders ---------------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(p=st.integers(1, 16), m=st.integers(1, 32))
def test_zb_h1_orders_are_complete_causal_and_within_1f1b_memory(p: int, m: int) -> None:
    orders = [schedule_order("zb-h1", p, m, r) for r in range(p)]
    for r, order in enumerate(orders):
        assert sorted(order) == sorted((ph, mb, 0) for ph in "FBW" for mb in range(m))  # each exactly once
        pos = {item: i for i, item in enumerate(order)}
        for mb in range(m):
            assert pos[("F", mb, 0)] < pos[("B", mb, 0)] < pos[("W", mb, 0)]
        for ph in "FBW":  # micro-batches in order within each phase
            assert [mb for x, mb, _ in order if x == ph] == list(range(m))
        # activations B frees: at most p - r micro-batches between F and B, as 1F1B (whose count it reaches);
        # what W frees: at most p micro-batches between F and W on every rank (the paper's equal in-flight count)
        f_b = f_w = peak_fb = peak_fw = 0
        for ph, _, _ in order:
            f_b += {"F": 1, "B": -1, "W": 0}[ph]
            f_w += {"F": 1, "B": 0, "W": -1}[ph]
            peak_fb, peak_fw = max(peak_fb, f_b), max(peak_fw, f_w)
        inflight_1f1b = peak = 0
        for ph, _, _ in one_f_one_b(p, m, r):
            inflight_1f1b += 1 if ph == "F" else -1
            peak = max(peak, inflight_1f1b)
        assert peak_fb == peak == min(p - r, m)
        assert peak_fw == min(p, m)
        # rank r postpones its W's by r backwards (fewer when there are fewer micro-batches)
        bs = [mb for x, mb, _ in order if x == "B"]
        first_w = pos[("W", 0, 0)]
        assert sum(1 for x, _, _ in order[:first_w] if x == "B") == min(r, m - 1) + 1 and bs == list(range(m))
    # cross-rank causality: the orders run to completion (no deadlock) in the closed-form time
    for f, b, w in ((1.0, 1.0, 1.0), (1.0, 1.5, 0.5), (2.0, 1.0, 0.7), (1.0, 0.5, 1.5)):
        assert play_orders(orders, f, b, w) == pytest.approx(zb_time(p, m, f, b, w), rel=1e-12)
        assert play_orders([one_f_one_b(p, m, r) for r in range(p)], f, b + w, 0.0) == pytest.approx(
            (m + p - 1) * (f + b + w), rel=1e-12)


def test_zb_h1_order_matches_the_paper_figure() -> None:
    """Qi et al. 2024, Figure 3 (top): 4 stages; the last stage postpones its W's by 3 backwards."""
    def text(r: int) -> str:
        return " ".join(f"{ph}{mb}" for ph, mb, _ in zb_h1(4, 8, r))
    assert text(0) == "F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 B5 W5 B6 W6 B7 W7"
    assert text(3) == "F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 W5 W6 W7"


def test_unknown_schedule_names_stay_rejected() -> None:
    with pytest.raises(ValueError, match="unknown schedule"):
        schedule_order("zb-h2", 2, 2, 0)


# --- the split backward template -------------------------------------------------------------------------


def _lowered(kind: str, spec: dict[str, object], p: int = 2, m: int = 4) -> Program:
    dp = int(spec.get("dp", 1))  # type: ignore[call-overload]
    mdl = build_model("custom", dp, 128, "flash", layers=2 * p, hidden=256, heads=4, vocab=1024)
    fields = {k: v for k, v in spec.items() if k != "dp"}
    tree = build_strategy(mdl, ParallelSpec(pp=p, dp=dp, schedule=kind, micro_batch=1, global_batch=m * dp,
                                            **fields))  # type: ignore[arg-type]
    program = lower(tree, Precision())
    annotate(program, CLUSTER, RooflineCompute(), HierarchicalAlphaBeta(CLUSTER),
             memory=offload_memory_system(tree.offload, CLUSTER))
    return program


def _explicit(steps: list[Step]) -> list[tuple[int, ...]]:
    return [s.deps if s.deps is not None else ((i - 1,) if i else ()) for i, s in enumerate(steps)]


@pytest.mark.parametrize("spec", [{}, {"tp": 2, "sequence_parallel": True}, {"tp": 2}, {"recompute": "full"},
                                  {"recompute": "selective"}, {"zero": 3, "dp": 2}, {"offload": "cpu"}])
def test_backward_splits_into_b_and_w_halves(spec: dict[str, object]) -> None:
    zb, plain = _lowered("zb-h1", spec), _lowered("1f1b", spec)
    for ch, ref in zip(zb.chunks, plain.chunks, strict=True):
        b, w = split_backward(ch.bwd)
        assert len(b) + len(w) == len(ch.bwd)
        assert not any(s.phase == "wgrad" for s in b) and any(s.phase == "wgrad" for s in w)
        assert all(s.phase == "wgrad" or s.kind != "compute" for s in w)  # W: weight gradients (+ what feeds them)
        weighted = [s for s in ref.bwd if s.kind == "compute" and s.phase in ("bwd", "wgrad") and s.op is not None
                    and s.op.weight is not None and s.op.kind in CONTRACTION_KINDS]
        assert sum(s.phase == "wgrad" for s in w) == len(weighted) > 0  # one W step per weighted GEMM
        for half in (b, w):  # dependencies stay inside a half and point backwards
            assert all(d < i for i, deps in enumerate(_explicit(half)) for d in deps)
        # the split changes neither the work nor the memory: same seconds and FLOPs as the unsplit backward,
        # every byte a forward allocates is freed by B or W, and W frees more than it allocates
        assert sum(s.duration_s for s in b + w) == pytest.approx(sum(s.duration_s for s in ref.bwd), rel=1e-9)
        assert sum(s.model_flops for s in b + w) == pytest.approx(sum(s.model_flops for s in ref.bwd), rel=1e-12)
        fwd_alloc = sum(s.alloc_bytes - s.free_bytes for s in ch.fwd)
        assert fwd_alloc + sum(s.alloc_bytes - s.free_bytes for s in b + w) == pytest.approx(0.0, abs=1e-3)
        held = sum(s.free_bytes - s.alloc_bytes for s in w)
        assert 0 < held <= fwd_alloc + sum(s.alloc_bytes for s in b)
        # each layer's gradient bucket is anchored once, on its last weight gradient when it has one
        anchors = [s.grad_bucket for s in b + w if s.grad_bucket]
        assert sorted(anchors) == sorted({s.grad_bucket for s in ref.bwd if s.grad_bucket})
        for s in b:
            if s.grad_bucket:
                assert not any(x.layer == s.grad_bucket for x in w if x.phase == "wgrad")


def test_other_schedules_keep_one_backward_per_op() -> None:
    """Only zb-h1 lowers a weighted op's backward as two steps (without sequence parallelism)."""
    plain = _lowered("1f1b", {})
    assert not any(s.phase in ("dgrad", "wgrad") for ch in plain.chunks for s in ch.bwd)


# --- closed forms through the engine ---------------------------------------------------------------------


@dataclass
class PipeRun:
    iteration_s: float
    phase_s: dict[str, float]  # seconds of F, B, W (1F1B: B is the whole backward) per micro-batch on a stage
    peaks: list[float]  # dynamic memory peak per stage
    graph: ExecutionGraph
    trace: SimTrace
    program: Program


def pipeline(p: int, m: int, kind: str, layers_per_chunk: int = 1, granularity: str = "op") -> PipeRun:
    """Lower -> annotate -> graph -> engine on a tiny GPT whose stages are uniform and communication free:
    transformer-layer compute keeps its roofline duration, embedding and head compute, collectives, pipeline
    sends and the optimizer take no time (as tests/test_pipeline_schedules.py)."""
    mdl = build_model("custom", 1, 128, "flash", layers=p * layers_per_chunk, hidden=256, heads=4, vocab=1024)
    program = lower(build_strategy(mdl, ParallelSpec(pp=p, schedule=kind, micro_batch=1, global_batch=m)),
                    Precision())
    annotate(program, CLUSTER, RooflineCompute(), HierarchicalAlphaBeta(CLUSTER))
    make_uniform_and_free(program)
    graph = build_graph(program, granularity=granularity, optimizer_s=dict.fromkeys(range(p), 0.0))
    trace = run(graph, gamma=0.0, p2p_host_sync=False)
    per: dict[tuple[int, int, str], float] = {}  # (stage, micro-batch, phase) -> seconds of its compute tasks
    for t in range(len(graph)):
        if graph.stream[t] == Stream.COMPUTE and graph.micro_batch[t] >= 0:
            key = (graph.classes[graph.participants[t][0]].stage, graph.micro_batch[t], graph.name[t][0])
            per[key] = per.get(key, 0.0) + trace.end_s[t] - trace.start_s[t]
    phase_s = {ph: per.get((0, 0, ph), 0.0) for ph in "FBW"}
    for (_, _, ph), sec in per.items():  # the stages and micro-batches really are uniform
        assert sec == pytest.approx(phase_s[ph], rel=1e-9)
    peaks = [trace.peak_dynamic_bytes[next(c for c, rc in enumerate(graph.classes) if rc.stage == s)]
             for s in range(p)]
    return PipeRun(max(trace.end_s), phase_s, peaks, graph, trace, program)


@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (4, 4), (8, 16), (4, 2), (8, 3), (2, 1), (1, 3)])
def test_zb_h1_iteration_is_closed_form_and_beats_1f1b(p: int, m: int) -> None:
    zb, ref = pipeline(p, m, "zb-h1"), pipeline(p, m, "1f1b")
    f, b, w = zb.phase_s["F"], zb.phase_s["B"], zb.phase_s["W"]
    assert 0 < w < min(f, b)  # a transformer's weight-gradient GEMMs are lighter than its F and its B
    assert zb.iteration_s == pytest.approx(zb_time(p, m, f, b, w), rel=1e-9)
    if m >= p:  # the paper's form
        assert zb.iteration_s - m * (f + b + w) == pytest.approx((p - 1) * (f + b - w), rel=1e-9)
    # the same work as 1F1B (F, and B + W = 1F1B's backward), only ordered differently
    assert ref.phase_s["F"] == pytest.approx(f, rel=1e-12) and ref.phase_s["B"] == pytest.approx(b + w, rel=1e-9)
    assert ref.iteration_s == pytest.approx((m + p - 1) * (f + b + w), rel=1e-9)
    if p > 1:
        assert zb.iteration_s < ref.iteration_s
        assert ref.iteration_s - zb.iteration_s == pytest.approx((p - 1) * w + (min(m, p) - 1) * w, rel=1e-9)


@settings(max_examples=25, deadline=None)
@given(p=st.integers(1, 8), m=st.integers(1, 12), layers=st.integers(1, 2))
def test_zb_h1_closed_form_holds_for_any_depth_and_micro_batch_count(p: int, m: int, layers: int) -> None:
    zb = pipeline(p, m, "zb-h1", layers_per_chunk=layers, granularity="auto")
    f, b, w = zb.phase_s["F"], zb.phase_s["B"], zb.phase_s["W"]
    assert zb.iteration_s == pytest.approx(zb_time(p, m, f, b, w), rel=1e-9)
    assert zb.iteration_s <= (m + p - 1) * (f + b + w) * (1 + 1e-12)


# --- memory ----------------------------------------------------------------------------------------------


def _replay_peak(run_: PipeRun, stage: int, kind: str, m: int) -> float:
    """Peak of one stage's memory when its templates' steps run one after another along its order (what the
    engine does at op granularity with communication free): a step's allocation counts while it runs."""
    p = len(run_.peaks)
    ch = run_.program.chunks[stage]
    halves = split_backward(ch.bwd) if kind == "zb-h1" else (ch.bwd, [])
    steps = {"F": ch.fwd, "B": halves[0], "W": halves[1]}
    cur = peak = 0.0
    for ph, _, _ in schedule_order(kind, p, m, stage):
        for s in steps[ph]:
            peak = max(peak, cur + max(s.alloc_bytes, 0.0))
            cur += s.alloc_bytes - s.free_bytes
    assert cur == pytest.approx(0.0, abs=1e-3)  # nothing leaks across the iteration
    return peak


@pytest.mark.parametrize(("p", "m"), [(4, 8), (4, 4), (4, 2), (2, 6), (8, 3)])
def test_memory_follows_the_split_b_and_w(p: int, m: int) -> None:
    """Every stage's simulated peak is the replay of its order with B freeing all but what W needs and W the
    rest; the first stage (ZB-H1 runs its W right after its B) keeps 1F1B's peak."""
    zb, ref = pipeline(p, m, "zb-h1"), pipeline(p, m, "1f1b")
    for s in range(p):
        assert zb.peaks[s] == pytest.approx(_replay_peak(zb, s, "zb-h1", m), rel=1e-9)
        assert ref.peaks[s] == pytest.approx(_replay_peak(ref, s, "1f1b", m), rel=1e-9)
    act = sum(st_.alloc_bytes for st_ in ref.program.chunks[0].fwd)
    assert ref.peaks[0] == pytest.approx(min(p, m) * act, rel=1e-12)
    assert ref.peaks[0] <= zb.peaks[0] <= ref.peaks[0] * 1.02


def test_peak_memory_stays_near_1f1b() -> None:
    """With several layers per stage the worst stage's peak is within a few percent of 1F1B's: later stages
    hold p - r full micro-batches and r W-halves (GEMM inputs and output gradients, ~32/34 of a layer's
    activations; Qi et al. 2024, Table 1), no more than the first stage's p micro-batches plus the head's."""
    p, m = 4, 8
    zb = pipeline(p, m, "zb-h1", layers_per_chunk=6, granularity="auto")
    ref = pipeline(p, m, "1f1b", layers_per_chunk=6, granularity="auto")
    assert max(zb.peaks) <= max(ref.peaks) * 1.05
    assert zb.peaks[0] <= ref.peaks[0] * 1.02
    for s in range(1, p):  # the later stages hold more than under 1F1B (their postponed W's) ...
        assert zb.peaks[s] > ref.peaks[s]
    assert min(zb.peaks[:-1]) > 0.9 * zb.peaks[0]  # ... about as much as the first stage


# --- jobs, CLI, validation -------------------------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainsim", *args], capture_output=True, text=True, timeout=300)


GPT2_XL_PP4 = ("simulate", "--model", "gpt2-xl", "--cluster", "dgx-a100", "--nodes", "1", "--pp", "4",
               "--global-batch", "32", "--micro-batch", "1")


def test_cli_zb_h1_is_faster_than_1f1b_and_names_the_schedule() -> None:
    out = {}
    for kind in ("1f1b", "zb-h1"):
        p = _cli(*GPT2_XL_PP4, "--schedule", kind, "--json", "-")
        assert p.returncode == 0, p.stderr
        out[kind] = json.loads(p.stdout)
        assert out[kind]["strategy"]["schedule"] == kind
    zb, ref = out["zb-h1"], out["1f1b"]
    assert zb["iteration_time_s"] < ref["iteration_time_s"]
    assert zb["breakdown"]["bubble"] < ref["breakdown"]["bubble"]
    # the first stage (1F1B's worst) keeps its peak; the worst stage stays within a few percent
    assert zb["peak_memory_bytes"][0] == pytest.approx(ref["peak_memory_bytes"][0], rel=0.01)
    assert max(zb["peak_memory_bytes"]) <= max(ref["peak_memory_bytes"]) * 1.08
    summary = _cli(*GPT2_XL_PP4, "--schedule", "zb-h1")
    assert summary.returncode == 0 and "schedule=zb-h1" in summary.stdout


@pytest.mark.parametrize(("extra", "field"), [(("--vpp", "2"), "strategy.schedule"),
                                              (("--max-ongoing", "2"), "strategy.max_ongoing_micro_batch")])
def test_cli_zb_h1_rejects_what_it_cannot_run(extra: tuple[str, ...], field: str) -> None:
    p = _cli(*GPT2_XL_PP4, "--schedule", "zb-h1", *extra)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr + p.stdout
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0] and "zb-h1" in lines[0]


def test_zb_h1_with_uneven_stages_and_from_yaml_keys() -> None:
    kw = {"model": "gpt2", "cluster": "dgx-a100", "nodes": 1}
    strategy = {"pp": 4, "global_batch": 16, "first_stage_layers": 2, "last_stage_layers": 2}
    zb = api.simulate(**kw, strategy={**strategy, "schedule": "zb-h1"})
    ref = api.simulate(**kw, strategy={**strategy, "schedule": "1f1b"})
    assert zb.strategy["schedule"] == "zb-h1" and 0 < zb.iteration_time_s < ref.iteration_time_s
    assert {"F", "B", "W"} <= {name[0] for name in zb.graph.name}
    with pytest.raises(ConfigError) as err:
        api.simulate(**kw, strategy={"pp": 2, "vpp": 2, "global_batch": 16, "schedule": "zb-h1"})
    assert err.value.field == "strategy.schedule"


@pytest.mark.parametrize("job", [
    {"strategy": {"tp": 2, "pp": 2, "global_batch": 64, "sequence_parallel": True}},
    {"strategy": {"tp": 2, "pp": 2, "global_batch": 64}, "granularity": "layer"},
    {"strategy": {"tp": 2, "pp": 4, "global_batch": 64}, "granularity": "op"},
    {"strategy": {"tp": 2, "pp": 2, "global_batch": 32, "sequence_parallel": True}, "exact": True},
    {"strategy": {"pp": 4, "global_batch": 16, "recompute": "full", "offload": "cpu"}},
    {"strategy": {"pp": 2, "dp": 4, "global_batch": 64, "fsdp": True}, "exact": True},
])
def test_zb_h1_task_prediction_tracks_the_built_graph(job: dict[str, object]) -> None:
    strategy = {**job.pop("strategy"), "schedule": "zb-h1"}  # type: ignore[dict-item]
    kw = {"cluster": "dgx-a100", "nodes": 1, **job}
    r = api.simulate(model="gpt2", strategy=strategy, timeline=True, **kw)  # type: ignore[arg-type]
    tree = api.strategy_tree(api.job_from_keywords("gpt2", "dgx-a100", strategy, {"nodes": 1, **job}))
    est = predict_tasks(tree, exact=bool(job.get("exact", False)), granularity=str(job.get("granularity", "auto")))
    slots = sum(len(p) for p in r.graph.participants)
    assert 0.5 <= est.tasks / slots <= 2.0, (est, slots)


def test_gradient_reduction_hangs_off_the_last_w() -> None:
    """With overlapped gradient reduction each bucket starts after the W (the weight gradients) of the last
    micro-batch, never after a B: the gradients are complete only there."""
    r = api.simulate(model="gpt2", cluster="dgx-a100", nodes=1, strategy={"pp": 2, "dp": 4, "global_batch": 32,
                                                                          "schedule": "zb-h1"})
    g = r.graph
    m = 32 // 4
    grads = [t for t in range(len(g)) if g.stream[t] == Stream.GRAD and ".grads:" in g.name[t]]
    assert grads
    for t in grads:
        producers = [d for d in g.deps[t] if g.stream[d] == Stream.COMPUTE]
        assert producers and all(g.name[d].startswith(f"W{m - 1} ") or g.name[d].startswith(f"B{m - 1} ")
                                 for d in producers)
    assert any(g.name[d].startswith(f"W{m - 1} ") for t in grads for d in g.deps[t])


TITANXP = {"model": {"name": "gpt2"}, "cluster": {"name": "pcie-titanxp"}}
BASE = {"dp": 2, "tp": 2, "pp": 2, "global_batch": 8, "micro_batch": 2, "schedule": "zb-h1"}
SYMMETRY_CASES: dict[str, dict[str, object]] = {
    "3d": {**TITANXP, "strategy": BASE},
    "zero3-sp-full": {**TITANXP, "strategy": {**BASE, "zero": 3, "sequence_parallel": True, "recompute": "full"}},
    "sp-zero1-selective": {**TITANXP, "strategy": {**BASE, "zero": 1, "sequence_parallel": True,
                                                   "recompute": "selective"}},
    "no-overlap": {**TITANXP, "strategy": {**BASE, "dp": 4, "tp": 1, "global_batch": 16,
                                           "overlap_grad_reduce": False}},
}


@pytest.mark.parametrize("name", list(SYMMETRY_CASES))
def test_zb_h1_exact_mode_and_coarse_granularity_agree(name: str) -> None:
    """Rank classes give the same answer as every rank simulated (tests/test_symmetry.py, for zb-h1), and the
    coarsened B and W tasks the same as op granularity (2%: gamma applies per fused task)."""
    job = SYMMETRY_CASES[name]
    sym = api.simulate({**job, "simulation": {"granularity": "op"}})
    exact = api.simulate({**job, "simulation": {"granularity": "op", "exact": True}})
    assert exact.iteration_time_s == pytest.approx(sym.iteration_time_s, rel=1e-9)
    for e, s in zip(exact.memory, sym.memory, strict=True):
        assert e.peak_bytes == pytest.approx(s.peak_bytes, rel=1e-9)
    for gran in ("auto", "layer"):
        coarse = api.simulate({**job, "simulation": {"granularity": gran}})
        assert coarse.n_tasks < sym.n_tasks
        assert coarse.iteration_time_s == pytest.approx(sym.iteration_time_s, rel=0.02)
        assert coarse.peak_memory_bytes == pytest.approx(sym.peak_memory_bytes, rel=1e-9)
