"""TraceLens's normalization models (``Normalization``: batch, layer, group,
instance and RMS norm, forward and backward ops, one sheet).

Forward (batch, layer, group, instance norm): FLOPs 2 per element, plus 3
per element for the statistics when training, plus 6 per channel; bytes
each element read and written, and 2 to 6 per-channel vectors (mean and
variance; weight and bias when affine; the running statistics written when
training).  Backward: per channel 4 per element for the dot product, plus 5
per element for the input gradient when training (2 when the first output
is not asked for), 3 more per channel when not training; bytes the output
gradient and the input (twice when training and the input gradient is
asked for), per-channel inverse std, weight and the weight and bias
gradients.  RMS norm: its own formulas (below).  ``num_channels`` is the
channel dimension (batch, group, instance norm) or the product of the
normalized shape (layer and RMS norm).

*Accidents kept:* ``is_affine`` and ``has_bias`` test shapes for ``None``,
which Kineto never writes (an absent tensor is ``[]``), so they are always
true; batch and instance norm's ``training`` is ``bool`` of the concrete
text, so ``"False"`` counts as training; ``cudnn_`` and ``miopen_`` batch-norm
backward ops count as not training and as asking for the input gradient.
"""
from __future__ import annotations

import ast
from math import prod

from .perfmodel import size_of, spec_of


def _parse_list(text: str, kind: type) -> list:
    """TraceLens's ``parse_list``: a Python literal list of the concrete inputs."""
    return [kind(x) for x in ast.literal_eval(text)]


def input_params(args: dict, at: int) -> dict:
    """The shape, dtype and stride of the op's input ``at``."""
    return {"op_shape": tuple(args["Input Dims"][at]), "dtype_in_out": (args["Input type"][at], None),
            "stride_input": tuple(args["Input Strides"][at]), "stride_output": None}


def batch_norm(name: str, args: dict) -> dict:
    dims = args["Input Dims"]
    return {**input_params(args, 0), "num_channels": dims[0][1], "has_bias": True, "is_affine": dims[2] is not None,
            "is_training": bool(args["Concrete Inputs"][5])}


def batch_norm_backward(name: str, args: dict) -> dict:
    dims = args["Input Dims"]
    if name in ("aten::cudnn_batch_norm_backward", "aten::miopen_batch_norm_backward"):
        at, has_output, training = 0, True, False
    else:
        at, has_output, training = 1, dims[0] is not None, bool(args["Concrete Inputs"][7])
    params = input_params(args, at)
    return {**params, "num_channels": params["op_shape"][1], "has_bias": True, "is_affine": dims[2] is not None,
            "is_training": training, "output_mask": [has_output]}


def layer_norm(name: str, args: dict) -> dict:
    dims = args["Input Dims"]
    channels = prod(_parse_list(args["Concrete Inputs"][1], int))
    return {**input_params(args, 0), "num_channels": channels, "has_bias": dims[3] is not None,
            "is_affine": dims[2] is not None, "is_training": True}


def layer_norm_backward(name: str, args: dict) -> dict:
    channels = prod(_parse_list(args["Concrete Inputs"][2], int))
    mask = _parse_list(args["Concrete Inputs"][7], bool)
    return {**input_params(args, 1), "num_channels": channels, "has_bias": mask[2], "is_affine": mask[1],
            "is_training": True, "output_mask": mask}


def group_norm(name: str, args: dict) -> dict:
    params = input_params(args, 0)
    return {**params, "num_channels": params["op_shape"][1], "has_bias": True,
            "is_affine": args["Input Dims"][2] is not None, "is_training": True}


def group_norm_backward(name: str, args: dict) -> dict:
    params = input_params(args, 1)
    mask = _parse_list(args["Concrete Inputs"][9], bool)
    return {**params, "num_channels": params["op_shape"][1] / int(args["Concrete Inputs"][8]), "has_bias": True,
            "is_affine": args["Input Dims"][5] is not None, "is_training": True, "output_mask": mask}


def instance_norm(name: str, args: dict) -> dict:
    params = input_params(args, 0)
    return {**params, "num_channels": params["op_shape"][1], "has_bias": True,
            "is_affine": args["Input Dims"][2] is not None, "is_training": bool(args["Concrete Inputs"][5])}


def rms_norm(name: str, args: dict) -> dict:
    channels = prod(_parse_list(args["Concrete Inputs"][1], int))
    return {**input_params(args, 0), "num_channels": channels, "has_bias": False,
            "is_affine": args["Input Dims"][2] is not None, "is_training": False}


def rms_norm_backward(name: str, args: dict) -> dict:
    channels = prod(_parse_list(args["Concrete Inputs"][2], int))
    mask = _parse_list(args["Concrete Inputs"][5], bool)
    return {**input_params(args, 1), "num_channels": channels, "has_bias": False,
            "is_affine": args["Input Dims"][4] is not None, "is_training": False, "output_mask": mask}


def _sizes(p: dict) -> tuple[int, int]:
    size_in = size_of(p["dtype_in_out"][0])
    return size_in, size_in  # (the output's dtype is never read: the input's)


def norm_flops(p: dict) -> int:
    elems, channels = prod(p["op_shape"]), p["num_channels"]
    return channels * 3 + (elems * 3 if p["is_training"] else 0) + channels * 3 + 2 * elems


