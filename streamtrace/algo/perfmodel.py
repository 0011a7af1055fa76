"""TraceLens's GEMM performance model (``PerfModel``): the parameters of a
matrix multiply read from its op's shapes and dtypes, its FLOPs and the bytes
it must move, for ``aten::mm``, ``aten::addmm``, ``aten::bmm`` and
``aten::baddbmm``.

FLOPs are 2·M·N·K (+ M·N for the bias), times the batch; bytes are
(M·K + K·N + M·N + N if bias) elements of the first input's size, times the
batch. docs/analyze.md states the rules and TraceLens's accidents.
"""
from __future__ import annotations

import re

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
    size = BYTES_PER_ELEMENT.get(str(params["dtype_A_B"][0]).lower())
    if size is None:
        return None
    m, n, k = params["M"], params["N"], params["K"]
    return params["B"] * (m * k * size + k * n * size + m * n * size + (n if params["bias"] else 0) * size)


def compute_spec(params: dict) -> str:
    """TraceLens's "Compute Spec" (``matrix_<precision>``), empty when unknown."""
    dtype = params["dtype_A_B"][0] if params["dtype_A_B"] else None
    precision = PRECISION.get(str(dtype).lower()) if dtype else None
    return f"matrix_{precision}" if precision else ""
