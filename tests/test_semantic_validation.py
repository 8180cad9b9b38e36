"""Every input handled (issue 13): values accepted silently before are one-line errors naming the field,
on the CLI (a subprocess: exit 2, one stderr line) and in the Python API (trainsim.ConfigError)."""

from __future__ import annotations

import inspect
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import trainsim
from trainsim.config import ClusterSpec, ModelSpec, SimulationSpec, StrategySpec, merge, parse_job


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainsim", *args], capture_output=True, text=True, timeout=120)


def one_line_error(p: subprocess.CompletedProcess, *names: str) -> str:
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    for name in names:
        assert name in lines[0], lines[0]
    return lines[0]


SMALL = ["--model", "gpt2", "--cluster", "pcie-titanxp", "-q"]


@pytest.mark.parametrize(("args", "names"), [
    # 1. model shapes no checkpoint could have
    (["simulate", "--model", "llama2-70b", "--kv-heads", "5", "-q"], ["model.kv_heads", "64"]),
    (["simulate", "--model", "custom", "--layers", "2", "--hidden", "4096", "--heads", "7", "-q"],
     ["model.heads", "4096"]),
    (["simulate", "--model", "gpt2", "--hidden", "1000", "-q"], ["model.hidden", "multiple of 12"]),
    # 4. flags that were ignored or contradict each other
    (["simulate", *SMALL, "--bandwidth", "100"], ["cluster.bandwidth_gbps", "topology"]),
    (["simulate", *SMALL, "--latency", "100"], ["cluster.latency_ns", "topology"]),
    (["simulate", "--model", "gpt2", "--topology", "conv-4d", "--nodes", "3", "-q"], ["cluster.nodes", "topology"]),
    (["simulate", "--model", "gpt2", "--topology", "conv-4d", "--nic-gbps", "25", "-q"], ["cluster.nic_gbps"]),
    (["simulate", "--model", "resnet50", "--cluster", "pcie-titanxp", "--seq-len", "100", "-q"],
     ["model.seq_len", "resnet50"]),
    (["simulate", "--model", "dlrm", "--cluster", "pcie-titanxp", "--seq-len", "100", "-q"], ["model.seq_len"]),
    (["simulate", "--model", "resnet50", "--cluster", "pcie-titanxp", "--attention", "unfused", "-q"],
     ["model.attention"]),
    (["simulate", *SMALL, "--fsdp", "--zero", "1"], ["strategy.zero", "fsdp"]),
    (["simulate", *SMALL, "--scheduler", "themis"], ["simulation.scheduler", "analytical"]),
    (["simulate", *SMALL, "--tp", "2", "--no-sp", "--tp-comm-overlap"],
     ["strategy.tp_comm_overlap", "sequence parallelism"]),
    (["simulate", *SMALL, "--zero", "0", "--overlap-param-gather"], ["strategy.overlap_param_gather", "--zero 1"]),
    # 5. dtype support is the device's own list
    (["simulate", *SMALL, "--dtype", "bf16"], ["simulation.dtype", "titan-xp", "fp32, fp16"]),
    (["simulate", "--model", "gpt2", "--cluster", "dgx1-v100", "--dtype", "bf16", "-q"], ["simulation.dtype"]),
    (["simulate", "--model", "gpt2", "--cluster", "dgx1-v100", "--dtype", "fp8", "-q"], ["simulation.dtype"]),
    # 2. non-finite numbers
    (["simulate", *SMALL, "--gamma", "nan"], ["simulation.gamma"]),
    (["simulate", *SMALL, "--nic-gbps", "inf"], ["cluster.nic_gbps", "finite"]),
    (["simulate", "--model", "gpt2", "--topology", "Switch(8)", "--bandwidth", "inf", "--latency", "1", "-q"],
     ["--bandwidth", "finite"]),
    # 6. every command's options, refused before any work
    (["chakra", "run", "no/such/prefix", "--dtype", "int3"], ["--dtype", "int3"]),
    (["chakra", "run", "no/such/prefix", "--nodes", "0"], ["--nodes"]),
    (["calibrate", "no-such.csv", "--out", "x.yaml", "--family", "nosuch"], ["--family", "nosuch", "a100"]),
    (["calibrate", "no-such.csv", "--out", "x.yaml", "--fit", "nosuch"], ["--fit", "nosuch"]),
    (["calibrate", "no-such.csv", "--out", "x.yaml", "--jobs", "0"], ["--jobs"]),
    (["calibrate", "no-such.csv", "--out", "x.yaml", "--sweeps", "0"], ["--sweeps"]),
    (["validate", "no-such.csv", "--jobs", "0"], ["--jobs"]),
    (["validate", "no-such.csv", "--jobs", "-2"], ["--jobs"]),
    (["validate", "no-such.csv", "--max-mape", "nan"], ["--max-mape"]),
])
def test_cli_refuses(args: list[str], names: list[str]) -> None:
    one_line_error(run_cli(*args), *names)


