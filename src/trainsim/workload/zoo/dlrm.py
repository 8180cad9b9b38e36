"""DLRM builder (Naumov et al. 2019), defaulting to the MLPerf Training DLRM on Criteo Terabyte.

Reference config (facebookresearch/dlrm `--max-ind-range=40000000`, MLPerf v0.7-v2.1):
26 sparse features, one lookup per table per sample, embedding dim 128; bottom MLP 13-512-256-128;
pairwise dot interaction of the 27 feature vectors without self-interaction, concatenated with the
dense vector: 128 + C(27, 2) = 479 features; top MLP 479-1024-1024-512-256-1 with a sigmoid + BCE loss.

Dimension names: n batch, r rows of a table, h embedding dim (also the width of the dense vector that
enters the interaction), f/g the 27 interacting features, i interaction output features, c/k linear
layer input/output features.

Every embedding table is its own EMBEDDING op inside one "embeddings" Layer: a model-parallel
(table-wise) strategy places whole ops on devices, a row-wise one splits an op's "r", and data
parallelism splits "n" as for every other layer. One Layer (not 26) keeps the layer list short and
the interaction's all-to-all a single boundary.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import comb

from ..ir import Layer, Model, Module, Op, OpKind, SavedTensor

# MLPerf Criteo-1TB table sizes after hashing indices into 40M buckets (dlrm_s_pytorch.py,
# `--max-ind-range=40000000`); immutable.
CRITEO_1TB_ROWS: tuple[int, ...] = (
    39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951, 2953546, 403346, 10,
    2208, 11938, 155, 4, 976, 14, 39979771, 25641295, 39664984, 585935, 12972, 108, 36,
)
MAX_IND_RANGE = 40_000_000
LOSS_FLOPS_PER_ELEM = 4.0  # sigmoid + binary cross-entropy


def _linear(name: str, n: int, c: int, k: int) -> Op:
    """nn.Linear(c, k) with bias, saving its input for the weight gradient."""
    return Op(name, OpKind.MATMUL, {"n": n, "c": c, "k": k}, (("n", "c"),), ("n", "k"), weight=("k", "c"),
              extra_params=k, flops_per_point=2.0, saved=(SavedTensor("input", ("n", "c")),))


def _relu(name: str, n: int, k: int) -> Op:
    """ReLU keeping a 1-byte mask (its 2-byte output is the next linear's saved input)."""
    return Op(name, OpKind.ELEMENTWISE, {"n": n, "k": k}, (("n", "k"),), ("n", "k"), flops_per_point=1.0,
              saved=(SavedTensor("mask", ("n", "k"), 1.0),))


def _mlp(name: str, n: int, sizes: Sequence[int], last_relu: bool) -> Layer:
    """Linear + ReLU stack over `sizes` (input first); the last ReLU is omitted if not `last_relu`."""
    ops: list[Op] = []
    depth = len(sizes) - 1
    for j in range(depth):
        ops.append(_linear(f"fc{j}", n, sizes[j], sizes[j + 1]))
        if last_relu or j < depth - 1:
            ops.append(_relu(f"relu{j}", n, sizes[j + 1]))
    return Layer(name, "mlp", ops)


def _embeddings(n: int, rows: Sequence[int], dim: int) -> Layer:
    """One gather op per table: no FLOPs, weight ("r", "h"), int64 indices kept for the sparse grad."""
    ops = [Op(f"table{t}", OpKind.EMBEDDING, {"n": n, "r": r, "h": dim}, (("n",),), ("n", "h"),
              weight=("r", "h"), flop_dims=("n", "h"), flops_per_point=0.0,
              saved=(SavedTensor("indices", ("n",), 8.0),))
           for t, r in enumerate(rows)]
    return Layer("embeddings", "embedding", ops)


def _interaction(n: int, features: int, dim: int) -> Layer:
    """Concatenate the feature vectors, T T^T (batched dot products), keep the strict lower triangle.

    The BMM computes the full f x g product, as the reference does before gathering the triangle.
    """
    pairs = comb(features, 2)
    out = dim + pairs
    return Layer("interaction", "interaction", [
        Op("concat", OpKind.ELEMENTWISE, {"n": n, "f": features, "h": dim}, (("n", "h"),) * features,
           ("n", "f", "h"), flops_per_point=0.0),
        Op("dot", OpKind.BMM, {"n": n, "f": features, "g": features, "h": dim}, (("n", "f", "h"),),
           ("n", "f", "g"), flop_dims=("n", "f", "g", "h"), flops_per_point=2.0,
           saved=(SavedTensor("input", ("n", "f", "h")),)),
        Op("tril_cat", OpKind.ELEMENTWISE, {"n": n, "f": features, "g": features, "h": dim, "i": out},
           (("n", "f", "g"), ("n", "h")), ("n", "i"), flop_dims=("n", "i"), flops_per_point=0.0),
    ])


def build_dlrm(batch: int, rows: Sequence[int] = CRITEO_1TB_ROWS, emb_dim: int = 128,
               bottom_mlp: Sequence[int] = (512, 256, 128), top_mlp: Sequence[int] = (1024, 1024, 512, 256, 1),
               dense_features: int = 13, max_rows: int = MAX_IND_RANGE) -> Model:
    """DLRM on `batch` samples; defaults are the MLPerf Criteo-Terabyte model (~24.0B parameters).

    `rows` are capped at `max_rows` (the reference's --max-ind-range hashing). The bottom MLP must end
    at `emb_dim` so the dense vector can interact with the embeddings.
    """
    if not bottom_mlp or bottom_mlp[-1] != emb_dim:
        raise ValueError(f"bottom MLP must end at the embedding dim {emb_dim}, got {tuple(bottom_mlp)}")
    if not top_mlp:
        raise ValueError("top MLP needs at least one layer")
    n = batch
    capped = [min(r, max_rows) for r in rows]
    features = len(capped) + 1
    inter_out = emb_dim + comb(features, 2)
    root = Module("dlrm", [
        _mlp("bottom_mlp", n, (dense_features, *bottom_mlp), last_relu=True),
        _embeddings(n, capped, emb_dim),
        _interaction(n, features, emb_dim),
        Layer("top_mlp", "head", [
            *_mlp("top_mlp", n, (inter_out, *top_mlp), last_relu=False).ops,
            Op("loss", OpKind.LOSS, {"n": n, "k": top_mlp[-1]}, (("n", "k"),), ("n",), flop_dims=("n", "k"),
               flops_per_point=LOSS_FLOPS_PER_ELEM, saved=(SavedTensor("logits", ("n", "k"), 4.0),),
               bwd_flops_factor=1.0),
        ]),
    ])
    return Model("dlrm", "dlrm", root, batch_dim="n", seq_len=None,
                 description="DLRM (Naumov et al. 2019), MLPerf Criteo-Terabyte config: 26 tables x 128, "
                 "bottom 13-512-256-128, dot interaction, top 479-1024-1024-512-256-1",
                 hyper={"tables": len(capped), "emb_dim": emb_dim, "embedding_rows": sum(capped),
                        "dense_features": dense_features, "interaction_features": inter_out,
                        "bottom_mlp": "-".join(map(str, (dense_features, *bottom_mlp))),
                        "top_mlp": "-".join(map(str, (inter_out, *top_mlp)))})
