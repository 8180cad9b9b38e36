"""ASTRA-sim 2.0's disaggregated memory reachable from `trainsim simulate` (paper section IV-D, V-B).

A job that offloads its model states to a remote pool (`strategy.offload: remote`) prices its loads and stores
with the pool `cluster.remote_memory` describes (hiermem, zero_infinity or ASTRA-sim's remote memory JSON), and
with `strategy.offload_in_switch` the pool's switches do the ZeRO-3 parameter all-gathers (while loading) and
gradient reduce-scatters (while storing) instead of the GPUs. Known answers, orderings and bad input.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from trainsim.api import costed_program, job_tree, simulate
from trainsim.compile.program import Step, Stream
from trainsim.config import RemoteMemorySpec, parse_job
from trainsim.cost.offload import gather_group_system, remote_memory_system
from trainsim.errors import ConfigError
from trainsim.hardware.memory_systems import HierarchicalPool, MemoryAccess, ZeroInfinityOffload

DATA = Path(__file__).parent / "data" / "astra"
PER_NPU = DATA / "per_npu_memory_expansion.json"  # PER_NPU_MEMORY_EXPANSION, latency 0 ns, 512 GB/s
NO_EXPANSION = DATA / "no_memory_expansion.json"
MODEL = {"name": "gpt3-13b", "layers": 2, "hidden": 1024, "heads": 8, "ffn": 4096, "seq_len": 512}


def job(pool: dict[str, Any] | None = None, *, in_switch: bool = False, nodes: int = 2, **strategy: Any
        ) -> dict[str, Any]:
    """A small ZeRO-3 job offloading to a remote pool on `nodes` DGX-H100 nodes (8 GPUs each)."""
    cluster: dict[str, Any] = {"name": "dgx-h100", "nodes": nodes}
    if pool is not None:
        cluster["remote_memory"] = pool
    s = {"dp": 8 * nodes, "global_batch": 8 * nodes, "zero": 3, "offload": "remote", "offload_in_switch": in_switch}
    s.update(strategy)
    if "tp" in strategy:
        s["dp"] = 8 * nodes // strategy["tp"]
        s["global_batch"] = s["dp"]
    return {"model": dict(MODEL), "cluster": cluster, "strategy": s}


def steps_of(data: dict[str, Any]) -> tuple[list[Step], list[Step], Any]:
    """The costed forward and backward templates of the job's one chunk, and its memory system's cluster."""
    jc = parse_job(data)
    cl, _, tree = job_tree(jc)
    costed = costed_program(tree, cl, jc.simulation, jc.cluster.remote_memory)
    (ch,) = costed.program.chunks
    return ch.fwd, ch.bwd + ch.grad_sync, cl


def names(result: Any, stream: int | None = None) -> list[str]:
    g = result.graph
    return [g.name[t] for t in range(len(g)) if stream is None or g.stream[t] == stream]


# -- known answers ------------------------------------------------------------------------------------

def test_in_switch_removes_the_gpu_gather_and_reduce_scatter() -> None:
    plain, switched = simulate(job()), simulate(job(in_switch=True))
    assert any(n.endswith("params:all_gather") for n in names(plain))
    assert any(n.endswith("grads:reduce_scatter") for n in names(plain))
    got = names(switched)
    assert not any("all_gather" in n or "reduce_scatter" in n for n in got)
    g = switched.graph
    assert not any(g.stream[t] == Stream.GRAD for t in range(len(g)))  # nothing left on the GPU's grad stream
    # the same loads and stores, now in the switches
    assert sorted(n for n in names(plain, Stream.MEMORY)) == sorted(n for n in names(switched, Stream.MEMORY))


def test_in_switch_load_follows_the_pools_link_loads() -> None:
    """16 GPUs (2 nodes x 8), defaults: one out-node switch per node, one 100 GB/s group per GPU, 256 GB/s
    in-node. Each GPU loads its shard W; in the switches the in-node link carries the gathered 16 W."""
    fwd, _, cl = steps_of(job(in_switch=True))
    plain_fwd, _, _ = steps_of(job())
    pool = remote_memory_system(RemoteMemorySpec(), cl)
    assert isinstance(pool, HierarchicalPool)
    assert (pool.n_nodes, pool.gpus_per_node, pool.n_out_switches, pool.n_remote_groups) == (2, 8, 2, 16)
    for load in (s for s in fwd if s.access == "load" and s.layer.startswith("layers.")):
        w = load.size_bytes
        assert load.in_switch and load.axes == ("dp",)
        assert pool.link_loads(w, True) == pytest.approx({"rem2outsw": 16 * w / (16 * 2), "outsw2insw": 16 * w / 2,
                                                          "insw2gpu": 16 * w})
        assert load.duration_s == pytest.approx(pool.timing(MemoryAccess("load", w, "remote", True)).total_s)
        # in-node hop is the bottleneck: 16 W at 256 GB/s, plus one chunk's trip through the other two hops
        # (W / 2 per memory-side link at 50 GB/s and 8 W per uplink at 1024 GB/s, in ~12 chunks of 64 KiB)
        stages = math.ceil(w / 2 / 65536)
        fill = (w / 2 / 50e9 + 8 * w / 1024e9) / stages
        assert load.duration_s == pytest.approx(16 * w / 256e9 + fill, rel=0.005)
        # the GPU receives the gathered weights: what the plain load + GPU all-gather held, less the shard
        gather = next(s for s in plain_fwd if s.layer == load.layer and s.collective == "all_gather")
        plain = next(s for s in plain_fwd if s.layer == load.layer and s.access == "load")
        assert plain.size_bytes == w and not plain.in_switch
        assert load.alloc_bytes == pytest.approx(w - gather.size_bytes / 16 + gather.size_bytes)


def test_in_switch_loads_the_shard_of_a_tied_weight() -> None:
    """GPT's LM head shares the embedding's weight: its plain load moves none of it (the embedding stores it)
    and a GPU all-gather rebuilds it; in the switches the head's load moves that weight's shard to gather."""
    fwd, _, _ = steps_of(job(in_switch=True))
    plain_fwd, _, _ = steps_of(job())
    gather = next(s for s in plain_fwd if s.layer == "head" and s.collective == "all_gather")
    plain = next((s for s in plain_fwd if s.layer == "head" and s.access == "load"), None)
    load = next(s for s in fwd if s.layer == "head" and s.access == "load")
    own = plain.size_bytes if plain is not None else 0.0
    assert load.in_switch and load.size_bytes == pytest.approx(own + gather.size_bytes / 16)
    assert load.alloc_bytes == pytest.approx(own + gather.size_bytes)


def test_in_switch_store_reduce_scatters_the_gradient_shard() -> None:
    _, bwd, cl = steps_of(job(in_switch=True))
    pool = remote_memory_system(RemoteMemorySpec(), cl)
    stores = [s for s in bwd if s.access == "store"]
    assert stores and all(s.in_switch for s in stores if s.layer.startswith("layers."))
    assert not any(s.collective == "reduce_scatter" for s in bwd)
    for s in stores:
        assert s.duration_s == pytest.approx(pool.time_s(MemoryAccess("store", s.size_bytes, "remote", s.in_switch)))


def test_in_switch_with_tp_gathers_over_the_dp_group_only() -> None:
    """tp=2: the ZeRO-3 group is the 8 dp ranks of a tp rank, so each GPU receives 8 W, not 16 W: the in-node
    hop is priced as 16 W on links 16/8 times as fast (cost.offload.gather_group_system)."""
    fwd, _, cl = steps_of(job(in_switch=True, tp=2))
    pool = remote_memory_system(RemoteMemorySpec(), cl)
    assert isinstance(pool, HierarchicalPool)
    load = next(s for s in fwd if s.access == "load" and s.layer.startswith("layers."))
    narrow = gather_group_system(pool, 8)
    assert isinstance(narrow, HierarchicalPool) and narrow.in_node_gbps == pytest.approx(2 * pool.in_node_gbps)
    assert load.duration_s == pytest.approx(narrow.time_s(MemoryAccess("load", load.size_bytes, "remote", True)))
    assert gather_group_system(pool, 16) is pool


def test_hsdp_keeps_the_replica_all_reduce() -> None:
    """FSDP with 2 replicas: the reduce-scatter over the sharding group goes into the switches, the
    all-reduce of the shard across the replicas stays on the GPUs."""
    _, bwd, _ = steps_of(job(in_switch=True, zero=0, fsdp=True, dp_replicate=2))
    collectives = {(s.collective, s.axes) for s in bwd if s.kind == "collective" and s.category == "dp"}
    assert ("reduce_scatter", ("dp",)) not in collectives
    assert any(c == "all_reduce" and "dr" in axes for c, axes in collectives)


def test_astra_remote_memory_prices_latency_plus_floor_bytes_over_bw(tmp_path: Path) -> None:
    """ASTRA-sim's remote memory: latency + floor(bytes / bandwidth) ns (PER_NPU: each NPU its own)."""
    data = job({"pool": "astra", "config": str(PER_NPU)})
    fwd, bwd, _ = steps_of(data)
    memory = [s for s in fwd + bwd if s.kind == "memory"]
    assert memory
    for s in memory:
        assert s.duration_s == pytest.approx((0 + math.floor(s.size_bytes / 512)) * 1e-9, abs=1e-15)
    # the CLI flag sets the same section
    from trainsim.cli import main

    out = tmp_path / "r.json"
    main(["simulate", "--model", "gpt3-13b", "--layers", "2", "--hidden", "1024", "--heads", "8", "--ffn", "4096",
          "--seq-len", "512", "--cluster", "dgx-h100", "--nodes", "2", "--dp", "16", "--global-batch", "16",
          "--zero", "3", "--offload", "remote", "--remote-memory", str(PER_NPU), "--no-sp", "--recompute", "none",
          "-q", "--json", str(out)])
    want = simulate(data)
    assert json.loads(out.read_text())["iteration_time_s"] == pytest.approx(want.iteration_time_s, rel=1e-12)


