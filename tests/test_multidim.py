"""Multi-dimensional topology-aware collectives (trainsim.cost.multidim) and `trainsim collective`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainsim.cli import main
from trainsim.cost.comm import NcclComm
from trainsim.cost.microbench import nccl_collective, parse_bytes
from trainsim.cost.multidim import (
    AnalyticalComm,
    Dimension,
    bus_factor,
    phase_cost,
    run_collective,
    send_recv,
)
from trainsim.hardware.cluster import CLUSTERS, Level, get_cluster
from trainsim.hardware.topology import (
    GIB_PER_S_IN_GBPS,
    TOPOLOGY_PRESETS,
    cluster_from_topology,
    cluster_topology,
    fanouts,
    parse_topology,
    resolve_topology,
)

GIB = 2**30


def dims_of(spec: str, bw: list[float], lat_ns: float = 0.0) -> list[Dimension]:
    return [Dimension.of(lv) for lv in parse_topology(spec, bw, [lat_ns] * len(bw))]


sizes = st.lists(st.integers(2, 9), min_size=1, max_size=4)


@given(sizes)
def test_all_reduce_bytes_per_dimension_follow_the_hierarchical_closed_form(ks: list[int]) -> None:
    # reduce-scatter up the dimensions, all-gather back down: dimension i carries 2 S (k_i-1)/k_i / prod_{j<i} k_j
    spec = "_".join(f"Ring({k})" for k in ks)
    res = run_collective("all_reduce", GIB, dims_of(spec, [100.0] * len(ks)), chunks=4)
    for i, d in enumerate(res.per_dim):
        expected = 2 * GIB * (ks[i] - 1) / ks[i] / math.prod(ks[:i])
        assert d.bytes_sent == pytest.approx(expected, rel=1e-12)


@given(sizes, st.sampled_from(["all_gather", "reduce_scatter"]))
def test_gather_and_scatter_move_half_of_an_all_reduce(ks: list[int], op: str) -> None:
    spec = "_".join(f"Switch({k})" for k in ks)
    dims = dims_of(spec, [50.0] * len(ks))
    half = run_collective(op, GIB, dims, chunks=2)
    full = run_collective("all_reduce", GIB, dims, chunks=2)
    for a, b in zip(half.per_dim, full.per_dim, strict=True):
        assert a.bytes_sent == pytest.approx(b.bytes_sent / 2, rel=1e-12)


def test_one_ring_one_chunk_is_the_ring_formula() -> None:
    k, s, bw, lat = 8, 64e6, 100.0, 1e-6
    dims = [Dimension("ring", k, bw, lat, "ring")]
    t = run_collective("all_reduce", s, dims, chunks=1).time_s
    assert t == pytest.approx(2 * (k - 1) / k * s / (bw * 1e9) + 2 * (k - 1) * lat, rel=1e-12)


def test_chunks_pipeline_on_one_dimension_pay_latency_once() -> None:
    # the link is busy only for the bytes; step latencies delay a chunk, not the link
    k, s, bw, lat, c = 4, 1e8, 50.0, 2e-6, 16
    dims = [Dimension("switch", k, bw, lat, "halving_doubling")]
    t = run_collective("reduce_scatter", s, dims, chunks=c).time_s
    assert t == pytest.approx((k - 1) / k * s / (bw * 1e9) + 2 * 2 * lat, rel=1e-12)


def test_slowest_dimension_dominates_and_more_chunks_approach_it() -> None:
    dims = dims_of("Ring(2)_FC(8)_Ring(8)_Switch(4)", [1000.0, 200.0, 100.0, 50.0])
    loads = run_collective("all_reduce", GIB, dims, chunks=1).per_dim
    bottleneck = max(d.busy_s for d in loads)
    times = [run_collective("all_reduce", GIB, dims, chunks=c).time_s for c in (1, 8, 64, 512)]
    assert all(t >= bottleneck * (1 - 1e-12) for t in times)
    assert times == sorted(times, reverse=True)
    assert times[-1] < bottleneck * 1.01


@pytest.mark.parametrize("name", ["wafer-1d-350", "wafer-1d-600"])
def test_themis_gives_nothing_on_one_dimension(name: str) -> None:
    dims = [Dimension.of(lv) for lv in TOPOLOGY_PRESETS[name].levels()]
    base = run_collective("all_reduce", GIB, dims, "baseline").time_s
    assert run_collective("all_reduce", GIB, dims, "themis").time_s == pytest.approx(base, rel=1e-12)


@pytest.mark.parametrize("name", ["wafer-2d", "conv-3d", "conv-4d"])
def test_themis_balances_multi_dimensional_topologies(name: str) -> None:
    pre = TOPOLOGY_PRESETS[name]
    dims = [Dimension.of(lv) for lv in pre.levels()]
    base = run_collective("all_reduce", GIB, dims, "baseline")
    themis = run_collective("all_reduce", GIB, dims, "themis")
    assert themis.time_s < base.time_s / 1.1
    # ideal: every dimension busy all the time = total bytes over the sum of bandwidths
    n = math.prod(d.size for d in dims)
    ideal = 2 * GIB * (n - 1) / n / (sum(d.bandwidth_gbps for d in dims) * 1e9)
    assert themis.time_s < ideal * 1.1
    busy = [d.busy_s for d in themis.per_dim]
    assert max(busy) / min(busy) < 1.1  # load is balanced across dimensions


def test_in_switch_all_reduce_sends_the_buffer_once() -> None:
    assert phase_cost("in_switch", "ar", 8, 1e6) == (1e6, 1)
    assert phase_cost("ring", "ar", 8, 1e6) == (pytest.approx(2 * 7 / 8 * 1e6), 14)
    assert phase_cost("halving_doubling", "rs", 8, 1e6) == (pytest.approx(7 / 8 * 1e6), 3)
    ring = run_collective("all_reduce", 1e9, [Dimension("switch", 8, 100.0, 0.0, "ring")], chunks=1).time_s
    nvls = run_collective("all_reduce", 1e9, [Dimension("switch", 8, 100.0, 0.0, "in_switch")], chunks=1).time_s
    assert ring / nvls == pytest.approx(2 * 7 / 8)


def test_switch_only_algorithms_are_refused_elsewhere() -> None:
    with pytest.raises(ValueError, match="needs a Switch dimension") as err:
        Dimension.of(Level("d", "ring", 4, 10.0, 0.0), "in_switch")
    assert "\n" not in str(err.value)


def test_send_recv_crosses_the_dimensions_where_coordinates_differ() -> None:
    dims = dims_of("Ring(8)_Switch(4)", [100.0, 25.0], lat_ns=1000.0)
    r = send_recv(1e8, dims, 0, 6)  # same switch port group, ring distance 2 the short way
    assert r.time_s == pytest.approx(2e-6 + 1e8 / 100e9)
    r = send_recv(1e8, dims, 0, 8 * 3 + 1)  # one ring hop and one switch crossing (2 hops)
    assert r.time_s == pytest.approx(3e-6 + 1e8 / 25e9)
    assert [d.bytes_sent for d in r.per_dim] == [1e8, 1e8]


def test_bus_factors_are_nccl_tests() -> None:
    assert bus_factor("all_reduce", 8) == pytest.approx(1.75)
    assert bus_factor("all_gather", 8) == pytest.approx(0.875)
    assert bus_factor("broadcast", 8) == 1.0


def test_groups_use_only_the_dimensions_they_span() -> None:
    levels = parse_topology("Switch(8)_Switch(4)", [300.0, 25.0], [1000.0, 5000.0])
    assert fanouts(levels, range(8)) == [8, 1]
    assert fanouts(levels, [0, 8, 16, 24]) == [1, 4]
    m = AnalyticalComm(levels)
    inner = m.run("all_reduce", 1e8, tuple(range(8)))
    assert inner.per_dim[1].bytes_sent == 0
    assert inner.time_s == pytest.approx(m.time("all_reduce", 1e8, tuple(range(8))))
    assert m.time("all_reduce", 1e8, (0, 8, 16, 24)) > inner.time_s  # the network is 12x slower


def test_sixteen_cubed_torus_runs() -> None:
    m = AnalyticalComm(parse_topology("Ring(16)_Ring(16)_Ring(16)", [100.0] * 3, [500.0] * 3))
    r = m.run("all_reduce", 1e6, tuple(range(4096)))
    assert r.npus == 4096 and r.time_s > 0


def test_presets_and_clusters_have_topologies() -> None:
    for name in TOPOLOGY_PRESETS:
        assert math.prod(lv.size for lv in resolve_topology(name)) >= 8
    for name in CLUSTERS:
        cl = get_cluster(name, 2) if get_cluster(name).has_network else get_cluster(name)
        spec = cluster_topology(cl)
        levels = resolve_topology(spec, [lv.bandwidth_gbps for lv in cl.levels if lv.size > 1],
                                  [lv.latency_s * 1e9 for lv in cl.levels if lv.size > 1])
        assert math.prod(lv.size for lv in levels) == cl.world_size
    assert cluster_topology(get_cluster("dgx-a100", 1)) == "Switch(8)"  # a one-node network is left out
    assert TOPOLOGY_PRESETS["conv-4d"].levels()[0].bandwidth_gbps == pytest.approx(250 * GIB_PER_S_IN_GBPS)


def test_cluster_from_topology_puts_the_last_dimension_on_the_network() -> None:
    cl = cluster_from_topology(parse_topology("Ring(2)_FC(8)_Switch(4)", [100, 50, 25], [1, 1, 1]))
    assert (cl.gpus_per_node, cl.nodes, cl.world_size) == (16, 4, 64)
    assert cl.network_level is not None and cl.network_level.bandwidth_gbps == 25
    box = cluster_from_topology(parse_topology("Ring(8)", [100], [1]))
    assert (box.nodes, box.has_network) == (1, False)


def test_resolve_topology_errors_name_the_fix() -> None:
    with pytest.raises(ValueError, match="equal 256"):
        resolve_topology("conv-4d", npus=256)
    with pytest.raises(ValueError, match="needs --bandwidth"):
        resolve_topology("Ring(4)")


def test_parse_bytes() -> None:
    assert parse_bytes("1073741824") == GIB
    assert parse_bytes("1GiB") == GIB and parse_bytes("64MiB") == 64 * 2**20 and parse_bytes("1e9") == 1e9
    for bad in ("lots", "1XB", "-5"):
        with pytest.raises(ValueError):
            parse_bytes(bad)


def test_nccl_mode_reports_levels() -> None:
    cl = get_cluster("dgx-a100", 8)
    rep = nccl_collective("all_reduce", 2**28, cl, 64)
    assert rep.result.time_s == pytest.approx(NcclComm(cl).time("all_reduce", 2**28, tuple(range(64))))
    assert len(rep.result.per_dim) == 2 and rep.result.per_dim[1].bytes_sent > 0


def test_cli_collective_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "c.json"
    main(["collective", "--op", "all_gather", "--bytes", "1073741824", "--topology", "Ring(2)_FC(8)_Ring(8)_Switch(4)",
          "--bandwidth", "1000,200,100,50", "--latency", "500,500,500,500", "--scheduler", "themis",
          "--json", str(out)])
    data = json.loads(out.read_text())
    assert {"time_us", "algbw_gbps", "busbw_gbps", "per_dim"} <= set(data)
    assert data["algbw_gbps"] == pytest.approx(2**30 / (data["time_us"] * 1e-6) / 1e9)
    assert sum(d["bytes"] for d in data["per_dim"]) == pytest.approx(
        sum(2**30 * (k - 1) / k / math.prod([2, 8, 8, 4][i + 1:]) for i, k in enumerate([2, 8, 8, 4])))
    main(["collective", "--cluster", "dgx-h100", "--ranks", "16", "--bytes", "64MiB"])
    assert "busbw" in capsys.readouterr().out


@pytest.mark.parametrize("args", [
    ["--topology", "Ring(4)_Torus(2)", "--bandwidth", "1,1", "--latency", "1,1"],
    ["--topology", "conv-4d", "--ranks", "100"],
    ["--topology", "Ring(4)", "--bandwidth", "1,2", "--latency", "1"],
    ["--topology", "Ring(4)", "--bandwidth", "1", "--latency", "1", "--bytes", "many"],
    ["--topology", "Ring(4)", "--bandwidth", "1", "--latency", "1", "--algorithms", "in_switch"],
    ["--cluster", "dgx-a100", "--ranks", "1"],
    ["--op", "gather", "--topology", "conv-3d"],
])
def test_cli_collective_bad_input_is_one_line(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["collective", *args])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err and "Traceback" not in err


@settings(max_examples=30)
@given(sizes, st.sampled_from(["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"]),
       st.sampled_from(["baseline", "themis"]))
def test_time_is_at_least_the_busiest_dimension(ks: list[int], op: str, sched: str) -> None:
    spec = "_".join(f"Switch({k})" for k in ks)
    dims = dims_of(spec, [float(10 * (i + 1)) for i in range(len(ks))], lat_ns=100.0)
    r = run_collective(op, 1e8, dims, sched, chunks=8)
    assert r.time_s >= max(d.busy_s for d in r.per_dim) * (1 - 1e-12)
    assert r.time_s <= sum(d.busy_s for d in r.per_dim) + 1e-3
