"""TraceLens's GEMM models of other names than ``aten::mm``'s: the scaled
GEMM (``aten_scaled_mm``) for ``aten::_scaled_mm`` and the ops TraceLens
models the same way (``trtllm::cublas_scaled_mm``,
``bitsandbytes::int8_linear_matmul``): A (M, K) x B (K, N); aiter's
block-scale and bf16 GEMMs, vLLM's dynamic-quant GEMM and TransformerEngine's
(``te_gemm_ts``, v2's pseudo ops), each reading its shapes and dtypes where
its signature has them.

FLOPs 2·M·N·K (+ M·N with a bias); bytes A, B, the output and the bias,
each at its size (none when one is unknown).  Scaled GEMM: A and B at the
first input's dtype size, the output at 2 bytes when that size is 1 (fp8,
int8), else at it (none past 4 bytes).  *Accident kept:* a bias only when
the op has exactly three inputs (``_scaled_mm`` has at least four: never).
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


def gemm_bytes(p: dict, size_a: object, size_b: object, size_bias: object, size_out: object) -> int | None:
    """TraceLens's GEMM bytes with a size per operand: none when any is unknown."""
    if None in {size_a, size_b, size_bias, size_out}:
        return None
    m, n, k = p["M"], p["N"], p["K"]
    return m * k * size_a + k * n * size_b + m * n * size_out + (n if p["bias"] else 0) * size_bias  # type: ignore


def _flops(p: dict) -> int:
    return 2 * p["M"] * p["N"] * p["K"] + (p["M"] * p["N"] if p["bias"] else 0)


def _three_dtypes(name: str, args: dict, kernels: list[str], params: dict) -> tuple[dict, int, int | None, str]:
    """A GEMM whose dtype_A_B names A, B and the output (the bias at the output's size)."""
    params = gemm_common(params, kernels)
    dtypes = params["dtype_A_B"]
    size_out = size_of(dtypes[2])
    return params, _flops(params), gemm_bytes(params, size_of(dtypes[0]), size_of(dtypes[1]), size_out, size_out), \
        compute_spec(params)


