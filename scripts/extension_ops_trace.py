"""A small hand-built Kineto trace of the ops TraceLens's extension models
cover, with their shapes as PyTorch records them: a training step's
grouped GEMMs (Primus Turbo's, fixed and variable K, shapes as tensors and
as tensor lists), token dispatch and combine, Apex's fused convolutions
(``ConvBias_``, ``ConvBiasReLU_``) and Mamba-2's fused scan with their
backward ops, DaoAILab's causal convolution, then an
inference step's aiter fused and two-stage expert GEMMs, SGLang's Triton
expert GEMM, the router's top-k and the token sort, aiter's group norm and
aiter's and vLLM's fused RMS norms, Primus's fused layer norm, MXFP4
quantizations, MLA's rotary embedding, exponential sampling, custom
all-reduce, reduce-scatter and all-gather ops, aiter's,
vLLM's and TransformerEngine's GEMMs, gated activations and fp8
quantizations, and
the inference-attention ops around them (KV-cache writes, aiter's sparse
prefill, packed and paged attention, vLLM's gated delta net), aiter's mHC
ops and Inductor's compiled kernels.  TraceLens's
sheets for them (``GroupedGEMM_fwd``, ``MoE_*``, ``InferenceAttention_fwd``,
``CONV_*``, ``SSM_*``, ``mHC_fwd``, ``RMSNorm_fwd``, ``GEMM``, ``UnaryElementwise``, ``BinaryElementwise``,
``RoPE_fwd``, ``GroupQuant_fwd``, ``FusedRoPE_fwd``, ``elementwise_fwd``,
``CustomCollective_fwd``,
``Normalization`` ...) are made from this one
(scripts/tracelens_perf_reference.py), and the tests compare analyze --ops
with them.

Some ops are odd on purpose: a grouped GEMM of tensor lists (dtype
``TensorList``, no size), an fmoe call whose top-k is not recorded,
shapes that do not parse, a fused convolution of mixed dtypes (its model
caches nothing for its backward op).

    python scripts/extension_ops_trace.py OUT.json
"""
from __future__ import annotations

import sys

from model_ops_trace import BF16, F32, NONE, Trace, _scalar, _tensor, dump

FP8 = "c10::Float8_e4m3fnuz"
FP4, E8M0, U8 = "c10::Float4_e2m1fn_x2", "c10::Float8_e8m0fnu", "unsigned char"
INT, LONG = "int", "long int"
GROUPED = "_ZN7ck_tile6kentryILi1ENS_15GroupedGemmKernelINS_22GemmPipelineAgBgCrCompV3EEEEEvNT_5KargsE"
GROUPED_WGRAD = "_ZN7ck_tile6kentryILi1ENS_23GroupedGemmVariableKKernelINS_22GemmPipelineAgBgCrMemEEEEvNT_5KargsE"
DISPATCH = "void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*, long*, float*, int*, int*, int)"
COMBINE = "void deep_ep::intranode::combine<__nv_bfloat16, 8, 768, 4096>(__nv_bfloat16*, float*, int*, int)"
FMOE = "_ZN5aiter42fmoe_bf16_pertokenFp8_g1u1_vs_silu_1tg_32x256E"
FMOE_BLOCKSCALE = "_ZN5aiter47fmoe_fp8_blockscale_g1u1_novs_silu_1tg_32x256_subGU_256E"
CK_STAGE1 = "_ZN7ck_tile6kentryILi1ENS_16MoeGemmKernelStage1INS_18MoeFlatmmPipelineEEEEvNT_5KargsE"
CK_STAGE2 = "_ZN7ck_tile6kentryILi1ENS_16MoeGemmKernelStage2INS_18MoeFlatmmPipelineEEEEvNT_5KargsE"
TRITON_MOE = "fused_moe_kernel"
TOPK = "_ZN5aiter24biased_grouped_topk_kernelIN3c108BFloat16EfLi8ELb1EEEvPT_PKS3_PfPiiiiif"
SOFTPLUS = "_ZN5aiter20topk_softplus_kernelIN3c108BFloat16ELi8EEEvPKT_PfPiiii"
SORT = "_ZN7ck_tile6kentryILi1ENS_14MoeSortingKernelINS_15MoeSortingProblemIifEEEEEvNT_5KargsE"
MX_SORT = "_ZN5aiter18mxfp4_moe_sort_hipILi32EEEvPKhPhPKiS4_ii"
APPEND = "_fused_append_shared_experts_kernel"
GEMM_KERNELS = ("_ZN5aiter41gemm_a8w8_blockscale_bf16_128x128_kernelE",
                "Cijk_Alik_Bljk_BBS_BH_MT128x128x64_MI16x16x16x1_SN_1LDSB0", "nvjet_hsh_128x256_64x4_1x2_h_bz_coopB_TN")
