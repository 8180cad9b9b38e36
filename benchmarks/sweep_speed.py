"""Sweep throughput: one 24-job sweep of a mid-size model evaluated in this process, by 2 local worker
processes, and on a local Ray cluster with 2 and 4 tasks in flight; checks that every way gives the same
rows and prints jobs/s and the speed-up over one worker. Worker start-up (process spawn, Ray start) is
counted in each run's wall time, Ray's cluster start printed apart. Asserts only that the rows agree.
Usage: python benchmarks/sweep_speed.py   (the Ray runs need trainsim[ray])
"""

from __future__ import annotations

import itertools
import os
import sys
import time
from typing import Any

from trainsim.optimize.evaluate import NONDETERMINISTIC_COLUMNS
from trainsim.optimize.runners import Runner

BASE: dict[str, Any] = {"model": {"name": "llama3-8b", "seq_len": 4096}, "cluster": {"name": "dgx-a100", "nodes": 4},
                        "strategy": {"global_batch": 512, "sequence_parallel": True},
                        "simulation": {"granularity": "op"}}
GRID = {"tp": [2, 4, 8], "pp": [1, 2, 4, 8], "recompute": ["selective", "full"]}


def jobs() -> list[dict[str, Any]]:
    out = []
    for values in itertools.product(*GRID.values()):
        job = {k: dict(v) for k, v in BASE.items()}
        job["strategy"].update(dict(zip(GRID, values, strict=True)))
        out.append(job)
    return out


def same(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    strip = [[{k: v for k, v in r.items() if k not in NONDETERMINISTIC_COLUMNS} for r in rows] for rows in (a, b)]
    return strip[0] == strip[1]


def _burn(n: int) -> float:
    t0 = time.perf_counter()
    s = 0
    for i in range(n):
        s += i
    return time.perf_counter() - t0


def machine_parallelism(n: int) -> float:
    """How many times one process's work n CPU-bound processes get done in the same time on this machine
    (the best speed-up any runner can reach here: shared or throttled cores give less than n)."""
    import multiprocessing

    work = 10_000_000
    solo = _burn(work)
    with multiprocessing.get_context("spawn").Pool(n) as pool:
        pool.map(_burn, [1000] * n)  # started
        t0 = time.perf_counter()
        pool.map(_burn, [work] * n)
        wall = time.perf_counter() - t0
    return n * solo / wall


def timed(label: str, make: Any, work: list[dict[str, Any]]) -> tuple[str, float, list[dict[str, Any]]]:  # noqa: ANN401
    t0 = time.perf_counter()
    with make() as runner:
        rows = runner.map(work)
    return label, time.perf_counter() - t0, rows


def main() -> None:
    work = jobs()
    cpus = os.cpu_count() or 1
    print(f"{len(work)} jobs (llama3-8b seq 4096 on 32 A100, op granularity; tp x pp x recompute) on {cpus} CPUs")
    print("this machine runs CPU-bound processes at " + ", ".join(
        f"{machine_parallelism(n):.2f}x one with {n}" for n in (2, 4)) + " (the ceiling of any speed-up below)")
    runs = [timed("local, 1 worker (in-process)", lambda: Runner(1), work),
            timed("local, 2 worker processes", lambda: Runner(2), work)]
    try:
        import ray
    except ImportError:
        print("ray is not installed (pip install 'trainsim[ray]'): Ray runs skipped")
    else:
        t0 = time.perf_counter()
        ray.init(num_cpus=max(4, cpus), include_dashboard=False, logging_level="ERROR", log_to_driver=False)
        print(f"Ray local cluster started in {time.perf_counter() - t0:.1f} s (not counted below)")
        try:
            for n in (2, 4):
                runs.append(timed(f"Ray, {n} tasks in flight", lambda n=n: Runner(n, ray="auto"), work))
        finally:
            ray.shutdown()
    base_label, base_wall, base_rows = runs[0]
    errors = sum(r["error"] is not None for r in base_rows)
    print(f"{errors} of {len(work)} jobs are refused configurations (rows with an error)")
    print(f"{'runner':32s} {'wall s':>8s} {'jobs/s':>8s} {'speed-up':>9s}  rows")
    ok = True
    for label, wall, rows in runs:
        agree = same(rows, base_rows)
        ok &= agree
        print(f"{label:32s} {wall:8.2f} {len(work) / wall:8.2f} {base_wall / wall:8.2f}x  "
              f"{'identical' if agree else 'DIFFERENT'}")
    if not ok:
        sys.exit("rows differ between runners")


if __name__ == "__main__":
    main()
