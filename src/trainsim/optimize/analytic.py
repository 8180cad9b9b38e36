"""The analytic tier over a batch of strategies: iteration time, throughput, MFU and peak memory of many
configurations of one model, cluster and global batch at once (numpy), for a search to rank with before it
confirms the best with the event simulation.

The per-layer pieces come from reduced jobs, as in optimize.bounds: one block per pipeline stage (two stages,
so the pieces include a block that receives its input from the previous stage, the pipeline sends and the
tied-embedding sum; one stage for configurations without a pipeline), with the configuration's tensor,
context, expert and data degrees, micro-batch, sequence parallelism, recompute, ZeRO stage and dtype. Each
distinct key is lowered and costed once and cut into layers by sim.analytic.replay_layers, the same replay
the single-configuration tier runs on the whole program. A configuration's stages are then sums of those
pieces (first stage: embedding + blocks; others: a received block + blocks; last: + the head), and the
pipeline depth, micro-batch count, virtual stages, schedule and overlap flags go into sim.analytic.evaluate
as arrays. It agrees with `simulate(..., fidelity="analytic")` up to what the reduced job cannot see (a
wrap-around send of the interleaved schedule, the tied-embedding sum between stages further apart):
tests/test_analytic.py checks the agreement.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..api import costed_program, job_tree
from ..compile.graph import split_backward
from ..compile.program import ChunkProgram
from ..config import parse_job
from ..cost.annotate import optimizer_time
from ..cost.memory import RUNTIME_RESERVED_BYTES
from ..hardware.cluster import Cluster
from ..sim.analytic import CATEGORIES, SCHEDULES, PhaseCost, StageBatch, combine, evaluate, replay_layers
from ..workload.ir import Model
from .space import Candidate


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
class _Chunk:
    """One chunk type's phases per micro-batch and per-iteration terms (see `_chunk`)."""

    fwd: PhaseCost
    bwd: PhaseCost
    w: PhaseCost
    reduce_s: float
    first_reduce_s: float
    last_bwd_s: float
    post_s: float
    state_bytes: float
    optimizer_params: float


@dataclass
class _Pieces:
    """Per layer role of a reduced job: phases, buckets and states; sends and the embedding sum."""

    fwd: dict[str, PhaseCost]
    bwd: dict[str, PhaseCost]
    w: dict[str, PhaseCost]
    reduce_s: dict[str, float]
    post_s: dict[str, float]
    state_bytes: dict[str, float]
    optimizer_params: dict[str, float]
    head: list[str]  # the layers after the blocks (head, loss), in order
    send_fwd_s: float
    send_bwd_s: float
    embedding_s: float
    model_flops: dict[str, float]  # per micro-batch and rank, forward + backward (no recompute)


