"""Memory model: static bytes per device (parameters, gradients, optimizer states) and capacity.

Activations are not costed here: they are allocated and released by the engine as the
compiled tasks run (alloc at production, free at last use), which gives the peak per schedule.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..compile.program import ChunkProgram
from ..strategy.precision import Precision

# CUDA context, NCCL communicator buffers and allocator fragmentation that a training process
# holds beyond its tensors (PyTorch reports ~0.5-1 GiB of context alone on A100/H100).
RUNTIME_RESERVED_BYTES = 2 * 2**30


@dataclass(frozen=True)
class StaticMemory:
    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes


def static_memory(chunks: list[ChunkProgram], precision: Precision) -> StaticMemory:
    """Bytes one rank holds for the chunks it runs (ZeRO sharding already in the local counts). Offloaded
    chunks keep their states off the GPU (compile.offload: loaded and stored per layer, held transiently)."""
    kept = [c for c in chunks if c.offload == "none"]
    return StaticMemory(
        params_bytes=sum(c.params_local for c in kept) * precision.param_bytes,
        grads_bytes=sum(c.grads_local for c in kept) * precision.grad_bytes,
        optimizer_bytes=sum(c.optimizer_params_local for c in kept) * precision.optimizer_bytes,
    )
