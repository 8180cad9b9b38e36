"""Run the CLI as a user would (a subprocess with a time and memory limit) and check its promise.

The promise (README, DEVELOPERS): every run ends in exit 0, or exit 2 with exactly one stderr line and
no new file; never a traceback, never a hang, never unbounded memory.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

TIMEOUT_S = 60.0  # a refused input must be refused at once; an accepted one in well under this
MEMORY_LIMIT_BYTES = 6 * 2**30  # address space of one run


@dataclass
class Run:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    new_files: list[str]


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))


def _listing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def run_cli(argv: list[str], cwd: Path, stdin: str | None = None) -> Run:
    """`python -m trainsim ARGV` in `cwd` under the limits; the files it left in `cwd` are listed."""
    before = _listing(cwd)
    env = {**os.environ, "COLUMNS": "80", "PYTHONHASHSEED": "0"}
    try:
        p = subprocess.run([sys.executable, "-m", "trainsim", *argv], cwd=cwd, capture_output=True, text=True,
                           timeout=TIMEOUT_S, preexec_fn=_limit_memory, env=env, input=stdin,
                           errors="replace")
    except subprocess.TimeoutExpired:
        raise AssertionError(f"hang: trainsim {argv!r} ran past {TIMEOUT_S:.0f} s") from None
    new = sorted(_listing(cwd) - before)
    return Run(argv, p.returncode, p.stdout, p.stderr, new)


def check_promise(run: Run, outputs: tuple[str, ...] = ()) -> None:
    """Exit 0 (only the asked-for outputs are new), or exit 2 with one `error:` line and nothing new
    (or `validate --max-mape`'s exit 1 with its one line)."""
    where = f"trainsim {run.argv!r}"
    assert "Traceback" not in run.stderr and "Traceback" not in run.stdout, f"traceback from {where}:\n{run.stderr}"
    if run.returncode == 1 and "--max-mape" in run.argv:  # validate's documented check: MAPE above the bound
        assert run.stderr.startswith("MAPE ") and run.stderr.count("\n") == 1, repr(run.stderr)
        return
    assert run.returncode in (0, 2), f"exit {run.returncode} from {where}:\n{run.stderr[-2000:]}"
    if run.returncode == 2:
        lines = run.stderr.splitlines()  # exactly one line: no blank line before or after it either
        assert len(lines) == 1 and run.stderr.endswith("\n"), f"stderr from {where} is not one line:\n{run.stderr!r}"
        assert lines[0].startswith("error: "), f"not an error line from {where}: {lines[0]!r}"
        assert not run.new_files, f"{where} failed but left {run.new_files}"
    else:
        stray = [f for f in run.new_files if not any(f == o or f.startswith(o.rstrip("/") + "/") for o in outputs)]
        assert not stray, f"{where} left files it was not asked for: {stray}"
        assert not [f for f in run.new_files if f.endswith(".part")], f"{where} left temporary files"


def run_example(argv: list[str], files: dict[str, bytes]) -> Run:
    """Run `argv` in a fresh directory holding `files` and an empty folder `sub/`."""
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        (root / "sub").mkdir()
        for name, data in files.items():
            (root / name).write_bytes(data)
        return run_cli(argv, root)
