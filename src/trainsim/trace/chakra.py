"""Chakra execution traces (ASTRA-sim 2.0's workload format) to and from trainsim execution graphs.

A Chakra ET workload is one protobuf file per NPU, `<prefix>.<rank>.et`: a GlobalMetadata message,
then Node messages, each length-delimited (the `mlc-chakra` package's schema `et_def.proto` and its
protolib codec, used here; install with `pip install 'trainsim[chakra]'`).

Node types and the attributes read, as ASTRA-sim's workload layer reads them
(astra-sim/astra-sim `astra-sim/workload/Workload.cc`, `issue_comp` / `issue_coll_comm` /
`issue_send_comm` / `issue_recv_comm` / `issue_remote_mem`):
- COMP_NODE: `duration_micros` (replayed), else `num_ops` / `tensor_size` on a roofline
  (time = num_ops / min(peak, HBM bandwidth x num_ops / tensor_size)); `is_cpu_op` marks host ops.
- COMM_COLL_NODE: `comm_type` (CollectiveCommType), `comm_size`, `pg_name` naming a communicator group
  of ASTRA-sim's comm-group JSON file (`--comm-group-configuration`; "" or absent: all NPUs).
- COMM_SEND_NODE / COMM_RECV_NODE: `comm_src`, `comm_dst`, `comm_tag`, `comm_size` (bytes sent).
- MEM_LOAD_NODE / MEM_STORE_NODE: `tensor_size` (bytes), a remote-memory access.
Dependencies are `data_deps` and `ctrl_deps` (node ids of the same file).

`comm_size` follows ASTRA-sim's own convention, not nccl-tests': for an all-gather it is the per-NPU
*input* (its ring all-gather sends `comm_size` per step and ends with `comm_size x n`:
astra-sim `system/collective/Ring.cc`, `final_data_size = data_size * nodes_in_ring`); reduce-scatter
is the per-NPU input, all-reduce / broadcast / reduce the buffer, all-to-all the send buffer per NPU,
exactly as nccl-tests. trainsim's cost models use nccl-tests sizes (all-gather = gathered output), so
import multiplies an all-gather's `comm_size` by the group size and export divides
(`nccl_bytes` / `astra_comm_size`).

Import (`load_chakra`) builds a per-rank graph (one RankClass per rank, multiplicity 1): compute on
Stream.COMPUTE, collectives on Stream.GRAD (FEATURE where the ET says so with `trainsim_stream`), sends
on Stream.P2P, memory on Stream.MEMORY. A collective is one task joined by every member rank, the k-th
collective a rank issues in a group matching the k-th of every other member (ASTRA-sim has no
collective id either). A send is one P2P task on the sender; its matching receive (same src, dst, tag,
in issue order) costs no time of its own: whatever waits on the receive waits on the send instead.
Streams run their tasks in order (CUDA semantics; a rank's nodes are ordered by a topological sort
that keeps file order), where ASTRA-sim issues any dependency-free node on a free resource and keeps
one GPU op, one CPU op, one communication and one memory op in flight per NPU
(astra-sim `workload/HardwareResource.cc`); trainsim overlaps collectives of different streams.

Export (`write_chakra`) writes any ExecutionGraph so ASTRA-sim can run it. A class with many ranks (a
pipeline stage in symmetric mode) is expanded into one file per rank, each rank's collectives over its
own group (derived from the class representative's group `ExecutionGraph.comm_ranks`). Tasks that are
not plain communication export as COMP nodes with their duration: in the default granularity TP/CP
collectives are fused into compute chains (compile.graph.coarsen) and go out as COMP nodes, so build
the graph with `granularity="op"` for a faithful export of every collective. Cross-rank dependencies
other than pipeline sends are dropped (Chakra has none). Every node also carries `trainsim_*`
attributes (exact duration in seconds, stream, category, host time, memory effect) that ASTRA-sim
ignores and `load_chakra` reads back, so an export imports to the same simulation.
"""

from __future__ import annotations

import contextlib
import heapq
import io
import json
import math
import re
import shutil
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from ..compile.graph import ExecutionGraph, RankClass
from ..compile.program import Stream
from ..cost.comm import CommModel
from ..errors import ConfigError
from ..files import (
    MAX_BINARY_BYTES,
    Outputs,
    OutputTarget,
    Payload,
    check_file_prefix,
    check_output,
    check_output_dir,
    gunzip_bounded,
    load_json,
    read_bytes,
)
from ..hardware.cluster import Cluster, get_cluster
from ..hardware.devices import DTYPES

# collective names (trainsim / nccl-tests) <-> Chakra CollectiveCommType names
CHAKRA_COLLECTIVES: dict[str, str] = {
    "ALL_REDUCE": "all_reduce", "REDUCE": "reduce", "ALL_GATHER": "all_gather", "BROADCAST": "broadcast",
    "ALL_TO_ALL": "all_to_all", "REDUCE_SCATTER": "reduce_scatter", "REDUCE_SCATTER_BLOCK": "reduce_scatter",
    "BARRIER": "all_reduce",  # a barrier is priced as a zero-byte all-reduce (latency only)
}
TO_CHAKRA: dict[str, str] = {"all_reduce": "ALL_REDUCE", "reduce": "REDUCE", "all_gather": "ALL_GATHER",
                             "broadcast": "BROADCAST", "all_to_all": "ALL_TO_ALL",
                             "reduce_scatter": "REDUCE_SCATTER"}
