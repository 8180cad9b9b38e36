"""Collective cost models: the NCCL-like model (closed forms, choices, bounds, accuracy on a subset of
the published nccl-tests measurements) and the hierarchical alpha-beta model's ring formulas."""

from __future__ import annotations

import csv
import math
import statistics
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from trainsim.cost.calibration import load_calibration
from trainsim.cost.comm import (
    COLLECTIVE_BASE_S,
    PROTOCOLS,
    CommParams,
    HierarchicalAlphaBeta,
    NcclComm,
    tree_correction,
)
from trainsim.hardware.cluster import CLUSTERS, get_cluster
from trainsim.strategy.mesh import DeviceMesh
from trainsim.validate.collectives import collective_outcomes, parse_fabric

PARAMS = CommParams.model_validate(load_calibration().comm)
A100 = get_cluster("dgx-a100")
MIB = 1 << 20
SUBSET = Path(__file__).parent / "data" / "collectives_subset.csv"


def nccl(cluster_name: str, nodes: int = 1, **kw: object) -> NcclComm:
    return NcclComm(get_cluster(cluster_name, nodes), PARAMS, **kw)  # type: ignore[arg-type]


# -- NcclComm: closed forms -------------------------------------------------------------------------

@pytest.mark.parametrize("size", [256e6, 1e9, 4e9])
def test_large_single_node_all_reduce_is_the_simple_ring_formula(size: float) -> None:
    """2(n-1)/n S / B_eff + baseLat + 2(n-1) hops + the Simple pipeline fill, all from the parameters."""
    n, steps = 8, 14
    bus_gbps = (A100.levels[0].bandwidth_gbps * PARAMS.links["nvlink"].efficiency * PARAMS.simple.bw_factor
                * PARAMS.simple.efficiency)
    lat_us = (PARAMS.launch_us + PARAMS.simple.extra_us + PARAMS.simple.base_ring_us
              + steps * (PARAMS.links["nvlink"].ring_hop_us.simple + PARAMS.simple.extra_hop_us))
    fill_s = steps * min(PARAMS.simple.window_bytes, size / n) / (bus_gbps * 1e9)
    expected = lat_us * 1e-6 + 2 * (n - 1) / n * size / (bus_gbps * 1e9) + fill_s
    choice = nccl("dgx-a100").choose("all_reduce", size, tuple(range(n)))
    assert (choice.algorithm, choice.protocol) == ("ring", "simple")  # A100 has no NVLS
    assert choice.time_s == pytest.approx(expected, rel=1e-12)


def test_forced_protocol_and_algorithm_follow_the_formula() -> None:
    """NCCL_PROTO=LL, NCCL_ALGO=Ring on 4 GPUs: LL's latency and its capped share of the bandwidth."""
    comm = nccl("dgx-a100", protocols=("ll", "simple"), algorithms=("ring",))
    size, n = 64e3, 4
    nvl = PARAMS.links["nvlink"]
    caps = PARAMS.ll.max_busbw_single_node_gbps
    assert isinstance(caps, dict)
    bus = min(300 * nvl.efficiency * PARAMS.ll.bw_factor, caps["a100"]) * PARAMS.ll.efficiency
    lat_us = (PARAMS.launch_us + PARAMS.ll.extra_us + PARAMS.ll.base_ring_us
              + 2 * (n - 1) * (nvl.ring_hop_us.ll + PARAMS.ll.extra_hop_us))
    choice = comm.choose("all_reduce", size, tuple(range(n)))
    assert choice.protocol == "ll"
    assert choice.time_s == pytest.approx(lat_us * 1e-6 + 2 * (n - 1) / n * size / (bus * 1e9), rel=1e-12)


def test_protocol_moves_from_ll_to_simple_as_size_grows() -> None:
    comm = nccl("dgx-a100")
    order = {p: i for i, p in enumerate(PROTOCOLS)}
    picks = [comm.choose("all_reduce", 2.0**k, tuple(range(8))).protocol for k in range(3, 33)]
    assert picks[0] == "ll" and picks[-1] == "simple"
    assert [order[p] for p in picks] == sorted(order[p] for p in picks)  # never back to a lighter protocol


