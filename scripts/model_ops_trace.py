"""A small hand-built Kineto trace of a training step whose ops carry their
shapes: attention (``aten::_scaled_dot_product_flash_attention`` and
``_efficient_attention``, flash-attn's ``flash_attn::_flash_attn_forward``
under ``FlashAttnFunc`` and its packed ``_varlen_`` form, aiter's and
flash-attn 3's ops), an fp8
``aten::_scaled_mm``, convolution, batch,
layer, group and RMS norm (aiter's too), TransformerEngine's fused rotary
embedding and cross entropy,
each forward op linked by its autograd sequence number to the backward op
that runs on the autograd thread.  None of the shared real traces has these
ops with ``record_shapes`` on; TraceLens's performance-model sheets for them
(``SDPA_fwd``, ``SDPA_bwd``, ``CONV_fwd``, ``CONV_bwd``, ``Normalization``,
``GEMM``)
are made from this one (scripts/tracelens_perf_reference.py), and the tests
compare analyze --ops with them.

Some ops are odd on purpose, as profilers and models give them: a
convolution without concrete inputs, a causal attention with query and key
lengths that differ, a norm with no shapes at all.

    python scripts/model_ops_trace.py OUT.json [--odd]

``--odd``: instead, the modelled ops called with odd argument lists (absent,
strings, nested or empty lists, zeros, lists as dtypes), one kernel each.
"""
from __future__ import annotations

import json
import sys

BF16, F32 = "c10::BFloat16", "float"
FLASH_FWD = ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 64, 4, false, false, "
             "cutlass::bfloat16_t, Flash_kernel_traits<64, 128, 64, 4, cutlass::bfloat16_t> >, false, true, false, "
             "false, true, true, false, false>(pytorch_flash::Flash_fwd_params)")
FLASH_BWD = ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<64, 128, 128, "
             "8, 4, 4, 4, false, false, cutlass::bfloat16_t, Flash_kernel_traits<64, 128, 128, 8, cutlass::bfloat16_t> "
             ">, false, true, false, false, false, true, false>(pytorch_flash::Flash_bwd_params)")
FLASH_BWD_CONVERT = ("void pytorch_flash::flash_bwd_convert_dq_kernel<Flash_bwd_kernel_traits<64, 128, 128, 8, 4, 4, 4, "
                     "false, false, cutlass::bfloat16_t, Flash_kernel_traits<64, 128, 128, 8, cutlass::bfloat16_t> > "
                     ">(pytorch_flash::Flash_bwd_params)")
EFFICIENT_FWD = "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::bfloat16_t, " \
    "cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)"
FA_FWD = ("void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::bfloat16_t, "
          "Flash_kernel_traits<64, 128, 128, 4, cutlass::bfloat16_t> >, false, true, false, false, false, true, false, "
          "false>(flash::Flash_fwd_params)")
FA_BWD = ("void flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<64, 128, 128, 8, 4, 4, 4, "
          "false, false, cutlass::bfloat16_t, Flash_kernel_traits<64, 128, 128, 8, cutlass::bfloat16_t> >, false, true, "
          "false, false, false, true, false, false>(flash::Flash_bwd_params)")
AITER_FWD = "_ZN5aiter25fmha_fwd_hd128_bf16_causalE"
AITER_BWD = "_ZN5aiter25fmha_bwd_hd128_bf16_causal_a32E"
EVOFORMER = "void attention_kernel<cutlass::bfloat16_t, cutlass::arch::Sm80, true, 64, 64>(AttentionKernel::Params)"
ROPE = "void transformer_engine::fused_rope_forward_kernel<__nv_bfloat16, float>(__nv_bfloat16 const*, float const*)"
XENT = "void transformer_engine::cross_entropy_kernel<__nv_bfloat16>(__nv_bfloat16 const*, long const*, float*)"
AITER_RMS = "_ZN7ck_tile6kentryILi1ENS_12Rmsnorm2dFwdE"
FP8 = "c10::Float8_e4m3fn"
SCALED_MM = "nvjet_qqtst_128x128_128x6_1x1_h_bz_coopA_TNT"
CONV_FWD = "void implicit_convolve_sgemm<float, float, 128, 5, 5, 3, 3, 3, 1, false, true, true>(int, int, int, " \
    "float const*, int, float*, float const*, kernel_conv_params, unsigned long long, int, float, float, int, " \
    "float const*, float const*, bool, int, int)"
