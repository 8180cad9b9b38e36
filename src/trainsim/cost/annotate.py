"""Fill every step of a compiled program with its duration from the pluggable cost models."""

from __future__ import annotations

import math

from ..compile.program import Program, Step
from ..hardware.cluster import Cluster
from ..workload.ir import OpKind
from .comm import CommModel
from .compute import ComputeModel

# Bytes an Adam step streams per parameter: read fp32 master, m, v and the grad, write master, m, v
# and the fp16/bf16 working copy (4*3 + 4 + 4*3 + 2 = 30 B; fused multi-tensor Adam, no extra passes).
ADAM_BYTES_PER_PARAM = 30.0


def annotate(program: Program, cluster: Cluster, compute: ComputeModel, comm: CommModel,
             collective_host_s: float = 0.0) -> None:
    """Set `duration_s` and `host_s` on every step (templates are shared by all micro-batches: cost once)."""
    device = cluster.device
    dtype = program.precision.compute_dtype
    mesh = program.mesh
    cache: dict[tuple, float] = {}
    groups: dict[tuple, tuple[int, ...]] = {}

    def cost(step: Step, stage_rank: int) -> float:
        if step.kind == "compute":
            assert step.op is not None and step.local is not None
            key = (id(step.op), tuple(sorted(step.local.items())), step.phase if step.phase != "recompute" else "fwd")
            if key not in cache:
                cache[key] = compute.op_time(step.op, step.local, step.phase, device, dtype)
            return cache[key]
        key = (step.collective, step.size_bytes, step.axes, stage_rank)
        if key not in cache:
            gkey = ("group", step.axes, stage_rank)
            if gkey not in groups:
                groups[gkey] = tuple(mesh.group_ranks(step.axes, stage_rank))
            cache[key] = comm.time(step.collective, step.size_bytes, groups[gkey])
        return cache[key]

    n = len(program.chunks)
    for ch in program.chunks:
        stage_rank = mesh.rank({"pp": ch.pp_rank})
        for s in ch.fwd + ch.bwd + ch.grad_sync + ch.post_step:
            s.duration_s = cost(s, stage_rank)
            if s.kind == "compute" and s.op is not None:
                s.host_s = compute.host_time(s.op, s.phase, s.local)
            elif s.kind == "collective" and s.axes:
                # issuing a collective costs framework time plus the launch skew of its members,
                # which grows with the group like a tree of waits (log2 of the group size)
                n = len(mesh.group_ranks(s.axes, stage_rank))
                s.host_s = collective_host_s * math.log2(n) if n > 1 else 0.0
        if program.tree.tp_comm_overlap and mesh.tp > 1:
            _overlap_tp_comm(ch.fwd, mesh.tp)
            _overlap_tp_comm(ch.bwd, mesh.tp)
        if ch.chunk < n - 1:
            nxt = mesh.rank({"pp": (ch.pp_rank + 1) % mesh.pp})
            ch.send_fwd_s = comm.time("send_recv", ch.send_fwd_bytes, (stage_rank, nxt))
        if ch.chunk > 0:
            prv = mesh.rank({"pp": (ch.pp_rank - 1) % mesh.pp})
            ch.send_bwd_s = comm.time("send_recv", ch.send_bwd_bytes, (stage_rank, prv))
    emb = [ch for ch in program.chunks if ch.embedding_grad_bytes > 0]
    if len(emb) >= 2 and emb[0].pp_rank != emb[-1].pp_rank:
        a, b = mesh.rank({"pp": emb[0].pp_rank}), mesh.rank({"pp": emb[-1].pp_rank})
        program.embedding_sync_s = comm.time("all_reduce", emb[0].embedding_grad_bytes, (a, b))


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


def _is_gemm(step: Step) -> bool:
    return step.kind == "compute" and step.op is not None and step.op.kind == OpKind.MATMUL


def optimizer_time(params_local: float, cluster: Cluster, compute: ComputeModel) -> float:
    """One fused Adam step over the optimizer shard this rank owns (memory-bound)."""
    return compute.memory_time(params_local * ADAM_BYTES_PER_PARAM, cluster.device)