CUSTOM_AR = "void vllm::cross_device_reduce_1stage<__hip_bfloat16, 8>(vllm::RankData*, vllm::RankSignals, int)"
FUSED = "_ZN5aiter26fused_inference_kernel_stubE"
ELEMENTWISE = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int, float*)"
RMS_FUSED = "_ZN5aiter24rmsnorm2d_fused_fwd_kernelIN3c108BFloat16ELi2048EEEvNS_6ParamsE"
LN_MODULATE = "_fused_ln_modulate_fwd_kernel"
LN_MODULATE_BWD = "_fused_ln_modulate_bwd_kernel"
SSD = "_mamba_chunk_scan_combined_fwd_kernel"
SSD_BWD = "_mamba_chunk_scan_combined_bwd_kernel"
CAUSAL_CONV = "void causal_conv1d_fwd_kernel<Causal_conv1d_fwd_kernel_traits<128, 4, true, c10::BFloat16>>(ConvParamsBase)"
CONV_BIAS = "_ZN5miopen20conv_fwd_bias_kernelI6__halfLi64EEEvPKT_S4_S4_PS2_"
CONV_BIAS_RELU = "_ZN5miopen25conv_fwd_bias_relu_kernelI6__halfLi64EEEvPKT_S4_S4_PS2_"
CONV_DGRAD = "_ZN5miopen16conv_bwd_data_kernelI6__halfLi64EEEvPKT_S4_PS2_"
CONV_WGRAD = "_ZN5miopen18conv_bwd_weight_kernelI6__halfLi64EEEvPKT_S4_PS2_"
GROUPNORM = "_ZN5aiter18group_norm_kernelIN3c108BFloat16ELi256EEEvPKT_S5_S5_PS3_iiif"
STORE = "_store_cache_kernel"
SPARSE = "_ZN5aiter28pa_sparse_prefill_opus_kernelILi512ELi64EEEvNS_6ParamsE"
VARLEN = "_ZN5aiter29fmha_fwd_hd128_bf16_group_rtneE"
PAGED = "paged_attention_decode_sliding_window"
GDN = "fused_recurrent_gated_delta_rule_fwd_kernel"


def grouped_gemm(tokens: int, hidden: int, out: int, groups: int, dtype: str = BF16, k_last: bool = True,
                 ) -> list[tuple]:
    """``grouped_gemm(a [M, K], b [G, N, K] (or [G, K, N]), group_lens [G], group_offs [G + 1], trans_b, num_cu)``."""
    weight = [groups, out, hidden] if k_last else [groups, hidden, out]
    return [_tensor([tokens, hidden], dtype), _tensor(weight, dtype), _tensor([groups], LONG),
            _tensor([groups + 1], LONG), _scalar(str(k_last)), _scalar("None", "")]


def grouped_gemm_variable_k(tokens: int, left: int, right: int, groups: int) -> list[tuple]:
    """The weight gradient: ``grouped_gemm_variable_k(a [M, K], b [M, N], group_lens, group_offs, ...)``."""
    return [_tensor([tokens, left], BF16), _tensor([tokens, right], BF16), _tensor([groups], LONG),
            _tensor([groups + 1], LONG), _scalar("True"), _scalar("False"), _scalar("None", "")]


def tensor_lists(rows: list[int], hidden: int, out: int) -> list[tuple]:
    """Per-group tensor lists as Kineto writes them: nested shapes, dtype ``TensorList``."""
    return [([[m, hidden] for m in rows], "TensorList", [[hidden, 1] for _ in rows], ""),
            ([[hidden, out] for _ in rows], "TensorList", [[out, 1] for _ in rows], "")]


