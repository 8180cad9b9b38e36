"""Memory systems (ASTRA-sim 2.0 section IV-D): hand-computed link loads, closed forms, pipeline timing,
the TABLE V ordering on a fixed graph, and one-line errors."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainsim.compile.graph import ExecutionGraph, RankClass
from trainsim.compile.program import STREAM_NAMES, Stream
from trainsim.hardware.memory_systems import (
    HierarchicalPool,
    LocalHBM,
    MemoryAccess,
    PipelineTiming,
    ZeroInfinityOffload,
    pipelined,
)
from trainsim.sim.engine import run

GB = 1e9


def paper_pool(**kw: object) -> HierarchicalPool:
    """The paper's worked example: 16 nodes x 16 GPUs, 4 out-node switches, 8 remote memory groups."""
    args = {"n_nodes": 16, "gpus_per_node": 16, "n_out_switches": 4, "n_remote_groups": 8, "in_node_gbps": 256.0,
            "gpu_side_out_gbps": 100.0, "mem_side_out_gbps": 50.0, "chunk_bytes": 1e6}
    args.update(kw)
    return HierarchicalPool(**args)  # type: ignore[arg-type]


def test_paper_example_link_loads() -> None:
    # each GPU loads W: 256W from 8 groups = 32W per group, over 4 switch links = 8W per link;
    # a node needs 16W from 4 switches = 4W per switch->node link; W per GPU link
    w = 3.0
    assert paper_pool().link_loads(w) == {"rem2outsw": 8 * w, "outsw2insw": 4 * w, "insw2gpu": 1 * w}
    # in-switch gather: 8W per group link, an out-node switch collects 8 x 8W = 64W and forwards it to
    # every node; each in-node switch holds the whole 256W and broadcasts it to each GPU
    assert paper_pool().link_loads(w, in_switch_collective=True) == {
        "rem2outsw": 8 * w, "outsw2insw": 64 * w, "insw2gpu": 256 * w}


def test_paper_pipeline_equations_by_hand() -> None:
    pool = paper_pool()
    w = 64e6  # per GPU: 8W = 512 MB per group link = 512 stages of 1 MB
    t = pool.timing(MemoryAccess("load", w, "remote"))
    assert t.stages == 512  # tensor x GPUs / groups / switches / chunk
    assert t.hop_s["rem2outsw"] == pytest.approx(1e6 / (50 * GB))  # chunk / mem-side BW
    assert t.hop_s["outsw2insw"] == pytest.approx(8 * 1e6 / (16 * 100 * GB))  # groups x chunk / (nodes x BW)
    assert t.hop_s["insw2gpu"] == pytest.approx(8 * 4 * 1e6 / (256 * 256 * GB))  # groups x switches x chunk / ...
    fill = 8e6 / (1600 * GB) + 32e6 / (256 * 256 * GB)
    assert t.bottleneck_hop == "rem2outsw"
    assert t.fill_s == pytest.approx(fill)
    assert pool.time_s(MemoryAccess("load", w, "remote")) == pytest.approx(fill + 512 * 1e6 / (50 * GB))
    # in-switch: TX_outSW2inSW = groups x chunk / BW; TX_inSW2GPU = groups x switches x chunk / in-node BW
    ts = pool.timing(MemoryAccess("load", w, "remote", in_switch_collective=True))
    assert ts.stages == 512
    assert ts.hop_s == pytest.approx({"rem2outsw": 1e6 / (50 * GB), "outsw2insw": 8e6 / (100 * GB),
                                      "insw2gpu": 32e6 / (256 * GB)})
    assert ts.total_s == pytest.approx(1e6 / (50 * GB) + 8e6 / (100 * GB) + 512 * 32e6 / (256 * GB))
    # a store moves the same bytes over the same links, the other way
    assert pool.time_s(MemoryAccess("store", w, "remote", True)) == ts.total_s


