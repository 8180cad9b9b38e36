"""Collective cost model: ring closed forms on one NVSwitch node, hierarchical fan-outs, monotonicity."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainsim.cost.comm import COLLECTIVE_BASE_S, HierarchicalAlphaBeta
from trainsim.hardware.cluster import CLUSTERS, get_cluster
from trainsim.strategy.mesh import DeviceMesh

A100 = get_cluster("dgx-a100")
NVS = A100.levels[0]
B_NVS = NVS.bandwidth_gbps * 1e9 * 0.78  # what NCCL reaches on NVSwitch
ALPHA = NVS.latency_s


@pytest.mark.parametrize("size", [1e3, 1e6, 64e6, 1e9])
@pytest.mark.parametrize("n", [2, 4, 8])
def test_single_node_collectives_are_ring_formulas(n: int, size: float) -> None:
    comm = HierarchicalAlphaBeta(A100)
    group = tuple(range(n))
    assert comm.fanouts(group) == [n, 1]
    ar = 2 * (n - 1) / n * size / B_NVS + 2 * (n - 1) * ALPHA + COLLECTIVE_BASE_S
    ag = (n - 1) / n * size / B_NVS + (n - 1) * ALPHA + COLLECTIVE_BASE_S
    assert comm.time("all_reduce", size, group) == pytest.approx(ar, rel=1e-12)
    assert comm.time("all_gather", size, group) == pytest.approx(ag, rel=1e-12)
    assert comm.time("reduce_scatter", size, group) == pytest.approx(ag, rel=1e-12)


def test_point_to_point_and_trivial_groups() -> None:
    comm = HierarchicalAlphaBeta(get_cluster("dgx-a100", 2))
    s = 8e6
    assert comm.time("send_recv", s, (0, 1)) == pytest.approx(COLLECTIVE_BASE_S + ALPHA + s / B_NVS, rel=1e-12)
    ib = comm.cluster.levels[1]
    b_ib = ib.bandwidth_gbps * 1e9 * 0.90
    assert comm.time("send_recv", s, (0, 8)) == pytest.approx(COLLECTIVE_BASE_S + ib.latency_s + s / b_ib, rel=1e-12)
    assert comm.time("all_reduce", s, (3,)) == 0.0  # a group of one moves nothing
    assert comm.time("all_reduce", 0.0, (0, 1)) == 0.0
    with pytest.raises(ValueError, match="unknown collective"):
        comm.time("gossip", s, (0, 1))


def test_strided_groups_fan_out_per_level() -> None:
    """Megatron order puts tp innermost: a tp=8 group fills a node, dp then crosses nodes one GPU each."""
    cl = get_cluster("dgx-a100", 4)
    comm = HierarchicalAlphaBeta(cl)
    mesh = DeviceMesh(tp=8, dp=4)
    tp_group, dp_group = tuple(mesh.group_ranks(("tp",), 0)), tuple(mesh.group_ranks(("dp",), 3))
    assert tp_group == tuple(range(8)) and dp_group == (3, 11, 19, 27)
    assert comm.fanouts(tp_group) == [8, 1]
    assert comm.fanouts(dp_group) == [1, 4]
    ib = cl.levels[1]
    b_ib = ib.bandwidth_gbps * 1e9 * 0.90
    s = 100e6
    expected = 2 * 3 / 4 * s / b_ib + 2 * 3 * ib.latency_s + COLLECTIVE_BASE_S
    assert comm.time("all_reduce", s, dp_group) == pytest.approx(expected, rel=1e-12)

    # tp=2: a dp group of 8 spans 4 GPUs in each of 2 nodes -> fan-outs 4 then 2
    mesh2 = DeviceMesh(tp=2, dp=8)
    g = tuple(mesh2.group_ranks(("dp",), 1))
    assert g == (1, 3, 5, 7, 9, 11, 13, 15)
    assert comm.fanouts(g) == [4, 2]
    comm2 = HierarchicalAlphaBeta(get_cluster("dgx-a100", 2))
    bw = max(2 * 3 / 4 * s / B_NVS, 2 * 1 / 2 * (s / 4) / b_ib)  # the slowest level's share of the data
    lat = 2 * 3 * ALPHA + 2 * 1 * ib.latency_s
    assert comm2.time("all_reduce", s, g) == pytest.approx(COLLECTIVE_BASE_S + lat + bw, rel=1e-12)


def test_cross_socket_pcie_is_slower_than_within_a_switch() -> None:
    comm = HierarchicalAlphaBeta(get_cluster("pcie-titanxp"))
    s = 50e6
    assert comm.fanouts((0, 1, 2, 3)) == [4, 1]
    assert comm.fanouts((0, 4)) == [1, 2]
    assert comm.time("all_reduce", s, (0, 4)) > comm.time("all_reduce", s, (0, 1))


@st.composite
def cluster_and_group(draw: st.DrawFn) -> tuple[HierarchicalAlphaBeta, tuple[int, ...]]:
    name = draw(st.sampled_from(sorted(CLUSTERS)))
    nodes = 1 if name == "pcie-titanxp" else draw(st.integers(2 if name == "pcie-1080ti-10gbe" else 1, 8))
    cl = get_cluster(name, nodes)
    ranks = draw(st.lists(st.integers(0, cl.world_size - 1), min_size=2, max_size=cl.world_size, unique=True))
    return HierarchicalAlphaBeta(cl), tuple(sorted(ranks))


COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce")


@settings(max_examples=200, deadline=None)
@given(cg=cluster_and_group(), a=st.floats(1.0, 1e10), b=st.floats(1.0, 1e10), kind=st.sampled_from(COLLECTIVES))
def test_time_is_monotone_in_size(cg: tuple[HierarchicalAlphaBeta, tuple[int, ...]], a: float, b: float,
                                  kind: str) -> None:
    comm, group = cg
    lo, hi = sorted((a, b))
    assert 0 < comm.time(kind, lo, group) <= comm.time(kind, hi, group)


@settings(max_examples=200, deadline=None)
@given(cg=cluster_and_group(), size=st.floats(1.0, 1e10))
def test_all_reduce_costs_at_least_a_reduce_scatter(cg: tuple[HierarchicalAlphaBeta, tuple[int, ...]],
                                                    size: float) -> None:
    comm, group = cg
    rs = comm.time("reduce_scatter", size, group)
    assert comm.time("all_reduce", size, group) >= rs
    assert comm.time("all_gather", size, group) == pytest.approx(rs, rel=1e-12)
    fan = comm.fanouts(group)
    assert len(fan) == len(comm.cluster.levels)
    prod = 1
    for f in fan:
        prod *= f
    assert prod <= len(group)


@settings(max_examples=100, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), dp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2, 4]),
       data=st.data())
def test_mesh_groups_fan_out_to_their_size(tp: int, dp: int, pp: int, data: st.DataObject) -> None:
    mesh = DeviceMesh(tp=tp, dp=dp, pp=pp)
    cl = get_cluster("dgx-h100", max(1, mesh.world_size // 8))
    comm = HierarchicalAlphaBeta(cl)
    rank = data.draw(st.integers(0, mesh.world_size - 1))
    for axes in (("tp",), ("dp",), ("pp",), ("tp", "dp")):
        group = tuple(mesh.group_ranks(axes, rank))
        assert rank in group and len(group) == mesh.group_size(axes)
        fan = comm.fanouts(group)
        prod = 1
        for f in fan:
            prod *= f
        assert prod == len(group)
