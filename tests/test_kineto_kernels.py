"""GPU op name -> op class (trainsim.trace.kineto.kernels): real kernel names from the shared traces, the
rule-order traps, and coverage of every shared trace (GPU time left as `other`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from trainsim.trace.kineto import read_kineto, trace_from_json
from trainsim.trace.kineto.kernels import OP_CLASSES, OpClass, classify, classify_all, classify_codes
from trainsim.trace.kineto.model import CollectiveSource, GpuKind

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces"

# real names as the shared traces record them (a few very long ones cut after their distinguishing part)
NAMES: list[tuple[str, OpClass]] = [
    # collectives
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", OpClass.COLLECTIVE),
    ("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", OpClass.COLLECTIVE),
    ("void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>(c10::BFloat16*, unsigned long, "
     "unsigned int**, unsigned long, unsigned long)", OpClass.COLLECTIVE),
    # attention
    ("fmhaSm100aKernel_QkvE4m3OBfloat16H64PagedKvCausalP16VarSeqQ128Kv128PersistentContext", OpClass.ATTENTION),
    # norms (cuDNN, ATen, vLLM); cudnn::bn_* must not fall into the cuDNN conv rule
    ("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 128, true, 1, true>(cudnnTensorStruct, float const*, "
     "cudnnTensorStruct, float*, float const*, float const*, float, float, float*, float*, float*, float*, float, "
     "float)", OpClass.NORM),
    ("void at::native::batch_norm_backward_kernel<c10::BFloat16, c10::BFloat16, float, int>", OpClass.NORM),
    ("std::enable_if<(((8)>(0)))&&vllm::_typeConvert<c10::BFloat16>::exists, void>::type "
     "vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>(c10::BFloat16*, long, c10::BFloat16*, c10::BFloat16 const*, "
     "float, int, int)", OpClass.NORM),
    ("void at::native::(anonymous namespace)::RowwiseMomentsCUDAKernel<float, float>(long, float, float const*, "
     "float*, float*)", OpClass.NORM),
    ("void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernel<float, float>(long, long, float const*, "
     "float const*, float const*, float const*, float*, float*)", OpClass.NORM),
    # convolutions (cuDNN, CUTLASS-in-cuDNN, MIOpen, composable kernel); many carry "gemm" in the name
    ("sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_stage4_warpsize"
     "2x2x1_g1_tensor16x8x8_execute_kernel_cudnn_infer", OpClass.CONV),
    ("_ZN19cutlass_cudnn_train6KernelINS_4conv6kernel23ImplicitGemmConvolutionINS1_11threadblock22ImplicitGemm"
     "MultistageINS_4gemm9GemmShapeILi128ELi128ELi32EEE", OpClass.CONV),
    ("igemm_wrw_gtcx3_nhwc_bf16_bx0_ex1_bt128x64x32_wt32x32x8_ws1x1_wr1x2_ta1x4x1x4_1x8x1x32_tb1x4x1x2_1x8x1x32_gkgs",
     OpClass.CONV),
    ("_ZN2ck16tensor_operation6device37kernel_batched_gemm_xdlops_bwd_weightINS_47GridwiseGemm_bk0mk1_bk0nk1_mn_"
     "xdlops_bwd_weightILi64EttftLNS_25InMemoryDataOperationEnumE1E", OpClass.CONV),
    ("volta_scudnn_winograd_128x128_ldg1_ldg4_relu_tile148t_nt_v1", OpClass.CONV),
    ("void implicit_convolve_sgemm<float, float, 128, 6, 7, 3, 3, 5, 1, false, true, true>(int, int, int, float "
     "const*, int, float*, float const*, kernel_conv_params, unsigned long long, int, float, float, int, float "
     "const*, float const*, bool, int, int)", OpClass.CONV),
    ("void fft2d_r2c_32x32<float, false, 0u, false>(float2*, float const*, int, int, int, int, int, int, int, int, "
     "int, cudnn::reduced_divisor, bool, int2, int, int)", OpClass.CONV),
    ("cudnn_infer_ampere_scudnn_128x64_relu_xregs_large_nn_v1", OpClass.CONV),
    # GEMMs (CUTLASS, cuBLAS, rocBLAS/Tensile, cuBLASLt nvjet, TensorRT-LLM)
    ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4>(cutlass_80_tensorop_s1688gemm_"
     "256x64_16x4_nn_align4::Params)", OpClass.GEMM),
    ("ampere_sgemm_128x64_nn", OpClass.GEMM),
    ("volta_sgemm_128x64_nn", OpClass.GEMM),
    ("Cijk_Ailk_Bljk_BBS_BH_MT64x64x64_MI16x16x16x1_SN_1LDSB0_APM1_ABV0_ACED0_AF0EM1_AF1EM1_AMAS3_ASE_ASGT_ASLT",
     OpClass.GEMM),
    ("nvjet_tst_64x64_64x16_2x1_2cta_v_bz_bias_TNT", OpClass.GEMM),
    ("bmm_Bfloat16_MxE2m1MxE4m3_Fp32_t128x16x256u2_s3_et128x16_m128x16x32_cga1x1x1_16dp256b_rM_TN_transOut_"
     "schedP2x1x2x3_biasM_bN_tmaOpt_clmp_dynBatch_sm100f", OpClass.GEMM),
    ("void gemvNSP_kernel<float, float, float, float, 1, 32, 4, 1024, cublasGemvParams<cublasGemvTensorStrided"
     "Batched<float const>, cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, "
     "float> >", OpClass.GEMM),
    ("void cublasLt::splitKreduce_kernel<32, 16, int, float, float, float, float, true, false, false>(cublasLt::"
     "cublasSplitKParams<float>, float const*, float const*, float*, float const*, float const*, float const*, "
     "float const*, float*, void*, long, float*, int*)", OpClass.GEMM),
    # elementwise and data movement (FBGEMM's "gemm" is not a GEMM; MoE glue with cutlass types is not one)
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, at::detail::Array<"
     "char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)", OpClass.ELEMENTWISE),
    ("triton_poi_fused_add_bitwise_and_bitwise_not_bitwise_or_ge_lt_mul_sub_0", OpClass.ELEMENTWISE),
    ("triton__0d1d2d3d4d5d6d7d8d9d10d11d12d13d14", OpClass.ELEMENTWISE),
    ("void split_embedding_codegen_forward_unweighted_kernel<c10::Half, c10::Half, float, false, long, 2ul, 32ul>",
     OpClass.ELEMENTWISE),
    ("void split_embedding_backward_codegen_rowwise_adagrad_unweighted_kernel_cta_per_row_1<c10::Half, float, "
     "c10::Half, 2ul, 32>", OpClass.ELEMENTWISE),
    ("void fbgemm_gpu::_block_bucketize_sparse_features_cuda_kernel1<int, int>(int, int, int const*, int, int "
     "const*, int const*, int*)", OpClass.ELEMENTWISE),
    ("void cudnn::ops::nchwToNhwcKernel<float, float, float, false, true, (cudnnKernelDataType_t)2>(cudnn::ops::"
     "nchw2nhwc_params_t<float>, float const*, float*)", OpClass.ELEMENTWISE),
    ("batched_transpose_32x32_half", OpClass.ELEMENTWISE),
    ("void moe::dev::finalize::finalizeKernelVecLoad<moe::dev::finalize::KernelParams<cutlass::bfloat16_t, "
     "cutlass::bfloat16_t, 4, true> >(moe::dev::finalize::KernelParams<cutlass::bfloat16_t, cutlass::bfloat16_t, "
     "4, true>)", OpClass.ELEMENTWISE),
    ("void vllm::rotary_embedding_kernel<c10::BFloat16, true>(long const*, c10::BFloat16*, c10::BFloat16*, "
     "c10::BFloat16 const*, int, long, long, long, int, int, int)", OpClass.ELEMENTWISE),
    ("void permute_pooled_embs_kernel<float>(float const*, long const*, long const*, long const*, float*, long, "
     "long, long)", OpClass.ELEMENTWISE),
    # reductions, softmax, losses, pooling, sorts
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, float, "
     "float>, unsigned int, float, 4> >", OpClass.REDUCTION),
    ("void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, false, false>(float*, float const*, "
     "int, int, int, bool const*, int, bool)", OpClass.REDUCTION),
    ("void cunn_ClassNLLCriterion_updateOutput_kernel<float, float>(float*, float*, float*, long*, float*, int, "
     "int, int, int, long)", OpClass.REDUCTION),
    ("void at::native::(anonymous namespace)::max_pool_forward_nchw<float, float>", OpClass.REDUCTION),
    ("void cub::DeviceRadixSortOnesweepKernel<cub::DeviceRadixSortPolicy<long, int, int>::Policy800, false, long, "
     "int, int, int>", OpClass.REDUCTION),
    # optimizers
    ("void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>, float, float, float, float, float, "
     "float, float, float, adamMode_t, float, int, int, int>", OpClass.OPTIMIZER),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
     "TensorListMetadata<2>, at::native::(anonymous namespace)::BinaryOpListAlphaFunctor<float, 2, 2, 0>, "
     "std::plus<float>, float>", OpClass.OPTIMIZER),
    # torch.cuda._sleep's busy wait is nothing the model prices
    ("at::cuda::(anonymous namespace)::spin_kernel(long)", OpClass.OTHER),
]


@pytest.mark.parametrize(("name", "expected"), NAMES, ids=[f"{c.value}-{i}" for i, (_, c) in enumerate(NAMES)])
def test_real_kernel_names(name: str, expected: OpClass) -> None:
    assert classify(name, GpuKind.KERNEL) == expected


def test_kind_and_rule_order() -> None:
    assert classify("Memcpy HtoD (Pageable -> Device)", GpuKind.MEMCPY) == "memcpy"
    assert classify("Memset (Device)", GpuKind.MEMSET) == "memset"
    assert classify("Memcpy DtoD (Device -> Device)", GpuKind.KERNEL) == "memcpy"  # a copy recorded as a kernel
    # Inductor names say their kind up front: a bias-grad reduction named after convolution_backward
    assert classify("triton_red_fused_convolution_backward_0", GpuKind.KERNEL) == "reduction"
    assert classify("triton_per_fused_native_layer_norm_1", GpuKind.KERNEL) == "norm"
    assert classify("triton_tem_fused_mm_0", GpuKind.KERNEL) == "gemm"
    # argument types do not decide: a cuBLAS parameter struct in the parameter list is not a GEMM
    assert classify("void my_kernel<float>(cublasGemvParams<float>)", GpuKind.KERNEL) == "other"
    assert classify("", GpuKind.KERNEL) == "other"
    assert {c.value for c in OP_CLASSES} == {"gemm", "conv", "attention", "norm", "elementwise", "reduction",
                                             "optimizer", "collective", "memcpy", "memset", "other"}


def _x(cat: str, name: str, ts: float, **args: object) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": 10, "args": args}


def test_classify_all_synthetic() -> None:
    gemm = "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4>"
    ev = [
        _x("kernel", gemm, 0, device=0, stream=7, correlation=1),
        _x("gpu_memcpy", "Memcpy DtoD (Device -> Device)", 20, device=0, stream=7, correlation=2, bytes=64),
        _x("kernel", gemm, 40, device=0, stream=7, correlation=3),
        _x("gpu_memset", "Memset (Device)", 60, device=0, stream=7, correlation=4, bytes=64),
        _x("kernel", "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 80, device=0, stream=7,
           correlation=5, **{"Collective name": "allgather", "In msg nelems": 8, "Group size": 2}),
        _x("kernel", "spin", 100, device=0, stream=7, correlation=6),
    ]
    tr = trace_from_json({"traceEvents": ev}, "synthetic")
    got = classify_all(tr)
    assert got.tolist() == ["gemm", "memcpy", "gemm", "memset", "collective", "other"]
    codes = classify_codes(tr)
    assert codes.dtype == np.int8 and [OP_CLASSES[c] for c in codes] == got.tolist()
    assert classify_all(trace_from_json({"traceEvents": [_x("cpu_op", "aten::mm", 0)]}, "cpu")).tolist() == []


SHARED = sorted(p.relative_to(TRACES).as_posix() for p in TRACES.rglob("*.json.gz")) if TRACES.is_dir() else []
_SPIN_ONLY = "HolisticTraceAnalysis/tests/data/critical_path/cuda_event_sync/event_sync_trace.json.gz"


@pytest.mark.skipif(not SHARED, reason="shared traces folder is absent")
@pytest.mark.parametrize("rel", SHARED)
def test_shared_trace_coverage(rel: str) -> None:
    """Under 5% of kernel time stays `other` on every shared trace, except the event-sync test program whose
    main kernel is torch.cuda._sleep's spin; per-row classes agree with per-name classification."""
    tr = read_kineto(TRACES / rel)
    cls = classify_all(tr)
    gpu = tr.gpu
    assert len(cls) == len(gpu) and set(cls.tolist()) <= {c.value for c in OP_CLASSES}
    for i in range(0, len(gpu), max(1, len(gpu) // 50)):
        if cls[i] != "collective":
            assert cls[i] == classify(tr.name(gpu.name_id[i]), int(gpu.kind[i]))
    kernels = gpu.kind == GpuKind.KERNEL
    other = kernels & (cls == "other")
    if rel == _SPIN_ONLY:
        assert {tr.name(i) for i in gpu.name_id[other].tolist()} == {"at::cuda::(anonymous namespace)::spin_kernel(long)"}
    else:
        assert gpu.dur_us[other].sum() < 0.05 * gpu.dur_us[kernels].sum()
    coll = tr.collectives
    rows = [r for s, r in zip(coll.source, coll.row, strict=True) if s == CollectiveSource.GPU_KERNEL]
    assert all(cls[r] == "collective" for r in rows)
