"""Recording one torch.fx node: its value is a SymTensor for tensors (or a tuple of them) and a plain
Python value for sizes and other non-tensors (evaluated on the spot: `B, T, C = x.size()`).

call_module nodes run the handler for the module's class (torch_fx.modules, or the caller's
`handlers`), call_function / call_method nodes the handler for the function (torch_fx.functions).
The shapes PyTorch computed for the node (ShapeProp) size every view and check every recorded op.
A node nothing maps gets a one-line ConfigError naming it and the fix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
from torch.fx.passes.shape_prop import TensorMetadata

from ...errors import ConfigError
from ..record import GraphBuilder, ParamRef, SymTensor
from .functions import CONSTANT_FUNCTIONS, FUNCTIONS, METHODS

_PURE = frozenset({"_operator", "operator", "builtins", "math"})  # functions evaluated on concrete values

Handler = Callable[..., Any]


@dataclass
class FxContext:
    """What a handler gets: the recorder, the node, the module path and the helpers to reach
    parameters, PyTorch's shapes and the out-feature names (`dim_names`)."""

    builder: GraphBuilder
    node: torch.fx.Node
    path: str
    resolve_dim: Callable[[str], str | None]

    def ref(self, param: torch.Tensor | None) -> ParamRef | None:
        if param is None:
            return None
        return ParamRef(id(param), tuple(int(s) for s in param.shape), self.path)

    def out_dim(self, default: str | None) -> str | None:
        """The `dim_names` override for this module, else `default` (None: the recorder's default)."""
        return self.resolve_dim(self.path) or default

    def shapes(self) -> list[tuple[int, ...]]:
        """PyTorch's output shape(s) of this node (ShapeProp)."""
        meta = self.node.meta.get("tensor_meta")
        metas = [meta] if isinstance(meta, TensorMetadata) or not isinstance(meta, (tuple, list)) else meta
        return [tuple(int(s) for s in m.shape) for m in metas if hasattr(m, "shape")]

    def reduced(self, loss: SymTensor) -> SymTensor:
        """The per-token loss as PyTorch returns it: reduced (mean / sum, free) when it returns a scalar."""
        return loss.like((), ()) if self.shapes() == [()] else loss

    def shape(self) -> tuple[int, ...]:
        shapes = self.shapes()
        if len(shapes) != 1:
            raise ConfigError(f"torch_fx.{self.node.name}", "PyTorch computed no single tensor shape for this node",
                              "make forward return tensors from it")
        return shapes[0]


def _lookup(table: Mapping[type, Handler], m: torch.nn.Module) -> Handler | None:
    for t in type(m).__mro__:
        if t in table:
            return table[t]
    return None