class AnalyticBatch:
    """The analytic tier for the configurations of one search (one model, cluster, batch and simulation)."""

    def __init__(self, base: dict[str, Any], model: Model, cluster: Cluster) -> None:
        self.base = base
        self.model = model
        self.cluster = cluster
        self.capacity_bytes = cluster.device.hbm_bytes - RUNTIME_RESERVED_BYTES
        self.blocks = sum(1 for la in model.layers if la.kind == "transformer")
        self._pieces: dict[tuple, _Pieces] = {}
        self._rows: dict[tuple, dict[str, Any]] = {}
        self._flops: dict[tuple, tuple[float, float]] = {}
        self._compute = None
        self._gamma = 0.0
        self._host_sync = True
        self._peak_flops = 0.0
        self.reduced_jobs = 0

    # -- pieces --------------------------------------------------------------------------------------
    def _key(self, c: Candidate) -> tuple:
        return (c.tp, c.cp, c.ep, c.dp, c.micro_batch, c.sequence_parallel, c.recompute, c.zero, c.tp_comm_overlap,
                c.cp_comm, c.schedule == "zb-h1" and c.vpp == 1, min(c.pp, 2))

    def pieces(self, c: Candidate) -> _Pieces:
        """The reduced job of `c`'s key, lowered, costed and cut into layer roles (cached per key)."""
        key = self._key(c)
        if key in self._pieces:
            return self._pieces[key]
        pp = key[-1]
        zb = key[-2]
        job = {k: dict(v) for k, v in self.base.items()}
        job["model"]["layers"] = 2 * pp  # two blocks a stage: the second one follows a block (ZeRO-3 prefetch)
        gpn = self.cluster.gpus_per_node
        world = c.tp * c.cp * c.dp * pp
        job["cluster"] = {**job.get("cluster", {}), "nodes": max(1, world // gpn)}
        if world < gpn:
            job["cluster"]["gpus_per_node"] = world
        job["strategy"] = {"tp": c.tp, "cp": c.cp, "ep": c.ep, "dp": c.dp, "pp": pp, "vpp": 1,
                           "sequence_parallel": c.sequence_parallel, "micro_batch": c.micro_batch,
                           "global_batch": c.micro_batch * c.dp, "recompute": c.recompute, "zero": c.zero,
                           "tp_comm_overlap": c.tp_comm_overlap, "cp_comm": c.cp_comm,
                           "schedule": "zb-h1" if zb else "1f1b"}
        jc = parse_job(job)
        cl, _, tree = job_tree(jc)
        costed = costed_program(tree, cl, jc.simulation)
        self.reduced_jobs += 1
        self._compute = costed.compute
        self._gamma, self._host_sync, self._peak_flops = costed.gamma, costed.p2p_host_sync, costed.peak_flops
        program = costed.program
        prec = costed.precision
        out = _Pieces({}, {}, {}, {}, {}, {}, {}, [], 0.0, 0.0, program.embedding_sync_s, {})
        kinds = {la.name: la.kind for la in tree.model.layers}
        for ch in program.chunks:
            roles = _roles(ch, kinds, pp)
            for phase, layers in (("fwd", replay_layers(ch.fwd, costed.gamma)), *self._backward(ch, zb, costed.gamma)):
                for name, pc in layers.items():
                    getattr(out, phase)[roles[name]] = pc
            for s in ch.grad_sync:
                out.reduce_s[roles[s.layer]] = out.reduce_s.get(roles[s.layer], 0.0) + s.duration_s
            for s in ch.post_step:
                out.post_s[roles[s.layer]] = out.post_s.get(roles[s.layer], 0.0) + s.duration_s
            for name, (p, g, o) in ch.layer_states.items():
                out.state_bytes[roles[name]] = p * prec.param_bytes + g * prec.grad_bytes + o * prec.optimizer_bytes
                out.optimizer_params[roles[name]] = o
            out.head += [roles[x] for x in ch.layers if roles[x].startswith("tail:")]
            per_layer: dict[str, float] = {}
            for s in (*ch.fwd, *ch.bwd):
                per_layer[s.layer] = per_layer.get(s.layer, 0.0) + s.model_flops
            out.model_flops.update({roles[x]: f for x, f in per_layer.items()})  # one layer per role
            out.send_fwd_s = max(out.send_fwd_s, ch.send_fwd_s)
            out.send_bwd_s = max(out.send_bwd_s, ch.send_bwd_s)
        self._pieces[key] = out
        return out

    @staticmethod
    def _backward(ch: ChunkProgram, zb: bool, gamma: float) -> list[tuple[str, dict[str, PhaseCost]]]:
        if not zb:
            return [("bwd", replay_layers(ch.bwd, gamma))]
        b_half, w_half = split_backward(ch.bwd)
        return [("bwd", replay_layers(b_half, gamma)), ("w", replay_layers(w_half, gamma))]

    def _chunk(self, pc: _Pieces, kind: str, blocks: int) -> _Chunk:
        """A chunk of `blocks` blocks: 'first' (embedding + blocks), 'mid' (a received block + blocks), 'last'
        (mid + the head) or 'both' (no pipeline: embedding + blocks + head)."""
        lead = ["embedding", "first"] if kind in ("first", "both") else ["recv"]
        inner = blocks - 1
        tail = pc.head if kind in ("last", "both") else []
        order = [*lead, *(["inner"] if inner > 0 else []), *tail]
        counts = {x: 1 for x in order} | ({"inner": inner} if inner > 0 else {})

        def phase(table: dict[str, PhaseCost], names: list[str]) -> PhaseCost:
            return combine([table.get(x, PhaseCost()).scaled(counts[x]) for x in names])

        rev = order[::-1]
        last_layer = order[-1]
        return _Chunk(phase(pc.fwd, order), phase(pc.bwd, rev), phase(pc.w, rev),
                      sum(pc.reduce_s.get(x, 0.0) * counts[x] for x in order), pc.reduce_s.get(order[0], 0.0),
                      pc.bwd.get(last_layer, PhaseCost()).busy_s, sum(pc.post_s.get(x, 0.0) * counts[x] for x in order),
                      sum(pc.state_bytes.get(x, 0.0) * counts[x] for x in order),
                      sum(pc.optimizer_params.get(x, 0.0) * counts[x] for x in order))

    def _stage_rows(self, c: Candidate) -> dict[str, Any]:
        """The distinct stage rows of `c` (no pipeline: one; else first, middle and last) as StageBatch fields,
        and which row each stage takes."""
        key = (self._key(c), c.pp, c.vpp)
        if key in self._rows:
            return self._rows[key]
        pc = self.pieces(c)
        p, v = c.pp, c.vpp
        n = p * v
        if self.blocks % n:
            raise ValueError(f"{self.blocks} blocks do not split evenly over {n} chunks")
        k = self.blocks // n
        kinds = ["both"] if n == 1 else ["first", *(["mid"] * (n - 2)), "last"]
        chunk_of = {kd: self._chunk(pc, kd, k) for kd in set(kinds)}
        types = ["only"] if p == 1 else ["first", "mid", "last"] if p > 2 else ["first", "last"]
        stage_of = {"only": 0, "first": 0, "mid": 1, "last": p - 1}
        rows = []
        for t in types:
            r = stage_of[t]
            chunks = [chunk_of[kinds[vc * p + r]] for vc in range(v)]
            rows.append(self._row(pc, chunks, r, p))
        table = {f: np.array([row[f] for row in rows]) for f in rows[0]}
        self._rows[key] = {"table": table, "types": types}
        return self._rows[key]

    def _row(self, pc: _Pieces, chunks: list[_Chunk], r: int, p: int) -> dict[str, Any]:
        row: dict[str, Any] = {}
        for phase in ("fwd", "bwd", "w"):
            pcs = [getattr(ch, phase) for ch in chunks]
            row[f"{phase}_s"] = sum(x.busy_s for x in pcs)
            row[f"{phase}_host_s"] = sum(x.host_s for x in pcs)
            row[f"{phase}_sync_s"] = sum(x.synced_s for x in pcs)
        row["parts_s"] = [sum(getattr(ch, ph).parts.get(cat, 0.0) for ch in chunks for ph in ("fwd", "bwd", "w"))
                          for cat in CATEGORIES]
        v = len(chunks)
        row["send_fwd_s"] = pc.send_fwd_s * (v - (r == p - 1)) if p > 1 else 0.0
        row["send_bwd_s"] = pc.send_bwd_s * (v - (r == 0)) if p > 1 else 0.0
        row["reduce_s"] = sum(ch.reduce_s for ch in chunks)
        row["first_reduce_s"] = chunks[0].first_reduce_s
        row["last_layer_bwd_s"] = chunks[-1].last_bwd_s
        row["embedding_s"] = pc.embedding_s if p > 1 and r in (0, p - 1) else 0.0
        assert self._compute is not None
        row["optimizer_s"] = optimizer_time(sum(ch.optimizer_params for ch in chunks), self.cluster, self._compute)
        row["post_s"] = sum(ch.post_s for ch in chunks)
        row["static_bytes"] = sum(ch.state_bytes for ch in chunks)
        row["act_bytes"] = [ch.fwd.net_bytes for ch in chunks]
        row["fwd_peak_bytes"] = max(ch.fwd.peak_bytes for ch in chunks)
        row["bwd_peak_bytes"] = max(ch.fwd.net_bytes + ch.bwd.peak_bytes for ch in chunks)
        row["w_held_bytes"] = max(ch.fwd.net_bytes + ch.bwd.net_bytes for ch in chunks) if pc.w else 0.0
        return row

    # -- the batch -----------------------------------------------------------------------------------
    def stage_batch(self, candidates: list[Candidate]) -> StageBatch:
        """The candidates as one StageBatch (stage rows gathered by index, no Python loop over stages)."""
        n = len(candidates)
        p_max = max(c.pp for c in candidates)
        v_max = max(c.vpp for c in candidates)
        rows = [self._stage_rows(c) for c in candidates]
        # one table of every distinct row, and per candidate the index of its first / middle / last row
        tables: dict[int, int] = {}
        offsets = np.zeros((n, 3), dtype=np.int64)
        parts: list[dict[str, np.ndarray]] = []
        start = 0
        for i, rw in enumerate(rows):
            ident = id(rw)
            if ident not in tables:
                tables[ident] = start
                parts.append(rw["table"])
                start += len(rw["types"])
            base = tables[ident]
            k = len(rw["types"])
            offsets[i] = (base, base + (1 if k == 3 else 0), base + k - 1)
        fields_ = parts[0].keys()
        big: dict[str, np.ndarray] = {}
        for f in fields_:
            arrays = [t[f] for t in parts]
            if arrays[0].ndim == 2 and f == "act_bytes":
                arrays = [np.pad(a, [(0, 0), (0, v_max - a.shape[1])]) for a in arrays]
            big[f] = np.concatenate(arrays)
        pp = np.array([c.pp for c in candidates])
        stage = np.arange(p_max)[None, :]
        idx = np.where(stage == 0, offsets[:, :1], np.where(stage == pp[:, None] - 1, offsets[:, 2:], offsets[:, 1:2]))
        mask = stage < pp[:, None]
        out: dict[str, np.ndarray] = {}
        for f, arr in big.items():
            g = arr[idx]
            if g.ndim == 2:
                out[f] = np.where(mask, g, 0.0)
            else:
                out[f] = np.where(mask[:, :, None], g, 0.0)
        return StageBatch(
            pp=pp, vpp=np.array([c.vpp for c in candidates]),
            micro_batches=np.array([c.micro_batches for c in candidates]),
            schedule=np.array([SCHEDULES.index("interleaved" if c.vpp > 1 else c.schedule) for c in candidates]),
            max_ongoing=np.zeros(n, dtype=np.int64),
            overlap_grad_reduce=np.array([c.overlap_grad_reduce for c in candidates]),
            overlap_param_gather=np.array([c.overlap_param_gather for c in candidates]),
            host_sync=np.full(n, self._host_sync), gamma=np.full(n, self._gamma), **out)

    def _flops_per_sample(self, c: Candidate) -> float:
        """Model FLOPs of one sample through the whole model (a stage's ranks hold 1 / (tp cp) of each layer)."""
        pc = self.pieces(c)
        f = pc.model_flops
        per_rank = f.get("embedding", 0.0) + self.blocks * f.get("inner", 0.0) + sum(f.get(x, 0.0) for x in pc.head)
        return per_rank * c.tp * c.cp / c.micro_batch

    def evaluate(self, candidates: list[Candidate]) -> BatchEstimate:
        """The analytic tier's answers for `candidates` (all of this model, cluster and global batch)."""
        batch = self.stage_batch(candidates)
        est = evaluate(batch)
        gb = np.array([c.global_batch for c in candidates], dtype=float)
        world = np.array([c.tp * c.pp * c.cp * c.dp for c in candidates], dtype=float)
        model_flops = np.array([self._flops_per_sample(c) for c in candidates]) * gb
        samples = gb / est.iteration_s
        seq = self.model.seq_len
        tokens = samples * seq if seq else np.full(len(candidates), np.nan)
        mfu = model_flops / est.iteration_s / world / self._peak_flops
        peak = est.peak_bytes.max(axis=1)
        return BatchEstimate(est.iteration_s, samples, tokens, mfu, peak, peak <= self.capacity_bytes)


def _roles(ch: ChunkProgram, kinds: dict[str, str], pp: int) -> dict[str, str]:
    """Each layer of a reduced chunk by its role: embedding, inner (a block after another layer of its chunk),
    first (the block after the embedding), inner (a block after a block), recv (the block a chunk starts with, its
    input received), tail:NAME (what follows the blocks)."""
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
