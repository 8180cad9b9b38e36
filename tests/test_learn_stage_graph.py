"""PredTOP's stage graphs from trainsim's IR: one block's ops per stage (symmetry), dataflow edges in
topological order, and the pipeline composition of a stage correction into an iteration."""

from __future__ import annotations

import math

import numpy as np
import pytest

from trainsim.learn.dataset import analytical_mre_pct, config_key, split_by_config
from trainsim.learn.stage_graph import GRAPH_FEATURES, NODE_FEATURES, StageGraph, job_stage_graph
from trainsim.validate.vtrain import row_job


def vtrain_row(layers: int = 12, tp: int = 2, pp: int = 2, mb: int = 2, ms: str = "250.0") -> dict[str, str]:
    dp = 8 // (tp * pp)
    return {"# GPUs": "8", "global batch": str(4 * mb * dp), "micro batch": str(mb), "hidden size": "1024",
            "attention heads": "16", "# layers": str(layers), "sequence length": "1024",
            "tensor parallelism": str(tp), "data parallelism": str(dp), "pipeline parallelism": str(pp),
            "iteration time (ms)": ms}


@pytest.fixture(scope="module")
def graphs() -> dict[int, StageGraph]:
    out = {}
    for layers in (12, 24):
        job = row_job(vtrain_row(layers))
        assert isinstance(job, dict)
        out[layers] = job_stage_graph(job, 0.25, f"l{layers}")
    return out


def test_a_stage_graph_holds_one_block_whatever_the_depth(graphs: dict[int, StageGraph]) -> None:
    a, b = graphs[12], graphs[24]
    assert a.x.shape == b.x.shape  # 6 and 12 blocks per stage: the same ops
    assert a.x.shape[1] == len(NODE_FEATURES) and a.g.shape == (len(GRAPH_FEATURES),)
    blocks = GRAPH_FEATURES.index("log_blocks")
    assert math.exp(a.g[blocks]) == pytest.approx(12 / 2) and math.exp(b.g[blocks]) == pytest.approx(24 / 2)
    # the deeper model's stage takes about twice as long (its blocks dominate the stage)
    assert 1.6 < b.base_stage_s / a.base_stage_s < 2.1


def test_edges_point_forward_and_connect_the_dag(graphs: dict[int, StageGraph]) -> None:
    g = graphs[12]
    src, dst = g.edges
    assert (src < dst).all() and src.min() >= 0 and dst.max() < len(g.x)
    reached = {0}
    for s, d in sorted(zip(src.tolist(), dst.tolist(), strict=True)):
        if s in reached:
            reached.add(d)
    assert len(reached) == len(g.x)  # every op depends, through the dataflow, on the stage's first op


def test_one_hot_blocks_are_one_hot(graphs: dict[int, StageGraph]) -> None:
    x = graphs[12].x
    for prefix in ("kind:", "phase:", "category:", "op:"):
        cols = [i for i, name in enumerate(NODE_FEATURES) if name.startswith(prefix)]
        assert np.allclose(x[:, cols].sum(axis=1), 1.0)


def test_pipeline_slots_are_micro_batches_plus_stages_minus_one(graphs: dict[int, StageGraph]) -> None:
    g = graphs[12]
    assert g.slots == 4 + 2 - 1  # global batch 4 x mb x dp: 4 micro-batches on 2 stages
    assert g.base_iter_s > g.base_stage_s > 0


def test_split_is_by_configuration_and_seeded() -> None:
    gs = [StageGraph(np.zeros((1, 1), np.float32), np.zeros((2, 0), np.int64), np.zeros(1, np.float32), 1.0, 1.0,
                     1.0, 1.0, f"k{i % 10}") for i in range(40)]
    train, test = split_by_config(gs, 0.3, seed=3)
    assert sorted(train + test) == list(range(40))
    assert not {gs[i].key for i in train} & {gs[i].key for i in test}
    assert len({gs[i].key for i in train}) == 3
    assert (train, test) == split_by_config(gs, 0.3, seed=3)
    assert (train, test) != split_by_config(gs, 0.3, seed=4)


def test_config_key_ignores_the_measurement() -> None:
    assert config_key(vtrain_row(ms="1.0")) == config_key(vtrain_row(ms="2.0"))
    assert config_key(vtrain_row(tp=2)) != config_key(vtrain_row(tp=4))


def test_analytical_error_is_the_simulated_iteration_against_the_label() -> None:
    g = StageGraph(np.zeros((1, 1), np.float32), np.zeros((2, 0), np.int64), np.zeros(1, np.float32), 1.0, 1.1, 1.0,
                   1.0, "k")
    assert analytical_mre_pct([g]) == pytest.approx(10.0)
