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

Bandwidth sharing (Proteus section VI-C): a task with a flow demand (graph.flow_demand) first
spends its fixed latency, then becomes a flow over shared resources (a class's GPU links, a node's
NICs) whose rate is its max-min fair share (sim.flows), recomputed whenever a flow starts or ends;
a task's remaining work is rescheduled at the new rate as compute tasks are under gamma (set_rate).
A compute task that absorbed feature collectives (graph.coarsen) is a flow from its start, and its
rate is the gamma slowdown times its share.

How the loop runs (and why it is fast). Events are heap entries (time, sequence number, task,
version): a task's end (stale once a rate change bumped the task's version), the end of a flow's
latency (version -1) or a host-issue wake-up (task encoded as -1 - t). Equal times pop in push
order. Each task keeps one counter, `waiting`: its unfinished dependencies plus the queues it is
not yet at the head of (-1 once started). An event collects, in a fixed order, the tasks it may let
start (the successors it made ready, then the new head of each queue it left, then, after a pipeline
send, the host-issued heads it may unblock) and the loop tries each in turn: ready means waiting ==
0, then the host may still hold it (its sync point or issue time). The order, and every float
operation, are those of the simple engine this replaced (kept as tests/engine_reference.py), so
traces are the same to the bit. Per-task inputs (intensities, the gamma slowdown, a host sync
point) are derived when a task needs them, not for every task up front, and a flow alone on a link
only its own stream loads (a class's GPU link under its fused compute) is left out of the shares.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field
from heapq import heappop, heappush
from itertools import accumulate, compress, count
from operator import add, index

from ..compile.graph import ExecutionGraph
from ..compile.program import Stream
from .flows import Intensities, max_min_rates

OVERLAP_GAMMA = 0.189
NS = len(Stream)
_COMPUTE, _FEATURE, _GRAD, _P2P = int(Stream.COMPUTE), int(Stream.FEATURE), int(Stream.GRAD), int(Stream.P2P)
_SLOWED = frozenset({"compute", "recompute", "optimizer"})
# a flow loading an exclusive resource below this (of its capacity 1) can never saturate it: sim.flows
# saturates a resource within 1e-9 of its level (< 1 while any flow is throttled)
_QUIET = 0.999


class SimulationError(RuntimeError):
    """The graph cannot finish (a cycle in control dependencies or inconsistent collective order)."""


@dataclass
class SimTrace:
    start_s: list[float]
    end_s: list[float]
    critical_pred: list[int]
    peak_dynamic_bytes: list[float]
    memory_timeline: list[list[tuple[float, float]]] = field(default_factory=list)
    issue_s: list[float] = field(default_factory=list)  # when the host issued each task (nan: not host-issued)


def _p2p_sends(graph: ExecutionGraph, n_classes: int) -> tuple[list[list[int]], list[list[int]]]:
    """Per class: its pipeline sends in queue order, and their running maximum task id (for bisection).

    Megatron syncs the host after pipeline p2p: a host-issued task waits for its class's latest earlier
    send, the last of the longest run of sends with ids below the task's (bisect_left on the running
    maximum). A collective several classes join takes its first participant's sends (the class it was
    built for: task ids follow that class's program order), a compute task its last participant's."""
    sends = [graph.queues.get((c, Stream.P2P), []) for c in range(n_classes)]
    return sends, [list(accumulate(s, max)) for s in sends]


def _exclusive_resources(demand: list[tuple[tuple[int, float], ...] | None], tq: list[tuple[int, ...]],
                         n_resources: int) -> list[bool]:
    """Per resource: only the tasks of one stream queue load it, each once. They run one at a time, so a
    flow on it never shares it, and its summed load is exactly that flow's intensity (0 between flows)."""
    owner = [-2] * n_resources  # the one queue of its users, -2: none yet, -1: several
    last = [-1] * n_resources  # its latest user (a task that lists it twice leaves rounding behind)
    assert len(demand) == len(tq)
    for t in compress(range(len(demand)), demand):  # the tasks with a demand
        dem, qs = demand[t], tq[t]
        if dem:
            q = qs[0] if len(qs) == 1 else -1
            for r, _ in dem:
                o = owner[r]
                if o == -2:
                    owner[r] = q
                elif o != q or last[r] == t:
                    owner[r] = -1
                last[r] = t
    return [o >= 0 for o in owner]


def _slowdown(graph: ExecutionGraph, t: int, gamma: float) -> float:
    """Rate of compute task t while gradient communication overlaps it: 1 / (1 + gamma x the slowed
    fraction of its time; all of it unless fused parts say otherwise)."""
    p = graph.parts[t]
    frac = 1.0 if p is None else sum(v for k, v in p.items() if k in _SLOWED) / max(sum(p.values()), 1e-30)
    if p is None and graph.category[t] not in _SLOWED:
        frac = 0.0
    return 1.0 / (1.0 + gamma * frac)


def run(graph: ExecutionGraph, gamma: float = OVERLAP_GAMMA, record_memory: bool = True,
        p2p_host_sync: bool = True, bandwidth_sharing: bool = True,
        progress: Callable[[int, int], None] | None = None, progress_every: int = 8192) -> SimTrace:
    """Simulate the graph. Compute tasks and feature collectives (TP/CP/EP, the ones fusion may fold
    into compute) also wait for the framework (host) to issue them: each class's host issues them in
    order, `host_s` per task, running ahead of the GPU except that with `p2p_host_sync` it waits for
    pipeline sends/receives to finish (Megatron's batch_p2p_sync), and before a `host_sync` task it waits
    for that task's dependencies to finish (a device-to-host read), so tiny kernels, pipeline hand-offs and
    synchronizing reads become host-bound as in real runs. A task cannot finish before its issue time plus its
    `host_path_s`; a fused task's host_path_s covers the ops it fused, so how finely a chain is cut
    into tasks does not change when it ends.
    `bandwidth_sharing=False` ignores the graph's flow demands (every task keeps its duration).
    `progress(tasks finished, tasks)` is called every `progress_every` finished tasks."""
    n = len(graph)
    n_classes = len(graph.classes)
    # ---- graph inputs, bound to locals once
    deps, participants = graph.deps, graph.participants
    kind = list(map(index, graph.stream))  # plain ints: they compare faster than Stream members
    dur, host, host_path = graph.duration_s, graph.host_s, graph.host_path_s
    host_sync = graph.host_sync
    mem_peak, mem_net = graph.mem_peak_bytes, graph.mem_net_bytes
    flow_lat = graph.flow_latency_s
    sharing = bandwidth_sharing and any(graph.flow_demand)
    demand = graph.flow_demand if sharing else [None] * n
    use_host = any(h > 0 for h in host)
    p2p_sync = use_host and p2p_host_sync
    sends, sends_reach = _p2p_sends(graph, n_classes) if p2p_sync else ([], [])

    # ---- stream queues: id c * ns + stream, each ending in a sentinel task n that never becomes ready
    ns = max(NS, max(kind, default=0) + 1)  # trace graphs add streams (host threads, CUDA streams)
    qlist: list[list[int]] = [[n] for _ in range(n_classes * ns)]
    for (c, s), tasks in graph.queues.items():
        qlist[c * ns + s] = [*tasks, n]
    qhead = [0] * len(qlist)  # index of each queue's head (running or next to run)
    host_queues = [(c * ns + _COMPUTE, c * ns + _FEATURE) for c in range(n_classes)]  # what a host issues
    tq = [(p[0] * ns + s,) if len(p) == 1 else tuple(c * ns + s for c in p)  # t's queues, participant order
          for p, s in zip(participants, kind, strict=True)]
    succ: list[list[int]] = [[] for _ in range(n)]
    for t, ds in enumerate(deps):
        for d in ds:
            succ[d].append(t)
    # unfinished dependencies + queues where t is not the head yet: t may start when it reaches 0
    waiting = list(map(add, map(len, deps), map(len, participants)))
    waiting.append(len(qlist) + 1)  # the sentinel's: each queue lowers it once at most (a started task's: -1)
    for q in qlist:
        waiting[q[0]] -= 1

    # ---- per-task state
    start = [math.nan] * n
    end = [math.nan] * n
    pred = [-1] * n
    version = [0] * n  # bumped when a rate change moves the task's end (older end events are stale)
    issue_of = [math.nan] * n  # set for host-issued tasks only
    left = [0.0] * n  # full-speed seconds of work left at `since` (rate-scaled tasks)
    floor = [0.0] * n  # a compute task ends no earlier: its issue time + host_path_s (the host's pace)
    since = [0.0] * n
    rate = [1.0] * n
    slow_rate = [0.0] * n  # the gamma slowdown, derived on first use (0: not yet)
    share = [1.0] * n  # bandwidth share of a flow
    bw_of = [0.0] * n  # a flow's stand-alone bandwidth seconds (its intensities: work / this)
    # ---- per-class state
    cur_mem = [0.0] * n_classes  # net allocations of finished tasks
    held = [0.0] * n_classes  # running tasks' peak extra allocation (their net lands when they end)
    peak_mem = [0.0] * n_classes
    timeline: list[list[tuple[float, float]]] = [[(0.0, 0.0)] for _ in range(n_classes)]
    grad_active = [0] * n_classes
    run_task = [-1] * n_classes
    host_free = [0.0] * n_classes  # when each class's host has issued everything so far
    # ---- bandwidth sharing: active flows (insertion ordered), summed intensity per resource
    active: dict[int, None] = {}
    demand_load = [0.0] * len(graph.resources)
    throttled = 0  # active flows below full speed at the last refill
    intensity: list[Intensities | None] = [None] * n  # of flows, derived at their first refill
    exclusive = _exclusive_resources(demand, tq, len(graph.resources)) if sharing else []
    heap: list[tuple[float, int, int, int]] = []
    seq = count().__next__  # ties in time pop in push order

    def slowdown(t: int) -> float:
        """Compute task t's rate under gradient overlap (derived once, when first needed)."""
        v = slow_rate[t]
        if not v:
            v = slow_rate[t] = _slowdown(graph, t, gamma) if gamma > 0 else 1.0
        return v

    def reschedule(t: int, now: float) -> None:
        """Move task t's finish to match its current rate (gamma slowdown x bandwidth share)."""
        r = share[t]
        if kind[t] == _COMPUTE:
            c = participants[t][0]
            if grad_active[c] > 0:
                r *= slowdown(t)
        if r == rate[t]:
            return
        left[t] -= (now - since[t]) * rate[t]
        since[t] = now
        rate[t] = r
        version[t] += 1
        heappush(heap, (max(now + max(left[t], 0.0) / r, floor[t]), seq(), t, version[t]))

    def set_rate(c: int, now: float) -> None:
        t = run_task[c]
        if t >= 0:
            reschedule(t, now)

    def refill(now: float) -> None:
        """Recompute every active flow's max-min share and reschedule those whose share changed."""
        nonlocal throttled
        throttled = 0
        for f in active:
            if intensity[f] is None:
                intensity[f] = tuple((r, w / bw_of[f]) for r, w in demand[f] if w > 0)
        for f, x in max_min_rates(active, intensity).items():
            if x < 1.0:
                throttled += 1
            if x != share[f]:
                share[f] = x
                reschedule(f, now)

    def flow_start(t: int, now: float) -> None:
        """t's bandwidth part starts: it loads its resources (intensity: work / bw_of[t] seconds) and the
        shares are recomputed if that overloads one or some flow runs throttled. A flow on one exclusive
        resource (no other flow at the same time), below its capacity, can neither be throttled nor
        change another's share nor overload: it is left out (from `active` and the loads) altogether."""
        bw = bw_of[t]
        dem = demand[t]
        if len(dem) == 1 and exclusive[dem[0][0]] and dem[0][1] < _QUIET * bw:
            return
        active[t] = None
        over = False
        for r, w in dem:
            if w > 0:
                load = demand_load[r] = demand_load[r] + w / bw
                if load > 1.0 + 1e-12:
                    over = True
        if over or throttled:
            refill(now)

    def bandwidth_phase(t: int, now: float) -> None:
        """A flow task's latency is over: its bandwidth part (bw_of[t] > 0 seconds alone) starts sharing
        links. Its rate and share are still 1 and its version 0: nothing rescheduled it yet."""
        bw = left[t] = bw_of[t]
        since[t] = now
        heappush(heap, (now + bw, seq(), t, 0))
        flow_start(t, now)

    done = 0
    report_at = progress_every if progress is not None else -1
    now = 0.0
    ready = [q[0] for q in qlist if q[0] < n]  # tasks to try, in the order events name them
    add_ready = ready.append
    while True:
        # ---- try to start each task the last event named (all of them, in order: ties are exact)
        for x in ready:
            if waiting[x]:  # not ready, or started already
                continue
            s = kind[x]
            members = participants[x]
            ds = deps[x]
            if use_host and s in (_COMPUTE, _FEATURE):  # host-issued
                synced = 0.0
                if p2p_sync:
                    c = members[0] if len(members) == 1 or s != _COMPUTE else max(members)
                    i = bisect_left(sends_reach[c], x)
                    if i:
                        synced = end[sends[c][i - 1]]
                        if synced != synced:  # nan: the send is running; retried when it ends
                            continue
                    for p in ds:
                        if kind[p] == _P2P and end[p] > synced:
                            synced = end[p]
                if host_sync[x]:  # tried once its dependencies ended: the host read waits for the latest
                    for p in ds:
                        if end[p] > synced:
                            synced = end[p]
                # each member's host issues it when done with what came before (a collective: once all did)
                issue = host_free[members[0]] if len(members) == 1 else max(host_free[c] for c in members)
                if synced > issue:
                    issue = synced
                if issue > now + 1e-12:
                    heappush(heap, (issue, seq(), -1 - x, 0))
                    continue
                if len(members) == 1:
                    host_free[members[0]] = issue + host[x]  # = max(its host_free, synced) + host_s
                else:
                    h = host[x]
                    for c in members:
                        host_free[c] = max(host_free[c], synced) + h
                issue_of[x] = issue
            waiting[x] = -1
            start[x] = now
            # the critical predecessor: the latest-ending dependency or previous task on its streams
            best, best_end = -1, -1.0
            for p in ds:
                if end[p] > best_end:
                    best, best_end = p, end[p]
            for q in tq[x]:
                h = qhead[q]
                if h:
                    p = qlist[q][h - 1]
                    if end[p] > best_end:
                        best, best_end = p, end[p]
            pred[x] = best
            mp = mem_peak[x]
            for c in members:
                held[c] += mp
                v = cur_mem[c] + held[c]
                if v > peak_mem[c]:
                    peak_mem[c] = v
                if record_memory and mp > 0.0 and mp > mem_net[x]:  # frees some of what it takes (a transient)
                    timeline[c].append((now, v))
            d = dur[x]
            dem = demand[x]
            if s == _COMPUTE:
                c = members[0]
                # host-bound: kernels wait to be issued. The wait is a floor on the end, not GPU work: the
                # overlap slowdown and a link share stretch the kernels only (a fused chain and its ops alike)
                if grad_active[c] > 0:
                    r0 = slowdown(x)
                    e = now + d / r0
                else:
                    r0 = 1.0
                    e = now + d  # = now + d / 1.0
                if use_host:
                    f = floor[x] = issue_of[x] + host_path[x]
                    if f > e:
                        e = f
                run_task[c], left[x], since[x], rate[x] = x, d, now, r0
                heappush(heap, (e, seq(), x, 0))
                if dem and d > 0:  # a flow from its start
                    bw_of[x] = d
                    flow_start(x, now)
                continue
            # a host-bound collective: its kernel waits to be launched before it moves anything
            late = max(0.0, issue_of[x] + host_path[x] - now - d) if use_host and s == _FEATURE else 0.0
            lat = flow_lat[x]
            if dem and d - lat > 0:  # a flow after its latency
                bw_of[x] = d - lat
                lat = (d if d < lat else lat) + late  # min(lat, d) + late
                if lat > 0:
                    heappush(heap, (now + lat, seq(), x, -1))
                else:
                    bandwidth_phase(x, now)
            else:
                heappush(heap, (now + d + late, seq(), x, 0))
            if s == _GRAD:
                for c in members:
                    grad_active[c] += 1
                    if grad_active[c] == 1:
                        set_rate(c, now)
        ready.clear()
        if not heap:
            break
        # ---- the next event
        now, _, t, ver = heappop(heap)
        if t < 0:  # a host-issued task whose issue time has come
            add_ready(-1 - t)
            continue
        if ver != version[t]:
            if ver == -1:  # a flow's latency is over
                bandwidth_phase(t, now)
            continue  # else stale: the task's rate changed after this end was scheduled
        # ---- task t ends
        end[t] = now
        done += 1
        if done == report_at:
            assert progress is not None
            progress(done, n)
            report_at += progress_every
        s = kind[t]
        members = participants[t]
        if t in active:  # its flow leaves the links
            del active[t]
            bw = bw_of[t]
            for r, w in demand[t]:
                if w > 0:
                    demand_load[r] -= w / bw
            if share[t] < 1.0 or throttled:
                share[t] = 1.0
                refill(now)
        mp, mn = mem_peak[t], mem_net[t]
        for c in members:
            held[c] -= mp
            if mn:
                cur_mem[c] += mn
                if record_memory:
                    timeline[c].append((now, cur_mem[c]))
            if s == _COMPUTE:
                run_task[c] = -1
            elif s == _GRAD:
                grad_active[c] -= 1
                if grad_active[c] == 0:
                    set_rate(c, now)
        qs = tq[t]
        for q in qs:  # each queue moves on to its next task
            h = qhead[q] = qhead[q] + 1
            waiting[qlist[q][h]] -= 1
        for x in succ[t]:
            waiting[x] -= 1
            if not waiting[x]:
                add_ready(x)
        for q in qs:
            x = qlist[q][qhead[q]]
            if not waiting[x]:
                add_ready(x)
        if s == _P2P and use_host:  # the host was blocked on this send: what it issues may go on
            for c in members:
                for q in host_queues[c]:
                    x = qlist[q][qhead[q]]
                    if not waiting[x]:
                        add_ready(x)
    if done < n:
        stuck = next(t for t in range(n) if waiting[t] >= 0)
        raise SimulationError(
            f"graph cannot finish: task '{graph.name[stuck]}' never became ready "
            f"(waits on {[graph.name[d] for d in deps[stuck] if math.isnan(end[d])][:3]}); "
            "check for a cycle in control dependencies or collectives issued in different orders")
    return SimTrace(start, end, pred, peak_mem, timeline, issue_of)
