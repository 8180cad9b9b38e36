"""Issue 21: lowering copies a whole chunk (its forward, its backward) to the chunks that repeat it, and costing
prices a compute step by comparing it with the last one of its op value. The cached program must be the very
program the uncached lowering and costing give (every step's every field, every chunk's counts, the flow
book), with each step its own object, on pipelines deep enough that chunks repeat: several stages and virtual
stages, offload (CPU, or a remote pool with in-switch collectives), ZeRO-3, tied embeddings, recompute.
The equality checks are test_templates'."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_templates import SMALL_MODELS, assert_own_objects, assert_same_program, costed, costed_tree

from trainsim.compile import program as program_mod
from trainsim.errors import ConfigError
from trainsim.hardware.cluster import get_cluster
from trainsim.strategy.mesh import DeviceMesh
from trainsim.strategy.precision import Precision
from trainsim.strategy.tree import StrategyTree
from trainsim.workload.ir import Op, OpValues
from trainsim.workload.zoo import build_model


@st.composite
def deep_jobs(draw: st.DrawFn) -> dict[str, Any]:
    """A small job with 2 or 4 pipeline stages (and maybe 2 virtual stages) of 1 to 3 layers each on one to
    four DGX-A100 nodes, with any of tp, cp, sequence parallelism, recompute, ZeRO, offload and a schedule."""
    model = draw(st.sampled_from(sorted(SMALL_MODELS)))
    nodes = draw(st.sampled_from([1, 2, 4]))
    pp = draw(st.sampled_from([2, 4]))
    tp, cp = draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2]))
    ep = draw(st.sampled_from([1, 2])) if model == "moe" else 1
    dp = nodes * 8 // (tp * pp * cp)
    schedule = draw(st.sampled_from(["1f1b", "gpipe", "zb-h1", "interleaved"]))
    vpp = 2 if schedule == "interleaved" else 1
    sp = tp > 1 and draw(st.booleans())
    offload = draw(st.sampled_from(["none", "none", "cpu", "remote"]))
    zero = 3 if offload == "remote" else draw(st.integers(0, 3))
    strategy: dict[str, Any] = {
        "tp": tp, "pp": pp, "cp": cp, "ep": ep, "dp": dp, "vpp": vpp, "schedule": schedule,
        "global_batch": dp * pp * draw(st.sampled_from([1, 2])),
        "sequence_parallel": sp,
        "recompute": draw(st.sampled_from(["none", "selective", "full"])),
        "zero": zero,
        "tp_comm_overlap": sp and draw(st.booleans()),
        "offload": offload,
        "offload_in_switch": offload == "remote" and draw(st.booleans()),
    }
    if cp > 1:
        strategy["cp_comm"] = draw(st.sampled_from(["p2p", "all_gather"]))
    per_chunk = draw(st.integers(1, 3))
    m = dict(SMALL_MODELS[model], layers=per_chunk * pp * vpp)
    return {"model": m, "cluster": {"name": "dgx-a100", "nodes": nodes}, "strategy": strategy,
            "simulation": {"exact": draw(st.booleans())}}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(deep_jobs())
def test_copied_chunks_equal_uncached(job: dict[str, Any]) -> None:
    try:
        cached, flows = costed(job, cache=True)
    except ConfigError:
        return  # a combination the strategy refuses (checked by its own tests)
    plain, plain_flows = costed(job, cache=False)
    assert_same_program(cached, plain)
    assert flows == plain_flows
    assert_own_objects(cached)


@st.composite
def chunk_styled_trees(draw: st.DrawFn) -> StrategyTree:
    """8 blocks on 4 pipeline stages (2 each), every stage's blocks in one style drawn from a few: stages
    that differ only in recompute, ZeRO items, sequence parallelism or saved-input storage must not share a
    chunk template, stages in one style must (and give the same program)."""
    model = build_model("gpt2", 1, 128, layers=8, hidden=128, heads=4, vocab=512)
    S = StrategyTree.from_model(model, DeviceMesh(tp=2, pp=4), 8, 1)
    S.root.split("b", "ep", "dp").split(("q", "a", "g", "o", "kv", "f", "f2"), "tp").split("v", "tp", pad=True)
    styles = st.fixed_dictionaries({
        "recompute": st.sampled_from(["none", "selective", "full"]),
        "shard": st.sampled_from([(), ("optimizer",), ("optimizer", "grad", "weight")]),
        "sp": st.booleans(),
        "store": st.booleans(),
    })
    palette = draw(st.lists(styles, min_size=1, max_size=3))
    stage_style = [draw(st.sampled_from(palette)) for _ in range(4)]
    for i, blk in enumerate(S.layers):
        style = stage_style[i // 2]
        blk.map(i // 2)
        blk.recompute(style["recompute"])
        blk.shard(*style["shard"])
        if style["sp"]:
            blk.select("ln1", "attn_residual", "ln2", "mlp_residual").split("s", "tp")
        if style["store"]:
            blk.select("qkv", "fc1").store("input", "s", "tp")
    S.head.map(3)
    return S


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chunk_styled_trees())
def test_chunks_in_other_styles_not_shared(tree: StrategyTree) -> None:
    cl = get_cluster("dgx-a100", 1)
    cached, flows = costed_tree(tree, Precision.named("bf16"), cl, cache=True)
    plain, plain_flows = costed_tree(tree, Precision.named("bf16"), cl, cache=False)
    assert_same_program(cached, plain)
    assert flows == plain_flows
    assert_own_objects(cached)


def test_default_job_lowers_each_distinct_chunk_once(monkeypatch: Any) -> None:
    """GPT-3 175B on 16 stages: stages 1 to 14 are identical but for their layers, so only the first, the
    second (the template of the next 13) and the last chunk are lowered; the others are copies."""
    calls = {"fwd": 0, "bwd": 0}
    fwd, bwd = program_mod._Lowerer.forward_chunk, program_mod._Lowerer.backward_chunk

    def counting_fwd(self: Any, *args: Any) -> Any:
        calls["fwd"] += 1
        return fwd(self, *args)

    def counting_bwd(self: Any, *args: Any) -> Any:
        calls["bwd"] += 1
        return bwd(self, *args)

    monkeypatch.setattr(program_mod._Lowerer, "forward_chunk", counting_fwd)
    monkeypatch.setattr(program_mod._Lowerer, "backward_chunk", counting_bwd)
    program, _ = costed(None, cache=True)
    assert len(program.chunks) == 16
    assert calls == {"fwd": 3, "bwd": 3}
    calls.update(fwd=0, bwd=0)
    costed(None, cache=False)
    assert calls == {"fwd": 16, "bwd": 16}


def test_op_key_is_kept_and_follows_replace() -> None:
    """Op.key is computed once per op and kept on it (not a field: equality and replace ignore it); a replaced
    op has its own key; ops compared equal (with their dims in the same order) have equal keys."""
    model = build_model("gpt2", 2, 128, layers=2, hidden=128, heads=4, vocab=512)
    a = model.layers[1].ops[1]
    b = dataclasses.replace(a)
    assert a is not b and a.key() == b.key() and a == b
    assert a.key() is a.key()
    bigger = dataclasses.replace(a, dims={**a.dims, "b": a.dims["b"] * 2})
    assert bigger.key() != a.key() and bigger != a
    reordered = dataclasses.replace(a, dims=dict(reversed(a.dims.items())))
    assert reordered == a and reordered.key() != a.key()
    assert not program_mod._same_ops([reordered], [a]) and program_mod._same_ops([b], [a])
    assert [f.name for f in dataclasses.fields(Op)] == [f for f in vars(a) if f not in ("_key", "_params")]
    weight = next(op for op in model.layers[1].ops if op.weight is not None)
    assert weight.params == math.prod(weight.dims[d] for d in weight.weight) + weight.extra_params > 0
    assert dataclasses.replace(weight, dims={**weight.dims, weight.weight[0]: 2 * weight.dims[weight.weight[0]]}
                               ).params == 2 * weight.params - weight.extra_params  # its own, not the kept one


def test_op_values_alias_and_keep_ops() -> None:
    model = build_model("gpt2", 2, 128, layers=2, hidden=128, heads=4, vocab=512)
    first, second = model.layers[1].ops, model.layers[2].ops
    values = OpValues()
    ids = [values(op) for op in first]
    for op, like in zip(second, first, strict=True):
        values.alias(op, like)
    assert [values(op) for op in second] == ids
    assert len(set(ids)) == len(ids)
    assert all(values.ids[id(op)] == i for op, i in zip(second, ids, strict=True))