def test_pipeline_is_fill_plus_stages_times_bottleneck() -> None:
    t = PipelineTiming(10, {"a": 1.0, "b": 3.0, "c": 2.0}, latency_s=0.5)
    assert t.bottleneck_s == 3.0 and t.fill_s == 3.0
    assert t.total_s == 0.5 + 3.0 + 10 * 3.0  # = latency + first chunk through all hops (6) + 9 x 3
    assert PipelineTiming(0, {}, 0.25).total_s == 0.25


def test_partial_last_chunk_by_hand() -> None:
    """1.5 chunks over hop a (1 s per chunk) then hop b (2 s per chunk): chunk 1 holds a 0-1 and b 1-3;
    the half chunk holds a 1-1.5 and b 3-4."""
    t = pipelined({"a": 1.5, "b": 3.0}, {"a": 1e-9, "b": 1e-9}, 1.0, "a")
    assert (t.stages, t.last_fraction) == (2, 0.5)
    assert t.hop_s == pytest.approx({"a": 1.0, "b": 2.0})
    assert t.total_s == pytest.approx(4.0)
    # a hair over one chunk costs a hair more than one chunk (no drop at the stage boundary)
    one = pipelined({"a": 1.0, "b": 2.0}, {"a": 1e-9, "b": 1e-9}, 1.0, "a").total_s
    assert one == pytest.approx(3.0)
    assert pipelined({"a": 1.0 + 1e-6, "b": 2.0 + 2e-6}, {"a": 1e-9, "b": 1e-9}, 1.0, "a").total_s == (
        pytest.approx(one, rel=1e-5))


@settings(max_examples=300)
@given(st.floats(1e3, 1e10), st.floats(1e3, 1e10))
def test_pool_time_monotone_and_stages_whole(w: float, extra: float) -> None:
    pool = paper_pool()
    a, b = (pool.timing(MemoryAccess("load", x, "remote")) for x in (w, w + extra))
    assert b.total_s >= a.total_s
    assert a.stages == math.ceil(pool.link_loads(w)["rem2outsw"] / 1e6 - 1e-9)
    # never faster than the bottleneck link moving its whole load
    assert a.total_s >= pool.link_loads(w)["rem2outsw"] / (50 * GB) * (1 - 1e-12)


def test_local_hbm_closed_form() -> None:
    hbm = LocalHBM(bandwidth_gbps=4096.0, latency_s=2e-6)
    assert hbm.time_s(MemoryAccess("load", 4096e6)) == pytest.approx(2e-6 + 1e-3)
    assert hbm.time_s(MemoryAccess("store", 0.0)) == 2e-6
    pool = paper_pool(local=hbm)
    assert pool.time_s(MemoryAccess("load", 4096e6, "local")) == hbm.time_s(MemoryAccess("load", 4096e6))


def test_zero_infinity_closed_forms() -> None:
    # cpu tier: one hop at min(PCIe, the GPU's share of its node's devices)
    z = ZeroInfinityOffload(n_nodes=2, gpus_per_node=16, n_remote_groups=2, remote_group_gbps=48.0, pcie_gbps=12.0)
    assert z.tier_gbps_per_gpu == 3.0
    assert z.time_s(MemoryAccess("load", 3e9, "remote")) == pytest.approx(1.0)
    assert ZeroInfinityOffload.dgx2_cpu(2) == z
    # nvme tier: NVMe -> DRAM -> GPU pipelined in chunks: fill (one chunk over PCIe) + stages x NVMe chunk time
    n = ZeroInfinityOffload(n_nodes=1, gpus_per_node=4, n_remote_groups=4, remote_group_gbps=5.0, pcie_gbps=20.0,
                            tier="nvme", chunk_bytes=1e6)
    t = n.timing(MemoryAccess("store", 100e6, "remote"))
    assert t.stages == 100
    assert t.total_s == pytest.approx(1e6 / (20 * GB) + 100 * 1e6 / (5 * GB))
    # Table V: 256 devices of 100 GB/s, one per GPU
    tv = ZeroInfinityOffload(n_nodes=16, gpus_per_node=16, n_remote_groups=256, remote_group_gbps=100.0,
                             pcie_gbps=100.0)
    assert tv.time_s(MemoryAccess("load", 1e9, "remote")) == pytest.approx(0.01)


