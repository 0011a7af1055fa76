"""TraceLens's performance models (``PerfModel``) for the sheets analyze
writes: an op's parameters read from its shapes and dtypes, its FLOPs and
the bytes it must move.

GEMM (``aten::mm``, ``addmm``, ``bmm``, ``baddbmm``): FLOPs 2·M·N·K (+ M·N
for the bias) times the batch; bytes (M·K + K·N + M·N + N if bias) elements
of the first input's size, times the batch.  Unary elementwise: FLOPs one
per element, bytes each element read and written.  Binary elementwise:
FLOPs one per output element (the broadcast shape), bytes both inputs read
and the output written.  docs/analyze.md states the rules and TraceLens's
accidents.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from math import prod

# bytes per element by dtype name (lower case), as TraceLens's name2bpe
BYTES_PER_ELEMENT = {
    "double": 8, "long int": 8, "float": 4, "scalar": 4, "int": 4, "c10::half": 2, "c10::bfloat16": 2,
    "c10::float8_e4m3fnuz": 1, "c10::float8_e4m3fn": 1, "c10::float8_e5m2": 1, "c10::float8_e8m0fnu": 1,
    "unsigned char": 1, "signed char": 1, "fp8": 1, "c10::float4_e2m1fn_x2": 1, "fp4": 1,
}
# dtype name (lower case) -> precision of the "Compute Spec" column, as TraceLens's torch_dtype_map
PRECISION = {
    "float": "fp32", "double": "fp64", "c10::half": "fp16", "c10::bfloat16": "bf16", "c10::float8_e4m3fnuz": "fp8",
    "unsigned char": "fp8", "fp8": "fp8", "fp4": "fp4", "mxfp4": "fp4", "c10::float4_e2m1fn_x2": "fp4",
    "c10::float8_e4m3fn": "fp8",
}
# op name -> (index of A among the inputs, batched)
GEMM_OPS = {"aten::mm": (0, False), "aten::addmm": (1, False), "aten::bmm": (0, True), "aten::baddbmm": (1, True)}
ROCM_GEMM = re.compile(r"^.*C[a-z]{3}_A[a-z]{3}_B[a-z]{3}.*$")


def transpose_of(kernel: str) -> tuple[bool | None, bool | None] | None:
    """The (A, B) transpose flags a GEMM kernel's name tells (Tensile's
    ``_Alik_``/``_Bjlk_``, cuBLAS's ``nvjet..._TN``), or None."""
    if ROCM_GEMM.match(kernel):
        a = False if "_Ailk_" in kernel else True if "_Alik_" in kernel else None
        b = False if "_Bljk_" in kernel else True if "_Bjlk_" in kernel else None
        return a, b
    if kernel.startswith("nvjet"):
        flags = kernel.split("_")[-1]
        return flags[0] == "T", flags[1] == "T"
    return None


def gemm_params(name: str, args: dict, kernels: list[str]) -> dict:
    """TraceLens's ``param_details`` of a GEMM op (raises on odd shapes, as
    TraceLens does: such an op gets no row)."""
    first, batched = GEMM_OPS[name]
    dims = args["Input Dims"]
    a_shape, b_shape = dims[first], dims[first + 1]
    if batched:
        batch, m, k = a_shape
        n = b_shape[2]
    else:
        m, n, k = a_shape[0], b_shape[1], a_shape[1]
    dtypes = tuple(args["Input type"][first:first + 2])
    try:
        stride_a, stride_b = tuple(args["Input Strides"][first]), tuple(args["Input Strides"][first + 1])
    except KeyError:
        stride_a = stride_b = None
    params = {"B": batch} if batched else {}
    params.update({"M": m, "N": n, "K": k, "bias": first == 1, "stride_A": stride_a, "stride_B": stride_b,
                   "dtype_A_B": dtypes})
    return gemm_common(params, kernels)


def gemm_common(params: dict, kernels: list[str]) -> dict:
    """What TraceLens's GEMM base adds to every model's parameters: a batch
    of 1 when none, the transpose flags of the first kernel name telling them."""
    params.setdefault("B", 1)
    for kernel in kernels:
        flags = transpose_of(kernel)
        if flags is not None:
            params["transpose"] = flags
            break
    return params


def gemm_flops(params: dict) -> int:
    m, n, k = params["M"], params["N"], params["K"]
    return params["B"] * (2 * m * n * k + (m * n if params["bias"] else 0))


def gemm_bytes(params: dict) -> int | None:
    """Bytes moved, None when the first input's dtype has no known size."""
    size = size_of(params["dtype_A_B"][0])
    if size is None:
        return None
    m, n, k = params["M"], params["N"], params["K"]
    return params["B"] * (m * k * size + k * n * size + m * n * size + (n if params["bias"] else 0) * size)