def test_nvls_only_on_nvswitch_gen3_nodes() -> None:
    group = tuple(range(8))
    assert nccl("dgx-h100").choose("all_reduce", 1e9, group).algorithm == "nvls"
    assert nccl("dgx-b200").choose("all_reduce", 1e9, group).algorithm == "nvls"
    for name in ("dgx-h800", "dgx-b300", "gb200-nvl72", "gb300-nvl72"):  # NVSwitch gen3+ too (NVL72: its rack)
        assert nccl(name).choose("all_reduce", 1e9, group).algorithm == "nvls", name
    a100 = nccl("dgx-a100")
    assert {a100.choose("all_reduce", 2.0**k, group).algorithm for k in range(3, 34)} <= {"ring"}
    multi = nccl("dgx-h100", 2).choose("all_reduce", 1e9, tuple(range(16)))
    assert multi.algorithm in ("nvls_tree", "tree", "ring")
    assert nccl("dgx-h100", algorithms=("ring",)).choose("all_reduce", 1e9, group).algorithm == "ring"


# -- NcclComm: multi-node bounds, partial and strided groups, concurrency ---------------------------

@pytest.mark.parametrize("nodes", [2, 4, 8])
def test_multi_node_all_reduce_is_bounded_by_the_nics(nodes: int) -> None:
    """No algorithm beats the classic bound 2(m-1)/m S / (node NIC line rate); faster NICs help."""
    slow = get_cluster("dgx-a100", nodes).customised(nics_per_node=4, nic_gbps=12.5)  # p4d-like EFA rates
    fast = slow.customised(nic_gbps=25.0)
    size, group = 4e9, tuple(range(8 * nodes))
    t_slow = NcclComm(slow, PARAMS).time("all_reduce", size, group)
    t_fast = NcclComm(fast, PARAMS).time("all_reduce", size, group)
    assert t_slow >= 2 * (nodes - 1) / nodes * size / (4 * 12.5e9)
    assert t_slow / t_fast > 1.6  # network-bound: twice the NIC rate, nearly half the time
    assert t_slow > NcclComm(A100, PARAMS).time("all_reduce", size, tuple(range(8)))


def test_groups_inside_a_cluster() -> None:
    """A tp group of 8 in one node costs what the node alone costs; a dp group of 4 with one GPU per node
    rides one rail NIC; rails are private on one-NIC-per-GPU nodes and shared on 4-NIC nodes."""
    cl = get_cluster("dgx-h100", 4)
    mesh = DeviceMesh(tp=8, dp=4)
    tp_group, dp_group = tuple(mesh.group_ranks(("tp",), 0)), tuple(mesh.group_ranks(("dp",), 3))
    assert dp_group == (3, 11, 19, 27)
    size = 256e6
    comm = NcclComm(cl, PARAMS)
    one_node = nccl("dgx-h100")
    assert comm.time("all_reduce", size, tp_group) == one_node.time("all_reduce", size, tuple(range(8)))
    rail_bytes_s = cl.nic_gbps * 1e9
    assert comm.time("all_reduce", size, dp_group) >= 2 * 3 / 4 * size / rail_bytes_s  # one NIC each
    assert comm.time("all_reduce", size, dp_group, concurrency=8) == comm.time("all_reduce", size, dp_group)
    efa = NcclComm(cl.customised(nics_per_node=4, nic_gbps=12.5), PARAMS)
    alone = efa.time("all_reduce", size, dp_group)
    assert efa.time("all_reduce", size, dp_group, concurrency=8) > 1.5 * alone
    # strided: tp=2 leaves a dp group of 8 with 4 GPUs in each of 2 nodes
    g = tuple(DeviceMesh(tp=2, dp=8).group_ranks(("dp",), 1))
    assert g == (1, 3, 5, 7, 9, 11, 13, 15)
    two = NcclComm(get_cluster("dgx-h100", 2), PARAMS)
    assert two.time("all_reduce", size, g) > one_node.time("all_reduce", size, tuple(range(8)))


def test_concurrent_groups_on_the_same_gpus_share_nvlink() -> None:
    comm = nccl("dgx-a100")
    group, size = tuple(range(8)), 1e9
    assert comm.time("all_gather", size, group, concurrency=2) > 1.8 * comm.time("all_gather", size, group)


