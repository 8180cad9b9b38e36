"""Rows of `collectives.csv` (nccl-tests sweeps, XLA's collective table) -> predicted vs measured times.

Each row builds its own cluster from its columns: the GPU picks the preset (A100 -> dgx-a100 with
a100-80gb, H100 -> dgx-h100), n_nodes and gpus_per_node size it, and `inter_fabric` gives the
network ("EFA 4x100G/node" -> 4 NICs of 12.5 GB/s on an EFA link). Where the source does not state
the network the preset's NICs (one per GPU) are used and the outcome's tags say so. Sizes follow
nccl-tests, which is also `NcclComm`'s convention; a forced NCCL_PROTO / NCCL_ALGO is honoured, a
stated NCCL release selects that release's tuning tables, and nccl-tests `-g N` (one thread driving N
GPUs) adds their serial kernel launches.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace

from ..cost.calibration import Calibration
from ..cost.comm import NcclComm
from ..hardware.cluster import Cluster, get_cluster
from ..hardware.devices import get_device
from .cases import Outcome, skip

REQUIRED_COLUMNS = ("source_id", "gpu", "n_gpus", "n_nodes", "gpus_per_node", "collective", "size_bytes",
                    "time_us")
_PRESETS = {"a100": ("dgx-a100", "a100-80gb"), "h100": ("dgx-h100", "h100-sxm")}
_COLLECTIVES = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
                "alltoall": "all_to_all", "broadcast": "broadcast", "reduce": "reduce",
                "sendrecv": "send_recv"}
_FABRICS = {"efa": "efa", "roce": "roce", "ib": "infiniband", "infiniband": "infiniband",
            "ethernet": "ethernet"}


def parse_fabric(text: str) -> tuple[str, int | None, float | None] | None:
    """'EFA 4x100G/node' -> ('efa', 4, 12.5): link type, NICs per node, GB/s per NIC (None = not stated).

    Returns None when the row names no network ('-', 'unknown', empty)."""
    t = text.strip().lower()
    if t in ("", "-", "unknown", "not stated"):
        return None
    words = re.findall(r"[a-z]+", t)
    kind = "tcpxo" if "tcpx" in t else next((_FABRICS[w] for w in words if w in _FABRICS), "infiniband")
    m = re.search(r"(\d+)\s*x\s*(\d+(?:\.\d+)?)\s*g", t)
    if m:
        return kind, int(m.group(1)), float(m.group(2)) / 8.0
    speed = re.search(r"(\d+(?:\.\d+)?)\s*g(?:bps|bit|b)?(?![a-z])", t)
    count = re.search(r"(\d+)\s*nics?", t)
    return kind, int(count.group(1)) if count else None, float(speed.group(1)) / 8.0 if speed else None


def row_cluster(row: dict[str, str]) -> tuple[Cluster, dict[str, str]] | str:
    """The row's cluster and the assumptions made building it, or why it cannot be built."""
    gpu = row["gpu"].strip().lower()
    preset = next((v for k, v in _PRESETS.items() if k in gpu), None)
    if preset is None:
        return f"no cluster preset for gpu '{row['gpu']}'"
    try:
        n, nodes, gpn = (int(row[k]) for k in ("n_gpus", "n_nodes", "gpus_per_node"))
    except ValueError as exc:
        return f"unreadable GPU counts: {exc}"
    if nodes < 1 or gpn < 1 or n != nodes * gpn:
        return f"n_gpus {n} != n_nodes {nodes} x gpus_per_node {gpn}"
    base = get_cluster(preset[0], nodes)
    fabric = parse_fabric(row.get("inter_fabric", "")) or ("infiniband", None, None)
    nics = fabric[1] or max(1, base.nics_per_node * gpn // base.gpus_per_node)  # preset: one NIC per GPU
    nic_gbps, kind = fabric[2] or base.nic_gbps, fabric[0]
    tags: dict[str, str] = {}
    if nodes > 1 and "assum" in row.get("inter_fabric", "").lower():
        tags["network"] = f"as assumed by the dataset: '{row['inter_fabric']}'"
    if nodes > 1 and (fabric[1] is None or fabric[2] is None):
        tags["network"] = (f"not stated in full ('{row.get('inter_fabric', '')}'): {preset[0]} preset NICs "
                           f"fill the gaps, {nics}x {nic_gbps:g} GB/s {kind} per node")
    cluster = base.customised(device=get_device(preset[1]), gpus_per_node=gpn, nics_per_node=nics,
                              nic_gbps=nic_gbps)
    net = cluster.network_level
    if net is not None and kind != net.name:
        cluster = replace(cluster, levels=(*cluster.levels[:-1], replace(net, name=kind)))
    return cluster, tags


def _forced(text: str, key: str) -> tuple[str, ...] | None:
    """Values of an NCCL_PROTO= / NCCL_ALGO= setting named in the row, lower-cased."""
    m = re.search(rf"{key}\s*=\s*([A-Za-z0-9_,]+)", text, flags=re.IGNORECASE)
    return tuple(v.strip().lower() for v in m.group(1).split(",") if v.strip()) if m else None


def gpus_per_thread(row: dict[str, str]) -> int:
    """GPUs one host thread drives in the measurement: nccl-tests `-g N` (one process, N GPUs), else 1."""
    m = re.search(r"(?:^|\s)-g\s*(\d+)", row.get("measurement_kind", ""))
    return max(1, int(m.group(1))) if m else 1


def _row_outcome(i: int, row: dict[str, str], calibration: Calibration) -> Outcome:
    sid = row.get("source_id", "").strip() or f"row{i}"
    coll = _COLLECTIVES.get(row.get("collective", "").strip().lower().replace("_", ""))
    case_id = f"{sid}-{row.get('collective', '?')}-{row.get('n_gpus', '?')}gpu-{row.get('size_bytes', '?')}B"
    if coll is None:
        return skip(i, case_id, f"collective '{row.get('collective')}' is not modelled", source=sid)
    try:
        size, measured_us = float(row["size_bytes"]), float(row["time_us"])
    except (KeyError, ValueError) as exc:
        return skip(i, case_id, f"unreadable size/time: {exc}", source=sid)
    if not (math.isfinite(size) and math.isfinite(measured_us)) or size <= 0 or measured_us <= 0:
        return skip(i, case_id, "size and time must be positive", source=sid)
    built = row_cluster(row)
    if isinstance(built, str):
        return skip(i, case_id, built, source=sid)
    cluster, tags = built
    setting = row.get("algo_proto_or_env", "")
    protos = _forced(setting, "NCCL_PROTO") or ("ll", "ll128", "simple")
    algos = _forced(setting, "NCCL_ALGO") or ("ring", "tree", "nvls", "nvls_tree", "p2p")
    try:
        comm = NcclComm(cluster, dict(calibration.comm), protocols=protos, algorithms=algos,
                        nccl_version=row.get("nccl_version") or None, gpus_per_thread=gpus_per_thread(row))
    except ValueError as exc:
        return skip(i, case_id, f"cannot honour '{setting}': {exc}", source=sid)
    choice = comm.choose(coll, size, tuple(range(cluster.world_size)))
    predicted_us = choice.time_s * 1e6
    tags.update(source=sid, algorithm=choice.algorithm, protocol=choice.protocol)
    return Outcome(row=i, case_id=case_id, metric="time_us", predicted=predicted_us, measured=measured_us,
                   group=f"{sid}|{coll}|{cluster.world_size}gpu", throughput_pred=size / predicted_us / 1e3,
                   throughput_meas=size / measured_us / 1e3, tags=tags)


def collective_outcomes(rows: list[dict[str, str]], calibration: Calibration) -> list[Outcome]:
    """One outcome per row (skipped rows say why); throughputs are algbw in GB/s for ranking."""
    missing = [c for c in REQUIRED_COLUMNS if rows and c not in rows[0]]
    if missing:
        return [skip(i, f"row{i}", f"missing columns {missing}") for i in range(len(rows))]
    return [_row_outcome(i, row, calibration) for i, row in enumerate(rows)]
