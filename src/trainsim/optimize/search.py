"""`trainsim search`: the fastest strategy that fits, found by branch and bound over the event simulation.

1. The space (optimize.space) is enumerated with its static rules (divisibility, node size, knobs that
   contradict or duplicate each other), each counted.
2. Every survivor gets two cheap bounds (optimize.bounds): a lower bound on peak memory (pruned when
   above capacity: it would OOM) and a lower bound on the iteration time.
3. The cheap bound ranks the survivors; the event simulation confirms them best-first, a batch per
   worker at a time, until the next bound is no better than the k-th best simulated time: nothing left
   can enter the top k, so the best (and the top k) equal an exhaustive search's.
4. For the throughput / memory-headroom Pareto front, configurations whose bounds could still reach the
   front are simulated too, until none can.
With several node counts each is searched, and their bests give the throughput-vs-GPUs front.
"""

from __future__ import annotations

import heapq
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..api import cluster_and_model, job_from_keywords
from ..errors import ConfigError
from .bounds import BoundModel
from .space import (
    PRUNE_REASONS,
    Candidate,
    SearchSpace,
    enumerate_space,
    held_knobs,
    strategy_section,
    with_held,
)

BOUND_MARGIN = 0.005  # a bound within 0.5% of the k-th best is simulated anyway (float and attribution slack)
FRONT_WINDOW = 0.10  # the throughput / memory-headroom front is exact down to 90% of the best throughput
RESULT_KEYS = ("iteration_time_s", "tokens_per_s", "samples_per_s", "mfu", "peak_memory_gib", "memory_headroom_gib",
               "dominant")

SearchProgress = Callable[[str, int, int], None]
"""progress(what, settled, total): configurations settled (simulated or pruned) of those to settle."""


@dataclass
class NodesResult:
    """The search at one node count."""

    nodes: int
    n_gpus: int
    space: int
    rows: list[dict[str, Any]]  # every simulated configuration (evaluate's rows, best first)
    pruned: Counter
    proven: bool  # False when the time limit stopped it before the bound did
    open_bounds_s: list[float] = field(default_factory=list)  # time bounds of the candidates not simulated

    def could_beat(self, time_s: float) -> int:
        """How many configurations not simulated might still be faster than `time_s` (their bound is lower)."""
        return sum(1 for lb in self.open_bounds_s if lb * (1.0 - BOUND_MARGIN) < time_s)

    @property
    def feasible(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r.get("error") is None and r.get("fits")]


@dataclass
class SearchResult:
    per_nodes: list[NodesResult]
    top_k: int
    wall_s: float
    reduced_jobs: int = 0
    front_exact: bool = False  # the memory-headroom front was completed (pareto_memory), not just read off
    held: dict[str, Any] = field(default_factory=dict)  # the job's strategy keys every ep > 1 candidate took

    @property
    def rows(self) -> list[dict[str, Any]]:
        return sorted((r for n in self.per_nodes for r in n.feasible), key=rank_key)

    @property
    def best(self) -> dict[str, Any] | None:
        rows = self.rows
        return rows[0] if rows else None

    @property
    def top(self) -> list[dict[str, Any]]:
        return self.rows[:self.top_k]

    @property
    def evaluated(self) -> int:
        return sum(len(n.rows) for n in self.per_nodes)

    @property
    def pruned(self) -> dict[str, int]:
        total: Counter = Counter()
        for n in self.per_nodes:
            total.update(n.pruned)
        return {k: total[k] for k in PRUNE_REASONS if total[k]}

    @property
    def space(self) -> int:
        return sum(n.space for n in self.per_nodes)

    @property
    def proven(self) -> bool:
        return all(n.proven for n in self.per_nodes)

    def pareto_gpus(self) -> list[dict[str, Any]]:
        """The best of each node count that beats every smaller cluster's best."""
        out: list[dict[str, Any]] = []
        for n in sorted(self.per_nodes, key=lambda n: n.n_gpus):
            feas = n.feasible
            if not feas:
                continue
            best = max(feas, key=throughput)
            if not out or throughput(best) > throughput(out[-1]):
                out.append(best)
        return out

    def pareto_memory(self) -> list[dict[str, Any]]:
        """Per node count, the configurations no other beats in both throughput and memory headroom, down to
        FRONT_WINDOW below that count's best throughput (the part the search makes exact)."""
        out: list[dict[str, Any]] = []
        for n in self.per_nodes:
            front = pareto(n.feasible, "tokens_per_s", "memory_headroom_gib")
            floor = (1.0 - FRONT_WINDOW) * max((throughput(r) for r in front), default=0.0)
            out += [r for r in front if throughput(r) >= floor]
        return out

    def entry(self, row: dict[str, Any]) -> dict[str, Any]:
        """A row as the JSON gives it: the strategy as the job YAML writes it, plus the results."""
        return {"strategy": with_held(strategy_section(row), self.held, row.get("ep") or 1),
                "nodes": row.get("nodes"), "n_gpus": row.get("n_gpus"), **{k: row.get(k) for k in RESULT_KEYS}}

    def to_json(self) -> dict[str, Any]:
        best = self.best
        return {
            "kind": "search",
            "best": self.entry(best) if best else None,
            "top": [self.entry(r) for r in self.top],
            "evaluated": self.evaluated,
            "pruned": self.pruned,
            "space": self.space,
            "proven_optimal": self.proven,
            "pareto_gpus": [self.entry(r) for r in self.pareto_gpus()],
            "pareto_memory": [self.entry(r) for r in self.pareto_memory()],
            "pareto_memory_exact": self.front_exact,
            "per_nodes": [{"nodes": n.nodes, "n_gpus": n.n_gpus, "space": n.space, "evaluated": len(n.rows),
                           "best": self.entry(max(n.feasible, key=throughput)) if n.feasible
                           else None} for n in self.per_nodes],
            "simulated": [{**self.entry(r), "fits": bool(r.get("fits")), **({"error": r["error"]} if r.get("error")
                                                                             else {})}
                          for n in self.per_nodes for r in n.rows],
            "wall_s": self.wall_s,
        }