def test_point_to_point_and_trivial_groups() -> None:
    comm = nccl("dgx-a100", 2)
    s = 64e6
    intra, inter = comm.time("send_recv", s, (0, 1)), comm.time("send_recv", s, (0, 8))
    assert inter > 5 * intra  # a 25 GB/s rail NIC against NVLink
    assert inter >= s / (comm.cluster.nic_gbps * 1e9)
    # a ring shift of 8 GPUs on NVSwitch: every GPU uses its own NVLink ports, as fast as one pair
    assert comm.time("send_recv", s, tuple(range(8))) == pytest.approx(intra, rel=1e-12)
    assert comm.time("all_reduce", s, (3,)) == 0.0  # a group of one moves nothing
    assert comm.time("all_reduce", 0.0, (0, 1)) == 0.0
    with pytest.raises(ValueError, match="unknown collective"):
        comm.time("gossip", s, (0, 1))
    with pytest.raises(ValueError, match="out of range"):
        comm.time("all_reduce", s, (0, 99))


def test_params_are_strict_and_dicts_are_parsed() -> None:
    with pytest.raises(ValidationError):
        CommParams.model_validate({"launch_us": 1.0, "nonsense": 2})
    with pytest.raises(ValidationError):
        CommParams.model_validate({"links": {"nvlink": PARAMS.links["nvlink"].model_dump()}})  # no pcie, ib
    with pytest.raises(ValueError):
        NcclComm(A100, PARAMS, protocols=("ll", "ll256"))
    with pytest.raises(ValueError):
        NcclComm(A100, PARAMS, algorithms=())
    ll_only = NcclComm(A100, PARAMS, protocols=("LL",))  # NCCL_PROTO=LL: only LL for collectives
    assert {ll_only.choose("all_reduce", 2.0**k, tuple(range(8))).protocol for k in range(3, 34)} == {"ll"}
    two = get_cluster("dgx-a100", 2)  # LL128 does not cross InfiniBand here: NCCL falls back to Simple
    assert NcclComm(two, PARAMS, protocols=("ll128",)).choose("all_reduce", 1e6, (0, 8)).protocol == "simple"
    from_dict = NcclComm(A100, load_calibration().comm)
    assert from_dict.time("all_reduce", 1e6, tuple(range(8))) == nccl("dgx-a100").time("all_reduce", 1e6,
                                                                                      tuple(range(8)))
    assert NcclComm(A100).params == PARAMS  # None: the packaged calibration


# -- NcclComm: properties over random clusters and groups -------------------------------------------

@st.composite
def cluster_and_group(draw: st.DrawFn) -> tuple[NcclComm, tuple[int, ...]]:
    name = draw(st.sampled_from(sorted(CLUSTERS)))
    nodes = 1 if name == "pcie-titanxp" else draw(st.integers(2 if name == "pcie-1080ti-10gbe" else 1, 8))
    cl = get_cluster(name, nodes)
    ranks = draw(st.lists(st.integers(0, cl.world_size - 1), min_size=2, max_size=cl.world_size, unique=True))
    return NcclComm(cl, PARAMS), tuple(sorted(ranks))


ALL_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce",
                   "send_recv")


@settings(max_examples=300, deadline=None)
@given(cg=cluster_and_group(), a=st.floats(1.0, 1e10), b=st.floats(1.0, 1e10),
       kind=st.sampled_from(ALL_COLLECTIVES), conc=st.integers(1, 4))
def test_nccl_time_is_monotone_in_size(cg: tuple[NcclComm, tuple[int, ...]], a: float, b: float, kind: str,
                                       conc: int) -> None:
    """Every option NCCL could run takes longer for more bytes; NCCL's choice may switch to a faster option
    as the size grows (as measured curves dip at protocol switches), but never to one faster than the
    fastest option was at the smaller size, and it is monotone while the choice stays."""
    comm, group = cg
    lo, hi = sorted((a, b))
    small, large = comm.options(kind, lo, group, conc), comm.options(kind, hi, group, conc)
    by_name = {o[0][:2]: o[0].time_s for o in small}
    for choice, _ in large:  # (p2p offers LL only up to NCCL_P2P_LL_THRESHOLD)
        if choice[:2] in by_name:
            assert by_name[choice[:2]] <= choice.time_s
    t_lo, t_hi = comm.choose(kind, lo, group, conc), comm.choose(kind, hi, group, conc)
    assert t_lo.time_s > 0
    assert t_hi.time_s >= min(by_name.values())
    if t_lo[:2] == t_hi[:2]:
        assert t_lo.time_s <= t_hi.time_s