SCHEMA = "1.0.2-chakra.1.0.0"  # what mlc-chakra 1.0's converters write in GlobalMetadata
COMM_GROUP_SUFFIX = ".comm_group.json"
DURATIONS = ("model", "recorded")
CPU_OPS = ("serial", "skip")

# trainsim's own node attributes (ASTRA-sim ignores unknown names)
A_DURATION = "trainsim_duration_s"
A_STREAM = "trainsim_stream"
A_CATEGORY = "trainsim_category"
A_HOST = "trainsim_host_s"
A_HOST_PATH = "trainsim_host_path_s"
A_HOST_SYNC = "trainsim_host_sync"  # the host waits for the node's dependencies before issuing it
A_MEM_PEAK = "trainsim_mem_peak_bytes"
A_MEM_NET = "trainsim_mem_net_bytes"
A_PARTS_KEYS = "trainsim_parts"
A_PARTS_S = "trainsim_parts_s"
A_MB = "trainsim_micro_batch"
A_BYTES = "trainsim_comm_bytes"
M_RANK, M_STAGE, M_STATIC = "trainsim_rank", "trainsim_stage", "trainsim_static_bytes"


class MemoryTimer(Protocol):
    """Any memory system (hardware.memory_systems): seconds for one MemoryAccess."""

    def time_s(self, access: Any) -> float: ...


# --------------------------------------------------------------------------------------------------
# size conventions
# --------------------------------------------------------------------------------------------------

def nccl_bytes(op: str, comm_size: float, group_size: int) -> float:
    """ASTRA-sim `comm_size` -> nccl-tests bytes: an all-gather's per-NPU input x group size; else as is."""
    return comm_size * group_size if op == "all_gather" else comm_size


def astra_comm_size(op: str, size_bytes: float, group_size: int) -> float:
    """nccl-tests bytes -> ASTRA-sim `comm_size` (the inverse of `nccl_bytes`)."""
    return size_bytes / group_size if op == "all_gather" and group_size > 0 else size_bytes


# --------------------------------------------------------------------------------------------------
# codec (mlc-chakra's schema and protolib)
# --------------------------------------------------------------------------------------------------

def _pb() -> Any:
    try:
        from chakra.schema.protobuf import et_def_pb2
    except ImportError:
        raise ConfigError("chakra", "the mlc-chakra package is not installed",
                          "pip install 'trainsim[chakra]'") from None
    return et_def_pb2


def _protolib() -> Any:
    _pb()
    from chakra.src.third_party.utils import protolib

    return protolib


class _Reader(io.BytesIO):
    """A byte stream that notes a short read (a truncated message)."""

    short = False

    def read(self, n: int | None = -1) -> bytes:
        data = super().read(n)
        if n is not None and n > 1 and len(data) < n:
            self.short = True
        return data


@dataclass
class EtFile:
    """One decoded `.et` file: its path, GlobalMetadata and Node messages in file order."""

    path: Path
    metadata: Any
    nodes: list[Any]


def _common_attrs(a: dict[str, Any], where: str) -> dict[str, Any]:
    """trainsim's own per-node attributes (micro-batch, memory, host time, fused parts); a malformed one is a
    one-line ConfigError naming the node, not a crash deep in the import."""
    try:
        return {
            "mb": int(a.get(A_MB, -1)), "mem_peak": float(a.get(A_MEM_PEAK, 0.0)),
            "mem_net": float(a.get(A_MEM_NET, 0.0)), "host_s": float(a.get(A_HOST, 0.0)),
            "host_path_s": float(a[A_HOST_PATH]) if A_HOST_PATH in a else None,
            "host_sync": bool(a.get(A_HOST_SYNC, False)),
            "parts": dict(zip(a[A_PARTS_KEYS], map(float, a[A_PARTS_S]), strict=True)) if A_PARTS_KEYS in a else None}
    except (KeyError, ValueError, TypeError) as exc:
        raise ConfigError(where, f"malformed trainsim attributes ({type(exc).__name__}: {exc})",
                          "re-write the trace with `trainsim chakra export`") from None


def read_et(path: str | Path) -> EtFile:
    """Decode one Chakra ET file (plain or gzipped); one-line ConfigError naming the file when it is not one."""
    pb, lib = _pb(), _protolib()
    from google.protobuf.message import DecodeError

    p = Path(path)
    raw = read_bytes(p, str(p), max_bytes=MAX_BINARY_BYTES, what="Chakra ET file",
                     fix="check the path (files are named <prefix>.<rank>.et)")
    if raw[:2] == b"\x1f\x8b":
        raw = gunzip_bounded(raw, str(p), max_bytes=MAX_BINARY_BYTES, what="Chakra ET file",
                             fix="re-write or re-compress the trace")
    stream = _Reader(raw)
    bad = ConfigError(str(p), "not a Chakra ET file (no length-delimited GlobalMetadata + Node messages)",
                      "write it with chakra's generator/converters or `trainsim chakra export`")
    meta = pb.GlobalMetadata()
    try:
        if (not lib.decodeMessage(stream, meta) and stream.tell() == 0) or stream.short:
            raise bad  # (a zero-length GlobalMetadata reads as False too, but past its length byte)
        nodes = []
        while True:
            node = pb.Node()
            if not lib.decodeMessage(stream, node):
                break
            if stream.short:
                raise ConfigError(str(p), f"truncated after {len(nodes)} nodes", "re-write the trace") from None
            nodes.append(node)
    except DecodeError:
        raise bad from None
    if stream.tell() != len(raw):
        raise bad
    return EtFile(p, meta, nodes)


