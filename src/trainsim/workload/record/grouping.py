"""From recorded ops to layers and a module tree (the IR the strategy tree mirrors).

Layers (the IR's leaves, the unit of pipeline placement, recompute and gradient buckets):
  * a *block* is one Layer: a non-leaf module held by a container (Sequential / ModuleList /
    ModuleDict) that is not itself a container of non-leaf modules - a transformer block
    ("blocks.3"), a ResNet bottleneck ("layer1.0"). Blocks do not nest: the walk stops at the
    first block. `blocks=` forces more modules to be blocks;
  * every other op belongs to a *run*: consecutive ops outside blocks form one Layer, cut after
    a pool with stride > 1 (the end of a CNN stage, as the zoo groups VGG's features). A run sits
    under the deepest non-leaf module holding all its ops; at the root it is called "stem" (first
    layer of the model), "head" (last layer), "body" (the only layer) or "run<k>"; inside a module M
    it is "M.block<k>" (VGG's "features.block1" .. "features.block5").
The module tree keeps the model's nesting, modules named by their paths as torch's named_modules
("layer1" holding "layer1.0"), so `S.layer1[0].conv1` reaches the op.

Op names are module paths relative to the layer ("conv1", "downsample.0", "attn.qkv") or the
function's name ("add"); repeats get "_1", "_2" (a ReLU module called three times).

`input_from` (how the compiler finds each input's producer): None when the input is the previous
op's output (or, for a layer's first op, the previous layer's output); an op name when another op
of the same layer produced it; "@skip" for anything else from outside the layer - a residual or a
downsample branch reading the block's input, a model input read again, a constant - which the
compiler treats as a skip path and does not reshard.

Parameters are counted where first used; a weight reused by a later layer (tied embedding and LM
head) becomes that layer's `tied_to` / `tied_op`, as in the zoo.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field, replace

from ..ir import Layer, Model, Module, Op, OpKind
from .builder import GraphBuilder, ModuleInfo, OpRecord
from .naming import fresh
from .tensor import INPUT


@dataclass
class _Group:
    block: str | None
    records: list[int] = field(default_factory=list)
    host: str = ""
    name: str = ""


def block_paths(modules: Mapping[str, ModuleInfo], forced: Callable[[str], bool] | None = None) -> set[str]:
    """Paths of the modules that become one Layer each (see the module docstring)."""
    out: set[str] = set()

    def container_of_modules(info: ModuleInfo) -> bool:
        return info.container and any(c in modules and not modules[c].leaf for c in info.children)

    def walk(path: str) -> None:
        info = modules.get(path)
        if info is None:
            return
        for c in info.children:
            ci = modules.get(c)
            if ci is None:
                continue
            if (forced is not None and forced(c)) or (info.container and not ci.leaf and not container_of_modules(ci)):
                out.add(c)
            else:
                walk(c)

    walk("")
    return out


def _group(records: list[OpRecord], blocks: set[str]) -> list[_Group]:
    groups: list[_Group] = []
    for i, r in enumerate(records):
        key = next((p for p in r.scope if p in blocks), None)
        last = groups[-1] if groups else None
        if last is None or last.block != key or (key is None and records[last.records[-1]].ends_stage):
            groups.append(_Group(key))
        groups[-1].records.append(i)
    return groups


def _host(group: _Group, records: list[OpRecord], modules: Mapping[str, ModuleInfo]) -> str:
    if group.block is not None:
        return group.block.rsplit(".", 1)[0] if "." in group.block else ""
    common = list(records[group.records[0]].scope)
    for i in group.records[1:]:
        scope = records[i].scope
        k = 0
        while k < min(len(common), len(scope)) and common[k] == scope[k]:
            k += 1
        common = common[:k]
    while common and (modules.get(common[-1]) is None or modules[common[-1]].leaf):
        common.pop()
    return common[-1] if common else ""


def _name_groups(groups: list[_Group]) -> None:
    root_runs = 0
    per_host: dict[str, int] = {}
    taken: list[str] = []
    for gi, g in enumerate(groups):
        if g.block is not None:
            name = g.block
        elif g.host == "":
            root_runs += 1
            first, last = gi == 0, gi == len(groups) - 1
            name = "body" if first and last else "stem" if first else "head" if last else f"run{root_runs}"
        else:
            per_host[g.host] = per_host.get(g.host, 0) + 1
            name = f"{g.host}.block{per_host[g.host]}"
        g.name = fresh(name, taken)
        taken.append(g.name)


def _op_names(group: _Group, records: list[OpRecord]) -> dict[int, str]:
    prefix = group.block or group.host
    out: dict[int, str] = {}
    used: set[str] = set()
    for i in group.records:
        r = records[i]
        base = r.base
        if r.module_op and prefix and base.startswith(prefix + "."):
            base = base[len(prefix) + 1:]
        elif r.module_op and base == prefix:
            base = base.rsplit(".", 1)[-1]
        name, k = base, 0
        while name in used:
            k += 1
            name = f"{base}_{k}"
        used.add(name)
        out[i] = name
    return out


def _input_from(group: _Group, gi: int, groups: list[_Group], records: list[OpRecord],
                names: dict[int, str]) -> dict[int, tuple[str | None, ...]]:
    pos = {ri: j for j, ri in enumerate(group.records)}
    prev_last = groups[gi - 1].records[-1] if gi > 0 else None
    out: dict[int, tuple[str | None, ...]] = {}
    for j, ri in enumerate(group.records):
        frm: list[str | None] = []
        for src in records[ri].sources:
            if src >= 0 and src in pos:
                frm.append(None if pos[src] == j - 1 else names[src])
            elif src >= 0:
                frm.append(None if j == 0 and src == prev_last else "@skip")
            elif src == INPUT:
                frm.append(None if j == 0 and gi == 0 else "@skip")
            else:
                frm.append("@skip")
        out[ri] = tuple(frm) if any(f is not None for f in frm) else ()
    return out


def _layer_kind(ops: list[Op]) -> str:
    kinds = {op.kind for op in ops}
    if OpKind.ATTENTION in kinds or OpKind.BMM in kinds:
        return "transformer"
    if OpKind.LOSS in kinds:
        return "head"
    if ops[0].kind == OpKind.EMBEDDING:
        return "embedding"
    if OpKind.CONV in kinds or OpKind.POOL in kinds:
        return "conv"
    return "mlp"


def _tree(name: str, layers: list[tuple[Layer, str]]) -> Module:
    """Nest the layers under Modules named by path, in execution order."""
    root = Module(name)
    stack: list[tuple[str, Module]] = [("", root)]
    for layer, host in layers:
        parts = host.split(".") if host else []
        chain = [""] + [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
        k = 0
        while k < min(len(stack), len(chain)) and stack[k][0] == chain[k]:
            k += 1
        del stack[k:]
        for path in chain[k:]:
            m = Module(path)
            stack[-1][1].children.append(m)
            stack.append((path, m))
        stack[-1][1].children.append(layer)
    return root


def assemble(builder: GraphBuilder, name: str, modules: Mapping[str, ModuleInfo], *,
             blocks: Callable[[str], bool] | None = None, family: str | None = None, description: str = "",
             total_params: int | None = None) -> Model:
    """The Model for the builder's records (see the module docstring for the rules)."""
    records = builder.records
    groups = _group(records, block_paths(modules, blocks))
    for g in groups:
        g.host = _host(g, records, modules)
    _name_groups(groups)
    counted: set[Hashable] = set()
    owner: dict[Hashable, str] = {}
    notes: list[str] = []
    layers: list[tuple[Layer, str]] = []
    for gi, g in enumerate(groups):
        names = _op_names(g, records)
        sources = _input_from(g, gi, groups, records, names)
        layer = Layer(g.name, "", [])
        for ri in g.records:
            r = records[ri]
            extra = 0
            for p in r.extras:
                if p.key not in counted:
                    counted.add(p.key)
                    extra += p.numel
            op = replace(r.op, name=names[ri], input_from=sources[ri], extra_params=extra)
            if r.weight is not None:
                key = r.weight.key
                if key not in owner:
                    owner[key] = g.name
                    counted.add(key)
                elif owner[key] != g.name and layer.tied_to is None:
                    layer.tied_to, layer.tied_op = owner[key], op.name
                else:
                    notes.append(f"weight {r.weight.name or op.name} is reused by {g.name}.{op.name} and counted again")
            layer.ops.append(op)
        layer.kind = _layer_kind(layer.ops)
        layers.append((layer, g.host))
    model = Model(name, family or _family(records), _tree(name, layers), batch_dim=builder.batch_dim,
                  seq_len=_seq_len(records), description=description, hyper=_hyper(records, groups))
    if total_params is not None and model.params != total_params:
        notes.append(f"{total_params - model.params:+,} parameters of the module are not used by forward "
                     "(not simulated)")
    model.assumptions = tuple(notes)
    return model


