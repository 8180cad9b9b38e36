"""The two-hop MoE dispatch (strategy.ep_dispatcher deepep: DeepEP / HybridEP send a token once per destination node
over RDMA and forward it over NVLink): the cross-node share in closed form, the all-to-all it prices, the strategy
keys and the moe_runs mapping."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import trainsim
from trainsim.cost.calibration import load_calibration
from trainsim.cost.comm import (
    CommParams,
    NcclComm,
    two_hop_dispatch,
    two_hop_rank_share,
    two_hop_remote_share,
)
from trainsim.errors import ConfigError
from trainsim.hardware.cluster import get_cluster
from trainsim.validate.moe_rows import ep_dispatcher

PARAMS = CommParams.model_validate(load_calibration().comm)
MIB = 1 << 20


def test_share_by_hand() -> None:
    # 128 experts over 2 nodes, top-8: the other node is missed only when all 8 land at home,
    # C(64, 8) / C(128, 8); a direct all-to-all sends it 8 x 1/2 = 4 copies on average
    miss = math.comb(64, 8) / math.comb(128, 8)
    assert two_hop_remote_share(128, 8, 2) == pytest.approx((1 - miss) / 4)
    # DeepSeek-V3 on 8 nodes, node-limited to 4: 4 x 7/8 remote nodes against 8 x 7/8 remote copies
    assert two_hop_remote_share(256, 8, 8, node_limit=4) == pytest.approx(0.5)
    assert two_hop_remote_share(256, 8, 8) == pytest.approx(8 * (1 - math.comb(224, 8) / math.comb(256, 8)) * 7 / 8
                                                             / (8 * 7 / 8))
    assert two_hop_remote_share(256, 8, 1) == 1.0  # inside one node nothing crosses
    assert two_hop_remote_share(8, 1, 4) == 1.0  # top-1: one copy is one node


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([8, 16, 64, 128, 256, 384]), st.integers(1, 16), st.sampled_from([2, 4, 8, 16]))
def test_share_is_a_fraction_that_falls_with_top_k(experts: int, top_k: int, nodes: int) -> None:
    top_k = min(top_k, experts)
    share = two_hop_remote_share(experts, top_k, nodes)
    assert 0 < share <= 1
    if top_k < experts:
        assert two_hop_remote_share(experts, top_k + 1, nodes) <= share + 1e-12  # more copies share more nodes


def test_two_hop_all_to_all_carries_the_share_over_the_nics() -> None:
    """Across nodes the NICs bound an 8-per-node all-to-all: the two-hop one takes that share of the bandwidth
    time (its NVLink forwarding is 9x faster than a GPU's NIC share), inside one node it is the direct one."""
    comm = NcclComm(get_cluster("dgx-h100", 4), PARAMS)
    group, size = tuple(range(32)), 512 * MIB
    direct = comm.time("all_to_all", size, group)
    half = comm.time("all_to_all", size, group, remote_share=0.5)
    fast = NcclComm(get_cluster("dgx-h100", 4), PARAMS)
    lat = fast.priced("all_to_all", size, group)[1][0]  # the latency part (links infinitely fast)
    assert half - lat == pytest.approx((direct - lat) * 0.5, rel=1e-6)
    one_node = tuple(range(8))
    assert comm.time("all_to_all", size, one_node, remote_share=0.5) == comm.time("all_to_all", size, one_node)
    # the demand that bandwidth sharing uses adds up to the same time
    t, (latency, work) = comm.priced("all_to_all", size, group, remote_share=0.5)
    assert t == pytest.approx(half) and latency + max(work.values()) == pytest.approx(t)


def _job(**strategy: Any) -> dict[str, Any]:
    return {"model": {"name": "qwen3-30b-a3b", "layers": 4, "seq_len": 2048},
            "cluster": {"name": "dgx-h100", "nodes": 2},
            "strategy": {"ep": 16, "global_batch": 32, **strategy}, "simulation": {"dtype": "bf16"}}


def test_the_two_hop_dispatch_shortens_cross_node_expert_parallelism_only() -> None:
    direct, two_hop = trainsim.simulate(_job()), trainsim.simulate(_job(ep_dispatcher="deepep"))
    assert two_hop.breakdown["ep"] < 0.6 * direct.breakdown["ep"]  # 2 nodes, top-8 of 128: share 0.25
    # the same GEMMs and memory traffic; DeepEP's fused preprocess launches fewer bookkeeping kernels (workload.zoo
    # MOE_TOKEN_KERNELS), so its compute is never longer (the overlap slowdown under gradient traffic moves a little)
    assert two_hop.breakdown["compute"] <= direct.breakdown["compute"] * 1.01
    small = {**_job(), "cluster": {"name": "dgx-h100", "nodes": 2}}
    small["strategy"] = {"ep": 8, "global_batch": 32}  # ep inside each node: nothing crosses
    inside = trainsim.simulate(small)
    small["strategy"]["ep_dispatcher"] = "deepep"
    nvlink_only = trainsim.simulate(small)
    # inside a node only the per-GPU deduplication remains: top-8 of 128 experts, 16 per GPU, reach 5.25 GPUs
    share = two_hop_rank_share(128, 8, 8, 1)
    assert share == pytest.approx(8 * (1 - math.comb(112, 8) / math.comb(128, 8)) / 8)
    assert nvlink_only.breakdown["ep"] < inside.breakdown["ep"]
    assert nvlink_only.breakdown["ep"] > share * inside.breakdown["ep"] * 0.95  # the latency does not shrink


def test_rank_share_by_hand() -> None:
    # 4 experts on 2 GPUs, top-2: both on one GPU with probability 2 x C(2, 2) / C(4, 2) = 1/3, so 5/3 GPUs per
    # token against 2 copies
    assert two_hop_rank_share(4, 2, 2, 1) == pytest.approx(5 / 6)
    assert two_hop_rank_share(256, 8, 1, 1) == 1.0 and two_hop_rank_share(256, 1, 64, 8) == 1.0
    # node-limited: a token picks its 8 experts among the 4 chosen nodes' 128, 32 GPUs of 4 experts there
    limited = 32 * (1 - math.comb(124, 8) / math.comb(128, 8)) / 8
    assert two_hop_rank_share(256, 8, 64, 8, node_limit=4) == pytest.approx(limited)


@settings(max_examples=80, deadline=None)
@given(st.sampled_from([16, 64, 128, 256]), st.integers(2, 16), st.sampled_from([1, 2, 4, 8]),
       st.sampled_from([1, 2, 4, 8]), st.sampled_from([None, 1, 2, 4]))
def test_a_gpu_is_never_reached_less_often_than_its_node(experts: int, top_k: int, nodes: int, per_node: int,
                                                         limit: int | None) -> None:
    """Deduplicating per GPU keeps at least as many copies as per node (uniform routing): the moved share is at
    least the remote share, both fractions of the per-expert copies, and two_hop_dispatch's pair multiplies back
    to the cross-node share."""
    ranks = nodes * per_node
    if experts % ranks:
        return
    moved = two_hop_rank_share(experts, top_k, ranks, nodes, limit)
    remote = two_hop_remote_share(experts, top_k, nodes, limit)
    assert 1 / top_k - 1e-12 <= moved <= 1.0
    # (on one node nothing crosses: the remote share is 1 by convention; a node limit takes every chosen node as
    # reached, which a tiny top_k need not do, so the property is the uniform routing's)
    if nodes > 1 and limit is None:
        assert remote <= moved + 1e-12
    got_moved, share = two_hop_dispatch(experts, top_k, ranks, nodes, limit)
    assert got_moved == moved and 0 < share <= 1.0
    assert moved * share == pytest.approx(min(moved, remote) if nodes > 1 else moved)


def test_strategy_keys_are_checked_and_kept() -> None:
    with pytest.raises(ConfigError, match=r"^strategy\.ep_node_limit:"):
        trainsim.simulate(_job(ep_node_limit=4))
    with pytest.raises(ConfigError, match=r"^strategy\.ep_dispatcher:"):
        trainsim.simulate(_job(ep_dispatcher="nccl"))
    limited = trainsim.simulate(_job(ep_dispatcher="deepep", ep_node_limit=1))
    assert limited.breakdown["ep"] <= trainsim.simulate(_job(ep_dispatcher="deepep")).breakdown["ep"]
    from trainsim.api import job_tree
    from trainsim.config import parse_job
    from trainsim.strategy.tree import StrategyTree

    _, _, tree = job_tree(parse_job(_job(ep_dispatcher="deepep", ep_node_limit=2)))
    again = StrategyTree.from_dict(tree.model, tree.to_dict())
    assert (again.ep_dispatcher, again.ep_node_limit) == ("deepep", 2)
    _, _, tree = job_tree(parse_job(_job(ep_dispatcher="hybridep", ep_node_limit=2, ep_dispatcher_sms=24)))
    again = StrategyTree.from_dict(tree.model, tree.to_dict())
    assert (again.ep_dispatcher, again.ep_node_limit, again.ep_dispatcher_sms) == ("hybridep", 2, 24)
    data = tree.to_dict()  # hybridep on 24 SMs: a strategy file is checked as a job is
    for bad in ({**data, "ep_dispatcher": "deepep"}, {**data, "ep_dispatcher_sms": 0}):
        with pytest.raises(ConfigError, match=r"^strategy\.ep_dispatcher_sms:"):
            StrategyTree.from_dict(tree.model, bad)
    for bad in ({"ep_dispatcher_sms": 16}, {"ep_dispatcher": "deepep", "ep_dispatcher_sms": 16},
                {"ep_dispatcher": "hybridep", "ep_dispatcher_sms": 0}):
        with pytest.raises(ConfigError, match=r"^strategy\.ep_dispatcher_sms:"):
            trainsim.simulate(_job(**bad))


def _dispatch_steps(dispatcher: str, **strategy: Any) -> list[Any]:
    """The forward dispatch all-to-alls of the first chunk, on one node of 8 GPUs (EP 8)."""
    from trainsim.api import simulate_costed
    from trainsim.config import JobConfig

    job = {**_job(ep_dispatcher=dispatcher, **strategy), "cluster": {"name": "dgx-b200", "nodes": 1}}
    job["strategy"] = {**job["strategy"], "ep": 8}
    _, costed = simulate_costed(JobConfig.model_validate(job))
    return [s for s in costed.program.chunks[0].fwd if s.label.endswith("expert_fc1.in0:all_to_all")]


def test_hybridep_moves_at_most_its_sms_rate_by_hand() -> None:
    """HybridEP sends what DeepEP sends (one copy per GPU reached), at most ep_dispatcher_sms x 21.0 GB/s: its BF16
    dispatch and combine on 8 GB200 ranks with 16 SMs (DeepEP pull request 420), per SM; Megatron's default 16."""
    from trainsim.cost.comm import HYBRIDEP_DEFAULT_SMS, HYBRIDEP_GBPS_PER_SM

    assert pytest.approx((362.01 + 310.21) / 2 / 16) == HYBRIDEP_GBPS_PER_SM
    assert HYBRIDEP_DEFAULT_SMS == 16
    deep = _dispatch_steps("deepep")
    moved = two_hop_rank_share(128, 8, 8, 1)  # qwen3-30b-a3b: top-8 of 128 experts on 8 GPUs
    for sms in (None, 16, 4):
        hybrid = _dispatch_steps("hybridep", **({"ep_dispatcher_sms": sms} if sms else {}))
        assert len(hybrid) == len(deep) == 4
        for h, d in zip(hybrid, deep, strict=True):
            bound = h.size_bytes * moved / ((sms or 16) * HYBRIDEP_GBPS_PER_SM * 1e9)
            assert h.size_bytes == d.size_bytes
            assert h.duration_s == pytest.approx(max(d.duration_s, bound))
    # 16 SMs bind on a B200's NVLink here; enough of them leave the links' price
    assert hybrid[0].duration_s > deep[0].duration_s
    many = _dispatch_steps("hybridep", ep_dispatcher_sms=1024)
    assert [s.duration_s for s in many] == pytest.approx([s.duration_s for s in deep])


def test_hybridep_across_nvlink_domains_moves_at_its_measured_cross_domain_rate() -> None:
    """Over two 8-GPU nodes (EP 16) HybridEP moves at most sms x 5.53 GB/s: its dispatch and combine on two B300 nodes
    with 24 SMs (DeepEP issue 590), per SM; inside one node the in-domain rate holds (the test above)."""
    from trainsim.api import simulate_costed
    from trainsim.config import JobConfig
    from trainsim.cost.comm import HYBRIDEP_CROSS_DOMAIN_GBPS_PER_SM

    assert pytest.approx((136.54 + 128.92) / 2 / 24) == HYBRIDEP_CROSS_DOMAIN_GBPS_PER_SM

    def steps(**strategy: Any) -> list[Any]:
        job = _job(**strategy)  # 2 DGX H100 nodes, EP 16
        _, costed = simulate_costed(JobConfig.model_validate(job))
        return [s for s in costed.program.chunks[0].fwd if s.label.endswith("expert_fc1.in0:all_to_all")]

    deep = steps(ep_dispatcher="deepep")
    moved = two_hop_rank_share(128, 8, 16, 2)
    for sms in (32, 1024):
        hybrid = steps(ep_dispatcher="hybridep", ep_dispatcher_sms=sms)
        for h, d in zip(hybrid, deep, strict=True):
            bound = h.size_bytes * moved / (sms * HYBRIDEP_CROSS_DOMAIN_GBPS_PER_SM * 1e9)
            assert h.duration_s == pytest.approx(max(d.duration_s, bound))
    assert steps(ep_dispatcher="hybridep", ep_dispatcher_sms=32)[0].duration_s > deep[0].duration_s  # it binds


@pytest.mark.parametrize(("cell", "settings_text", "want"), [
    ("flex (hybridep)", "", "hybridep"), ("flex (deepep)", "", "deepep"), ("DeepEP", "", "deepep"),
    ("alltoall (model default)", "", "alltoall"), ("", "--moe-token-dispatcher-type=flex", "deepep"),
    ("", "--moe-token-dispatcher-type=flex --moe-flex-dispatcher-backend=hybridep", "hybridep"),
    ("", "--moe-token-dispatcher-type=alltoall", "alltoall"), ("", "", "alltoall"),
])
def test_rows_name_their_dispatcher(cell: str, settings_text: str, want: str) -> None:
    assert ep_dispatcher(settings_text, cell) == want


def test_hybridep_rows_get_their_recipes_sms() -> None:
    """Megatron-Bridge's benchmark recipes run HybridEP on 32 SMs (_benchmark_common), Nemotron 3 Nano's on 16."""
    from trainsim.validate.moe_rows import hybridep_sms

    assert hybridep_sms({"model_name": "Nemotron 3 Nano (30B-A3B, hybrid)"})[0] == 16
    for name in ("DeepSeek-V3 (671B-A37B)", "Nemotron 3 Super (120B-A12B)", "Qwen3-30B-A3B"):
        assert hybridep_sms({"model_name": name})[0] == 32



@pytest.mark.parametrize(("experts", "dp_cp", "cell", "want"), [
    (128, 64, "DeepEP", 64), (32, 8, "DeepEP", 8), (32, 48, "flex (hybridep)", 16), (60, 16, "alltoall", 4),
    (128, 64, "", None), (128, 64, "allgather", None),
])
def test_a_named_dispatcher_without_an_ep_degree_folds_the_experts_over_data_parallel(
        experts: int, dp_cp: int, cell: str, want: int | None) -> None:
    """An EP dispatcher means EP > 1: the largest degree dividing the experts and dp x cp; no dispatcher, no EP."""
    from trainsim.validate.moe_rows import unstated_ep

    got = unstated_ep(experts, dp_cp, cell)
    assert (got and got[0]) == want
    if got:
        assert experts % got[0] == 0 and dp_cp % got[0] == 0 and str(got[0]) in got[1]

# ---- EP all-to-all overlapped with the other micro-batch's compute (strategy.ep_overlap) ----------------------

def _steps(layer: str, compute_s: float, a2a_s: float) -> list[Any]:
    from trainsim.compile.program import Step

    return [Step(f"{layer}.mlp", "compute", 0, "compute", layer=layer, duration_s=compute_s),
            Step(f"{layer}.d", "collective", 2, "ep", layer=layer, collective="all_to_all", axes=("ep",),
                 duration_s=a2a_s),
            Step(f"{layer}.c", "collective", 2, "ep", layer=layer, collective="all_to_all", axes=("ep",),
                 duration_s=a2a_s)]


@pytest.mark.parametrize(("paired", "gamma", "fwd_left", "bwd_left"), [
    (1.0, 0.0, 0.0, 0.25),  # forward a2a (1.0) under backward compute (3.0): gone; backward's 1.0 under 0.5: 0.5 left
    (1.0, 0.2, 0.1, 0.25 + 0.05),  # what is hidden costs gamma of itself in slowed compute
    (0.5, 0.0, 0.25, 0.375),  # half the micro-batches have no partner (warm-up, cool-down)
])
def test_ep_overlap_hides_each_layers_all_to_alls_under_the_other_pass(paired: float, gamma: float, fwd_left: float,
                                                                       bwd_left: float) -> None:
    from trainsim.cost.annotate import _overlap_ep_comm

    fwd, bwd = _steps("layers.0", 0.5, 0.5), _steps("layers.0", 3.0, 0.5)
    _overlap_ep_comm(fwd, bwd, paired, gamma)
    assert [s.duration_s for s in fwd] == pytest.approx([0.5, fwd_left, fwd_left])
    assert [s.duration_s for s in bwd] == pytest.approx([3.0, bwd_left, bwd_left])


def test_paired_share_leaves_out_the_warm_up() -> None:
    from trainsim.api import costed_program, job_tree
    from trainsim.config import parse_job
    from trainsim.cost.annotate import paired_share

    job = parse_job({**_job(), "cluster": {"name": "dgx-h100", "nodes": 4},
                     "strategy": {"ep": 16, "pp": 2, "global_batch": 64, "ep_overlap": True}})
    cl, _, tree = job_tree(job)
    costed = costed_program(tree, cl, job.simulation)
    m = tree.schedule.n_micro_batch
    # 1F1B on pp 2: the first rank runs one warm-up forward, then forward i + 1 beside backward i
    assert paired_share(costed.program) == pytest.approx((m - 1) / m)


def test_ep_overlap_shortens_only_the_exposed_expert_communication() -> None:
    four = {"name": "dgx-h100", "nodes": 4}
    plain = trainsim.simulate({**_job(pp=2, global_batch=64), "cluster": four})
    hidden = trainsim.simulate({**_job(pp=2, global_batch=64, ep_overlap=True), "cluster": four})
    # 3 of 4 micro-batches paired; the backward's all-to-alls outlast the forward compute they hide under
    assert hidden.breakdown["ep"] < 0.8 * plain.breakdown["ep"]
    assert hidden.iteration_time_s < plain.iteration_time_s
    # the same kernels: with no host in the way (a full-iteration graph) the compute is the same; eager, the one
    # host issues both paired micro-batches' launches, which a host-bound step feels
    graphed = [trainsim.simulate({**_job(pp=2, global_batch=64, cuda_graphs="full_iteration", **extra),
                                  "cluster": four}) for extra in ({}, {"ep_overlap": True})]
    assert graphed[1].breakdown["compute"] == pytest.approx(graphed[0].breakdown["compute"])
    with pytest.raises(ConfigError, match=r"^strategy\.ep_overlap:"):
        trainsim.simulate({**_job(), "strategy": {"global_batch": 32, "ep_overlap": True}})


def test_rows_with_ep_a2a_overlap_map_it() -> None:
    from trainsim.validate.training_runs import _settings

    assert _settings("grad_accum=32; EP a2a overlap=on; delay_wgrad_compute=on").ep_overlap is True
    assert _settings("EP a2a overlap=off").ep_overlap is False
