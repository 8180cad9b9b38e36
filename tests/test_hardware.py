"""Tests for the hardware catalogue: device peaks and lookup, cluster presets and topology maths."""

from __future__ import annotations

import copy
import math
import pickle

import pytest

from trainsim.hardware import (
    CLUSTERS,
    DEVICES,
    Cluster,
    Device,
    Level,
    custom_cluster,
    get_cluster,
    get_device,
)

# --- devices ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "dtype", "tflops"),
    [
        ("a100-80gb", "fp32", 19.5),
        ("a100-80gb", "tf32", 156.0),
        ("a100-80gb", "bf16", 312.0),
        ("h100-sxm", "fp16", 989.4),
        ("h100-sxm", "fp8", 1978.9),
        ("h100-sxm", "tf32", 494.7),
        ("h200-sxm", "bf16", 989.4),
        ("b200", "bf16", 2250.0),
        ("b200", "fp8", 4500.0),
        ("b300", "fp8", 72_000 / 8 / 2),  # HGX B300: 72 PF FP8 with sparsity per 8 GPUs
        ("b300", "bf16", 36_000 / 8 / 2),
        ("gb300", "fp8", 720_000 / 72 / 2),  # GB300 NVL72: 720 PF FP8 with sparsity per 72 GPUs
        ("gb300", "bf16", 360_000 / 72 / 2),
        ("h800-sxm", "bf16", 989.4),
        ("v100-sxm2-32gb", "fp16", 125.0),
        ("a40", "fp16", 149.7),
        ("rtx-a5500", "fp16", 136.4),
        ("gtx-1080-ti", "fp32", 11.3),
        ("titan-xp", "fp32", 12.1),
    ],
)
def test_peak_flops_matches_datasheet(name: str, dtype: str, tflops: float) -> None:
    assert get_device(name).peak_flops(dtype) == pytest.approx(tflops * 1e12)


@pytest.mark.parametrize(
    ("name", "gib", "gbps", "sms"),
    [
        ("a100-40gb", 40, 1555.0, 108),
        ("a100-80gb", 80, 2039.0, 108),
        ("h100-sxm", 80, 3350.0, 132),
        ("h200-sxm", 141, 4800.0, 132),
        ("b200", 180, 8000.0, 148),
        ("b300", 288, 8000.0, 160),  # 2.3 TB and 64 TB/s per 8 GPUs
        ("gb300", 278, 8000.0, 160),  # 20 TB and 576 TB/s per 72 GPUs
        ("v100-sxm2-16gb", 16, 900.0, 80),
        ("gtx-1080-ti", 11, 484.0, 28),
        ("titan-xp", 12, 547.7, 30),
    ],
)
def test_memory_and_sms(name: str, gib: int, gbps: float, sms: int) -> None:
    dev = get_device(name)
    assert dev.hbm_bytes == gib * 2**30
    assert dev.hbm_gbps == gbps
    assert dev.sms == sms


def test_h200_has_h100_compute_but_more_memory() -> None:
    h100, h200 = get_device("h100"), get_device("h200")
    assert dict(h200.peak_tflops) == dict(h100.peak_tflops)
    assert h200.hbm_bytes > h100.hbm_bytes and h200.hbm_gbps > h100.hbm_gbps


def test_every_device_has_source_and_known_dtypes() -> None:
    for name, dev in DEVICES.items():
        assert dev.name == name
        assert len(dev.source) > 20, name
        assert set(dev.peak_tflops) <= {"fp32", "tf32", "fp16", "bf16", "fp8", "fp4"}
        assert "fp32" in dev.peak_tflops, name


def test_fp16_bf16_fallback_only_between_half_types() -> None:
    v100 = get_device("v100")
    assert v100.peak_flops("bf16") == v100.peak_flops("fp16") == 125e12
    with pytest.raises(KeyError, match="tf32"):
        v100.peak_flops("tf32")
    with pytest.raises(KeyError, match="fp8"):
        get_device("a100").peak_flops("fp8")


def test_dtype_spellings_are_normalised() -> None:
    a100 = get_device("a100")
    assert a100.peak_flops("bfloat16") == a100.peak_flops("BF16") == 312e12
    assert a100.peak_flops("torch.float32") == 19.5e12


def test_pascal_fp16_runs_at_fp32_rate() -> None:
    for name in ("gtx-1080-ti", "titan-xp"):
        dev = get_device(name)
        assert dev.peak_flops("fp16") == dev.peak_flops("fp32") == dev.peak_flops("bf16")


@pytest.mark.parametrize(
    ("alias", "canonical"),
    [
        ("a100", "a100-80gb"),
        ("A100", "a100-80gb"),
        ("h100", "h100-sxm"),
        ("v100", "v100-sxm2-32gb"),
        ("titanxp", "titan-xp"),
        ("Titan Xp", "titan-xp"),
        ("1080ti", "gtx-1080-ti"),
        ("GTX_1080_Ti", "gtx-1080-ti"),
        ("A100-40GB", "a100-40gb"),
    ],
)
def test_alias_lookup(alias: str, canonical: str) -> None:
    assert get_device(alias) is DEVICES[canonical]


