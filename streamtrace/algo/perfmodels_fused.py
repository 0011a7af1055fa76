"""TraceLens's models of aiter's and SGLang's fused inference kernels with
sheets of their own: MXFP4 activation quantization (``GroupQuant``), MLA's
rotary embedding with the KV-cache write (``FusedRoPE``) and exponential
sampling (``elementwise``).

MXFP4 quantization of x (at the input each op's signature has): FLOPs 2 per
element, bytes x read, half a byte an element and a byte per 32 written.
MLA RoPE (q_nope [T, QH, D_lora], q_pe [T, QH, D_pe], k_nope or the latent
kv_c, k_pe, the cache): FLOPs 3 per rotated element of Q and K, bytes Q and
K read, Q written at the input's size (the ``concat`` form's at the output
dtype's) and the written cache rows at the cache's.  Sampling (logits [T,
V], noise): FLOPs 2·T·V, bytes both read and a 4-byte id a row written.
"""
from __future__ import annotations

from math import prod

from .perfmodel import PRECISION, size_of, spec_of

Result = tuple[dict, "int | float", "int | float | None", str]
# op -> (the input quantized, whether its strides are recorded in the parameters)
MXFP4_INPUT = {"sglang_profiler::fused_mxfp4_quant_fused_flatten_mxfp4_quant": (0, True),
               "aiter::fused_dynamic_mx_quant_moe_sort_hip": (2, True),
               "sglang_profiler::quant_dynamic_mxfp4_quant": (0, False),
               "aiter::fused_dynamic_mxfp4_quant_moe_sort_hip": (2, False),
               "aiter::dynamic_per_group_scaled_quant_fp4": (1, False)}


def mxfp4_quant(name: str, args: dict, kernels: list[str]) -> Result:
    at, strided = MXFP4_INPUT[name]
    shape, dtype = tuple(args["Input Dims"][at]), args["Input type"][at]
    params = {"op_shape": shape, "dtype_in_out": (dtype, dtype),
              "stride_input": tuple(args["Input Strides"][at]) if strided else None, "stride_output": None}
    count, size = prod(shape), size_of(dtype)
    moved = None if size is None else count * size + count * 0.5 + (count // 32) * 1
    return params, 2 * count, moved, spec_of("vector", dtype)


def _rope_size(args: dict) -> None:
    """TraceLens's rotary base sizes the first input first: a dtype that is no text fails."""
    types = args.get("Input type", [])
    dtype = types[0] if types else "c10::BFloat16"
    if dtype:
        size_of(dtype)


def mla_rope(name: str, args: dict, kernels: list[str]) -> Result:
    """aiter's ``fused_qk_rope_cat_and_cache_mla`` (K heads from k_nope) and ``_concat_and_cache_mla`` (one
    latent K head, q_out's dtype the sixth input's)."""
    dims, types = args["Input Dims"], args["Input type"]
    concat = name == "aiter::fused_qk_rope_concat_and_cache_mla"
    length, q_heads, lora = tuple(dims[0])
    params = {"T": length, "QH": q_heads, "KH": 1 if concat else tuple(dims[2])[1], "D_lora": lora,
              "D_pe": dims[1][2] if concat else tuple(dims[1])[2], "dtype_in": types[0],
              "dtype_kv": types[4] if len(types) > 4 and types[4] else types[0]}
    if concat:
        params["dtype_out"] = types[5] if len(types) > 5 and types[5] else types[0]
    _rope_size(args)
    size_in, size_kv = size_of(params["dtype_in"]), size_of(params["dtype_kv"])
    k_heads, pe = params["KH"], params["D_pe"]
    flops = 3 * (length * q_heads * pe + length * k_heads * pe)
    moved = None
    if size_in is not None:
        size_out = (size_of(params["dtype_out"]) or size_in) if concat else size_in
        size_kv = size_kv if size_kv is not None else size_in
        moved = ((length * q_heads * lora + length * q_heads * pe) * size_in
                 + (length * k_heads * lora + length * k_heads * pe) * size_in
                 + length * q_heads * (lora + pe) * size_out + length * k_heads * (lora + pe) * size_kv)
    precision = PRECISION.get(params["dtype_in"].lower())  # (unguarded in TraceLens: no text fails)
    return params, flops, moved, f"vector_{precision}" if precision else ""


def exponential_sample(name: str, args: dict, kernels: list[str]) -> Result:
    """aiter's ``mixed_sample_outer_exponential(out, logits [T, V], exp_noise, ...)``."""
    dims, types = args["Input Dims"], args["Input type"]
    logits = tuple(dims[1])
    params = {"T": logits[0] if len(logits) >= 1 else 1, "V": logits[1] if len(logits) >= 2 else 1,
              "dtype_logits": types[1] if len(types) > 1 else "c10::bfloat16",
              "dtype_noise": types[2] if len(types) > 2 else "float"}
    rows, vocab = params["T"], params["V"]
    size_logits, size_noise = size_of(params["dtype_logits"]), size_of(params["dtype_noise"])
    moved = None if size_logits is None or size_noise is None else (
        rows * vocab * size_logits + rows * vocab * size_noise + rows * 4)
    return params, 2 * rows * vocab, moved, spec_of("vector", params["dtype_logits"])


MODELS = {"GroupQuant": dict.fromkeys(MXFP4_INPUT, mxfp4_quant),
          "FusedRoPE": dict.fromkeys(("aiter::fused_qk_rope_cat_and_cache_mla",
                                      "aiter::fused_qk_rope_concat_and_cache_mla"), mla_rope),
          "elementwise": {"aiter::mixed_sample_outer_exponential": exponential_sample}}