@settings(max_examples=200, deadline=None)
@given(cg=cluster_and_group(), size=st.floats(1.0, 1e10))
def test_all_reduce_costs_at_least_a_reduce_scatter(cg: tuple[NcclComm, tuple[int, ...]],
                                                    size: float) -> None:
    """Ring all-reduce = ring reduce-scatter + all-gather, so it never costs less; inside one node that holds
    for NCCL's whole choice (NVLS included). Across nodes a tree all-reduce can beat a ring reduce-scatter
    on latency at small sizes (as in NCCL), so there the ring-only model is compared."""
    comm, group = cg
    ring = NcclComm(comm.cluster, PARAMS, algorithms=("ring",))
    assert ring.time("all_reduce", size, group) >= ring.time("reduce_scatter", size, group)
    gpn = comm.cluster.gpus_per_node
    local = tuple(r for r in group if r // gpn == group[0] // gpn)
    if len(local) > 1:
        assert comm.time("all_reduce", size, local) >= comm.time("reduce_scatter", size, local)
    assert comm.time("all_gather", size, group) == pytest.approx(comm.time("reduce_scatter", size, group))


# -- validation against published nccl-tests measurements (fixed subset; CI has no shared/) ---------

def test_collectives_subset_meets_the_accuracy_targets() -> None:
    with SUBSET.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert len({r["source_id"] for r in rows}) >= 8
    outs = collective_outcomes(rows, load_calibration())
    assert [o.row for o in outs] == list(range(len(rows)))
    assert not [o for o in outs if o.skipped]
    big = [abs(o.error_pct) for o, r in zip(outs, rows, strict=True) if float(r["size_bytes"]) >= MIB]
    small = [abs(o.error_pct) for o, r in zip(outs, rows, strict=True) if float(r["size_bytes"]) < MIB]
    assert big and small
    assert statistics.median(big) <= 10.0
    assert statistics.median(small) <= 25.0
    for o in outs:
        assert o.metric == "time_us" and o.throughput_pred and o.throughput_meas
        assert math.isclose(o.throughput_pred * o.predicted, o.throughput_meas * o.measured, rel_tol=1e-9)
    forced = [o for o, r in zip(outs, rows, strict=True) if "NCCL_PROTO=simple" in r["algo_proto_or_env"]]
    assert forced and all(o.tags["protocol"] == "simple" for o in forced)


def test_collective_rows_that_cannot_be_expressed_are_skipped_with_a_reason() -> None:
    with SUBSET.open(newline="") as f:
        row = next(csv.DictReader(f))
    rows = [dict(row, gpu="MI300X"), dict(row, collective="gossip"), dict(row, n_gpus="12"),
            dict(row, time_us="n/a"), row]
    outs = collective_outcomes(rows, load_calibration())
    assert [bool(o.skipped) for o in outs] == [True, True, True, True, False]
    assert "preset" in outs[0].skipped and "gossip" in outs[1].skipped


def test_fabric_strings() -> None:
    assert parse_fabric("EFA 4x100G/node") == ("efa", 4, 12.5)
    assert parse_fabric("TCPXO 8x200G/node") == ("tcpxo", 8, 25.0)
    assert parse_fabric("IB 400G (8 NICs/node assumed)") == ("infiniband", 8, 50.0)
    assert parse_fabric("-") is None and parse_fabric("unknown") is None


# -- HierarchicalAlphaBeta (the earlier model) ------------------------------------------------------

NVS = A100.levels[0]
B_NVS = NVS.bandwidth_gbps * 1e9 * 0.78  # its NVSwitch efficiency
ALPHA = NVS.latency_s


@pytest.mark.parametrize("size", [1e3, 1e6, 64e6, 1e9])
@pytest.mark.parametrize("n", [2, 4, 8])
def test_alpha_beta_single_node_collectives_are_ring_formulas(n: int, size: float) -> None:
    comm = HierarchicalAlphaBeta(A100)
    group = tuple(range(n))
    assert comm.fanouts(group) == [n, 1]
    ar = 2 * (n - 1) / n * size / B_NVS + 2 * (n - 1) * ALPHA + COLLECTIVE_BASE_S
    ag = (n - 1) / n * size / B_NVS + (n - 1) * ALPHA + COLLECTIVE_BASE_S
    assert comm.time("all_reduce", size, group) == pytest.approx(ar, rel=1e-12)
    assert comm.time("all_gather", size, group) == pytest.approx(ag, rel=1e-12)
    assert comm.time("reduce_scatter", size, group) == pytest.approx(ag, rel=1e-12)


def test_alpha_beta_strided_groups_fan_out_per_level() -> None:
    cl = get_cluster("dgx-a100", 4)
    comm = HierarchicalAlphaBeta(cl)
    dp_group = tuple(DeviceMesh(tp=8, dp=4).group_ranks(("dp",), 3))
    assert comm.fanouts(dp_group) == [1, 4]
    ib = cl.levels[1]
    s = 100e6
    expected = 2 * 3 / 4 * s / (ib.bandwidth_gbps * 1e9 * 0.90) + 2 * 3 * ib.latency_s + COLLECTIVE_BASE_S
    assert comm.time("all_reduce", s, dp_group) == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match="unknown collective"):
        comm.time("gossip", s, (0, 1))