def test_from_group_bandwidth_matches_table_v_resources() -> None:
    # TABLE V baseline: a group's 100 GB/s spreads over 16 switch links; the pool then moves a per-GPU
    # load at the same 100 GB/s per GPU as ZeRO-Infinity's device, plus the extra switch stages' fill
    pool = HierarchicalPool.from_group_bandwidth(n_nodes=16, gpus_per_node=16, n_out_switches=16, n_remote_groups=256,
                                                 in_node_gbps=256.0, remote_group_gbps=100.0, chunk_bytes=65536)
    assert pool.mem_side_out_gbps == 6.25 and pool.gpu_side_out_gbps == 256.0
    zero = ZeroInfinityOffload(n_nodes=16, gpus_per_node=16, n_remote_groups=256, remote_group_gbps=100.0,
                               pcie_gbps=100.0, chunk_bytes=65536)
    acc = MemoryAccess("load", 256 * 2**20, "remote")
    t = pool.timing(acc)
    assert t.bottleneck_hop == "rem2outsw"
    assert zero.time_s(acc) < pool.time_s(acc) < zero.time_s(acc) * 1.01
    assert pool.time_s(acc) - zero.time_s(acc) == pytest.approx(t.fill_s)


def test_concurrent_accesses_share_links() -> None:
    pool = paper_pool()
    a, b = MemoryAccess("load", 1e6, "remote"), MemoryAccess("load", 2e6, "remote", True)
    both = pool.timing_together([a, b])
    la, lb = pool.link_loads(1e6), pool.link_loads(2e6, True)
    assert both.stages == math.ceil((la["rem2outsw"] + lb["rem2outsw"]) / 1e6 - 1e-9)
    assert both.hop_s["insw2gpu"] == pytest.approx((la["insw2gpu"] + lb["insw2gpu"]) / both.stages / (256 * GB))
    with pytest.raises(ValueError, match="opposite directions"):
        pool.timing_together([a, MemoryAccess("store", 1e6, "remote")])


def _table_v_graph(memory: HierarchicalPool | ZeroInfinityOffload, layers: int = 8) -> float:
    """Per layer: load W (two-layer buffer) on the MEMORY stream, then compute; returns the iteration time."""
    g = ExecutionGraph()
    g.classes.append(RankClass("all", 0, 256, range(256)))
    w, compute_s = 256 * 2**20, 2e-4
    load_s = memory.time_s(MemoryAccess("load", w, "remote"))
    ends: list[int] = []
    loads = [g.add("load 0", "memory", Stream.MEMORY, "remote_memory", load_s, (0,), []),
             g.add("load 1", "memory", Stream.MEMORY, "remote_memory", load_s, (0,), [])]
    for i in range(layers):
        deps = [loads[i]] + ([ends[-1]] if ends else [])
        ends.append(g.add(f"compute {i}", "compute", Stream.COMPUTE, "compute", compute_s, (0,), deps))
        if i + 2 < layers:
            loads.append(g.add(f"load {i + 2}", "memory", Stream.MEMORY, "remote_memory", load_s, (0,), [ends[i]]))
    tr = run(g, gamma=0.0)
    return max(tr.end_s)


