"""The fast paths of job_tree equal their reference paths on random jobs:

- a zoo transformer builds one block's ops and shares them among its blocks: the same values as building
  every block afresh, each block with a list of its own;
- build_strategy derives a leaf's configs once per op list and shares that LeafConfig among the layers with
  the list: equal to deriving every leaf; two leaves share a mutable container only by being one shared object
  (primitives edit them in place, after taking the node's own copy: copy on write), and an edit through a
  primitive changes its own layer only;
- resolve skips propagation in layers whose dimensions are all decided: the same tree as the generic loop,
  also after edits with the primitives and on a second resolve.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import trainsim.strategy.tree as tree_module
from trainsim.errors import ConfigError
from trainsim.strategy.presets import ParallelSpec, build_strategy, preset_leaf
from trainsim.strategy.tree import LeafConfig, StrategyTree
from trainsim.workload.ir import Layer, Model, Module
from trainsim.workload.zoo import build_model, transformer_config
from trainsim.workload.zoo.transformer import _block_ops, _eager, _embedding, _head

MODELS = ("gpt2", "gpt3-125m", "llama2-7b", "llama3-8b", "mixtral-8x7b", "bert-base", "resnet50", "dlrm")


def _reference_transformer(name: str, batch: int, attention: str, kernels: str, layers: int) -> Model:
    """build_transformer as it was before the blocks shared their ops: every block built on its own."""
    cfg = transformer_config(name, {"kernels": kernels}, layers=layers)
    s = cfg.seq_len
    blocks: list[Module | Layer] = [Layer(f"layers.{i}", "transformer", _block_ops(cfg, batch, s, attention))
                                    for i in range(cfg.layers)]
    root = Module(cfg.name, [_embedding(cfg, batch, s), Module("layers", blocks), _head(cfg, batch, s)])
    if cfg.kernels == "eager":
        for layer in root.layers():
            layer.ops = [_eager(op, cfg) for op in layer.ops]
    return Model(cfg.name, cfg.family, root, seq_len=s, description=cfg.description, assumptions=cfg.assumptions,
                 hyper={"layers": cfg.layers, "hidden": cfg.hidden, "heads": cfg.heads, "kv_heads": cfg.kv,
                        "ffn": cfg.ffn, "vocab": cfg.vocab, "experts": cfg.experts,
                        "top_k": cfg.top_k if cfg.experts else 0,
                        "expert_ffn": (cfg.expert_ffn or cfg.ffn) if cfg.experts else 0,
                        "shared_expert_ffn": cfg.shared_expert_ffn, "first_dense_layers": 0, "attention": attention,
                        "mtp_layers": 0, "moe_padded": bool(cfg.experts and cfg.moe_pad_to_capacity)})


def _model_value(m: Model) -> tuple:
    return (m.name, m.family, m.batch_dim, m.seq_len, m.description, m.hyper, m.assumptions,
            [(la.name, la.kind, la.tied_to, la.tied_op, [op.key() for op in la.ops]) for la in m.layers])


@settings(max_examples=30, deadline=None)
@given(name=st.sampled_from(MODELS[:6]), batch=st.integers(1, 8), attention=st.sampled_from(["flash", "unfused"]),
       kernels=st.sampled_from(["fused", "eager"]), layers=st.integers(1, 6))
def test_shared_block_ops_equal_blocks_built_apart(name: str, batch: int, attention: str, kernels: str,
                                                   layers: int) -> None:
    fast = build_model(name, batch, None, attention, {"kernels": kernels}, layers=layers)
    assert _model_value(fast) == _model_value(_reference_transformer(name, batch, attention, kernels, layers))
    lists = [la.ops for la in fast.layers]
    assert len({id(x) for x in lists}) == len(lists)  # every layer owns its list


def _leaf_value(leaf: LeafConfig) -> str:
    return repr((leaf.ops, {k: vars(w) for k, w in leaf.weights.items()}, {k: vars(c) for k, c in leaf.extras.items()},
                 leaf.saved, {k: sorted(v) for k, v in leaf.explicit.items()}, leaf.memory,
                 {k: sorted(v) for k, v in leaf.propagated.items()}, sorted(leaf.derived)))


def _containers(leaf: LeafConfig) -> list[Any]:
    """Every mutable object a leaf holds."""
    out: list[Any] = [leaf.ops, leaf.weights, leaf.extras, leaf.saved, leaf.explicit, leaf.memory, leaf.propagated,
                      leaf.derived]
    out += [*leaf.ops.values(), *leaf.saved.values(), *leaf.explicit.values(), *leaf.memory.values(),
            *leaf.propagated.values(), *leaf.extras.values()]
    for w in leaf.weights.values():
        out += [w, w.weight, w.grad, w.optimizer]
    return out


@st.composite
def jobs(draw: st.DrawFn) -> tuple[Model, ParallelSpec]:
    name = draw(st.sampled_from(MODELS))
    transformer = name not in ("resnet50", "dlrm")
    tp = draw(st.sampled_from([1, 2, 4])) if transformer else 1
    pp = draw(st.sampled_from([1, 2, 4]))
    ep = draw(st.sampled_from([1, 2])) if name == "mixtral-8x7b" else 1
    dp = ep * draw(st.sampled_from([1, 2]))
    vpp = draw(st.sampled_from([1, 2])) if pp > 1 else 1
    micro = draw(st.sampled_from([1, 2]))
    spec = ParallelSpec(dp=dp, tp=tp, pp=pp, ep=ep, vpp=vpp, micro_batch=micro,
                        global_batch=micro * dp * pp * draw(st.sampled_from([1, 2])),
                        sequence_parallel=tp > 1 and draw(st.booleans()), zero=draw(st.integers(0, 3)),
                        recompute=draw(st.sampled_from(["none", "selective", "full"])),
                        schedule="interleaved" if vpp > 1 else draw(st.sampled_from(["1f1b", "gpipe", "zb-h1"])))
    dims = {"layers": draw(st.integers(4, 8))} if transformer else {}
    model = build_model(name, micro * dp, None, draw(st.sampled_from(["flash", "unfused"])) if transformer
                        else "flash", **dims)
    return model, spec


def _build(model: Model, spec: ParallelSpec) -> StrategyTree:
    try:
        return build_strategy(model, spec)
    except ConfigError:
        assume(False)
        raise


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(job=jobs(), which=st.integers(0, 10))
def test_shared_leaves_equal_derived_leaves_and_edits_stay_on_their_layer(job: tuple[Model, ParallelSpec],
                                                                          which: int) -> None:
    model, spec = job
    tree = _build(model, spec)
    leaves = [n for n in tree.root.walk() if n.layer is not None]
    for node in leaves:
        assert _leaf_value(node.leaf) == _leaf_value(preset_leaf(node.layer, spec, model.batch_dim))
    seen: dict[int, int] = {}  # container -> the LeafConfig holding it
    for node in leaves:
        for obj in _containers(node.leaf):
            assert seen.setdefault(id(obj), id(node.leaf)) == id(node.leaf), f"{node.name}: a config in two leaves"
    holders: dict[int, int] = {}
    for node in leaves:
        holders[id(node.leaf)] = holders.get(id(node.leaf), 0) + 1
    assert all(node.leaf.shared for node in leaves if holders[id(node.leaf)] > 1)
    # LeafConfig.copy sets the fields directly: every field, equal values, unshared, nothing in common
    for node in leaves[:3]:
        copied = node.leaf.copy()
        assert set(vars(copied)) == {f.name for f in fields(LeafConfig)}
        assert copied == node.leaf and not copied.shared
        assert not {id(o) for o in _containers(copied)} & {id(o) for o in _containers(node.leaf)}
    # an edit through a primitive (on a layer whose leaf others share, where there is one) changes that layer
    tree.resolve()
    sharing = [n for n in leaves if holders[id(n.leaf)] > 1] or leaves
    node = sharing[which % len(sharing)]
    before = [_leaf_value(n.leaf) for n in leaves]
    op = next((op for op in node.layer.ops if any(node.leaf.ops.get(op.name, {}).values())), node.layer.ops[0])
    dim = next((d for d, axes in node.leaf.ops.get(op.name, {}).items() if axes), next(iter(op.dims)))
    node.op(op.name).split(dim)  # no axes: the dimension replicated
    tree.resolve()
    after = [_leaf_value(n.leaf) for n in leaves]
    changed = {n.name for n, b, a in zip(leaves, before, after, strict=True) if b != a}
    assert changed <= {node.name}
    assert node.leaf.explicit[op.name] >= {dim} and not node.leaf.shared


def _tree_value(tree: StrategyTree) -> list[tuple]:
    return [(n.name, n.chunk, n.recompute_mode, _leaf_value(n.leaf)) for n in tree.root.walk()]


def _edit(tree: StrategyTree, which: int) -> None:
    """Leave some dimensions to propagation in a few layers (undecided dims, as a user's strategy does)."""
    blocks = [n for n in tree.root.walk() if n.layer is not None and n.layer.kind == "transformer"]
    if not blocks:
        return
    node = blocks[which % len(blocks)]
    leaf = node.own_leaf()  # the layer's own configs (its block's may be shared)
    for op in node.layer.ops[1:]:
        leaf.explicit[op.name] = set()
        for d in list(leaf.ops[op.name])[::2]:
            leaf.ops[op.name].pop(d)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(job=jobs(), which=st.integers(0, 10))
def test_resolve_fast_path_equals_generic_propagation(job: tuple[Model, ParallelSpec], which: int) -> None:
    model, spec = job
    results = []
    for fast in (True, False):
        tree = _build(model, spec)
        with pytest.MonkeyPatch.context() as mp:
            if not fast:
                mp.setattr(tree_module, "_decided", lambda leaf, ops: False)
            tree.resolve()
            first = _tree_value(tree)
            _edit(tree, which)
            tree.resolve()
            second = _tree_value(tree)
            tree.resolve()
            results.append((first, second, _tree_value(tree)))
    assert results[0] == results[1]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(job=jobs())
def test_resolve_owns_an_incomplete_shared_leaf_before_filling_it(job: tuple[Model, ParallelSpec]) -> None:
    """A shared leaf that resolve must fill (here: weight configs left to derivation) is copied per node first:
    every node ends with the configs an unshared tree derives, and the shared object itself is not written."""
    model, spec = job
    shared_tree, plain_tree = _build(model, spec), _build(model, spec)
    for tree in (shared_tree, plain_tree):
        for node in tree.root.walk():
            if node.layer is not None:
                leaf = node.leaf if tree is shared_tree else node.own_leaf()
                leaf.weights.clear()  # left to resolve: it derives them (sharded_weight_config)
    originals = {id(n.leaf): n.leaf for n in shared_tree.root.walk() if n.layer is not None and n.leaf.shared}
    assume(originals)
    shared_tree.resolve()
    plain_tree.resolve()
    assert _tree_value(shared_tree) == _tree_value(plain_tree)
    assert all(not leaf.weights for leaf in originals.values())  # nothing written into a shared object
    assert not any(n.leaf.shared for n in shared_tree.root.walk() if n.layer is not None and n.layer.ops
                   and any(op.weight is not None for op in n.layer.ops))
