"""Resharding inference: Megatron's tensor- and sequence-parallel collectives fall out of the layouts."""

from __future__ import annotations

import pytest

from trainsim.compile.layout import Layout, input_grad_layout, output_layout, reshard
from trainsim.compile.program import Step, Stream, lower
from trainsim.strategy.mesh import DeviceMesh
from trainsim.strategy.precision import Precision
from trainsim.strategy.presets import ParallelSpec, build_strategy, op_split
from trainsim.workload.zoo import build_model

B, S, H, A, V, T = 2, 128, 256, 4, 1024, 4
BSH2 = B * S * H * 2  # one bf16 activation of the residual stream, per rank when unsplit


def program(sp: bool, dp: int = 1):
    mdl = build_model("custom", B * dp, S, "flash", layers=1, hidden=H, heads=A, vocab=V)
    spec = ParallelSpec(dp=dp, tp=T, sequence_parallel=sp, micro_batch=B, global_batch=B * dp)
    return mdl, lower(build_strategy(mdl, spec), Precision())


def collectives(steps: list[Step], layer: str = "layers.0") -> list[tuple[str, str, tuple[str, ...], float]]:
    return [(s.label.removeprefix(layer + "."), s.collective, s.axes, s.size_bytes) for s in steps
            if s.kind == "collective" and s.layer == layer]


@pytest.mark.parametrize("dp", [1, 2])
def test_tensor_parallel_layer_all_reduces_after_each_row_parallel_gemm(dp: int) -> None:
    _, prog = program(sp=False, dp=dp)
    ch = prog.chunks[0]
    assert collectives(ch.fwd) == [
        ("attn_residual.in0:all_reduce", "all_reduce", ("tp",), BSH2),  # after the attention projection
        ("mlp_residual.in0:all_reduce", "all_reduce", ("tp",), BSH2),  # after fc2
    ]
    # backward: the input gradient of each column-parallel GEMM (qkv, fc1) is a partial sum over tp
    assert collectives(ch.bwd) == [
        ("ln2.dout:all_reduce", "all_reduce", ("tp",), BSH2),
        ("ln1.dout:all_reduce", "all_reduce", ("tp",), BSH2),
    ]
    assert all(s.stream == Stream.FEATURE and s.category == "tp" for s in ch.fwd + ch.bwd if s.kind == "collective")


def test_sequence_parallel_swaps_all_reduce_for_all_gather_and_reduce_scatter() -> None:
    _, prog = program(sp=True)
    ch = prog.chunks[0]
    assert collectives(ch.fwd) == [
        ("qkv.in0:all_gather", "all_gather", ("tp",), BSH2),  # gathered size (nccl-tests convention)
        ("attn_residual.in0:reduce_scatter", "reduce_scatter", ("tp",), BSH2),  # input size
        ("fc1.in0:all_gather", "all_gather", ("tp",), BSH2),
        ("mlp_residual.in0:reduce_scatter", "reduce_scatter", ("tp",), BSH2),
    ]
    # backward also re-gathers the sequence-sharded saved input of qkv/fc1 for their weight gradient,
    # concurrently with the input-gradient GEMM (Korthikanti et al. 2022, section 4.2.2)
    assert collectives(ch.bwd) == [
        ("fc2.dout:all_gather", "all_gather", ("tp",), BSH2),
        ("fc1.input:all_gather", "all_gather", ("tp",), BSH2),
        ("ln2.dout:reduce_scatter", "reduce_scatter", ("tp",), BSH2),
        ("proj.dout:all_gather", "all_gather", ("tp",), BSH2),
        ("qkv.input:all_gather", "all_gather", ("tp",), BSH2),
        ("ln1.dout:reduce_scatter", "reduce_scatter", ("tp",), BSH2),
    ]
    for name in ("fc1", "qkv"):
        i = next(i for i, s in enumerate(ch.bwd) if s.label.endswith(f"{name}.input:all_gather"))
        dgrad, gather, wgrad = ch.bwd[i - 1], ch.bwd[i], ch.bwd[i + 1]
        assert (dgrad.phase, wgrad.phase) == ("dgrad", "wgrad")
        assert gather.deps == dgrad.deps  # starts with the input-gradient GEMM, not after it
        assert wgrad.deps == (i - 1, i)  # the weight gradient waits for both
    # same bytes on the wire as plain TP: an all-reduce is a reduce-scatter plus an all-gather
    _, plain = program(sp=False)
    fwd_tp = [s for s in plain.chunks[0].fwd if s.kind == "collective" and s.layer == "layers.0"]
    fwd_sp = [s for s in ch.fwd if s.kind == "collective" and s.layer == "layers.0"]
    assert 2 * sum(s.size_bytes for s in fwd_tp) == sum(s.size_bytes for s in fwd_sp)


