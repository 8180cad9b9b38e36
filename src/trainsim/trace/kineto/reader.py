"""Read one rank's Kineto trace (`.json` / `.json.gz`) into the columnar KinetoTrace; no torch needed.

One pass over `traceEvents` appends to per-table column lists (no per-event objects); the tables are
then converted to numpy, sorted, nested per thread and linked (GPU op -> runtime call by correlation,
runtime call -> enclosing CPU op, flows paired by id). Every problem is one ConfigError naming the file.
"""

from __future__ import annotations

import gc
import math
import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ConfigError
from ...files import MAX_TRACE_BYTES, gunzip_bounded, parse_json_bytes, read_bytes
from .model import (
    Collectives,
    CollectiveSource,
    CpuKind,
    CpuOps,
    FlowKind,
    Flows,
    GpuAnnotations,
    GpuKind,
    GpuOps,
    KinetoTrace,
    MemoryEvents,
    RuntimeCalls,
    RuntimeKind,
    StepWindow,
    SyncEvents,
    SyncKind,
)

_CPU, _RUNTIME, _DRIVER, _GPU, _SYNC, _GPU_ANN = range(6)
_GROUP = {  # category -> (table, kind, 2021 schema)
    "cpu_op": (_CPU, CpuKind.CPU_OP, False), "Operator": (_CPU, CpuKind.CPU_OP, True),
    "user_annotation": (_CPU, CpuKind.USER_ANNOTATION, False),
    "python_function": (_CPU, CpuKind.PYTHON_FUNCTION, False),
    "cuda_runtime": (_RUNTIME, 0, False), "Runtime": (_RUNTIME, 0, True), "cuda_driver": (_DRIVER, 0, False),
    "kernel": (_GPU, GpuKind.KERNEL, False), "Kernel": (_GPU, GpuKind.KERNEL, True),
    "gpu_memcpy": (_GPU, GpuKind.MEMCPY, False), "Memcpy": (_GPU, GpuKind.MEMCPY, True),
    "gpu_memset": (_GPU, GpuKind.MEMSET, False), "Memset": (_GPU, GpuKind.MEMSET, True),
    "cuda_sync": (_SYNC, 0, False), "gpu_user_annotation": (_GPU_ANN, 0, False),
}
_LAUNCH_FLOWS = frozenset({"ac2g", "async_cpu_to_gpu"})  # plus 2021's cat "async" with name "launch"
_SYNC_KINDS = {"Stream Sync": SyncKind.STREAM_SYNC, "Event Sync": SyncKind.EVENT_SYNC,
               "Context Sync": SyncKind.CONTEXT_SYNC, "Stream Wait Event": SyncKind.STREAM_WAIT_EVENT}
_STEP_RE = re.compile(r"ProfilerStep#(\d+)$")
_FIX = "pass a trace written by torch.profiler (export_chrome_trace or tensorboard_trace_handler)"


def runtime_kind(name: str) -> RuntimeKind:
    """Classify a CUDA/HIP runtime or driver API name (cudaLaunchKernel, hipMemcpyAsync, cuLaunchKernelEx, ...)."""
    if "Launch" in name and ("Kernel" in name or "Graph" in name):
        return RuntimeKind.LAUNCH
    for key, kind in (("Memcpy", RuntimeKind.MEMCPY), ("Memset", RuntimeKind.MEMSET),
                      ("EventRecord", RuntimeKind.EVENT_RECORD), ("StreamWaitEvent", RuntimeKind.STREAM_WAIT_EVENT),
                      ("StreamSynchronize", RuntimeKind.STREAM_SYNC), ("DeviceSynchronize", RuntimeKind.DEVICE_SYNC),
                      ("CtxSynchronize", RuntimeKind.DEVICE_SYNC), ("EventSynchronize", RuntimeKind.EVENT_SYNC)):
        if key in name:
            return kind
    return RuntimeKind.OTHER


