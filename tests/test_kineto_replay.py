"""Kineto trace replay (trainsim.trace.kineto.graph / replay): synthetic traces with known answers (an event
wait across two streams, a host sync, a CPU-only trace, a launch-bound trace, a gap-free random property)
and the shared real single-rank traces (replay error per step against ProfilerStep / optimizer spacing)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainsim.replay import replay_trace
from trainsim.sim.engine import run
from trainsim.trace.kineto import trace_from_json
from trainsim.trace.kineto.graph import FIRST_STREAM, build_replay, build_replay_graph

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"


def _x(cat: str, name: str, ts: float, dur: float, pid: Any = 1, tid: Any = 1, **args: Any) -> dict:  # noqa: ANN401
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _launch(ts: float, corr: int, dur: float = 5) -> dict:
    return _x("cuda_runtime", "cudaLaunchKernel", ts, dur, cbid=211, correlation=corr)


def _kernel(name: str, ts: float, dur: float, stream: int, corr: int) -> dict:
    return _x("kernel", name, ts, dur, pid=0, tid=stream, device=0, stream=stream, correlation=corr)


def _step_ms(events: list[dict], **what_if: float) -> float:
    """Replayed length of the single step, ms, after setting named tasks' durations (us)."""
    rg = build_replay(trace_from_json({"traceEvents": events}, "synthetic"))
    g = rg.graph
    for name, us in what_if.items():
        for t in range(len(g)):
            if g.name[t] == name:
                g.duration_s[t] = us * 1e-6
    sim = run(g, gamma=0.0, record_memory=False, bandwidth_sharing=False)
    (th,) = set(rg.step_thread.values())
    b = rg.boundary_us[th].tolist()
    start = sim.end_s[rg.first_segment[th] + b.index(0.0) - 1] if b.index(0.0) > 0 else 0.0
    return (sim.end_s[rg.first_segment[th] + len(b) - 2] - start) * 1e3


def _two_streams(with_sync_record: bool) -> list[dict]:
    ev = [
        _x("user_annotation", "ProfilerStep#1", 0, 300),
        _launch(10, 1), _kernel("A", 20, 100, 7, 1),
        _x("cuda_runtime", "cudaEventRecord", 20, 2, cbid=135, correlation=2),
        _x("cuda_runtime", "cudaStreamWaitEvent", 30, 2, cbid=147, correlation=3),
        _launch(40, 4), _kernel("B", 121, 50, 9, 4),
        _x("cuda_runtime", "cudaDeviceSynchronize", 50, 130, cbid=165, correlation=5),
        _x("cpu_op", "aten::foo", 190, 60),
    ]
    if with_sync_record:
        ev.append(_x("cuda_sync", "Stream Wait Event", 30, 1, pid=0, tid=9, cuda_sync_kind="Stream Wait Event",
                     stream=9, wait_on_stream=7, wait_on_cuda_event_record_corr_id=2, correlation=3, device=0))
    return ev


@pytest.mark.parametrize("with_sync_record", [True, False])
def test_event_wait_two_streams(with_sync_record: bool) -> None:
    ev = _two_streams(with_sync_record)
    r = replay_trace(trace_from_json({"traceEvents": ev}, "synthetic"))
    assert [(s.step, round(s.measured_ms, 6), round(s.replayed_ms, 6)) for s in r.steps] == [(1, 0.3, 0.3)]
    g = r.graph
    assert g is not None
    b = g.name.index("B")
    assert g.name.index("A") in g.deps[b]  # the cross-stream wait
    assert len({g.stream[g.name.index("A")], g.stream[b]}) == 2 and min(g.stream) >= FIRST_STREAM
    # A 100 us longer: B waits for A, the device sync for B, the rest of the step moves by 100 us
    assert _step_ms(ev, A=200) == pytest.approx(0.4, abs=1e-9)


def test_host_sync() -> None:
    ev = [_x("user_annotation", "ProfilerStep#3", 0, 200), _launch(10, 1), _kernel("K", 20, 100, 7, 1),
          _x("cuda_runtime", "cudaStreamSynchronize", 20, 105, cbid=131, correlation=2),
          _x("cpu_op", "aten::item", 130, 60)]
    assert _step_ms(ev) == pytest.approx(0.2, abs=1e-9)
    assert _step_ms(ev, K=200) == pytest.approx(0.3, abs=1e-9)  # the CPU waits for the longer kernel
    assert _step_ms(ev, K=10) == pytest.approx(0.11, abs=1e-9)  # sync returns 5 us after K (as measured)


def test_cpu_only_trace() -> None:
    ev = [_x("user_annotation", "ProfilerStep#1", 0, 100), _x("cpu_op", "aten::a", 5, 30),
          _x("cpu_op", "aten::b", 50, 40), _x("cpu_op", "gloo:all_reduce", 10, 70, tid=2),
          _x("user_annotation", "ProfilerStep#2", 100, 50), _x("cpu_op", "aten::c", 110, 20)]
    r = replay_trace(trace_from_json({"traceEvents": ev}, "synthetic"))
    assert [(s.step, round(s.measured_ms, 9), round(s.replayed_ms, 9)) for s in r.steps] == [(1, 0.1, 0.1),
                                                                                               (2, 0.05, 0.05)]
    assert r.n_streams == 2 and r.replay_error_pct == pytest.approx(0.0, abs=1e-9)
    assert r.busy_ms_by_category["host_idle"] > 0 and r.busy_ms_by_category["host"] > 0
    assert any("no GPU ops" in a for a in r.assumptions)


