"""Rows of `alltoall.csv` (nccl-tests all-to-all, DeepEP dispatch / combine) -> predicted vs measured times.

Two kinds of row are compared, each on the time of one call:
- nccl-tests `alltoall_perf` (size per rank, time as measured): NcclComm's all-to-all on the row's node.
- DeepEP V1 normal kernels (the MoE dispatch trainsim prices as `strategy.ep_dispatcher deepep`): DeepEP
  reports a 'bottleneck bandwidth', its own byte count over the kernel time (tests/legacy/test_internode.py,
  deepseek-ai/DeepEP@81a433ef): RDMA bytes = tokens x the nodes each token reaches, its own included, x
  hidden x 2 bytes (x (1 + 4/128) / 2 for FP8 with a scale per 128 values); NVLink bytes (one node) = the
  tokens a rank receives, one per (token, destination rank). The measured time is that byte count over the
  reported bandwidth, with the distinct destinations per token taken from the benchmark's own routing
  (random scores, the top min(nodes, 4) nodes by their best expert, then the top 8 of 256 experts there;
  `deepep_destinations`, a seeded sample). The prediction is what a training simulation charges for the same
  call: an all-to-all of every (token, expert) copy (tokens x top_k x bytes per token) whose cross-node part
  is sent once per destination node (cost.comm.two_hop_remote_share with the benchmark's node limit).
Rows the simulator has no counterpart for are skipped and say why: DeepEP's low-latency (inference decode)
kernels, DeepEP V2's 'logical bandwidth' (its byte count not defined in the source read), rows their own
notes call anomalous, GPUs without a preset.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from ..api import job_cluster
from ..cost.calibration import Calibration
from ..cost.comm import NcclComm, two_hop_dispatch
from ..hardware.cluster import Cluster
from .cases import Outcome, skip
from .training_runs import cluster_spec

REQUIRED_COLUMNS = ("gpu", "n_gpus", "nodes", "collective", "size_bytes", "time_us", "reported_bw_gbps",
                    "bw_definition")
GPUS_PER_NODE = 8
"""DeepEP's normal kernels assume 8 NVLink peers per node (its tests assert num_local_ranks == 8)."""


@dataclass(frozen=True)
class DeepEPSetting:
    """DeepEP's benchmark setting for its normal kernels (tests/legacy/test_internode.py defaults; the DeepSeek-V3
    pre-training setting its README names)."""

    tokens: int = 4096
    hidden: int = 7168
    experts: int = 256
    top_k: int = 8
    max_groups: int = 4  # --num-topk-groups default: min(nodes, 4)


FP8_FACTOR = (1 + 4 / 128) / 2
"""DeepEP's FP8 bytes per BF16 byte: one byte per value plus a 4-byte scale per 128 values, over two."""


