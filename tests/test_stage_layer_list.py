"""strategy.stage_layers (every pipeline chunk's layer count given) and nanotron's compute-balanced split that
validate writes into it, checked against splits worked by hand from nanotron's rule."""

from __future__ import annotations

from collections import Counter

import pytest
from training_row import training_row

import trainsim
from trainsim.api import strategy_tree
from trainsim.errors import ConfigError
from trainsim.validate import training_runs as tr
from trainsim.validate.pipeline_splits import nanotron_layer_cost, nanotron_stage_layers

JOB = {"model": {"name": "llama3-8b", "seq_len": 1024}, "cluster": {"name": "dgx-h100", "nodes": 1}}
LLAMA_1B = {"layers": 24, "hidden": 2048, "heads": 32, "ffn": 4096, "vocab": 50257}
"""nanotron bench_cluster's Llama-1B."""


def _chunks(strategy: dict[str, object]) -> tuple[list[int], dict[str, int]]:
    tree = strategy_tree({**JOB, "strategy": {"tp": 2, "global_batch": 8, **strategy}})
    chunk = {n.layer.name: n.chunk for n in tree.root.walk() if n.layer is not None}
    blocks = Counter(c for name, c in chunk.items() if name.startswith("layers."))
    pp = int(strategy["pp"])  # type: ignore[call-overload]
    return [blocks[s] for s in range(pp)], {k: v for k, v in chunk.items() if not k.startswith("layers.")}


def test_llama_1b_layer_cost_by_hand() -> None:
    # 4 * 32 heads * 64 * 2048 = 16,777,216 (QKV + out); 3 * 4096 * 2048 = 25,165,824 (gate, up, down)
    assert nanotron_layer_cost(2048, 32, 4096) == 16_777_216 + 25_165_824


@pytest.mark.parametrize(("pp", "counts"), [
    # total = 24 * 41,943,040 + 50257 * 2048 (102,926,336) = 1,109,559,296. pp 2: half = 554,779,648; 13 layers
    # (545,259,520) stay under it, the 14th crosses it and stays on rank 0.
    (2, [14, 10]),
    # pp 4: thresholds 277.4M, 554.8M, 832.2M: the 7th layer (293.6M) crosses the first, the 14th (587.2M) the
    # second, the 20th (838.9M) the third; rank 3 takes 4 layers and the head.
    (4, [7, 7, 6, 4]),
    # pp 8: thresholds every 138.7M: layers 4 (167.8M), 7 (293.6M), 10 (419.4M), 14 (587.2M), 17 (713.0M),
    # 20 (838.9M), 24 (1006.6M > 970.9M) each cross one; the head alone is left for rank 7.
    (8, [4, 3, 3, 4, 3, 3, 4, 0]),
    (1, [24]),
])
def test_nanotron_split_of_llama_1b(pp: int, counts: list[int]) -> None:
    assert nanotron_stage_layers(pp=pp, **LLAMA_1B) == counts


def test_a_small_vocabulary_splits_nearly_evenly() -> None:
    # 8 layers of cost c and a head of 0.5c over 2 ranks: threshold 4.25c, the 5th layer (5c) crosses it.
    c = nanotron_layer_cost(64, 1, 64)  # 4*64*64 + 3*64*64 = 7 * 4096
    vocab = c // 2 // 64
    assert nanotron_stage_layers(8, 64, 1, 64, vocab, 2) == [5, 3]


@pytest.mark.parametrize(("strategy", "counts", "head"), [
    ({"pp": 2, "stage_layers": [18, 14]}, [18, 14], 1),
    ({"pp": 4, "stage_layers": [9, 9, 14, 0]}, [9, 9, 14, 0], 3),  # the last stage keeps only the head
    ({"pp": 4, "stage_layers": [0, 10, 11, 11]}, [0, 10, 11, 11], 3),  # the first keeps only the embedding
])
def test_listed_layers_per_stage(strategy: dict[str, object], counts: list[int], head: int) -> None:
    got, ends = _chunks(strategy)
    assert got == counts
    assert ends["embedding"] == 0 and ends["head"] == head