def test_renamed_network_level_picks_its_fabric_constants() -> None:
    """collective_outcomes names the network level after the fabric (efa, tcpxo): its constants apply."""
    cl = get_cluster("dgx-a100", 2)
    efa = replace(cl, levels=(cl.levels[0], replace(cl.levels[1], name="efa")))
    group = tuple(range(16))
    on_efa, on_ib = NcclComm(efa, PARAMS, protocols=("simple",)), NcclComm(cl, PARAMS, protocols=("simple",))
    links = PARAMS.links
    tree_gap_s = 2 * (links["efa"].tree_hop_us.simple - links["infiniband"].tree_hop_us.simple) * 1e-6
    assert on_efa.choose("all_reduce", 1e9, group).algorithm == "tree"
    big = on_efa.time("all_reduce", 1e9, group) - on_ib.time("all_reduce", 1e9, group)
    assert big >= tree_gap_s - 1e-12  # the slower fabric pays its own tree hop latency (and efficiency)


# -- NCCL's choice (its own estimate) and the calibrated time of that choice ------------------------

def test_ring_all_reduce_sits_between_the_bus_bandwidth_bounds() -> None:
    """A ring all-reduce moves 2(n-1)/n of the buffer through every GPU's link: never faster than that at the
    NVLink line rate, and within the calibrated efficiency, NCCL's latency and the pipeline fill of it."""
    size = 2.0**32
    for n in (2, 4, 8):
        comm = nccl("dgx-a100", protocols=("simple",), algorithms=("ring",))
        t = comm.time("all_reduce", size, tuple(range(n)))
        line_s = 2 * (n - 1) / n * size / (A100.levels[0].bandwidth_gbps * 1e9)
        eff = PARAMS.links["nvlink"].efficiency * PARAMS.simple.efficiency
        steps = 2 * (n - 1)
        lat_s = 1e-6 * (PARAMS.launch_us + PARAMS.simple.extra_us + PARAMS.simple.base_ring_us
                        + steps * (PARAMS.links["nvlink"].ring_hop_us.simple + PARAMS.simple.extra_hop_us))
        fill_s = steps * PARAMS.simple.window_bytes / (A100.levels[0].bandwidth_gbps * eff * 1e9)
        assert line_s < t <= line_s / eff + lat_s + fill_s + 1e-12
        assert t == pytest.approx(line_s / eff + lat_s + fill_s, rel=1e-9)  # 2^32 / n exceeds the window


