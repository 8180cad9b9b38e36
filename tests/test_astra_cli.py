"""ASTRA-sim's own input files through `trainsim astra run`, `collective --astra-network`, `chakra run
--topology`, `simulate --semantics astra` and `--cluster conv-4d`: known answers and one-line refusals."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from cli_helpers import one_line_error

from trainsim.astra_inputs import AstraSystem, load_network, load_remote_memory, load_system, network_of
from trainsim.cli import main
from trainsim.errors import ConfigError
from trainsim.hardware.memory_systems import MemoryAccess
from trainsim.hardware.topology import GIB_PER_S_IN_GBPS

DATA = Path(__file__).parent / "data" / "astra"
GIB = 2**30


def ring8_allreduce_ns(size: int, chunks: int, bw_gib: float = 50.0, lat_ns: float = 500.0, e: float = 10.0,
                       lmb: float = 1600.0) -> float:
    """The reference's worked formula: C chunks x (14 steps + 7 reductions + one phase delay)."""
    msg = size // chunks // 8
    step = math.floor(lat_ns + msg / (bw_gib * 2**30 / 1e9)) + e
    return chunks * (14 * step + 7 * 3 * math.floor(msg / lmb) + e)


@pytest.fixture(scope="module")
def workloads(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """ASTRA-sim's microbenchmarks: one 1 MiB collective per NPU, for 8 and 512 NPUs."""
    pytest.importorskip("chakra")
    from trainsim.trace.chakra import collective_graph, write_chakra

    root = tmp_path_factory.mktemp("wl")
    out = {}
    for name, op, n in (("ar8", "all_reduce", 8), ("ag8", "all_gather", 8), ("ar512", "all_reduce", 512)):
        write_chakra(collective_graph(op, 2**20 * (n if op == "all_gather" else 1), n), root / name, op)
        out[name] = str(root / name / op)
    return out


def run_json(tmp_path: Path, argv: list[str]) -> dict:
    out = tmp_path / "o.json"
    main([*argv, "--json", str(out)])
    return json.loads(out.read_text())


# -- the files -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["Ring_4npus.yml", "Ring_8npus.json", "HGX-H100-validated.json",
                                  "Ring_FullyConnected_Switch.yml", "conv_4d.yml"])
def test_shipped_network_configs_load_with_astra_units(name: str) -> None:
    net = load_network(DATA / name)
    levels = net.levels()
    assert [lv.size for lv in levels] == net.npus_count
    for lv, block, bw in zip(levels, net.topology, net.bandwidth, strict=True):
        links = lv.size - 1 if block == "FullyConnected" else 1
        # ASTRA-sim's GB/s is GiB/s per link; trainsim's levels hold the NPU's bandwidth in 1e9 B/s
        assert lv.bandwidth_gbps == pytest.approx(bw * 2**30 / 1e9 * links, rel=1e-12)
    back = network_of(levels)
    assert back.topology == net.topology and back.npus_count == net.npus_count
    assert back.bandwidth == pytest.approx(net.bandwidth, rel=1e-12)
    assert back.latency == pytest.approx(net.latency, rel=1e-12)


def test_conv_4d_config_is_the_papers_table() -> None:
    net = load_network(DATA / "conv_4d.yml")
    assert net.notation == "Ring(2)_FC(8)_Ring(8)_Switch(4)" and net.npus == 512
    assert net.levels()[1].bandwidth_gbps == pytest.approx(7 * 200 * GIB_PER_S_IN_GBPS)


@pytest.mark.parametrize("name", ["Ring_4chunks.json", "Ring_FullyConnected_Switch.json", "conv_4d_system.json",
                                  "FullyConnected_Roofline.json"])
def test_shipped_system_configs_load(name: str) -> None:
    sysc = load_system(DATA / name)
    sem = sysc.semantics()
    assert sem.endpoint_delay_ns == float(sysc.endpoint_delay) and sem.local_mem_bw_gbps == float(sysc.local_mem_bw)
    assert sem.name == "astra" and sem.latency_per_chunk and sem.per_link_bandwidth


def test_remote_memory_configs_price_latency_plus_whole_ns() -> None:
    per_npu = load_remote_memory(DATA / "per_npu_memory_expansion.json").memory(64)
    assert per_npu.time_s(MemoryAccess("load", 1e6, "remote")) == pytest.approx(math.floor(1e6 / 512) * 1e-9)
    node = load_remote_memory(DATA / "per_node_memory_expansion.json").memory(64)
    # one request at a time per node of 8 NPUs: the node's 8 symmetric loads queue behind each other
    assert node.time_s(MemoryAccess("load", 1e6, "remote")) == pytest.approx(8 * math.floor(1e6 / 128) * 1e-9)
    pool = load_remote_memory(DATA / "memory_pool_expansion.json").memory(16)
    assert pool.time_s(MemoryAccess("store", 512.0, "remote")) == pytest.approx(16e-9)
    with pytest.raises(ConfigError, match="NO_MEMORY_EXPANSION"):
        load_remote_memory(DATA / "no_memory_expansion.json").memory(8).time_s(MemoryAccess("load", 1.0, "remote"))


