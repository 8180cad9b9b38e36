"""Workload IR: operators as einsum-like dimension sets, grouped into layers and a module tree.

Every quantity the simulator needs (FLOPs, bytes moved, parameters, saved activations) follows
from the named dimensions of an operator, so a strategy can split any dimension and the local
cost is just the same formula over the local sizes (Proteus section II-A).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from operator import attrgetter


class OpKind(StrEnum):
    """What an operator does; the compute model picks its efficiency by kind."""

    MATMUL = "matmul"  # dense contraction with a weight (linear layers, LM head)
    BMM = "bmm"  # contraction of two activations (unfused attention scores / context)
    ATTENTION = "attention"  # fused (flash) attention core: QK^T, softmax, PV in one kernel
    CONV = "conv"  # convolution, an einsum over (n, k, c, p, q, r, s)
    ELEMENTWISE = "elementwise"  # activation functions, dropout, residual add, RoPE
    NORM = "norm"  # LayerNorm / RMSNorm / BatchNorm
    SOFTMAX = "softmax"  # unfused (scaled, masked) softmax
    EMBEDDING = "embedding"  # table lookup (gather): memory-bound, no FLOPs
    POOL = "pool"
    LOSS = "loss"  # cross-entropy over the vocabulary
    ROUTER = "router"  # MoE gating + token permutation (dispatch/combine)


CONTRACTION_KINDS = frozenset({OpKind.MATMUL, OpKind.BMM, OpKind.CONV, OpKind.ATTENTION})


@dataclass(frozen=True)
class SavedTensor:
    """A tensor the forward pass keeps for the backward pass (activation memory)."""

    name: str
    dims: tuple[str, ...]
    bytes_per_elem: float = 2.0
    selective_drop: bool = False  # dropped (and recomputed) under selective recompute
    # kept as the op consumes it even where the strategy stores the op's saved tensors sharded (sequence
    # parallelism): a column-parallel linear that all-gathers its input and lets autograd keep the gathered
    # tensor (nanotron's synchronous REDUCE_SCATTER mode) instead of re-gathering it for the weight gradient
    as_used: bool = False


@dataclass(frozen=True)
class Op:
    """One operator: an iteration space of named dimensions plus the tensors it touches.

    `flop_dims` x `flops_per_point` gives forward FLOPs (2 per multiply-add over the whole
    iteration space for a contraction; a few per output element for elementwise work).
    `inputs[0]` is the activation arriving from the previous op of the layer, named with the same
    dimension names as the producer's output so a layout can be compared across the edge.
    """

    name: str
    kind: OpKind
    dims: Mapping[str, int]
    inputs: tuple[tuple[str, ...], ...]
    output: tuple[str, ...]
    weight: tuple[str, ...] | None = None
    extra_params: int = 0  # biases / norm scales that follow the op's output feature dim
    flop_dims: tuple[str, ...] | None = None
    flops_per_point: float = 2.0
    saved: tuple[SavedTensor, ...] = ()
    # tensors alive only while the op's forward (or recompute) and its backward run, beside what it saves: the
    # op's own step allocates and frees them, so they raise the peak without holding memory across steps
    # (the bf16 logits and the fp32 copies a cross-entropy makes next to the softmax it keeps)
    transient: tuple[SavedTensor, ...] = ()
    selective_recompute: bool = False  # attention core: dropped and recomputed under selective
    causal: bool = False
    window: int = 0  # ATTENTION: each query sees at most this many keys (sliding-window attention); 0: all of them
    bytes_per_elem: float = 2.0
    bwd_flops_factor: float = 2.0  # backward FLOPs / forward FLOPs (dgrad + wgrad = 2)
    # ATTENTION only: the fused kernel that runs it (flash = FlashAttention-2, flash3, cudnn, triton; ssd = Mamba2's
    # chunked scan, mamba_ssm's Triton kernels)
    kernel: str = "flash"
    launches: int = 1  # kernels one phase of a non-GEMM op launches (> 1: an unfused PyTorch-eager chain)
    # small bookkeeping kernels the op launches beside its main work, (forward, backward): Megatron-Core's MoE
    # router past its gating GEMM (score function, top-k, aux-loss statistics) and its token dispatcher's counts,
    # splits, device-to-host copies and permutation maps. Each costs a launch (host) and a kernel gap (GPU)
    side_kernels: tuple[int, int] = (0, 0)
    traffic: float = 1.0  # HBM bytes its kernels move / (inputs read + output written once): > 1 for such chains
    # producer of each input: None = the previous op, an op name, or "@skip" (residual path)
    input_from: tuple[str | None, ...] = ()
    # parameter-efficient fine-tuning (LoRA, Hu et al. 2021): `frozen` parameters get no gradient, optimizer state
    # or gradient sync, and the backward skips the weight-gradient GEMM; `adapter_params` are trainable low-rank
    # adapters beside the weight (r x (in + out) per adapted matrix); `nf4_fraction` of the weight is stored as
    # 4-bit NormalFloat (QLoRA, Dettmers et al. 2023), the rest in the training dtype
    frozen: bool = False
    adapter_params: int = 0
    nf4_fraction: float = 0.0
    # the share of its FLOPs that are model FLOPs (MFU's): a routed expert priced at the busiest rank's load
    # (model.moe_imbalance, capacity padding) counts the mean's
    useful: float = 1.0
    # the framework module it runs in (attn, mlp, moe_router, moe_preprocess, moe, mamba; "" elsewhere): what a
    # scoped CUDA graph captures (strategy.cuda_graphs, Megatron's --cuda-graph-scope)
    module: str = ""
    # a GEMM launched once per index of this dim rather than as one kernel (model.expert_gemm per_expert:
    # Transformer Engine's GroupedLinear runs one cuBLAS GEMM per local expert, "e"); "": one launch
    launch_per: str = ""

    def size(self, dims: tuple[str, ...], local: Mapping[str, int] | None = None) -> int:
        sizes = local if local is not None else self.dims
        return math.prod(sizes[d] for d in dims)

    def fwd_flops(self, local: Mapping[str, int] | None = None) -> float:
        """Forward FLOPs over the (optionally local, i.e. sharded) iteration space."""
        sizes = local if local is not None else self.dims
        dims = self.flop_dims if self.flop_dims is not None else (
            tuple(self.dims) if self.kind in CONTRACTION_KINDS else self.output
        )
        return self.flops_per_point * math.prod(sizes[d] for d in dims)

    def bwd_flops(self, local: Mapping[str, int] | None = None) -> float:
        return self.bwd_flops_factor * self.fwd_flops(local)

    def fwd_bytes(self, local: Mapping[str, int] | None = None) -> float:
        """HBM bytes a forward kernel reads and writes (inputs, weight, output)."""
        sizes = local if local is not None else self.dims
        elems = sum(math.prod(sizes[d] for d in t) for t in self.inputs)
        elems += math.prod(sizes[d] for d in self.output)
        if self.weight is not None:
            elems += math.prod(sizes[d] for d in self.weight)
        return elems * self.bytes_per_elem

    def bwd_bytes(self, local: Mapping[str, int] | None = None) -> float:
        """Backward reads the saved inputs and the output gradient and writes input/weight grads."""
        return 2.0 * self.fwd_bytes(local)

    @property
    def params(self) -> int:
        """Weight elements plus extra parameters and adapters; kept on the op once computed (frozen, like `key`)."""
        p = self.__dict__.get("_params")
        if p is None:
            p = (math.prod(self.dims[d] for d in self.weight) if self.weight is not None else 0) + self.extra_params
            p += self.adapter_params
            object.__setattr__(self, "_params", p)  # not a field: equality, repr and replace() ignore it
        return p

    def key(self) -> tuple:
        """A hashable value of every field (dims as its ordered items): ops with equal keys cost and lower
        alike, so caches of one lowering or costing share their work (compile.program, cost.annotate).
        Computed once per op and kept on it (an op is frozen: lowering and costing both ask, per op)."""
        k = self.__dict__.get("_key")
        if k is None:
            values = list(_op_fields(self))
            values[_OP_DIMS] = tuple(self.dims.items())
            values[_OP_SAVED] = tuple(map(_saved_fields, self.saved))  # plain tuples hash fast
            k = tuple(values)
            object.__setattr__(self, "_key", k)  # not a field: equality, repr and replace() ignore it
        return k


_OP_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Op))
_OP_DIMS = _OP_FIELDS.index("dims")
_OP_SAVED = _OP_FIELDS.index("saved")
_op_fields = attrgetter(*_OP_FIELDS)
_saved_fields = attrgetter(*(f.name for f in fields(SavedTensor)))


class OpValues:
    """Small integer ids of op values (Op.key) for the caches of one lowering or costing: equal ops get one id,
    so cache keys hash and compare as ints. Ops are looked up by object id; the ops seen are kept alive here,
    so an id cannot be reused by another op while this table lives (a program hands its lowering's table to
    the costing of it)."""

    def __init__(self) -> None:
        self.ids: dict[int, int] = {}  # id(op) -> its value's id, for ops seen (a hot loop may read it directly)
        self._by_value: dict[tuple, int] = {}
        self._seen: list[Op] = []

    def __call__(self, op: Op) -> int:
        i = self.ids.get(id(op))
        if i is None:
            i = self.ids[id(op)] = self._by_value.setdefault(op.key(), len(self._by_value))
            self._seen.append(op)
        return i

    def alias(self, op: Op, like: Op) -> None:
        """Record `op` as equal in value to `like` (compared by the caller): its key need not be built."""
        if id(op) not in self.ids:
            self.ids[id(op)] = self(like)
            self._seen.append(op)


@dataclass
class Layer:
    """A leaf of the module tree: an ordered chain of ops run forward, reversed backward."""

    name: str
    kind: str  # "embedding", "transformer", "head", "conv", "mlp", ...
    ops: list[Op]
    tied_to: str | None = None  # name of a layer whose weight this layer shares (tied embeddings)
    tied_op: str | None = None  # the op of this layer whose weight is that shared one

    @property
    def params(self) -> int:
        """Parameters this layer adds to the model (a tied weight is counted where it is defined)."""
        total = sum(op.params for op in self.ops)
        if self.tied_to:
            total -= sum(op.params - op.extra_params - op.adapter_params for op in self.ops if op.name == self.tied_op)
        return total

    @property
    def stored_params(self) -> int:
        """Parameters a device holding this layer must store (tied copies included)."""
        return sum(op.params for op in self.ops)

    def fwd_flops(self) -> float:
        return sum(op.fwd_flops() for op in self.ops)


@dataclass
class Module:
    """A non-leaf of the module tree; mirrors the nesting of the model's code."""

    name: str
    children: list[Module | Layer] = field(default_factory=list)

    def layers(self) -> Iterator[Layer]:
        for c in self.children:
            if isinstance(c, Layer):
                yield c
            else:
                yield from c.layers()


