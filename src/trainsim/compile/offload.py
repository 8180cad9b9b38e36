"""Offload lowering: memory nodes that stream each layer's model states from CPU/NVMe or a remote pool.

ZeRO-Infinity (Rajbhandari et al., SC 2021) keeps parameters, gradients and optimizer states off the
GPU: a layer's (local shard of) parameters is loaded before its forward and again before its backward,
and its gradients are stored back after its backward. As ASTRA-sim 2.0's memory nodes, the loads and
stores run on the MEMORY stream; a load is prefetched once the previous layer has started (two layers
resident), and its bytes are held until the layer's last step. The optimizer step runs where the states
live (CPU / memory side), so the GPU keeps none of the layer's states between uses.

With ASTRA-sim 2.0's in-switch collectives (`tree.offload_in_switch`, a hierarchical pool), a ZeRO-3 layer's
load is of its shard with the pool's switches gathering it on the way (the GPU receives, and allocates, the
gathered weights; no GPU all-gather), and its gradient store reduce-scatters the whole gradient into the
pool's shards (no GPU reduce-scatter).
"""

from __future__ import annotations

from .program import Step, Stream

OFFLOAD_TARGETS = ("none", "cpu", "nvme", "remote")


def _load(label: str, layer: str, prefetch_after: int | None, phase: str, size_bytes: float, held_bytes: float,
          axes: tuple[str, ...] = (), in_switch: bool = False) -> Step:
    """A load on the memory stream of `size_bytes` that allocates `held_bytes`, issued once the step
    `prefetch_after` has started (the previous layer's first: one layer ahead) or at once (None)."""
    return Step(label, "memory", Stream.MEMORY, "offload", layer,
                deps=(prefetch_after,) if prefetch_after is not None else (), phase=phase, access="load",
                size_bytes=size_bytes, alloc_bytes=held_bytes, axes=axes, in_switch=in_switch)


def insert_offload(steps: list[Step], sizes: dict[str, tuple[float, float]], phase: str,
                   in_switch: dict[str, tuple[float, float, tuple[str, ...]]] | None = None) -> list[Step]:
    """Put a load before each layer's first step and (backward) a gradient store after its last one.

    `sizes`: layer -> (parameter bytes to load, gradient bytes to store) per rank. Stores go at the end
    of the template (each waits on its layer's last step), so no compute step ever waits on a store.
    `in_switch`: layer -> (parameter bytes to load, bytes held once gathered, gather axes) of the layers whose
    load gathers and whose store reduce-scatters in the pool's switches: their memory steps are `in_switch`
    over the axes, the load moves the shards and allocates the gathered weights, the store moves the gradient
    shard of `sizes`. Such a store is the
    layer's gradient reduce-scatter, so it cannot wait for the whole backward (the GPU would hold every
    layer's gradient until then): it follows the next load on the memory stream (the prefetch is issued
    first, as FSDP's backward prefetch does), sharing the pool's links with the loads in turn."""
    in_switch = in_switch or {}
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, s in enumerate(steps):
        if s.layer in sizes:
            first.setdefault(s.layer, i)
            last[s.layer] = i
    starts = {i: name for name, i in first.items() if sizes[name][0] > 0 or name in in_switch}
    layer_starts = set(first.values())
    ends = {i: name for name, i in last.items()}
    out: list[Step] = []
    new_index: dict[int, int] = {}
    prev_layer_start: int | None = None
    pending: list[Step] = []  # in-switch stores waiting for the next load

    def store(name: str, i: int) -> Step:
        grad = sizes[name][1]
        out[new_index[i]].alloc_bytes += grad  # the gradient buffer lives until it is stored
        return Step(f"{name}.grads:store", "memory", Stream.MEMORY, "offload", name, deps=(new_index[i],),
                    phase=phase, access="store", size_bytes=grad, free_bytes=grad,
                    axes=in_switch[name][2] if name in in_switch else (), in_switch=name in in_switch)

    for i, s in enumerate(steps):
        deps = None if s.deps is None else tuple(new_index[d] for d in s.deps)
        name = starts.get(i)
        if name is not None:
            size, held, axes = in_switch.get(name, (sizes[name][0], sizes[name][0], ()))
            out.append(_load(f"{name}.params:load", name, prev_layer_start, phase, size, held, axes,
                             name in in_switch))
            before = deps if deps is not None else ((new_index[i - 1],) if i > 0 else ())
            deps = (*before, len(out) - 1)  # explicit: the stores put after the load are not waited on
            out.extend(pending)
            pending.clear()
        if i in layer_starts:
            prev_layer_start = len(out)
        new_index[i] = len(out)
        s.deps = deps
        out.append(s)
        done = ends.get(i)
        if phase == "bwd" and done in in_switch and sizes[done][1] > 0:
            pending.append(store(done, i))
    out.extend(pending)
    for name, i in last.items():
        load, grad = sizes[name]
        if name in in_switch or load > 0:
            out[new_index[i]].free_bytes += in_switch.get(name, (load, load, ()))[1]  # dropped after last use
        if phase == "bwd" and grad > 0 and name not in in_switch:
            out.append(store(name, i))
    return out


def insert_activation_offload(steps: list[Step], kept: dict[str, float], phase: str) -> list[Step]:
    """Activation offloading (torchtune's enable_activation_offloading, on activation checkpointing): each layer's
    checkpointed input (`kept`: layer -> bytes per rank) goes to CPU memory as soon as its forward is done and
    comes back before its backward, on the memory stream.

    Forward: a store right after the layer's last step frees the bytes when it ends; the next step does not
    wait for it. Backward: a load before the layer's first step allocates them again (prefetched once the
    previous layer in backward order has started, as torchtune prefetches the next layer's), and the
    backward frees them where it freed them before. The other steps keep their order and dependencies."""
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, s in enumerate(steps):
        first.setdefault(s.layer, i)
        last[s.layer] = i
    starts = set(first.values())
    store_after = {i: name for name, i in last.items() if kept.get(name, 0.0) > 0} if phase == "fwd" else {}
    load_before = {i: name for name, i in first.items() if kept.get(name, 0.0) > 0} if phase == "bwd" else {}
    out: list[Step] = []
    new_index: dict[int, int] = {}
    prev_layer_start: int | None = None
    after_store = -1  # the output index of the step a store was just put after (-1: none)
    for i, s in enumerate(steps):
        deps = None if s.deps is None else tuple(new_index[d] for d in s.deps)
        if deps is None and after_store >= 0:
            deps = (after_store,)  # the previous step, not the store put between them
        after_store = -1
        name = load_before.get(i)
        if name is not None:
            out.append(_load(f"{name}.activations:load", name, prev_layer_start, phase, kept[name], kept[name]))
            before = deps if deps is not None else ((len(out) - 2,) if len(out) > 1 else ())
            deps = (*before, len(out) - 1)
        if i in starts:
            prev_layer_start = len(out)
        new_index[i] = len(out)
        s.deps = deps
        out.append(s)
        name = store_after.get(i)
        if name is not None:
            out.append(Step(f"{name}.activations:store", "memory", Stream.MEMORY, "offload", name,
                            deps=(len(out) - 1,), phase=phase, access="store", size_bytes=kept[name],
                            free_bytes=kept[name]))
            after_store = len(out) - 2
    return out
