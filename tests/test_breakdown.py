"""The per-class breakdown and the critical path's categories (sim.result), computed for all classes at once
in numpy columns, against a plain reference: each class's tasks one by one (`task_parts`) and its timeline cut
at every event, every piece asked what runs in it. On random jobs (pipelines, exact per-rank classes whose
collectives several classes share, offload, experts), on a replayed trace's streams and on a hand-made graph."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, reject, settings
from hypothesis import strategies as st

from trainsim.api import simulate
from trainsim.compile.graph import ExecutionGraph
from trainsim.compile.program import Stream
from trainsim.errors import ConfigError
from trainsim.sim.engine import SimTrace, run
from trainsim.sim.result import (
    BREAKDOWN_KEYS,
    COMM_PRIORITY,
    class_breakdowns,
    critical_path,
    is_compute,
    task_parts,
    time_by_category,
)
from trainsim.trace.kineto import trace_from_json
from trainsim.trace.kineto.graph import build_replay

TINY_MOE = {"name": "mixtral-8x7b", "layers": 4, "hidden": 256, "heads": 8, "ffn": 512, "vocab": 1000}


def reference_breakdown(graph: ExecutionGraph, trace: SimTrace, cls: int, horizon: float) -> dict[str, float]:
    """One class's [0, horizon): compute parts task by task; between consecutive event times, compute if any
    compute task runs, else the most blocking communication running (COMM_PRIORITY), else bubble before the
    class's last non-optimizer compute task ends and idle after."""
    out = dict.fromkeys(BREAKDOWN_KEYS, 0.0)
    mine = [t for t in range(len(graph)) if cls in graph.participants[t]]
    last_bwd_end = 0.0
    for t in mine:
        if trace.end_s[t] > trace.start_s[t] and is_compute(graph, t):
            for k, v in task_parts(graph, trace, t):
                out[k if k in out else "compute"] += v
            if graph.category[t] != "optimizer":
                last_bwd_end = max(last_bwd_end, trace.end_s[t])
    spans = [(min(max(trace.start_s[t], 0.0), horizon), min(max(trace.end_s[t], 0.0), horizon), t) for t in mine]
    cuts = sorted({0.0, horizon, *(s for s, _, _ in spans), *(e for _, e, _ in spans)})
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):
        running = [t for s, e, t in spans if s <= a and e >= b and e > s]
        if any(is_compute(graph, t) for t in running):
            continue
        kinds = {graph.category[t] for t in running}
        first = next((k for k in COMM_PRIORITY if k in kinds), None)
        if first is not None:
            out[first] += b - a
        else:
            cut = min(max(last_bwd_end, a), b)
            out["bubble"] += cut - a
            out["idle"] += b - cut
    return out


def reference_categories(graph: ExecutionGraph, trace: SimTrace, tasks: list[int]) -> dict[str, float]:
    out: dict[str, float] = {}
    for t in tasks:
        for k, v in task_parts(graph, trace, t):
            out[k] = out.get(k, 0.0) + v
    return out


def _assert_close(got: dict[str, float], want: dict[str, float], scale: float) -> None:
    assert list(got) == list(want)
    for k in want:
        assert got[k] == pytest.approx(want[k], rel=1e-9, abs=1e-12 * scale), k


def _check(graph: ExecutionGraph, trace: SimTrace) -> None:
    horizon = max(trace.end_s) if len(graph) else 0.0
    got = class_breakdowns(graph, trace, horizon)
    assert len(got) == len(graph.classes)
    for c, row in enumerate(got):
        _assert_close(row, reference_breakdown(graph, trace, c, horizon), horizon)
    path = critical_path(graph, trace)
    _assert_close(time_by_category(graph, trace, path), reference_categories(graph, trace, path), horizon)


