"""The execution graph (the one meeting point) and its construction from a costed program.

Tasks are stored as parallel lists (struct of arrays) so the engine touches no per-task Python
objects. Each task runs on one stream of one or more rank classes (a collective over several
classes waits for all of them), depends on other tasks, and carries a memory effect: its peak
extra allocation while running and its net allocation once done.
"""

from __future__ import annotations

import operator
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, chain, repeat
from operator import attrgetter, itemgetter
from typing import NamedTuple, Protocol, TypeVar

from ..strategy.schedules import ZERO_BUBBLE_KINDS, chunk_index, dynamic_orders, schedule_order
from ..strategy.tree import StrategyTree
from ..workload.ir import CONTRACTION_KINDS
from .program import STREAM_NAMES, ChunkProgram, Program, Step, StepNames, Stream


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
    # the host waits for the GPU to finish the task's dependencies before it issues it (a device-to-host read:
    # a dropless MoE's token counts before its dispatch, compile.program.Step.host_sync)
    host_sync: list[bool] = field(default_factory=list)
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
            comm_op: str = "", comm_bytes: float = 0.0, comm_ranks: tuple[int, ...] = (),
            host_sync: bool = False) -> int:
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
        self.host_sync.append(host_sync)
        self.micro_batch.append(mb)
        self.flow_latency_s.append(flow_latency_s)
        self.flow_demand.append(flow_demand)
        self.comm_op.append(comm_op)
        self.comm_bytes.append(comm_bytes)
        self.comm_ranks.append(comm_ranks)
        for c in classes:
            self.queues[(c, stream)].append(t)
        return t

    def add_copies(self, table: TaskTable, blocks: list[range], prefixes: list[str], mbs: list[int]
                   ) -> list[int]:
        """Append a copy of each block (a range of `table`'s rows), in turn: copy i for micro-batch `mbs[i]`,
        its tasks named `prefixes[i]` + their labels, their dependencies shifted onto the copy. What `add` per
        task gives, in bulk, one column at a time at C speed (a pipeline repeats the same few blocks for every
        micro-batch, and a copy is a task or two: any work per copy costs about what `add` does).
        Returns each copy's first task."""
        start = len(self.name)
        lens = [len(b) for b in blocks]
        bases = list(accumulate(lens, initial=start))
        end = bases.pop()
        if end == start:
            return bases
        rows = _picker(list(chain.from_iterable(blocks)))  # a new task's value: its template row's, or
        of_copy = _picker(list(chain.from_iterable(map(repeat, range(len(blocks)), lens))))  # its copy's
        self.name.extend(map(operator.add, of_copy(prefixes), rows(table.labels)))
        for column in _TEMPLATE_COLUMNS:
            getattr(self, column).extend(rows(getattr(table, column)))
        self.parts.extend([None if p is None else dict(p) for p in rows(table.parts)])  # each task its own
        self.deps.extend([([t - back[0]] if len(back) == 1 else [t - b for b in back]) if back else []
                          for t, back in zip(range(start, end), rows(table.back), strict=True)])
        self.micro_batch.extend(of_copy(mbs))
        queue_of = rows(table.queue)
        for q in dict.fromkeys(queue_of):  # each (participants, stream) pair's new tasks, first used first
            tasks = [t for t, x in zip(range(start, end), queue_of, strict=True) if x == q]
            classes, stream = table.queues[q]
            for c in classes:
                self.queues[(c, stream)].extend(tasks)
        return bases

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


@dataclass(eq=False, slots=True)
class _Flow:
    """A task's link demand while build_graph builds the graph, in its `flow_demand` (_resolve_flows maps it
    onto resources at the end): latency, work seconds by link key and the classes taking part, or the task
    whose participants they are (-1: `classes`; a collective in exact mode gains participants later)."""

    latency_s: float
    work: dict[str, float]
    classes: tuple[int, ...]
    task: int = -1


# build_graph adds the common schedule item as a bulk copy of its chunk-phase's block; off (tests): every item
# task by task, the reference the copies are checked against
_COPY_ITEMS = True

# the columns a copy of a template row takes as they are (ExecutionGraph.add_copies)
_TEMPLATE_COLUMNS = ("kind", "stream", "category", "duration_s", "participants", "mem_peak_bytes",
                     "mem_net_bytes", "host_s", "host_path_s", "host_sync", "flow_latency_s", "flow_demand", "comm_op",
                     "comm_bytes", "comm_ranks")


def _picker(index: list[int]) -> Callable[[Sequence], Sequence]:
    """values -> [values[i] for i in index], at C speed (operator.itemgetter; one index gives a scalar)."""
    if len(index) == 1:
        return lambda values: (values[index[0]],)
    return itemgetter(*index)


