"""Uneven pipeline stages (Megatron --decoder-first/last-pipeline-num-layers): layers per stage by hand, the
checks Megatron makes, and validate reading the flags."""

from __future__ import annotations

from collections import Counter

import pytest
from training_row import training_row

import trainsim
from trainsim.api import strategy_tree
from trainsim.errors import ConfigError
from trainsim.validate import training_runs as tr

JOB = {"model": {"name": "llama3-8b", "seq_len": 1024}, "cluster": {"name": "dgx-h100", "nodes": 1}}


def _stages(**strategy: int) -> tuple[list[int], dict[str, int]]:
    tree = strategy_tree({**JOB, "strategy": {"pp": 4, "tp": 2, "global_batch": 8, **strategy}})
    chunk = {n.layer.name: n.chunk for n in tree.root.walk() if n.layer is not None}
    blocks = Counter(c for name, c in chunk.items() if name.startswith("layers."))
    return [blocks[s] for s in range(4)], {k: v for k, v in chunk.items() if not k.startswith("layers.")}


@pytest.mark.parametrize(("strategy", "counts"), [
    ({}, [8, 8, 8, 8]),
    ({"first_stage_layers": 6, "last_stage_layers": 6}, [6, 10, 10, 6]),
    ({"first_stage_layers": 5}, [5, 9, 9, 9]),
    ({"last_stage_layers": 2}, [10, 10, 10, 2]),
    ({"first_stage_layers": 2, "pp": 2}, [2, 30, 0, 0]),  # the other stage takes the rest
])
def test_layers_per_stage(strategy: dict[str, int], counts: list[int]) -> None:
    got, ends = _stages(**strategy)
    assert got == counts
    last = max(i for i, n in enumerate(counts) if n)
    assert ends["embedding"] == 0 and ends["head"] == last  # embedding and LM head stay on the end stages


def test_lighter_end_stages_relieve_the_lm_head_stage() -> None:
    """Llama-3-8B's 128k-vocab head sits on the last stage: moving two layers off it shortens the pipeline."""
    def step(**strategy: int) -> float:
        return trainsim.simulate({**JOB, "strategy": {"pp": 4, "tp": 2, "global_batch": 32, **strategy}}
                                 ).iteration_time_s

    assert step(first_stage_layers=9, last_stage_layers=7) < step()


@pytest.mark.parametrize("strategy", [
    {"pp": 1, "tp": 8, "first_stage_layers": 4},
    {"pp": 4, "vpp": 2, "first_stage_layers": 4},
    {"pp": 4, "first_stage_layers": 7},  # 25 layers for 3 stages
    {"pp": 2, "first_stage_layers": 10, "last_stage_layers": 10},  # 12 layers left for no stage
])
def test_impossible_layouts_are_refused(strategy: dict[str, int]) -> None:
    with pytest.raises(ConfigError, match="stage_layers"):
        trainsim.simulate({**JOB, "strategy": {"tp": 2, "global_batch": 8, **strategy}})


def test_validate_reads_megatron_uneven_flags() -> None:
    row = training_row(n_layers="12", n_gpus="4", dp="1", pp="4", micro_batch="1", global_batch="8",
                       other_settings="decoder-first-pipeline-num-layers=2; decoder-last-pipeline-num-layers=2")
    rj = tr.row_job(row)
    assert not isinstance(rj, str), rj
    assert rj.job["strategy"]["first_stage_layers"] == 2 and rj.job["strategy"]["last_stage_layers"] == 2
    assert trainsim.simulate(rj.job).iteration_time_s > 0
