"""PredTOP's stage-latency predictors over StageGraphs, in plain PyTorch.

Every model reads one stage's operator DAG (`StageGraph.x`, `.edges`) and its graph features (`.g`) and
predicts r = log(stage_s / base_stage_s): a learned correction of trainsim's analytical stage time, not the
time itself, so the output layer starts at zero and an untrained model reproduces the analytical time
exactly. The iteration follows the pipeline: `base_iter_s + slots * base_stage_s * (exp(r) - 1)`.

- `dag-transformer`: PredTOP's DAG Transformer (Luo et al.'s DAGRA + DAGPE): self-attention restricted to
  each node's DAG ancestors and descendants (and itself), with a sinusoidal encoding of the node's depth.
- `gcn`: Kipf & Welling's GCN on the symmetric normalised adjacency with self loops (edges both ways).
- `gat`: Velickovic et al.'s GAT: multi-head additive attention over predecessors, successors and self.
- `features`: an MLP on `g` and the mean of `x`, no graph structure (a sanity baseline).

The graph models pool node embeddings by mean and max (PredTOP adds; a mean and a max are scale-free in
the node count, which `g` already carries) and feed them with `g` into the same MLP head. Batches are dense:
graphs are padded to the batch's largest and padded nodes only see themselves and are left out of pooling.

`fit` trains one model as PredTOP does: 4 layers of 64, AdamW, cosine learning rate from `lr` to 0 over
`epochs`, early stopping on a validation split by configuration `key` with the best weights restored, and
as loss the mean absolute relative error of the predicted iteration (PredTOP's MAE, relative so that fast
and slow configurations weigh alike). `Fitted` predicts, saves and loads (a plain dict, weights_only).

PyTorch is an optional extra: importing this module imports torch when it is installed (trainsim itself
never imports this module on `import trainsim`); without it, `make_model`, `fit` and `Fitted.load` raise a
one-line ConfigError.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from ..errors import ConfigError

try:
    import torch
    from torch import nn
except ImportError:  # the optional extra is missing: everything that needs torch raises ConfigError
    torch = None  # type: ignore[assignment]
    nn = None  # type: ignore[assignment]

from .stage_graph import GRAPH_FEATURES, NODE_FEATURES

if TYPE_CHECKING:
    from torch import Tensor

    from .stage_graph import StageGraph

MODELS = ("dag-transformer", "gcn", "gat", "features")
HIDDEN = 64  # PredTOP: 4 DAG Transformer layers of 64
LAYERS = 4
HEADS = 4
R_BOUND = 5.0  # |r| <= 5 (a factor of ~150 either way): keeps exp(r) finite whatever the weights
FORMAT = "trainsim.learn.models/1"
_STRUCTURE = {"dag-transformer": "reach", "gcn": "adjacency", "gat": "adjacency", "features": None}

Progress = Callable[[int, float, float | None], None]  # (epoch, train loss, validation loss or None)

# nn.Module when torch is installed; the classes below are only instantiated after require_torch()
_Module: type = nn.Module if nn is not None else object


def require_torch(field_name: str = "learn") -> None:
    if torch is None:
        raise ConfigError(field_name, "the learned models need torch, which is not installed",
                          "pip install 'trainsim[learn]'")


def _check_kind(kind: str) -> None:
    if kind not in MODELS:
        raise ConfigError("model", f"unknown model {kind!r}", f"use one of {', '.join(MODELS)}")


# ---------------------------------------------------------------------------------------------- graphs


def _checked_edges(edges: np.ndarray, n_nodes: int) -> np.ndarray:
    """`edges` as int64 [2, E] after checking the contract: node ids in range, src < dst (topological)."""
    if n_nodes < 1:
        raise ValueError("a stage graph needs at least one node")
    e = np.asarray(edges, dtype=np.int64).reshape(2, -1)
    if e.size and (e.min() < 0 or e.max() >= n_nodes):
        raise ValueError(f"edge ids outside 0..{n_nodes - 1}")
    if e.size and np.any(e[0] >= e[1]):
        raise ValueError("edges must go from a lower to a higher node id (topological order)")
    return e


def reachability(edges: np.ndarray, n_nodes: int) -> np.ndarray:
    """bool [n, n]: `reach[u, v]` when a directed path u -> ... -> v of at least one edge exists.

    One reverse-topological pass with Python ints as bit sets (descendants(u) = union over children c of
    {c} | descendants(c)): O(E) big-int ORs, well under a millisecond for a few hundred nodes, which keeps
    prediction fast without caching."""
    e = _checked_edges(edges, n_nodes)
    children: list[list[int]] = [[] for _ in range(n_nodes)]
    for s, d in zip(e[0].tolist(), e[1].tolist(), strict=True):
        children[s].append(d)
    bits = [0] * n_nodes
    for u in range(n_nodes - 1, -1, -1):
        b = 0
        for c in children[u]:
            b |= bits[c] | (1 << c)
        bits[u] = b
    width = (n_nodes + 7) // 8
    raw = np.frombuffer(b"".join(b.to_bytes(width, "little") for b in bits), dtype=np.uint8)
    return np.unpackbits(raw.reshape(n_nodes, width), axis=1, bitorder="little")[:, :n_nodes].astype(bool)


def dag_attention_mask(edges: np.ndarray, n_nodes: int) -> np.ndarray:
    """bool [n, n]: who attends to whom in the DAG Transformer (PredTOP's mask M with k = infinity): a
    node's ancestors, its descendants and itself."""
    reach = reachability(edges, n_nodes)
    return reach | reach.T | np.eye(n_nodes, dtype=bool)


def adjacency(edges: np.ndarray, n_nodes: int) -> np.ndarray:
    """bool [n, n]: the undirected adjacency with self loops (GCN's A + I, GAT's neighbourhoods)."""
    e = _checked_edges(edges, n_nodes)
    a = np.eye(n_nodes, dtype=bool)
    a[e[0], e[1]] = True
    a[e[1], e[0]] = True
    return a


def node_depth(edges: np.ndarray, n_nodes: int) -> np.ndarray:
    """int64 [n]: each node's depth, the longest path from a source (DAGPE's position of a node)."""
    e = _checked_edges(edges, n_nodes)
    depth = [0] * n_nodes
    order = np.argsort(e[0], kind="stable")  # all edges into s come from ids < s: done before s's edges
    for s, d in zip(e[0][order].tolist(), e[1][order].tolist(), strict=True):
        if depth[s] + 1 > depth[d]:
            depth[d] = depth[s] + 1
    return np.asarray(depth, dtype=np.int64)


@dataclass(frozen=True)
class _Prepared:
    """One graph ready for batching: standardised features and the structure its model kind reads."""

    x: np.ndarray  # float32 [n, F]
    g: np.ndarray  # float32 [G]
    structure: np.ndarray | None  # bool [n, n]: the attention mask or the adjacency
    depth: np.ndarray | None  # int64 [n] (dag-transformer only)
    targets: tuple[float, float, float, float]  # base_iter_s, base_stage_s, slots, label_s (nan unlabelled)


def _prepare(graph: StageGraph, kind: str, norm: _Norm) -> _Prepared:
    x = np.asarray(graph.x, dtype=np.float32)
    g = np.asarray(graph.g, dtype=np.float32).reshape(-1)
    if x.ndim != 2 or x.shape[1] != norm.x_mean.shape[0] or g.shape[0] != norm.g_mean.shape[0]:
        raise ValueError(f"graph {graph.key!r} has {x.shape[-1]} node / {g.shape[0]} graph features; the "
                         f"model reads {norm.x_mean.shape[0]} / {norm.g_mean.shape[0]}")
    n = x.shape[0]
    structure = _STRUCTURE[kind]
    label = math.nan if graph.label_s is None else float(graph.label_s)
    return _Prepared(
        x=((x - norm.x_mean) / norm.x_std).astype(np.float32),
        g=((g - norm.g_mean) / norm.g_std).astype(np.float32),
        structure=(dag_attention_mask(graph.edges, n) if structure == "reach"
                   else adjacency(graph.edges, n) if structure == "adjacency" else None),
        depth=node_depth(graph.edges, n) if kind == "dag-transformer" else None,
        targets=(float(graph.base_iter_s), float(graph.base_stage_s), float(graph.slots), label),
    )


@dataclass(frozen=True)
class _Batch:
    """Graphs padded to the largest: padded nodes are masked out and, in `structure`, see only themselves."""

    x: Tensor  # float32 [B, N, F]
    g: Tensor  # float32 [B, G]
    mask: Tensor  # bool [B, N], True on real nodes
    structure: Tensor | None  # bool [B, N, N]
    depth: Tensor | None  # int64 [B, N]
    base_iter: Tensor  # float64 [B]
    base_stage: Tensor
    slots: Tensor
    label: Tensor  # nan where unlabelled


def _collate(items: Sequence[_Prepared], device: Any = "cpu") -> _Batch:
    b = len(items)
    n_max = max(it.x.shape[0] for it in items)
    x = np.zeros((b, n_max, items[0].x.shape[1]), dtype=np.float32)
    mask = np.zeros((b, n_max), dtype=bool)
    has_structure = items[0].structure is not None
    structure = np.zeros((b, n_max, n_max), dtype=bool) if has_structure else None
    depth = np.zeros((b, n_max), dtype=np.int64) if items[0].depth is not None else None
    pad_diag = np.arange(n_max)
    for i, it in enumerate(items):
        n = it.x.shape[0]
        x[i, :n] = it.x
        mask[i, :n] = True
        if structure is not None:
            structure[i, :n, :n] = it.structure
            structure[i, pad_diag[n:], pad_diag[n:]] = True
        if depth is not None:
            depth[i, :n] = it.depth
    t = np.asarray([it.targets for it in items], dtype=np.float64)

    def dev(a: np.ndarray) -> Tensor:
        return torch.from_numpy(a).to(device)

    return _Batch(x=dev(x), g=dev(np.stack([it.g for it in items])), mask=dev(mask),
                  structure=None if structure is None else dev(structure),
                  depth=None if depth is None else dev(depth),
                  base_iter=dev(t[:, 0]), base_stage=dev(t[:, 1]), slots=dev(t[:, 2]), label=dev(t[:, 3]))


def _size_batches(items: Sequence[_Prepared], batch_size: int, pairs: int = 1 << 20) -> list[list[int]]:
    """Indices in batches of similar node counts (little padding) for evaluation and prediction, at most
    `batch_size` graphs and about `pairs` node pairs (B * N^2: the attention matrices stay in cache)."""
    order = sorted(range(len(items)), key=lambda i: items[i].x.shape[0])
    out: list[list[int]] = []
    for i in order:
        n = items[i].x.shape[0]  # the largest so far: the order is ascending
        if not out or len(out[-1]) >= batch_size or (len(out[-1]) + 1) * n * n > pairs:
            out.append([])
        out[-1].append(i)
    return out


# ---------------------------------------------------------------------------------------------- models


class _Head(_Module):
    """The MLP from the graph embedding to r, its output layer zero so that r starts at exactly 0."""

    def __init__(self, n_in: int, hidden: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        self.out = nn.Linear(hidden, 1)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)

    def forward(self, z: Tensor) -> Tensor:
        raw = self.out(self.mlp(z)).squeeze(-1)
        return R_BOUND * torch.tanh(raw / R_BOUND)  # smooth bound, tanh(0) = 0: untrained r is exactly 0


def _pool(h: Tensor, mask: Tensor) -> Tensor:
    """[B, 2D]: the mean and the max of the real nodes' embeddings."""
    m = mask.unsqueeze(-1)
    mean = (h * m).sum(1) / m.sum(1).clamp_min(1)
    top = h.masked_fill(~m, float("-inf")).amax(1)
    return torch.cat([mean, top], -1)


class _DagAttentionLayer(_Module):
    """A pre-norm transformer layer whose attention is masked to the DAG (PredTOP's Eqn. 1)."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden {hidden} is not a multiple of heads {heads}")
        self.heads = heads
        self.norm1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.norm2 = nn.LayerNorm(hidden)
        self.ff = nn.Sequential(nn.Linear(hidden, 2 * hidden), nn.ReLU(), nn.Linear(2 * hidden, hidden))

    def forward(self, h: Tensor, bias: Tensor) -> Tensor:
        """`bias` [B, 1, N, N]: PredTOP's M, 0 where attention is allowed and -inf elsewhere."""
        b, n, d = h.shape
        dh = d // self.heads
        q, k, v = self.qkv(self.norm1(h)).view(b, n, 3, self.heads, dh).permute(2, 0, 3, 1, 4)
        # softmax(q k^T / sqrt(dh) + M) v (every row keeps its diagonal, so none is all -inf); the fused
        # kernel is ~2.5x faster on CPU than the three-step version and gives the same numbers to 1e-6
        att = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        h = h + self.proj(att.transpose(1, 2).reshape(b, n, d))
        return h + self.ff(self.norm2(h))


class DagTransformer(_Module):
    """PredTOP's stage model: node projection + depth encoding, DAG-masked attention layers, pool, head."""

    def __init__(self, n_node_features: int, n_graph_features: int, hidden: int = HIDDEN,
                 layers: int = LAYERS, heads: int = HEADS) -> None:
        super().__init__()
        self.embed = nn.Linear(n_node_features, hidden)
        half = hidden // 2
        freq = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / max(half, 1))
        self.register_buffer("freq", freq, persistent=False)
        self.layers = nn.ModuleList(_DagAttentionLayer(hidden, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(hidden)
        self.head = _Head(2 * hidden + n_graph_features, hidden)

    def depth_encoding(self, depth: Tensor) -> Tensor:
        """Sinusoidal encoding of node depth (DAGPE; Vaswani et al.'s with depth as the position)."""
        angle = depth.unsqueeze(-1).to(self.freq.dtype) * self.freq
        enc = torch.cat([angle.sin(), angle.cos()], -1)
        return nn.functional.pad(enc, (0, self.embed.out_features - enc.shape[-1]))  # odd hidden

    def forward(self, batch: _Batch) -> Tensor:
        h = self.embed(batch.x) + self.depth_encoding(batch.depth)
        bias = torch.zeros(batch.structure.shape, dtype=h.dtype, device=h.device)
        bias = bias.masked_fill(~batch.structure, float("-inf")).unsqueeze(1)  # once, not once per layer
        for layer in self.layers:
            h = layer(h, bias)
        return self.head(torch.cat([_pool(self.norm(h), batch.mask), batch.g], -1))


class Gcn(_Module):
    """GCN: H' = relu(D^-1/2 (A + A^T + I) D^-1/2 H W) per layer, then the shared pool and head."""

    def __init__(self, n_node_features: int, n_graph_features: int, hidden: int = HIDDEN,
                 layers: int = LAYERS, heads: int = HEADS) -> None:
        super().__init__()
        dims = [n_node_features] + [hidden] * layers
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:], strict=True))
        self.head = _Head(2 * hidden + n_graph_features, hidden)

    def forward(self, batch: _Batch) -> Tensor:
        a = batch.structure.to(batch.x.dtype)
        inv_sqrt = a.sum(-1).rsqrt()  # degree >= 1: every node, padded ones too, has its self loop
        norm_adj = inv_sqrt.unsqueeze(-1) * a * inv_sqrt.unsqueeze(-2)
        h = batch.x
        for lin in self.layers:
            h = torch.relu(norm_adj @ lin(h))
        return self.head(torch.cat([_pool(h, batch.mask), batch.g], -1))


