"""The tracing context of trainsim.nn: which recorder the running modules and tensors write into."""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING

from ...errors import ConfigError
from ..record import GraphBuilder, ParamRef

if TYPE_CHECKING:
    from .module import Module, Parameter


class TraceContext:
    """One trace: the recorder plus the module and parameter paths of the traced model."""

    def __init__(self, builder: GraphBuilder, root: Module) -> None:
        self.builder = builder
        self.paths = {id(m): p for p, m in root.named_modules()}
        self.param_paths = {id(p): n for n, p in root.named_parameters()}

    def path(self, module: Module) -> str:
        p = self.paths.get(id(module))
        if p is None:
            raise ConfigError(f"trainsim.nn.{type(module).__name__}", "module is not a registered submodule of the "
                              "traced model", "assign it as an attribute or keep it in a ModuleList / Sequential")
        return p

    def ref(self, param: Parameter) -> ParamRef:
        return ParamRef(id(param), param.shape, self.param_paths.get(id(param), ""))


_ACTIVE: ContextVar[TraceContext | None] = ContextVar("trainsim_nn_trace", default=None)


def active(what: str) -> TraceContext:
    """The running trace, or a one-line error saying that `what` only runs under trace()."""
    ctx = _ACTIVE.get()
    if ctx is None:
        raise ConfigError(f"trainsim.nn.{what}", "runs only while tracing (it computes nothing)",
                          "call trainsim.nn.trace(model, input_shape)")
    return ctx
