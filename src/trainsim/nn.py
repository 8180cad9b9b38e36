"""`import trainsim.nn as nn`: the torch-free module API of trainsim.workload.nn (see there)."""

from __future__ import annotations

from .workload.nn import *  # noqa: F403
from .workload.nn import __all__  # noqa: F401
