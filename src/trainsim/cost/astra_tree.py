"""ASTRA-sim's double binary tree all-reduce on the outermost dimension, node by node.

ASTRA-sim (`DoubleBinaryTreeAllReduce`, `BinaryTree`, `DoubleBinaryTreeTopology`) builds, for k = 2^m
NPUs of the dimension, a sentinel root with one child over a complete in-order tree of the other
k-1 positions; even chunks use the tree whose root is the last position, odd chunks the one whose
root is position 0. Every message carries the whole chunk. A leaf sends up after one endpoint delay
E and finishes E after its parent's message arrives; an inner node sends up E + R after its later
child arrives (R: the local reduction cost), and sends down and finishes E + R after its parent's
message arrives; the root turns the message round after E + R. A receive completes when both the
message has arrived and the receiver has started that chunk. Leaves finish about m messages after
the root, so NPU finish times spread (12-14% on one dimension); ASTRA-sim's time is the slowest NPU.

The phases on the inner dimensions (reduce-scatter before, all-gather after) are the same on every
tree position; each position has its own queues, and runs its chunks in order. `tree_collective`
runs the positions and chunks as a small event simulation and returns the slowest position.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .semantics import Semantics, Steps, hops, message_ns, whole

if TYPE_CHECKING:
    from .multidim import CollectiveResult, Dimension


def tree_roles(k: int, root_last: bool) -> tuple[list[int], list[list[int]]]:
    """(parent of each position, -1 for the root; children of each position) of ASTRA-sim's tree."""
    if k < 2 or k & (k - 1):
        raise ValueError(f"ASTRA-sim's double binary tree needs a power-of-two dimension, not {k} NPUs")
    m = int(math.log2(k))
    parent = [-1] * k
    children: list[list[int]] = [[] for _ in range(k)]
    shift = 0 if root_last else 1
    for p in range(k - 1):  # in-order positions of the complete tree over k-1 nodes
        h = next(h for h in range(m) if (p + 1) % (1 << (h + 1)) == (1 << h))  # height: p = 2^h - 1 mod 2^(h+1)
        if h == m - 1:
            par = k - 1 if root_last else -1  # the subtree root hangs under the sentinel
        else:
            up = p + (1 << h)
            par = up if (up + 1) % (1 << (h + 2)) == (1 << (h + 1)) else p - (1 << h)
        me = p + shift
        if h == m - 1:
            parent[me] = par if root_last else 0
        else:
            parent[me] = par + shift
    root = k - 1 if root_last else 0
    parent[root] = -1
    for p, par in enumerate(parent):
        if par >= 0:
            children[par].append(p)
    return parent, children


