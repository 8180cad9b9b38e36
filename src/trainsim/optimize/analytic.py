"""The analytic tier over a batch of strategies: iteration time, throughput, MFU and peak memory of many
configurations of one model, cluster and global batch at once (numpy), for a search to rank with before it
confirms the best with the event simulation.

Two kinds of terms, priced apart so that a search pays for few lowerings:

- Per-layer compute and feature communication (the forward, backward and zero-bubble W of each layer, the
  TP/CP/EP collectives inside them, the pipeline sends, the tied-embedding sum) come from reduced jobs, as in
  optimize.bounds: three blocks on two pipeline stages (embedding + a block | a received block, a block that
  follows a block, the head), so the pieces include a block that receives its input from the previous stage.
  One reduced job per *compute key* (tensor, context and expert degrees, micro-batch, sequence parallelism,
  recompute, TP-communication overlap, CP communication, zero-bubble split), lowered and costed once and cut
  into layers by sim.analytic.replay_layers, the replay the single-configuration tier runs on the whole
  program. Its data-parallel degree is only what places a stage on the nodes as the real one (the sibling
  groups per node that share links), without ZeRO.
- Data-parallel terms are priced per data-parallel degree and ZeRO stage directly from the lowering's and the
  cost layer's own functions (compile.program.layer_sync: the gradient buckets, ZeRO-1/2 post-step all-gather,
  ZeRO-3 gathers and stored states `lower` makes; cost.annotate.group_concurrency + the job's comm model: what
  `annotate` charges for them), one strategy tree per (tp, cp, ep, SP, ZeRO) serving every degree, collectives
  cached per (GPUs, call, bytes, axes, stage). ZeRO-3's per-layer gathers enter the compute pieces in closed
  form: each gather is prefetched while the previous layer runs (a chunk's first layer waits for all of it),
  the compute under it runs slower by gamma, and the gathered weights sit on top of the layer's peak.

A configuration's stages are sums of those pieces (first chunk: embedding + blocks; others: a received block +
blocks; last: + the head), composed for the whole batch with numpy (`_Phases`, the arrays version of
sim.analytic.PhaseCost), and the pipeline depth, micro-batch count, virtual stages, schedule and overlap flags
go into sim.analytic.evaluate as arrays. It agrees with `simulate(..., fidelity="analytic")` up to what the
reduced job cannot see (a wrap-around send of the interleaved schedule, the tied-embedding sum between stages
further apart, the exact overlap of ZeRO-3 gathers): tests/test_analytic.py checks the agreement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..api import comm_model, costed_program, job_cluster, job_tree
from ..compile.graph import split_backward
from ..compile.program import ChunkProgram, Step, layer_sync
from ..config import SimulationSpec, parse_job
from ..cost.annotate import group_concurrency, optimizer_time
from ..cost.comm import CommModel
from ..cost.memory import RUNTIME_RESERVED_BYTES, workspace_bytes
from ..errors import ConfigError
from ..hardware.cluster import Cluster
from ..sim.analytic import (
    CATEGORIES,
    SCHEDULES,
    PhaseCost,
    StageBatch,
    evaluate,
    replay_layers,
    replay_order,
    stack,
)
from ..strategy.mesh import DeviceMesh
from ..strategy.schedules import chunk_index, run_kind
from ..strategy.tree import LeafConfig
from ..workload.ir import Layer, Model
from .space import Candidate

_DP, _COMPUTE, _RECOMPUTE = (CATEGORIES.index(c) for c in ("dp", "compute", "recompute"))
_LEAD = ("embedding", "first", "inner", "recv")  # compute roles of a reduced job before its tail layers
PHASES = ("fwd", "bwd", "w")
_FEW = 8  # batches up to this size are composed per candidate and cached (AnalyticBatch._one)


@dataclass
class BatchEstimate:
    """Per configuration (in the order given): the analytic tier's answers."""

    iteration_s: np.ndarray
    samples_per_s: np.ndarray
    tokens_per_s: np.ndarray  # nan without a sequence
    mfu: np.ndarray
    peak_bytes: np.ndarray  # the worst stage's
    fits: np.ndarray


@dataclass
class _Pieces:
    """A compute key's reduced job cut into layer roles (embedding, first, inner, recv, tail:NAME)."""

    phases: dict[str, dict[str, PhaseCost]]  # phase (fwd, bwd, w) -> role -> per micro-batch
    w_frees: dict[str, bool]  # role -> its last backward step is a weight gradient (zero bubble: freed in W)
    tails: list[str]  # the tail roles, in order
    send_fwd_s: float
    send_bwd_s: float
    embedding_s: float
    model_flops: dict[str, float]  # role -> per micro-batch and rank, forward + backward (no recompute)
    zero_bubble: bool  # the backward split into B and W


@dataclass
class _DpTerms:
    """One data-parallel configuration's per-layer terms by role (embedding, block, tail:NAME)."""

    reduce_s: dict[str, float]  # gradient buckets, per iteration
    post_s: dict[str, float]  # ZeRO-1/2 parameter all-gather after the step
    state_bytes: dict[str, float]  # parameters, gradients and optimizer states stored
    optimizer_params: dict[str, float]  # the optimizer shard the rank steps
    gather_s: dict[str, float]  # ZeRO-3 parameter all-gather before the layer, per micro-batch and phase
    gather_bytes: dict[str, float]  # ... and the gathered weights it holds during the layer