@st.composite
def jobs(draw: st.DrawFn) -> dict[str, Any]:
    """A small job of 8 GPUs: a pipeline or not, TP with or without SP, experts, ZeRO, recompute, offload,
    overlap flags, exact per-rank classes (collectives several classes share) and bandwidth sharing."""
    kind = draw(st.sampled_from(["1f1b", "zb-h1", "interleaved", "gpipe", "ep", "flat"]))
    model: dict[str, Any] = {"name": "gpt2", "layers": 4, "seq_len": draw(st.sampled_from([128, 256]))}
    s: dict[str, Any] = {"pp": draw(st.sampled_from([1, 2])), "tp": draw(st.sampled_from([1, 2])), "micro_batch": 1}
    if kind in ("zb-h1", "gpipe"):
        s.update(pp=2, schedule=kind)
    elif kind == "interleaved":
        s.update(pp=2, vpp=2)
    elif kind == "ep":
        model = {**TINY_MOE, "seq_len": model["seq_len"]}
        s.update(pp=2, ep=2)
    s["sequence_parallel"] = s["tp"] > 1 and draw(st.booleans())
    s["dp"] = 8 // (s["tp"] * s["pp"])
    s["global_batch"] = s["dp"] * draw(st.sampled_from([4, 6]))
    s["recompute"] = draw(st.sampled_from(["none", "selective", "full"]))
    s["zero"] = draw(st.sampled_from([0, 1, 3]))
    s["overlap_grad_reduce"] = draw(st.booleans())
    if draw(st.booleans()):
        s["offload"] = "optimizer"
    sim = {"exact": draw(st.booleans()), "bandwidth_sharing": draw(st.booleans())}
    return {"model": model, "cluster": {"name": "dgx-a100"}, "strategy": s, "simulation": sim}


@settings(max_examples=40, deadline=None, derandomize=True)
@given(jobs())
def test_breakdown_matches_the_reference_on_random_jobs(job: dict[str, Any]) -> None:
    try:
        r = simulate(job, timeline=True)
    except ConfigError:
        reject()
    assert r.graph is not None and r.trace is not None
    _check(r.graph, r.trace)


def test_breakdown_of_a_replayed_trace_with_streams_of_its_own() -> None:
    """A replayed Kineto trace puts kernels on CUDA streams beyond compile.program.Stream: a kernel there is
    compute by its kind, the host threads' tasks are not."""
    def x(cat: str, name: str, ts: float, dur: float, pid: int = 1, tid: int = 1, **args: Any) -> dict:  # noqa: ANN401
        return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}

    events = [x("user_annotation", "ProfilerStep#1", 0, 400)]
    for i, (stream, ts, dur) in enumerate([(7, 20, 100), (9, 60, 50), (7, 200, 80), (11, 150, 30)]):
        events.append(x("cuda_runtime", "cudaLaunchKernel", ts - 10, 5, cbid=211, correlation=i))
        kernel = "ncclKernel_AllReduce" if stream == 11 else f"gemm{i}"
        events.append(x("kernel", kernel, ts, dur, pid=0, tid=stream, device=0, stream=stream, correlation=i))
    graph = build_replay(trace_from_json({"traceEvents": events}, "synthetic")).graph
    assert max(graph.stream) >= len(Stream)
    _check(graph, run(graph, gamma=0.0, record_memory=False, bandwidth_sharing=False))


def test_breakdown_of_a_hand_made_graph() -> None:
    """Two classes: compute, a fused task that ran longer than its parts, a TP and a DP collective the
    classes share overlapping each other and the compute, a pipeline send, an optimizer step, and a class
    idle at the end."""
    from trainsim.sim.engine import SimTrace as Trace

    g = ExecutionGraph()
    g.classes = [None, None]  # type: ignore[list-item]  # only their number matters here
    a = g.add("f", "compute", Stream.COMPUTE, "compute", 1.0, (0,), [], 0)
    b = g.add("fused", "compute", Stream.COMPUTE, "compute", 1.0, (0,), [a], 0, parts={"compute": 0.6, "tp": 0.4},
              host_path_s=1.5)
    c = g.add("ar", "collective", Stream.FEATURE, "tp", 0.5, (0, 1), [a], 0)
    d = g.add("dp", "collective", Stream.GRAD, "dp", 2.0, (0, 1), [b], 0)
    e = g.add("send", "p2p", Stream.P2P, "pp", 0.3, (1,), [], 0)
    f = g.add("opt", "compute", Stream.COMPUTE, "optimizer", 0.5, (1,), [d], -1)
    trace = Trace(start_s=[0.0, 1.0, 0.8, 2.5, 0.2, 4.5], end_s=[1.0, 2.5, 1.3, 4.5, 0.5, 5.0],
                  critical_pred=[-1, a, a, b, -1, d], peak_dynamic_bytes=[0.0, 0.0])
    assert [c, e, f] == [2, 4, 5]
    got = class_breakdowns(g, trace, 6.0)
    for cls in range(2):
        _assert_close(got[cls], reference_breakdown(g, trace, cls, 6.0), 6.0)
    assert got[0]["tp"] == pytest.approx(0.4)  # the fused task waited for its host: that went to compute
    assert got[1]["tp"] == pytest.approx(0.5) and got[1]["pp"] == pytest.approx(0.3)
    _assert_close(time_by_category(g, trace, [a, b, d, f]), reference_categories(g, trace, [a, b, d, f]), 6.0)
