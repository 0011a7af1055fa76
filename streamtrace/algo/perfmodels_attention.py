"""TraceLens's attention models (``SDPA``) for PyTorch's fused attention ops
``aten::_scaled_dot_product_flash_attention``, ``_efficient_attention`` and
``_cudnn_attention``: batch, heads, lengths and head dims from the query,
key and value shapes ([B, H, N, d]), dropout and causality from the
concrete inputs.

Forward FLOPs: 2·B·H_Q·N_Q·N_KV·(d_qk + d_v), halved when causal.  Backward
FLOPs: the four matrix products of the gradients (plus the QK recompute of
a flash kernel and the GQA head reductions), halved when causal.  Bytes: Q,
K, V read and O written (backward: Q, K, V, dO read, dQ, dK, dV written),
*accident kept:* at 2 bytes an element whatever the dtype.
"""
from __future__ import annotations

from .perfmodel import compute_spec

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


def sdpa_params(name: str, args: dict) -> dict:
    """The parameters of an attention op (raises on shapes that disagree, as TraceLens does)."""
    dropout_at, flash = SDPA_OPS[name]
    dims, concrete = args["Input Dims"], args["Concrete Inputs"]
    (batch_q, heads_q, length_q, dim_q), (batch_k, heads_k, length_k, dim_k), (batch_v, heads_v, length_v, dim_v) = (
        tuple(dims[i][j] for j in range(4)) for i in range(3))
    if batch_q != batch_k or batch_q != batch_v:
        raise ValueError("batch sizes differ")
    if heads_k != heads_v or length_k != length_v or dim_q != dim_k:
        raise ValueError("key and value shapes differ")
    causal_text = concrete[dropout_at + 1]
    causal = causal_text.lower() == "true" if causal_text not in ("", "None") else False
    return {"B": batch_q, "N_Q": length_q, "H_Q": heads_q, "N_KV": length_k, "H_KV": heads_k, "d_h_qk": dim_q,
            "d_h_v": dim_v, "dropout": _optional_float(concrete[dropout_at]), "causal": causal, "flash_impl": flash,
            "dtype_A_B": tuple(args["Input type"][:2])}


def _causal(total: int, params: dict) -> int | float:
    if not params["causal"]:
        return total
    if params["N_Q"] != params["N_KV"]:
        raise ValueError("causal attention with query and key lengths that differ")
    return total / 2


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


def sdpa_bytes_backward(p: dict) -> int:
    b, n_q, h_q, n_kv, h_kv, d_qk, d_v = (p[k] for k in ("B", "N_Q", "H_Q", "N_KV", "H_KV", "d_h_qk", "d_h_v"))
    reads = b * n_q * h_q * d_qk + b * n_kv * h_kv * d_qk + b * n_kv * h_kv * d_v + b * n_q * h_q * d_v
    writes = b * n_q * h_q * d_qk + b * n_kv * h_kv * d_qk + b * n_kv * h_kv * d_v
    return (reads + writes) * BYTES_PER_ELEMENT


def sdpa(name: str, args: dict, kernels: list[str]) -> tuple[dict, int | float, int, str]:
    params = sdpa_params(name, args)
    return params, sdpa_flops(params), sdpa_bytes(params), compute_spec(params)


def sdpa_backward(name: str, args: dict, kernels: list[str]) -> tuple[dict, int | float, int, str]:
    """The forward op's row in the ``SDPA_bwd`` sheet: its backward FLOPs and bytes."""
    params = sdpa_params(name, args)
    return params, sdpa_flops_backward(params), sdpa_bytes_backward(params), compute_spec(params)


MODELS = dict.fromkeys(SDPA_OPS, sdpa)
BACKWARD_MODELS = dict.fromkeys(SDPA_OPS, sdpa_backward)
# the sheet's other ops (flash-attn, aiter, Evoformer: no model here yet)
SHEET_OPS_BEYOND_MODELS = ("EvoformerAttention", "FlashAttnFunc", "aiter::_flash_attn_backward",
                           "aiter::_flash_attn_forward", "aiter::fmha_v3_fwd", "aiter::mha_bwd", "aiter::mha_fwd",
                           "aiter::wrapper_fmha_v3_bwd", "aiter::wrapper_fmha_v3_fwd", "flash_attn::_flash_attn_backward",
                           "flash_attn::_flash_attn_forward", "flash_attn::_flash_attn_varlen_backward",
                           "flash_attn::_flash_attn_varlen_forward", "flash_attn_3::fwd")
