"""Strategy search speed on the issue's case: GPT-3 175B on 1024 A100s (128 DGX A100), global batch 1536,
sequence 2048, the whole Megatron space (tp, pp, cp, vpp, sp, micro-batch, recompute, ZeRO 0-3, the overlap
flags, 1F1B / interleaved / ZB-H1). Prints the space, what was pruned, how many were simulated, the wall
time and configurations settled per second (Calculon: about 60/s), and the best.

--verify checks the two things the bounded search rests on, on the same job:
- a random sample of the space's candidates: the time and memory bounds never exceed the simulation;
- a sub-space (Megatron's knobs, 17,280 configurations before pruning, 3,648 after) searched exhaustively:
  the same best and top 5 as branch and bound.

    python benchmarks/search_speed.py [--jobs 2] [--top 1] [--verify [--sample 200]]
"""

from __future__ import annotations

import argparse
import random
import sys
import time

from trainsim.optimize.search import run_search
from trainsim.optimize.space import SearchSpace

JOB = {"model": {"name": "gpt3-175b", "seq_len": 2048}, "cluster": {"name": "dgx-a100"}}
NODES, GLOBAL_BATCH = 128, 1536
SUB_SPACE = SearchSpace(tp=[1, 2, 4, 8, 16], pp=[2, 4, 8, 16, 32, 64], cp=[1, 2], vpp=[1, 2, 3],
                        sequence_parallel=[True], micro_batch=[1, 2, 4], recompute=["selective", "full"], zero=[1, 3],
                        overlap_grad_reduce=[True], overlap_param_gather=[False, True], tp_comm_overlap=[False, True],
                        schedule=["1f1b", "zb-h1"])  # 17,280 configurations, 3,648 after the static rules


def _line(row: dict) -> str:
    keys = ("tp", "pp", "dp", "cp", "vpp", "sequence_parallel", "micro_batch", "recompute", "zero",
            "overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap", "schedule")
    return (f"{row['iteration_time_s']:.3f} s  {row['tokens_per_s']:,.0f} tokens/s  MFU {100 * row['mfu']:.1f}%  "
            + " ".join(f"{k}={row[k]}" for k in keys))


def _search(space: SearchSpace | None, jobs: int, top: int, exhaustive: bool = False) -> object:
    t0 = time.perf_counter()
    result, _ = run_search(JOB, [NODES], GLOBAL_BATCH, space=space, top=top, jobs=jobs, exhaustive=exhaustive)
    wall = time.perf_counter() - t0
    print(f"  space {result.space:,}, simulated {result.evaluated:,}, pruned {result.pruned}")
    print(f"  wall {wall:.1f} s, {result.space / wall:,.0f} configurations settled/s, "
          f"{result.reduced_jobs:,} one-block jobs for the bounds")
    for i, r in enumerate(result.top, 1):
        print(f"  #{i} {_line(r)}")
    return result


def _check_bounds(sample: int) -> int:
    import trainsim.api as api
    from trainsim.optimize.bounds import BoundModel
    from trainsim.optimize.evaluate import evaluate
    from trainsim.optimize.space import enumerate_space

    base = {**JOB, "cluster": {**JOB["cluster"], "nodes": NODES}, "simulation": {}}
    cl, model = api.cluster_and_model(base)
    cands = enumerate_space(SearchSpace(), model, cl.world_size, cl.gpus_per_node, GLOBAL_BATCH).candidates
    bm = BoundModel(base, model, cl)
    bad, worst_t, worst_m = 0, 0.0, 0.0
    rng = random.Random(0)
    for c in rng.sample(cands, sample):
        lb, mem = bm.bounds(c, refine=True)
        row = evaluate({**base, "strategy": c.strategy()})
        if row["error"] is not None:
            continue
        rt, rm = lb / row["iteration_time_s"], mem / (row["peak_memory_gib"] * 2**30)
        worst_t, worst_m = max(worst_t, rt), max(worst_m, rm)
        if rt > 1 + 1e-9 or rm > 1 + 1e-9:
            bad += 1
            print(f"  BOUND ABOVE THE SIMULATION: time {rt:.4f} memory {rm:.4f} {c}")
    print(f"  {sample} random candidates: largest bound / simulated = {worst_t:.4f} (time), {worst_m:.4f} "
          f"(memory); {bad} above")
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--top", type=int, default=1)
    ap.add_argument("--verify", action="store_true")
    ap.add_argument("--sample", type=int, default=200)
    args = ap.parse_args()
    print(f"GPT-3 175B, {NODES * 8} A100s, global batch {GLOBAL_BATCH}, whole space, {args.jobs} workers, "
          f"top {args.top}:")
    _search(None, args.jobs, args.top)
    if not args.verify:
        return 0
    print("bounds against the simulation:")
    bad = _check_bounds(args.sample)
    print("sub-space, branch and bound:")
    fast = _search(SUB_SPACE, args.jobs, 5)
    print("sub-space, exhaustive:")
    full = _search(SUB_SPACE, args.jobs, 5, exhaustive=True)
    same = [r["key"] for r in fast.top] == [r["key"] for r in full.top]
    print(f"  top 5 identical: {same}")
    return 0 if same and not bad else 1


if __name__ == "__main__":
    sys.exit(main())