@dataclass
class TaskTable:
    """Template tasks as rows of ExecutionGraph's columns (less the micro-batch), to copy in bulk with
    `ExecutionGraph.add_copies`: `labels` are the names after a copy's prefix; `back`, per dependency, how
    many tasks before the task it is; `queue` indexes `queues`, the (participants, stream) pairs."""

    labels: list[str] = field(default_factory=list)
    kind: list[str] = field(default_factory=list)
    stream: list[int] = field(default_factory=list)
    category: list[str] = field(default_factory=list)
    duration_s: list[float] = field(default_factory=list)
    parts: list[dict[str, float] | None] = field(default_factory=list)
    participants: list[tuple[int, ...]] = field(default_factory=list)
    back: list[tuple[int, ...]] = field(default_factory=list)
    mem_peak_bytes: list[float] = field(default_factory=list)
    mem_net_bytes: list[float] = field(default_factory=list)
    host_s: list[float] = field(default_factory=list)
    host_path_s: list[float] = field(default_factory=list)
    host_sync: list[bool] = field(default_factory=list)
    flow_latency_s: list[float] = field(default_factory=list)
    flow_demand: list[object] = field(default_factory=list)
    comm_op: list[str] = field(default_factory=list)
    comm_bytes: list[float] = field(default_factory=list)
    comm_ranks: list[tuple[int, ...]] = field(default_factory=list)
    queue: list[int] = field(default_factory=list)
    queues: list[tuple[tuple[int, ...], int]] = field(default_factory=list)
    _queue_ids: dict[tuple[tuple[int, ...], int], int] = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.labels)

    def add(self, label: str, kind: str, stream: int, category: str, duration_s: float,
            classes: tuple[int, ...], deps: tuple[int, ...], parts: dict[str, float] | None = None,
            mem_peak: float = 0.0, mem_net: float = 0.0, host_s: float = 0.0,
            host_path_s: float | None = None, comm_op: str = "", comm_bytes: float = 0.0,
            comm_ranks: tuple[int, ...] = (), flow: object = None, host_sync: bool = False) -> int:
        """Append one row (ExecutionGraph.add's arguments, `deps` as rows of this table; `flow`: what its
        copies' `flow_demand` holds, their latency 0 meanwhile); its row."""
        k = len(self.labels)
        self.labels.append(label)
        self.kind.append(kind)
        self.stream.append(stream)
        self.category.append(category)
        self.duration_s.append(duration_s)
        self.parts.append(parts)
        self.participants.append(classes)
        self.back.append(tuple(k - d for d in deps))
        self.mem_peak_bytes.append(mem_peak)
        self.mem_net_bytes.append(mem_net)
        self.host_s.append(host_s)
        self.host_path_s.append(max(duration_s, host_s) if host_path_s is None else host_path_s)
        self.host_sync.append(host_sync)
        self.flow_latency_s.append(0.0)
        self.flow_demand.append(flow)
        self.comm_op.append(comm_op)
        self.comm_bytes.append(comm_bytes)
        self.comm_ranks.append(comm_ranks)
        if (classes, stream) not in self._queue_ids:
            self._queue_ids[(classes, stream)] = len(self.queues)
            self.queues.append((classes, stream))
        self.queue.append(self._queue_ids[(classes, stream)])
        return k


class _Item(NamedTuple):
    """Where a schedule item's tasks of interest are, as offsets from a base task (build_graph `placed`): the
    first and last task of its body (what receives and sends activations: not offload loads / stores), the
    body's first compute task (its first task where it has none), the phase's last task and the pipeline
    send (-1: none); and, for an item copied in bulk, its block of template rows (the offsets are the
    block's), empty for one added task by task."""

    first: int
    last_body: int
    first_compute: int
    last: int
    send: int
    rows: range = range(0)


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
    host_sync: bool = False  # its first step's (Step.host_sync): a chain is never fused across one


T = TypeVar("T")


def _cloned(obj: T, **changes: object) -> T:
    """A shallow copy of a plain dataclass instance (no slots, no __post_init__: Step, _Spec) with `changes`
    set: what `type(obj)(**{**vars(obj), **changes})` makes, for a third of its cost (coarsening and
    renaming copy thousands of them a simulation)."""
    new = object.__new__(type(obj))
    state = obj.__dict__.copy()
    state.update(changes)
    new.__dict__ = state
    return new


Demand = tuple[float, dict[str, float]]
"""(latency_s, {link key: work seconds}) of one communication call alone (cost.comm `demand`)."""


_Send = tuple[float, float, int, Demand | None]
"""A pipeline send: seconds, bytes, destination rank, link demand."""


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
        fork = a.deps is not None and len(a.deps) == 1 and a.kind == "compute" and i + 1 < len(steps)
        k = i + 2  # steps[i + 1] (the first collective) carries the fork's explicit deps
        while fork and k < len(steps) and steps[k].deps is None and steps[k].stream in streams \
                and steps[k].kind == "collective":
            k += 1
        c = steps[k] if k < len(steps) else None
        fork = (fork and c is not None and steps[i + 1].kind == "collective"
                and steps[i + 1].deps == a.deps and steps[i + 1].stream in streams and c.kind == "compute"
                and c.deps == (i, k - 1) and refs[i] == 1 and all(refs[j] == (1 if j == k - 1 else 0)
                                                                   for j in range(i + 1, k))
                and not any(steps[j].host_sync for j in range(i, k + 1)))  # a sync stays its own task
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
            if s.parts is not None or deps != s.deps or deps == (n - 1,):
                # a copy (made once); deps None: the previous step
                out[n] = _cloned(s, deps=None if deps == (n - 1,) else deps)
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


@dataclass
class _Prepared:
    """A step list made ready for coarsen's chain fusion, which is the same with and without anchors: the
    steps after fork-join fusion, per step the original steps its label joins, its link demand as a spec
    starting at it carries it (latency, work; None: none) and the steps another step names as a dependency."""

    steps: list[Step]
    origins: list[tuple[int, ...]]
    flows: list[tuple[float, dict[str, float]] | None]
    referenced: set[int]


def _prepare(steps: list[Step], granularity: str, merge_streams: frozenset[int],
             demand_of: Callable[[Step], Demand | None] | None = None) -> _Prepared:
    """coarsen's first half: fork-join fusion and the steps' link demands."""
    fused_work: dict[int, dict[str, float]] = {}
    origins: list[tuple[int, ...]] = []
    if granularity != "op" and Stream.FEATURE in merge_streams:
        steps = _fuse_fork_join(steps, merge_streams, demand_of, fused_work, origins)
    else:
        origins = [(i,) for i in range(len(steps))]
    flows: list[tuple[float, dict[str, float]] | None] = [None] * len(steps)
    if demand_of is not None:
        # the repeated layers' collectives look up the same demand object with the same duration: fit each
        # pair once (the fitted demand is only read: a spec copies the one it starts with; the memo keeps the
        # demand it is keyed by alive, so that its id is not reused)
        fitted: dict[tuple[int, float], tuple[Demand | None, Demand | None]] = {}
        for i, s in enumerate(steps):
            if i in fused_work:
                flows[i] = (0.0, fused_work[i])
            elif s.kind == "collective":
                demand = demand_of(s)
                key = (id(demand), s.duration_s)
                if key not in fitted:
                    fitted[key] = (demand, fit_demand(demand, s.duration_s))
                flows[i] = fitted[key][1]
    return _Prepared(steps, origins, flows, {d for s in steps if s.deps for d in s.deps})