def test_choice_is_the_minimum_of_nccls_estimates() -> None:
    """NCCL picks by its own model; the returned time is the calibrated time of that option."""
    for name, nodes in (("dgx-a100", 1), ("dgx-h100", 1), ("dgx-h100", 2), ("dgx-a100", 4)):
        comm = nccl(name, nodes)
        group = tuple(range(comm.cluster.world_size))
        for k in range(3, 34, 2):
            options = comm.options("all_reduce", 2.0**k, group)
            picked = min(options, key=lambda o: o[1])[0]
            assert comm.choose("all_reduce", 2.0**k, group) == picked


@pytest.mark.parametrize(("name", "nodes"), [("dgx-a100", 1), ("dgx-h100", 1), ("dgx-a100", 2), ("dgx-h100", 2),
                                             ("dgx-h100", 8), ("dgx-b200", 1)])
def test_switch_points_move_to_heavier_protocols_as_size_grows(name: str, nodes: int) -> None:
    """LL, then LL128, then Simple (NVLS and NVLS-tree run Simple): NCCL's choice never returns to a lighter
    protocol, and latency-bound algorithms (ring/tree LL) give way to bandwidth-bound ones."""
    comm = nccl(name, nodes)
    group = tuple(range(comm.cluster.world_size))
    order = {p: i for i, p in enumerate(PROTOCOLS)}
    picks = [comm.choose("all_reduce", 2.0**k, group) for k in range(3, 35)]
    ranks = [order[c.protocol] for c in picks]
    assert ranks == sorted(ranks)
    assert picks[0].protocol == "ll" and picks[-1].protocol == "simple"


def test_h100_switches_from_ring_ll_to_nvls_where_nccls_estimates_cross() -> None:
    """Analytic crossover on one H100 node: ring LL (baseLat + 14 hops, busBw/2 capped by llMaxBws, algbw =
    busbw x 8/14) against NVLS (hwLat 25 us, 5/6 of the NVLink bandwidth)."""
    h100 = get_cluster("dgx-h100")
    comm = NcclComm(h100, PARAMS)
    nvl = PARAMS.links["nvlink"]
    link = h100.levels[0].bandwidth_gbps * nvl.efficiency
    caps = PARAMS.ll.max_busbw_single_node_gbps
    assert isinstance(caps, dict)
    ll_lat = PARAMS.ll.base_ring_us + 14 * nvl.ring_hop_us.ll
    ll_algbw = min(link * PARAMS.ll.bw_factor, caps["h100"]) * 8 / 14
    nvls_algbw = link * PARAMS.nvls.nccl_ratio
    cross = (PARAMS.nvls.hop_us - ll_lat) * 1e3 / (1 / ll_algbw - 1 / nvls_algbw)  # bytes
    group = tuple(range(8))
    assert comm.choose("all_reduce", cross * 0.98, group)[:2] == ("ring", "ll")
    assert comm.choose("all_reduce", cross * 1.02, group)[:2] == ("nvls", "simple")
    assert 2e5 < cross < 4e6  # NCCL hands H100 all-reduces to NVLS from about a megabyte


def test_nccl_release_gates_algorithms_and_tables() -> None:
    """NVLS from 2.17, NVLS-tree from 2.18; 2.18-2.22 tables (ring LL busBw/4, tree Simple hop 28 us)."""
    one, two = tuple(range(8)), tuple(range(16))
    assert nccl("dgx-h100", nccl_version="2.16.5").choose("all_reduce", 1e9, one).algorithm == "ring"
    assert nccl("dgx-h100", nccl_version="2.17.1").choose("all_reduce", 1e9, one).algorithm == "nvls"
    old = nccl("dgx-h100", 2, nccl_version="2.17.1")
    assert "nvls_tree" not in {c.algorithm for c, _ in old.options("all_reduce", 1e9, two)}
    assert "nvls_tree" in {c.algorithm for c, _ in nccl("dgx-h100", 2).options("all_reduce", 1e9, two)}
    legacy = old.p
    assert legacy.ll.bw_factor == 0.25 and legacy.links["nvlink"].tree_hop_us.simple == 28.0
    assert legacy.simple.base_tree_us == 0.0 and legacy.nvls.hop_us == 23.0
    assert nccl("dgx-h100", nccl_version="unknown (pip)").p == PARAMS  # no release read: current tables
    assert nccl("dgx-h100", nccl_version="2.23.4").p == PARAMS


