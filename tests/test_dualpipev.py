"""DualPipeV (DeepSeek-V3's DualPipe cut in half, github.com/deepseek-ai/DualPipe) through the real compiler and
engine.

Its 2p chunks form a V over p ranks (rank r runs chunks r and 2p - 1 - r), every backward is split into B and W as in
zero bubble, and rank r's order has eight phases (strategy.schedules.dualpipev). The checks: every order is
complete and causal; an independent executor of the orders (each item starts when its rank is free and its inputs
are done) never deadlocks and, with equal F, B and W per chunk, leaves the paper's bubble (p - 1)(F&B + B - 3W) =
(p - 1) F, where 1F1B over the same ranks leaves 2 (p - 1)(F + B + W); and the event engine on uniform stages with
free communication takes exactly the executor's time.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pipeline_helpers import make_uniform_and_free, play_orders

from trainsim import api
from trainsim.compile.graph import build_graph, split_backward
from trainsim.compile.program import lower
from trainsim.cost.annotate import annotate
from trainsim.cost.comm import HierarchicalAlphaBeta
from trainsim.cost.compute import RooflineCompute
from trainsim.errors import ConfigError
from trainsim.hardware.cluster import get_cluster
from trainsim.sim.engine import run
from trainsim.strategy.precision import Precision
from trainsim.strategy.presets import ParallelSpec, build_strategy
from trainsim.strategy.schedules import chunk_index, chunk_place, dualpipev, schedule_order
from trainsim.workload.zoo import build_model

CLUSTER = get_cluster("dgx-a100")


def execute(kind: str, p: int, m: int, f_s: float, b_s: float, w_s: float, v: int = 1) -> float:
    """The makespan of the per-rank orders of `kind` run as written (pipeline_helpers.play_orders); f_s, b_s, w_s per
    chunk (a schedule without W runs B + W as one backward). Fails on a deadlock."""
    orders = [schedule_order(kind, p, m, r, 2 if kind == "dualpipev" else v) for r in range(p)]
    split = kind in ("dualpipev", "zb-h1")
    return play_orders(orders, f_s, b_s if split else b_s + w_s, w_s,
                       lambda r, vc: chunk_index(r, vc, p, kind))


@settings(max_examples=80, deadline=None)
@given(p=st.integers(1, 12), extra=st.integers(0, 20), data=st.data())
def test_orders_are_complete_and_causal(p: int, extra: int, data: st.DataObject) -> None:
    m = 2 * p + extra
    rank = data.draw(st.integers(0, p - 1))
    order = dualpipev(p, m, rank)
    expected = {(ph, mb, vc) for ph in "FBW" for mb in range(m) for vc in (0, 1)}
    assert len(order) == len(expected) and set(order) == expected
    pos = {item: i for i, item in enumerate(order)}
    for mb in range(m):
        for vc in (0, 1):
            assert pos[("F", mb, vc)] < pos[("B", mb, vc)] < pos[("W", mb, vc)]
        if rank == p - 1:  # the bottom of the V: both chunks on this rank, forward 0 -> 1, backward 1 -> 0
            assert pos[("F", mb, 0)] < pos[("F", mb, 1)] and pos[("B", mb, 1)] < pos[("B", mb, 0)]
    for ph in "FBW":
        for vc in (0, 1):
            mbs = [mb for x, mb, c in order if x == ph and c == vc]
            assert mbs == sorted(mbs)  # micro-batches in order per chunk (W: first in first out)
    # the warm-up runs 2 (p - r - 1) + 2 (r + 1) = 2p forwards before the first backward; the last rank starts the
    # steady state's (F0, B1) pair at once, so one more
    first_b = next(i for i, item in enumerate(order) if item[0] == "B")
    assert first_b == 2 * p + (rank == p - 1)
    # its memory: 2p + 1 chunk forwards wait for their backward at the peak, on every rank (1F1B: p - r stages)
    held = peak = 0
    for ph, _, _ in order:
        held += {"F": 1, "B": -1, "W": 0}[ph]
        peak = max(peak, held)
    assert peak == 2 * p + 1


@pytest.mark.parametrize("p", [1, 2, 3, 4, 8])
def test_v_placement(p: int) -> None:
    for c in range(2 * p):
        r, vc = chunk_place(c, p, "dualpipev")
        assert chunk_index(r, vc, p, "dualpipev") == c
    assert chunk_place(0, p, "dualpipev") == (0, 0) and chunk_place(2 * p - 1, p, "dualpipev") == (0, 1)
    assert chunk_place(p - 1, p, "dualpipev") == (p - 1, 0) and chunk_place(p, p, "dualpipev") == (p - 1, 1)
    assert [chunk_place(c, p, "interleaved") for c in range(2 * p)] == [(c % p, c // p) for c in range(2 * p)]


def test_too_few_micro_batches_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 2 x pp = 8"):
        dualpipev(4, 7, 0)


@settings(max_examples=40, deadline=None)
@given(p=st.integers(1, 10), extra=st.integers(0, 12), f=st.floats(0.5, 3.0))
def test_equal_costs_leave_the_papers_bubble(p: int, extra: int, f: float) -> None:
    """F = B = W per chunk: (p - 1)(F&B + B - 3W) with F&B = F + B + W run back to back is (p - 1) F; 1F1B's
    stage (two chunks) leaves 2 (p - 1)(F + B + W) = 6 (p - 1) F."""
    m = 2 * p + extra
    work = 2 * m * 3 * f  # each rank runs F, B and W of its two chunks for every micro-batch
    assert execute("dualpipev", p, m, f, f, f) - work == pytest.approx((p - 1) * f, rel=1e-9, abs=1e-9)
    assert execute("1f1b", p, m, 2 * f, 2 * f, 2 * f) - work == pytest.approx(6 * (p - 1) * f, rel=1e-9)


def _uniform_pipeline(p: int, m: int) -> tuple[float, float, float, float, int]:
    """A tiny GPT under DualPipeV lowered, costed, built and simulated with uniform chunks (transformer-layer
    compute only: embedding, head, collectives, sends and the optimizer take no time, no host overhead): the
    iteration, one chunk's F, B, W and the pipeline sends in the graph."""
    mdl = build_model("custom", 1, 128, "flash", layers=2 * p, hidden=256, heads=4, vocab=1024)
    spec = ParallelSpec(pp=p, vpp=2, schedule="dualpipev", micro_batch=1, global_batch=m)
    program = lower(build_strategy(mdl, spec), Precision())
    annotate(program, CLUSTER, RooflineCompute(), HierarchicalAlphaBeta(CLUSTER))
    make_uniform_and_free(program)
    graph = build_graph(program, granularity="op", optimizer_s=dict.fromkeys(range(p), 0.0))
    trace = run(graph, gamma=0.0, p2p_host_sync=False)
    per_chunk = set()
    for ch in program.chunks:
        b_half, w_half = split_backward(ch.bwd)
        per_chunk.add(tuple(round(sum(s.duration_s for s in x), 15) for x in (ch.fwd, b_half, w_half)))
    assert len(per_chunk) == 1  # the chunks really are uniform
    (f_s, b_s, w_s), = per_chunk
    sends = sum(1 for k in graph.kind if k == "p2p")
    return max(trace.end_s), f_s, b_s, w_s, sends


