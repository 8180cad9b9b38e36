"""The discrete-event engine as it was before its rewrite for speed (sim.engine, issue 21), kept verbatim
as a test oracle: tests/test_engine_equivalence.py checks that sim.engine.run gives the same trace to the
bit on random graphs and real jobs. Only its imports changed (absolute, and SimTrace / SimulationError
from sim.engine so that the two traces compare field by field). Do not optimise this file.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

from trainsim.compile.graph import ExecutionGraph
from trainsim.compile.program import Stream
from trainsim.sim.engine import SimTrace, SimulationError
from trainsim.sim.flows import max_min_rates

OVERLAP_GAMMA = 0.189
NS = len(Stream)
_COMPUTE, _FEATURE, _GRAD, _P2P = int(Stream.COMPUTE), int(Stream.FEATURE), int(Stream.GRAD), int(Stream.P2P)
_SLOWED = frozenset({"compute", "recompute", "optimizer"})


def _sync_points(graph: ExecutionGraph, n_classes: int) -> list[int]:
    """For each host-issued task, the class's latest earlier pipeline send (Megatron syncs the host after
    p2p). A collective several classes join takes its first participant's (the class it was built for:
    task ids follow that class's program order)."""
    sync = [-1] * len(graph)
    participants = graph.participants
    for c in range(n_classes):
        sends = graph.queues.get((c, Stream.P2P), [])
        comp = [*graph.queues.get((c, Stream.COMPUTE), []),
                *(t for t in graph.queues.get((c, Stream.FEATURE), []) if participants[t][0] == c)]
        i, last = 0, -1
        for t in sorted(comp):
            while i < len(sends) and sends[i] < t:
                last = sends[i]
                i += 1
            sync[t] = last
    return sync


def _intensities(graph: ExecutionGraph) -> list[tuple[tuple[int, float], ...] | None]:
    """Per task: (resource, work / bandwidth seconds) pairs, or None for a fixed-duration task."""
    out: list[tuple[tuple[int, float], ...] | None] = [None] * len(graph)
    for t, dem in enumerate(graph.flow_demand):
        if not dem:
            continue
        bw_s = graph.duration_s[t] - (0.0 if graph.stream[t] == Stream.COMPUTE else graph.flow_latency_s[t])
        if bw_s > 0:
            out[t] = tuple((r, w / bw_s) for r, w in dem if w > 0)
    return out