def _coarsen(steps: list[Step], granularity: str, keep_anchors: bool, merge_streams: frozenset[int],
             demand_of: Callable[[Step], Demand | None] | None = None,
             prepared: _Prepared | None = None) -> tuple[list[_Spec], _Naming]:
    """coarsen, and how it named the specs; `prepared`: _prepare's result for these arguments, if at hand."""
    if prepared is None:
        prepared = _prepare(steps, granularity, merge_streams, demand_of)
    steps, flows, referenced = prepared.steps, prepared.flows, prepared.referenced
    naming = _Naming(prepared.origins)
    out: list[_Spec] = []
    remap = [0] * len(steps)  # step -> its spec
    fused: set[int] = set()
    op_level, by_layer = granularity == "op", granularity != "auto"
    compute = Stream.COMPUTE
    prev: _Spec | None = None
    # the spec being built (prev) while it absorbs a chain: its running values, written back when it ends
    # (plain locals: a chain is most of a chunk at auto granularity)
    kind, stream, bucket, last, anchor = "", 0, None, -1, -1
    parts: dict[str, float] | None = None
    duration = host = host_path = mem_peak = mem_net = 0.0
    flow: dict[str, float] | None = None

    def finish(sp: _Spec) -> None:
        """Write the running values back into the spec that absorbed steps up to `last`."""
        sp.parts, sp.duration_s, sp.host_s, sp.host_path_s = parts, duration, host, host_path
        sp.mem_peak, sp.mem_net, sp.grad_bucket, sp.index = mem_peak, mem_net, bucket, last
        sp.kind, sp.stream, sp.flow, sp.flow_latency_s, sp.comm_op, sp.comm_bytes = (
            "compute", Stream.COMPUTE, flow, 0.0, "", 0.0)
        sp.label = sp.label + " .. " + steps[last].label
        fused.add(len(out) - 1)
        naming.last[-1], naming.bucket[-1] = last, anchor

    for i, s in enumerate(steps):
        if (not op_level and prev is not None and s.deps is None and s.stream in merge_streams
                and stream in merge_streams and (i - 1) not in referenced
                and not (keep_anchors and bucket) and kind != "p2p" and not s.host_sync
                and (not by_layer or steps[i - 1].layer == s.layer)):
            dur, alloc, step_host, step_bucket = s.duration_s, s.alloc_bytes, s.host_s, s.grad_bucket
            if parts is None:
                parts = {prev.category: duration}
            if s.parts:
                for cat, sec in s.parts.items():
                    parts[cat] = parts.get(cat, 0.0) + sec
            else:
                cat = s.category
                parts[cat] = parts.get(cat, 0.0) + dur
            if mem_net + alloc > mem_peak:
                mem_peak = mem_net + alloc
            mem_net += alloc - s.free_bytes
            # host_path = max(host_path + dur, host + max(dur, step_host)), without the calls
            paced = host + (dur if dur > step_host else step_host)
            host_path = host_path + dur if host_path + dur >= paced else paced
            duration += dur
            host += step_host
            bucket = step_bucket or (None if keep_anchors else bucket)
            kind, stream, last = "compute", compute, i
            demand = flows[i]
            if demand is not None and demand[1]:  # the spec's own dict: summed into in place
                flow = flow if flow is not None else {}
                for link, w in demand[1].items():
                    flow[link] = flow.get(link, 0.0) + w
            remap[i] = len(out) - 1
            if step_bucket:
                anchor = i
            elif keep_anchors:
                anchor = -1
        else:
            if prev is not None and last > prev.index:
                finish(prev)
            remap[i] = len(out)
            demand = flows[i]
            flow_latency, flow = (demand[0], dict(demand[1])) if demand is not None else (0.0, None)
            prev = _Spec(s.label, s.kind, s.stream, s.category, s.duration_s,
                         dict(s.parts) if s.parts else None, max(s.alloc_bytes, 0.0),
                         s.alloc_bytes - s.free_bytes, s.deps, s.grad_bucket, s.axes, i,
                         s.host_s, max(s.duration_s, s.host_s), flow_latency, flow, s.collective or s.access,
                         s.size_bytes, s.host_sync)
            out.append(prev)
            kind, stream, bucket, last = prev.kind, prev.stream, prev.grad_bucket, i
            anchor = i if s.grad_bucket else -1
            parts, duration, host, host_path = prev.parts, prev.duration_s, prev.host_s, prev.host_path_s
            mem_peak, mem_net = prev.mem_peak, prev.mem_net
            naming.first.append(i)
            naming.last.append(i)
            naming.bucket.append(anchor)
    if prev is not None and last > prev.index:
        finish(prev)
    for sp in out:
        if sp.deps is not None:
            sp.deps = tuple(remap[d] for d in sp.deps)
    for n in fused:  # a fused spec is named for its largest part (once, not at every step it absorbs)
        parts = out[n].parts
        assert parts is not None
        out[n].category = max(parts, key=lambda k: parts[k])
    return out, naming


def _renamed(specs: list[_Spec], naming: _Naming, steps: list[Step] | StepNames) -> list[_Spec]:
    """Another chunk's coarsened specs from one made for steps equal to its own but for their names: the same
    specs named after its own steps (and their gradient buckets)."""
    def label(x: int) -> str:
        return " | ".join(steps[o].label for o in naming.origins[x])

    out = []
    for j, sp in enumerate(specs):
        first, last, bucket = naming.first[j], naming.last[j], naming.bucket[j]
        name = label(first) if first == last else label(first) + " .. " + label(last)
        anchored = steps[naming.origins[bucket][-1]].grad_bucket if bucket >= 0 else None
        out.append(_cloned(sp, label=name, grad_bucket=anchored))
    return out


# the fields of a step that coarsen reads as they are (_signature)
_SIGNATURE_FIELDS = attrgetter("kind", "stream", "category", "deps", "duration_s", "host_s", "alloc_bytes",
                               "free_bytes", "axes", "collective", "access", "size_bytes")