@pytest.mark.parametrize(("p", "m"), [(2, 4), (2, 7), (3, 6), (4, 8), (4, 11)])
def test_engine_takes_the_executors_time(p: int, m: int) -> None:
    iteration, f_s, b_s, w_s, sends = _uniform_pipeline(p, m)
    assert f_s > 0 and b_s > 0 and w_s > 0
    assert iteration == pytest.approx(execute("dualpipev", p, m, f_s, b_s, w_s), rel=1e-9)
    # every chunk boundary but the bottom of the V crosses ranks: 2p - 2 forward and 2p - 2 backward sends
    assert sends == m * 2 * (2 * p - 2)


def _job(schedule: str, **strategy: object) -> dict:
    return {"model": {"name": "llama3-8b", "seq_len": 2048}, "cluster": {"name": "dgx-h100", "nodes": 1},
            "strategy": {"pp": 4, "dp": 2, "global_batch": 32, "schedule": schedule, **strategy}}


def test_first_rank_holds_embedding_and_head_and_the_bubble_shrinks() -> None:
    v = api.simulate(_job("dualpipev"))
    one = api.simulate(_job("1f1b"))
    assert v.strategy["vpp"] == 2 and v.strategy["schedule"] == "dualpipev"
    assert v.iteration_time_s < one.iteration_time_s
    assert v.breakdown["bubble"] < one.breakdown["bubble"]
    static = [m.static_bytes for m in v.memory]
    assert static[0] > max(static[1:])  # embedding and LM head (untied in Llama 3) both on rank 0
    assert static[1] == pytest.approx(static[2], rel=1e-12) == pytest.approx(static[3], rel=1e-12)
    assert v.model_flops == pytest.approx(one.model_flops, rel=1e-12)  # the same work, placed and ordered apart


