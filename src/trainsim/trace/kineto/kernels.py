"""GPU op names -> op classes, so a what-if can re-time each kernel by how its class scales.

Pure string logic on the names CUDA/HIP libraries give their kernels (no cost-model imports: trace/
sits left of cost/). The classes, and why each kernel family lands where it does:

* `gemm`: cuBLAS/cuBLASLt (sgemm/hgemm, gemv, `nvjet_*`, cublasLt split-K and epilogue helpers),
  CUTLASS GEMMs, `sm80_xmma_gemm`, rocBLAS/Tensile `Cijk_*`, hipBLASLt, Triton/Inductor mm templates,
  TensorRT-LLM `bmm_*`: dense contractions, bound by matmul throughput.
* `conv`: cuDNN convolutions (implicit/precomputed/explicit convolve, `*_fprop*`, `dgrad`, `wgrad`,
  winograd, FFT, `scudnn`), CUTLASS implicit-GEMM convolutions, MIOpen (`igemm_fwd/bwd/wrw`, composable
  kernel grouped conv / bwd-weight). Checked before `gemm` because many carry "gemm" in the name.
* `attention`: fused attention (FlashAttention, FMHA, cuDNN SDPA, memory-efficient attention, paged
  attention).
* `norm`: layer/batch/RMS/group/instance norm kernels (cuDNN `bn_fw`/`bn_bw`, apex, vLLM, MIOpen).
* `elementwise`: memory-bound streaming and data movement: PyTorch (vectorized/unrolled) elementwise
  kernels, Triton `triton_poi`, fused activations, dropout, copies, casts and quantisation, layout
  transposes (NCHW<->NHWC), cat, index/gather/scatter and embedding lookups (FBGEMM), MoE finalize,
  RoPE, KV-cache writes.
* `reduction`: reductions and what is built from them: `reduce_kernel`, softmax, log-softmax, losses
  (cross-entropy, NLL), Triton `triton_red`/`triton_per`, pooling, cub sorts/scans, top-k, MoE routing.
* `optimizer`: `multi_tensor_apply` (foreach / fused optimizers), fused Adam/SGD/LAMB kernels.
* `collective`: NCCL/RCCL kernels and PyTorch symmetric-memory / custom all-reduce kernels.
* `memcpy`, `memset`: the GPU op kind (or a `Memcpy ...`/`Memset ...` name).
* `other`: anything not recognised (e.g. `spin_kernel`, the busy-wait of `torch.cuda._sleep`).

Rules are tried in order and the first match wins (e.g. `cudnn::bn_fw` is a norm before it is cuDNN,
`moe::...<cutlass::bfloat16_t>` is MoE glue before it is CUTLASS).
"""

from __future__ import annotations

import re
from enum import StrEnum

import numpy as np

from .model import CollectiveSource, GpuKind, KinetoTrace


class OpClass(StrEnum):
    """What a GPU op does, at the granularity a GPU what-if re-times it."""

    GEMM = "gemm"
    CONV = "conv"
    ATTENTION = "attention"
    NORM = "norm"
    ELEMENTWISE = "elementwise"
    REDUCTION = "reduction"
    OPTIMIZER = "optimizer"
    COLLECTIVE = "collective"
    MEMCPY = "memcpy"
    MEMSET = "memset"
    OTHER = "other"


OP_CLASSES: tuple[OpClass, ...] = tuple(OpClass)
"""Every op class, in declaration order (the order `classify_all`'s codes index)."""

