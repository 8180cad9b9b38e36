"""What-if edits on a replay's merged graph (dPRO's optimizer questions, Lumos' estimation): each factory
returns a function that changes the ReplayGraphs in place before the engine runs it.

Collective kernels are priced by a `CommCost`: a cluster preset with trainsim's NCCL-like model, a
measured all-reduce curve (bytes -> time, e.g. from nccl-tests or the gloo benchmark), or the trace's own
collectives scaled by a factor. A collective's bytes are its `In msg nelems` times its dtype's size.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

import numpy as np

from ..errors import ConfigError
from ..replay import GraphEdit, RankGraph, ReplayGraphs
from ..trace.kineto.model import GpuKind, RuntimeKind

_DTYPE_BYTES = (("float8", 1), ("bfloat16", 2), ("half", 2), ("float16", 2), ("double", 8), ("float64", 8),
                ("long", 8), ("int64", 8), ("float", 4), ("int", 4), ("short", 2), ("byte", 1), ("char", 1),
                ("bool", 1))
_OPS = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
        "alltoall": "all_to_all", "broadcast": "broadcast", "reduce": "reduce", "sendrecv": "send_recv"}


def dtype_bytes(dtype: str | None) -> int:
    """Bytes per element of a Kineto dtype string ('Float', 'BFloat16', 'c10::Half', ...); 4 if unknown."""
    d = (dtype or "").lower()
    return next((b for k, b in _DTYPE_BYTES if k in d), 4)


class CommCost(Protocol):
    """Seconds one collective of `nbytes` (nccl-tests convention) takes on a group of `n` ranks."""

    def time_s(self, kind: str, nbytes: float, n: int) -> float: ...


@dataclass(frozen=True)
class ClusterComm:
    """trainsim's NCCL-like model on a cluster preset (the first n GPUs of enough nodes)."""

    cluster: str

    @cached_property
    def _gpus_per_node(self) -> int:
        from ..hardware.cluster import get_cluster

        return get_cluster(self.cluster, 1).gpus_per_node

    def time_s(self, kind: str, nbytes: float, n: int) -> float:
        from ..cost.microbench import nccl_collective
        from ..hardware.cluster import get_cluster

        if n < 2:
            return 0.0
        nodes = max(1, math.ceil(n / self._gpus_per_node))
        return nccl_collective(_OPS.get(kind, "all_reduce"), nbytes, get_cluster(self.cluster, nodes), n).result.time_s


@dataclass(frozen=True)
class TableComm:
    """A measured all-reduce curve (bytes -> seconds), interpolated log-log; other kinds move about half an
    all-reduce's bytes per rank on a ring, so they take the all-reduce time of half the bytes."""

    bytes_: tuple[float, ...]
    time_s_: tuple[float, ...]
    group: int = 2  # the group size the curve was measured on

    def time_s(self, kind: str, nbytes: float, n: int) -> float:
        if n < 2 or nbytes <= 0:
            return 0.0
        b = nbytes if kind in ("allreduce", "") else nbytes / 2
        x, y = np.log(np.asarray(self.bytes_)), np.log(np.asarray(self.time_s_))
        lb = math.log(b)
        if lb <= x[0]:
            t = float(np.exp(y[0]))  # below the smallest size: latency-bound
        elif lb >= x[-1]:
            t = float(np.exp(y[-1])) * b / self.bytes_[-1]  # above the largest: bandwidth-bound, linear
        else:
            t = float(np.exp(np.interp(lb, x, y)))
        # a ring moves 2(n-1)/n of the buffer: scale from the measured group size
        return t * (2 * (n - 1) / n) / (2 * (self.group - 1) / self.group)


def load_comm_table(path: str, field: str = "--comm-table") -> TableComm:
    """A `bytes,time_us` CSV (as benchmarks/ddp_gloo writes) -> TableComm; one-line errors on bad rows."""
    from ..files import read_csv

    _, rows = read_csv(path, field, what="collective timing CSV")
    pts: list[tuple[float, float]] = []
    for i, row in enumerate(rows, start=2):
        try:
            b, t = float(row["bytes"]), float(row["time_us"])
        except (KeyError, TypeError, ValueError):
            raise ConfigError(field, f"{path} line {i}: needs numeric 'bytes' and 'time_us' columns",
                              "write one row per message size: bytes,time_us") from None
        if not (b > 0 and t > 0 and math.isfinite(b) and math.isfinite(t)):
            raise ConfigError(field, f"{path} line {i}: bytes and time_us must be positive numbers",
                              "fix the row or drop it")
        pts.append((b, t * 1e-6))
    if len(pts) < 2:
        raise ConfigError(field, f"{path} has {len(pts)} timing rows", "measure at least two message sizes")
    pts.sort()
    return TableComm(tuple(p[0] for p in pts), tuple(p[1] for p in pts))


