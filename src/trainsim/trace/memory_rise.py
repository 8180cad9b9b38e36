"""What a profiled training step allocates above what it starts with, from a Kineto trace's `[memory]` events.

torch.profiler(profile_memory=True) records one `[memory]` instant event per caching-allocator malloc (+bytes)
and free (-bytes), with the device type (1 = CUDA) and id. The 2021 schema gives only the delta, so the running
sum from the first recorded event is the allocated bytes up to an unknown constant: whatever was allocated
before profiling began (parameters, gradients, optimizer states). That constant cancels in the rise:

    rise = max over the step's events of the running sum  -  the running sum just before the step starts

i.e. the dynamic peak of one step above the memory it starts with: the activations kept for backward, the
backward's transient gradient buffers and workspaces, and any gradient the step newly allocates (none where
`optimizer.zero_grad()` zeroes gradients in place, as PyTorch before 2.0 did by default). Steps are the
trace's ProfilerStep#N windows (trace.kineto's step windows); an event belongs to a step when
start <= ts <= end. Used by benchmarks/resnet_memory_rise.py and its test to check trainsim's activation peak.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .kineto.model import KinetoTrace

CUDA_DEVICE_TYPE = 1  # c10::DeviceType::CUDA, as `[memory]` events' "Device Type" gives it
HALF_MARKERS = ("half", "bf16", "bfloat16", "fp16", "h884", "h1688", "h16816", "f16f16")
"""Kernel-name fragments of fp16/bf16 work (mixed precision): cuDNN/cuBLAS `h884`/`h1688` tensor-core
kernels, ATen's `c10::Half` / `c10::BFloat16` template arguments."""


@dataclass(frozen=True)
class StepRise:
    """One step's allocated-memory rise on one device; bytes relative to the trace's first recorded event."""

    step: int
    device_id: int
    start_bytes: int  # running sum just before the step starts
    peak_bytes: int  # largest running sum within the step
    end_bytes: int  # running sum after the step's last event
    events: int  # `[memory]` events of this device within the step

    @property
    def rise_bytes(self) -> int:
        """The step's dynamic peak above what it started with."""
        return self.peak_bytes - self.start_bytes


def cuda_devices(trace: KinetoTrace) -> list[int]:
    """The CUDA device ids that have `[memory]` events."""
    mem = trace.memory
    return sorted(set(mem.device_id[mem.device_type == CUDA_DEVICE_TYPE].tolist()))


def step_rises(trace: KinetoTrace, device_id: int | None = None) -> list[StepRise]:
    """The allocated-bytes rise of every step window on one CUDA device (default: the only one with events).

    Raises ValueError when the trace has no CUDA `[memory]` events (it was not recorded with
    profile_memory=True) or several devices and none is named.
    """
    devices = cuda_devices(trace)
    if not devices:
        raise ValueError(f"{trace.path}: no CUDA [memory] events (record with torch.profiler's profile_memory=True)")
    if device_id is None:
        if len(devices) > 1:
            raise ValueError(f"{trace.path}: [memory] events on CUDA devices {devices}: name one")
        device_id = devices[0]
    mem = trace.memory
    mine = (mem.device_type == CUDA_DEVICE_TYPE) & (mem.device_id == device_id)
    ts = mem.ts_us[mine]
    running = np.cumsum(mem.bytes[mine].astype(np.int64))
    out: list[StepRise] = []
    for w in trace.steps():
        lo = int(np.searchsorted(ts, w.start_us, side="left"))
        hi = int(np.searchsorted(ts, w.end_us, side="right"))
        start = int(running[lo - 1]) if lo > 0 else 0
        if hi <= lo:
            out.append(StepRise(w.step, device_id, start, start, start, 0))
            continue
        out.append(StepRise(w.step, device_id, start, int(running[lo:hi].max()), int(running[hi - 1]), hi - lo))
    return out


def kernel_precision(trace: KinetoTrace) -> str:
    """"amp" when any GPU kernel's name marks fp16/bf16 work (HALF_MARKERS), else "fp32": the dtype the
    trace's convolutions and GEMMs ran in (ResNet-50's 2021 trace: scudnn/sgemm kernels on float)."""
    names = {trace.name(i).lower() for i in np.unique(trace.gpu.name_id).tolist()}
    return "amp" if any(m in n for n in names for m in HALF_MARKERS) else "fp32"
