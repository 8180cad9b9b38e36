"""Numeric precision of a training job: compute dtype and bytes kept per parameter."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..workload.ir import Op, OpKind

OptimizerKind = Literal["adam", "adam_8bit", "adafactor", "muon"]
OPTIMIZERS: tuple[str, ...] = ("adam", "adam_8bit", "adafactor", "muon")
"""Optimizers whose states trainsim prices: Adam/AdamW (two moments), block-wise 8-bit Adam, Adafactor (a
factored second moment: row and column statistics per matrix, a full one per vector; no first moment) and Muon
(one momentum per hidden matrix, AdamW's two moments for embeddings, the output layer and vectors)."""

ADAM_8BIT_BLOCK = 2048
"""Elements per quantisation block of an 8-bit optimizer state (Dettmers et al. 2022, "8-bit Optimizers via
Block-wise Quantization", section 2.1: blocks of 2048, one fp32 absolute maximum per block)."""
ADAM_8BIT_STATE_BYTES = 2 * (1.0 + 4.0 / ADAM_8BIT_BLOCK)
"""Both 8-bit Adam moments per parameter: one byte each plus each block's fp32 scale (2.0039 B)."""
FP8_PARAM_BYTES = 1.0
"""An FP8 (E4M3) weight element; its per-tensor scale is negligible."""
FP8_ACTIVATION_BYTES = 1.0 + 4.0 / 128
"""A cached FP8 activation element with its share of a 1 x 128 tile's fp32 scale (DeepSeek-V3's fine-grained
quantisation, arXiv 2412.19437 sec. 3.3.2)."""
NF4_BYTES_PER_PARAM = 0.5 + 1 / 64 + 4 / (64 * 256)
"""A 4-bit NormalFloat weight with double-quantised block scales: 4 bits, an 8-bit absmax per block of 64 and an
fp32 scale per 256 blocks (Dettmers et al. 2023, QLoRA, section 3: 4.127 bits per parameter)."""


HIGH_PRECISION_LAYERS = frozenset({"embedding", "head"})
"""Layers whose weighted GEMMs an FP8 / NVFP4 recipe leaves in BF16: the embedding and the output layer
(Megatron's output layer is a plain tensor-parallel linear, not Transformer Engine's; torchao's float8 conversion
skips the output projection)."""
HIGH_PRECISION_OPS = frozenset({"router", "mtp_lm_head"})
"""Ops an FP8 recipe keeps in higher precision outside those layers: the MoE router's gating GEMM (Megatron's
TopKRouter is a plain GEMM; DeepSeek-V3 keeps its gating in BF16/FP32, arXiv 2412.19437 sec. 3.3.1) and the
multi-token-prediction module's output head (the main head's weight, in BF16 like it)."""


def weighted_gemm(op: Op) -> bool:
    """A GEMM with a weight: the ops a low-precision recipe may run in FP8 / NVFP4."""
    return op.kind == OpKind.MATMUL and op.weight is not None


def low_precision_gemm(layer_kind: str, op: Op) -> bool:
    """Whether an FP8 / NVFP4 recipe runs `op` in that precision (and can keep its weight in FP8, stash its input
    in FP8): a block's weighted linear, not the embedding's or the output layer's, not the MoE router."""
    return weighted_gemm(op) and layer_kind not in HIGH_PRECISION_LAYERS and op.name not in HIGH_PRECISION_OPS


def _dtype_bytes(dtype: str) -> float:
    """Bytes of a weight stored in the training dtype (fp8 GEMMs keep their weights in bf16 unless
    Precision.fp8_params)."""
    return 4.0 if dtype in ("fp32", "tf32") else 2.0


@dataclass(frozen=True)
class Precision:
    """Mixed-precision Adam as in ZeRO (Rajbhandari et al. 2020, section 3.1): 2 + 2 + 12 bytes/param.

    param_bytes: working (fp16/bf16) weights; grad_bytes: gradients as reduced; optimizer_bytes:
    fp32 master weights + Adam momentum + variance (K = 12 in the ZeRO paper). `named("bf16")`
    keeps gradients in fp32 (2 + 4 + 12) as Megatron does; the bare constructor is the ZeRO case.
    grad_buffers: copies of the gradients held across the step (2: PyTorch DDP without
    gradient_as_bucket_view, whose reducer buckets hold a second copy); optimizer_in_backward: each
    gradient is consumed by its optimizer step as backward produces it (torchtune's optimizer_in_bwd), so
    no gradient buffer outlives its layer's backward.
    """

    compute_dtype: str = "bf16"
    param_bytes: float = 2.0
    grad_bytes: float = 2.0
    optimizer_bytes: float = 12.0
    activation_bytes: float = 2.0
    grad_buffers: int = 1
    optimizer_in_backward: bool = False
    fp8_params: bool = False  # the FP8 GEMMs' weights stored and gathered in FP8 (FP8_PARAM_BYTES each)
    # Adafactor (Shazeer & Stern 2018): a matrix keeps rows + columns second-moment values instead of one per
    # element, each of these bytes (0: not factored); optimizer_bytes counts the full-size moment, lowering
    # takes the difference off each matrix (compile.program)
    factored_moment_bytes: float = 0.0
    # Muon (Jordan et al. 2024, Megatron-Core's): a block's weight matrix keeps one momentum of these bytes where
    # AdamW keeps two (0: not Muon); optimizer_bytes counts AdamW's, lowering takes one moment off each matrix
    muon_moment_bytes: float = 0.0
    # the FP8 GEMMs' inputs kept for their backward in FP8 (FP8_ACTIVATION_BYTES each) instead of the activation
    # dtype: DeepSeek-V3's low-precision activation caching (arXiv 2412.19437, sec. 3.3.3)
    fp8_activations: bool = False

    def weight_bytes(self, fp8_gemm: bool) -> float:
        """Bytes of one stored weight element: FP8_PARAM_BYTES for an FP8 GEMM's (`fp8_gemm`) when the weights
        are kept in FP8 (fp8_params), else param_bytes."""
        return FP8_PARAM_BYTES if fp8_gemm and self.fp8_params else self.param_bytes

    @classmethod
    def named(cls, dtype: str, *, master_weights: bool = True, optimizer: OptimizerKind = "adam",
              grad_buffers: int = 1, optimizer_in_backward: bool = False, fp8_params: bool = False,
              fp8_activations: bool = False) -> Precision:
        """The precision of training in `dtype`. master_weights: an fp32 master copy with fp32 optimizer states
        (mixed precision, the default); False: weights, gradients and optimizer states all in the training dtype
        (PyTorch Lightning's bf16-true, torchtune's bf16). optimizer: adam (two moments), adam_8bit (two
        block-wise quantised 8-bit moments, ADAM_8BIT_STATE_BYTES), adafactor (one moment, factored per matrix
        by lowering) or muon (Adam's two moments, one taken off each block matrix by lowering). fp8_params: the
        FP8 GEMMs' weights stored in FP8 (fp8 training only); fp8_activations: their inputs cached for the
        backward in FP8 (fp8 training only). fp32 and tf32 train without a master copy
        (the weights are fp32 already): master_weights changes nothing there."""
        if optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {optimizer!r}; one of {', '.join(OPTIMIZERS)}")
        if grad_buffers < 1:
            raise ValueError(f"grad_buffers must be at least 1, not {grad_buffers}")
        base = cls._mixed(dtype)
        weight = _dtype_bytes(dtype)
        full = dtype in ("fp32", "tf32")
        if master_weights or full:
            master = 0.0 if full else 4.0
            moments = {"adam": 8.0, "adam_8bit": ADAM_8BIT_STATE_BYTES, "adafactor": 4.0, "muon": 8.0}[optimizer]
            grads = base.grad_bytes
        else:  # everything in the training dtype: no master copy, moments in that dtype too
            master = 0.0
            moments = {"adam": 2 * weight, "adam_8bit": ADAM_8BIT_STATE_BYTES, "adafactor": weight,
                       "muon": 2 * weight}[optimizer]
            grads = weight
        if fp8_params and base.compute_dtype != "fp8":
            raise ValueError(f"fp8_params keeps FP8 GEMMs' weights in FP8; {dtype} training has none")
        if fp8_activations and base.compute_dtype != "fp8":
            raise ValueError(f"fp8_activations caches FP8 GEMMs' inputs in FP8; {dtype} training has none")
        return cls(base.compute_dtype, base.param_bytes, grads, master + moments, base.activation_bytes,
                   grad_buffers, optimizer_in_backward, fp8_params,
                   moments if optimizer == "adafactor" else 0.0, moments / 2 if optimizer == "muon" else 0.0,
                   fp8_activations)

    @classmethod
    def _mixed(cls, dtype: str) -> Precision:
        """Mixed-precision Adam in `dtype` (what `named` gives by default)."""
        if dtype == "fp32":
            return cls("fp32", 4.0, 4.0, 8.0, 4.0)
        if dtype == "tf32":
            return cls("tf32", 4.0, 4.0, 8.0, 4.0)
        if dtype == "bf16":
            # bf16 needs fp32 gradient accumulation and reduction: Megatron forces
            # accumulate_allreduce_grads_in_fp32 for bf16 (docs/distrib_optimizer: 2 + 4 + 12 B/param)
            return cls("bf16", 2.0, 4.0, 12.0, 2.0)
        return cls(dtype)

    def state_bytes(self, params: float, grads: float, optimizer_params: float,
                    params_adjust_bytes: float = 0.0, optimizer_adjust_bytes: float = 0.0) -> float:
        """Bytes of these parameter, gradient and optimizer-state counts kept across the step (every gradient
        copy; none with the optimizer in backward, where each lives only through its layer's backward);
        `params_adjust_bytes`: what weights stored in another format (FP8, NF4) take beyond param_bytes each;
        `optimizer_adjust_bytes`: what matrix optimizers save against their per-parameter moments (Adafactor's
        factored moment, Muon's single one)."""
        kept_grads = 0.0 if self.optimizer_in_backward else grads * self.grad_bytes * self.grad_buffers
        return (params * self.param_bytes + params_adjust_bytes + kept_grads + optimizer_params * self.optimizer_bytes
                + optimizer_adjust_bytes)
