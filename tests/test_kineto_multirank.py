"""Multi-rank replay (trainsim.replay with trace.kineto.match): a collective over two ranks with a known
clock skew (recovered), coupling (a collective starts when its last member is ready), and the errors for
traces that do not belong together."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainsim.errors import ConfigError
from trainsim.replay import ReplayGraphs, replay
from trainsim.trace.kineto import trace_from_json


def _x(cat: str, name: str, ts: float, dur: float, pid: Any = 1, tid: Any = 1, **args: Any) -> dict:  # noqa: ANN401
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _rank(rank: int, compute_us: float, skew_us: float, nelems: int = 1000, n_coll: int = 1) -> Any:  # noqa: ANN401
    """One step on a rank: a kernel of `compute_us`, then an all-reduce over ranks 0-1 that ends when the
    slower rank's compute is done + 100 us, a device sync, host work to 1000 us. Clock shifted by skew."""
    slowest = 20 + 500  # the slower rank's compute ends at 520 (true time)
    ev = [
        _x("user_annotation", "ProfilerStep#1", 0, 1000),
        _x("cuda_runtime", "cudaLaunchKernel", 10, 5, cbid=211, correlation=1),
        _x("kernel", "ampere_sgemm_128x64_nn", 20, compute_us, pid=0, tid=7, stream=7, correlation=1, device=0),
    ]
    for k in range(3):  # small copies on another stream: a typical 10 us launch latency
        ev.append(_x("cuda_runtime", "cudaLaunchKernel", 1 + 2 * k, 1, cbid=211, correlation=50 + k))
        ev.append(_x("kernel", "vectorized_elementwise_kernel", 11 + 2 * k, 1, pid=0, tid=9, stream=9,
                     correlation=50 + k, device=0))
    t_end = slowest
    for k in range(n_coll):
        ev.append(_x("cuda_runtime", "cudaLaunchKernel", 30 + k, 0.5, cbid=211, correlation=2 + k))
        start = 20 + compute_us if k == 0 else t_end
        ev.append(_x("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
                     start, t_end + 100 - start, pid=0, tid=7, stream=7, correlation=2 + k, device=0,
                     **{"Collective name": "allreduce", "In msg nelems": nelems, "Out msg nelems": nelems,
                        "Group size": 2, "dtype": "Float", "Process Group Name": "0",
                        "Process Group Ranks": "[0, 1]"}))
        t_end += 100
    ev.append(_x("cuda_runtime", "cudaDeviceSynchronize", 40, t_end + 5 - 40, cbid=165, correlation=99))
    ev.append(_x("cpu_op", "aten::host_work", t_end + 5, 1000 - t_end - 5))
    for e in ev:
        e["ts"] += skew_us + 1_000_000
    doc = {"traceEvents": ev, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 2}}
    return trace_from_json(doc, f"rank{rank}.json")


def test_collective_over_two_ranks_recovers_clock_skew() -> None:
    r = replay([_rank(0, 200, 0.0), _rank(1, 500, 5000.0)])
    assert r.clock_offsets_us[0] == 0.0
    assert r.clock_offsets_us[1] == pytest.approx(5000.0, abs=1e-6)
    assert [(s.rank, round(s.replayed_ms, 9)) for s in r.steps] == [(0, 1.0), (1, 1.0)]
    assert r.replay_error_pct == pytest.approx(0.0, abs=1e-9)
    assert r.breakdown["comm.allreduce"] > 0


@given(skew=st.floats(-1e6, 1e6), c0=st.floats(50, 480), c1=st.floats(50, 480))
@settings(max_examples=30, deadline=None)
def test_any_skew_is_recovered_and_replays_exactly(skew: float, c0: float, c1: float) -> None:
    """Whatever the skew and whichever rank is slower to reach the collective, the offset comes back and
    the step replays to its measured length (the true end of the collective is the same on both)."""
    r = replay([_rank(0, c0, 0.0), _rank(1, c1, skew)])
    assert r.clock_offsets_us[1] == pytest.approx(skew, abs=1e-3)
    assert all(s.replayed_ms == pytest.approx(1.0, abs=1e-6) for s in r.steps)


def _faster_rank1(rgs: ReplayGraphs) -> None:
    """What-if: rank 1's GEMM as fast as rank 0's (200 us instead of 500)."""
    rk = rgs.ranks[1]
    g = rgs.graph
    for t in range(rk.task0, rk.task0 + rk.n_tasks):
        if g.name[t].startswith("ampere_sgemm"):
            g.duration_s[t] = 200e-6


def test_coupled_collective_starts_when_the_last_member_is_ready() -> None:
    """Measured: rank 0 waits 300 us in the all-reduce for rank 1. With rank 1 as fast as rank 0, the
    collective starts at 220 us on both and the sync returns 300 us earlier: steps of 0.7 ms on both."""
    r = replay([_rank(0, 200, 0.0), _rank(1, 500, 123.0)], edits=[_faster_rank1])
    assert [(s.rank, round(s.replayed_ms, 9)) for s in r.steps] == [(0, 0.7), (1, 0.7)]
    # rank 0 alone keeps the measured wait inside its collective: the what-if on rank 1 cannot reach it
    alone = replay([_rank(0, 200, 0.0)])
    assert alone.steps[0].replayed_ms == pytest.approx(1.0)


def test_several_collectives_match_in_order() -> None:
    r = replay([_rank(0, 200, 0.0, n_coll=3), _rank(1, 500, -700.0, n_coll=3)])
    assert r.clock_offsets_us[1] == pytest.approx(-700.0, abs=1e-6)
    assert len(r.graphs.matching.matched) == 3
    assert all(s.replayed_ms == pytest.approx(1.0, abs=1e-6) for s in r.steps)


def test_collective_without_its_peer_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"rank1.json: allreduce #2 of process group 0 has no peer on rank 0"):
        replay([_rank(0, 200, 0.0, n_coll=1), _rank(1, 500, 0.0, n_coll=2)])


def test_mismatched_sizes_are_refused() -> None:
    with pytest.raises(ConfigError, match="moves 2000 elements on rank 1 but 1000 elements on rank 0"):
        replay([_rank(0, 200, 0.0), _rank(1, 500, 0.0, nelems=2000)])


def test_ranks_that_do_not_match_are_refused() -> None:
    with pytest.raises(ConfigError, match="is rank 0 again"):
        replay([_rank(0, 200, 0.0), _rank(0, 500, 0.0)])
    bad = _rank(1, 500, 0.0)
    bad.world_size = 4
    with pytest.raises(ConfigError, match="disagree on world_size"):
        replay([_rank(0, 200, 0.0), bad])
    out = _rank(1, 500, 0.0)
    out.rank, out.world_size = 7, 2
    a = _rank(0, 200, 0.0)
    with pytest.raises(ConfigError, match="rank 7 is outside world_size 2"):
        replay([a, out])
