"""Chakra ET import/export (trace.chakra): round trip, ASTRA-sim's comm_size convention, a hand-written
two-rank trace timed by hand, symmetric-group expansion, one-line errors."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pb = pytest.importorskip("chakra.schema.protobuf.et_def_pb2")  # optional extra: pip install 'trainsim[chakra]'

from chakra.src.third_party.utils.protolib import encodeMessage  # noqa: E402

from trainsim.api import simulate  # noqa: E402
from trainsim.cli import main  # noqa: E402
from trainsim.compile.graph import ExecutionGraph  # noqa: E402
from trainsim.compile.program import Stream  # noqa: E402
from trainsim.cost.calibration import load_calibration  # noqa: E402
from trainsim.errors import ConfigError  # noqa: E402
from trainsim.hardware.cluster import get_cluster  # noqa: E402
from trainsim.sim.engine import run  # noqa: E402
from trainsim.strategy.mesh import AXIS_ORDER, DeviceMesh  # noqa: E402
from trainsim.trace.chakra import (  # noqa: E402
    astra_comm_size,
    load_chakra,
    member_group,
    nccl_bytes,
    read_et,
    write_chakra,
)

GPT2 = {"model": {"name": "gpt2"}, "strategy": {"dp": 2, "tp": 2, "pp": 2, "global_batch": 8, "micro_batch": 2}}


def _sim(cluster: dict[str, Any], **simulation: Any):
    return simulate({**GPT2, "cluster": cluster, "simulation": {"bandwidth_sharing": False, **simulation}})


def _engine(graph: ExecutionGraph) -> float:
    cal = load_calibration(None)
    return max(run(graph, gamma=cal.gamma, p2p_host_sync=cal.p2p_host_sync, bandwidth_sharing=False).end_s)


def _per_rank(graph: ExecutionGraph) -> dict[int, tuple[Counter, Counter]]:
    """Per rank: task kinds and (collective, bytes) of its tasks (a class's ranks share its program)."""
    out = {}
    for c, rc in enumerate(graph.classes):
        tasks = [t for t in range(len(graph)) if c in graph.participants[t]]
        kinds = Counter(graph.kind[t] for t in tasks)
        comm = Counter((graph.comm_op[t], graph.comm_bytes[t]) for t in tasks if graph.comm_op[t])
        for r in rc.ranks:
            out[r] = (kinds, comm)
    return out


@pytest.mark.parametrize(("granularity", "exact"), [("op", False), ("auto", False), ("op", True)])
def test_round_trip_gives_same_iteration_time_and_per_rank_counts(tmp_path: Path, granularity: str,
                                                                  exact: bool) -> None:
    res = _sim({"name": "pcie-titanxp"}, granularity=granularity, exact=exact)
    paths = write_chakra(res.graph, tmp_path, "gpt2")
    assert [p.name for p in paths[:-1]] == [f"gpt2.{r}.et" for r in range(8)]
    back = load_chakra(tmp_path / "gpt2", "pcie-titanxp", durations="recorded")
    assert len(back.classes) == 8 and all(rc.multiplicity == 1 for rc in back.classes)
    assert _engine(back) == pytest.approx(_engine(res.graph), rel=1e-9)
    assert _engine(res.graph) == pytest.approx(res.iteration_time_s, rel=1e-9)
    assert _per_rank(back) == _per_rank(res.graph)
    n_coll = sum(1 for k in res.graph.kind if k == "collective")
    assert (n_coll > 0) and sum(1 for k in back.kind if k == "collective") >= n_coll


def test_round_trip_with_trainsim_comm_model_reprices_every_call_identically(tmp_path: Path) -> None:
    """durations='model': every collective and send is re-priced by NcclComm from the ET's sizes (ZeRO-1 + SP
    exercise all-gather and reduce-scatter), and the iteration time comes out the same."""
    res = simulate({**GPT2, "cluster": {"name": "dgx-a100", "nodes": 1},
                    "strategy": {**GPT2["strategy"], "zero": 1, "sequence_parallel": True},
                    "simulation": {"bandwidth_sharing": False, "granularity": "op"}})
    write_chakra(res.graph, tmp_path, "job")
    back = load_chakra(tmp_path, "dgx-a100")  # a directory holding one workload works too
    ops = Counter(back.comm_op)
    assert ops["all_gather"] > 0 and ops["reduce_scatter"] > 0 and ops["send_recv"] > 0
    assert _engine(back) == pytest.approx(res.iteration_time_s, rel=1e-9)


def test_comm_size_conventions_by_hand() -> None:
    # ASTRA-sim's all-gather comm_size is the per-NPU input; nccl-tests' is the gathered output
    assert nccl_bytes("all_gather", 1 << 20, 8) == 8 << 20
    assert astra_comm_size("all_gather", 8 << 20, 8) == 1 << 20
    for op in ("reduce_scatter", "all_reduce", "all_to_all", "broadcast", "send_recv"):
        assert nccl_bytes(op, 12345.0, 8) == 12345.0 == astra_comm_size(op, 12345.0, 8)


@given(st.sampled_from(["all_gather", "reduce_scatter", "all_reduce", "all_to_all"]),
       st.floats(0, 1e12), st.integers(1, 4096))
def test_comm_size_conversion_round_trips(op: str, size: float, n: int) -> None:
    assert astra_comm_size(op, nccl_bytes(op, size, n), n) == pytest.approx(size, rel=1e-12)


@dataclass
class LinearComm:
    """alpha + bytes / bandwidth, so expected times are hand arithmetic."""

    alpha_s: float = 5e-6
    gbps: float = 100.0
    calls: list[tuple[str, float, tuple[int, ...]]] | None = None

    def time(self, collective: str, size_bytes: float, group: tuple[int, ...], concurrency: int = 1) -> float:
        if self.calls is not None:
            self.calls.append((collective, size_bytes, group))
        return self.alpha_s + size_bytes / (self.gbps * 1e9)


def _node(nid: int, name: str, ntype: int, deps: tuple[int, ...] = (), micros: int = 0, **attrs: Any) -> Any:
    node = pb.Node(id=nid, name=name, type=ntype, duration_micros=micros)
    node.data_deps.extend(deps)
    for key, v in attrs.items():
        kind = "bool_val" if isinstance(v, bool) else "string_val" if isinstance(v, str) else "int64_val"
        node.attr.append(pb.AttributeProto(name=key, **{kind: v}))
    return node


def _write(path: Path, nodes: list[Any]) -> None:
    with open(path, "wb") as f:
        encodeMessage(f, pb.GlobalMetadata(version="0.0.4"))
        for n in nodes:
            encodeMessage(f, n)


NUM_OPS = 62_400_000_000
AR_SIZE, SEND_SIZE, LOAD_SIZE = 4_000_000, 2_000_000, 8_000_000


def _two_rank_trace(d: Path) -> Path:
    """rank 0: A (100 us) -> all-reduce -> send to 1; A -> memory load.
    rank 1: B (roofline) -> all-reduce; recv from 0 -> C (50 us)."""
    _write(d / "hand.0.et", [
        _node(1, "A", pb.COMP_NODE, micros=100),
        _node(2, "allreduce", pb.COMM_COLL_NODE, (1,), comm_type=pb.ALL_REDUCE, comm_size=AR_SIZE),
        _node(3, "send", pb.COMM_SEND_NODE, (2,), comm_src=0, comm_dst=1, comm_tag=7, comm_size=SEND_SIZE),
        _node(4, "load", pb.MEM_LOAD_NODE, (1,), tensor_size=LOAD_SIZE),
    ])
    _write(d / "hand.1.et", [
        _node(10, "B", pb.COMP_NODE, num_ops=NUM_OPS, tensor_size=1_000_000, is_cpu_op=False),
        _node(11, "allreduce", pb.COMM_COLL_NODE, (10,), comm_type=pb.ALL_REDUCE, comm_size=AR_SIZE),
        _node(12, "recv", pb.COMM_RECV_NODE, (11,), comm_src=0, comm_dst=1, comm_tag=7, comm_size=SEND_SIZE),
        _node(13, "C", pb.COMP_NODE, (12,), micros=50),
    ])
    return d / "hand"


def test_hand_written_two_rank_trace_simulates_to_the_hand_computed_time(tmp_path: Path) -> None:
    comm = LinearComm(calls=[])
    cl = get_cluster("dgx-a100", 1)
    g = load_chakra(_two_rank_trace(tmp_path), cl, comm=comm)
    dev = cl.device
    t_b = max(NUM_OPS / dev.peak_flops("bf16"), 1_000_000 / (dev.hbm_gbps * 1e9))  # roofline: compute-bound
    assert t_b > 100e-6
    t_ar = 5e-6 + AR_SIZE / 100e9
    t_send = 5e-6 + SEND_SIZE / 100e9
    t_load = LOAD_SIZE / (dev.hbm_gbps * 1e9)  # no memory system: local HBM
    # the all-reduce waits for B (rank 1 is later), the send for the all-reduce, C for the send
    expected = max(t_b + t_ar + t_send + 50e-6, 100e-6 + t_load)
    trace = run(g, gamma=0.0)
    assert max(trace.end_s) == pytest.approx(expected, rel=1e-12)
    assert sorted(comm.calls) == [("all_reduce", AR_SIZE, (0, 1)), ("send_recv", SEND_SIZE, (0, 1))]
    # one all-reduce task joined by both ranks; the receive is the send itself
    per_rank = [Counter(g.kind[t] for t in range(len(g)) if r in g.participants[t]) for r in range(2)]
    assert per_rank == [Counter(compute=1, collective=1, p2p=1, memory=1), Counter(compute=2, collective=1)]
    ar = g.kind.index("collective")
    assert g.participants[ar] == (0, 1) and g.stream[ar] == Stream.GRAD
    assert g.stream[g.kind.index("p2p")] == Stream.P2P and g.stream[g.kind.index("memory")] == Stream.MEMORY


def test_memory_nodes_use_the_given_memory_system(tmp_path: Path) -> None:
    seen = []

    class Pool:
        def time_s(self, access: Any) -> float:
            seen.append((access.kind, access.size_bytes, access.location))
            return 1e-3

    g = load_chakra(_two_rank_trace(tmp_path), "dgx-a100", comm=LinearComm(), memory=Pool())
    assert seen == [("load", LOAD_SIZE, "remote")]  # ASTRA-sim's memory nodes are remote accesses
    assert g.duration_s[g.kind.index("memory")] == 1e-3


def test_all_gather_comm_size_is_the_per_npu_input_on_import_and_export(tmp_path: Path) -> None:
    per_npu = 1 << 20
    for r in range(4):
        _write(tmp_path / f"ag.{r}.et", [_node(1, "ag", pb.COMM_COLL_NODE, comm_type=pb.ALL_GATHER,
                                               comm_size=per_npu, pg_name="g")])
    (tmp_path / "ag.comm_group.json").write_text(json.dumps({"g": [0, 1, 2, 3]}))
    comm = LinearComm(calls=[])
    g = load_chakra(tmp_path / "ag", "dgx-a100", comm=comm)
    assert comm.calls == [("all_gather", 4 * per_npu, (0, 1, 2, 3))]  # nccl-tests: the gathered output
    assert g.comm_bytes == [4 * per_npu] and g.participants[0] == (0, 1, 2, 3)
    out = tmp_path / "out"
    write_chakra(g, out, "ag")
    node = read_et(out / "ag.2.et").nodes[0]
    attrs = {a.name: a for a in node.attr}
    assert node.type == pb.COMM_COLL_NODE and attrs["comm_size"].int64_val == per_npu
    assert json.loads((out / "ag.comm_group.json").read_text()) == {}  # the whole world is pg_name ""


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 3), min_size=len(AXIS_ORDER), max_size=len(AXIS_ORDER)), st.data())
def test_member_group_recovers_every_ranks_mesh_group(sizes: list[int], data: st.DataObject) -> None:
    mesh = DeviceMesh(**dict(zip(AXIS_ORDER, sizes, strict=True)))
    axes = tuple(data.draw(st.lists(st.sampled_from(AXIS_ORDER[:-1]), min_size=1, unique=True)))
    per_stage = mesh.world_size // mesh.pp
    for stage in range(mesh.pp):
        rep = stage * per_stage  # a symmetric class's representative: the stage's first rank
        rep_group = tuple(mesh.group_ranks(axes, rep))
        for r in range(rep, rep + per_stage):
            assert member_group(rep_group, r) == tuple(mesh.group_ranks(axes, r))


