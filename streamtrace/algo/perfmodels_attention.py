"""TraceLens's attention models (``SDPA``) for PyTorch's fused attention ops
``aten::_scaled_dot_product_flash_attention``, ``_efficient_attention`` and
``_cudnn_attention`` (query, key and value shapes [B, H, N, d]) and
flash-attn's ``FlashAttnFunc``, ``flash_attn::_flash_attn_forward`` and
``_flash_attn_backward`` ([B, N, H, d]; the backward op's tensors after the
output gradient), its packed (varlen) ops, aiter's and flash-attn 3's ops
and DeepSpeed's ``EvoformerAttention`` (every op of TraceLens's sheet):
batch, heads, lengths and head dims from the shapes,
dropout and causality from the concrete inputs.

Forward FLOPs: 2·B·H_Q·N_Q·N_KV·(d_qk + d_v), halved when causal.  Backward
FLOPs: the four matrix products of the gradients (plus the QK recompute of
a flash kernel and the GQA head reductions), halved when causal.  Bytes: Q,
K, V read and O written (backward: Q, K, V, dO read, dQ, dK, dV written),
*accident kept:* at 2 bytes an element whatever the dtype (but flash-attn's
backward op at its dtype's size).  *Accident kept:* flash-attn's backward op
reads its dropout and causality two places off (``dv`` and
``softmax_scale``), so a scale counts as causal.
"""
from __future__ import annotations

import ast
from collections.abc import Callable

from .perfmodel import compute_spec, size_of

BYTES_PER_ELEMENT = 2  # (TraceLens's default, the op's dtype unread)
# op name -> (index of dropout_p among the concrete inputs, flash kernel: recomputes QK^T in backward)
SDPA_OPS = {
    "aten::_scaled_dot_product_flash_attention": (3, True),
    "aten::_scaled_dot_product_efficient_attention": (5, False),
    "aten::_scaled_dot_product_cudnn_attention": (5, False),
}


def _optional_float(value: object) -> float:
    """TraceLens's ``optional_float``: 0.0 for an empty, "None" or unreadable value."""
    if value in ("", "None", None):
        return 0.0
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0.0


def _shapes(dims: list, first: int, order: tuple[int, int, int, int]) -> dict:
    """B, N, H, d of the query, key and value (inputs ``first`` on; ``order``: where B, H, N, d sit)."""
    (batch_q, heads_q, length_q, dim_q), (batch_k, heads_k, length_k, dim_k), (batch_v, heads_v, length_v, dim_v) = (
        tuple(dims[first + i][j] for j in order) for i in range(3))
    if batch_q != batch_k or batch_q != batch_v:
        raise ValueError("batch sizes differ")
    if heads_k != heads_v or length_k != length_v or dim_q != dim_k:
        raise ValueError("key and value shapes differ")
    return {"B": batch_q, "N_Q": length_q, "H_Q": heads_q, "N_KV": length_k, "H_KV": heads_k, "d_h_qk": dim_q,
            "d_h_v": dim_v}


def sdpa_params(name: str, args: dict) -> dict:
    """The parameters of a PyTorch attention op (raises on shapes that disagree, as TraceLens does)."""
    dropout_at, flash = SDPA_OPS[name]
    concrete = args["Concrete Inputs"]
    shapes = _shapes(args["Input Dims"], 0, (0, 1, 2, 3))
    causal_text = concrete[dropout_at + 1]
    causal = causal_text.lower() == "true" if causal_text not in ("", "None") else False
    return {**shapes, "dropout": _optional_float(concrete[dropout_at]), "causal": causal, "flash_impl": flash,
            "dtype_A_B": tuple(args["Input type"][:2])}


def flash_attn_params(name: str, args: dict) -> dict:
    """The parameters of a flash-attn op: q, k, v [B, N, H, d] (after ``dout`` in the backward op)."""
    first = 1 if name == FLASH_BACKWARD else 0
    shapes = _shapes(args["Input Dims"], first, (0, 2, 1, 3))
    strides = args["Input Strides"]
    q_stride, k_stride, v_stride = (tuple(strides[first + i]) for i in range(3))
    if name == FLASH_BACKWARD:
        concrete = args.get("Concrete Inputs", [])
        dropout = float(concrete[8]) if len(concrete) > 8 and concrete[8] else 0.0
        causal = ast.literal_eval(concrete[10]) if len(concrete) > 10 and concrete[10] else True
    else:
        dropout = float(args["Concrete Inputs"][3])
        causal = ast.literal_eval(args["Concrete Inputs"][5])
    return {**shapes, "q_stride": q_stride, "k_stride": k_stride, "v_stride": v_stride, "dropout": dropout,
            "causal": causal, "flash_impl": True, "dtype_A_B": tuple(args["Input type"][:2])}


