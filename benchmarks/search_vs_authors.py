"""Where does the strategy the authors ran rank in trainsim's search? For published setups in
../shared/validation/training_runs.csv (model, GPUs, global batch, precision as published), the search
over the whole space runs with the authors' predicted iteration time as a bar: every configuration that
could beat it is simulated, so the rank is exact (1 = the authors' strategy is trainsim's best), unless
the per-row time limit stops it first (then the rank is a range: the configurations simulated faster, up to
those whose bound says they might be).

    python benchmarks/search_vs_authors.py [--groups megatron_sc21_table1,megatron_readme_h100]
                                           [--time-limit 60] [--jobs 1] [--max-gpus 1024]
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

from trainsim.api import simulate
from trainsim.optimize.search import search
from trainsim.optimize.space import SearchSpace
from trainsim.validate.training_runs import row_job

CSV = Path(__file__).resolve().parents[2] / "shared" / "validation" / "training_runs.csv"
KEYS = ("tp", "pp", "dp", "cp", "vpp", "micro_batch", "recompute", "zero", "schedule")


def _short(s: dict) -> str:
    sched = "interleaved" if (s.get("vpp") or 1) > 1 else s.get("schedule", "1f1b")
    extra = [f"{k}{s[k]}" for k in ("cp", "vpp") if (s.get(k) or 1) > 1]
    return " ".join([f"tp{s.get('tp', 1)} pp{s.get('pp', 1)} dp{s.get('dp')}", *extra, f"mb{s.get('micro_batch', 1)}",
                     str(s.get("recompute", "none")), f"zero{s.get('zero', 0)}", sched])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", default="megatron_sc21_table1,megatron_readme_h100")
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--max-gpus", type=int, default=1024)
    ap.add_argument("--hold", default="", help="strategy keys held at the authors' values in the space "
                    "(e.g. recompute,zero): rank the rest of their choice")
    args = ap.parse_args()
    groups = set(args.groups.split(","))
    rows = [r for r in csv.DictReader(CSV.open()) if r["source_group"] in groups]
    print("| row | GPUs | authors' strategy | authors (pred. s) | trainsim best (pred. s) | best strategy | "
          "rank | gap | simulated | wall s |")
    print("|---|---:|---|---:|---:|---|---:|---:|---:|---:|")
    from trainsim.optimize.runners import Runner

    with Runner(args.jobs) as runner:
        for row in rows:
            rj = row_job(row)
            if isinstance(rj, str):
                print(f"| {row['case_id']} | | not mapped: {rj} | | | | | | | |")
                continue
            job = rj.job
            n_gpus = int(row["n_gpus"])
            if n_gpus > args.max_gpus:
                continue
            t0 = time.perf_counter()
            authors = simulate(job)
            t_a = authors.iteration_time_s
            cl = job["cluster"]
            nodes = cl.get("nodes") or max(1, n_gpus // 8)
            base = {"model": job["model"], "cluster": {k: v for k, v in cl.items() if k != "nodes"},
                    "simulation": job.get("simulation", {})}
            gb = authors.strategy["global_batch"]
            held = {k: [authors.strategy[k]] for k in filter(None, args.hold.split(","))}
            res = search(base, [nodes], gb, space=SearchSpace(**held), top=1, time_limit_s=args.time_limit,
                         runner=runner, beat_s=t_a)
            best = res.best
            faster = sum(1 for r in res.rows if r["iteration_time_s"] < t_a * (1 - 1e-9))
            maybe = res.per_nodes[0].could_beat(t_a) if res.per_nodes else 0
            rank = f"{faster + 1}" if res.proven or not maybe else f"{faster + 1}-{faster + 1 + maybe}"
            fits = "" if not authors.oom else " (OOM in trainsim)"
            if best is None:
                print(f"| {row['case_id']} | {n_gpus} | {_short(authors.strategy)}{fits} | {t_a:.3f} | none fits | "
                      f"| {rank} | | {res.evaluated} | {time.perf_counter() - t0:.0f} |")
                continue
            gap = (t_a - best["iteration_time_s"]) / t_a
            print(f"| {row['case_id']} | {n_gpus} | {_short(authors.strategy)}{fits} | {t_a:.3f} | "
                  f"{best['iteration_time_s']:.3f} | {_short(best)} | {rank} | {100 * gap:.1f}% | {res.evaluated} | "
                  f"{time.perf_counter() - t0:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
