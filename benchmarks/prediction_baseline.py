"""Do predictions move? Every row of every shared validation file, predicted by `trainsim validate`, against
a recorded baseline: a speed-up that must keep the event simulation's answers (issue 21: no row may move by
more than 1e-9 relative, except a named bug fix) checks itself with this.

    python benchmarks/prediction_baseline.py            # compare with benchmarks/data/prediction_baseline.json
    python benchmarks/prediction_baseline.py --write    # record the current predictions as the baseline

Prints, per file, the rows compared, the largest relative change and how many rows moved past --tol; exits 1
when any did (or a row appeared, vanished or changed between compared and skipped). Needs ../shared beside
the clone. Runs in about a minute on 2 cores (--jobs).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "validation"
BASELINE = ROOT / "benchmarks" / "data" / "prediction_baseline.json"
FILES = ("training_runs.csv", "vtrain/ground_truth_single.csv", "vtrain/ground_truth_multi.csv", "collectives.csv",
         "astra_reference.csv", "memory_runs.csv", "moe_runs.csv", "alltoall.csv")


def predictions(name: str, jobs: int) -> dict[str, float | None]:
    """Row index -> predicted value (None: the row is skipped), from `trainsim validate FILE --json`."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "v.json"
        run = subprocess.run([sys.executable, "-m", "trainsim", "validate", str(SHARED / name), "--json", str(out),
                              "--jobs", str(jobs), "-q"], capture_output=True, text=True)
        if not out.exists():
            sys.exit(f"validate {name} failed (exit {run.returncode}): {run.stderr.strip()[-500:]}")
        data = json.loads(out.read_text())
    rows: dict[str, float | None] = {str(r["row"]): r["predicted"] for r in data["rows"]}
    rows.update({str(r["row"]): None for r in data["skipped_rows"]})
    return rows


def compare(name: str, base: dict[str, float | None], now: dict[str, float | None], tol: float) -> int:
    """Print one line for the file (and its worst rows); return how many rows moved past tol."""
    moved: list[tuple[float, str]] = []
    for row in sorted(set(base) | set(now), key=int):
        a, b = base.get(row, "absent"), now.get(row, "absent")
        if a is None or b is None or isinstance(a, str) or isinstance(b, str):
            if a != b:
                moved.append((float("inf"), f"row {row}: {a} -> {b}"))
            continue
        rel = abs(b - a) / abs(a) if a else abs(b)
        if rel > tol:
            moved.append((rel, f"row {row}: {a:.12g} -> {b:.12g} ({rel:.2e})"))
    compared = sum(1 for r in base if base[r] is not None)
    worst = max((abs(now[r] - base[r]) / abs(base[r]) for r in base
                 if base[r] and isinstance(now.get(r), float)), default=0.0)
    print(f"{name:<34} {compared:5d} rows predicted  max relative change {worst:.2e}  moved past {tol:g}: {len(moved)}")
    for _, text in sorted(moved, reverse=True)[:5]:
        print(f"    {text}")
    return len(moved)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="record the current predictions as the baseline")
    ap.add_argument("--tol", type=float, default=1e-9, help="relative change allowed (default 1e-9)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    if not SHARED.is_dir():
        sys.exit(f"no {SHARED}: the shared validation files must be beside the clone")
    now = {name: predictions(name, args.jobs) for name in FILES}
    if args.write:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
        BASELINE.write_text(json.dumps({"commit": commit.stdout.strip(), "files": now}, indent=1) + "\n")
        print(f"wrote {BASELINE.relative_to(ROOT)}: {sum(len(v) for v in now.values())} rows of {len(FILES)} files")
        return
    base = json.loads(BASELINE.read_text())
    print(f"against the baseline of commit {base['commit']}")
    moved = sum(compare(name, base["files"].get(name, {}), now[name], args.tol) for name in FILES)
    sys.exit(1 if moved else 0)


if __name__ == "__main__":
    main()