CONV_DGRAD = "void cudnn::detail::dgrad_engine<float, 128, 6, 7, 3, 3, 5, false>(int, int, int, float const*, int, " \
    "float const*, int, float*, kernel_grad_params, unsigned long long, int, unsigned long long, int, float, int, int, int)"
CONV_WGRAD = "void cudnn::detail::wgrad_alg0_engine<float, 128, 5, 5, 3, 3, 3, false, 512>(int, int, int, " \
    "float const*, int, float*, float const*, kernel_grad_params, unsigned long long, int, float, int, int, int, int)"
BN_STATS = "void at::native::batch_norm_collect_statistics_kernel<at::native::Var, float, float, float, int>(" \
    "at::GenericPackedTensorAccessor<float const, 3ul, at::RestrictPtrTraits, int>, float, float, " \
    "at::GenericPackedTensorAccessor<float, 1ul, at::RestrictPtrTraits, int>, " \
    "at::GenericPackedTensorAccessor<float, 1ul, at::RestrictPtrTraits, int>)"
BN_APPLY = "void at::native::batch_norm_transform_input_kernel<float, float, float, true, int>(" \
    "at::GenericPackedTensorAccessor<float const, 3ul, at::RestrictPtrTraits, int>)"
BN_BWD = "void at::native::batch_norm_backward_kernel<float, float, float, int>(" \
    "at::GenericPackedTensorAccessor<float const, 3ul, at::DefaultPtrTraits, int>)"
LN_FWD = "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>(int, float, " \
    "c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)"
LN_BWD_INPUT = "void at::native::(anonymous namespace)::layer_norm_grad_input_kernel<c10::BFloat16, float>(" \
    "c10::BFloat16 const*, c10::BFloat16 const*, float const*, float const*, c10::BFloat16 const*, c10::BFloat16*, int)"
LN_BWD_WEIGHT = "void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernel_32x32<c10::BFloat16, float>(" \
    "long, long, c10::BFloat16 const*, c10::BFloat16 const*, float const*, float const*, c10::BFloat16*, c10::BFloat16*)"
GN_FWD = "void at::native::(anonymous namespace)::RowwiseMomentsCUDAKernel<float>(long, float, float const*, " \
    "float*, float*)"
RMS_FWD = "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float, true>(int, " \
    "float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)"

# an op's arguments: (dims, type, strides, concrete value) per input, as Kineto records them
def _contiguous(shape: list[int]) -> list[int]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.insert(0, step)
        step *= size
    return strides


def _tensor(shape: list[int], dtype: str) -> tuple:
    return (shape, dtype, _contiguous(shape), "")


def _scalar(value: str, dtype: str = "Scalar") -> tuple:
    return ([], dtype, [], value)


NONE = ([], "", [], "")


def attention(batch: int, heads: int, length_q: int, length_kv: int, dim: int, causal: bool) -> list[tuple]:
    return [_tensor([batch, heads, length_q, dim], BF16), _tensor([batch, heads, length_kv, dim], BF16),
            _tensor([batch, heads, length_kv, dim], BF16), _scalar("0."), _scalar(str(causal)),
            _scalar("False"), NONE]


def attention_backward(batch: int, heads: int, length: int, dim: int) -> list[tuple]:
    q = [batch, heads, length, dim]
    return [_tensor(q, BF16), _tensor(q, BF16), _tensor(q, BF16), _tensor(q, BF16), _tensor(q, BF16),
            _tensor([batch, heads, length], F32), NONE, NONE, _scalar(str(length), "Scalar"),
            _scalar(str(length), "Scalar"), _scalar("0."), _scalar("True"), _tensor([], "long int"),
            _tensor([], "long int"), NONE]


def efficient_attention(batch: int, heads: int, length: int, dim: int) -> list[tuple]:
    q = [batch, heads, length, dim]
    return [_tensor(q, BF16), _tensor(q, BF16), _tensor(q, BF16), NONE, _scalar("True"), _scalar("0."),
            _scalar("False"), NONE]


