"""Bad input: one line on stderr naming the field, exit code 2, never a traceback (CLI in a subprocess)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainsim", *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd)


def assert_one_line_error(p: subprocess.CompletedProcess, *names: str) -> str:
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr and "Traceback" not in p.stdout
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    line = lines[0]
    for name in names:
        assert name in line, line
    return line


@pytest.mark.parametrize(("args", "names"), [
    (["--model", "no-such-model", "--cluster", "dgx-a100"], ["model", "no-such-model"]),
    (["--model", "gpt2", "--cluster", "no-such-cluster"], ["cluster", "no-such-cluster"]),
    # 40 GPUs = 5 DGX nodes, so the world size fits and only the head count is wrong
    (["--model", "gpt2", "--cluster", "dgx-a100", "--nodes", "5", "--tp", "5", "--dp", "8"], ["tp", "12"]),
    # a single 8-GPU box: the fix is another dp, not more nodes
    (["--model", "gpt2", "--cluster", "pcie-titanxp", "--dp", "3", "--tp", "2", "--pp", "2"],
     ["strategy.dp", "12", "8 GPUs", "--dp 2"]),
    (["--model", "gpt2", "--cluster", "dgx-a100", "--dp", "3", "--tp", "2", "--pp", "2"], ["strategy.dp", "12"]),
    (["--model", "gpt2", "--cluster", "pcie-titanxp", "--dp", "1", "--tp", "2", "--pp", "2"], ["dp", "8"]),
    (["--model", "gpt2", "--cluster", "pcie-titanxp", "--dp", "2", "--tp", "2", "--pp", "2", "--global-batch", "7"],
     ["global_batch", "7"]),
    (["--model", "gpt2", "--cluster", "pcie-titanxp", "--zero", "4"], ["zero"]),
    (["--model", "gpt2", "--cluster", "pcie-titanxp", "--recompute", "sometimes"], ["recompute"]),
    (["--model", "gpt2", "--cluster", "pcie-titanxp", "--schedule", "zb-v"], ["schedule"]),
    (["--model", "gpt2", "--cluster", "pcie-titanxp", "--tp", "2", "--dp", "4", "--sp", "--pp", "1",
      "--vpp", "2"], ["vpp"]),
    (["--model", "gpt2", "--cluster", "pcie-titanxp", "--pp", "2", "--vpp", "2", "--global-batch", "16",
      "--schedule", "gpipe"], ["schedule", "vpp"]),
    (["--model", "custom", "--layers", "2", "--cluster", "pcie-titanxp"], ["model", "hidden"]),
    (["--model", "gpt2", "--cluster", "pcie-titanxp", "--seq-len", "-5"], ["seq_len"]),
])
def test_bad_flags_give_one_line_naming_the_field(args: list[str], names: list[str]) -> None:
    assert_one_line_error(run_cli("simulate", *args, "-q"), *names)


def test_malformed_yaml_names_the_file_and_line(tmp_path: Path) -> None:
    cfg = tmp_path / "job.yaml"
    cfg.write_text("model:\n  name: gpt2\nstrategy: [tp: 2\n  pp: {\n")
    line = assert_one_line_error(run_cli("simulate", str(cfg), "-q"), "config", "job.yaml")
    assert "line" in line


def test_unknown_yaml_key_is_named(tmp_path: Path) -> None:
    cfg = tmp_path / "job.yaml"
    cfg.write_text("model:\n  name: gpt2\nstrategy:\n  tp: 2\n  tensor_parallel_size: 4\n")
    assert_one_line_error(run_cli("simulate", str(cfg), "-q"), "strategy.tensor_parallel_size")


def test_yaml_that_is_not_a_mapping(tmp_path: Path) -> None:
    cfg = tmp_path / "job.yaml"
    cfg.write_text("- gpt2\n- dgx-a100\n")
    assert_one_line_error(run_cli("simulate", str(cfg), "-q"), "config")


def test_missing_yaml_file(tmp_path: Path) -> None:
    assert_one_line_error(run_cli("simulate", str(tmp_path / "nope.yaml"), "-q"), "nope.yaml")


def test_unknown_flag_is_a_usage_error() -> None:
    assert_one_line_error(run_cli("simulate", "--tensor-parallel", "2"), "--tensor-parallel")


def test_yaml_errors_match_flag_errors(tmp_path: Path) -> None:
    """A YAML job and the equivalent flags hit the same check."""
    cfg = tmp_path / "job.yaml"
    cfg.write_text("model: {name: gpt2}\ncluster: {name: dgx-a100, nodes: 5}\nstrategy: {tp: 5, dp: 8}\n")
    from_yaml = assert_one_line_error(run_cli("simulate", str(cfg), "-q"), "tp")
    from_flags = assert_one_line_error(
        run_cli("simulate", "--model", "gpt2", "--cluster", "dgx-a100", "--nodes", "5", "--tp", "5", "--dp", "8", "-q"),
        "tp")
    assert from_yaml == from_flags


def test_a_valid_job_exits_zero_with_nothing_on_stderr() -> None:
    p = run_cli("simulate", "--model", "gpt2", "--cluster", "pcie-titanxp", "--tp", "2", "--pp", "2",
                "--global-batch", "8", "-q")
    assert p.returncode == 0, p.stderr
    assert p.stderr.strip() == ""