def _signature(steps: list[Step], demand_of: Callable[[Step], Demand | None] | None) -> tuple:
    """Everything coarsen reads of a step list but the names and the layers: two chunks with equal signatures
    coarsen to the same specs, at layer granularity if their layers appear in the same order too
    (`_layer_order`: auto fuses across layers, op fuses nothing). Field by field over the steps (attrgetter:
    C speed), the few that need a look of their own apart."""
    parts = tuple([(i, tuple(p.items())) for i, p in enumerate(map(attrgetter("parts"), steps)) if p])
    demands: tuple = ()
    if demand_of is not None:
        found = [demand_of(s) for s in steps if s.kind == "collective"]
        demands = tuple([(d[0], tuple(d[1].items())) if d else None for d in found])
    buckets = tuple(map(bool, map(attrgetter("grad_bucket"), steps)))
    return tuple(map(_SIGNATURE_FIELDS, steps)), buckets, parts, demands


def _layer_order(steps: list[Step]) -> tuple[int, ...]:
    """Each step's layer as the order in which it first appears (all that coarsen compares of layers)."""
    layers: dict[str, int] = {}
    return tuple([layers.setdefault(layer, len(layers)) for layer in map(attrgetter("layer"), steps)])


class _ChunkSpecs:
    """Each chunk's phases coarsened into specs, for build_graph (one per graph: no state outlives it). A
    chunk-phase whose steps equal an earlier one's but for their names (the same _signature) is coarsened
    once and renamed (_renamed); zero bubble splits a chunk's backward into B and W like an earlier chunk's
    whose backward is the same but for the names, keeping of its own steps only what names the specs.

    `copies` ((chunk, "fwd" | "bwd") -> chunk, of `chunks`): chunk phases known to equal another's but for their
    names, costs and link demands included (compile.program.ChunkCopies.priced, while it holds): such a phase
    takes its original's signature without building its own. `all_copies`: they are all the copies lowering
    made, so the other phases were lowered from distinct keys and are rarely equal: each is numbered without
    building its signature (an equal pair is then coarsened twice, to the same specs)."""

    def __init__(self, granularity: str, merge: frozenset[int], zero_bubble: bool,
                 demand_of: Callable[[ChunkProgram], Callable[[Step], Demand | None] | None],
                 chunks: list[ChunkProgram] | None = None, copies: dict[tuple[int, str], int] | None = None,
                 all_copies: bool = False) -> None:
        self.granularity, self.merge, self.zero_bubble = granularity, merge, zero_bubble
        self.demand_of = demand_of
        self.chunks, self.copies, self.all_copies = chunks or [], copies or {}, all_copies
        self.by_layer = granularity not in ("auto", "op")  # auto fuses across layers, op fuses nothing
        self.cache: dict[tuple[int, str, bool], list[_Spec]] = {}  # (chunk, phase, anchors) -> specs
        self.distinct: dict[int, list[tuple[tuple, int]]] = {}  # step count -> signatures and their numbers
        self.count = 0  # signatures numbered
        self.signatures: dict[tuple[int, str], int] = {}  # (chunk, phase) -> the number of its signature
        self.coarsened: dict[tuple[int, bool], tuple[list[_Spec], _Naming]] = {}  # (number, anchors) -> ...
        self.prepared: dict[tuple[int, str], _Prepared] = {}  # (chunk, phase): with or without anchors
        self.halves: dict[int, tuple[list[Step], list[Step]]] = {}  # zero bubble: chunk -> its (B, W) halves
        self.split_like: dict[tuple, _Split] = {}  # zero bubble: backward's signature -> how it was split
        self.split_of: dict[int, _Split] = {}  # zero bubble: chunk -> how its backward was split
        self.named: dict[int, tuple[list[Step], list[Step]]] = {}  # ... chunk -> its steps in each half

    def template(self, ch: ChunkProgram, phase: str) -> list[Step]:
        """The steps of ch's phase (F, B, or zero bubble's B / W), to coarsen."""
        if phase == "F":
            return ch.fwd
        if not self.zero_bubble:
            return ch.bwd
        if ch.chunk not in self.halves:
            self.halves[ch.chunk] = split_backward(ch.bwd)
        return self.halves[ch.chunk][0 if phase == "B" else 1]

    def steps_named(self, ch: ChunkProgram, phase: str) -> list[Step]:
        """The steps of ch's phase for their labels and gradient buckets (all _renamed reads): its template,
        or its own steps as an earlier chunk's split put them into the half (zero bubble, `signature`)."""
        if phase != "F" and ch.chunk in self.named:
            return self.named[ch.chunk][0 if phase == "B" else 1]
        if phase == "F" or not self.zero_bubble:  # names only: a deferred copy is not made (ChunkProgram.defer)
            return ch.step_names("fwd" if phase == "F" else "bwd")  # type: ignore[return-value]
        return self.template(ch, phase)

    def number(self, steps: list[Step], ch: ChunkProgram) -> int:
        """The number of the signature of chunk ch's template `steps`: the first equal one's (compared with
        those of as many steps, not hashed: hashing a signature costs more than comparing two)."""
        if self.all_copies:
            self.count += 1
            return self.count
        sig = (_signature(steps, self.demand_of(ch)), _layer_order(steps) if self.by_layer else None)
        alike = self.distinct.setdefault(len(steps), [])
        for known, n in alike:
            if known == sig:
                return n
        self.count += 1
        alike.append((sig, self.count))
        return self.count

    def signature(self, ch: ChunkProgram, phase: str) -> int:
        """The number of the signature of ch's phase. Zero bubble splits a backward unlike an earlier
        chunk's only: what split_backward reads of it (its signature, the layers' pattern, the steps'
        phases) decides the halves, but for the names."""
        key = (ch.chunk, phase)
        if key in self.signatures:
            return self.signatures[key]
        src = self.copies.get((ch.chunk, "fwd" if phase == "F" else "bwd"))
        if src is not None:  # a recorded copy: its original's signature (and split, which reads only that)
            number = self.signature(self.chunks[src], phase)
            if not self.zero_bubble or phase == "F":
                self.signatures[key] = number
                return number
            split = self.split_of[src]
            bwd = ch.bwd
            self.named[ch.chunk] = ([bwd[i] for i in split.b_members], [bwd[i] for i in split.w_members])
            self.split_of[ch.chunk] = split
            self.signatures[(ch.chunk, "B")], self.signatures[(ch.chunk, "W")] = split.signatures
            return self.signatures[key]
        if not self.zero_bubble or phase == "F":
            self.signatures[key] = self.number(self.template(ch, phase), ch)
            return self.signatures[key]
        if self.all_copies:
            b_half, w_half, b_members, w_members = _split_backward(ch.bwd)
            self.halves[ch.chunk] = (b_half, w_half)
            self.split_of[ch.chunk] = _Split(b_members, w_members, (self.number(b_half, ch), self.number(w_half, ch)))
            self.signatures[(ch.chunk, "B")], self.signatures[(ch.chunk, "W")] = self.split_of[ch.chunk].signatures
            return self.signatures[key]
        backward = (_signature(ch.bwd, self.demand_of(ch)), _layer_order(ch.bwd),
                    tuple(map(attrgetter("phase"), ch.bwd)))
        if backward in self.split_like:
            split = self.split_like[backward]
            bwd = ch.bwd
            self.named[ch.chunk] = ([bwd[i] for i in split.b_members], [bwd[i] for i in split.w_members])
        else:
            b_half, w_half, b_members, w_members = _split_backward(ch.bwd)
            self.halves[ch.chunk] = (b_half, w_half)
            split = _Split(b_members, w_members, (self.number(b_half, ch), self.number(w_half, ch)))
            self.split_like[backward] = split
        self.split_of[ch.chunk] = split
        self.signatures[(ch.chunk, "B")], self.signatures[(ch.chunk, "W")] = split.signatures
        return self.signatures[key]

    def specs(self, ch: ChunkProgram, phase: str, anchors: bool) -> list[_Spec]:
        """Chunk ch's phase coarsened (`anchors`: a spec ends at each gradient bucket's last step)."""
        key = (ch.chunk, phase, anchors)
        if key not in self.cache:
            sig = self.signature(ch, phase)
            if (sig, anchors) in self.coarsened:
                made, naming = self.coarsened[(sig, anchors)]
                self.cache[key] = _renamed(made, naming, self.steps_named(ch, phase))
            else:
                # a recorded copy is coarsened from its original's steps (equal but for names) and renamed
                src = self.copies.get((ch.chunk, "fwd" if phase == "F" else "bwd"))
                of = self.chunks[src] if src is not None and (phase == "F" or not self.zero_bubble) else ch
                steps, demand_of = self.template(of, phase), self.demand_of(of)
                own = (of.chunk, phase)  # prepared from its own steps: the specs take their names
                if own not in self.prepared:
                    self.prepared[own] = _prepare(steps, self.granularity, self.merge, demand_of)
                made, naming = self.coarsened[(sig, anchors)] = _coarsen(steps, self.granularity, anchors,
                                                                          self.merge, demand_of, self.prepared[own])
                self.cache[key] = made if of is ch else _renamed(made, naming, self.steps_named(ch, phase))
        return self.cache[key]