def throughput(row: dict[str, Any]) -> float:
    """What the search maximises: tokens/s, or samples/s for a model without a sequence (a CNN)."""
    return row.get("tokens_per_s") or row.get("samples_per_s") or 0.0


_RECOMPUTE_ORDER = {"none": 0, "selective": 1, "full": 2}


def rank_key(row: dict[str, Any]) -> tuple:
    """Fastest first; among equal times the simpler configuration (less sharding, recompute, overlap,
    fewer stages and shards), so ties come out the same every run."""
    return (-round(throughput(row), 6), row.get("zero") or 0, _RECOMPUTE_ORDER.get(row.get("recompute"), 3),
            bool(row.get("overlap_param_gather")), bool(row.get("tp_comm_overlap")),
            not row.get("overlap_grad_reduce", True), row.get("vpp") or 1, row.get("pp") or 1, row.get("tp") or 1,
            row.get("cp") or 1, row.get("micro_batch") or 1, str(row.get("schedule")), bool(row.get("sequence_parallel")))


def pareto(rows: list[dict[str, Any]], a: str, b: str) -> list[dict[str, Any]]:
    """Rows not dominated in (a, b), both maximised, sorted by a descending."""
    def get(r: dict[str, Any], k: str) -> float:
        return throughput(r) if k == "tokens_per_s" else r[k]

    out: list[dict[str, Any]] = []
    for r in sorted(rows, key=lambda r: (-get(r, a), -get(r, b))):
        if not out or get(r, b) > get(out[-1], b):
            out.append(r)
    return out


def _base_job(job: dict[str, Any], nodes: int) -> dict[str, Any]:
    """The job's model, cluster (at `nodes`) and simulation sections, and the strategy keys a search holds."""
    base = {k: dict(job.get(k) or {}) for k in ("model", "cluster", "simulation")}
    base["cluster"]["nodes"] = nodes
    if held := held_knobs(job.get("strategy")):
        base["strategy"] = held
    return base


