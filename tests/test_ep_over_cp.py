"""Expert parallelism folded over context parallelism (Megatron's MoE parallel folding: the EP group is formed from
consecutive ranks of cp x dp, cp first): where ep does not fit in the data axis it spans every cp rank and a part of
the data axis, the experts split over cp x ep and their tokens over what is left of the data axis; and EP beside
hybrid sharding (HSDP replicas)."""

from __future__ import annotations

from typing import Any

import pytest

import trainsim
from trainsim.api import job_tree
from trainsim.config import parse_job

MODEL = {"name": "custom", "layers": 2, "hidden": 512, "heads": 8, "ffn": 2048, "seq_len": 1024, "experts": 4,
         "top_k": 1}


def _job(**strategy: Any) -> dict[str, Any]:
    return {"model": MODEL, "cluster": {"name": "dgx-h100", "nodes": 1},
            "strategy": {"tp": 2, "global_batch": 32, "micro_batch": 4, **strategy}}


def _expert_split(job: dict[str, Any]) -> dict[str, tuple[str, ...]]:
    _, _, tree = job_tree(parse_job(job))
    tree.resolve()
    leaf = next(n.leaf for n in tree.root.walk() if n.leaf is not None and "expert_fc1" in n.leaf.ops)
    return leaf.ops["expert_fc1"]


@pytest.mark.parametrize(("strategy", "e_axes", "c_axes", "mesh_ep"), [
    ({"cp": 2, "pp": 2, "ep": 2, "dp": 1}, ("cp", "ep"), ("dp",), 1),  # EP is the cp group itself
    ({"cp": 2, "ep": 4, "dp": 2}, ("cp", "ep"), ("dp",), 2),  # every cp rank and the whole data axis
    ({"cp": 2, "ep": 2, "dp": 2}, ("ep",), ("dp", "cp"), 2),  # fits in the data axis: it stays there
])
def test_experts_fold_over_cp_where_the_data_axis_cannot_hold_them(strategy: dict[str, int], e_axes: tuple[str, ...],
                                                                   c_axes: tuple[str, ...], mesh_ep: int) -> None:
    job = _job(**strategy)
    split = _expert_split(job)
    assert split["e"] == e_axes and split["c"] == c_axes
    _, _, tree = job_tree(parse_job(job))
    assert tree.mesh.size("ep") == mesh_ep


def test_the_dispatch_over_cp_is_expert_parallel_traffic_and_halves_the_experts_per_rank() -> None:
    folded = trainsim.simulate(_job(cp=2, pp=2, ep=2, dp=1))
    plain = trainsim.simulate(_job(cp=2, pp=2, ep=1, dp=1))
    assert folded.breakdown["ep"] > 0 and plain.breakdown.get("ep", 0.0) == 0.0
    assert folded.breakdown["cp"] == pytest.approx(plain.breakdown["cp"], rel=0.02)  # the attention's own
    assert folded.model_params == plain.model_params
    assert all(f.components_bytes["params"] < p.components_bytes["params"]
               for f, p in zip(folded.memory, plain.memory, strict=True))


def test_an_ep_neither_axis_holds_is_refused() -> None:
    with pytest.raises(trainsim.ConfigError, match=r"^strategy\.ep: ep=4 must divide dp=1"):
        trainsim.simulate(_job(cp=2, pp=2, ep=4, dp=1))


def test_hybrid_sharding_with_expert_parallelism() -> None:
    """HSDP replicas (Megatron's --num-distributed-optimizer-instances) beside EP: the experts' tokens split over the
    replicas too (the step's work is the plain run's), the dense states shard over ep x dp only, so they double
    against a sharding over the whole data axis when half of it replicates."""
    base = {"model": {**MODEL, "experts": 8}, "cluster": {"name": "dgx-h100", "nodes": 1}}
    st = {"tp": 2, "dp": 4, "ep": 2, "zero": 1, "global_batch": 32, "micro_batch": 4}
    plain = trainsim.simulate({**base, "strategy": st})
    hsdp = trainsim.simulate({**base, "strategy": {**st, "dp_replicate": 2}})
    assert hsdp.breakdown["compute"] == pytest.approx(plain.breakdown["compute"], rel=1e-9)
    assert hsdp.breakdown["ep"] == pytest.approx(plain.breakdown["ep"], rel=1e-9)
    assert hsdp.memory[0].components_bytes["params"] == plain.memory[0].components_bytes["params"]
    assert hsdp.memory[0].components_bytes["optimizer_states"] > plain.memory[0].components_bytes["optimizer_states"]
    assert hsdp.memory[0].components_bytes["optimizer_states"] <= 2 * plain.memory[0].components_bytes[
        "optimizer_states"] * (1 + 1e-9)


def test_the_dispatch_over_cp_takes_the_two_hop_pricing_and_the_overlap() -> None:
    """The dispatch is recognised by what it is (the all-to-all into and out of the experts), not by crossing the
    ep axis: folded over cp it still gets DeepEP's one copy per GPU and the all-to-all overlap."""
    model = {**MODEL, "experts": 8, "top_k": 2}
    st = {"cp": 2, "pp": 2, "ep": 2, "dp": 1}
    job = {**_job(**st), "model": model}
    plain = trainsim.simulate(job)
    two_hop = trainsim.simulate({**job, "strategy": {**job["strategy"], "ep_dispatcher": "deepep"}})
    overlap = trainsim.simulate({**job, "strategy": {**job["strategy"], "ep_overlap": True}})
    assert two_hop.breakdown["ep"] < plain.breakdown["ep"]  # top-2 of 8 on 2 GPUs: 1.57 GPUs per token, not 2
    assert overlap.breakdown["ep"] < plain.breakdown["ep"]
