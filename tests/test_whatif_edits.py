"""What-if edits on a replay (trainsim.whatif.edits), `scale` and the replay/scale/optimize commands: known
answers on the synthetic two-rank step of test_kineto_multirank and on the project's own gloo DDP traces."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_kineto_multirank import _rank, _x

from trainsim.cli import main
from trainsim.replay import replay
from trainsim.trace.kineto import trace_from_json
from trainsim.whatif.edits import (
    TableComm,
    bucket,
    dtype_bytes,
    fuse_elementwise,
    load_comm_table,
    recost_network,
    scale_network,
)
from trainsim.whatif.scale import scale

GLOO = Path(__file__).resolve().parents[1] / "benchmarks" / "ddp_gloo" / "traces"
FLAT_10US = TableComm((1e3, 1e9), (10e-6, 10e-6))  # every all-reduce of 2 ranks takes 10 us


def _two_ranks(n_coll: int = 1) -> list[Any]:
    return [_rank(0, 200, 0.0, n_coll=n_coll), _rank(1, 500, 40.0, n_coll=n_coll)]


def test_dtype_bytes() -> None:
    assert [dtype_bytes(d) for d in ("Float", "BFloat16", "c10::Half", "Double", "Float8_e4m3fn", None)] == \
        [4, 2, 2, 8, 1, 4]


def test_faster_network_shortens_the_coupled_collective() -> None:
    """The all-reduce's wait-free part (100 us) halves: both steps end 50 us sooner."""
    r = replay(_two_ranks(), edits=[scale_network(2.0)])
    assert [round(s.replayed_ms, 9) for s in r.steps] == [0.95, 0.95]


def test_recost_on_a_measured_curve() -> None:
    """A flat 10 us curve replaces the 100 us all-reduce: steps of 1.0 - 0.09 ms."""
    r = replay(_two_ranks(), edits=[recost_network(FLAT_10US, "flat")])
    assert [round(s.replayed_ms, 9) for s in r.steps] == [0.91, 0.91]


def test_bucket_merge_issues_one_all_reduce_at_the_last_bucket() -> None:
    """Three 4 KB all-reduces back to back, merged into one 12 KB bucket: two take no time, one 10 us."""
    r = replay(_two_ranks(n_coll=3), edits=[recost_network(FLAT_10US, "flat"), bucket(1e6, FLAT_10US, "flat")])
    g = r.graph
    assert g is not None
    durs = sorted(round(g.duration_s[t] * 1e6, 6) for t in range(len(g)) if g.category[t] == "collective")
    assert durs == [0.0, 0.0, 0.0, 0.0, 10.0, 10.0]


def test_fusion_of_an_elementwise_chain() -> None:
    """Kernels of 30, 60 and 90 us back to back fuse into one of 90 + (30 + 60) / 3 = 120 us."""
    ev = [_x("user_annotation", "ProfilerStep#1", 0, 500)]
    t = 100.0
    for k, d in enumerate((30, 60, 90)):
        ev.append(_x("cuda_runtime", "cudaLaunchKernel", 10 + 5 * k, 4, cbid=211, correlation=k + 1))
        ev.append(_x("kernel", "void at::native::vectorized_elementwise_kernel<4>", t, d, pid=0, tid=7, stream=7,
                     correlation=k + 1, device=0))
        t += d
    ev.append(_x("cuda_runtime", "cudaDeviceSynchronize", 30, t + 5 - 30, cbid=165, correlation=9))
    r = replay(trace_from_json({"traceEvents": ev}, "chain"), edits=[fuse_elementwise()])
    g = r.graph
    assert g is not None
    kernels = sorted(round(g.duration_s[t] * 1e6, 6) for t in range(len(g)) if g.kind[t] == "compute")
    assert kernels == [0.0, 0.0, 120.0]


@pytest.mark.skipif(not GLOO.is_dir(), reason="benchmarks/ddp_gloo traces absent")
def test_scale_keeps_the_profile_at_its_own_size_and_slows_with_more_ranks() -> None:
    table = load_comm_table(str(GLOO / "gloo_allreduce.csv"))
    res = scale([GLOO / "1proc"], table, "gloo", [1, 2, 4], 2, cores_per_node=2)
    one, two, four = res.points
    assert one.alpha == 1.0 and one.step_ms == res.profile_step_ms
    assert res.profile_step_ms == pytest.approx(res.measured_step_ms, rel=1e-9)  # the 1-rank replay is exact
    assert 0 < four.alpha < two.alpha < 1
    assert all(p.throughput_x == pytest.approx(p.ranks * p.alpha) for p in res.points)
    assert [p.nodes for p in res.points] == [1, 1, 2]


@pytest.mark.skipif(not GLOO.is_dir(), reason="benchmarks/ddp_gloo traces absent")
def test_commands_write_json(capsys: pytest.CaptureFixture[str]) -> None:
    csv = str(GLOO / "gloo_allreduce.csv")
    main(["replay", str(GLOO / "2proc"), "--json", "-"])
    out = json.loads(capsys.readouterr().out)
    assert out["kind"] == "replay" and out["ranks"] == [0, 1] and len(out["steps"]) == 10
    assert set(out["clock_offsets_us"]) == {"0", "1"} and out["replay_error_pct"] < 5
    main(["scale", str(GLOO / "1proc"), "--comm-table", csv, "--ranks", "1,2", "--json", "-"])
    out = json.loads(capsys.readouterr().out)
    assert [p["ranks"] for p in out["points"]] == [1, 2]
    main(["optimize", str(GLOO / "1proc"), "--comm-table", csv, "--ranks", "2", "--json", "-"])
    out = json.loads(capsys.readouterr().out)
    steps = [s["step_ms"] for s in out["settings"]]
    assert steps == sorted(steps) and len(steps) == 20