# ---- what the edits need to know about a rank's collectives -------------------------------------------------

@dataclass
class CollTask:
    """One collective's work (a GPU kernel or a CPU work range) on one rank, as a task of the merged graph."""

    rank_index: int
    task: int
    kind: str
    nbytes: float
    elem_bytes: int  # bytes per element of its dtype
    group: int  # ranks in its group
    start_us: float  # its measured start on the rank's clock, relative to the trace origin
    coupled: bool = False


def collective_works(rgs: ReplayGraphs) -> list[CollTask]:
    """The replay's collective works (GPU kernels, CPU work ranges such as gloo's) with bytes and groups."""
    coupled = {t for calls in rgs.coupled for t, _ in calls}
    out: list[CollTask] = []
    for i, rk in enumerate(rgs.ranks):
        c, tr = rk.trace.collectives, rk.trace
        for j, local in sorted(rk.rg.coll_task.items()):
            n = c.group_size[j] if c.group_size[j] > 0 else (len(c.pg_ranks[j]) if c.pg_ranks[j] else
                                                             (tr.world_size or 1))
            elem = dtype_bytes(c.dtype[j])
            nbytes = max(c.in_nelems[j], c.out_nelems[j], 0) * elem
            t = rk.task0 + local
            out.append(CollTask(i, t, c.kind[j], float(nbytes), elem, int(n), float(c.ts_us[j]), t in coupled))
    return out


def _need_bytes(colls: list[CollTask], what: str) -> None:
    if colls and not any(c.nbytes > 0 for c in colls):
        raise ConfigError(what, "the trace's collectives carry no message sizes (no 'In msg nelems')",
                          "profile with a PyTorch that records collective metadata (2.1 or newer)")


# ---- edits ----------------------------------------------------------------------------------------------

def recost_network(comm: CommCost, label: str, group: int | None = None) -> GraphEdit:
    """Every collective work takes what `comm` says for its kind, bytes and group (`group`: every group
    that size, as when data parallelism grows); waits come from the coupling of the ranks, not from the
    measurement."""
    def edit(rgs: ReplayGraphs) -> None:
        colls = collective_works(rgs)
        _need_bytes(colls, "--cluster")
        for c in colls:
            if c.nbytes > 0:
                rgs.graph.duration_s[c.task] = comm.time_s(c.kind, c.nbytes, group or c.group)
        rgs.assumptions.append(f"what-if network: {len(colls)} collectives re-costed on {label}"
                               + (f" for groups of {group}" if group else ""))
    return edit


def share_host_cores(cores_per_node: int, ranks_per_node: int) -> GraphEdit:
    """CPU work (host ops and CPU collective works such as gloo's) shares the node's cores among its ranks:
    each rank has cores/ranks of them, and its busy threads split that fairly (max-min, sim.flows). Apply
    it after every edit that changes durations (it reads them)."""
    def edit(rgs: ReplayGraphs) -> None:
        g = rgs.graph
        per_thread = ranks_per_node / cores_per_node  # one busy thread's share of the rank's cores
        works = {c.task for c in collective_works(rgs) if g.kind[c.task] == "host"}
        for rk in rgs.ranks:
            res = g.resource_id(f"cpu cores of rank {rk.rank}")
            for t in range(rk.task0, rk.task0 + rk.n_tasks):
                if g.kind[t] == "host" and (g.category[t] in ("host", "runtime", "launch") or t in works) \
                        and g.duration_s[t] > 0:
                    g.flow_demand[t] = ((res, g.duration_s[t] * per_thread),)
        rgs.assumptions.append(f"host CPU work shares {cores_per_node} cores among {ranks_per_node} ranks per node")
    return edit


def scale_network(speedup: float) -> GraphEdit:
    """Collective kernels `speedup` times faster (their wait-free part when coupled)."""
    def edit(rgs: ReplayGraphs) -> None:
        colls = collective_works(rgs)
        for c in colls:
            rgs.graph.duration_s[c.task] /= speedup
        rgs.assumptions.append(f"what-if network x{speedup:g}: {len(colls)} collectives scaled")
    return edit


