"""ASTRA-sim's multi-dimensional topology notation <-> trainsim's interconnect levels.

`Ring(4)_FC(2)_Switch(8)` stacks building blocks innermost first, one per dimension (ASTRA-sim 2.0,
section IV-A): `Ring(k)`, `FullyConnected(k)` (also `FC(k)`) and `Switch(k)`. Each dimension gets its
own bandwidth (GB/s per NPU, one direction) and latency (ns per hop), given as comma lists in the same
order, as ASTRA-sim's network configs take them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from .cluster import Level

_BLOCKS = {"ring": "ring", "fc": "fc", "fullyconnected": "fc", "switch": "switch"}
_NAMES = {"ring": "Ring", "fc": "FC", "switch": "Switch"}
_DIM = re.compile(r"^([A-Za-z]+)\((\d+)\)$")


def parse_topology(spec: str, bandwidths_gbps: Sequence[float], latencies_ns: Sequence[float]) -> tuple[Level, ...]:
    """Levels of a topology string; ValueError naming the bad part and the fix on any mistake."""
    parts = [p.strip() for p in spec.strip().split("_")] if spec.strip() else []
    if not parts:
        raise ValueError("topology is empty: give dimensions like 'Ring(4)_FC(2)_Switch(8)'")
    kinds, sizes = [], []
    for i, part in enumerate(parts):
        m = _DIM.match(part)
        kind = _BLOCKS.get(m.group(1).lower()) if m else None
        if m is None or kind is None:
            raise ValueError(f"topology dimension {i + 1} '{part}' is not Ring(k), FC(k), FullyConnected(k) or "
                             f"Switch(k): write e.g. 'Ring(4)_FC(2)_Switch(8)'")
        size = int(m.group(2))
        if size < 2:
            raise ValueError(f"topology dimension {i + 1} '{part}' has {size} NPUs: a dimension needs at least 2")
        kinds.append(kind)
        sizes.append(size)
    for what, values in (("bandwidth", bandwidths_gbps), ("latency", latencies_ns)):
        if len(values) != len(parts):
            raise ValueError(f"{what} has {len(values)} value(s) for {len(parts)} topology dimension(s): give one "
                             f"per dimension, innermost first")
    levels = []
    for i, (kind, size, bw, lat) in enumerate(zip(kinds, sizes, bandwidths_gbps, latencies_ns, strict=True)):
        if not bw > 0:
            raise ValueError(f"bandwidth of dimension {i + 1} is {bw}: give a positive GB/s value")
        if not lat >= 0:
            raise ValueError(f"latency of dimension {i + 1} is {lat}: give a latency >= 0 ns")
        levels.append(Level(f"dim{i + 1}", kind, size, float(bw), float(lat) * 1e-9))
    return tuple(levels)


def format_topology(levels: Sequence[Level]) -> str:
    """The ASTRA-sim notation of a level tuple (a shared 'bus' level has no building block there)."""
    out = []
    for lv in levels:
        if lv.kind not in _NAMES:
            raise ValueError(f"level '{lv.name}' is a {lv.kind}: ASTRA-sim's notation has Ring, FC and Switch only")
        out.append(f"{_NAMES[lv.kind]}({lv.size})")
    return "_".join(out)


__all__ = ["format_topology", "parse_topology"]