@dataclass
class _Phases:
    """sim.analytic.PhaseCost over a batch: every field an (N,) array, parts (N, len(CATEGORIES))."""

    busy: np.ndarray
    host: np.ndarray
    synced: np.ndarray
    net: np.ndarray
    peak: np.ndarray
    parts: np.ndarray

    @staticmethod
    def zeros(n: int) -> _Phases:
        z = np.zeros(n)
        return _Phases(z, z, z, z, z, np.zeros((n, len(CATEGORIES))))

    def add(self, o: _Phases) -> _Phases:
        """PhaseCost.add, elementwise."""
        return _Phases(self.busy + o.busy, self.host + o.host, np.maximum(self.synced + o.busy, self.host + o.synced),
                       self.net + o.net, np.maximum(self.peak, self.net + o.peak), self.parts + o.parts)

    def scaled(self, k: np.ndarray) -> _Phases:
        """PhaseCost.scaled, elementwise (k <= 0: nothing)."""
        kk = np.maximum(k, 0).astype(float)
        pos = kk > 0
        return _Phases(self.busy * kk, self.host * kk,
                       np.where(pos, self.synced + (kk - 1) * np.maximum(self.busy, self.host), 0.0), self.net * kk,
                       np.where(pos, self.peak + np.maximum(self.net, 0.0) * (kk - 1), 0.0), self.parts * kk[:, None])

    def shifted(self, wait_s: np.ndarray, slow_s: np.ndarray, peak_bytes: np.ndarray,
                net_bytes: np.ndarray) -> _Phases:
        """This phase after a ZeRO-3 gather: `wait_s` more waiting on it (dp), `slow_s` of compute slowed under it,
        its gathered weights on top of the peak (and `net_bytes` still held when the phase ends)."""
        parts = self.parts.copy()
        parts[:, _DP] += wait_s
        parts[:, _COMPUTE] += slow_s
        extra = wait_s + slow_s
        return _Phases(self.busy + extra, self.host, self.synced + extra, self.net + net_bytes,
                       self.peak + peak_bytes, parts)


class _CachedComm:
    """A comm model's `time`, memoised per call: the reduced jobs of one cluster repeat their collectives."""

    def __init__(self, comm: CommModel) -> None:
        self.comm = comm
        self._times: dict[tuple, float] = {}

    def time(self, collective: str, size_bytes: float, group: tuple[int, ...], concurrency: int = 1) -> float:
        key = (collective, size_bytes, group, concurrency)
        t = self._times.get(key)
        if t is None:
            t = self._times[key] = self.comm.time(collective, size_bytes, group, concurrency)
        return t


