"""TraceLens's elementwise models of other names than PyTorch's unary and
binary ops (sheets ``UnaryElementwise`` and ``BinaryElementwise``): gated
activations, padding and upsampling, Liger's fused SiLU·mul, per-token and
per-group fp8 quantization.

Gated activations (``silu_and_mul(out, input)``: aiter's, vLLM's, SGLang's;
aiter's GELU ones): FLOPs 5 (SiLU), 8 (GELU) or 10 (tanh GELU) per output
element; bytes the input (twice the output's elements) at its size and the
output at its own.  Replication padding and nearest upsampling: one FLOP
per output element, bytes the input read and output written.  Per-token
quantization (``dynamic_per_token_scaled_quant(out, input, scales)`` ...):
2.59375 FLOPs per output element (TraceLens's counter-based figure), bytes
each of the three tensors at its size.  vLLM's per-token-group fp8
quantization: 6 FLOPs per element, bytes the input, an fp8 output and fp32
scales per group of 128 (or the recorded size).
"""
from __future__ import annotations

import ast
from math import prod

from .perfmodel import broadcast, size_of, spec_of

Result = tuple[dict, "int | float", "int | float | None", str]
GATED_FLOPS = {"aiter::silu_and_mul": 5, "_C::silu_and_mul": 5, "sgl_kernel::silu_and_mul": 5,
               "aiter::gelu_and_mul": 8, "aiter::gelu_tanh_and_mul": 10}


def _out_size(dtype_in: object, dtype_out: object) -> int | None:
    """TraceLens's unary output size: the output dtype's when there is one, else the input's."""
    return size_of(dtype_out) if dtype_out is not None else size_of(dtype_in)


def gated(name: str, args: dict, kernels: list[str]) -> Result:
    """``silu_and_mul(out [..., N], input [..., 2N])`` and the GELU forms (no row for a dtype with no size)."""
    dims, types, strides = args["Input Dims"], args["Input type"], args["Input Strides"]
    shape = tuple(dims[0])
    params = {"op_shape": shape, "dtype_in_out": (types[1], types[0]), "stride_input": tuple(strides[1]),
              "stride_output": tuple(strides[0])}
    count = prod(shape)
    size_in, size_out = size_of(types[1]), _out_size(types[1], types[0])
    return params, GATED_FLOPS[name] * count, 2 * count * size_in + count * size_out, spec_of("vector", types[1])


def _resized(args: dict, output: tuple, extra: dict) -> Result:
    """Padding or upsampling: the input's dims, dtype and strides, an output shape."""
    shape, dtype = tuple(args["Input Dims"][0]), args["Input type"][0]
    params = {"input_shape": shape, "output_shape": output, **extra, "op_shape": output, "dtype_in_out": (dtype, dtype),
              "stride_input": tuple(args["Input Strides"][0]), "stride_output": None}
    size = size_of(dtype)
    return params, prod(output), prod(shape) * size + prod(output) * size, spec_of("vector", dtype)


