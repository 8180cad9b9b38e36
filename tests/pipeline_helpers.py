"""Shared by the strategy tests: compile a strategy tree, cost it and simulate it step by step (the
same stages as trainsim.api, exposed so tests can compare programs and graphs)."""

from __future__ import annotations

from collections.abc import Callable

from trainsim.compile.graph import ExecutionGraph, build_graph
from trainsim.compile.program import Program, lower
from trainsim.cost.annotate import annotate, optimizer_time
from trainsim.cost.calibration import load_calibration
from trainsim.cost.comm import NcclComm
from trainsim.cost.compute import RooflineCompute
from trainsim.hardware.cluster import get_cluster
from trainsim.sim.engine import run
from trainsim.strategy.mesh import DeviceMesh
from trainsim.strategy.precision import Precision
from trainsim.strategy.tree import StrategyTree
from trainsim.workload.ir import Model


def compile_tree(tree: StrategyTree, cluster: str = "dgx-a100", nodes: int = 1) -> tuple[ExecutionGraph, Program]:
    """Lower, cost (bandwidth sharing on) and build the execution graph of `tree` on `nodes` nodes."""
    cl = get_cluster(cluster, nodes)
    program = lower(tree, Precision.named("bf16"))
    cal = load_calibration(None)
    compute = RooflineCompute(cal.compute_for(cl.device))
    flows = annotate(program, cl, compute, NcclComm(cl, cal.comm or None), sharing=True)
    by_rank: dict[int, list] = {}
    for ch in program.chunks:
        by_rank.setdefault(ch.pp_rank, []).append(ch)
    opt = {r: optimizer_time(sum(c.optimizer_params_local for c in chs), cl, compute) for r, chs in by_rank.items()}
    return build_graph(program, optimizer_s=opt, flows=flows), program


def simulate_tree_steps(tree: StrategyTree, cluster: str = "dgx-a100",
                        nodes: int = 1) -> tuple[float, ExecutionGraph, Program]:
    """`compile_tree` plus the engine: (iteration seconds, graph, program)."""
    graph, program = compile_tree(tree, cluster, nodes)
    cal = load_calibration(None)
    trace = run(graph, gamma=cal.gamma, p2p_host_sync=cal.p2p_host_sync)
    return max(trace.end_s), graph, program


def collectives(program: Program) -> set[tuple[str, str]]:
    """(collective, category) of every collective step the compiler put in the templates."""
    return {(s.collective, s.category) for ch in program.chunks for s in ch.fwd + ch.bwd if s.kind == "collective"}


def assert_late_stages_pipelined(model: Model, global_batch: int, micro_batch: int) -> None:
    """ResNet-style model on 2 stages x dp 4 (layer3, layer4 and the head on stage 1): it simulates and
    the first stage sends its activations."""
    P = StrategyTree.from_model(model, DeviceMesh(pp=2, dp=4), global_batch, micro_batch)
    P.root.split("n", "dp")
    for node in (P.layer3, P.layer4, P.head):
        node.map(1)
    t, graph, program = simulate_tree_steps(P)
    assert t > 0 and program.chunks[0].send_fwd_bytes > 0 and "pp" in set(graph.category)


def make_uniform_and_free(program: Program) -> None:
    """Edit a costed program into what the pipelines' closed forms assume: transformer-layer compute keeps its
    roofline duration; embedding and head compute, every collective, the pipeline sends, the tied-embedding sum
    and the framework's issue time take none."""
    for ch in program.chunks:
        for s in ch.fwd + ch.bwd + ch.grad_sync + ch.post_step:
            s.host_s = 0.0
            if s.kind != "compute" or not s.layer.startswith("layers."):
                s.duration_s = 0.0
        ch.send_fwd_s = ch.send_bwd_s = 0.0
    program.embedding_sync_s = 0.0


def play_orders(orders: list[list[tuple[str, int, int]]], f: float, b: float, w: float,
                chunk_of: Callable[[int, int], int] | None = None) -> float:
    """Run per-rank orders as list schedules, an independent check of the engine: an item starts once its rank
    finished the item before it and its inputs are done (F of chunk c waits for F of c - 1, B for its own F and B of
    c + 1, W for its own B); F, B and W take f, b and w. `chunk_of(rank, virtual chunk)`: the chunk an item runs
    (default: the rank, one chunk each). Returns the makespan; fails on a deadlock."""
    p = len(orders)
    place = chunk_of or (lambda r, _vc: r)
    n_chunks = len({place(r, vc) for r, order in enumerate(orders) for _, _, vc in order})
    dur = {"F": f, "B": b, "W": w}
    done: dict[tuple[str, int, int], float] = {}
    pos, free_at = [0] * p, [0.0] * p
    moved = True
    while moved:
        moved = False
        for r in range(p):
            while pos[r] < len(orders[r]):
                ph, mb, vc = orders[r][pos[r]]
                c = place(r, vc)
                need = {"F": [("F", mb, c - 1)] if c > 0 else [],
                        "B": [("F", mb, c)] + ([("B", mb, c + 1)] if c < n_chunks - 1 else []),
                        "W": [("B", mb, c)]}[ph]
                if any(d not in done for d in need):
                    break
                free_at[r] = max([free_at[r]] + [done[d] for d in need]) + dur[ph]
                done[(ph, mb, c)] = free_at[r]
                pos[r] += 1
                moved = True
    assert all(pos[r] == len(orders[r]) for r in range(p)), "the orders deadlock"
    return max(free_at)
