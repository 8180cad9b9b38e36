"""The execution graph (the one meeting point) and its construction from a costed program.

Tasks are stored as parallel lists (struct of arrays) so the engine touches no per-task Python
objects. Each task runs on one stream of one or more rank classes (a collective over several
classes waits for all of them), depends on other tasks, and carries a memory effect: its peak
extra allocation while running and its net allocation once done.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

from ..strategy.schedules import dynamic_orders, schedule_order
from ..strategy.tree import StrategyTree
from ..workload.ir import CONTRACTION_KINDS
from .program import STREAM_NAMES, ChunkProgram, Program, Step, Stream


@dataclass
class RankClass:
    """Ranks that run an identical program: simulated once, counted `multiplicity` times."""

    name: str
    stage: int
    multiplicity: int
    ranks: range
    static_bytes: float = 0.0


@dataclass
class ExecutionGraph:
    classes: list[RankClass] = field(default_factory=list)
    name: list[str] = field(default_factory=list)
    kind: list[str] = field(default_factory=list)  # compute | collective | p2p
    stream: list[int] = field(default_factory=list)
    category: list[str] = field(default_factory=list)
    duration_s: list[float] = field(default_factory=list)
    parts: list[dict[str, float] | None] = field(default_factory=list)  # category split of fused tasks
    participants: list[tuple[int, ...]] = field(default_factory=list)
    deps: list[list[int]] = field(default_factory=list)
    mem_peak_bytes: list[float] = field(default_factory=list)
    mem_net_bytes: list[float] = field(default_factory=list)
    host_s: list[float] = field(default_factory=list)  # framework time to issue the task (CPU side)
    # earliest finish after the host starts issuing the task: max over its ops k of host time up to and
    # including k plus GPU time from k on (exact for fused chains, = max(duration, host) for one op)
    host_path_s: list[float] = field(default_factory=list)
    micro_batch: list[int] = field(default_factory=list)
    queues: dict[tuple[int, int], list[int]] = field(default_factory=lambda: defaultdict(list))
    # bandwidth sharing (sim.flows): a task's fixed latency and its work seconds on shared physical
    # resources (ids into `resources`) when it runs alone; None: a fixed duration, shares nothing
    flow_latency_s: list[float] = field(default_factory=list)
    flow_demand: list[tuple[tuple[int, float], ...] | None] = field(default_factory=list)
    resources: list[str] = field(default_factory=list)
    _resource_ids: dict[str, int] = field(default_factory=dict, repr=False)
    # what a task moves, for Chakra ET export (trace.chakra): the collective ("all_reduce", ...; "send_recv"
    # for a pipeline send; "load" / "store" for a memory task; "" for none), its bytes in nccl-tests'
    # convention (memory: bytes per rank) and the ranks of its group for the class's first rank
    comm_op: list[str] = field(default_factory=list)
    comm_bytes: list[float] = field(default_factory=list)
    comm_ranks: list[tuple[int, ...]] = field(default_factory=list)
    # names of streams beyond compile.program.Stream (a replayed trace's host threads and CUDA streams)
    stream_names: dict[int, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.name)

    def add(self, name: str, kind: str, stream: int, category: str, duration_s: float, classes: tuple[int, ...],
            deps: list[int], mb: int = -1, parts: dict[str, float] | None = None, mem_peak: float = 0.0,
            mem_net: float = 0.0, host_s: float = 0.0, host_path_s: float | None = None,
            flow_latency_s: float = 0.0, flow_demand: tuple[tuple[int, float], ...] | None = None,
            comm_op: str = "", comm_bytes: float = 0.0, comm_ranks: tuple[int, ...] = ()) -> int:
        t = len(self.name)
        self.name.append(name)
        self.kind.append(kind)
        self.stream.append(stream)
        self.category.append(category)
        self.duration_s.append(duration_s)
        self.parts.append(parts)
        self.participants.append(classes)
        self.deps.append(deps)
        self.mem_peak_bytes.append(mem_peak)
        self.mem_net_bytes.append(mem_net)
        self.host_s.append(host_s)
        self.host_path_s.append(max(duration_s, host_s) if host_path_s is None else host_path_s)
        self.micro_batch.append(mb)
        self.flow_latency_s.append(flow_latency_s)
        self.flow_demand.append(flow_demand)
        self.comm_op.append(comm_op)
        self.comm_bytes.append(comm_bytes)
        self.comm_ranks.append(comm_ranks)
        for c in classes:
            self.queues[(c, stream)].append(t)
        return t

    def stream_name(self, stream: int) -> str:
        """Display name of a stream: the Stream enum's name, else the graph's own (trace streams)."""
        if stream < len(STREAM_NAMES):
            return STREAM_NAMES[stream]
        return self.stream_names.get(stream, f"stream {stream}")

    def resource_id(self, name: str) -> int:
        """Id of a shared physical resource by name (added on first use)."""
        if name not in self._resource_ids:
            self._resource_ids[name] = len(self.resources)
            self.resources.append(name)
        return self._resource_ids[name]

    def join(self, t: int, cls: int, deps: list[int]) -> None:
        """Add another participant class to an existing collective task."""
        self.participants[t] = (*self.participants[t], cls)
        self.deps[t].extend(d for d in deps if d not in self.deps[t])
        self.queues[(cls, self.stream[t])].append(t)


@dataclass
class _Spec:
    """A (possibly fused) template entry ready to be instantiated."""

    label: str
    kind: str
    stream: int
    category: str
    duration_s: float
    parts: dict[str, float] | None
    mem_peak: float
    mem_net: float
    deps: tuple[int, ...] | None
    grad_bucket: str | None
    axes: tuple[str, ...]
    index: int  # index of the last original step it covers
    host_s: float = 0.0
    host_path_s: float = 0.0
    flow_latency_s: float = 0.0
    flow: dict[str, float] | None = None  # work seconds by link key (fused comm load, see coarsen)
    comm_op: str = ""  # the step's collective or memory access ("" once fused into compute)
    comm_bytes: float = 0.0


Demand = tuple[float, dict[str, float]]
"""(latency_s, {link key: work seconds}) of one communication call alone (cost.comm `demand`)."""


class FlowSource(Protocol):
    """What the cost layer knows about link loads (cost.annotate.FlowBook); keys name links generically:
    'intra<i>:<level>' and 'rail' are a GPU's own links (one resource per rank class); the keys in
    `block_gpus` ('nic': the node's NICs, 'port<i>:<level>': a level's port) are one resource per set
    of classes sharing a block of that many consecutive ranks."""

    gpus_per_node: int
    block_gpus: dict[str, int]
    embedding: Demand | None

    def step_demand(self, step: Step, stage_rank: int) -> Demand | None: ...

    def send_demand(self, chunk: int, phase: str) -> Demand | None: ...


def fit_demand(demand: Demand | None, duration_s: float) -> Demand | None:
    """The demand of a call whose duration the cost layer changed afterwards (e.g. TP-comm overlap
    exposes only part of it): the latency stays, the work scales with the bandwidth part left."""
    if demand is None or duration_s <= 0:
        return None
    latency, work = demand
    top = max(work.values(), default=0.0)
    bw_s = duration_s - latency
    if top <= 0 or bw_s <= 0:
        return None
    return latency, {k: w * bw_s / top for k, w in work.items()}


def _add_work(into: dict[str, float] | None, work: dict[str, float] | None) -> dict[str, float] | None:
    if not work:
        return into
    out = dict(into or {})
    for k, w in work.items():
        out[k] = out.get(k, 0.0) + w
    return out


def _fuse_fork_join(steps: list[Step], streams: frozenset[int],
                    demand_of: Callable[[Step], Demand | None] | None = None,
                    fused_work: dict[int, dict[str, float]] | None = None,
                    origins: list[tuple[int, ...]] | None = None) -> list[Step]:
    """Fuse a compute step and collectives that start with it and join before the next compute step.

    Pattern (sequence-parallel weight-gradient re-gather): a(deps=D), b1(deps=D) -> b2 ..., c(deps=(a, b_last)).
    Nothing else waits on a or the b's, so the fork-join runs in max(a, sum b) + c: exact, one task.
    `origins` gets, per step returned, the steps whose labels name it (a and c for a fused fork-join).
    """
    refs: dict[int, int] = defaultdict(int)
    for s in steps:
        for d in s.deps or ():
            refs[d] += 1
    out: list[Step] = []
    remap: dict[int, int] = {}
    i = 0
    while i < len(steps):
        a = steps[i]
        k = i + 2  # steps[i + 1] (the first collective) carries the fork's explicit deps
        while k < len(steps) and steps[k].deps is None and steps[k].stream in streams and steps[k].kind == "collective":
            k += 1
        c = steps[k] if k < len(steps) else None
        fork = (a.kind == "compute" and a.deps is not None and len(a.deps) == 1 and i + 1 < len(steps)
                and c is not None and steps[i + 1].kind == "collective"
                and steps[i + 1].deps == a.deps and steps[i + 1].stream in streams and c.kind == "compute"
                and c.deps == (i, k - 1) and refs[i] == 1 and all(refs[j] == (1 if j == k - 1 else 0)
                                                                   for j in range(i + 1, k)))
        if not fork:
            remap[i] = len(out)
            out.append(a)
            if origins is not None:
                origins.append((i,))
            i += 1
            continue
        assert c is not None
        comm = sum(steps[j].duration_s for j in range(i + 1, k))
        exposed = max(0.0, comm - a.duration_s)
        parts = {a.category: a.duration_s}
        parts[c.category] = parts.get(c.category, 0.0) + c.duration_s
        if exposed > 0:
            cat = steps[i + 1].category
            parts[cat] = parts.get(cat, 0.0) + exposed
        fused = Step(f"{a.label} | {c.label}", "compute", Stream.COMPUTE, max(parts, key=lambda x: parts[x]),
                     a.layer, deps=a.deps, phase=c.phase, alloc_bytes=a.alloc_bytes + c.alloc_bytes,
                     free_bytes=a.free_bytes + c.free_bytes, grad_bucket=c.grad_bucket,
                     duration_s=max(a.duration_s, comm) + c.duration_s, parts=parts,
                     host_s=sum(steps[j].host_s for j in range(i, k + 1)))
        for j in range(i, k + 1):
            remap[j] = len(out)
        if demand_of is not None and fused_work is not None:
            work: dict[str, float] | None = None
            for j in range(i + 1, k):
                fitted = fit_demand(demand_of(steps[j]), steps[j].duration_s)
                work = _add_work(work, fitted[1] if fitted else None)
            if work:
                fused_work[len(out)] = work
        out.append(fused)
        if origins is not None:
            origins.append((i, k))
        i = k + 1
    for n, s in enumerate(out):
        if s.deps is not None:
            deps = tuple(remap[d] for d in s.deps)
            if s.parts is not None or deps != s.deps:
                s = out[n] = Step(**{**s.__dict__, "deps": deps})
            if deps == (n - 1,):
                out[n] = Step(**{**s.__dict__, "deps": None})
    return out


@dataclass
class _Naming:
    """How coarsen named its specs, so that another chunk's identical steps are named alike (`_renamed`): per
    step after fork-join fusion the original steps its label joins; per spec its first and last such step
    and the one whose gradient bucket it anchors (-1: none)."""

    origins: list[tuple[int, ...]] = field(default_factory=list)
    first: list[int] = field(default_factory=list)
    last: list[int] = field(default_factory=list)
    bucket: list[int] = field(default_factory=list)


def coarsen(steps: list[Step], granularity: str, keep_anchors: bool, merge_streams: frozenset[int],
            demand_of: Callable[[Step], Demand | None] | None = None) -> list[_Spec]:
    """Fuse chains of steps no other step waits on (dPRO's coarsened view): exact for serial chains.

    With `demand_of` (bandwidth sharing), a collective spec carries its link work, and a compute spec
    that absorbed collectives carries their summed work as load spread over its whole duration (the
    engine shares it at intensity work / duration: the time-average of the fused comm's load)."""
    return _coarsen(steps, granularity, keep_anchors, merge_streams, demand_of)[0]


def _coarsen(steps: list[Step], granularity: str, keep_anchors: bool, merge_streams: frozenset[int],
             demand_of: Callable[[Step], Demand | None] | None = None) -> tuple[list[_Spec], _Naming]:
    """coarsen, and how it named the specs."""
    naming = _Naming()
    fused_work: dict[int, dict[str, float]] = {}
    if granularity != "op" and Stream.FEATURE in merge_streams:
        steps = _fuse_fork_join(steps, merge_streams, demand_of, fused_work, naming.origins)
    else:
        naming.origins = [(i,) for i in range(len(steps))]
    referenced = {d for s in steps if s.deps for d in s.deps}
    out: list[_Spec] = []
    remap: dict[int, int] = {}
    first_label: list[str] = []  # each spec's first step's label (a fused spec is named "first .. last")
    fused: set[int] = set()
    op_level, by_layer = granularity == "op", granularity != "auto"
    prev: _Spec | None = None
    for i, s in enumerate(steps):
        flow: dict[str, float] | None = None
        flow_latency = 0.0
        if demand_of is not None:
            if i in fused_work:
                flow = dict(fused_work[i])
            elif s.kind == "collective":
                fitted = fit_demand(demand_of(s), s.duration_s)
                if fitted is not None:
                    flow_latency, flow = fitted[0], dict(fitted[1])
        if (not op_level and prev is not None and s.deps is None and s.stream in merge_streams
                and prev.stream in merge_streams and (i - 1) not in referenced
                and not (keep_anchors and prev.grad_bucket) and prev.kind != "p2p"
                and (not by_layer or steps[i - 1].layer == s.layer)):
            parts = prev.parts or {prev.category: prev.duration_s}
            if s.parts:
                for cat, sec in s.parts.items():
                    parts[cat] = parts.get(cat, 0.0) + sec
            else:
                parts[s.category] = parts.get(s.category, 0.0) + s.duration_s
            prev.parts = parts
            prev.mem_peak = max(prev.mem_peak, prev.mem_net + s.alloc_bytes)
            prev.mem_net += s.alloc_bytes - s.free_bytes
            prev.host_path_s = max(prev.host_path_s + s.duration_s, prev.host_s + max(s.duration_s, s.host_s))
            prev.duration_s += s.duration_s
            prev.host_s += s.host_s
            prev.grad_bucket = s.grad_bucket or (None if keep_anchors else prev.grad_bucket)
            prev.index = i
            prev.kind = "compute"
            prev.stream = Stream.COMPUTE
            prev.flow = _add_work(prev.flow, flow)
            prev.flow_latency_s = 0.0
            prev.comm_op, prev.comm_bytes = "", 0.0
            prev.label = first_label[-1] + " .. " + s.label
            fused.add(len(out) - 1)
            remap[i] = len(out) - 1
            naming.last[-1] = i
            if s.grad_bucket:
                naming.bucket[-1] = i
            elif keep_anchors:
                naming.bucket[-1] = -1
        else:
            remap[i] = len(out)
            prev = _Spec(s.label, s.kind, s.stream, s.category, s.duration_s, dict(s.parts) if s.parts else None,
                         max(s.alloc_bytes, 0.0), s.alloc_bytes - s.free_bytes, s.deps, s.grad_bucket, s.axes, i,
                         s.host_s, max(s.duration_s, s.host_s), flow_latency, flow, s.collective or s.access,
                         s.size_bytes)
            out.append(prev)
            first_label.append(s.label)
            naming.first.append(i)
            naming.last.append(i)
            naming.bucket.append(i if s.grad_bucket else -1)
    for sp in out:
        if sp.deps is not None:
            sp.deps = tuple(remap[d] for d in sp.deps)
    for n in fused:  # a fused spec is named for its largest part (once, not at every step it absorbs)
        parts = out[n].parts
        assert parts is not None
        out[n].category = max(parts, key=lambda k: parts[k])
    return out, naming


def _renamed(specs: list[_Spec], naming: _Naming, steps: list[Step]) -> list[_Spec]:
    """Another chunk's coarsened specs from one made for steps equal to its own but for their names: the same
    specs named after its own steps (and their gradient buckets)."""
    def label(x: int) -> str:
        return " | ".join(steps[o].label for o in naming.origins[x])

    out = []
    for j, sp in enumerate(specs):
        first, last, bucket = naming.first[j], naming.last[j], naming.bucket[j]
        out.append(replace(sp, label=label(first) if first == last else label(first) + " .. " + label(last),
                           grad_bucket=steps[naming.origins[bucket][-1]].grad_bucket if bucket >= 0 else None))
    return out


def _signature(steps: list[Step], demand_of: Callable[[Step], Demand | None] | None) -> tuple:
    """Everything coarsen reads of a step list but the names: two chunks with equal signatures coarsen to the
    same specs (a layer shows as the order in which it first appears, which is all coarsen compares)."""
    sig = []
    layers: dict[str, int] = {}
    for s in steps:
        demand = demand_of(s) if demand_of is not None and s.kind == "collective" else None
        sig.append((s.kind, s.stream, s.category, s.deps, s.duration_s, s.host_s, s.alloc_bytes, s.free_bytes,
                    bool(s.grad_bucket), s.axes, s.collective, s.access, s.size_bytes,
                    tuple(s.parts.items()) if s.parts else None, layers.setdefault(s.layer, len(layers)),
                    (demand[0], tuple(demand[1].items())) if demand else None))
    return tuple(sig)


def split_backward(steps: list[Step]) -> tuple[list[Step], list[Step]]:
    """A backward template cut into its zero-bubble halves (Qi et al. 2024): B, the input-gradient side
    (everything but the weight gradients: dgrad and unsplit backward steps, recompute, feature collectives)
    and W, the weight-gradient steps with what only they consume (the sequence-parallel re-gather of a saved
    input, an offloaded layer's gradient store). Both are templates of their own: a B step that waited on a
    W step (the serial chain ran dgrad, wgrad, next op) waits on that step's B-side dependencies instead;
    W's dependencies on B are dropped, since the graph builder starts a micro-batch's W after its whole B.
    Redundant dependencies are pruned, so serial chains stay implicit (None) and coarsen as before."""
    n = len(steps)
    deps = [tuple(s.deps) if s.deps is not None else ((i - 1,) if i > 0 else ()) for i, s in enumerate(steps)]
    in_w = [s.phase == "wgrad" for s in steps]
    last_wgrad = {s.layer: i for i, s in enumerate(steps) if in_w[i]}
    moved: dict[int, float] = defaultdict(float)  # bytes allocated by another step than the template's
    for i, s in enumerate(steps):
        if s.kind == "memory" and s.access == "store" and s.layer in last_wgrad:
            # an offloaded layer's gradient store (compile.offload): its buffer, allocated by the step it
            # waited on, is made by the layer's last weight gradient, which the store now waits for
            w = last_wgrad[s.layer]
            for d in deps[i]:
                if d != w and not in_w[d]:
                    size = min(s.size_bytes, steps[d].alloc_bytes + moved[d])
                    moved[d] -= size
                    moved[w] += size
            deps[i] = (w,)
            in_w[i] = True
    consumers: list[list[int]] = [[] for _ in range(n)]
    for i in range(n):
        for d in deps[i]:
            consumers[d].append(i)
    for i in range(n - 1, -1, -1):  # communication that feeds only W steps (SP re-gathers) moves with them
        if not in_w[i] and steps[i].kind != "compute" and consumers[i] and all(in_w[c] for c in consumers[i]):
            in_w[i] = True
    b_side: dict[int, frozenset[int]] = {}

    def on_b(d: int) -> frozenset[int]:
        """The B steps that stand for d (itself, or what a W step waited for on the B side)."""
        if not in_w[d]:
            return frozenset((d,))
        if d not in b_side:
            b_side[d] = frozenset().union(*(on_b(e) for e in deps[d]))
        return b_side[d]

    def half(members: list[int], keep: Callable[[int], frozenset[int]], chain_orphans: bool) -> list[Step]:
        """The steps `members` as a template: dependencies through `keep`, transitively reduced. A step left
        with none follows the previous one of its half when `chain_orphans` (W: all of it runs after B) or
        when it had implicit dependencies (None)."""
        new = {old: k for k, old in enumerate(members)}
        ancestors: dict[int, int] = {}  # bit set over new indices
        out: list[Step] = []
        for k, i in enumerate(members):
            direct = sorted({new[x] for d in deps[i] for x in keep(d)})
            reach = 0
            for d in direct:
                reach |= ancestors[d]
            ancestors[k] = reach | sum(1 << d for d in direct)
            needed = tuple(d for d in direct if not reach >> d & 1)
            chain = needed == (k - 1,) or (not needed and (k == 0 or chain_orphans or steps[i].deps is None))
            out.append(Step(**{**steps[i].__dict__, "deps": None if chain else needed,  # None: the previous step
                               "alloc_bytes": steps[i].alloc_bytes + moved.get(i, 0.0)}))
        return out

    b_members = [i for i in range(n) if not in_w[i]]
    w_members = [i for i in range(n) if in_w[i]]
    b_half = half(b_members, on_b, False)
    w_half = half(w_members, lambda d: frozenset((d,)) if in_w[d] else frozenset(), True)
    return b_half, w_half


def _htae_orders(chunks: list[ChunkProgram], m: int, max_ongoing: int | None) -> list[list[tuple[str, int, int]]]:
    """Per-rank orders of the HTAE scheduler (strategy.schedules.dynamic_orders) on the costed stages:
    a stage's forward / backward time per micro-batch is its steps' durations (compute, exposed
    feature collectives, recompute), or the framework's time to issue them where that is longer
    (host-bound small kernels); hand-offs are the annotated pipeline sends."""
    def seconds(steps: list[Step]) -> float:
        gpu = sum(s.duration_s for s in steps if s.stream in (Stream.COMPUTE, Stream.FEATURE))
        return max(gpu, sum(s.host_s for s in steps))

    return dynamic_orders([seconds(ch.fwd) for ch in chunks], [seconds(ch.bwd) for ch in chunks], m, max_ongoing,
                          [ch.send_fwd_s for ch in chunks], [ch.send_bwd_s for ch in chunks])


@dataclass(frozen=True)
class WorkEstimate:
    """build_graph's predicted size, summed over the rank classes it simulates (every rank with exact)."""

    micro_batches: int
    per_micro_batch: int  # tasks each micro-batch adds (forward, backward and pipeline sends of every chunk)
    fixed: int  # tasks made once (gradient sync, anchors, optimizer)

    @property
    def tasks(self) -> int:
        return self.micro_batches * self.per_micro_batch + self.fixed


def predict_tasks(tree: StrategyTree, *, exact: bool = False, granularity: str = "auto") -> WorkEstimate:
    """Predict build_graph's task count from layer and op counts alone (no lowering, O(layers)).

    Per micro-batch and chunk: op granularity ~3 tasks per op (forward, backward, collectives); exact mode
    with tp/cp/ep keeps feature collectives apart (~1 task per op, 2 with sequence parallelism); layer granularity ~2 per layer; auto fuses a
    chunk's forward and backward into ~2; ZeRO-3 gathers and offload loads/stores add ~6 per layer. The zero-bubble
    schedule's weight-gradient half (W) adds a task per weighted op (op granularity), per layer (layer) or per
    chunk (auto). A collective counts once per class taking part. Within a factor of 2 of the built graph (tests)."""
    tree.resolve()
    mesh, sched = tree.mesh, tree.schedule
    n_chunks = mesh.pp * sched.virtual_stages
    layers, ops, recomputed, heavy, stored_split, weighted = ([0] * n_chunks for _ in range(6))
    for node, recompute, chunk, items in tree._inherited():
        n_ops = len(node.layer.ops) if node.layer is not None else 0
        weighted[chunk] += sum(op.weight is not None and op.kind in CONTRACTION_KINDS
                               for op in (node.layer.ops if node.layer is not None else ()))
        layers[chunk] += 1
        ops[chunk] += n_ops
        recomputed[chunk] += n_ops if recompute == "full" else 0
        stored_split[chunk] += n_ops if node.leaf is not None and node.leaf.saved else 0  # sequence parallel
        heavy[chunk] += "weight" in items or tree.offload != "none"  # per-layer gathers / loads / stores
    mp = any(mesh.size(a) > 1 for a in ("tp", "cp", "ep"))
    per_mb = fixed = 0
    for c in range(n_chunks):
        n_layers, n_ops, extra = layers[c], ops[c], 6 * heavy[c]
        if granularity == "op":
            n = 2 * n_ops + recomputed[c] + (n_ops if mp else 0) + extra // 2
        elif exact and mp:  # each feature collective splits the fused compute: ~1 per op, 2 with SP
            n = n_ops + stored_split[c] + extra // 2
        elif granularity == "layer":
            n = max(2 * n_layers, extra)
        else:
            n = max(2, extra)
        if sched.kind == "zb-h1" and weighted[c]:  # W: weight gradients apart from B
            n += weighted[c] if granularity == "op" else n_layers if granularity == "layer" else 1
        per_mb += n + (2 if n_chunks > 1 else 0)  # + pipeline sends
        fixed += 3 * n_layers  # gradient buckets, their anchors, ZeRO parameter gathers
    copies = mesh.world_size // mesh.pp if exact else 1
    return WorkEstimate(sched.n_micro_batch, per_mb * copies, (fixed + mesh.pp) * copies)


def build_graph(program: Program, *, exact: bool = False, granularity: str = "auto",
                optimizer_s: dict[int, float] | None = None, static_bytes: dict[int, float] | None = None,
                flows: FlowSource | None = None, progress: Callable[[int], None] | None = None,
                micro_batches: int | None = None) -> ExecutionGraph:
    """Instantiate the costed templates along the pipeline schedule into one execution graph.

    `micro_batches`: build the schedule for that many micro-batches instead of the tree's (sim.periodic
    simulates fewer identical micro-batches and adds the periods it left out).

    `flows` (bandwidth sharing): fill `flow_latency_s` / `flow_demand` / `resources` from the cost
    layer's per-link work, so the engine shares links among concurrent tasks. `progress(tasks built)`
    is called every 256 schedule items."""
    tree = program.tree
    mesh = tree.mesh
    sched = tree.schedule
    pp, v = mesh.pp, sched.virtual_stages
    m = sched.n_micro_batch if micro_batches is None else micro_batches
    n_chunks = pp * v
    g = ExecutionGraph()
    per_stage = mesh.world_size // pp
    if exact:
        for r in range(mesh.world_size):
            stage = mesh.coords(r)["pp"]
            g.classes.append(RankClass(f"rank{r}", stage, 1, range(r, r + 1), (static_bytes or {}).get(stage, 0.0)))
    else:
        for s in range(pp):
            ranks = range(s * per_stage, (s + 1) * per_stage)  # pp is the outermost mesh axis
            g.classes.append(RankClass(f"stage{s}", s, per_stage, ranks, (static_bytes or {}).get(s, 0.0)))
    merge = frozenset({Stream.COMPUTE}) if exact else frozenset({Stream.COMPUTE, Stream.FEATURE})
    spec_cache: dict[tuple[int, str, bool], list[_Spec]] = {}

    task_flow: dict[int, Demand] = {}  # task -> (latency, work by link key), resolved to resources at the end

    def step_demand_of(ch: ChunkProgram) -> Callable[[Step], Demand | None] | None:
        if flows is None:
            return None
        stage_rank = mesh.rank({"pp": ch.pp_rank})
        return lambda step: flows.step_demand(step, stage_rank)

    def note_flow(t: int, demand: Demand | None) -> None:
        if demand is not None and demand[1] and t not in task_flow:
            task_flow[t] = demand

    zero_bubble = sched.kind == "zb-h1"
    halves: dict[int, tuple[list[Step], list[Step]]] = {}  # zero bubble: chunk -> its backward's (B, W)

    def template(ch: ChunkProgram, phase: str) -> list[Step]:
        if phase == "F":
            return ch.fwd
        if not zero_bubble:
            return ch.bwd
        if ch.chunk not in halves:
            halves[ch.chunk] = split_backward(ch.bwd)
        return halves[ch.chunk][0 if phase == "B" else 1]

    signatures: dict[tuple[int, str], tuple] = {}
    by_signature: dict[tuple[tuple, bool], tuple[list[_Spec], _Naming]] = {}  # identical chunks coarsen once

    def specs(ch: ChunkProgram, phase: str, anchors: bool) -> list[_Spec]:
        key = (ch.chunk, phase, anchors)
        if key not in spec_cache:
            steps, demand_of = template(ch, phase), step_demand_of(ch)
            if (ch.chunk, phase) not in signatures:
                signatures[(ch.chunk, phase)] = _signature(steps, demand_of)
            shared = (signatures[(ch.chunk, phase)], anchors)
            if shared in by_signature:
                made, naming = by_signature[shared]
                spec_cache[key] = _renamed(made, naming, steps)
            else:
                by_signature[shared] = _coarsen(steps, granularity, anchors, merge, demand_of)
                spec_cache[key] = by_signature[shared][0]
        return spec_cache[key]

    shared: dict[tuple, int] = {}  # exact mode: one task per collective instance
    group_of: dict[tuple[tuple[str, ...], int], tuple[int, ...]] = {}  # (axes, rank) -> group ranks
    # (class, chunk, phase, micro-batch) -> (first body task, last body task, first compute task or -1)
    first_last: dict[tuple[int, int, str, int], tuple[int, int, int]] = {}
    p2p: dict[tuple[int, int, str, int], int] = {}
    last_b: dict[int, int] = {}
    grad_tasks: dict[int, list[int]] = defaultdict(list)
    chunks = program.chunks
    has_grad = any(ch.grad_sync for ch in chunks)

    def cls_of(rank: int) -> int:
        return rank if exact else mesh.coords(rank)["pp"]

    def collective_task(name: str, stream: int, cat: str, dur: float, cid: int, rank: int, axes: tuple[str, ...],
                        deps: list[int], mb: int, key: tuple, extra: tuple[int, ...] = (), op: str = "",
                        size: float = 0.0) -> int:
        if (axes, rank) not in group_of:
            group_of[(axes, rank)] = tuple(mesh.group_ranks(axes, rank)) if axes else (rank,)
        members = group_of[(axes, rank)]
        comm = {"comm_op": op, "comm_bytes": size, "comm_ranks": members}
        if not exact:
            return g.add(name, "collective", stream, cat, dur, (cid, *extra), deps, mb, **comm)
        k = (*key, members[0], extra)
        if k in shared:
            g.join(shared[k], cid, deps)
            return shared[k]
        t = g.add(name, "collective", stream, cat, dur, (cid,), deps, mb, **comm)
        shared[k] = t
        return t

    def step_flow(ch: ChunkProgram, s: Step) -> Demand | None:
        dem = step_demand_of(ch)
        return fit_demand(dem(s), s.duration_s) if dem is not None else None

    def grad_sync(ch: ChunkProgram, cid: int, rank: int, dep: int, bucket: str | None) -> None:
        for s in reversed(ch.grad_sync):
            if bucket is not None and s.grad_bucket != bucket:
                continue
            t = collective_task(s.label, Stream.GRAD, "dp", s.duration_s, cid, rank, s.axes, [dep], m - 1,
                                ("grad", ch.chunk, s.label, s.axes), op=s.collective, size=s.size_bytes)
            note_flow(t, step_flow(ch, s))
            grad_tasks[cid].append(t)

    reps = range(mesh.world_size) if exact else [mesh.rank({"pp": s}) for s in range(pp)]
    # --overlap-param-gather: the ZeRO parameter all-gather of the previous step runs under this
    # step's first forward (steady state); the first forward of each chunk waits for it to finish
    param_gather: dict[tuple[int, int], list[int]] = defaultdict(list)
    if tree.overlap_param_gather:
        for rank in reps:
            cid = cls_of(rank)
            r = mesh.coords(rank)["pp"]
            for vc in range(v):
                ch = chunks[vc * pp + r]
                for s in ch.post_step:
                    t = collective_task(s.label, Stream.GRAD, "dp", s.duration_s, cid, rank, s.axes, [], 0,
                                        ("post", ch.chunk, s.label, s.axes), op=s.collective, size=s.size_bytes)
                    note_flow(t, step_flow(ch, s))
                    param_gather[(cid, ch.chunk)].append(t)
    dynamic = _htae_orders(chunks, m, sched.max_ongoing_micro_batch) if sched.kind == "dynamic" else None
    for rank in reps:
        cid = cls_of(rank)
        r = mesh.coords(rank)["pp"]
        order = dynamic[r] if dynamic is not None else schedule_order(sched.kind, pp, m, r, v,
                                                                          sched.max_ongoing_micro_batch)
        sends: dict[tuple[int, str], tuple[float, float, int, Demand | None]] = {}  # this rank's, per chunk
        # the last backward item (B; zero bubble: B and W, each anchoring the gradient buckets it finishes)
        # of each chunk: its gradients are complete there
        last_item_of_chunk: dict[tuple[str, int], int] = {}
        for idx, (ph, _mb, vc) in enumerate(order):
            if ph != "F":
                last_item_of_chunk[(ph, vc)] = idx
        for idx, (ph, mb, vc) in enumerate(order):
            if progress is not None and not idx & 255:
                progress(len(g))
            c = vc * pp + r
            ch = chunks[c]
            anchors = ph != "F" and tree.overlap_grad_reduce and has_grad and idx == last_item_of_chunk.get((ph, vc))
            ids: list[int] = []
            todo = specs(ch, ph, anchors)
            if ph == "W" and not todo:  # a chunk without weight gradients: an empty W keeps the bookkeeping
                ids.append(g.add(f"W{mb} c{c} (no weight gradients)", "compute", Stream.COMPUTE, "compute", 0.0,
                                 (cid,), [first_last[(cid, c, "B", mb)][1]], mb))
            for j, sp in enumerate(todo):
                deps = [ids[d] for d in sp.deps] if sp.deps is not None else ([ids[-1]] if ids else [])
                if ph == "W" and not ids:  # a micro-batch's W starts after its whole B (Qi et al. 2024)
                    deps.append(first_last[(cid, c, "B", mb)][1])
                name = f"{ph}{mb} c{c} {sp.label}"
                if sp.kind == "collective":
                    t = collective_task(name, sp.stream, sp.category, sp.duration_s, cid, rank, sp.axes, deps, mb,
                                        (c, ph, mb, j), op=sp.comm_op, size=sp.comm_bytes)
                    g.mem_peak_bytes[t] = max(g.mem_peak_bytes[t], sp.mem_peak)
                    g.mem_net_bytes[t] = sp.mem_net
                    g.host_s[t] = sp.host_s
                    g.host_path_s[t] = sp.host_path_s
                else:
                    t = g.add(name, sp.kind, sp.stream, sp.category, sp.duration_s, (cid,), deps, mb,
                              dict(sp.parts) if sp.parts else None, sp.mem_peak, sp.mem_net, sp.host_s,
                              sp.host_path_s, comm_op=sp.comm_op, comm_bytes=sp.comm_bytes,
                              comm_ranks=(rank,) if sp.comm_op else ())
                if sp.flow:
                    note_flow(t, (sp.flow_latency_s, sp.flow))
                ids.append(t)
                if anchors and sp.grad_bucket:
                    grad_sync(ch, cid, rank, t, sp.grad_bucket)
            if ph == "F" and mb == 0 and param_gather.get((cid, c)):
                ids.append(g.add(f"F0 c{c} wait for parameter all-gather", "compute", Stream.COMPUTE, "dp", 0.0,
                                 (cid,), [ids[-1], *param_gather[(cid, c)]], mb))
            # offload loads/stores (MEMORY stream) neither receive nor send activations
            body = [t for t in ids if g.stream[t] != Stream.MEMORY] or ids
            first_compute = next((t for t in body if g.stream[t] == Stream.COMPUTE), -1)
            first_last[(cid, c, ph, mb)] = (body[0], body[-1], first_compute)
            if ph != "F":
                last_b[cid] = ids[-1]
            if (ph == "F" and c < n_chunks - 1) or (ph == "B" and c > 0):
                if (c, ph) not in sends:  # what a chunk's send is does not depend on the micro-batch
                    dur = ch.send_fwd_s if ph == "F" else ch.send_bwd_s
                    dst = mesh.rank({**mesh.coords(rank), "pp": ((c + 1) if ph == "F" else (c - 1)) % pp})
                    sends[(c, ph)] = (dur, ch.send_fwd_bytes if ph == "F" else ch.send_bwd_bytes, dst,
                                      fit_demand(flows.send_demand(c, ph), dur) if flows is not None else None)
                dur, send_bytes, dst, demand = sends[(c, ph)]
                p2p[(cid, c, ph, mb)] = t = g.add(f"{ph}{mb} c{c} send {send_bytes / 1e6:.1f} MB", "p2p",
                                                  Stream.P2P, "pp", dur, (cid,), [body[-1]], mb,
                                                  comm_op="send_recv", comm_bytes=send_bytes, comm_ranks=(rank, dst))
                note_flow(t, demand)
        if has_grad and not tree.overlap_grad_reduce:
            for vc in sorted({vc for _, vc in last_item_of_chunk}, reverse=True):
                grad_sync(chunks[vc * pp + r], cid, rank, last_b[cid], None)

    # cross-class edges: pipeline sends and the loss turning forward into backward
    peers: dict[tuple[int, int], int] = {}

    def peer(rank: int, stage: int) -> int:
        """The class of `rank`'s counterpart in pipeline stage `stage`."""
        if (rank, stage) not in peers:
            peers[(rank, stage)] = cls_of(mesh.rank({**mesh.coords(rank), "pp": stage}))
        return peers[(rank, stage)]

    def receive(first: int, first_compute: int, send: int) -> None:
        """The body starting at `first` receives what `send` sends. Its first compute task names the
        receive as well, whatever precedes it (the receiver's all-gather of a scatter-gather hand-off,
        a feature collective left unfused at op granularity): the engine holds the host's issue of
        compute behind a pipeline receive it waits on directly (p2p_host_sync), so the sync must not
        depend on how finely the body was cut into tasks."""
        g.deps[first].append(send)
        if first_compute >= 0 and first_compute != first and send not in g.deps[first_compute]:
            g.deps[first_compute].append(send)

    for rank in reps:
        cid = cls_of(rank)
        r = mesh.coords(rank)["pp"]
        for vc in range(v):
            c = vc * pp + r
            for mb in range(m):
                f0, f1, fc = first_last[(cid, c, "F", mb)]
                b0, _, bc = first_last[(cid, c, "B", mb)]
                if c > 0:
                    receive(f0, fc, p2p[(peer(rank, (c - 1) % pp), c - 1, "F", mb)])
                if c < n_chunks - 1:
                    receive(b0, bc, p2p[(peer(rank, (c + 1) % pp), c + 1, "B", mb)])
                g.deps[b0].append(f1)

    # tied embedding / LM-head gradients are summed across the first and last stage (Megatron)
    emb = [ch for ch in chunks if ch.embedding_grad_bytes > 0]
    if len(emb) >= 2 and emb[0].pp_rank != emb[-1].pp_rank:
        for rank in reps:
            if mesh.coords(rank)["pp"] != emb[0].pp_rank:
                continue
            a, b = cls_of(rank), peer(rank, emb[-1].pp_rank)
            deps = [last_b[a], last_b[b]]
            comm = {"comm_op": "all_reduce", "comm_bytes": emb[0].embedding_grad_bytes,
                    "comm_ranks": (rank, mesh.rank({**mesh.coords(rank), "pp": emb[-1].pp_rank}))}
            if exact:
                t = g.add("embedding grads:all_reduce", "collective", Stream.GRAD, "dp", program.embedding_sync_s,
                          (a,), deps, **comm)
                g.join(t, b, [])
            else:
                t = g.add("embedding grads:all_reduce", "collective", Stream.GRAD, "dp", program.embedding_sync_s,
                          (a, b), deps, **comm)
            if flows is not None:
                note_flow(t, fit_demand(flows.embedding, program.embedding_sync_s))
            grad_tasks[a].append(t)
            grad_tasks[b].append(t)

    # optimizer step after the last gradient is reduced, then ZeRO-1/2 parameter all-gather
    for rank in reps:
        cid = cls_of(rank)
        r = mesh.coords(rank)["pp"]
        deps = [last_b[cid], *grad_tasks[cid]]
        opt = g.add("optimizer step", "compute", Stream.COMPUTE, "optimizer", (optimizer_s or {}).get(r, 0.0),
                    (cid,), deps)
        for vc in range(v if not tree.overlap_param_gather else 0):
            ch = chunks[vc * pp + r]
            for s in ch.post_step:
                t = collective_task(s.label, Stream.GRAD, "dp", s.duration_s, cid, rank, s.axes, [opt], -1,
                                    ("post", ch.chunk, s.label, s.axes))
                note_flow(t, step_flow(ch, s))
    if flows is not None:
        _resolve_flows(g, task_flow, flows.block_gpus or {"nic": flows.gpus_per_node})
    return g


def _blocks(ranks: range, span: int) -> range | set[int]:
    """The blocks of `span` consecutive ranks that `ranks` touch (one per block, not one per rank: a class of
    a 16,384-GPU job has a thousand ranks but a few blocks)."""
    if ranks.step == 1 and len(ranks):
        return range(ranks[0] // span, ranks[-1] // span + 1)
    return {r // span for r in ranks}


def _resolve_flows(g: ExecutionGraph, task_flow: dict[int, Demand], block_gpus: dict[str, int]) -> None:
    """Map link keys onto the graph's resources: a GPU's own links are one resource per rank class
    (its ranks' links, symmetric); a shared key (the NICs, a level's port) is one resource per set of
    classes with ranks in the same block of `block_gpus[key]` consecutive ranks."""
    shared: dict[str, list[list[str]]] = {}  # key -> per class: names of its blocks' resources
    for key, span in block_gpus.items():
        in_block: dict[int, set[int]] = defaultdict(set)
        blocks = [_blocks(rc.ranks, span) for rc in g.classes]
        for c, bs in enumerate(blocks):
            for b in bs:
                in_block[b].add(c)
        per_class: list[list[str]] = []
        for bs in blocks:
            sets = {tuple(sorted(in_block[b])) for b in bs}
            per_class.append([f"{key}:" + "+".join(f"c{x}" for x in s) for s in sorted(sets)])
        shared[key] = per_class
    for t, (latency, work) in task_flow.items():
        by_id: dict[int, float] = {}
        for c in g.participants[t]:
            for key, w in work.items():
                names = shared[key][c] if key in shared else [f"{key}@c{c}"]
                ids = [g.resource_id(x) for x in names]
                for rid in ids:
                    if w > by_id.get(rid, 0.0):
                        by_id[rid] = w
        g.flow_latency_s[t] = latency
        g.flow_demand[t] = tuple(sorted(by_id.items()))
