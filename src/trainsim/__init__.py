"""trainsim: predict distributed deep-learning training performance before paying for the GPUs."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .errors import ConfigError

if TYPE_CHECKING:  # annotations only: importing trainsim stays cheap (the API is imported on first call)
    from .config import JobConfig
    from .optimize.search import SearchResult
    from .sim.result import SimulationResult
    from .strategy.tree import StrategyTree

__version__ = "0.1.0"


def simulate(job: JobConfig | dict[str, Any] | None = None, *, model: str | dict[str, Any] | None = None,
             cluster: str | dict[str, Any] | None = None, strategy: dict[str, Any] | None = None,
             bandwidth_sharing: bool | None = None, progress: Callable[[str, int, int], None] | None = None,
             timeline: bool = False, **options: Any) -> SimulationResult:
    """Predict one training iteration.

    Either pass a JobConfig / nested dict, or keywords: `simulate(model="llama3-70b", cluster="dgx-h100",
    strategy={"tp": 8, "pp": 4, "dp": 16, "global_batch": 1024}, nodes=64, seq_len=8192)`.
    Any other keyword is a key of the model, cluster, strategy or simulation section (seq_len, nodes, gpu,
    topology, tp, dtype, comm_model, ...) and goes there; an unknown one is a ConfigError.
    `bandwidth_sharing` (any form) overrides simulation.bandwidth_sharing: False prices every call as
    if it ran alone, for an ablation. `progress(phase, done, total)`, if given, is called every few thousand
    tasks ('building graph', then 'simulating'); without it nothing is reported.
    Many identical micro-batches are folded (trainsim.sim.periodic: the steady state is simulated until it
    repeats exactly, the rest added), so `result.graph` / `result.trace` are None; `timeline=True` simulates
    every micro-batch and keeps every task's times (same numbers, for a timeline or a trace export).
    """
    from .api import simulate as _simulate

    return _simulate(job, model=model, cluster=cluster, strategy=strategy, bandwidth_sharing=bandwidth_sharing,
                     progress=progress, timeline=timeline, **options)


def simulate_tree(tree: StrategyTree, cluster: str = "dgx-a100", *, nodes: int | None = None,
                  progress: Callable[[str, int, int], None] | None = None, **simulation: Any) -> SimulationResult:
    """Simulate a strategy tree written with the primitives (`StrategyTree.from_model(...)`) on a cluster
    preset; `nodes` defaults to what the tree's mesh needs (a mesh smaller than a node uses part of one),
    `simulation` takes the simulation keys
    (dtype, gamma, exact, granularity, bandwidth_sharing, comm_model, ...)."""
    from .api import simulate_tree as _simulate_tree

    return _simulate_tree(tree, cluster, nodes=nodes, progress=progress, **simulation)


def search(model: str | dict[str, Any] | None = None, cluster: str | dict[str, Any] | None = None,
           nodes: int | list[int] | None = None, global_batch: int | None = None, *,
           space: dict[str, Any] | None = None, top: int = 3, time_limit_s: float | None = None, jobs: int = 1,
           ray: str | None = None, db: str | None = None, pareto_memory: bool = False,
           progress: Callable[[str, int, int], None] | None = None, **keys: Any) -> SearchResult:
    """Find the fastest strategy that fits: branch and bound over the event simulation (`trainsim search`).

    `model` / `cluster` are names or dicts of their keys (default GPT-3 175B on DGX A100); `nodes` one count or
    several (a throughput-vs-GPUs front); `global_batch` defaults to ~4M tokens; `space` restricts the knobs
    ({'tp': [4, 8], 'recompute': ['selective'], ...}); other keywords are model/cluster/simulation keys
    (seq_len, gpu, dtype, ...). `jobs` local worker processes or `ray` ('auto' or an address) run the
    simulations; `db` keeps every simulated configuration in a DuckDB file. The result has `best`, `top`,
    `rows`, `pruned`, `space`, `evaluated`, `pareto_gpus()`, `pareto_memory()` and `to_json()`."""
    from .optimize.search import search_keywords

    return search_keywords(model, cluster, nodes, global_batch, space=space, top=top, time_limit_s=time_limit_s,
                           jobs=jobs, ray=ray, db=db, pareto_memory=pareto_memory, progress=progress, **keys)


_LAZY = {"StrategyTree": "trainsim.strategy.tree", "DeviceMesh": "trainsim.strategy.mesh"}


def __getattr__(name: str) -> Any:
    """`trainsim.StrategyTree` / `trainsim.DeviceMesh` / `trainsim.nn`, imported on first use (importing
    trainsim stays cheap)."""
    import importlib

    if name == "nn":
        return importlib.import_module(".nn", __name__)
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'trainsim' has no attribute '{name}'")


__all__ = ["ConfigError", "DeviceMesh", "StrategyTree", "search", "simulate", "simulate_tree", "__version__"]