def _attrs(msg: Any) -> dict[str, Any]:
    """A node's (or metadata's) attributes by name, lists as Python lists."""
    out: dict[str, Any] = {}
    for a in msg.attr:
        kind = a.WhichOneof("value")
        if kind is None:
            continue
        v = getattr(a, kind)
        out[a.name] = list(v.values) if kind.endswith("_list") else v
    return out


def et_files(source: str | Path) -> list[Path]:
    """The per-rank files of a workload: `source` is a prefix (`dir/name` for dir/name.<rank>.et) or a
    directory holding one such set. Ranks must run 0..N-1 with none missing."""
    if str(source) == "":
        raise ConfigError("PREFIX", "empty path", "pass the prefix of the per-rank files, e.g. DIR/NAME for DIR/NAME.0.et")
    src = Path(source)
    if src.is_dir():
        found = [p for p in src.iterdir() if re.fullmatch(r".+\.\d+\.et", p.name)]
        prefixes = sorted({p.name.rsplit(".", 2)[0] for p in found})
        if len(prefixes) != 1:
            what = "no <prefix>.<rank>.et files" if not prefixes else f"several workloads ({', '.join(prefixes)})"
            raise ConfigError(str(src), f"{what} in the directory", "pass the prefix, e.g. DIR/NAME for DIR/NAME.0.et")
        src = src / prefixes[0]
    pat = re.compile(re.escape(src.name) + r"\.(\d+)\.et")
    parent = src.parent if str(src.parent) else Path(".")
    ranks: dict[int, Path] = {}
    if parent.is_dir():
        for p in parent.iterdir():
            m = pat.fullmatch(p.name)
            if m:
                ranks[int(m.group(1))] = p
    if not ranks:
        raise ConfigError(str(source), f"no Chakra ET files {src}.<rank>.et",
                          "pass the prefix of the per-rank files (without .<rank>.et)")
    missing = [r for r in range(max(ranks) + 1) if r not in ranks]
    if missing:
        raise ConfigError(f"{src}.{missing[0]}.et", "missing: ranks must be numbered 0..N-1",
                          "export every rank or rename the files")
    return [ranks[r] for r in range(len(ranks))]


def _load_groups(path: Path | None, world: int) -> dict[str, tuple[int, ...]]:
    """ASTRA-sim's communicator-group JSON ({name: [ranks]}); "" is the whole world."""
    groups: dict[str, tuple[int, ...]] = {"": tuple(range(world))}
    if path is None:
        return groups
    data = load_json(path, "--comm-groups", what="comm group JSON", fix='write {"<pg_name>": [rank, ...], ...}')
    if not isinstance(data, dict):
        raise ConfigError(str(path), "must map group names to rank lists", 'write {"1": [0, 1], ...}')
    for name, ranks in data.items():
        if not isinstance(ranks, list) or not ranks or not all(isinstance(r, int) and 0 <= r < world for r in ranks):
            raise ConfigError(str(path), f"group '{name}' must be a non-empty list of ranks in 0..{world - 1}",
                              "fix the group or the number of .et files")
        groups[str(name)] = tuple(sorted(set(ranks)))
    return groups


# --------------------------------------------------------------------------------------------------
# import
# --------------------------------------------------------------------------------------------------

@dataclass
class _Costs:
    """How imported nodes get their durations (see `load_chakra`)."""

    cluster: Cluster | None
    comm: CommModel | None
    memory: MemoryTimer | None
    memory_location: str
    dtype: str

    def _need(self, where: str) -> Cluster:
        if self.cluster is None:
            raise ConfigError("cluster", f"{where} has no recorded duration, so it needs a cost model",
                              "pass a cluster (--cluster NAME)")
        return self.cluster

    def compute_s(self, num_ops: float, tensor_bytes: float, where: str) -> float:
        """Roofline, as ASTRA-sim's: the longer of FLOPs at peak and bytes at HBM bandwidth."""
        dev = self._need(where).device
        try:
            peak = dev.peak_flops(self.dtype)
        except KeyError:
            raise ConfigError("dtype", f"{dev.name} has no {self.dtype} peak", f"use one of {', '.join(dev.dtypes)}") \
                from None
        return max(num_ops / peak, tensor_bytes / (dev.hbm_gbps * 1e9))

    def comm_s(self, op: str, size_bytes: float, group: tuple[int, ...], where: str) -> float:
        if self.comm is None:
            self._need(where)
        assert self.comm is not None
        return self.comm.time(op, size_bytes, group, 1)

    def memory_s(self, kind: str, size_bytes: float, where: str) -> float:
        if self.memory is None:  # local HBM: size / bandwidth
            return size_bytes / (self._need(where).device.hbm_gbps * 1e9)
        from ..hardware.memory_systems import MemoryAccess

        return self.memory.time_s(MemoryAccess(kind, size_bytes, self.memory_location))