def _causal(total: int, params: dict) -> int | float:
    if not params["causal"]:
        return total
    if params["N_Q"] != params["N_KV"]:
        raise ValueError("causal attention with query and key lengths that differ")
    return total / 2


VARLEN_FORWARD, VARLEN_BACKWARD = "flash_attn::_flash_attn_varlen_forward", "flash_attn::_flash_attn_varlen_backward"


def varlen_params(name: str, args: dict) -> dict:
    """flash-attn's packed (varlen) ops: q, k, v [T, H, d] (after ``dout`` in the backward op), batch 1,
    the sequence counts from ``cu_seqlens``, the longest lengths, dropout and causality."""
    first = 1 if name == VARLEN_BACKWARD else 0
    dims, concrete = args["Input Dims"], args["Concrete Inputs"]
    (heads_q, length_q, dim_q), (heads_k, length_k, dim_k), (heads_v, length_v, dim_v) = (
        tuple(dims[first + i][j] for j in (1, 0, 2)) for i in range(3))
    if heads_k != heads_v or length_k != length_v or dim_q != dim_k:
        raise ValueError("key and value shapes differ")
    strides = args["Input Strides"]
    q_stride, k_stride, v_stride = (tuple(strides[first + i]) for i in range(3))
    at = 9 if first else 3  # (cu_seqlens_q)
    return {"B": 1, "N_Q": length_q, "H_Q": heads_q, "N_KV": length_k, "H_KV": heads_k, "d_h_qk": dim_q,
            "d_h_v": dim_v, "q_stride": q_stride, "k_stride": k_stride, "v_stride": v_stride,
            "dropout": float(concrete[at + 4]), "causal": ast.literal_eval(concrete[at + 6]), "flash_impl": True,
            "dtype_A_B": tuple(args["Input type"][:2]), "num_seqs_q": dims[at][0] - 1, "num_seqs_kv": dims[at + 1][0] - 1,
            "max_seqlen_q": float(concrete[at + 2]), "max_seqlen_kv": float(concrete[at + 3])}


