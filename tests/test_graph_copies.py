"""Issue 21: build_graph appends the common schedule item as a bulk copy of its chunk-phase's template block
(ExecutionGraph.add_copies) and coarsens a chunk (zero bubble: splits its backward) once for all chunks equal
but for their names. Both must build the very graph that adding every task one by one and coarsening every
chunk on its own builds: every column, in the same task order, on random jobs and on deep pipelines."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st
from test_templates import GRAPH_COLUMNS, small_jobs

from trainsim.api import _stage_terms, costed_program, default_job, job_tree, parse_job
from trainsim.compile import graph as graph_mod
from trainsim.compile.graph import ExecutionGraph
from trainsim.compile.program import Stream, stretch_compute
from trainsim.errors import ConfigError


def _inputs(job: dict[str, Any] | None) -> tuple[Any, dict[str, Any]]:
    """A job's costed program and build_graph's arguments as api._simulate_program passes them."""
    jc = default_job() if job is None else parse_job(job)
    cl, _, tree = job_tree(jc)
    sim = jc.simulation
    costed = costed_program(tree, cl, sim, jc.cluster.remote_memory)
    statics, opt_s = _stage_terms(costed, cl)
    static = {r: memory.total_bytes for r, memory in statics.items()}
    return costed.program, {"exact": sim.exact, "granularity": sim.granularity, "optimizer_s": opt_s,
                            "flows": costed.flows, "static_bytes": static}


def _build(program: Any, kw: dict[str, Any], monkeypatch: pytest.MonkeyPatch, copies: bool, shared: bool,
           record: bool = True) -> tuple[ExecutionGraph, list[int]]:
    """The graph (and its progress reports) with bulk copies and chunk sharing on or off; `record` off: chunks
    are shared by their signatures only, not by the lowering's record of copies (ChunkCopies)."""
    reports: list[int] = []
    with monkeypatch.context() as mp:
        mp.setattr(graph_mod, "_COPY_ITEMS", copies)
        if not shared or not record:
            mp.setattr(program, "copies", None)
        if not shared:
            unique = iter(range(10**9))
            mp.setattr(graph_mod, "_signature", lambda steps, demand_of: (next(unique),))
        graph = graph_mod.build_graph(program, **kw, progress=reports.append)
    return graph, reports


def _assert_same(a: ExecutionGraph, b: ExecutionGraph) -> None:
    for column in (*GRAPH_COLUMNS, "stream_names"):
        assert getattr(a, column) == getattr(b, column), column
    assert [vars(c) for c in a.classes] == [vars(c) for c in b.classes]
    assert [type(x) for x in a.flow_demand] == [type(x) for x in b.flow_demand]  # resolved, never a _Flow
    assert list(a.queues) == list(b.queues)  # streams in the same order too


def _counted(f: Callable[..., Any], name: str, counts: dict[str, int]) -> Callable[..., Any]:
    """f, counting its calls in counts[name]."""
    def counted(*args: Any) -> Any:  # noqa: ANN401
        counts[name] += 1
        return f(*args)
    return counted


def _check(job: dict[str, Any] | None, monkeypatch: pytest.MonkeyPatch, micro_batches: int | None = None
           ) -> dict[tuple[bool, bool], dict[str, int]]:
    """Every combination of copies and sharing builds the reference graph (neither); returns how often each
    coarsened a chunk and split a backward (for the tests that check that sharing happened at all)."""
    program, kw = _inputs(job)
    kw["micro_batches"] = micro_batches
    reference, reference_reports = _build(program, kw, monkeypatch, copies=False, shared=False)
    calls: dict[tuple[bool, bool], dict[str, int]] = {}
    for copies, shared in ((True, False), (False, True), (True, True)):
        counts = calls[(copies, shared)] = {"_coarsen": 0, "_split_backward": 0}
        with monkeypatch.context() as mp:
            for name in counts:
                mp.setattr(graph_mod, name, _counted(getattr(graph_mod, name), name, counts))
            graph, reports = _build(program, kw, mp, copies, shared)
        _assert_same(graph, reference)
        assert reports == reference_reports
    graph, _ = _build(program, kw, monkeypatch, copies=True, shared=True, record=False)  # signatures only
    _assert_same(graph, reference)
    return calls


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(small_jobs(), st.sampled_from(["auto", "layer", "op"]), st.sampled_from([None, 4]))  # 4: pp divides it
def test_copies_and_shared_chunks_build_the_one_by_one_graph(monkeypatch: pytest.MonkeyPatch,
                                                              job: dict[str, Any], granularity: str,
                                                              micro_batches: int | None) -> None:
    job = {**job, "simulation": {**job.get("simulation", {}), "granularity": granularity}}
    try:
        _check(job, monkeypatch, micro_batches)
    except ConfigError:
        reject()  # a combination the job validation refuses


DEEP = {"name": "gpt3-13b", "layers": 8, "hidden": 256, "heads": 4, "ffn": 1024, "seq_len": 256,
        "vocab": 1000}