@pytest.mark.parametrize(("doc", "key"), [
    ('{"topology": ["Ring"], "npus_count": [8], "bandwidth": [50.0], "latency": [500.0], "packet_size": 1}',
     "packet_size"),
    ('{"topology": ["Torus"], "npus_count": [8], "bandwidth": [50.0], "latency": [500.0]}', "topology"),
    ('{"topology": ["Ring"], "npus_count": [8, 2], "bandwidth": [50.0], "latency": [500.0]}', "npus_count"),
    ('{"topology": ["Ring"], "npus_count": [1], "bandwidth": [50.0], "latency": [500.0]}', "npus_count"),
])
def test_bad_network_key_is_named(tmp_path: Path, doc: str, key: str) -> None:
    p = tmp_path / "n.json"
    p.write_text(doc)
    with pytest.raises(ConfigError) as exc:
        load_network(p)
    assert key in exc.value.field and "\n" not in str(exc.value)


@pytest.mark.parametrize(("doc", "key"), [
    ('{"scheduling-policy": "EXPLICIT"}', "scheduling-policy"),
    ('{"all-reduce-implementation": ["oneRing"]}', "all-reduce-implementation"),
    ('{"all-to-all-implementation": ["halvingDoubling"]}', "all-to-all-implementation"),
    ('{"inter-dimension-scheduling": "themis"}', "inter-dimension-scheduling"),
    ('{"all-reduce-implementation-custom": ["x"]}', "all-reduce-implementation-custom"),
    ('{"no-such-key": 1}', "no-such-key"),
    ('{"roofline-enabled": true}', "roofline-enabled"),
])
def test_bad_system_key_is_named(tmp_path: Path, doc: str, key: str) -> None:
    p = tmp_path / "s.json"
    p.write_text(doc)
    with pytest.raises(ConfigError) as exc:
        load_system(p)
    assert key in exc.value.field


def test_system_defaults_are_astras_shipped_example() -> None:
    assert AstraSystem() == load_system(DATA / "Ring_4chunks.json").model_copy(
        update={"all_reduce_implementation": None, "all_gather_implementation": None,
                "reduce_scatter_implementation": None, "all_to_all_implementation": None})


# -- trainsim astra run -------------------------------------------------------------------------------------------

def test_astra_run_reproduces_the_reference_ring(tmp_path: Path, workloads: dict[str, str]) -> None:
    data = run_json(tmp_path, ["astra", "run", "--network", str(DATA / "Ring_8npus.json"), "--system",
                               str(DATA / "Ring_4chunks.json"), "--workload", workloads["ar8"]])
    # A0004: Ring(8) all_reduce 1 MiB, 4 chunks, 50 GiB/s, 500 ns = 64.440 us
    assert data["iteration_time_s"] * 1e9 == pytest.approx(ring8_allreduce_ns(2**20, 4), abs=1e-3)
    assert data["iteration_time_s"] * 1e9 == pytest.approx(64440, abs=1e-3)


def test_astra_run_all_gather_size_is_the_input_per_rank(tmp_path: Path, workloads: dict[str, str]) -> None:
    """The ET's all-gather comm_size is 1 MiB per rank; with free reduction it equals a reduce-scatter of
    8 MiB on the same network (ASTRA-sim's convention, astra_reference.md item 3)."""
    from trainsim.cost.multidim import Dimension, run_collective
    from trainsim.cost.semantics import astra

    sysc = tmp_path / "s.json"
    sysc.write_text(json.dumps({"preferred-dataset-splits": 1, "local-mem-bw": 1000000000}))
    data = run_json(tmp_path, ["astra", "run", "--network", str(DATA / "Ring_8npus.json"), "--system", str(sysc),
                               "--workload", workloads["ag8"]])
    dim = [Dimension("ring", 8, 50 * GIB_PER_S_IN_GBPS, 500e-9, "ring", 1)]
    rs = run_collective("reduce_scatter", 8 * 2**20, dim, chunks=1, semantics=astra(10.0, 1e9)).time_s
    assert data["iteration_time_s"] == pytest.approx(rs, rel=1e-12)


