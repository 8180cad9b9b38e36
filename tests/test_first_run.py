"""A user's first commands: flags change the default job, the output says what ran, 80-column output."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from trainsim import __version__
from trainsim.api import default_job, simulate
from trainsim.cli import main
from trainsim.config import DEFAULT_JOB, apply_flags, describe_flags, parse_job
from trainsim.report.summary import print_summary
from trainsim.workload.zoo import build_model


def run_cli(*args: str, columns: int | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **({"COLUMNS": str(columns)} if columns else {})}
    return subprocess.run([sys.executable, "-m", "trainsim", *args], capture_output=True, text=True, timeout=120,
                          env=env)


def run_json(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "r.json"
    main(["simulate", *args, "-q", "--json", str(out)])
    return json.loads(out.read_text())


def flags(**sections: dict) -> dict:
    return {sec: dict(sections.get(sec, {})) for sec in ("model", "cluster", "strategy", "simulation")}


# ---- layering: flags change the default job ----------------------------------------------------------------

def test_one_setting_flag_keeps_the_default_job(tmp_path: Path) -> None:
    r = run_json(tmp_path, "--recompute", "full")
    s = r["strategy"]
    assert r["n_gpus"] == 1024 and r["model"] == "gpt3-175b" and r["seq_len"] == 2048
    assert (s["tp"], s["pp"], s["dp"], s["recompute"], s["zero"], s["sequence_parallel"]) == (8, 16, 8, "full", 1, True)
    assert s["global_batch"] == 1536 and not r["oom"]


def test_an_empty_job_file_is_the_default_job(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert run_json(tmp_path, str(empty))["iteration_time_s"] == pytest.approx(
        simulate(default_job()).iteration_time_s, rel=1e-12)
    assert parse_job(apply_flags({}, flags()).data) == parse_job(apply_flags(None, flags()).data) == default_job()


def test_another_model_replaces_the_defaults_recipe() -> None:
    job = apply_flags(None, flags(model={"name": "gpt2"}))
    assert job.from_default and job.data["model"] == {"name": "gpt2"}
    assert job.data["cluster"] == {"name": "dgx-a100"}  # one node: the GPT-3 sizes went with GPT-3
    assert {"tp", "pp", "dp", "global_batch", "sequence_parallel"}.isdisjoint(job.data["strategy"])
    assert job.data["strategy"]["recompute"] == "selective" and job.data["strategy"]["zero"] == 1
    assert any("seq_len" in n for n in job.notes)
    r = simulate(parse_job(job.data))
    assert r.n_gpus == 8 and r.strategy["dp"] == 8 and not r.oom
    # the same model named again is no new model: the default stays
    same = apply_flags(None, flags(model={"name": "gpt3-175b"})).data
    assert parse_job(same) == parse_job(DEFAULT_JOB)


@pytest.mark.parametrize(("given", "gone", "kept"), [
    ({"strategy": {"tp": 4}}, ("strategy", "dp"), ("cluster", "nodes")),
    ({"strategy": {"pp": 8}}, ("strategy", "dp"), ("cluster", "nodes")),
    ({"cluster": {"nodes": 64}}, ("strategy", "dp"), ("strategy", "pp")),
    ({"cluster": {"name": "dgx-h100"}}, ("strategy", "dp"), ("cluster", "nodes")),
    ({"strategy": {"dp": 4}}, ("cluster", "nodes"), ("strategy", "tp")),
    ({"cluster": {"topology": "conv-4d"}}, ("cluster", "nodes"), ("strategy", "tp")),
])
def test_size_flags_drop_the_size_they_contradict(given: dict, gone: tuple[str, str], kept: tuple[str, str]) -> None:
    job = apply_flags(None, flags(**given))
    assert gone[1] not in job.data[gone[0]] and kept[1] in job.data[kept[0]]
    assert job.notes


def test_derived_sizes_run() -> None:
    r = simulate(parse_job(apply_flags(None, flags(cluster={"nodes": 64})).data))
    assert (r.n_gpus, r.strategy["dp"], r.strategy["pp"]) == (512, 4, 16)
    r = simulate(parse_job(apply_flags(None, flags(strategy={"tp": 4})).data))
    assert (r.n_gpus, r.strategy["dp"], r.strategy["tp"]) == (1024, 16, 4)


def test_a_job_file_keeps_its_layout_under_a_model_flag() -> None:
    base = {"model": {"name": "gpt2", "seq_len": 512}, "cluster": {"name": "dgx-a100", "nodes": 2},
            "strategy": {"tp": 2, "pp": 2}}
    job = apply_flags(base, flags(model={"name": "gpt2-medium"}))
    assert not job.from_default and job.data["model"] == {"name": "gpt2-medium", "seq_len": 512}
    assert job.data["strategy"] == {"tp": 2, "pp": 2} and job.data["cluster"]["nodes"] == 2
    assert base["model"]["name"] == "gpt2"  # the caller's dict is not modified


def test_describe_flags() -> None:
    text = describe_flags(flags(model={"name": "gpt2", "seq_len": None}, strategy={"sequence_parallel": False},
                                cluster={"bandwidth_gbps": [300.0, 25.0]}, simulation={"exact": False}))
    assert text == "--model gpt2 --bandwidth 300,25 --no-sp --symmetric"


# ---- the output says what ran ------------------------------------------------------------------------------

def test_json_has_seq_len_and_model_params(tmp_path: Path) -> None:
    r = run_json(tmp_path, "--model", "gpt2", "--tp", "2", "--global-batch", "16")
    m = build_model("gpt2", 1, None)
    assert r["seq_len"] == m.seq_len == 1024 and r["model_params"] == m.params
    cnn = run_json(tmp_path, "--model", "resnet50")
    assert cnn["seq_len"] is None and cnn["model_params"] == build_model("resnet50", 1, None).params


def test_summary_says_what_ran() -> None:
    p = run_cli("simulate", "--recompute", "full", columns=200)
    assert p.returncode == 0, p.stderr
    head = p.stdout.splitlines()[:5]
    assert head[0].startswith("job: the default job (GPT-3 175B") and head[0].endswith("with --recompute full")
    assert "174.6B params" in head[1] and "sequence length 2048" in head[1]
    assert "1024x a100-80gb (dgx-a100)" in head[2] and "recompute=full" in head[3]


def test_ep_dp_is_explained_and_consistent_with_the_placement() -> None:
    p = run_cli("simulate", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--nodes", "8", "--tp", "2",
                "--ep", "8", "--pp", "2", "--global-batch", "256", "--sp", columns=200)
    assert p.returncode == 0, p.stderr
    assert "dp=16 (ep=8 x dp/ep=2)" in p.stdout and "dp/ep=2: dim2" in p.stdout
    assert not re.search(r"(?<![/\w])dp=2\b", p.stdout)


def test_memory_table_marks_hidden_stages() -> None:
    buf = io.StringIO()
    print_summary(simulate(default_job()), Console(file=buf, width=120))
    text = buf.getvalue()
    assert "8 stages not shown" in text and "│    15 │" in text


# ---- 80 columns, --version, chakra wording -----------------------------------------------------------------

def test_version() -> None:
    p = run_cli("--version")
    assert p.returncode == 0 and p.stdout.strip() == f"trainsim {__version__}" == "trainsim 0.1.0"


def test_clusters_fit_80_columns() -> None:
    p = run_cli("clusters", columns=80)
    assert p.returncode == 0, p.stderr
    assert "dgx-h100" in p.stdout and "conv-4d" in p.stdout
    assert max(len(line) for line in p.stdout.splitlines()) <= 80


def test_simulate_help_keeps_every_option_name_whole_at_80_columns() -> None:
    import typer

    from trainsim.cli import app

    p = run_cli("simulate", "--help", columns=80)
    assert p.returncode == 0, p.stderr
    command = typer.main.get_command(app).commands["simulate"]  # type: ignore[attr-defined]
    names = [n for param in command.params for n in (*param.opts, *getattr(param, "secondary_opts", ()))
             if n.startswith("-")]
    assert len(names) > 60
    for name in names:
        assert re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", p.stdout), name
    assert max(len(line) for line in p.stdout.splitlines()) <= 80


def test_chakra_export_says_simulated_iteration_time(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("chakra.schema.protobuf.et_def_pb2")
    main(["chakra", "export", "--model", "gpt2", "--nodes", "1", "--tp", "2", "--pp", "2", "--global-batch", "8",
          "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert "simulated iteration time" in out and "simulated in" not in out