def run(graph: ExecutionGraph, gamma: float = OVERLAP_GAMMA, record_memory: bool = True,
        p2p_host_sync: bool = True, bandwidth_sharing: bool = True,
        progress: Callable[[int, int], None] | None = None, progress_every: int = 8192) -> SimTrace:
    """Simulate the graph. Compute tasks and feature collectives (TP/CP/EP, the ones fusion may fold
    into compute) also wait for the framework (host) to issue them: each class's host issues them in
    order, `host_s` per task, running ahead of the GPU except that with `p2p_host_sync` it waits for
    pipeline sends/receives to finish (Megatron's batch_p2p_sync), so tiny kernels and pipeline
    hand-offs become host-bound as in real runs. A task cannot finish before its issue time plus its
    `host_path_s`; a fused task's host_path_s covers the ops it fused, so how finely a chain is cut
    into tasks does not change when it ends.
    `bandwidth_sharing=False` ignores the graph's flow demands (every task keeps its duration).
    `progress(tasks finished, tasks)` is called every `progress_every` finished tasks."""
    n = len(graph)
    n_classes = len(graph.classes)
    deps = graph.deps
    ndeps = [len(d) for d in deps]
    succ: list[list[int]] = [[] for _ in range(n)]
    for t, ds in enumerate(deps):
        for d in ds:
            succ[d].append(t)
    stream = graph.stream
    ns = max(NS, max(stream, default=0) + 1)  # trace graphs add streams (host threads, CUDA streams)
    qlist: list[list[int]] = [[] for _ in range(n_classes * ns)]
    for (c, s), tasks in graph.queues.items():
        qlist[c * ns + s] = tasks
    qhead = [0] * (n_classes * ns)
    qbusy = [False] * (n_classes * ns)
    participants = graph.participants
    tq = [[c * ns + stream[t] for c in participants[t]] for t in range(n)]
    dur = graph.duration_s
    parts = graph.parts
    category = graph.category
    mem_peak, mem_net = graph.mem_peak_bytes, graph.mem_net_bytes
    start = [math.nan] * n
    end = [math.nan] * n
    pred = [-1] * n
    started = [False] * n
    version = [0] * n
    cur_mem = [0.0] * n_classes  # net allocations of finished tasks
    held = [0.0] * n_classes  # running tasks' peak extra allocation (their net lands when they end)
    peak_mem = [0.0] * n_classes
    timeline: list[list[tuple[float, float]]] = [[(0.0, 0.0)] for _ in range(n_classes)]
    grad_active = [0] * n_classes
    run_task = [-1] * n_classes
    left = [0.0] * n  # full-speed seconds of work left at `since` (rate-scaled tasks)
    floor = [0.0] * n  # a compute task ends no earlier: its issue time + host_path_s (the host's pace)
    since = [0.0] * n
    rate = [1.0] * n
    slow_rate = [1.0] * n
    # bandwidth sharing state: intensities, current share, active flows, summed intensity per resource
    flow = _intensities(graph) if bandwidth_sharing and any(graph.flow_demand) else [None] * n
    has_flows = any(f is not None for f in flow)
    share = [1.0] * n
    active: dict[int, None] = {}
    demand_load = [0.0] * len(graph.resources)
    throttled = 0
    flow_lat = graph.flow_latency_s if has_flows else [0.0] * n
    for t in range(n):
        if stream[t] == _COMPUTE and gamma > 0:
            p = parts[t]
            frac = 1.0 if p is None else sum(v for k, v in p.items() if k in _SLOWED) / max(sum(p.values()), 1e-30)
            if p is None and category[t] not in _SLOWED:
                frac = 0.0
            slow_rate[t] = 1.0 / (1.0 + gamma * frac)
    host = graph.host_s
    use_host = any(h > 0 for h in host)
    host_path = graph.host_path_s
    host_free = [0.0] * n_classes  # when each class's host has issued everything so far
    issue_of = [math.nan] * n  # set for host-issued tasks only
    sync_on = _sync_points(graph, n_classes) if (use_host and p2p_host_sync) else [-1] * n
    host_issued = [use_host and s in (_COMPUTE, _FEATURE) for s in stream]
    p2p_deps = [[d for d in ds if stream[d] == _P2P] if h else [] for ds, h in zip(deps, host_issued, strict=True)]
    heap: list[tuple[float, int, int, int]] = []
    seq = 0

    def reschedule(t: int, now: float) -> None:
        """Move task t's finish to match its current rate (gamma slowdown x bandwidth share)."""
        nonlocal seq
        r = share[t]
        if stream[t] == _COMPUTE:
            c = participants[t][0]
            if grad_active[c] > 0:
                r *= slow_rate[t]
        if r == rate[t]:
            return
        left[t] -= (now - since[t]) * rate[t]
        since[t] = now
        rate[t] = r
        version[t] += 1
        seq += 1
        heapq.heappush(heap, (max(now + max(left[t], 0.0) / r, floor[t]), seq, t, version[t]))

    def set_rate(c: int, now: float) -> None:
        t = run_task[c]
        if t >= 0:
            reschedule(t, now)

    def refill(now: float) -> None:
        """Recompute every active flow's max-min share and reschedule those whose share changed."""
        nonlocal throttled
        throttled = 0
        for f, x in max_min_rates(active, flow).items():
            if x < 1.0:
                throttled += 1
            if x != share[f]:
                share[f] = x
                reschedule(f, now)

    def flow_start(t: int, now: float) -> None:
        fl = flow[t]
        assert fl is not None
        active[t] = None
        over = False
        for r, u in fl:
            demand_load[r] += u
            if demand_load[r] > 1.0 + 1e-12:
                over = True
        if over or throttled:
            refill(now)

    def flow_end(t: int, now: float) -> None:
        fl = flow[t]
        assert fl is not None
        del active[t]
        for r, u in fl:
            demand_load[r] -= u
        if share[t] < 1.0 or throttled:
            share[t] = 1.0
            refill(now)

    def comm_bandwidth_phase(t: int, now: float) -> None:
        """A flow task's latency is over: its bandwidth part starts sharing links."""
        nonlocal seq
        left[t], since[t], rate[t], share[t] = dur[t] - flow_lat[t], now, 1.0, 1.0
        seq += 1
        heapq.heappush(heap, (now + max(left[t], 0.0), seq, t, version[t]))
        flow_start(t, now)

    def try_start(t: int, now: float) -> None:
        nonlocal seq
        if started[t] or ndeps[t]:
            return
        for q in tq[t]:
            if qbusy[q] or qlist[q][qhead[q]] != t:
                return
        if host_issued[t]:
            synced = 0.0
            if p2p_host_sync:
                sp = sync_on[t]
                if sp >= 0:
                    if math.isnan(end[sp]):
                        return  # retried when the send ends
                    synced = end[sp]
                for d in p2p_deps[t]:
                    if end[d] > synced:
                        synced = end[d]
            if graph.host_sync[t]:  # a device-to-host read: the host waits for every dependency's end
                synced = max([synced, *(end[d] for d in deps[t])])
            members = participants[t]
            # each member's host issues it when done with what came before (a collective runs once all did)
            issue = host_free[members[0]] if len(members) == 1 else max(host_free[c] for c in members)
            if synced > issue:
                issue = synced
            if issue > now + 1e-12:
                seq += 1
                heapq.heappush(heap, (issue, seq, -1 - t, 0))
                return
            for c in members:
                host_free[c] = max(host_free[c], synced) + host[t]
            issue_of[t] = issue
        started[t] = True
        start[t] = now
        best, best_end = -1, -1.0
        for d in deps[t]:
            if end[d] > best_end:
                best, best_end = d, end[d]
        for q in tq[t]:
            qbusy[q] = True
            h = qhead[q]
            if h > 0:
                p = qlist[q][h - 1]
                if end[p] > best_end:
                    best, best_end = p, end[p]
        pred[t] = best
        for c in participants[t]:
            held[c] += mem_peak[t]
            v = cur_mem[c] + held[c]
            if v > peak_mem[c]:
                peak_mem[c] = v
            if record_memory and mem_peak[t] > 0.0 and mem_peak[t] > mem_net[t]:  # a transient: its top
                timeline[c].append((now, v))
        s = stream[t]
        d = dur[t]
        if s == _COMPUTE:
            c = participants[t][0]
            r0 = slow_rate[t] if grad_active[c] > 0 else 1.0
            # host-bound: kernels wait to be issued. The wait is a floor on the end, not GPU work: the
            # overlap slowdown and a link share stretch the kernels only (a fused chain and its ops alike)
            if use_host:
                floor[t] = issue_of[t] + host_path[t]
            run_task[c], left[t], since[t], rate[t] = t, d, now, r0
            seq += 1
            heapq.heappush(heap, (max(now + d / r0, floor[t]), seq, t, version[t]))
            if flow[t] is not None:
                flow_start(t, now)
        else:
            # a host-bound collective: its kernel waits to be launched before it moves anything
            late = max(0.0, issue_of[t] + host_path[t] - now - d) if use_host and s == _FEATURE else 0.0
            if flow[t] is not None:
                lat = min(flow_lat[t], d) + late
                if lat > 0:
                    seq += 1
                    heapq.heappush(heap, (now + lat, seq, t, -1))
                else:
                    comm_bandwidth_phase(t, now)
            else:
                seq += 1
                heapq.heappush(heap, (now + d + late, seq, t, version[t]))
            if s == _GRAD:
                for c in participants[t]:
                    grad_active[c] += 1
                    if grad_active[c] == 1:
                        set_rate(c, now)

    for q in range(len(qlist)):
        if qlist[q]:
            try_start(qlist[q][0], 0.0)
    done = 0
    report_at = progress_every if progress is not None else -1
    while heap:
        now, _, t, ver = heapq.heappop(heap)
        if t < 0:  # a host-issued task whose issue time has come
            try_start(-1 - t, now)
            continue
        if ver == -1:  # a flow's latency is over
            comm_bandwidth_phase(t, now)
            continue
        if ver != version[t]:
            continue
        end[t] = now
        done += 1
        if done == report_at and progress is not None:
            progress(done, n)
            report_at += progress_every
        s = stream[t]
        if t in active:
            flow_end(t, now)
        for c in participants[t]:
            held[c] -= mem_peak[t]
            if mem_net[t]:
                cur_mem[c] += mem_net[t]
                if record_memory:
                    timeline[c].append((now, cur_mem[c]))
            if s == _COMPUTE:
                run_task[c] = -1
            elif s == _GRAD:
                grad_active[c] -= 1
                if grad_active[c] == 0:
                    set_rate(c, now)
        for q in tq[t]:
            qbusy[q] = False
            qhead[q] += 1
        for x in succ[t]:
            ndeps[x] -= 1
            if not ndeps[x]:
                try_start(x, now)
        for q in tq[t]:
            if qhead[q] < len(qlist[q]):
                try_start(qlist[q][qhead[q]], now)
        if s == _P2P and use_host:  # the host was blocked on this send: what it issues may go on
            for c in participants[t]:
                for hs in (_COMPUTE, _FEATURE):
                    q = c * ns + hs
                    if qhead[q] < len(qlist[q]):
                        try_start(qlist[q][qhead[q]], now)
    if done < n:
        stuck = next(t for t in range(n) if not started[t])
        raise SimulationError(
            f"graph cannot finish: task '{graph.name[stuck]}' never became ready "
            f"(waits on {[graph.name[d] for d in deps[stuck] if math.isnan(end[d])][:3]}); "
            "check for a cycle in control dependencies or collectives issued in different orders")
    return SimTrace(start, end, pred, peak_mem, timeline, issue_of)
