"""Hybrid sharding (HSDP): states sharded over dp / dp_replicate ranks, gradients reduce-scattered in the
sharding group and all-reduced across the replicas; hand-computed bytes and the option's checks."""

from __future__ import annotations

import pytest

import trainsim
from trainsim.api import strategy_tree
from trainsim.compile.program import lower
from trainsim.errors import ConfigError
from trainsim.strategy.precision import Precision
from trainsim.strategy.tree import StrategyTree

JOB = {"model": {"name": "llama3-8b", "layers": 2, "seq_len": 1024},
       "cluster": {"name": "dgx-h100", "nodes": 2}}


def _program(dp_replicate: int):
    tree = strategy_tree({**JOB, "strategy": {"dp": 16, "fsdp": True, "dp_replicate": dp_replicate,
                                              "global_batch": 16}})
    return tree, lower(tree, Precision.named("bf16"))


def test_hsdp_shards_over_the_group_and_all_reduces_over_replicas() -> None:
    tree, prog = _program(4)  # 16 ranks: sharding groups of 4, 4 replicas
    assert tree.mesh.dp == 4 and tree.mesh.dr == 4 and tree.data_parallel == 16
    layer = "layers.0"
    sync = [s for ch in prog.chunks for s in ch.grad_sync if s.layer == layer]
    assert [(s.collective, s.axes) for s in sync] == [("reduce_scatter", ("dp",)), ("all_reduce", ("dr",))]
    rs, ar = sync
    assert ar.size_bytes == pytest.approx(rs.size_bytes / 4)  # the shard of the group, fp32 gradients
    # Llama-3-8B block: 4096 x (4096 + 2 x 1024) + 4096 x 4096 + 3 x 4096 x 14336, plus two norms of 4096
    block = 4096 * (4096 + 2048) + 4096 * 4096 + 3 * 4096 * 14336 + 2 * 4096
    assert rs.size_bytes == pytest.approx(block * 4.0)
    gathers = [s for s in prog.chunks[0].fwd if s.label == f"{layer}.params:all_gather"]
    assert len(gathers) == 1 and gathers[0].axes == ("dp",)


def test_one_replica_is_plain_fsdp() -> None:
    _, prog = _program(1)
    sync = [s for ch in prog.chunks for s in ch.grad_sync if s.layer == "layers.0"]
    assert [(s.collective, s.axes) for s in sync] == [("reduce_scatter", ("dp",))]
    a = trainsim.simulate({**JOB, "strategy": {"dp": 16, "fsdp": True, "global_batch": 16}})
    b = trainsim.simulate({**JOB, "strategy": {"dp": 16, "fsdp": True, "dp_replicate": 1, "global_batch": 16}})
    assert a.iteration_time_s == b.iteration_time_s


def test_hsdp_holds_group_sized_shards() -> None:
    full = trainsim.simulate({**JOB, "strategy": {"dp": 16, "fsdp": True, "global_batch": 16}})
    hsdp = trainsim.simulate({**JOB, "strategy": {"dp": 16, "fsdp": True, "dp_replicate": 4, "global_batch": 16}})
    states = [m.static_bytes for m in full.memory]
    assert [m.static_bytes for m in hsdp.memory] == pytest.approx([4 * s for s in states], rel=0.02)


def test_tree_keeps_the_replica_axis() -> None:
    tree, _ = _program(2)
    model = tree.model
    again = StrategyTree.from_dict(model, tree.to_dict())
    assert again.mesh.dr == 2 and again.mesh.dp == 8


@pytest.mark.parametrize(("strategy", "field"), [
    ({"dp": 16, "dp_replicate": 2, "global_batch": 16}, "dp_replicate"),
    ({"dp": 16, "fsdp": True, "dp_replicate": 16, "global_batch": 16}, "dp_replicate"),
    ({"dp": 16, "fsdp": True, "dp_replicate": 3, "global_batch": 48}, "dp_replicate"),
])
def test_bad_replica_counts_are_refused(strategy: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        trainsim.simulate({**JOB, "strategy": strategy})
