"""trace(): run a trainsim.nn model's forward on symbolic tensors and return the IR Model."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ...errors import ConfigError
from ..ir import Model
from ..record import GraphBuilder, ModuleInfo, SymTensor, ops
from ..record.grouping import forced_blocks
from .context import _ACTIVE, TraceContext
from .module import CONTAINERS, Module
from .tensor import Tensor

Shape = Sequence[int]


def _first_tensor(out: Any) -> SymTensor | None:
    if isinstance(out, Tensor):
        return out.sym
    if isinstance(out, Mapping):
        out = list(out.values())
    if isinstance(out, (tuple, list)):
        for o in out:
            t = _first_tensor(o)
            if t is not None:
                return t
    return None


def module_infos(root: Module) -> dict[str, ModuleInfo]:
    """Leaf / container / children of every module, by path (what record.grouping reads)."""
    out: dict[str, ModuleInfo] = {}
    for path, m in root.named_modules():
        kids = tuple(f"{path}.{n}" if path else n for n, _ in m.named_children())
        out[path] = ModuleInfo(leaf=m._leaf, container=isinstance(m, CONTAINERS), children=kids)
    return out


def trace(module: Module, inputs: Shape | Mapping[str, Shape], *, batch_dim: str | None = None,
          name: str | None = None, loss: bool = True, blocks: Iterable[type | str] = (),
          input_dims: Sequence[str] | Mapping[str, Sequence[str]] | None = None, family: str | None = None) -> Model:
    """Trace `module` on inputs of the given shape (batch first) and return its IR Model.

    `inputs`: one shape (passed positionally) or {argument: shape} (passed by keyword).
    `batch_dim`: the batch dimension's name; default "n" for 4-D image inputs, else "b" (the zoo's
    CNN and language-model conventions). `loss`: append a softmax cross-entropy over the output's
    last dim when forward returns logits (the zoo's heads end with the loss). `blocks`: extra module
    classes or path patterns to make one Layer each (see record.grouping). `input_dims`: names of
    the inputs' dimensions (default by rank: GraphBuilder.default_names).
    """
    specs: dict[str | None, Shape] = dict(inputs) if isinstance(inputs, Mapping) else {None: inputs}
    if not specs:
        raise ConfigError("trace.inputs", "no input shape given", "pass the input's shape, batch first")
    first = next(iter(specs.values()))
    batch = batch_dim or ("n" if len(first) == 4 else "b")
    builder = GraphBuilder(batch)
    args: list[Tensor] = []
    kwargs: dict[str, Tensor] = {}
    for key, shape in specs.items():
        names = input_dims.get(key or "", None) if isinstance(input_dims, Mapping) else input_dims
        t = Tensor(builder.input(shape, names))
        if key is None:
            args.append(t)
        else:
            kwargs[key] = t
    ctx = TraceContext(builder, module)
    token = _ACTIVE.set(ctx)
    try:
        out = module(*args, **kwargs)
    finally:
        _ACTIVE.reset(token)
    result = _first_tensor(out)
    if loss and result is not None and result.source >= 0 and builder.op_kind_of(result) != "loss":
        with builder.at(()):
            ops.cross_entropy(builder, result)
    type_of = {p: type(m) for p, m in module.named_modules()}
    model_name = name or type(module).__name__.lower()
    return builder.build(model_name, module_infos(module), blocks=forced_blocks(tuple(blocks), type_of),
                         family=family, description=f"{type(module).__name__} traced with trainsim.nn",
                         total_params=sum(p.numel() for p in module.parameters()))
