"""One rank's Kineto trace -> the ExecutionGraph the engine runs (Lumos / dPRO replay graph).

Streams (ids after compile.program.Stream, named in `graph.stream_names`): one per CPU thread, one per
(device, CUDA stream).

* A CPU thread is a chain of back-to-back segments covering [0, its last event]: the pieces between
  every boundary on that thread (top-level CPU op starts/ends, runtime call starts/ends, step
  boundaries and the cut points below). A segment is host work (covered by a top-level CPU op), host
  idle (covered by nothing: the gap is kept as host time), a runtime call (launch, memcpy, sync, other)
  or part of one. Each keeps its measured length, so the chain replays to its measured times unless
  a sync makes it wait longer.
* A GPU op (kernel, memcpy, memset; NCCL kernels are `collective`) is one task on its stream, in
  stream order, depending on the CPU segment that ends at its *cut point* on the launching thread:
  - launch-bound (it started more than `tol` after the GPU could have run it): the cut is its measured
    start, i.e. the launch plus its measured launch latency (`measured_latency=False`: the launch start
    plus the median launch latency, which predicts rather than copies the start);
  - GPU-bound (it started within `tol` of its stream predecessor / cross-stream wait): the cut is the
    launch start plus the median measured launch latency (at most the time the GPU became free), and
    the small measured gap before it is folded into its duration (GPU-side kernel switch time);
  - no runtime event (launched outside the trace): GPU-bound ones follow stream order only;
    launch-bound ones are anchored at their measured start on the main thread.
  A cut inside a host sync call splits it (the sync's wait is its last piece); a cut at or after the end
  of the first sync call after the launch moves to that call's start (the sync may wait for the op).
* Cross-stream waits: `cuda_sync` "Stream Wait Event" records (waited stream + event-record
  correlation) where present, else cudaEventRecord -> cudaStreamWaitEvent pairs on a thread, streams
  inferred from the launches around them: the first op launched on the waiting stream after the wait
  depends on the last op launched on the recorded stream before the record.
* Host syncs (cudaStreamSynchronize / cudaDeviceSynchronize / cudaEventSynchronize / blocking memcpy):
  the call's last segment depends on the GPU ops it waited for and lasts only the measured time after
  the last of them ended. Stream/event syncs wait for the stream (from a `cuda_sync` record, else the
  stream whose work launched before the call ended last within it); device syncs for every stream.
* CPU collectives (gloo): a collective's work range on a worker thread (`gloo:all_reduce`, top level on a
  thread that is not the step thread) waits for the `c10d::*` call that issued it (paired in order) and
  not for the gap before it; the issuing thread's next `Optimizer.step` (else the step's end) waits for
  every work issued in the step, and the gap before it lasts only its measured time after the last work.
* Every inferred dependency is kept only if it is causal in the measured times (the dependency ended
  no later than the dependant started, within `tol`), so a wrong guess never stretches the replay.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from ...compile.graph import ExecutionGraph, RankClass
from ...compile.program import Stream
from .model import CollectiveSource, GpuKind, KinetoTrace, RuntimeKind, StepWindow, SyncKind

FIRST_STREAM = len(Stream)
_ROUND = 3  # boundaries are rounded to 1 ns so equal times from different tables coincide
_SYNC_KINDS = (RuntimeKind.STREAM_SYNC, RuntimeKind.DEVICE_SYNC, RuntimeKind.EVENT_SYNC)


@dataclass
class ReplayGraph:
    """The execution graph plus what the replay needs to map step windows back to replayed times."""

    graph: ExecutionGraph
    thread_stream: dict[int, int]  # trace thread index -> stream id
    boundary_us: dict[int, np.ndarray]  # trace thread index -> sorted segment boundaries, us
    first_segment: dict[int, int]  # trace thread index -> task id of its first segment
    step_thread: dict[int, int]  # step number -> thread whose boundaries hold its window
    main_thread: int
    gpu_task0: int  # task id of GPU op row 0 (GPU op row i is task gpu_task0 + i)
    assumptions: list[str] = field(default_factory=list)
    dropped_deps: int = 0  # inferred dependencies dropped as non-causal
    coll_task: dict[int, int] = field(default_factory=dict)  # trace.collectives index -> task doing its work


def round_us(x: np.ndarray | float) -> np.ndarray:
    return np.round(np.asarray(x, dtype=np.float64), _ROUND)


def _main_thread(trace: KinetoTrace) -> int:
    """The thread with the most runtime calls (else the most CPU ops)."""
    if len(trace.runtime):
        return int(np.bincount(trace.runtime.thread).argmax())
    if len(trace.cpu):
        return int(np.bincount(trace.cpu.thread).argmax())
    return 0


def _step_threads(trace: KinetoTrace, main: int) -> dict[int, int]:
    """The thread of each step window's start annotation (ProfilerStep / optimizer), else the main thread."""
    cpu = trace.cpu
    out: dict[int, int] = {}
    for w in trace.steps():
        th = main
        if w.source != "trace" and len(cpu):
            hit = np.flatnonzero(np.abs(cpu.ts_us - w.start_us) < 1e-6)
            for r in hit.tolist():
                nm = trace.strings[int(cpu.name_id[r])]
                if "ProfilerStep" in nm or nm.startswith("Optimizer.step"):
                    th = int(cpu.thread[r])
                    break
        out[w.step] = th
    return out


