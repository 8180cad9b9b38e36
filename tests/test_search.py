"""Strategy search: the bounds never exceed what the simulation gives, branch and bound finds the exhaustive
search's best and top k, the pruning counts add up to the space, and the CLI keeps its interface."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections import Counter
from itertools import product

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import trainsim.api as api
from trainsim.config import parse_job
from trainsim.optimize.bounds import BoundModel, _in_flight
from trainsim.optimize.evaluate import evaluate, job_key
from trainsim.optimize.search import default_global_batch, parse_space, search
from trainsim.optimize.space import Candidate, SearchSpace, enumerate_space
from trainsim.strategy.schedules import schedule_order

# a 1.6B-parameter, 8-layer transformer on one 8-GPU V100 node: pipeline, tensor and ZeRO choices all matter
SMALL_JOB = {"model": {"name": "custom", "layers": 8, "hidden": 4096, "heads": 32, "seq_len": 1024},
             "cluster": {"name": "dgx1-v100"}}
SMALL_SPACE = SearchSpace(micro_batch=[1, 2], vpp=[1, 2], cp=[1], recompute=["none", "full"],
                          overlap_param_gather=[False], tp_comm_overlap=[False], zero=[0, 1, 3],
                          overlap_grad_reduce=[True])
# the same model on 12 GB Titan Xp cards (fp32): pure data parallelism runs out of memory
TIGHT_JOB = {"model": {"name": "custom", "layers": 8, "hidden": 4096, "heads": 32, "seq_len": 512},
             "cluster": {"name": "pcie-titanxp"}}
TIGHT_SPACE = SearchSpace(micro_batch=[1, 4], vpp=[1], cp=[1], recompute=["none", "full"], zero=[0, 3],
                          overlap_param_gather=[False], tp_comm_overlap=[False], overlap_grad_reduce=[True],
                          sequence_parallel=[False])


def _setup(job: dict, nodes: int) -> tuple[dict, object, object]:
    base = {**{k: dict(v) for k, v in job.items()}, "simulation": {}}
    base["cluster"]["nodes"] = nodes
    cl, model = api.cluster_and_model(base)
    return base, model, cl


def _key(row: dict) -> tuple:
    return tuple(row[k] for k in Candidate.__dataclass_fields__)


@pytest.mark.parametrize(("job", "space", "nodes", "gb"), [(SMALL_JOB, SMALL_SPACE, 1, 16),
                                                           (TIGHT_JOB, TIGHT_SPACE, 1, 8)])
def test_branch_and_bound_finds_the_exhaustive_top_k(job: dict, space: SearchSpace, nodes: int, gb: int) -> None:
    """Simulating every configuration and taking the fastest that fits gives the same top 3 (configurations
    and times) as the bounded search, which simulates a fraction of them; configurations pruned by the
    memory bound all run out of memory in the exhaustive run."""
    fast = search(job, [nodes], gb, space=space, top=3, pareto_memory=False)
    full = search(job, [nodes], gb, space=space, top=3, exhaustive=True, pareto_memory=False)
    assert fast.best is not None
    assert [_key(r) for r in fast.top] == [_key(r) for r in full.top]
    assert [r["iteration_time_s"] for r in fast.top] == pytest.approx([r["iteration_time_s"] for r in full.top])
    assert fast.evaluated < full.evaluated / 2
    assert fast.proven
    # every configuration pruned for memory is one the exhaustive run found out of memory
    base, model, cl = _setup(job, nodes)
    bm = BoundModel(base, model, cl)
    by_key = {r["key"]: r for r in full.per_nodes[0].rows}
    pruned = 0
    for c in enumerate_space(space, model, cl.world_size, cl.gpus_per_node, gb).candidates:
        if bm.bounds(c)[1] > bm.capacity_bytes:
            row = by_key[job_key({**base, "strategy": c.strategy()})]
            assert row["error"] is not None or not row["fits"], c
            pruned += 1
    assert pruned == fast.pruned.get("memory_bound", 0)


def test_tight_memory_prunes_and_the_best_fits() -> None:
    r = search(TIGHT_JOB, [1], 8, space=TIGHT_SPACE, top=3, pareto_memory=False)
    assert r.pruned.get("memory_bound", 0) > 0
    assert all(row["fits"] and row["memory_headroom_gib"] >= 0 for row in r.top)


def test_pruning_counts_add_up_to_the_space() -> None:
    r = search(SMALL_JOB, [1, 2], 32, space=SMALL_SPACE, top=2)
    assert sum(r.pruned.values()) + r.evaluated == r.space
    assert r.space == sum(n.space for n in r.per_nodes)
    for n in r.per_nodes:
        assert sum(n.pruned.values()) + len(n.rows) == n.space


def _naive_count(space: SearchSpace, model: object, world: int, gpn: int, gb: int) -> tuple[int, Counter]:
    """The static rules applied one configuration at a time (the nested enumeration's reference)."""
    from trainsim.optimize.space import _inner_reason, _outer_reason, knob_values

    v = knob_values(space, model, world)
    hyper = model.hyper
    blocks = sum(1 for la in model.layers if la.kind == "transformer")
    kept, pruned = 0, Counter()
    for tp, pp, cp, ep, vpp, sp, mb, _rc, z, ogr, opg, tco, sc in product(*(v[k] for k in (
            "tp", "pp", "cp", "ep", "vpp", "sequence_parallel", "micro_batch", "recompute", "zero",
            "overlap_grad_reduce", "overlap_param_gather", "tp_comm_overlap", "schedule"))):
        reason = _outer_reason(tp, pp, cp, ep, vpp, mb, world, gpn, space.tp_across_nodes, hyper["heads"],
                               hyper["kv_heads"], blocks, model.seq_len, 0, gb)
        if reason is None:
            dp = world // (tp * pp * cp)
            reason = _inner_reason(tp, pp, dp, cp, vpp, sp, z, ogr, opg, tco, sc, gb // (mb * dp), blocks)
        if reason:
            pruned[reason] += 1
        else:
            kept += 1
    return kept, pruned


def test_enumeration_counts_match_one_at_a_time() -> None:
    base, model, cl = _setup(SMALL_JOB, 2)
    en = enumerate_space(SMALL_SPACE, model, cl.world_size, cl.gpus_per_node, 32)
    kept, pruned = _naive_count(SMALL_SPACE, model, cl.world_size, cl.gpus_per_node, 32)
    assert len(en.candidates) == kept
    assert en.pruned == pruned
    assert en.space_size == kept + sum(pruned.values())
    for c in en.candidates:  # every survivor is a job trainsim accepts
        assert c.global_batch % (c.micro_batch * c.dp) == 0 and c.tp * c.pp * c.dp * c.cp == cl.world_size


# a space with every knob the bounds treat differently: pipeline (1F1B, interleaved, ZB-H1), ZeRO 0-3,
# context parallelism, sequence parallelism with TP overlap, recompute modes
_BOUND_JOB = {"model": {"name": "custom", "layers": 8, "hidden": 1024, "heads": 16, "seq_len": 1024},
              "cluster": {"name": "dgx-a100", "nodes": 2}, "simulation": {}}


@pytest.fixture(scope="module")
def bound_setup() -> tuple[BoundModel, list[Candidate]]:
    base, model, cl = _setup(_BOUND_JOB, 2)
    space = SearchSpace(micro_batch=[1, 2], vpp=[1, 2], cp=[1, 2])
    cands = enumerate_space(space, model, cl.world_size, cl.gpus_per_node, 64).candidates
    return BoundModel(base, model, cl), cands


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_bounds_never_exceed_the_simulation(bound_setup: tuple[BoundModel, list[Candidate]],
                                            data: st.DataObject) -> None:
    bm, cands = bound_setup
    c = data.draw(st.sampled_from(cands))
    refine = data.draw(st.booleans())
    lb, mem = bm.bounds(c, refine=refine)
    row = evaluate({**_BOUND_JOB, "strategy": c.strategy()})
    assert row["error"] is None, row["error"]
    assert 0 < lb <= row["iteration_time_s"] * (1 + 1e-9), (c, lb, row["iteration_time_s"])
    assert 0 < mem <= row["peak_memory_gib"] * 2**30 * (1 + 1e-9), c
    if refine and bm.refinable(c):  # the refined bound is at least the cheap one
        assert lb >= bm.bounds(c)[0] * (1 - 1e-12)


@pytest.mark.parametrize(("kind", "p", "m", "v"), [("1f1b", 4, 8, 1), ("1f1b", 4, 2, 1), ("interleaved", 4, 8, 2),
                                                   ("zb-h1", 4, 8, 1), ("1f1b", 1, 8, 1)])
def test_in_flight_counts_follow_the_schedule(kind: str, p: int, m: int, v: int) -> None:
    """1F1B holds min(m, p - rank) micro-batches on rank `rank` (Narayanan et al. 2021); interleaving holds
    its warm-up's chunk forwards plus one."""
    held = _in_flight(kind, p, m, v)
    if kind in ("1f1b", "zb-h1"):
        assert held == tuple(min(m, p - r) for r in range(p))
    else:
        assert held == tuple(min(m * v, (p - r - 1) * 2 + (v - 1) * p + 1) for r in range(p))
        assert len(schedule_order(kind, p, m, 0, v)) == 2 * m * v


def test_default_global_batch() -> None:
    assert default_global_batch(1024, 2048) == 2048  # 4M tokens
    assert default_global_batch(64, 8192) == 512
    assert default_global_batch(8, 1024) == 128  # capped at 16 per GPU
    assert default_global_batch(8, 10**7) == 8  # at least one per GPU


def test_bad_space_is_one_config_error() -> None:
    from trainsim.errors import ConfigError

    for data, field in (({"tp": [0]}, "--space.tp"), ({"nosuch": [1]}, "--space.nosuch"),
                        ({"recompute": ["sometimes"]}, "--space.recompute"), ([1, 2], "--space"),
                        ({"zero": [4]}, "--space.zero"), ({"schedule": []}, "--space.schedule")):
        with pytest.raises(ConfigError) as err:
            parse_space(data)
        assert err.value.field.startswith(field), (data, err.value.field)


def _cli(*args: str, cwd: object = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trainsim", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=600)


def test_cli_json_interface(tmp_path: object) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("micro_batch: [1, 2]\nvpp: [1]\ncp: [1]\nzero: [1]\nrecompute: [selective]\n")
    out = tmp_path / "s.json"
    p = _cli("search", "--model", "gpt3-350m", "--cluster", "dgx-a100", "--nodes", "1,2", "--global-batch", "32",
             "--space", str(space), "--top", "3", "--json", str(out))
    assert p.returncode == 0, p.stderr
    data = json.loads(out.read_text())
    for key in ("best", "top", "evaluated", "pruned", "space", "wall_s"):
        assert key in data
    best = data["best"]
    for key in ("iteration_time_s", "tokens_per_s", "mfu", "peak_memory_gib"):
        assert best[key] > 0
    assert best["strategy"]["zero"] == 1 and best["strategy"]["recompute"] == "selective"
    assert data["top"][0] == best and len(data["top"]) == 3
    assert [t["tokens_per_s"] for t in data["top"]] == sorted((t["tokens_per_s"] for t in data["top"]), reverse=True)
    assert sum(data["pruned"].values()) + data["evaluated"] == data["space"]
    assert {n["n_gpus"] for n in data["per_nodes"]} == {8, 16}
    gpus = [e["n_gpus"] for e in data["pareto_gpus"]]
    assert gpus == sorted(gpus)
    toks = [e["tokens_per_s"] for e in data["pareto_gpus"]]
    assert toks == sorted(toks)
    # the best strategy is a job trainsim runs as it stands, with the same result
    job = {"model": {"name": "gpt3-350m"}, "cluster": {"name": "dgx-a100", "nodes": best["nodes"]},
           "strategy": {**best["strategy"], "global_batch": 32}}
    assert api.simulate(job).iteration_time_s == pytest.approx(best["iteration_time_s"])
    assert "top 3" in p.stdout and "pruned" in p.stdout


@pytest.mark.parametrize(("args", "field"), [(["--nodes", "0"], "--nodes"), (["--nodes", "x,2"], "--nodes"),
                                             (["--top", "0"], "--top"), (["--time-limit", "-1"], "--time-limit"),
                                             (["--model", "nosuch"], "model"), (["--global-batch", "0"],
                                                                                "--global-batch")])
def test_cli_bad_input_is_one_line(args: list[str], field: str) -> None:
    p = _cli("search", "--model", "gpt2", "--cluster", "pcie-titanxp", "--nodes", "1", *args)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0], p.stderr


def test_search_store_reuses_rows(tmp_path: object) -> None:
    pytest.importorskip("duckdb")
    import duckdb

    db = str(tmp_path / "runs.duckdb")
    space = tmp_path / "space.yaml"
    space.write_text("micro_batch: [1, 2]\nvpp: [1]\ncp: [1]\nrecompute: [none, selective]\n")
    args = ("search", "--model", "gpt2", "--cluster", "dgx-a100", "--nodes", "1", "--global-batch", "16",
            "--space", str(space), "--db", db, "--json")
    p1 = _cli(*args, str(tmp_path / "a.json"))
    assert p1.returncode == 0, p1.stderr
    first = json.loads((tmp_path / "a.json").read_text())
    n = duckdb.connect(db, read_only=True).execute("select count(*) from runs").fetchone()[0]
    assert n == first["evaluated"]
    best = duckdb.connect(db, read_only=True).execute(
        "select tp, pp, micro_batch, tokens_per_s from runs where fits order by tokens_per_s desc limit 1").fetchone()
    assert best[3] == pytest.approx(first["best"]["tokens_per_s"])
    p2 = _cli(*args, str(tmp_path / "b.json"))
    assert p2.returncode == 0, p2.stderr
    second = json.loads((tmp_path / "b.json").read_text())
    assert second["best"] == first["best"]
    n2 = duckdb.connect(db, read_only=True).execute("select count(*) from runs").fetchone()[0]
    assert n2 == n  # nothing evaluated twice


def test_time_limit_stops_and_says_so() -> None:
    r = search(SMALL_JOB, [1], 16, space=SMALL_SPACE, top=3, time_limit_s=1e-9)
    assert not r.proven
    assert r.pruned.get("time_limit", 0) > 0
    assert sum(r.pruned.values()) + r.evaluated == r.space


def test_strategy_round_trip() -> None:
    c = Candidate(8, 4, 2, 1, 1, 2, True, 1, "selective", 1, True, False, True, "1f1b", 64)
    s = c.strategy()
    assert s["schedule"] == "interleaved" and "cp_comm" not in s
    job = parse_job({"model": {"name": "gpt3-1.3b"}, "cluster": {"name": "dgx-a100", "nodes": 8}, "strategy": s})
    assert job.strategy.vpp == 2 and math.prod((job.strategy.tp, job.strategy.pp, job.strategy.dp)) == 64


def test_memory_front_matches_the_exhaustive_front() -> None:
    """With pareto_memory the throughput / headroom front (down to 90% of the best) is the one every
    configuration's simulation gives."""
    from trainsim.optimize.search import FRONT_WINDOW, pareto

    fast = search(SMALL_JOB, [1], 16, space=SMALL_SPACE, top=1, pareto_memory=True)
    full = search(SMALL_JOB, [1], 16, space=SMALL_SPACE, top=1, exhaustive=True)
    front = pareto(full.per_nodes[0].feasible, "tokens_per_s", "memory_headroom_gib")
    floor = (1 - FRONT_WINDOW) * front[0]["tokens_per_s"]
    want = [(r["tokens_per_s"], r["memory_headroom_gib"]) for r in front if r["tokens_per_s"] >= floor]
    got = [(r["tokens_per_s"], r["memory_headroom_gib"]) for r in fast.pareto_memory()]
    assert len(want) >= 2
    assert [x for pair in got for x in pair] == pytest.approx([x for pair in want for x in pair])
    assert fast.evaluated < full.evaluated


def test_simulate_without_degrees_searches(tmp_path: object) -> None:
    """`simulate` given no parallel degree runs the search, simulates the best and says so; a knob the user
    gave is held fixed; with a degree given nothing is searched."""
    out = tmp_path / "o.json"
    p = _cli("simulate", "--model", "gpt3-350m", "--cluster", "dgx-a100", "--nodes", "1", "--global-batch", "32",
             "--recompute", "full", "--json", str(out))
    assert p.returncode == 0, p.stderr
    data = json.loads(out.read_text())
    chosen = data["strategy_search"]["chosen"]
    assert chosen["recompute"] == "full" and data["strategy"]["recompute"] == "full"
    for k in ("tp", "pp", "dp", "micro_batch", "zero"):
        assert data["strategy"][k] == chosen[k], k
    assert data["strategy_search"]["evaluated"] >= 1 and data["strategy_search"]["proven_optimal"]
    assert "strategy chosen by search" in " ".join(p.stdout.split())
    # the chosen strategy is the search's best for the same job
    best = search({"model": {"name": "gpt3-350m"}, "cluster": {"name": "dgx-a100"}}, [1], 32,
                  space=SearchSpace(recompute=["full"]), top=1).best
    assert data["iteration_time_s"] == pytest.approx(best["iteration_time_s"])
    q = _cli("simulate", "--model", "gpt3-350m", "--cluster", "dgx-a100", "--nodes", "1", "--tp", "2", "--json",
             str(out), "-q")
    assert q.returncode == 0, q.stderr
    assert "strategy_search" not in json.loads(out.read_text())


def test_python_search_api() -> None:
    import trainsim
    from trainsim.errors import ConfigError

    r = trainsim.search("gpt3-350m", "dgx-a100", nodes=1, global_batch=32, space={"micro_batch": [1, 2], "vpp": [1]},
                        top=2)
    assert r.best is not None and r.best["n_gpus"] == 8 and len(r.top) == 2
    assert json.loads(json.dumps(r.to_json()))["best"]["strategy"]["dp"] * r.best["tp"] * r.best["pp"] \
        * r.best["cp"] == 8
    for kwargs in ({"tp": 2}, {"global_batch": "32"}, {"top": 0}, {"nodes": [0]}, {"space": {"tp": "x"}},
                   {"no_such_key": 1}, {"time_limit_s": float("nan")}):
        with pytest.raises(ConfigError):
            trainsim.search("gpt3-350m", "dgx-a100", **{"nodes": 1, **kwargs})


def test_search_on_ray_matches_local() -> None:
    """The same search spread over a local 2-CPU Ray cluster settles the same top configurations."""
    pytest.importorskip("ray")
    from trainsim.optimize.runners import Runner

    local = search(SMALL_JOB, [1], 16, space=SMALL_SPACE, top=3)
    with Runner(2, ray="auto", ray_init_kwargs={"num_cpus": 2}) as runner:
        assert runner.workers == 2
        remote = search(SMALL_JOB, [1], 16, space=SMALL_SPACE, top=3, runner=runner)
    assert [r["key"] for r in remote.top] == [r["key"] for r in local.top]
    assert [r["iteration_time_s"] for r in remote.top] == [r["iteration_time_s"] for r in local.top]
    assert remote.pruned.get("memory_bound", 0) == local.pruned.get("memory_bound", 0)


def test_dualpipev_enters_the_space_at_two_chunks_per_rank() -> None:
    """DualPipeV candidates run a V of 2 x pp chunks (vpp 2) over a pipeline with at least 2 x pp micro-batches,
    whatever pp divides; their strategy section keeps the schedule (vpp 2 alone would mean interleaving)."""
    base, model, cl = _setup(_BOUND_JOB, 2)
    space = SearchSpace(micro_batch=[1, 2], vpp=[1, 2, 4], cp=[1], schedule=["1f1b", "dualpipev"])
    en = enumerate_space(space, model, cl.world_size, cl.gpus_per_node, 18)
    dual = [c for c in en.candidates if c.schedule == "dualpipev"]
    assert dual and all(c.vpp == 2 and c.pp > 1 and c.micro_batches >= 2 * c.pp for c in dual)
    assert any(c.micro_batches % c.pp for c in dual)  # interleaving's groups of pp do not bind it
    assert not any(c.schedule == "1f1b" and c.vpp > 1 and c.micro_batches % c.pp for c in en.candidates)
    kept = {(c.tp, c.pp, c.dp, c.micro_batch) for c in dual}
    for tp, pp, mb in product((1, 2, 4, 8), (2, 4, 8), (1, 2)):  # every pipeline the rules let through is there
        dp = cl.world_size // (tp * pp)
        if dp and 18 % (mb * dp) == 0 and 18 // (mb * dp) >= 2 * pp and tp <= cl.gpus_per_node and 8 % (2 * pp) == 0:
            assert (tp, pp, dp, mb) in kept
    s = dual[0].strategy()
    assert s["schedule"] == "dualpipev" and s["vpp"] == 2
    assert parse_job({**_BOUND_JOB, "strategy": s}).strategy.schedule == "dualpipev"


@pytest.fixture(scope="module")
def dual_setup(bound_setup: tuple[BoundModel, list[Candidate]]) -> list[Candidate]:
    bm = bound_setup[0]
    space = SearchSpace(micro_batch=[1, 2], vpp=[2], cp=[1, 2], schedule=["dualpipev"])
    return enumerate_space(space, bm.model, bm.cluster.world_size, bm.cluster.gpus_per_node, 64).candidates


@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_dualpipev_bounds_never_exceed_the_simulation(bound_setup: tuple[BoundModel, list[Candidate]],
                                                      dual_setup: list[Candidate], data: st.DataObject) -> None:
    """The time and memory bounds stay below the event simulation's DualPipeV runs (its V: rank 0 holds the
    embedding and the head, the bottom hands over without a send; after a rank's last first-arm B the last
    micro-batch's input gradients still run down to rank 0)."""
    bm = bound_setup[0]
    c = data.draw(st.sampled_from(dual_setup))
    lb, mem = bm.bounds(c, refine=data.draw(st.booleans()))
    row = evaluate({**_BOUND_JOB, "strategy": c.strategy()})
    assert row["error"] is None, row["error"]
    assert 0 < lb <= row["iteration_time_s"] * (1 + 1e-9), (c, lb, row["iteration_time_s"])
    assert 0 < mem <= row["peak_memory_gib"] * 2**30 * (1 + 1e-9), c


def test_in_flight_counts_of_dualpipev() -> None:
    """DualPipeV's rank 0 holds the most chunk forwards at once (2 pp + 1 with the last warm-up's), the V's bottom
    the fewest; the bound's count is the schedule's own."""
    for p in (2, 4, 8):
        held = _in_flight("dualpipev", p, 4 * p, 2)
        assert held[0] == max(held) == 2 * p + 1
        assert list(held) == sorted(held, reverse=True)


def test_simulate_without_degrees_searches_dualpipev(tmp_path: object) -> None:
    """`simulate --schedule dualpipev` with no parallel degree searches the pipelines DualPipeV can run (two
    chunks per rank, at least 2 x pp micro-batches) and simulates the best with that schedule."""
    from trainsim.cli import main

    out = tmp_path / "d.json"
    main(["simulate", "--model", "gpt3-350m", "--cluster", "dgx-a100", "--nodes", "1", "--global-batch", "32",
          "--schedule", "dualpipev", "--recompute", "none", "--json", str(out), "-q"])
    data = json.loads(out.read_text())
    chosen = data["strategy_search"]["chosen"]
    assert chosen["schedule"] == data["strategy"]["schedule"] == "dualpipev"
    assert data["strategy"]["vpp"] == 2 and data["strategy"]["pp"] > 1
    assert data["strategy"]["grad_accumulation"] >= 2 * data["strategy"]["pp"]


def test_uneven_pipelines_enter_the_space_and_stay_bounded() -> None:
    """A model whose layer count no pipeline depth divides (7 blocks, as DeepSeek-V3's 61) still gets pipelines: the
    powers of 2 up to its blocks, split as evenly as possible (the end chunks one block short, as the presets
    split); their bounds stay below the simulation and the search ranks them."""
    job = {"model": {"name": "custom", "layers": 7, "hidden": 1024, "heads": 16, "seq_len": 1024},
           "cluster": {"name": "dgx-a100", "nodes": 1}, "simulation": {}}
    base, model, cl = _setup(job, 1)
    space = SearchSpace(micro_batch=[1], cp=[1], recompute=["none"], zero=[1], overlap_param_gather=[False],
                        tp_comm_overlap=[False], sequence_parallel=[False], tp=[1, 2])
    en = enumerate_space(space, model, cl.world_size, cl.gpus_per_node, 16)
    assert {c.pp for c in en.candidates} == {1, 2, 4}  # 7 does not divide the 8 GPUs
    uneven = [c for c in en.candidates if 7 % (c.pp * c.vpp)]
    assert uneven and all(c.pp * c.vpp <= 7 for c in uneven)
    bm = BoundModel(base, model, cl)
    for c in uneven[:: max(1, len(uneven) // 4)]:
        row = evaluate({**job, "strategy": c.strategy()})
        assert row["error"] is None, row["error"]
        lb, mem = bm.bounds(c)
        assert 0 < lb <= row["iteration_time_s"] * (1 + 1e-9), c
        assert 0 < mem <= row["peak_memory_gib"] * 2**30 * (1 + 1e-9), c
    best = search(job, [1], 16, space=space, top=1, pareto_memory=False).best
    assert best is not None


def test_default_schedules_add_dualpipev_for_a_mixture_of_experts() -> None:
    """The default space tries 1F1B (interleaved at vpp > 1) and ZB-H1, and DualPipeV where the model has experts
    (DeepSeek's schedule for hiding their all-to-alls); a space may name any of them."""
    from trainsim.optimize.space import knob_values

    dense = api.cluster_and_model({"model": {"name": "gpt2"}, "cluster": {"name": "dgx-a100"}})[1]
    moe = api.cluster_and_model({"model": {"name": "mixtral-8x7b", "layers": 4}, "cluster": {"name": "dgx-h100"}})[1]
    assert knob_values(SearchSpace(), dense, 8)["schedule"] == ["1f1b", "zb-h1"]
    assert knob_values(SearchSpace(), moe, 8)["schedule"] == ["1f1b", "zb-h1", "dualpipev"]
    assert knob_values(SearchSpace(schedule=["dualpipev"]), dense, 8)["schedule"] == ["dualpipev"]
    assert parse_space({"schedule": ["dualpipev"]}).schedule == ["dualpipev"]
    assert parse_space({"tp": [1, 2]}).schedule is None


MOE_JOB = {"model": {"name": "mixtral-8x7b", "layers": 4, "seq_len": 1024}, "cluster": {"name": "dgx-h100"},
           "strategy": {"ep_dispatcher": "deepep", "ep_overlap": True}}


def test_search_holds_the_jobs_expert_parallel_knobs() -> None:
    """A job's ep_dispatcher / ep_overlap are held for every candidate with ep > 1 (the space does not vary them),
    its bounds' reduced jobs included: each simulated row ran with them, the bounds stay below those runs, and
    the best strategy carries them."""
    space = SearchSpace(micro_batch=[1], cp=[1], recompute=["none"], zero=[1], overlap_param_gather=[False],
                        tp_comm_overlap=[False], sequence_parallel=[False], vpp=[1], schedule=["1f1b"])
    res = search(MOE_JOB, [1], 16, space=space, top=2, pareto_memory=False)
    rows = [r for r in res.per_nodes[0].rows if r.get("error") is None]
    moe = [r for r in rows if r["ep"] > 1]
    assert moe and all('"ep_dispatcher":"deepep"' in r["job"] and '"ep_overlap":true' in r["job"] for r in moe)
    assert all('"ep_overlap"' not in r["job"] for r in rows if r["ep"] == 1)
    base, model, cl = _setup(MOE_JOB, 1)
    bm = BoundModel({**base, "strategy": MOE_JOB["strategy"]}, model, cl)
    for r in moe:
        c = Candidate(**{k: r[k] for k in Candidate.__dataclass_fields__ if r.get(k) is not None})
        lb, mem = bm.bounds(c)
        assert 0 < lb <= r["iteration_time_s"] * (1 + 1e-9), c
        assert 0 < mem <= r["peak_memory_gib"] * 2**30 * (1 + 1e-9), c
    best = res.entry(res.best)["strategy"]
    if best["ep"] > 1:
        assert best["ep_dispatcher"] == "deepep" and best["ep_overlap"] is True
    else:
        assert "ep_overlap" not in best


@pytest.mark.parametrize(("args", "field"), [(["--ep-dispatcher", "nccl"], "strategy.ep_dispatcher")])
def test_cli_bad_held_knob_is_one_line(args: list[str], field: str) -> None:
    p = _cli("search", "--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--nodes", "1", *args)
    assert p.returncode == 2 and field in p.stderr and "Traceback" not in p.stderr


def test_simulate_without_degrees_holds_the_expert_parallel_knobs(tmp_path: object) -> None:
    """`simulate` with ep_dispatcher / ep_overlap and no degree searches (they are held, not a strategy that
    needs ep > 1 before the search chose one), and the job it simulates keeps them where ep > 1."""
    from trainsim.cli import main

    job = tmp_path / "moe.yaml"
    job.write_text(json.dumps({**MOE_JOB, "cluster": {"name": "dgx-h100", "nodes": 1},
                               "strategy": {**MOE_JOB["strategy"], "global_batch": 16, "recompute": "none",
                                            "zero": 1}}))
    out = tmp_path / "o.json"
    main(["simulate", str(job), "--json", str(out), "-q"])
    data = json.loads(out.read_text())
    assert "strategy_search" in data
    strat = data["job"]["strategy"]
    assert strat["ep"] == 1 or (strat["ep_dispatcher"] == "deepep" and strat["ep_overlap"] is True)
