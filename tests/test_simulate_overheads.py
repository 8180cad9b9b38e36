"""The per-call savings of `simulate` change no answer and leave no state behind:

- the cyclic garbage collector is off during a simulation and restored to the caller's setting after it,
  also when the simulation raises (api._gc_paused);
- a strategy tree held resolved (StrategyTree.held_resolved, used by api._run_tree so that predict_tasks and
  lower resolve it once) skips resolve only inside the block: an edit after it is resolved as before, and the
  simulation of a held tree equals the one of a tree resolved at every pass.
"""

from __future__ import annotations

import gc

import pytest

import trainsim.api as api
from trainsim.api import job_tree, simulate
from trainsim.compile.graph import predict_tasks
from trainsim.errors import ConfigError
from trainsim.strategy.tree import StrategyTree

SMALL = {"model": {"name": "gpt2"}, "cluster": {"name": "dgx-a100", "nodes": 1},
         "strategy": {"tp": 2, "pp": 2, "global_batch": 16, "micro_batch": 2}}


def test_collector_is_off_during_a_simulation_and_restored_after() -> None:
    seen: list[bool] = []
    real = api.job_tree

    def spy(job: api.JobConfig) -> tuple:
        seen.append(gc.isenabled())
        return real(job)

    assert gc.isenabled()
    api.job_tree = spy
    try:
        simulate(SMALL)
    finally:
        api.job_tree = real
    assert seen == [False]
    assert gc.isenabled()


def test_collector_left_off_when_the_caller_turned_it_off() -> None:
    gc.disable()
    try:
        simulate(SMALL)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_collector_restored_when_the_simulation_raises() -> None:
    bad = {**SMALL, "strategy": {**SMALL["strategy"], "global_batch": 15}}
    with pytest.raises(ConfigError):
        simulate(bad)
    assert gc.isenabled()


def _tree() -> StrategyTree:
    return job_tree(api.parse_job(SMALL))[2]


def test_held_tree_resolves_once_and_an_edit_after_the_block_is_resolved() -> None:
    tree = _tree()
    calls = 0
    real = StrategyTree._propagate

    def counting(self: StrategyTree, inherited: list) -> None:
        nonlocal calls
        calls += 1
        real(self, inherited)

    StrategyTree._propagate = counting  # type: ignore[method-assign]
    try:
        with tree.held_resolved():
            with tree.held_resolved():  # nested: the outer block holds
                tree.resolve()
            predict_tasks(tree)
            tree.resolve()
        assert calls == 1
        assert not tree._resolve_held
        tree.schedule_set, tree.global_batch = False, 32  # an edit between two simulations: derived again
        tree.resolve()
        assert calls == 2
        assert tree.schedule.n_micro_batch == 32 // (tree.micro_batch * tree.data_parallel)
    finally:
        StrategyTree._propagate = real  # type: ignore[method-assign]


def test_hold_released_on_an_error() -> None:
    tree = _tree()
    with pytest.raises(RuntimeError), tree.held_resolved():
        raise RuntimeError("inside")
    assert not tree._resolve_held


@pytest.mark.parametrize("strategy", [
    {"zero": 1, "sequence_parallel": True, "recompute": "selective"},
    {"pp": 2, "vpp": 2, "global_batch": 32, "zero": 3, "recompute": "full"},
    {"tp": 1, "pp": 1, "global_batch": 32, "zero": 2},
])
def test_held_simulation_equals_resolving_at_every_pass(strategy: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    job = api.parse_job({**SMALL, "strategy": {**SMALL["strategy"], **strategy}})
    held = simulate(job).to_json()
    held_costed = api.simulate_costed(job)[0].to_json()
    monkeypatch.setattr(StrategyTree, "held_resolved", lambda self: _NoHold())
    plain = simulate(job).to_json()
    for r in (held, held_costed, plain):
        r.pop("simulation_wall_s")
    assert held == plain == held_costed


class _NoHold:
    """A stand-in for held_resolved that holds nothing: every pass resolves the tree (the reference)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
