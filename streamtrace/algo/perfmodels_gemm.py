"""TraceLens's scaled GEMM model (``aten_scaled_mm``) for ``aten::_scaled_mm``
and the ops TraceLens models the same way (``trtllm::cublas_scaled_mm``,
``bitsandbytes::int8_linear_matmul``): A (M, K) x B (K, N).

FLOPs 2·M·N·K (+ M·N with a bias); bytes A and B at the first input's dtype
size, the output at 2 bytes when that size is 1 (fp8, int8), else at it
(none past 4 bytes).  *Accident kept:* a bias only when the op has exactly
three inputs (``_scaled_mm`` has at least four: never).
"""
from __future__ import annotations

from .perfmodel import compute_spec, gemm_common, size_of

SCALED_MM_OPS = ("aten::_scaled_mm", "trtllm::cublas_scaled_mm", "bitsandbytes::int8_linear_matmul")


def scaled_mm(name: str, args: dict, kernels: list[str]) -> tuple[dict, int, int | None, str]:
    dims, types = args["Input Dims"], args["Input type"]
    m, n, k = dims[0][0], dims[1][1], dims[0][1]
    bias = len(dims) == 3
    try:
        strides = (tuple(args["Input Strides"][0]), tuple(args["Input Strides"][1]))
    except KeyError:
        strides = (None, None)
    params = gemm_common({"M": m, "N": n, "K": k, "bias": bias, "stride_A": strides[0], "stride_B": strides[1],
                          "dtype_A_B": tuple(types[:2])}, kernels)
    size_a, size_b = size_of(params["dtype_A_B"][0]), size_of(params["dtype_A_B"][1])
    if size_a is None or size_b is None:
        raise ValueError("A or B of a dtype with no known size")  # (TraceLens's assertion: no row)
    size_out = 2 if size_a == 1 else size_a if size_a in (2, 4) else None
    moved = None if size_out is None else (m * k * size_a + k * n * size_a + m * n * size_out
                                           + (n if bias else 0) * size_a)
    return params, 2 * m * n * k + (m * n if bias else 0), moved, compute_spec(params)


MODELS = dict.fromkeys(SCALED_MM_OPS, scaled_mm)