def norm_bytes(p: dict) -> int:
    size_in, size_out = _sizes(p)
    vectors = 2 + ((1 + (1 if p["has_bias"] else 0)) if p["is_affine"] else 0) + (2 if p["is_training"] else 0)
    elems = prod(p["op_shape"])
    return elems * size_in + elems * size_out + vectors * p["num_channels"] * size_in


def norm_flops_backward(p: dict) -> int | float:
    elems, channels = prod(p["op_shape"]), p["num_channels"]
    per_channel_elems = elems / channels
    per_channel = (3 if not p["is_training"] else 0) + 4 * per_channel_elems
    if p["output_mask"][0]:
        if p["is_training"]:
            per_channel += 5 * per_channel_elems
    else:
        per_channel += 2 * per_channel_elems
    return channels * per_channel


def norm_bytes_backward(p: dict) -> int:
    size_in, size_out = _sizes(p)
    elems, channels = prod(p["op_shape"]), p["num_channels"]
    moved = elems * size_out + elems * size_in * (2 if p["output_mask"][0] and p["is_training"] else 1)
    if p["is_training"]:
        moved += channels * size_in
    if p["is_affine"]:
        moved += channels * size_in
        if p["is_training"]:
            moved += channels * size_in * (2 if p["has_bias"] else 1)
    return moved


def rms_flops(p: dict) -> int | float:
    elems = prod(p["op_shape"])
    return elems / p["num_channels"] * (2 * p["num_channels"] + 2) + elems * (2 if p["is_affine"] else 1)


def rms_bytes(p: dict) -> int:
    size_in, size_out = _sizes(p)
    elems = prod(p["op_shape"])
    return elems * size_in + elems * size_out + (p["num_channels"] * size_in if p["is_affine"] else 0)


def rms_flops_backward(p: dict) -> int | float:
    elems = prod(p["op_shape"])
    flops = (elems if p["is_affine"] else 0) + elems
    if p["output_mask"][0]:
        flops += 2 * elems + 4 * elems
    if p["output_mask"][1] and p["is_affine"]:
        flops += elems
        if elems / p["num_channels"] > 1:
            flops += elems
    return flops


def rms_bytes_backward(p: dict) -> int:
    size_in, size_out = _sizes(p)
    elems = prod(p["op_shape"])
    return elems * size_out + elems * size_in * 2 + (p["num_channels"] * size_in * 2 if p["is_affine"] else 0)


# kind -> (parameters, FLOPs, bytes)
KINDS = {
    "batch": (batch_norm, norm_flops, norm_bytes),
    "batch_backward": (batch_norm_backward, norm_flops_backward, norm_bytes_backward),
    "layer": (layer_norm, norm_flops, norm_bytes),
    "layer_backward": (layer_norm_backward, norm_flops_backward, norm_bytes_backward),
    "group": (group_norm, norm_flops, norm_bytes),
    "group_backward": (group_norm_backward, norm_flops_backward, norm_bytes_backward),
    "instance": (instance_norm, norm_flops, norm_bytes),
    "rms": (rms_norm, rms_flops, rms_bytes),
    "rms_backward": (rms_norm_backward, rms_flops_backward, rms_bytes_backward),
}
KIND_OF_OP = {
    **{f"aten::{prefix}{kind}_norm": kind for prefix in ("", "native_", "miopen_", "cudnn_")
       for kind in ("batch", "layer", "group", "instance")},
    **{f"aten::{prefix}{kind}_norm_backward": f"{kind}_backward" for prefix in ("", "native_", "miopen_", "cudnn_")
       for kind in ("batch", "layer", "group")},
    "aten::_fused_rms_norm": "rms",
    "aiter::_groupnorm_run": "group",  # (TraceLens models aiter's group norm as PyTorch's)
    **{f"aten::{prefix}rms_norm_backward": "rms_backward" for prefix in ("", "native_", "miopen_", "cudnn_", "_fused_")},
}
# TraceLens's instance-norm backward model always declines (no row, no warning)
DECLINED = frozenset(f"aten::{prefix}instance_norm_backward" for prefix in ("", "native_", "miopen_", "cudnn_"))


def norm(name: str, args: dict, kernels: list[str]) -> tuple[dict, int | float, int, str]:
    if name in DECLINED:
        raise NotImplementedError(name)
    parameters, flops, moved = KINDS[KIND_OF_OP[name]]
    params = parameters(name, args)
    return params, flops(params), moved(params), spec_of("vector", params["dtype_in_out"][0])


MODELS = dict.fromkeys([*KIND_OF_OP, *DECLINED], norm)


def aiter_rms_norm(name: str, args: dict, kernels: list[str]) -> tuple[dict, int | float, int, str]:
    """aiter's RMS norms (TraceLens's extension, sheet ``RMSNorm``): ``rms_norm(x, weight, eps)`` and
    ``rmsnorm2d_fwd_ck`` alike, ``rmsnorm(out, input, weight, eps)`` one place on; the channels are the
    weight's length, always affine, RMS norm's formulas."""
    at = 1 if name == "aiter::rmsnorm" else 0
    dims = args["Input Dims"]
    params = {**input_params(args, at), "num_channels": dims[at + 1][0], "has_bias": False, "is_affine": True,
              "is_training": False}
    return params, rms_flops(params), rms_bytes(params), spec_of("vector", params["dtype_in_out"][0])


RMS_MODELS = dict.fromkeys(("aiter::rms_norm", "aiter::rmsnorm2d_fwd_ck", "aiter::rmsnorm"), aiter_rms_norm)
