"""TraceLens's models of TransformerEngine's fused ops: ``FusedRoPEFunc``
(sheet ``RoPE``, with aiter's and sgl-kernel's rotary ops) and
``CrossEntropyFunction`` (sheet ``CrossEntropy``).

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


def aiter_rope(name: str, args: dict, kernels: list[str]) -> tuple[dict, int, int, str]:
    """aiter's ``rope_cached_positions_2c_fwd_impl(out_x, out_y, x [B, S, H_q, d], y [B, S, H_kv, d], cos, sin,
    positions, ...)``: both channels rotated, read and written, at the first input's size."""
    dims = args["Input Dims"]
    x, y = tuple(dims[2]), tuple(dims[3])
    params = {"x_shape": x, "y_shape": y, "num_elements": prod(x) + prod(y)}
    return params, 3 * params["num_elements"], 2 * params["num_elements"] * _size(args), _spec(args)


def sgl_rotary_embedding(name: str, args: dict, kernels: list[str]) -> tuple[dict, int, int, str]:
    """sgl-kernel's ``rotary_embedding(positions, query [T, H_q·d], key [T, H_k·d], head_size, cos_sin_cache,
    ...)``: the rotated slice (the cache's second dim, else the head size) of every head, at the query's size."""
    dims, concrete = args["Input Dims"], args.get("Concrete Inputs", [])
    query, key = tuple(dims[1]), tuple(dims[2])
    head = query[-1]
    if len(concrete) > 3 and str(concrete[3]).strip():
        head = int(concrete[3])
    rotated = dims[4][1] if len(dims) > 4 and len(dims[4]) > 1 else head
    params = {"num_elements": query[0] * (query[1] // head + key[1] // head) * rotated}
    _size(args)  # (TraceLens sizes the first input too: a dtype that is no text fails)
    dtype = args["Input type"][1]
    size = size_of(dtype)
    return params, 3 * params["num_elements"], 2 * params["num_elements"] * (size if size is not None else 2), \
        spec_of("vector", dtype)


ROPE_MODELS = {"FusedRoPEFunc": fused_rope, "aiter::rope_cached_positions_2c_fwd_impl": aiter_rope,
               "sgl_kernel::rotary_embedding": sgl_rotary_embedding}
CROSS_ENTROPY_MODELS = {"CrossEntropyFunction": cross_entropy}
