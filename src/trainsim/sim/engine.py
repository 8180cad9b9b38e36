"""Discrete-event engine: one global event heap, per-class streams running concurrently.

A stream executes its tasks in program order (CUDA stream semantics); a task starts when its
dependencies are done and it is at the head of every participating class's stream (collectives
wait for all members). Compute overlapped with gradient communication on the same rank runs
slower by the overlap factor gamma (Proteus section VI-C). The default gamma = 0.189 is the
average compute slowdown under compute/communication overlap measured on A100/H100/MI250/MI210
by Lee et al. 2025 ("Characterizing Compute-Communication Overlap in GPU-Accelerated
Distributed Deep Learning", arXiv:2507.03114). The slowdown is applied as a rate while the
overlap lasts, not to whole tasks. Memory is tracked per class: each task holds its peak extra
allocation while it runs (concurrent tasks add up) and leaves its net allocation when it ends.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from ..compile.graph import ExecutionGraph
from ..compile.program import Stream

OVERLAP_GAMMA = 0.189
NS = len(Stream)
_SLOWED = frozenset({"compute", "recompute", "optimizer"})


class SimulationError(RuntimeError):
    """The graph cannot finish (a cycle in control dependencies or inconsistent collective order)."""


@dataclass
class SimTrace:
    start_s: list[float]
    end_s: list[float]
    critical_pred: list[int]
    peak_dynamic_bytes: list[float]
    memory_timeline: list[list[tuple[float, float]]] = field(default_factory=list)


def _sync_points(graph: ExecutionGraph, n_classes: int) -> list[int]:
    """For each compute task, the class's latest earlier pipeline send (Megatron syncs the host after p2p)."""
    sync = [-1] * len(graph)
    for c in range(n_classes):
        sends = graph.queues.get((c, Stream.P2P), [])
        comp = graph.queues.get((c, Stream.COMPUTE), [])
        i, last = 0, -1
        for t in sorted(comp):
            while i < len(sends) and sends[i] < t:
                last = sends[i]
                i += 1
            sync[t] = last
    return sync


