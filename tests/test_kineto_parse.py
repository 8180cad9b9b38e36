"""Kineto trace reader (trainsim.trace.kineto): the shared real traces against their README's measured
step times, synthetic traces for each schema variant with known answers, and bad input."""

from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from trainsim.errors import ConfigError
from trainsim.trace.kineto import read_kineto
from trainsim.trace.kineto.model import CollectiveSource, CpuKind, FlowKind, GpuKind, RuntimeKind, SyncKind
from trainsim.trace.kineto.reader import collective_kind, runtime_kind

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"
HTA = "HolisticTraceAnalysis/tests/data/"

# file -> (step source, step durations in ms (ProfilerStep) or None, rank, world size, GPU names)
REAL: dict[str, dict[str, Any]] = {
    HTA + "trace_filter/sampled_rank-0.json.gz": dict(steps=[607.312, 622.928], rank=0, world=128, gpus=[]),
    HTA + "trace_filter/sampled_rank-1.json.gz": dict(steps=[607.904, 630.639], rank=1, world=128, gpus=[]),
    HTA + "nccl_parser_config/nccl_data.json.gz": dict(
        steps=[222.442, 219.727, 224.936], rank=0, world=2, gpus=["NVIDIA A100-PG509-200"]),
    HTA + "negative_queue_length_values_check/rank0.json.gz": dict(
        steps=[209.748, 216.483, 216.119, 215.467, 216.216], rank=0, world=16, gpus=["NVIDIA A100-SXM4-80GB"]),
    HTA + "ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz": dict(
        steps=[35.116, 72.077, 95.697, 95.551, 95.699], rank=0, world=1, gpus=["Tesla V100-SXM2-32GB"]),
    HTA + "critical_path/alexnet/benchmark_result_2869224_1695835535_trace.json.gz": dict(
        source="trace", rank=0, gpus=["NVIDIA A100-PG509-200"]),
    HTA + "critical_path/cuda_event_sync/event_sync_trace.json.gz": dict(
        steps=[3.154], rank=0, gpus=["NVIDIA A100-PG509-200"]),
    HTA + "critical_path/cuda_event_sync_multi_stream/event_sync_trace.json.gz": dict(
        source="trace", rank=0, gpus=["NVIDIA A100-PG509-200"]),
    HTA + "with_gpu_user_annotation/step_based_trace_2543932.json.gz": dict(
        source="optimizer", spacing=[1.531, 1.497, 1.603, 1.530], rank=0, gpus=["Quadro GP100"]),
    HTA + "amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz": dict(
        steps=[9.288, 0.049], gpus=["AMD Radeon Graphics"], platform="rocm"),
    "kineto/tb_plugin/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz": dict(
        steps=[176.078, 173.992, 176.918, 181.259, 176.468, 164.261], gpus=["Tesla V100-DGXS-32GB"], schema="2021"),
    "kineto/tb_plugin/samples/resnet50_num_workers_4/worker0.1623212756351.pt.trace.json.gz": dict(
        steps=[181.565, 123.884, 126.824, 126.272, 163.461, 116.146], gpus=["Tesla V100-DGXS-32GB"], schema="2021"),
    "param/et_replay/tests/inputs/resnet_kineto.json.gz": dict(
        source="optimizer", median=176.6, min=127.8, max=824.1, gpus=["NVIDIA GeForce RTX 2080 Ti"]),
    "param/et_replay/tests/inputs/linear_kineto.json.gz": dict(
        source="optimizer", median=24.5, min=16.5, max=57.2, gpus=["NVIDIA GeForce RTX 2080 Ti"]),
    "TraceLens/tests/traces/mi300/resnet_act_checkpoint.json.gz": dict(
        steps=[16.799, 15.951, 15.887], rank=0, world=8, gpus=["AMD Instinct MI300X"], platform="rocm"),
    "TraceLens/tests/traces/b200/eager_trace.json.gz": dict(source="trace", rank=0, world=8, gpus=["NVIDIA B200"]),
}


