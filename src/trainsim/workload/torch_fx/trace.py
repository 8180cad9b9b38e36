"""torch.fx front end: symbolic trace, then one walk over the graph that runs each node on fake
tensors (ShapeProp: PyTorch's shapes, no memory, no GPU) and records it (torch_fx.nodes) right away.

Modules handled by a caller's `handlers` are leaves fx does not trace into and may not even run on
fake tensors (data-dependent control flow), so they are recorded first and handed fake outputs of the
recorded shapes.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

import torch
import torch.fx
from torch.fx.passes.shape_prop import ShapeProp

from ...errors import ConfigError
from ..ir import Model
from ..record import GraphBuilder, ModuleInfo, SymTensor, ops
from ..record.grouping import forced_blocks
from .modules import MODULES
from .nodes import Handler, NodeRecorder

_CONTAINERS = (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict)


class _Tracer(torch.fx.Tracer):
    """Leaves: every class with a handler; containers are traced through; other torch.nn modules are
    leaves only when they have no submodules (so composite ones are traced through)."""

    def __init__(self, leaf_types: tuple[type, ...]) -> None:
        super().__init__()
        self.leaf_types = leaf_types

    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        if isinstance(m, self.leaf_types):
            return True
        if isinstance(m, _CONTAINERS):
            return False
        return super().is_leaf_module(m, module_qualified_name) and next(m.children(), None) is None


def _dim_resolver(dim_names: Mapping[str, str] | None) -> Callable[[str], str | None]:
    items = list((dim_names or {}).items())

    def resolve(path: str) -> str | None:
        last = path.rsplit(".", 1)[-1]
        for key, name in items:
            if key in (path, last) or fnmatchcase(path, key):
                return name
        return None

    return resolve


def _symbolic(module: torch.nn.Module, tracer: _Tracer, concrete: dict[str, Any]) -> torch.fx.GraphModule:
    try:
        graph = tracer.trace(module, concrete_args=concrete or None)
    except Exception as exc:  # torch.fx raises many types (TraceError, TypeError, NotImplementedError ...)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"torch_fx.{type(module).__name__}", f"torch.fx cannot trace it ({first})",
                          "register the untraceable submodule as a leaf module: trace_module(..., handlers="
                          "{ItsClass: fn}) with fn recording its ops via trainsim.workload.record.ops") from None
    return torch.fx.GraphModule(tracer.root, graph, type(module).__name__)


@dataclass(frozen=True)
class _Spec:
    """An example input: shape and dtype."""

    shape: tuple[int, ...]
    dtype: torch.dtype


def _arguments(module: torch.nn.Module, example: Sequence[int] | Mapping[str, Sequence[int]]
               ) -> tuple[dict[str, tuple[int, ...]], dict[str, Any]]:
    """Shapes of the traced arguments and the defaults the others keep (fx concrete_args)."""
    params = [p for p in inspect.signature(module.forward).parameters.values()
              if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    if isinstance(example, Mapping):
        shapes = {str(k): tuple(int(d) for d in v) for k, v in example.items()}
    elif params:
        shapes = {params[0].name: tuple(int(d) for d in example)}
    else:
        raise ConfigError("torch_fx.example_input_shape", "forward takes no arguments", "trace a module whose forward "
                          "takes the input")
    known = {p.name for p in params}
    unknown = [k for k in shapes if k not in known]
    concrete = {p.name: p.default for p in params if p.name not in shapes and p.default is not inspect.Parameter.empty}
    missing = [p.name for p in params if p.name not in shapes and p.name not in concrete]
    if unknown or missing:
        problem = f"forward has no argument {unknown[0]}" if unknown else f"no shape for forward argument {missing[0]}"
        raise ConfigError("torch_fx.example_input_shape", problem,
                          f"pass {{argument: shape}} for forward's arguments ({', '.join(p.name for p in params)})")
    return shapes, concrete


class _Walk(ShapeProp):
    """ShapeProp that records every node as soon as PyTorch has computed its shapes."""

    def __init__(self, gm: torch.fx.GraphModule, fake: Any, recorder: NodeRecorder, opaque: frozenset[str],
                 device: torch.device) -> None:
        super().__init__(gm, fake_mode=fake)
        self.extra_traceback = False  # keep the one-line errors one line
        self.recorder, self.opaque, self.fake, self.device = recorder, opaque, fake, device
        self.current: torch.fx.Node | None = None

    def run_node(self, n: torch.fx.Node) -> Any:
        self.current = n
        if n.op == "call_module" and str(n.target) in self.opaque:
            return self._fake(self.recorder.record(n))
        result = super().run_node(n)
        self.recorder.record(n)
        return result

    def _fake(self, value: Any) -> Any:
        if isinstance(value, SymTensor):
            with self.fake:
                return torch.empty(value.shape, device=self.device)
        if isinstance(value, (tuple, list)):
            return type(value)(self._fake(v) for v in value)
        return value


def _walk(gm: torch.fx.GraphModule, inputs: list[Any], device: torch.device, recorder: NodeRecorder,
          opaque: frozenset[str]) -> None:
    """Run the walk on fake inputs (_Spec entries become tensors, others are passed as they are)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    fake = FakeTensorMode(allow_non_fake_inputs=True)
    with fake:
        args = [torch.empty(v.shape, dtype=v.dtype, device=device) if isinstance(v, _Spec) else v for v in inputs]
    log = logging.getLogger("torch._subclasses.fake_tensor")
    level = log.level
    log.setLevel(logging.CRITICAL)  # a failure is reported below, in one line
    walk = _Walk(gm, fake, recorder, opaque, device)
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # ShapeProp prints the traceback it re-raises
            walk.propagate(*args)
    except ConfigError:
        raise
    except Exception as exc:
        cause: BaseException = exc
        while cause.__cause__ is not None:
            cause = cause.__cause__
        first = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        at = f" at node {walk.current.name}" if walk.current is not None else ""
        raise ConfigError("torch_fx.example_input_shape", f"PyTorch rejects the example input{at} ({first})",
                          "pass the shape(s) forward expects, batch first, or input_dtypes={argument: dtype}") from None
    finally:
        log.setLevel(level)


