"""Speed of the analytic tier (issue 21: <= 1 ms per configuration single, >= 5,000 configurations/s batched
on one core; Calculon: 2.0 ms and 450/s).

    python benchmarks/analytic_speed.py [--repeat N]

Single configuration, GPT-3 175B on 1024 A100-80GB (the default job, TP8 x PP16 x DP8, 1F1B):
  - `simulate(job, fidelity="analytic")` end to end (the job lowered and costed, then the formula);
  - warm, the costed program cached (api.costed_program: lowering and annotation): sim.analytic.program_batch
    (replay of the chunk templates) + evaluate;
  - warm, the per-layer pieces cached (optimize.analytic.AnalyticBatch with one candidate).
Batched: every configuration of a search space over tp, pp, micro-batch, recompute, ZeRO, schedule and the
overlap flags (optimize.space.enumerate_space's static rules applied), evaluated by AnalyticBatch: cold (the
first evaluation of the whole space by a new AnalyticBatch, every compute key's reduced job lowered and costed
and every data-parallel degree priced, as a search pays it) and warm (everything cached), in configurations/s.
numpy runs on one thread (OMP/OpenBLAS/MKL threads set to 1 before it is imported).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402


def _best(fn, repeat: int) -> tuple[float, float]:  # noqa: ANN001 - a thunk
    """(best, median) seconds of `repeat` calls."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    from trainsim.api import cluster_and_model, costed_program, default_job, job_tree, simulate
    from trainsim.config import job_dict
    from trainsim.cost.annotate import optimizer_time
    from trainsim.cost.memory import static_memory
    from trainsim.optimize.analytic import AnalyticBatch
    from trainsim.optimize.space import Candidate, SearchSpace, enumerate_space
    from trainsim.sim.analytic import evaluate, program_batch

    job = default_job()
    data = job_dict(job)
    data["simulation"]["fidelity"] = "analytic"
    t0 = time.perf_counter()
    res = simulate(data)
    cold = time.perf_counter() - t0
    e2e = _best(lambda: simulate(data), max(3, args.repeat // 4))
    print(f"GPT-3 175B, 1024 x A100: analytic {res.iteration_time_s:.3f} s/iteration, MFU {100 * res.mfu:.1f}%")
    print(f"single, simulate(fidelity='analytic') end to end: first {1e3 * cold:.1f} ms, then best "
          f"{1e3 * e2e[0]:.1f} ms / median {1e3 * e2e[1]:.1f} ms (lowering and costing each time)")
    cl, spec, tree = job_tree(job)
    costed = costed_program(tree, cl, job.simulation)
    prog = costed.program
    ranks = sorted({ch.pp_rank for ch in prog.chunks})
    chunks = {r: [c for c in prog.chunks if c.pp_rank == r] for r in ranks}
    statics = {r: static_memory(chunks[r], costed.precision).total_bytes for r in ranks}
    opt = {r: optimizer_time(sum(c.optimizer_params_local for c in chunks[r]), cl, costed.compute) for r in ranks}
    warm = _best(lambda: evaluate(program_batch(prog, opt, statics, costed.gamma, costed.p2p_host_sync)),
                 args.repeat)
    print(f"single, costed program cached (template replay + formula): best {1e3 * warm[0]:.2f} ms / median "
          f"{1e3 * warm[1]:.2f} ms")

    base = {"model": dict(data["model"]), "cluster": dict(data["cluster"]), "simulation": {}}
    cluster, model = cluster_and_model({**base, "strategy": {}})
    s = job.strategy
    one = Candidate(s.tp, s.pp, spec.dp, 1, 1, 1, s.sequence_parallel, s.micro_batch, s.recompute, s.zero,
                    s.overlap_grad_reduce, s.overlap_param_gather, s.tp_comm_overlap, s.schedule, spec.global_batch)
    ab = AnalyticBatch(base, model, cluster)
    ab.evaluate([one])
    single = _best(lambda: ab.evaluate([one]), args.repeat)
    print(f"single, per-layer pieces cached (AnalyticBatch, one candidate): best {1e3 * single[0]:.2f} ms / median "
          f"{1e3 * single[1]:.2f} ms; iteration {ab.evaluate([one]).iteration_s[0]:.3f} s")

    space = SearchSpace(tp=[1, 2, 4, 8], pp=[1, 2, 4, 8, 16, 32], cp=[1], vpp=[1, 2, 4], micro_batch=[1, 2, 4],
                        recompute=["none", "selective", "full"], zero=[0, 1, 3], sequence_parallel=[True, False],
                        tp_comm_overlap=[False], schedule=["1f1b", "zb-h1"])
    en = enumerate_space(space, model, cluster.world_size, cluster.gpus_per_node, spec.global_batch)
    blocks = sum(1 for la in model.layers if la.kind == "transformer")
    cands = [c for c in en.candidates if blocks % (c.pp * c.vpp) == 0]  # the batch composes even splits only
    t0 = time.perf_counter()
    ab = AnalyticBatch(base, model, cluster)
    est = ab.evaluate(cands)
    first = time.perf_counter() - t0
    again = _best(lambda: ab.evaluate(cands), max(3, args.repeat // 4))
    n_fit = int(est.fits.sum())
    best = int(max(range(len(cands)), key=lambda i: est.samples_per_s[i] if est.fits[i] else 0.0))
    print(f"batched: {len(cands):,} configurations (space {en.space_size:,}, statically pruned "
          f"{sum(en.pruned.values()):,}); {ab.reduced_jobs} distinct compute keys costed (one reduced job each), "
          f"{len(ab._dp_list)} data-parallel configurations priced from {ab.dp_trees} strategy trees")
    print(f"  cold (first evaluation, costing included): {first:.2f} s = {len(cands) / first:,.0f} configurations/s")
    print(f"  warm (everything cached): best {1e3 * again[0]:.1f} ms = {len(cands) / again[0]:,.0f} configurations/s "
          f"(median {len(cands) / again[1]:,.0f}/s)")
    c = cands[best]
    print(f"  fastest that fits ({n_fit:,} fit): tp{c.tp} pp{c.pp} dp{c.dp} vpp{c.vpp} mb{c.micro_batch} "
          f"{c.recompute} zero{c.zero} {c.schedule}: {est.iteration_s[best]:.3f} s, MFU {100 * est.mfu[best]:.1f}%")


if __name__ == "__main__":
    main()