def flash_attn(batch: int, length: int, heads: int, dim: int) -> list[tuple]:
    """flash-attn 2's ``_flash_attn_forward(q, k, v, dropout_p, softmax_scale, causal, ...)``, q/k/v [B, N, H, d]."""
    q = [batch, length, heads, dim]
    return [_tensor(q, BF16), _tensor(q, BF16), _tensor(q, BF16), _scalar("0."), _scalar("0.125"), _scalar("True"),
            _scalar("-1"), _scalar("-1"), _scalar("0."), NONE, _scalar("False")]


def flash_attn_backward(batch: int, length: int, heads: int, dim: int) -> list[tuple]:
    """``_flash_attn_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, dropout_p, softmax_scale, causal, ...)``."""
    q = [batch, length, heads, dim]
    return [*[_tensor(q, BF16)] * 5, _tensor([batch, heads, length], F32), *[_tensor(q, BF16)] * 3, _scalar("0."),
            _scalar("0.125"), _scalar("True"), _scalar("-1"), _scalar("-1"), _scalar("0."), NONE, _scalar("False"),
            _tensor([2], "long int")]


def scaled_mm(m: int, k: int, n: int) -> list[tuple]:
    """``_scaled_mm(self, mat2, scale_a, scale_b, bias, scale_result, out_dtype, use_fast_accum)``, B column-major."""
    return [_tensor([m, k], FP8), ([k, n], FP8, [1, k], ""), _tensor([], F32), _tensor([], F32), NONE, NONE,
            _scalar("15"), _scalar("False")]


def flash_attn_varlen(tokens: int, sequences: int, longest: int, heads: int, dim: int) -> list[tuple]:
    """``_flash_attn_varlen_forward(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
    softmax_scale, causal, ...)``, q/k/v [T, H, d]."""
    q = [tokens, heads, dim]
    return [_tensor(q, BF16), _tensor(q, BF16), _tensor(q, BF16), _tensor([sequences + 1], "int"),
            _tensor([sequences + 1], "int"), _scalar(str(longest)), _scalar(str(longest)), _scalar("0."),
            _scalar("0.125"), _scalar("True"), _scalar("-1"), _scalar("-1"), _scalar("0."), NONE, _scalar("False")]


def flash_attn_varlen_backward(tokens: int, sequences: int, longest: int, heads: int, dim: int) -> list[tuple]:
    """``_flash_attn_varlen_backward(dout, q, k, v, out, softmax_lse, dq, dk, dv, cu_seqlens_q, cu_seqlens_k,
    max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale, causal, ...)``."""
    q = [tokens, heads, dim]
    return [*[_tensor(q, BF16)] * 5, _tensor([heads, tokens], F32), *[_tensor(q, BF16)] * 3,
            _tensor([sequences + 1], "int"), _tensor([sequences + 1], "int"), _scalar(str(longest)),
            _scalar(str(longest)), _scalar("0."), _scalar("0.125"), _scalar("True"), _scalar("-1"), _scalar("-1"),
            _scalar("0."), NONE, _scalar("False"), _tensor([2], "long int")]


def aiter_attention(length: int, first: int, dropout_at: int | None, causal_at: int, count: int) -> list[tuple]:
    """aiter's (and flash-attn 3's) attention ops: ``count`` inputs, q/k/v [B, N, H, d] from ``first`` on
    (tensors before them shaped alike), dropout_p and is_causal where each op's signature has them."""
    q = [2, length, 8, 128]
    args = [_tensor(q, BF16) if at < first + 3 else _scalar("") for at in range(count)]
    if dropout_at is not None:
        args[dropout_at] = _scalar("0.0")
    args[causal_at] = _scalar("True")
    return args


def evoformer(depth: int) -> list[tuple]:
    """DeepSpeed's ``EvoformerAttention(Q, K, V, res_mask, pair_bias)``, Q/K/V [B, N_seq, N_res, H, d]."""
    q = [1, depth, 64, 4, 32]
    return [_tensor(q, BF16), _tensor(q, BF16), _tensor(q, BF16), _tensor([1, depth, 1, 1, 64], BF16),
            _tensor([1, 1, 4, 64, 64], BF16)]