def _real(rel: str) -> Path:
    if not TRACES.is_dir():
        pytest.skip(f"shared traces folder {TRACES} is absent")
    p = TRACES / rel
    if not p.is_file():
        pytest.skip(f"shared trace {p} is absent")
    return p


@pytest.mark.parametrize("rel", sorted(REAL))
def test_real_trace(rel: str) -> None:
    exp = REAL[rel]
    tr = read_kineto(_real(rel))
    steps = tr.steps()
    if "steps" in exp:
        assert tr.step_source == "ProfilerStep" and tr.assumptions == []
        assert [w.dur_us / 1000 for w in steps] == pytest.approx(exp["steps"], abs=1e-3)
    elif exp["source"] == "optimizer":
        assert tr.step_source == "optimizer" and "Optimizer.step" in tr.assumptions[0]
        ms = [w.dur_us / 1000 for w in steps]
        if "spacing" in exp:
            assert ms == pytest.approx(exp["spacing"], abs=1e-3)
        else:
            assert statistics.median(ms) == pytest.approx(exp["median"], abs=0.05)
            assert min(ms) == pytest.approx(exp["min"], abs=0.05) and max(ms) == pytest.approx(exp["max"], abs=0.05)
    else:
        assert tr.step_source == "trace" and len(steps) == 1 and "whole trace" in tr.assumptions[0]
    assert tr.rank == exp.get("rank") and tr.world_size == exp.get("world")
    assert tr.gpu_names == exp["gpus"]
    assert tr.platform == exp.get("platform", "cuda") and tr.schema == exp.get("schema", "current")
    # every GPU op with a runtime event links to it by correlation, and links only to its own correlation
    gpu, rt = tr.gpu, tr.runtime
    rt_corr = set(rt.correlation.tolist())
    has = np.isin(gpu.correlation, list(rt_corr)) & (gpu.correlation >= 0)
    assert np.array_equal(gpu.runtime >= 0, has)
    linked = gpu.runtime >= 0
    assert np.array_equal(rt.correlation[gpu.runtime[linked]], gpu.correlation[linked])
    kernels_linked = linked & (gpu.kind == GpuKind.KERNEL)
    kinds = rt.kind[gpu.runtime[kernels_linked]]
    assert np.all(kinds == RuntimeKind.LAUNCH)  # a kernel's runtime event is always a launch
    # GPU ops are sorted per (device, stream); CPU nesting is consistent
    assert np.all(np.diff(gpu.ts_us[(gpu.device == gpu.device[0]) & (gpu.stream == gpu.stream[0])]) >= 0)
    cpu = tr.cpu
    child = cpu.parent >= 0
    assert np.all(cpu.depth[child] == cpu.depth[cpu.parent[child]] + 1)
    assert np.all(cpu.ts_us[cpu.parent[child]] <= cpu.ts_us[child])
    assert np.all(cpu.thread[cpu.parent[child]] == cpu.thread[child])
    assert tr.origin_us > 0 and min(cpu.ts_us.min(), gpu.ts_us.min()) == 0.0


def test_real_2021_streams_and_collectives() -> None:
    tr = read_kineto(_real("kineto/tb_plugin/samples/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz"))
    assert set(tr.gpu.stream.tolist()) == {7} and tr.launch_flow_categories == ["async"]
    assert np.all(tr.gpu.has_flow) and len(tr.memory) > 0
    nccl = read_kineto(_real(HTA + "nccl_parser_config/nccl_data.json.gz"))
    c = nccl.collectives
    per_cpu = [i for i in range(len(c)) if c.source[i] == CollectiveSource.PARAM_COMMS]
    assert {c.kind[i] for i in per_cpu} == {"allreduce", "broadcast", "wait"}  # `wait` is recorded too
    i = [j for j in per_cpu if c.kind[j] == "allreduce"][-1]
    assert c.group_size[i] == 2 and c.pg_ranks[i] == (0, 1) and c.dtype[i] == "Float" and c.pg_name[i] == "0"
    gpu_rows = [i for i in range(len(c)) if c.source[i] == CollectiveSource.GPU_KERNEL]
    assert gpu_rows and all(c.in_nelems[i] > 0 for i in gpu_rows)
    assert nccl.pg_config[0]["ranks"] == [0, 1] and nccl.backend == "nccl" and nccl.nccl_version == "2.17.1"
    sync = read_kineto(_real(HTA + "critical_path/cuda_event_sync_multi_stream/event_sync_trace.json.gz")).syncs
    wait = np.flatnonzero(sync.kind == SyncKind.STREAM_WAIT_EVENT)
    assert len(wait) == 1 and sync.wait_on_stream[wait[0]] == 20 and sync.stream[wait[0]] == 24
    assert sync.wait_on_event_record_correlation[wait[0]] == 1385 and sync.runtime[wait[0]] >= 0


