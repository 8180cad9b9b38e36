"""The in-memory form of one rank's Kineto (torch.profiler) trace: columnar tables of numpy arrays.

Times: every `*_us` column is float64 microseconds **relative to `KinetoTrace.origin_us`** (the earliest
`ts` of any kept complete event, on the trace's own clock, which may be boot-relative or epoch-based);
add `origin_us` back for the absolute clock (needed when aligning ranks). Durations are as recorded.
Missing integers are -1. Names are ids into `KinetoTrace.strings` (one table for the whole trace).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np


class CpuKind(IntEnum):
    """What a CPU range is: an operator (`cpu_op`, 2021 `Operator`), a `user_annotation`, a `python_function`."""

    CPU_OP = 0
    USER_ANNOTATION = 1
    PYTHON_FUNCTION = 2


class RuntimeKind(IntEnum):
    """What a CUDA/HIP runtime or driver call does, for the graph builder."""

    LAUNCH = 0  # kernel or graph launch (cudaLaunchKernel[ExC], cuLaunchKernel[Ex], hip*LaunchKernel, *GraphLaunch)
    MEMCPY = 1
    MEMSET = 2
    EVENT_RECORD = 3
    STREAM_WAIT_EVENT = 4
    STREAM_SYNC = 5
    DEVICE_SYNC = 6  # cudaDeviceSynchronize, cuCtxSynchronize, hipDeviceSynchronize
    EVENT_SYNC = 7
    OTHER = 8


class GpuKind(IntEnum):
    """What a GPU op is."""

    KERNEL = 0
    MEMCPY = 1
    MEMSET = 2


class SyncKind(IntEnum):
    """The `cuda_sync` event kinds CUPTI records (`cuda_sync_kind`)."""

    STREAM_SYNC = 0
    EVENT_SYNC = 1
    CONTEXT_SYNC = 2
    STREAM_WAIT_EVENT = 3
    OTHER = 4


class FlowKind(IntEnum):
    """A flow arrow: a launch (`ac2g`, 2022 `async_cpu_to_gpu`, 2021 `async`/`launch`) or forward->backward."""

    LAUNCH = 0
    FWDBWD = 1


class CollectiveSource(IntEnum):
    """Where a collective record comes from."""

    PARAM_COMMS = 0  # the `record_param_comms` CPU op (carries the args in 2024+ builds)
    ANNOTATION = 1  # the `nccl:*` / `gloo:*` CPU user annotation wrapping it
    GPU_KERNEL = 2  # an NCCL/RCCL kernel on the GPU (its duration includes waiting for peers)


@dataclass
class _Table:
    """A table of parallel numpy columns (all the same length)."""

    def __len__(self) -> int:
        fs = dataclasses.fields(self)
        return len(getattr(self, fs[0].name)) if fs else 0

    def take(self, order: np.ndarray) -> None:
        """Reorder every column in place by the index array `order`."""
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name)[order])


@dataclass
class CpuOps(_Table):
    """CPU ranges, sorted by (thread, ts_us, -dur_us): nested per thread by `parent` / `depth`."""

    thread: np.ndarray  # int32: index into KinetoTrace.threads (pid, tid)
    ts_us: np.ndarray  # float64: start, us from origin_us
    dur_us: np.ndarray  # float64: duration, us
    name_id: np.ndarray  # int32: index into KinetoTrace.strings
    kind: np.ndarray  # int8: CpuKind
    external_id: np.ndarray  # int64: `External id` (ties an op to its launches and GPU ops), -1 if none
    ev_idx: np.ndarray  # int64: `Ev Idx` (event index in the original trace; gaps = events removed), -1
    parent: np.ndarray  # int64: row of the innermost enclosing range on the same thread, -1 at top level
    depth: np.ndarray  # int32: nesting depth (0 = top level)


@dataclass
class RuntimeCalls(_Table):
    """CUDA/HIP runtime (`cuda_runtime`, 2021 `Runtime`) and driver (`cuda_driver`) calls, sorted by (thread, ts_us)."""

    thread: np.ndarray  # int32: index into KinetoTrace.threads
    ts_us: np.ndarray  # float64: start, us from origin_us
    dur_us: np.ndarray  # float64: duration, us
    name_id: np.ndarray  # int32: index into KinetoTrace.strings (cudaLaunchKernel, hipMemcpyAsync, ...)
    kind: np.ndarray  # int8: RuntimeKind
    driver: np.ndarray  # bool: a `cuda_driver` call (cuLaunchKernelEx, ...) rather than a runtime call
    cbid: np.ndarray  # int64: CUPTI callback id (`cbid`; ROCm `cid`), -1
    correlation: np.ndarray  # int64: links the call to the GPU ops it issued, -1
    external_id: np.ndarray  # int64: `External id` of the CPU op that issued it (absent on driver calls), -1
    cpu_parent: np.ndarray  # int64: row in CpuOps of the innermost CPU range enclosing the call, -1


@dataclass
class GpuOps(_Table):
    """Kernels, copies and sets on the GPU, sorted by (device, stream, ts_us)."""

    device: np.ndarray  # int32: device id (`args.device`, else the event's pid)
    stream: np.ndarray  # int64: stream id (`args.stream`; 2021's tid "stream 7" parses to 7)
    ts_us: np.ndarray  # float64: start, us from origin_us
    dur_us: np.ndarray  # float64: duration, us
    name_id: np.ndarray  # int32: index into KinetoTrace.strings
    kind: np.ndarray  # int8: GpuKind
    correlation: np.ndarray  # int64: the launching runtime call's correlation id, -1
    external_id: np.ndarray  # int64: `External id` of the launching CPU op, -1
    bytes: np.ndarray  # int64: bytes moved or set (memcpy/memset), -1 for kernels
    runtime: np.ndarray  # int64: row in RuntimeCalls with the same correlation, -1 when none is in the trace
    has_flow: np.ndarray  # bool: a launch flow arrow points at this op


@dataclass
class SyncEvents(_Table):
    """`cuda_sync` events (CUPTI synchronization records; only some traces have them), sorted by ts_us."""

    device: np.ndarray  # int32
    stream: np.ndarray  # int64: the stream that waits / is synchronised, -1 for none (context/event sync)
    ts_us: np.ndarray  # float64
    dur_us: np.ndarray  # float64
    kind: np.ndarray  # int8: SyncKind
    correlation: np.ndarray  # int64: correlation of the runtime call (cudaStreamWaitEvent, ...), -1
    external_id: np.ndarray  # int64
    wait_on_stream: np.ndarray  # int64: stream whose event is waited on, -1
    wait_on_event_record_correlation: np.ndarray  # int64: correlation of the cudaEventRecord waited on, -1
    wait_on_event_id: np.ndarray  # int64: CUDA event id, -1
    runtime: np.ndarray  # int64: row in RuntimeCalls with the same correlation, -1


@dataclass
class GpuAnnotations(_Table):
    """`gpu_user_annotation` ranges: user annotations projected onto a GPU stream, sorted by ts_us."""

    device: np.ndarray  # int32
    stream: np.ndarray  # int64
    ts_us: np.ndarray  # float64
    dur_us: np.ndarray  # float64
    name_id: np.ndarray  # int32
    external_id: np.ndarray  # int64


@dataclass
class Flows(_Table):
    """Complete flow arrows (an `s` and an `f` with the same category and id), sorted by src_ts_us."""

    kind: np.ndarray  # int8: FlowKind
    id: np.ndarray  # int64: flow id (= correlation for launch flows)
    src_pid: np.ndarray  # int64: start event's pid (a process id)
    src_tid: np.ndarray  # int64
    src_ts_us: np.ndarray  # float64
    dst_pid: np.ndarray  # int64: finish event's pid (the device id for a launch flow)
    dst_tid: np.ndarray  # int64: (the stream id for a launch flow)
    dst_ts_us: np.ndarray  # float64


@dataclass
class MemoryEvents(_Table):
    """`[memory]` instant events (allocator activity; present when profile_memory=True), sorted by ts_us."""

    ts_us: np.ndarray  # float64
    device_type: np.ndarray  # int32: 0 CPU, 1 CUDA (c10 DeviceType)
    device_id: np.ndarray  # int32: -1 for the CPU
    bytes: np.ndarray  # int64: allocated (+) or freed (-)
    total_allocated_bytes: np.ndarray  # int64: allocator total after the event, -1 where not recorded


@dataclass
class Collectives:
    """Collective calls, CPU and GPU side, sorted by ts_us; lists because they are few.

    `row` indexes CpuOps (PARAM_COMMS, ANNOTATION) or GpuOps (GPU_KERNEL). Fields the trace lacks are
    None / -1; a `nccl:*` annotation without args takes its size and dtype from `Input Dims`/`Input type`.
    """

    source: list[CollectiveSource] = field(default_factory=list)
    row: list[int] = field(default_factory=list)
    ts_us: list[float] = field(default_factory=list)
    dur_us: list[float] = field(default_factory=list)
    name: list[str] = field(default_factory=list)  # `Collective name` or from the op/kernel name
    kind: list[str] = field(default_factory=list)  # normalised: allreduce, allgather, reducescatter, ...
    in_nelems: list[int] = field(default_factory=list)  # elements in, -1 if unknown
    out_nelems: list[int] = field(default_factory=list)  # elements out, -1
    dtype: list[str | None] = field(default_factory=list)
    group_size: list[int] = field(default_factory=list)  # -1
    pg_name: list[str | None] = field(default_factory=list)  # process group name (`Process Group ID` too)
    pg_desc: list[str | None] = field(default_factory=list)
    pg_ranks: list[tuple[int, ...] | None] = field(default_factory=list)
    seq: list[int] = field(default_factory=list)  # per-group sequence number where recorded, -1

    def __len__(self) -> int:
        return len(self.source)


@dataclass(frozen=True)
class StepWindow:
    """One training step: `start_us`/`end_us` relative to origin_us; `source` ProfilerStep, optimizer or trace."""

    step: int
    start_us: float
    end_us: float
    source: str

    @property
    def dur_us(self) -> float:
        """The step's length, us."""
        return self.end_us - self.start_us


