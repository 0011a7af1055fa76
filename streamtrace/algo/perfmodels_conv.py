"""TraceLens's convolution models (``CONV``) for ``aten::convolution`` and
``aten::convolution_backward``: input and filter shapes, stride, padding,
dilation, transposition, output padding and groups from the op's inputs;
Apex's fused ``ConvBias_`` and ``ConvBiasReLU_`` (always a bias, one stride
and one padding) and their backward ops, which take the parameters their
forward op cached under the autograd sequence number.

Output spatial size per dimension int((in + 2·pad − dil·(k − 1) − 1) / stride
+ 1) (transposed: (in − 1)·stride − 2·pad + dil·(k − 1) + out_pad + 1).
Forward FLOPs 2·prod(filter[1:]) per output element (per input element when
transposed), plus one per output element with a bias; bytes input, filter,
bias and output at the input's dtype size.  Backward: the input gradient as
a convolution of the output gradient and the weight gradient as one of the
transposed input and output gradient; bytes of both plus the bias gradient.
*Accidents kept:* ``aten::convolution`` has a bias only when it has exactly
three inputs (Kineto records nine, so never); ``convolution_backward``'s
bias is its ``bias_sizes`` shape, which Kineto records as ``[]`` (written
as such, counted as none).
"""
from __future__ import annotations

import ast
from math import prod

from .perfmodel import compute_spec, size_of

# op name -> index of the input tensor (the filter follows it, the concrete arguments the bias)
CONV_OPS = {"aten::convolution": 0, "aten::convolution_backward": 1}


def _ints(text: str) -> tuple[int, ...]:
    """TraceLens's ``str_to_tuple``: ``"[1, 1]"`` -> (1, 1)."""
    return tuple(int(x) for x in text[1:-1].split(","))


def conv_params(name: str, args: dict) -> dict:
    """The parameters of a convolution (raises where TraceLens's model does)."""
    first = CONV_OPS[name]
    dims, concrete = args["Input Dims"], args["Concrete Inputs"]
    input_shape, filter_shape = tuple(dims[first]), tuple(dims[first + 1])
    ndims = len(input_shape) - 2
    if first == 0:
        bias: object = len(dims) == 3
    else:
        bias = len(dims) > 3 and dims[3] and len(dims[3]) > 0
    at = first + 2  # (the bias, or bias_sizes)
    stride, padding, dilation = (_ints(concrete[at + i + 1]) if concrete[at + i + 1] != "" else default
                                 for i, default in enumerate(((1,) * ndims, (0,) * ndims, (1,) * ndims)))
    transposed = ast.literal_eval(concrete[at + 4])  # (TraceLens eval()s it: here Python literals only)
    output_padding = _ints(concrete[at + 5]) if concrete[at + 5] != "" else (0,) * ndims
    groups = int(concrete[at + 6])
    stride, padding, dilation, output_padding = (value * ndims if len(value) == 1 else value
                                                 for value in (stride, padding, dilation, output_padding))
    dtypes = tuple(args["Input type"][first:first + 2])
    if dtypes[0] != dtypes[1]:
        raise ValueError("input and weight dtypes differ")
    try:
        input_stride, weight_stride = tuple(args["Input Strides"][first]), tuple(args["Input Strides"][first + 1])
    except KeyError:
        input_stride = weight_stride = None
    kinds = {3: "conv1d", 4: "conv2d", 5: "conv3d"}
    if len(input_shape) not in kinds:
        raise ValueError("not a 1, 2 or 3-d convolution")
    return {"convNd": kinds[len(input_shape)], "input_shape": input_shape, "filter_shape": filter_shape,
            "dtype_input_weight": dtypes, "input_stride": input_stride, "weight_stride": weight_stride,
            "bias": bias, "stride": stride, "padding": padding, "dilation": dilation, "transposed_conv": transposed,
            "output_padding": output_padding, "groups": groups}


