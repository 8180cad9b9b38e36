"""Shared by the strategy tests: compile a strategy tree, cost it and simulate it step by step (the
same stages as trainsim.api, exposed so tests can compare programs and graphs)."""

from __future__ import annotations

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
