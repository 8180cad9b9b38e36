"""Bandwidth sharing: max-min fair flows (sim.flows + engine), per-link work of NcclComm, static
concurrency among identical groups, and the switch (Proteus section VI-C)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainsim.api import simulate
from trainsim.compile.graph import ExecutionGraph, RankClass, _blocks
from trainsim.compile.program import Stream
from trainsim.cost.annotate import axes_concurrency, pair_concurrency
from trainsim.cost.comm import COLLECTIVES, CommParams, NcclComm, port_key
from trainsim.hardware.cluster import get_cluster
from trainsim.sim.engine import run
from trainsim.sim.flows import max_min_rates, resource_loads
from trainsim.strategy.mesh import AXIS_ORDER, DeviceMesh

# --------------------------------------------------------------------------------------------------
# The flow model by hand
# --------------------------------------------------------------------------------------------------


def _graph(n_classes: int, n_resources: int) -> ExecutionGraph:
    g = ExecutionGraph()
    g.classes = [RankClass(f"c{c}", 0, 1, range(c, c + 1)) for c in range(n_classes)]
    for r in range(n_resources):
        g.resource_id(f"link{r}")
    return g


def _flow(g: ExecutionGraph, cls: int, work: dict[int, float], latency_s: float = 0.0,
          deps: list[int] | None = None) -> int:
    """A gradient-stream transfer of `latency_s` plus max(work) seconds alone, loading each resource."""
    dur = latency_s + max(work.values())
    return g.add(f"flow c{cls}", "collective", Stream.GRAD, "dp", dur, (cls,), deps or [],
                 flow_latency_s=latency_s, flow_demand=tuple(sorted(work.items())))


def _ends(g: ExecutionGraph, sharing: bool = True) -> list[float]:
    return run(g, gamma=0.0, p2p_host_sync=False, bandwidth_sharing=sharing).end_s


def test_two_flows_on_one_link_one_starting_later() -> None:
    """A (2 s alone) starts at 0; B (2 s alone) starts at 1 behind a 1 s compute task. Alone A does
    1 s of work by t=1; then both run at 1/2: A's last second takes 2 s (ends 3), B has done 1 s by
    then and finishes its last second alone (ends 4). Off: 2 and 3."""
    g = _graph(2, 1)
    a = _flow(g, 0, {0: 2.0})
    c = g.add("compute", "compute", Stream.COMPUTE, "compute", 1.0, (1,), [])
    b = _flow(g, 1, {0: 2.0}, deps=[c])
    ends = _ends(g)
    assert ends[a] == pytest.approx(3.0, abs=1e-12)
    assert ends[b] == pytest.approx(4.0, abs=1e-12)
    off = _ends(g, sharing=False)
    assert (off[a], off[b]) == pytest.approx((2.0, 3.0), abs=1e-12)


def test_latency_part_loads_no_link() -> None:
    """B starts at 1 with 0.5 s of latency: A runs alone until 1.5 (0.5 s left), then both at 1/2:
    A ends at 2.5; B has 1.5 s of its 2 s left and finishes alone at 4.0."""
    g = _graph(2, 1)
    a = _flow(g, 0, {0: 2.0})
    c = g.add("compute", "compute", Stream.COMPUTE, "compute", 1.0, (1,), [])
    b = _flow(g, 1, {0: 2.0}, latency_s=0.5, deps=[c])
    ends = _ends(g)
    assert ends[a] == pytest.approx(2.5, abs=1e-12)
    assert ends[b] == pytest.approx(4.0, abs=1e-12)


def test_max_min_gives_the_leftover_to_the_flow_bottlenecked_elsewhere() -> None:
    """Link 1 carries B (intensity 1) and C (1): both get 1/2. B also loads link 0 at intensity 1/2,
    i.e. 1/4 of it at its rate, so A (alone on link 0 otherwise) gets the leftover 3/4 - not an equal
    split of link 0. A: 4.5 s alone, 3 s done by t=4 when B and C end (2 s at 1/2), then 1.5 s at full
    speed: ends 5.5."""
    g = _graph(3, 2)
    a = _flow(g, 0, {0: 4.5})
    b = _flow(g, 1, {0: 1.0, 1: 2.0})
    c = _flow(g, 2, {1: 2.0})
    rates = max_min_rates([a, b, c], [((0, 1.0),), ((0, 0.5), (1, 1.0)), ((1, 1.0),)])
    assert rates == pytest.approx({a: 0.75, b: 0.5, c: 0.5})
    ends = _ends(g)
    assert (ends[a], ends[b], ends[c]) == pytest.approx((5.5, 4.0, 4.0), abs=1e-12)


def test_fused_compute_shares_its_links_and_keeps_gamma() -> None:
    """A compute task that absorbed 1 s of TP comm in its 4 s loads its link at 1/4 all the time; a
    gradient flow of 3 s on the same link makes the link 1.25 loaded: both run at 0.8. The compute task
    is also slowed by gamma while the gradient flow runs: rate 0.8 / (1 + gamma)."""
    g = _graph(1, 1)
    comp = g.add("fused", "compute", Stream.COMPUTE, "compute", 4.0, (0,), [], parts={"compute": 3.0, "tp": 1.0},
                 flow_demand=((0, 1.0),))
    grad = g.add("grads", "collective", Stream.GRAD, "dp", 3.0, (0,), [], flow_demand=((0, 3.0),))
    gamma = 0.25
    tr = run(g, gamma=gamma, p2p_host_sync=False)
    # both at 0.8 while together; compute at 0.8 / 1.25 = 0.64 of full speed (gamma on 3/4 of its parts:
    # slow rate 1 / (1 + 0.25 * 0.75)); grad ends at 3 / 0.8 = 3.75 if the compute task is still running
    slow = 1.0 / (1.0 + gamma * 0.75)
    assert tr.end_s[grad] == pytest.approx(3.75, abs=1e-12)
    done_by = 3.75 * 0.8 * slow
    assert tr.end_s[comp] == pytest.approx(3.75 + (4.0 - done_by), abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 4), st.floats(0.01, 1.0)), min_size=0, max_size=3),
                min_size=1, max_size=8))
def test_max_min_rates_are_feasible_and_bottlenecked(flows: list[list[tuple[int, float]]]) -> None:
    demand = [tuple(dict(f).items()) for f in flows]
    rates = max_min_rates(range(len(demand)), demand)
    assert set(rates) == set(range(len(demand)))
    loads = resource_loads(rates, demand)
    assert all(v <= 1.0 + 1e-9 for v in loads.values())
    for f, x in rates.items():
        assert 0.0 < x <= 1.0
        if x < 1.0 - 1e-9:
            # bottlenecked: on some saturated resource, no other flow there runs faster
            assert any(loads[r] >= 1.0 - 1e-9 and all(rates[g] <= x + 1e-9 for g in rates
                                                        if any(q == r for q, _ in demand[g]))
                       for r, _ in demand[f])


# Reference implementations (enumerate every sibling group) that the vectorised counts are checked against

def group_concurrency(groups: list[tuple[int, ...]], group: tuple[int, ...], gpus_per_node: int) -> int:
    """Reference count, by enumeration: how many of `groups` have ranks on a node of `group`."""
    per_node: Counter[int] = Counter()
    for g in groups:
        for node in {r // gpus_per_node for r in g}:
            per_node[node] += 1
    return max((per_node[r // gpus_per_node] for r in group), default=1) or 1


def axes_siblings(mesh: DeviceMesh, axes: tuple[str, ...], stage: int) -> list[tuple[int, ...]]:
    """Every group over `axes` among the ranks of pipeline stage `stage` (one rank class)."""
    per_stage = mesh.world_size // mesh.pp
    seen: dict[int, list[int]] = {}
    strides = [(a, mesh.stride(a)) for a in axes]
    for r in range(stage * per_stage, (stage + 1) * per_stage):  # pp is the outermost mesh axis
        c = mesh.coords(r)
        seen.setdefault(r - sum(c[a] * st for a, st in strides), []).append(r)
    return [tuple(v) for v in seen.values()]


def pair_siblings(mesh: DeviceMesh, stage: int, other: int) -> list[tuple[int, int]]:
    """Each rank of `stage` paired with its peer in stage `other` (pipeline sends, embedding sum)."""
    per_stage = mesh.world_size // mesh.pp
    return [(r, r + (other - stage) * per_stage) for r in range(stage * per_stage, (stage + 1) * per_stage)]


# --------------------------------------------------------------------------------------------------
# The comm model's per-link work and static concurrency
# --------------------------------------------------------------------------------------------------

CLUSTERS = [("dgx-a100", 4), ("dgx-h100", 2), ("dgx1-v100", 4), ("pcie-titanxp", 1), ("pcie-1080ti-10gbe", 4)]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(CLUSTERS), st.sampled_from(COLLECTIVES), st.floats(1.0, 4e9),
       st.integers(0, 5), st.sampled_from([1, 2, 4, 8]), st.integers(1, 8), st.integers(0, 31))
def test_demand_is_consistent_with_time(cluster: tuple[str, int], collective: str, size: float, log_n: int,
                                        stride: int, concurrency: int, start: int) -> None:
    cl = get_cluster(*cluster)
    comm = NcclComm(cl)
    n = min(2 ** log_n, cl.world_size)
    group = tuple(sorted({(start + i * stride) % cl.world_size for i in range(n)}))
    t = comm.time(collective, size, group, concurrency)
    latency, work = comm.demand(collective, size, group, concurrency)
    assert latency >= 0 and all(w > 0 for w in work.values())
    assert latency + max(work.values(), default=0.0) == pytest.approx(t, rel=1e-9, abs=1e-15)
    assert set(work) <= ({"rail", "nic"} | {f"intra{i}:{lv.name}" for i, lv in enumerate(cl.intra_node_levels)}
                         | {port_key(i, lv) for i, lv in enumerate(cl.intra_node_levels) if lv.port_gbps})


def test_static_concurrency_by_hand_dgx1_vs_dgx_a100() -> None:
    """tp=4 x dp=4 on two 8-GPU nodes: the DP group {0, 4, 8, 12} has two ranks on each node, and four
    DP groups sit on every node. They divide the node's NICs: DGX-1's single 12.5 GB/s NIC gives each
    group 12.5 / 4 GB/s (x 0.9 IB efficiency), 4x slower than alone; DGX A100's eight 25 GB/s rails give
    each group min(2 x 25, 8 x 25 / 4) = 50 GB/s either way, so nothing changes."""
    mesh = DeviceMesh(tp=4, dp=4)
    group = tuple(mesh.group_ranks(("dp",), 0))
    assert group == (0, 4, 8, 12)
    siblings = axes_siblings(mesh, ("dp",), 0)
    assert sorted(siblings) == [(0, 4, 8, 12), (1, 5, 9, 13), (2, 6, 10, 14), (3, 7, 11, 15)]
    assert group_concurrency(siblings, group, 8) == 4
    size = 1e9  # all-gather: a ring, Simple protocol; bandwidth part = (n-1)/n * size / node share
    v100 = NcclComm(get_cluster("dgx1-v100", 2), CommParams())
    a100 = NcclComm(get_cluster("dgx-a100", 2), CommParams())
    for comm, alone_gbps, shared_gbps in ((v100, 12.5 * 0.9, 12.5 * 0.9 / 4), (a100, 50 * 0.9, 50 * 0.9)):
        for conc, gbps in ((1, alone_gbps), (4, shared_gbps)):
            _, work = comm.demand("all_gather", size, group, conc)
            assert max(work.values()) == pytest.approx(0.75 * size / (gbps * 1e9), rel=1e-12)
            assert max(work, key=lambda k: work[k]) in ("nic", "rail")
    # pipeline sends of a 2-stage dp=8 job: 8 sender ranks on node 0 share its NICs
    pp_mesh = DeviceMesh(dp=8, pp=2)
    pairs = pair_siblings(pp_mesh, 0, 1)
    assert pairs[0] == (0, 8) and group_concurrency(pairs, (0, 8), 8) == 8


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from([1, 2, 4]), min_size=len(AXIS_ORDER), max_size=len(AXIS_ORDER)),
       st.sampled_from([1, 2, 4, 8, 16]), st.data())
def test_vectorised_concurrency_equals_enumerating_the_groups(sizes: list[int], gpn: int, data: st.DataObject) -> None:
    mesh = DeviceMesh(**dict(zip(AXIS_ORDER, sizes, strict=True)))
    names = AXIS_ORDER
    axes = tuple(a for a in names[:-1] if data.draw(st.booleans()) and mesh.size(a) > 1) or ("dp",)
    stage = data.draw(st.integers(0, mesh.pp - 1))
    rep = mesh.rank({"pp": stage})
    group = tuple(mesh.group_ranks(axes, rep))
    assert axes_concurrency(mesh, axes, stage, group, gpn) == group_concurrency(
        axes_siblings(mesh, axes, stage), group, gpn)
    if mesh.pp > 1:
        other = (stage + 1) % mesh.pp
        pair = (rep, mesh.rank({"pp": other}))
        assert pair_concurrency(mesh, stage, other, pair, gpn) == group_concurrency(
            pair_siblings(mesh, stage, other), pair, gpn)


def test_static_concurrency_slows_dgx1_not_dgx_a100() -> None:
    def it(cluster: str, sharing: bool) -> float:
        return simulate({"model": {"name": "gpt2"}, "cluster": {"name": cluster, "nodes": 2},
                         "strategy": {"tp": 4, "dp": 4, "global_batch": 16},
                         "simulation": {"bandwidth_sharing": sharing}}).iteration_time_s

    assert it("dgx-a100", True) == pytest.approx(it("dgx-a100", False), rel=1e-3)
    assert it("dgx1-v100", True) > 1.15 * it("dgx1-v100", False)  # fp16 on V100: 2-byte gradients


def test_socket_link_divided_among_cross_socket_groups_by_hand() -> None:
    """Proteus Fig. 5(a): on one 8-GPU two-socket box, gradient groups {0,4},{1,5},{2,6},{3,7} all cross
    the QPI link between the sockets at once. pcie-titanxp's QPI level has a 6 GB/s port per socket
    (NCCL BDW_QPI_BW): four groups get 1.5 GB/s each, so the bandwidth part of a 1 GiB all-reduce
    (a 2-rank ring sends the whole buffer once) is exactly 4x its lone value, S / 6 GB/s plus the
    Simple pipeline fill (under 1%). The per-GPU part of the level is unchanged."""
    cl = get_cluster("pcie-titanxp")
    assert cl.intra_node_levels[1].port_gbps == 6.0
    mesh = DeviceMesh(tp=4, dp=2)
    siblings = axes_siblings(mesh, ("dp",), 0)
    assert sorted(siblings) == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert group_concurrency(siblings, (0, 4), 8) == 4
    comm, size = NcclComm(cl, CommParams()), float(2**30)
    port, per_gpu = port_key(1, cl.intra_node_levels[1]), "intra1:qpi"
    alone = comm.demand("all_reduce", size, (0, 4), 1)[1]
    shared = comm.demand("all_reduce", size, (0, 4), 4)[1]
    assert size / 6e9 <= alone[port] <= 1.01 * size / 6e9
    assert shared[port] == pytest.approx(4 * alone[port], rel=1e-12)
    assert shared[per_gpu] == pytest.approx(alone[per_gpu], rel=1e-12) == pytest.approx(alone[port], rel=1e-12)
    # dp=2 x tp=2 x ... : two 4-rank rings {0,2,4,6}, {1,3,5,7} each cross QPI once per direction: 3 GB/s
    two = comm.demand("all_reduce", size, (0, 2, 4, 6), 2)[1]
    assert two[port] == pytest.approx(2 * two[per_gpu], rel=1e-12)
    # all-to-all of 8 ranks: 4 members per socket each send 4/8 of their buffer across: the port carries
    # 4 x 4/8 = 2 buffers against the 7/8 a rank sends in all: 16/7 lone flows at 6 GB/s
    a2a = comm.demand("all_to_all", size, tuple(range(8)), 1)[1]
    assert a2a[port] == pytest.approx(16 / 7 * a2a[per_gpu], rel=1e-12)
    # a group inside one socket never touches the socket link
    assert port not in comm.demand("all_reduce", size, (0, 1), 4)[1]
    # without the port (ASTRA-sim's congestion-free per-NPU dimension) the four groups run at 6 GB/s each
    pcie, qpi = cl.intra_node_levels
    free = NcclComm(replace(cl, levels=(pcie, replace(qpi, port_gbps=None))), CommParams())
    assert free.demand("all_reduce", size, (0, 4), 4)[1] == {per_gpu: pytest.approx(alone[per_gpu], rel=1e-12)}


def test_cross_socket_groups_slow_hybrid_not_pure_dp() -> None:
    """The Fig. 5(a) strategy (dp=2 x tp=4) slows down with sharing on; pure DP (one ring, crossing QPI
    once each way) does not."""
    def it(strategy: dict[str, Any], sharing: bool) -> float:
        return simulate({"model": {"name": "gpt2"}, "cluster": {"name": "pcie-titanxp"},
                         "strategy": {**strategy, "global_batch": 8},
                         "simulation": {"bandwidth_sharing": sharing}}).iteration_time_s

    assert it({"tp": 4}, True) > 1.05 * it({"tp": 4}, False)
    assert it({}, True) == pytest.approx(it({}, False), rel=1e-9)


# --------------------------------------------------------------------------------------------------
# End to end
# --------------------------------------------------------------------------------------------------

JOBS: dict[str, dict[str, Any]] = {
    "titanxp-tp2-pp2": {"cluster": {"name": "pcie-titanxp"}, "strategy": {"tp": 2, "pp": 2, "global_batch": 8}},
    "titanxp-tp4-pp2": {"cluster": {"name": "pcie-titanxp"}, "strategy": {"tp": 4, "pp": 2, "global_batch": 8}},
    "titanxp-dp8": {"cluster": {"name": "pcie-titanxp"}, "strategy": {"global_batch": 8}},
    "titanxp-tp4-dp2": {"cluster": {"name": "pcie-titanxp"}, "strategy": {"tp": 4, "global_batch": 8}},
    "dgx1-tp4-dp4": {"cluster": {"name": "dgx1-v100", "nodes": 2}, "strategy": {"tp": 4, "global_batch": 16}},
    "dgx1-tp2-pp2": {"cluster": {"name": "dgx1-v100", "nodes": 2}, "strategy": {"tp": 2, "pp": 2,
                                                                                 "global_batch": 16}},
    "dgx1-pp2-dp8": {"cluster": {"name": "dgx1-v100", "nodes": 2}, "strategy": {"pp": 2, "global_batch": 16}},
    "a100-tp2-pp2-zero1": {"cluster": {"name": "dgx-a100", "nodes": 2},
                           "strategy": {"tp": 2, "pp": 2, "global_batch": 16, "zero": 1}},
}


def _sim(job: dict[str, Any], **sim: Any):
    return simulate({"model": {"name": "gpt2"}, **job, "simulation": sim})


@pytest.mark.parametrize("name", list(JOBS))
def test_sharing_never_makes_an_iteration_faster(name: str) -> None:
    on, off = _sim(JOBS[name]), _sim(JOBS[name], bandwidth_sharing=False)
    assert on.iteration_time_s >= off.iteration_time_s * (1 - 1e-9)
    assert any(d is not None for d in on.graph.flow_demand) and on.graph.resources
    assert all(d is None for d in off.graph.flow_demand) and not off.graph.resources


@pytest.mark.parametrize("name", ["titanxp-tp2-pp2", "titanxp-tp4-pp2", "titanxp-tp4-dp2", "dgx1-tp4-dp4",
                                  "dgx1-tp2-pp2", "dgx1-pp2-dp8"])
def test_symmetric_and_exact_agree_with_sharing_on(name: str) -> None:
    """Symmetric mode divides the NICs among a stage's identical groups statically; exact mode runs the
    groups as separate flows that share the NIC dynamically. 1e-3: NCCL's algorithm choice is made per
    call from the speed the call sees (shared in symmetric mode, alone in exact mode)."""
    sym = _sim(JOBS[name], granularity="op")
    exact = _sim(JOBS[name], granularity="op", exact=True)
    assert exact.iteration_time_s == pytest.approx(sym.iteration_time_s, rel=1e-3)


def test_switch_in_api_config_and_cli(tmp_path: Path) -> None:
    job = {"model": {"name": "gpt2"}, **JOBS["dgx1-pp2-dp8"]}
    off_cfg = simulate({**job, "simulation": {"bandwidth_sharing": False}}).iteration_time_s
    off_kw = simulate(job, bandwidth_sharing=False).iteration_time_s
    on = simulate(job).iteration_time_s
    assert off_cfg == off_kw < on
    out = tmp_path / "off.json"
    p = subprocess.run([sys.executable, "-m", "trainsim", "simulate", "--model", "gpt2", "--cluster", "dgx1-v100",
                        "--nodes", "2", "--pp", "2", "--global-batch", "16", "--no-bandwidth-sharing", "-q",
                        "--recompute", "none", "--zero", "0",  # flags change the default job: plain settings
                        "--json", str(out)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(out.read_text())["iteration_time_s"] == pytest.approx(off_cfg, rel=1e-12)


def test_default_dtype_follows_the_gpu() -> None:
    """auto: bf16 from Ampere on, fp16 on V100 (tensor cores, no bf16), fp32 on Pascal (no fast half)."""
    from trainsim.hardware.devices import get_device

    assert [get_device(d).training_dtype for d in ("a100-80gb", "h100-sxm", "v100-sxm2-32gb", "titan-xp")] == [
        "bf16", "bf16", "fp16", "fp32"]
    r = simulate({"model": {"name": "gpt2"}, "cluster": {"name": "pcie-titanxp"}, "strategy": {"global_batch": 8}})
    assert r.strategy["dtype"] == "fp32"
    explicit = simulate({"model": {"name": "gpt2"}, "cluster": {"name": "pcie-titanxp"},
                         "strategy": {"global_batch": 8}, "simulation": {"dtype": "fp32"}})
    assert explicit.iteration_time_s == r.iteration_time_s


@settings(max_examples=400, deadline=None)
@given(start=st.integers(0, 200), step=st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16, 64, 128]), n=st.integers(0, 60),
       span=st.sampled_from([1, 2, 3, 4, 6, 8, 16, 72]))
def test_blocks_a_rank_class_touches(start: int, step: int, n: int, span: int) -> None:
    """graph._blocks (a shared link's blocks a rank class uses, by range arithmetic where it can) equals the
    blocks of its ranks one by one."""
    ranks = range(start, start + step * n, step)
    assert set(_blocks(ranks, span)) == {r // span for r in ranks}


def test_disjoint_stages_name_the_shared_links_as_block_by_block(monkeypatch: pytest.MonkeyPatch) -> None:
    """graph._resolve_flows names a shared link (the NICs) per class at once where no node holds two classes'
    ranks (graph._disjoint): the same resources and demands as finding each block's classes one by one."""
    import trainsim.compile.graph as graph_mod

    job = {"model": {"name": "gpt3-1.3b"}, "cluster": {"name": "dgx-a100", "nodes": 8},
           "strategy": {"tp": 8, "pp": 4, "dp": 2, "global_batch": 16}}
    seen: list[bool] = []
    disjoint = graph_mod._disjoint
    monkeypatch.setattr(graph_mod, "_disjoint", lambda blocks: seen.append(disjoint(blocks)) or seen[-1])
    fast = simulate(job, timeline=True).graph
    assert seen and all(seen)  # every stage on nodes of its own
    monkeypatch.setattr(graph_mod, "_disjoint", lambda blocks: False)
    slow = simulate(job, timeline=True).graph
    assert fast is not None and slow is not None
    assert any(r.startswith("nic:") for r in fast.resources)
    assert fast.resources == slow.resources and fast.flow_demand == slow.flow_demand
