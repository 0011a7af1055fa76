"""TraceLens's models of TransformerEngine's fused ops: ``FusedRoPEFunc``
(sheet ``RoPE``) and ``CrossEntropyFunction`` (sheet ``CrossEntropy``).

Rotary embedding: the input [seq, batch, heads, head_dim], FLOPs 3 per
element (6 per rotated pair), bytes each element read and written.  Cross
entropy: logits [batch, ..., vocab], FLOPs 5·batch·vocab, bytes the logits,
an 8-byte target and a 4-byte loss per batch row.  Both at the first
input's dtype size, *accident kept:* 2 bytes when it has none or an
unknown one.  Neither has a backward model (no ``_bwd`` sheet).
"""
from __future__ import annotations

from math import prod

from .perfmodel import size_of, spec_of


def _size(args: dict) -> int:
    """TraceLens's bytes per element of these ops: the first input's dtype's, else 2."""
    types = args.get("Input type", [])
    dtype = types[0] if types else "c10::BFloat16"
    size = size_of(dtype) if dtype else None
    return size if size is not None else 2


def _spec(args: dict) -> str:
    types = args.get("Input type", [])
    return spec_of("vector", types[0] if types else None)


def fused_rope(name: str, args: dict, kernels: list[str]) -> tuple[dict, int, int, str]:
    shape = args["Input Dims"][0]
    params = {"seq_len": shape[0], "batch": shape[1], "heads": shape[2], "head_dim": shape[3],
              "num_elements": prod(shape)}
    size = _size(args)
    return params, 3 * params["num_elements"], 2 * params["num_elements"] * size, _spec(args)


def cross_entropy(name: str, args: dict, kernels: list[str]) -> tuple[dict, int, int, str]:
    logits = args["Input Dims"][0]
    params = {"batch": logits[0], "vocab_size": logits[-1], "logits_shape": logits}
    size = _size(args)
    moved = prod(logits) * size + params["batch"] * 8 + params["batch"] * 4
    return params, 5 * params["batch"] * params["vocab_size"], moved, _spec(args)


ROPE_MODELS = {"FusedRoPEFunc": fused_rope}
# the RoPE sheet's other ops (aiter's, sgl-kernel's: no model here yet)
ROPE_SHEET_OPS_BEYOND_MODELS = ("aiter::rope_cached_positions_2c_fwd_impl", "sgl_kernel::rotary_embedding")
CROSS_ENTROPY_MODELS = {"CrossEntropyFunction": cross_entropy}