def _one_line(exc: pytest.ExceptionInfo[ConfigError], name: str) -> None:
    msg = str(exc.value)
    assert "\n" not in msg and name in msg


def test_malformed_and_missing_files_give_one_line_errors(tmp_path: Path) -> None:
    (tmp_path / "bad.0.et").write_bytes(b"this is not a protobuf stream at all")
    with pytest.raises(ConfigError) as exc:
        load_chakra(tmp_path / "bad", "dgx-a100")
    _one_line(exc, "bad.0.et")
    _two_rank_trace(tmp_path)
    (tmp_path / "hand.3.et").write_bytes((tmp_path / "hand.1.et").read_bytes())
    with pytest.raises(ConfigError) as exc:
        load_chakra(tmp_path / "hand", "dgx-a100")
    _one_line(exc, "hand.2.et")
    (tmp_path / "hand.3.et").unlink()
    raw = (tmp_path / "hand.0.et").read_bytes()
    (tmp_path / "hand.0.et").write_bytes(raw[:-5])  # truncated in its last node
    with pytest.raises(ConfigError) as exc:
        load_chakra(tmp_path / "hand", "dgx-a100")
    _one_line(exc, "hand.0.et")


def test_unmatched_receive_is_a_one_line_error(tmp_path: Path) -> None:
    _write(tmp_path / "p.0.et", [_node(1, "A", pb.COMP_NODE, micros=1)])
    _write(tmp_path / "p.1.et", [_node(1, "recv", pb.COMM_RECV_NODE, comm_src=0, comm_dst=1, comm_tag=3,
                                       comm_size=10)])
    with pytest.raises(ConfigError) as exc:
        load_chakra(tmp_path / "p", "dgx-a100")
    _one_line(exc, "p.1.et")
    assert "no matching send" in str(exc.value)


