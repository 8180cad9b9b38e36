"""Fuzz every command: argument lists, YAML documents, CSV files and trace files (tests/fuzz_inputs.py).

Each example runs `python -m trainsim ...` in a fresh directory under a time and memory limit and checks
the promise (fuzz_helpers.check_promise): exit 0, or exit 2 with one stderr line and no new file.
Examples are derandomised so CI is repeatable; TRAINSIM_FUZZ_EXAMPLES=N runs N fresh random ones per
command. benchmarks/input_fuzz.py runs the same strategies and prints the tally per command.
"""

from __future__ import annotations

import math
import os

import pytest
from fuzz_helpers import check_promise, run_example
from fuzz_inputs import COMMANDS, Example, asked_outputs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import trainsim
from trainsim.api import keyword_sections

_N = int(os.environ.get("TRAINSIM_FUZZ_EXAMPLES", "0"))
EXAMPLES = {"simulate (flags)": 30, "simulate (YAML job)": 30, "collective": 30, "validate": 15, "calibrate": 8,
            "chakra export": 12, "chakra export (YAML job)": 6, "chakra run (trace files)": 15,
            "replay | scale | optimize (trace files)": 25, "sweep": 20, "search": 15, "astra run": 20,
            "collective (ASTRA-sim configs)": 20, "predictor train | predictor eval": 15,
            "simulate | validate --compute learned:FILE": 12, "report | simulate --report": 25,
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
    from trainsim.cli_astra import astra_app
    from trainsim.cli_chakra import chakra_app
    from trainsim.cli_predictor import predictor_app

    names = {c.name or c.callback.__name__ for c in app.registered_commands}
    names |= {f"chakra {c.name or c.callback.__name__}" for c in chakra_app.registered_commands}
    names |= {f"astra {c.name or c.callback.__name__}" for c in astra_app.registered_commands}
    names |= {f"predictor {c.name or c.callback.__name__}" for c in predictor_app.registered_commands}
    covered = " | ".join(COMMANDS)
    assert all(n in covered for n in names), sorted(n for n in names if n not in covered)
    assert set(EXAMPLES) == set(COMMANDS)


API_VALUES = st.one_of(st.sampled_from([None, True, 0, 1, 2, 4, 8, -1, 1.5, float("nan"), float("inf"), 10**15, "",
                                        "x", "gpt2", "bf16", "full", "1f1b", "Ring(4)_Switch(2)", [1.0], [], {}]),
                       st.text(max_size=4))


@settings(max_examples=_N or 60, derandomize=not _N, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(st.dictionaries(st.sampled_from(sorted(set(keyword_sections()) - {"exact"}) + ["nodez"]), API_VALUES,
                      max_size=4),
       st.sampled_from(["gpt2", "no-such", 3, {"name": "gpt2"}, None]),
       st.sampled_from(["pcie-titanxp", "dgx-a100", "x", None, ["dgx-a100"]]),
       st.sampled_from([None, {"tp": 2}, "tp=8", {"tp": True}, {"pp": 2, "global_batch": 8}]))
def test_fuzz_python_api_raises_only_config_errors(options: dict, model: object, cluster: object,
                                                   strategy: object) -> None:
    """trainsim.simulate with any keywords returns a result or raises trainsim.ConfigError, nothing else."""
    try:
        r = trainsim.simulate(model=model, cluster=cluster, strategy=strategy, **options)
    except trainsim.ConfigError as exc:
        assert "\n" not in exc.one_line()
        return
    assert math.isfinite(r.iteration_time_s) and r.iteration_time_s > 0