def output_shape(p: dict) -> tuple:
    x, w = p["input_shape"], p["filter_shape"]
    spatial = []
    for i in range(len(x) - 2):
        size, kernel, stride, pad, dil = x[2 + i], w[2 + i], p["stride"][i], p["padding"][i], p["dilation"][i]
        if p["transposed_conv"]:
            spatial.append((size - 1) * stride - 2 * pad + dil * (kernel - 1) + p["output_padding"][i] + 1)
        else:
            spatial.append(int(((size + 2 * pad - dil * (kernel - 1) - 1) / stride) + 1))
    return (x[0], w[1] if p["transposed_conv"] else w[0], *spatial)


def _flops(x: tuple, w: tuple, out: tuple, bias: object, transposed: object) -> int:
    return (prod(x) if transposed else prod(out)) * 2 * prod(w[1:]) + (prod(out) if bias else 0)


def _bytes(x: tuple, w: tuple, out: tuple, bias: object, size: int) -> int:
    return (prod(x) + prod(w) + (out[1] if bias else 0) + prod(out)) * size


def _swap(shape: tuple) -> tuple:
    return (shape[1], shape[0], *shape[2:])


def conv_flops(p: dict) -> int:
    return _flops(p["input_shape"], p["filter_shape"], output_shape(p), p["bias"], p["transposed_conv"])


def conv_bytes(p: dict) -> int | None:
    size = size_of(p["dtype_input_weight"][0])
    return None if size is None else _bytes(p["input_shape"], p["filter_shape"], output_shape(p), p["bias"], size)


def conv_flops_backward(p: dict) -> int:
    x, w, out, transposed = p["input_shape"], p["filter_shape"], output_shape(p), p["transposed_conv"]
    input_grad = _flops(out, w, x, False, not transposed)
    weight_grad = _flops(_swap(out), _swap(x), _swap(w), False, False) if transposed else \
        _flops(_swap(x), _swap(out), _swap(w), False, False)
    return input_grad + weight_grad + (prod(out) if p["bias"] else 0)


def conv_bytes_backward(p: dict) -> int | None:
    size = size_of(p["dtype_input_weight"][0])
    if size is None:
        return None
    x, w, out = p["input_shape"], p["filter_shape"], output_shape(p)
    return _bytes(out, w, x, False, size) + _bytes(out, x, w, False, size) + (prod(out) + out[1] if p["bias"] else 0)


def _spec(params: dict) -> str:
    return compute_spec({"dtype_A_B": params["dtype_input_weight"]})


def conv_backward(name: str, args: dict, kernels: list[str]) -> tuple[dict, int, int | None, str]:
    """The backward formulas: a convolution's row in the ``CONV_bwd`` sheet over its backward op's kernels,
    and ``convolution_backward``'s own (over its kernels)."""
    params = conv_params(name, args)
    return params, conv_flops_backward(params), conv_bytes_backward(params), _spec(params)


def conv(name: str, args: dict, kernels: list[str]) -> tuple[dict, int, int | None, str]:
    if name == "aten::convolution_backward":
        return conv_backward(name, args, kernels)
    params = conv_params(name, args)
    return params, conv_flops(params), conv_bytes(params), _spec(params)