# (class, pattern) tried in order on the lower-cased kernel name without its parameter list; first match wins.
_RULES: tuple[tuple[OpClass, str], ...] = (
    (OpClass.COLLECTIVE, r"^(void )?(nccl|rccl)|multimem_all_reduce|one_shot_all_reduce|two_shot_all_reduce"
                         r"|cross_device_reduce|custom_?all_?reduce"),
    (OpClass.ATTENTION, r"flash_fwd|flash_bwd|flash::|flash_attn|fmha|sdpa|efficient_attention|pytorch_flash"
                        r"|attention_kernel|paged_attention|attn_fwd|attn_bwd|mha_fwd|mha_bwd"),
    (OpClass.NORM, r"layer_?norm|batch_?norm|rms_?norm|group_?norm|instance_?norm|cudnn::bn_|\bbn_(fw|bw)"
                   r"|rowwisemoments|gammabetabackward|computeinternalgradients|computefusedparams|welford"
                   r"|cuapplylayernorm|cucomputegradgammabeta|cucomputepartgradgammabeta"),
    # Inductor kernels by their kind prefix (a name like `triton_red_fused_convolution_backward_0` is a bias-grad
    # reduction, not a convolution); its older names (`triton__0d1d2d`) say nothing: they are fused pointwise or
    # reduction kernels (its matmuls are templates or cuBLAS calls), memory-bound either way
    (OpClass.GEMM, r"^triton_tem_"),
    (OpClass.REDUCTION, r"^triton_(red|per)_"),
    (OpClass.ELEMENTWISE, r"^triton_poi_|^triton_+\d"),
    # PyTorch elementwise kernels whatever functor they carry; embedding tables (FBGEMM); library layout
    # transposes and glue that would otherwise match the conv/gemm/reduction rules below
    (OpClass.ELEMENTWISE, r"elementwise|split_embedding|embedding_bag|embeddingbag|bounds_check_indices"
                          r"|nchwtonhwc|nhwctonchw|batched_transpose|transpose_[a-z0-9]+2[a-z0-9]+|scal_kernel"
                          r"|subtensorop|scalepackedtensor|im2col|col2im|moe::dev::finalize|quantize|quant_kernel"),
    (OpClass.REDUCTION, r"reduce_wgrad|moe::dev::routing"),
    (OpClass.CONV, r"conv(olution|olve|_|2d|3d|fwd|bwd)|implicit_?gemm|_fprop|fprop_|dgrad|wgrad|winograd"
                   r"|fft2d|fft_|scudnn|cudnn|miopen|igemm_(fwd|bwd|wrw)|bwd_weight|computeoffsetskernel"),
    (OpClass.GEMM, r"(?<!fb)gemm|gemv|cublas|cutlass(_|::kernel|::gemm|::device)|xmma|matmul|^(void )?cijk_"
                   r"|hipblaslt|nvjet|triton.*_(b|add)?mm(_|$)|^(void )?bmm_|splitkreduce"
                   r"|epilogue::impl::globalkernel"),
    (OpClass.OPTIMIZER, r"multi_tensor_apply|fused_?adam|adam_|fused_?sgd|sgd_|lamb_|adagrad"),
    (OpClass.REDUCTION, r"reduce|softmax|cross_?entropy|nll_?loss|nllcriterion"
                        r"|_pool\b|pool_|pool[123]d|pooling|cub::|radixsort|\bscan|sort|topk|argmax|cumsum|histogram"),
    (OpClass.ELEMENTWISE, r"copy|fill|dropout|relu|gelu|silu|swiglu|sigmoid|tanh|act_|activation|catarray"
                          r"|transpose|permute|index|gather|scatter|embedding|rotary|cast|convert|where|masked"
                          r"|clamp|arange|upsample|_pad|compute_cuda_kernel|fbgemm_gpu::|vllm::|add|mul|div"),
)
_COMPILED: tuple[tuple[OpClass, re.Pattern[str]], ...] = tuple((c, re.compile(p)) for c, p in _RULES)


def _without_parameters(name: str) -> str:
    """The kernel name without its trailing parameter list (`f<T>(float*, int)` -> `f<T>`): argument types
    (`cublasGemvParams`, `cudnnTensorStruct`, FBGEMM accessors) would otherwise match other classes' rules."""
    if not name.endswith(")"):
        return name
    depth = 0
    for i in range(len(name) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(name[i], 0)
        if depth == 0:
            return name[:i] if i > 0 else name
    return name  # unbalanced (a truncated name): keep it whole


def classify(name: str, gpu_kind: int) -> OpClass:
    """The op class of one GPU op from its name and `GpuKind` (copies and sets by kind, kernels by name)."""
    if gpu_kind == GpuKind.MEMCPY:
        return OpClass.MEMCPY
    if gpu_kind == GpuKind.MEMSET:
        return OpClass.MEMSET
    low = name.strip().lower()
    if low.startswith("memcpy "):
        return OpClass.MEMCPY
    if low.startswith("memset "):
        return OpClass.MEMSET
    low = _without_parameters(low)
    for cls, pattern in _COMPILED:
        if pattern.search(low):
            return cls
    return OpClass.OTHER


def classify_codes(trace: KinetoTrace) -> np.ndarray:
    """Per row of `trace.gpu`, the index into `OP_CLASSES` (int8); each distinct (name, kind) is classified once.

    Kernels the reader recorded as collectives (GPU-side collective records) are `collective` whatever
    their name, as in the replay graph."""
    gpu = trace.gpu
    key = gpu.name_id.astype(np.int64) * len(GpuKind) + gpu.kind.astype(np.int64)
    uniq, inverse = np.unique(key, return_inverse=True)
    index = {c: i for i, c in enumerate(OP_CLASSES)}
    per_key = np.array([index[classify(trace.name(k // len(GpuKind)), int(k % len(GpuKind)))]
                        for k in uniq.tolist()], dtype=np.int8)
    codes = per_key[inverse.reshape(-1)] if len(uniq) else np.zeros(0, dtype=np.int8)
    coll = trace.collectives
    rows = [r for s, r in zip(coll.source, coll.row, strict=True) if s == CollectiveSource.GPU_KERNEL]
    if rows:
        codes[np.asarray(rows, dtype=np.int64)] = index[OpClass.COLLECTIVE]
    return codes


def classify_all(trace: KinetoTrace) -> np.ndarray:
    """Per row of `trace.gpu`, its op class as a numpy string array (compare with `== "gemm"`)."""
    return np.asarray([c.value for c in OP_CLASSES])[classify_codes(trace)]
