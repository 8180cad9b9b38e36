"""The fast caching-allocator replay (cost.allocator.replay_stages: compiled units, stages sharing their common
order, the cool-down cut short) against the reference replay it replaced (tests/allocator_reference.py), to
the byte, on random jobs: schedules 1f1b / interleaved / gpipe / zb-h1, recompute modes, ZeRO stages,
expandable_segments on and off."""

from __future__ import annotations

import copy
import random
from typing import Any

import allocator_reference as ref
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainsim import api
from trainsim.config import DEFAULT_JOB, parse_job
from trainsim.cost.allocator import (
    CachingAllocator,
    _compile,
    _Replay,
    replay_stages,
    round_size,
    stage_replay,
)
from trainsim.errors import ConfigError

MODELS = ("gpt2", "gpt3-350m", "gpt3-1.3b", "gpt2-medium")


def _random_job(rng: random.Random) -> dict[str, Any]:
    schedule = rng.choice(("1f1b", "interleaved", "gpipe", "zb-h1"))
    pp = rng.choice((2, 4, 6, 8, 12)) if schedule != "interleaved" else rng.choice((2, 4))
    tp = rng.choice((1, 2, 4))
    strategy: dict[str, Any] = {
        "tp": tp, "pp": pp, "dp": rng.choice((1, 2)), "micro_batch": rng.choice((1, 2)),
        "sequence_parallel": tp > 1 and rng.random() < 0.5,
        "recompute": rng.choice(("none", "selective", "full")), "zero": rng.choice((0, 1, 2, 3)),
        "schedule": schedule}
    strategy["global_batch"] = strategy["dp"] * strategy["micro_batch"] * rng.choice((pp, 2 * pp, 3 * pp + 1))
    if schedule == "interleaved":
        strategy["vpp"] = 2
        strategy["global_batch"] = strategy["dp"] * strategy["micro_batch"] * pp * rng.choice((1, 2, 3))
    if schedule == "1f1b" and rng.random() < 0.3:
        strategy["max_ongoing_micro_batch"] = rng.choice((1, 2, 3))
    world = strategy["tp"] * pp * strategy["dp"]
    return {"model": {"name": rng.choice(MODELS), "seq_len": rng.choice((512, 1024))},
            "cluster": {"name": "dgx-a100", "nodes": max(1, world // 8)} if world >= 8 else
            {"name": "dgx-a100", "nodes": 1, "gpus_per_node": world},
            "strategy": strategy, "simulation": {"expandable_segments": rng.random() < 0.5}}


def _stages(data: dict[str, Any]) -> tuple[list[tuple[list[Any], list[float]]], Any, bool, dict] | None:
    """The (chunks, static blocks) of each rank of a job, its schedule, its expandable setting and lowering's
    record of chunk copies (api._phase_copies)."""
    try:
        job = parse_job(data)
        cl, _, tree = api.job_tree(job)
        costed = api.costed_program(tree, cl, job.simulation, job.cluster.remote_memory)
    except (ConfigError, ValueError):
        return None
    statics, _ = api._stage_terms(costed, cl)
    by_rank: dict[int, list[Any]] = {}
    for ch in costed.program.chunks:
        by_rank.setdefault(ch.pp_rank, []).append(ch)
    stages = [(by_rank[r], api._static_blocks(by_rank[r], statics[r], costed.precision)) for r in sorted(statics)]
    return stages, costed.program.tree.schedule, job.simulation.expandable_segments, api._phase_copies(costed.program)


def _assert_matches_reference(stages: list, sched: Any, expandable: bool, copies: dict) -> tuple[tuple, list]:
    """replay_stages, with lowering's record of chunk copies and without, equals the reference's stage-by-stage
    replay on both peaks of every stage; the replay's arguments and the reference's estimates."""
    args = (sched.kind, len(stages), sched.n_micro_batch, sched.virtual_stages, sched.max_ongoing_micro_batch,
            expandable)
    slow = [ref.stage_replay(chunks, static, *args) for chunks, static in stages]
    for record in (copies, None):
        fast = replay_stages(stages, *args, copies=record)
        assert [(e.peak_allocated_bytes, e.peak_reserved_bytes) for e in fast] == \
               [(e.peak_allocated_bytes, e.peak_reserved_bytes) for e in slow]
    return args, slow


@pytest.mark.parametrize("seed", range(24))
def test_fast_replay_matches_the_reference_to_the_byte(seed: int) -> None:
    rng = random.Random(seed)
    got = None
    while got is None:
        got = _stages(_random_job(rng))
    stages, sched, expandable, copies = got
    args, slow = _assert_matches_reference(stages, sched, expandable, copies)
    one = stage_replay(*stages[-1], *args)
    assert (one.peak_allocated_bytes, one.peak_reserved_bytes) == \
           (slow[-1].peak_allocated_bytes, slow[-1].peak_reserved_bytes)


def test_default_job_stages_match_the_reference() -> None:
    got = _stages(copy.deepcopy(DEFAULT_JOB))
    assert got is not None
    stages, sched, expandable, copies = got
    assert copies  # the default job's middle chunks are lowered as copies
    for exp in (expandable, not expandable):
        _assert_matches_reference(stages, sched, exp, copies)


@pytest.mark.parametrize("expandable", [False, True])
def test_allocator_matches_the_reference_on_random_events(expandable: bool) -> None:
    rng = random.Random(7)
    for _ in range(30):
        events: list[tuple[str, float | int]] = []
        live: list[int] = []
        for i in range(300):
            if live and rng.random() < 0.45:
                events.append(("free", live.pop(rng.randrange(len(live)))))
            else:
                size = rng.choice((rng.randrange(1, 1 << 20), rng.randrange(1 << 20, 12 << 20),
                                   rng.randrange(10 << 20, 64 << 20), 2 << 20, 6 << 20))
                events.append(("alloc", size))
                live.append(i)
        a, b = CachingAllocator(expandable), ref.CachingAllocator(expandable)
        ha: dict[int, int] = {}
        hb: dict[int, int] = {}
        for i, (kind, value) in enumerate(events):
            if kind == "alloc":
                ha[i], hb[i] = a.alloc(float(value)), b.alloc(float(value))
            else:
                a.free(ha.pop(int(value)))
                b.free(hb.pop(int(value)))
            assert (a.allocated_bytes, a.reserved_bytes) == (b.allocated_bytes, b.reserved_bytes)
        assert (a.peak_allocated_bytes, a.peak_reserved_bytes) == (b.peak_allocated_bytes, b.peak_reserved_bytes)


def test_deep_pipeline_stages_match_the_reference() -> None:
    """A pp 32 job (deeper than the random ones): 30 middle ranks fork off one shared warm-up, one rank at a
    time, so `_Replay.descend`'s grouping (programs compared by identity) is exercised at every position."""
    got = _stages({"model": {"name": "gpt3-175b"}, "cluster": {"name": "dgx-a100", "nodes": 32},
                   "strategy": {"tp": 8, "pp": 32, "dp": 1, "global_batch": 64, "sequence_parallel": True,
                                "recompute": "selective", "zero": 1}})
    assert got is not None
    stages, sched, _, copies = got
    for exp in (False, True):
        _assert_matches_reference(stages, sched, exp, copies)


_SIZES = st.one_of(st.integers(1, 1 << 20), st.integers(1 << 20, 12 << 20), st.integers(10 << 20, 40 << 20))
_STEPS = st.lists(st.tuples(st.one_of(st.just(0), _SIZES), st.one_of(st.just(0), _SIZES)), min_size=1, max_size=12)


@settings(max_examples=300, deadline=None)
@given(fwd=_STEPS, bwd=_STEPS, static=st.lists(_SIZES, max_size=6), warm=st.integers(1, 6),
       expandable=st.booleans())
def test_cut_short_cool_down_equals_the_whole_replay(fwd: list[tuple[int, int]], bwd: list[tuple[int, int]],
                                                     static: list[int], warm: int, expandable: bool) -> None:
    """`_Replay.finish` stops a cool-down of contained backwards early on its bound (per pool: the requests'
    sum, or their largest live total when the unit frees its own blocks last in first out); on random forward
    and backward steps, after any number of forwards, it reads the same peaks as replaying every unit."""
    fwd_steps = [(float(a), float(f), "fwd") for a, f in fwd]
    held = sum(a for a, _ in fwd) + sum(a for a, _ in bwd)
    bwd_steps = [(float(a), float(f), "bgrad") for a, f in bwd] + [(0.0, float(held), "bgrad")]  # frees all
    stack: list[tuple[int, int]] = []
    slots: list[int] = []
    prog_f = _compile(fwd_steps, stack, slots, expandable)
    prog_b = _compile(bwd_steps, stack, slots, expandable)
    assert prog_b.contained
    plan = [((mb, 0), prog_f) for mb in range(warm)] + [((mb, 0), prog_b) for mb in range(warm)]
    cut, whole = CachingAllocator(expandable), CachingAllocator(expandable)
    for a in (cut, whole):
        a.run([round_size(b) for b in static], [])
    got = _Replay.finish(cut, {}, plan, 0)
    units: dict[tuple[int, int], list[int]] = {}
    for unit, prog in plan:
        whole.run(prog.ops, units.setdefault(unit, []))
    assert (got.peak_allocated_bytes, got.peak_reserved_bytes) == \
           (float(whole.peak_allocated_bytes), float(whole.peak_reserved_bytes))


def test_a_unit_freeing_out_of_order_needs_the_sum_of_its_requests() -> None:
    """Large pool, 20 / 26 / 40 MiB requests (bounds +1 MiB each for an unsplit remainder): freed last in first
    out, 62 MiB of free block serves them all (their largest live total); with the 20 MiB freed first, the 40
    MiB request finds a 20 and a 22 MiB hole in a 68 MiB block (their largest live total) and needs a new
    segment, so the bound is the 89 MiB sum."""
    mib = 1 << 20
    lifo = [(20.0 * mib, 0.0, "fwd"), (26.0 * mib, 0.0, "fwd"), (0.0, 26.0 * mib, "fwd"), (40.0 * mib, 0.0, "fwd"),
            (0.0, 60.0 * mib, "fwd")]
    out_of_order = [*lifo[:2], (0.0, 20.0 * mib, "fwd"), *lifo[3:4], (0.0, 66.0 * mib, "fwd")]
    for steps, need, grows_at in ((lifo, 62 * mib, None), (out_of_order, 89 * mib, 68 * mib)):
        prog = _compile(steps, [], [], expandable=False)
        assert prog.contained and prog.need == (need, 0)
        for free_block in (need, grows_at):
            if free_block is None:
                continue
            a = CachingAllocator()
            a.free(a.alloc(free_block))  # one cached free block of that size (its segment: 2 MiB rounded)
            before = a.reserved_bytes
            a.run(prog.ops, [])
            assert (a.reserved_bytes > before) == (free_block == grows_at)
