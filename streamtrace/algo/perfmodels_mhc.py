"""TraceLens's models of aiter's manifold-constrained hyper-connection ops
(sheet ``mHC``): M tokens, n residual streams of width C, the projection
of hc3 = n² + 2n logits over K = n·C, split-K partials.

``mhc_post`` (out, x [M, C], residual [M, n, C], mixes): FLOPs
2·M·n·C·(n + 1); bytes x and the residual read, 4-byte mixes, the next
residual written.  ``mhc_pre_gemm_sqrsum`` (out [split, M, hc3], sqrsum, x
[M, n, C], fn [hc3, K]): FLOPs 2·M·hc3·K; bytes x, a 4-byte fn, 4-byte
partials written.  ``mhc_pre_big_fuse_rmsnorm`` (post_mix [M, n, 1], ...,
out [M, C], partials [split, M, hc3] ...): FLOPs 2·M·C·n + 5·M·C.
``mhc_fused_post_pre_gemm_sqrsum``: post and pre in one.  Sizes at the
residual's dtype (bfloat16 when not recorded); ``matrix_`` for the two with
a GEMM, ``vector_`` for the others.  No backward models.
"""
from __future__ import annotations

from collections.abc import Callable

from .perfmodel import size_of, spec_of

Result = tuple[dict, "int | None", "int | None", str]


def _dtype(args: dict, at: int) -> object:
    types = args.get("Input type", []) or []
    return types[at] if len(types) > at else "c10::BFloat16"


def _result(params: dict, flops: int, moved: Callable[[int], int], kind: str) -> Result:
    """FLOPs, and bytes from ``moved(size)`` unless the dtype has no size."""
    size = size_of(params["dtype_in"])
    return params, flops, None if size is None else moved(size), spec_of(kind, params["dtype_in"])


def post(name: str, args: dict, kernels: list[str]) -> Result:
    dims = args["Input Dims"]
    m, c, n = dims[1][0], dims[1][1], dims[0][1]
    params = {"M": m, "n": n, "C": c, "hc3": None, "dtype_in": _dtype(args, 1)}
    return _result(params, 2 * m * n * c * (n + 1),
                   lambda size: m * c * size + m * n * c * size + (m * n * 4 + m * n * n * 4) + m * n * c * size,
                   "vector")


def pre_gemm_sqrsum(name: str, args: dict, kernels: list[str]) -> Result:
    dims = args["Input Dims"]
    m, n, c = dims[2][0], dims[2][1], dims[2][2]
    hc3, k, split = dims[3][0], dims[3][1], dims[0][0]
    params = {"M": m, "n": n, "C": c, "hc3": hc3, "K": k, "split_k": split, "dtype_in": _dtype(args, 2)}
    return _result(params, 2 * m * hc3 * k,
                   lambda size: m * n * c * size + hc3 * k * 4 + split * m * hc3 * 4 + split * m * 4, "matrix")


def pre_big_fuse_rmsnorm(name: str, args: dict, kernels: list[str]) -> Result:
    dims = args["Input Dims"]
    m, c, n = dims[2][0], dims[2][1], dims[0][1]
    hc3, split = dims[6][0], dims[3][0]
    params = {"M": m, "n": n, "C": c, "hc3": hc3, "split_k": split, "dtype_in": _dtype(args, 7)}
    return _result(params, 2 * m * c * n + 5 * m * c,
                   lambda size: (m * n * c * size + split * m * hc3 * 4 + c * size + m * c * size
                                 + (m * n * 4 + m * n * n * 4)), "vector")


def fused_post_pre_gemm_sqrsum(name: str, args: dict, kernels: list[str]) -> Result:
    dims = args["Input Dims"]
    m, c, n = dims[3][0], dims[3][1], dims[2][1]
    hc3, k, split = dims[7][0], dims[7][1], dims[0][0]
    params = {"M": m, "n": n, "C": c, "hc3": hc3, "K": k, "split_k": split, "dtype_in": _dtype(args, 3)}

    def moved(size: int) -> int:
        streams = m * n * c * size
        return (m * c * size + streams + streams + streams + (m * n * 4 + m * n * n * 4) + hc3 * k * 4
                + (split * m * hc3 * 4 + split * m * 4))

    return _result(params, 2 * m * n * c * (n + 1) + 2 * m * hc3 * k, moved, "matrix")


MODELS = {"aiter::mhc_post": post, "aiter::mhc_pre_gemm_sqrsum": pre_gemm_sqrsum,
          "aiter::mhc_pre_big_fuse_rmsnorm": pre_big_fuse_rmsnorm,
          "aiter::mhc_fused_post_pre_gemm_sqrsum": fused_post_pre_gemm_sqrsum}