def test_one_thread_driving_several_gpus_adds_their_serial_launches() -> None:
    """nccl-tests -g 8: one thread launches the 8 ranks' kernels one after another."""
    group = tuple(range(8))
    for size in (8.0, 1e6, 1e9):
        alone = nccl("dgx-a100").choose("all_reduce", size, group)
        threaded = nccl("dgx-a100", gpus_per_thread=8).choose("all_reduce", size, group)
        assert threaded[:2] == alone[:2]
        assert threaded.time_s - alone.time_s == pytest.approx(7 * PARAMS.serial_launch_us * 1e-6, rel=1e-9)
    with pytest.raises(ValueError):
        nccl("dgx-a100", gpus_per_thread=0)


def test_tree_correction_is_nccls_table_at_powers_of_two() -> None:
    """NCCL's treeCorrectionFactor (tuning.cc) at 64 B x 2^i, interpolated in between, 1 from 512 MB."""
    assert tree_correction("simple", 64 * 2**11) == pytest.approx(0.5)
    assert tree_correction("ll", 64 * 2**12) == pytest.approx(0.4)
    assert tree_correction("ll128", 64 * 2**16) == pytest.approx(0.8)
    assert tree_correction("simple", 64 * 2**11.5) == pytest.approx(0.5)
    assert tree_correction("ll", 64 * 2**12.5) == pytest.approx(0.4)
    assert tree_correction("ll", 64 * 2**13.5) == pytest.approx(0.45)
    assert tree_correction("simple", 8.0) == pytest.approx(0.9)
    assert tree_correction("simple", 2.0**30) == 1.0


def test_forced_algorithm_and_protocol_rows_are_honoured() -> None:
    """A row's NCCL_ALGO / NCCL_PROTO restricts NCCL's choice as the environment variables do."""
    with SUBSET.open(newline="") as f:
        base = next(r for r in csv.DictReader(f) if r["source_id"] == "S16")
    sizes = ("1048576", "67108864", "4294967296")
    settings_ = {"NCCL_ALGO=Ring": ("ring", None), "NCCL_ALGO=Tree": ("tree", None),
                 "NCCL_ALGO=NVLSTree": ("nvls_tree", "simple"), "NCCL_ALGO=Ring NCCL_PROTO=LL": ("ring", "ll"),
                 "NCCL_PROTO=Simple": (None, "simple")}
    rows = [dict(base, size_bytes=s, algo_proto_or_env=env) for env in settings_ for s in sizes]
    outs = collective_outcomes(rows, load_calibration())
    assert not [o for o in outs if o.skipped]
    for o, r in zip(outs, rows, strict=True):
        algo, proto = settings_[r["algo_proto_or_env"]]
        assert algo is None or o.tags["algorithm"] == algo
        assert proto is None or o.tags["protocol"] == proto
    bad = collective_outcomes([dict(base, algo_proto_or_env="NCCL_ALGO=Pat")], load_calibration())
    assert bad[0].skipped and "cannot honour" in bad[0].skipped


def test_dgx_b200_preset_carries_the_datasheet_figures() -> None:
    """DGX B200: NVLink5 900 GB/s per direction per GPU, 8x 400 Gb/s ConnectX-7; B200 dense BF16 2.25 PF,
    FP8 4.5 PF, 180 GB HBM3e at 8 TB/s (NVIDIA DGX B200 / HGX datasheets); NVLS runs there, with Blackwell's
    LL cap (llMaxBws 2 x 141 GB/s)."""
    b200 = get_cluster("dgx-b200")
    assert (b200.levels[0].bandwidth_gbps, b200.nics_per_node, b200.nic_gbps) == (900.0, 8, 50.0)
    dev = b200.device
    assert (dev.peak_tflops["bf16"], dev.peak_tflops["fp8"], dev.hbm_gbps) == (2250.0, 4500.0, 8000.0)
    comm = NcclComm(b200, PARAMS)
    assert comm.choose("all_reduce", 1e9, tuple(range(8))).algorithm == "nvls"
    assert comm._single_node_cap(PARAMS.ll) == 282.0
    assert NcclComm(get_cluster("dgx1-v100"), PARAMS)._single_node_cap(PARAMS.ll) == 39.0