@pytest.mark.parametrize(("yaml_text", "names"), [
    ("strategy: {tp: true}\n", ["strategy.tp", "integer", "bool"]),
    ("strategy: {tp: '8'}\n", ["strategy.tp", "integer", "str"]),
    ("strategy: {fsdp: 'yes'}\n", ["strategy.fsdp", "true or false"]),
    ("simulation: {gamma: .nan}\n", ["simulation.gamma", "finite"]),
    ("cluster: {nic_gbps: .inf}\n", ["cluster.nic_gbps", "finite"]),
    ("model: 42\n", ["model: must be a mapping"]),
    ("cluster: [1]\n", ["cluster: must be a mapping"]),
    ('strategy: "tp=8"\n', ["strategy: must be a mapping"]),
])
def test_yaml_values_of_the_wrong_kind(tmp_path: Path, yaml_text: str, names: list[str]) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(yaml_text)
    one_line_error(run_cli("simulate", str(job), "-q"), *names)
    one_line_error(run_cli("simulate", str(job), "--model", "gpt2", "-q"), *names)  # flags do not hide it


def test_non_mapping_sections_are_named_by_merge_and_parse_job() -> None:
    with pytest.raises(trainsim.ConfigError, match=r"^model: must be a mapping"):
        merge({"model": 42}, {"model": {"name": "gpt2"}})
    with pytest.raises(trainsim.ConfigError, match=r"^cluster: must be a mapping"):
        parse_job({"cluster": [1]})
    with pytest.raises(trainsim.ConfigError, match=r"^job: must be a mapping"):
        parse_job("x")  # type: ignore[arg-type]


@pytest.mark.parametrize("spec", [ModelSpec, ClusterSpec, StrategySpec, SimulationSpec])
def test_no_int_field_takes_a_bool_or_a_string_and_no_float_field_nan(spec: Any) -> None:
    for name, field in spec.model_fields.items():
        section = spec.__name__.removesuffix("Spec").lower()
        text = str(field.annotation)
        if "int" in text and "list" not in text:
            for bad in (True, "8", 8.0):
                with pytest.raises(trainsim.ConfigError, match=rf"^{section}\.{name}:"):
                    parse_job({section: {name: bad}})
        if "float" in text:
            for bad in (math.nan, math.inf, -math.inf):
                value = [bad] if "list" in text else bad
                with pytest.raises(trainsim.ConfigError, match=rf"^{section}\.{name}"):
                    parse_job({section: {name: value}})


# --- Python API ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(("kwargs", "pattern"), [
    ({"model": "gpt2", "cluster": "pcie-titanxp", "strategy": "tp=8"}, r"^strategy: must be .*dict"),
    ({"job": {"model": 1}}, r"^model: must be a mapping"),
    ({"job": "x"}, r"^job: must be a JobConfig"),
    ({"job": 3}, r"^job: must be a JobConfig"),
    ({"model": 3}, r"^model: must be a model name"),
    ({"cluster": ["dgx-a100"]}, r"^cluster: must be a cluster preset name"),
    ({"model": "gpt2", "nodez": 2}, r"^nodez: is not a simulate\(\) keyword; did you mean nodes"),
    ({"model": "gpt2", "comm_modle": "nccl"}, r"comm_model"),
    ({"model": "gpt2", "strategy": {"tp": 2}, "tp": 4}, r"^strategy\.tp: given twice"),
    ({"job": {"model": {"name": "gpt2"}}, "nodes": 2}, r"^nodes: is ignored when a job is passed"),
    ({"model": "gpt2", "bandwidth_sharing": "no"}, r"^bandwidth_sharing: must be True or False"),
    ({"model": "gpt2", "cluster": "pcie-titanxp", "dtype": "bf16"}, r"^simulation\.dtype: titan-xp"),
    ({"model": "gpt2", "cluster": "pcie-titanxp", "scheduler": "themis"}, r"^simulation\.scheduler"),
    ({"model": "gpt2", "cluster": "pcie-titanxp", "nic_gbps": math.nan}, r"^cluster\.nic_gbps"),
    ({"model": "gpt2", "cluster": "pcie-titanxp", "gamma": math.inf}, r"^simulation\.gamma"),
    ({"model": "gpt2", "cluster": "pcie-titanxp", "strategy": {"tp": True}}, r"^strategy\.tp: must be an integer"),
    ({"model": "gpt2", "cluster": "pcie-titanxp", "bandwidth_gbps": [100.0]}, r"^cluster\.bandwidth_gbps"),
    ({"model": "llama2-70b", "kv_heads": 5}, r"^model\.kv_heads: 5 key/value heads do not divide 64"),
    ({"model": "resnet50", "cluster": "pcie-titanxp", "seq_len": 5}, r"^model\.seq_len: resnet50 has no sequence"),
])
def test_api_refuses_with_a_config_error(kwargs: dict[str, Any], pattern: str) -> None:
    with pytest.raises(trainsim.ConfigError, match=pattern):
        trainsim.simulate(**kwargs)


