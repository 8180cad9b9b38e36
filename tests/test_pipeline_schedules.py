"""Pipeline schedules through the real compiler and engine against their closed forms.

With uniform stages and free communication, GPipe and 1F1B take (m + p - 1)(tf + tb) (bubble fraction
(p-1)/(m+p-1)); interleaved 1F1B with v chunks per rank shrinks the bubble to (p-1)/v (tf + tb)
(Narayanan et al. SC'21, section 2.2); stage 0 holds m (GPipe) or min(p, m) (1F1B) micro-batches of
activations at its peak.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pipeline_helpers import make_uniform_and_free

from trainsim.compile.graph import build_graph
from trainsim.compile.program import Program, lower
from trainsim.cost.annotate import annotate
from trainsim.cost.comm import HierarchicalAlphaBeta
from trainsim.cost.compute import RooflineCompute
from trainsim.hardware.cluster import get_cluster
from trainsim.sim.engine import run
from trainsim.strategy.precision import Precision
from trainsim.strategy.presets import ParallelSpec, build_strategy
from trainsim.strategy.schedules import gpipe, interleaved, one_f_one_b, schedule_order
from trainsim.workload.zoo import build_model

CLUSTER = get_cluster("dgx-a100")  # 8 GPUs: enough ranks for pp <= 8


@dataclass
class PipeRun:
    iteration_s: float
    tf: float  # forward of one micro-batch over a whole pipeline rank (all its chunks)
    tb: float
    stage0_peak_bytes: float
    stage0_act_bytes: float  # activations one micro-batch leaves on stage 0 (all its chunks)
    program: Program


def pipeline(p: int, m: int, kind: str, v: int = 1, layers_per_chunk: int = 1) -> PipeRun:
    """Lower -> annotate -> graph -> engine on a tiny GPT, then make stages uniform and communication free.

    Transformer-layer compute keeps its roofline duration (identical for every layer); embedding and
    head compute, every collective, pipeline sends and the optimizer get zero duration.
    """
    layers = p * v * layers_per_chunk
    mdl = build_model("custom", 1, 128, "flash", layers=layers, hidden=256, heads=4, vocab=1024)
    spec = ParallelSpec(pp=p, vpp=v, schedule=kind, micro_batch=1, global_batch=m)
    program = lower(build_strategy(mdl, spec), Precision())
    annotate(program, CLUSTER, RooflineCompute(), HierarchicalAlphaBeta(CLUSTER))
    make_uniform_and_free(program)  # GPU-bound: the closed forms have no framework overhead
    graph = build_graph(program, granularity="op", optimizer_s=dict.fromkeys(range(p), 0.0))
    trace = run(graph, gamma=0.0, p2p_host_sync=False)
    rank0 = [ch for ch in program.chunks if ch.pp_rank == 0]
    tf = sum(s.duration_s for ch in rank0 for s in ch.fwd)
    tb = sum(s.duration_s for ch in rank0 for s in ch.bwd)
    for r in range(p):  # the stages really are uniform
        chs = [ch for ch in program.chunks if ch.pp_rank == r]
        assert sum(s.duration_s for ch in chs for s in ch.fwd) == pytest.approx(tf, rel=1e-12)
        assert sum(s.duration_s for ch in chs for s in ch.bwd) == pytest.approx(tb, rel=1e-12)
    act = sum(s.alloc_bytes for ch in rank0 for s in ch.fwd)
    stage0 = next(c for c, rc in enumerate(graph.classes) if rc.stage == 0)
    return PipeRun(max(trace.end_s), tf, tb, trace.peak_dynamic_bytes[stage0], act, program)


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (4, 4), (8, 16), (4, 2), (8, 3), (2, 1)])
def test_gpipe_and_1f1b_bubble_is_closed_form(kind: str, p: int, m: int) -> None:
    r = pipeline(p, m, kind)
    assert r.tf > 0 and r.tb > r.tf
    assert r.iteration_s == pytest.approx((m + p - 1) * (r.tf + r.tb), rel=1e-9)
    bubble = r.iteration_s - m * (r.tf + r.tb)
    assert bubble / r.iteration_s == pytest.approx((p - 1) / (m + p - 1), rel=1e-9)


@settings(max_examples=25, deadline=None)
@given(p=st.integers(1, 8), m=st.integers(1, 12), kind=st.sampled_from(["gpipe", "1f1b"]))
def test_closed_form_holds_for_any_depth_and_micro_batch_count(p: int, m: int, kind: str) -> None:
    r = pipeline(p, m, kind)
    assert r.iteration_s == pytest.approx((m + p - 1) * (r.tf + r.tb), rel=1e-9)


@pytest.mark.parametrize(("p", "m", "v"), [(2, 4, 2), (4, 8, 2), (2, 8, 4), (4, 4, 2), (4, 8, 4)])
def test_interleaved_bubble_shrinks_by_v(p: int, m: int, v: int) -> None:
    r = pipeline(p, m, "interleaved", v)
    bubble = r.iteration_s - m * (r.tf + r.tb)
    assert bubble == pytest.approx((p - 1) / v * (r.tf + r.tb), rel=1e-6)
    plain = pipeline(p, m, "1f1b", 1, layers_per_chunk=v)  # same model depth per rank, no interleaving
    assert plain.tf == pytest.approx(r.tf, rel=1e-12) and plain.tb == pytest.approx(r.tb, rel=1e-12)
    assert r.iteration_s < plain.iteration_s
    assert plain.iteration_s - m * (plain.tf + plain.tb) == pytest.approx(v * bubble, rel=1e-6)


@pytest.mark.parametrize(("p", "m"), [(4, 8), (4, 4), (4, 2), (2, 6), (8, 3)])
def test_first_stage_holds_m_micro_batches_under_gpipe_and_p_under_1f1b(p: int, m: int) -> None:
    g = pipeline(p, m, "gpipe")
    f = pipeline(p, m, "1f1b")
    assert g.stage0_act_bytes > 0
    assert g.stage0_peak_bytes / g.stage0_act_bytes == pytest.approx(m, rel=1e-12)
    assert f.stage0_peak_bytes / f.stage0_act_bytes == pytest.approx(min(p, m), rel=1e-12)


def _replay_peak(order: list[tuple[str, int, int]], act: dict[int, float]) -> float:
    """Peak of a rank's activations when each F allocates its chunk's bytes and each B frees them."""
    cur = peak = 0.0
    for ph, _, vc in order:
        cur += act[vc] if ph == "F" else -act[vc]
        peak = max(peak, cur)
    return peak


def test_interleaved_first_stage_memory_follows_its_schedule_and_exceeds_1f1b() -> None:
    p, m, v = 4, 8, 2
    r = pipeline(p, m, "interleaved", v)
    act = {ch.vchunk: sum(s.alloc_bytes for s in ch.fwd) for ch in r.program.chunks if ch.pp_rank == 0}
    assert r.stage0_peak_bytes == pytest.approx(_replay_peak(interleaved(p, m, 0, v), act), rel=1e-12)
    # warm-up of 2(p-1) + (v-1)p chunk forwards plus one: more in flight than 1F1B's p full stages
    assert r.stage0_peak_bytes > p * r.stage0_act_bytes


def test_activations_are_balanced_per_chunk() -> None:
    """Every byte a forward template allocates, its backward frees (no leak across micro-batches)."""
    for kind, v in (("1f1b", 1), ("interleaved", 2)):
        r = pipeline(2, 4, kind, v)
        for ch in r.program.chunks:
            alloc = sum(s.alloc_bytes for s in ch.fwd + ch.bwd)
            free = sum(s.free_bytes for s in ch.fwd + ch.bwd)
            assert alloc == pytest.approx(free, rel=1e-12) and alloc > 0


# --- schedule orders ----------------------------------------------------------------------------------


def _check_order(order: list[tuple[str, int, int]], m: int, v: int) -> None:
    expected = {(ph, mb, c) for ph in "FB" for mb in range(m) for c in range(v)}
    assert len(order) == len(expected) and set(order) == expected  # every item exactly once
    pos = {item: i for i, item in enumerate(order)}
    for mb in range(m):
        for c in range(v):
            assert pos[("F", mb, c)] < pos[("B", mb, c)]
            if c + 1 < v:  # a micro-batch goes forward through the chunks in order, backward in reverse
                assert pos[("F", mb, c)] < pos[("F", mb, c + 1)]
                assert pos[("B", mb, c + 1)] < pos[("B", mb, c)]
    for c in range(v):  # micro-batches enter each chunk in order
        fwd = [mb for ph, mb, ch in order if ph == "F" and ch == c]
        bwd = [mb for ph, mb, ch in order if ph == "B" and ch == c]
        assert fwd == sorted(fwd) and bwd == sorted(bwd)


@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 16), m=st.integers(1, 32), data=st.data())
def test_gpipe_and_1f1b_orders_are_complete_and_causal(p: int, m: int, data: st.DataObject) -> None:
    rank = data.draw(st.integers(0, p - 1))
    for kind in ("gpipe", "1f1b"):
        order = schedule_order(kind, p, m, rank)
        _check_order(order, m, 1)
    # 1F1B never has more than p - rank forwards in flight (its memory bound)
    inflight = peak = 0
    for ph, _, _ in one_f_one_b(p, m, rank):
        inflight += 1 if ph == "F" else -1
        peak = max(peak, inflight)
    assert peak == min(p - rank, m)
    assert gpipe(p, m, rank)[:m] == [("F", i, 0) for i in range(m)]


@settings(max_examples=60, deadline=None)
@given(p=st.integers(2, 8), k=st.integers(1, 4), v=st.integers(2, 4), data=st.data())
def test_interleaved_orders_are_complete_and_causal(p: int, k: int, v: int, data: st.DataObject) -> None:
    m = p * k  # Megatron's interleaved schedule needs m % p == 0
    rank = data.draw(st.integers(0, p - 1))
    order = schedule_order("interleaved", p, m, rank, v)
    _check_order(order, m, v)


def test_unknown_schedule_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown schedule"):
        schedule_order("zero-bubble", 2, 2, 0)


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_every_chunk_but_the_last_pays_for_its_forward_send(tp: int) -> None:
    """Each chunk sends its activations on (all but the last) and its gradients back (all but the first), priced
    by the same pair model: a collective's group size once stood in for the chunk count, so with tp 8 the
    chunks from 7 on sent for free."""
    from trainsim.api import costed_program, default_job, job_tree

    job = default_job().model_copy(update={"strategy": default_job().strategy.model_copy(
        update={"tp": tp, "dp": 64 // tp, "sequence_parallel": tp > 1})})
    cl, _, tree = job_tree(job)
    chunks = costed_program(tree, cl, job.simulation).program.chunks
    assert len(chunks) == 16
    for ch in chunks[:-1]:
        assert ch.send_fwd_s > 0, ch.chunk
    for ch in chunks[1:]:
        assert ch.send_bwd_s > 0, ch.chunk
    inner = [ch.send_fwd_s for ch in chunks[1:-1]]  # the same bytes between the same kind of neighbours
    assert max(inner) == pytest.approx(min(inner), rel=1e-9)