def replication_pad(name: str, args: dict, kernels: list[str]) -> Result:
    """``replication_pad{1,2,3}d(x, padding)``: the padding text's pairs widen the last dims, last first."""
    shape = tuple(args["Input Dims"][0])
    _ = args["Input type"][0], tuple(args["Input Strides"][0])  # (read first by TraceLens: absent, no row)
    padding = [int(x) for x in args["Concrete Inputs"][1].strip("[]").replace(" ", "").split(",")]
    output = list(shape)
    for i in range(len(padding) // 2):
        output[len(shape) - 1 - i] += padding[2 * i] + padding[2 * i + 1]
    return _resized(args, tuple(output), {"padding": padding})


def upsample_nearest(name: str, args: dict, kernels: list[str]) -> Result:
    """``upsample_nearest{1,2,3}d(x, output_size, ...)``: N, C and the output size."""
    shape = tuple(args["Input Dims"][0])
    _ = args["Input type"][0], tuple(args["Input Strides"][0])
    return _resized(args, shape[:2] + tuple(ast.literal_eval(args["Concrete Inputs"][1])), {})


def liger_silu_mul(name: str, args: dict, kernels: list[str]) -> Result:
    """Liger's ``LigerSiLUMulFunction(a, b)``: binary elementwise of a and b, the output at the larger size."""
    dims, types, strides = args["Input Dims"], args["Input type"], args["Input Strides"]
    first, second = tuple(dims[0]), tuple(dims[1])
    params = {"shape_in1": first, "shape_in2": second, "dtype_in1_in2_out": (types[0], types[1], None),
              "stride_input1": tuple(strides[0]), "stride_input2": tuple(strides[1]), "stride_output": None}
    out = prod(broadcast(first, second))
    size1, size2 = size_of(types[0]), size_of(types[1])
    size_out = (max(size1, size2) if first != () and second != () else size1) if size1 and size2 else None
    moved = None if None in {size1, size2, size_out} else prod(first) * size1 + prod(second) * size2 + out * size_out
    return params, out, moved, spec_of("vector", types[0])


def per_token_quant(name: str, args: dict, kernels: list[str]) -> Result:
    """aiter's ``dynamic_per_{token,group,tensor}_..._quant(out, input, scales, ...)`` (no row for a dtype
    with no size)."""
    dims, types, strides = args["Input Dims"], args["Input type"], args["Input Strides"]
    shape_in, shape_scales, shape_out = tuple(dims[1]), tuple(dims[2]), tuple(dims[0])
    params = {"shape_in1": shape_in, "shape_in2": shape_scales, "shape_out": shape_out,
              "dtype_in1_in2_out": (types[1], types[2], types[0]), "stride_input1": tuple(strides[1]),
              "stride_input2": tuple(strides[2]), "stride_output": tuple(strides[0])}
    size_in, size_scales = size_of(types[1]), size_of(types[2])  # (all three sized first: a dtype that is no text fails)
    moved = prod(shape_out) * size_of(types[0])
    moved += prod(shape_in) * size_in
    moved += prod(shape_scales) * size_scales
    return params, prod(shape_out) * 2.59375, moved, spec_of("vector", types[1])


def _int_or_none(value: object) -> int | None:
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None


def token_group_quant(name: str, args: dict, kernels: list[str]) -> Result:
    """``vllm::triton_per_token_group_quant_fp8(x [M, N], group_size)``: a missing or unreadable group size is
    128; a 1-d x is one row, no shape 1 by 1."""
    dims = args.get("Input Dims") or []
    shape = tuple(dims[0]) if len(dims) > 0 else ()
    m, n = (shape[0], shape[1]) if len(shape) >= 2 else (1, shape[0]) if len(shape) == 1 else (1, 1)
    concrete = args.get("Concrete Inputs") or []
    group = 128
    if len(concrete) > 1:
        text = str(concrete[1]).strip()
        if text and text.lower() != "none" and _int_or_none(text) is not None:
            group = _int_or_none(text)  # type: ignore[assignment]
    groups = max(1, (n + group - 1) // group)
    dtype = args.get("Input type", ("",))[0] if args.get("Input type") else ""
    params = {"M": m, "N": n, "group_size": group, "num_groups": groups, "shape_x": shape, "dtype_x": dtype,
              "shape_in1": shape, "shape_in2": (), "shape_out": shape,
              "dtype_in1_in2_out": (dtype, None, "c10::float8_e4m3fn"), "stride_input1": None, "stride_input2": None,
              "stride_output": None}
    _ = prod(shape)  # (TraceLens counts the elements first: shapes that are no numbers fail)
    size = size_of(dtype)
    moved = None if size is None else m * n * size + m * n * 1 + m * groups * 4
    return params, 6 * m * n, moved, spec_of("vector", dtype)


def _quantized(args: dict, dtype_out: str) -> tuple[dict, int, object]:
    """Primus's quantizers: the input's shape and dtype (strides when recorded), a fixed output dtype."""
    shape, dtype = tuple(args["Input Dims"][0]), args["Input type"][0]
    try:
        stride = tuple(args["Input Strides"][0])
    except (KeyError, IndexError):
        stride = None
    params = {"op_shape": shape, "dtype_in_out": (dtype, dtype_out), "stride_input": stride, "stride_output": None}
    return params, prod(shape), size_of(dtype)


def quantize_fp8(name: str, args: dict, kernels: list[str]) -> Result:
    """Primus Turbo's ``quantize_fp8_tensorwise(x, scale_inv, amax)``: each element read and written as fp8."""
    params, count, size = _quantized(args, "c10::Float8_e4m3fnuz")
    return params, count, None if size is None else count * size + count * 1, spec_of("vector", params["dtype_in_out"][0])


def quantize_mxfp4_dual(name: str, args: dict, kernels: list[str]) -> Result:
    """Primus's ``quantize_mxfp4_dual(x [M, N], ...)``: x read, row- and column-wise fp4 copies (half a byte an
    element, rounded up) and a byte of scale per 32 elements of each row and each column written."""
    params, count, size = _quantized(args, "c10::Float4_e2m1fn_x2")
    rows, cols = params["op_shape"]
    moved = None if size is None else (rows * cols * size + (rows * cols + 1) // 2 + (cols * rows + 1) // 2
                                       + rows * ((cols + 31) // 32) + cols * ((rows + 31) // 32))
    return params, count, moved, spec_of("vector", params["dtype_in_out"][0])


UNARY_MODELS = {
    **dict.fromkeys(("primus_turbo_cpp_extension::quantize_fp8_tensorwise", "primus_turbo::quantize_fp8_tensorwise"),
                    quantize_fp8),
    **dict.fromkeys(("primus_turbo_cpp_extension::quantize_mxfp4_dual", "primus_turbo::quantize_mxfp4_dual",
                     "primus::quantize_mxfp4_dual"), quantize_mxfp4_dual),
    **dict.fromkeys(GATED_FLOPS, gated),
    **dict.fromkeys(("aten::replication_pad1d", "aten::replication_pad2d", "aten::replication_pad3d"), replication_pad),
    **dict.fromkeys(("aten::upsample_nearest1d", "aten::upsample_nearest2d", "aten::upsample_nearest3d"),
                    upsample_nearest),
}
BINARY_MODELS = {
    "LigerSiLUMulFunction": liger_silu_mul,
    **dict.fromkeys(("aiter::dynamic_per_token_scaled_quant", "aiter::dynamic_per_group_scaled_quant",
                     "aiter::dynamic_per_tensor_quant"), per_token_quant),
    "vllm::triton_per_token_group_quant_fp8": token_group_quant,
}
