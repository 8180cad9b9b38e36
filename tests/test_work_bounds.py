"""Work bounds (issue 13): inputs that would hang or exhaust memory are refused at once with one line naming the
field and the limit; the task-count prediction behind the refusal tracks the built graph; progress is opt-in."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

import trainsim.api as api
from trainsim.compile.graph import predict_tasks
from trainsim.errors import ConfigError
from trainsim.limits import (
    MAX_COLLECTIVE_CHUNKS,
    MAX_GPUS,
    MAX_GPUS_PER_NODE,
    MAX_HEADS,
    MAX_HIDDEN,
    MAX_LAYERS,
    MAX_NICS_PER_NODE,
    MAX_PREDICTED_TASKS,
    MAX_SEQ_LEN,
    MAX_VOCAB,
)
from trainsim.sim.engine import run

TIMEOUT_S = 60  # a refusal is immediate; a hang (the bug) fails here instead of stalling the suite


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainsim", *args], capture_output=True, text=True,
                          timeout=TIMEOUT_S)


def assert_refused(p: subprocess.CompletedProcess, field: str, limit: int) -> str:
    """Exit 2, exactly one stderr line naming the field and the limit (either way it is written)."""
    assert p.returncode == 2, (p.returncode, p.stdout[-500:], p.stderr[-500:])
    assert "Traceback" not in p.stderr and "MemoryError" not in p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    line = lines[0]
    assert line.startswith("error: "), line
    assert field in line, line
    assert f"{limit:,}" in line or str(limit) in line, line
    return line


BIG = str(10**9)


@pytest.mark.parametrize(("args", "field", "limit"), [
    # 1. billions of micro-batches: refused on the predicted task count, before lowering
    (["--global-batch", "100000000000"], "strategy.global_batch", MAX_PREDICTED_TASKS),
    # 2. 200k layers: refused before any model is built
    (["--model", "custom", "--layers", "200000", "--hidden", "65536", "--heads", "64"], "model.layers", MAX_LAYERS),
    # 3. per-rank simulation of the default 1024-GPU job (~24M tasks, ~20 GB)
    (["--exact"], "simulation.exact", MAX_PREDICTED_TASKS),
    (["--granularity", "op", "--global-batch", "15360"], "simulation.granularity", MAX_PREDICTED_TASKS),
    # 4. topologies and clusters too big to lay out
    (["--topology", "Ring(100000)_Switch(100000)", "--bandwidth", "1,1", "--latency", "1,1"], "cluster.topology",
     MAX_GPUS),
    (["--topology", "Ring(1000000000)", "--bandwidth", "1", "--latency", "1"], "cluster.topology", MAX_GPUS),
    # 5. other size fields
    (["--model", "gpt2", "--nodes", BIG], "cluster.nodes", MAX_GPUS),
    (["--model", "gpt2", "--nodes", "200000"], "cluster.nodes", MAX_GPUS),  # 1.6M GPUs of 8-GPU nodes
    (["--model", "gpt2", "--tp", "8", "--dp", "500000"], "strategy.dp", MAX_GPUS),
    (["--model", "gpt2", "--dp", BIG], "strategy.dp", MAX_GPUS),
    (["--model", "gpt2", "--gpus-per-node", BIG], "cluster.gpus_per_node", MAX_GPUS_PER_NODE),
    (["--model", "gpt2", "--nics-per-node", BIG], "cluster.nics_per_node", MAX_NICS_PER_NODE),
    (["--seq-len", str(10**12)], "model.seq_len", MAX_SEQ_LEN),
    (["--seq-len", str(10**400)], "model.seq_len", MAX_SEQ_LEN),  # no float overflow downstream
    (["--hidden", BIG], "model.hidden", MAX_HIDDEN),
    (["--vocab", str(10**12)], "model.vocab", MAX_VOCAB),
    (["--model", "gpt2", "--heads", str(10**12), "--kv-heads", "7"], "model.heads", MAX_HEADS),
    (["--model", "gpt2", "--vpp", BIG, "--pp", "2"], "strategy.vpp", MAX_LAYERS),
])
def test_simulate_refuses_oversized_work_at_once(args: list[str], field: str, limit: int) -> None:
    assert_refused(run_cli("simulate", *args, "-q"), field, limit)


def test_yaml_topology_has_the_same_bound(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("cluster: {topology: 'Ring(100000)_Switch(100000)', bandwidth_gbps: [1, 1], latency_ns: [1, 1]}\n")
    assert_refused(run_cli("simulate", str(job), "-q"), "cluster.topology", MAX_GPUS)


def test_hf_config_layers_have_the_same_bound(tmp_path: Path) -> None:
    data = json.loads((Path(__file__).parent / "data" / "hf" / "gpt-neox-20b.json").read_text())
    data["num_hidden_layers"] = 10**6
    (tmp_path / "config.json").write_text(json.dumps(data))
    assert_refused(run_cli("simulate", "--hf-config", str(tmp_path / "config.json"), "-q"), "model.layers", MAX_LAYERS)


@pytest.mark.parametrize(("args", "field", "limit"), [
    (["--topology", "Ring(100000)_Switch(100000)", "--bandwidth", "1,1", "--latency", "1,1"], "--topology", MAX_GPUS),
    (["--cluster", "dgx-a100", "--ranks", "100000000000"], "--ranks", MAX_GPUS),
    (["--topology", "dgx-a100", "--ranks", "100000000000"], "--ranks", MAX_GPUS),
    (["--topology", "Ring(1000000000)", "--bandwidth", "1", "--latency", "1"], "--topology", MAX_GPUS),
    (["--topology", "Ring(" + "9" * 5000 + ")", "--bandwidth", "1", "--latency", "1"], "--topology", MAX_GPUS),
    (["--topology", "Ring(8)", "--bandwidth", "1", "--latency", "1", "--chunks", "100000000"], "--chunks",
     MAX_COLLECTIVE_CHUNKS),
])
def test_collective_refuses_oversized_inputs(args: list[str], field: str, limit: int) -> None:
    assert_refused(run_cli("collective", *args), field, limit)


def test_predicted_work_is_checked_before_lowering(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_lowering(*_: Any) -> None:
        raise AssertionError("lowered a job that should have been refused")

    monkeypatch.setattr(api, "lower", no_lowering)
    with pytest.raises(ConfigError) as err:
        api.simulate(model="gpt2", cluster="dgx-a100", nodes=1, strategy={"global_batch": 8 * 10**9})
    assert err.value.field == "strategy.global_batch"
    assert f"{MAX_PREDICTED_TASKS:,}" in str(err.value) and "--micro-batch" in str(err.value)


def test_exact_mode_is_bounded_by_tasks_not_ranks() -> None:
    """1,088 GPUs (above the old 1,024-rank limit) of plain data parallelism is a small per-rank graph."""
    r = api.simulate(model="gpt2", cluster="dgx-a100", nodes=136, exact=True,
                     strategy={"dp": 1088, "global_batch": 1088})
    assert len(r.graph.classes) == 1088 and r.iteration_time_s > 0


SMALL_JOBS: list[dict[str, Any]] = [
    {"model": "gpt2", "strategy": {"tp": 2, "pp": 2, "global_batch": 64, "sequence_parallel": True}},
    {"model": "gpt2", "strategy": {"tp": 2, "pp": 2, "global_batch": 64}, "granularity": "layer"},
    {"model": "gpt2", "strategy": {"tp": 2, "pp": 4, "global_batch": 64, "schedule": "dynamic"}, "granularity": "op"},
    {"model": "gpt2", "strategy": {"tp": 2, "pp": 2, "vpp": 2, "global_batch": 64}},
    {"model": "gpt2", "strategy": {"tp": 2, "pp": 2, "global_batch": 32}, "exact": True},
    {"model": "gpt2", "strategy": {"tp": 2, "pp": 2, "global_batch": 32, "sequence_parallel": True}, "exact": True},
    {"model": "gpt2", "strategy": {"dp": 8, "global_batch": 64, "fsdp": True}},
    {"model": "gpt2", "strategy": {"dp": 8, "global_batch": 64, "fsdp": True}, "exact": True},
    {"model": "gpt2", "strategy": {"pp": 4, "global_batch": 16, "recompute": "full", "offload": "cpu"}},
    {"model": "resnet50", "strategy": {"global_batch": 256}, "exact": True},
]


@pytest.mark.parametrize("job", SMALL_JOBS)
def test_task_prediction_tracks_the_built_graph(job: dict[str, Any]) -> None:
    """predict_tasks (layer and op counts only) is within a factor of 2 of the built graph's tasks, counted once
    per rank class taking part (len(graph) outside exact mode; measured: 0.9x to 1.25x)."""
    kw = {"cluster": "dgx-a100", "nodes": 1, **job}
    r = api.simulate(**kw, timeline=True)  # every task built (micro-batches not folded)
    tree = api.strategy_tree(api.job_from_keywords(kw.pop("model"), kw.pop("cluster"), kw.pop("strategy"), kw))
    est = predict_tasks(tree, exact=job.get("exact", False), granularity=job.get("granularity", "auto"))
    slots = sum(len(p) for p in r.graph.participants)
    assert 0.5 <= est.tasks / slots <= 2.0, (est, slots, len(r.graph))
    assert 0.5 <= est.tasks / len(r.graph) <= 2.0 or job.get("exact"), (est, len(r.graph))


PROGRESS_JOB: dict[str, Any] = {"model": "gpt2", "cluster": "dgx-a100", "nodes": 1,
                                "strategy": {"tp": 2, "pp": 2, "global_batch": 4096}}


def test_progress_is_reported_only_when_asked(capsys: pytest.CaptureFixture[str]) -> None:
    calls: list[tuple[str, int, int]] = []
    r = api.simulate(**PROGRESS_JOB, progress=lambda *a: calls.append(a), timeline=True)
    phases = [c[0] for c in calls]
    assert phases[0] == "building graph" and phases[-1] == "simulating"
    assert phases == sorted(phases)  # all building, then all simulating
    sim = [c for c in calls if c[0] == "simulating"]
    assert all(total == len(r.graph) for _, _, total in sim)
    assert [d for _, d, _ in sim] == sorted(d for _, d, _ in sim) and sim[-1][1] <= len(r.graph)
    api.simulate(**PROGRESS_JOB)
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""


def test_two_simulations_keep_their_own_progress() -> None:
    """No global state: concurrent simulations each see only their own graph's progress."""
    jobs = [PROGRESS_JOB, {**PROGRESS_JOB, "strategy": {"tp": 2, "pp": 2, "global_batch": 8192}}]
    seen: list[list[tuple[str, int, int]]] = [[], []]
    sizes = [0, 0]

    def work(i: int) -> None:
        sizes[i] = len(api.simulate(**jobs[i], progress=lambda *a: seen[i].append(a), timeline=True).graph)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sizes[0] != sizes[1]
    for i in range(2):
        assert {total for phase, _, total in seen[i] if phase == "simulating"} == {sizes[i]}


def test_engine_reports_every_n_tasks() -> None:
    r = api.simulate(model="gpt2", cluster="dgx-a100", nodes=1, strategy={"global_batch": 256}, timeline=True)
    calls: list[tuple[int, int]] = []
    run(r.graph, progress=lambda d, n: calls.append((d, n)), progress_every=10)
    n = len(r.graph)
    assert calls == [(d, n) for d in range(10, n + 1, 10)]
