"""evaluate() rows, the runners (in-process, local processes, Ray), the DuckDB results store and
`trainsim sweep`: resumable after SIGKILL, the same rows however they are evaluated."""

from __future__ import annotations

import json
import os
import pickle
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from trainsim.errors import ConfigError
from trainsim.optimize.evaluate import NONDETERMINISTIC_COLUMNS, columns, evaluate, job_key
from trainsim.optimize.runners import Runner, run_with_store
from trainsim.sim.result import BREAKDOWN_KEYS

duckdb = pytest.importorskip("duckdb")

from trainsim.optimize.store import ResultsStore  # noqa: E402 - after the skip: it needs duckdb

BASE: dict[str, Any] = {"model": {"name": "gpt2"}, "cluster": {"name": "dgx-a100", "nodes": 1},
                        "strategy": {"global_batch": 64}}


def job(**strategy: Any) -> dict[str, Any]:
    return {**BASE, "strategy": {**BASE["strategy"], **strategy}}


JOBS = [job(tp=tp, recompute=r) for tp in (1, 2, 4, 8) for r in ("none", "full")]  # tp=8: 12 heads, an error


def results(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows without the columns that differ between two evaluations of one job (wall time)."""
    return [{k: v for k, v in r.items() if k not in NONDETERMINISTIC_COLUMNS} for r in rows]


# ------------------------------------------------------------------------------------------ evaluate


def test_evaluate_row_has_every_column() -> None:
    row = evaluate(job(tp=2))
    assert list(row) == list(columns())
    assert row["error"] is None
    assert (row["model"], row["cluster"], row["tp"], row["global_batch"]) == ("gpt2", "dgx-a100", 2, 64)
    assert row["pp"] is None and row["seq_len"] is None  # keys the job leaves out
    assert (row["n_gpus"], row["dp"], row["grad_accumulation"]) == (8, 4, 16)  # dp derived: 8 GPUs / tp 2
    assert row["tokens_per_s"] == pytest.approx(64 * 1024 / row["iteration_time_s"])
    assert row["samples_per_s"] == pytest.approx(64 / row["iteration_time_s"])
    assert 0 < row["mfu"] <= row["hfu"] < 1
    assert row["fits"] is True and row["memory_headroom_gib"] > 0
    assert row["peak_memory_gib"] + row["memory_headroom_gib"] < 80  # an A100-80GB, less the runtime reserve
    assert row["dominant"] in BREAKDOWN_KEYS
    assert row["key"] == job_key(job(tp=2)) and len(row["key"]) >= 16
    assert json.loads(json.dumps(row)) == row
    assert pickle.loads(pickle.dumps(row)) == row


def test_evaluate_invalid_jobs_are_error_rows() -> None:
    row = evaluate(job(tp=8))
    assert row["error"].startswith("strategy.tp:") and "\n" not in row["error"]
    assert row["tp"] == 8 and row["iteration_time_s"] is None and row["fits"] is None
    bad = {"model": {"name": "gpt2"}, "cluster": 5, "strategy": {"tp": "x", "nic": 3, "pp": float("nan")}}
    row = evaluate(bad)
    assert row["error"] is not None and row["error"].startswith("cluster")
    assert row["tp"] is None and row["pp"] is None and row["cluster"] is None  # values of the wrong type
    assert json.loads(json.dumps(row, allow_nan=False))["key"] == job_key(bad)


def test_job_key_is_the_canonical_job() -> None:
    a = {"model": {"name": "gpt2"}, "strategy": {"tp": 2, "pp": 1}}
    b = {"strategy": {"pp": 1, "tp": 2}, "model": {"name": "gpt2"}}
    assert job_key(a) == job_key(b)
    assert job_key(a) != job_key({**a, "strategy": {"tp": 2, "pp": 2}})


# ------------------------------------------------------------------------------------------- runners


def test_process_pool_gives_the_in_process_rows() -> None:
    local = Runner(1).map(JOBS)
    seen: list[tuple[int, int]] = []
    with Runner(2) as runner:
        first = runner.map(JOBS, progress=lambda d, n: seen.append((d, n)))
        pool = runner._pool
        again = runner.map(JOBS[:3])
        assert runner._pool is pool  # one pool, reused across batches
    assert results(first) == results(local)
    assert results(again) == results(local[:3])
    assert seen[-1] == (len(JOBS), len(JOBS)) and len(seen) == len(JOBS)


def test_ray_runner_gives_the_local_rows() -> None:
    ray = pytest.importorskip("ray")
    jobs = JOBS[:6]
    local = Runner(1).map(jobs)
    try:
        with Runner(2, ray="auto", ray_init_kwargs={"num_cpus": 2}) as runner:
            assert ray.is_initialized()
            rows = runner.map(jobs)
            again = runner.map(jobs[:2])
        assert not ray.is_initialized()  # the runner started it, so it shut it down
    finally:
        ray.shutdown()
    assert results(rows) == results(local)
    assert results(again) == results(local[:2])


def test_missing_extras_are_one_line_errors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "duckdb", None)  # import duckdb now raises ImportError
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ConfigError, match=r"trainsim\[search\]") as exc:
        ResultsStore(tmp_path / "r.db")
    assert exc.value.field == "--db" and not (tmp_path / "r.db").exists()
    with pytest.raises(ConfigError, match=r"trainsim\[ray\]") as exc:
        Runner(2, ray="auto")
    assert exc.value.field == "--ray"


def test_importing_trainsim_imports_neither_duckdb_nor_ray() -> None:
    code = "import sys, trainsim, trainsim.cli, trainsim.optimize.runners; print(sorted({'duckdb', 'ray'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# --------------------------------------------------------------------------------------------- store


def test_store_round_trip_without_duplicates(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    rows = Runner(1).map(JOBS)
    with ResultsStore(db) as store:
        store.add(rows[:5], "first")
        store.add(rows, "second")  # the first five are stored already: skipped
        assert store.count() == len(JOBS)
        got = store.rows([r["key"] for r in rows] + ["no-such-key"])
        assert set(got) == {r["key"] for r in rows}
        assert [got[r["key"]] for r in rows] == rows  # every column round-trips exactly
        meta = store.rows([rows[0]["key"], rows[6]["key"]], meta=True)
        assert meta[rows[0]["key"]]["study"] == "first" and meta[rows[6]["key"]]["study"] == "second"
        assert meta[rows[0]["key"]]["created_at"] is not None
    con = duckdb.connect(str(db), read_only=True)
    best = con.sql("SELECT tp, recompute, tokens_per_s FROM runs WHERE error IS NULL "
                   "ORDER BY tokens_per_s DESC").fetchall()
    con.close()
    tps = [r[2] for r in best]
    assert len(best) == 6 and tps == sorted(tps, reverse=True)
    want = max((r for r in rows if r["error"] is None), key=lambda r: r["tokens_per_s"])
    assert best[0][:2] == (want["tp"], want["recompute"])


def test_store_refuses_what_it_cannot_use(tmp_path: Path) -> None:
    text = tmp_path / "notes.db"
    text.write_text("not a database\n")
    with pytest.raises(ConfigError, match="not a DuckDB database") as exc:
        ResultsStore(text)
    assert exc.value.field == "--db" and "\n" not in exc.value.one_line()
    assert text.read_text() == "not a database\n"
    other = tmp_path / "other.db"
    con = duckdb.connect(str(other))
    con.execute("CREATE TABLE runs (key VARCHAR PRIMARY KEY, speed DOUBLE)")
    con.close()
    with pytest.raises(ConfigError, match="runs table with other columns") as exc:
        ResultsStore(other)
    assert exc.value.field == "--db"
    with pytest.raises(ConfigError, match="directory"):
        ResultsStore(tmp_path)
    empty = tmp_path / "touched.db"
    empty.touch()  # an empty file is a new database
    with ResultsStore(empty) as store:
        assert store.count() == 0


def test_run_with_store_evaluates_only_what_is_missing(tmp_path: Path) -> None:
    clean = Runner(1).map(JOBS)
    with ResultsStore(tmp_path / "r.db") as store, Runner(1) as runner:
        rows, evaluated, reused = run_with_store(JOBS[:3], runner, store, "s")
        assert (evaluated, reused) == (3, 0)
        seen: list[tuple[int, int]] = []
        rows, evaluated, reused = run_with_store(JOBS + JOBS[:2], runner, store, "s",
                                                 lambda d, n: seen.append((d, n)))
        assert (evaluated, reused) == (len(JOBS) - 3, 3)  # a job listed twice is evaluated once
        assert seen[-1] == (len(JOBS) - 3, len(JOBS) - 3)
        assert results(rows) == results(clean + clean[:2])
        assert store.count() == len(JOBS)
        assert run_with_store(JOBS, runner, store, "s")[1:] == (0, len(JOBS))  # rerun: nothing evaluated


# --------------------------------------------------------------------------------------------- sweep

SWEEP = """\
name: grid
base:
  model: {name: gpt2}
  cluster: {name: dgx-a100, nodes: 1}
  strategy: {global_batch: 64}
grid:
  strategy.tp: [1, 2, 8]
  strategy.recompute: [none, full]
  cluster.gpu: [a100-80gb, h100-sxm]
"""
SLOW_SWEEP = """\
base:
  model: {name: gpt2}
  cluster: {name: dgx-a100, nodes: 1}
  strategy: {global_batch: 256}
  simulation: {granularity: op}
grid:
  strategy.pp: [1, 2, 4]
  strategy.tp: [1, 2]
  strategy.micro_batch: [1, 2]
"""


def trainsim(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "trainsim", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300)


def sweep_json(tmp_path: Path, name: str, *args: str, text: str = SWEEP) -> dict[str, Any]:
    (tmp_path / "sweep.yaml").write_text(text)
    p = trainsim("sweep", "sweep.yaml", "--json", f"{name}.json", "-q", *args, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    return json.loads((tmp_path / f"{name}.json").read_text())


def test_sweep_jobs_2_gives_the_rows_of_jobs_1(tmp_path: Path) -> None:
    one = sweep_json(tmp_path, "one", "--jobs", "1")
    two = sweep_json(tmp_path, "two", "--jobs", "2")
    assert len(one["rows"]) == 12 and one["evaluated"] == 12 and one["reused"] == 0
    assert results(two["rows"]) == results(one["rows"])
    assert sum(r["error"] is not None for r in one["rows"]) == 4  # tp=8 does not divide gpt2's 12 heads
    assert {(r["tp"], r["recompute"], r["gpu"]) for r in one["rows"]} == {
        (tp, rc, g) for tp in (1, 2, 8) for rc in ("none", "full") for g in ("a100-80gb", "h100-sxm")}


def test_sweep_random_sample_is_seeded_and_without_replacement(tmp_path: Path) -> None:
    text = SWEEP + "random: {samples: 5, seed: 3}\n"
    a = sweep_json(tmp_path, "a", "--jobs", "1", text=text)
    b = sweep_json(tmp_path, "b", "--jobs", "1", text=text)
    full = sweep_json(tmp_path, "full", "--jobs", "1")
    keys = [r["key"] for r in a["rows"]]
    assert len(keys) == len(set(keys)) == 5
    assert keys == [r["key"] for r in b["rows"]]
    grid_keys = [r["key"] for r in full["rows"]]
    assert set(keys) <= set(grid_keys)
    assert keys == [k for k in grid_keys if k in keys]  # kept in grid order
    other = sweep_json(tmp_path, "c", "--jobs", "1", text=SWEEP + "random: {samples: 5, seed: 4}\n")
    assert [r["key"] for r in other["rows"]] != keys


def _run_until(argv: list[str], cwd: Path, done_at_least: int, total: int) -> int:
    """Run argv on a pseudo-terminal (so the progress bar shows), SIGKILL it once the bar reads at least
    `done_at_least`/`total`; the count it read."""
    import pty

    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE",
                                                              "TTY_INTERACTIVE", "CI")}
    env.update(TERM="xterm", COLUMNS="120")
    p = subprocess.Popen(argv, cwd=cwd, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    seen, text = 0, ""
    deadline = time.monotonic() + 120
    try:
        while seen < done_at_least and time.monotonic() < deadline and p.poll() is None:
            ready, _, _ = select.select([master], [], [], 0.05)
            if ready:
                try:
                    text += os.read(master, 65536).decode(errors="replace")
                except OSError:
                    break
                counts = [int(m) for m in re.findall(rf"(\d+)/{total}\b", text)]
                seen = max(counts, default=0)
        assert seen >= done_at_least, f"the progress bar never reached {done_at_least}/{total}: {text[-500:]!r}"
        p.send_signal(signal.SIGKILL)
    finally:
        p.wait(timeout=30)
        os.close(master)
    return seen


def test_sweep_resumes_after_sigkill(tmp_path: Path) -> None:
    (tmp_path / "sweep.yaml").write_text(SLOW_SWEEP)
    clean = sweep_json(tmp_path, "clean", "--jobs", "1", text=SLOW_SWEEP)
    assert len(clean["rows"]) == 12 and all(r["error"] is None for r in clean["rows"])
    argv = [sys.executable, "-m", "trainsim", "sweep", "sweep.yaml", "--db", "runs.db", "--jobs", "1"]
    _run_until(argv, tmp_path, 3, 12)
    con = duckdb.connect(str(tmp_path / "runs.db"))
    killed = con.execute("SELECT count(*) FROM runs").fetchone()[0]
    con.close()
    assert 3 <= killed < 12  # committed as they finished; the rest were still to run
    resumed = sweep_json(tmp_path, "resumed", "--db", "runs.db", "--jobs", "1", text=SLOW_SWEEP)
    assert (resumed["evaluated"], resumed["reused"]) == (12 - killed, killed)
    assert results(resumed["rows"]) == results(clean["rows"])
    con = duckdb.connect(str(tmp_path / "runs.db"))
    n, distinct = con.execute("SELECT count(*), count(DISTINCT key) FROM runs").fetchone()
    con.close()
    assert n == distinct == 12  # every job exactly once
    again = sweep_json(tmp_path, "again", "--db", "runs.db", text=SLOW_SWEEP)
    assert (again["evaluated"], again["reused"]) == (0, 12)
    assert not list(tmp_path.glob("*.wal"))  # closed cleanly: the log is folded into the database


def test_sweep_table_ranks_by_throughput(tmp_path: Path) -> None:
    (tmp_path / "sweep.yaml").write_text(SWEEP)
    p = trainsim("sweep", "sweep.yaml", "--jobs", "1", "--top", "3", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    rows = sweep_json(tmp_path, "s", "--jobs", "1")["rows"]
    best = sorted((r for r in rows if r["error"] is None), key=lambda r: -r["tokens_per_s"])[:3]
    shown = [int(m.replace(",", "")) for m in re.findall(r"[│|]\s+([\d,]{5,})\s+[│|]", p.stdout)]
    assert shown == [round(r["tokens_per_s"]) for r in best]
    assert "top 3 of 12 rows" in p.stdout


@pytest.mark.parametrize(("text", "args", "field", "hint"), [
    ("base: {model: {name: gpt2}}\ngrid: {strategy.tpp: [1, 2]}\n", [], "grid.strategy.tpp", "strategy.tp"),
    ("base: {model: {name: gpt2}}\ngrid: {tp: [1, 2]}\n", [], "grid.tp", "strategy.tp"),
    ("base: {model: {name: gpt2}}\ngrid: {strategy.tp: [1, x]}\n", [], "grid.strategy.tp", "integer"),
    ("base: {model: {name: gpt2}}\ngrid: {strategy.tp: 2}\n", [], "grid.strategy.tp", "list"),
    ("base: {modle: {name: gpt2}}\n", [], "base.modle", "model"),
    ("base: missing.yaml\n", [], "base", "missing.yaml"),
    ("grid: {strategy.tp: [1]}\n", [], "base", "missing"),
    ("base: {model: {name: gpt2}}\nrandom: {sample: 2}\n", [], "random.sample", "samples"),
    ("base: {model: {name: gpt2}}\n", ["--db", "notes.txt"], "--db", "DuckDB"),
    ("base: {model: {name: gpt2}}\n", ["--top", "0"], "--top", ">= 1"),
])
def test_sweep_bad_input_is_one_line_and_writes_nothing(tmp_path: Path, text: str, args: list[str], field: str,
                                                        hint: str) -> None:
    (tmp_path / "sweep.yaml").write_text(text)
    (tmp_path / "notes.txt").write_text("notes\n")
    p = trainsim("sweep", "sweep.yaml", "--db", "runs.db", "--json", "o.json", *args, cwd=tmp_path)
    assert p.returncode == 2
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}:") and hint in lines[0], p.stderr
    assert sorted(f.name for f in tmp_path.iterdir()) == ["notes.txt", "sweep.yaml"]
