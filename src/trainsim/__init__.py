"""trainsim: predict distributed deep-learning training performance before paying for the GPUs."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def simulate(*args: Any, **kwargs: Any) -> Any:
    """Predict one training iteration; see trainsim.api.simulate (imported lazily: no import side effects)."""
    from .api import simulate as _simulate

    return _simulate(*args, **kwargs)


def simulate_tree(*args: Any, **kwargs: Any) -> Any:
    """Simulate a strategy tree written with the primitives; see trainsim.api.simulate_tree (lazy import)."""
    from .api import simulate_tree as _simulate_tree

    return _simulate_tree(*args, **kwargs)


_LAZY = {"StrategyTree": "trainsim.strategy.tree", "DeviceMesh": "trainsim.strategy.mesh"}


def __getattr__(name: str) -> Any:
    """`trainsim.StrategyTree` / `trainsim.DeviceMesh` / `trainsim.nn`, imported on first use (importing
    trainsim stays cheap)."""
    import importlib

    if name == "nn":
        return importlib.import_module(".nn", __name__)
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'trainsim' has no attribute '{name}'")


__all__ = ["DeviceMesh", "StrategyTree", "simulate", "simulate_tree", "__version__"]