def _seq_len(records: list[OpRecord]) -> int | None:
    for r in records:
        if r.op.kind == OpKind.EMBEDDING and r.sources and r.sources[0] == INPUT and len(r.op.inputs[0]) >= 2:
            return r.op.dims[r.op.inputs[0][1]]
    return None


def _family(records: list[OpRecord]) -> str:
    kinds = {r.op.kind for r in records}
    if OpKind.CONV in kinds:
        return "cnn"
    attn = [r.op for r in records if r.op.kind == OpKind.ATTENTION]
    if attn:
        return "gpt" if attn[0].causal else "bert"
    return "mlp"


def _hyper(records: list[OpRecord], groups: list[_Group]) -> dict[str, int | float | str]:
    hyper: dict[str, int | float | str] = {"layers": sum(1 for g in groups if g.block is not None)}
    attn = next((r.op for r in records if r.op.kind == OpKind.ATTENTION), None)
    if attn is not None:
        hyper.update(heads=attn.dims["a"], kv_heads=attn.dims["g"], head_dim=attn.dims["d"])
    return hyper


def forced_blocks(spec: tuple[type | str, ...], type_of: Mapping[str, type]) -> Callable[[str], bool] | None:
    """Predicate for `blocks=`: module classes, or fnmatch patterns over module paths ("encoder.*")."""
    if not spec:
        return None
    from fnmatch import fnmatchcase

    types = tuple(s for s in spec if isinstance(s, type))
    globs = [s for s in spec if isinstance(s, str)]

    def pred(path: str) -> bool:
        t = type_of.get(path)
        return (t is not None and bool(types) and issubclass(t, types)) or any(fnmatchcase(path, g) for g in globs)

    return pred