def test_cli_export_then_run_prints_the_simulated_time(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    res = _sim({"name": "dgx-a100", "nodes": 1}, granularity="op")
    main(["chakra", "export", "--model", "gpt2", "--cluster", "dgx-a100", "--nodes", "1", "--dp", "2", "--tp", "2",
          "--pp", "2", "--global-batch", "8", "--micro-batch", "2", "--out", str(tmp_path), "--prefix", "g",
          "--no-sp", "--recompute", "none", "--zero", "0"])  # flags change the default job: plain settings
    assert len(list(tmp_path.glob("g.*.et"))) == 8
    out_json = tmp_path / "run.json"
    main(["chakra", "run", str(tmp_path / "g"), "--cluster", "dgx-a100", "--json", str(out_json)])
    assert "iteration time" in capsys.readouterr().out
    data = json.loads(out_json.read_text())
    assert data["ranks"] == 8
    assert data["iteration_time_s"] == pytest.approx(res.iteration_time_s, rel=1e-9)
    with pytest.raises(SystemExit) as ex:
        main(["chakra", "run", str(tmp_path / "nothing"), "--cluster", "dgx-a100"])
    assert ex.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err


GENERATED = [("one_comm_coll_node_allreduce", "ALL_REDUCE", "all_reduce"),
             ("one_comm_coll_node_allgather", "ALL_GATHER", "all_gather"),
             ("one_comm_coll_node_reducescatter", "REDUCE_SCATTER", "reduce_scatter"),
             ("one_comm_coll_node_alltoall", "ALL_TO_ALL", "all_to_all"),
             ("one_comm_coll_node_broadcast", "BROADCAST", "broadcast")]


@pytest.mark.parametrize(("fn", "prefix", "op"), GENERATED)
def test_traces_from_mlc_chakras_own_generator_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      fn: str, prefix: str, op: str) -> None:
    """ASTRA-sim's micro-benchmark workloads as mlc-chakra's `chakra_generator` writes them (no process
    group: the collective spans every NPU) import as one collective over all ranks, sized by ASTRA-sim's
    convention, and take the comm model's time."""
    gen = pytest.importorskip("chakra.src.generator.generator")
    monkeypatch.chdir(tmp_path)
    n, size = 8, 1 << 20
    getattr(gen, fn)(n, size)
    comm = LinearComm(calls=[])
    g = load_chakra(tmp_path / prefix, "dgx-a100", comm=comm)
    assert comm.calls == [(op, nccl_bytes(op, size, n), tuple(range(n)))]
    assert len(g) == 1 and g.participants[0] == tuple(range(n))
    assert max(run(g, gamma=0.0).end_s) == pytest.approx(5e-6 + nccl_bytes(op, size, n) / 100e9, rel=1e-12)


