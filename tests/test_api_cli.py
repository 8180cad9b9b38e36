"""End to end: the default job, the CLI outputs (JSON, trace, dumped YAML) and API isolation."""

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from trainsim.api import default_job, simulate

JSON_KEYS = {"iteration_time_s", "tokens_per_s", "samples_per_s", "tflops_per_gpu", "mfu", "hfu",
             "peak_memory_bytes", "oom", "breakdown", "simulation_wall_s"}


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainsim", *args], capture_output=True, text=True, timeout=120)


def test_default_job_is_gpt3_on_1024_a100_and_breakdown_adds_up() -> None:
    r = simulate(default_job(), timeline=True)  # every task kept: the critical path is listed
    assert r.n_gpus == 1024 and r.model == "gpt3-175b" and r.device == "a100-80gb"
    assert r.strategy["tp"] * r.strategy["pp"] * r.strategy["dp"] == 1024
    assert sum(r.breakdown.values()) == pytest.approx(r.iteration_time_s, rel=1e-9)
    for stage in r.breakdown_per_stage:
        assert sum(stage.values()) == pytest.approx(r.iteration_time_s, rel=1e-9)
    assert 0 < r.mfu < 1 and r.hfu >= r.mfu and not r.oom
    assert len(r.peak_memory_bytes) == 16
    # the critical path is a chain in time ending at the iteration end
    path = r.critical_path
    assert path[-1][3] == pytest.approx(r.iteration_time_s)
    assert all(a[3] <= b[2] + 1e-12 for a, b in zip(path, path[1:], strict=False))
    # per-class timelines: a stream never runs two tasks at once
    for cls in (0, len(r.graph.classes) - 1):
        for stream in ("compute", "grad-comm", "pp-p2p"):
            rows = [x for x in r.timeline(cls) if x[1] == stream]
            assert rows and all(a[4] <= b[3] + 1e-12 for a, b in zip(rows, rows[1:], strict=False))


def test_cli_writes_json_trace_and_a_config_that_reproduces(tmp_path: Path) -> None:
    out, trace, cfg = tmp_path / "o.json", tmp_path / "t.json", tmp_path / "job.yaml"
    p = run_cli("simulate", "--model", "gpt2-proteus", "--cluster", "dgx1-v100", "--nodes", "2", "--tp", "2",
                "--pp", "2", "--global-batch", "64", "--micro-batch", "4", "--json", str(out), "--trace", str(trace),
                "--dump-config", str(cfg))
    assert p.returncode == 0, p.stderr
    assert "MFU" in p.stdout and "HFU" in p.stdout and "bubble" in p.stdout
    data = json.loads(out.read_text())
    assert set(data) >= JSON_KEYS
    assert data["strategy"]["dp"] == 4 and data["strategy"]["grad_accumulation"] == 4
    events = json.loads(trace.read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert spans and max(e["ts"] + e["dur"] for e in spans) == pytest.approx(data["iteration_time_s"] * 1e6, rel=1e-6)
    assert {e["args"]["name"] for e in events if e["name"] == "thread_name"} >= {"compute", "pp-p2p"}
    again = tmp_path / "again.json"
    p2 = run_cli("simulate", str(cfg), "--json", str(again), "-q")
    assert p2.returncode == 0, p2.stderr
    assert json.loads(again.read_text())["iteration_time_s"] == pytest.approx(data["iteration_time_s"], rel=1e-12)


def test_models_and_clusters_list() -> None:
    assert "llama3-70b" in run_cli("models").stdout
    out = run_cli("clusters").stdout
    assert "dgx-h100" in out and "pcie-titanxp" in out


def test_two_simulations_in_threads_match_running_alone() -> None:
    jobs = [dict(model={"name": "gpt2"}, cluster={"name": "dgx-a100"}, strategy={"tp": 2, "pp": 2, "global_batch": 16}),
            dict(model={"name": "llama3-8b", "seq_len": 2048}, cluster={"name": "dgx-h100", "nodes": 2},
                 strategy={"tp": 4, "pp": 2, "global_batch": 32, "zero": 3})]
    alone = [simulate(j).iteration_time_s for j in jobs]
    got: dict[int, float] = {}
    threads = [threading.Thread(target=lambda i=i, j=j: got.__setitem__(i, simulate(j).iteration_time_s))
               for i, j in enumerate(jobs) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == {0: alone[0], 1: alone[1]}
    assert alone[0] != alone[1]


def test_more_network_bandwidth_never_slows_a_dp_job() -> None:
    base = dict(model={"name": "gpt3-1.3b"}, strategy={"global_batch": 64})
    slow = simulate({**base, "cluster": {"name": "pcie-1080ti-10gbe", "nodes": 8}}).iteration_time_s
    fast = simulate({**base, "cluster": {"name": "dgx-a100", "nodes": 1}}).iteration_time_s
    assert fast < slow


def test_zero3_and_recompute_trade_time_for_memory() -> None:
    base = dict(model={"name": "llama3-8b", "seq_len": 4096}, cluster={"name": "dgx-h100", "nodes": 1},
                strategy={"global_batch": 16})
    plain = simulate(base)
    z3 = simulate({**base, "strategy": {"global_batch": 16, "zero": 3}})
    full = simulate({**base, "strategy": {"global_batch": 16, "zero": 3, "recompute": "full"}})
    assert z3.memory[0].static_bytes < plain.memory[0].static_bytes / 4
    assert full.memory[0].activation_peak_bytes < z3.memory[0].activation_peak_bytes
    assert full.iteration_time_s > z3.iteration_time_s and full.hfu > full.mfu
