"""TraceLens's models of fused RMS norms (sheet ``RMSNorm``: aiter's and
vLLM's RMS norm with a residual add, a quantized output or padding) and of
Primus's fused layer norm + modulation (sheet ``Normalization``).

Each fused RMS norm reads its input at one place and its weight's length
as the channels (always affine): RMS norm's FLOPs, plus one per element
for a residual add, two for a quantization (three for both); bytes the
input and weight at the input's size and what the fusion reads and
writes: an fp8 output (1 byte an element) with fp32 scales per token or
per group, the residual read and written, an fp4 output (half a byte) with
a byte of scale per 32, a padded output.  Primus's ``fused_ln_modulate``
(x [T, B, H]): FLOPs 12 per element, bytes x read and y written, scale and
shift [B, H], fp32 mean and rstd per row; its backward op 15 per element.
A dtype with no size makes the bytes fail (no row).
"""
from __future__ import annotations

from collections.abc import Callable
from math import prod

from .perfmodel import size_of, spec_of
from .perfmodels_norm import input_params, rms_flops

Result = tuple[dict, "int | float", "int | float", str]


def _fused(args: dict, at: int, weight: int) -> tuple[dict, int, int, int, int]:
    """The parameters (input ``at``, channels the length of input ``weight``), elements, rows, channels, size."""
    params = {**input_params(args, at), "num_channels": args["Input Dims"][weight][0], "has_bias": False,
              "is_affine": True, "is_training": False}
    elements, channels = prod(params["op_shape"]), params["num_channels"]
    return params, elements, elements // channels, channels, size_of(params["dtype_in_out"][0])


def _groups(channels: int, group: int) -> int:
    return (channels + group - 1) // group


def _model(at: int, weight: int, extra_flops: int, moved: Callable[..., "int | float"],
           group_at: int | None = None) -> Callable[[str, dict, list[str]], Result]:
    """A fused RMS norm: RMS norm's FLOPs plus ``extra_flops`` per element; ``moved(elements, rows, channels,
    size, group)`` its bytes (``group``: the concrete input ``group_at``, the quantization's group size)."""
    def model(name: str, args: dict, kernels: list[str]) -> Result:
        params, elements, rows, channels, size = _fused(args, at, weight)
        group = int(args["Concrete Inputs"][group_at]) if group_at is not None else None
        return (params, rms_flops(params) + extra_flops * elements, moved(elements, rows, channels, size, group),
                spec_of("vector", params["dtype_in_out"][0]))
    return model


def rmsnorm_quant(name: str, args: dict, kernels: list[str]) -> Result:
    """``aiter::rmsnorm_quant(out, input, scale, weight, eps, group_size, ...)``: a group size that is not
    recorded (or 0) is the whole row."""
    params, elements, rows, channels, size = _fused(args, 1, 3)
    try:
        group = int(args["Concrete Inputs"][5])
    except (KeyError, IndexError, ValueError, TypeError):
        group = 0
    group = group if group and group > 0 else channels
    moved = elements * size + channels * size + elements * 1 + rows * _groups(channels, group) * 4
    return params, rms_flops(params) + 2 * elements, moved, spec_of("vector", params["dtype_in_out"][0])