def convolution(x: list[int], w: list[int], stride: int, padding: int, bias: bool) -> list[tuple]:
    spatial = len(x) - 2
    pair = "[" + ", ".join([str(stride)] * spatial) + "]"
    pad = "[" + ", ".join([str(padding)] * spatial) + "]"
    return [_tensor(x, F32), _tensor(w, F32), _tensor([w[0]], F32) if bias else NONE, _scalar(pair, "ScalarList"),
            _scalar(pad, "ScalarList"), _scalar("[" + ", ".join(["1"] * spatial) + "]", "ScalarList"),
            _scalar("False"), _scalar("[" + ", ".join(["0"] * spatial) + "]", "ScalarList"), _scalar("1")]


def convolution_backward(x: list[int], w: list[int], out: list[int], bias: bool) -> list[tuple]:
    spatial = len(x) - 2
    ones = "[" + ", ".join(["1"] * spatial) + "]"
    return [_tensor(out, F32), _tensor(x, F32), _tensor(w, F32), _scalar(f"[{w[0]}]" if bias else "", "ScalarList"),
            _scalar(ones, "ScalarList"), _scalar(ones, "ScalarList"), _scalar(ones, "ScalarList"),
            _scalar("False"), _scalar("[" + ", ".join(["0"] * spatial) + "]", "ScalarList"), _scalar("1"),
            _scalar(f"[True, True, {bias}]", "ScalarList")]


def batch_norm(x: list[int], training: str) -> list[tuple]:
    c = [x[1]]
    return [_tensor(x, F32), _tensor(c, F32), _tensor(c, F32), _tensor(c, F32), _tensor(c, F32), _scalar(training),
            _scalar("0.1", "Double"), _scalar("1e-05", "Double")]


def batch_norm_backward(x: list[int]) -> list[tuple]:
    c = [x[1]]
    return [_tensor(x, F32), _tensor(x, F32), _tensor(c, F32), _tensor(c, F32), _tensor(c, F32), _tensor(c, F32),
            _tensor(c, F32), _scalar("True"), _scalar("1e-05", "Double"), _scalar("[True, True, True]", "ScalarList")]


def layer_norm(x: list[int], normalized: int) -> list[tuple]:
    return [_tensor(x, BF16), _scalar(f"[{normalized}]", "ScalarList"), _tensor([normalized], BF16),
            _tensor([normalized], BF16), _scalar("1e-05", "Double")]


def layer_norm_backward(x: list[int], normalized: int) -> list[tuple]:
    stats = [*x[:-1], 1]
    return [_tensor(x, BF16), _tensor(x, BF16), _scalar(f"[{normalized}]", "ScalarList"), _tensor(stats, F32),
            _tensor(stats, F32), _tensor([normalized], BF16), _tensor([normalized], BF16),
            _scalar("[True, True, True]", "ScalarList")]


def group_norm(x: list[int], groups: int) -> list[tuple]:
    c = [x[1]]
    hw = 1
    for size in x[2:]:
        hw *= size
    return [_tensor(x, F32), _tensor(c, F32), _tensor(c, F32), _scalar(str(x[0])), _scalar(str(x[1])),
            _scalar(str(hw)), _scalar(str(groups)), _scalar("1e-05", "Double")]


def rms_norm(x: list[int], normalized: int) -> list[tuple]:
    return [_tensor(x, BF16), _scalar(f"[{normalized}]", "ScalarList"), _tensor([normalized], BF16),
            _scalar("1e-06", "Double")]


def _shape_args(args: list[tuple] | None) -> dict:
    """Kineto's four argument lists of an op recorded with its shapes (none without)."""
    if args is None:
        return {}
    return {"Input Dims": [a[0] for a in args], "Input type": [a[1] for a in args],
            "Input Strides": [a[2] for a in args], "Concrete Inputs": [a[3] for a in args]}


