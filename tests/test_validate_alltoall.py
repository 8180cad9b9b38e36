"""alltoall.csv: nccl-tests all-to-all rows priced by NcclComm, DeepEP's normal-kernel bandwidths turned into times
with DeepEP's own byte count and compared with the two-hop dispatch a training simulation charges; the rest
skipped with their reasons."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from trainsim.cost.calibration import load_calibration
from trainsim.cost.comm import NcclComm, two_hop_dispatch
from trainsim.hardware.cluster import get_cluster
from trainsim.validate import runner
from trainsim.validate.alltoall import FP8_FACTOR, DeepEPSetting, alltoall_outcomes, deepep_destinations

HEADER = ["gpu", "n_gpus", "nodes", "network", "size_bytes", "time_us", "algbw_gbps", "busbw_gbps", "source",
          "collective", "bw_definition", "reported_bw_gbps", "notes"]
CAL = load_calibration()
SHARED = Path(__file__).resolve().parents[2] / "shared" / "validation" / "alltoall.csv"


def _row(**cells: str) -> dict[str, str]:
    return {c: cells.get(c, "") for c in HEADER}


def test_the_format_is_detected_before_collectives() -> None:
    assert runner.detect_kind(HEADER) == "alltoall"
    assert runner.detect_kind(["source_id", "gpu", "n_gpus", "n_nodes", "gpus_per_node", "collective", "size_bytes",
                               "time_us"]) == "collectives"


def test_an_nccl_tests_row_is_ncclcomms_all_to_all() -> None:
    row = _row(gpu="H100 80GB HBM3", n_gpus="4", nodes="1", size_bytes="524288000", time_us="1174.14",
               collective="nccl-tests alltoall_perf, out-of-place", network="NVSwitch; NCCL_ALGO=Ring")
    (out,) = alltoall_outcomes([row], CAL)
    cluster = get_cluster("dgx-h100", 1).customised(gpus_per_node=4)
    want = NcclComm(cluster, dict(CAL.comm)).time("all_to_all", 524288000, (0, 1, 2, 3)) * 1e6
    assert out.skipped is None and out.predicted == pytest.approx(want) and out.measured == 1174.14
    assert "nccl_env" in out.tags


def test_deepep_destinations_follow_its_routing() -> None:
    """One node: the top 8 of 256 experts uniformly, 32 per GPU: 8 (1 - C(224, 8) / C(256, 8)) GPUs per token;
    two nodes with at most min(2, 4) groups: both nodes nearly always."""
    nodes, ranks = deepep_destinations(1, 8)
    assert nodes == 1.0
    assert ranks == pytest.approx(8 * (1 - math.comb(224, 8) / math.comb(256, 8)), rel=0.01)
    assert deepep_destinations(2, 16)[0] == pytest.approx(2 * (1 - 0.5 ** 8), rel=0.01)
    assert deepep_destinations(8, 64)[0] <= 4.0  # the node limit: min(nodes, 4) groups


def test_a_deepep_row_compares_times_from_deepeps_byte_count() -> None:
    row = _row(gpu="H800", n_gpus="16", nodes="2", collective="DeepEP V1 normal-kernel dispatch (EP16)",
               bw_definition="'bottleneck bandwidth' over RDMA as reported by DeepEP", reported_bw_gbps="43")
    (out,) = alltoall_outcomes([row], CAL)
    st = DeepEPSetting()
    per_node, _ = deepep_destinations(2, 16, st)
    assert out.measured == pytest.approx(st.tokens * per_node * st.hidden * 2 * FP8_FACTOR / 43e9 * 1e6)
    moved, share = two_hop_dispatch(256, 8, 16, 2, 2)
    size = st.tokens * st.top_k * st.hidden * 2 * FP8_FACTOR
    want = NcclComm(get_cluster("dgx-h800", 2), dict(CAL.comm)).time("all_to_all", size * moved, tuple(range(16)),
                                                                     remote_share=share) * 1e6
    assert out.predicted == pytest.approx(want)
    combine = alltoall_outcomes([{**row, "collective": "DeepEP V1 normal-kernel combine (EP16)"}], CAL)[0]
    assert combine.predicted > out.predicted  # BF16 back: about twice the bytes


@pytest.mark.parametrize(("collective", "notes", "reason"), [
    ("DeepEP V1 low-latency dispatch (EP8)", "", "not a training dispatcher"),
    ("DeepEP V2 dispatch (EP 8 x 2, 12 SMs)", "", "bandwidth not convertible"),
    ("nccl-tests alltoall_perf, out-of-place", "ANOMALOUS: a pathology example", "marked anomalous"),
    ("ring all-to-all of something else", "", "collective not modelled"),
])
def test_rows_without_a_counterpart_say_why(collective: str, notes: str, reason: str) -> None:
    (out,) = alltoall_outcomes([_row(gpu="H800", n_gpus="8", collective=collective, notes=notes)], CAL)
    assert out.skipped is not None and out.skipped.startswith(reason)


def test_an_unknown_gpu_is_a_skip() -> None:
    row = _row(gpu="TPU v5p", n_gpus="8", size_bytes="1000", time_us="10", collective="nccl-tests alltoall_perf")
    (out,) = alltoall_outcomes([row], CAL)
    assert out.skipped is not None and "no cluster preset" in out.skipped


@pytest.mark.skipif(not SHARED.exists(), reason="needs ../shared/validation/alltoall.csv")
def test_the_shared_file_compares_every_convertible_row() -> None:
    header, rows = runner.read_rows(SHARED)
    report = runner.run_rows(runner.detect_kind(header), rows)
    assert len(report.compared) == 9  # 1 nccl-tests + 8 DeepEP normal-kernel rows
    reasons = sorted(o.skipped.split(":")[0] for o in report.skipped if o.skipped)
    assert reasons.count("not a training dispatcher") == 12 and reasons.count("bandwidth not convertible") == 10
    assert reasons.count("marked anomalous") == 2
    # sending every (token, expert) copy on NVLink made the one-node rows 58-63% slow (MAPE 23.9%)
    assert report.summary()["mape"] < 15.0