def retime_gpu(ratios_for: Callable[[RankGraph], dict[str, float]], label: str) -> GraphEdit:
    """Each GPU op's time multiplied by its op class's ratio (trainsim's compute model, source -> target GPU)."""
    from ..trace.kineto.kernels import classify_all

    def edit(rgs: ReplayGraphs) -> None:
        g = rgs.graph
        for rk in rgs.ranks:
            ratios = ratios_for(rk)
            classes = classify_all(rk.trace)
            for i, cls in enumerate(classes.tolist()):
                t = rk.gpu_task(i)
                g.duration_s[t] *= ratios.get(str(cls), 1.0)
        rgs.assumptions.append(f"what-if GPU: kernels re-timed by op class for {label}")
    return edit


def overlap_off() -> GraphEdit:
    """Collectives do not overlap computation: each waits for the GPU work launched before it on its
    device, and the work launched after it waits for it."""
    def edit(rgs: ReplayGraphs) -> None:
        g = rgs.graph
        works = collective_works(rgs)
        for i, rk in enumerate(rgs.ranks):
            tr = rk.trace
            colls = {c.task for c in works if c.rank_index == i}
            if not colls:
                continue
            order = np.argsort(tr.gpu.ts_us, kind="stable").tolist()
            last_by_stream: dict[tuple[int, int], int] = {}
            pending: list[int] = []
            for row in order:
                t = rk.gpu_task(row)
                key = (int(tr.gpu.device[row]), int(tr.gpu.stream[row]))
                if t in colls:
                    g.deps[t].extend(x for k, x in last_by_stream.items() if k != key and x not in g.deps[t])
                    pending.append(t)
                else:
                    for c in pending:
                        if g.stream[c] != g.stream[t] and c not in g.deps[t]:
                            g.deps[t].append(c)
                    pending = [c for c in pending if g.stream[c] == g.stream[t]]
                last_by_stream[key] = t
        rgs.assumptions.append("what-if: communication does not overlap computation")
    return edit


def _launch_segments(rk: RankGraph, runtime_row: int) -> range:
    """Merged ids of the host segments that make up one runtime call."""
    tr, rg = rk.trace, rk.rg
    th = int(tr.runtime.thread[runtime_row])
    if th not in rg.boundary_us:
        return range(0)
    from ..trace.kineto.graph import round_us

    b = rg.boundary_us[th]
    a_us = float(tr.runtime.ts_us[runtime_row])
    e_us = a_us + float(tr.runtime.dur_us[runtime_row])
    j0, j1 = int(np.searchsorted(b, round_us(a_us))), int(np.searchsorted(b, round_us(e_us)))
    base = rk.task0 + rg.first_segment[th]
    return range(base + j0, base + j1)


def fuse_elementwise() -> GraphEdit:
    """Chains of back-to-back element-wise kernels on a stream become one kernel: one launch (the others'
    launch calls cost nothing) and one pass over memory per chain. The fused kernel takes the longest op's
    time plus a third of the others' (each later op still reads its own extra operand: about one of the
    three memory passes of a binary element-wise op)."""
    from ..trace.kineto.kernels import OpClass, classify_all

    def edit(rgs: ReplayGraphs) -> None:
        g = rgs.graph
        fused = chains = 0
        for rk in rgs.ranks:
            tr = rk.trace
            classes = classify_all(rk.trace).tolist()
            kind = tr.gpu.kind.tolist()
            rows_by_stream: dict[tuple[int, int], list[int]] = defaultdict(list)
            for row in np.argsort(tr.gpu.ts_us, kind="stable").tolist():
                rows_by_stream[(int(tr.gpu.device[row]), int(tr.gpu.stream[row]))].append(row)
            for rows in rows_by_stream.values():
                chain: list[int] = []
                for row in [*rows, -1]:
                    ok = row >= 0 and kind[row] == GpuKind.KERNEL and str(classes[row]) == OpClass.ELEMENTWISE
                    if ok:
                        chain.append(row)
                        continue
                    if len(chain) >= 2:
                        durs = [g.duration_s[rk.gpu_task(r)] for r in chain]
                        keep = chain[int(np.argmax(durs))]
                        total = sum(durs)
                        for r in chain:
                            g.duration_s[rk.gpu_task(r)] = 0.0
                            rt = int(tr.gpu.runtime[r])
                            if r != chain[0] and rt >= 0 and tr.runtime.kind[rt] == RuntimeKind.LAUNCH:
                                for s in _launch_segments(rk, rt):
                                    g.duration_s[s] = 0.0
                        g.duration_s[rk.gpu_task(keep)] = max(durs) + (total - max(durs)) / 3
                        fused += len(chain)
                        chains += 1
                    chain = []
        rgs.assumptions.append(f"what-if fusion: {fused} element-wise kernels in {chains} chains fused")
    return edit


