"""No global state: two simulations with different strategies, run concurrently from threads (and
interleaved with a strategy-tree compile), give exactly what each gives alone."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from trainsim.api import simulate

JOBS: list[dict[str, Any]] = [
    {"model": {"name": "gpt2"}, "cluster": {"name": "dgx-a100", "nodes": 2},
     "strategy": {"tp": 2, "pp": 2, "dp": 4, "global_batch": 32, "sequence_parallel": True, "zero": 1}},
    {"model": {"name": "llama2-7b", "layers": 8}, "cluster": {"name": "dgx-h100", "nodes": 1},
     "strategy": {"tp": 4, "dp": 2, "global_batch": 8, "recompute": "full", "zero": 3}},
    {"model": {"name": "resnet50"}, "cluster": {"name": "dgx1-v100", "nodes": 2},
     "strategy": {"dp": 16, "micro_batch": 32, "global_batch": 512}},
    {"model": {"name": "gpt2-proteus"}, "cluster": {"name": "pcie-titanxp"},
     "strategy": {"dp": 2, "tp": 2, "pp": 2, "global_batch": 8, "micro_batch": 2},
     "simulation": {"dtype": "fp32", "bandwidth_sharing": True}},
]


def _key(job: dict[str, Any]) -> tuple:
    r = simulate(job)
    return (r.iteration_time_s, r.n_tasks, tuple(m.peak_bytes for m in r.memory), tuple(sorted(r.breakdown.items())),
            tuple(r.graph.duration_s) if r.graph is not None else ())


def test_threads_give_the_results_of_runs_alone() -> None:
    alone = [_key(j) for j in JOBS]
    assert len(set(alone)) == len(JOBS)  # the jobs really differ
    with ThreadPoolExecutor(max_workers=4) as pool:
        for _ in range(2):
            together = list(pool.map(_key, JOBS * 2))
            assert together == alone * 2