def resolve_cluster(cluster: Cluster | str | None, nodes: int | None, world: int) -> Cluster | None:
    """A cluster (or preset name, sized to `nodes` or to the trace's `world` ranks) that holds the trace;
    one-line ConfigError on --cluster / --nodes otherwise."""
    if cluster is None or isinstance(cluster, Cluster):
        if isinstance(cluster, Cluster) and cluster.world_size < world:
            raise ConfigError("cluster", f"{cluster.name} has {cluster.world_size} GPUs but the trace has {world} "
                              "ranks", "use a larger cluster (--nodes)")
        return cluster
    try:
        base = get_cluster(cluster)
    except KeyError:
        raise ConfigError("--cluster", f"unknown cluster '{cluster}'", "see `trainsim clusters`") from None
    n = nodes if nodes is not None else max(1, math.ceil(world / base.gpus_per_node))
    try:
        cl = base.with_nodes(n)
    except ValueError as exc:
        raise ConfigError("--nodes", str(exc), "pick a cluster with a network or fewer ranks") from None
    if cl.world_size < world:
        raise ConfigError("--nodes", f"{n} nodes of {cluster} have {cl.world_size} GPUs but the trace has {world} "
                          "ranks", f"use --nodes {math.ceil(world / cl.gpus_per_node)} or more")
    return cl