class Trace:
    """Events appended in time order per thread, kernels on the GPU in launch order."""

    def __init__(self) -> None:
        self.events: list[dict] = [
            {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python3"}},
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "main"}},
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "autograd"}},
            {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}},
        ]
        self.external = 0
        self.correlation = 0
        self.gpu_clock = 10_000.0

    def op(self, tid: int, ts: float, name: str, args: list[tuple] | None, kernels: list[tuple[str, float]],
           seq: int | None = None) -> float:
        """One CPU op (its launches inside it, one per kernel); its end."""
        self.external += 1
        ext = self.external
        dur = 4.0 + 6.0 * len(kernels)
        event_args: dict = {"External id": ext, "Record function id": 0}
        if seq is not None:
            event_args["Sequence number"] = seq
            event_args["Fwd thread id"] = 0 if tid == 1 else 1
        event_args.update(_shape_args(args))
        self.events.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts,
                            "dur": dur, "args": event_args})
        at = ts + 2.0
        for kernel, length in kernels:
            self.correlation += 1
            corr = self.correlation
            self.events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": tid,
                                "ts": at, "dur": 3.5, "args": {"External id": ext, "correlation": corr,
                                                               "cbid": 211}})
            self.events.append({"ph": "s", "id": corr, "pid": 1, "tid": tid, "ts": at, "cat": "ac2g",
                                "name": "ac2g"})
            start = max(self.gpu_clock, at + 5.0)
            self.events.append({"ph": "X", "cat": "kernel", "name": kernel, "pid": 0, "tid": 7, "ts": start,
                                "dur": length, "args": {"External id": ext, "correlation": corr, "stream": 7,
                                                        "device": 0, "context": 1}})
            self.events.append({"ph": "f", "id": corr, "pid": 0, "tid": 7, "ts": start, "cat": "ac2g",
                                "name": "ac2g", "bp": "e"})
            self.gpu_clock = start + length + 1.5
            at += 6.0
        return ts + dur

    def wrapped(self, tid: int, ts: float, outer: list[tuple[str, list[tuple] | None]], name: str,
                args: list[tuple] | None, kernels: list[tuple[str, float]], seq: int | None = None,
                backward: bool = False) -> float:
        """An op inside wrappers (``aten::conv2d`` > ``aten::convolution``, the autograd function of a
        backward op ...), each wrapper starting 1 us earlier and ending 1 us later; its end.  The sequence
        number goes on every forward op, and on the outermost wrapper alone of a backward op."""
        wrappers = []
        for level, (wrapper, shapes) in enumerate(outer):
            self.external += 1
            wrapper_args: dict = {"External id": self.external, "Record function id": 0, **_shape_args(shapes)}
            if seq is not None and (not backward or level == 0):
                wrapper_args["Sequence number"] = seq
                wrapper_args["Fwd thread id"] = 1 if backward else 0
            wrappers.append({"ph": "X", "cat": "cpu_op", "name": wrapper, "pid": 1, "tid": tid, "ts": ts + level,
                             "dur": 0.0, "args": wrapper_args})
            self.events.append(wrappers[-1])
        end = self.op(tid, ts + len(outer), name, args, kernels, None if backward else seq)
        for back, wrapper in enumerate(reversed(wrappers)):
            wrapper["dur"] = end + 1 + back - wrapper["ts"]
        return end + len(outer)


    def step(self, t: float, seq: int, forward: list[tuple]) -> tuple[float, int]:
        """A training step: the forward ops on the main thread, each given the next sequence number, then the
        backward ops on the autograd thread in reverse order; its end and the last sequence number.
        ``forward``: (wrappers with their args, op, args, kernels, backward: (autograd function, op, args,
        kernels), or None); a backward op of None is the function itself launching the kernels (it then
        carries the sequence number too)."""
        backward = []
        for wrappers, name, args, kernels, back in forward:
            seq += 1
            t = self.wrapped(1, t, wrappers, name, args, kernels, seq if back else None) + 3.0
            if back is not None:
                backward.append((seq, back))
        t += 20.0
        for seq_of, (function, name, args, kernels) in reversed(backward):
            outer = [(f"autograd::engine::evaluate_function: {function}", None)]
            if name is None:
                first = len(self.events)
                t = self.wrapped(2, t, outer, function, None, kernels, seq_of, backward=True) + 3.0
                self.events[first + 1]["args"].update({"Sequence number": seq_of, "Fwd thread id": 1})
            else:
                t = self.wrapped(2, t, [*outer, (function, None)], name, args, kernels, seq_of, backward=True) + 3.0
        return t + 50.0, seq