def split_backward(steps: list[Step]) -> tuple[list[Step], list[Step]]:
    """A backward template cut into its zero-bubble halves (B, W): see _split_backward."""
    b_half, w_half, _, _ = _split_backward(steps)
    return b_half, w_half


@dataclass
class _Split:
    """How split_backward cut a backward template: the steps in each half (B, W), in order, and the numbers
    of the halves' signatures (build_graph)."""

    b_members: list[int]
    w_members: list[int]
    signatures: tuple[int, int]


def _split_backward(steps: list[Step]) -> tuple[list[Step], list[Step], list[int], list[int]]:
    """A backward template cut into its zero-bubble halves (Qi et al. 2024): B, the input-gradient side
    (everything but the weight gradients: dgrad and unsplit backward steps, recompute, feature collectives)
    and W, the weight-gradient steps with what only they consume (the sequence-parallel re-gather of a saved
    input, an offloaded layer's gradient store). Both are templates of their own: a B step that waited on a
    W step (the serial chain ran dgrad, wgrad, next op) waits on that step's B-side dependencies instead;
    W's dependencies on B are dropped, since the graph builder starts a micro-batch's W after its whole B.
    Redundant dependencies are pruned, so serial chains stay implicit (None) and coarsen as before. Returns
    the halves and the steps each one is made of (indices into `steps`, in order)."""
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
            out.append(_cloned(steps[i], deps=None if chain else needed,  # None: the previous step
                              alloc_bytes=steps[i].alloc_bytes + moved.get(i, 0.0)))
        return out

    b_members = [i for i in range(n) if not in_w[i]]
    w_members = [i for i in range(n) if in_w[i]]
    b_half = half(b_members, on_b, False)
    w_half = half(w_members, lambda d: frozenset((d,)) if in_w[d] else frozenset(), True)
    return b_half, w_half, b_members, w_members


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
        if sched.kind in ZERO_BUBBLE_KINDS and weighted[c]:  # W: weight gradients apart from B
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
    is called every 256 schedule items.

    A schedule item (a chunk's phase for one micro-batch, then its pipeline send) is the same few tasks
    for every micro-batch: each chunk-phase's are made once as a block of template rows and the items
    appended as copies in bulk (ExecutionGraph.add_copies); the few items that differ (exact mode's shared
    collectives, the gradient-bucket anchors, the wait for the parameter all-gather) are added task by
    task (add_item), the path the copies are tested against. Chunks equal but for their names are
    coarsened once (_ChunkSpecs)."""
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
    stage_demands: dict[int, Callable[[Step], Demand | None]] = {}  # by pipeline rank

    def step_demand_of(ch: ChunkProgram) -> Callable[[Step], Demand | None] | None:
        """A step's link demand on chunk ch's stage (None: no bandwidth sharing)."""
        if flows is None:
            return None
        if ch.pp_rank not in stage_demands:
            stage_rank = mesh.rank({"pp": ch.pp_rank})
            stage_demands[ch.pp_rank] = lambda step: flows.step_demand(step, stage_rank)
        return stage_demands[ch.pp_rank]

    def note_flow(t: int, demand: Demand | None) -> None:
        """Task t's link demand, to map onto resources at the end (_resolve_flows)."""
        if demand is not None and demand[1] and g.flow_demand[t] is None:
            g.flow_demand[t] = _Flow(demand[0], demand[1], (), t)  # type: ignore[call-overload]

    zero_bubble = sched.kind in ZERO_BUBBLE_KINDS

    def cidx(vc: int, r: int) -> int:
        """The chunk rank r runs as virtual chunk vc (interleaved: vc x pp + r; DualPipeV's V)."""
        return chunk_index(r, vc, pp, sched.kind)

    # lowering's and annotate's record of chunk copies, while no chunk was edited since and the link demands are
    # the ones annotate booked (else every chunk's signature is built and compared)
    record = program.copies
    copies = record.priced if (record is not None and record.priced is not None and record.valid(program.chunks)
                               and (flows is None or flows is record.book)) else None
    chunk_specs = _ChunkSpecs(granularity, merge, zero_bubble, step_demand_of, program.chunks, copies,
                              all_copies=copies is not None and record is not None and record.complete
                              and copies == record.lowered)
    specs = chunk_specs.specs

    shared: dict[tuple, int] = {}  # exact mode: one task per collective instance
    group_of: dict[tuple[tuple[str, ...], int], tuple[int, ...]] = {}  # (axes, rank) -> group ranks
    # where each schedule item went, (class, chunk, phase, micro-batch) -> (base, shape): its tasks of
    # interest are base + the shape's offsets (added in bulk: base is the copy's first task; one by one: 0)
    placed: dict[tuple[int, int, str, int], tuple[int, _Item]] = {}
    last_b: dict[int, int] = {}
    grad_tasks: dict[int, list[int]] = defaultdict(list)
    chunks = program.chunks
    has_grad = any(ch.grad_sync for ch in chunks)

    def cls_of(rank: int) -> int:
        return rank if exact else mesh.coords(rank)["pp"]

    def group(axes: tuple[str, ...], rank: int) -> tuple[int, ...]:
        """The ranks of `rank`'s group over `axes`."""
        if (axes, rank) not in group_of:
            group_of[(axes, rank)] = tuple(mesh.group_ranks(axes, rank)) if axes else (rank,)
        return group_of[(axes, rank)]

    def collective_task(name: str, stream: int, cat: str, dur: float, cid: int, rank: int, axes: tuple[str, ...],
                        deps: list[int], mb: int, key: tuple, extra: tuple[int, ...] = (), op: str = "",
                        size: float = 0.0) -> int:
        members = group(axes, rank)
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

    # fitted demands by (id of the booked demand, duration): a stage's repeated layers sync their gradients and
    # gather their parameters with the same booked demand (the memo keeps it alive, so its id is not reused;
    # the fitted demand is only read)
    fitted: dict[tuple[int, float], tuple[Demand | None, Demand | None]] = {}

    def step_flow(ch: ChunkProgram, s: Step) -> Demand | None:
        dem = step_demand_of(ch)
        if dem is None:
            return None
        demand = dem(s)
        got = fitted.get((id(demand), s.duration_s))
        if got is None:
            got = fitted[(id(demand), s.duration_s)] = (demand, fit_demand(demand, s.duration_s))
        return got[1]

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
                ch = chunks[cidx(vc, r)]
                for s in ch.post_step:
                    t = collective_task(s.label, Stream.GRAD, "dp", s.duration_s, cid, rank, s.axes, [], 0,
                                        ("post", ch.chunk, s.label, s.axes), op=s.collective, size=s.size_bytes)
                    note_flow(t, step_flow(ch, s))
                    param_gather[(cid, ch.chunk)].append(t)

    def send_of(c: int, ph: str, rank: int) -> _Send | None:
        """Chunk c's pipeline send after phase ph on `rank`; None: none (the last chunk's forward and the
        first chunk's backward send nothing, nor does W, nor a hand-off to a chunk on the same rank: the
        bottom of DualPipeV's V)."""
        if not ((ph == "F" and c < n_chunks - 1) or (ph == "B" and c > 0)):
            return None
        ch = chunks[c]
        to = chunks[c + 1 if ph == "F" else c - 1].pp_rank
        if to == ch.pp_rank:
            return None
        dur = ch.send_fwd_s if ph == "F" else ch.send_bwd_s
        dst = mesh.rank({**mesh.coords(rank), "pp": to})
        return (dur, ch.send_fwd_bytes if ph == "F" else ch.send_bwd_bytes, dst,
                fit_demand(flows.send_demand(c, ph), dur) if flows is not None else None)

    def send_label(send_bytes: float) -> str:
        return f"send {send_bytes / 1e6:.1f} MB"

    table = TaskTable()  # the rows of the items' blocks

    def item_block(ch: ChunkProgram, ph: str, cid: int, rank: int, send: _Send | None) -> _Item | None:
        """A schedule item's tasks (chunk `ch`'s phase `ph` on `rank`, then its send) as a block: what
        `add_item` adds for it, but for names, micro-batch and the dependencies on other items (a W's on its
        B, added after the copy). None where an item needs `add_item` (a W without weight gradients)."""
        todo = specs(ch, ph, False)
        if not todo:
            return None
        start = len(table)
        for j, sp in enumerate(todo):
            previous = (start + j - 1,) if j else ()  # deps None: the previous spec
            deps = tuple(start + d for d in sp.deps) if sp.deps is not None else previous
            flow = _Flow(sp.flow_latency_s, sp.flow, (cid,)) if sp.flow else None
            if sp.kind == "collective":
                table.add(sp.label, "collective", sp.stream, sp.category, sp.duration_s, (cid,), deps, None,
                          max(0.0, sp.mem_peak), sp.mem_net, sp.host_s, sp.host_path_s, comm_op=sp.comm_op,
                          comm_bytes=sp.comm_bytes, comm_ranks=group(sp.axes, rank), flow=flow,
                          host_sync=sp.host_sync)
            else:
                table.add(sp.label, sp.kind, sp.stream, sp.category, sp.duration_s, (cid,), deps,
                          dict(sp.parts) if sp.parts else None, sp.mem_peak, sp.mem_net, sp.host_s,
                          sp.host_path_s, comm_op=sp.comm_op, comm_bytes=sp.comm_bytes,
                          comm_ranks=(rank,) if sp.comm_op else (), flow=flow, host_sync=sp.host_sync)
        last = len(todo) - 1
        streams = table.stream[start:]
        body = [k for k, x in enumerate(streams) if x != Stream.MEMORY] or list(range(len(todo)))
        first_compute = next((k for k in body if streams[k] == Stream.COMPUTE), body[0])
        sent = -1
        if send is not None:
            dur, send_bytes, dst, demand = send
            flow = _Flow(*demand, (cid,)) if demand is not None and demand[1] else None
            sent = table.add(send_label(send_bytes), "p2p", Stream.P2P, "pp", dur, (cid,),
                             (start + body[-1],), comm_op="send_recv", comm_bytes=send_bytes,
                             comm_ranks=(rank, dst), flow=flow)
            sent -= start
        return _Item(body[0], body[-1], first_compute, last, sent, range(start, len(table)))

    def add_copies(items: list[tuple[int, int, str, int]], blocks: list[_Item]) -> None:
        """Add the schedule items `items` (class, chunk, phase, micro-batch), copies of `blocks`, in bulk."""
        bases = g.add_copies(table, [b.rows for b in blocks], [f"{ph}{mb} c{c} " for _, c, ph, mb in items],
                             [mb for _, _, _, mb in items])
        placed.update(zip(items, zip(bases, blocks, strict=True), strict=True))
        if zero_bubble:
            for (cid, c, ph, mb), base in zip(items, bases, strict=True):
                if ph == "W":  # a micro-batch's W starts after its whole B (Qi et al. 2024)
                    b_base, b_shape = placed[(cid, c, "B", mb)]
                    g.deps[base].append(b_base + b_shape.last_body)

    def add_item(cid: int, rank: int, c: int, ph: str, mb: int, anchors: bool, send: _Send | None) -> None:
        """Add one schedule item's tasks one by one: what its block's copy would be, in exact mode with a
        collective shared by the ranks taking part, anchoring gradient buckets (their all-reduce after
        the task that finishes them) and the first forward's wait for the parameter all-gather."""
        ch = chunks[c]
        ids: list[int] = []
        todo = specs(ch, ph, anchors)
        if ph == "W":
            b_base, b_shape = placed[(cid, c, "B", mb)]
            b_last = b_base + b_shape.last_body
        if ph == "W" and not todo:  # a chunk without weight gradients: an empty W keeps the bookkeeping
            ids.append(g.add(f"W{mb} c{c} (no weight gradients)", "compute", Stream.COMPUTE, "compute", 0.0,
                             (cid,), [b_last], mb))
        for j, sp in enumerate(todo):
            deps = [ids[d] for d in sp.deps] if sp.deps is not None else ([ids[-1]] if ids else [])
            if ph == "W" and not ids:  # a micro-batch's W starts after its whole B (Qi et al. 2024)
                deps.append(b_last)
            name = f"{ph}{mb} c{c} {sp.label}"
            if sp.kind == "collective":
                t = collective_task(name, sp.stream, sp.category, sp.duration_s, cid, rank, sp.axes, deps, mb,
                                    (c, ph, mb, j), op=sp.comm_op, size=sp.comm_bytes)
                g.mem_peak_bytes[t] = max(g.mem_peak_bytes[t], sp.mem_peak)
                g.mem_net_bytes[t] = sp.mem_net
                g.host_s[t] = sp.host_s
                g.host_path_s[t] = sp.host_path_s
                g.host_sync[t] = sp.host_sync
            else:
                t = g.add(name, sp.kind, sp.stream, sp.category, sp.duration_s, (cid,), deps, mb,
                          dict(sp.parts) if sp.parts else None, sp.mem_peak, sp.mem_net, sp.host_s,
                          sp.host_path_s, comm_op=sp.comm_op, comm_bytes=sp.comm_bytes,
                          comm_ranks=(rank,) if sp.comm_op else (), host_sync=sp.host_sync)
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
        first_compute = next((t for t in body if g.stream[t] == Stream.COMPUTE), body[0])
        sent = -1
        if send is not None:
            dur, send_bytes, dst, demand = send
            sent = g.add(f"{ph}{mb} c{c} {send_label(send_bytes)}", "p2p", Stream.P2P, "pp", dur, (cid,),
                         [body[-1]], mb, comm_op="send_recv", comm_bytes=send_bytes, comm_ranks=(rank, dst))
            note_flow(sent, demand)
        placed[(cid, c, ph, mb)] = (0, _Item(body[0], body[-1], first_compute, ids[-1], sent))

    dynamic = _htae_orders(chunks, m, sched.max_ongoing_micro_batch) if sched.kind == "dynamic" else None
    for rank in reps:
        cid = cls_of(rank)
        r = mesh.coords(rank)["pp"]
        order = dynamic[r] if dynamic is not None else schedule_order(sched.kind, pp, m, r, v,
                                                                          sched.max_ongoing_micro_batch)
        # the last backward item (B; zero bubble: B and W, each anchoring the gradient buckets it finishes)
        # of each chunk: its gradients are complete there
        last_item_of_chunk: dict[tuple[str, int], int] = {}
        for idx, (ph, _mb, vc) in enumerate(order):
            if ph != "F":
                last_item_of_chunk[(ph, vc)] = idx
        # per (phase, virtual chunk): its send (the same for every micro-batch) and block (none in exact mode)
        sends: dict[tuple[str, int], _Send | None] = {}
        blocks: dict[tuple[str, int], _Item | None] = {}
        for ph, vc in dict.fromkeys((ph, vc) for ph, _, vc in order):
            sends[(ph, vc)] = send_of(cidx(vc, r), ph, rank)
            if _COPY_ITEMS and not exact:
                blocks[(ph, vc)] = item_block(chunks[cidx(vc, r)], ph, cid, rank, sends[(ph, vc)])
            else:
                blocks[(ph, vc)] = None
        items = [(cid, cidx(vc, r), ph, mb) for ph, mb, vc in order]
        copied = [blocks[(ph, vc)] for ph, _, vc in order]
        # one by one (add_item): the items without a block, those anchoring gradient buckets and the first
        # forward of a chunk waiting for the parameter all-gather
        anchoring = set(last_item_of_chunk.values()) if tree.overlap_grad_reduce and has_grad else set()
        for idx in anchoring:
            copied[idx] = None
        for vc in range(v):
            if param_gather.get((cid, cidx(vc, r))):
                copied[order.index(("F", 0, vc))] = None
        single = {idx for idx, block in enumerate(copied) if block is None}
        reports = set(range(0, len(order), 256)) if progress is not None else set()  # every 256 items
        start = 0
        for stop in [*sorted(single | reports), len(order)]:
            if start < stop:
                add_copies(items[start:stop], copied[start:stop])  # type: ignore[arg-type]
            start = stop
            if progress is not None and stop in reports:
                progress(len(g))
            if stop in single:
                ph, mb, vc = order[stop]
                add_item(cid, rank, cidx(vc, r), ph, mb, stop in anchoring, sends[(ph, vc)])
                start = stop + 1
        ph, mb, vc = next(item for item in reversed(order) if item[0] != "F")
        base, shape = placed[(cid, cidx(vc, r), ph, mb)]
        last_b[cid] = base + shape.last
        if has_grad and not tree.overlap_grad_reduce:
            for vc in sorted({vc for _, vc in last_item_of_chunk}, reverse=True):
                grad_sync(chunks[cidx(vc, r)], cid, rank, last_b[cid], None)

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
        if first_compute != first and send not in g.deps[first_compute]:
            g.deps[first_compute].append(send)

    for rank in reps:
        cid = cls_of(rank)
        r = mesh.coords(rank)["pp"]
        for vc in range(v):
            c = cidx(vc, r)
            before = peer(rank, chunks[c - 1].pp_rank) if c > 0 else -1
            after = peer(rank, chunks[c + 1].pp_rank) if c < n_chunks - 1 else -1
            for mb in range(m):
                f_base, f = placed[(cid, c, "F", mb)]
                b_base, b = placed[(cid, c, "B", mb)]
                if c > 0:  # a hand-off on the same rank (no send): straight from the body that made it
                    s_base, s = placed[(before, c - 1, "F", mb)]
                    receive(f_base + f.first, f_base + f.first_compute,
                            s_base + (s.send if s.send >= 0 else s.last_body))
                if c < n_chunks - 1:
                    s_base, s = placed[(after, c + 1, "B", mb)]
                    receive(b_base + b.first, b_base + b.first_compute,
                            s_base + (s.send if s.send >= 0 else s.last_body))
                g.deps[b_base + b.first].append(f_base + f.last_body)

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
            ch = chunks[cidx(vc, r)]
            for s in ch.post_step:
                t = collective_task(s.label, Stream.GRAD, "dp", s.duration_s, cid, rank, s.axes, [opt], -1,
                                    ("post", ch.chunk, s.label, s.axes))
                note_flow(t, step_flow(ch, s))
    if flows is not None:
        _resolve_flows(g, flows.block_gpus or {"nic": flows.gpus_per_node})
    return g


def _blocks(ranks: range, span: int) -> range | set[int]:
    """The blocks of `span` consecutive ranks that `ranks` touch (one per block, not one per rank: a class of
    a 16,384-GPU job has a thousand ranks but a few blocks)."""
    if len(ranks) and (span % ranks.step == 0 or ranks.step % span == 0):
        step = max(1, ranks.step // span)  # consecutive ranks touch every block between; spread ones every step-th
        return range(ranks[0] // span, ranks[-1] // span + 1, step)
    return {r // span for r in ranks}


def _disjoint(blocks: list[range | set[int]]) -> bool:
    """Whether no block is used by two classes, told from the ranges' ends (all must be ranges of step 1)."""
    if not all(isinstance(bs, range) and bs.step == 1 for bs in blocks):
        return False
    spans = sorted((bs.start, bs.stop) for bs in blocks if len(bs))
    return all(stop <= nxt for (_, stop), (nxt, _) in zip(spans, spans[1:], strict=False))


def _resolve_flows(g: ExecutionGraph, block_gpus: dict[str, int]) -> None:
    """Map link keys onto the graph's resources (the tasks' `flow_demand` holds a _Flow each until then): a
    GPU's own links are one resource per rank class (its ranks' links, symmetric); a shared key (the NICs, a
    level's port) is one resource per set of classes with ranks in the same block of `block_gpus[key]`
    consecutive ranks. Resources are numbered in the order the tasks first use them."""
    shared: dict[str, list[list[str]]] = {}  # key -> per class: names of its blocks' resources
    for key, span in block_gpus.items():
        blocks = [_blocks(rc.ranks, span) for rc in g.classes]
        if _disjoint(blocks):  # each block is one class's (pipeline stages on their own nodes): one resource each
            shared[key] = [[f"{key}:c{c}"] if len(bs) else [] for c, bs in enumerate(blocks)]
            continue
        in_block: dict[int, set[int]] = defaultdict(set)
        for c, bs in enumerate(blocks):
            for b in bs:
                in_block[b].add(c)
        per_class: list[list[str]] = []
        for bs in blocks:
            sets = {tuple(sorted(in_block[b])) for b in bs}
            per_class.append([f"{key}:" + "+".join(f"c{x}" for x in s) for s in sorted(sets)])
        shared[key] = per_class
    # the copies of a template row share its _Flow: resolve each once, in task order (dict.fromkeys keeps
    # the first use's), and the same participants and work once; then replace each task's _Flow by its
    # resources and set its latency (at C speed: nearly every task of a pipeline has a link demand)
    by_flow: dict[_Flow | None, tuple[tuple[int, float], ...] | None] = {None: None}
    latency: dict[_Flow, float] = {}
    by_work: dict[tuple, tuple[tuple[int, float], ...]] = {}
    for flow in dict.fromkeys(g.flow_demand):
        if flow is None:
            continue
        assert isinstance(flow, _Flow)
        classes = flow.classes if flow.task < 0 else g.participants[flow.task]
        key = (classes, tuple(flow.work.items()))
        if key not in by_work:
            by_id: dict[int, float] = {}
            for c in classes:
                for link, w in flow.work.items():
                    names = shared[link][c] if link in shared else [f"{link}@c{c}"]
                    for rid in [g.resource_id(x) for x in names]:
                        if w > by_id.get(rid, 0.0):
                            by_id[rid] = w
            by_work[key] = tuple(sorted(by_id.items()))
        by_flow[flow] = by_work[key]
        latency[flow] = flow.latency_s
    g.flow_latency_s[:] = map(latency.get, g.flow_demand, g.flow_latency_s)
    g.flow_demand[:] = map(by_flow.__getitem__, g.flow_demand)