def _topo_order(et: EtFile) -> list[Any]:
    """The file's nodes in a topological order that keeps file order wherever dependencies allow."""
    pos = {}
    for i, n in enumerate(et.nodes):
        if n.id in pos:
            raise ConfigError(str(et.path), f"node id {n.id} appears twice", "give every node a unique id")
        pos[n.id] = i
    indeg = [0] * len(et.nodes)
    succ: list[list[int]] = [[] for _ in et.nodes]
    for i, n in enumerate(et.nodes):
        for d in {*n.data_deps, *n.ctrl_deps}:
            if d not in pos:
                raise ConfigError(str(et.path), f"node {n.id} ('{n.name}') depends on unknown node {d}",
                                  "dependencies must name node ids of the same file")
            succ[pos[d]].append(i)
            indeg[i] += 1
    ready = [i for i, k in enumerate(indeg) if k == 0]
    heapq.heapify(ready)
    out: list[Any] = []
    while ready:
        i = heapq.heappop(ready)
        out.append(et.nodes[i])
        for j in succ[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(ready, j)
    if len(out) != len(et.nodes):
        stuck = next(n for i, n in enumerate(et.nodes) if indeg[i] > 0)
        raise ConfigError(str(et.path), f"dependency cycle through node {stuck.id} ('{stuck.name}')",
                          "remove the cycle from data_deps/ctrl_deps")
    return out


def _stream(a: dict[str, Any], default: Stream, where: str) -> int:
    s = a.get(A_STREAM, int(default))
    if s not in {int(x) for x in Stream}:
        raise ConfigError(where, f"{A_STREAM} {s} is not a trainsim stream", f"use 0..{len(Stream) - 1} or drop it")
    return int(s)


def load_chakra(source: str | Path, cluster: Cluster | str | None = None, *, nodes: int | None = None,
                comm: CommModel | None = None, memory: MemoryTimer | None = None,
                memory_location: str = "remote", durations: str = "model", cpu_ops: str = "serial",
                dtype: str = "auto", comm_groups: str | Path | None = None,
                compute: Callable[[float | None, float, float | None], float] | None = None) -> ExecutionGraph:
    """Read a Chakra ET workload (`<prefix>.<rank>.et` per rank) into a per-rank ExecutionGraph.

    Costs: COMP nodes keep their recorded duration (`duration_micros`, or trainsim's exact seconds),
    else a roofline of `num_ops` / `tensor_size` on the cluster's device (peak for `dtype`, HBM; auto: what
    the device trains in, bf16 without a cluster; a dtype the device lacks is a ConfigError).
    Collectives and sends use `comm` (default NcclComm on the cluster) on nccl-tests sizes converted
    from ASTRA-sim's `comm_size`; memory nodes use `memory` (any object with `time_s(MemoryAccess)`;
    accesses are `memory_location`, ASTRA-sim's are remote) or local HBM time without one.
    `durations="recorded"`: communication and memory nodes that carry a duration keep it too.
    `cpu_ops`: "serial" runs is_cpu_op COMP nodes on the compute stream (trainsim has no CPU stream),
    "skip" makes them free. `cluster` may be a preset name, sized to the ranks (or `nodes`).
    `comm_groups`: ASTRA-sim's comm-group JSON (default `<prefix>.comm_group.json` when it exists).
    `compute(num_ops or None, tensor_bytes, recorded seconds or None)`: prices GPU COMP nodes instead (ASTRA-sim's
    own rules: its roofline from the system config, or the recorded runtime)."""
    if durations not in DURATIONS:
        raise ConfigError("durations", f"'{durations}' is not one of {', '.join(DURATIONS)}", "")
    if cpu_ops not in CPU_OPS:
        raise ConfigError("cpu_ops", f"'{cpu_ops}' is not one of {', '.join(CPU_OPS)}", "")
    if dtype != "auto" and dtype not in DTYPES:
        raise ConfigError("dtype", f"'{dtype}' is not a dtype", f"use auto or one of {', '.join(DTYPES)}")
    pb = _pb()
    files = et_files(source)
    ets = [read_et(p) for p in files]
    world = len(ets)
    prefix = files[0].with_name(files[0].name.rsplit(".", 2)[0])
    if comm_groups is None:
        default = prefix.with_name(prefix.name + COMM_GROUP_SUFFIX)
        group_file = default if default.exists() else None
    else:
        group_file = Path(comm_groups)
    groups = _load_groups(group_file, world)
    cl = resolve_cluster(cluster, nodes, world)
    if dtype == "auto":
        dtype = cl.device.training_dtype if cl is not None else "bf16"
    elif cl is not None and not cl.device.supports(dtype):
        raise ConfigError("dtype", f"{cl.device.name} does not support {dtype}",
                          f"use one of {', '.join(cl.device.dtypes)} or auto ({cl.device.training_dtype})")
    if comm is None and cl is not None:
        from ..cost.comm import NcclComm

        comm = NcclComm(cl)
    costs = _Costs(cl, comm, memory, memory_location, dtype)
    ctype = {pb.CollectiveCommType.Value(k): v for k, v in CHAKRA_COLLECTIVES.items()}

    g = ExecutionGraph()
    for r, et in enumerate(ets):
        md = _attrs(et.metadata)
        g.classes.append(RankClass(f"rank{r}", int(md.get(M_STAGE, 0)), 1, range(r, r + 1),
                                   float(md.get(M_STATIC, 0.0))))
    orders = [_topo_order(et) for et in ets]
    task_of: list[dict[int, int]] = [{} for _ in ets]
    colls: dict[tuple[tuple[int, ...], int], int] = {}
    coll_seen: Counter[tuple[int, str]] = Counter()
    sends: dict[tuple[int, int, int], list[int]] = defaultdict(list)
    recv_seen: Counter[tuple[int, int, int]] = Counter()
    recv_of: list[dict[int, tuple[tuple[int, int, int], int, str]]] = [{} for _ in ets]

    def recorded(a: dict[str, Any], node: Any) -> float | None:
        if A_DURATION in a:
            return float(a[A_DURATION])
        return node.duration_micros * 1e-6 if node.duration_micros else None

    # a rank issues a group's collectives in its file's order (the order the generator recorded them),
    # which is how the members' calls pair up, whatever order dependencies let them be processed in
    node_pos = [{n.id: i for i, n in enumerate(et.nodes)} for et in ets]
    file_pos: list[dict[int, int]] = [{} for _ in ets]  # rank -> task -> position of its node in the file
    issue_index: list[dict[int, int]] = [{} for _ in ets]  # rank -> collective node -> its issue number
    for r, et in enumerate(ets):
        for node in et.nodes:
            if node.type == pb.COMM_COLL_NODE:
                pg_key = str(_attrs(node).get("pg_name", ""))
                issue_index[r][node.id] = coll_seen[(r, pg_key)]
                coll_seen[(r, pg_key)] += 1

    for r, (et, order) in enumerate(zip(ets, orders, strict=True)):
        for node in order:
            a = _attrs(node)
            where = f"{et.path}: node {node.id} ('{node.name}')"
            common = _common_attrs(a, where)
            rec = recorded(a, node) if durations == "recorded" else None
            name = node.name or f"node{node.id}"
            t: int | None = None
            if node.type == pb.COMP_NODE:
                if a.get("is_cpu_op", False) and cpu_ops == "skip":
                    continue
                dur = recorded(a, node)
                if compute is not None and not a.get("is_cpu_op", False):
                    dur = compute(float(a["num_ops"]) if "num_ops" in a else None, float(a.get("tensor_size", 0)),
                                  dur)
                elif dur is None:
                    dur = costs.compute_s(float(a["num_ops"]), float(a.get("tensor_size", 0)), where) \
                        if "num_ops" in a else 0.0
                t = g.add(name, "compute", _stream(a, Stream.COMPUTE, where), a.get(A_CATEGORY, "compute"), dur,
                          (r,), [], **common)
            elif node.type == pb.COMM_COLL_NODE:
                if "comm_type" not in a or "comm_size" not in a:
                    raise ConfigError(where, "collective without comm_type or comm_size",
                                      "set both attributes (ASTRA-sim needs them)")
                op = ctype.get(int(a["comm_type"]))
                if op is None:
                    raise ConfigError(where, f"collective type {a['comm_type']} is not supported",
                                      f"use one of {', '.join(CHAKRA_COLLECTIVES)}")
                dims = a.get("involve_dims")
                if dims is not None and not all(dims):
                    raise ConfigError(where, "involve_dims selects part of the topology, which trainsim cannot map "
                                      "to ranks", "name the group with pg_name and a comm group file")
                pg = str(a.get("pg_name", ""))
                if pg not in groups:
                    raise ConfigError(where, f"pg_name '{pg}' is not a known communicator group",
                                      f"pass its comm group file (default {prefix.name}{COMM_GROUP_SUFFIX})")
                group = groups[pg]
                if r not in group:
                    raise ConfigError(where, f"rank {r} is not in its group '{pg}' {list(group)}",
                                      "fix pg_name or the comm group file")
                key = (group, issue_index[r][node.id])
                if key in colls:
                    t = colls[key]
                    if g.comm_op[t] != op and int(a["comm_type"]) != pb.BARRIER:
                        raise ConfigError(where, f"collective #{key[1]} of group {list(group)} is {op} here but "
                                          f"{g.comm_op[t]} on rank {g.participants[t][0]}",
                                          "every member must issue the group's collectives in the same order")
                    g.join(t, r, [])
                else:
                    size = 0.0 if int(a["comm_type"]) == pb.BARRIER else \
                        float(a.get(A_BYTES, nccl_bytes(op, float(a["comm_size"]), len(group))))
                    dur = rec if rec is not None else costs.comm_s(op, size, group, where)
                    t = g.add(name, "collective", _stream(a, Stream.GRAD, where), a.get(A_CATEGORY, "dp"), dur, (r,),
                              [], comm_op=op, comm_bytes=size, comm_ranks=group, **common)
                    colls[key] = t
            elif node.type in (pb.COMM_SEND_NODE, pb.COMM_RECV_NODE):
                send = node.type == pb.COMM_SEND_NODE
                peer_key = "comm_dst" if send else "comm_src"
                if peer_key not in a or "comm_size" not in a:
                    raise ConfigError(where, f"{'send' if send else 'receive'} without {peer_key} or comm_size",
                                      "set both attributes")
                me = int(a.get("comm_src" if send else "comm_dst", r))
                peer = int(a[peer_key])
                if me != r or not 0 <= peer < world:
                    raise ConfigError(where, f"{'comm_src' if send else 'comm_dst'}={me}, {peer_key}={peer} in the "
                                      f"file of rank {r} of {world}", "a rank sends and receives only its own data")
                tag = int(a.get("comm_tag", 0))
                if not send:
                    k3 = (peer, r, tag)
                    recv_of[r][node.id] = (k3, recv_seen[k3], where)
                    recv_seen[k3] += 1
                    continue
                size = float(a.get(A_BYTES, float(a["comm_size"])))
                dur = rec if rec is not None else costs.comm_s("send_recv", size, (r, peer), where)
                t = g.add(name, "p2p", _stream(a, Stream.P2P, where), a.get(A_CATEGORY, "pp"), dur, (r,), [],
                          comm_op="send_recv", comm_bytes=size, comm_ranks=(r, peer), **common)
                sends[(r, peer, tag)].append(t)
            elif node.type in (pb.MEM_LOAD_NODE, pb.MEM_STORE_NODE):
                if "tensor_size" not in a:
                    raise ConfigError(where, "memory node without tensor_size", "set tensor_size (bytes)")
                kind = "load" if node.type == pb.MEM_LOAD_NODE else "store"
                size = float(a["tensor_size"])
                dur = rec if rec is not None else costs.memory_s(kind, size, where)
                t = g.add(name, "memory", _stream(a, Stream.MEMORY, where), a.get(A_CATEGORY, "offload"), dur, (r,),
                          [], comm_op=kind, comm_bytes=size, comm_ranks=(r,), **common)
            if t is not None:
                task_of[r][node.id] = t
                file_pos[r].setdefault(t, node_pos[r][node.id])

    # dependencies: a node without a task of its own (receive, metadata, skipped CPU op) stands for
    # the tasks it waits on (a receive: also its matching send)
    for r, order in enumerate(orders):
        resolved: dict[int, tuple[int, ...]] = {}
        for node in order:
            parents: set[int] = set()
            for d in {*node.data_deps, *node.ctrl_deps}:
                parents.update(resolved[d])
            t = task_of[r].get(node.id)
            if t is not None:
                resolved[node.id] = (t,)
                g.deps[t].extend(d for d in sorted(parents) if d != t and d not in g.deps[t])
                continue
            if node.id in recv_of[r]:
                k3, occ, where = recv_of[r][node.id]
                matched = sends.get(k3, [])
                if occ >= len(matched):
                    raise ConfigError(where, f"receive from rank {k3[0]} (tag {k3[2]}) has no matching send",
                                      f"add the COMM_SEND_NODE to {files[k3[0]].name} or drop the receive")
                parents.add(matched[occ])
            resolved[node.id] = tuple(sorted(parents))
    for k3, ts in sends.items():
        if recv_seen[k3] < len(ts):
            raise ConfigError(str(files[k3[0]]), f"send to rank {k3[1]} (tag {k3[2]}) has no matching receive",
                              f"add the COMM_RECV_NODE to {files[k3[1]].name}")
    for (group, k), t in colls.items():
        if len(g.participants[t]) != len(group):
            absent = next(x for x in group if x not in g.participants[t])
            raise ConfigError(str(files[absent]), f"rank {absent} never issues collective #{k} of group {list(group)} "
                              f"({g.name[t]})", "every member of a group must issue each of its collectives")
    # each rank's streams run its tasks in file order (how the trace recorded them), not in the order
    # dependencies let the import visit them: a collective shared by several ranks then sits at the
    # same place in every member's stream
    for (c, _s), tasks in g.queues.items():
        pos = file_pos[c]
        tasks.sort(key=lambda t: pos.get(t, len(pos)))
    return g


# --------------------------------------------------------------------------------------------------
# export
# --------------------------------------------------------------------------------------------------

def member_group(group: tuple[int, ...], rank: int) -> tuple[int, ...]:
    """The group of `rank` that corresponds to `group` (a representative rank's group) in a rank mesh.

    Mesh groups are lattices: offsets sum_a k_a * stride_a (0 <= k_a < size_a) from the group's lowest
    rank. The strides and sizes are recovered from the offsets, and `rank`'s own coordinates along
    them are removed to find its group's base. A group that already holds `rank` is returned as is."""
    if rank in group:
        return tuple(sorted(group))
    offs, axes = _lattice(tuple(group))
    if axes is None:
        raise ValueError(f"group {list(group)} is not a mesh group; cannot place rank {rank}")
    comp = sum(((rank // s) % n) * s for s, n in axes)
    return tuple(rank - comp + o for o in offs)


@lru_cache(maxsize=4096)
def _lattice(group: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...] | None]:
    """A group's offsets from its lowest rank and its (stride, size) axes; None if it is no lattice."""
    base = min(group)
    offs = tuple(sorted({x - base for x in group}))
    rest = set(offs)
    covered = [0]
    axes: list[tuple[int, int]] = []
    while len(covered) < len(offs):
        seen = set(covered)
        stride = min(o for o in offs if o not in seen)
        size = 1
        while all(c + size * stride in rest for c in covered):
            size += 1
        axes.append((stride, size))
        covered = [c + j * stride for j in range(size) for c in covered]
    return offs, (tuple(axes) if set(covered) == rest else None)


def _field(values: list[Any], t: int, default: Any) -> Any:
    return values[t] if t < len(values) else default


ET_BYTES_PER_NODE = 250
"""Encoded size of one exported node (measured: ~295 B with trainsim's op names; a lower bound with ids)."""


def _check_space(out: Path, need_bytes: float) -> None:
    """Refuse an export that cannot fit on the disk before writing any of it."""
    probe = out
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if need_bytes > free:
        raise ConfigError("--out", f"the export needs at least {need_bytes / 2**30:,.1f} GiB and {probe} has "
                          f"{free / 2**30:,.1f} GiB free", "free space, choose another --out, or export fewer ranks "
                          "(--ranks 0-7)")


def collective_graph(op: str, size_bytes: float, npus: int) -> ExecutionGraph:
    """One collective over `npus` ranks (nccl-tests size), as a per-rank graph: ASTRA-sim's microbenchmark
    workloads (`examples/workload/microbenchmarks/<op>/<N>npus_<size>/`) when written by `write_chakra`."""
    if op not in TO_CHAKRA:
        raise ConfigError("op", f"'{op}' is not a Chakra collective", f"use one of {', '.join(TO_CHAKRA)}")
    g = ExecutionGraph()
    for r in range(npus):
        g.classes.append(RankClass(f"rank{r}", 0, 1, range(r, r + 1), 0.0))
    everyone = tuple(range(npus))
    g.add(op, "collective", Stream.GRAD, "dp", 0.0, everyone, [], comm_op=op, comm_bytes=float(size_bytes),
          comm_ranks=everyone)
    return g


def write_chakra(graph: ExecutionGraph, out_dir: str | Path, prefix: str = "trainsim",
                 ranks: Iterable[int] | None = None, progress: Callable[[int, int], None] | None = None) -> list[Path]:
    """Write `graph` as Chakra ET, one `<prefix>.<rank>.et` per rank (all ranks, or `ranks`), plus
    `<prefix>.comm_group.json` for ASTRA-sim's `--comm-group-configuration`. Returns the paths written.
    All files are written or none (trainsim.files); `progress(done, total)` is called after each rank's file.

    Fused tasks (compute chains that absorbed TP collectives, graph.coarsen) become COMP nodes with
    their duration; build with `granularity="op"` to export every collective as a COMM_COLL_NODE."""
    pb, lib = _pb(), _protolib()
    n = len(graph)
    world = max((rc.ranks.stop for rc in graph.classes), default=0)
    owner = [-1] * world
    for c, rc in enumerate(graph.classes):
        for r in rc.ranks:
            owner[r] = c
    wanted = sorted(set(range(world) if ranks is None else ranks))
    bad = [r for r in wanted if not 0 <= r < world or owner[r] < 0]
    if bad:
        raise ConfigError("ranks", f"rank {bad[0]} is not a rank of the graph (0..{world - 1})", "pick ranks in range")
    out = check_output_dir(out_dir, "--out")
    check_file_prefix(prefix, "--prefix")
    class_tasks: dict[int, list[int]] = defaultdict(list)
    for t in range(n):
        for c in graph.participants[t]:
            class_tasks[c].append(t)
    readers: dict[int, set[int]] = defaultdict(set)  # p2p task -> classes that wait on it from elsewhere
    for t in range(n):
        for d in graph.deps[t]:
            if graph.kind[d] == "p2p":
                readers[d].update(c for c in graph.participants[t] if c not in graph.participants[d])
    pg_names: dict[tuple[int, ...], str] = {}
    everyone = tuple(range(world))

    def pg(group: tuple[int, ...]) -> str:
        if group == everyone:
            return ""
        return pg_names.setdefault(group, str(len(pg_names) + 1))

    def offset(d: int, dst_class: int) -> int:
        """dst - src of pipeline send `d` (the same for every rank of a symmetric class)."""
        pair = _field(graph.comm_ranks, d, ())
        if len(pair) == 2 and pair[0] != pair[1]:
            return pair[1] - pair[0]
        return graph.classes[dst_class].ranks.start - graph.classes[graph.participants[d][0]].ranks.start

    def attr(node: Any, name: str, **value: Any) -> None:
        node.attr.append(pb.AttributeProto(name=name, **value))

    def base_node(node_id: int, name: str, ntype: int, t: int) -> Any:
        node = pb.Node(id=node_id, name=name, type=ntype)
        dur = graph.duration_s[t]
        node.duration_micros = max(0, round(dur * 1e6))
        attr(node, "is_cpu_op", bool_val=False)
        attr(node, A_DURATION, double_val=dur)
        attr(node, A_STREAM, int64_val=int(graph.stream[t]))
        attr(node, A_CATEGORY, string_val=graph.category[t])
        attr(node, A_MB, int64_val=int(graph.micro_batch[t]))
        attr(node, A_HOST, double_val=graph.host_s[t])
        attr(node, A_HOST_PATH, double_val=graph.host_path_s[t])
        if graph.host_sync[t]:
            attr(node, A_HOST_SYNC, bool_val=True)
        if graph.mem_peak_bytes[t] or graph.mem_net_bytes[t]:
            attr(node, A_MEM_PEAK, double_val=graph.mem_peak_bytes[t])
            attr(node, A_MEM_NET, double_val=graph.mem_net_bytes[t])
        parts = graph.parts[t]
        if parts:
            attr(node, A_PARTS_KEYS, string_list=pb.StringList(values=list(parts)))
            attr(node, A_PARTS_S, double_list=pb.DoubleList(values=list(parts.values())))
        return node

    def task_node(t: int, r: int, c: int) -> Any:
        op = _field(graph.comm_op, t, "")
        size = _field(graph.comm_bytes, t, 0.0)
        kind = graph.kind[t]
        if kind == "collective" and op in TO_CHAKRA and _field(graph.comm_ranks, t, ()):
            group = member_group(graph.comm_ranks[t], r)
            if all(0 <= x < world and owner[x] in graph.participants[t] for x in group):
                node = base_node(t, graph.name[t], pb.COMM_COLL_NODE, t)
                attr(node, "comm_type", int64_val=pb.CollectiveCommType.Value(TO_CHAKRA[op]))
                attr(node, "comm_size", int64_val=round(astra_comm_size(op, size, len(group))))
                attr(node, A_BYTES, double_val=size)
                attr(node, "pg_name", string_val=pg(group))
                return node
        if kind == "p2p" and readers.get(t):
            dst_class = min(readers[t])
            dst = r + offset(t, dst_class)
            if 0 <= dst < world and owner[dst] in readers[t]:
                node = base_node(t, graph.name[t], pb.COMM_SEND_NODE, t)
                for key, v in (("comm_src", r), ("comm_dst", dst), ("comm_tag", t)):
                    attr(node, key, int32_val=v)
                attr(node, "comm_size", int64_val=round(size))
                attr(node, A_BYTES, double_val=size)
                return node
        if kind == "memory" and op in ("load", "store"):
            node = base_node(t, graph.name[t], pb.MEM_LOAD_NODE if op == "load" else pb.MEM_STORE_NODE, t)
            attr(node, "tensor_size", uint64_val=round(size))
            return node
        return base_node(t, graph.name[t], pb.COMP_NODE, t)

    def files() -> Iterator[tuple[OutputTarget, Payload]]:
        for i, r in enumerate(wanted):
            c = owner[r]
            rc = graph.classes[c]
            nodes: list[Any] = []
            received: dict[int, int] = {}
            for t in class_tasks[c]:
                own = [d for d in graph.deps[t] if c in graph.participants[d]]
                waits = list(own)
                for d in graph.deps[t]:
                    if c in graph.participants[d] or graph.kind[d] != "p2p":
                        continue  # other cross-rank edges have no Chakra form
                    if d not in received:
                        src = r - offset(d, c)
                        if not 0 <= src < world or owner[src] != graph.participants[d][0]:
                            continue
                        recv = base_node(n + d, f"recv {graph.name[d]}", pb.COMM_RECV_NODE, d)
                        for key, v in (("comm_src", src), ("comm_dst", r), ("comm_tag", d)):
                            attr(recv, key, int32_val=v)
                        size = _field(graph.comm_bytes, d, 0.0)
                        attr(recv, "comm_size", int64_val=round(size))
                        attr(recv, A_BYTES, double_val=size)
                        recv.data_deps.extend(own)
                        nodes.append(recv)
                        received[d] = n + d
                    waits.append(received[d])
                node = task_node(t, r, c)
                node.data_deps.extend(waits)
                nodes.append(node)
            meta = pb.GlobalMetadata(version="0.0.4")
            meta.attr.extend([pb.AttributeProto(name="schema", string_val=SCHEMA),
                              pb.AttributeProto(name="generator", string_val="trainsim"),
                              pb.AttributeProto(name=M_RANK, int64_val=r),
                              pb.AttributeProto(name=M_STAGE, int64_val=rc.stage),
                              pb.AttributeProto(name=M_STATIC, double_val=rc.static_bytes)])

            def emit(fh: BinaryIO, meta: Any = meta, nodes: list[Any] = nodes) -> None:
                lib.encodeMessage(fh, meta)
                for node in nodes:
                    lib.encodeMessage(fh, node)

            yield check_output(out / f"{prefix}.{r}.et", "--out"), emit
            if progress is not None:
                progress(i + 1, len(wanted))
        # last: the ranks' files named the groups
        yield (check_output(out / f"{prefix}{COMM_GROUP_SUFFIX}", "--out"),
               json.dumps({name: list(grp) for grp, name in pg_names.items()}, indent=1))

    paths = [out / f"{prefix}.{r}.et" for r in wanted] + [out / f"{prefix}{COMM_GROUP_SUFFIX}"]
    _check_space(out, sum(len(class_tasks[owner[r]]) for r in wanted) * ET_BYTES_PER_NODE)
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        Outputs().write(files())
    except OSError as exc:
        raise ConfigError("--out", f"cannot create {out}: {exc.strerror}", "choose a writable directory") from None
    finally:
        if created and not any(p.exists() for p in paths):
            with contextlib.suppress(OSError):
                out.rmdir()  # nothing was written: leave no empty directory behind
    return paths
