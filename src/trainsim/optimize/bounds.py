"""Cheap, safe bounds on a configuration before it is simulated: a lower bound on the iteration time
(so an upper bound on throughput, for branch and bound) and a lower bound on peak memory (for OOM pruning).

Both come from the same costed templates the event engine runs, not from a separate formula: a job
reduced to one transformer block (pipeline 1, the same tp / cp / ep, and the same dp where the data
axis matters) is lowered and costed once per distinct key, and its steps are cut into per-layer pieces:
- the compute stream's occupancy per layer (compute plus the waits on communication the layer's own
  dependencies force, replayed as-soon-as-possible with every task alone on its link), and the wait
  between a layer and the next one (a TP all-reduce closing a block, say);
- gradient-stream work per layer (ZeRO-3 gathers), gradient reduction and ZeRO parameter all-gathers;
- states (parameters, gradients, optimizer) and the activations one forward keeps, per layer.
A full configuration's stages are sums of those pieces. Every term is a duration the engine can only
stretch (overlap slowdown, link sharing, host issue), so the bound holds whatever the schedule does;
`tests/test_search.py` checks it against the simulation on random configurations.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from ..api import costed_program, job_tree
from ..compile.program import Step, Stream
from ..config import JobConfig, parse_job
from ..cost.annotate import optimizer_time
from ..cost.memory import RUNTIME_RESERVED_BYTES, workspace_bytes
from ..errors import ConfigError
from ..hardware.cluster import Cluster
from ..strategy.presets import ParallelSpec, chunk_assignment, stage_layers
from ..strategy.schedules import ZERO_BUBBLE_KINDS, chunk_index, schedule_order
from ..workload.ir import Model
from .space import Candidate, with_held

# The activation term of the memory bound is scaled down by this much: the reduced job attributes a
# tensor freed across a layer boundary to the neighbouring layer (a chunk that starts with a block holds
# the hand-off it received where the reduced job holds an embedding output): up to ~10% either way.
ACTIVATION_SAFETY = 0.85


@dataclass
class _Pieces:
    """Per layer (reduced-model layer name): compute-stream seconds and the wait after it, per phase."""

    own: dict[str, dict[str, float]] = field(default_factory=lambda: {"F": defaultdict(float), "B": defaultdict(float)})
    tail: dict[str, dict[str, float]] = field(default_factory=lambda: {"F": defaultdict(float), "B": defaultdict(float)})
    act_bytes: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    wgrad_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # weight-gradient compute


@dataclass
class _DataPieces:
    """Per layer: gradient-stream seconds per micro-batch (ZeRO-3 gathers), gradient reduction and
    post-step all-gather seconds, and the states one rank stores (bytes)."""

    grad_stream_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    reduce_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    post_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    state_bytes: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    optimizer_params: dict[str, float] = field(default_factory=lambda: defaultdict(float))


def _replay(steps: list[Step], phase: str, into: _Pieces) -> None:
    """As-soon-as-possible replay of one template, every stream in order and every task alone: the
    compute stream's busy time and forced waits, attributed to the layer of the compute step after it."""
    end: list[float] = []
    free: dict[int, float] = {}
    last_end, last_layer = None, ""
    for i, s in enumerate(steps):
        deps = (i - 1,) if s.deps is None and i > 0 else (s.deps or ())
        t0 = max([end[d] for d in deps] + [free.get(s.stream, 0.0)])
        e = t0 + s.duration_s
        end.append(e)
        free[s.stream] = e
        if s.stream != Stream.COMPUTE:
            continue
        if s.phase == "wgrad":
            into.wgrad_s[s.layer] += s.duration_s
        if last_end is None:
            into.own[phase][s.layer] += s.duration_s
        elif s.layer == last_layer:
            into.own[phase][s.layer] += (t0 - last_end) + s.duration_s
        else:
            into.tail[phase][last_layer] += t0 - last_end
            into.own[phase][s.layer] += s.duration_s
        last_end, last_layer = e, s.layer


