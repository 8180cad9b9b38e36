"""Trace real torch.nn.Modules into the workload IR with torch.fx (no GPU, no weights needed).

`trace_module(module, example_input_shape)` symbolically traces the module (torch.fx), propagates
shapes with fake tensors, and maps every call_module / call_function / call_method node onto the
same op recorder as trainsim.nn (workload.record), keeping the module nesting. PyTorch is an
optional extra (`pip install 'trainsim[torch]'`); importing this package does not import it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...errors import ConfigError
from ..ir import Model


def trace_module(module: Any, example_input_shape: Sequence[int] | Mapping[str, Sequence[int]], **options: Any) -> Model:
    """Trace `module` (a torch.nn.Module, on any device, meta included) into a Model; see
    trainsim.workload.torch_fx.trace.trace_module for the options."""
    try:
        import torch  # noqa: F401
    except ImportError:
        raise ConfigError("torch_fx", "PyTorch is not installed", "pip install 'trainsim[torch]'") from None
    from .trace import trace_module as _trace

    return _trace(module, example_input_shape, **options)


__all__ = ["trace_module"]