class _GatLayer(_Module):
    """One GAT layer: e_ij = LeakyReLU(a_dst . W h_i + a_src . W h_j) softmaxed over i's neighbours j."""

    def __init__(self, n_in: int, hidden: int, heads: int) -> None:
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden {hidden} is not a multiple of heads {heads}")
        self.heads = heads
        self.lin = nn.Linear(n_in, hidden, bias=False)
        self.att_src = nn.Parameter(torch.empty(heads, hidden // heads))
        self.att_dst = nn.Parameter(torch.empty(heads, hidden // heads))
        self.bias = nn.Parameter(torch.zeros(hidden))
        nn.init.xavier_uniform_(self.att_src)
        nn.init.xavier_uniform_(self.att_dst)

    def forward(self, h: Tensor, neighbours: Tensor) -> Tensor:
        b, n, _ = h.shape
        z = self.lin(h).view(b, n, self.heads, -1).transpose(1, 2)  # [B, H, N, dh]
        e = (z * self.att_dst.unsqueeze(1)).sum(-1).unsqueeze(-1) + (z * self.att_src.unsqueeze(1)).sum(-1).unsqueeze(-2)
        e = nn.functional.leaky_relu(e, 0.2).masked_fill(~neighbours.unsqueeze(1), float("-inf"))
        return (e.softmax(-1) @ z).transpose(1, 2).reshape(b, n, -1) + self.bias


class Gat(_Module):
    """GAT over predecessors, successors and self, ELU between layers, then the shared pool and head."""

    def __init__(self, n_node_features: int, n_graph_features: int, hidden: int = HIDDEN,
                 layers: int = LAYERS, heads: int = HEADS) -> None:
        super().__init__()
        dims = [n_node_features] + [hidden] * layers
        self.layers = nn.ModuleList(_GatLayer(a, b, heads) for a, b in zip(dims[:-1], dims[1:], strict=True))
        self.head = _Head(2 * hidden + n_graph_features, hidden)

    def forward(self, batch: _Batch) -> Tensor:
        h = batch.x
        for layer in self.layers:
            h = nn.functional.elu(layer(h, batch.structure))
        return self.head(torch.cat([_pool(h, batch.mask), batch.g], -1))


class FeatureMlp(_Module):
    """No graph structure: the head on the mean node features and the graph features."""

    def __init__(self, n_node_features: int, n_graph_features: int, hidden: int = HIDDEN,
                 layers: int = LAYERS, heads: int = HEADS) -> None:
        super().__init__()
        self.head = _Head(n_node_features + n_graph_features, hidden)

    def forward(self, batch: _Batch) -> Tensor:
        m = batch.mask.unsqueeze(-1)
        mean = (batch.x * m).sum(1) / m.sum(1).clamp_min(1)
        return self.head(torch.cat([mean, batch.g], -1))


_CLASSES = {"dag-transformer": "DagTransformer", "gcn": "Gcn", "gat": "Gat", "features": "FeatureMlp"}


def make_model(kind: str, n_node_features: int, n_graph_features: int, *, hidden: int = HIDDEN,
               layers: int = LAYERS, heads: int = HEADS) -> Any:
    """A fresh model of `kind` (one of MODELS): a torch.nn.Module mapping a batch to r [B], r = 0 untrained."""
    require_torch()
    _check_kind(kind)
    cls = globals()[_CLASSES[kind]]
    return cls(n_node_features, n_graph_features, hidden=hidden, layers=layers, heads=heads)


# ---------------------------------------------------------------------------------------------- fitting


@dataclass(frozen=True)
class _Norm:
    """Feature standardisation from the training graphs (std floored so constant columns stay finite)."""

    x_mean: np.ndarray
    x_std: np.ndarray
    g_mean: np.ndarray
    g_std: np.ndarray

    @staticmethod
    def of(graphs: Sequence[StageGraph]) -> _Norm:
        xs = np.concatenate([np.asarray(gr.x, dtype=np.float64) for gr in graphs], axis=0)
        gs = np.stack([np.asarray(gr.g, dtype=np.float64).reshape(-1) for gr in graphs])

        def std(a: np.ndarray) -> np.ndarray:
            s = a.std(axis=0)
            return np.where(s > 1e-6, s, 1.0).astype(np.float32)

        return _Norm(xs.mean(axis=0).astype(np.float32), std(xs), gs.mean(axis=0).astype(np.float32), std(gs))


def _relative_error(r: Tensor, batch: _Batch) -> Tensor:
    """|predicted iteration / measured - 1| per graph, in float64 (expm1: exact at r = 0)."""
    pred = batch.base_iter + batch.slots * batch.base_stage * torch.expm1(r.double())
    return (pred - batch.label).abs() / batch.label


def _split_by_key(graphs: Sequence[StageGraph], fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Train and validation indices: a seeded `fraction` of the configurations (at least one, and never all)
    held out whole, so that validation measures configurations the model has not seen."""
    keys = sorted({gr.key for gr in graphs})
    if fraction <= 0 or len(keys) < 2:
        return list(range(len(graphs))), []
    order = np.random.default_rng(seed).permutation(len(keys))
    n_val = min(len(keys) - 1, max(1, round(fraction * len(keys))))
    val_keys = {keys[i] for i in order[:n_val]}
    train = [i for i, gr in enumerate(graphs) if gr.key not in val_keys]
    val = [i for i, gr in enumerate(graphs) if gr.key in val_keys]
    return train, val


@contextmanager
def _threads(n: int | None) -> Iterator[None]:
    """torch's intra-op threads set to `n` inside (None: left alone), the caller's count restored after.

    One by default: these models run many small kernels, and with more threads than idle cores (a busy
    machine, parallel workers) OpenMP's barriers make a training step 10-25x slower; one thread also keeps
    the numbers independent of the machine's core count."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextmanager
def _deterministic() -> Iterator[None]:
    """Deterministic kernels inside, the caller's setting (and RNG state) restored after."""
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)  # warn, not fail, where a kernel has none
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


def _mean_error(model: Any, batches: Sequence[_Batch]) -> float:
    model.eval()
    with torch.no_grad():
        total = sum(float(_relative_error(model(b), b).sum()) for b in batches)
    return total / sum(int(b.mask.shape[0]) for b in batches)


def _natural(feature: str, value: float) -> str:
    """A graph feature's value in its own units (the log_ features are logs)."""
    return f"{math.exp(value) if feature.startswith('log_') else value:.4g}"


@dataclass
class Fitted:
    """A trained model with the standardisation it was trained with; predicts batched, on the CPU."""

    kind: str
    model: Any  # torch.nn.Module, in eval mode on the CPU
    x_mean: np.ndarray
    x_std: np.ndarray
    g_mean: np.ndarray
    g_std: np.ndarray
    n_node_features: int
    n_graph_features: int
    config: dict[str, int] = field(default_factory=lambda: {"hidden": HIDDEN, "layers": LAYERS, "heads": HEADS})
    best_epoch: int = -1  # the epoch whose weights were kept (-1: untrained)
    val_error: float | None = None  # its mean relative error on the validation split
    history: list[tuple[int, float, float | None]] = field(default_factory=list)  # (epoch, train, val)
    meta: dict[str, str] = field(default_factory=dict)  # what it was trained on (data, device, rows), for users
    # the range of every graph feature over the labelled graphs it was fitted to: its domain (outside_domain)
    g_min: np.ndarray | None = None
    g_max: np.ndarray | None = None

    @property
    def _norm(self) -> _Norm:
        return _Norm(self.x_mean, self.x_std, self.g_mean, self.g_std)

    def outside_domain(self, graph: StageGraph, tolerance: float = 1e-4) -> list[str]:
        """The graph features of `graph` outside the ranges the model was fitted on, as 'name value (trained on
        lo-hi)' in natural units (the features are logs): where its prediction is an extrapolation."""
        if self.g_min is None or self.g_max is None:
            return []
        g = np.asarray(graph.g, dtype=np.float64).reshape(-1)
        out = []
        for i, name in enumerate(GRAPH_FEATURES):
            lo, hi = float(self.g_min[i]), float(self.g_max[i])
            if g[i] < lo - tolerance or g[i] > hi + tolerance:
                out.append(f"{name.removeprefix('log_')} {_natural(name, g[i])} (trained on {_natural(name, lo)}-"
                           f"{_natural(name, hi)})")
        return out

    def predict_r(self, graphs: Sequence[StageGraph], batch_size: int = 64, threads: int | None = 1) -> np.ndarray:
        """float64 [len(graphs)]: the predicted log(stage_s / base_stage_s) of each graph (`threads`: see
        fit)."""
        items = [_prepare(gr, self.kind, self._norm) for gr in graphs]
        out = np.zeros(len(items), dtype=np.float64)
        self.model.eval()
        with _threads(threads), torch.inference_mode():
            for idx in _size_batches(items, batch_size):
                out[idx] = self.model(_collate([items[i] for i in idx])).double().numpy()
        return out

    def predict_stage_s(self, graphs: Sequence[StageGraph]) -> np.ndarray:
        """float64 [len(graphs)]: the corrected stage time, base_stage_s * exp(r)."""
        base = np.asarray([float(gr.base_stage_s) for gr in graphs], dtype=np.float64)
        return base * np.exp(self.predict_r(graphs))

    def predict_iter_s(self, graphs: Sequence[StageGraph]) -> np.ndarray:
        """float64 [len(graphs)]: the iteration, base_iter_s + slots * base_stage_s * (exp(r) - 1)."""
        t = np.asarray([(gr.base_iter_s, gr.slots, gr.base_stage_s) for gr in graphs], dtype=np.float64)
        t = t.reshape(-1, 3)
        return t[:, 0] + t[:, 1] * t[:, 2] * np.expm1(self.predict_r(graphs))

    def save(self, path: str | Path | BinaryIO) -> None:
        """torch.save of a plain dict (tensors, numbers, strings) to a path or an open binary file: loadable
        with weights_only=True."""
        torch.save({
            "format": FORMAT, "kind": self.kind, "config": dict(self.config),
            "n_node_features": self.n_node_features, "n_graph_features": self.n_graph_features,
            "state_dict": self.model.state_dict(),
            "x_mean": torch.from_numpy(self.x_mean), "x_std": torch.from_numpy(self.x_std),
            "g_mean": torch.from_numpy(self.g_mean), "g_std": torch.from_numpy(self.g_std),
            "best_epoch": self.best_epoch, "val_error": self.val_error,
            "history": [[e, t, v] for e, t, v in self.history], "meta": dict(self.meta),
            "node_features": list(NODE_FEATURES), "graph_features": list(GRAPH_FEATURES),
            **({"g_min": torch.from_numpy(self.g_min), "g_max": torch.from_numpy(self.g_max)}
               if self.g_min is not None and self.g_max is not None else {}),
        }, path if hasattr(path, "write") else Path(path))

    @classmethod
    def load(cls, path: str | Path, field_name: str = "model") -> Fitted:
        """The model `save` wrote, rebuilt from its config and state dict (no pickled classes); a file that
        is missing, unreadable or not such a model is a one-line ConfigError on `field_name`."""
        require_torch(field_name)
        p = Path(path)
        if not p.is_file():
            raise ConfigError(field_name, f"{path} does not exist", "pass a model from `trainsim predictor train`")
        try:
            d = torch.load(p, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - torch raises many kinds on a file that is not its own
            raise ConfigError(field_name, f"{path} is not a trainsim learned model ({type(exc).__name__})",
                              "pass a model from `trainsim predictor train`") from None
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ConfigError(field_name, f"{path} is not a trainsim learned model ({FORMAT})",
                              "pass a model from `trainsim predictor train`")
        names = (d.get("node_features"), d.get("graph_features"))
        if names != (list(NODE_FEATURES), list(GRAPH_FEATURES)):
            raise ConfigError(field_name, f"{path} reads other stage-graph features than this trainsim writes",
                              "retrain it with `trainsim predictor train`")
        try:
            config = {k: int(v) for k, v in d["config"].items()}
            model = make_model(d["kind"], int(d["n_node_features"]), int(d["n_graph_features"]), **config)
            model.load_state_dict(d["state_dict"])
            model.eval()
            return cls(kind=d["kind"], model=model, x_mean=d["x_mean"].numpy(), x_std=d["x_std"].numpy(),
                       g_mean=d["g_mean"].numpy(), g_std=d["g_std"].numpy(),
                       n_node_features=int(d["n_node_features"]), n_graph_features=int(d["n_graph_features"]),
                       config=config, best_epoch=int(d["best_epoch"]), val_error=d["val_error"],
                       history=[(int(e), float(t), v) for e, t, v in d["history"]],
                       meta={str(k): str(v) for k, v in dict(d.get("meta") or {}).items()},
                       g_min=d["g_min"].numpy() if "g_min" in d else None,
                       g_max=d["g_max"].numpy() if "g_max" in d else None)
        except (KeyError, TypeError, ValueError, RuntimeError, AttributeError, ConfigError) as exc:
            raise ConfigError(field_name, f"{path} is damaged ({type(exc).__name__})",
                              "retrain it with `trainsim predictor train`") from None


def fit(kind: str, graphs: Sequence[StageGraph], *, seed: int = 0, epochs: int = 500, lr: float = 1e-3,
        patience: int = 50, val_fraction: float = 0.1, batch_size: int = 32, progress: Progress | None = None,
        weight_decay: float = 1e-2, device: str = "cpu", threads: int | None = 1) -> Fitted:
    """Train a `kind` model on the labelled `graphs` (unlabelled ones are ignored).

    Loss: mean |predicted iteration / label_s - 1|. AdamW, cosine learning rate from `lr` to 0 over
    `epochs`, gradient norm clipped at 1. A seeded `val_fraction` of the configurations (`key`) is held
    out; training stops after `patience` epochs without a better validation error and keeps the best
    epoch's weights (without a validation split, the last epoch's). Deterministic for a given seed on a
    given machine and thread count; the caller's torch RNG, determinism and thread settings are left as
    they were. `threads`: torch's intra-op threads while fitting (1 by default: see _threads; None keeps
    the caller's). `device`: where to train ("cuda" works the same way; the fitted model comes back on the
    CPU). `epochs=0` returns the untrained model (r = 0: the analytical times). `progress(epoch, train,
    val)` is called after every epoch."""
    require_torch()
    _check_kind(kind)
    labelled = [gr for gr in graphs if gr.label_s is not None]
    if not labelled:
        raise ConfigError("learn", "no labelled stage graphs to fit", "pass graphs with measured label_s")
    bad = [gr.key for gr in labelled if not (math.isfinite(gr.label_s) and gr.label_s > 0)]
    if bad:
        raise ConfigError("learn", f"labels must be positive seconds; {bad[0]!r} has a bad one", "fix the data")
    train_idx, val_idx = _split_by_key(labelled, val_fraction, seed)
    train_graphs = [labelled[i] for i in train_idx]
    norm = _Norm.of(train_graphs)
    n_f, n_g = int(norm.x_mean.shape[0]), int(norm.g_mean.shape[0])
    train_items = [_prepare(gr, kind, norm) for gr in train_graphs]
    val_items = [_prepare(labelled[i], kind, norm) for i in val_idx]
    val_batches = [_collate([val_items[i] for i in idx], device) for idx in _size_batches(val_items, 64)]
    history: list[tuple[int, float, float | None]] = []
    best_epoch, best_val, best_state = -1, math.inf, None
    with _deterministic(), _threads(threads):
        torch.manual_seed(seed)
        rng = np.random.default_rng(seed)
        model = make_model(kind, n_f, n_g).to(device)
        if epochs > 0:
            opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
            schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=epochs)
        for epoch in range(epochs):
            model.train()
            total = 0.0
            order = rng.permutation(len(train_items))
            for start in range(0, len(order), batch_size):
                batch = _collate([train_items[i] for i in order[start:start + batch_size]], device)
                loss = _relative_error(model(batch), batch).mean()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                total += loss.item() * int(batch.mask.shape[0])
            schedule.step()
            train_error = total / len(train_items)
            val_error = _mean_error(model, val_batches) if val_batches else None
            history.append((epoch, train_error, val_error))
            if progress is not None:
                progress(epoch, train_error, val_error)
            if val_error is None:
                best_epoch = epoch
            elif val_error < best_val:
                best_epoch, best_val = epoch, val_error
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            elif epoch - best_epoch >= patience:
                break
        if best_state is not None:
            model.load_state_dict(best_state)
    model = model.to("cpu").eval()
    g_all = np.stack([np.asarray(gr.g, dtype=np.float32).reshape(-1) for gr in labelled])
    return Fitted(kind=kind, model=model, x_mean=norm.x_mean, x_std=norm.x_std, g_mean=norm.g_mean,
                  g_std=norm.g_std, n_node_features=n_f, n_graph_features=n_g, best_epoch=best_epoch,
                  val_error=best_val if math.isfinite(best_val) else None, history=history,
                  g_min=g_all.min(axis=0), g_max=g_all.max(axis=0))


__all__ = ["FORMAT", "MODELS", "DagTransformer", "FeatureMlp", "Fitted", "Gat", "Gcn", "adjacency",
           "dag_attention_mask", "fit", "make_model", "node_depth", "reachability"]
