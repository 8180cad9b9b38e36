"""Max-min fair bandwidth sharing among concurrent flows (progressive filling / water-filling).

Proteus (section VI-C) lets concurrent communication fairly share each physical link (NIC,
NVLink/NVSwitch, PCIe switch, CPU socket link, its Fig. 7 hierarchy). Here a flow f runs at a rate
x_f in (0, 1], the fraction of its stand-alone speed, and puts an intensity u_{f,r} on resource r:
its work seconds on r alone / its stand-alone bandwidth seconds (1 on its own bottleneck). Every
resource has capacity 1: sum_f u_{f,r} x_f <= 1. Progressive filling raises all unfrozen rates
together; when a resource saturates, the flows crossing it freeze at that level; flows that never
meet a saturated resource stop at 1. The result is the max-min fair allocation: no rate can rise
without lowering an equal or smaller one (Bertsekas & Gallager, Data Networks, section 6.5.2).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

Intensities = Sequence[tuple[int, float]]
"""A flow's (resource id, intensity u) pairs."""

_EPS = 1e-12


def max_min_rates(flows: Iterable[int], intensity: Sequence[Intensities | None]) -> dict[int, float]:
    """Max-min fair rates of `flows` (ids into `intensity`), each in (0, 1].

    O(flows x resources per flow) per filling level; the levels are few (one per distinct bottleneck).
    """
    unfrozen = list(flows)
    rates: dict[int, float] = {}
    frozen_load: dict[int, float] = {}
    while unfrozen:
        load: dict[int, float] = {}
        for f in unfrozen:
            for r, u in intensity[f] or ():
                load[r] = load.get(r, 0.0) + u
        level = 1.0
        for r, s in load.items():
            if s > 0:
                lam = (1.0 - frozen_load.get(r, 0.0)) / s
                if lam < level:
                    level = lam
        if level >= 1.0:
            for f in unfrozen:
                rates[f] = 1.0
            break
        level = max(level, _EPS)
        cut = level * (1.0 + 1e-9) + _EPS
        saturated = {r for r, s in load.items() if s > 0 and (1.0 - frozen_load.get(r, 0.0)) / s <= cut}
        rest = []
        for f in unfrozen:
            us = intensity[f] or ()
            if any(r in saturated for r, _ in us):
                rates[f] = level
                for r, u in us:
                    frozen_load[r] = frozen_load.get(r, 0.0) + u * level
            else:
                rest.append(f)
        unfrozen = rest
    return rates


def resource_loads(rates: dict[int, float], intensity: Sequence[Intensities | None]) -> dict[int, float]:
    """sum_f u_{f,r} x_f per resource (<= 1 for a feasible allocation)."""
    out: dict[int, float] = {}
    for f, x in rates.items():
        for r, u in intensity[f] or ():
            out[r] = out.get(r, 0.0) + u * x
    return out
