"""Issue 21 item 1: a layer's program is lowered and costed once per distinct layer and copied to the layers
that repeat it (compile.program's templates, cost.annotate's value-keyed compute costs). The cached path must
give the very program the uncached one does (every step's every field, every chunk's counts, the flow book),
each step its own object (later in-place edits must not reach another layer), and must do less work."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainsim.api import costed_program, default_job, job_tree, parse_job
from trainsim.compile import program as program_mod
from trainsim.compile.program import Program, Step, lower
from trainsim.cost.annotate import FlowBook, annotate
from trainsim.cost.calibration import load_calibration
from trainsim.cost.comm import NcclComm
from trainsim.cost.compute import RooflineCompute
from trainsim.cost.offload import offload_memory_system
from trainsim.errors import ConfigError
from trainsim.hardware.cluster import get_cluster
from trainsim.strategy.mesh import DeviceMesh
from trainsim.strategy.precision import Precision
from trainsim.strategy.tree import StrategyTree
from trainsim.workload.zoo import build_model

SMALL_MODELS: dict[str, dict[str, Any]] = {
    "gpt": {"name": "gpt3-13b", "layers": 4, "hidden": 256, "heads": 4, "ffn": 1024, "seq_len": 256, "vocab": 1000},
    "llama": {"name": "llama3-8b", "layers": 3, "hidden": 256, "heads": 4, "kv_heads": 2, "ffn": 512,
              "seq_len": 256, "vocab": 1000},
    "unfused": {"name": "gpt3-13b", "layers": 3, "hidden": 256, "heads": 4, "ffn": 1024, "seq_len": 256,
                "vocab": 1000, "attention": "unfused", "tied_embeddings": True},
    "moe": {"name": "mixtral-8x7b", "layers": 2, "hidden": 256, "heads": 4, "kv_heads": 2, "ffn": 512,
            "seq_len": 256, "vocab": 1000},
}


@st.composite
def small_jobs(draw: st.DrawFn) -> dict[str, Any]:
    """A small random job on one or two DGX-A100 nodes: any mix of tp / pp / cp / ep / dp, sequence
    parallelism, recompute, ZeRO stage, schedule, TP overlap, ring attention and CPU offload."""
    model = draw(st.sampled_from(sorted(SMALL_MODELS)))
    nodes = draw(st.sampled_from([1, 2]))
    tp, pp, cp = (draw(st.sampled_from([1, 2])) for _ in range(3))
    ep = draw(st.sampled_from([1, 2])) if model == "moe" else 1
    rest = nodes * 8 // (tp * pp * cp)
    dp = rest  # the data-parallel size includes ep (ep x dp x dr)
    schedule = draw(st.sampled_from(["1f1b", "gpipe", "zb-h1", "interleaved"] if pp > 1 else ["1f1b"]))
    vpp = 2 if schedule == "interleaved" else 1
    sp = tp > 1 and draw(st.booleans())
    strategy: dict[str, Any] = {
        "tp": tp, "pp": pp, "cp": cp, "ep": ep, "dp": dp, "vpp": vpp, "schedule": schedule,
        "global_batch": dp * pp * draw(st.sampled_from([1, 2])),
        "sequence_parallel": sp,
        "recompute": draw(st.sampled_from(["none", "selective", "full"])),
        "zero": draw(st.integers(0, 3)),
        "tp_comm_overlap": sp and draw(st.booleans()),
        "offload": draw(st.sampled_from(["none", "none", "cpu"])),
    }
    if cp > 1:
        strategy["cp_comm"] = draw(st.sampled_from(["p2p", "all_gather"]))
    layers = SMALL_MODELS[model]["layers"]
    m = dict(SMALL_MODELS[model], layers=layers * pp * vpp)
    return {"model": m, "cluster": {"name": "dgx-a100", "nodes": nodes}, "strategy": strategy,
            "simulation": {"exact": draw(st.booleans())}}


def costed(job: dict[str, Any] | None, cache: bool) -> tuple[Program, FlowBook | None]:
    """Lower and cost the job's tree (built afresh) with the template / cost caches on or off."""
    jc = default_job() if job is None else parse_job(job)
    cl, _, tree = job_tree(jc)
    sim = jc.simulation
    precision = Precision.named(cl.device.training_dtype if sim.dtype == "auto" else sim.dtype)
    return costed_tree(tree, precision, cl, cache, sharing=sim.bandwidth_sharing, exact=sim.exact)


