"""What selective recompute of named modules re-runs and drops in a block (Megatron-Core's --recompute-modules).

A module names ops of a zoo block (workload/zoo/transformer.py): the recompute phase before the block's backward
runs them again, and the tensors their forward results were kept as (by them, or by the ops that consume them)
are not kept from the forward; the re-run makes them again. Megatron-Core (transformer_config.py,
recompute_modules) checkpoints:
- core_attn: the attention core (the ops marked selective_recompute; what they keep marked selective_drop);
- moe_act: the experts' activation (its output, expert_fc2's saved input);
- layernorm: the two norms of a block (their outputs, the saved inputs of the projections after them);
- mla_up_proj: multi-latent attention's up projections and RoPE (the queries and keys attention keeps);
- mlp: the dense MLP (what its activation and second projection keep; its input stays, it is the checkpoint);
- shared_experts: the shared expert's MLP, as mlp;
- moe: the whole mixture-of-experts MLP (all it keeps but its input).
Each dropped tensor is made again by the re-run op that produces it (itself, or the op feeding its consumer);
one whose producer is not re-run stays kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..workload.ir import Op

_MOE_OPS = ("router", "dispatch", "expert_fc1", "expert_act", "expert_fc2", "expert_bias", "combine")
_SHARED = ("shared_fc1", "shared_act", "shared_fc2")

# module -> (ops re-run, (consumer op, saved tensor) dropped beside the re-run ops' own)
_MODULES: dict[str, tuple[tuple[str, ...], tuple[tuple[str, str], ...]]] = {
    "moe_act": (("expert_act",), (("expert_fc2", "input"),)),
    "layernorm": (("ln1", "ln2"), tuple((c, "input") for c in ("qkv", "q_down", "q_proj", "fc1", "router"))),
    "mla_up_proj": (("q_up", "kv_up", "rope"), (("attention", "q"), ("attention", "kv"))),
    "mlp": (("fc1", "act", "fc2"), (("act", "input"), ("act", "silu_out"), ("fc2", "input"))),
    "shared_experts": (_SHARED, (("shared_act", "input"), ("shared_act", "silu_out"), ("shared_fc2", "input"))),
    "moe": (_MOE_OPS + _SHARED, ()),
}


@dataclass(frozen=True)
class RecomputePlan:
    """`rerun`: the ops the recompute phase runs again; `dropped`: (op, saved tensor) pairs not kept from the
    forward; `remakes`: per re-run op, the dropped tensors of other ops it makes again."""

    rerun: frozenset[str]
    dropped: frozenset[tuple[str, str]]
    remakes: dict[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)


def recompute_plan(ops: Sequence[Op], modules: frozenset[str]) -> RecomputePlan:
    """The plan of selective recompute of `modules` for a layer of `ops` (names absent from it are ignored)."""
    names = {op.name: op for op in ops}
    rerun: set[str] = set()
    wanted: set[tuple[str, str]] = set()
    dropped: set[tuple[str, str]] = set()
    if "core_attn" in modules:  # what selective recompute has always meant (compile.program)
        rerun |= {op.name for op in ops if op.selective_recompute}
        dropped |= {(op.name, t.name) for op in ops for t in op.saved if t.selective_drop}
    for module in modules - {"core_attn"}:
        run, drop = _MODULES[module]
        if module == "mla_up_proj" and not ({"q_up", "kv_up"} & names.keys()):
            continue  # RoPE alone is not the module
        rerun |= {n for n in run if n in names}
        wanted |= set(drop)
        if module == "moe":  # all the MoE MLP keeps but its input (the router's: the checkpoint)
            wanted |= {(n, t.name) for n in run if n in names for t in names[n].saved if n != "router"}
    own = {(n, t.name) for n in rerun for t in names[n].saved}
    remakes: dict[str, list[tuple[str, str]]] = {}
    for consumer, tensor in sorted(wanted):
        op = names.get(consumer)
        if op is None or tensor not in {t.name for t in op.saved}:
            continue
        if (consumer, tensor) in own:
            dropped.add((consumer, tensor))
            continue
        producer = _producer(ops, consumer)
        if producer in rerun:
            dropped.add((consumer, tensor))
            remakes.setdefault(producer, []).append((consumer, tensor))
    return RecomputePlan(frozenset(rerun), frozenset(dropped), {k: tuple(v) for k, v in remakes.items()})


def _producer(ops: Sequence[Op], name: str) -> str | None:
    """The op whose output feeds op `name`'s first input: its input_from, else the op before it."""
    for k, op in enumerate(ops):
        if op.name == name:
            src = op.input_from[0] if op.input_from else None
            if src == "@skip":
                return None
            return src if src else (ops[k - 1].name if k else None)
    return None