def _gpu_category(name: str, kind: int, collective: bool) -> str:
    if kind == GpuKind.MEMCPY:
        return "memcpy"
    if kind == GpuKind.MEMSET:
        return "memset"
    return "collective" if collective or name.startswith(("nccl", "rccl")) else "compute"


@dataclass(frozen=True)
class _Work:
    """A CPU collective's work range (top level on a worker thread) and the call that issued it."""

    coll: int  # index into trace.collectives
    row: int  # CpuOps row of the work
    issue: int  # CpuOps row of the issuing c10d call, -1 if none was found
    step: int  # step whose issuing thread waits for it, -1 if none


def _cpu_collective_works(trace: KinetoTrace, step_threads: set[int], steps: list[StepWindow],
                          step_thread: dict[int, int]) -> tuple[list[_Work], list[tuple[int, float, float, list[int]]]]:
    """CPU collective works, each paired with its issuing call, and per step the waits: (issuing thread,
    end of the last issue, the optimizer step (else the step end), the step's works in issue order)."""
    cpu, c = trace.cpu, trace.collectives
    rows = [(j, c.row[j]) for j in range(len(c)) if c.source[j] == CollectiveSource.ANNOTATION
            and int(cpu.depth[c.row[j]]) == 0 and int(cpu.thread[c.row[j]]) not in step_threads]
    if not rows:
        return [], []
    names = trace.strings
    issue_rows = [r for r in np.flatnonzero(np.isin(cpu.thread, list(step_threads))).tolist()
                  if names[int(cpu.name_id[r])].startswith("c10d::") and "wait" not in names[int(cpu.name_id[r])]]
    issue_rows.sort(key=lambda r: float(cpu.ts_us[r]))
    rows.sort(key=lambda x: float(cpu.ts_us[x[1]]))
    works: list[_Work] = []
    k = 0
    for j, r in rows:  # the earliest unpaired call that started before the work
        issue = -1
        if k < len(issue_rows) and float(cpu.ts_us[issue_rows[k]]) <= float(cpu.ts_us[r]):
            issue = issue_rows[k]
            k += 1
        step = -1
        if issue >= 0:
            t0 = float(cpu.ts_us[issue])
            step = next((w.step for w in steps if w.source != "trace" and w.start_us <= t0 < w.end_us), -1)
        works.append(_Work(j, r, issue, step))
    wait_at: list[tuple[int, float, float, list[int]]] = []
    opt = [r for r in range(len(cpu)) if names[int(cpu.name_id[r])].startswith("Optimizer.step")]
    for w in steps:
        if w.source == "trace":
            continue
        mine = [x for x in works if x.step == w.step]
        if not mine:
            continue
        th = step_thread[w.step]
        last_issue = max(float(cpu.ts_us[x.issue] + cpu.dur_us[x.issue]) for x in mine)
        t_wait = min((float(cpu.ts_us[r]) for r in opt if int(cpu.thread[r]) == th
                      and last_issue < float(cpu.ts_us[r]) < w.end_us), default=w.end_us)
        mine.sort(key=lambda x: float(cpu.ts_us[x.issue]))
        wait_at.append((th, last_issue, t_wait, [x.coll for x in mine]))
    return works, wait_at