# ------------------------------------------------------------------------------------------- synthetic


def _write(tmp_path: Path, doc: Any, name: str = "t.json", gz: bool = False) -> Path:  # noqa: ANN401
    data = json.dumps(doc).encode()
    p = tmp_path / (name + (".gz" if gz else ""))
    p.write_bytes(gzip.compress(data) if gz else data)
    return p


def _x(cat: str, name: str, ts: float, dur: float, pid: Any = 1, tid: Any = 1, **args: Any) -> dict:  # noqa: ANN401
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _current() -> dict[str, Any]:
    ev = [
        _x("user_annotation", "ProfilerStep#7", 1000, 100, **{"External id": 1}),
        _x("cpu_op", "aten::mm", 1010, 50, **{"External id": 2}),
        _x("cpu_op", "aten::empty", 1012, 3, **{"External id": 3}),
        _x("cuda_runtime", "cudaLaunchKernel", 1020, 5, **{"External id": 2, "cbid": 211, "correlation": 99}),
        _x("cuda_runtime", "cudaEventRecord", 1030, 1, **{"cbid": 135, "correlation": 100}),
        _x("cuda_runtime", "cudaStreamWaitEvent", 1032, 1, **{"cbid": 147, "correlation": 101}),
        _x("cuda_runtime", "cudaMemcpyAsync", 1070, 5, **{"cbid": 41, "correlation": 102}),
        _x("cuda_runtime", "cudaStreamSynchronize", 1080, 10, **{"cbid": 131, "correlation": 103}),
        _x("kernel", "sm90_gemm", 1030, 20, pid=0, tid=7, device=0, stream=7, correlation=99),
        _x("gpu_memcpy", "Memcpy DtoH", 1075, 2, pid=0, tid=7, device=0, stream=7, correlation=102, bytes=4096),
        _x("kernel", "orphan", 900, 1, pid=0, tid=9, device=0, stream=9, correlation=5),
        _x("cuda_sync", "Stream Wait Event", 1060, 1, pid=0, tid=9, cuda_sync_kind="Stream Wait Event",
           stream=9, wait_on_stream=7, wait_on_cuda_event_record_corr_id=100, correlation=101, device=0),
        _x("gpu_user_annotation", "ProfilerStep#7", 1030, 50, pid=0, tid=7),
        {"ph": "s", "cat": "ac2g", "id": 99, "pid": 1, "tid": 1, "ts": 1020},
        {"ph": "f", "cat": "ac2g", "id": 99, "pid": 0, "tid": 7, "ts": 1030, "bp": "e"},
        {"ph": "M", "name": "thread_name", "pid": 0, "tid": 7, "args": {"name": "stream 7 "}},
    ]
    return {"traceEvents": ev, "deviceProperties": [{"id": 0, "name": "NVIDIA H100"}],
            "distributedInfo": {"backend": "nccl", "rank": 3, "world_size": 4}}