def rms_mxfp4_quant(name: str, args: dict, kernels: list[str]) -> Result:
    """``fused_rms_mxfp4_quant(x1, x1_weight, eps, x2, x2_weight, eps2, res1, ...)``: an x2 and a res1 when
    their inputs are 2-d; x2's norm counted at x1's FLOPs per element (truncated)."""
    params, elements, rows, channels, size = _fused(args, 0, 1)
    dims = args["Input Dims"]
    second = dims[3][1] if len(dims) > 3 and len(dims[3]) == 2 else None
    residual = len(dims) > 6 and len(dims[6]) == 2
    flops = rms_flops(params)
    if residual:
        flops += rows * channels
    if second is not None:
        flops += int(rms_flops(params) * (rows * second) / max(elements, 1))
    flops += 2 * elements
    moved = elements * size + channels * size + elements * 0.5 + (elements // 32) * 1
    if residual:
        moved += elements * size
        moved += elements * size
    if second is not None:
        moved += rows * second * size
        moved += second * size
        moved += rows * second * size
    return params, flops, moved, spec_of("vector", params["dtype_in_out"][0])


def add_rmsnorm_pad(name: str, args: dict, kernels: list[str]) -> Result:
    """``rocm_aiter_triton_add_rmsnorm_pad(x, weight, eps, residual, pad_to)``: the output padded to a multiple
    of ``pad_to`` (the fifth concrete input, read first: a missing one fails before anything else)."""
    pad = int(args["Concrete Inputs"][4])
    params, elements, rows, channels, size = _fused(args, 0, 1)
    width = (channels + pad - 1) // pad * pad if pad > 0 else channels
    moved = 2 * elements * size + channels * size + rows * width * size + rows * channels * size
    return params, elements + rms_flops(params), moved, spec_of("vector", params["dtype_in_out"][0])


def _quant(elements: int, rows: int, channels: int, size: int, group: int | None) -> int:
    """An fp8 output with fp32 scales: per token without a group size, else per group."""
    scales = rows * 1 * 4 if group is None else rows * _groups(channels, group) * 4
    return elements * size + channels * size + elements * 1 + scales


def _add(elements: int, rows: int, channels: int, size: int, group: int | None) -> int:
    return 2 * elements * size + channels * size + 2 * elements * size


def _add_quant(elements: int, rows: int, channels: int, size: int, group: int) -> int:
    return (elements * size + elements * size + channels * size + elements * 1 + elements * size
            + rows * _groups(channels, group) * 4)


RMS_MODELS = {
    "aiter::rmsnorm2d_fwd_with_dynamicquant_ck": _model(1, 3, 2, _quant),
    "aiter::rmsnorm_quant": rmsnorm_quant,
    "sglang_profiler::fused_mxfp4_quant_fused_rms_mxfp4_quant": rms_mxfp4_quant,
    "aiter::_fuse_rmsnorm_fp4_quant": rms_mxfp4_quant,
    "vllm::rocm_aiter_rmsnorm_fp8_group_quant": _model(0, 1, 2, _quant, group_at=3),
    "aiter::rmsnorm2d_fwd_with_add_ck": _model(1, 4, 1, _add),
    "aiter::add_rmsnorm": _model(1, 4, 1, _add),
    "vllm::rocm_aiter_rmsnorm_with_add_fp8_group_quant": _model(0, 2, 3, _add_quant, group_at=4),
    "vllm::rocm_aiter_triton_add_rmsnorm_pad": add_rmsnorm_pad,
    "aiter::fused_add_rmsnorm_pad_": add_rmsnorm_pad,
}


def _ln_modulate(args: dict) -> tuple[dict, int, int, int, int]:
    shape = tuple(args["Input Dims"][0])
    dtype = args["Input type"][0]
    try:
        stride = tuple(args["Input Strides"][0])
    except (KeyError, IndexError):
        stride = None
    hidden = shape[2]
    params = {"op_shape": shape, "dtype_in_out": (dtype, None), "stride_input": stride, "stride_output": None,
              "num_channels": hidden, "has_bias": True, "is_affine": True, "is_training": True}
    return params, prod(shape), shape[0], shape[1], size_of(dtype)


def ln_modulate(name: str, args: dict, kernels: list[str]) -> Result:
    params, elements, length, batch, size = _ln_modulate(args)
    hidden = params["num_channels"]
    moved = elements * size + elements * size + 2 * batch * hidden * size + 2 * length * batch * 4
    return params, elements * 12, moved, spec_of("vector", params["dtype_in_out"][0])


def ln_modulate_backward(name: str, args: dict, kernels: list[str]) -> Result:
    params, elements, length, batch, size = _ln_modulate(args)
    params["output_mask"] = [True, True, True]
    hidden = params["num_channels"]
    moved = (2 * elements * size + 2 * batch * length * 4 + elements * size + 2 * batch * hidden * size
             + batch * hidden * size)
    return params, elements * 15, moved, spec_of("vector", params["dtype_in_out"][0])


NORM_MODELS = {"primus::fused_ln_modulate": ln_modulate, "primus::fused_ln_modulate_backward": ln_modulate_backward}
