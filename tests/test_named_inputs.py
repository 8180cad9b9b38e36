"""Issue 13's bad inputs by name (tests/named_cases.py) and the output guarantees of trainsim.files."""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

import pytest
from fuzz_helpers import check_promise, run_cli
from named_cases import CASES, Case

from trainsim.errors import ConfigError
from trainsim.files import Outputs, check_output, load_yaml, parse_json, parse_yaml, read_csv, read_text

GPT2 = ["--model", "gpt2", "--cluster", "pcie-titanxp", "--tp", "2", "--pp", "2", "--global-batch", "8"]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_named_case_keeps_the_promise(case: Case, tmp_path: Path) -> None:
    if "/dev/full" in case.argv and not Path("/dev/full").exists():
        pytest.skip("no /dev/full here")
    for name, data in case.files.items():
        (tmp_path / name).write_bytes(data)
    run = run_cli(case.argv, tmp_path)
    check_promise(run, case.outputs)
    assert run.returncode == case.rc, (run.returncode, run.stderr)
    line = run.stderr.strip()
    for name in case.names:
        assert name.lower() in line.lower(), f"{case.name}: '{name}' not in {line!r}"


def test_empty_numeric_cell_is_a_skipped_row_not_a_crash(tmp_path: Path) -> None:
    case = next(c for c in CASES if c.name == "validate: empty numeric cell")
    (tmp_path / "cases.csv").write_bytes(case.files["cases.csv"])
    check_promise(run_cli(case.argv, tmp_path), case.outputs)
    data = json.loads((tmp_path / "v.json").read_text())
    assert [r["row"] for r in data["skipped_rows"]] == [0] and "iteration time" in data["skipped_rows"][0]["reason"]
    assert [r["row"] for r in data["rows"]] == [1]


def test_failed_run_leaves_the_earlier_outputs_untouched(tmp_path: Path) -> None:
    (tmp_path / "o.json").write_text("old")
    run = run_cli(["simulate", *GPT2, "--json", "o.json", "--trace", "nonexistent/t.json", "-q"], tmp_path)
    check_promise(run)
    assert run.returncode == 2 and (tmp_path / "o.json").read_text() == "old"


def test_symlink_output_writes_through_the_link(tmp_path: Path) -> None:
    target = tmp_path / "real.json"
    target.write_text("old")
    (tmp_path / "link.json").symlink_to(target)
    run = run_cli(["simulate", *GPT2, "--json", "link.json", "-q"], tmp_path)
    check_promise(run)
    assert run.returncode == 0
    assert (tmp_path / "link.json").is_symlink() and json.loads(target.read_text())["n_gpus"] == 8


def test_json_to_stdout_with_dash_and_dev_stdout(tmp_path: Path) -> None:
    for path in ("-", "/dev/stdout"):
        run = run_cli(["simulate", *GPT2, "--json", path], tmp_path)
        check_promise(run)
        assert run.returncode == 0, run.stderr
        assert json.loads(run.stdout)["n_gpus"] == 8  # the summary stays off stdout when JSON goes there


def test_every_json_output_can_go_to_stdout_alone(tmp_path: Path) -> None:
    """`--json -` on each command that has it: stdout is exactly the JSON (reports and progress stay off it)."""
    (tmp_path / "c.csv").write_text("source_id,collective,size_bytes,time_us,n_gpus,n_nodes,gpus_per_node,gpu,"
                                    "inter_fabric\nx,all_reduce,1048576,100,8,1,8,A100,NVLink\n")
    for argv, key in ((["validate", "c.csv", "--json", "-"], "summary"),
                      (["collective", "--cluster", "dgx-a100", "--ranks", "8", "--json", "-"], "time_us"),
                      (["simulate", *GPT2, "--json", "/dev/stdout"], "iteration_time_s")):
        run = run_cli(argv, tmp_path)
        check_promise(run)
        assert run.returncode == 0, run.stderr
        assert key in json.loads(run.stdout), argv


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
def test_device_output_is_written_in_place_not_replaced(tmp_path: Path) -> None:
    run = run_cli(["simulate", *GPT2, "--json", "o.json", "--trace", "/dev/full", "-q"], tmp_path)
    check_promise(run)
    assert run.returncode == 2 and not (tmp_path / "o.json").exists()
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def test_chakra_export_prefix_cannot_escape(tmp_path: Path) -> None:
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    run = run_cli(["chakra", "export", *GPT2, "--out", "et", "--prefix", "../../escape"], work)
    check_promise(run)
    assert run.returncode == 2 and not list(tmp_path.rglob("escape*"))


def test_chakra_export_writes_every_file_or_none(tmp_path: Path) -> None:
    run = run_cli(["chakra", "export", *GPT2, "--out", "et", "--prefix", "g"], tmp_path)
    check_promise(run, ("et",))
    assert sorted(p.name for p in (tmp_path / "et").iterdir()) == [*(f"g.{r}.et" for r in range(8)),
                                                                   "g.comm_group.json"]