def spec_of(kind: str, dtype: object) -> str:
    """TraceLens's "Compute Spec" (``<matrix|vector>_<precision>``), empty when unknown."""
    precision = PRECISION.get(dtype.lower()) if dtype else None  # (not text: AttributeError, as TraceLens)
    return f"{kind}_{precision}" if precision else ""


def compute_spec(params: dict) -> str:
    return spec_of("matrix", params["dtype_A_B"][0] if params["dtype_A_B"] else None)


def size_of(dtype: object) -> int | None:
    return None if dtype is None else BYTES_PER_ELEMENT.get(dtype.lower())  # (not text: AttributeError, as TraceLens)


def gemm(name: str, args: dict, kernels: list[str]) -> tuple[dict, int, int | None, str]:
    params = gemm_params(name, args, kernels)
    return params, gemm_flops(params), gemm_bytes(params), compute_spec(params)


def vllm_unquantized_gemm(name: str, args: dict, kernels: list[str]) -> tuple[dict, int, int | None, str]:
    """``vllm::rocm_unquantized_gemm`` (x [M, K], weight [N, K], bias [N]):
    the bias, when it has a shape, gives the output's and its own dtype,
    else the weight's does."""
    dims, types = args["Input Dims"], args["Input type"]
    bias = len(dims) > 2 and len(dims[2]) > 0
    params = gemm_common({"M": dims[0][0], "N": dims[1][0], "K": dims[0][1], "bias": bias,
                           "dtype_A_B": (types[0], types[1], types[2] if len(types) > 2 else "")}, kernels)
    m, n, k = params["M"], params["N"], params["K"]
    size_a, size_b = size_of(types[0]), size_of(types[1])
    size_out = size_of(params["dtype_A_B"][2]) if bias else size_b
    moved = None if None in (size_a, size_b, size_out) else (
        m * k * size_a + k * n * size_b + m * n * size_out + (n if bias else 0) * size_out)
    return params, 2 * m * n * k + (m * n if bias else 0), moved, compute_spec(params)


def unary(name: str, args: dict, kernels: list[str]) -> tuple[dict, int, int | None, str]:
    """``aten_unary_elementwise``: the first input's shape; an output dtype when a second input has a shape."""
    dims, types, strides = args["Input Dims"], args["Input type"], args["Input Strides"]
    shape, dtype_in, stride_in = tuple(dims[0]), types[0], tuple(strides[0])
    dtype_out, stride_out = (types[1], tuple(strides[1])) if len(dims) > 1 and dims[1] else (None, None)
    params = {"op_shape": shape, "dtype_in_out": (dtype_in, dtype_out), "stride_input": stride_in,
              "stride_output": stride_out}
    count = prod(shape)
    size_in = size_of(dtype_in)
    size_out = size_of(dtype_out) if dtype_out is not None else size_in
    moved = None if size_in is None or size_out is None else count * size_in + count * size_out
    return params, count, moved, spec_of("vector", dtype_in)


def broadcast(first: tuple, second: tuple) -> tuple:
    ndim = max(len(first), len(second))
    first, second = (1,) * (ndim - len(first)) + first, (1,) * (ndim - len(second)) + second
    if any(a != b and a != 1 and b != 1 for a, b in zip(first, second)):
        raise ValueError(f"shapes not broadcastable: {first} and {second}")
    return tuple(max(a, b) for a, b in zip(first, second))


def binary(name: str, args: dict, kernels: list[str]) -> tuple[dict, int, int | None, str]:
    """``aten_binary_elementwise``: two inputs broadcast; the output's dtype
    from a third input, else the larger input size when both are tensors,
    else the first's."""
    dims, types, strides = args["Input Dims"], args["Input type"], args["Input Strides"]
    shape1, shape2 = tuple(dims[0]), tuple(dims[1])
    dtype_out, stride_out = (types[2], tuple(strides[2])) if len(dims) > 2 and dims[2] else (None, None)
    params = {"shape_in1": shape1, "shape_in2": shape2, "dtype_in1_in2_out": (types[0], types[1], dtype_out),
              "stride_input1": tuple(strides[0]), "stride_input2": tuple(strides[1]), "stride_output": stride_out}
    out = prod(broadcast(shape1, shape2))
    size1, size2 = size_of(types[0]), size_of(types[1])
    if dtype_out is not None:
        size_out = size_of(dtype_out)
    elif size1 and size2:
        size_out = max(size1, size2) if shape1 != () and shape2 != () else size1
    else:
        size_out = None
    moved = None if None in (size1, size2, size_out) else prod(shape1) * size1 + prod(shape2) * size2 + out * size_out
    return params, out, moved, spec_of("vector", types[0])