class AnalyticBatch:
    """The analytic tier for the configurations of one search (one model, cluster, batch and simulation)."""

    def __init__(self, base: dict[str, Any], model: Model, cluster: Cluster) -> None:
        self.base = base
        self.model = model
        self.cluster = cluster
        self.capacity_bytes = cluster.device.hbm_bytes - RUNTIME_RESERVED_BYTES
        self.blocks = sum(1 for la in model.layers if la.kind == "transformer")
        if model.hyper.get("first_dense_layers"):  # the reduced jobs stand one block for all of them
            raise ConfigError("model.first_dense_layers", "the analytic batch takes every transformer block to be "
                              "alike, and this model mixes dense and MoE blocks",
                              "simulate the candidates one by one (trainsim simulate / sweep)")
        self._pieces: dict[tuple, int] = {}  # compute key -> index into _piece_list
        self._piece_list: list[_Pieces] = []
        self._trees: dict[tuple, tuple[Any, dict[str, tuple[Layer, LeafConfig]], list[str]]] = {}
        self._dp: dict[tuple, int] = {}  # data-parallel key -> index into _dp_list
        self._dp_list: list[_DpTerms] = []
        self._comms: dict[int, _CachedComm] = {}  # GPUs of a reduced cluster -> its comm model
        self._prices: dict[tuple, float] = {}
        self._tables: dict[tuple, tuple[int, Any]] = {}  # see _table
        self._composed: dict[Candidate, StageBatch] = {}  # see _one
        self._replays: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}  # see _Compose.replayed
        self._sim: SimulationSpec | None = None
        self._precision = None
        self._compute = None
        self._gamma = 0.0
        self._host_sync = True
        self._peak_flops = 0.0
        self.reduced_jobs = 0  # compute keys lowered and costed
        self.dp_trees = 0  # strategy trees built for the data-parallel terms

    # -- reduced jobs ----------------------------------------------------------------------------------
    def _feature_dp(self, c: Candidate) -> int:
        """The reduced job's data-parallel degree: enough replicas that a stage spans the nodes the real one
        does (up to a whole node: the same sibling TP/CP/EP groups and pipeline pairs share a node's links),
        a multiple of ep."""
        per_node = max(1, self.cluster.gpus_per_node // (c.tp * c.cp))
        return c.ep * max(1, min(c.dp, per_node) // c.ep)

    def _pp(self) -> int:
        """Stages of a reduced job: two (the pieces include a received block) when the model has blocks."""
        return 2 if self.blocks >= 3 else 1

    def _job(self, c: Candidate, *, dp: int, pp: int, zero: int, micro_batch: int, recompute: str,
             zb: bool) -> dict[str, Any]:
        """A reduced job: two stages of embedding + one block | two blocks + the head (one stage: two blocks)."""
        job = {k: dict(v) for k, v in self.base.items()}
        job["model"]["layers"] = 3 if pp == 2 else 2
        gpn = self.cluster.gpus_per_node
        world = c.tp * c.cp * dp * pp
        job["cluster"] = {**job.get("cluster", {}), "nodes": max(1, world // gpn)}
        if world < gpn:
            job["cluster"]["gpus_per_node"] = world
        job["strategy"] = {"tp": c.tp, "cp": c.cp, "ep": c.ep, "dp": dp, "pp": pp, "vpp": 1,
                           "sequence_parallel": c.sequence_parallel, "micro_batch": micro_batch,
                           "global_batch": micro_batch * dp, "recompute": recompute, "zero": zero,
                           "tp_comm_overlap": c.tp_comm_overlap, "cp_comm": c.cp_comm,
                           "schedule": "zb-h1" if zb else "1f1b"}
        if pp == 2:
            job["strategy"]["first_stage_layers"] = 1
        return job

    def _key(self, c: Candidate) -> tuple:
        """What changes the per-layer compute and feature-collective costs (not dp beyond placement, nor ZeRO)."""
        return (c.tp, c.cp, c.ep, self._feature_dp(c), c.micro_batch, c.sequence_parallel, c.recompute,
                c.tp_comm_overlap, c.cp_comm, c.schedule == "dualpipev" or c.schedule == "zb-h1" and c.vpp == 1)

    def _piece_index(self, c: Candidate) -> int:
        key = self._key(c)
        i = self._pieces.get(key)
        if i is None:
            i = self._pieces[key] = len(self._piece_list)
            self._piece_list.append(self._cost_pieces(c, key[-1]))
        return i

    def pieces(self, c: Candidate) -> _Pieces:
        """The reduced job of `c`'s compute key, lowered, costed and cut into layer roles (cached per key)."""
        return self._piece_list[self._piece_index(c)]

    def _cost_pieces(self, c: Candidate, zb: bool) -> _Pieces:
        pp = self._pp()
        jc = parse_job(self._job(c, dp=self._feature_dp(c), pp=pp, zero=0, micro_batch=c.micro_batch,
                                 recompute=c.recompute, zb=zb))
        cl, _, tree = job_tree(jc)
        costed = costed_program(tree, cl, jc.simulation, flows=False, comm=self._comm(cl.world_size, jc.simulation))
        self.reduced_jobs += 1
        self._sim, self._precision, self._compute = jc.simulation, costed.precision, costed.compute
        self._gamma, self._host_sync, self._peak_flops = costed.gamma, costed.p2p_host_sync, costed.peak_flops
        program = costed.program
        out = _Pieces({ph: {} for ph in PHASES}, {}, [], 0.0, 0.0, program.embedding_sync_s, {}, zb)
        kinds = {la.name: la.kind for la in tree.model.layers}
        for ch in program.chunks:
            roles = _roles(ch, kinds)
            for phase, layers in (("fwd", replay_layers(ch.fwd, costed.gamma)), *_backward(ch, zb, costed.gamma)):
                for name, pc in layers.items():
                    out.phases[phase][roles[name]] = pc
            last_bwd: dict[str, Step] = {s.layer: s for s in ch.bwd}
            out.w_frees.update({roles[x]: zb and s.phase == "wgrad" for x, s in last_bwd.items()})
            out.tails += [roles[x] for x in ch.layers if roles[x].startswith("tail:")]
            per_layer: dict[str, float] = {}
            for s in (*ch.fwd, *ch.bwd):
                per_layer[s.layer] = per_layer.get(s.layer, 0.0) + s.model_flops
            out.model_flops.update({roles[x]: f for x, f in per_layer.items()})  # one layer per role
            out.send_fwd_s = max(out.send_fwd_s, ch.send_fwd_s)
            out.send_bwd_s = max(out.send_bwd_s, ch.send_bwd_s)
        return out

    # -- data-parallel terms ---------------------------------------------------------------------------
    def _tree(self, c: Candidate) -> tuple[Any, dict[str, tuple[Layer, LeafConfig]], list[str]]:
        """A reduced job's strategy tree for (tp, cp, ep, SP, ZeRO), its layers and leaves, and its layer names
        (embedding, one block, the tail) by role; the leaf configs name mesh axes, so it serves every dp."""
        key = (c.tp, c.cp, c.ep, c.sequence_parallel, c.zero)
        if key not in self._trees:
            jc = parse_job(self._job(c, dp=c.dp, pp=self._pp(), zero=c.zero, micro_batch=1, recompute="none",
                                     zb=False))
            _, _, tree = job_tree(jc)
            tree.resolve()
            self.dp_trees += 1
            leaves = {node.layer.name: (node.layer, node.leaf) for node, _, _ in tree.leaves()}
            self._trees[key] = (tree, leaves, list(leaves))
        return self._trees[key]

    def _comm(self, world: int, sim: SimulationSpec) -> _CachedComm:
        """The comm model of a reduced job's cluster of `world` GPUs (as `_job` sizes it), shared by its jobs."""
        if world not in self._comms:
            gpn = self.cluster.gpus_per_node
            cluster = {**self.base.get("cluster", {}), "nodes": max(1, world // gpn)}
            if world < gpn:
                cluster["gpus_per_node"] = world
            self._comms[world] = _CachedComm(comm_model(job_cluster({**self.base, "cluster": cluster, "strategy": {}}),
                                                        sim))
        return self._comms[world]

    def _price(self, mesh: DeviceMesh, step: Step, stage: int) -> float:
        """What cost.annotate charges for a collective step of a program on `mesh` at pipeline rank `stage`."""
        world = mesh.world_size
        key = (world, mesh.tp, mesh.cp, mesh.ep, mesh.dp, step.collective, step.size_bytes, step.axes, stage)
        if key not in self._prices:
            assert self._sim is not None
            gpn = min(self.cluster.gpus_per_node, world)
            group, conc = group_concurrency(mesh, step.axes, mesh.rank({"pp": stage}), gpn,
                                            self._sim.bandwidth_sharing and not self._sim.exact)
            self._prices[key] = self._comm(world, self._sim).time(step.collective, step.size_bytes, group, conc)
        return self._prices[key]

    def _dp_index(self, c: Candidate) -> int:
        pp = 1 if c.pp == 1 else self._pp()
        key = (c.tp, c.cp, c.ep, c.sequence_parallel, c.zero, c.dp, pp, c.schedule == "dualpipev")
        i = self._dp.get(key)
        if i is None:
            i = self._dp[key] = len(self._dp_list)
            self._dp_list.append(self.dp_terms(c))
        return i

    def dp_terms(self, c: Candidate) -> _DpTerms:
        """`c`'s data-parallel terms by role, priced on the reduced job's mesh with `c`'s data-parallel degree
        (its stages: one without a pipeline, else two): what that reduced job's lowering and annotation give.
        DualPipeV places the head on the embedding's rank: a tied embedding is one stored weight there, its
        gradient summed locally, as without a pipeline."""
        self._piece_index(c)  # the simulation settings and precision come with the first reduced job
        pp = 1 if c.pp == 1 else self._pp()
        dual = c.schedule == "dualpipev"
        tree, leaves, names = self._tree(c)
        mesh = DeviceMesh(tp=c.tp, cp=c.cp, ep=c.ep, dp=c.dp // c.ep, pp=pp)
        prec = self._precision
        assert prec is not None
        out = _DpTerms({}, {}, {}, {}, {}, {})
        blocks = [x for x in names if leaves[x][0].kind == "transformer"]
        for name in names:
            layer, leaf = leaves[name]
            if layer.kind == "transformer" and name != blocks[0]:
                continue  # every block alike: the first stands for them
            role = _dp_role(layer)
            stage = pp - 1 if role.startswith("tail:") and not dual else 0
            ls = layer_sync(tree, prec, layer, leaf, (pp == 1 or dual) and layer.tied_to in leaves, mesh)
            out.reduce_s[role] = sum(self._price(mesh, s, stage) for s in ls.grad_sync)
            out.post_s[role] = sum(self._price(mesh, s, stage) for s in ls.post_step)
            p, g, o = ls.states
            out.state_bytes[role] = prec.state_bytes(p, g, o, ls.param_bytes_adjust, ls.optimizer_bytes_adjust)
            out.optimizer_params[role] = o
            gather = Step("", "collective", 0, "dp", collective="all_gather", axes=ls.gather_axes,
                          size_bytes=ls.gather_bytes)
            out.gather_s[role] = self._price(mesh, gather, stage) if ls.gather_bytes > 0 else 0.0
            out.gather_bytes[role] = ls.gather_bytes
        return out

    # -- tables over the keys costed so far (rebuilt when a key is added) -----------------------------------
    def _table(self, key: tuple, size: int, build: Any) -> Any:
        hit = self._tables.get(key)
        if hit is None or hit[0] != size:
            hit = self._tables[key] = (size, build())
        return hit[1]

    def role_table(self, phase: str, role: str) -> _Phases:
        """A role's phase per compute key, (K,) arrays."""
        def build() -> _Phases:
            rows = [pc.phases[phase].get(role, PhaseCost()) for pc in self._piece_list]
            parts = np.array([[r.parts.get(cat, 0.0) for cat in CATEGORIES] for r in rows])
            return _Phases(*(np.array([getattr(r, f) for r in rows])
                             for f in ("busy_s", "host_s", "synced_s", "net_bytes", "peak_bytes")), parts)
        return self._table(("role", phase, role), len(self._piece_list), build)

    def w_free_table(self, role: str) -> np.ndarray:
        return self._table(("w_free", role), len(self._piece_list),
                           lambda: np.array([pc.w_frees.get(role, False) for pc in self._piece_list]))

    def dp_table(self, table: str, role: str) -> np.ndarray:
        """A data-parallel term (a _DpTerms field) of a role (embedding, block, tail:NAME) per dp key, (D,)."""
        return self._table(("dp", table, role), len(self._dp_list),
                           lambda: np.array([getattr(t, table).get(role, 0.0) for t in self._dp_list]))

    # -- the batch -----------------------------------------------------------------------------------
    def _indices(self, candidates: list[Candidate]) -> tuple[np.ndarray, np.ndarray]:
        """Per candidate, its compute key's and data-parallel terms' indices (costing what is new)."""
        return (np.array([self._piece_index(c) for c in candidates]),
                np.array([self._dp_index(c) for c in candidates]))

    def stage_batch(self, candidates: list[Candidate]) -> StageBatch:
        """The candidates as one StageBatch, composed with numpy (no Python loop over candidates or stages
        beyond finding each one's keys)."""
        kid, did = self._indices(candidates)
        return _Compose(self, candidates, kid, did).batch()

    def _one(self, c: Candidate, kid: int, did: int) -> StageBatch:
        """One candidate's StageBatch, composed once (its pieces never change)."""
        if c not in self._composed:
            self._composed[c] = _Compose(self, [c], np.array([kid]), np.array([did])).batch()
        return self._composed[c]

    def _flops_per_sample(self, kid: np.ndarray, candidates: list[Candidate]) -> np.ndarray:
        """Model FLOPs of one sample through the whole model (a stage's ranks hold 1 / (tp cp) of each layer)."""
        per_key = np.array([pc.model_flops.get("embedding", 0.0) + self.blocks * pc.model_flops.get("inner", 0.0)
                            + sum(pc.model_flops.get(x, 0.0) for x in pc.tails) for pc in self._piece_list])
        scale = np.array([c.tp * c.cp / c.micro_batch for c in candidates], dtype=float)
        return per_key[kid] * scale

    def evaluate(self, candidates: list[Candidate]) -> BatchEstimate:
        """The analytic tier's answers for `candidates` (all of this model, cluster and global batch). Evaluated
        per pipeline depth: a batch's arrays are as wide as its deepest pipeline."""
        n = len(candidates)
        kid, did = self._indices(candidates)
        pp = np.array([c.pp for c in candidates])
        iteration, peak = np.zeros(n), np.zeros(n)
        if n <= _FEW:  # a few: their composed stages cached one by one (composing is per batch, not per row)
            few = [self._one(c, int(k), int(d)) for c, k, d in zip(candidates, kid, did, strict=True)]
            est = evaluate(few[0] if n == 1 else stack(few))
            iteration[:], peak[:] = est.iteration_s, est.peak_bytes.max(axis=1)
        for depth in sorted(set(pp.tolist())) if n > _FEW else ():  # (np.unique imports numpy.ma: cold-call cost)
            rows = np.flatnonzero(pp == depth)
            group = [candidates[i] for i in rows]
            est = evaluate(_Compose(self, group, kid[rows], did[rows]).batch())
            iteration[rows] = est.iteration_s
            peak[rows] = est.peak_bytes.max(axis=1)
        gb = np.array([c.global_batch for c in candidates], dtype=float)
        world = np.array([c.tp * c.pp * c.cp * c.dp for c in candidates], dtype=float)
        model_flops = self._flops_per_sample(kid, candidates) * gb
        samples = gb / iteration
        seq = self.model.seq_len
        tokens = samples * seq if seq else np.full(n, np.nan)
        mfu = model_flops / iteration / world / self._peak_flops
        return BatchEstimate(iteration, samples, tokens, mfu, peak, peak <= self.capacity_bytes)


KINDS = ("first", "mid", "last", "both")


def _kind_code(g: np.ndarray, total: np.ndarray) -> np.ndarray:
    """Index into KINDS of the model's chunk `g` of `total`: first, last, both (the only one), else mid."""
    return np.where(total == 1, 3, np.where(g == 0, 0, np.where(g == total - 1, 2, 1)))


class _Compose:
    """One batch's stages from the role tables: chunks of each kind (first: embedding + blocks; mid: a received
    block + blocks; last: mid + the tail; both: the whole model), then stages of chunks."""

    def __init__(self, ab: AnalyticBatch, candidates: list[Candidate], kid: np.ndarray, did: np.ndarray) -> None:
        self.ab = ab
        self.candidates = candidates
        self.n = len(candidates)
        self.kid, self.did = kid, did
        self.pp = np.array([c.pp for c in candidates])
        self.vpp = np.array([c.vpp for c in candidates])
        self.dual = np.array([c.schedule == "dualpipev" for c in candidates])  # the V: rank r runs r and 2 pp - 1 - r
        chunks = self.pp * self.vpp
        if np.any(ab.blocks % chunks):
            bad = candidates[int(np.argmax(ab.blocks % chunks != 0))]
            raise ValueError(f"{ab.blocks} blocks do not split evenly over {bad.pp * bad.vpp} chunks")
        self.k = ab.blocks // chunks  # blocks per chunk
        self.tails = ab._piece_list[0].tails
        self.zb = np.array([pc.zero_bubble for pc in ab._piece_list])[kid]
        self.gamma = ab._gamma
        self._tables: dict[tuple, Any] = {}
        self.unit = np.ones(self.n, dtype=np.int64)
        self.gathers = any(bool((self.dp("gather_bytes", r) > 0).any()) for r in ("embedding", "first", *self.tails))

    # role tables gathered per candidate (cached per role)
    def piece(self, phase: str, role: str) -> _Phases:
        key = ("piece", phase, role)
        if key not in self._tables:
            t = self.ab.role_table(phase, role)
            self._tables[key] = _Phases(*(getattr(t, f)[self.kid] for f in ("busy", "host", "synced", "net", "peak",
                                                                          "parts")))
        return self._tables[key]

    def dp(self, table: str, role: str) -> np.ndarray:
        """A data-parallel term of a role per candidate (the block roles share the block's)."""
        key = ("dp", table, role)
        if key not in self._tables:
            self._tables[key] = self.ab.dp_table(table, "block" if role in _LEAD[1:] else role)[self.did]
        return self._tables[key]

    def w_free(self, role: str) -> np.ndarray:
        key = ("w_free", role)
        if key not in self._tables:
            self._tables[key] = self.ab.w_free_table(role)[self.kid]
        return self._tables[key]

    # chunks
    def segments(self, kind: str) -> list[tuple[str, np.ndarray]]:
        """A chunk's layers in forward order as (role, count) runs (`self.unit`: one layer for every candidate)."""
        one = self.unit
        lead = [("embedding", one), ("first", one)] if kind in ("first", "both") else [("recv", one)]
        tail = [(t, one) for t in self.tails] if kind in ("last", "both") else []
        return [*lead, ("inner", self.k - 1), *tail]

    def chain(self, segs: list[tuple[str, np.ndarray]], phase: str) -> tuple[_Phases, np.ndarray]:
        """The runs one after the other as one phase (and the busy time of the first layer it runs). A layer with
        a ZeRO-3 gather waits for what of it the previous layer did not hide (the chunk's first layer for all
        of it) and runs its compute slower by gamma under it; W (zero bubble) has no gathers but frees the
        gathered weights a layer's last weight gradient held."""
        zero = np.zeros(self.n)
        acc = _Phases.zeros(self.n)
        prev, first = zero, zero
        started = np.zeros(self.n, dtype=bool)
        for role, count in segs:
            base = self.piece(phase, role)
            one = rest = base
            if self.gathers:
                g_s, g_b = self.dp("gather_s", role), self.dp("gather_bytes", role)
                held = np.where(self.zb & self.w_free(role), g_b, 0.0)
                if phase == "w":
                    one = rest = base.shifted(zero, zero, zero, -held)
                else:
                    slow = self.gamma * np.minimum(g_s, base.parts[:, _COMPUTE] + base.parts[:, _RECOMPUTE])
                    net = held if phase == "bwd" else zero
                    one = base.shifted(np.maximum(g_s - prev, 0.0), slow, g_b, net)
                    rest = base.shifted(np.maximum(g_s - base.busy, 0.0), slow, g_b, net)
            if count is self.unit:  # one layer each: no repeats to scale
                acc = acc.add(one)
                first = np.where(started, first, one.busy)
                started = self.unit > 0
                prev = base.busy
                continue
            has = count >= 1
            acc = acc.add(one.scaled(has.astype(np.int64))).add(rest.scaled(count - 1))
            first = np.where(~started & has, one.busy, first)
            started = started | has
            prev = np.where(has, base.busy, prev)
        return acc, first

    def chunk(self, kind: str) -> dict[str, Any]:
        """One chunk kind's phases, its last layer's backward, and its data-parallel sums."""
        segs = self.segments(kind)
        fwd, _ = self.chain(segs, "fwd")
        bwd, last_bwd = self.chain(segs[::-1], "bwd")
        w = self.chain(segs[::-1], "w")[0] if self.zb.any() else _Phases.zeros(self.n)
        out: dict[str, Any] = {"fwd": fwd, "bwd": bwd, "w": w, "last_bwd": last_bwd,
                               "first_reduce": self.dp("reduce_s", segs[0][0])}
        for table in ("reduce_s", "post_s", "state_bytes", "optimizer_params"):
            out[table] = sum(self.dp(table, role) * count for role, count in segs)
        return out

    def no_chunk(self) -> dict[str, Any]:
        """A chunk kind no candidate of the batch has (zeros, counted zero times)."""
        z = np.zeros(self.n)
        empty = _Phases.zeros(self.n)
        return {"fwd": empty, "bwd": empty, "w": empty, "last_bwd": z, "first_reduce": z, "reduce_s": z,
                "post_s": z, "state_bytes": z, "optimizer_params": z}

    @staticmethod
    def model_chunk(vc: np.ndarray, rank: np.ndarray, p: np.ndarray, dual: np.ndarray) -> np.ndarray:
        """The model's chunk a rank runs as virtual chunk vc (strategy.schedules.chunk_index, broadcast)."""
        return np.where(dual & (vc == 1), 2 * p - 1 - rank, vc * p + rank)

    # stages
    def stage_rows(self, ch: dict[str, dict[str, Any]]) -> dict[str, dict[str, np.ndarray]]:
        """Per stage type (s0: the first stage, sm: a middle one, sl: the last) and candidate: the sums and
        maxima over the stage's v chunks (chunk vc of stage r is the model's chunk vc p + r)."""
        n, p, v = self.n, self.pp, self.vpp
        vc = np.arange(int(v.max()))[None, :]
        valid = vc < v[:, None]
        rows: dict[str, dict[str, np.ndarray]] = {}
        for st, r in (("s0", 0 * p), ("sm", 1 + 0 * p), ("sl", p - 1)):
            code = _kind_code(self.model_chunk(vc, r[:, None], p[:, None], self.dual[:, None]), (p * v)[:, None])
            cnt = {kd: ((code == i) & valid).sum(axis=1) for i, kd in enumerate(KINDS)}
            present = {kd: c > 0 for kd, c in cnt.items()}
            row: dict[str, np.ndarray] = {}
            for ph in PHASES:
                for f, suffix in (("busy", ""), ("host", "_host"), ("synced", "_sync")):
                    row[f"{ph}{suffix}_s"] = sum(cnt[kd] * getattr(ch[kd][ph], f) for kd in KINDS)
            row["parts_s"] = sum(cnt[kd][:, None] * (ch[kd]["fwd"].parts + ch[kd]["bwd"].parts + ch[kd]["w"].parts)
                                 for kd in KINDS)
            for t in ("reduce_s", "post_s", "state_bytes", "optimizer_params"):
                row[t] = sum(cnt[kd] * ch[kd][t] for kd in KINDS)
            row["fwd_peak"] = _max_of(present, {kd: ch[kd]["fwd"].peak for kd in KINDS})
            row["bwd_peak"] = _max_of(present, {kd: ch[kd]["fwd"].net + ch[kd]["bwd"].peak for kd in KINDS})
            row["w_held"] = np.where(self.zb, _max_of(present, {kd: ch[kd]["fwd"].net + ch[kd]["bwd"].net
                                                              for kd in KINDS}), 0.0)
            last_code = np.take_along_axis(code, (v - 1)[:, None], axis=1)[:, 0]
            row["first_reduce_s"] = _by_kind(code[:, 0], ch, "first_reduce")
            row["last_layer_bwd_s"] = _by_kind(last_code, ch, "last_bwd")
            rows[st] = row
        assert all(x["fwd_s"].shape == (n,) for x in rows.values())
        return rows

    def batch(self) -> StageBatch:
        n, p, v = self.n, self.pp, self.vpp
        total = p * v
        used = {"both": bool((total == 1).any()), "first": bool((total > 1).any()), "last": bool((total > 1).any()),
                "mid": bool((total > 2).any())}
        ch = {kind: self.chunk(kind) if used[kind] else self.no_chunk() for kind in KINDS}
        rows = self.stage_rows(ch)
        p_max, v_max = int(p.max()), int(v.max())
        stage = np.arange(p_max)[None, :]
        pc = p[:, None]
        mask = stage < pc
        which = np.where(stage == 0, 0, np.where(stage == pc - 1, 2, 1))  # the stage type of each stage

        at = np.arange(n)[:, None]

        def spread(key: str) -> np.ndarray:
            vals = np.stack([rows[st][key] for st in ("s0", "sm", "sl")], axis=1)
            return np.where(mask, vals[at, which], 0.0)

        out = {f"{ph}{x}_s": spread(f"{ph}{x}_s") for ph in PHASES for x in ("", "_host", "_sync")}
        parts = np.stack([rows[st]["parts_s"] for st in ("s0", "sm", "sl")], axis=1)  # (N, 3, C)
        out["parts_s"] = np.where(mask[:, :, None], parts[at, which], 0.0)
        pieces = self.ab._piece_list
        send_f, send_b, emb = (np.array([getattr(x, f) for x in pieces])[self.kid][:, None]
                               for f in ("send_fwd_s", "send_bwd_s", "embedding_s"))
        multi = mask & (pc > 1)
        vv = v[:, None].astype(float)
        dual = self.dual[:, None]
        # DualPipeV: the V's bottom hands over on rank pp - 1 without a send, its ends (chunk 0 and 2 pp - 1) sit on
        # rank 0, which also sums the tied embedding's gradient with itself
        out["send_fwd_s"] = np.where(multi, send_f * (vv - (stage == pc - 1) - (dual & (stage == 0))), 0.0)
        out["send_bwd_s"] = np.where(multi, send_b * (vv - (stage == 0) - (dual & (stage == pc - 1))), 0.0)
        out["embedding_s"] = np.where(multi & ~dual & ((stage == 0) | (stage == pc - 1)), emb, 0.0)
        for key in ("reduce_s", "first_reduce_s", "last_layer_bwd_s", "post_s"):
            out[key] = spread(key)
        assert self.ab._compute is not None
        out["optimizer_s"] = np.where(mask, optimizer_time(spread("optimizer_params"), self.ab.cluster,
                                                           self.ab._compute), 0.0)
        # the GEMM workspaces every rank holds (cost.memory.static_memory adds them to the event simulation's too)
        out["static_bytes"] = spread("state_bytes") + np.where(mask, workspace_bytes(self.ab.cluster.device), 0.0)
        out["fwd_peak_bytes"] = spread("fwd_peak")
        out["bwd_peak_bytes"] = spread("bwd_peak")
        out["w_held_bytes"] = spread("w_held")
        # activations a stage's forward keeps, per virtual chunk (vc p + r of the model)
        vc = np.arange(v_max)[None, None, :]
        code = _kind_code(self.model_chunk(vc, stage[:, :, None], pc[:, :, None], dual[:, :, None]),
                          (p * v)[:, None, None])  # (N, P, V)
        nets = np.stack([ch[kd]["fwd"].net for kd in KINDS], axis=1)  # (N, 4)
        act = nets[np.arange(n)[:, None, None], code]
        out["act_bytes"] = np.where(mask[:, :, None] & (vc < v[:, None, None]), act, 0.0)
        cands = self.candidates
        if self.dual.any():
            out["pipeline_end_s"], out["held_chunks"] = self.replayed(ch, send_f[:, 0], send_b[:, 0], p_max, v_max)
        return StageBatch(
            pp=p, vpp=v, micro_batches=np.array([c.micro_batches for c in cands]),
            schedule=np.array([SCHEDULES.index(run_kind(c.schedule, c.vpp)) for c in cands]),
            max_ongoing=np.zeros(n, dtype=np.int64),
            overlap_grad_reduce=np.array([c.overlap_grad_reduce for c in cands]),
            overlap_param_gather=np.array([c.overlap_param_gather for c in cands]),
            host_sync=np.full(n, self.ab._host_sync), gamma=np.full(n, self.gamma), **out)

    def replayed(self, ch: dict[str, dict[str, Any]], send_f: np.ndarray, send_b: np.ndarray, p_max: int,
                 v_max: int) -> tuple[np.ndarray, np.ndarray]:
        """The DualPipeV candidates' orders replayed (sim.analytic.replay_order, as the single-configuration
        tier does on its own chunks): per stage the end of its last backward-side item and the chunk forwards
        it holds at its activation peak; zeros for the other candidates. A Python loop over those candidates,
        each O(pp x micro-batches), once per distinct replay (AnalyticBatch._replays)."""
        ends, held = np.zeros((self.n, p_max)), np.zeros((self.n, p_max, v_max))
        sync = self.ab._host_sync
        for i in np.flatnonzero(self.dual):
            p, m = int(self.pp[i]), self.candidates[i].micro_batches
            # the chunks' phases follow from the compute key and the depth (and the data-parallel terms where
            # ZeRO-3 gathers shift them): candidates apart only in other data-parallel knobs replay alike
            key = (int(self.kid[i]), int(self.did[i]) if self.gathers else -1, p, m, sync)
            if key in self.ab._replays:
                ends[i, :p], held[i, :p, :2] = self.ab._replays[key]
                continue
            chunks = []
            for r in range(p):
                for vc in range(2):
                    g = chunk_index(r, vc, p, "dualpipev")
                    kind = KINDS[int(_kind_code(np.array(g), np.array(2 * p)))]
                    f, b, w = (max(float(ch[kind][ph].busy[i]), float(ch[kind][ph].host[i])) for ph in PHASES)
                    sf = 0.0 if g in (p - 1, 2 * p - 1) else float(send_f[i])
                    sb = 0.0 if g in (0, p) else float(send_b[i])
                    chunks.append((r, vc, f, b, w, sf, sb))
            self.ab._replays[key] = replay_order("dualpipev", p, m, 2, chunks, sync)
            ends[i, :p], held[i, :p, :2] = self.ab._replays[key]
        return ends, held


def _max_of(present: dict[str, np.ndarray], values: dict[str, np.ndarray]) -> np.ndarray:
    """Per candidate, the largest value among the chunk kinds its stage holds (0 if none)."""
    out = np.full(len(next(iter(values.values()))), -np.inf)
    for kd, val in values.items():
        out = np.maximum(out, np.where(present[kd], val, -np.inf))
    return np.where(np.isfinite(out), out, 0.0)


def _by_kind(code: np.ndarray, ch: dict[str, dict[str, Any]], field: str) -> np.ndarray:
    """Per candidate, `field` of the chunk kind `code` indexes (KINDS)."""
    return np.take_along_axis(np.stack([ch[kd][field] for kd in KINDS], axis=1), code[:, None], axis=1)[:, 0]


def _backward(ch: ChunkProgram, zb: bool, gamma: float) -> list[tuple[str, dict[str, PhaseCost]]]:
    if not zb:
        return [("bwd", replay_layers(ch.bwd, gamma))]
    b_half, w_half = split_backward(ch.bwd)
    return [("bwd", replay_layers(b_half, gamma)), ("w", replay_layers(w_half, gamma))]


def _dp_role(layer: Layer) -> str:
    return {"embedding": "embedding", "transformer": "block"}.get(layer.kind, f"tail:{layer.name}")


def _roles(ch: ChunkProgram, kinds: dict[str, str]) -> dict[str, str]:
    """Each layer of a reduced chunk by its role: embedding, first (the block after the embedding), inner (a
    block after a block), recv (the block a chunk starts with, its input received), tail:NAME (what follows
    the blocks)."""
    out: dict[str, str] = {}
    for i, name in enumerate(ch.layers):
        kind = kinds[name]
        if kind == "embedding":
            out[name] = "embedding"
        elif kind == "transformer":
            prev = kinds[ch.layers[i - 1]] if i > 0 else None
            out[name] = "recv" if prev is None else "first" if prev == "embedding" else "inner"
        else:
            out[name] = f"tail:{name}"
    return out