def collective_kind(name: str) -> str:
    """Normalise a collective name: `_allgather_base`, `all_gather`, `AllGather` -> `allgather`."""
    s = name.strip().lower().lstrip("_")
    for suffix in ("_base", "_coalesced", "_into_tensor"):
        s = s.removesuffix(suffix)
    s = s.replace("_", "")
    return {"alltoallv": "alltoall", "allgatherintotensor": "allgather", "reducescattertensor": "reducescatter",
            "sendrecv": "sendrecv"}.get(s, s)


def _kernel_collective(name: str) -> str | None:
    """The collective in an NCCL/RCCL kernel name (ncclKernel_AllReduce_RING_LL..., ncclDevKernel_Generic)."""
    low = name[:16].lower()
    if not (low.startswith("nccl") or low.startswith("rccl")):
        return None
    head = name.split("(", 1)[0]
    parts = head.split("_")
    return parts[1] if len(parts) > 1 and parts[0].lower().endswith("kernel") else head


def _int(x: Any, default: int = -1) -> int:  # noqa: ANN401 - any JSON value
    """An int from a JSON value (int, integral float or digit string), else `default`."""
    if type(x) is int:
        return x
    if isinstance(x, float) and math.isfinite(x) and x.is_integer():
        return int(x)
    if isinstance(x, str):
        try:
            return int(x.strip(), 0)
        except ValueError:
            return default
    return default


def _ranks(x: Any) -> tuple[int, ...] | None:  # noqa: ANN401
    """`Process Group Ranks` ("[0, 1]" or a list) as a tuple of ints."""
    if isinstance(x, list):
        vals = [_int(v, -(2**62)) for v in x]
    elif isinstance(x, str) and x.strip().startswith("["):
        body = x.strip()[1:-1].strip()
        vals = [_int(v, -(2**62)) for v in body.split(",")] if body else []
    else:
        return None
    return None if any(v == -(2**62) for v in vals) else tuple(vals)


class _Ids:
    """Maps non-integer pids/tids (2021's "25738" and "stream 7", or labels) to ints."""

    def __init__(self) -> None:
        self.labels: dict[str, int] = {}

    def __call__(self, x: Any) -> int:  # noqa: ANN401
        if type(x) is int:
            return x
        if isinstance(x, str):
            s = x.strip()
            if s.startswith("stream "):
                s = s[7:].strip()
            if s.lstrip("-").isdigit():
                return int(s)
            return self.labels.setdefault(s, -(1 << 40) - len(self.labels))
        return _int(x, -1)


def read_kineto(path: str | Path) -> KinetoTrace:
    """Read one rank's Kineto trace (`.json` or `.json.gz`) into a KinetoTrace; ConfigError naming the file."""
    p = Path(path)
    field = str(p)
    raw = read_bytes(p, field, max_bytes=MAX_TRACE_BYTES, what="profiler trace", fix="check the trace path")
    file_bytes = len(raw)
    if raw[:2] == b"\x1f\x8b":
        raw = gunzip_bounded(raw, field, max_bytes=MAX_TRACE_BYTES, what="profiler trace",
                             fix="copy the trace again (the gzip stream is damaged or cut short)")
    json_bytes = len(raw)
    if not raw.strip():
        raise ConfigError(field, f"{p} is empty", _FIX)
    gc_was_on = gc.isenabled()
    gc.disable()  # millions of fresh dicts would trigger the cycle collector over and over (~2x slower)
    try:
        doc = parse_json_bytes(raw, field, str(p), what="profiler trace")
        del raw
        return trace_from_json(doc, field, file_bytes=file_bytes, json_bytes=json_bytes)
    finally:
        if gc_was_on:
            gc.enable()


def trace_from_json(doc: Any, source: str, *, file_bytes: int = 0, json_bytes: int = 0) -> KinetoTrace:  # noqa: ANN401
    """Build a KinetoTrace from a parsed trace document; `source` names it in errors."""
    if isinstance(doc, list):
        raise ConfigError(source, "is a JSON array, not a Kineto trace object with 'traceEvents'", _FIX)
    if not isinstance(doc, dict):
        raise ConfigError(source, f"is a JSON {type(doc).__name__}, not a Kineto trace object", _FIX)
    events = doc.get("traceEvents")
    if events is None:
        raise ConfigError(source, "has no 'traceEvents' (not a Chrome/Kineto trace)", _FIX)
    if not isinstance(events, list):
        raise ConfigError(source, "'traceEvents' is not a list", _FIX)
    if not events:
        raise ConfigError(source, "'traceEvents' is empty (the profiler recorded nothing)",
                          "profile at least one step (check the profiler schedule's active steps)")
    b = _Builder(source)
    b.scan(events)
    return b.finish(doc, file_bytes=file_bytes, json_bytes=json_bytes, n_events=len(events))