@pytest.mark.parametrize("gz", [False, True])
def test_synthetic_current(tmp_path: Path, gz: bool) -> None:
    tr = read_kineto(_write(tmp_path, _current(), gz=gz))
    assert tr.origin_us == 900 and tr.rank == 3 and tr.world_size == 4 and tr.gpu_names == ["NVIDIA H100"]
    assert [(w.step, w.start_us, w.end_us, w.source) for w in tr.steps()] == [(7, 100.0, 200.0, "ProfilerStep")]
    cpu = tr.cpu
    names = tr.names(cpu.name_id)
    assert names == ["ProfilerStep#7", "aten::mm", "aten::empty"]
    assert cpu.parent.tolist() == [-1, 0, 1] and cpu.depth.tolist() == [0, 1, 2]
    assert cpu.kind.tolist() == [CpuKind.USER_ANNOTATION, CpuKind.CPU_OP, CpuKind.CPU_OP]
    rt = tr.runtime
    assert [RuntimeKind(k).name for k in rt.kind] == ["LAUNCH", "EVENT_RECORD", "STREAM_WAIT_EVENT", "MEMCPY",
                                                      "STREAM_SYNC"]
    assert rt.cpu_parent.tolist() == [1, 1, 1, 0, 0]  # launch inside aten::mm, the sync inside the step
    gpu = tr.gpu
    assert gpu.stream.tolist() == [7, 7, 9] and tr.names(gpu.name_id) == ["sm90_gemm", "Memcpy DtoH", "orphan"]
    assert gpu.runtime.tolist() == [0, 3, -1] and gpu.has_flow.tolist() == [True, False, False]
    assert gpu.bytes.tolist() == [-1, 4096, -1] and gpu.kind.tolist() == [GpuKind.KERNEL, GpuKind.MEMCPY, GpuKind.KERNEL]
    assert tr.syncs.kind.tolist() == [SyncKind.STREAM_WAIT_EVENT] and tr.syncs.runtime.tolist() == [2]
    assert tr.syncs.wait_on_event_record_correlation.tolist() == [100]
    assert len(tr.flows) == 1 and tr.flows.kind[0] == FlowKind.LAUNCH and tr.flows.dst_tid[0] == 7
    assert len(tr.gpu_annotations) == 1 and tr.thread_names[(0, 7)] == "stream 7"
    s = tr.summary()
    assert s["gpu_ops_without_runtime"] == 1 and s["launches_without_gpu_op"] == 0


def test_synthetic_2021_schema(tmp_path: Path) -> None:
    ev = [
        _x("Operator", "ProfilerStep#5", 10, 30, pid=25, tid="25"),
        _x("Operator", "aten::conv2d", 12, 10, pid=25, tid="25", **{"External id": 4}),
        _x("Runtime", "cudaLaunchKernel", 14, 2, pid=25, tid="25", cbid=211, correlation=34, **{"external id": 4}),
        _x("Kernel", "implicit_gemm", 20, 5, pid=0, tid="stream 7", device=0, correlation=34, **{"external id": 4}),
        _x("Memset", "Memset (Device)", 26, 1, pid=0, tid="stream 7", correlation=35, bytes=128),
        {"ph": "s", "cat": "async", "name": "launch", "id": 34, "pid": 25, "tid": 25, "ts": 14},
        {"ph": "f", "cat": "async", "name": "launch", "id": 34, "pid": 0, "tid": "stream 7", "ts": 20, "bp": "e"},
        {"ph": "i", "s": "t", "name": "[memory]", "pid": 25, "tid": 25, "ts": 13,
         "args": {"Device Type": 1, "Device Id": 0, "Bytes": 512}},
    ]
    tr = read_kineto(_write(tmp_path, {"traceEvents": ev}))
    assert tr.schema == "2021" and tr.launch_flow_categories == ["async"] and tr.threads == [(25, 25)]
    assert tr.gpu.stream.tolist() == [7, 7] and tr.gpu.runtime.tolist() == [0, -1]
    assert tr.gpu.external_id.tolist() == [4, -1] and tr.runtime.external_id.tolist() == [4]
    assert tr.runtime.cpu_parent.tolist() == [1] and tr.flows.dst_tid.tolist() == [7]
    assert [w.dur_us for w in tr.steps()] == [30.0] and tr.rank is None
    assert tr.memory.bytes.tolist() == [512] and tr.memory.device_id.tolist() == [0]


