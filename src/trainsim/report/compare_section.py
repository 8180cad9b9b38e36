"""Several simulations side by side: throughput, MFU, where the time goes and peak memory per input, so a
page made from two job files answers "which is better, and why"."""

from __future__ import annotations

from typing import Any

from ..sim.result import BREAKDOWN_KEYS
from .figures import CATEGORY_COLORS, CATEGORY_LABELS, PALETTE, BarPlot, Section, Table
from .simulation_section import GIB


def _breakdown(data: dict[str, Any]) -> dict[str, float]:
    """The iteration's breakdown as simulate reports it."""
    return {k: float((data.get("breakdown") or {}).get(k, 0.0)) for k in BREAKDOWN_KEYS}


def comparison_section(runs: list[tuple[str, dict[str, Any]]]) -> Section:
    """`runs`: (label, simulate JSON) per input, in the order given."""
    labels = [label for label, _ in runs]
    datas = [d for _, d in runs]
    sec = Section(f"{len(runs)} simulations compared", "comparison")
    tput = [float(d.get("tokens_per_s_per_gpu") or d.get("samples_per_s_per_gpu") or 0.0) for d in datas]
    unit = "tokens/s per GPU" if any(d.get("tokens_per_s_per_gpu") for d in datas) else "samples/s per GPU"
    best = max(range(len(runs)), key=lambda i: tput[i])
    sec.cards = [("fastest per GPU", labels[best])]
    if len(runs) == 2 and min(tput) > 0:
        sec.cards.append(("ratio", f"{max(tput) / min(tput):.2f}x"))
    sec.items.append(BarPlot(f"Throughput ({unit})", labels, [(unit, tput, PALETTE[0])], unit, stacked=False,
                             horizontal=True, caption="Per GPU, so jobs on different GPU counts compare on cost."))
    sec.items.append(BarPlot("MFU", labels, [("MFU %", [100 * float(d.get("mfu") or 0) for d in datas],
                                              PALETTE[2])], "MFU (%)", stacked=False, horizontal=True))
    keys = [k for k in BREAKDOWN_KEYS if any(_breakdown(d)[k] > 0 for d in datas)]
    sec.items.append(BarPlot("Where the iteration goes", labels,
                             [(CATEGORY_LABELS.get(k, k), [_breakdown(d)[k] for d in datas],
                               CATEGORY_COLORS.get(k, "#999")) for k in keys], "seconds per iteration",
                             "The slowest stage's iteration split as in each simulation's own section.",
                             horizontal=True))
    cap = [float(d.get("memory_capacity_bytes") or 0) / GIB for d in datas]
    peak = [max(d.get("peak_memory_bytes") or [0.0]) / GIB for d in datas]
    sec.items.append(BarPlot("Peak memory (the fullest stage)", labels,
                             [("peak GiB", peak, CATEGORY_COLORS["memory"]),
                              ("GPU capacity GiB", cap, "#D8D8D8")], "GiB", stacked=False, horizontal=True,
                             caption="The largest peak over stages against the GPU's capacity."))
    cols = ["input", "GPUs", "iteration s", unit, "MFU %", "peak GiB", "verdict", "strategy"]
    rows = []
    for label, d, t in zip(labels, datas, tput, strict=True):
        s = d.get("strategy") or {}
        strat = " ".join(f"{k}{s[k]}" for k in ("tp", "pp", "dp", "cp", "ep", "vpp") if s.get(k))
        rows.append([label, f"{d.get('n_gpus')} {d.get('device', '')}", f"{float(d['iteration_time_s']):.4g}",
                     f"{t:,.1f}", f"{100 * float(d.get('mfu') or 0):.1f}",
                     f"{max(d.get('peak_memory_bytes') or [0.0]) / GIB:.1f}", "OOM" if d.get("oom") else "fits",
                     strat])
    sec.items.append(Table("Side by side", cols, rows))
    return sec