def test_table_v_ordering_on_fixed_graph() -> None:
    def pool(in_node: float, group: float) -> HierarchicalPool:
        return HierarchicalPool.from_group_bandwidth(n_nodes=16, gpus_per_node=16, n_out_switches=16,
                                                     n_remote_groups=256, in_node_gbps=in_node,
                                                     remote_group_gbps=group, chunk_bytes=65536)

    zero = ZeroInfinityOffload(n_nodes=16, gpus_per_node=16, n_remote_groups=256, remote_group_gbps=100.0,
                               pcie_gbps=100.0, chunk_bytes=65536)
    t_zero, t_base, t_opt = _table_v_graph(zero), _table_v_graph(pool(256, 100)), _table_v_graph(pool(512, 500))
    assert t_zero < t_base < t_zero * 1.01  # ZeRO-Infinity slightly better: same resources, fewer stages
    assert t_base / t_opt > 4.0  # the memory-bound baseline gains several times from 5x group bandwidth
    # memory-bound: 8 loads of 268 MB at 100 GB/s back to back, the last compute after the last load
    assert t_zero == pytest.approx(8 * (256 * 2**20) / (100 * GB) + 2e-4)


def test_memory_stream_is_named() -> None:
    assert Stream.MEMORY == 4 and STREAM_NAMES[Stream.MEMORY] == "memory" and len(STREAM_NAMES) == len(Stream)


@pytest.mark.parametrize(("make", "field"), [
    (lambda: MemoryAccess("read", 1.0), "MemoryAccess.kind"),
    (lambda: MemoryAccess("load", -1.0), "MemoryAccess.size_bytes"),
    (lambda: MemoryAccess("load", 1.0, "far"), "MemoryAccess.location"),
    (lambda: MemoryAccess("load", 1.0, "local", True), "MemoryAccess.in_switch_collective"),
    (lambda: LocalHBM(0.0), "LocalHBM.bandwidth_gbps"),
    (lambda: LocalHBM(1.0, -1.0), "LocalHBM.latency_s"),
    (lambda: paper_pool(n_out_switches=0), "HierarchicalPool.n_out_switches"),
    (lambda: paper_pool(n_remote_groups=2.5), "HierarchicalPool.n_remote_groups"),
    (lambda: paper_pool(chunk_bytes=0), "HierarchicalPool.chunk_bytes"),
    (lambda: paper_pool(in_node_gbps=float("nan")), "HierarchicalPool.in_node_gbps"),
    (lambda: ZeroInfinityOffload(n_nodes=3, gpus_per_node=8, n_remote_groups=4, remote_group_gbps=1.0,
                                 pcie_gbps=1.0), "ZeroInfinityOffload.n_remote_groups"),
    (lambda: ZeroInfinityOffload(n_nodes=1, gpus_per_node=8, n_remote_groups=1, remote_group_gbps=1.0,
                                 pcie_gbps=1.0, tier="tape"), "ZeroInfinityOffload.tier"),
    (lambda: LocalHBM(1.0).time_s(MemoryAccess("load", 1.0, "remote")), "MemoryAccess.location"),
    (lambda: paper_pool().time_s(MemoryAccess("load", 1.0, "local")), "HierarchicalPool.local"),
    (lambda: ZeroInfinityOffload.dgx2_cpu().time_s(MemoryAccess("load", 1.0, "remote", True)),
     "MemoryAccess.in_switch_collective"),
])
def test_bad_parameters_one_line_errors(make, field: str) -> None:
    with pytest.raises(ValueError) as err:
        make()
    msg = str(err.value)
    assert msg.startswith(field) and "\n" not in msg


# -- offload plumbing: memory nodes in the compiled training graph ------------------------------------