def test_fewer_layers_than_chunks_when_the_ends_hold_only_embedding_and_loss() -> None:
    """6 blocks over pp 4 x vpp 2 = 8 chunks, one each but the first (the embedding alone) and the last (the loss):
    Megatron's account-for-embedding/loss-in-pipeline-split. Listed counts are checked by their own rules, not
    by the even split's blocks >= chunks."""
    job = {"model": {"name": "custom", "layers": 6, "hidden": 512, "heads": 8, "seq_len": 1024},
           "cluster": {"name": "dgx-h100", "nodes": 1},
           "strategy": {"pp": 4, "vpp": 2, "dp": 2, "micro_batch": 4, "global_batch": 32,
                        "stage_layers": [0, 1, 1, 1, 1, 1, 1, 0]}}
    tree = strategy_tree(job)
    chunk = {n.layer.name: n.chunk for n in tree.root.walk() if n.layer is not None}
    assert chunk["embedding"] == 0 and chunk["head"] == 7
    assert sorted(c for name, c in chunk.items() if name.startswith("layers.")) == [1, 2, 3, 4, 5, 6]
    assert trainsim.simulate(job).iteration_time_s > 0
    with pytest.raises(ConfigError, match="layers for pp x vpp"):
        trainsim.simulate({**job, "strategy": {k: v for k, v in job["strategy"].items() if k != "stage_layers"}})


def test_an_empty_last_stage_still_simulates() -> None:
    result = trainsim.simulate({**JOB, "strategy": {"pp": 4, "tp": 2, "global_batch": 8,
                                                    "stage_layers": [9, 9, 14, 0]}})
    assert result.iteration_time_s > 0


@pytest.mark.parametrize(("strategy", "problem"), [
    ({"pp": 2, "stage_layers": [18, 13]}, "sum to 31"),
    ({"pp": 4, "stage_layers": [16, 16]}, "2 counts for pp x vpp"),
    ({"pp": 4, "stage_layers": [16, 0, 16, 0]}, "would hold no layer"),
    ({"pp": 2, "stage_layers": [16, 16], "first_stage_layers": 16}, "set them twice"),
    ({"pp": 1, "stage_layers": [16, 16]}, "needs pipeline parallelism"),
    ({"pp": 2, "stage_layers": [-1, 33]}, "greater than or equal to 0"),
])
def test_impossible_lists_are_refused(strategy: dict[str, object], problem: str) -> None:
    with pytest.raises(ConfigError, match="stage_layers") as info:
        trainsim.simulate({**JOB, "strategy": {"tp": 2, "global_batch": 8, **strategy}})
    assert problem in str(info.value)


def _nanotron_row(**columns: str) -> dict[str, str]:
    return training_row(source_group="nanotron_bench_cluster", source="huggingface/bench_cluster (nanotron)",
                        model_name="Llama-1B", arch="Llama (RMSNorm, SwiGLU, MHA, RoPE)", n_layers="24",
                        hidden="2048", n_heads="32", n_kv_heads="32", ffn_hidden="4096", vocab="50257",
                        seq_len="4096", **columns)


def test_validate_maps_nanotron_rows_to_its_split() -> None:
    rj = tr.row_job(_nanotron_row(n_gpus="8", dp="2", tp="1", pp="4", micro_batch="1", global_batch="8"))
    assert not isinstance(rj, str), rj
    assert rj.job["strategy"]["stage_layers"] == [7, 7, 6, 4]
    assert "[7, 7, 6, 4]" in rj.assumptions["pipeline_split"]


def test_validate_leaves_other_frameworks_and_pp_1_alone() -> None:
    rj = tr.row_job(_nanotron_row(n_gpus="8", dp="8", tp="1", pp="1", micro_batch="1", global_batch="8"))
    assert not isinstance(rj, str) and "stage_layers" not in rj.job["strategy"]
    rj = tr.row_job(training_row(n_layers="12", n_gpus="4", dp="1", pp="4", micro_batch="1", global_batch="8"))
    assert not isinstance(rj, str) and "stage_layers" not in rj.job["strategy"]