def conv_bias_params(args: dict) -> dict:
    """Apex's fused ``ConvBias_``/``ConvBiasReLU_(x, weight, bias, stride, padding)``: always a bias, the
    stride and padding one int each for every spatial dimension (1 and 0 when not recorded)."""
    dims, concrete = args["Input Dims"], args["Concrete Inputs"]
    input_shape, filter_shape = tuple(dims[0]), tuple(dims[1])
    ndims = len(input_shape) - 2
    stride_text = concrete[3] if len(concrete) > 3 else ""
    padding_text = concrete[4] if len(concrete) > 4 else ""
    dtypes = tuple(args["Input type"][:2])
    if dtypes[0] != dtypes[1]:
        raise ValueError("input and weight dtypes differ")
    try:
        input_stride, weight_stride = tuple(args["Input Strides"][0]), tuple(args["Input Strides"][1])
    except (KeyError, IndexError):
        input_stride = weight_stride = None
    kinds = {3: "conv1d", 4: "conv2d", 5: "conv3d"}
    if len(input_shape) not in kinds:
        raise ValueError("not a 1, 2 or 3-d convolution")
    return {"convNd": kinds[len(input_shape)], "input_shape": input_shape, "filter_shape": filter_shape,
            "dtype_input_weight": dtypes, "input_stride": input_stride, "weight_stride": weight_stride, "bias": True,
            "stride": (int(stride_text),) * ndims if stride_text != "" else (1,) * ndims,
            "padding": (int(padding_text),) * ndims if padding_text != "" else (0,) * ndims,
            "dilation": (1,) * ndims, "transposed_conv": False, "output_padding": (0,) * ndims, "groups": 1}


def conv_bias_cached(args: dict) -> dict:
    """The parameters TraceLens's ``ConvBias_`` model caches by sequence number: those of an op whose
    output shape it could compute (raises otherwise: nothing cached)."""
    params = conv_bias_params(args)
    output_shape(params)
    return params


def conv_bias(name: str, args: dict, kernels: list[str]) -> tuple[dict, int, int | None, str]:
    params = conv_bias_cached(args)
    return params, conv_flops(params), conv_bytes(params), _spec(params)


def conv_bias_backward(name: str, args: dict, kernels: list[str]) -> tuple[dict, int, int | None, str]:
    """A fused convolution's backward formulas over its backward op's kernels (the ``CONV_bwd`` sheet)."""
    params = conv_bias_cached(args)
    return params, conv_flops_backward(params), conv_bytes_backward(params), _spec(params)


# the key under which a backward op's model gets its forward op's arguments (see CACHED_FORWARD)
FORWARD_ARGS = "forward op arguments"


def conv_bias_from_forward(name: str, args: dict, kernels: list[str]) -> tuple[dict, int, int | None, str]:
    """``ConvBias_Backward``/``ConvBiasReLU_Backward``: the backward formulas of the parameters TraceLens's
    forward model cached under the op's sequence number (none cached: its model fails, no row)."""
    forward = args.get(FORWARD_ARGS)
    if forward is None:
        raise TypeError(f"{name}: no forward op cached for its sequence number")
    return conv_bias_backward(name, forward, kernels)


FUSED = {"ConvBias_": conv_bias, "ConvBiasReLU_": conv_bias, "ConvBias_Backward": conv_bias_from_forward,
         "ConvBiasReLU_Backward": conv_bias_from_forward}
MODELS = {**dict.fromkeys(CONV_OPS, conv), **FUSED}
BACKWARD_MODELS = {**dict.fromkeys(CONV_OPS, conv_backward), "ConvBias_": conv_bias_backward,
                   "ConvBiasReLU_": conv_bias_backward}
# backward op -> the forward op whose parameters TraceLens's model reads from a class-wide cache keyed by
# sequence number, filled as forward ops are modelled (in event order: the sheets, then the unified summary)
CACHED_FORWARD = {"ConvBias_Backward": "ConvBias_", "ConvBiasReLU_Backward": "ConvBiasReLU_"}
# TraceLens computes these backward ops as forward ones, then moves their rows to the _bwd sheet
MOVED_TO_BACKWARD = frozenset({"flash_attn::_flash_attn_varlen_backward", "aten::convolution_backward",
                               "ConvBias_Backward", "ConvBiasReLU_Backward"})
# and leaves these out of the _bwd sheet
FORWARD_ONLY = frozenset({"aten::convolution", "aten::miopen_convolution", "aten::cudnn_convolution", "ConvBias_",
                          "ConvBiasReLU_"})