def test_pool_keys_reach_the_memory_system() -> None:
    spec = RemoteMemorySpec(pool="hiermem", in_node_gbps=512.0, remote_group_gbps=500.0, out_switches=4,
                            remote_groups=8, chunk_bytes=1 << 20, latency_ns=250.0)
    _, _, cl = steps_of(job())
    pool = remote_memory_system(spec, cl)
    assert isinstance(pool, HierarchicalPool)
    assert (pool.n_out_switches, pool.n_remote_groups, pool.in_node_gbps, pool.chunk_bytes) == (4, 8, 512.0, 1 << 20)
    assert pool.mem_side_out_gbps == pytest.approx(500.0 / 4) and pool.latency_s == pytest.approx(250e-9)
    zi = remote_memory_system(RemoteMemorySpec(pool="zero_infinity", remote_groups=16, remote_group_gbps=100.0,
                                               pcie_gbps=64.0), cl)
    assert isinstance(zi, ZeroInfinityOffload)
    assert (zi.n_remote_groups, zi.remote_group_gbps, zi.pcie_gbps, zi.tier) == (16, 100.0, 64.0, "cpu")


def test_no_remote_memory_section_keeps_the_default_pool() -> None:
    """cluster.remote_memory absent and `{pool: hiermem}` with every key left out price the same."""
    a, b = simulate(job()), simulate(job({"pool": "hiermem"}))
    assert a.iteration_time_s == b.iteration_time_s