def tree_collective(op: str, size_bytes: float, dims: Sequence[Dimension], active: list[int], chunks: int,
                    chunk_bytes: float, sem: Semantics) -> CollectiveResult:
    """An all-reduce whose outermost dimension runs ASTRA-sim's double binary tree (see the module)."""
    from .multidim import CollectiveResult, DimResult, _chunk_phases

    top = active[-1]
    if any(dims[i].algorithm == "double_binary_tree" for i in active[:-1]):
        raise ValueError("ASTRA-sim runs doubleBinaryTree on the outermost dimension only: use ring, direct or "
                         "halvingDoubling on the inner ones")
    if op != "all_reduce":
        raise ValueError(f"doubleBinaryTree is an all-reduce algorithm (ASTRA-sim runs it for {op} too, but the "
                         f"result is not meaningful): pick another algorithm for {op}")
    dim = dims[top]
    k = dim.size
    plan = _chunk_phases(op, dims, active, chunk_bytes, sem)  # the top phase's entry is replaced by the tree
    j_top = next(j for j, (d, *_) in enumerate(plan) if d == top)
    data = chunk_bytes / math.prod(dims[i].size for i in active[:-1])
    msg_bytes = whole(data) if sem.truncate_ns else data  # every tree message carries the whole chunk
    e = sem.endpoint_delay_ns
    red = 0.0 if sem.local_mem_bw_gbps is None else 3 * (whole(data / sem.local_mem_bw_gbps) if sem.truncate_ns
                                                           else data / sem.local_mem_bw_gbps)

    def delay_ns(a: int, b: int) -> float:
        s = Steps(1, 1, msg_bytes, hops(dim.kind, k, abs(a - b)))
        wire, lat = message_ns(dim.kind, dim.link_gbps, dim.bandwidth_gbps, dim.latency_s * 1e9, s, sem)
        return whole(wire + lat) if sem.truncate_ns else wire + lat

    trees = [tree_roles(k, True), tree_roles(k, False)]
    # per position: the chunk pipeline over its own queues; the tree phase couples the positions
    arrive: dict[tuple[int, int, int], float] = {}  # (chunk, src, dst) -> message arrival
    posted: dict[tuple[int, int, int], float] = {}  # (chunk, src, dst) -> receive posted
    got: dict[tuple[int, int], list[float]] = {}  # (chunk, position) -> child bundle completions
    events: list[tuple[float, int, int, int, int, int]] = []  # (time, seq, kind, chunk, position, arg)
    seq = 0

    def push(t: float, kind: int, c: int, p: int, arg: int = 0) -> None:
        nonlocal seq
        heapq.heappush(events, (t, seq, kind, c, p, arg))
        seq += 1

    READY, FREE, RECV, DONE = 0, 1, 2, 3
    free: dict[tuple[int, int], bool] = {}
    waiting: dict[tuple[int, int], list[tuple[float, int, int, int]]] = {}
    finish = [0.0] * k

    def send(t: float, c: int, src: int, dst: int) -> None:
        key = (c, src, dst)
        arrive[key] = t + delay_ns(src, dst)
        if key in posted:
            push(max(arrive[key], posted[key]), RECV, c, dst, src)

    def post(t: float, c: int, src: int, dst: int) -> None:
        key = (c, src, dst)
        posted[key] = t
        if key in arrive:
            push(max(arrive[key], t), RECV, c, dst, src)

    def tree_start(t: float, c: int, p: int) -> None:
        parent, children = trees[c % 2]
        if not children[p]:  # leaf: one bundle, send up, wait for the parent
            send(t + e, c, p, parent[p])
            post(t + e, c, parent[p], p)
        else:
            for ch in children[p]:
                post(t, c, ch, p)

    def on_recv(t: float, c: int, p: int, src: int) -> None:
        parent, children = trees[c % 2]
        if not children[p]:  # a leaf hears from its parent
            push(t + e, DONE, c, p)
        elif src == parent[p]:  # an inner node hears from its parent: send down, done
            for ch in children[p]:
                send(t + e + red, c, p, ch)
            push(t + e + red, DONE, c, p)
        else:
            bundles = got.setdefault((c, p), [])
            bundles.append(t + e + red)
            if len(bundles) == len(children[p]):
                t_up = max(bundles)
                if parent[p] < 0:  # the root turns the message round
                    for ch in children[p]:
                        send(t_up, c, p, ch)
                    push(t_up, DONE, c, p)
                else:
                    send(t_up, c, p, parent[p])
                    post(t_up, c, parent[p], p)

    dim_of = [d for d, *_ in plan]  # one queue per dimension and position
    for p in range(k):
        for c in range(chunks):
            push(0.0, READY, c, p, 0)
    while events:
        now, _, kind, c, p, arg = heapq.heappop(events)
        if kind == RECV:
            on_recv(now, c, p, arg)
            continue
        j = arg
        if kind == DONE:
            j = j_top
        slot = (p, dim_of[j])
        if kind in (FREE, DONE):
            free[slot] = True
            ready = now + (0 if kind == DONE else plan[j][2] * 1e9)
            if j + 1 < len(plan):
                push(ready, READY, c, p, j + 1)
            else:
                finish[p] = max(finish[p], ready)
        else:  # READY: the chunk joins the queue of stage j at this position
            heapq.heappush(waiting.setdefault(slot, []), (now, c, j, 0))
        line = waiting.get(slot)
        if line and free.get(slot, True):
            _, c2, j2, _ = heapq.heappop(line)
            free[slot] = False
            if j2 == j_top:
                tree_start(now, c2, p)
            else:
                push(now + plan[j2][1] * 1e9, FREE, c2, p, j2)
    per_dim = tuple(DimResult(i, d.kind, d.size, d.algorithm, sum(b for dd, _, _, b in plan if dd == i) * chunks,
                              sum(t for dd, t, _, _ in plan if dd == i) * chunks, d.bandwidth_gbps, d.latency_s)
                    for i, d in enumerate(dims))
    return CollectiveResult(op, size_bytes, math.prod(d.size for d in dims), max(finish) * 1e-9, per_dim)


__all__ = ["tree_collective", "tree_roles"]