def test_astra_run_compare_splits_the_gap_into_terms(tmp_path: Path, workloads: dict[str, str]) -> None:
    data = run_json(tmp_path, ["astra", "run", "--network", str(DATA / "Ring_8npus.json"), "--system",
                               str(DATA / "Ring_4chunks.json"), "--workload", workloads["ar8"], "--compare", "astra"])
    cmp_ = data["compare"]
    assert cmp_["astra_us"] == pytest.approx(64.44, abs=1e-6)
    # NCCL-like: the ring formula, latency once per step, chunks pipelined: 2(k-1)/k S / B + 2(k-1) L
    nccl_us = (2 * 7 / 8 * 2**20 / (50 * GIB_PER_S_IN_GBPS * 1e9) + 14 * 500e-9) * 1e6
    assert cmp_["nccl_us"] == pytest.approx(nccl_us, rel=1e-9)
    assert sum(t["delta_us"] for t in cmp_["terms"]) == pytest.approx(cmp_["gap_us"], rel=1e-9)
    names = [t["term"] for t in cmp_["terms"]]
    assert {"latency_per_chunk", "endpoint_delay", "reduction"} <= set(names)
    # the endpoint delay is 10 ns per step and per phase once chunks pipeline: 4 x (14 + 1) x 10 ns
    assert next(t for t in cmp_["terms"] if t["term"] == "endpoint_delay")["delta_us"] == pytest.approx(0.15)


def test_astra_run_conv_4d_at_512_npus(tmp_path: Path, workloads: dict[str, str]) -> None:
    """The 4-D conventional system runs; in NCCL semantics it is faster than in ASTRA-sim's with 64 chunks
    (ASTRA-sim pays every step's latency per chunk)."""
    args = ["astra", "run", "--network", str(DATA / "conv_4d.yml"), "--system", str(DATA / "conv_4d_system.json"),
            "--workload", workloads["ar512"]]
    a = run_json(tmp_path, args)
    n = run_json(tmp_path, [*args, "--semantics", "nccl"])
    assert a["npus"] == 512 and a["topology"] == "Ring(2)_FC(8)_Ring(8)_Switch(4)"
    assert 0 < n["iteration_time_s"] < a["iteration_time_s"]


