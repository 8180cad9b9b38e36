"""Memory model: static bytes per device (parameters, gradients, optimizer states, library workspaces) and
capacity.

Activations are not costed here: they are allocated and released by the engine as the
compiled tasks run (alloc at production, free at last use), which gives the peak per schedule.

What a peak is compared with: PyTorch's allocated counter (torch.cuda.max_memory_allocated) sees every tensor
and the cuBLAS workspaces PyTorch takes from its caching allocator, but neither the CUDA context nor NCCL's own
buffers nor the allocator's cached-but-free blocks; those sit in RUNTIME_RESERVED_BYTES, taken off the capacity.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..compile.program import ChunkProgram
from ..errors import ConfigError
from ..hardware.devices import Device
from ..strategy.precision import Precision

if TYPE_CHECKING:
    from ..config import SimulationSpec
    from ..strategy.tree import StrategyTree

# What a training process holds outside PyTorch's caching allocator, so beside its reserved peak: the CUDA
# context (~0.5-1.3 GiB on A100/H100) and NCCL's communicator buffers. The allocator's own rounding and
# fragmentation are no longer part of it: cost.allocator replays them into the reserved peak.
RUNTIME_RESERVED_BYTES = 2 * 2**30

MIB = 2**20
CUBLAS_WORKSPACE_BYTES = 4096 * 2 * 1024 + 16 * 8 * 1024
"""PyTorch's default cuBLAS workspace, CUBLAS_WORKSPACE_CONFIG ':4096:2:16:8' = 8.125 MiB (PyTorch's
CublasHandlePool.cpp and its test_cublas_workspace_explicit_allocation), taken from the caching allocator on
the first GEMM and held for the life of the process."""
CUBLAS_WORKSPACE_BYTES_HOPPER = 4096 * 8 * 1024
"""The same on compute capability 9.0 and newer (':4096:8' = 32 MiB)."""
CUBLASLT_WORKSPACE_BYTES = 1 * MIB
"""PyTorch's cuBLASLt workspace (CUBLASLT_WORKSPACE_SIZE, default 1024 KiB), also from the allocator."""
_HOPPER_OR_NEWER = ("h100", "h200", "h800", "gh200", "b200", "gb200", "b300", "gb300")
"""Catalogue names of parts with compute capability 9.0 or newer (hardware.devices)."""


def workspace_bytes(device: Device) -> float:
    """The GEMM workspaces a PyTorch training process holds in allocated memory on `device`: cuBLAS (32 MiB
    from Hopper on, 8.125 MiB before) and cuBLASLt (1 MiB). A library's own workspace (Transformer Engine's
    32 MiB on Hopper) is not included: trainsim does not know which library runs the GEMMs."""
    hopper = device.name.lower().startswith(_HOPPER_OR_NEWER)
    return float((CUBLAS_WORKSPACE_BYTES_HOPPER if hopper else CUBLAS_WORKSPACE_BYTES) + CUBLASLT_WORKSPACE_BYTES)


@dataclass(frozen=True)
class StaticMemory:
    """Bytes one rank holds for the whole iteration, by kind."""

    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    workspace_bytes: float = 0.0

    @property
    def total_bytes(self) -> float:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes + self.workspace_bytes


def static_memory(chunks: list[ChunkProgram], precision: Precision, device: Device | None = None) -> StaticMemory:
    """Bytes one rank holds for the chunks it runs (ZeRO sharding already in the local counts). Offloaded
    chunks keep their states off the GPU (compile.offload: loaded and stored per layer, held transiently).

    Gradients: `precision.grad_buffers` copies of every local gradient (two under PyTorch DDP without bucket
    views); with the optimizer in backward, only the largest layer's gradients, the most that is alive at
    once when each gradient is stepped and freed as its layer's backward produces it. `device`: add the
    GEMM workspaces PyTorch holds there (workspace_bytes); None leaves them out."""
    kept = [c for c in chunks if c.offload == "none"]
    if precision.optimizer_in_backward:
        layer_grads = max((g for c in kept for _, g, _ in c.layer_states.values()), default=0.0)
        grads = layer_grads * precision.grad_bytes
    else:
        grads = sum(c.grads_local for c in kept) * precision.grad_bytes * precision.grad_buffers
    adjust = sum(c.param_bytes_adjust for c in kept)  # weights stored in FP8 (fp8_params) or NF4 (QLoRA)
    return StaticMemory(
        params_bytes=sum(c.params_local for c in kept) * precision.param_bytes + adjust,
        grads_bytes=grads,
        optimizer_bytes=sum(c.optimizer_params_local for c in kept) * precision.optimizer_bytes
        + sum(c.optimizer_bytes_adjust for c in kept),  # Adafactor's factored moments
        workspace_bytes=workspace_bytes(device) if device is not None else 0.0,
    )


def job_precision(tree: StrategyTree, device: Device, sim: SimulationSpec) -> Precision:
    """The job's precision and state layout: `sim.dtype` (auto: what `device` trains in) with the simulation's
    master_weights, optimizer, optimizer_in_backward and grad_bucket_copy. The optimizer in backward steps each
    gradient as it is made, so the tree (a saved one too) must run one micro-batch per step on one stage."""
    if sim.optimizer_in_backward:
        tree.resolve()  # the schedule of a tree without one is derived from the batch
        micro, pp = tree.schedule.n_micro_batch, tree.mesh.pp
        if pp > 1 or micro > 1:
            raise ConfigError("simulation.optimizer_in_backward", f"steps each gradient as backward makes it; this "
                              f"strategy accumulates {micro} micro-batch(es) over {pp} pipeline stage(s)",
                              "use one micro-batch per step (global_batch = micro_batch x dp) and pp 1, or drop it")
    return Precision.named(device.training_dtype if sim.dtype == "auto" else sim.dtype,
                           master_weights=sim.master_weights, optimizer=sim.optimizer,
                           grad_buffers=2 if sim.grad_bucket_copy else 1,
                           optimizer_in_backward=sim.optimizer_in_backward, fp8_params=sim.fp8_params,
                           fp8_activations=sim.fp8_activations)