# -- orderings ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("in_switch", [False, True])
def test_faster_pool_never_slows_the_iteration(in_switch: bool) -> None:
    times = {}
    for in_node in (64.0, 256.0, 1024.0):
        for group in (25.0, 100.0, 400.0):
            pool = {"pool": "hiermem", "in_node_gbps": in_node, "remote_group_gbps": group}
            times[(in_node, group)] = simulate(job(pool, in_switch=in_switch, nodes=1)).iteration_time_s
    for (b, r), t in times.items():
        for (b2, r2), t2 in times.items():
            if b2 >= b and r2 >= r:
                assert t2 <= t * (1 + 1e-9), ((b, r, t), (b2, r2, t2))


def test_faster_astra_memory_never_slows_the_iteration(tmp_path: Path) -> None:
    times = []
    for bw in (8, 64, 512):
        path = tmp_path / f"m{bw}.json"
        path.write_text(json.dumps({"memory-type": "PER_NPU_MEMORY_EXPANSION", "remote-mem-latency": 100,
                                    "remote-mem-bw": bw}))
        times.append(simulate(job({"pool": "astra", "config": str(path)}, nodes=1)).iteration_time_s)
    assert times[0] >= times[1] >= times[2]
    assert times[0] > times[2]


def test_in_switch_removes_the_exposed_gather_time() -> None:
    """On a slow GPU network the ZeRO-3 gathers are exposed; in the pool's switches they are not on the GPUs
    at all: no exposed dp time, and the iteration is no slower than the GPU collectives'."""
    slow = {"name": "dgx-h100", "nodes": 2, "nic_gbps": 1.0}
    plain, switched = job(), job(in_switch=True)
    plain["cluster"].update(slow)
    switched["cluster"].update(slow)
    a, b = simulate(plain), simulate(switched)
    assert a.breakdown["dp"] > 0 and b.breakdown["dp"] == 0
    assert b.iteration_time_s < a.iteration_time_s


def test_existing_offload_targets_unchanged_by_a_default_pool() -> None:
    """cpu / nvme never read cluster.remote_memory; an explicit default hiermem pool equals offload remote."""
    base = simulate(job())
    explicit = simulate(job({"pool": "hiermem", "in_node_gbps": 256.0, "remote_group_gbps": 100.0,
                             "out_switches": 2, "remote_groups": 16, "chunk_bytes": 65536, "latency_ns": 0.0}))
    assert explicit.iteration_time_s == base.iteration_time_s


# -- bad input: one line, exit code 2 --------------------------------------------------------------------

