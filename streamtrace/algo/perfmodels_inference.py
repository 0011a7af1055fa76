"""TraceLens's inference-attention models (sheet ``InferenceAttention``:
vLLM's, SGLang's and aiter's paged and packed attention, KV-cache writes).

Most of them read the batch's query and key lengths (``c_sq``, ``g_sqsk``
...) from the iteration annotation enclosing the op, which TraceLens's
report attaches to ``vllm::unified_attention_with_output`` alone: on every
other op the annotation is absent, the model gives no FLOPs, and
TraceLens's arithmetic on that fails (no row in the sheet, kernel time
only in the unified summary; the gated delta net's model raises
``NotImplementedError`` instead, so its op has no unified row either).
Two models read the op's own shapes: aiter's sparse prefill
(``pa_sparse_prefill_opus_fwd``: FLOPs 2·pairs·H_Q·(d_qk + d_v), bytes Q
read and O written plus the attended KV slots) and SGLang's KV-cache write
(``store_cache``: no FLOPs, 4·T·D elements).  vLLM's
``unified_attention_with_output`` reads the annotation TraceLens gives it
(:mod:`.iterannotation`, under :data:`ANNOTATION` in its args).
"""
from __future__ import annotations

from math import prod

from .iterannotation import ANNOTATED_PREFIX, chunk_stats
from .perfmodel import size_of, spec_of

Result = tuple[dict, int, int, str]


def sparse_prefill(name: str, args: dict, kernels: list[str]) -> Result:
    """``aiter::pa_sparse_prefill_opus_fwd``: Q [N_Q, H_Q, d]; the attended (token, slot) pairs the lengths
    of inputs 3 and 6 (the prefix and in-chunk KV indices); one latent KV head."""
    dims, types = args["Input Dims"], args["Input type"]
    length, heads, dim = dims[0][0], dims[0][1], dims[0][2]
    pairs = int(dims[2][0]) + int(dims[5][0])
    dtype_q = types[0]
    dtype_kv = types[1] if len(types) > 1 else dtype_q
    params = {"B": 1, "N_Q": length, "H_Q": heads, "H_V": 1, "H_K": 1, "N_KV": pairs, "H_KV": 1, "d_h_qk": dim,
              "d_h_v": dim, "dropout": 0.0, "causal": False, "flash_impl": True, "prefill_pairs": pairs,
              "dtype_Q": dtype_q, "dtype_KV": dtype_kv}
    size = size_of(dtype_q) or 2
    size_kv = (size_of(dtype_kv) if dtype_kv else None) or size
    moved = 2 * length * heads * dim * size + pairs * dim * size_kv
    return params, pairs * heads * 2 * (dim + dim), moved, spec_of("matrix", dtype_q or "c10::bfloat16")


def store_cache(name: str, args: dict, kernels: list[str]) -> Result:
    """``sglang::store_cache(k [T, D], v, k_cache, v_cache, indices)``: k and v read, their rows of the
    caches written, at k's dtype size (2 bytes when it has none)."""
    shape = tuple(args["Input Dims"][0])
    dtype = args["Input type"][0]
    size = size_of(dtype) if dtype else None
    count = prod(shape)
    moved = 4 * count * (size if size is not None else 2)
    return {"op_shape": shape, "nelems": count, "dtype": dtype}, 0, moved, spec_of("vector", dtype)


ANNOTATION = "annotation"  # (the args member holding the name of the annotation enclosing the op)