def test_launch_bound_gpu_waits_on_cpu() -> None:
    ev = [_x("user_annotation", "ProfilerStep#1", 0, 120)]
    for i in range(10):
        ev += [_x("cpu_op", f"aten::op{i}", 10 * i, 9), _launch(10 * i + 2, 100 + i),
               _kernel(f"k{i}", 10 * i + 8, 2, 7, 100 + i)]
    tr = trace_from_json({"traceEvents": ev}, "synthetic")
    r = replay_trace(tr)
    assert r.steps[0].replayed_ms == pytest.approx(0.12, abs=1e-9)
    g = r.graph
    sim = r.trace
    assert g is not None and sim is not None
    assert sim.start_s[g.name.index("k9")] * 1e6 == pytest.approx(98.0)
    # faster kernels do not help (CPU-bound); a longer host op delays every later kernel
    assert _step_ms(ev, **{f"k{i}": 1 for i in range(10)}) == pytest.approx(0.12, abs=1e-9)
    rg = build_replay(tr)
    g2 = rg.graph
    g2.duration_s[g2.name.index("ProfilerStep#1")] += 50e-6  # host work before the first launch
    sim2 = run(g2, gamma=0.0, record_memory=False, bandwidth_sharing=False)
    assert sim2.start_s[g2.name.index("k9")] * 1e6 == pytest.approx(148.0)
    # the modelled launch latency (median) reproduces a uniform-latency trace too
    assert replay_trace(tr, measured_latency=False).steps[0].replayed_ms == pytest.approx(0.12, abs=1e-9)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 20), st.integers(1, 10), st.integers(0, 15), st.integers(1, 40),
                          st.integers(0, 1)), min_size=1, max_size=25))
def test_gap_free_trace_replays_to_its_length(ops: list[tuple[int, int, int, int, int]]) -> None:
    """Random CPU ops each launching one kernel on one of two streams, kernels starting when both the launch
    (plus a latency) and the stream allow: the replay reproduces the measured span and every GPU op end."""
    ev: list[dict] = []
    t = 0.0
    stream_free = {7: 0.0, 9: 0.0}
    ends = []
    for i, (host_us, launch_us, lat_us, kdur_us, s) in enumerate(ops):
        ev.append(_x("cpu_op", f"op{i}", t, host_us + launch_us))
        ev.append(_launch(t + host_us, i + 1, launch_us))
        stream = (7, 9)[s]
        start = max(t + host_us + lat_us, stream_free[stream])
        ev.append(_kernel(f"k{i}", start, kdur_us, stream, i + 1))
        stream_free[stream] = start + kdur_us
        ends.append(start + kdur_us)
        t += host_us + launch_us
    span = max(t, *ends)
    ev.append(_x("cuda_runtime", "cudaDeviceSynchronize", t, span - t + 1, cbid=165, correlation=10_000))
    r = replay_trace(trace_from_json({"traceEvents": ev}, "synthetic"))
    assert r.makespan_ms == pytest.approx(r.measured_span_ms, abs=1e-9)
    g, sim = r.graph, r.trace
    assert g is not None and sim is not None
    for i, e in enumerate(ends):
        assert sim.end_s[g.name.index(f"k{i}")] * 1e6 == pytest.approx(e - ev[0]["ts"], abs=1e-6)


def test_graph_api_and_names() -> None:
    g = build_replay_graph(trace_from_json({"traceEvents": _two_streams(True)}, "synthetic"))
    assert len(g.classes) == 1 and g.classes[0].multiplicity == 1
    assert sorted(g.stream_names.values()) == ["cpu 1/1", "gpu 0 stream 7", "gpu 0 stream 9"]
    assert g.stream_name(0) == "compute" and g.stream_name(FIRST_STREAM).startswith(("cpu", "gpu"))
    assert set(g.category) >= {"host", "launch", "sync", "compute"}


SINGLE_RANK = sorted(str(p.relative_to(TRACES)) for p in TRACES.rglob("*.json.gz")) if TRACES.is_dir() else []


@pytest.mark.skipif(not TRACES.is_dir(), reason="../shared/traces is absent")
def test_shared_traces_replay_error() -> None:
    """Every shared trace replays (one rank each); report per-file error. With measured launch latencies the
    graph reproduces each step within 0.2% (measured here: max 0.15%, mean per file <= 0.08%); with the
    median launch latency instead (a model), median 0.01% and max 14% (param resnet, launch latencies vary)."""
    errs, modelled = [], []
    for rel in SINGLE_RANK:
        r = replay_trace(TRACES / rel)
        assert r.steps and all(s.measured_ms > 0 for s in r.steps)
        print(f"{rel}: {len(r.steps)} steps, error {r.replay_error_pct:.3f}%")
        assert max(s.error_pct for s in r.steps) <= 0.2, rel
        errs.append(r.replay_error_pct)
        modelled.append(replay_trace(TRACES / rel, measured_latency=False).replay_error_pct)
    assert statistics.median(errs) <= 0.05 and max(errs) <= 0.2
    assert statistics.median(modelled) <= 0.1 and max(modelled) <= 16.0
