"""The event engine (sim.engine.run, rewritten for speed) gives the trace of the engine before the rewrite
(tests/engine_reference.py) to the bit: every task's start, end, issue time and critical predecessor, each
class's peak memory and memory timeline, the progress calls and the SimulationError of a graph that cannot
finish. Random graphs exercise what real jobs rarely do: ties in time, collectives over several classes in
any participant order, host-bound tasks that wait to be issued, pipeline syncs, gradient overlap (gamma),
links shared by many flows, zero latencies and durations, extra streams and deadlocks."""

from __future__ import annotations

import math
from typing import Any

import pytest
from engine_reference import run as reference_run
from hypothesis import given, settings
from hypothesis import strategies as st

import trainsim.api as api
from trainsim.api import default_job
from trainsim.compile.graph import ExecutionGraph, RankClass
from trainsim.compile.program import Stream
from trainsim.sim.engine import SimTrace, SimulationError, run

FIELDS = ("start_s", "end_s", "critical_pred", "peak_dynamic_bytes", "memory_timeline", "issue_s")
TIMES = (0.0, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0)  # few values: many events tie in time
CATEGORIES = ("compute", "recompute", "optimizer", "tp", "dp", "pp")


def _same(a: Any, b: Any) -> bool:  # noqa: ANN401
    """Equal to the bit (nan equals nan), through lists and tuples."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b) or (math.isnan(a) and math.isnan(b))
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _outcome(engine: Any, graph: ExecutionGraph,  # noqa: ANN401
             **kw: Any) -> tuple[SimTrace | str, list[tuple[int, int]]]:  # noqa: ANN401
    calls: list[tuple[int, int]] = []
    try:
        trace: SimTrace | str = engine(graph, progress=lambda k, n: calls.append((k, n)), progress_every=3,
                                       **kw)
    except SimulationError as e:
        trace = str(e)
    return trace, calls


def assert_same_run(graph: ExecutionGraph, **kw: Any) -> None:  # noqa: ANN401
    """sim.engine.run and the reference engine agree on everything they return (or raise)."""
    new, new_calls = _outcome(run, graph, **kw)
    ref, ref_calls = _outcome(reference_run, graph, **kw)
    assert new_calls == ref_calls
    if isinstance(ref, str) or isinstance(new, str):
        assert new == ref
        return
    for f in FIELDS:
        assert _same(getattr(new, f), getattr(ref, f)), f


@st.composite
def graphs(draw: st.DrawFn) -> ExecutionGraph:
    """A random execution graph: tasks in program order on 1-4 classes, dependencies on earlier tasks,
    collectives several classes join, flows over a few shared resources, host issue and memory."""
    g = ExecutionGraph()
    n_classes = draw(st.integers(1, 4))
    g.classes = [RankClass(f"c{c}", c, 1, range(c, c + 1)) for c in range(n_classes)]
    shared = [g.resource_id(f"link{r}") for r in range(draw(st.integers(0, 3)))]
    own = [g.resource_id(f"own{c}") for c in range(n_classes)]  # loaded by a class's compute stream, mostly
    time = st.sampled_from(TIMES)
    streams = [*Stream, 5] if draw(st.booleans()) else list(Stream)
    for t in range(draw(st.integers(1, 40))):
        stream = draw(st.sampled_from(streams))
        classes = (draw(st.integers(0, n_classes - 1)),)
        if stream in (Stream.FEATURE, Stream.GRAD) and n_classes > 1 and draw(st.booleans()):
            classes = tuple(draw(st.permutations(range(n_classes)))[:draw(st.integers(2, n_classes))])
        deps = sorted(set(draw(st.lists(st.integers(0, t - 1), max_size=3)))) if t else []
        duration = draw(time)
        parts = None
        if stream == Stream.COMPUTE and draw(st.booleans()):
            cats = draw(st.lists(st.sampled_from(CATEGORIES), min_size=1, max_size=3))
            parts = {c: draw(time) for c in cats}
        demand = None
        if stream == Stream.COMPUTE and draw(st.booleans()):  # below, at or above the link's capacity
            work = [draw(st.sampled_from((0.2, 0.5, 0.9995, 1.0, 1.5))) * duration
                    for _ in range(draw(st.sampled_from((1, 1, 1, 2))))]  # twice: rounding left on the link
            demand = tuple((own[classes[0]], w) for w in work)
        elif draw(st.integers(0, 2)):
            links = shared + own[:draw(st.integers(0, 1))]  # now and then another class's own link
            if links:
                loaded = sorted(set(draw(st.lists(st.sampled_from(links), min_size=1, max_size=3))))
                demand = tuple((r, draw(st.sampled_from((0.0, 0.5, 1.0, 2.0)))) for r in loaded)
        host_s = draw(st.sampled_from((0.0, 0.0, 0.1, 0.5, 1.0)))
        host_path = draw(st.none() | time)
        g.add(f"t{t}", "compute" if stream == Stream.COMPUTE else "collective", stream,
              draw(st.sampled_from(CATEGORIES)), duration, classes, deps, parts=parts,
              mem_peak=draw(st.sampled_from((0.0, 1.0, 3.0))),
              mem_net=draw(st.sampled_from((0.0, 2.0, -2.0))),
              host_s=host_s, host_path_s=host_path, flow_latency_s=draw(st.sampled_from((0.0, 0.25, 1.0))),
              flow_demand=demand, host_sync=draw(st.integers(0, 5)) == 0)
    if len(g) > 2 and draw(st.integers(0, 9)) == 0:  # a class joins an earlier collective late: may deadlock
        t = draw(st.integers(0, len(g) - 1))
        missing = [c for c in range(n_classes) if c not in g.participants[t]]
        if missing:
            g.join(t, draw(st.sampled_from(missing)), [])
    return g


@settings(max_examples=400, deadline=None)
@given(graphs(), st.sampled_from((0.0, 0.189, 1.0)), st.booleans(), st.booleans(), st.booleans())
def test_random_graphs_run_as_the_reference(graph: ExecutionGraph, gamma: float, sync: bool, sharing: bool,
                                            record: bool) -> None:
    assert_same_run(graph, gamma=gamma, p2p_host_sync=sync, bandwidth_sharing=sharing, record_memory=record)


def test_a_graph_that_cannot_finish_says_why() -> None:
    """Two collectives that classes 0 and 1 issue in opposite orders deadlock in both engines alike."""
    g = ExecutionGraph()
    g.classes = [RankClass(f"c{c}", c, 1, range(c, c + 1)) for c in range(2)]
    a = g.add("a", "collective", Stream.GRAD, "dp", 1.0, (0,), [])
    b = g.add("b", "collective", Stream.GRAD, "dp", 1.0, (1,), [])
    g.join(b, 0, [])
    g.join(a, 1, [])
    with pytest.raises(SimulationError, match="never became ready"):
        run(g)
    assert_same_run(g)


JOBS = {
    "default job (GPT-3 175B, 1024 A100)": None,
    "default job, no bandwidth sharing": {"bandwidth_sharing": False},
    "llama3.1-405b": {"model": {"name": "llama3.1-405b", "seq_len": 8192},
                      "cluster": {"name": "dgx-h100", "nodes": 64},
                      "strategy": {"tp": 8, "pp": 16, "dp": 4, "global_batch": 64, "sequence_parallel": True,
                                   "recompute": "selective", "zero": 1}},
}


@pytest.mark.parametrize("name", list(JOBS))
def test_real_jobs_run_as_the_reference(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every graph the simulation of a real job hands the engine (the folded run's reduced one)."""
    seen: list[tuple[ExecutionGraph, dict[str, Any]]] = []

    def capture(graph: ExecutionGraph, **kw: Any) -> SimTrace:  # noqa: ANN401
        kw.pop("progress", None)
        seen.append((graph, kw))
        return run(graph, **kw)

    monkeypatch.setattr(api, "run", capture)
    job = JOBS[name]
    if job is None or "model" not in job:
        api.simulate(default_job(), **(job or {}))
    else:
        api.simulate(job)
    assert seen
    for graph, kw in seen:
        assert_same_run(graph, **kw)
