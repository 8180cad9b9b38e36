"""How frameworks other than Megatron assign transformer layers to pipeline stages (a framework fact the
validation mapping writes into strategy.stage_layers and the row's assumptions, never a fitted number).

nanotron balances compute, not layer counts (huggingface/nanotron, src/nanotron/models/base.py `build_model`
and src/nanotron/trainer.py `_init_model`, "Balance compute across PP blocks"): each model's
`get_block_compute_costs` prices a decoder layer at 4 * heads * d_qkv * hidden + 3 * ffn * hidden (Llama;
d_qkv = hidden / heads, whatever the kv heads) and the LM head (TensorParallelColumnLinear) at vocab *
hidden; every other pipeline block (embedding, final norm, fp32 cast, loss) costs 0. The blocks are walked in
order with the running total; a block goes on the current rank, and the rank advances once the running total
passes total * (rank + 1) / pp. The block that crosses a threshold therefore stays on the earlier rank, and
with a large vocabulary the last rank can hold the LM head alone.
"""

from __future__ import annotations

from itertools import accumulate


def nanotron_layer_cost(hidden: int, heads: int, ffn: int) -> int:
    """nanotron's compute cost of one Llama decoder layer (LlamaForTraining.get_block_compute_costs):
    4 * heads * d_qkv * hidden for the QKV and output projections, 3 * ffn * hidden for the gated MLP."""
    d_qkv = hidden // heads
    return 4 * heads * d_qkv * hidden + 3 * ffn * hidden


def nanotron_stage_layers(layers: int, hidden: int, heads: int, ffn: int, vocab: int, pp: int) -> list[int]:
    """Decoder layers per pipeline rank under nanotron's compute-balanced block assignment (module docstring).

    The pipeline blocks are [embedding, decoder x layers, final norm, lm_head, fp32 cast, loss]; only the
    decoder layers and the LM head (vocab * hidden) cost anything."""
    if pp < 1 or layers < 1:
        raise ValueError(f"need pp >= 1 and layers >= 1, got pp={pp}, layers={layers}")
    layer = nanotron_layer_cost(hidden, heads, ffn)
    costs = [0] + [layer] * layers + [0, vocab * hidden, 0, 0]
    is_layer = [False] + [True] * layers + [False] * 4
    cumulative = list(accumulate(costs))
    total = cumulative[-1]
    counts = [0] * pp
    rank = 0
    for decoder, running in zip(is_layer, cumulative, strict=True):
        if decoder:
            counts[rank] += 1
        # nanotron: `if cumulative_cost > thresholds[target_pp_rank_idx]: target_pp_rank_idx += 1`, with
        # thresholds[r] = total * (r + 1) / pp; compared in integers (running * pp > total * (r + 1)).
        if running * pp > total * (rank + 1) and rank < pp - 1:
            rank += 1
    return counts
