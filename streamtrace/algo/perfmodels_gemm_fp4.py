"""TraceLens's fp8 and fp4 GEMM models: Primus Turbo's hipBLASLt GEMMs
(``hipblaslt_gemm_fp8``/``_fp4(A, scaleA, B, scaleB, out_dtype, transA,
transB, transC, granularity)``), aiter's ``gemm_a4w4(A, B, scaleA, scaleB,
...)``, ``gemm_afp4wfp4_`` and its batched GEMMs.

FLOPs 2·M·N·K (times the batch).  fp4 inputs pack two elements a byte, so
K is twice the recorded last dim and A and B take half a byte an element.
hipBLASLt fp8: A and B at their sizes, a 2-byte output when A's size is 1;
fp4 (and aiter's a4w4): A and B at K/2 elements a row, plus a scale per 32
elements of a row at its dtype's size (1 when unknown) and a bf16 output.
aiter's: its output bf16; the batched a16wfp4 with bf16 activations and
fp4 weights, the batched a8w8 at its inputs' sizes.  Compute spec
``matrix_fp4`` for aiter's fp4 GEMMs (whatever the recorded dtype),
the weights' dtype for the batched a8w8, else A's.
"""
from __future__ import annotations

from .perfmodel import PRECISION, compute_spec, gemm_common, size_of
from .perfmodels_gemm import gemm_bytes

Result = tuple[dict, int, "int | float | None", str]
SCALE_BLOCK = 32  # fp4 (MX) elements per scale


def parse_bool(value: object) -> bool:
    """TraceLens's ``parse_bool``: ``"true"``/``"1"`` and ``"false"``/``"0"``/``""`` as such, else truthiness."""
    if isinstance(value, bool):
        return value
    if value is None:
        return False
    if isinstance(value, str):
        text = value.strip().lower()
        if text in {"true", "1"}:
            return True
        if text in {"false", "0", ""}:
            return False
    return bool(value)


def _strides(args: dict, first: int, second: int) -> tuple[tuple | None, tuple | None]:
    try:
        return tuple(args["Input Strides"][first]), tuple(args["Input Strides"][second])
    except (KeyError, IndexError):
        return None, None


def _hipblaslt_params(args: dict, packed: bool, kernels: list[str]) -> dict:
    """A the first input, B the third; transposes from the 6th-8th concrete inputs (C transposed swaps A and B)."""
    dims, concrete = args["Input Dims"], args.get("Concrete Inputs") or []
    a_shape, b_shape = list(dims[0]), list(dims[2])
    trans_a, trans_b, trans_c = (parse_bool(concrete[at]) if len(concrete) > at else False for at in (5, 6, 7))
    if trans_c:
        a_shape, b_shape = b_shape, a_shape
        trans_a, trans_b = not trans_b, not trans_a
    k = a_shape[0] if trans_a else a_shape[1]
    types = args["Input type"]
    stride_a, stride_b = _strides(args, 0, 2)
    return gemm_common({"M": a_shape[1] if trans_a else a_shape[0], "N": b_shape[0] if trans_b else b_shape[1],
                        "K": k * 2 if packed else k, "bias": False, "stride_A": stride_a, "stride_B": stride_b,
                        "dtype_A_B": (types[0], types[2]), "dtype_scaleA": types[1] if len(types) > 1 else None,
                        "dtype_scaleB": types[3] if len(types) > 3 else None}, kernels)


def _sizes(params: dict) -> tuple[int, int]:
    size_a, size_b = size_of(params["dtype_A_B"][0]), size_of(params["dtype_A_B"][1])
    if size_a is None or size_b is None:
        raise ValueError("A or B of a dtype with no known size")  # (TraceLens's assertion: no row)
    return size_a, size_b


