"""Event engine speed (sim.engine.run) on the graphs real jobs hand it, against the engine before its
rewrite (tests/engine_reference.py), interleaved in one process, best of --repeat warm calls each.

Cases: the default job's reduced graph (52 of 192 micro-batches, as the folded run simulates it), the same
without bandwidth sharing, its full 192-micro-batch graph, Llama-3.1 405B on 16,384 H100 and GPT-3 175B on
64 A100. Each row also says whether the two traces agree to the bit. Prints numbers; asserts nothing.
Usage: python benchmarks/engine_speed.py [--repeat N] [--only SUBSTRING]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from engine_reference import run as reference_run  # noqa: E402

import trainsim.api as api  # noqa: E402
from trainsim.compile.graph import ExecutionGraph  # noqa: E402
from trainsim.sim.engine import SimTrace, run  # noqa: E402

CASES: dict[str, tuple[Any, dict[str, Any]]] = {
    "gpt3-175b 1024x A100 (default job), 52 micro-batches": (None, {}),
    "the same without bandwidth sharing": (None, {"bandwidth_sharing": False}),
    "the same, all 192 micro-batches": (None, {"timeline": True}),
    "llama3.1-405b 16384x H100 tp8 pp16 dp128": (
        {"model": {"name": "llama3.1-405b", "seq_len": 8192}, "cluster": {"name": "dgx-h100", "nodes": 2048},
         "strategy": {"tp": 8, "pp": 16, "dp": 128, "global_batch": 2048, "sequence_parallel": True,
                      "recompute": "selective", "zero": 1}}, {}),
    "gpt3-175b 64x A100 tp8 pp8": (
        {"model": {"name": "gpt3-175b"}, "cluster": {"name": "dgx-a100", "nodes": 8},
         "strategy": {"tp": 8, "pp": 8, "dp": 1, "global_batch": 16, "sequence_parallel": True,
                      "recompute": "selective", "zero": 1}}, {}),
}


def engine_inputs(job: Any, options: dict[str, Any]) -> tuple[ExecutionGraph, dict[str, Any]]:  # noqa: ANN401
    """The first graph and engine settings api.simulate hands sim.engine.run for the job."""
    seen: list[tuple[ExecutionGraph, dict[str, Any]]] = []

    def capture(graph: ExecutionGraph, **kw: Any) -> SimTrace:  # noqa: ANN401
        kw.pop("progress", None)
        seen.append((graph, kw))
        return run(graph, **kw)

    original = api.run
    api.run = capture  # type: ignore[assignment]
    try:
        api.simulate(job if job is not None else api.default_job(), **options)
    finally:
        api.run = original  # type: ignore[assignment]
    return seen[0]


def same(a: Any, b: Any) -> bool:  # noqa: ANN401
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=10,
                    help="warm calls per engine and case (the best is printed)")
    ap.add_argument("--only", default="", help="run the cases whose name contains this")
    args = ap.parse_args()
    print(f"{'case':<56}{'tasks':>7}{'before ms':>11}{'now ms':>9}{'speed-up':>10}  same trace")
    for name, (job, options) in CASES.items():
        if args.only not in name:
            continue
        graph, kw = engine_inputs(job, options)
        new, ref = run(graph, **kw), reference_run(graph, **kw)
        agree = all(same(getattr(new, f), getattr(ref, f)) for f in SimTrace.__dataclass_fields__)
        best = {"before": math.inf, "now": math.inf}
        for _ in range(args.repeat):
            for key, engine in (("before", reference_run), ("now", run)):
                t0 = time.perf_counter()
                engine(graph, **kw)
                best[key] = min(best[key], time.perf_counter() - t0)
        print(f"{name:<56}{len(graph):>7}{best['before'] * 1e3:>11.2f}{best['now'] * 1e3:>9.2f}"
              f"{best['before'] / best['now']:>9.2f}x  {agree}")


if __name__ == "__main__":
    main()