def varlen_flops(p: dict, flops: Callable[[dict], int | float]) -> int | float:
    """TraceLens's lower bound for packed sequences: the longest pair, and the others at the mean of the rest."""
    total = flops({**p, "N_Q": p["max_seqlen_q"], "N_KV": p["max_seqlen_kv"]})
    if p["num_seqs_q"] > 1:
        rest = {**p, "N_Q": (p["N_Q"] - p["max_seqlen_q"]) // (p["num_seqs_q"] - 1),
                "N_KV": (p["N_KV"] - p["max_seqlen_kv"]) // (p["num_seqs_kv"] - 1)}
        total += (p["num_seqs_q"] - 1) * flops(rest)
    return total


# aiter's and flash-attn 3's ops: name -> (index of q, of dropout_p (None: 0.0), of is_causal, a backward op)
AITER_OPS = {
    "aiter::_flash_attn_forward": (0, 3, 5, False), "aiter::_flash_attn_backward": (0, 10, 12, True),
    "aiter::mha_fwd": (0, 3, 5, False), "aiter::fmha_v3_fwd": (0, 3, 5, False), "aiter::mha_bwd": (1, 6, 8, True),
    "aiter::wrapper_fmha_v3_fwd": (1, 4, 6, False), "aiter::wrapper_fmha_v3_bwd": (1, 7, 9, True),
    "flash_attn_3::fwd": (0, None, 24, False),
}


def aiter_params(name: str, args: dict) -> dict:
    """aiter's attention ops (and flash-attn 3's): q, k, v [B, N, H, d] from input ``first`` on, no dtype read
    (*accident kept:* ``aiter::_flash_attn_backward``'s q, k, v are read from its first three inputs)."""
    first, dropout_at, causal_at, _ = AITER_OPS[name]
    concrete = args["Concrete Inputs"]
    shapes = _shapes(args["Input Dims"], first, (0, 2, 1, 3))
    causal_text = concrete[causal_at]
    causal = causal_text.lower() == "true" if causal_text not in ("", "None") else False
    return {**shapes, "dropout": 0.0 if dropout_at is None else _optional_float(concrete[dropout_at]),
            "causal": causal, "flash_impl": True}


def evoformer_params(name: str, args: dict) -> dict:
    """DeepSpeed's ``EvoformerAttention(Q, K, V, res_mask, pair_bias)``: Q [B, N_seq, N_res, H, d], the MSA
    depth folded into the batch, attention over the residues, never causal."""
    batch, depth, residues, heads, dim = args["Input Dims"][0]
    types = args.get("Input type", [])
    return {"B": batch * depth, "N_Q": residues, "H_Q": heads, "N_KV": residues, "H_KV": heads, "d_h_qk": dim,
            "d_h_v": dim, "causal": False, "flash_impl": False, "dtype_A_B": [types[0] if types else None]}


def sdpa_flops(p: dict) -> int | float:
    return _causal(p["B"] * p["H_Q"] * (2 * p["N_Q"] * p["N_KV"] * p["d_h_qk"])
                   + p["B"] * p["H_Q"] * (2 * p["N_Q"] * p["d_h_v"] * p["N_KV"]), p)


def sdpa_bytes(p: dict) -> int:
    b, n_q, h_q, n_kv, h_kv, d_qk, d_v = (p[k] for k in ("B", "N_Q", "H_Q", "N_KV", "H_KV", "d_h_qk", "d_h_v"))
    return (b * n_q * h_q * d_qk + b * n_kv * h_kv * d_qk + b * n_kv * h_kv * d_v + b * n_q * h_q * d_v) \
        * BYTES_PER_ELEMENT


def sdpa_flops_backward(p: dict) -> int | float:
    b, n_q, h_q, n_kv, h_kv, d_qk, d_v = (p[k] for k in ("B", "N_Q", "H_Q", "N_KV", "H_KV", "d_h_qk", "d_h_v"))
    total = b * h_q * (2 * n_q * n_kv * d_qk) if p["flash_impl"] else 0  # QK^T recomputed
    total += b * h_q * (2 * n_kv * n_q * d_v) + b * n_kv * d_v * (h_q // h_kv - 1)  # dV (and its GQA reduction)
    total += b * h_q * (2 * n_q * n_kv * d_v)  # dP
    total += b * h_q * (2 * n_q * n_kv * d_qk)  # dQ
    total += b * h_q * (2 * n_kv * n_q * d_qk) + b * n_kv * d_qk * (h_q // h_kv - 1)  # dK
    return _causal(total, p)


def sdpa_bytes_backward(p: dict, size: int | None = BYTES_PER_ELEMENT) -> int:
    b, n_q, h_q, n_kv, h_kv, d_qk, d_v = (p[k] for k in ("B", "N_Q", "H_Q", "N_KV", "H_KV", "d_h_qk", "d_h_v"))
    reads = b * n_q * h_q * d_qk + b * n_kv * h_kv * d_qk + b * n_kv * h_kv * d_v + b * n_q * h_q * d_v
    writes = b * n_q * h_q * d_qk + b * n_kv * h_kv * d_qk + b * n_kv * h_kv * d_v
    return (reads + writes) * size  # (no size: TypeError, the op's model fails, as TraceLens's)


FLASH_BACKWARD = "flash_attn::_flash_attn_backward"
PARAMS = {**dict.fromkeys(SDPA_OPS, sdpa_params),
          **dict.fromkeys(("FlashAttnFunc", "flash_attn::_flash_attn_forward", FLASH_BACKWARD), flash_attn_params),
          **dict.fromkeys((VARLEN_FORWARD, VARLEN_BACKWARD), varlen_params), **dict.fromkeys(AITER_OPS, aiter_params),
          "EvoformerAttention": evoformer_params}


def _spec(params: dict) -> str:
    """``matrix_<precision>``; empty for the ops whose parameters hold no dtype (aiter's)."""
    return compute_spec(params) if "dtype_A_B" in params else ""


def sdpa(name: str, args: dict, kernels: list[str]) -> tuple[dict, int | float, int, str]:
    params = PARAMS[name](name, args)
    if name == FLASH_BACKWARD:  # (a backward op TraceLens models as a forward one, its row in SDPA_fwd)
        return params, sdpa_flops_backward(params), sdpa_bytes_backward(params, size_of(params["dtype_A_B"][0])), \
            _spec(params)
    if name == VARLEN_BACKWARD:  # (the same, its row moved to SDPA_bwd)
        return params, varlen_flops(params, sdpa_flops_backward), sdpa_bytes_backward(params), _spec(params)
    if name == VARLEN_FORWARD:
        return params, varlen_flops(params, sdpa_flops), sdpa_bytes(params), _spec(params)
    if name in AITER_OPS and AITER_OPS[name][3]:  # (aiter's backward ops: as flash-attn's, at 2 bytes)
        return params, sdpa_flops_backward(params), sdpa_bytes_backward(params), _spec(params)
    return params, sdpa_flops(params), sdpa_bytes(params), _spec(params)


def sdpa_backward(name: str, args: dict, kernels: list[str]) -> tuple[dict, int | float, int, str]:
    """The forward op's row in the ``SDPA_bwd`` sheet: its backward FLOPs and bytes (at 2 bytes)."""
    params = PARAMS[name](name, args)
    return params, sdpa_flops_backward(params), sdpa_bytes_backward(params), _spec(params)


MODELS = dict.fromkeys(PARAMS, sdpa)
BACKWARD_MODELS = dict.fromkeys(PARAMS, sdpa_backward)
SHEET_OPS_BEYOND_MODELS: tuple[str, ...] = ()  # (every op of TraceLens's sheet has its model here)