@dataclass
class Model:
    """A trainable model: the module tree plus what the summary needs to speak its language."""

    name: str
    family: str  # "gpt", "llama", "moe", "bert", "cnn", "dlrm"
    root: Module
    batch_dim: str = "b"
    seq_len: int | None = None  # tokens per sample for language models, None otherwise
    description: str = ""
    hyper: dict[str, int | float | str] = field(default_factory=dict)
    assumptions: tuple[str, ...] = ()  # where the model approximates its source (e.g. an imported HF config)

    @property
    def layers(self) -> list[Layer]:
        return list(self.root.layers())

    @property
    def params(self) -> int:
        return sum(layer.params for layer in self.layers)

    @property
    def active_params(self) -> int:
        """Parameters one token runs through: all of them but the routed experts it skips (each MoE layer's
        expert weights, shaped (experts, out, in), count top_k / experts of theirs; routers and shared experts
        count whole). The same as `params` for a dense model."""
        experts, top_k = int(self.hyper.get("experts", 0) or 0), int(self.hyper.get("top_k", 0) or 0)
        total = 0
        for layer in self.layers:
            for op in layer.ops:
                w = op.weight
                routed = experts > 0 and w is not None and len(w) == 3 and w[0] == "e" and op.dims["e"] == experts
                total += op.params * top_k // experts if routed else op.params
        return total

    @property
    def is_language_model(self) -> bool:
        return self.seq_len is not None

    def fwd_flops_per_sample(self) -> float:
        """Forward contraction FLOPs per sample (the 'model FLOPs' that MFU counts, /3)."""
        total = 0.0
        for layer in self.layers:
            for op in layer.ops:
                if op.kind in CONTRACTION_KINDS:
                    total += op.fwd_flops() * op.useful
        return total / self.batch_size_in_graph

    @property
    def batch_size_in_graph(self) -> int:
        for layer in self.layers:
            for op in layer.ops:
                if self.batch_dim in op.dims:
                    return op.dims[self.batch_dim]
        return 1