def run(graph: ExecutionGraph, gamma: float = OVERLAP_GAMMA, record_memory: bool = True,
        p2p_host_sync: bool = True) -> SimTrace:
    """Simulate the graph. Compute tasks also wait for the framework (host) to issue them: the host
    issues a class's compute stream in order, `host_s` per task, running ahead of the GPU except
    that with `p2p_host_sync` it waits for pipeline sends/receives to finish (Megatron's
    batch_p2p_sync), so tiny kernels and pipeline hand-offs become host-bound as in real runs."""
    n = len(graph)
    n_classes = len(graph.classes)
    deps = graph.deps
    ndeps = [len(d) for d in deps]
    succ: list[list[int]] = [[] for _ in range(n)]
    for t, ds in enumerate(deps):
        for d in ds:
            succ[d].append(t)
    qlist: list[list[int]] = [[] for _ in range(n_classes * NS)]
    for (c, s), tasks in graph.queues.items():
        qlist[c * NS + s] = tasks
    qhead = [0] * (n_classes * NS)
    qbusy = [False] * (n_classes * NS)
    stream = graph.stream
    tq = [[c * NS + stream[t] for c in graph.participants[t]] for t in range(n)]
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
    run_left = [0.0] * n_classes  # full-speed seconds of work left at run_since
    run_since = [0.0] * n_classes
    run_rate = [1.0] * n_classes
    slow_rate = [1.0] * n
    for t in range(n):
        if stream[t] == Stream.COMPUTE and gamma > 0:
            p = parts[t]
            frac = 1.0 if p is None else sum(v for k, v in p.items() if k in _SLOWED) / max(sum(p.values()), 1e-30)
            if p is None and category[t] not in _SLOWED:
                frac = 0.0
            slow_rate[t] = 1.0 / (1.0 + gamma * frac)
    host = graph.host_s
    use_host = any(h > 0 for h in host)
    host_path = graph.host_path_s
    host_free = [0.0] * n_classes  # when each class's host has issued everything so far
    issue_of = [0.0] * n
    sync_on = _sync_points(graph, n_classes) if (use_host and p2p_host_sync) else [-1] * n
    heap: list[tuple[float, int, int, int]] = []
    seq = 0

    def set_rate(c: int, now: float) -> None:
        nonlocal seq
        t = run_task[c]
        if t < 0:
            return
        rate = slow_rate[t] if grad_active[c] > 0 else 1.0
        if rate == run_rate[c]:
            return
        run_left[c] -= (now - run_since[c]) * run_rate[c]
        run_since[c] = now
        run_rate[c] = rate
        version[t] += 1
        seq += 1
        heapq.heappush(heap, (now + max(run_left[c], 0.0) / rate, seq, t, version[t]))

    def try_start(t: int, now: float) -> None:
        nonlocal seq
        if started[t] or ndeps[t]:
            return
        for q in tq[t]:
            if qbusy[q] or qlist[q][qhead[q]] != t:
                return
        issue = 0.0
        if use_host and stream[t] == Stream.COMPUTE:
            c0 = graph.participants[t][0]
            issue = host_free[c0]
            if p2p_host_sync:
                sp = sync_on[t]
                if sp >= 0:
                    if math.isnan(end[sp]):
                        return  # retried when the send ends
                    issue = max(issue, end[sp])
                for d in deps[t]:
                    if stream[d] == Stream.P2P and end[d] > issue:
                        issue = end[d]
            if issue > now + 1e-12:
                seq += 1
                heapq.heappush(heap, (issue, seq, -1 - t, 0))
                return
            host_free[c0] = issue + host[t]
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
        for c in graph.participants[t]:
            held[c] += mem_peak[t]
            v = cur_mem[c] + held[c]
            if v > peak_mem[c]:
                peak_mem[c] = v
        s = stream[t]
        d = dur[t]
        if s == Stream.COMPUTE:
            c = graph.participants[t][0]
            rate = slow_rate[t] if grad_active[c] > 0 else 1.0
            if use_host and issue_of[t] + host_path[t] - now > d:  # host-bound: kernels wait to be issued
                d = issue_of[t] + host_path[t] - now
            run_task[c], run_left[c], run_since[c], run_rate[c] = t, d, now, rate
            finish_at = now + d / rate
        else:
            finish_at = now + d
            if s == Stream.GRAD:
                for c in graph.participants[t]:
                    grad_active[c] += 1
                    if grad_active[c] == 1:
                        set_rate(c, now)
        seq += 1
        heapq.heappush(heap, (finish_at, seq, t, version[t]))

    for q in range(len(qlist)):
        if qlist[q]:
            try_start(qlist[q][0], 0.0)
    done = 0
    while heap:
        now, _, t, ver = heapq.heappop(heap)
        if t < 0:  # a compute task whose host issue time has come
            try_start(-1 - t, now)
            continue
        if ver != version[t]:
            continue
        end[t] = now
        done += 1
        s = stream[t]
        for c in graph.participants[t]:
            held[c] -= mem_peak[t]
            if mem_net[t]:
                cur_mem[c] += mem_net[t]
                if record_memory:
                    timeline[c].append((now, cur_mem[c]))
            if s == Stream.COMPUTE:
                run_task[c] = -1
            elif s == Stream.GRAD:
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
        if s == Stream.P2P and use_host:  # the host was blocked on this send: its compute may go on
            for c in graph.participants[t]:
                q = c * NS + Stream.COMPUTE
                if qhead[q] < len(qlist[q]):
                    try_start(qlist[q][qhead[q]], now)
    if done < n:
        stuck = next(t for t in range(n) if not started[t])
        raise SimulationError(
            f"graph cannot finish: task '{graph.name[stuck]}' never became ready "
            f"(waits on {[graph.name[d] for d in deps[stuck] if math.isnan(end[d])][:3]}); "
            "check for a cycle in control dependencies or collectives issued in different orders")
    return SimTrace(start, end, pred, peak_mem, timeline)
