"""Offload lowering: memory nodes that stream each layer's model states from CPU/NVMe or a remote pool.

ZeRO-Infinity (Rajbhandari et al., SC 2021) keeps parameters, gradients and optimizer states off the
GPU: a layer's (local shard of) parameters is loaded before its forward and again before its backward,
and its gradients are stored back after its backward. As ASTRA-sim 2.0's memory nodes, the loads and
stores run on the MEMORY stream; a load is prefetched once the previous layer has started (two layers
resident), and its bytes are held until the layer's last step. The optimizer step runs where the states
live (CPU / memory side), so the GPU keeps none of the layer's states between uses.
"""

from __future__ import annotations

from .program import Step, Stream

OFFLOAD_TARGETS = ("none", "cpu", "nvme", "remote")


def insert_offload(steps: list[Step], sizes: dict[str, tuple[float, float]], phase: str) -> list[Step]:
    """Put a load before each layer's first step and (backward) a gradient store after its last one.

    `sizes`: layer -> (parameter bytes to load, gradient bytes to store) per rank. Stores go at the end
    of the template (each waits on its layer's last step), so no compute step ever waits on a store."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, s in enumerate(steps):
        if s.layer in sizes:
            first.setdefault(s.layer, i)
            last[s.layer] = i
    starts = {i: name for name, i in first.items() if sizes[name][0] > 0}
    layer_starts = set(first.values())
    out: list[Step] = []
    new_index: dict[int, int] = {}
    prev_layer_start: int | None = None
    for i, s in enumerate(steps):
        deps = None if s.deps is None else tuple(new_index[d] for d in s.deps)
        name = starts.get(i)
        if name is not None:
            size = sizes[name][0]
            out.append(Step(f"{name}.params:load", "memory", Stream.MEMORY, "offload", name,
                            deps=(prev_layer_start,) if prev_layer_start is not None else (), phase=phase,
                            access="load", size_bytes=size, alloc_bytes=size))
            before = deps if deps is not None else ((new_index[i - 1],) if i > 0 else ())
            deps = (*before, len(out) - 1)
        if i in layer_starts:
            prev_layer_start = len(out)
        new_index[i] = len(out)
        s.deps = deps
        out.append(s)
    for name, i in last.items():
        load, grad = sizes[name]
        if load > 0:
            out[new_index[i]].free_bytes += load  # the loaded weights are dropped after their last use
        if phase == "bwd" and grad > 0:
            out[new_index[i]].alloc_bytes += grad  # the gradient buffer lives until it is stored
            out.append(Step(f"{name}.grads:store", "memory", Stream.MEMORY, "offload", name, deps=(new_index[i],),
                            phase=phase, access="store", size_bytes=grad, free_bytes=grad))
    return out