def _pass_s_per_byte(rgs: ReplayGraphs, grad_bytes_per_step: float) -> float:
    """Seconds one memory pass over a byte of gradient takes on this machine, measured from the trace's
    optimizer (SGD/Adam read the gradient and parameters and write the parameters: about 3 passes)."""
    from ..trace.kineto.kernels import OpClass, classify_all

    tr = rgs.ranks[0].trace
    n_steps = max(len(tr.steps()), 1)
    if len(tr.gpu):
        cls = classify_all(tr)
        opt_s = float(tr.gpu.dur_us[cls == OpClass.OPTIMIZER].sum()) * 1e-6
    else:
        names = tr.names(tr.cpu.name_id)
        opt_s = sum(float(d) for n, d in zip(names, tr.cpu.dur_us.tolist(), strict=True)
                    if n.startswith("Optimizer.step")) * 1e-6
    return opt_s / n_steps / (3 * grad_bytes_per_step) if grad_bytes_per_step > 0 and opt_s > 0 else 0.0


def compress(bits: int, comm: CommCost, label: str, group: int | None = None) -> GraphEdit:
    """Gradient compression (PerfEstimator's TernGrad study): all-reduces move `bits`-bit payloads instead of
    their dtype's, plus encode and decode work (about 2.2 memory passes over the full gradient, timed from
    the trace's own optimizer step) on the communication worker."""
    def edit(rgs: ReplayGraphs) -> None:
        colls = [c for c in collective_works(rgs) if c.kind == "allreduce" and c.nbytes > 0]
        _need_bytes(colls, "--compress")
        n_steps = max(len(rgs.ranks[0].trace.steps()), 1)
        per_step = sum(c.nbytes for c in colls if c.rank_index == 0) / n_steps
        pass_s = _pass_s_per_byte(rgs, per_step)
        for c in colls:
            small = c.nbytes * bits / (8 * c.elem_bytes)
            rgs.graph.duration_s[c.task] = comm.time_s(c.kind, small, group or c.group) + 2.2 * c.nbytes * pass_s
        rgs.assumptions.append(f"what-if compression: {len(colls)} all-reduces carry {bits}-bit gradients on {label}; "
                               f"encode+decode {2.2 * pass_s * 1e12:.1f} ps/byte from the optimizer's time")
    return edit


def bucket(cap_bytes: float, comm: CommCost, label: str, group: int | None = None) -> GraphEdit:
    """DDP bucket size (tensor fusion / partition of the gradient all-reduces): per step, consecutive
    all-reduces are merged until a bucket holds `cap_bytes` (issued when its last gradient is ready), and
    one larger than the cap is split into equal pieces sent back to back (the trace cannot tell when
    parts of a bucket were ready, so a split bucket starts when the whole one was)."""
    def edit(rgs: ReplayGraphs) -> None:
        colls = [c for c in collective_works(rgs) if c.kind == "allreduce" and c.nbytes > 0]
        _need_bytes(colls, "--bucket-mb")
        g = rgs.graph
        n_new = 0
        for rk_i, rk in enumerate(rgs.ranks):
            steps = rk.trace.steps()
            mine = sorted((c for c in colls if c.rank_index == rk_i), key=lambda c: c.start_us)
            by_step: dict[int, list[CollTask]] = defaultdict(list)
            for c in mine:
                k = next((i for i, w in enumerate(steps) if w.start_us <= c.start_us < w.end_us), -1)
                by_step[k].append(c)
            for group_colls in by_step.values():
                acc: list[CollTask] = []
                for c in group_colls:
                    acc.append(c)
                    total = sum(x.nbytes for x in acc)
                    if total < cap_bytes and c is not group_colls[-1]:
                        continue
                    # DDP fills a bucket until it reaches the cap (so a merged one may exceed it); a single
                    # bucket above the cap is split, as smaller buckets would have held its gradients
                    pieces = 1 if len(acc) > 1 else max(1, math.ceil(total / cap_bytes - 1e-9))
                    for x in acc[:-1]:
                        g.duration_s[x.task] = 0.0
                    g.duration_s[acc[-1].task] = pieces * comm.time_s("allreduce", total / pieces,
                                                                      group or acc[-1].group)
                    n_new += pieces
                    acc = []
        rgs.assumptions.append(f"what-if buckets of {cap_bytes / 2**20:g} MiB: {len(colls)} all-reduces became "
                               f"{n_new} on {label}")
    return edit


__all__ = ["ClusterComm", "CollTask", "CommCost", "TableComm", "bucket", "collective_works", "compress",
           "dtype_bytes", "fuse_elementwise", "load_comm_table", "overlap_off", "recost_network", "retime_gpu",
           "scale_network", "share_host_cores"]
