"""Parallel groups on the topology (placement) and simulations over an explicit topology."""

from __future__ import annotations

import math

import pytest

from trainsim.api import simulate
from trainsim.errors import ConfigError
from trainsim.hardware.cluster import get_cluster
from trainsim.hardware.topology import parse_topology
from trainsim.strategy.mesh import DeviceMesh
from trainsim.strategy.placement import placement


def test_megatron_order_keeps_tp_inside_the_node() -> None:
    levels = get_cluster("dgx-a100", 16).levels
    placed = {p.axis: p.fanout for p in placement(DeviceMesh(tp=8, dp=4, pp=4), levels)}
    assert placed == {"tp": (8, 1), "dp": (1, 4), "pp": (1, 4)}


def test_fanouts_multiply_to_the_degree() -> None:
    levels = parse_topology("Ring(2)_FC(8)_Ring(8)_Switch(4)", [1, 1, 1, 1], [0, 0, 0, 0])
    for p in placement(DeviceMesh(tp=8, dp=8, pp=8), levels):
        assert math.prod(p.fanout) == p.degree
    tp = placement(DeviceMesh(tp=8, dp=8, pp=8), levels)[0]
    assert tp.fanout == (2, 4, 1, 1)
    assert tp.describe(levels) == "tp=8: dim1 ring(2) x2, dim2 fc(8) x4"


JOB = {"model": {"name": "gpt3-1.3b", "seq_len": 1024}, "strategy": {"tp": 2, "pp": 2, "dp": 4, "global_batch": 32}}


def test_a_topology_job_matches_the_equivalent_preset() -> None:
    # Switch(8)_Switch(2) at the DGX A100 rates is the dgx-a100 preset with 2 nodes, priced by the same NCCL model
    pre = simulate({**JOB, "cluster": {"name": "dgx-a100", "nodes": 2}})
    cl = get_cluster("dgx-a100", 2)
    topo = simulate({**JOB, "cluster": {"topology": "Switch(8)_Switch(2)",
                                        "bandwidth_gbps": [lv.bandwidth_gbps for lv in cl.levels],
                                        "latency_ns": [lv.latency_s * 1e9 for lv in cl.levels]}})
    assert topo.iteration_time_s == pytest.approx(pre.iteration_time_s, rel=1e-9)
    assert topo.placement and topo.placement[0].startswith("tp=2: dim1")


def test_analytical_model_and_themis_run_end_to_end() -> None:
    base = {**JOB, "cluster": {"topology": "conv-3d"}, "strategy": {**JOB["strategy"], "dp": 128, "global_batch": 256}}
    runs = {s: simulate({**base, "simulation": {"comm_model": "analytical", "scheduler": s}}) for s in
            ("baseline", "themis")}
    assert runs["baseline"].n_gpus == 512
    assert runs["themis"].iteration_time_s <= runs["baseline"].iteration_time_s * (1 + 1e-9)


def test_topology_size_must_match_the_strategy() -> None:
    with pytest.raises(ConfigError, match="cluster.topology: .*512 NPUs but 16") as err:
        simulate({**JOB, "cluster": {"topology": "conv-4d"}})
    assert "\n" not in str(err.value)
