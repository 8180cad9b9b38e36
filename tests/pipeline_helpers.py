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
from trainsim.strategy.precision import Precision
from trainsim.strategy.tree import StrategyTree


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