def costed_tree(tree: StrategyTree, precision: Precision, cl: Any, cache: bool, sharing: bool = True,
                exact: bool = False) -> tuple[Program, FlowBook | None]:
    program = lower(tree, precision, cache=cache)
    cal = load_calibration(None)
    cparams = cal.compute_for(cl.device)
    flows = annotate(program, cl, RooflineCompute(cparams), NcclComm(cl, cal.comm or None),
                     collective_host_s=cparams.collective_host_s, sharing=sharing, exact=exact,
                     memory=offload_memory_system(tree.offload, cl, None), cache=cache)
    return program, flows


@st.composite
def mixed_trees(draw: st.DrawFn) -> StrategyTree:
    """A Megatron-like tree (tp 2, pp 2, dp 2) whose blocks differ from one base style in at most one thing:
    recompute, ZeRO items, sequence parallelism, the storage of saved inputs, an optimizer-state split. Blocks
    that differ only there must not share a template (the keys must see every config lowering reads)."""
    layers = 6
    model = build_model("gpt2", 2, 128, layers=layers, hidden=128, heads=4, vocab=512)
    S = StrategyTree.from_model(model, DeviceMesh(tp=2, pp=2, dp=2), 8, 1)
    S.root.split("b", "ep", "dp").split(("q", "a", "g", "o", "kv", "f", "f2"), "tp").split("v", "tp", pad=True)
    options: dict[str, list[Any]] = {
        "recompute": ["none", "selective", "full"],
        "shard": [(), ("optimizer",), ("optimizer", "grad"), ("optimizer", "grad", "weight")],
        "sp": [False, True],
        "store": [False, True],
        "opt_split": [False, True],
    }
    base = {k: draw(st.sampled_from(v)) for k, v in options.items()}
    for i, blk in enumerate(S.layers):
        style = dict(base)
        changed = draw(st.sampled_from([None, *options]))
        if changed is not None:
            style[changed] = draw(st.sampled_from(options[changed]))
        blk.map(i * 2 // layers)
        blk.recompute(style["recompute"])
        blk.shard(*style["shard"])
        if style["sp"]:  # sequence parallel block
            blk.select("ln1", "attn_residual", "ln2", "mlp_residual").split("s", "tp")
        if style["store"]:  # saved LN outputs kept split over tp
            blk.select("qkv", "fc1").store("input", "s", "tp")
        if style["opt_split"]:
            blk.fc1.optimizer.split("f", "tp", "dp")
    S.head.map(1)
    return S


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mixed_trees())
def test_mixed_layers_templated_equals_uncached(tree: StrategyTree) -> None:
    """Layers that differ only in their leaf configs or recompute must not share a template."""
    cl = get_cluster("dgx-a100", 1)
    cached, flows = costed_tree(tree, Precision.named("bf16"), cl, cache=True)
    plain, plain_flows = costed_tree(tree, Precision.named("bf16"), cl, cache=False)
    assert_same_program(cached, plain)
    assert flows == plain_flows
    assert_own_objects(cached)


def step_record(s: Step) -> dict[str, Any]:
    """Every field of a step; its op by value (the two programs come from two trees)."""
    rec = {f.name: getattr(s, f.name) for f in dataclasses.fields(s)}
    rec["op"] = s.op.key() if s.op is not None else None
    return rec


def assert_same_program(a: Program, b: Program) -> None:
    assert a.model_flops_per_iteration == b.model_flops_per_iteration
    assert a.hw_flops_per_iteration == b.hw_flops_per_iteration
    assert a.embedding_sync_s == b.embedding_sync_s
    assert len(a.chunks) == len(b.chunks)
    for ca, cb in zip(a.chunks, b.chunks, strict=True):
        for f in dataclasses.fields(ca):
            va, vb = getattr(ca, f.name), getattr(cb, f.name)
            if f.name in ("fwd", "bwd", "grad_sync", "post_step"):
                assert [step_record(s) for s in va] == [step_record(s) for s in vb], (ca.chunk, f.name)
            else:
                assert va == vb, (ca.chunk, f.name)


def assert_own_objects(program: Program) -> None:
    """No two steps are one object or share a dict, and each step's op is its own layer's."""
    steps = [s for ch in program.chunks for s in (*ch.fwd, *ch.bwd, *ch.grad_sync, *ch.post_step)]
    assert len({id(s) for s in steps}) == len(steps)
    locals_ = [s.local for s in steps if s.local is not None]
    assert len({id(d) for d in locals_}) == len(locals_)
    ops = {layer.name: {id(op) for op in layer.ops} for layer in program.tree.model.layers}
    for s in steps:
        if s.op is not None:
            assert id(s.op) in ops[s.layer], s.label


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_jobs())
def test_templated_program_equals_uncached(job: dict[str, Any]) -> None:
    try:
        cached, flows = costed(job, cache=True)
    except ConfigError:
        return  # a combination the strategy refuses (checked by its own tests)
    plain, plain_flows = costed(job, cache=False)
    assert_same_program(cached, plain)
    assert flows == plain_flows
    assert_own_objects(cached)