def _link_cpu_works(g: ExecutionGraph, trace: KinetoTrace, works: list[_Work],
                    wait_at: list[tuple[int, float, float, list[int]]], boundary: dict[int, np.ndarray],
                    first_seg: dict[int, int], tol_us: float, wait_us: float = 1000.0) -> dict[int, int]:
    """Dependencies of CPU collective works (see module docstring); returns collective index -> work task."""
    cpu = trace.cpu

    def seg_ending(th: int, t_us: float) -> int:
        j = int(np.searchsorted(boundary[th], round_us(t_us)))
        return first_seg[th] + j - 1 if j > 0 else -1

    task_of: dict[int, int] = {}
    end_of: dict[int, float] = {}
    for w in works:
        th = int(cpu.thread[w.row])
        t0, t1 = float(cpu.ts_us[w.row]), float(cpu.ts_us[w.row] + cpu.dur_us[w.row])
        first = seg_ending(th, t0) + 1
        last = seg_ending(th, t1)
        task_of[w.coll], end_of[w.coll] = last, t1
        if w.issue < 0:
            continue
        ith = int(cpu.thread[w.issue])
        issue_end = float(cpu.ts_us[w.issue] + cpu.dur_us[w.issue])
        src = seg_ending(ith, issue_end)
        if src >= 0 and issue_end <= t0 + tol_us:
            g.deps[first].append(src)
            gap = first - 1
            if gap >= first_seg[th] and g.category[gap] == "host_idle":
                g.duration_s[gap] = 0.0  # the worker was waiting for this work to be issued
                g.host_path_s[gap] = 0.0
    for th, last_issue, t_us, colls in wait_at:
        # DDP waits for the buckets in issue order after backward: a gap on the issuing thread that ends
        # shortly after a work ended (within `wait_us`) was the wait for it and every work issued before it
        b = boundary[th]
        j0 = int(np.searchsorted(b, round_us(last_issue)))
        j1 = int(np.searchsorted(b, round_us(t_us)))
        ends = [end_of[c] for c in colls]
        if j1 < len(b) - 1 and max(ends) <= t_us + tol_us:  # the optimizer step waits for every work
            g.deps[first_seg[th] + j1].extend(task_of[c] for c in colls)
        for j in range(max(j0, 1), j1 + 1):
            gap = first_seg[th] + j - 1
            if g.category[gap] != "host_idle":
                continue
            g0, g1 = float(b[j - 1]), float(b[j])
            hit = [k for k, e in enumerate(ends) if g0 - tol_us <= e <= g1 + tol_us and g1 - e <= wait_us]
            if j == j1:  # the optimizer step / step end waits for every work of the step
                if max(ends) > g1 + tol_us:
                    continue
                hit = [len(ends) - 1]
            if not hit:
                continue
            k = max(hit)
            done = max(ends[: k + 1])
            g.deps[gap].extend(task_of[c] for c in colls[: k + 1])
            g.duration_s[gap] = max(g1 - max(g0, done), 0.0) * 1e-6
            g.host_path_s[gap] = g.duration_s[gap]
    return task_of


def build_replay_graph(trace: KinetoTrace, tol_us: float = 5.0, measured_latency: bool = True) -> ExecutionGraph:
    """The replay ExecutionGraph of one rank's trace (one rank class, multiplicity 1); see module docstring."""
    return build_replay(trace, tol_us, measured_latency).graph


