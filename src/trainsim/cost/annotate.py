"""Fill every step of a compiled program with its duration from the pluggable cost models.

With bandwidth sharing on, two more things happen (Proteus section VI-C):
- static sharing among identical groups: a collective of the symmetric (one class per pipeline
  stage) program stands for every group over the same mesh axes in its stage; those run at the same
  moment, so the groups with ranks on the same node divide that node's NICs (`concurrency`);
- the comm model's per-resource work of every call is recorded in a `FlowBook`, which the graph
  builder turns into flow demands that the engine shares max-min fairly at run time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache

import numpy as np

from ..compile.program import ChunkCopies, ChunkProgram, Program, Step
from ..hardware.cluster import Cluster
from ..hardware.devices import Device
from ..hardware.memory_systems import MemoryAccess, MemorySystem
from ..strategy.mesh import DeviceMesh
from ..strategy.precision import low_precision_gemm, weighted_gemm
from ..strategy.tree import FULL_ITERATION, TWO_HOP_DISPATCHERS
from ..workload.ir import Op, OpKind, OpValues
from ..workload.zoo.transformer import as_dispatched
from .comm import (
    HYBRIDEP_CROSS_DOMAIN_GBPS_PER_SM,
    HYBRIDEP_DEFAULT_SMS,
    HYBRIDEP_GBPS_PER_SM,
    CommModel,
    NcclComm,
    port_key,
    two_hop_dispatch,
)
from .compute import LOW_PRECISION_GEMM, ComputeModel
from .offload import gather_group_system

# Bytes an Adam step streams per parameter: read fp32 master, m, v and the grad, write master, m, v
# and the fp16/bf16 working copy (4*3 + 4 + 4*3 + 2 = 30 B; fused multi-tensor Adam, no extra passes).
ADAM_BYTES_PER_PARAM = 30.0


Demand = tuple[float, dict[str, float]]
"""(latency_s, {link key: work seconds}) of one communication call, as `NcclComm.demand` gives it."""


@dataclass
class FlowBook:
    """Per-resource work of the program's communication, for the graph builder (see compile.graph).

    `steps` is keyed like the cost cache: (collective, size_bytes, axes, stage rank); `sends` by
    (chunk, 'F' | 'B'); `embedding` is the tied-embedding all-reduce. Work is for the stand-alone call
    (with its static concurrency), consistent with the duration annotate gave it. `block_gpus`: link
    keys that name one resource per block of that many consecutive ranks ('nic': a node; a level's
    port: the GPUs below it), shared by every rank class with ranks in the block."""

    gpus_per_node: int
    block_gpus: dict[str, int] = field(default_factory=dict)
    steps: dict[tuple, Demand] = field(default_factory=dict)
    sends: dict[tuple[int, str], Demand] = field(default_factory=dict)
    embedding: Demand | None = None

    def step_demand(self, step: Step, stage_rank: int) -> Demand | None:
        return self.steps.get((step.collective, step.size_bytes, step.axes, stage_rank))

    def send_demand(self, chunk: int, phase: str) -> Demand | None:
        return self.sends.get((chunk, phase))


def _block_gpus(cluster: Cluster) -> dict[str, int]:
    """Shared link keys -> GPUs per block: the node's NICs, and each intra-node level's port."""
    out = {"nic": cluster.gpus_per_node}
    span = 1
    for i, level in enumerate(cluster.intra_node_levels):
        if level.port_gbps is not None:
            out[port_key(i, level)] = span
        span *= level.size
    return out


def _groups_per_node(ranks: np.ndarray, group_ids: np.ndarray, group: tuple[int, ...], gpus_per_node: int) -> int:
    """How many of the sibling groups (given as member rank / group id arrays; they run at once and
    divide the NICs and ports of the nodes they share) have a rank on a node of `group`: the most
    crowded such node counts."""
    nodes = ranks // gpus_per_node
    # with return_counts: np.unique without one imports numpy.ma to test for a mask (20-40 ms of a cold call)
    pairs = np.unique(nodes * (int(group_ids.max()) + 1) + group_ids, return_counts=True)[0]
    node_ids, counts = np.unique(pairs // (int(group_ids.max()) + 1), return_counts=True)
    mine = np.isin(node_ids, np.array(sorted({r // gpus_per_node for r in group})))
    return int(counts[mine].max()) if mine.any() else 1


@lru_cache(maxsize=4096)
def axes_concurrency(mesh: DeviceMesh, axes: tuple[str, ...], stage: int, group: tuple[int, ...],
                     gpus_per_node: int) -> int:
    """Concurrency of `group` among every group over `axes` in pipeline stage `stage` (one rank class),
    counted without building the groups: each rank of the stage is keyed by its group (its rank with
    the `axes` coordinates zeroed). Cached: a pure function of hashable inputs that many programs on one
    mesh ask again (a search's reduced jobs)."""
    per_stage = mesh.world_size // mesh.pp
    ranks = np.arange(stage * per_stage, (stage + 1) * per_stage, dtype=np.int64)
    keys = ranks.copy()
    for a in axes:
        st = mesh.stride(a)
        keys -= (ranks // st) % mesh.size(a) * st
    return _groups_per_node(ranks, keys - keys.min(), group, gpus_per_node)


@lru_cache(maxsize=4096)
def pair_concurrency(mesh: DeviceMesh, stage: int, other: int, group: tuple[int, ...], gpus_per_node: int) -> int:
    """Concurrency of the pair `group` among the pairs that join each rank of `stage` with its peer in
    stage `other` (pipeline sends, the tied-embedding sum). Cached like `axes_concurrency`."""
    per_stage = mesh.world_size // mesh.pp
    mine = np.arange(stage * per_stage, (stage + 1) * per_stage, dtype=np.int64)
    ids = np.arange(per_stage, dtype=np.int64)
    ranks = np.concatenate([mine, mine + (other - stage) * per_stage])
    return _groups_per_node(ranks, np.concatenate([ids, ids]), group, gpus_per_node)


def group_concurrency(mesh: DeviceMesh, axes: tuple[str, ...], stage_rank: int, gpus_per_node: int,
                      sharing: bool) -> tuple[tuple[int, ...], int]:
    """The group of a collective over `axes` that holds `stage_rank`, and its static concurrency (the sibling
    groups of its pipeline stage that share its nodes' links; 1 without `sharing`): how `annotate` prices a
    step, for callers that price a collective of a program they do not lower (optimize.analytic)."""
    group = tuple(mesh.group_ranks(axes, stage_rank))
    if not sharing:
        return group, 1
    return group, axes_concurrency(mesh, axes, mesh.coords(stage_rank)["pp"], group, gpus_per_node)


class _CostCache:
    """Compute costs of one annotate call, keyed by op value (OpValues id), local shape and phase: the repeated
    layers of a model (distinct Op objects, equal values) are priced once. `ops`: the lowering's op ids (the
    program's, so each op's value is looked up once per lowering, not again here). `enabled` off: no caching.

    `recent` keeps, per (op value, phase), the last local shape priced and its costs: the copies of a layer
    come in runs, so a step is mostly priced by comparing its shape with that one (a dict comparison, cheaper
    than building the key; the compute model reads a shape by dimension, so equal dicts cost the same)."""

    def __init__(self, compute: ComputeModel, device: Device, dtype: str, enabled: bool,
                 ops: OpValues | None, dispatcher: tuple[str, int]) -> None:
        self.compute, self.device, self.dtype, self.enabled = compute, device, dtype, enabled
        self.dispatcher = dispatcher  # (strategy.ep_dispatcher, ep): the MoE ops' bookkeeping kernels
        self._ops = ops if ops is not None else OpValues()
        self.op_ids = self._ops.ids  # op object id -> value id (annotate's loop reads it and `recent` itself)
        self.times: dict[tuple, tuple[float, float]] = {}  # (op value id, local items, phase) -> costs
        self.recent: dict[tuple[int, str], tuple[Mapping[str, float], tuple[float, float]]] = {}

    def step(self, step: Step) -> tuple[float, float]:
        """(duration_s, host_s) of a compute step: `compute.op_time` (a recompute priced as the forward it
        repeats) and `compute.host_time`."""
        op, local, phase = step.op, step.local, step.phase
        assert op is not None and local is not None
        if not self.enabled:
            return self._price(op, local, phase)
        value = self.op_ids.get(id(op))
        if value is None:
            value = self._ops(op)
        key = (value, tuple(local.items()), phase)
        hit = self.times.get(key)
        if hit is None:
            hit = self.times[key] = self._price(op, local, phase)
        self.recent[(value, phase)] = (local, hit)
        return hit

    def _price(self, op: Op, local: Mapping[str, float], phase: str) -> tuple[float, float]:
        if op.side_kernels != (0, 0):  # the MoE router's and token dispatcher's, as the dispatcher runs them
            op = as_dispatched(op, *self.dispatcher)
        time_s = self.compute.op_time(op, local, "fwd" if phase == "recompute" else phase, self.device, self.dtype)
        return time_s, self.compute.host_time(op, phase, local)


class _CommPricer:
    """Collective, pair and memory costs of one annotate call, with the FlowBook it fills.

    With `cache`, each distinct call is priced once: (collective, bytes, axes, stage) as always, and, for a comm
    model whose prices depend on ranks only through their node-relative layout (`node_shift_invariant`), every
    stage's copy of a call over the same group shape shares one price. Static concurrency is counted once per
    axes (or stage distance of a pair) when stages are whole nodes, since shifting a stage by whole nodes
    leaves every count the same. `cache` off: everything is priced anew (the reference)."""

    def __init__(self, mesh: DeviceMesh, cluster: Cluster, comm: CommModel, memory: MemorySystem | None, *,
                 sharing: bool, exact: bool, cache: bool, flows: bool = True,
                 two_hop: tuple[int, int, int | None] | None = None,
                 dispatch_gbps: tuple[float, float] = (0.0, 0.0)) -> None:
        self.mesh, self.comm, self.memory = mesh, comm, memory
        # (experts, top_k, node limit) of a MoE whose expert-parallel all-to-alls are two-hop dispatches
        # (strategy.ep_dispatcher deepep or hybridep), where the comm model prices them (NcclComm)
        self.two_hop = two_hop if isinstance(comm, NcclComm) else None
        # what the dispatcher's own kernels move at most, GB/s, within one NVLink domain and across domains (HybridEP's
        # SMs: strategy.ep_dispatcher_sms); 0: no bound
        self.dispatch_gbps = dispatch_gbps if self.two_hop is not None else (0.0, 0.0)
        self.sharing, self.exact, self.cache = sharing, exact, cache
        self.gpn = cluster.gpus_per_node
        self.world_size = cluster.world_size
        self.demand_of = getattr(comm, "demand", None) if sharing and flows else None
        self.priced_of = getattr(comm, "priced", None) if self.demand_of is not None else None
        self.book = FlowBook(self.gpn, _block_gpus(cluster)) if self.demand_of is not None else None
        self.shift_invariant = cache and bool(getattr(comm, "node_shift_invariant", False))
        self.aligned = cache and (mesh.world_size // mesh.pp) % self.gpn == 0  # stages of whole nodes
        self.times: dict[tuple, float] = {}
        self._groups: dict[tuple, tuple[int, ...]] = {}
        self._conc: dict[tuple, int] = {}
        self._priced: dict[tuple, tuple[float, Demand | None]] = {}
        self._stage_calls: dict[tuple, tuple[float, Demand | None]] = {}  # (collective, bytes, axes) -> priced

    def stage_of(self, rank: int) -> int:
        return self.mesh.coords(rank)["pp"]

    def concurrency(self, key: tuple, count: Callable[[], int]) -> int:
        if not self.sharing or self.exact:
            return 1
        if not self.cache:
            return count()
        if key not in self._conc:
            self._conc[key] = count()
        return self._conc[key]

    def call(self, collective: str, size: float, group: tuple[int, ...], conc: int,
             share: float = 1.0) -> tuple[float, Demand | None]:
        """(seconds, demand) of one call; shared by groups that are node shifts of each other where the comm
        model allows (each caller gets its own copy of the demand's work). `share`: a two-hop all-to-all's
        cross-node share (NcclComm's remote_share)."""
        if not self.shift_invariant or min(group) < 0 or max(group) >= self.world_size:
            return self._price(collective, size, group, conc, share)
        base = min(group) // self.gpn * self.gpn
        key = (collective, size, tuple(r - base for r in group), conc, share)
        hit = self._priced.get(key)
        if hit is None:
            hit = self._priced[key] = self._price(collective, size, group, conc, share)
        t, dem = hit
        return t, None if dem is None else (dem[0], dict(dem[1]))

    def _price(self, collective: str, size: float, group: tuple[int, ...], conc: int,
               share: float = 1.0) -> tuple[float, Demand | None]:
        kw = {"remote_share": share} if share != 1.0 else {}
        if self.demand_of is None:
            return self.comm.time(collective, size, group, conc, **kw), None
        if self.priced_of is not None:  # one algorithm choice for both
            return self.priced_of(collective, size, group, conc, **kw)
        return self.comm.time(collective, size, group, conc, **kw), self.demand_of(collective, size, group, conc, **kw)

    def two_hop_shares(self, step: Step, group: tuple[int, ...]) -> tuple[float, float]:
        """An expert-parallel all-to-all sent as a two-hop dispatch: (what it moves of its per-(token, expert)
        buffer, one copy per GPU reached: two_hop_rank_share; the cross-node share of that, one copy per node
        reached: two_hop_remote_share over it); (1, 1) for every other collective."""
        if self.two_hop is None or not _is_dispatch(step):
            return 1.0, 1.0
        experts, top_k, limit = self.two_hop
        return two_hop_dispatch(experts, top_k, len(group), self.domains(group), limit)

    def domains(self, group: tuple[int, ...]) -> int:
        """The nodes (NVLink domains) a group's ranks sit in."""
        return len({r // self.gpn for r in group})

    def pair(self, collective: str, size: float, a: int, b: int) -> tuple[float, Demand | None]:
        """A call between rank `a` and its peer `b` of another stage (pipeline send, tied-embedding sum)."""
        sa, sb = self.stage_of(a), self.stage_of(b)
        key = ("pair", sb - sa) if self.aligned else ("pair", sa, sb)
        conc = self.concurrency(key, lambda: pair_concurrency(self.mesh, sa, sb, (a, b), self.gpn))
        return self.call(collective, size, (a, b), conc)

    def collective(self, step: Step, stage_rank: int) -> float:
        """A collective step of the stage whose first rank is `stage_rank` (its group: the step's axes)."""
        key = (step.collective, step.size_bytes, step.axes, stage_rank)
        if self.cache:
            hit = self.times.get(key)
            if hit is not None:
                return hit
        if self.shift_invariant and self.aligned and "pp" not in step.axes:
            # every stage's group over these axes is the first stage's shifted by whole nodes (pp is the
            # outermost axis): `call` would give it the same price and a copy of the same demand
            call = self._stage_calls.get(key[:3])
            if call is not None:
                t, dem = call
                self.times[key] = t
                if self.book is not None and dem is not None:
                    self.book.steps[key] = (dem[0], dict(dem[1]))
                return t
        gkey = (step.axes, stage_rank)
        group = self._groups.get(gkey) if self.cache else None
        if group is None:
            group = self._groups[gkey] = tuple(self.mesh.group_ranks(step.axes, stage_rank))
        stage = self.stage_of(stage_rank)
        ckey = ("axes", step.axes) if self.aligned else ("axes", step.axes, stage)
        conc = self.concurrency(ckey, lambda: axes_concurrency(self.mesh, step.axes, stage, group, self.gpn))
        moved, share = self.two_hop_shares(step, group)
        t, dem = self.call(step.collective, step.size_bytes * moved, group, conc, share)
        if self.dispatch_gbps[0] and _is_dispatch(step):  # the dispatcher's kernels, not the links, bound it
            within, across = self.dispatch_gbps
            gbps = across if self.domains(group) > 1 else within
            t = max(t, step.size_bytes * moved / (gbps * 1e9))
        self.times[key] = t
        if self.book is not None and dem is not None:
            self.book.steps[key] = dem
        self._stage_calls[key[:3]] = (t, dem)
        return t

    def memory_access(self, step: Step) -> float:
        """A load or store of offloaded states (compile.offload), priced by the memory system."""
        if self.memory is None:
            raise ValueError(f"step '{step.label}' is a memory access but no memory system was given; "
                             "pass memory= to annotate (cost.offload.offload_memory_system)")
        key = ("memory", step.access, step.size_bytes, step.in_switch, step.axes)
        if self.cache and key in self.times:
            return self.times[key]
        # an in-switch access gathers / reduce-scatters over its ZeRO-3 group (`axes`) in the pool
        system = gather_group_system(self.memory, self.mesh.group_size(step.axes)) if step.in_switch \
            else self.memory
        t = self.times[key] = system.time_s(MemoryAccess(step.access, step.size_bytes, "remote", step.in_switch))
        return t


def annotate(program: Program, cluster: Cluster, compute: ComputeModel, comm: CommModel,
             collective_host_s: float = 0.0, *, sharing: bool = False, exact: bool = False,
             memory: MemorySystem | None = None, cache: bool = True, flows: bool = True,
             gamma: float = 0.0) -> FlowBook | None:
    """Set `duration_s` and `host_s` on every step (templates are shared by all micro-batches: cost once).

    `sharing`: price calls with their static concurrency (symmetric mode only: with `exact` every
    rank is its own class and the engine shares links among the groups' separate tasks) and return
    a FlowBook of per-resource work when the comm model can give it (`demand`), else None.
    `memory` prices memory steps (offload loads/stores, compile.offload). `cache`: price each distinct
    (op value, local shape, phase), collective and memory access once (off: every step anew, the reference;
    the cost models are pure functions of those, so the numbers are the same). `flows=False`: no FlowBook
    even so (a caller that only reads the durations, the analytic tier; the durations are the same). `gamma`: the
    compute slowdown under overlapped communication (the engine's), which EP overlap (strategy.ep_overlap) pays for
    the all-to-all time it hides."""
    device = cluster.device
    dtype = program.precision.compute_dtype
    mesh = program.mesh
    dispatcher = (program.tree.ep_dispatcher, mesh.ep)
    costs = _CostCache(compute, device, dtype, cache, program.op_values if cache else None, dispatcher)
    # an FP8 / NVFP4 recipe leaves the embedding's, the output layer's and the MoE router's GEMMs in BF16
    # (strategy.precision.low_precision_gemm): those are priced by a BF16 cache of their own
    high = _CostCache(compute, device, "bf16", cache, program.op_values if cache else None, dispatcher) \
        if dtype in LOW_PRECISION_GEMM else None
    layer_kinds = {la.name: la.kind for la in program.tree.model.layers} if high is not None else {}
    tree, hyper = program.tree, program.tree.model.hyper
    two_hop = (int(hyper["experts"]), int(hyper["top_k"]), tree.ep_node_limit) \
        if tree.ep_dispatcher in TWO_HOP_DISPATCHERS and hyper.get("experts") else None
    sms = tree.ep_dispatcher_sms or HYBRIDEP_DEFAULT_SMS
    dispatch_gbps = (sms * HYBRIDEP_GBPS_PER_SM, sms * HYBRIDEP_CROSS_DOMAIN_GBPS_PER_SM) \
        if tree.ep_dispatcher == "hybridep" else (0.0, 0.0)
    pricer = _CommPricer(mesh, cluster, comm, memory, sharing=sharing, exact=exact, cache=cache, flows=flows,
                         two_hop=two_hop, dispatch_gbps=dispatch_gbps)
    book = pricer.book
    pair_time = pricer.pair

    n_chunks = len(program.chunks)
    # CUDA graphs (strategy.cuda_graphs): a captured op's kernels are replayed from the graph, so the host issues
    # none of them (the graph's own launch, a few microseconds per captured region, is not charged); a full-iteration
    # graph captures the collectives too
    graphed = frozenset(tree.cuda_graphs)
    host_scale = cluster.host_overhead_scale
    full_graph = FULL_ITERATION in graphed
    paired: float | None = None  # EP overlap's paired share (paired_share), found once
    host_of: dict[tuple[str, ...], float] = {}  # a collective's issue time by its axes

    def collective_host(axes: tuple[str, ...]) -> float:
        # issuing a collective costs framework time plus the launch skew of its members,
        # which grows with the group like a tree of waits (log2 of the group size)
        group = mesh.group_size(axes)
        host = host_of[axes] = collective_host_s * math.log2(group) if group > 1 else 0.0
        return host

    # the hot loop (every step of every chunk) reads the two caches' tables itself when they hold the step's
    # price, and asks them (which price and remember it) when they do not
    op_ids, recent, comm_times = costs.op_ids, costs.recent, pricer.times
    # EP overlap sets a chunk's all-to-alls from its own forward and backward together: every chunk is priced
    # step by step then (no chunk copies; the graph builder reads each chunk's own steps)
    overlap_ep = program.tree.ep_overlap and bool(hyper.get("experts"))
    record = program.copies if cache and program.copies is not None and program.copies.valid(program.chunks) \
        and not overlap_ep else None
    copier = _Copier(program, record, pricer) if record is not None else None
    for ch in program.chunks:
        stage_rank = mesh.rank({"pp": ch.pp_rank})
        copied = copier.take(ch, stage_rank) if copier is not None else ()
        # (a copied phase's lists are not read: lowering may have deferred them, ChunkProgram.defer)
        lists = [getattr(ch, name) for phase, name in (("fwd", "fwd"), ("bwd", "bwd"), ("fwd", "grad_sync"),
                                                       ("fwd", "post_step")) if phase not in copied]
        for s in [s for steps in lists for s in steps]:
            kind = s.kind
            if kind == "compute" and high is not None and _high_precision(s, layer_kinds):
                s.duration_s, s.host_s = high.step(s)
            elif kind == "compute":
                value = op_ids.get(id(s.op)) if cache else None
                last = recent.get((value, s.phase)) if value is not None else None
                s.duration_s, s.host_s = last[1] if last is not None and last[0] == s.local else costs.step(s)
            elif kind == "memory":
                s.duration_s = pricer.memory_access(s)
            else:
                t = comm_times.get((s.collective, s.size_bytes, s.axes, stage_rank)) if cache else None
                s.duration_s = pricer.collective(s, stage_rank) if t is None else t
                if kind == "collective" and s.axes and not full_graph:
                    host = host_of.get(s.axes)
                    s.host_s = collective_host(s.axes) if host is None else host
            if graphed and kind == "compute" and (full_graph or (s.op is not None and s.op.module in graphed)):
                s.host_s = 0.0
            elif host_scale != 1.0:  # the nodes' CPUs (cluster.host_overhead_scale)
                s.host_s *= host_scale
        # (a copied phase has its original's durations as these leave them)
        adjusted = [getattr(ch, phase) for phase in ("fwd", "bwd") if phase not in copied]
        if program.tree.tp_comm_overlap and mesh.tp > 1:
            for steps in adjusted:
                _overlap_tp_comm(steps, mesh.tp)
        if program.tree.cp_comm == "p2p" and mesh.cp > 1:
            for steps in adjusted:
                _ring_attention(steps, mesh.cp, compute, device, dtype)
        if overlap_ep:
            paired = paired if paired is not None else paired_share(program)
            _overlap_ep_comm(ch.fwd, ch.bwd, paired, gamma)
        if copier is not None:
            copier.release(ch)
        # the neighbouring chunks' ranks (interleaved: the next and previous rank; DualPipeV's V turns on the last
        # rank, whose two chunks hand over without a send)
        if ch.chunk < n_chunks - 1 and (to := program.chunks[ch.chunk + 1].pp_rank) != ch.pp_rank:
            nxt = mesh.rank({"pp": to})
            ch.send_fwd_s, dem = pair_time("send_recv", ch.send_fwd_bytes, stage_rank, nxt)
            if book is not None and dem is not None:
                book.sends[(ch.chunk, "F")] = dem
        if ch.chunk > 0 and (to := program.chunks[ch.chunk - 1].pp_rank) != ch.pp_rank:
            prv = mesh.rank({"pp": to})
            ch.send_bwd_s, dem = pair_time("send_recv", ch.send_bwd_bytes, stage_rank, prv)
            if book is not None and dem is not None:
                book.sends[(ch.chunk, "B")] = dem
    emb = [ch for ch in program.chunks if ch.embedding_grad_bytes > 0]
    if len(emb) >= 2 and emb[0].pp_rank != emb[-1].pp_rank:
        a, b = mesh.rank({"pp": emb[0].pp_rank}), mesh.rank({"pp": emb[-1].pp_rank})
        program.embedding_sync_s, dem = pair_time("all_reduce", emb[0].embedding_grad_bytes, a, b)
        if book is not None:
            book.embedding = dem
    if copier is not None and record is not None:
        program.copies = copier.record(record, book)
    return book


def _high_precision(s: Step, layer_kinds: dict[str, str]) -> bool:
    """A weighted GEMM step that a low-precision recipe leaves in BF16 (strategy.precision.low_precision_gemm)."""
    op = s.op
    return op is not None and weighted_gemm(op) and not low_precision_gemm(layer_kinds.get(s.layer, ""), op)


_COPIED_LISTS = {"fwd": ("fwd", "grad_sync", "post_step"), "bwd": ("bwd",)}
"""The step lists of a chunk that lowering copies with its forward / backward (compile.program.ChunkCopies)."""


class _Copier:
    """annotate's use of lowering's record of chunk copies (compile.program.ChunkCopies): a phase that lowering
    made as a renamed copy of another chunk's is priced by copying that chunk's costs step for step, once they
    are known (an original later in the pass, as a backward's is, hands them on when it is priced: `release`).

    A copy's steps equal its original's but for names, so its compute and memory steps cost the same; its
    collectives do too on the original's pipeline stage, and on another stage where every stage's call over the
    same axes shares one price (a node-shift-invariant comm model, stages of whole nodes, no call over pp: see
    _CommPricer.collective), whose one call per distinct (collective, bytes, axes) also books the copy's stage's
    link demands. Elsewhere the copy is priced step by step as any chunk. What was copied is recorded for the
    graph builder (`record`)."""

    def __init__(self, program: Program, record: ChunkCopies, pricer: _CommPricer) -> None:
        self.chunks, self.mesh, self.lowered, self.pricer = program.chunks, program.mesh, record.lowered, pricer
        self.priced: dict[tuple[int, str], int] = {}
        self.pending: dict[tuple[int, str], list[int]] = {}  # an original's (chunk, phase) -> copies waiting
        self._calls: dict[tuple[int, str], list[Step]] = {}  # an original's collectives, one per distinct call
        self._costs: dict[tuple[int, str], list[tuple[float, float]]] = {}  # an original's list: its step costs

    def take(self, ch: ChunkProgram, stage_rank: int) -> tuple[str, ...]:
        """The phases of ch not to price step by step: copied now from an original already priced, or left
        for an original priced later."""
        out = []
        for phase in _COPIED_LISTS:
            src = self.lowered.get((ch.chunk, phase))
            if src is None or not self._agree(ch, src, phase):
                continue
            if src < ch.chunk:
                self._copy(ch, src, phase, stage_rank)
            else:
                self.pending.setdefault((src, phase), []).append(ch.chunk)
            out.append(phase)
        return tuple(out)

    def release(self, ch: ChunkProgram) -> None:
        """ch was priced: copy its costs to the copies that wait for them."""
        for phase in _COPIED_LISTS:
            for c in self.pending.pop((ch.chunk, phase), ()):
                copy = self.chunks[c]
                self._copy(copy, ch.chunk, phase, self.mesh.rank({"pp": copy.pp_rank}))

    def record(self, record: ChunkCopies, book: FlowBook | None) -> ChunkCopies:
        assert not self.pending, "an original was not priced"
        return replace(record, priced=self.priced, book=book)

    def _calls_of(self, src: int, phase: str) -> list[Step]:
        if (src, phase) not in self._calls:
            distinct: dict[tuple, Step] = {}
            for name in _COPIED_LISTS[phase]:
                for s in getattr(self.chunks[src], name):
                    if s.kind != "compute" and s.kind != "memory":
                        distinct.setdefault((s.collective, s.size_bytes, s.axes), s)
            self._calls[(src, phase)] = list(distinct.values())
        return self._calls[(src, phase)]

    def _agree(self, ch: ChunkProgram, src: int, phase: str) -> bool:
        """Whether ch's phase provably costs what its original's does (see the class)."""
        if self.chunks[src].pp_rank == ch.pp_rank:
            return True
        return (self.pricer.shift_invariant and self.pricer.aligned
                and not any("pp" in s.axes for s in self._calls_of(src, phase)))

    def _copy(self, ch: ChunkProgram, src: int, phase: str, stage_rank: int) -> None:
        original = self.chunks[src]
        if original.pp_rank != ch.pp_rank:
            for s in self._calls_of(src, phase):  # the copy's stage's prices and link demands
                self.pricer.collective(s, stage_rank)
        for name in _COPIED_LISTS[phase]:
            costs = self._costs.get((src, name))
            if costs is None:
                costs = self._costs[(src, name)] = [(s.duration_s, s.host_s) for s in getattr(original, name)]
            ch.copy_costs(name, costs)  # a deferred list keeps them for when it is made
        self.priced[(ch.chunk, phase)] = src


def _overlap_tp_comm(steps: list[Step], tp: int) -> None:
    """Megatron --tp-comm-overlap (Transformer Engine userbuffers): a sequence-parallel all-gather
    feeding a GEMM, or a reduce-scatter of a GEMM's output, is split into `tp` chunks pipelined with
    the GEMM's chunks, so only max(0, comm - gemm) plus one chunk of the shorter side stays exposed.
    The collective keeps its place in the chain and carries just that exposed time."""
    for i, s in enumerate(steps):
        if (s.kind != "collective" or s.category != "tp" or s.deps is not None
                or s.collective not in ("all_gather", "reduce_scatter")):
            continue
        nxt = steps[i + 1] if i + 1 < len(steps) else None
        prv = steps[i - 1] if i > 0 else None
        if nxt is not None and _is_gemm(nxt) and (nxt.deps is None or i in nxt.deps):
            gemm = nxt
        elif prv is not None and _is_gemm(prv):
            gemm = prv
        else:
            continue
        comm, g = s.duration_s, gemm.duration_s
        s.duration_s = max(0.0, comm - g) + min(comm, g) / tp


def _is_dispatch(step: Step) -> bool:
    """A MoE token dispatch or combine: the lowering's all-to-all into or out of the experts, categorised ep
    whatever mesh axes it crosses (ep, or tp and cp where the experts fold over them)."""
    return step.kind == "collective" and step.collective == "all_to_all" and step.category == "ep"


def paired_share(program: Program) -> float:
    """The share of forwards a pipeline rank runs beside a backward of another micro-batch: all but the
    schedule's warm-up forwards (1F1B: pp - rank - 1; interleaved: more), whose all-to-alls have no backward to
    hide under (nor have the cool-down backwards)."""
    from ..strategy.schedules import schedule_order

    sched, mesh = program.tree.schedule, program.mesh
    kind = sched.kind if sched.kind in ("1f1b", "interleaved", "zb-h1", "gpipe", "dualpipev") else "1f1b"
    # the first rank's (the longest warm-up, so the slowest rank's): one share for every chunk, so a chunk that
    # lowering copied (ChunkCopies) keeps its original's durations
    order = schedule_order(kind, mesh.pp, sched.n_micro_batch, 0, sched.virtual_stages)
    forwards = sum(1 for item in order if item[0] == "F")
    # the steady state runs forward i + w beside backward i: the w forwards before the one that precedes the
    # first backward have no partner
    warm_up = max(0, next((i for i, item in enumerate(order) if item[0] != "F"), len(order) + 1) - 1)
    return max(0.0, forwards - warm_up) / forwards if forwards else 0.0


def _overlap_ep_comm(fwd: list[Step], bwd: list[Step], paired: float, gamma: float = 0.0) -> None:
    """Expert-parallel all-to-all overlapped with compute (Megatron --overlap-moe-expert-parallel-comm, DeepSeek's
    DualPipe): the steady state runs one micro-batch's forward beside another's backward, layer against layer, so
    a layer's forward dispatch and combine run under the backward compute of a layer like it and its backward
    ones under forward compute. Per layer, min(all-to-all, the other direction's compute) is hidden, for the
    `paired` share of micro-batches that have a partner (paired_share), and the compute it hides under runs
    slower by `gamma` meanwhile (the communication kernels take SMs and memory bandwidth: the engine's overlap
    slowdown); each all-to-all keeps its place and carries what stays exposed plus that slowdown."""
    def per_layer(steps: list[Step]) -> tuple[dict[str, list[Step]], dict[str, float]]:
        comm: dict[str, list[Step]] = {}
        work: dict[str, float] = {}
        for s in steps:
            if _is_dispatch(s):
                comm.setdefault(s.layer, []).append(s)
            elif s.kind == "compute":
                work[s.layer] = work.get(s.layer, 0.0) + s.duration_s
        return comm, work

    (comm_f, work_f), (comm_b, work_b) = per_layer(fwd), per_layer(bwd)
    for comm, other in ((comm_f, work_b), (comm_b, work_f)):
        for layer, steps in comm.items():
            total = sum(s.duration_s for s in steps)
            if total <= 0:
                continue
            hidden = paired * min(total, other.get(layer, 0.0))
            keep = (total - hidden + gamma * hidden) / total
            for s in steps:
                s.duration_s *= keep


def _ring_attention(steps: list[Step], cp: int, compute: ComputeModel, device: Device, dtype: str) -> None:
    """Context parallelism as ring attention (Megatron / Transformer Engine `cp_comm_type=p2p`): each rank keeps
    its own K and V chunk and runs `cp` attention kernels, one per chunk, each over 1/cp of the keys, while the
    next chunk arrives from its ring neighbour. The lowered program gathers K and V over cp before attention
    (forward, recompute) and reduce-scatters their gradients after it (backward); those collectives move the
    bytes of the cp - 1 ring steps. Only what a step's transfer takes beyond one kernel stays exposed:
    (cp - 1) x max(0, transfer - kernel). Backward passes K and V again with their gradients (twice the bytes).
    The attention step is re-priced as cp kernels over t / cp keys (shorter kernels run less efficiently)."""
    for i, s in enumerate(steps):
        if s.kind != "compute" or s.op is None or s.op.kind != OpKind.ATTENTION or s.local is None:
            continue
        bwd = s.phase == "bwd"
        comm: list[Step] = []
        j = i + 1 if bwd else i - 1
        while 0 <= j < len(steps) and steps[j].kind == "collective" and steps[j].category == "cp":
            comm.append(steps[j])
            j += 1 if bwd else -1
        if not comm:
            continue
        if not bwd:
            comm.reverse()  # execution order: the first transfer carries the exposed time
        local = dict(s.local)
        keys = local.get("t", 1)
        local["t"] = max(1, keys // cp)
        phase = "fwd" if s.phase == "recompute" else s.phase
        s.duration_s = cp * compute.op_time(s.op, local, phase, device, dtype)
        total = sum(c.duration_s for c in comm) * (2.0 if bwd else 1.0)
        per_step, kernel = total / (cp - 1), s.duration_s / cp
        exposed = (cp - 1) * max(0.0, per_step - kernel)
        for k, c in enumerate(comm):
            c.duration_s = exposed if k == 0 else 0.0


def _is_gemm(step: Step) -> bool:
    return step.kind == "compute" and step.op is not None and step.op.kind == OpKind.MATMUL


def optimizer_time(params_local: float, cluster: Cluster, compute: ComputeModel) -> float:
    """One fused Adam step over the optimizer shard this rank owns (memory-bound)."""
    return compute.memory_time(params_local * ADAM_BYTES_PER_PARAM, cluster.device)