@dataclass
class KinetoTrace:
    """One rank's Kineto trace, normalised across schema generations (2021, 2022, current, ROCm)."""

    path: str
    file_bytes: int  # size on disk
    json_bytes: int  # size of the JSON text (after gunzip)
    n_events: int  # entries in traceEvents
    origin_us: float  # absolute `ts` that every *_us column is relative to
    schema: str  # "2021" (Operator/Runtime/Kernel categories) or "current"
    platform: str  # "cuda", "rocm" or "cpu" (no GPU or runtime events)
    strings: list[str]
    threads: list[tuple[int, int]]  # (pid, tid) per CpuOps/RuntimeCalls `thread` index
    cpu: CpuOps
    runtime: RuntimeCalls
    gpu: GpuOps
    syncs: SyncEvents
    gpu_annotations: GpuAnnotations
    flows: Flows
    memory: MemoryEvents
    collectives: Collectives
    rank: int | None = None
    world_size: int | None = None
    backend: str | None = None
    nccl_version: str | None = None
    pg_config: list[dict[str, Any]] = field(default_factory=list)
    distributed_info: dict[str, Any] = field(default_factory=dict)
    device_properties: list[dict[str, Any]] = field(default_factory=list)
    base_time_ns: int | None = None  # `baseTimeNanoseconds`: offset of a boot-relative clock, when given
    process_names: dict[int, str] = field(default_factory=dict)
    thread_names: dict[tuple[int, int], str] = field(default_factory=dict)
    launch_flow_categories: list[str] = field(default_factory=list)  # ac2g, async_cpu_to_gpu, async
    skipped: dict[str, int] = field(default_factory=dict)  # events not kept, by category
    step_windows: list[StepWindow] = field(default_factory=list)
    step_source: str = "trace"
    assumptions: list[str] = field(default_factory=list)

    def steps(self) -> list[StepWindow]:
        """Step windows: ProfilerStep#N, else optimizer-step spacing, else the whole trace (see assumptions)."""
        return list(self.step_windows)

    def name(self, name_id: int) -> str:
        """The string behind a `name_id`."""
        return self.strings[int(name_id)]

    def names(self, ids: np.ndarray) -> list[str]:
        """The strings behind an array of name ids."""
        s = self.strings
        return [s[i] for i in ids.tolist()]

    @property
    def device_names(self) -> dict[int, str]:
        """GPU model per device id, from deviceProperties."""
        out: dict[int, str] = {}
        for i, p in enumerate(self.device_properties):
            if isinstance(p, dict) and isinstance(p.get("name"), str):
                out[int(p["id"]) if isinstance(p.get("id"), int) else i] = p["name"]
        return out

    @property
    def gpu_names(self) -> list[str]:
        """GPU models of the devices that ran GPU ops (empty when deviceProperties is absent)."""
        names = self.device_names
        return sorted({names[d] for d in np.unique(self.gpu.device).tolist() if d in names})

    def summary(self) -> dict[str, Any]:
        """Counts a reader of the trace wants first (events per table, links found and missing)."""
        gpu, rt = self.gpu, self.runtime
        launches = rt.kind == RuntimeKind.LAUNCH
        issued = np.zeros(len(rt), dtype=bool)
        issued[gpu.runtime[gpu.runtime >= 0]] = True
        return {
            "events": self.n_events, "cpu_ops": len(self.cpu), "runtime_calls": len(rt), "gpu_ops": len(gpu),
            "kernels": int(np.sum(gpu.kind == GpuKind.KERNEL)), "syncs": len(self.syncs),
            "flows": len(self.flows), "collectives": len(self.collectives), "memory_events": len(self.memory),
            "gpu_ops_without_runtime": int(np.sum(gpu.runtime < 0)),
            "gpu_ops_without_flow": int(np.sum(~gpu.has_flow)),
            "launches_without_gpu_op": int(np.sum(launches & ~issued)),
            "streams": sorted({(int(d), int(s)) for d, s in zip(gpu.device.tolist(), gpu.stream.tolist(),
                                                                 strict=True)}),
            "steps": len(self.step_windows), "step_source": self.step_source,
        }