def _fp4_bytes(params: dict) -> int:
    size_a, size_b = _sizes(params)
    m, n, k = params["M"], params["N"], params["K"]
    per_row = (k + SCALE_BLOCK - 1) // SCALE_BLOCK
    scale_a, scale_b = size_of(params["dtype_scaleA"]) or 1, size_of(params["dtype_scaleB"]) or 1
    return m * (k // 2) * size_a + n * (k // 2) * size_b + m * per_row * scale_a + n * per_row * scale_b + m * n * 2


def _flops(params: dict) -> int:
    return 2 * params["M"] * params["N"] * params["K"]


def hipblaslt_fp8(name: str, args: dict, kernels: list[str]) -> Result:
    params = _hipblaslt_params(args, False, kernels)
    size_a, size_b = _sizes(params)
    moved = gemm_bytes(params, size_a, size_b, size_a, 2 if size_a == 1 else size_a)
    return params, _flops(params), moved, compute_spec(params)


def hipblaslt_fp4(name: str, args: dict, kernels: list[str]) -> Result:
    params = _hipblaslt_params(args, True, kernels)
    return params, _flops(params), _fp4_bytes(params), compute_spec(params)


def a4w4(name: str, args: dict, kernels: list[str]) -> Result:
    """aiter's ``gemm_a4w4``/``_gemm_a4w4_asm``: A [M, K/2], B [N, K/2] (the NT layout), scales third and fourth."""
    dims, types = args["Input Dims"], args["Input type"]
    a_shape, b_shape = list(dims[0]), list(dims[1])
    stride_a, stride_b = _strides(args, 0, 1)
    params = gemm_common({"M": a_shape[0], "N": b_shape[0], "K": a_shape[1] * 2, "bias": False, "stride_A": stride_a,
                          "stride_B": stride_b, "dtype_A_B": (types[0], types[1]),
                          "dtype_scaleA": types[2] if len(types) > 2 else None,
                          "dtype_scaleB": types[3] if len(types) > 3 else None}, kernels)
    return params, _flops(params), _fp4_bytes(params), compute_spec(params)


def afp4wfp4(name: str, args: dict, kernels: list[str]) -> Result:
    """aiter's ``gemm_afp4wfp4_``: X [M, K/2], W [N, K/2], half a byte an element, a bf16 output."""
    dims, types = args["Input Dims"], args["Input type"]
    params = gemm_common({"B": 1, "M": dims[0][0], "N": dims[1][0], "K": dims[0][1] * 2, "bias": False,
                          "dtype_A_B": (types[0], types[1], "c10::bfloat16")}, kernels)
    return params, _flops(params), gemm_bytes(params, 0.5, 0.5, 2, 2), "matrix_fp4"


def batched_a16wfp4(name: str, args: dict, kernels: list[str]) -> Result:
    """aiter's ``batched_gemm_a16wfp4_``: X [B, M, K], W [B, N, K/2] (fp4), a bf16 output."""
    dims, types = args["Input Dims"], args["Input type"]
    params = gemm_common({"B": dims[0][0], "M": dims[0][1], "N": dims[1][1], "K": dims[0][2], "bias": False,
                          "dtype_A_B": (types[0], types[1], "c10::bfloat16")}, kernels)
    per_batch = gemm_bytes(params, size_of(types[0]), 0.5, 2, 2)
    return params, params["B"] * _flops(params), None if per_batch is None else params["B"] * per_batch, "matrix_fp4"


def batched_a8w8(name: str, args: dict, kernels: list[str]) -> Result:
    """SGLang's batched a8w8 GEMM: X [B, M, K] (or [M, B, K]), W [B, N, K], a bf16 output; the weights' compute."""
    dims, types = args["Input Dims"], args["Input type"]
    x_shape, w_shape = dims[0], dims[1]
    batch = w_shape[0]
    params = gemm_common({"B": batch, "M": x_shape[1] if x_shape[0] == batch else x_shape[0], "N": w_shape[1],
                          "K": x_shape[2], "bias": False, "dtype_A_B": (types[0], types[1], "c10::bfloat16")}, kernels)
    per_batch = gemm_bytes(params, size_of(types[0]), size_of(types[1]), 2, 2)
    precision = PRECISION.get(types[1].lower())  # (unguarded in TraceLens: a dtype that is no text fails)
    return (params, batch * _flops(params), None if per_batch is None else batch * per_batch,
            f"matrix_{precision}" if precision else "")


MODELS = {
    **dict.fromkeys(("primus_turbo_cpp_extension::hipblaslt_gemm_fp8", "primus_turbo::hipblaslt_gemm_fp8"),
                    hipblaslt_fp8),
    **dict.fromkeys(("primus_turbo_cpp_extension::hipblaslt_gemm_fp4", "primus_turbo::hipblaslt_gemm_fp4"),
                    hipblaslt_fp4),
    **dict.fromkeys(("aiter::gemm_a4w4", "aiter::_gemm_a4w4_asm"), a4w4),
    "aiter::gemm_afp4wfp4_": afp4wfp4, "aiter::batched_gemm_a16wfp4_": batched_a16wfp4,
    "sglang_profiler::batched_gemm_a8w8_a_per_token_group_prequant_w_per_batched_tensor_quant"
    "_batched_gemm_a8w8_a_per_token_group_prequant_w_per_batched_tensor_quant": batched_a8w8,
}