def test_unknown_device_names_known_ones() -> None:
    with pytest.raises(KeyError) as info:
        get_device("tpu-v4")
    message = str(info.value)
    assert "unknown device 'tpu-v4'" in message
    assert "a100-80gb" in message and "titan-xp" in message


def test_device_is_immutable_hashable_and_picklable() -> None:
    dev = get_device("h100")
    with pytest.raises(TypeError):
        dev.peak_tflops["fp16"] = 1.0  # type: ignore[index]
    assert hash(dev) == hash(get_device("h100-sxm"))
    assert pickle.loads(pickle.dumps(dev)) == dev
    assert copy.deepcopy(dev) == dev


def test_device_validation() -> None:
    with pytest.raises(ValueError, match="unknown dtype"):
        Device("x", {"int8": 1.0}, 1, 1.0, 1, "made up")
    with pytest.raises(ValueError, match="positive"):
        Device("x", {"fp32": 1.0}, 0, 1.0, 1, "made up")


# --- clusters --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "device", "world"),
    [
        ("dgx-a100", "a100-80gb", 8),
        ("dgx-h100", "h100-sxm", 8),
        ("hgx-h200", "h200-sxm", 8),
        ("dgx-b200", "b200", 8),
        ("dgx-h800", "h800-sxm", 8),
        ("dgx-b300", "b300", 8),
        ("gb200-nvl72", "gb200", 72),
        ("gb300-nvl72", "gb300", 72),
        ("dgx1-v100", "v100-sxm2-32gb", 8),
        ("pcie-titanxp", "titan-xp", 8),
        ("pcie-1080ti-10gbe", "gtx-1080-ti", 1),
    ],
)
def test_preset_defaults(name: str, device: str, world: int) -> None:
    cluster = get_cluster(name)
    assert cluster.name == name
    assert cluster.device is DEVICES[device]
    assert cluster.nodes == 1
    assert cluster.world_size == world


@pytest.mark.parametrize(
    ("name", "nodes"),
    [
        (name, nodes)
        for name in sorted(CLUSTERS)
        for nodes in (1, 4)
        if not (name == "pcie-titanxp" and nodes > 1)
    ],
)
def test_level_sizes_multiply_to_world_size(name: str, nodes: int) -> None:
    cluster = get_cluster(name, nodes)
    assert cluster.world_size == cluster.gpus_per_node * nodes
    assert math.prod(level.size for level in cluster.levels) == cluster.world_size
    if cluster.has_network:
        assert cluster.levels[-1].size == nodes
    assert cluster.source and cluster.description


def test_interconnect_numbers() -> None:
    a100 = get_cluster("dgx-a100")
    assert a100.intra_node_bandwidth_gbps == 300.0
    assert a100.inter_node_bandwidth_gbps == 25.0
    assert (a100.nics_per_node, a100.nic_gbps) == (8, 25.0)
    h100 = get_cluster("dgx-h100")
    assert (h100.intra_node_bandwidth_gbps, h100.inter_node_bandwidth_gbps) == (450.0, 50.0)
    assert get_cluster("dgx-b200").intra_node_bandwidth_gbps == 900.0
    # H800: the H100's compute behind 8 NVLinks (400 GB/s bidirectional); Blackwell Ultra: 800 Gb/s NICs
    h800 = get_cluster("dgx-h800", 2)
    assert (h800.intra_node_bandwidth_gbps, h800.inter_node_bandwidth_gbps) == (200.0, 50.0)
    assert h800.device.peak_tflops == DEVICES["h100-sxm"].peak_tflops
    for name in ("dgx-b300", "gb300-nvl72"):
        c = get_cluster(name, 2)
        assert (c.intra_node_bandwidth_gbps, c.nic_gbps) == (900.0, 100.0)
    assert get_cluster("gb300-nvl72", 2).world_size == 144  # a 'node' is the 72-GPU NVLink domain
    v100 = get_cluster("dgx1-v100")
    assert (v100.nics_per_node, v100.nic_gbps) == (1, 12.5)
    assert v100.inter_node_bandwidth_gbps == pytest.approx(12.5 / 8)
    titan = get_cluster("pcie-titanxp")
    assert [level.name for level in titan.levels] == ["pcie", "qpi"]
    assert titan.intra_node_bandwidth_gbps == 6.0  # slowest intra-node level
    assert titan.inter_node_bandwidth_gbps == 0.0 and titan.nic_gbps == 0.0
    gtx = get_cluster("pcie-1080ti-10gbe", 4)
    assert gtx.inter_node_bandwidth_gbps == 1.25
    assert gtx.intra_node_bandwidth_gbps == math.inf
    assert gtx.levels[-1].latency_s > a100.levels[-1].latency_s > a100.levels[0].latency_s