def deepep_destinations(nodes: int, ranks: int, setting: DeepEPSetting = DeepEPSetting(), samples: int = 20000,
                        seed: int = 0) -> tuple[float, float]:
    """(nodes, ranks) one token reaches on average under DeepEP's benchmark routing: scores |N(0,1)| + 1 per
    expert, the top min(nodes, max_groups) nodes by their best score, the top_k experts among those nodes'
    experts; experts laid out evenly over ranks and nodes. A seeded sample (deterministic)."""
    rng = np.random.default_rng(seed)
    e, k = setting.experts, setting.top_k
    scores = np.abs(rng.standard_normal((samples, e))) + 1.0
    groups = min(nodes, setting.max_groups)
    best = scores.reshape(samples, nodes, e // nodes).max(axis=2)
    keep = np.argsort(-best, axis=1)[:, :groups]
    mask = np.zeros((samples, nodes), dtype=bool)
    np.put_along_axis(mask, keep, True, axis=1)
    masked = np.where(np.repeat(mask, e // nodes, axis=1), scores, -np.inf)
    chosen = np.argpartition(-masked, k - 1, axis=1)[:, :k]
    node_of, rank_of = chosen // (e // nodes), chosen // (e // ranks)

    def distinct(ids: np.ndarray) -> float:
        s = np.sort(ids, axis=1)
        return float((1 + (s[:, 1:] != s[:, :-1]).sum(axis=1)).mean())

    return distinct(node_of), distinct(rank_of)


def _cluster(row: dict[str, str], n: int) -> Cluster | str:
    """The row's cluster: training_runs' preset for its GPU, nodes of 8 (fewer GPUs: part of one node)."""
    if n % GPUS_PER_NODE and n > GPUS_PER_NODE:
        return f"{n} GPUs do not fill nodes of {GPUS_PER_NODE}"
    spec = cluster_spec({**row, "gpus_per_node": str(GPUS_PER_NODE)}, n, {})
    if isinstance(spec, str):
        return f"no cluster preset for gpu '{row.get('gpu', '')}' ({spec})"
    return job_cluster({"cluster": spec})


def _count(row: dict[str, str], column: str) -> float | None:
    try:
        v = float(row.get(column, "") or "nan")
    except ValueError:
        return None
    return v if math.isfinite(v) and v > 0 else None


def _nccl_tests(i: int, case_id: str, row: dict[str, str], calibration: Calibration) -> Outcome:
    n, size, measured = _count(row, "n_gpus"), _count(row, "size_bytes"), _count(row, "time_us")
    if n is None or size is None or measured is None:
        return skip(i, case_id, "missing column: n_gpus, size_bytes and time_us")
    cluster = _cluster(row, int(n))
    if isinstance(cluster, str):
        return skip(i, case_id, f"GPU or cluster not expressible: {cluster}")
    comm = NcclComm(cluster, dict(calibration.comm))
    choice = comm.choose("all_to_all", size, tuple(range(int(n))))
    tags = {"priced": f"NcclComm all-to-all of {size:.0f} B per rank on {cluster.name}, {int(n)} GPUs"}
    if re.search(r"NCCL_(ALGO|PROTO)", row.get("network", "")):
        tags["nccl_env"] = "NCCL_ALGO / NCCL_PROTO: all-to-all runs as point-to-point sends either way"
    pred = choice.time_s * 1e6
    return Outcome(row=i, case_id=case_id, metric="time_us", predicted=pred, measured=measured,
                   group=f"nccl-tests|{cluster.name}", throughput_pred=size / pred / 1e3,
                   throughput_meas=size / measured / 1e3, tags=tags)


def _deepep_normal(i: int, case_id: str, row: dict[str, str], calibration: Calibration) -> Outcome:
    n, bw = _count(row, "n_gpus"), _count(row, "reported_bw_gbps")
    if n is None or bw is None:
        return skip(i, case_id, "missing column: n_gpus and reported_bw_gbps")
    cluster = _cluster(row, int(n))
    if isinstance(cluster, str):
        return skip(i, case_id, f"GPU or cluster not expressible: {cluster}")
    st = DeepEPSetting()
    ranks = int(n)
    nodes = max(1, ranks // GPUS_PER_NODE)
    combine = "combine" in row.get("collective", "").lower()
    bytes_per_value = 2.0 if combine else 2.0 * FP8_FACTOR  # FP8 dispatch, BF16 combine (the rows' setting)
    per_node, per_rank = deepep_destinations(nodes, ranks, st)
    definition = row.get("bw_definition", "").lower()
    if "rdma" in definition:
        counted = st.tokens * per_node * st.hidden * bytes_per_value
        what = f"RDMA bytes: {per_node:.2f} nodes per token"
    elif "nvlink" in definition and nodes == 1:
        counted = st.tokens * per_rank * st.hidden * bytes_per_value
        what = f"NVLink bytes: {per_rank:.2f} ranks per token"
    else:
        return skip(i, case_id, f"bandwidth not convertible: '{row.get('bw_definition', '')}'")
    measured = counted / (bw * 1e9) * 1e6
    size = st.tokens * st.top_k * st.hidden * bytes_per_value
    moved, share = two_hop_dispatch(st.experts, st.top_k, ranks, nodes, min(nodes, st.max_groups))
    comm = NcclComm(cluster, dict(calibration.comm))
    pred = comm.choose("all_to_all", size * moved, tuple(range(ranks)), remote_share=share).time_s * 1e6
    tags = {"measured": f"DeepEP's {what} over its {bw:g} GB/s (DeepEP's benchmark routing, sampled)",
            "priced": f"trainsim's two-hop dispatch (ep_dispatcher deepep) of {st.tokens} tokens x top-{st.top_k} x "
                      f"{st.hidden} {'BF16' if combine else 'FP8'} values: {moved:.3f} of it moved (one copy per "
                      f"GPU reached), cross-node share {share:.3f}"}
    return Outcome(row=i, case_id=case_id, metric="time_us", predicted=pred, measured=measured,
                   group=f"deepep|{'combine' if combine else 'dispatch'}", throughput_pred=counted / pred / 1e3,
                   throughput_meas=bw, tags=tags)


def _row_outcome(i: int, row: dict[str, str], calibration: Calibration) -> Outcome:
    what = row.get("collective", "").strip()
    case_id = f"{what or '?'} {row.get('gpu', '?')} x{row.get('n_gpus', '?')}"
    low = what.lower()
    if "anomalous" in row.get("notes", "").lower():
        return skip(i, case_id, "marked anomalous: the row's own notes call it a pathology example")
    if "nccl-tests" in low and "alltoall" in low:
        return _nccl_tests(i, case_id, row, calibration)
    if "deepep v1 normal" in low:
        return _deepep_normal(i, case_id, row, calibration)
    if "low-latency" in low:
        return skip(i, case_id, "not a training dispatcher: DeepEP's low-latency kernels (inference decode, pure "
                    "RDMA, one copy per expert)")
    if "deepep v2" in low:
        return skip(i, case_id, "bandwidth not convertible: DeepEP V2's 'logical bandwidth' (its byte count is not "
                    "defined in the source read; the GPU is named by SM architecture only)")
    return skip(i, case_id, f"collective not modelled: '{what}'")


def alltoall_outcomes(rows: list[dict[str, str]], calibration: Calibration) -> list[Outcome]:
    """One outcome per row (skipped rows say why); throughputs are GB/s (algbw, or DeepEP's own bandwidth)."""
    missing = [c for c in REQUIRED_COLUMNS if rows and c not in rows[0]]
    if missing:
        return [skip(i, f"row{i}", f"missing column: {', '.join(missing)}") for i in range(len(rows))]
    return [_row_outcome(i, row, calibration) for i, row in enumerate(rows)]