def unified_attention(name: str, args: dict, kernels: list[str]) -> Result:
    """vLLM's ``unified_attention_with_output(q [N_Q, H_Q, d], k [..., N_KV, H_KV, d_v], ...)`` over the
    sums its annotation states: FLOPs 2·H_Q·(d_qk + d_v)·(c_sqsk + g_sqsk) less H_Q·(d_qk + d_v)·c_sqsq
    (the causal half of each chunk); bytes Q read, O written and the new K, V at q's size, the cached
    K, V at k's.  Without those sums (or with odd shapes) TraceLens has no FLOPs and its arithmetic on
    them fails; with both query sums 0 it declines."""
    sums = chunk_stats(str(args.get(ANNOTATION)))
    if sums is None:
        raise TypeError(f"{name}: no query and key sums in its annotation, no FLOPs")
    try:
        dims, types = args["Input Dims"], args["Input type"]
        length, heads, dim_qk = dims[0]
        length_kv, heads_kv, dim_v = dims[1][-3:]
        dtype_q = types[0]
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        raise TypeError(f"{name}: arguments the model cannot read, no FLOPs") from exc
    dtype_kv = types[1] if len(types) > 1 else dtype_q
    params = {"B": 1, "N_Q": length, "H_Q": heads, "H_V": heads_kv, "H_K": heads_kv, "N_KV": length_kv,
              "H_KV": heads_kv, "d_h_qk": dim_qk, "d_h_v": dim_v, "dropout": 0.0, "causal": False,
              "flash_impl": True, **sums, "dtype_Q": dtype_q, "dtype_KV": dtype_kv}
    if sums["c_sq"] == 0 and sums["g_sq"] == 0:
        raise NotImplementedError(f"{name}: no query tokens in its annotation")
    flops = (heads * (2 * sums["c_sqsk"] * dim_qk) + heads * (2 * sums["c_sqsk"] * dim_v)
             - heads * sums["c_sqsq"] * dim_qk - heads * sums["c_sqsq"] * dim_v
             + heads * (2 * sums["g_sqsk"] * dim_qk) + heads * (2 * sums["g_sqsk"] * dim_v))
    size = size_of(dtype_q) or 2
    size_kv = (size_of(dtype_kv) if dtype_kv else None) or size
    per_token = heads * dim_qk + heads * dim_v + heads_kv * dim_qk + heads_kv * dim_v
    cached_per_token = heads_kv * dim_qk + heads_kv * dim_v
    fresh = sums["c_sq"] * per_token + sums["g_sq"] * per_token
    cached = (sums["c_sk"] - sums["c_sq"]) * cached_per_token + (sums["g_sk"] - sums["g_sq"]) * cached_per_token
    return params, flops, fresh * size + cached * size_kv, spec_of("matrix", dtype_q)


def _no_annotation(name: str, args: dict, kernels: list[str]) -> Result:
    """A model that needs the iteration annotation TraceLens's report never attaches to this op: no FLOPs,
    and TraceLens's division of them fails."""
    raise TypeError(f"{name}: no iteration annotation, no FLOPs")


def _gated_delta_net(name: str, args: dict, kernels: list[str]) -> Result:
    """The gated delta net's model reads the annotation without a fallback and declines."""
    raise NotImplementedError(f"{name}: attention without sq/sk annotation is not supported")


MODELS = {
    "aiter::pa_sparse_prefill_opus_fwd": sparse_prefill, "sglang::store_cache": store_cache,
    **dict.fromkeys(("aiter::fmha_v3_varlen_fwd", "aiter::mha_batch_prefill", "aiter::mha_varlen_fwd",
                     "aiter::pa_decode_gluon", "pseudo_mla_decode_fwd", "pseudo_mla_prefill_fwd",
                     "pseudo_v4_paged_decode_csa", "pseudo_v4_paged_decode_hca", "pseudo_v4_paged_decode_swa",
                     "sglang_profiler::attention_paged_attention_ragged",
                     "sglang_profiler::tilelang_kernel_tilelang_sparse_fwd"), _no_annotation),
    "vllm::unified_attention_with_output": unified_attention,
    **dict.fromkeys(("aiter::linear_attention_with_output_base", "vllm::gdn_attention_core"), _gated_delta_net),
}
SHEET_OPS_BEYOND_MODELS: tuple[str, ...] = ()  # (every op of TraceLens's sheet has its model here)
ANNOTATED = frozenset(name for name in MODELS if name.startswith(ANNOTATED_PREFIX))  # (models reading ANNOTATION)