class BoundModel:
    """Lower bounds for the configurations of one search (one model, cluster, batch and simulation)."""

    def __init__(self, base: dict[str, Any], model: Model, cluster: Cluster) -> None:
        self.base = base
        self.model = model
        self.cluster = cluster
        self.capacity_bytes = cluster.device.hbm_bytes - RUNTIME_RESERVED_BYTES
        blocks = [la for la in model.layers if la.kind == "transformer"]
        self.enabled = bool(blocks) and all(_signature(b) == _signature(blocks[0]) for b in blocks)
        # a learned compute model may make compute faster than the roofline's times these bounds add up: no
        # time bound then (memory, which it does not change, still prunes)
        self.time_bound = (base.get("simulation") or {}).get("compute_model", "roofline") == "roofline"
        self._chain: dict[tuple, tuple[_Pieces, dict[str, str]] | None] = {}
        self._data: dict[tuple, tuple[_DataPieces, dict[str, str]] | None] = {}
        self._assign: dict[tuple, list[list[str]]] = {}
        self._compute = None
        self.reduced_jobs = 0

    # -- the reduced jobs ------------------------------------------------------------------------------
    def _reduced(self, c: Candidate, dp: int, **over: Any) -> tuple[Any, dict[str, str]] | None:
        """Lower and cost the one-block job of `c` with `dp` data-parallel ranks on pipeline 1. A stage smaller
        than a node is a part of one node where the preset allows it, else (a node of several switch levels)
        a pipeline of one block per stage filling the node: the same groups on the same links either way."""
        world = c.tp * c.cp * dp
        gpn = self.cluster.gpus_per_node
        attempts = [(1, {"nodes": max(1, world // gpn)} | ({"gpus_per_node": world} if world < gpn else {}))]
        if world < gpn and gpn % world == 0:
            attempts.append((gpn // world, {"nodes": 1}))
        for pp, cluster in attempts:
            job = {k: dict(v) for k, v in self.base.items()}
            held = job.pop("strategy", {})  # the search's held expert-parallel knobs (space.HELD_KNOBS)
            job["model"]["layers"] = pp
            job["cluster"] = {**job.get("cluster", {}), **cluster}
            job["strategy"] = {"tp": c.tp, "cp": c.cp, "ep": c.ep, "dp": dp, "pp": pp, "vpp": 1,
                               "sequence_parallel": c.sequence_parallel, "micro_batch": c.micro_batch,
                               "global_batch": c.micro_batch * dp, "recompute": c.recompute, "zero": c.zero,
                               "tp_comm_overlap": c.tp_comm_overlap,
                               "overlap_param_gather": c.overlap_param_gather, "cp_comm": c.cp_comm, **over}
            job["strategy"] = with_held(job["strategy"], held, c.ep)
            try:
                jc: JobConfig = parse_job(job)
                clu, _, tree = job_tree(jc)
                costed = costed_program(tree, clu, jc.simulation)
            except ConfigError as exc:
                if not exc.field.startswith(("strategy", "cluster")):
                    raise  # the job itself is wrong (a calibration file, a dtype the GPU lacks): say so at once
                continue  # this stage shape does not fit the cluster preset: try the next way, or no bound
            self.reduced_jobs += 1
            if self._compute is None:
                self._compute = costed.compute
            names: dict[str, str] = {}
            for la in tree.model.layers:
                names.setdefault("block" if la.kind == "transformer" else la.name, la.name)
            return costed, names
        return None  # a stage that is not whole nodes nor part of one: no bound (the candidate is simulated)

    @staticmethod
    def refinable(c: Candidate) -> bool:
        """Whether `bounds(c, refine=True)` is tighter (and dearer: a reduced job of its own data axis)."""
        return c.zero == 3

    def _chain_pieces(self, c: Candidate, refine: bool) -> tuple[_Pieces, dict[str, str]] | None:
        # ZeRO-3 gathers sit in the chain (and need the real data axis); without them the chain is shorter
        zero3 = c.dp if refine and c.zero == 3 else None
        split = c.schedule in ZERO_BUBBLE_KINDS  # ZB-H1 and DualPipeV lower weighted backwards as dgrad + wgrad
        key = (c.tp, c.cp, c.ep, c.sequence_parallel, c.micro_batch, c.recompute, c.tp_comm_overlap, c.cp_comm, zero3,
               split)
        if key not in self._chain:
            sched = {"schedule": "zb-h1" if split else "1f1b"}
            red = (self._reduced(c, c.dp, **sched) if zero3 else
                   self._reduced(c, c.ep, zero=0, overlap_param_gather=False, **sched))
            if red is None:  # the stage's data axis does not fit whole nodes: the chain without its gathers
                self._chain[key] = self._chain_pieces(c, False) if zero3 else None
                return self._chain[key]
            pieces = _Pieces()
            costed, names = red
            for ch in costed.program.chunks:
                _replay(ch.fwd, "F", pieces)
                _replay(ch.bwd, "B", pieces)
                for s in ch.fwd:
                    pieces.act_bytes[s.layer] += s.alloc_bytes - s.free_bytes
            self._chain[key] = (pieces, names)
        return self._chain[key]

    def _data_pieces(self, c: Candidate) -> tuple[_DataPieces, dict[str, str]] | None:
        key = (c.tp, c.cp, c.ep, c.dp, c.zero)
        if key not in self._data:
            red = self._reduced(c, c.dp, micro_batch=1, global_batch=c.dp, recompute="none",
                                sequence_parallel=False, tp_comm_overlap=False, cp_comm="p2p",
                                overlap_param_gather=False)
            if red is None:  # a stage that is not whole nodes nor part of one: no data-axis terms (still a bound)
                self._data[key] = None
                return None
            costed, names = red
            prec = costed.precision
            d = _DataPieces()
            for ch in costed.program.chunks:
                for s in ch.fwd + ch.bwd:
                    if s.stream == Stream.GRAD:
                        d.grad_stream_s[s.layer] += s.duration_s
                for s in ch.grad_sync:
                    d.reduce_s[s.layer] += s.duration_s
                for s in ch.post_step:
                    d.post_s[s.layer] += s.duration_s
                for name, (p, g, o) in ch.layer_states.items():
                    d.state_bytes[name] = prec.state_bytes(p, g, o)
                    d.optimizer_params[name] = o
            self._data[key] = (d, names)
        return self._data[key]

    def _chunks(self, c: Candidate) -> list[list[str]]:
        """Reduced-model layer names of each pipeline chunk's layers, in forward order."""
        key = (c.pp, c.vpp)
        if key not in self._assign:
            spec = ParallelSpec(pp=c.pp, vpp=c.vpp)
            chunk_of = chunk_assignment(self.model, c.pp * c.vpp, stage_layers(self.model, spec))
            out: list[list[str]] = [[] for _ in range(c.pp * c.vpp)]
            for la in self.model.layers:
                out[chunk_of[la.name]].append("block" if la.kind == "transformer" else la.name)
            self._assign[key] = out
        return self._assign[key]

    # -- the bounds -----------------------------------------------------------------------------------
    def bounds(self, c: Candidate, refine: bool = False) -> tuple[float, float]:
        """(iteration time lower bound in seconds, peak memory lower bound in bytes per rank); (0, 0)
        when the model's blocks differ (no bound: every configuration is simulated); no time bound (0) with
        a learned compute model. `refine`: replay the
        chain with the configuration's own ZeRO-3 gathers (see `refinable`)."""
        if not self.enabled:
            return 0.0, 0.0
        chain = self._chain_pieces(c, refine)
        if chain is None:
            return 0.0, 0.0
        pieces, names = chain
        data, dnames = self._data_pieces(c) or (_DataPieces(), names)
        chunks = self._chunks(c)
        pp, v, m = c.pp, c.vpp, c.micro_batches
        n = pp * v
        fwd = [0.0] * n
        bwd = [0.0] * n
        wgrad = [0.0] * n
        act = [0.0] * n
        for k, layers in enumerate(chunks):
            red = [names[x] for x in layers]
            fwd[k] = sum(pieces.own["F"][x] for x in red) + sum(pieces.tail["F"][x] for x in red[:-1])
            bwd[k] = sum(pieces.own["B"][x] for x in red) + sum(pieces.tail["B"][x] for x in red[1:])
            wgrad[k] = sum(pieces.wgrad_s[x] for x in red)
            act[k] = sum(pieces.act_bytes[x] for x in red)
        stage_chunks = [[chunk_index(s, vc, pp, c.schedule) for vc in range(v)] for s in range(pp)]
        stage_layers_red = [[dnames[x] for k in stage_chunks[s] for x in chunks[k]] for s in range(pp)]
        dual = c.schedule == "dualpipev"
        tails, occupancy, grad_work, static = [], [], [], []
        for s in range(pp):
            red = stage_layers_red[s]
            opt = optimizer_time(sum(data.optimizer_params[x] for x in red), self.cluster, self._compute)
            first = dnames[chunks[s][0]]  # its bucket is reduced last
            # DualPipeV interleaves its two chunks' last backwards: some bucket of the rank is reduced last
            last = min(data.reduce_s[x] for x in red) if dual else data.reduce_s[first]
            reduce = last if c.overlap_grad_reduce else sum(data.reduce_s[x] for x in red)
            post = 0.0 if c.overlap_param_gather or c.zero == 3 else sum(data.post_s[x] for x in red)
            tails.append(reduce + opt + post)
            occupancy.append(sum(fwd[k] + bwd[k] for k in stage_chunks[s]))
            grad_work.append(m * sum(data.grad_stream_s[x] for x in red) + sum(data.reduce_s[x] for x in red))
            static.append(sum(data.state_bytes[x] for x in red) + workspace_bytes(self.cluster.device))
        after = _after_last_b(c.schedule, pp, m, v) if c.schedule in ZERO_BUBBLE_KINDS else None

        def after_s(s: int) -> float:
            """Seconds of what rank s runs after its last B of virtual chunk 0 (its order's items, `after`)."""
            assert after is not None and after[s] is not None
            total = 0.0
            for ph, vc, n in after[s]:
                k = stage_chunks[s][vc]
                total += n * (fwd[k] if ph == "F" else wgrad[k] if ph == "W" else bwd[k] - wgrad[k])
            return total

        best = 0.0
        for s in range(pp):
            fill = sum(fwd[:s])
            own_end = fill + m * occupancy[s]
            t = own_end + tails[s]
            if after is not None:
                # zero bubble (ZB-H1; DualPipeV's first arm): after this rank's last B of its first chunk it may
                # still owe items (weight gradients); below it the last micro-batch's input gradients go down to
                # rank 0, which runs what its order puts after its own last B, then ends
                if (s > 0 or dual) and after[s] is not None and after[0] is not None:
                    t = max(t, own_end - after_s(s) + sum(bwd[k] - wgrad[k] for k in range(s)) + after_s(0)
                            + tails[0])
            elif s > 0:
                # the last micro-batch's backward still runs down the stages below, then stage 0 ends
                t = max(t, own_end + sum(bwd[:s]) + tails[0])
            best = max(best, t, grad_work[s])
        held = _in_flight(c.schedule if v == 1 or dual else "interleaved", pp, m, v)
        memory = max(static[s] + ACTIVATION_SAFETY * held[s] * min(act[k] for k in stage_chunks[s])
                     for s in range(pp))
        return (best if self.time_bound else 0.0), memory


@lru_cache(maxsize=4096)
def _in_flight(kind: str, pp: int, m: int, v: int) -> tuple[int, ...]:
    """Per pipeline rank, the most chunk forwards whose backward has not started yet at any point of the
    schedule: each holds its saved activations then."""
    out = []
    order_kind = "1f1b" if kind == "zb-h1" else kind  # ZB-H1 keeps 1F1B's in-flight count
    for r in range(pp):
        held = most = 0
        for phase, _, _ in schedule_order(order_kind, pp, m, r, v):
            if phase == "F":
                held += 1
                most = max(most, held)
            elif phase == "B":
                held -= 1
        out.append(most)
    return tuple(out)


@lru_cache(maxsize=4096)
def _after_last_b(kind: str, pp: int, m: int, v: int) -> tuple[tuple[tuple[str, int, int], ...] | None, ...]:
    """Per pipeline rank, the items a zero-bubble schedule (ZB-H1; DualPipeV) runs after the rank's last
    input-gradient B of its virtual chunk 0 (DualPipeV's first arm), as (phase, virtual chunk, count); None where
    that B is not the last micro-batch's (then the bound leaves the drain out)."""
    out: list[tuple[tuple[str, int, int], ...] | None] = []
    for r in range(pp):
        order = schedule_order(kind, pp, m, r, v)
        last_b = max(i for i, (phase, _, vc) in enumerate(order) if phase == "B" and vc == 0)
        if order[last_b][1] != m - 1:
            out.append(None)
            continue
        counts: dict[tuple[str, int], int] = defaultdict(int)
        for phase, _, vc in order[last_b + 1:]:
            counts[(phase, vc)] += 1
        out.append(tuple((ph, vc, n) for (ph, vc), n in sorted(counts.items())))
    return tuple(out)


def _signature(layer: Any) -> tuple:
    return tuple((op.name, op.kind, tuple(sorted(op.dims.items()))) for op in layer.ops)