SMALL = ["simulate", "--model", "gpt2", "--cluster", "dgx-h100", "--nodes", "1", "--dp", "8", "--global-batch",
         "8", "--no-sp", "--recompute", "none", "-q"]


@pytest.mark.parametrize(("extra", "field"), [
    (["--zero", "3", "--in-switch-collectives"], "strategy.offload_in_switch"),
    (["--zero", "3", "--offload", "cpu", "--in-switch-collectives"], "strategy.offload_in_switch"),
    (["--zero", "1", "--offload", "remote", "--in-switch-collectives"], "strategy.offload_in_switch"),
    (["--zero", "3", "--offload", "cpu", "--remote-memory", str(PER_NPU)], "cluster.remote_memory"),
    (["--zero", "3", "--remote-memory", str(PER_NPU)], "cluster.remote_memory"),
    (["--zero", "3", "--offload", "remote", "--remote-memory", "no/such.json"], "cluster.remote_memory.config"),
    (["--zero", "3", "--offload", "remote", "--remote-memory", str(NO_EXPANSION)], "memory-type"),
    (["--zero", "3", "--offload", "remote", "--remote-memory", str(PER_NPU), "--in-switch-collectives"],
     "strategy.offload_in_switch"),
])
def test_bad_flags_one_line(extra: list[str], field: str, capsys: pytest.CaptureFixture[str]) -> None:
    from trainsim.cli import main

    with pytest.raises(SystemExit) as exc:
        main([*SMALL, *extra])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error:") and field in err, err


@pytest.mark.parametrize(("pool", "strategy", "field"), [
    ({"pool": "zero_infinity", "in_node_gbps": 512.0}, {}, "cluster.remote_memory.in_node_gbps"),
    ({"pool": "hiermem", "pcie_gbps": 50.0}, {}, "cluster.remote_memory.pcie_gbps"),
    ({"pool": "hiermem", "config": str(PER_NPU)}, {}, "cluster.remote_memory.config"),
    ({"pool": "astra", "remote_groups": 8}, {}, "cluster.remote_memory.remote_groups"),
    ({"pool": "astra"}, {}, "cluster.remote_memory.config"),
    ({"pool": "zero_infinity"}, {"offload_in_switch": True}, "strategy.offload_in_switch"),
    ({"pool": "hiermem", "in_node_gbps": 0.0}, {}, "cluster.remote_memory.in_node_gbps"),
    ({"pool": "hiermem", "out_switches": 0}, {}, "cluster.remote_memory.out_switches"),
    ({"pool": "tape"}, {}, "cluster.remote_memory.pool"),
    ({"pool": "hiermem", "bogus": 1}, {}, "cluster.remote_memory.bogus"),
    ({"pool": "hiermem"}, {"offload": "nvme"}, "cluster.remote_memory"),
])
def test_bad_yaml_one_line(tmp_path: Path, pool: dict[str, Any], strategy: dict[str, Any], field: str,
                           capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    from trainsim.cli import main

    data = job(pool, nodes=1, **strategy)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SystemExit) as exc:
        main(["simulate", str(path), "-q"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"error: {field}"), err


def test_tree_file_with_in_switch_needs_a_hierarchical_pool(tmp_path: Path) -> None:
    """A saved strategy tree carries offload_in_switch; simulating it with another pool is refused."""
    from trainsim.api import strategy_tree

    tree = strategy_tree(job(in_switch=True, nodes=1))
    assert tree.offload_in_switch and tree.offload == "remote"
    path = tmp_path / "tree.yaml"
    path.write_text(tree.to_yaml())
    ok = simulate({"model": dict(MODEL), "cluster": {"name": "dgx-h100", "nodes": 1},
                   "strategy": {"tree": str(path)}})
    assert not any("all_gather" in n for n in names(ok))
    with pytest.raises(ConfigError) as err:
        simulate({"model": dict(MODEL), "cluster": {"name": "dgx-h100", "nodes": 1,
                                                     "remote_memory": {"pool": "zero_infinity"}},
                  "strategy": {"tree": str(path)}})
    assert str(err.value).startswith("strategy.offload_in_switch") and "\n" not in str(err.value)
    tree.offload = "cpu"
    path.write_text(tree.to_yaml())
    with pytest.raises(ConfigError) as err:
        simulate({"model": dict(MODEL), "cluster": {"name": "dgx-h100", "nodes": 1}, "strategy": {"tree": str(path)}})
    assert str(err.value).startswith("strategy.offload_in_switch")


def test_offload_devices_must_spread_over_the_nodes() -> None:
    with pytest.raises(ConfigError) as err:
        simulate(job({"pool": "zero_infinity", "remote_groups": 3}, nodes=2))
    assert str(err.value).startswith("cluster.remote_memory.remote_groups") and "\n" not in str(err.value)