_VIEWS = frozenset({"view", "reshape", "flatten", "contiguous", "squeeze", "unsqueeze", "to", "long"})


def _index_use(node: torch.fx.Node, gm: torch.fx.GraphModule, arg: int) -> bool:
    """Does the tensor (through views) feed an Embedding or the targets of a cross-entropy?"""
    for user in node.users:
        if user.op == "call_method" and user.target in _VIEWS and user.args and user.args[0] is node:
            if _index_use(user, gm, 0):
                return True
            continue
        pos = next((i for i, a in enumerate(user.args) if a is node), -1)
        if user.op == "call_module":
            m = gm.get_submodule(str(user.target))
            lookup, loss = isinstance(m, torch.nn.Embedding), isinstance(m, torch.nn.CrossEntropyLoss)
        elif user.op == "call_function":
            lookup = user.target is torch.nn.functional.embedding
            loss = user.target in (torch.nn.functional.cross_entropy, torch.nn.functional.nll_loss)
        else:
            continue
        if (lookup and pos == 0) or (loss and pos == 1):
            return True
    return False


def _input_dtype(node: torch.fx.Node, gm: torch.fx.GraphModule) -> torch.dtype:
    """long for token ids and targets (read by an Embedding or a cross-entropy), else float32."""
    return torch.long if _index_use(node, gm, 0) else torch.float32


def trace_module(module: torch.nn.Module, example_input_shape: Sequence[int] | Mapping[str, Sequence[int]], *,
                 batch_dim: str | None = None, name: str | None = None, loss: bool = True,
                 dim_names: Mapping[str, str] | None = None, handlers: Mapping[type, Handler] | None = None,
                 blocks: Iterable[type | str] = (), input_dtypes: Mapping[str, torch.dtype] | None = None,
                 family: str | None = None) -> Model:
    """Trace a torch.nn.Module into the IR.

    `example_input_shape`: the shape of forward's first argument, or {argument: shape}; other
    arguments with defaults keep them. `batch_dim`: default "n" for 4-D inputs, else "b". `loss`:
    append a cross-entropy over the output's last dim when forward returns logits. `dim_names`:
    {module path, pattern or attribute name: output-feature dim name}, e.g. {"qkv": "q", "fc1": "f",
    "lm_head": "v"} (default: the attribute name, record.naming; embeddings: "h"). `handlers`:
    {module class: fn(ctx, module, *inputs) -> SymTensor} for classes fx should not trace into (they
    become leaves). `blocks`: extra module classes or path patterns that become one Layer each.
    `input_dtypes`: {argument: torch dtype} (default: long when an Embedding reads it, else float32).
    """
    table: dict[type, Handler] = {**MODULES, **(handlers or {})}
    tracer = _Tracer(tuple(table))
    shapes, concrete = _arguments(module, example_input_shape)
    gm = _symbolic(module, tracer, concrete)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    names = list(shapes) + list(concrete)
    order = [p for p in inspect.signature(module.forward).parameters if p in names]
    arg_of = dict(zip(placeholders, order, strict=True)) if len(order) == len(placeholders) else {
        n: str(n.target) for n in placeholders}
    dtypes = {a: (input_dtypes or {}).get(a) or _input_dtype(n, gm) for n, a in arg_of.items() if a in shapes}
    device = next((p.device for p in module.parameters()), torch.device("meta"))
    first_shape = next(iter(shapes.values()))
    resolve = _dim_resolver(dim_names)
    builder = GraphBuilder(batch_dim or ("n" if len(first_shape) == 4 else "b"), resolve)
    inputs = {n: builder.input(shapes[a]) if a in shapes else concrete.get(a) for n, a in arg_of.items()}
    recorder = NodeRecorder(builder, gm, table, resolve, inputs)
    opaque = frozenset(str(n.target) for n in gm.graph.nodes if n.op == "call_module"
                       and isinstance(gm.get_submodule(str(n.target)), tuple(handlers or ())))
    _walk(gm, [_Spec(shapes[a], dtypes[a]) if a in shapes else concrete.get(a) for a in arg_of.values()], device,
          recorder, opaque)
    out = recorder.output()
    if loss and out is not None and out.source >= 0 and builder.op_kind_of(out) != "loss":
        with builder.at(()):
            ops.cross_entropy(builder, out)
    type_of = {p: type(m) for p, m in module.named_modules()}
    return builder.build(name or type(module).__name__.lower(), _module_infos(module, tracer),
                         blocks=forced_blocks(tuple(blocks), type_of), family=family,
                         description=f"{type(module).__name__} traced with torch.fx",
                         total_params=sum(p.numel() for p in module.parameters()))


def _module_infos(module: torch.nn.Module, tracer: _Tracer) -> dict[str, ModuleInfo]:
    out: dict[str, ModuleInfo] = {}
    for path, m in module.named_modules():
        kids = tuple(f"{path}.{n}" if path else n for n, _ in m.named_children())
        out[path] = ModuleInfo(leaf=tracer.is_leaf_module(m, path) if path else False,
                               container=isinstance(m, _CONTAINERS), children=kids)
    return out