class _Builder:
    """Column lists filled by one pass over the events, then turned into the tables."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.strings: dict[str, int] = {}
        self.threads: dict[tuple[int, int], int] = {}
        self.ids = _Ids()
        self.cpu: tuple[list[Any], ...] = tuple([] for _ in range(6))  # thread ts dur name kind ext, + ev_idx
        self.cpu_ev: list[int] = []
        self.rt: tuple[list[Any], ...] = tuple([] for _ in range(8))  # thread ts dur name driver cbid corr ext
        self.gpu: tuple[list[Any], ...] = tuple([] for _ in range(9))  # dev stream ts dur name kind corr ext bytes
        self.sync: tuple[list[Any], ...] = tuple([] for _ in range(10))
        self.ann: tuple[list[Any], ...] = tuple([] for _ in range(6))
        self.mem: tuple[list[Any], ...] = tuple([] for _ in range(5))
        self.flow_s: dict[tuple[int, Any], tuple[int, int, float]] = {}
        self.flow_f: dict[tuple[int, Any], tuple[int, int, float]] = {}
        self.flow_cats: set[str] = set()
        self.coll_cpu: list[tuple[int, dict[str, Any], str]] = []  # (raw cpu row, args, op name)
        self.coll_gpu: list[tuple[int, dict[str, Any], str]] = []
        self.process_names: dict[int, str] = {}
        self.thread_names: dict[tuple[int, int], str] = {}
        self.skipped: Counter[str] = Counter()
        self.old_schema = False
        self.hip = False

    def scan(self, events: list[Any]) -> None:  # noqa: C901 - one flat loop is the fast path
        """One pass over traceEvents, appending to the column lists."""
        strings, threads, ids, group_of = self.strings, self.threads, self.ids, _GROUP
        c_th, c_ts, c_dur, c_name, c_kind, c_ext = self.cpu
        c_ev = self.cpu_ev
        r_th, r_ts, r_dur, r_name, r_drv, r_cbid, r_corr, r_ext = self.rt
        g_dev, g_str, g_ts, g_dur, g_name, g_kind, g_corr, g_ext, g_bytes = self.gpu
        empty: dict[str, Any] = {}
        for e in events:
            if type(e) is not dict:
                self.skipped["not an object"] += 1
                continue
            ph = e.get("ph")
            if ph == "X":
                cat = e.get("cat")
                grp = group_of.get(cat)
                if grp is None:
                    self.skipped[str(cat)] += 1
                    continue
                g, kind, old = grp
                if old:
                    self.old_schema = True
                a = e.get("args") or empty
                name = e.get("name", "")
                if type(name) is not str:
                    name = str(name)
                nid = strings.get(name)
                if nid is None:
                    nid = strings[name] = len(strings)
                if g <= _DRIVER:  # _CPU, _RUNTIME, _DRIVER
                    pid, tid = e.get("pid"), e.get("tid")
                    if type(pid) is not int:
                        pid = ids(pid)
                    if type(tid) is not int:
                        tid = ids(tid)
                    th = threads.get((pid, tid))
                    if th is None:
                        th = threads[(pid, tid)] = len(threads)
                    if g == _CPU:
                        c_th.append(th)
                        c_ts.append(e.get("ts"))
                        c_dur.append(e.get("dur", 0))
                        c_name.append(nid)
                        c_kind.append(kind)
                        c_ext.append(a.get("External id", a.get("external id", -1)))
                        c_ev.append(a.get("Ev Idx", -1))
                        if name == "record_param_comms" or name.startswith(("nccl:", "gloo:")):
                            self.coll_cpu.append((len(c_ts) - 1, a, name))
                    else:
                        r_th.append(th)
                        r_ts.append(e.get("ts"))
                        r_dur.append(e.get("dur", 0))
                        r_name.append(nid)
                        r_drv.append(g == _DRIVER)
                        r_cbid.append(a.get("cbid", a.get("cid", -1)))
                        r_corr.append(a.get("correlation", -1))
                        r_ext.append(a.get("External id", a.get("external id", -1)))
                elif g == _GPU:
                    stream = a.get("stream")
                    if type(stream) is not int:
                        stream = ids(e.get("tid"))
                    dev = a.get("device")
                    if type(dev) is not int:
                        dev = ids(e.get("pid"))
                    g_dev.append(dev)
                    g_str.append(stream)
                    g_ts.append(e.get("ts"))
                    g_dur.append(e.get("dur", 0))
                    g_name.append(nid)
                    g_kind.append(kind)
                    g_corr.append(a.get("correlation", -1))
                    g_ext.append(a.get("External id", a.get("external id", -1)))
                    g_bytes.append(a.get("bytes", -1))
                    if kind == GpuKind.KERNEL and name[:4].lower() in ("nccl", "rccl"):
                        self.coll_gpu.append((len(g_ts) - 1, a, name))
                elif g == _SYNC:
                    self._sync(e, a, name)
                else:
                    self._annotation(e, a, nid)
            elif ph in ("s", "f"):
                self._flow(e, ph)
            elif ph == "M":
                self._meta(e)
            elif ph == "i" and e.get("name") == "[memory]":
                self._memory(e)
            else:
                self.skipped[f"ph {ph}"] += 1

    def _sync(self, e: dict[str, Any], a: dict[str, Any], name: str) -> None:
        kind = _SYNC_KINDS.get(a.get("cuda_sync_kind", name), SyncKind.OTHER)
        stream = _int(a.get("stream", e.get("tid")))
        cols = (_int(a.get("device", e.get("pid"))), -1 if stream in (4294967295, 2**64 - 1) else stream,
                e.get("ts"), e.get("dur", 0), int(kind), _int(a.get("correlation")),
                _int(a.get("External id", a.get("external id"))), _int(a.get("wait_on_stream")),
                _int(a.get("wait_on_cuda_event_record_corr_id")), _int(a.get("wait_on_cuda_event_id")))
        for col, v in zip(self.sync, cols, strict=True):
            col.append(v)

    def _annotation(self, e: dict[str, Any], a: dict[str, Any], nid: int) -> None:
        cols = (_int(a.get("device", e.get("pid"))), self.ids(a.get("stream", e.get("tid"))), e.get("ts"),
                e.get("dur", 0), nid, _int(a.get("External id", a.get("external id"))))
        for col, v in zip(self.ann, cols, strict=True):
            col.append(v)

    def _flow(self, e: dict[str, Any], ph: str) -> None:
        cat = e.get("cat")
        if cat == "ac2g" or cat == "async_cpu_to_gpu" or (cat == "async" and e.get("name") == "launch"):
            kind = 0  # FlowKind.LAUNCH
            if cat not in self.flow_cats:
                self.flow_cats.add(str(cat))
        elif cat == "fwdbwd":
            kind = 1  # FlowKind.FWDBWD
        else:
            self.skipped[f"flow {cat}"] += 1
            return
        pid, tid = e.get("pid"), e.get("tid")
        if type(pid) is not int:
            pid = self.ids(pid)
        if type(tid) is not int:
            tid = self.ids(tid)
        (self.flow_s if ph == "s" else self.flow_f)[(kind, e.get("id"))] = (pid, tid, e.get("ts"))

    def _meta(self, e: dict[str, Any]) -> None:
        name, a = e.get("name"), e.get("args") or {}
        if name == "process_name" and isinstance(a.get("name"), str):
            self.process_names[self.ids(e.get("pid"))] = a["name"]
        elif name == "thread_name" and isinstance(a.get("name"), str):
            self.thread_names[(self.ids(e.get("pid")), self.ids(e.get("tid")))] = a["name"].strip()

    def _memory(self, e: dict[str, Any]) -> None:
        a = e.get("args") or {}
        cols = (e.get("ts"), _int(a.get("Device Type"), 0), _int(a.get("Device Id")), _int(a.get("Bytes"), 0),
                _int(a.get("Total Allocated")))
        for col, v in zip(self.mem, cols, strict=True):
            col.append(v)

    # ------------------------------------------------------------------------------------------ finish

    def _f64(self, values: list[Any], what: str) -> np.ndarray:
        try:
            arr = np.asarray(values, dtype=np.float64)
        except (TypeError, ValueError):
            arr = np.asarray([v if isinstance(v, int | float) else math.nan for v in values], dtype=np.float64)
        bad = ~np.isfinite(arr)
        if bad.any():
            raise ConfigError(self.source, f"{int(bad.sum())} {what} events have no numeric ts/dur",
                              "re-export the trace (it is damaged)")
        return arr

    @staticmethod
    def _i64(values: list[Any]) -> np.ndarray:
        try:
            return np.asarray(values, dtype=np.int64)
        except (TypeError, ValueError, OverflowError):
            return np.asarray([_int(v) for v in values], dtype=np.int64)

    def finish(self, doc: dict[str, Any], *, file_bytes: int, json_bytes: int, n_events: int) -> KinetoTrace:
        """Convert, sort, nest and link the collected columns."""
        src = self.source
        f64, i64 = self._f64, self._i64
        c_th, c_ts, c_dur, c_name, c_kind, c_ext = self.cpu
        cpu_ts, cpu_dur = f64(c_ts, "CPU"), f64(c_dur, "CPU")
        r_th, r_ts, r_dur, r_name, r_drv, r_cbid, r_corr, r_ext = self.rt
        rt_ts, rt_dur = f64(r_ts, "runtime"), f64(r_dur, "runtime")
        g_dev, g_str, g_ts, g_dur, g_name, g_kind, g_corr, g_ext, g_bytes = self.gpu
        gpu_ts, gpu_dur = f64(g_ts, "GPU"), f64(g_dur, "GPU")
        sy = self.sync
        sync_ts, sync_dur = f64(sy[2], "cuda_sync"), f64(sy[3], "cuda_sync")
        an = self.ann
        ann_ts, ann_dur = f64(an[2], "gpu_user_annotation"), f64(an[3], "gpu_user_annotation")
        firsts = [float(x.min()) for x in (cpu_ts, rt_ts, gpu_ts, sync_ts, ann_ts) if len(x)]
        if not firsts:
            raise ConfigError(src, "has no CPU, runtime or GPU events (only metadata)", _FIX)
        origin = min(firsts)

        cpu = CpuOps(np.asarray(c_th, dtype=np.int32), cpu_ts - origin, cpu_dur, np.asarray(c_name, dtype=np.int32),
                     np.asarray(c_kind, dtype=np.int8), i64(c_ext), i64(self.cpu_ev),
                     np.full(len(c_ts), -1, dtype=np.int64), np.zeros(len(c_ts), dtype=np.int32))
        cpu_order = np.lexsort((-cpu.dur_us, cpu.ts_us, cpu.thread))
        cpu.take(cpu_order)
        _nest(cpu)

        names = list(self.strings)
        kind_of = {i: int(runtime_kind(names[i])) for i in set(r_name)}  # classify each distinct name once
        rt_kind = np.asarray([kind_of[i] for i in r_name], dtype=np.int8)
        rt = RuntimeCalls(np.asarray(r_th, dtype=np.int32), rt_ts - origin, rt_dur, np.asarray(r_name, dtype=np.int32),
                          rt_kind, np.asarray(r_drv, dtype=bool), i64(r_cbid), i64(r_corr), i64(r_ext),
                          np.full(len(r_ts), -1, dtype=np.int64))
        rt.take(np.lexsort((rt.ts_us, rt.thread)))
        _enclosing(cpu, rt)

        gpu = GpuOps(np.asarray(g_dev, dtype=np.int32), i64(g_str), gpu_ts - origin, gpu_dur,
                     np.asarray(g_name, dtype=np.int32), np.asarray(g_kind, dtype=np.int8), i64(g_corr), i64(g_ext),
                     i64(g_bytes), np.full(len(g_ts), -1, dtype=np.int64), np.zeros(len(g_ts), dtype=bool))
        gpu_order = np.lexsort((gpu.ts_us, gpu.stream, gpu.device))
        gpu.take(gpu_order)
        gpu.runtime = _link(gpu.correlation, rt.correlation)

        syncs = SyncEvents(np.asarray(sy[0], dtype=np.int32), i64(sy[1]), sync_ts - origin, sync_dur,
                           np.asarray(sy[4], dtype=np.int8), *(i64(c) for c in sy[5:]),
                           np.zeros(len(sy[0]), dtype=np.int64))
        syncs.take(np.argsort(syncs.ts_us, kind="stable"))
        syncs.runtime = _link(syncs.correlation, rt.correlation)

        ann = GpuAnnotations(np.asarray(an[0], dtype=np.int32), i64(an[1]), ann_ts - origin, ann_dur,
                             np.asarray(an[4], dtype=np.int32), i64(an[5]))
        ann.take(np.argsort(ann.ts_us, kind="stable"))

        flows = self._flows(origin)
        launch_ids = flows.id[flows.kind == FlowKind.LAUNCH]
        gpu.has_flow = np.isin(gpu.correlation, launch_ids) & (gpu.correlation >= 0)
        mem = MemoryEvents(f64(self.mem[0], "[memory]") - origin, np.asarray(self.mem[1], dtype=np.int32),
                           np.asarray(self.mem[2], dtype=np.int32), i64(self.mem[3]), i64(self.mem[4]))
        mem.take(np.argsort(mem.ts_us, kind="stable"))
        colls = self._collectives(cpu, gpu, cpu_order, gpu_order)

        dist = doc.get("distributedInfo") if isinstance(doc.get("distributedInfo"), dict) else {}
        props = doc.get("deviceProperties") if isinstance(doc.get("deviceProperties"), list) else []
        hip = any(k in doc for k in ("hip_runtime_version", "roctracer_version")) or any(
            names[i].startswith("hip") for i in set(r_name))
        platform = "rocm" if hip else ("cuda" if len(gpu) or len(rt) else "cpu")
        trace = KinetoTrace(
            path=src, file_bytes=file_bytes, json_bytes=json_bytes, n_events=n_events, origin_us=origin,
            schema="current", platform=platform, strings=names, threads=list(self.threads), cpu=cpu,
            runtime=rt, gpu=gpu, syncs=syncs, gpu_annotations=ann, flows=flows, memory=mem, collectives=colls,
            rank=_opt_int(dist.get("rank")), world_size=_opt_int(dist.get("world_size")),
            backend=dist.get("backend") if isinstance(dist.get("backend"), str) else None,
            nccl_version=str(dist["nccl_version"]) if "nccl_version" in dist else None,
            pg_config=[c for c in dist.get("pg_config", []) if isinstance(c, dict)]
            if isinstance(dist.get("pg_config"), list) else [],
            distributed_info=dist, device_properties=props, base_time_ns=_opt_int(doc.get("baseTimeNanoseconds")),
            process_names=self.process_names, thread_names=self.thread_names,
            launch_flow_categories=sorted(self.flow_cats), skipped=dict(self.skipped))
        trace.schema = "2021" if (self.old_schema or "async" in self.flow_cats) else "current"
        _steps(trace)
        return trace

    def _flows(self, origin: float) -> Flows:
        pairs = [(k, s, self.flow_f[k]) for k, s in self.flow_s.items() if k in self.flow_f]
        unpaired = len(self.flow_s) + len(self.flow_f) - 2 * len(pairs)
        if unpaired:
            self.skipped["unpaired flow ends"] = unpaired
        fl = Flows(np.asarray([k[0] for k, _, _ in pairs], dtype=np.int8),
                   self._i64([k[1] for k, _, _ in pairs]),
                   self._i64([s[0] for _, s, _ in pairs]), self._i64([s[1] for _, s, _ in pairs]),
                   self._f64([s[2] for _, s, _ in pairs], "flow") - origin,
                   self._i64([f[0] for _, _, f in pairs]), self._i64([f[1] for _, _, f in pairs]),
                   self._f64([f[2] for _, _, f in pairs], "flow") - origin)
        fl.take(np.argsort(fl.src_ts_us, kind="stable"))
        return fl

    def _collectives(self, cpu: CpuOps, gpu: GpuOps, cpu_order: np.ndarray, gpu_order: np.ndarray) -> Collectives:
        inv_cpu = np.empty_like(cpu_order)
        inv_cpu[cpu_order] = np.arange(len(cpu_order))
        inv_gpu = np.empty_like(gpu_order)
        inv_gpu[gpu_order] = np.arange(len(gpu_order))
        rows: list[tuple[float, CollectiveSource, int, dict[str, Any], str]] = []
        for raw, a, name in self.coll_cpu:
            row = int(inv_cpu[raw])
            source = CollectiveSource.PARAM_COMMS if name == "record_param_comms" else CollectiveSource.ANNOTATION
            fallback = "" if name == "record_param_comms" else name.split(":", 1)[1]
            rows.append((float(cpu.ts_us[row]), source, row, a, fallback))
        for raw, a, name in self.coll_gpu:
            row = int(inv_gpu[raw])
            rows.append((float(gpu.ts_us[row]), CollectiveSource.GPU_KERNEL, row, a, _kernel_collective(name) or ""))
        rows.sort(key=lambda r: r[0])
        out = Collectives()
        for ts, source, row, a, fallback in rows:
            name = a.get("Collective name") if isinstance(a.get("Collective name"), str) else fallback
            in_n, dtype = _int(a.get("In msg nelems")), a.get("dtype")
            if in_n < 0 and isinstance(a.get("Input Dims"), list) and a["Input Dims"] and \
                    isinstance(a["Input Dims"][0], list) and source == CollectiveSource.ANNOTATION:
                dims = [_int(d) for d in a["Input Dims"][0]]
                in_n = math.prod(dims) if dims and min(dims) >= 0 else -1
            if dtype is None and isinstance(a.get("Input type"), list) and a["Input type"] and \
                    source == CollectiveSource.ANNOTATION:
                dtype = a["Input type"][0]
            pg = a.get("Process Group Name", a.get("Process Group ID"))
            table = cpu if source != CollectiveSource.GPU_KERNEL else gpu
            out.source.append(source)
            out.row.append(row)
            out.ts_us.append(ts)
            out.dur_us.append(float(table.dur_us[row]))
            out.name.append(name)
            out.kind.append(collective_kind(name) if name else "")
            out.in_nelems.append(in_n)
            out.out_nelems.append(_int(a.get("Out msg nelems")))
            out.dtype.append(str(dtype) if dtype is not None else None)
            out.group_size.append(_int(a.get("Group size")))
            out.pg_name.append(str(pg) if pg is not None else None)
            desc = a.get("Process Group Description")
            out.pg_desc.append(desc if isinstance(desc, str) else None)
            out.pg_ranks.append(_ranks(a.get("Process Group Ranks")))
            out.seq.append(_int(a.get("Seq", a.get("seq"))))
        return out


def _opt_int(x: Any) -> int | None:  # noqa: ANN401
    v = _int(x, -(2**62))
    return None if v == -(2**62) else v


def _nest(cpu: CpuOps) -> None:
    """Fill `parent` and `depth` of CPU ranges sorted by (thread, ts, -dur) with one stack per thread."""
    thread, ts = cpu.thread.tolist(), cpu.ts_us.tolist()
    end = (cpu.ts_us + cpu.dur_us).tolist()
    parent, depth = [-1] * len(ts), [0] * len(ts)
    stack: list[int] = []
    cur = None
    for i, t in enumerate(ts):
        if thread[i] != cur:
            cur = thread[i]
            stack.clear()
        while stack and end[stack[-1]] <= t:
            stack.pop()
        if stack:
            parent[i] = stack[-1]
            depth[i] = len(stack)
        stack.append(i)
    cpu.parent = np.asarray(parent, dtype=np.int64)
    cpu.depth = np.asarray(depth, dtype=np.int32)


def _enclosing(cpu: CpuOps, rt: RuntimeCalls) -> None:
    """Set each runtime call's `cpu_parent`: the innermost CPU range on its thread that contains its start."""
    if not len(rt) or not len(cpu):
        return
    # a composite key (thread, ts) sorted in both tables: threads are small ints, so offset by a span
    span = float(max(cpu.ts_us.max() + cpu.dur_us.max(), rt.ts_us.max())) + 1.0
    ckey = cpu.thread.astype(np.float64) * span + cpu.ts_us
    rkey = rt.thread.astype(np.float64) * span + rt.ts_us
    cand = (np.searchsorted(ckey, rkey, side="right") - 1).tolist()
    cthread, cend, parent = cpu.thread.tolist(), (cpu.ts_us + cpu.dur_us).tolist(), cpu.parent.tolist()
    rthread, rts = rt.thread.tolist(), rt.ts_us.tolist()
    out = [-1] * len(rts)
    for i, c in enumerate(cand):
        if c < 0 or cthread[c] != rthread[i]:
            continue
        t = rts[i]
        while c >= 0 and cend[c] < t:
            c = parent[c]
        out[i] = c
    rt.cpu_parent = np.asarray(out, dtype=np.int64)