def build_replay(trace: KinetoTrace, tol_us: float = 5.0,
                 measured_latency: bool = True) -> ReplayGraph:  # noqa: C901, PLR0912, PLR0915
    """Build the replay graph and the step-mapping tables; `measured_latency=False` cuts launch-bound ops at
    launch start + the median launch latency instead of their measured start (a model, not the measurement)."""
    cpu, rt, gpu = trace.cpu, trace.runtime, trace.gpu
    n_gpu = len(gpu)
    main = _main_thread(trace)
    assumptions: list[str] = []
    dropped = 0

    # ---- GPU side: launch rows, streams, per-stream order --------------------------------------------
    g_ts, g_dur = gpu.ts_us.tolist(), gpu.dur_us.tolist()
    g_end = [a + b for a, b in zip(g_ts, g_dur, strict=True)]
    g_rt = gpu.runtime.tolist()
    rt_ts, rt_dur, rt_thread = rt.ts_us.tolist(), rt.dur_us.tolist(), rt.thread.tolist()
    rt_kind = rt.kind.tolist()
    rt_end = [a + b for a, b in zip(rt_ts, rt_dur, strict=True)]
    launch_ts = [rt_ts[r] if r >= 0 else g_ts[i] for i, r in enumerate(g_rt)]
    keys = list(zip(gpu.device.tolist(), gpu.stream.tolist(), strict=True))
    stream_rows: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, k in enumerate(keys):
        stream_rows[k].append(i)
    # per stream: running max of launch times (stream order) for "last op launched before t"
    stream_lmax = {k: np.maximum.accumulate(np.asarray([launch_ts[i] for i in rows])) for k, rows in stream_rows.items()}

    def last_launched_before(k: tuple[int, int], t: float) -> int:
        j = int(np.searchsorted(stream_lmax[k], t, side="left")) - 1
        return stream_rows[k][j] if j >= 0 else -1

    def first_launched_after(k: tuple[int, int], t: float) -> int:
        j = int(np.searchsorted(stream_lmax[k], t, side="right"))
        rows = stream_rows[k]
        return rows[j] if j < len(rows) else -1

    # ---- cross-stream waits ------------------------------------------------------------------------
    waits: dict[int, list[int]] = defaultdict(list)

    def add_wait(src: int, dst: int) -> None:
        nonlocal dropped
        if src < 0 or dst < 0 or keys[src] == keys[dst]:
            return
        if g_end[src] <= g_ts[dst] + tol_us:
            waits[dst].append(src)
        else:
            dropped += 1

    corr_row = {c: r for r, c in enumerate(rt.correlation.tolist()) if c >= 0}
    sy = trace.syncs
    swe = np.flatnonzero(sy.kind == SyncKind.STREAM_WAIT_EVENT).tolist()
    n_waits = 0
    if swe:
        for s in swe:
            dev, w_stream, s_stream = int(sy.device[s]), int(sy.wait_on_stream[s]), int(sy.stream[s])
            rec = corr_row.get(int(sy.wait_on_event_record_correlation[s]), -1)
            if rec < 0 or (dev, w_stream) not in stream_rows or (dev, s_stream) not in stream_rows:
                continue
            tw = rt_ts[int(sy.runtime[s])] if int(sy.runtime[s]) >= 0 else float(sy.ts_us[s])
            add_wait(last_launched_before((dev, w_stream), rt_ts[rec]), first_launched_after((dev, s_stream), tw))
            n_waits += 1
        assumptions.append(f"cross-stream waits from {n_waits} cuda_sync 'Stream Wait Event' records")
    elif n_gpu:
        # infer: per thread, the launches around cudaEventRecord / cudaStreamWaitEvent give the streams
        launch_of_rt: dict[int, int] = {}
        for i, r in enumerate(g_rt):
            if r >= 0 and r not in launch_of_rt:
                launch_of_rt[r] = i
        last_op: dict[int, int] = {}  # thread -> last GPU op launched on it so far
        last_rec: dict[int, tuple[int, float]] = {}  # thread -> (op before its last cudaEventRecord, record ts)
        pending: dict[int, list[int]] = defaultdict(list)  # thread -> recorded ops its next launch waits for
        for r in range(len(rt)):
            th, kd = rt_thread[r], rt_kind[r]
            if r in launch_of_rt:
                op = launch_of_rt[r]
                last_op[th] = op
                for src in pending.pop(th, []):
                    add_wait(src, op)
                    n_waits += 1
            elif kd == RuntimeKind.EVENT_RECORD and th in last_op:
                last_rec[th] = (last_op[th], rt_ts[r])
            elif kd == RuntimeKind.STREAM_WAIT_EVENT and th in last_rec:
                src_op, t_rec = last_rec[th]
                pending[th].append(last_launched_before(keys[src_op], t_rec))
        if n_waits:
            assumptions.append(f"{n_waits} cross-stream waits inferred from cudaEventRecord -> cudaStreamWaitEvent "
                               "order (streams from the launches around them)")

    # ---- host syncs: which GPU ops each sync-like call waits for -----------------------------------
    sync_stream: dict[int, tuple[int, int]] = {}
    for s in np.flatnonzero((sy.kind == SyncKind.STREAM_SYNC) & (sy.runtime >= 0)).tolist():
        sync_stream[int(sy.runtime[s])] = (int(sy.device[s]), int(sy.stream[s]))
    own_ops: dict[int, list[int]] = defaultdict(list)
    for i, r in enumerate(g_rt):
        if r >= 0:
            own_ops[r].append(i)
    names = trace.strings
    rt_name = rt.name_id.tolist()
    sync_deps: dict[int, list[int]] = {}  # runtime row -> GPU ops it waits for
    for r in range(len(rt)):
        kd = rt_kind[r]
        ts, te = rt_ts[r], rt_end[r]
        if kd == RuntimeKind.MEMCPY and "Async" not in names[rt_name[r]]:
            deps = [i for i in own_ops.get(r, []) if g_end[i] <= te + tol_us]
            if deps:
                sync_deps[r] = deps
            continue
        if kd not in _SYNC_KINDS or not n_gpu:
            continue
        cands = [last_launched_before(k, ts) for k in stream_rows]
        cands = [i for i in cands if i >= 0 and g_end[i] <= te + tol_us]
        if kd == RuntimeKind.STREAM_SYNC and r in sync_stream:
            cands = [i for i in cands if keys[i] == sync_stream[r]]
        elif kd != RuntimeKind.DEVICE_SYNC and cands:
            cands = [max(cands, key=lambda i: g_end[i])]
        if cands:
            sync_deps[r] = cands
    # sync windows per thread (a cut inside one moves to its start)
    sync_win: dict[int, list[tuple[float, float, int]]] = defaultdict(list)
    for r in sync_deps:
        sync_win[rt_thread[r]].append((rt_ts[r], rt_end[r], r))
    sync_starts = {th: np.asarray([w[0] for w in sorted(v)]) for th, v in sync_win.items()}
    for th in sync_win:
        sync_win[th].sort()

    # ---- GPU ops: launch-bound or GPU-bound, cut points ----------------------------------------------
    lat = [g_ts[i] - rt_ts[r] for i, r in enumerate(g_rt) if r >= 0 and g_ts[i] >= rt_ts[r]]
    lat0 = float(np.median(lat)) if lat else 0.0
    cut_of = [(-1, 0.0)] * n_gpu  # (thread, cut us) per GPU op; thread -1: no CPU dependency
    start_m = list(g_ts)  # measured start of each GPU task (earlier than the op where a gap is folded in)
    for rows in stream_rows.values():
        prev_end = -np.inf
        for i in rows:
            ready = max([prev_end, *(g_end[w] for w in waits.get(i, ()))])
            r = g_rt[i]
            gpu_bound = g_ts[i] - ready <= tol_us and (r < 0 or ready >= rt_ts[r])
            if gpu_bound:
                start_m[i] = min(ready, g_end[i])
                if r >= 0:
                    cut_of[i] = (rt_thread[r], min(ready, rt_ts[r] + lat0))
            else:
                start_m[i] = max(g_ts[i], ready)
                p = g_ts[i] if (measured_latency or r < 0) else rt_ts[r] + lat0
                cut_of[i] = (rt_thread[r] if r >= 0 else main, p)
            prev_end = max(prev_end, g_end[i])
            th, p = cut_of[i]
            if r >= 0 and th in sync_win:  # the next sync call after the launch may wait for the op:
                j = int(np.searchsorted(sync_starts[th], rt_ts[r], side="right"))  # cut before its end
                if j < len(sync_win[th]) and p >= sync_win[th][j][1]:
                    cut_of[i] = (th, sync_win[th][j][0])

    # ---- CPU threads: boundaries and segments --------------------------------------------------------
    steps = trace.steps()
    step_thread = _step_threads(trace, main)
    extra: dict[int, list[float]] = defaultdict(list)
    works, wait_at = _cpu_collective_works(trace, set(step_thread.values()) or {main}, steps, step_thread)
    for w in works:
        if w.issue >= 0:
            extra[int(cpu.thread[w.issue])].append(float(cpu.ts_us[w.issue] + cpu.dur_us[w.issue]))
    for th, _, t_us, _ in wait_at:
        extra[th].append(t_us)
    for i in range(n_gpu):
        th, p = cut_of[i]
        if th >= 0:
            extra[th].append(p)
    for w in steps:
        if w.source != "trace":
            extra[step_thread[w.step]] += [w.start_us, w.end_us]
    threads = sorted(set(cpu.thread.tolist()) | set(rt_thread) | set(extra))
    if not threads and n_gpu:
        threads = [main]
    top = cpu.depth == 0
    g = ExecutionGraph()
    g.classes.append(RankClass(f"rank{trace.rank or 0}", 0, 1, range(1)))
    thread_stream: dict[int, int] = {}
    boundary: dict[int, np.ndarray] = {}
    first_seg: dict[int, int] = {}
    seg_of_sync: dict[int, int] = {}  # runtime row -> its last segment's task id
    seg_start_of: dict[int, float] = {}
    cpu_names = trace.names(cpu.name_id)
    for n_th, th in enumerate(threads):
        sid = FIRST_STREAM + n_th
        thread_stream[th] = sid
        pid, tid = trace.threads[th] if th < len(trace.threads) else (0, th)
        label = trace.thread_names.get((pid, tid), "")
        g.stream_names[sid] = f"cpu {pid}/{tid}" + (f" ({label})" if label else "")
        c_rows = np.flatnonzero((cpu.thread == th) & top)
        r_rows = np.flatnonzero(rt.thread == th)
        c_ts, c_end = cpu.ts_us[c_rows], cpu.ts_us[c_rows] + cpu.dur_us[c_rows]
        r_ts_a = rt.ts_us[r_rows]
        r_end_a = r_ts_a + rt.dur_us[r_rows]
        b = round_us(np.concatenate([[0.0], c_ts, c_end, r_ts_a, r_end_a, np.asarray(extra.get(th, []))]))
        b = np.unique(b[b >= 0])
        boundary[th] = b
        first_seg[th] = len(g)
        if len(b) < 2:
            continue
        mids = (b[:-1] + b[1:]) / 2
        # covering runtime call (runtime calls on one thread do not overlap) and top-level CPU op
        jr = np.searchsorted(round_us(r_ts_a), mids, side="right") - 1
        in_rt = (jr >= 0) & (r_end_a[np.maximum(jr, 0)] > mids) if len(r_rows) else np.zeros(len(mids), bool)
        jc = np.searchsorted(round_us(c_ts), mids, side="right") - 1
        in_cpu = (jc >= 0) & (c_end[np.maximum(jc, 0)] > mids) if len(c_rows) else np.zeros(len(mids), bool)
        b_l, in_rt_l, in_cpu_l, jr_l, jc_l = b.tolist(), in_rt.tolist(), in_cpu.tolist(), jr.tolist(), jc.tolist()
        r_rows_l, c_rows_l = r_rows.tolist(), c_rows.tolist()
        for s in range(len(b_l) - 1):
            d_s = (b_l[s + 1] - b_l[s]) * 1e-6
            if in_rt_l[s]:
                r = r_rows_l[jr_l[s]]
                kd = rt_kind[r]
                nm = names[rt_name[r]]
                cat = "launch" if kd == RuntimeKind.LAUNCH else ("sync" if r in sync_deps else "runtime")
                t = g.add(nm, "host", sid, cat, d_s, (0,), [])
                if r in sync_deps:
                    seg_of_sync[r] = t  # the last segment inside the call wins
                    seg_start_of[r] = b_l[s]
            elif in_cpu_l[s]:
                g.add(cpu_names[c_rows_l[jc_l[s]]], "host", sid, "host", d_s, (0,), [])
            else:
                g.add("host gap", "host", sid, "host_idle", d_s, (0,), [])

    # ---- GPU tasks ---------------------------------------------------------------------------------
    coll_rows = {trace.collectives.row[j] for j in range(len(trace.collectives))
                 if trace.collectives.source[j] == CollectiveSource.GPU_KERNEL}
    gpu_stream: dict[tuple[int, int], int] = {}
    for k in sorted(stream_rows):
        gpu_stream[k] = FIRST_STREAM + len(threads) + len(gpu_stream)
        g.stream_names[gpu_stream[k]] = f"gpu {k[0]} stream {k[1]}"
    gpu_task0 = len(g)
    g_names = trace.names(gpu.name_id)
    g_kind = gpu.kind.tolist()
    for i in range(n_gpu):
        deps: list[int] = []
        th, p = cut_of[i]
        if th >= 0:
            j = int(np.searchsorted(boundary[th], round_us(p)))
            if j > 0:
                deps.append(first_seg[th] + j - 1)
        cat = _gpu_category(g_names[i], g_kind[i], i in coll_rows)
        g.add(g_names[i], "collective" if cat == "collective" else "compute", gpu_stream[keys[i]], cat,
              max(g_end[i] - start_m[i], 0.0) * 1e-6, (0,), deps)
    for dst, srcs in waits.items():
        g.deps[gpu_task0 + dst].extend(gpu_task0 + s for s in srcs)
    # a task was added after its CPU-side source ids were known; GPU ids are fixed now: link syncs
    for r, ops in sync_deps.items():
        t = seg_of_sync.get(r)
        if t is None:
            continue
        last = max(g_end[i] for i in ops)
        g.deps[t].extend(gpu_task0 + i for i in ops)
        g.duration_s[t] = max(rt_end[r] - max(seg_start_of[r], last), 0.0) * 1e-6
        g.host_path_s[t] = g.duration_s[t]
    coll_task = {j: gpu_task0 + trace.collectives.row[j] for j in range(len(trace.collectives))
                 if trace.collectives.source[j] == CollectiveSource.GPU_KERNEL}
    if works:
        coll_task.update(_link_cpu_works(g, trace, works, wait_at, boundary, first_seg, tol_us))
        assumptions.append(f"{len(works)} CPU collective works (e.g. gloo) wait for the call that issued them; "
                           f"{len(wait_at)} optimizer steps / step ends wait for the works of their step")
    if n_gpu:
        assumptions.append(f"launch latency of GPU-bound ops: median measured {lat0:.1f} us; gaps <= {tol_us:g} us "
                           "before a GPU-bound op are kept as GPU time")
    if dropped:
        assumptions.append(f"{dropped} inferred cross-stream waits dropped (not causal in the measured times)")
    if int(np.sum(gpu.runtime < 0)):
        assumptions.append(f"{int(np.sum(gpu.runtime < 0))} GPU ops have no runtime event: stream order only, "
                           "anchored at their measured start when the stream was idle before them")
    if not n_gpu:
        assumptions.append("no GPU ops: the replay is the CPU timeline")
    return ReplayGraph(g, thread_stream, boundary, first_seg, step_thread, main, gpu_task0, assumptions, dropped,
                       coll_task)


__all__ = ["FIRST_STREAM", "ReplayGraph", "build_replay", "build_replay_graph"]