def test_default_job_same_program_and_own_steps() -> None:
    """GPT-3 175B on 1024 GPUs (96 identical layers, 16 stages): the same program with and without caches."""
    cached, flows = costed(None, cache=True)
    plain, plain_flows = costed(None, cache=False)
    assert_same_program(cached, plain)
    assert flows == plain_flows
    assert_own_objects(cached)


def test_editing_one_layer_leaves_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    """A later in-place edit of a step (fusion, stretch, overlap) stays with that step: the costed program of a
    repeated layer is not shared by object."""
    program, _ = costed(None, cache=True)
    ch = program.chunks[1]
    first, second = ch.layers[0], ch.layers[1]
    a = [s for s in ch.fwd if s.layer == first]
    b = [s for s in ch.fwd if s.layer == second]
    before = [s.duration_s for s in b]
    for s in a:
        s.duration_s *= 3.0
        if s.local is not None:
            s.local["b"] = -1.0
    assert [s.duration_s for s in b] == before
    assert all(s.local is None or s.local.get("b") != -1.0 for s in b)


def test_repeated_layers_lowered_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the caches on, the 96 identical transformer layers of the default job are lowered a handful of
    times (per distinct incoming layout: a stage's first layer receives a scattered activation), not 96."""
    calls = {"fwd": 0, "bwd": 0}
    fwd, bwd = program_mod._Lowerer._forward_layer, program_mod._Lowerer._backward_layer

    def counting_fwd(self: Any, *args: Any) -> Any:
        calls["fwd"] += 1
        return fwd(self, *args)

    def counting_bwd(self: Any, *args: Any) -> Any:
        calls["bwd"] += 1
        return bwd(self, *args)

    monkeypatch.setattr(program_mod._Lowerer, "_forward_layer", counting_fwd)
    monkeypatch.setattr(program_mod._Lowerer, "_backward_layer", counting_bwd)
    costed(None, cache=True)
    cached = dict(calls)
    calls.update(fwd=0, bwd=0)
    costed(None, cache=False)
    assert calls["bwd"] == 98  # embedding, 96 blocks, head
    assert cached["bwd"] <= 10 and cached["fwd"] <= 12


def test_costed_program_through_api_matches_uncached() -> None:
    """The API's costed program (caches on) and the uncached lowering agree on a Llama-style job with selective
    recompute, sequence parallelism and ZeRO-1 over 4 stages."""
    job = {"model": dict(SMALL_MODELS["llama"], layers=8), "cluster": {"name": "dgx-a100", "nodes": 2},
           "strategy": {"tp": 2, "pp": 4, "dp": 2, "global_batch": 8, "sequence_parallel": True,
                        "recompute": "selective", "zero": 1}}
    jc = parse_job(job)
    cl, _, tree = job_tree(jc)
    api_program = costed_program(tree, cl, jc.simulation).program
    plain, _ = costed(job, cache=False)
    assert_same_program(api_program, plain)


GRAPH_COLUMNS = ("name", "kind", "stream", "category", "duration_s", "parts", "participants", "deps", "mem_peak_bytes",
                 "mem_net_bytes", "host_s", "host_path_s", "micro_batch", "flow_latency_s", "flow_demand",
                 "resources", "comm_op", "comm_bytes", "comm_ranks", "queues")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_jobs(), st.sampled_from(["auto", "layer", "op"]))
def test_identical_chunks_coarsened_once_build_the_same_graph(job: dict[str, Any], granularity: str) -> None:
    """build_graph coarsens a chunk whose steps equal an earlier chunk's but for their names once and renames
    the copy (compile.graph._signature / _renamed): the graph is the one coarsening every chunk gives."""
    from trainsim.compile import graph as graph_mod

    job = {**job, "simulation": {**job.get("simulation", {}), "granularity": granularity}}
    try:
        jc = parse_job(job)
        cl, _, tree = job_tree(jc)
        c = costed_program(tree, cl, jc.simulation)
    except ConfigError:
        return
    kw = {"granularity": granularity, "flows": c.flows, "exact": jc.simulation.exact}
    shared = graph_mod.build_graph(c.program, **kw)
    unique = iter(range(10**9))
    original = graph_mod._signature
    try:
        graph_mod._signature = lambda steps, demand_of: (next(unique),)  # every chunk its own: no sharing
        alone = graph_mod.build_graph(c.program, **kw)
    finally:
        graph_mod._signature = original
    for column in GRAPH_COLUMNS:
        assert getattr(shared, column) == getattr(alone, column), column