def fmoe(tokens: int, hidden: int, inter: int, experts: int, topk: str, blockscale: bool) -> list[tuple]:
    """``fmoe_g1u1(out, input, gate, down, sorted_token_ids, sorted_weights, sorted_expert_ids, num_valid_ids,
    topk, input_scale, fc1_scale, fc2_scale, ...)`` (the block-scale one: scales by blocks, block sizes last)."""
    padded = tokens * int(topk or 8) + experts * 31
    args = [_tensor([tokens, hidden], BF16), _tensor([tokens, hidden], FP8), _tensor([experts, 2 * inter, hidden], FP8),
            _tensor([experts, hidden, inter], FP8), _tensor([padded], INT), _tensor([padded], F32),
            _tensor([padded // 32], INT), _tensor([1], INT), _scalar(topk),
            _tensor([tokens, hidden // 128 if blockscale else 1], F32),
            _tensor([experts, 2 * inter // 128 if blockscale else 2 * inter, hidden // 128 if blockscale else 1], F32),
            _tensor([experts, hidden // 128 if blockscale else hidden, inter // 128 if blockscale else 1], F32)]
    if blockscale:
        args += [NONE, _scalar("128"), _scalar("128")]
    return args


def ck_stage(stage: int, tokens: int, hidden: int, inter: int, experts: int, topk: int) -> list[tuple]:
    """``ck_moe_stage1(hidden_states, w1, w2, sorted_token_ids, sorted_expert_ids, num_valid_ids, out, topk, ...)``
    and ``ck_moe_stage2(inter_states, w1, w2, ..., out, topk, ...)``."""
    padded = tokens * topk + experts * 31
    first = [tokens, hidden] if stage == 1 else [tokens, topk, inter]
    out = [tokens, topk, inter] if stage == 1 else [tokens, hidden]
    return [_tensor(first, FP8), _tensor([experts, 2 * inter, hidden], FP8), _tensor([experts, hidden, inter], FP8),
            _tensor([padded], INT), _tensor([padded // 32], INT), _tensor([1], INT), _tensor(out, BF16),
            _scalar(str(topk)), _scalar("None", ""), _tensor([tokens, 1], F32), _tensor([experts, 1, 1], F32)]


def cktile_gemm(stage: int, tokens: int, hidden: int, inter: int, experts: int, topk: int) -> list[tuple]:
    """``moe_cktile2stages_gemm1_ck(XQ [M, K], WQ [E, 2N, K], Y [M, topk, N], sorted_ids, sorted_expert_ids,
    max_token_ids, topk, ...)``, ``gemm2_ck(XQ [M, topk, N], WQ [E, K, N], Y [M, K], ...)``."""
    padded = tokens * topk + experts * 31
    x, w, y = (([tokens, hidden], [experts, 2 * inter, hidden], [tokens, topk, inter]) if stage == 1 else
               ([tokens, topk, inter], [experts, hidden, inter], [tokens, hidden]))
    return [_tensor(x, FP8), _tensor(w, FP8), _tensor(y, BF16), _tensor([padded], INT), _tensor([padded // 32], INT),
            _tensor([1], INT), _scalar(str(topk))]


def triton_moe(tokens: int, n: int, k: int, experts: int, topk: int) -> list[tuple]:
    """SGLang's ``invoke_fused_moe_kernel(A, B, bias, C, A_scale, B_scale, B_zp, topk_weights, topk_ids,
    sorted_token_ids, expert_ids, num_tokens_post_padded, ...)``."""
    padded = tokens * topk + experts * 15
    return [_tensor([tokens, k], BF16), _tensor([experts, n, k], FP8), NONE, _tensor([tokens, topk, n], BF16),
            NONE, _tensor([experts], F32), NONE, _tensor([tokens, topk], F32), _tensor([tokens, topk], INT),
            _tensor([padded], INT), _tensor([padded // 64], INT), _tensor([1], INT), _scalar("False")]


def router(tokens: int, experts: int, topk: int) -> list[tuple]:
    """``biased_grouped_topk_hip(gating_output, correction_bias, topk_weights, topk_ids, num_expert_group,
    topk_group, need_renorm, routed_scaling_factor)``."""
    return [_tensor([tokens, experts], BF16), _tensor([experts], BF16), _tensor([tokens, topk], F32),
            _tensor([tokens, topk], INT), _scalar("8"), _scalar("4"), _scalar("True"), _scalar("2.5", "Double")]


def softplus(tokens: int, experts: int, topk: int) -> list[tuple]:
    """``topk_softplus(topk_weights, topk_indices, gating_output, need_renorm, ...)``."""
    return [_tensor([tokens, topk], F32), _tensor([tokens, topk], INT), _tensor([tokens, experts], BF16),
            _scalar("True"), _scalar("1.0", "Double")]


def sorting(tokens: int, hidden: int, experts: int, topk: int) -> list[tuple]:
    """``moe_sorting_fwd(topk_ids, topk_weights, sorted_token_ids, sorted_weights, sorted_expert_ids,
    num_valid_ids, moe_buf, num_experts, unit_size, ...)``."""
    padded = tokens * topk + experts * 31
    return [_tensor([tokens, topk], INT), _tensor([tokens, topk], F32), _tensor([padded], INT), _tensor([padded], F32),
            _tensor([padded // 32], INT), _tensor([2], INT), _tensor([tokens, hidden], BF16), _scalar(str(experts)),
            _scalar("32"), NONE]


def mx_sort(tokens: int, hidden: int, experts: int, topk: int) -> list[tuple]:
    """``mxfp4_moe_sort_hip(out [P, S], scales [M, S], sorted_ids [P], num_valid_ids [2], token_num, cols)``."""
    padded = tokens * topk + experts * 31
    return [_tensor([padded, hidden // 32], "unsigned char"), _tensor([tokens, hidden // 32], "unsigned char"),
            _tensor([padded], INT), _tensor([2], INT), _scalar(str(tokens)), _scalar(str(hidden))]


def append_shared(tokens: int, topk: int) -> list[tuple]:
    """SGLang's ``fused_append_shared_experts(topk_ids, topk_weights, num_fused_shared_experts, scale)``."""
    return [_tensor([tokens, topk], INT), _tensor([tokens, topk], F32), _scalar("1"), _scalar("1.0", "Double")]


def group_norm(x: list[int]) -> list[tuple]:
    """aiter's ``_groupnorm_run(x, weight, bias, num_groups, eps, ...)``."""
    return [_tensor(x, BF16), _tensor([x[1]], BF16), _tensor([x[1]], BF16), _scalar("32"), _scalar("1e-05", "Double"),
            _scalar("False")]


def store_cache(tokens: int, width: int) -> list[tuple]:
    """SGLang's ``store_cache(k [T, D], v, k_cache [slots, D], v_cache, indices [T], ...)``."""
    return [_tensor([tokens, width], BF16), _tensor([tokens, width], BF16), _tensor([65536, width], BF16),
            _tensor([65536, width], BF16), _tensor([tokens], LONG), NONE, NONE]


def sparse_prefill(tokens: int, heads: int, dim: int) -> list[tuple]:
    """``pa_sparse_prefill_opus_fwd(q [N, H, d], kv_cache, kv_indices_prefix [P], kv_indptr_prefix, kv_cache_extend,
    kv_indices_extend [P'], kv_indptr_extend, softmax_scale, ...)``."""
    return [_tensor([tokens, heads, dim], BF16), _tensor([8192, 1, dim], BF16), _tensor([tokens * 512], INT),
            _tensor([tokens + 1], INT), _tensor([tokens, 1, dim], BF16), _tensor([tokens * 64], INT),
            _tensor([tokens + 1], INT), _scalar("0.044", "Double")]


def varlen(tokens: int, heads: int, kv_heads: int, dim: int) -> list[tuple]:
    """``mha_varlen_fwd(q [T, H, d], k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, ...)``."""
    return [_tensor([tokens, heads, dim], BF16), _tensor([tokens, kv_heads, dim], BF16),
            _tensor([tokens, kv_heads, dim], BF16), _tensor([5], INT), _tensor([5], INT), _scalar(str(tokens)),
            _scalar(str(tokens)), _scalar("0.0", "Double"), _scalar("0.088", "Double"), _scalar("True")]


def paged_decode(tokens: int, heads: int, kv_heads: int, dim: int) -> list[tuple]:
    """``pa_decode_gluon(q [T, H, d], out, k_cache [blocks, H_kv, ...], v_cache, block_tables, context_lens, ...)``."""
    return [_tensor([tokens, heads, dim], BF16), _tensor([tokens, heads, dim], BF16),
            _tensor([4096, kv_heads, dim // 16, 16, 16], FP8), _tensor([4096, kv_heads, dim, 16], FP8),
            _tensor([tokens, 64], INT), _tensor([tokens], INT)]


def gated_delta(tokens: int, v_heads: int, dim: int) -> list[tuple]:
    """vLLM's ``gdn_attention_core(mixed_qkv [T, 2·H_K·d_k + H_V·d_v], b [T, H_V], a, core_attn_out, layer_name)``."""
    return [_tensor([tokens, v_heads * dim * 2], BF16), _tensor([tokens, v_heads], BF16),
            _tensor([tokens, v_heads], BF16), _tensor([tokens, v_heads, dim], BF16), _scalar("layers.0", "String")]


def conv_bias(x: list[int], w: list[int], stride: int, padding: int, dtype: str = "c10::Half") -> list[tuple]:
    """Apex's ``ConvBias_(x, weight, bias, stride, padding)`` (and ``ConvBiasReLU_``), NCHW."""
    return [_tensor(x, "c10::Half"), _tensor(w, dtype), _tensor([1, w[0], 1, 1], "c10::Half"),
            _scalar(str(stride)), _scalar(str(padding))]


def inductor(shapes: list[list[int]], *counts: int, dtype: str = BF16) -> list[tuple]:
    """An Inductor kernel's launch as PyTorch 2.4+ records it: its buffers, then its element counts."""
    return [*(_tensor(shape, dtype) for shape in shapes), *(_scalar(str(count)) for count in counts)]


def mamba(batch: int, length: int, heads: int, head_dim: int, state: int) -> list[tuple]:
    """``MambaSplitConv1dScanCombinedFn(zxbcdt [B, T, D], conv1d_weight [C_conv, 4], conv1d_bias, dt_bias [H], A, D,
    chunk_size, ..., headdim (16th), ngroups (17th), ...)``, one group."""
    inner = heads * head_dim
    conv = inner + 2 * state
    args = [_tensor([batch, length, 2 * inner + 2 * state + heads], BF16), _tensor([conv, 4], BF16),
            _tensor([conv], BF16), _tensor([heads], F32), _tensor([heads], F32), _tensor([heads], F32), _scalar("256")]
    args += [NONE] * 8 + [_scalar(str(head_dim)), _scalar("1"), _scalar("False")]
    return args


def mhc(kind: str, tokens: int, streams: int, width: int, split: int) -> list[tuple]:
    """aiter's mHC ops: residual [M, n, C], layer input [M, C], mixes, the projection fn [n² + 2n, n·C]."""
    hc3, residual = streams * streams + 2 * streams, [tokens, streams, width]
    mixes = [_tensor([tokens, streams, 1], F32), _tensor([tokens, streams, streams], F32)]
    partials = [_tensor([split, tokens, hc3], F32), _tensor([split, tokens], F32)]
    fn = _tensor([hc3, streams * width], F32)
    return {
        "post": [_tensor(residual, BF16), _tensor([tokens, width], BF16), _tensor(residual, BF16), *mixes,
                 _scalar("False")],
        "pre_gemm": [*partials, _tensor(residual, BF16), fn, _scalar("256"), _scalar("False")],
        "pre_rmsnorm": [*mixes, _tensor([tokens, width], BF16), *partials, _tensor([3], F32), _tensor([hc3], F32),
                        _tensor(residual, BF16), _tensor([width], BF16), _scalar("1e-06", "Double")],
        "fused": [*partials, _tensor(residual, BF16), _tensor([tokens, width], BF16), _tensor(residual, BF16), *mixes,
                  fn, _scalar("32"), _scalar("32"), _scalar("256"), _scalar("False")],
    }[kind]


def rms_variants(tokens: int, width: int) -> list[tuple[str, list[tuple]]]:
    """aiter's and vLLM's fused RMS norms (residual add, fp8 or fp4 quantization, padding) as they are called."""
    x, w, eps = _tensor([tokens, width], BF16), _tensor([width], BF16), _scalar("1e-06", "Double")
    fp8, scale = _tensor([tokens, width], FP8), _tensor([tokens, width // 128], F32)
    return [
        ("aiter::rmsnorm2d_fwd_with_dynamicquant_ck", [fp8, x, _tensor([tokens, 1], F32), w, eps, _scalar("0")]),
        ("aiter::rmsnorm_quant", [fp8, x, scale, w, eps, _scalar("128"), _scalar("False"), _scalar("False")]),
        ("sglang_profiler::fused_mxfp4_quant_fused_rms_mxfp4_quant",
         [x, w, eps, _tensor([tokens, 512], BF16), _tensor([512], BF16), eps, x, _scalar("False"), _scalar("False"),
          _scalar("False")]),
        ("aiter::_fuse_rmsnorm_fp4_quant", [x, w, eps, NONE, NONE, eps, NONE, _scalar("True")]),
        ("vllm::rocm_aiter_rmsnorm_fp8_group_quant", [x, w, eps, _scalar("128")]),
        ("aiter::rmsnorm2d_fwd_with_add_ck", [x, x, x, x, w, eps, _scalar("0")]),
        ("aiter::add_rmsnorm", [x, x, x, x, w, eps]),
        ("vllm::rocm_aiter_rmsnorm_with_add_fp8_group_quant", [x, x, w, eps, _scalar("128")]),
        ("vllm::rocm_aiter_triton_add_rmsnorm_pad", [_tensor([tokens, 2880], BF16), _tensor([2880], BF16), eps,
                                                     _tensor([tokens, 2880], BF16), _scalar("256")]),
        ("aiter::fused_add_rmsnorm_pad_", [x, w, eps, x, _scalar("0")]),
    ]


def ln_modulate(length: int, batch: int, hidden: int, backward: bool = False) -> list[tuple]:
    """Primus's ``fused_ln_modulate(x [T, B, H], scale [B, H], shift [B, H], eps)`` and its backward op
    ``(grad_out, x_norm, mean [B·T], rstd, mod_grad [B, H])``."""
    x, modulation = _tensor([length, batch, hidden], BF16), _tensor([batch, hidden], BF16)
    if backward:
        rows = _tensor([batch * length], F32)
        return [x, x, rows, rows, modulation]
    return [x, modulation, modulation, _scalar("1e-06", "Double")]


def gemms(tokens: int, k: int, n: int) -> list[tuple[str, list[tuple]]]:
    """aiter's, vLLM's and TransformerEngine's GEMMs, X [M, K] by W [N, K] (TE's B [K, N]), as they are called."""
    x, w = _tensor([tokens, k], BF16), _tensor([n, k], BF16)
    x8, w8, y = _tensor([tokens, k], FP8), _tensor([n, k], FP8), _tensor([tokens, n], BF16)
    te = [NONE] * 19
    te[0], te[5], te[10], te[18] = _tensor([k, tokens], FP8), _tensor([n, k], FP8), _tensor([tokens, n], BF16), NONE
    te_concrete = [(dims, dtype, strides, {4: "1", 9: "0", 14: ""}.get(at, value))
                   for at, (dims, dtype, strides, value) in enumerate(te)]
    return [
        ("aiter::gemm_a8w8_blockscale_ck", [x8, w8, _tensor([tokens, k // 128], F32),
                                            _tensor([n // 128, k // 128], F32), y]),
        ("aiter::gemm_a8w8_bpreshuffle", [x8, w8, _tensor([tokens, 1], F32), _tensor([n, 1], F32), y]),
        ("vllm::rocm_aiter_triton_gemm_a8w8_blockscale", [x8, w8]),
        ("aiter::gemm_a16w16", [x, w, NONE, _scalar("None", "")]),
        ("aiter::gemm_a16w16", [x, w, _tensor([n], BF16), _scalar("None", "")]),
        ("aiter::gemm_a16w16_atomic_", [x, w, NONE, _tensor([tokens, n], F32)]),
        ("aiter::_gemm_a16w16_asm", [x, w, y, _tensor([4], "unsigned int")]),
        ("vllm::gemm_with_dynamic_quant", [x, w8, _scalar("1", "Scalar"), y]),
        ("tex_ts::te_gemm_ts", te_concrete),
        ("_Linear_yfwd_mm", [x, _tensor([k, n], BF16)]),
        ("_LinearBackward_wgrad_mm", [x, _tensor([k, n], F32)]),  # A and B of different dtypes: no row
        ("primus_turbo_cpp_extension::hipblaslt_gemm_fp8",
         [x8, _tensor([], F32), w8, _tensor([], F32), _scalar("15"), _scalar("False"), _scalar("True"),
          _scalar("False"), _scalar("TENSORWISE", "String")]),
        ("primus_turbo::hipblaslt_gemm_fp4",
         [_tensor([tokens, k // 2], FP4), _tensor([tokens, k // 32], E8M0), _tensor([n, k // 2], FP4),
          _tensor([n, k // 32], E8M0), _scalar("15"), _scalar("False"), _scalar("True"), _scalar("True"),
          _scalar("MX_BLOCKWISE", "String")]),
        ("aiter::gemm_a4w4", [_tensor([tokens, k // 2], FP4), _tensor([n, k // 2], FP4), _tensor([tokens, k // 32], E8M0),
                              _tensor([n, k // 32], E8M0), y, _scalar("15"), _scalar("1.0"), _scalar("0.0"),
                              _scalar("True")]),
        ("aiter::gemm_afp4wfp4_", [_tensor([tokens, k // 2], U8), _tensor([n, k // 2], U8),
                                   _tensor([tokens, k // 32], U8), _tensor([n, k // 32], U8), NONE, y, NONE, NONE]),
        ("aiter::batched_gemm_a16wfp4_", [_tensor([4, tokens, k], BF16), _tensor([4, n, k // 2], U8),
                                          _tensor([4, n, k // 32], U8), NONE]),
        ("sglang_profiler::batched_gemm_a8w8_a_per_token_group_prequant_w_per_batched_tensor_quant"
         "_batched_gemm_a8w8_a_per_token_group_prequant_w_per_batched_tensor_quant",
         [_tensor([tokens, 4, k], BF16), _tensor([4, n, k], "signed char"), _tensor([1], F32), NONE]),
    ]


def elementwise(tokens: int, width: int) -> list[tuple[str, list[tuple]]]:
    """Gated activations, padding, upsampling, Liger's SiLU·mul, fp8 quantizations and rotary embeddings as they
    are called."""
    out, gate_up = _tensor([tokens, width], BF16), _tensor([tokens, 2 * width], BF16)
    image = _tensor([2, 16, 32, 32], BF16)
    fp8, x = _tensor([tokens, width], FP8), _tensor([tokens, width], BF16)
    return [
        ("_C::silu_and_mul", [out, gate_up]),
        ("aiter::silu_and_mul", [out, _tensor([tokens, 2 * width], F32)]),
        ("sgl_kernel::silu_and_mul", [out, gate_up]),
        ("aiter::gelu_and_mul", [out, gate_up]),
        ("aiter::gelu_tanh_and_mul", [out, gate_up]),
        ("aten::replication_pad2d", [image, _scalar("[1, 1, 2, 0]", "ScalarList")]),
        ("aten::upsample_nearest2d", [image, _scalar("[64, 64]", "ScalarList"), NONE, NONE]),
        ("LigerSiLUMulFunction", [x, x]),
        ("aiter::dynamic_per_token_scaled_quant", [fp8, x, _tensor([tokens, 1], F32), NONE, _scalar("False")]),
        ("aiter::dynamic_per_group_scaled_quant", [fp8, x, _tensor([tokens, width // 128], F32), NONE]),
        ("aiter::dynamic_per_tensor_quant", [fp8, x, _tensor([1], F32)]),
        ("vllm::triton_per_token_group_quant_fp8", [x, _scalar("64")]),
        ("vllm::triton_per_token_group_quant_fp8", [x, _scalar("None", "")]),
        ("primus_turbo_cpp_extension::quantize_fp8_tensorwise", [x, _tensor([], F32), _tensor([], F32)]),
        ("primus::quantize_mxfp4_dual", [_tensor([tokens + 1, width], BF16), _scalar("12"),
                                         *[_scalar("False")] * 10]),
        ("aiter::rope_cached_positions_2c_fwd_impl",
         [*[_tensor([1, tokens, heads, 128], BF16) for heads in (32, 8, 32, 8)], _tensor([4096, 1, 1, 64], BF16),
          _tensor([4096, 1, 1, 64], BF16), _tensor([1, tokens], LONG), _scalar("0"), _scalar("False"),
          _scalar("False")]),
        ("sgl_kernel::rotary_embedding", [_tensor([tokens], LONG), _tensor([tokens, 32 * 128], BF16),
                                          _tensor([tokens, 8 * 128], BF16), _scalar("128"),
                                          _tensor([4096, 64], F32), _scalar("True")]),
    ]


def fused_inference(tokens: int, width: int) -> list[tuple[str, list[tuple]]]:
    """MXFP4 activation quantizations, MLA's rotary embedding with the KV-cache write and exponential sampling."""
    x, fp4, scales = _tensor([tokens, width], BF16), _tensor([tokens, width // 2], U8), _tensor([tokens, width // 32], U8)
    sort = [_tensor([tokens * 8 + 64], INT), _tensor([2], INT)]
    q_nope, q_pe = _tensor([tokens, 16, 512], BF16), _tensor([tokens, 16, 64], BF16)
    cache, slots = _tensor([8192, 1, 576], FP8), _tensor([tokens], LONG)
    return [
        ("sglang_profiler::fused_mxfp4_quant_fused_flatten_mxfp4_quant", [_tensor([tokens, 16, 128], BF16)]),
        ("aiter::fused_dynamic_mx_quant_moe_sort_hip", [fp4, scales, x, *sort]),
        ("sglang_profiler::quant_dynamic_mxfp4_quant", [x, _scalar("False")]),
        ("aiter::fused_dynamic_mxfp4_quant_moe_sort_hip", [fp4, scales, x, *sort]),
        ("aiter::dynamic_per_group_scaled_quant_fp4", [fp4, x, scales, _scalar("32")]),
        ("aiter::fused_qk_rope_cat_and_cache_mla", [q_nope, q_pe, _tensor([tokens, 1, 512], BF16),
                                                     _tensor([tokens, 1, 64], BF16), cache, slots]),
        ("aiter::fused_qk_rope_concat_and_cache_mla", [q_nope, q_pe, _tensor([tokens, 512], BF16),
                                                        _tensor([tokens, 64], BF16), cache,
                                                        _tensor([tokens, 16, 576], FP8), slots]),
        ("aiter::mixed_sample_outer_exponential", [_tensor([tokens], INT), _tensor([tokens, 32000], BF16),
                                                    _tensor([tokens, 32000], F32), _scalar("1.0", "Double")]),
    ]


def custom_collectives(tokens: int, width: int) -> list[tuple[str, list[tuple]]]:
    """vLLM's, SGLang's and aiter's custom all-reduce, reduce-scatter and all-gather ops as they are called."""
    x, handle, w, eps = _tensor([tokens, width], BF16), _scalar("140213", "Scalar"), _tensor([width], BF16), \
        _scalar("1e-06", "Double")
    shard, gathered = _tensor([tokens // 8, width], BF16), _tensor([tokens * 8, width], BF16)
    return [
        ("_C_custom_ar::all_reduce", [handle, x, x, _scalar("0"), _scalar("8388608")]),
        ("_C_custom_ar::qr_all_reduce", [handle, x, x, _scalar("3"), _scalar("False")]),
        ("sgl_kernel::all_reduce_reg", [handle, x, x]),
        ("sgl_kernel::qr_all_reduce", [handle, x, x, _scalar("0"), _scalar("False")]),
        ("aiter::reduce_scatter", [handle, x, shard, NONE]),
        ("aiter::all_gather_reg", [handle, x, gathered]),
        ("sglang::reg_all_gather_into_tensor", [gathered, x, handle]),
        ("aiter::fused_allreduce_rmsnorm", [_tensor([1], LONG), NONE, x, x, x, x, w, eps, _scalar("False")]),
        ("aiter::fused_allreduce_rmsnorm_", [x, x, w, eps, _scalar("tp:0", "String"), _scalar("True"), _scalar("0"),
                                             _scalar("False")]),
    ]


def training(trace: Trace, t: float, seq: int, tokens: int) -> tuple[float, int]:
    """A training step of an MoE layer: dispatch, grouped GEMMs up and down, combine; the backward ops."""
    hidden, inter, experts = 1024, 512, 8
    forward = [  # (wrappers, op, args, kernels, backward (function, op, args, kernels) or None)
        ([], "MoEDispatch", [_tensor([tokens, hidden], BF16), _tensor([tokens, 2], LONG), _tensor([tokens, 2], F32)],
         [(DISPATCH, 14.0)], ("MoEDispatchBackward", None, None, [(COMBINE, 15.5)])),
        ([("primus_turbo::grouped_gemm", grouped_gemm(2 * tokens, hidden, 2 * inter, experts))],
         "primus_turbo::grouped_gemm_impl", grouped_gemm(2 * tokens, hidden, 2 * inter, experts),
         [(GROUPED, 22.0 + tokens / 64)], ("GroupedGemmFuncBackward", "primus_turbo::grouped_gemm_variable_k",
                                           grouped_gemm_variable_k(2 * tokens, hidden, 2 * inter, experts),
                                           [(GROUPED_WGRAD, 30.0)])),
        ([], "primus_turbo_cpp_extension::ck_grouped_gemm", grouped_gemm(2 * tokens, inter, hidden, experts, FP8, False),
         [(GROUPED, 18.25)], None),
        ([], "primus_turbo_cpp_extension::grouped_gemm", tensor_lists([tokens // 2, tokens, tokens // 2], hidden, inter),
         [(GROUPED, 9.5)], None),  # TensorList: no size, TraceLens's bytes fail (no row)
        ([], "primus_turbo_cpp_extension::grouped_gemm_variable_k",
         tensor_lists([tokens // 4, tokens, tokens // 4], hidden, inter), [(GROUPED_WGRAD, 11.0)], None),
        ([], "MoECombine", [_tensor([2 * tokens, hidden], BF16), _tensor([tokens, 2], F32)], [(COMBINE, 12.5)],
         ("MoECombineBackward", None, None, [(DISPATCH, 13.0)])),
        ([], "ConvBias_", conv_bias([tokens // 32, 64, 56, 56], [64, 64, 3, 3], 1, 1), [(CONV_BIAS, 31.0)],
         ("ConvBias_Backward", None, None, [(CONV_DGRAD, 33.0), (CONV_WGRAD, 29.5)])),
        ([], "ConvBiasReLU_", conv_bias([tokens // 32, 64, 56, 56], [128, 64, 1, 1], 2, 0), [(CONV_BIAS_RELU, 12.0)],
         ("ConvBiasReLU_Backward", None, None, [(CONV_DGRAD, 14.0), (CONV_WGRAD, 11.5)])),
        ([], "ConvBiasReLU_", conv_bias([tokens // 32, 64, 28, 28], [64, 64, 3, 3], 1, 1, "float"),
         [(CONV_BIAS_RELU, 10.0)],  # mixed dtypes: no row, nothing cached for its backward op
         ("ConvBiasReLU_Backward", None, None, [(CONV_DGRAD, 12.0), (CONV_WGRAD, 9.0)])),
        ([], "MambaSplitConv1dScanCombinedFn", mamba(tokens // 128, 256, 8, 64, 64), [(SSD, 48.0)],
         ("MambaSplitConv1dScanCombinedFnBackward", None, None, [(SSD_BWD, 96.0)])),
        ([], "primus::fused_ln_modulate", ln_modulate(256, tokens // 64, 1024), [(LN_MODULATE, 7.5)],
         ("FusedLnModulateFunctionBackward", "primus::fused_ln_modulate_backward",
          ln_modulate(256, tokens // 64, 1024, backward=True), [(LN_MODULATE_BWD, 11.25)])),
        ([], "DaoAILab::_causal_conv1d_fwd_cpp", [_tensor([tokens // 128, 640, 256], BF16), _tensor([640, 4], BF16),
                                                   _tensor([640], BF16), NONE, NONE, _scalar("True")],
         [(CAUSAL_CONV, 6.5)], None),
    ]
    return trace.step(t, seq, forward)


def inference(trace: Trace, t: float, tokens: int) -> float:
    """A decode step of an MoE layer through each kernel family, and the odd calls."""
    hidden, inter, experts, topk = 2048, 768, 64, 8
    calls = [
        ("aiter::topk_softplus", softplus(tokens, experts, topk), SOFTPLUS, 3.25),
        ("aiter::biased_grouped_topk_hip", router(tokens, experts, topk), TOPK, 4.0),
        ("sglang_profiler::fused_moe_triton_kernels_fused_append_shared_experts", append_shared(tokens, topk),
         APPEND, 2.5),
        ("aiter::moe_sorting_fwd", sorting(tokens, hidden, experts, topk), SORT, 5.5),
        ("aiter::mxfp4_moe_sort_hip", mx_sort(tokens, hidden, experts, topk), MX_SORT, 3.0),
        ("aiter::fmoe_g1u1", fmoe(tokens, hidden, inter, experts, str(topk), False), FMOE, 40.0 + tokens / 8),
        ("aiter::fmoe_fp8_blockscale_g1u1", fmoe(tokens, hidden, inter, experts, str(topk), True), FMOE_BLOCKSCALE,
         44.5),
        ("pseudo_op::moe_aiter_fused_1stage", [_tensor([tokens, hidden], BF16),
                                               _tensor([experts, 2 * inter, hidden], FP8),
                                               _tensor([experts, hidden, inter], FP8),
                                               _tensor([tokens, topk], F32)], FMOE, 39.0),
        *[(f"pseudo_op::moe_flydsl_stage{stage}", [_tensor([tokens, hidden], BF16),
                                                    _tensor([experts, 2 * inter, hidden], FP8),
                                                    _tensor([experts, hidden, inter], FP8),
                                                    _tensor([tokens, topk], F32)], FMOE, 18.0 + stage)
          for stage in (1, 2)],
        ("aiter::ck_moe_stage1", ck_stage(1, tokens, hidden, inter, experts, topk), CK_STAGE1, 21.0),
        ("aiter::ck_moe_stage2", ck_stage(2, tokens, hidden, inter, experts, topk), CK_STAGE2, 17.5),
        ("aiter::moe_cktile2stages_gemm1_ck", cktile_gemm(1, tokens, hidden, inter, experts, topk), CK_STAGE1, 20.0),
        ("aiter::moe_cktile2stages_gemm2_ck", cktile_gemm(2, tokens, hidden, inter, experts, topk), CK_STAGE2, 16.0),
        ("sglang_profiler::fused_moe_triton_kernels_invoke_fused_moe_kernel",
         triton_moe(tokens, 2 * inter, hidden, experts, topk), TRITON_MOE, 25.0),
        ("sglang_profiler::fused_moe_triton_kernels_invoke_fused_moe_kernel",
         triton_moe(tokens * topk, hidden, inter, experts, 1), TRITON_MOE, 19.0),
        ("aiter::_groupnorm_run", group_norm([2, 128, 16, 16]), GROUPNORM, 6.75),
        ("sglang::store_cache", store_cache(tokens, 1024), STORE, 2.25),
        ("aiter::pa_sparse_prefill_opus_fwd", sparse_prefill(4 * tokens, 16, 512), SPARSE, 35.0),
        ("aiter::mha_varlen_fwd", varlen(tokens, 32, 8, 128), VARLEN, 12.0),  # (the annotation-driven models:
        ("aiter::pa_decode_gluon", paged_decode(tokens, 32, 8, 128), PAGED, 9.0),  # no row without one)
        ("vllm::gdn_attention_core", gated_delta(tokens, 16, 128), GDN, 8.5),
        ("triton_poi_fused__to_copy_add_mul_silu_0", inductor([[tokens, 4096], [tokens, 4096], [4096]], tokens * 4096),
         "triton_poi_fused__to_copy_add_mul_silu_0", 3.5),
        ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_1",
         inductor([[tokens, 4096], [4096], [tokens, 4096]], tokens, 4096), "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_1",
         4.25),
        ("triton_per_fused_native_layer_norm_2", inductor([[tokens, 1024], [1024], [1024]], tokens, 1024, dtype="float"),
         "triton_per_fused_native_layer_norm_2", 2.75),
        ("triton_poi_fused_zzz_unknown_3", inductor([[tokens, 64]], tokens * 64), "triton_poi_fused_zzz_unknown_3", 1.5),
        ("triton_poi_fused_cat_4", [_tensor([tokens, 64], BF16)], "triton_poi_fused_cat_4", 1.25),  # no count: no model
        *[(f"aiter::mhc_{op}", mhc(kind, tokens, 4, 1024, 4), f"mhc_{op}_kernel", 5.0)
          for op, kind in (("post", "post"), ("pre_gemm_sqrsum", "pre_gemm"), ("pre_big_fuse_rmsnorm", "pre_rmsnorm"),
                           ("fused_post_pre_gemm_sqrsum", "fused"))],
        *[(name, args, RMS_FUSED, 4.0 + at / 4) for at, (name, args) in enumerate(rms_variants(tokens, 2048))],
        *[(name, args, GEMM_KERNELS[at % 3], 9.0 + at) for at, (name, args) in enumerate(gemms(tokens, 2048, 1536))],
        *[(name, args, ELEMENTWISE, 2.0 + at / 8) for at, (name, args) in enumerate(elementwise(tokens, 1024))],
        *[(name, args, FUSED, 3.0 + at / 4) for at, (name, args) in enumerate(fused_inference(tokens, 1024))],
        *[(name, args, CUSTOM_AR, 6.0 + at / 2) for at, (name, args) in enumerate(custom_collectives(tokens, 4096))],
        # odd calls: top-k not recorded, weights that do not parse (TraceLens gives these no row)
        ("aiter::fmoe_g1u1", fmoe(tokens, hidden, inter, experts, "", False), FMOE, 41.0),
        ("primus_turbo::grouped_gemm", [_tensor([tokens, hidden], BF16), _tensor([8, 100, 200], BF16)], GROUPED, 7.0),
    ]
    for name, args, kernel, length in calls:
        t = trace.op(1, t, name, args, [(kernel, length)]) + 3.0
    return t + 50.0


def build() -> dict:
    """The trace: three training steps and three decode steps (the last of each at another size: other rows)."""
    trace = Trace()
    t, seq = 0.0, 500
    for tokens in (256, 256, 512):
        t, seq = training(trace, t, seq, tokens)
    for tokens in (16, 16, 32):
        t = inference(trace, t, tokens)
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "AMD Instinct MI300X"}],
            "traceEvents": trace.events, "traceName": "extension_ops"}


def write(path: str) -> str:
    return dump(build(), path)


if __name__ == "__main__":
    write(sys.argv[1])