def _link(corr: np.ndarray, rt_corr: np.ndarray) -> np.ndarray:
    """Row in the runtime table with the same correlation id for each `corr` (-1 where none)."""
    out = np.full(len(corr), -1, dtype=np.int64)
    if not len(corr) or not len(rt_corr):
        return out
    order = np.argsort(rt_corr, kind="stable")
    keys = rt_corr[order]
    pos = np.minimum(np.searchsorted(keys, corr), len(keys) - 1)
    hit = (keys[pos] == corr) & (corr >= 0)
    out[hit] = order[pos[hit]]
    return out


def _steps(trace: KinetoTrace) -> None:
    """Step windows: ProfilerStep#N, else the start-to-start spacing of optimizer steps, else the trace."""
    cpu, names = trace.cpu, trace.strings
    step_ids = {i: int(m.group(1)) for i, s in enumerate(names) if (m := _STEP_RE.match(s))}
    if step_ids:
        rows = np.flatnonzero(np.isin(cpu.name_id, list(step_ids)))
        seen: dict[int, StepWindow] = {}
        for r in rows[np.argsort(cpu.ts_us[rows], kind="stable")].tolist():
            n = step_ids[int(cpu.name_id[r])]
            start = float(cpu.ts_us[r])
            seen.setdefault(n, StepWindow(n, start, start + float(cpu.dur_us[r]), "ProfilerStep"))
        trace.step_windows = sorted(seen.values(), key=lambda w: w.start_us)
        trace.step_source = "ProfilerStep"
        return
    opt = {i: s for i, s in enumerate(names) if s.startswith("Optimizer.step")}
    if opt:
        rows = np.flatnonzero(np.isin(cpu.name_id, list(opt)) & (cpu.kind != CpuKind.PYTHON_FUNCTION))
        counts = Counter(cpu.name_id[rows].tolist())
        best = max(counts, key=lambda k: (counts[k], -float(cpu.ts_us[rows][cpu.name_id[rows] == k].min())))
        starts = np.sort(cpu.ts_us[rows][cpu.name_id[rows] == best])
        if len(starts) >= 2:
            trace.step_windows = [StepWindow(i, float(a), float(b), "optimizer")
                                  for i, (a, b) in enumerate(zip(starts[:-1], starts[1:], strict=True))]
            trace.step_source = "optimizer"
            trace.assumptions.append(
                f"no ProfilerStep#N in the trace: {len(starts) - 1} steps are the start-to-start spacing of "
                f"the {len(starts)} '{opt[best]}' annotations")
            return
    end = 0.0
    for t in (trace.cpu, trace.runtime, trace.gpu):
        if len(t):
            end = max(end, float(np.max(t.ts_us + t.dur_us)))
    trace.step_windows = [StepWindow(0, 0.0, end, "trace")]
    trace.step_source = "trace"
    trace.assumptions.append(f"no ProfilerStep#N and no repeated Optimizer.step annotation: the whole trace "
                             f"({end / 1000:.3f} ms) is taken as one step")