def test_synthetic_2022_rocm_driver(tmp_path: Path) -> None:
    ev = [
        _x("cpu_op", "aten::add", 0, 20),
        _x("cuda_runtime", "hipExtModuleLaunchKernel", 2, 3, cid=123, correlation=7),
        _x("cuda_driver", "cuLaunchKernelEx", 8, 3, cbid=652, correlation=8),
        _x("kernel", "triton_poi", 12, 2, pid=2, tid=0, device=2, stream=0, correlation=7),
        _x("kernel", "triton_red", 15, 2, pid=2, tid=0, device=2, stream=0, correlation=8),
        {"ph": "s", "cat": "async_cpu_to_gpu", "id": 7, "pid": 1, "tid": 1, "ts": 2},
        {"ph": "f", "cat": "async_cpu_to_gpu", "id": 7, "pid": 2, "tid": 0, "ts": 12, "bp": "e"},
    ]
    tr = read_kineto(_write(tmp_path, {"traceEvents": ev, "hip_runtime_version": 60400}))
    assert tr.platform == "rocm" and tr.launch_flow_categories == ["async_cpu_to_gpu"]
    assert tr.runtime.cbid.tolist() == [123, 652] and tr.runtime.driver.tolist() == [False, True]
    assert tr.runtime.kind.tolist() == [RuntimeKind.LAUNCH] * 2 and tr.gpu.runtime.tolist() == [0, 1]
    assert tr.gpu.has_flow.tolist() == [True, False]
    assert tr.step_source == "trace" and tr.steps()[0].end_us == 20.0 and tr.gpu_names == []


def test_synthetic_optimizer_steps_and_collectives(tmp_path: Path) -> None:
    ev = [_x("user_annotation", "Optimizer.step#SGD.step", t, 5) for t in (100, 250, 420)]
    ev += [
        _x("cpu_op", "record_param_comms", 10, 8, **{"Collective name": "_allgather_base", "In msg nelems": 4,
                                                     "Out msg nelems": 32, "Group size": 8, "dtype": "BFloat16",
                                                     "Process Group Name": "3", "Seq": 12,
                                                     "Process Group Ranks": "[0, 1, 2, 3, 4, 5, 6, 7]"}),
        _x("user_annotation", "nccl:all_reduce", 11, 5, **{"Input Dims": [[4, 256]], "Input type": ["float"]}),
        _x("kernel", "ncclDevKernel_AllGather_RING_LL(x)", 30, 9, pid=0, tid=7, stream=7, device=0),
        _x("cpu_op", "CPU-only op", 500, 1),
    ]
    tr = read_kineto(_write(tmp_path, {"traceEvents": ev}))
    assert [(w.step, w.start_us, w.end_us) for w in tr.steps()] == [(0, 90.0, 240.0), (1, 240.0, 410.0)]
    assert tr.step_source == "optimizer" and len(tr.assumptions) == 1
    c = tr.collectives
    assert [s.name for s in c.source] == ["PARAM_COMMS", "ANNOTATION", "GPU_KERNEL"]
    assert c.kind == ["allgather", "allreduce", "allgather"] and c.seq[0] == 12 and c.pg_ranks[0] == tuple(range(8))
    assert c.in_nelems[:2] == [4, 1024] and c.dtype[:2] == ["BFloat16", "float"] and c.group_size[0] == 8


def test_cpu_only_trace_is_valid(tmp_path: Path) -> None:
    ev = [_x("cpu_op", "gloo:all_reduce", 0, 10), _x("cpu_op", "aten::add", 20, 5)]
    tr = read_kineto(_write(tmp_path, {"traceEvents": ev, "distributedInfo": {"backend": "gloo", "rank": 1,
                                                                               "world_size": 2}}))
    assert tr.platform == "cpu" and len(tr.gpu) == 0 and tr.backend == "gloo" and tr.steps()[0].end_us == 25.0
    assert tr.collectives.kind == ["allreduce"] and tr.summary()["kernels"] == 0