def build() -> dict:
    """The trace: three training steps of a small conv + attention model."""
    trace = Trace()
    t = 0.0
    seq = 100
    for step in range(3):
        length = 128 if step < 2 else 256  # the last step at another sequence length: other rows
        batch_x = [8, 3, 32, 32]
        conv_w = [16, 3, 3, 3]
        conv_out = [8, 16, 32, 32]
        hidden = [4, length, 256]
        conv = convolution(batch_x, conv_w, 1, 1, True)
        norm = batch_norm(conv_out, "True")
        layer = layer_norm(hidden, 256)
        groups = group_norm(conv_out, 4)
        flash = attention(2, 8, length, length, 64, True)
        efficient = efficient_attention(2, 4, length, 64)
        forward = [  # (wrappers with their args, op, args, kernels, backward: (function, op, args, kernels) or None)
            ([("aten::conv2d", [*conv[:6], conv[8]])], "aten::convolution", conv, [(CONV_FWD, 41.5)],
             ("ConvolutionBackward0", "aten::convolution_backward",
              convolution_backward(batch_x, conv_w, conv_out, True), [(CONV_DGRAD, 52.0), (CONV_WGRAD, 38.25)])),
            ([("aten::batch_norm", [*norm, _scalar("True")]), ("aten::_batch_norm_impl_index", [*norm, _scalar("True")])],
             "aten::native_batch_norm", norm, [(BN_STATS, 9.5), (BN_APPLY, 7.0)],
             ("NativeBatchNormBackward0", "aten::native_batch_norm_backward", batch_norm_backward(conv_out),
              [(BN_BWD, 12.75)])),
            ([("aten::group_norm", [groups[0], groups[6], groups[1], groups[2], groups[7], _scalar("True")])],
             "aten::native_group_norm", groups, [(GN_FWD, 8.0)], None),
            ([("aten::layer_norm", [*layer, _scalar("True")])], "aten::native_layer_norm", layer, [(LN_FWD, 6.5)],
             ("NativeLayerNormBackward0", "aten::native_layer_norm_backward", layer_norm_backward(hidden, 256),
              [(LN_BWD_INPUT, 7.25), (LN_BWD_WEIGHT, 5.0)])),
            ([("aten::rms_norm", rms_norm(hidden, 256))], "aten::_fused_rms_norm", rms_norm(hidden, 256),
             [(RMS_FWD, 5.5)], None),
            ([("aten::scaled_dot_product_attention", [*flash[:3], NONE, *flash[3:5], NONE, _scalar("False")])],
             "aten::_scaled_dot_product_flash_attention", flash, [(FLASH_FWD, 30.0 + length / 16)],
             ("ScaledDotProductFlashAttentionBackward0", "aten::_scaled_dot_product_flash_attention_backward",
              attention_backward(2, 8, length, 64), [(FLASH_BWD, 70.0 + length / 8), (FLASH_BWD_CONVERT, 3.0)])),
            ([("aten::scaled_dot_product_attention", [*efficient[:3], NONE, _scalar("0."), _scalar("False"), NONE,
                                                       _scalar("False")])],
             "aten::_scaled_dot_product_efficient_attention", efficient, [(EFFICIENT_FWD, 21.0)], None),
            ([], "aten::_scaled_mm", scaled_mm(4 * length, 256, 512), [(SCALED_MM, 9.25)], None),
            ([("FlashAttnFunc", None), ("aiter::_flash_attn_forward", aiter_attention(length, 0, 3, 5, 12))],
             "aiter::mha_fwd", aiter_attention(length, 0, 3, 5, 14), [(AITER_FWD, 24.0)],
             ("FlashAttnFuncBackward", "aiter::mha_bwd", aiter_attention(length, 1, 6, 8, 16), [(AITER_BWD, 55.0)])),
            *[([], name, aiter_attention(length, *layout), [(AITER_FWD, 20.5)], None) for name, layout in (
                ("aiter::_flash_attn_backward", (0, 10, 12, 18)), ("aiter::wrapper_fmha_v3_fwd", (1, 4, 6, 12)),
                ("aiter::wrapper_fmha_v3_bwd", (1, 7, 9, 16)), ("flash_attn_3::fwd", (0, None, 24, 30)))],
            ([], "EvoformerAttention", evoformer(length // 32), [(EVOFORMER, 15.75)], None),
            ([], "FusedRoPEFunc", [_tensor([length, 2, 8, 64], BF16), _tensor([length, 1, 1, 64], F32)],
             [(ROPE, 3.75)], None),
            ([], "CrossEntropyFunction", [_tensor([8, 1, 32000], BF16), _tensor([8, 1], "long int")], [(XENT, 11.5)],
             None),
            ([], "aiter::rms_norm", [_tensor(hidden, BF16), _tensor([256], BF16), _scalar("1e-06", "Double")],
             [(AITER_RMS, 4.5)], None),
            ([], "aiter::rmsnorm2d_fwd_ck", [_tensor(hidden, BF16), _tensor([256], BF16), _scalar("1e-06", "Double")],
             [(AITER_RMS, 4.25)], None),
            ([], "aiter::rmsnorm", [_tensor(hidden, BF16), _tensor(hidden, BF16), _tensor([256], BF16),
                                    _scalar("1e-06", "Double")], [(AITER_RMS, 4.75)], None),
            ([("FlashAttnVarlenFunc", None)], "flash_attn::_flash_attn_varlen_forward",
             flash_attn_varlen(length + 172, 3, length, 8, 64), [(FA_FWD, 33.5)],
             ("FlashAttnVarlenFuncBackward", "flash_attn::_flash_attn_varlen_backward",
              flash_attn_varlen_backward(length + 172, 3, length, 8, 64), [(FA_BWD, 70.25)])),
            ([("FlashAttnFunc", None)], "flash_attn::_flash_attn_forward", flash_attn(2, length, 8, 64),
             [(FA_FWD, 27.0 + length / 32)], ("FlashAttnFuncBackward", "flash_attn::_flash_attn_backward",
                                              flash_attn_backward(2, length, 8, 64), [(FA_BWD, 61.5)])),
        ]
        if step == 1:  # odd shapes: TraceLens's models fail on these and it leaves them out of its sheets
            odd_conv = convolution(batch_x, conv_w, 1, 1, False)
            odd_conv = [(dims, dtype, strides, "") for dims, dtype, strides, _ in odd_conv]  # no concrete inputs
            forward += [
                ([], "aten::convolution", odd_conv, [(CONV_FWD, 40.0)], None),
                ([], "aten::_scaled_dot_product_flash_attention", attention(2, 8, 64, length, 64, True),
                 [(FLASH_FWD, 25.0)], None),  # causal with query and key lengths that differ
                ([], "aten::native_layer_norm", None, [(LN_FWD, 6.0)], None),  # no shapes recorded
            ]
        t, seq = trace.step(t, seq, forward)
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}],
            "traceEvents": trace.events, "traceName": "model_ops"}


