"""Tally of the input promise per command: random bad (and good) inputs plus issue 13's named cases.

Every run must end in exit 0, or exit 2 with one stderr line and no new file, within the time and memory
limit (tests/fuzz_helpers.py). This prints, per command, the cases tried and how they ended: the table
of issue 13's acceptance. Usage: python benchmarks/input_fuzz.py [EXAMPLES_PER_COMMAND] [SEED]
"""

from __future__ import annotations

import sys
import tempfile
import time
import warnings
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fuzz_helpers import Run, run_cli, run_example  # noqa: E402
from fuzz_inputs import COMMANDS, asked_outputs  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import seed as hypothesis_seed  # noqa: E402
from named_cases import CASES  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402


def classify(run: Run | None, outputs: tuple[str, ...]) -> str:
    """How one run ended: ok-0, ok-2, or the broken promise."""
    if run is None:
        return "hang"
    if "Traceback" in run.stderr or "Traceback" in run.stdout:
        return "traceback"
    if run.returncode == 0:
        stray = [f for f in run.new_files if not any(f == o or f.startswith(o.rstrip("/") + "/") for o in outputs)]
        return "left files" if stray else "ok-0"
    if run.returncode == 1 and "--max-mape" in run.argv and run.stderr.startswith("MAPE ") \
            and run.stderr.count("\n") == 1:
        return "ok-0"  # validate's check failing is its documented exit 1
    if run.returncode != 2:
        return f"exit {run.returncode}"
    if run.new_files:
        return "left files"
    lines = run.stderr.splitlines()
    return "ok-2" if len(lines) == 1 and lines[0].startswith("error: ") else "not one line"


def _safe(fn, *args) -> Run | None:  # noqa: ANN001
    try:
        return fn(*args)
    except AssertionError:  # run_cli raises on a hang
        return None


def draw_examples(command: str, n: int, seed: int) -> list[tuple[list[str], dict[str, bytes]]]:
    out: list[tuple[list[str], dict[str, bytes]]] = []

    @hypothesis_seed(seed)
    @settings(max_examples=n, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(COMMANDS[command])
    def collect(example: tuple[list[str], dict[str, bytes]]) -> None:
        out.append(example)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        collect()
    return out[:n]


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    tally: dict[str, Counter[str]] = defaultdict(Counter)
    broken: list[str] = []
    t0 = time.perf_counter()
    jobs: list[tuple[str, list[str], dict[str, bytes]]] = []
    for command in COMMANDS:
        jobs += [(command, argv, files) for argv, files in draw_examples(command, n, seed)]

    def one(job: tuple[str, list[str], dict[str, bytes]]) -> tuple[str, str, list[str]]:
        command, argv, files = job
        return command, classify(_safe(run_example, argv, files), asked_outputs(argv)), argv

    def named(case) -> tuple[str, str, list[str]]:  # noqa: ANN001
        with tempfile.TemporaryDirectory() as d:
            for name, data in case.files.items():
                (Path(d) / name).write_bytes(data)
            run = _safe(run_cli, case.argv, Path(d))
        verdict = classify(run, case.outputs)
        if run is not None and verdict.startswith("ok") and run.returncode != case.rc:
            verdict = f"exit {run.returncode} (expected {case.rc})"
        return f"named: {case.command}", verdict, case.argv

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(one, jobs)) + list(pool.map(named, CASES))
    for command, verdict, argv in results:
        tally[command][verdict] += 1
        if not verdict.startswith("ok"):
            broken.append(f"{command}: {verdict}: trainsim {' '.join(argv)}")
    table = Table(title=f"Input promise: {n} random examples per command (seed {seed}) + {len(CASES)} named cases")
    for col in ("command", "tried", "exit 0", "exit 2, one line", "hangs", "tracebacks", "files left", "other"):
        table.add_column(col, justify="right" if col != "command" else "left")
    for command in sorted(tally):
        c = tally[command]
        other = sum(v for k, v in c.items() if k not in ("ok-0", "ok-2", "hang", "traceback", "left files"))
        table.add_row(command, str(sum(c.values())), str(c["ok-0"]), str(c["ok-2"]), str(c["hang"]),
                      str(c["traceback"]), str(c["left files"]), str(other))
    total = Counter()
    for c in tally.values():
        total.update(c)
    table.add_row("all", str(sum(total.values())), str(total["ok-0"]), str(total["ok-2"]), str(total["hang"]),
                  str(total["traceback"]), str(total["left files"]),
                  str(sum(v for k, v in total.items() if k not in ("ok-0", "ok-2", "hang", "traceback", "left files"))))
    Console(width=120).print(table)
    for line in broken:
        print("BROKEN", line)
    print(f"{len(results)} runs in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
