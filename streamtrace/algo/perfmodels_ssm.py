"""TraceLens's state-space models (sheet ``SSM``): DaoAILab's causal
depthwise convolution and Mamba-2's fused conv + chunked scan (SSD).

Causal conv1d, x [B, C, T] and weight [C, k]: FLOPs 2·B·C·T·k, bytes input,
weight, output and bias (when it has a shape), all at the input's dtype
size (2 bytes when it has none).  Mamba SSD, zxbcdt [B, T, D], conv weight
[C_conv, k], dt_bias [H], chunk C, head dim P and groups G from the
concrete inputs (128, 64, 1 when absent), state size N = (D − 2·H·P − H)
/ (2·G): FLOPs the conv and the four matrix products of the algorithm,
bytes the input, conv weight and bias, three per-head vectors (dt_bias
and A at their dtypes, 4 bytes by default; D at the input's) and the
output; its backward the same FLOPs and bytes.
"""
from __future__ import annotations

from .perfmodel import size_of, spec_of

Result = tuple[dict, int, int, str]


def _size(types: list) -> int:
    """TraceLens's size of these ops' elements: the first dtype's (bfloat16 when none), 2 when unknown."""
    dtype = types[0] if types else "c10::BFloat16"
    size = size_of(dtype) if dtype else None
    return size if size is not None else 2


def _spec(args: dict) -> str:
    return spec_of("matrix", args.get("Input type", [None])[0])


def causal_conv1d(name: str, args: dict, kernels: list[str]) -> Result:
    dims = args["Input Dims"]
    x, w = dims[0], dims[1]
    params = {"batch": x[0], "channels": x[1], "seq_len": x[2], "kernel_size": w[1],
              "has_bias": len(dims) > 2 and isinstance(dims[2], (list, tuple)) and len(dims[2]) > 0}
    size = _size(args.get("Input type", []))
    batch, channels, length, kernel = params["batch"], params["channels"], params["seq_len"], params["kernel_size"]
    moved = (batch * channels * length * size + channels * kernel * size + batch * channels * length * size
             + (channels * size if params["has_bias"] else 0))
    return params, 2 * batch * channels * length * kernel, moved, _spec(args)


def _slot_size(types: list, slot: int, default: int) -> int:
    if len(types) > slot and types[slot]:
        size = size_of(types[slot])
        return size if size is not None else default
    return default


def _concrete_int(concrete: list, at: int, default: int) -> int:
    return int(concrete[at]) if len(concrete) > at and concrete[at] else default


def mamba_ssd(name: str, args: dict, kernels: list[str]) -> Result:
    """``MambaSplitConv1dScanCombinedFn`` (raises when the state size does not divide out: no row)."""
    dims = args["Input Dims"]
    concrete = args.get("Concrete Inputs", [])
    heads = dims[3][0]
    batch, length, combined = dims[0][0], dims[0][1], dims[0][2]
    conv_channels, kernel = dims[1][0], dims[1][1]
    chunk, head_dim, groups = (_concrete_int(concrete, 6, 128), _concrete_int(concrete, 15, 64),
                               _concrete_int(concrete, 16, 1))
    inner = heads * head_dim
    numerator = combined - 2 * inner - heads
    if numerator <= 0 or numerator % (2 * groups) != 0:
        raise ValueError("the state size does not divide out")
    state = numerator // (2 * groups)
    params = {"B": batch, "T": length, "H": heads, "P": head_dim, "G": groups, "N": state, "C": chunk,
              "d_inner": inner, "d_conv": kernel, "conv_channels": conv_channels, "combined_dim": combined}
    types = args.get("Input type", [])
    size = _size(types)
    per_head = heads * _slot_size(types, 3, 4) + heads * _slot_size(types, 4, 4) + heads * _slot_size(types, 5, size)
    moved = (batch * length * combined * size + conv_channels * kernel * size + conv_channels * size + per_head
             + batch * length * inner * size)
    flops = (2 * batch * conv_channels * length * kernel + 2 * batch * groups * length * chunk * state
             + 2 * batch * heads * length * chunk * head_dim + 2 * batch * heads * length * state * head_dim
             + 2 * batch * heads * length * state * head_dim)
    return params, flops, moved, _spec(args)


MODELS = {"DaoAILab::_causal_conv1d_fwd_cpp": causal_conv1d, "MambaSplitConv1dScanCombinedFn": mamba_ssd}
# the causal convolution has no backward model; Mamba's backward is its forward's FLOPs and bytes
BACKWARD_MODELS = {"MambaSplitConv1dScanCombinedFn": mamba_ssd}