def test_plot_without_matplotlib_fails_before_simulating(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """matplotlib hidden (the test extra installs it): --plot and report --format png are refused in one line
    before any row is simulated or any input read."""
    import importlib.util

    from cli_helpers import one_line_error

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    header = "# GPUs,global batch,micro batch,hidden size,attention heads,# layers,sequence length," \
             "tensor parallelism,data parallelism,pipeline parallelism,iteration time (ms)\n"
    (tmp_path / "c.csv").write_text(header + "8,16,2,1024,16,4,512,2,4,1,120\n")
    err = one_line_error(["validate", str(tmp_path / "c.csv"), "--plot", str(tmp_path / "p.png")], capsys)
    assert "matplotlib" in err and "trainsim[plot]" in err
    err = one_line_error(["report", str(tmp_path / "missing.json"), "--format", "png", "-o", str(tmp_path / "png")],
                         capsys)
    assert "matplotlib" in err and "trainsim[report]" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.csv"]


# ------------------------------------------------------------------ trainsim.files, in process


def test_all_or_nothing_when_a_later_output_fails(tmp_path: Path) -> None:
    outs = Outputs()
    first, second = outs.add(tmp_path / "a.json", "--json"), outs.add(tmp_path / "b.json", "--trace")
    (tmp_path / "a.json").write_text("old")

    def disk_full(fh) -> None:  # noqa: ANN001
        fh.write(b"x" * 1000)
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(ConfigError, match="--trace.*No space left"):
        outs.write({first: "new", second: disk_full})
    assert (tmp_path / "a.json").read_text() == "old" and not (tmp_path / "b.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]  # no temporary file left


def test_replaced_file_keeps_its_permissions(tmp_path: Path) -> None:
    p = tmp_path / "o.json"
    p.write_text("old")
    p.chmod(0o640)
    outs = Outputs()
    t = outs.add(p, "--json")
    outs.write({t: "new"})
    assert p.read_text() == "new" and stat.S_IMODE(p.stat().st_mode) == 0o640


def test_output_checks_name_the_field(tmp_path: Path) -> None:
    for path, words in (("", "empty"), (str(tmp_path), "directory"), (str(tmp_path / "no" / "x.json"), "exist")):
        with pytest.raises(ConfigError, match=words) as exc:
            check_output(path, "--json")
        assert exc.value.field == "--json"
    assert check_output("-", "--json").to_stdout


@pytest.mark.parametrize(("text", "words"), [
    ("a: 1\na: 2\n", "twice"),
    ("a: &x [*x]\n", "cycle"),
    ("[" * 5000, "nested"),
    ("a: [1, 2\n", "malformed"),
    ("!!python/object/apply:os.system ['true']\n", "malformed"),  # no object construction
])
def test_yaml_refusals(text: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        parse_yaml(text, "config", "job.yaml")


def test_yaml_merge_keys_and_shared_anchors_still_load() -> None:
    doc = "base: &b {tp: 2, pp: 2}\njob: {<<: *b, tp: 4}\nother: *b\n"
    data = parse_yaml(doc, "config", "job.yaml")
    assert data["job"] == {"tp": 4, "pp": 2} and data["other"] == {"tp": 2, "pp": 2}


def test_alias_bomb_is_counted_not_built() -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    with pytest.raises(ConfigError, match="expands"):
        parse_yaml("\n".join(lines) + "\n", "config", "bomb.yaml")


def test_json_refuses_nan_and_deep_nesting() -> None:
    with pytest.raises(ConfigError, match="NaN"):
        parse_json('{"a": NaN}', "--comm-groups", "g.json")
    with pytest.raises(ConfigError, match="nested"):
        parse_json("[" * 100 + "]" * 100, "--comm-groups", "g.json")
    assert parse_json('{"a": [1, 2]}', "f", "g.json") == {"a": [1, 2]}


def test_readers_bound_size_and_decode(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * 2048)
    with pytest.raises(ConfigError, match="limit"):
        read_text(big, "config", max_bytes=1024)
    bom = tmp_path / "bom.csv"
    bom.write_bytes("\ufeffa,b\n1,\n".encode())
    assert read_csv(bom, "CASES") == (["a", "b"], [{"a": "1", "b": ""}])
    with pytest.raises(ConfigError, match="directory"):
        load_yaml(tmp_path, "config")


def test_sigterm_mid_export_leaves_nothing(tmp_path: Path) -> None:
    """A run stopped by SIGTERM (a timeout, a scheduler) removes what it had half-written, like Ctrl-C."""
    import signal
    import subprocess
    import sys
    import time

    p = subprocess.Popen([sys.executable, "-m", "trainsim", "chakra", "export", "--granularity", "auto", "--out", "et"],
                         cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not list(tmp_path.rglob("*.part")) and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.05)  # until the first rank's file is being written
    assert list(tmp_path.rglob("*.part")), "the export never started writing"
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130 and "Traceback" not in err, err
    assert not list(tmp_path.iterdir())  # no partial file, no temporary file, no empty directory


def test_export_that_cannot_fit_the_disk_is_refused_before_writing(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from trainsim.api import simulate
    from trainsim.trace import chakra

    res = simulate(model="gpt2", cluster="pcie-titanxp", strategy={"tp": 2, "pp": 2, "global_batch": 8},
                   granularity="layer")
    real = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(chakra.shutil, "disk_usage", lambda p: real._replace(free=10_000))
    with pytest.raises(ConfigError, match="--out.*GiB free"):
        chakra.write_chakra(res.graph, tmp_path / "et", "g")
    assert not list(tmp_path.iterdir())