def test_with_nodes_rebuilds_network_level() -> None:
    base = get_cluster("dgx-h100")
    big = base.with_nodes(16)
    assert big.nodes == 16 and big.world_size == 128
    assert big.levels[0] == base.levels[0]
    assert big.levels[-1].size == 16
    assert big.levels[-1].bandwidth_gbps == base.levels[-1].bandwidth_gbps
    assert base.nodes == 1  # original untouched
    assert big == get_cluster("dgx-h100", 16)
    assert big.with_nodes(1) == base


def test_single_box_preset_refuses_more_nodes() -> None:
    titan = get_cluster("pcie-titanxp")
    with pytest.raises(ValueError, match="only 1 node"):
        titan.with_nodes(2)
    with pytest.raises(ValueError):
        get_cluster("pcie-titanxp", 2)
    assert titan.with_nodes(1) is titan


def test_with_nodes_rejects_non_positive() -> None:
    with pytest.raises(ValueError):
        get_cluster("dgx-a100").with_nodes(0)


def test_level_of_titanxp_same_switch_and_across_sockets() -> None:
    titan = get_cluster("pcie-titanxp")
    assert titan.level_of(0, 3) == 0  # same PCIe switch
    assert titan.level_of(4, 7) == 0
    assert titan.level_of(3, 4) == 1  # across the QPI link
    assert titan.level_of(0, 7) == 1
    assert titan.levels[titan.level_of(1, 5)].name == "qpi"


def test_level_of_across_nodes() -> None:
    dgx = get_cluster("dgx-a100", 4)
    assert dgx.level_of(0, 7) == 0
    assert dgx.level_of(7, 8) == 1  # rank 8 is local rank 0 of node 1
    assert dgx.levels[dgx.level_of(3, 27)].name == "infiniband"
    assert dgx.level_of(5, 2) == dgx.level_of(2, 5)
    gtx = get_cluster("pcie-1080ti-10gbe", 3)
    assert gtx.level_of(0, 2) == 0 and gtx.levels[0].name == "ethernet"


def test_level_of_rejects_bad_ranks() -> None:
    dgx = get_cluster("dgx-a100")
    with pytest.raises(ValueError):
        dgx.level_of(0, 8)
    with pytest.raises(ValueError):
        dgx.level_of(-1, 0)
    with pytest.raises(ValueError):
        dgx.level_of(2, 2)


def test_get_cluster_names() -> None:
    assert get_cluster("DGX_A100").name == "dgx-a100"
    assert get_cluster("titanxp").name == "pcie-titanxp"
    with pytest.raises(KeyError) as info:
        get_cluster("tpu-pod")
    assert "dgx-h100" in str(info.value) and "pcie-titanxp" in str(info.value)


def test_custom_cluster() -> None:
    cluster = custom_cluster("a100", 4, 3, intra_gbps=100.0, inter_gbps=10.0, inter_latency_s=8e-6)
    assert cluster.world_size == 12
    assert cluster.device is DEVICES["a100-80gb"]
    assert [level.size for level in cluster.levels] == [4, 3]
    assert cluster.intra_node_bandwidth_gbps == 100.0
    assert cluster.inter_node_bandwidth_gbps == 10.0
    assert cluster.levels[-1].latency_s == 8e-6
    assert cluster.level_of(3, 4) == 1
    assert cluster.with_nodes(5).world_size == 20
    solo = custom_cluster("v100", 2, 1, intra_gbps=50.0, inter_gbps=0.0)
    assert not solo.has_network and len(solo.levels) == 1
    with pytest.raises(ValueError):
        solo.with_nodes(2)


def test_cluster_validation() -> None:
    dev = get_device("a100")
    nvs = Level("nvswitch", "switch", 8, 300.0, 1e-6)
    with pytest.raises(ValueError, match="product of level sizes"):
        Cluster("bad", dev, 8, 2, (nvs, Level("infiniband", "switch", 3, 25.0, 5e-6)), 8, 25.0, "", "x")
    with pytest.raises(ValueError, match="nodes must be 1"):
        Cluster("bad", dev, 4, 2, (Level("pcie", "switch", 8, 12.0, 2e-6),), 0, 0.0, "", "x")
    with pytest.raises(ValueError, match="kind"):
        Level("x", "torus", 2, 1.0, 0.0)


def test_clusters_are_hashable_and_picklable() -> None:
    cluster = get_cluster("dgx-h100", 2)
    assert hash(cluster) == hash(get_cluster("dgx-h100", 2))
    assert pickle.loads(pickle.dumps(cluster)) == cluster


def test_h800_is_priced_with_the_h100_kernels() -> None:
    """The H800 is the H100's die: the same compute calibration (the h100 entry), only its NVLink differs."""
    from trainsim.cost.calibration import device_family, load_calibration

    cal = load_calibration(None)
    assert cal.compute[device_family(get_device("h800"))] == cal.compute["h100"]