def test_astra_run_refusals(tmp_path: Path, workloads: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    base = ["astra", "run", "--system", str(DATA / "Ring_4chunks.json"), "--workload", workloads["ar8"]]
    err = one_line_error([*base, "--network", str(DATA / "Ring_4npus.yml")], capsys)
    assert "--workload" in err and "8 .et file(s)" in err and "4 NPUs" in err
    one_line_error([*base, "--network", str(DATA / "Ring_FullyConnected_Switch.yml"), "--backend", "aware"], capsys)
    one_line_error([*base, "--network", str(DATA / "Ring_8npus.json"), "--semantics", "exact"], capsys)
    one_line_error([*base, "--network", str(DATA / "Ring_8npus.json"), "--num-queues-per-dim", "0"], capsys)


# -- trainsim collective on ASTRA-sim configs ----------------------------------------------------------------------

def test_collective_astra_network_matches_the_reference(tmp_path: Path) -> None:
    data = run_json(tmp_path, ["collective", "--astra-network", str(DATA / "Ring_8npus.json"), "--astra-system",
                               str(DATA / "Ring_4chunks.json"), "--bytes", "1MiB"])
    assert data["time_us"] == pytest.approx(64.44, abs=1e-9)


def test_collective_compare_on_fc_names_per_link_bandwidth(tmp_path: Path) -> None:
    """Switch direct all-to-all: ASTRA-sim's congestion-unaware sends each get the whole link; trainsim's
    NCCL-like model shares the NPU's link among the k-1 sends, so most of the gap is that term."""
    net = tmp_path / "n.json"
    net.write_text(json.dumps({"topology": ["Switch"], "npus_count": [64], "bandwidth": [100.0],
                               "latency": [1000.0]}))
    sysc = tmp_path / "s.json"
    sysc.write_text(json.dumps({"preferred-dataset-splits": 1, "all-to-all-implementation": ["direct"]}))
    data = run_json(tmp_path, ["collective", "--op", "all_to_all", "--bytes", "16MiB", "--astra-network", str(net),
                               "--astra-system", str(sysc), "--compare", "astra"])
    assert data["time_us"] == pytest.approx(4.461, abs=1e-9)  # A0148
    terms = {t["term"]: t for t in data["compare"]["terms"]}
    assert terms["bandwidth_per_link"]["delta_us"] < 0  # ASTRA-sim is faster for it
    assert abs(terms["bandwidth_per_link"]["share"]) > 0.9


def test_collective_refusals(capsys: pytest.CaptureFixture[str]) -> None:
    net, sysc = str(DATA / "Ring_8npus.json"), str(DATA / "Ring_4chunks.json")
    one_line_error(["collective", "--astra-network", net], capsys)
    one_line_error(["collective", "--astra-network", net, "--astra-system", sysc, "--topology", "Ring(8)"], capsys)
    one_line_error(["collective", "--astra-network", net, "--astra-system", sysc, "--bandwidth", "1"], capsys)
    one_line_error(["collective", "--cluster", "dgx-a100", "--ranks", "8", "--model", "nccl", "--semantics", "astra"],
                   capsys)
    one_line_error(["collective", "--topology", "Ring(8)", "--bandwidth", "50", "--latency", "500", "--backend",
                    "aware"], capsys)
    one_line_error(["collective", "--topology", "Ring(8)", "--bandwidth", "50", "--latency", "500", "--compare",
                    "nccl"], capsys)


def test_collective_semantics_astra_on_topology_flags(tmp_path: Path) -> None:
    """--semantics astra with trainsim's own flags: --bandwidth is the NPU's GB/s (1e9 B/s), as always."""
    bw = 50 * GIB_PER_S_IN_GBPS
    data = run_json(tmp_path, ["collective", "--topology", "Ring(8)", "--bandwidth", repr(bw), "--latency", "500",
                               "--bytes", "1MiB", "--chunks", "1", "--semantics", "astra"])
    assert data["time_us"] == pytest.approx(43.025, abs=1e-9)


# -- chakra run --topology, simulate --semantics astra, --cluster conv-4d ------------------------------------------

def test_chakra_run_topology_flags(tmp_path: Path, workloads: dict[str, str]) -> None:
    bw = repr(50 * GIB_PER_S_IN_GBPS)
    astra_ = run_json(tmp_path, ["chakra", "run", workloads["ar8"], "--topology", "Ring(8)", "--bandwidth", bw,
                                 "--latency", "500", "--semantics", "astra"])
    assert astra_["iteration_time_s"] * 1e9 == pytest.approx(64440, abs=1e-3)  # ASTRA's default system: 4 chunks
    nccl = run_json(tmp_path, ["chakra", "run", workloads["ar8"], "--topology", "Ring(8)", "--bandwidth", bw,
                               "--latency", "500"])
    assert nccl["iteration_time_s"] < astra_["iteration_time_s"]


def test_chakra_run_topology_refusals(workloads: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    one_line_error(["chakra", "run", workloads["ar8"], "--bandwidth", "50"], capsys)
    one_line_error(["chakra", "run", workloads["ar8"], "--topology", "Ring(4)", "--bandwidth", "50", "--latency",
                    "500"], capsys)


def test_cluster_conv_4d_simulates(tmp_path: Path) -> None:
    data = run_json(tmp_path, ["simulate", "-q", "--cluster", "conv-4d", "--model", "gpt2", "--dp", "512",
                               "--global-batch", "512"])
    assert data["n_gpus"] == 512 and data["iteration_time_s"] > 0


def test_cluster_conv_4d_refuses_nodes(capsys: pytest.CaptureFixture[str]) -> None:
    one_line_error(["simulate", "--cluster", "conv-4d", "--nodes", "4", "--model", "gpt2", "--dp", "512"], capsys)


def test_simulate_in_astra_semantics_is_slower_with_many_chunks(tmp_path: Path) -> None:
    """The same job in ASTRA-sim's semantics with 64 chunks per collective pays every step's latency per
    chunk, so its communication cannot be faster than with 1 chunk."""
    base = ["simulate", "-q", "--model", "gpt2", "--cluster", "dgx-a100", "--nodes", "2", "--dp", "16",
            "--global-batch", "64", "--semantics", "astra"]
    s64, s1 = tmp_path / "s64.json", tmp_path / "s1.json"
    s64.write_text(json.dumps({"preferred-dataset-splits": 64}))
    s1.write_text(json.dumps({"preferred-dataset-splits": 1}))
    t64 = run_json(tmp_path, [*base, "--astra-system", str(s64)])["iteration_time_s"]
    t1 = run_json(tmp_path, [*base, "--astra-system", str(s1)])["iteration_time_s"]
    assert t64 > t1


def test_simulate_astra_system_needs_astra_semantics(capsys: pytest.CaptureFixture[str]) -> None:
    one_line_error(["simulate", "--model", "gpt2", "--astra-system", str(DATA / "Ring_4chunks.json")], capsys)