def test_nesting_multiple_threads(tmp_path: Path) -> None:
    ev = [_x("cpu_op", "a", 0, 100, tid=1), _x("cpu_op", "b", 10, 20, tid=1), _x("cpu_op", "c", 30, 10, tid=1),
          _x("cpu_op", "d", 35, 2, tid=1), _x("cpu_op", "e", 100, 5, tid=1), _x("cpu_op", "x", 5, 200, tid=2),
          _x("python_function", "f.py(1): g", 6, 1, tid=2)]
    tr = read_kineto(_write(tmp_path, {"traceEvents": ev}))
    names = tr.names(tr.cpu.name_id)
    parent = {names[i]: (names[p] if p >= 0 else None) for i, p in enumerate(tr.cpu.parent.tolist())}
    assert parent == {"a": None, "b": "a", "c": "a", "d": "c", "e": None, "x": None, "f.py(1): g": "x"}
    assert dict(zip(names, tr.cpu.depth.tolist(), strict=True)) == {"a": 0, "b": 1, "c": 1, "d": 2, "e": 0,
                                                                    "x": 0, "f.py(1): g": 1}


def test_classifiers() -> None:
    assert runtime_kind("cudaLaunchKernelExC") == RuntimeKind.LAUNCH == runtime_kind("cudaGraphLaunch")
    assert runtime_kind("hipMemcpyWithStream") == RuntimeKind.MEMCPY
    assert runtime_kind("cudaEventRecordWithFlags") == RuntimeKind.EVENT_RECORD
    assert runtime_kind("hipDeviceSynchronize") == RuntimeKind.DEVICE_SYNC
    assert runtime_kind("cudaEventSynchronize") == RuntimeKind.EVENT_SYNC
    assert runtime_kind("cudaEventQuery") == RuntimeKind.OTHER
    assert collective_kind("_reduce_scatter_base") == "reducescatter" == collective_kind("ReduceScatter")
    assert collective_kind("all_to_all") == "alltoall"


# ----------------------------------------------------------------------------------------------- bad input


def _one_line_error(p: Path) -> str:
    with pytest.raises(ConfigError) as exc:
        read_kineto(p)
    msg = str(exc.value)
    assert "\n" not in msg and str(p) in msg
    return msg


def test_bad_inputs(tmp_path: Path) -> None:
    good = gzip.compress(json.dumps(_current()).encode())
    (tmp_path / "cut.json.gz").write_bytes(good[: len(good) // 2])
    assert "truncated gzip" in _one_line_error(tmp_path / "cut.json.gz")
    (tmp_path / "bad.json.gz").write_bytes(b"\x1f\x8b" + b"garbage" * 10)
    assert "gzip" in _one_line_error(tmp_path / "bad.json.gz")
    (tmp_path / "text.json").write_text("this is not json")
    assert "not JSON" in _one_line_error(tmp_path / "text.json")
    (tmp_path / "half.json").write_text(json.dumps(_current())[:200])
    assert "not JSON" in _one_line_error(tmp_path / "half.json")
    assert "JSON array" in _one_line_error(_write(tmp_path, [_x("cpu_op", "a", 0, 1)], "list.json"))
    assert "empty" in _one_line_error(_write(tmp_path, {"traceEvents": []}, "empty.json"))
    assert "no 'traceEvents'" in _one_line_error(_write(tmp_path, {"foo": 1}, "nokey.json"))
    assert "not a list" in _one_line_error(_write(tmp_path, {"traceEvents": {}}, "dict.json"))
    meta_only = {"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "p"}}]}
    assert "only metadata" in _one_line_error(_write(tmp_path, meta_only, "meta.json"))
    no_ts = {"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "dur": 1}]}
    assert "no numeric ts" in _one_line_error(_write(tmp_path, no_ts, "nots.json"))
    (tmp_path / "zero.json").write_bytes(b"")
    assert "empty" in _one_line_error(tmp_path / "zero.json")
    assert "cannot read" in _one_line_error(tmp_path / "missing.json")
    assert "directory" in _one_line_error(tmp_path)


def test_json_fallback_without_orjson(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_orjson(name: str, *args: Any, **kwargs: Any) -> Any:  # noqa: ANN401
        if name == "orjson":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_orjson)
    tr = read_kineto(_write(tmp_path, _current(), gz=True))
    assert [w.step for w in tr.steps()] == [7] and len(tr.gpu) == 3
    (tmp_path / "text.json").write_text("{")
    assert "not JSON" in _one_line_error(tmp_path / "text.json")