def _reduced_dims(concrete: list) -> tuple[list[int] | None, bool]:
    """The dims and keepdim of a reduction from its concrete inputs after the
    tensor, searched from the end: keepdim the last bool, dims the last int or
    list before it.  *Accident kept:* Kineto writes these as strings
    (``'[0]'``, ``'True'``), which TraceLens skips, so a reduction over some
    dims is modelled as a full one."""
    dims, keepdim, keep_at = None, False, None
    scalars = concrete[1:] if len(concrete) >= 2 else []
    for at in range(len(scalars) - 1, -1, -1):
        if isinstance(scalars[at], bool):
            keepdim, keep_at = scalars[at], at
            break
    for at in range(len(scalars) - 1, -1, -1):
        value = scalars[at]
        if at == keep_at or value is None or isinstance(value, str):
            continue
        try:
            if isinstance(value, (list, tuple)):
                return [int(d) for d in value], keepdim
            if isinstance(value, int) and not isinstance(value, bool):
                return [int(value)], keepdim
        except (TypeError, ValueError):
            continue
    return dims, keepdim


def reduce(name: str, args: dict, kernels: list[str]) -> tuple[dict, int, int | None, str]:
    """``aten_reduce``: FLOPs one per input element; bytes the input read and
    the output (the input's shape less the reduced dims) written."""
    dims = args.get("Input Dims", [])
    if not dims or dims[0] is None:
        params: dict = {"num_input_elems": 0, "num_output_elems": 0, "dtype_in_out": (None, None)}
        return params, 0, None, ""
    shape = tuple(dims[0])
    count = prod(shape)
    types = args.get("Input type", [])
    dtype_in = types[0] if types else None
    dtype_out = args.get("Output type", [None])
    dtype_out = dtype_out[0] if isinstance(dtype_out, list) and dtype_out else None
    reduced, keepdim = _reduced_dims(args.get("Concrete Inputs", []))
    if "cumsum" in name or "cumprod" in name:
        out = count
    elif reduced:
        out_shape = list(shape)
        for d in sorted((d if d >= 0 else len(shape) + d for d in reduced), reverse=True):
            if 0 <= d < len(out_shape):
                if keepdim:
                    out_shape[d] = 1
                else:
                    out_shape.pop(d)
        out = prod(out_shape) if out_shape else 1
    else:
        out = 1
    kind = next((k for k in ("mean", "max", "min", "norm") if k in name), "sum")
    params = {"num_input_elems": count, "num_output_elems": out, "dtype_in_out": (dtype_in, dtype_out),
              "reduce_type": kind}
    size_in = size_of(dtype_in) if isinstance(dtype_in, str) and dtype_in else None
    if dtype_out is None:
        size_out = size_in
    else:
        size_out = size_of(dtype_out) if isinstance(dtype_out, str) and dtype_out else None
    moved = None if size_in is None or size_out is None else count * size_in + out * size_out
    return params, count, moved, spec_of("vector", dtype_in)


Model = Callable[[str, dict, list[str]], tuple[dict, int, "int | None", str]]
UNARY_OPS = ("aten::copy", "aten::copy_", "aten::clamp_min", "aten::clamp_min_", "aten::clamp_max", "aten::clamp_max_",
             "aten::sigmoid", "aten::rsqrt", "aten::silu", "aten::neg", "aten::pow")
BINARY_OPS = ("aten::div", "aten::div_", "aten::mul", "aten::mul_", "aten::add", "aten::add_", "aten::sigmoid_backward",
              "aten::threshold_backward")
REDUCE_OPS = ("aten::sum", "aten::mean", "aten::max", "aten::min", "aten::norm", "aten::linalg_norm", "aten::std",
              "aten::var", "aten::logsumexp", "aten::cumsum", "aten::cumprod", "aten::amin", "aten::amax")
# sheet -> the models here, by op name (TraceLens has more ops in each sheet: see SHEET_OPS)
MODELS: dict[str, dict[str, Model]] = {
    "GEMM": {**dict.fromkeys(GEMM_OPS, gemm), "vllm::rocm_unquantized_gemm": vllm_unquantized_gemm},
    "UnaryElementwise": dict.fromkeys(UNARY_OPS, unary),
    "BinaryElementwise": dict.fromkeys(BINARY_OPS, binary),
    "Reduce": dict.fromkeys(REDUCE_OPS, reduce),
}
# the sheets TraceLens splits into <sheet>_fwd and <sheet>_bwd (analyze writes the _fwd one)
SPLIT_SHEETS = frozenset({"Reduce"})