def search(job: dict[str, Any], nodes: list[int], global_batch: int, *, space: SearchSpace | None = None,
           top: int = 3, time_limit_s: float | None = None, runner: Any = None, store: Any = None,
           study: str = "search", exhaustive: bool = False, pareto_memory: bool = False,
           beat_s: float | None = None, progress: SearchProgress | None = None) -> SearchResult:
    """Search the strategy space of `job` (its model, cluster and simulation sections; of its strategy only the
    expert-parallel dispatch and overlap, space.HELD_KNOBS, held for every candidate with ep > 1) at each node
    count. `runner` evaluates batches of jobs (optimize.runners.Runner; in-process when
    None), `store` keeps every evaluated row (optimize.store.ResultsStore). `exhaustive` simulates every
    candidate that passes the static rules (the reference the bounds are tested against). `beat_s`: also
    simulate every configuration that could be faster than this iteration time (to rank a given strategy:
    every configuration faster than it is then among the rows)."""
    t0 = time.perf_counter()
    space = space or SearchSpace()
    deadline = None if time_limit_s is None else t0 + time_limit_s
    per_nodes: list[NodesResult] = []
    reduced = 0

    def run_batch(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if store is not None:
            from .runners import Runner, run_with_store
            return run_with_store(jobs, runner or Runner(1), store, study)[0]
        if runner is not None:
            return runner.map(jobs)
        from .evaluate import evaluate
        return [evaluate(j) for j in jobs]

    width = max(1, getattr(runner, "workers", 1) or 1)
    for n_nodes in nodes:
        if deadline is not None and time.perf_counter() > deadline and per_nodes:
            break
        ns = _NodeSearch(_base_job(job, n_nodes), n_nodes, global_batch, space, top, run_batch, width, deadline,
                         exhaustive, progress, beat_s)
        per_nodes.append(ns.run(pareto_memory))
        reduced += ns.bm.reduced_jobs
    return SearchResult(per_nodes, top, time.perf_counter() - t0, reduced, front_exact=pareto_memory and not exhaustive,
                        held=held_knobs(job.get("strategy")))


class _NodeSearch:
    """Branch and bound at one node count: a heap of candidates by time bound, refined lazily."""

    def __init__(self, base: dict[str, Any], nodes: int, global_batch: int, space: SearchSpace, top: int,
                 run_batch: Callable[[list[dict[str, Any]]], list[dict[str, Any]]], width: int,
                 deadline: float | None, exhaustive: bool, progress: SearchProgress | None,
                 beat_s: float | None = None) -> None:
        self.base, self.nodes, self.top, self.width = base, nodes, top, width
        self.beat_s = beat_s
        self.run_batch, self.deadline, self.exhaustive, self.progress = run_batch, deadline, exhaustive, progress
        self.cluster, self.model = cluster_and_model(base)
        self.tokens = global_batch * (self.model.seq_len or 1)
        self.en = enumerate_space(space, self.model, self.cluster.world_size, self.cluster.gpus_per_node,
                                  global_batch)
        self.pruned: Counter = Counter(self.en.pruned)
        self.bm = BoundModel(base, self.model, self.cluster)
        self.scored: list[tuple[float, float, Candidate]] = []
        self.done: list[bool] = []
        self.rows: list[dict[str, Any]] = []
        self.times: list[float] = []  # feasible iteration times, ascending

    def _tick(self, what: str, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress(f"{what} ({self.cluster.world_size} GPUs)", done, total)

    def _settle(self, batch: list[int]) -> None:
        held = self.base.get("strategy") or {}
        jobs = [{**self.base, "strategy": with_held(c.strategy(), held, c.ep)}
                for c in (self.scored[i][2] for i in batch)]
        for i, row in zip(batch, self.run_batch(jobs), strict=True):
            self.done[i] = True
            row["nodes"] = self.nodes
            self.rows.append(row)
            if row.get("error") is None and row.get("fits"):
                self.times.append(row["iteration_time_s"])
        self.times.sort()

    def _kth(self) -> float:
        kth = self.times[self.top - 1] if len(self.times) >= self.top else float("inf")
        return kth if self.beat_s is None else max(kth, self.beat_s)

    def run(self, pareto_memory: bool) -> NodesResult:
        cands = self.en.candidates
        cut = False
        for i, c in enumerate(cands):
            if not i % 1024:
                self._tick("bounding", i, len(cands))
                if self.deadline is not None and time.perf_counter() > self.deadline:
                    self.pruned["time_limit"] += len(cands) - i
                    cut = True
                    break
            lb, mem = self.bm.bounds(c)
            if not self.exhaustive and mem > self.bm.capacity_bytes:
                self.pruned["memory_bound"] += 1
                continue
            self.scored.append((lb, mem, c))
        self.done = [False] * len(self.scored)
        heap = [(lb, i, False) for i, (lb, _, _) in enumerate(self.scored)]
        heapq.heapify(heap)
        proven, settled, total = not cut, 0, len(self.scored)
        while heap:
            if self.deadline is not None and time.perf_counter() > self.deadline:
                proven = False
                break
            batch: list[int] = []
            while heap and len(batch) < self.width:
                lb, i, refined = heapq.heappop(heap)
                if not self.exhaustive and lb * (1.0 - BOUND_MARGIN) >= self._kth():
                    heap.clear()  # every bound left is at least this one: none can enter the top k
                    break
                c = self.scored[i][2]
                if not refined and not self.exhaustive and self.bm.refinable(c):
                    lb, mem = self.bm.bounds(c, refine=True)
                    self.scored[i] = (lb, mem, c)
                    heapq.heappush(heap, (lb, i, True))
                    continue
                batch.append(i)
            if batch:
                self._settle(batch)
                settled += len(batch)
                self._tick("simulating", settled, total)
        if pareto_memory and not self.exhaustive and proven:  # the best is proven; the front may be cut short
            _refine_front(self.scored, self.done, self.rows, self.bm.capacity_bytes, self.tokens, self._settle,
                          self.width, self.deadline)
        left = self.done.count(False)
        if left:
            self.pruned["throughput_bound" if proven else "time_limit"] += left
        self.rows.sort(key=rank_key)
        open_bounds = sorted(lb for i, (lb, _, _) in enumerate(self.scored) if not self.done[i])
        return NodesResult(self.nodes, self.cluster.world_size, self.en.space_size, self.rows,
                           self.pruned, proven, open_bounds)


def _refine_front(scored: list[tuple[float, float, Candidate]], done: list[bool], rows: list[dict[str, Any]],
                  capacity: float, tokens: float, settle: Callable[[list[int]], None], width: int,
                  deadline: float | None) -> bool:
    """Simulate the unsimulated configurations whose bounds (throughput at most tokens / time bound,
    headroom at most capacity - memory bound) no simulated configuration dominates and that could reach
    FRONT_WINDOW of the best throughput, until none is left: then the throughput / headroom front of the
    simulated rows is the true one down to that throughput. False on the deadline."""
    gib = 2**30
    while True:
        feasible = [r for r in rows if r.get("error") is None and r.get("fits")]
        front = pareto(feasible, "tokens_per_s", "memory_headroom_gib")
        floor = (1.0 - FRONT_WINDOW) * max((throughput(r) for r in feasible), default=0.0)
        todo = []
        for i, (lb, mem, _) in enumerate(scored):
            if done[i] or lb <= 0:
                continue
            ub_tok = tokens / (lb * (1.0 - BOUND_MARGIN))
            if ub_tok < floor:
                continue
            ub_head = (capacity - mem) / gib
            if not any(throughput(r) >= ub_tok and r["memory_headroom_gib"] >= ub_head for r in front):
                todo.append(i)
        if not todo:
            return True
        if deadline is not None and time.perf_counter() > deadline:
            return False
        settle(todo[:width])


TOKENS_PER_BATCH = 4 * 2**20  # the default global batch aims at ~4M tokens (GPT-3 / Llama-class pre-training)


def default_global_batch(world: int, seq_len: int | None) -> int:
    """A global batch for a search that was given none: about 4M tokens, a multiple of the GPU count, at
    most 16 sequences per GPU (so small clusters do not simulate hundreds of micro-batches)."""
    want = TOKENS_PER_BATCH // max(1, seq_len or 1)
    per_gpu = min(16, max(1, -(-want // world)))
    return world * per_gpu


def parse_space(data: Any, field: str = "--space") -> SearchSpace:  # noqa: ANN401 - a loaded YAML document
    """A SearchSpace from a YAML mapping; a bad key or value is one ConfigError naming it."""
    from pydantic import ValidationError

    if data is None:
        return SearchSpace()
    if not isinstance(data, dict):
        raise ConfigError(field, f"must be a mapping of knob: [values], not {type(data).__name__}",
                          "e.g. {tp: [4, 8], recompute: [selective]}")
    try:
        space = SearchSpace.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise ConfigError(f"{field}.{loc}" if loc else field, err["msg"].lower(),
                          f"knobs: {', '.join(SearchSpace.model_fields)}") from None
    for name in ("tp", "pp", "cp", "ep", "vpp", "micro_batch", "zero"):
        values = getattr(space, name)
        if values is not None and (not values or any(x < (0 if name == "zero" else 1) for x in values)):
            raise ConfigError(f"{field}.{name}", f"needs positive values, got {values}",
                              "give a non-empty list such as [1, 2, 4]")
    if any(z > 3 for z in space.zero):
        raise ConfigError(f"{field}.zero", f"ZeRO stages are 0..3, got {space.zero}", "use values 0 to 3")
    for name in ("sequence_parallel", "recompute", "overlap_grad_reduce", "overlap_param_gather",
                 "tp_comm_overlap", "schedule"):
        if getattr(space, name) is not None and not getattr(space, name):
            raise ConfigError(f"{field}.{name}", "is empty", "give at least one value")
    return space


def run_search(job: dict[str, Any], nodes: list[int], global_batch: int | None, *,
               space: SearchSpace | None = None, top: int = 3, time_limit_s: float | None = None,
               jobs: int = 1, ray: str | None = None, db: str | None = None, study: str | None = None,
               exhaustive: bool = False, pareto_memory: bool = False,
               progress: SearchProgress | None = None) -> tuple[SearchResult, int]:
    """`search` with its runner and results store opened and closed here; returns the result and the
    global batch it used (`default_global_batch` of the largest cluster when None). `pareto_memory`: also
    simulate what could reach the throughput / memory-headroom front (else it is read off what was simulated)."""
    from .runners import Runner

    def whole(x: Any) -> bool:  # noqa: ANN401
        return isinstance(x, int) and not isinstance(x, bool)

    if not whole(top) or top < 1:
        raise ConfigError("--top", f"must be a whole number >= 1, got {top!r}", "pass how many configurations to list")
    if time_limit_s is not None and (isinstance(time_limit_s, bool) or not isinstance(time_limit_s, int | float)
                                     or not 0 < time_limit_s < float("inf")):
        raise ConfigError("--time-limit", f"must be > 0 seconds, got {time_limit_s!r}", "pass a positive number")
    if not nodes or any(not whole(n) or n < 1 for n in nodes):
        raise ConfigError("--nodes", f"needs positive node counts, got {nodes}", "e.g. --nodes 8 or --nodes 8,16,32")
    if global_batch is not None and not whole(global_batch):
        raise ConfigError("--global-batch", f"must be a whole number, got {global_batch!r}",
                          "pass sequences per iteration")
    if global_batch is None:
        cl, model = cluster_and_model(_base_job(job, max(nodes)))
        global_batch = default_global_batch(cl.world_size, model.seq_len)
    elif global_batch < 1:
        raise ConfigError("--global-batch", f"must be >= 1, got {global_batch}", "pass sequences per iteration")
    store = None
    if db is not None:
        from .store import ResultsStore
        store = ResultsStore(db)
    try:
        with Runner(jobs, ray) as runner:
            name = study or f"search {job.get('model', {}).get('name') or 'model'} {global_batch}"
            result = search(job, nodes, global_batch, space=space, top=top, time_limit_s=time_limit_s,
                            runner=runner, store=store, study=name, exhaustive=exhaustive,
                            pareto_memory=pareto_memory, progress=progress)
    finally:
        if store is not None:
            store.close()
    return result, global_batch


def search_keywords(model: str | dict[str, Any] | None = None, cluster: str | dict[str, Any] | None = None,
                    nodes: int | list[int] | None = None, global_batch: int | None = None, *,
                    space: SearchSpace | dict[str, Any] | None = None, top: int = 3, time_limit_s: float | None = None,
                    jobs: int = 1, ray: str | None = None, db: str | None = None, pareto_memory: bool = False,
                    progress: SearchProgress | None = None, **keys: Any) -> SearchResult:
    """trainsim.search: keywords as trainsim.simulate takes them (model/cluster/simulation keys), strategy
    keys excepted (the search chooses them)."""
    job = job_from_keywords(model, cluster, None, keys, caller="search")
    chosen = job.pop("strategy")
    if chosen:
        raise ConfigError(next(iter(chosen)), "is not a search keyword (the search chooses the strategy)",
                          "use model/cluster/simulation keys, or space={...} to restrict the strategy")
    if not job["model"]:
        job["model"] = {"name": "gpt3-175b", "seq_len": 2048}
    if not job["cluster"]:
        job["cluster"] = {"name": "dgx-a100"}
    if nodes is None:
        nodes = job["cluster"].pop("nodes", None) or 1
    node_list = [nodes] if isinstance(nodes, int) else list(nodes)
    if any(isinstance(n, bool) or not isinstance(n, int) for n in node_list):
        raise ConfigError("nodes", f"must be node counts, got {nodes!r}", "e.g. nodes=8 or nodes=[8, 16]")
    cluster_and_model(job)  # the job's keys checked before any search work
    sp = space if isinstance(space, SearchSpace) else parse_space(space, "space")
    result, _ = run_search(job, sorted(set(node_list)), global_batch, space=sp, top=top, time_limit_s=time_limit_s,
                           jobs=jobs, ray=ray, db=db, pareto_memory=pareto_memory, progress=progress)
    return result