# the modelled ops the odd trace calls with odd arguments
ODD_OPS = ("aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_efficient_attention",
           "aten::_scaled_dot_product_cudnn_attention", "FlashAttnFunc", "flash_attn::_flash_attn_forward",
           "flash_attn::_flash_attn_backward", "flash_attn::_flash_attn_varlen_forward",
           "flash_attn::_flash_attn_varlen_backward", "aiter::mha_fwd", "aiter::mha_bwd", "aiter::_flash_attn_backward",
           "flash_attn_3::fwd", "EvoformerAttention", "aten::convolution", "aten::convolution_backward",
           "aten::native_batch_norm",
           "aten::cudnn_batch_norm_backward", "aten::native_batch_norm_backward", "aten::native_layer_norm",
           "aten::native_layer_norm_backward", "aten::native_group_norm", "aten::native_group_norm_backward",
           "aten::instance_norm", "aten::native_instance_norm_backward", "aten::_fused_rms_norm",
           "aten::_fused_rms_norm_backward", "aiter::rms_norm", "aiter::rmsnorm", "aten::_scaled_mm", "aten::mm",
           "aten::add", "aten::sum", "FusedRoPEFunc", "CrossEntropyFunction", "primus_turbo::grouped_gemm",
           "primus_turbo::grouped_gemm_variable_k", "MoEDispatch", "aiter::fmoe_g1u1", "pseudo_op::moe_aiter_fused_1stage",
           "aiter::ck_moe_stage1", "aiter::ck_moe_stage2", "aiter::moe_cktile2stages_gemm1_ck",
           "aiter::moe_cktile2stages_gemm2_ck", "sglang_profiler::fused_moe_triton_kernels_invoke_fused_moe_kernel",
           "aiter::biased_grouped_topk_hip", "aiter::moe_sorting_fwd", "aiter::topk_softplus",
           "sglang_profiler::fused_moe_triton_kernels_fused_append_shared_experts", "aiter::pa_sparse_prefill_opus_fwd",
           "sglang::store_cache", "aiter::mha_varlen_fwd", "vllm::gdn_attention_core", "ConvBias_", "aiter::_groupnorm_run",
           "triton_poi_fused_add_mul_0", "triton_red_fused_sum_1", "aiter::rmsnorm_quant",
           "vllm::rocm_aiter_triton_add_rmsnorm_pad", "sglang_profiler::fused_mxfp4_quant_fused_rms_mxfp4_quant",
           "aiter::rmsnorm2d_fwd_with_add_ck", "primus::fused_ln_modulate", "MambaSplitConv1dScanCombinedFn",
           "DaoAILab::_causal_conv1d_fwd_cpp", "aiter::mhc_post", "aiter::mhc_fused_post_pre_gemm_sqrsum",
           "aiter::gemm_a8w8_blockscale_ck", "aiter::gemm_a16w16", "aiter::_gemm_a16w16_asm", "tex_ts::te_gemm_ts",
           "vllm::gemm_with_dynamic_quant", "_Linear_yfwd_mm", "_C::silu_and_mul", "aten::replication_pad2d",
           "aten::upsample_nearest2d", "LigerSiLUMulFunction", "aiter::dynamic_per_token_scaled_quant",
           "vllm::triton_per_token_group_quant_fp8", "aiter::rope_cached_positions_2c_fwd_impl",
           "sgl_kernel::rotary_embedding", "primus_turbo::hipblaslt_gemm_fp8", "primus_turbo::hipblaslt_gemm_fp4",
           "aiter::gemm_a4w4", "aiter::gemm_afp4wfp4_", "aiter::batched_gemm_a16wfp4_",
           "primus::quantize_mxfp4_dual", "primus_turbo::quantize_fp8_tensorwise",
           "aiter::fused_dynamic_mx_quant_moe_sort_hip", "sglang_profiler::quant_dynamic_mxfp4_quant",
           "aiter::fused_qk_rope_cat_and_cache_mla", "aiter::fused_qk_rope_concat_and_cache_mla",
           "aiter::mixed_sample_outer_exponential", "_C_custom_ar::all_reduce", "aiter::reduce_scatter",
           "sglang::reg_all_gather_into_tensor", "aiter::fused_allreduce_rmsnorm", "aiter::fused_allreduce_rmsnorm_")