def test_memory_replay_covers_the_steady_state() -> None:
    """The allocator replay plays 2p + 2 micro-batches: more of them leave every stage's peak where it is."""
    a = api.simulate(_job("dualpipev", global_batch=20))  # m = 10 = 2p + 2
    b = api.simulate(_job("dualpipev", global_batch=40))
    for x, y in zip(a.memory, b.memory, strict=True):
        assert x.peak_bytes == pytest.approx(y.peak_bytes, rel=1e-12)
        assert x.peak_reserved_bytes == pytest.approx(y.peak_reserved_bytes, rel=1e-12)


@pytest.mark.parametrize(("strategy", "field"), [
    ({"global_batch": 8}, "global_batch"),  # 4 micro-batches < 2 x pp
    ({"vpp": 3}, "strategy.vpp"),
    ({"pp": 1, "dp": 8}, "pp"),
])
def test_bad_dualpipev_jobs_are_refused(strategy: dict, field: str) -> None:
    with pytest.raises(ConfigError) as e:
        api.simulate(_job("dualpipev", **strategy))
    assert field in str(e.value)


@pytest.mark.parametrize(("p", "m", "costs"), [(2, 4, (1.0, 1.0, 1.0)), (4, 11, (1.0, 2.0, 0.5)),
                                                (8, 19, (2.0, 1.5, 1.0))])
def test_the_analytic_replay_is_the_executors(p: int, m: int, costs: tuple[float, float, float]) -> None:
    from trainsim.sim.analytic import replay_order

    chunks = [(*chunk_place(c, p, "dualpipev"), *costs, 0.0, 0.0) for c in range(2 * p)]
    ends, held = replay_order("dualpipev", p, m, 2, chunks)
    assert max(ends) == pytest.approx(execute("dualpipev", p, m, *costs), rel=1e-12)
    assert all(h.sum() == 2 * p for h in held)  # 2p + 1 at the peak, less the forward reaching it


@pytest.mark.parametrize("job", [
    _job("dualpipev"),
    {"model": {"name": "gpt2", "layers": 16, "seq_len": 256}, "cluster": {"name": "dgx-a100", "nodes": 1},
     "strategy": {"pp": 8, "dp": 1, "global_batch": 96, "schedule": "dualpipev"}},
])
def test_analytic_tier_follows_the_event_simulation(job: dict) -> None:
    """The analytic tier replays DualPipeV's order on the per-chunk costs, the hosts waiting on their sends: within
    1% of the event simulation (which adds the links the sends share and the hosts' own pace)."""
    event = api.simulate(job)
    analytic = api.simulate({**job, "simulation": {"fidelity": "analytic"}})
    assert analytic.iteration_time_s == pytest.approx(event.iteration_time_s, rel=0.01)
    for a, e in zip(analytic.memory, event.memory, strict=True):
        assert a.peak_bytes == pytest.approx(e.peak_bytes, rel=0.05)


def test_the_cli_refuses_a_short_batch_in_one_line(tmp_path) -> None:  # noqa: ANN001
    job = _job("dualpipev", global_batch=8)
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job))
    out = tmp_path / "out.json"
    proc = subprocess.run([sys.executable, "-m", "trainsim", "simulate", str(path), "-q", "--json", str(out)],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and "global_batch" in proc.stderr and "2 x pp" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not out.exists()


def test_the_bottom_of_the_v_hands_over_whole() -> None:
    """The last rank's two chunks hand over without a send: nothing scattered over tp to gather again, no bytes
    on a link; every other chunk boundary sends (tp 2: 1/tp of the hand-off per rank, Megatron's scatter-gather)."""
    from trainsim.api import costed_program, job_tree

    job = _job("dualpipev", tp=2, dp=1)
    cl, _, tree = job_tree(api.JobConfig.model_validate(job))
    chunks = costed_program(tree, cl, api.JobConfig.model_validate(job).simulation).program.chunks
    p = 4
    assert chunks[p - 1].pp_rank == chunks[p].pp_rank == p - 1
    assert chunks[p - 1].send_fwd_bytes == 0 and chunks[p - 1].send_fwd_s == 0
    assert chunks[p].send_bwd_bytes == 0 and chunks[p].send_bwd_s == 0
    for c in range(2 * p - 1):
        if c != p - 1:
            assert chunks[c].send_fwd_bytes > 0 and chunks[c].send_fwd_s > 0
    gathers = [[s for s in ch.fwd[:3] if s.collective == "all_gather"] for ch in chunks]
    assert not gathers[p] and all(gathers[c] for c in range(1, 2 * p) if c != p)  # received scattered: gathered
