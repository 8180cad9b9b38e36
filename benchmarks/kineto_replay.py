"""Kineto trace replay: every shared single-rank trace (../shared/traces) read, built into the replay graph
and run by the engine; measured vs replayed step time.

    .venv/bin/python benchmarks/kineto_replay.py

Columns: file, steps, measured ms (sum over steps), replayed ms, mean error % over steps, the error with
the median launch latency instead of each op's measured one ("model lat %"), parse / build / replay seconds.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from trainsim.replay import replay_trace
from trainsim.trace.kineto import read_kineto

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"


def main() -> int:
    """Print the table; 1 if the traces are absent."""
    if not TRACES.is_dir():
        print(f"no traces at {TRACES}", file=sys.stderr)
        return 1
    print(f"{'file':<62} {'steps':>5} {'meas ms':>10} {'repl ms':>10} {'err %':>7} {'model lat %':>11} "
          f"{'tasks':>7} {'parse s':>7} {'build s':>7} {'replay s':>8}")
    errs, model = [], []
    for p in sorted(TRACES.rglob("*.json.gz")):
        tr = read_kineto(p)
        r = replay_trace(p)
        m = replay_trace(tr, measured_latency=False)
        meas, rep = sum(s.measured_ms for s in r.steps), sum(s.replayed_ms for s in r.steps)
        errs.append(r.replay_error_pct)
        model.append(m.replay_error_pct)
        print(f"{str(p.relative_to(TRACES))[-62:]:<62} {len(r.steps):>5} {meas:10.3f} {rep:10.3f} "
              f"{r.replay_error_pct:7.3f} {m.replay_error_pct:11.3f} {r.n_tasks:>7} {r.parse_s:7.3f} "
              f"{r.build_s:7.3f} {r.replay_s:8.3f}")
    print(f"median error {statistics.median(errs):.3f}% (max {max(errs):.3f}%); with median launch latency "
          f"{statistics.median(model):.3f}% (max {max(model):.3f}%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