# argument lists as odd traces give them: absent, a string, nested or empty lists, zeros, lists as dtypes ...
ODD_VALUES = (None, "weird", [[2, "x"]], [[1, 2, 3, 4]] * 12, [[0, 0, 0, 0]] * 12, [["[1]"]] * 12,
              ["", "[", "1e9999", "None", "[[1]", "()", "True"] * 3, [[2, 2], [2]])


def build_odd() -> dict:
    """A trace of the modelled ops called with odd argument lists, each launching one kernel."""
    trace = Trace()
    keys = ("Input Dims", "Input type", "Input Strides", "Concrete Inputs")
    ts = 0.0
    for number, name in enumerate(ODD_OPS):
        for first in range(len(ODD_VALUES)):
            values = [ODD_VALUES[(first + i) % len(ODD_VALUES)] for i in range(len(keys))]
            trace.wrapped(1, ts, [], name, None, [(f"kernel_{number}", 3.0)])
            trace.events[-5]["args"].update({key: value for key, value in zip(keys, values) if value is not None})
            ts += 20.0
    return {"traceEvents": trace.events}


def dump(document: dict, path: str) -> str:
    """``document`` written as JSON to ``path`` (returned): what every trace script here writes."""
    with open(path, "w") as out:
        json.dump(document, out)
    return path


def write(path: str, odd: bool = False) -> str:
    return dump(build_odd() if odd else build(), path)


if __name__ == "__main__":
    write(sys.argv[1], odd="--odd" in sys.argv[2:])
