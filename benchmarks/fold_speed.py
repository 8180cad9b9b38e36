"""How long the fold takes on the default job (GPT-3 175B, 1024 A100, pp 16, 192 micro-batches): reading the
reduced run's columns (sim.result.task_columns), finding the fold (sim.periodic.find_fold) and summing the
full iteration from it (fold_summary), best of N warm calls in thread CPU time (less sensitive than wall time
to other processes on a shared machine).

    PYTHONPATH=src python benchmarks/fold_speed.py [N]
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import trainsim.api as api
from trainsim.sim import periodic
from trainsim.sim.result import task_columns


def best_ms(fn: Callable[[], Any], n: int) -> float:
    best = float("inf")
    for _ in range(n):
        t = time.thread_time()
        fn()
        best = min(best, time.thread_time() - t)
    return best * 1e3


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    seen: list[tuple] = []
    find = api.find_fold

    def keep(graph: Any, trace: Any, reduced: int, m: int, period: int, cols: Any = None) -> Any:  # noqa: ANN401
        seen.append((graph, trace, reduced, m, period))
        return find(graph, trace, reduced, m, period, cols)

    api.find_fold = keep  # type: ignore[assignment]
    result = api.simulate(api.default_job())
    api.find_fold = find  # type: ignore[assignment]
    graph, trace, reduced, m, period = seen[0]
    cols = task_columns(graph, trace)
    fold = periodic.find_fold(graph, trace, reduced, m, period, cols)
    assert fold is not None
    t_cols = best_ms(lambda: task_columns(graph, trace), n)
    t_find = best_ms(lambda: periodic.find_fold(graph, trace, reduced, m, period, cols), n)
    t_sum = best_ms(lambda: periodic.fold_summary(graph, trace, fold, cols), n)
    print(result.fold)
    print(f"reduced graph: {len(graph)} tasks of {reduced} micro-batches")
    print(f"task_columns {t_cols:.2f} ms  find_fold {t_find:.2f} ms  fold_summary {t_sum:.2f} ms  "
          f"together {t_cols + t_find + t_sum:.2f} ms (best of {n})")


if __name__ == "__main__":
    main()