def test_generated_dependent_compute_nodes_run_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gen = pytest.importorskip("chakra.src.generator.generator")
    monkeypatch.chdir(tmp_path)
    gen.two_comp_nodes_dependent(4, 7)
    gen.two_comp_nodes_independent(4, 7)
    for prefix in ("two_comp_nodes_dependent", "two_comp_nodes_independent"):
        g = load_chakra(tmp_path / prefix, "dgx-a100", comm=LinearComm())
        assert Counter(g.kind) == Counter(compute=8)
        # one compute stream per NPU: independent nodes serialise too, as in ASTRA-sim
        assert max(run(g, gamma=0.0).end_s) == pytest.approx(14e-6, rel=1e-12)


def test_malformed_trainsim_attribute_is_a_one_line_error(tmp_path: Path) -> None:
    """Found by the fuzz suite: a flipped bit left `trainsim_parts` without `trainsim_parts_s` (was a KeyError)."""
    node = _node(1, "A", pb.COMP_NODE, micros=1)
    node.attr.append(pb.AttributeProto(name="trainsim_parts", string_list=pb.StringList(values=["compute"])))
    _write(tmp_path / "p.0.et", [node])
    with pytest.raises(ConfigError) as exc:
        load_chakra(tmp_path / "p", "dgx-a100")
    _one_line(exc, "p.0.et")
    assert "node 1" in str(exc.value) and "malformed" in str(exc.value)