def _scope(node: torch.fx.Node) -> tuple[str, ...]:
    stack = node.meta.get("nn_module_stack")
    if stack:
        return tuple(str(v[0]) for v in stack.values())
    if node.op == "call_module":
        parts = str(node.target).split(".")
        return tuple(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return ()


def _has_tensor(values: Iterable[Any]) -> bool:
    for v in values:
        if isinstance(v, SymTensor):
            return True
        if isinstance(v, (tuple, list)) and _has_tensor(v):
            return True
        if isinstance(v, dict) and _has_tensor(v.values()):
            return True
    return False


def _first_tensor(value: Any) -> SymTensor | None:
    if isinstance(value, SymTensor):
        return value
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        for v in value:
            t = _first_tensor(v)
            if t is not None:
                return t
    return None


def _unsupported(node: torch.fx.Node, what: str, fix: str) -> ConfigError:
    where = [p for p in _scope(node) if p != str(node.target)]
    inside = f" in {where[-1]}" if where else ""
    return ConfigError(f"torch_fx.{node.name}", f"unsupported {what}{inside}", fix)


def _check(node: torch.fx.Node, value: Any, ctx: FxContext) -> None:
    got = [value] if isinstance(value, SymTensor) else [v for v in value if isinstance(v, SymTensor)] \
        if isinstance(value, (tuple, list)) else []
    want = ctx.shapes()
    if got and want and [t.shape for t in got] != want:
        raise ConfigError(f"torch_fx.{node.name}", f"recorded shape {[t.shape for t in got]} but PyTorch computes {want}",
                          "report it: the mapping of this operation is wrong")


def _call_module(ctx: FxContext, gm: torch.fx.GraphModule, table: Mapping[type, Handler], args: tuple, kwargs: dict) -> Any:
    m = gm.get_submodule(ctx.path)
    handler = _lookup(table, m)
    if handler is None:
        name = type(m).__name__
        raise _unsupported(ctx.node, f"module {ctx.path} ({name})",
                           f"register it as a leaf module: trace_module(..., handlers={{{name}: fn}}) with fn(ctx, module, "
                           "*inputs) recording its ops via trainsim.workload.record.ops")
    return handler(ctx, m, *args, **kwargs)


def _call_function(ctx: FxContext, args: tuple, kwargs: dict) -> Any:
    node = ctx.node
    target = node.target
    if node.op == "call_function":
        if target in CONSTANT_FUNCTIONS:
            return ctx.builder.const(ctx.shape())
        pure = target is getattr or getattr(target, "__module__", None) in _PURE
        if pure and not _has_tensor((*args, *kwargs.values())):
            return target(*args, **kwargs)
        handler = FUNCTIONS.get(target)
        label = getattr(target, "__name__", str(target))
    else:
        if args and not isinstance(args[0], SymTensor):
            return getattr(args[0], str(target))(*args[1:], **kwargs)
        handler = METHODS.get(str(target))
        label = f"Tensor.{target}"
    if handler is None:
        raise _unsupported(node, f"{node.op.replace('_', ' ')} '{label}'",
                           "rewrite it with supported operations (torch_fx.functions) or move it into a submodule "
                           "registered as a leaf with trace_module(..., handlers={TheClass: fn})")
    return handler(ctx, *args, **kwargs)


def _attr(builder: GraphBuilder, gm: torch.fx.GraphModule, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    if isinstance(obj, torch.nn.Parameter):
        return builder.param(ParamRef(id(obj), tuple(int(s) for s in obj.shape), target))
    if isinstance(obj, torch.Tensor):
        return builder.const(tuple(int(s) for s in obj.shape))
    return obj


class NodeRecorder:
    """Records the graph's nodes one at a time, in order, keeping each node's value."""

    def __init__(self, builder: GraphBuilder, gm: torch.fx.GraphModule, table: Mapping[type, Handler],
                 resolve_dim: Callable[[str], str | None], inputs: Mapping[torch.fx.Node, Any]) -> None:
        self.builder, self.gm, self.table, self.resolve_dim = builder, gm, table, resolve_dim
        self.inputs = inputs
        self.env: dict[torch.fx.Node, Any] = {}
        self.result: Any = None

    def record(self, node: torch.fx.Node) -> Any:
        """The node's value (recording its ops on the way)."""
        args = torch.fx.node.map_arg(node.args, lambda n: self.env[n])
        kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: self.env[n])
        path = str(node.target) if node.op == "call_module" else ""
        ctx = FxContext(self.builder, node, path, self.resolve_dim)
        if node.op == "placeholder":
            value: Any = self.inputs[node]
        elif node.op == "get_attr":
            value = _attr(self.builder, self.gm, str(node.target))
        elif node.op == "output":
            self.result = args[0]
            value = None
        else:
            with self.builder.at(_scope(node), path or None):
                if node.op == "call_module":
                    value = _call_module(ctx, self.gm, self.table, args, kwargs)
                else:
                    value = _call_function(ctx, args, kwargs)
            _check(node, value, ctx)
        self.env[node] = value
        return value

    def output(self) -> SymTensor | None:
        """The first tensor forward returned."""
        return _first_tensor(self.result)