def test_api_keywords_go_to_their_section() -> None:
    """gpu/topology/comm_model/scheduler/... are cluster and simulation keys, not model.X."""
    from trainsim.api import job_from_keywords, keyword_sections

    routes = keyword_sections()
    for spec, section in ((ModelSpec, "model"), (ClusterSpec, "cluster"), (StrategySpec, "strategy"),
                          (SimulationSpec, "simulation")):
        for key in spec.model_fields:
            if key != "name":
                assert routes[key] == section, key
    data = job_from_keywords("gpt2", "dgx-a100", None, {
        "gpu": "h100", "topology": "Switch(8)", "bandwidth_gbps": [300.0], "latency_ns": [500.0],
        "comm_model": "analytical", "scheduler": "themis", "attention": "unfused", "hf_config": Path("x.json"),
        "tp": 2, "dtype": "bf16"})
    assert data["cluster"] == {"name": "dgx-a100", "gpu": "h100", "topology": "Switch(8)", "bandwidth_gbps": [300.0],
                               "latency_ns": [500.0]}
    assert data["simulation"] == {"comm_model": "analytical", "scheduler": "themis", "dtype": "bf16"}
    assert data["model"] == {"name": "gpt2", "attention": "unfused", "hf_config": "x.json"}
    assert data["strategy"] == {"tp": 2}
    res = trainsim.simulate(model="gpt2", cluster="dgx-a100", gpu="h100", gpus_per_node=4, nodes=1, tp=2,
                            comm_model="analytical", scheduler="themis", intra_node_gbps=200.0)
    assert res.device == "h100-sxm" and res.n_gpus == 4 and res.strategy["tp"] == 2


def test_simulate_tree_checks_its_arguments() -> None:
    with pytest.raises(trainsim.ConfigError, match=r"^tree: must be a StrategyTree"):
        trainsim.simulate_tree("gpt2")  # type: ignore[arg-type]
    with pytest.raises(trainsim.ConfigError, match=r"^cluster: must be a cluster preset name"):
        trainsim.simulate_tree(trainsim.StrategyTree.__new__(trainsim.StrategyTree), 8)  # type: ignore[arg-type]


def test_lazy_wrappers_have_the_real_signature_and_docstring() -> None:
    from trainsim import api

    for name in ("simulate", "simulate_tree"):
        lazy, real = inspect.signature(getattr(trainsim, name)), inspect.signature(getattr(api, name))
        assert [(p.name, p.kind, p.default) for p in lazy.parameters.values()] == \
            [(p.name, p.kind, p.default) for p in real.parameters.values()], name
        assert getattr(trainsim, name).__doc__ == getattr(api, name).__doc__, name
    assert list(inspect.signature(trainsim.simulate).parameters)[:4] == ["job", "model", "cluster", "strategy"]
    assert trainsim.ConfigError is __import__("trainsim.errors").errors.ConfigError
    assert "ConfigError" in trainsim.__all__


def test_importing_trainsim_stays_cheap() -> None:
    code = ("import sys, trainsim; trainsim.ConfigError; heavy = [m for m in sys.modules if m.split('.')[0] in "
            "('pydantic', 'yaml', 'numpy', 'typer') or m in ('trainsim.api', 'trainsim.config')]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


def test_chakra_dtype_follows_the_device(tmp_path: Path) -> None:
    from trainsim.trace.chakra import load_chakra, write_chakra

    res = trainsim.simulate(model="gpt2", cluster="pcie-titanxp", strategy={"dp": 8, "global_batch": 8}, layers=2,
                            granularity="op")
    write_chakra(res.graph, tmp_path, "g")
    with pytest.raises(trainsim.ConfigError, match=r"^dtype: titan-xp does not support bf16"):
        load_chakra(tmp_path / "g", "pcie-titanxp", dtype="bf16")
    with pytest.raises(trainsim.ConfigError, match=r"^dtype: 'int3' is not a dtype"):
        load_chakra(tmp_path / "g", "pcie-titanxp", dtype="int3")
    assert len(load_chakra(tmp_path / "g", "pcie-titanxp")) > 0  # auto: fp32 on Pascal
