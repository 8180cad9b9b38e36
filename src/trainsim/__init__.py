"""trainsim: predict distributed deep-learning training performance before paying for the GPUs."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def simulate(*args: Any, **kwargs: Any) -> Any:
    """Predict one training iteration; see trainsim.api.simulate (imported lazily: no import side effects)."""
    from .api import simulate as _simulate

    return _simulate(*args, **kwargs)


__all__ = ["simulate", "__version__"]