def test_insert_offload_by_hand() -> None:
    from trainsim.compile.offload import insert_offload
    from trainsim.compile.program import Step

    def comp(label: str, layer: str, deps: tuple[int, ...] | None = None) -> Step:
        return Step(label, "compute", Stream.COMPUTE, "compute", layer, deps=deps)

    steps = [comp("a1", "a"), comp("a2", "a"), comp("b1", "b"), comp("b2", "b", deps=(0, 2))]
    out = insert_offload(steps, {"a": (10.0, 4.0), "b": (20.0, 6.0)}, "bwd")
    assert [s.label for s in out] == ["a.params:load", "a1", "a2", "b.params:load", "b1", "b2",
                                      "a.grads:store", "b.grads:store"]
    load_a, a1, a2, load_b, b1, b2, store_a, store_b = out
    assert load_a.deps == () and a1.deps == (0,) and a2.deps is None
    assert load_b.deps == (1,)  # prefetched once the previous layer's first step is done
    assert b1.deps == (2, 3)  # the step before it and its own load
    assert b2.deps == (1, 4)  # explicit deps remapped
    assert store_a.deps == (2,) and store_b.deps == (5,)
    assert (load_a.stream, load_a.access, load_a.size_bytes, load_a.alloc_bytes) == (Stream.MEMORY, "load", 10.0, 10.0)
    assert a2.free_bytes == 10.0 and a2.alloc_bytes == 4.0  # weights dropped, gradient buffer until stored
    assert (store_b.access, store_b.size_bytes, store_b.free_bytes) == ("store", 6.0, 6.0)


def _small_job(offload: str) -> dict:
    return {"model": {"name": "gpt3-13b", "layers": 4, "hidden": 1024, "heads": 8, "ffn": 4096, "seq_len": 512},
            "cluster": {"name": "dgx-h100", "nodes": 1},
            "strategy": {"tp": 2, "dp": 4, "global_batch": 8, "zero": 3, "offload": offload}}


def test_offload_simulation_memory_nodes() -> None:
    from trainsim.api import simulate

    runs = {o: simulate(_small_job(o)) for o in ("none", "cpu", "nvme", "remote")}
    base = runs["none"]
    assert base.memory[0].static_bytes > 0
    for o in ("cpu", "nvme", "remote"):
        r = runs[o]
        g = r.graph
        assert g is not None
        mem = [t for t in range(len(g)) if g.stream[t] == Stream.MEMORY]
        loads = [t for t in mem if g.name[t].endswith("params:load")]
        stores = [t for t in mem if g.name[t].endswith("grads:store")]
        m = 2  # global batch 8 / (micro-batch 1 x dp 4)
        assert len(mem) == len(loads) + len(stores) and len(loads) == 2 * len(stores) and len(stores) % m == 0
        # the states live off the GPU: what stays is PyTorch's GEMM workspaces (32 + 1 MiB on an H100)
        assert r.memory[0].static_bytes == 33 * 2**20 and r.memory[0].peak_bytes < base.memory[0].peak_bytes
        assert r.iteration_time_s >= base.iteration_time_s  # loads can hide behind compute, never speed it up
    assert runs["nvme"].iteration_time_s > runs["cpu"].iteration_time_s  # 3 GB/s NVMe vs 52.7 GB/s PCIe
    assert runs["nvme"].breakdown["offload"] > 0  # NVMe loads stall the compute stream


def test_offload_bad_value_one_line() -> None:
    from trainsim.api import simulate
    from trainsim.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        simulate(_small_job("tape"))
    assert str(err.value).startswith("strategy.offload") and "\n" not in str(err.value)


def test_offload_flag_on_the_cli_matches_the_yaml_key(tmp_path) -> None:
    import json
    import subprocess
    import sys

    from trainsim.api import simulate

    out = tmp_path / "r.json"
    args = [sys.executable, "-m", "trainsim", "simulate", "--model", "gpt2", "--cluster", "dgx-h100", "--tp", "2",
            "--global-batch", "8", "--zero", "3", "-q", "--json", str(out),
            "--no-sp", "--recompute", "none"]  # flags change the default job: its SP and recompute off
    p = subprocess.run([*args, "--offload", "nvme"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    want = simulate({"model": {"name": "gpt2"}, "cluster": {"name": "dgx-h100"},
                     "strategy": {"tp": 2, "global_batch": 8, "zero": 3, "offload": "nvme"}})
    got = json.loads(out.read_text())
    assert got["iteration_time_s"] == pytest.approx(want.iteration_time_s, rel=1e-12)
    assert got["breakdown"]["offload"] > 0
    bad = subprocess.run([*args, "--offload", "tape"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "strategy.offload" in bad.stderr
