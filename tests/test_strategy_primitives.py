"""Strategy-tree primitives (Proteus sections IV and VII): split / map / shard / store / schedule /
recompute, attribute access that mirrors the model, dataflow propagation, YAML round trip, and
one-line errors naming the node. The Megatron preset and the same strategy written with the
primitives must compile to the identical execution graph (one lowering path)."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pipeline_helpers import compile_tree

from trainsim.compile.graph import ExecutionGraph
from trainsim.compile.program import lower
from trainsim.errors import ConfigError
from trainsim.strategy.mesh import DeviceMesh
from trainsim.strategy.precision import Precision
from trainsim.strategy.presets import ParallelSpec, build_strategy
from trainsim.strategy.tree import StrategyTree
from trainsim.workload.zoo import build_model

# --------------------------------------------------------------------------------------------------
# The Megatron strategy in primitives (TP + SP + ZeRO-1, with CP and PP placement)
# --------------------------------------------------------------------------------------------------


def megatron(model, mesh: DeviceMesh, global_batch: int, micro_batch: int) -> StrategyTree:
    S = StrategyTree.from_model(model, mesh, global_batch, micro_batch)
    S.root.split("b", "ep", "dp").split("s", "cp")                       # data and context parallel
    S.root.split(("q", "a", "g", "o", "kv", "f", "f2"), "tp")           # column/row-parallel GEMMs, heads
    S.root.split("v", "tp", pad=True)                                    # vocab-parallel embedding, head, loss
    S.root.select("ln1", "attn_residual", "ln2", "mlp_residual", "final_norm", "embed_dropout").split(
        "s", "cp", "tp")                                                 # sequence parallelism ...
    S.root.select("qkv", "fc1", "lm_head").store("input", "s", "cp", "tp")  # ... saved LN outputs stay split
    S.root.shard("optimizer")                                            # ZeRO-1
    blocks = list(S.layers)
    for i, blk in enumerate(blocks):
        blk.map(i * mesh.pp // len(blocks))                              # even pipeline stages
    S.head.map(mesh.pp - 1)
    return S


# --------------------------------------------------------------------------------------------------
# Compile and compare
# --------------------------------------------------------------------------------------------------


def _graph(tree: StrategyTree, cluster_name: str = "dgx-a100", nodes: int = 2) -> ExecutionGraph:
    return compile_tree(tree, cluster_name, nodes)[0]


FIELDS = ("name", "kind", "stream", "category", "duration_s", "participants", "deps", "mem_peak_bytes",
          "mem_net_bytes", "host_s", "comm_op", "comm_bytes", "flow_demand")


def _same(a: ExecutionGraph, b: ExecutionGraph) -> None:
    assert len(a) == len(b)
    for f in FIELDS:
        assert getattr(a, f) == getattr(b, f), f


CASES = [
    ("gpt2", DeviceMesh(tp=2, dp=4, pp=2), 32, 2),
    ("gpt2", DeviceMesh(tp=4, cp=2, dp=2), 8, 1),
    ("llama2-7b", DeviceMesh(tp=8, dp=2), 16, 1),
]


@pytest.mark.parametrize(("name", "mesh", "gb", "mb"), CASES)
def test_megatron_in_primitives_compiles_to_the_presets_graph(name: str, mesh: DeviceMesh, gb: int, mb: int) -> None:
    model = build_model(name, mb * mesh.dp * mesh.ep, 1024)
    spec = ParallelSpec(dp=mesh.dp * mesh.ep, tp=mesh.tp, pp=mesh.pp, cp=mesh.cp, ep=mesh.ep, sequence_parallel=True,
                        zero=1, micro_batch=mb, global_batch=gb)
    preset = build_strategy(model, spec)
    mine = megatron(model, mesh, gb, mb)
    _same(_graph(preset), _graph(mine))


def test_megatron_strategy_is_at_most_15_lines() -> None:
    body = inspect.getsource(megatron).splitlines()[1:]  # without the def line
    code = [ln for ln in body if ln.strip() and not ln.strip().startswith("#")]
    assert len(code) <= 15


def _small(layers: int = 4, batch: int = 8):
    return build_model("gpt2", batch, 256, layers=layers)


def _preset(model, **kw: Any) -> StrategyTree:
    return build_strategy(model, ParallelSpec(**kw))


def test_attribute_access_mirrors_the_model() -> None:
    S = StrategyTree.from_model(_small(), DeviceMesh(), 8, 8)
    assert S.layers[3].name == "layers.3" and S.root.layers[3] is S.layers[3]
    assert S.layers[3].qkv.op.name == "qkv" and S.layers[3].qkv.name == "layers.3.qkv"
    assert S.embedding.embed.op.weight == ("v", "h")
    assert len(S.layers) == 4 and [n.name for n in S.layers] == [f"layers.{i}" for i in range(4)]
    with pytest.raises(AttributeError, match="no child or op 'nope'"):
        _ = S.layers[0].nope


def test_data_parallel_set_once_propagates_along_the_dataflow() -> None:
    """Only the embedding's batch dim is set; every later op inherits the split from its producer, and
    weights follow their ops: the same graph as the DP preset (Proteus section VII)."""
    model = _small()
    S = StrategyTree.from_model(model, DeviceMesh(dp=4), 8, 2)
    S.embedding.split("b", "dp")
    S.resolve()
    assert all(leaf.leaf.ops[op.name].get("b") == ("dp",) for leaf, op in S.root.ops() if "b" in op.dims)
    _same(_graph(_preset(model, dp=4, micro_batch=2, global_batch=8), nodes=1), _graph(S, nodes=1))


def test_propagation_leaves_an_axis_alone_when_the_op_already_uses_it() -> None:
    """Sequence-parallel ln1 (s over tp) feeds qkv, which splits q over tp: qkv must not inherit s over tp
    (one axis cannot split two loop dims), so the compiler inserts the all-gather, as Megatron does."""
    S = StrategyTree.from_model(_small(batch=2), DeviceMesh(tp=2), 2, 2)
    S.root.split(("q", "a", "g", "o", "kv", "f", "f2"), "tp")
    S.layers[0].ln1.split("s", "tp")
    S.resolve()
    assert S.layers[0].leaf.ops["qkv"] == {"q": ("tp",)}
    steps = lower(S, Precision.named("bf16")).chunks[0].fwd
    assert any(s.label.startswith("layers.0.qkv.in0:all_gather") for s in steps)


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_shard_items_are_zero_stages(zero: int) -> None:
    model = _small(batch=4)
    items = ("optimizer", "grad", "weight")[:zero]
    S = StrategyTree.from_model(model, DeviceMesh(tp=2, dp=4), 8, 1)
    S.root.split("b", "ep", "dp").split(("q", "a", "g", "o", "kv", "f", "f2"), "tp").split("v", "tp", pad=True)
    S.root.shard(*items)
    _same(_graph(_preset(model, tp=2, dp=4, zero=zero, global_batch=8)), _graph(S))


def test_recompute_and_shard_inherit_top_down_with_overrides() -> None:
    model = _small()
    S = StrategyTree.from_model(model, DeviceMesh(dp=8), 8, 1)
    S.root.split("b", "ep", "dp").recompute("full").shard("optimizer")
    S.embedding.recompute("none")
    S.head.recompute("none")
    _same(_graph(_preset(model, dp=8, zero=1, recompute="full", global_batch=8)), _graph(S))
    S2 = StrategyTree.from_model(model, DeviceMesh(dp=8), 8, 1)
    S2.root.split("b", "ep", "dp").shard("optimizer", "grad", "weight")
    S2.layers[1].shard()  # this block keeps its states whole
    S2.resolve()
    assert S2.layers[1].leaf.weights["qkv"].optimizer == {}
    assert S2.layers[2].leaf.weights["qkv"].optimizer == {"q": ("ep", "dp")}


def test_explicit_memory_item_config_overrides_the_default() -> None:
    S = StrategyTree.from_model(_small(batch=2), DeviceMesh(tp=2, dp=2), 4, 1)
    S.root.split("b", "dp").split("f", "tp")
    S.layers[0].fc1.optimizer.split("f", "tp", "dp")
    S.resolve()
    w = S.layers[0].leaf.weights["fc1"]
    assert w.weight == {"f": ("tp",)} and w.optimizer == {"f": ("tp", "dp")}
    assert S.layers[1].leaf.weights["fc1"].optimizer == {"f": ("tp",)}


@pytest.mark.parametrize("kw", [dict(tp=2, pp=2, dp=2, global_batch=8, micro_batch=1, zero=1, sequence_parallel=True),
                                dict(dp=8, global_batch=16, micro_batch=2, zero=3, recompute="selective"),
                                dict(tp=2, pp=2, vpp=2, dp=2, global_batch=16, micro_batch=1, schedule="interleaved")])
def test_yaml_round_trip_gives_the_identical_graph(kw: dict[str, Any]) -> None:
    model = _small(batch=kw["dp"] * kw["micro_batch"])
    tree = _preset(model, **kw)
    text = tree.to_yaml()
    again = StrategyTree.from_yaml(model, text)
    _same(_graph(tree), _graph(again))
    assert again.to_yaml() == text
    assert len(text.splitlines()) < 200  # identical blocks share one YAML anchor


@settings(max_examples=12, deadline=None)
@given(st.sampled_from([1, 2, 4]), st.sampled_from([1, 2]), st.sampled_from([1, 2]), st.sampled_from([0, 1, 2, 3]),
       st.booleans())
def test_primitives_match_presets_over_degrees(tp: int, pp: int, dp: int, zero: int, sp: bool) -> None:
    sp = sp and tp > 1
    model = _small(layers=4, batch=2 * dp)
    spec = dict(tp=tp, pp=pp, dp=dp, zero=zero, sequence_parallel=sp, micro_batch=2, global_batch=8 * dp)
    S = StrategyTree.from_model(model, DeviceMesh(tp=tp, dp=dp, pp=pp), 8 * dp, 2)
    S.root.split("b", "ep", "dp").split("s", "cp").split(("q", "a", "g", "o", "kv", "f", "f2"), "tp")
    S.root.split("v", "tp", pad=True).shard(*("optimizer", "grad", "weight")[:zero])
    if sp:
        S.root.select("ln1", "attn_residual", "ln2", "mlp_residual", "final_norm", "embed_dropout").split(
            "s", "cp", "tp")
        S.root.select("qkv", "fc1", "lm_head").store("input", "s", "cp", "tp")
    for i, blk in enumerate(S.layers):
        blk.map(i * pp // 4)
    S.head.map(pp - 1)
    _same(_graph(_preset(model, **spec)), _graph(S))


# --------------------------------------------------------------------------------------------------
# One-line errors naming the node and the fix
# --------------------------------------------------------------------------------------------------

def _err(fn) -> str:
    with pytest.raises(ConfigError) as e:
        fn()
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_invalid_strategies_give_one_line_errors() -> None:
    # gpt2: 12 heads

    def fresh(**mesh: int) -> StrategyTree:
        return StrategyTree.from_model(_small(batch=mesh.get("dp", 1)), DeviceMesh(**mesh), 8, 1)

    m = _err(lambda: fresh(tp=8).root.split("a", "tp"))
    assert m.startswith("strategy.layers.0.attention:") and "'a' of size 12 is not divisible by tp = 8" in m
    assert "unknown mesh axis 'xp'" in _err(lambda: fresh().root.split("b", "xp"))
    assert "no op below it has dimension(s) zz" in _err(lambda: fresh().layers[0].split("zz", "dp"))
    assert "op has no dimension 'v'" in _err(lambda: fresh().layers[0].qkv.split("v", "dp"))
    assert "already splits dimension 'b'" in _err(lambda: fresh(dp=2).layers[0].qkv.split("b", "dp").split("h", "dp"))
    assert "names a mesh axis twice" in _err(lambda: fresh(dp=2).root.split("b", "dp", "dp"))
    assert "unknown recompute mode" in _err(lambda: fresh().layers[0].recompute("some"))
    assert "unknown state item(s) moments" in _err(lambda: fresh().root.shard("moments"))
    assert "saves no tensor 'output'" in _err(lambda: fresh().layers[0].qkv.store("output", "s", "tp"))
    assert "on the tree's root" in _err(lambda: fresh().layers[0].schedule(4))

    def cyc() -> None:
        S = fresh(pp=2)
        S.root.map(1)
        S.layers[2].map(0)
        S.resolve()
    m = _err(cyc)
    assert m.startswith("strategy.layers.2:") and "cyclic" in m

    def out_of_range() -> None:
        S = fresh(pp=2)
        S.head.map(2)
        S.resolve()
    assert "only 2" in _err(out_of_range)

    def empty_chunk() -> None:
        fresh(pp=2).resolve()  # everything on chunk 0
    assert "chunk(s) 1 have no layers" in _err(empty_chunk)

    def bad_batch() -> None:
        StrategyTree.from_model(_small(batch=4), DeviceMesh(dp=4), 6, 1).resolve()
    assert _err(bad_batch).startswith("strategy.global_batch: 6 is not divisible")
    m = _err(lambda: StrategyTree.from_model(_small(batch=8), DeviceMesh(dp=2), 8, 1).resolve())
    assert m.startswith("strategy.micro_batch: gpt2 was built with a batch of 8 but micro_batch x data-parallel")

    assert "max_ongoing_micro_batch must be >= 1" in _err(lambda: fresh(pp=2).root.schedule(8, 0))
    assert "needs the 1f1b schedule, not gpipe" in _err(lambda: fresh(pp=4).root.schedule(8, 2, kind="gpipe"))


def test_a_failed_split_changes_nothing() -> None:
    """gpt2's 12 heads over tp=8 fail at the first block's attention; the ops split before it (qkv) and
    the other blocks are left as they were."""
    S = StrategyTree.from_model(_small(batch=1), DeviceMesh(tp=8), 1, 1)
    before = {n.name: ({o: dict(sp) for o, sp in n.leaf.ops.items()}, dict(n.leaf.explicit)) for n in S.root.walk()}
    with pytest.raises(ConfigError):
        S.root.split(("q", "a"), "tp")
    after = {n.name: ({o: dict(sp) for o, sp in n.leaf.ops.items()}, dict(n.leaf.explicit)) for n in S.root.walk()}
    assert after == before


def test_bad_yaml_is_a_one_line_error() -> None:
    model = _small(batch=2)
    text = _preset(model, dp=2, global_batch=4).to_yaml()
    assert "malformed YAML" in _err(lambda: StrategyTree.from_yaml(model, "mesh: [1, 2"))
    assert "no layer 'layers.9'" in _err(lambda: StrategyTree.from_yaml(model, text.replace("layers.3:", "layers.9:")))
    assert "missing 'mesh'" in _err(lambda: StrategyTree.from_yaml(model, "global_batch: 4\n"))
    # the preset's padded vocabulary split (50257 over tp = 4) is recorded as padded and loads; the same
    # split without that mark is an uneven split, caught on load with the op named
    tp4 = _preset(_small(batch=1), tp=4, global_batch=1).to_yaml()
    assert "padded:" in tp4
    StrategyTree.from_yaml(_small(batch=1), tp4)
    data = yaml.safe_load(tp4)
    for entry in data["layers"].values():
        entry["config"].pop("padded", None)
    m = _err(lambda: StrategyTree.from_dict(_small(batch=1), data))
    assert m.startswith("strategy.embedding.embed: dimension 'v' of size 50257 is not divisible by tp = 4")
    m = _err(lambda: StrategyTree.from_yaml(_small(batch=1), tp4.replace("padded:", "paded:")))
    assert m.startswith("strategy.layers.embedding.paded: unknown key")


# --------------------------------------------------------------------------------------------------
# From Python and the CLI
# --------------------------------------------------------------------------------------------------

def test_simulate_tree_equals_the_preset_job() -> None:
    from trainsim.api import simulate, simulate_tree

    model = build_model("gpt2", 4, 1024)
    S = megatron(model, DeviceMesh(tp=2, dp=4, pp=2), 32, 1)
    mine = simulate_tree(S, "dgx-a100", granularity="op")
    ref = simulate({"model": {"name": "gpt2"}, "cluster": {"name": "dgx-a100", "nodes": 2},
                    "strategy": {"tp": 2, "pp": 2, "dp": 4, "global_batch": 32, "sequence_parallel": True, "zero": 1},
                    "simulation": {"granularity": "op"}})
    assert mine.iteration_time_s == ref.iteration_time_s and mine.n_gpus == 16
    assert mine.strategy == ref.strategy and mine.memory == ref.memory
    m = _err(lambda: simulate_tree(S, "dgx-a100", nodes=1))
    assert m.startswith("strategy.tree: the strategy's mesh has 16 GPUs, the cluster 8")


def test_threads_simulating_different_trees_match_runs_alone() -> None:
    from concurrent.futures import ThreadPoolExecutor

    from trainsim.api import simulate_tree

    def job(k: int) -> float:
        model = _small(batch=8 if k == 0 else 4)
        S = StrategyTree.from_model(model, DeviceMesh(dp=8) if k == 0 else DeviceMesh(tp=2, dp=4), 8, 1)
        S.embedding.split("b", "dp")
        if k:
            S.root.split(("q", "a", "g", "o", "kv", "f", "f2"), "tp").shard("optimizer")
        return simulate_tree(S, "dgx-a100").iteration_time_s

    alone = [job(0), job(1)]
    assert alone[0] != alone[1]
    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(job, [0, 1, 0, 1])) == alone * 2


def test_cli_dump_strategy_then_run_it(tmp_path) -> None:
    import json
    import subprocess
    import sys

    base = [sys.executable, "-m", "trainsim", "simulate", "--model", "gpt2", "--cluster", "dgx-a100", "-q"]
    tree, a, b = tmp_path / "s.yaml", tmp_path / "a.json", tmp_path / "b.json"
    p = subprocess.run([*base, "--nodes", "2", "--tp", "2", "--pp", "2", "--global-batch", "32", "--sp", "--zero", "1",
                        "--json", str(a), "--dump-strategy", str(tree)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    edited = tree.read_text().replace("recompute: none", "recompute: full", 3)  # edit the file: recompute blocks
    tree.write_text(edited)
    p = subprocess.run([*base, "--strategy-tree", str(tree), "--json", str(b)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    ja, jb = json.loads(a.read_text()), json.loads(b.read_text())
    assert jb["n_gpus"] == 16 and jb["strategy"]["tp"] == 2
    def flops(j: dict, key: str) -> float:
        return j[key] * j["iteration_time_s"]

    # recomputing the first layers adds hardware FLOPs and time, not model FLOPs
    assert flops(jb, "hw_tflops_per_gpu") > flops(ja, "hw_tflops_per_gpu")
    assert flops(jb, "tflops_per_gpu") == pytest.approx(flops(ja, "tflops_per_gpu"), rel=1e-12)
    assert jb["iteration_time_s"] > ja["iteration_time_s"]
    bad = subprocess.run([*base, "--strategy-tree", str(tree), "--tp", "4"], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "strategy.tp" in bad.stderr


def test_max_ongoing_micro_batch_bounds_memory_and_stretches_the_pipeline() -> None:
    """4 stages, 8 micro-batches: 1F1B keeps 4 - rank micro-batches in flight; a cap of 1 runs each
    backward before the next forward (stage 0 holds one micro-batch's activations, not four); a cap of 8
    (all of them) is GPipe."""
    from trainsim.api import simulate_tree

    def run(cap: int | None):
        S = StrategyTree.from_model(_small(layers=8, batch=1), DeviceMesh(pp=4), 8, 1)
        S.embedding.split("b", "dp")
        for i, blk in enumerate(S.layers):
            blk.map(i // 2)
        S.head.map(3)
        if cap is not None:
            S.root.schedule(8, cap)
        return S, simulate_tree(S, "dgx-a100")

    (s1, r1f1b), (sc, rcap), (sg, rgpipe) = run(None), run(1), run(8)
    assert (s1.schedule.kind, sc.schedule.kind, sg.schedule.kind) == ("1f1b", "1f1b", "gpipe")
    assert sc.schedule.max_ongoing_micro_batch == 1 and s1.schedule.max_ongoing_micro_batch is None
    act = [r.memory[0].activation_peak_bytes for r in (rcap, r1f1b, rgpipe)]
    assert act[0] == pytest.approx(act[1] / 4, rel=0.05) and act[2] == pytest.approx(2 * act[1], rel=0.05)
    assert rcap.iteration_time_s > r1f1b.iteration_time_s
    again = StrategyTree.from_yaml(sc.model, sc.to_yaml())
    assert again.schedule.max_ongoing_micro_batch == 1


def test_changing_a_tree_after_a_simulation_re_resolves_everything() -> None:
    """What resolve inferred (propagated splits, weight configs, the micro-batch count) is redone after the
    user changes the tree: simulating, editing, simulating again equals building the edited tree fresh."""
    model = _small(batch=8)

    def base() -> StrategyTree:
        S = StrategyTree.from_model(model, DeviceMesh(tp=2, dp=4), 8, 2)
        S.embedding.split("b", "dp")
        return S

    def edit(S: StrategyTree) -> StrategyTree:
        S.root.split(("q", "a", "g", "o", "kv", "f", "f2"), "tp").shard("optimizer")
        S.layers[1].split(("q", "a", "g", "o", "kv", "f", "f2"))  # this block: replicated weights ...
        S.layers[1].split("b", "tp", "dp")  # ... and pure data parallel over all 8 GPUs
        S.global_batch = 16
        return S

    reused = base()
    _graph(reused)
    edit(reused)
    _same(_graph(edit(base())), _graph(reused))
    assert reused.schedule.n_micro_batch == 2
    assert reused.layers[2].leaf.weights["fc1"].optimizer == {"f": ("tp", "dp")}


def test_module_paths_inside_a_traced_layer_read_like_the_code() -> None:
    """A model written with trainsim.nn names a block's ops by module path ('attn.qkv', 'mlp.fc1'):
    S.blocks[1].mlp.fc1 and S.blocks[1].mlp (all its ops) are reachable and splittable like the code."""
    import trainsim.nn as nn

    class MLP(nn.Module):
        def __init__(self, d: int) -> None:
            super().__init__()
            self.fc1, self.act, self.fc2 = nn.Linear(d, 4 * d, out_dim="f"), nn.GELU(), nn.Linear(4 * d, d)

        def forward(self, x):
            return self.fc2(self.act(self.fc1(x)))

    class Block(nn.Module):
        def __init__(self, d: int) -> None:
            super().__init__()
            self.ln, self.attn, self.ln2, self.mlp = nn.LayerNorm(d), nn.CausalSelfAttention(d, 4), nn.LayerNorm(d), MLP(d)

        def forward(self, x):
            x = x + self.attn(self.ln(x))
            return x + self.mlp(self.ln2(x))

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(512, 64)
            self.blocks = nn.ModuleList([Block(64) for _ in range(2)])
            self.head = nn.Linear(64, 512, out_dim="v")

        def forward(self, idx):
            x = self.emb(idx)
            for b in self.blocks:
                x = b(x)
            return self.head(x)

    model = nn.trace(Net(), (4, 32))
    S = StrategyTree.from_model(model, DeviceMesh(tp=2, dp=2), 8, 2)
    S.root.split("b", "dp")
    assert S.blocks[1].mlp.fc1.name == "blocks.1.mlp.fc1"
    S.blocks[1].mlp.split("f", "tp")  # fc1's output and fc2's input: Megatron's MLP
    S.blocks[1].attn.qkv.split("q", "tp")
    S.resolve()
    ops = S.blocks[1].leaf.ops
    assert ops["mlp.fc1"]["f"] == ("tp",) and ops["mlp.fc2"]["f"] == ("tp",) and ops["attn.qkv"]["q"] == ("tp",)
    assert "f" not in S.blocks[0].leaf.ops.get("mlp.fc1", {})
    with pytest.raises(AttributeError, match="no op or submodule 'nope'"):
        _ = S.blocks[1].mlp.nope
    steps = lower(S, Precision.named("bf16")).chunks[0].fwd
    # the row-parallel fc2 leaves a partial sum: all-reduced over tp where the residual add reads it
    assert [s.label for s in steps if s.layer == "blocks.1" and s.collective == "all_reduce"] == [
        "blocks.1.add_1.in1:all_reduce"]


@pytest.mark.parametrize("sp", [False, True])
def test_pipeline_hand_off_is_scattered_over_tp_and_gathered(sp: bool) -> None:
    """Megatron's scatter-gather p2p: a hand-off replicated over tp (no SP) is sent 1/tp per rank
    (b x s x h x 2 B / tp) and all-gathered over tp on arrival, forward and backward; under SP it is
    already split over tp and goes as it is, with nothing to gather."""
    model = build_model("gpt2", 2, 1024, layers=4)
    program = lower(_preset(model, tp=2, pp=2, micro_batch=2, global_batch=4, sequence_parallel=sp),
                    Precision.named("bf16"))
    c0, c1 = program.chunks
    full = 2 * 1024 * 768 * 2
    assert c0.send_fwd_bytes == c1.send_bwd_bytes == full / 2
    first_fwd, first_bwd = c1.fwd[0], c0.bwd[0]
    if sp:
        assert first_fwd.kind == first_bwd.kind == "compute"
    else:
        for s in (first_fwd, first_bwd):
            assert (s.collective, s.axes, s.size_bytes) == ("all_gather", ("tp",), full)


def test_scatter_gather_can_be_switched_off() -> None:
    """--no-p2p-scatter-gather (Megatron's --no-scatter-gather-tensors-in-pipeline): whole activations,
    nothing to gather; the switch survives the YAML round trip."""
    model = build_model("gpt2", 2, 1024, layers=4)
    tree = _preset(model, tp=2, pp=2, micro_batch=2, global_batch=4, p2p_scatter_gather=False)
    c0, c1 = lower(tree, Precision.named("bf16")).chunks
    assert c0.send_fwd_bytes == c1.send_bwd_bytes == 2 * 1024 * 768 * 2
    assert c1.fwd[0].kind == c0.bwd[0].kind == "compute"
    assert StrategyTree.from_yaml(model, tree.to_yaml()).p2p_scatter_gather is False