def a8w8_blockscale(name: str, args: dict, kernels: list[str]) -> tuple[dict, int, int | None, str]:
    """aiter's (and vLLM's, SGLang's) block-scale fp8/int8 GEMMs: X [M, K], W [N, K], then the scales, whose
    shapes give the block sizes; a bf16 output."""
    dims = args["Input Dims"]
    types = args.get("Input type", []) or []
    m, k, n = dims[0][0], dims[0][1], dims[1][0]
    params = {"B": 1, "M": m, "N": n, "K": k, "bias": False,
              "dtype_A_B": (types[0] if len(types) > 0 else "", types[1] if len(types) > 1 else "", "c10::bfloat16")}
    if len(dims) > 3:
        x_scale, w_scale = dims[2], dims[3]
        params.update({"quant_scheme": "a8w8_blockscale", "quant_granularity": "per_block",
                       "block_k": -(-k // x_scale[-1]) if x_scale and x_scale[-1] else None,
                       "block_n": -(-n // w_scale[0]) if w_scale and w_scale[0] else None,
                       "scale_dtype": types[2] if len(types) > 2 else "float32"})
    params.update({"output_shape": (m, n), "output_dtype": "c10::bfloat16"})
    return _three_dtypes(name, args, kernels, params)


def a16w16(name: str, args: dict, kernels: list[str]) -> tuple[dict, int, int | None, str]:
    """aiter's bf16 GEMMs, X [M, K] and W [N, K]: ``gemm_a16w16(x, w, bias, ...)`` (a bias when the third input
    has a shape; output at X's dtype), ``gemm_a16w16_atomic_`` and SGLang's flydsl hgemm (output the fourth
    input's dtype, bf16 when none), ``_gemm_a16w16_asm`` (the third's when it has a size, else X's)."""
    dims, types = args["Input Dims"], args["Input type"]
    bias = False
    if name == "aiter::gemm_a16w16":
        bias = len(dims) > 2 and len(dims[2]) > 0
        out = types[0]
    elif name == "aiter::_gemm_a16w16_asm":
        out = types[2] if len(types) > 2 and size_of(types[2]) is not None else types[0]
    else:
        out = types[3] if len(types) > 3 else "c10::bfloat16"
    params = {"B": 1, "M": dims[0][0], "N": dims[1][0], "K": dims[0][1], "bias": bias,
              "dtype_A_B": (types[0], types[1], out)}
    return _three_dtypes(name, args, kernels, params)


def _strides(args: dict, first: int, second: int) -> tuple[tuple | None, tuple | None]:
    try:
        return tuple(args["Input Strides"][first]), tuple(args["Input Strides"][second])
    except KeyError:
        return None, None


def dynamic_quant(name: str, args: dict, kernels: list[str]) -> tuple[dict, int, int | None, str]:
    """``vllm::gemm_with_dynamic_quant``: A and B the first two 2-d inputs (else the first two inputs), B [N, K];
    every operand at A's dtype size."""
    dims = args.get("Input Dims", [])
    found: list[tuple] = []
    for shape in dims:
        if isinstance(shape, (list, tuple)) and len(shape) == 2:
            found.append(tuple(shape))
            if len(found) == 2:
                break
    a_shape, b_shape = (found + [None, None])[:2]
    if (a_shape is None or b_shape is None) and len(dims) >= 2:
        if a_shape is None and isinstance(dims[0], (list, tuple)):
            a_shape = tuple(dims[0])
        if b_shape is None and isinstance(dims[1], (list, tuple)):
            b_shape = tuple(dims[1])
    if not a_shape or not b_shape or len(a_shape) != 2 or len(b_shape) != 2:
        raise ValueError("no 2-d A and B among the inputs")
    types = args.get("Input type", [])
    if not isinstance(types, (list, tuple)) or len(types) < 2:
        raise ValueError("no dtypes of A and B")
    stride_a, stride_b = _strides(args, 0, 1)
    params = gemm_common({"M": a_shape[0], "N": b_shape[0], "K": a_shape[1], "bias": False, "stride_A": stride_a,
                          "stride_B": stride_b, "dtype_A_B": tuple(types[:2])}, kernels)
    size = size_of(params["dtype_A_B"][0])
    return params, _flops(params), gemm_bytes(params, size, size, size, size), compute_spec(params)


def te_gemm_ts(name: str, args: dict, kernels: list[str]) -> tuple[dict, int, int | None, str]:
    """TransformerEngine's ``tex_ts::te_gemm_ts``: A the 1st input, B the 6th, transposes the 5th and 10th
    concrete inputs (``"1"``), a bias when the 15th is not empty; dtypes of A, B, the output (11th), the bias (19th)."""
    dims, concrete, types = args["Input Dims"], args["Concrete Inputs"], args["Input type"]
    a_shape, b_shape = dims[0], dims[5]
    _ = dims[10]  # (the output C, which TraceLens reads first: absent, no row)
    m, k = (a_shape[0], a_shape[1]) if concrete[4] == "1" else (a_shape[1], a_shape[0])
    n = b_shape[1] if concrete[9] == "1" else b_shape[0]
    stride_a, stride_b = _strides(args, 0, 5)
    params = gemm_common({"M": m, "N": n, "K": k, "bias": concrete[14] != "", "stride_A": stride_a,
                          "stride_B": stride_b, "dtype_A_B": (types[0], types[5], types[10], types[18])}, kernels)
    dtypes = params["dtype_A_B"]
    moved = gemm_bytes(params, size_of(dtypes[0]), size_of(dtypes[1]), size_of(dtypes[3]), size_of(dtypes[2]))
    return params, _flops(params), moved, compute_spec(params)


def te_pseudo_gemm(name: str, args: dict, kernels: list[str]) -> tuple[dict, int, int | None, str]:
    """TransformerEngine v2's GEMM pseudo ops (``_Linear_yfwd_mm`` ...): A [M, K], B [K, N] of one dtype (else no
    row); a 2-byte output."""
    dims = args["Input Dims"]
    a_shape, b_shape = dims[0], dims[1]
    stride_a, stride_b = _strides(args, 0, 1)
    params = gemm_common({"M": a_shape[0], "N": b_shape[1], "K": a_shape[1], "bias": False, "stride_A": stride_a,
                          "stride_B": stride_b, "dtype_A_B": tuple(args["Input type"][:2])}, kernels)
    dtypes = params["dtype_A_B"]
    if dtypes[0] != dtypes[1]:
        raise ValueError("A and B of different dtypes")
    size = size_of(dtypes[0])
    return params, _flops(params), gemm_bytes(params, size, size, size, 2), compute_spec(params)


BLOCKSCALE_OPS = (
    "sglang_profiler::fp8_utils_gemm_a8w8_blockscale", "sglang_profiler::gemm_a8w8_blockscale_gemm_a8w8_blockscale",
    "vllm::rocm_aiter_triton_gemm_a8w8_blockscale", "aiter::gemm_a8w8_blockscale_ck", "aiter::gemm_a8w8_blockscale_cktile",
    "aiter::gemm_a8w8_blockscale_bpreshuffle_ck", "aiter::gemm_a8w8_blockscale_bpreshuffle_cktile",
    "aiter::flatmm_a8w8_blockscale_asm", "aiter::gfx950_a8w8_blockscale_asm", "aiter::gemm_a8w8_ck",
    "aiter::gemm_a8w8_bpreshuffle_ck", "aiter::gemm_a8w8_bpreshuffle", "vllm::_rocm_aiter_preshuffled_per_token_w8a8_gemm",
    "aiter::_gemm_a8w8_blockscale_bpreshuffle_asm")
TE_PSEUDO_OPS = ("_Linear_yfwd_mm", "_LinearBackward_xgrad_mm", "_LinearBackward_wgrad_mm", "_LayerNormLinear_yfwd_mm",
                 "_LayerNormLinearBackward_xgrad_mm", "_LayerNormLinearBackward_wgrad_mm")
MODELS.update({
    **dict.fromkeys(BLOCKSCALE_OPS, a8w8_blockscale),
    **dict.fromkeys(("aiter::gemm_a16w16", "aiter::gemm_a16w16_atomic_", "aiter::_gemm_a16w16_asm",
                     "sglang_profiler::gemm_kernels_flydsl_hgemm"), a16w16),
    "vllm::gemm_with_dynamic_quant": dynamic_quant, "tex_ts::te_gemm_ts": te_gemm_ts,
    **dict.fromkeys(TE_PSEUDO_OPS, te_pseudo_gemm),
})