def test_vocab_parallel_embedding_and_head() -> None:
    _, prog = program(sp=False)
    ch = prog.chunks[0]
    emb = collectives(ch.fwd, "embedding")
    assert emb == [("embed_dropout.in0:all_reduce", "all_reduce", ("tp",), BSH2)]  # partial lookup summed
    assert collectives(ch.bwd, "embedding") == []  # token ids take no gradient
    head_bwd = collectives(ch.bwd, "head")
    assert head_bwd == [("final_norm.dout:all_reduce", "all_reduce", ("tp",), BSH2)]  # lm_head is column-parallel
    _, sp = program(sp=True)
    assert collectives(sp.chunks[0].fwd, "embedding") == [
        ("embed_dropout.in0:reduce_scatter", "reduce_scatter", ("tp",), BSH2)]


def test_layouts_of_megatron_column_and_row_parallel_gemms() -> None:
    mdl, _ = program(sp=False)
    spec = ParallelSpec(tp=T, micro_batch=B, global_batch=B)
    ops = {op.name: op for op in mdl.layers[1].ops}
    qkv, proj = ops["qkv"], ops["proj"]
    qsplit, psplit = op_split(qkv, spec, "b"), op_split(proj, spec, "b")
    assert qsplit["q"] == ("tp",) and psplit["o"] == ("tp",) and "h" not in psplit
    out_q = output_layout(qkv, qsplit)
    assert out_q.split.get("q") == ("tp",) and out_q.partial == frozenset()  # column: split output, no sum
    out_p = output_layout(proj, psplit)
    assert "tp" in out_p.partial and "h" not in out_p.split  # row: full-size partial sums
    g = input_grad_layout(qkv, qsplit)
    assert g.dims == ("b", "s", "h") and "tp" in g.partial  # column-parallel dgrad is partial over tp
    assert input_grad_layout(proj, psplit).partial.isdisjoint({"tp"})  # row-parallel dgrad stays split


MESH = DeviceMesh(tp=4, dp=2)


@pytest.mark.parametrize(("src", "dst_split", "expected"), [
    (Layout(("b", "h"), {}, frozenset({"tp"})), {}, [("all_reduce", ("tp",), 1000.0)]),
    (Layout(("b", "h"), {}, frozenset({"tp"})), {"h": ("tp",)}, [("reduce_scatter", ("tp",), 1000.0)]),
    (Layout(("b", "h"), {"h": ("tp",)}), {}, [("all_gather", ("tp",), 4000.0)]),
    (Layout(("b", "h"), {"h": ("tp",)}), {"b": ("tp",)}, [("all_to_all", ("tp",), 1000.0)]),
    (Layout(("b", "h"), {"h": ("tp",)}), {"h": ("tp",)}, []),
    (Layout(("b", "h"), {}), {"h": ("tp",)}, []),  # replicated -> split is a local slice
    (Layout(("b", "h"), {"b": ("dp",)}, frozenset({"tp"})), {"b": ("dp",)}, [("all_reduce", ("tp",), 1000.0)]),
    (Layout(("b", "h"), {"h": ("tp", "dp")}), {}, [("all_gather", ("tp", "dp"), 8000.0)]),
])
def test_reshard_patterns(src: Layout, dst_split: dict, expected: list) -> None:
    got = [(r.collective, r.axes, r.size_bytes) for r in reshard(src, src.dims, dst_split, MESH, 1000.0)]
    assert got == expected


def test_reshard_ignores_trivial_axes() -> None:
    mesh = DeviceMesh(tp=1, dp=2)
    assert reshard(Layout(("b", "h"), {}, frozenset({"tp"})), ("b", "h"), {}, mesh, 10.0) == []
