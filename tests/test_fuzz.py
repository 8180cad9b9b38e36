"""Fuzz every command: argument lists, YAML documents, CSV files and trace files (tests/fuzz_inputs.py).

Each example runs `python -m trainsim ...` in a fresh directory under a time and memory limit and checks
the promise (fuzz_helpers.check_promise): exit 0, or exit 2 with one stderr line and no new file.
Examples are derandomised so CI is repeatable; TRAINSIM_FUZZ_EXAMPLES=N runs N fresh random ones per
command. benchmarks/input_fuzz.py runs the same strategies and prints the tally per command.
"""

from __future__ import annotations

import os

import pytest
from fuzz_helpers import check_promise, run_example
from fuzz_inputs import COMMANDS, Example, asked_outputs
from hypothesis import HealthCheck, given, settings

_N = int(os.environ.get("TRAINSIM_FUZZ_EXAMPLES", "0"))
EXAMPLES = {"simulate (flags)": 30, "simulate (YAML job)": 30, "collective": 30, "validate": 15, "calibrate": 8,
            "chakra export": 12, "chakra export (YAML job)": 6, "chakra run (trace files)": 15,
            "models, clusters, help, version": 8}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_fuzz_command_keeps_the_promise(command: str) -> None:
    @settings(max_examples=_N or EXAMPLES[command], derandomize=not _N, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(COMMANDS[command])
    def check(example: Example) -> None:
        argv, files = example
        check_promise(run_example(argv, files), asked_outputs(argv))

    check()


def test_every_command_is_fuzzed() -> None:
    """A new command must get a strategy in fuzz_inputs.COMMANDS (and so inherit the promise's test)."""
    from trainsim.cli import app
    from trainsim.cli_chakra import chakra_app

    names = {c.name or c.callback.__name__ for c in app.registered_commands}
    names |= {f"chakra {c.name or c.callback.__name__}" for c in chakra_app.registered_commands}
    covered = " | ".join(COMMANDS)
    assert all(n in covered for n in names), sorted(n for n in names if n not in covered)
    assert set(EXAMPLES) == set(COMMANDS)
