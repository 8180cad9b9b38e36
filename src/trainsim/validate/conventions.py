"""FLOP-counting conventions of published training results, so predictions are compared in the
source's own terms (see shared/validation/README.md, "FLOP conventions").

Each returns FLOPs for one iteration of `global_batch` sequences.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPTShape:
    """What the published FLOP formulas need to know about a GPT-style model."""

    layers: int
    hidden: int
    seq_len: int
    vocab: int
    params: float  # total parameters N (as the source counts them)
    non_embedding_params: float


def narayanan_eq3(m: GPTShape, batch: int) -> float:
    """Megatron SC'21 eq. 3: includes the recompute forward (full activation recomputation)."""
    b, s, lay, h, v = batch, m.seq_len, m.layers, m.hidden, m.vocab
    return 96.0 * b * s * lay * h * h * (1 + s / (6 * h) + v / (16 * lay * h))


def korthikanti_model(m: GPTShape, batch: int) -> float:
    """Model FLOPs without recompute: 72 B s L h^2 (1 + s/6h + V/12hL) (Korthikanti et al. 2022)."""
    b, s, lay, h, v = batch, m.seq_len, m.layers, m.hidden, m.vocab
    return 72.0 * b * s * lay * h * h * (1 + s / (6 * h) + v / (12 * h * lay))


def six_n_plus_attention(m: GPTShape, batch: int, non_embedding: bool = False) -> float:
    """(6N + 12 L h s) per token: PaLM / llm-foundry / torchtitan style model FLOPs."""
    n = m.non_embedding_params if non_embedding else m.params
    return (6.0 * n + 12.0 * m.layers * m.hidden * m.seq_len) * m.seq_len * batch


def convention_of(text: str) -> str | None:
    """Map a `flops_convention` cell to a formula key; None when the source states none."""
    t = text.lower()
    if not t.strip():
        return None
    if "narayanan" in t or "eq.3" in t or "eq. 3" in t:
        return "narayanan_eq3"
    if "llm-foundry" in t:
        return "llmfoundry"
    if "torchtitan" in t:
        return "torchtitan"
    if "num_floating_point_operations" in t or "72bslh" in t.replace(" ", "").replace("*", "").replace("^", ""):
        return "megatron_model"
    if "model flops" in t or "palm" in t or "chowdhery" in t:
        return "palm"
    return "unknown"


def iteration_flops(key: str, m: GPTShape, batch: int, checkpointing: bool, hardware: bool = False) -> float:
    """FLOPs one iteration counts under convention `key` (hardware=True: the source's HFU variant)."""
    if key == "narayanan_eq3":
        return narayanan_eq3(m, batch)
    if key == "megatron_model":
        return korthikanti_model(m, batch)
    if key == "llmfoundry":
        f = six_n_plus_attention(m, batch)
        return f * 4.0 / 3.0 if hardware and checkpointing else f
    if key == "torchtitan":
        return six_n_plus_attention(m, batch, non_embedding=True)
    if key == "palm":
        return six_n_plus_attention(m, batch)
    raise KeyError(key)