@pytest.mark.parametrize("strategy, simulation", [
    ({"schedule": "zb-h1"}, {}),  # middle chunks split their backward like the first middle one
    ({"schedule": "zb-h1", "offload": "cpu", "recompute": "full"}, {"granularity": "layer"}),
    ({"schedule": "interleaved", "vpp": 2}, {}),
    ({"schedule": "1f1b", "overlap_param_gather": True, "zero": 1}, {"bandwidth_sharing": False}),
    ({"schedule": "zb-h1", "tp": 2}, {"exact": True, "granularity": "op"}),
    ({"schedule": "dynamic", "tp": 2, "sequence_parallel": True}, {"granularity": "layer"}),
    ({"schedule": "gpipe", "zero": 3}, {}),
])
def test_deep_pipelines_share_chunks_and_copies_exactly(strategy: dict[str, Any], simulation: dict[str, Any],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Four stages, so that chunks 1 and 2 are equal but for their names (small_jobs has two at most)."""
    s = {"tp": 1, "pp": 4, "dp": 2, "global_batch": 2 * 12, "sequence_parallel": strategy.get("tp", 1) > 1,
         "recompute": "selective", "zero": 1, **strategy}
    s["dp"] = 16 // (s["tp"] * s["pp"])
    s["global_batch"] = s["dp"] * 12
    model = dict(DEEP, layers=DEEP["layers"] * s.get("vpp", 1))
    calls = _check({"model": model, "cluster": {"name": "dgx-a100", "nodes": 2}, "strategy": s,
                    "simulation": simulation}, monkeypatch)
    shared, alone = calls[(True, True)], calls[(True, False)]
    assert shared["_coarsen"] < alone["_coarsen"]  # some chunk was renamed, not coarsened
    if s["schedule"] == "zb-h1":
        assert shared["_split_backward"] < alone["_split_backward"]  # a backward split like an earlier one


def test_default_job_reduced_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """The benchmark's graph: GPT-3 175B over 16 stages, 52 micro-batches, bandwidth sharing on."""
    _check(None, monkeypatch, micro_batches=52)


@pytest.mark.parametrize("schedule", ["1f1b", "zb-h1"])
def test_a_chunk_is_named_for_its_own_steps_whatever_was_coarsened_first(schedule: str) -> None:
    """Chunks 1 and 2 of four stages are equal but for their names: asked in any order, with or without
    anchors, each gets the specs it gets when asked alone (its own labels and gradient buckets)."""
    s = {"tp": 2, "pp": 4, "dp": 2, "global_batch": 24, "sequence_parallel": True, "schedule": schedule}
    program, kw = _inputs({"model": DEEP, "cluster": {"name": "dgx-a100", "nodes": 2}, "strategy": s})
    merge = frozenset({Stream.COMPUTE, Stream.FEATURE})
    flows = kw["flows"]

    def fresh() -> graph_mod._ChunkSpecs:
        return graph_mod._ChunkSpecs("auto", merge, schedule == "zb-h1",
                                     lambda ch: lambda step: flows.step_demand(step, ch.pp_rank * 4))

    phases = ["F", "B", "W"] if schedule == "zb-h1" else ["F", "B"]
    chunks = program.chunks
    for phase in phases:
        for first, then in ((1, 2), (2, 1)):
            for anchors_first, anchors_then in ((False, True), (True, False), (True, True)):
                specs = fresh()
                specs.specs(chunks[first], phase, anchors_first)
                got = specs.specs(chunks[then], phase, anchors_then)
                want = fresh().specs(chunks[then], phase, anchors_then)
                assert [vars(x) for x in got] == [vars(x) for x in want]


def test_default_job_shares_recorded_copies_without_signatures(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default job's chunks that lowering copied (and annotate priced as copies) take their original's
    signature from the record: a signature is built for the originals only, and the graph is the reference."""
    program, kw = _inputs(None)
    record = program.copies
    assert record is not None and record.priced and record.priced == record.lowered
    counts = {"_signature": 0}
    with monkeypatch.context() as mp:
        mp.setattr(graph_mod, "_signature", _counted(graph_mod._signature, "_signature", counts))
        graph, _ = _build(program, kw, mp, copies=True, shared=True)
    originals = 2 * len(program.chunks) - len(record.priced)
    assert counts["_signature"] <= originals
    reference, _ = _build(program, kw, monkeypatch, copies=False, shared=False)
    _assert_same(graph, reference)


def test_an_edited_chunk_drops_the_record(monkeypatch: pytest.MonkeyPatch) -> None:
    """stretch_compute edits one chunk's steps in place: its revision moves, the record no longer holds, and the
    graph builder compares signatures again (the stretched chunk is no longer coarsened like its original)."""
    program, kw = _inputs(None)
    record = program.copies
    assert record is not None
    chunk, original = next((c, src) for (c, phase), src in record.priced.items() if phase == "fwd")
    stretch_compute(program.chunks[chunk], 1.5)
    assert not record.valid(program.chunks)
    graph, _ = _build(program, kw, monkeypatch, copies=True, shared=True)
    reference, _ = _build(program, kw, monkeypatch, copies=False, shared=False)
    _assert_same(graph, reference)
    stretched = [d for n, d in zip(graph.name, graph.duration_s, strict=True) if n.startswith(f"F0 c{chunk} ")]
    like = [d for n, d in zip(graph.name, graph.duration_s, strict=True) if n.startswith(f"F0 c{original} ")]
    assert sum(stretched) > sum(like)
