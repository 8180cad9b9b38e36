"""Simulation cost against Proteus' Table VI (compile + execute time of VGG19 and GPT-2 data parallel on
HC2 = 8x V100 NVLink nodes with 100 Gb/s, 1 to 32 GPUs). Proteus reports 6.265 s for GPT-2 on 32 GPUs
(compile 4.143 s + HTAE 2.123 s) and 1.698 s for VGG19; issue 5's target is <= 0.5 s for GPT-2 at 32.

trainsim times the same pipeline in two modes: symmetric (rank classes and automatic task granularity,
the default) and exact (every GPU and every op a task of its own, as Proteus simulates). "compile" = strategy tree + lowering + cost annotation +
graph build, "execute" = the discrete-event engine. Best of 3 in one process after a warm-up run.
Prints numbers; asserts nothing. Run: .venv/bin/python benchmarks/proteus_cost.py
"""

from __future__ import annotations

import time
from typing import Any

from trainsim.compile.graph import build_graph
from trainsim.compile.program import lower
from trainsim.cost.annotate import annotate, optimizer_time
from trainsim.cost.calibration import load_calibration
from trainsim.cost.comm import NcclComm
from trainsim.cost.compute import RooflineCompute
from trainsim.hardware.cluster import get_cluster
from trainsim.sim.engine import run
from trainsim.strategy.mesh import DeviceMesh
from trainsim.strategy.precision import Precision
from trainsim.strategy.tree import StrategyTree
from trainsim.workload.zoo import build_model

PROTEUS_TABLE_VI = {  # GPUs -> (VGG19 total s, GPT-2 total s), Proteus Table VI on HC2
    1: (0.039, 0.258), 2: (0.460, 0.792), 4: (0.644, 1.196), 8: (0.733, 1.881), 16: (0.966, 3.138),
    32: (1.698, 6.265)}


def _once(model_name: str, gpus: int, per_gpu_batch: int, exact: bool, **model_kw: Any) -> tuple[float, float, int]:
    t0 = time.perf_counter()
    cl = get_cluster("dgx1-v100", max(1, gpus // 8))
    if gpus < 8:
        cl = cl.customised(gpus_per_node=gpus)
    model = build_model(model_name, per_gpu_batch * gpus, **model_kw)
    S = StrategyTree.from_model(model, DeviceMesh(dp=gpus), per_gpu_batch * gpus, per_gpu_batch)
    S.root.split(model.batch_dim, "dp")  # data parallel, set once and propagated along the dataflow
    prec = Precision.named("fp32")
    program = lower(S, prec)
    cal = load_calibration(None)
    compute = RooflineCompute(cal.compute_for(cl.device))
    flows = annotate(program, cl, compute, NcclComm(cl, cal.comm or None), sharing=True, exact=exact)
    opt = {0: optimizer_time(sum(c.optimizer_params_local for c in program.chunks), cl, compute)}
    graph = build_graph(program, exact=exact, granularity="op" if exact else "auto", optimizer_s=opt, flows=flows)
    t1 = time.perf_counter()
    trace = run(graph, gamma=cal.gamma)
    t2 = time.perf_counter()
    assert max(trace.end_s) > 0
    return t1 - t0, t2 - t1, len(graph)


def main() -> None:
    print(f"{'model':<8}{'GPUs':>5}  {'mode':<10}{'tasks':>7}{'compile s':>11}{'execute s':>11}{'total s':>9}"
          f"{'Proteus s':>11}")
    cases = [("vgg19", 32, {}), ("gpt2", 2, {"seq_len": 1024})]
    for gpus in (1, 2, 4, 8, 16, 32):
        for (name, batch, kw), proteus in zip(cases, PROTEUS_TABLE_VI[gpus], strict=True):
            label = "gpt2-proteus" if name == "gpt2" else name
            model_name = "gpt2-proteus" if name == "gpt2" else name
            for exact in (False, True):
                _once(model_name, gpus, batch, exact, **kw)
                best = min((_once(model_name, gpus, batch, exact, **kw) for _ in range(3)), key=lambda x: sum(x[:2]))
                mode = "exact/op" if exact else "symmetric"
                print(f"{label[:8]:<8}{gpus:>5}  {mode:<10}{best[2]:>7}{best[0]:>11.3f}{best[1]:>11.3f}"
                      f"{best[0] + best[1]:>9.3f}{proteus:>11.3f}")


if __name__ == "__main__":
    main()
