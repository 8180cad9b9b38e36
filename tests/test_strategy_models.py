"""Strategies written with the primitives on imported and built-in models: a Hugging Face GPT-2
config.json and ResNet-50, each with data parallelism, op-shard (tensor) parallelism and a pipeline,
compiled and simulated end to end; what each strategy must put in the graph is checked by kind."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainsim.api import simulate_tree
from trainsim.strategy.mesh import DeviceMesh
from trainsim.strategy.tree import StrategyTree
from trainsim.workload.hf import build_hf_model
from trainsim.workload.zoo import build_model

GPT2_JSON = Path(__file__).parent / "data" / "hf" / "gpt2.json"
TP_DIMS = ("q", "a", "g", "o", "kv", "f", "f2")


def _categories(result) -> set[str]:
    g = result.graph
    return {g.category[t] for t in range(len(g)) if g.kind[t] != "compute"}


def _gpt2(dp: int, micro_batch: int = 2):
    return build_hf_model(GPT2_JSON, micro_batch * dp, 1024)


def test_hf_gpt2_data_parallel() -> None:
    S = StrategyTree.from_model(_gpt2(8), DeviceMesh(dp=8), 64, 2)
    S.embedding.split("b", "dp")  # set once: propagates through every op
    r = simulate_tree(S, "dgx-a100", granularity="op")
    assert r.iteration_time_s > 0 and r.model == "gpt2-124m"
    assert _categories(r) == {"dp"}  # gradient all-reduces only
    assert r.model_params == 124_439_808


def test_hf_gpt2_op_shard_megatron() -> None:
    S = StrategyTree.from_model(_gpt2(2), DeviceMesh(tp=4, dp=2), 16, 2)
    S.root.split("b", "dp").split(TP_DIMS, "tp").split("v", "tp", pad=True)
    r = simulate_tree(S, "dgx-a100", granularity="op")
    g = r.graph
    tp = [t for t in range(len(g)) if g.category[t] == "tp"]
    assert tp and {g.comm_op[t] for t in tp} >= {"all_reduce"}  # row-parallel outputs are summed over tp
    dp_only = StrategyTree.from_model(_gpt2(8), DeviceMesh(dp=8), 16, 2)
    dp_only.embedding.split("b", "dp")
    assert r.memory[0].static_bytes < simulate_tree(dp_only, "dgx-a100").memory[0].static_bytes / 3


def test_hf_gpt2_pipeline() -> None:
    S = StrategyTree.from_model(_gpt2(2), DeviceMesh(dp=2, pp=4), 32, 2)
    S.embedding.split("b", "dp")
    for i, blk in enumerate(S.layers):
        blk.map(i // 3)
    S.head.map(3)
    r = simulate_tree(S, "dgx-a100", granularity="op")
    assert "pp" in _categories(r) and len(r.memory) == 4
    assert r.breakdown["bubble"] > 0


@pytest.mark.parametrize("pp", [1, 2])
def test_resnet50_dp_op_shard_and_pipeline(pp: int) -> None:
    """ResNet-50: batch over dp; the classifier's output classes and the last stage's 3x3 convs split over
    tp (op-shard: the compiler gathers and reduces around them); with pp = 2 the stages are pipelined."""
    model = build_model("resnet50", 16)
    S = StrategyTree.from_model(model, DeviceMesh(tp=2, dp=4, pp=pp), 64, 4)
    S.root.split("n", "dp")
    S.fc.fc.split("k", "tp")
    for blk in S.layer4:
        blk.conv2.split("k", "tp")
    if pp == 2:
        S.layer3.map(1)
        S.layer4.map(1)
        S.fc.map(1)
    r = simulate_tree(S, "dgx-a100", granularity="op")
    cats = _categories(r)
    assert {"dp", "tp"} <= cats and ("pp" in cats) == (pp == 2)
    assert r.iteration_time_s > 0 and len(r.memory) == pp
